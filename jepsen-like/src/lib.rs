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
pub mod claims;
pub mod cluster;
pub mod containers;
pub mod failover;
pub mod faults;
pub mod history;
pub mod pki;
pub mod proxy;
pub mod report;
pub mod run;
pub mod signals;
pub mod workload;

/// The Raft timing flags of both binaries (`jepsen-like`, `failover-bench`):
/// the node's own defaults unless given.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct TimingArgs {
    /// Raft heartbeat of every node, in milliseconds.
    #[arg(long, default_value_t = 30)]
    pub heartbeat_ms: u64,
    /// Minimum election timeout of every node, in milliseconds.
    #[arg(long, default_value_t = 120)]
    pub election_timeout_min_ms: u64,
    /// Maximum election timeout of every node, in milliseconds.
    #[arg(long, default_value_t = 240)]
    pub election_timeout_max_ms: u64,
}

impl TimingArgs {
    pub fn timing(self) -> oncekv_testkit::Timing {
        oncekv_testkit::Timing {
            heartbeat_ms: self.heartbeat_ms,
            election_timeout_min_ms: self.election_timeout_min_ms,
            election_timeout_max_ms: self.election_timeout_max_ms,
        }
    }
}
