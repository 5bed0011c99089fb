//! The storage adapter: openraft's log store and state machine over sled
//! and snapshot files. It translates between openraft and the registry core
//! and owns the fsync discipline; it decides nothing.

pub mod flusher;
pub mod identity;
pub mod log_store;
pub mod segment_log;
pub mod state_machine;

pub use identity::ClusterIdentity;
pub use log_store::SledLogStore;
pub use segment_log::{SegmentLogConfig, SegmentLogError, SegmentLogReader, SegmentLogStore};
pub use state_machine::{SharedState, StateMachineStore};
