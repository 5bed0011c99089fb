//! oncekv: an exactly-once key-value service — a replicated client-session
//! registry on Raft (the Idempotent Receiver). See README.md and docs/rules.md.

#[cfg(feature = "server")]
pub mod cli;
pub mod client;
#[cfg(feature = "server")]
pub mod clock;
pub mod local;
#[cfg(feature = "server")]
pub mod metrics;
pub mod network;
#[cfg(feature = "server")]
pub mod node;
#[cfg(feature = "server")]
pub mod raft_types;
#[cfg(feature = "server")]
pub mod read_index;
#[cfg(feature = "server")]
pub mod storage;
