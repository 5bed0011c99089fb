//! oncekv: an exactly-once key-value service — a replicated client-session
//! registry on Raft (the Idempotent Receiver). See README.md and DESIGN rules.

pub mod cli;
pub mod proto;
pub mod registry;
