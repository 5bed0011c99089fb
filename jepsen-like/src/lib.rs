//! oncekv-jepsen: a fault-injection harness for oncekv. It runs a throwaway
//! 3-node cluster (local processes, or containers with real faults; with
//! TLS and authentication on, `--tls`), drives client workloads through the
//! client library while
//! a seeded schedule of faults (kills, pauses, partitions, lost replies, a
//! short session TTL) plays, heals everything, reads every replica back and
//! checks the history for any violation of exactly-once. Its failover
//! benchmark (`failover`, binary `failover-bench`) times leader kills under
//! load on the same local-cluster controller.

pub mod admin;
pub mod checker;
pub mod cluster;
pub mod containers;
pub mod failover;
pub mod faults;
pub mod history;
pub mod pki;
pub mod proxy;
pub mod report;
pub mod run;
pub mod workload;
