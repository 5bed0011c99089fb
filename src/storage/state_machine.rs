//! openraft's state machine over the registry core: applies committed
//! entries to the in-memory `Registry`, and keeps it durable as snapshot
//! files. It translates; every decision is the core's. The applied state it
//! writes (`crate::shared::SharedState`) is shared with the network adapter,
//! which reads it; this is its only writer.
//!
//! Durability (rules 4 and 14): the applied state lives in memory and is
//! persisted only as whole snapshots — one file holding the effect, the
//! cached responses and the applied index of the same log index. A snapshot
//! is written to a temporary file, fsynced, renamed into place and the
//! directory fsynced before `build_snapshot` or `install_snapshot` returns,
//! because openraft purges the log behind it right after. After a crash the
//! node loads its latest snapshot and openraft re-applies the log after it.
//!
//! Snapshot file: `snapshot-<index>.snap` = meta length (u32 LE) | meta
//! (codec, version byte 1) | registry snapshot bytes (see
//! `registry::snapshot`).

use crate::metrics::{self, NodeMetrics};
use crate::raft_types::{
    Entry, LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::shared::SharedState;
use futures::{FutureExt, Stream, StreamExt};
use oncekv_core::{Registry, codec, snapshot};
use openraft::storage::{ApplyResponder, EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use std::fs;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const META_FORMAT_VERSION: u8 = 1;
const SNAPSHOT_PREFIX: &str = "snapshot-";
const SNAPSHOT_SUFFIX: &str = ".snap";

#[derive(Debug, thiserror::Error)]
pub enum StateMachineError {
    #[error("snapshot directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("snapshot file {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// The state machine handed to openraft.
pub struct StateMachineStore {
    state: SharedState,
    files: Arc<SnapshotFiles>,
    /// Outcomes are counted here, where they are decided, so every replica
    /// counts the same entries the same way.
    metrics: Arc<NodeMetrics>,
}

/// Where snapshots live, and which one is current. The current snapshot's
/// registry bytes are also kept in memory, so serving it never races with
/// a newer snapshot replacing the file.
struct SnapshotFiles {
    dir: PathBuf,
    current: Mutex<Option<CurrentSnapshot>>,
    /// Log index covered by the newest durable snapshot; the log store waits
    /// on it before purging (the log behind a snapshot may only go once the
    /// snapshot is on disk).
    durable_index: tokio::sync::watch::Sender<u64>,
}

#[derive(Clone)]
struct CurrentSnapshot {
    meta: SnapshotMeta,
    path: PathBuf,
    registry_bytes: Arc<Vec<u8>>,
}

fn snapshot_index(meta: &SnapshotMeta) -> u64 {
    meta.last_log_id.as_ref().map_or(0, |id| id.index)
}

impl StateMachineStore {
    /// Opens the snapshot directory and restores the latest snapshot, if any.
    pub fn open(dir: &Path) -> Result<StateMachineStore, StateMachineError> {
        let io = |source| StateMachineError::Io {
            path: dir.to_path_buf(),
            source,
        };
        fs::create_dir_all(dir).map_err(io)?;
        let mut latest: Option<(u64, PathBuf)> = None;
        for entry in fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".tmp") {
                // A snapshot whose writer crashed before the rename.
                let _ = fs::remove_file(&path);
                continue;
            }
            let index = name
                .strip_prefix(SNAPSHOT_PREFIX)
                .and_then(|rest| rest.strip_suffix(SNAPSHOT_SUFFIX))
                .and_then(|index| index.parse::<u64>().ok());
            if let Some(index) = index
                && latest.as_ref().is_none_or(|(best, _)| index > *best)
            {
                latest = Some((index, path));
            }
        }
        let state = SharedState::default();
        let mut current = None;
        if let Some((_, path)) = latest {
            let bytes = fs::read(&path).map_err(|source| StateMachineError::Io {
                path: path.clone(),
                source,
            })?;
            let (meta, registry) =
                decode_file(&bytes).map_err(|reason| StateMachineError::Corrupt {
                    path: path.clone(),
                    reason,
                })?;
            let registry_bytes = Arc::new(snapshot::to_bytes(&registry));
            let mut applied = state.write();
            applied.registry = registry;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
            state.publish_cluster_id(&applied);
            drop(applied);
            tracing::info!(log_index = ?meta.last_log_id.as_ref().map(|id| id.index), path = %path.display(), "restored snapshot");
            current = Some(CurrentSnapshot {
                meta,
                path,
                registry_bytes,
            });
        }
        let durable = current
            .as_ref()
            .map_or(0, |current| snapshot_index(&current.meta));
        Ok(StateMachineStore {
            state,
            metrics: Arc::default(),
            files: Arc::new(SnapshotFiles {
                dir: dir.to_path_buf(),
                current: Mutex::new(current),
                durable_index: tokio::sync::watch::Sender::new(durable),
            }),
        })
    }

    pub fn state(&self) -> SharedState {
        self.state.clone()
    }

    /// Counts applied outcomes, expiries and snapshots into `metrics`
    /// (instead of a private, unexported set).
    pub fn with_metrics(mut self, metrics: Arc<NodeMetrics>) -> StateMachineStore {
        self.metrics = metrics;
        self
    }

    /// The log index covered by the newest durable snapshot, as it moves.
    pub fn durable_snapshot_index(&self) -> tokio::sync::watch::Receiver<u64> {
        self.files.durable_index.subscribe()
    }
}

fn encode_file(meta: &SnapshotMeta, registry_bytes: &[u8]) -> Vec<u8> {
    let meta_bytes = codec::encode_versioned(META_FORMAT_VERSION, meta);
    let mut file = Vec::with_capacity(4 + meta_bytes.len() + registry_bytes.len());
    file.extend_from_slice(&(meta_bytes.len() as u32).to_le_bytes());
    file.extend_from_slice(&meta_bytes);
    file.extend_from_slice(registry_bytes);
    file
}

fn decode_file(bytes: &[u8]) -> Result<(SnapshotMeta, Registry), String> {
    let (length, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or("shorter than its header")?;
    let length = u32::from_le_bytes(*length) as usize;
    if length > rest.len() {
        return Err("meta length beyond the file".into());
    }
    let (meta_bytes, registry_bytes) = rest.split_at(length);
    let meta: SnapshotMeta =
        codec::decode_versioned(META_FORMAT_VERSION, meta_bytes).map_err(|e| e.to_string())?;
    let registry = snapshot::from_bytes(registry_bytes).map_err(|e| e.to_string())?;
    check_meta(&meta, &registry)?;
    Ok((meta, registry))
}

fn check_meta(meta: &SnapshotMeta, registry: &Registry) -> Result<(), String> {
    let index = snapshot_index(meta);
    if index != registry.applied_index() {
        return Err(format!(
            "meta says index {index}, registry says {}",
            registry.applied_index()
        ));
    }
    Ok(())
}

impl SnapshotFiles {
    /// Writes a snapshot file durably (temporary file, fsync, rename,
    /// directory fsync) and makes it current — unless a snapshot at least as
    /// new is already current (a build can finish after an install), in
    /// which case the older one is discarded. Only strictly older files are
    /// ever deleted. Holds the lock throughout, so concurrent builds and
    /// installs are ordered.
    fn persist(&self, meta: &SnapshotMeta, registry_bytes: Arc<Vec<u8>>) -> std::io::Result<()> {
        let index = snapshot_index(meta);
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = current.as_ref()
            && snapshot_index(&existing.meta) >= index
            && existing.meta.last_log_id.is_some()
        {
            tracing::debug!(log_index = index, "older snapshot discarded");
            return Ok(());
        }
        let name = format!("{SNAPSHOT_PREFIX}{index:020}{SNAPSHOT_SUFFIX}");
        let path = self.dir.join(&name);
        let temporary = self.dir.join(format!("{name}.tmp"));
        {
            let mut file = fs::File::create(&temporary)?;
            file.write_all(&encode_file(meta, &registry_bytes))?;
            file.sync_all()?;
        }
        fs::rename(&temporary, &path)?;
        fs::File::open(&self.dir)?.sync_all()?;
        let previous = current.replace(CurrentSnapshot {
            meta: meta.clone(),
            path: path.clone(),
            registry_bytes,
        });
        if let Some(previous) = previous
            && previous.path != path
        {
            let _ = fs::remove_file(previous.path);
        }
        self.durable_index
            .send_modify(|durable| *durable = (*durable).max(index));
        Ok(())
    }

    fn current(&self) -> Option<CurrentSnapshot> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A snapshot failure as openraft 0.10 takes it: an `io::Error` naming the
/// snapshot.
fn snapshot_error(
    meta: Option<&SnapshotMeta>,
    action: &str,
    error: impl std::fmt::Display,
) -> std::io::Error {
    let index = meta.map(snapshot_index);
    std::io::Error::other(format!("snapshot {action} (log index {index:?}): {error}"))
}

/// Builds snapshots from the shared state while apply goes on.
pub struct SnapshotBuilder {
    state: SharedState,
    files: Arc<SnapshotFiles>,
    metrics: Arc<NodeMetrics>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, std::io::Error> {
        // One point in time: the meta and an O(1) copy of the registry are
        // taken under the read lock, which apply waits for only that long;
        // the copy is encoded after the lock is released, on a blocking
        // thread, so neither apply nor a tokio worker (and the Raft core or
        // RPCs scheduled on it) waits for the encoding.
        let (meta, registry) = {
            let applied = self.state.read();
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            (meta, applied.registry.clone())
        };
        let bytes = tokio::task::spawn_blocking(move || snapshot::to_bytes(&registry))
            .await
            .map_err(|e| snapshot_error(None, "encoding", e))?;
        let bytes = Arc::new(bytes);
        let files = self.files.clone();
        let persisted_meta = meta.clone();
        let persisted = bytes.clone();
        tokio::task::spawn_blocking(move || files.persist(&persisted_meta, persisted))
            .await
            .map_err(|e| snapshot_error(Some(&meta), "writing", e))?
            .map_err(|e| snapshot_error(Some(&meta), "writing", e))?;
        self.metrics.snapshots_built.inc();
        tracing::info!(
            log_index = snapshot_index(&meta),
            bytes = bytes.len(),
            "built snapshot"
        );
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(bytes.as_ref().clone()),
        })
    }
}

impl StateMachineStore {
    /// Applies `batch` under one write lock and returns each entry's reply
    /// with its responder; the replies are sent after the lock is released.
    fn apply_batch(
        &self,
        batch: Vec<EntryResponder<TypeConfig>>,
    ) -> Vec<(
        Vec<oncekv_core::Outcome>,
        Option<ApplyResponder<TypeConfig>>,
    )> {
        let mut applied = self.state.write();
        let mut replies = Vec::with_capacity(batch.len());
        for (entry, responder) in batch {
            let Entry { log_id, payload } = entry;
            let index = log_id.index;
            let reply = match payload {
                EntryPayload::Blank => {
                    applied.registry.apply_other(index);
                    Vec::new()
                }
                EntryPayload::Normal(ref registry_entry) => {
                    let counts = |registry: &oncekv_core::Registry| {
                        (registry.session_count(), registry.key_count())
                    };
                    let before = counts(&applied.registry);
                    let outcomes = applied.registry.apply(index, registry_entry);
                    self.metrics.count_applied(
                        registry_entry,
                        &outcomes,
                        before,
                        counts(&applied.registry),
                    );
                    tracing::debug!(log_index = index, requests = outcomes.len(), "applied");
                    outcomes
                }
                EntryPayload::Membership(membership) => {
                    applied.registry.apply_other(index);
                    applied.membership = StoredMembership::new(Some(log_id), membership);
                    Vec::new()
                }
            };
            applied.last_applied = Some(log_id);
            replies.push((reply, responder));
        }
        self.state.publish_cluster_id(&applied);
        replies
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), std::io::Error> {
        let applied = self.state.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    /// Applies the entries as they come, in batches of those already
    /// available: one write lock per batch, the responders answered after
    /// it is released.
    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), std::io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, std::io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some(first) = entries.next().await {
            let started = metrics::now();
            let mut batch = vec![first?];
            while let Some(Some(next)) = entries.next().now_or_never() {
                batch.push(next?);
            }
            let replies = self.apply_batch(batch);
            self.metrics.entries_applied.inc_by(replies.len() as u64);
            metrics::observe_since(&self.metrics.apply_batch_duration, started);
            for (reply, responder) in replies {
                if let Some(responder) = responder {
                    responder.send(reply);
                }
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            state: self.state.clone(),
            files: self.files.clone(),
            metrics: self.metrics.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), std::io::Error> {
        let bytes = snapshot.into_inner();
        let registry =
            snapshot::from_bytes(&bytes).map_err(|e| snapshot_error(Some(meta), "decoding", e))?;
        check_meta(meta, &registry)
            .map_err(|reason| snapshot_error(Some(meta), "checking", reason))?;
        // Durable before the state changes and before openraft purges.
        let files = self.files.clone();
        let persisted_meta = meta.clone();
        let bytes = Arc::new(bytes);
        tokio::task::spawn_blocking(move || files.persist(&persisted_meta, bytes))
            .await
            .map_err(|e| snapshot_error(Some(meta), "writing", e))?
            .map_err(|e| snapshot_error(Some(meta), "writing", e))?;
        let mut applied = self.state.write();
        applied.registry = registry;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        self.state.publish_cluster_id(&applied);
        drop(applied);
        self.metrics.snapshots_installed.inc();
        tracing::info!(log_index = snapshot_index(meta), "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, std::io::Error> {
        Ok(self.files.current().map(|current| Snapshot {
            meta: current.meta,
            snapshot: Cursor::new(current.registry_bytes.as_ref().clone()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<TypeConfig>(1, 1, index)),
            last_membership: StoredMembership::default(),
        }
    }

    /// A snapshot that finishes after a newer one (a build overtaken by an
    /// install) is discarded: the newer file stays current and on disk.
    #[test]
    fn older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateMachineStore::open(dir.path()).unwrap();
        let durable = store.durable_snapshot_index();
        let bytes = |index| {
            let mut registry = Registry::new();
            registry.apply_other(index);
            Arc::new(snapshot::to_bytes(&registry))
        };
        store.files.persist(&meta(9), bytes(9)).unwrap();
        store.files.persist(&meta(4), bytes(4)).unwrap();
        let current = store.files.current().unwrap();
        assert_eq!(snapshot_index(&current.meta), 9);
        assert!(current.path.exists());
        assert_eq!(*durable.borrow(), 9);
        let files: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 1, "only the newest snapshot file remains");
        drop(store);
        let reopened = StateMachineStore::open(dir.path()).unwrap();
        assert_eq!(reopened.state().read().registry.applied_index(), 9);
    }
}
