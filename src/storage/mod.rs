//! The storage adapter: openraft's log store (the segment log) and state
//! machine (in memory, made durable by snapshot files). It translates
//! between openraft and the registry core and owns the fsync discipline; it
//! decides nothing.
//!
//! `log_store` (sled) and its `flusher` are the log store the node used
//! before the segment log; the node no longer uses them. They stay as the
//! baseline that `benches/log_store.rs` measures the segment log against,
//! and openraft's suite still runs over them (`tests/storage_suite.rs`).

pub mod flusher;
pub mod identity;
pub mod log_store;
pub mod segment_log;
pub mod state_machine;

pub use identity::ClusterIdentity;
pub use log_store::SledLogStore;
pub use segment_log::{SegmentLogConfig, SegmentLogError, SegmentLogReader, SegmentLogStore};
pub use state_machine::{SharedState, StateMachineStore};

use std::ops::{Bound, RangeBounds};
use std::path::Path;

/// Replaces the small file at `path` with `bytes` durably: a temporary file
/// beside it, fsync, rename, directory fsync. A crash leaves the old
/// content or the new one, never a mix.
pub fn replace_file_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, bytes)?;
    std::fs::File::open(&temporary)?.sync_all()?;
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

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
