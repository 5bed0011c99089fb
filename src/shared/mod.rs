//! What the storage adapter and the network adapter share, owned by
//! neither: the applied state (`applied`: the registry as this node applied
//! it, its cluster id and state hash; written by the state machine only,
//! read by the services, the cluster clock and observability) and the
//! node's cluster identity (`identity`: the id file the peer service checks
//! and adopts, and the durable replacement of the data directory's small
//! records), and the snapshot files (`snapshot_file`: the file format,
//! writing, reading and the inbox that receives a peer's snapshot, used by
//! the state machine and the peer service alike), and the key records of
//! the applied state that lie outside the registry (`records`: the on-disk
//! store and the layers flushed into it, written by the state machine,
//! read by the admin service), and the lower-priority threads that build
//! snapshots, hash the state and do a catch-up's work (`background`).
//!
//! This module must not depend on `network` or `storage` (both depend on
//! it); `tests/adapter_direction.rs` fails if it, or either adapter, names
//! the other.

pub mod applied;
pub mod background;
pub mod identity;
pub mod records;
pub mod snapshot_file;

pub use applied::{AppliedState, HASH_INTERVAL, SharedState, StateHashAt};
pub use identity::{ClusterIdentity, IdentityError, replace_file_durably};
