//! oncekv: an exactly-once key-value service — a replicated client-session
//! registry on Raft (the Idempotent Receiver). See README.md and docs/rules.md.

pub mod cli;
pub mod clock;
pub mod metrics;
pub mod network;
pub mod node;
pub mod raft_types;
pub mod read_index;
pub mod shared;
pub mod storage;
