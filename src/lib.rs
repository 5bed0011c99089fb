//! oncekv: an exactly-once key-value service — a replicated client-session
//! registry on Raft (the Idempotent Receiver). See README.md and DESIGN rules.

pub mod cli;
pub mod client;
pub mod clock;
pub mod network;
pub mod node;
pub mod proto;
pub mod raft_types;
pub mod registry;
pub mod storage;
