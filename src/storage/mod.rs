//! The storage adapter: openraft's log store (the segment log) and state
//! machine (in memory, made durable by snapshot files, which
//! `snapshot_file` reads and writes a buffer at a time). It translates
//! between openraft and the registry core and owns the fsync discipline; it
//! decides nothing. The applied state its state machine writes, and the
//! network adapter reads, is `crate::shared`'s.
//!
//! `log_store` (sled) and its `flusher` are the log store the node used
//! before the segment log; the node no longer uses them. They stay as the
//! baseline that `benches/log_store.rs` measures the segment log against,
//! and openraft's suite still runs over them (`tests/storage_suite.rs`).

pub mod flusher;
pub mod log_store;
pub mod segment_log;
pub mod state_machine;

pub use crate::shared::snapshot_file::{
    IncomingSnapshot, ReceiveError, SnapshotFile, SnapshotInbox,
};
pub use log_store::SledLogStore;
pub use segment_log::{SegmentLogConfig, SegmentLogError, SegmentLogReader, SegmentLogStore};
pub use state_machine::StateMachineStore;

use std::ops::{Bound, RangeBounds};

/// Converts a log index range into the `[start, end)` form, `None` meaning
/// unbounded; returns `None` for an empty range. Both log stores read ranges
/// through it.
fn half_open(range: &impl RangeBounds<u64>) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => None,
    };
    match end {
        Some(end) if end <= start => None,
        _ => Some((start, end)),
    }
}
