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
//! node loads its latest snapshot and openraft re-applies the log after it;
//! temporary files (a build, a copy or a reception cut short) are deleted.
//!
//! Idempotency-key records (with a record store, as a node runs): each
//! build flushes the records changed since the last into the store
//! (`crate::shared::records`) with the build's index before writing the
//! file; a restart whose store is at the file's index reads only the
//! file's part before the records (format 8); an install streams the
//! file's records into a new store generation.
//!
//! Memory: a snapshot is never held in memory as bytes. Building encodes a
//! copy of the registry (O(1): persistent maps) straight into the file;
//! the current snapshot is a path, and serving it opens the file; an
//! install decodes from the file, its key records going to the store as
//! they are read. The file format and the streaming are `snapshot_file`'s.

use crate::metrics::{self, NodeMetrics};
use crate::raft_types::{
    Entry, LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::shared::SharedState;
use crate::shared::background;
use crate::shared::records::OutsideRecords;
use crate::shared::snapshot_file::{
    BaseId, CurrentBase, Extended, PART_SUFFIX, SNAPSHOT_PREFIX, SNAPSHOT_SUFFIX, SnapshotFile,
    SnapshotInbox, TEMPORARY_SUFFIX, TemporaryFile, check_meta, part_file_name, snapshot_file_name,
    snapshot_index,
};
use futures::{FutureExt, Stream, StreamExt};
use oncekv_core::extension::RecordsBase;
use oncekv_core::{Registry, snapshot};
use oncekv_records::RecordStore;
use openraft::storage::{ApplyResponder, EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    /// Snapshot builds, one at a time: each takes the registry's key-record
    /// changes, flushes them and writes its file before the next takes.
    builds: Arc<tokio::sync::Mutex<()>>,
    /// Where the number of key records held in memory is published after
    /// each apply batch (see [`StateMachineStore::publish_key_records_held`]).
    key_records_held: Option<Arc<AtomicUsize>>,
    /// Outcomes are counted here, where they are decided, so every replica
    /// counts the same entries the same way.
    metrics: Arc<NodeMetrics>,
}

/// Where snapshots live, and which one is current. Only the current
/// snapshot's path and header are kept; a reader opens the file under the
/// lock, so a newer snapshot that deletes it meanwhile cannot pull it from
/// under the reader (an open file stays readable).
struct SnapshotFiles {
    dir: PathBuf,
    current: Mutex<Option<CurrentSnapshot>>,
    /// Log index covered by the newest durable snapshot; the log store waits
    /// on it before purging (the log behind a snapshot may only go once the
    /// snapshot is on disk).
    durable_index: tokio::sync::watch::Sender<u64>,
    inbox: SnapshotInbox,
}

impl CurrentSnapshot {
    /// This snapshot as the base of an extension, if its records lie in
    /// the store.
    fn as_base(&self) -> Option<CurrentBase> {
        let (view, records) = (self.records.as_ref()?, self.base.as_ref()?);
        Some(CurrentBase {
            id: BaseId {
                index: snapshot_index(&self.meta),
                generation: view.generation(),
            },
            records: records.clone(),
            view: view.clone(),
        })
    }
}

#[derive(Clone)]
struct CurrentSnapshot {
    meta: SnapshotMeta,
    path: PathBuf,
    /// Where the registry bytes start in the file.
    registry_offset: u64,
    /// For a part file: the view of the record store holding its key
    /// records, kept while it is current.
    records: Option<Arc<oncekv_records::View>>,
    /// For a part file: its records in summary (what a receiver tells a
    /// leader, and a leader plans an extension from).
    base: Option<Arc<RecordsBase>>,
}

impl StateMachineStore {
    /// Opens the snapshot directory and restores the latest snapshot, if
    /// any, reading it from the file through a buffer. Temporary files
    /// (written by a process that died before renaming them) are deleted.
    pub fn open(dir: &Path) -> Result<StateMachineStore, StateMachineError> {
        Self::open_with(dir, SharedState::default())
    }

    /// [`StateMachineStore::open`], with the idempotency-key records
    /// moving out of memory into the record store under `records_dir` at
    /// every snapshot build (docs/state-beyond-ram.md §4.5).
    pub fn open_with_records(
        dir: &Path,
        records_dir: &Path,
    ) -> Result<StateMachineStore, StateMachineError> {
        let records =
            OutsideRecords::open(records_dir).map_err(|source| StateMachineError::Io {
                path: records_dir.to_path_buf(),
                source,
            })?;
        Self::open_with(dir, SharedState::with_records(Arc::new(records)))
    }

    fn open_with(dir: &Path, state: SharedState) -> Result<StateMachineStore, StateMachineError> {
        let io = |source| StateMachineError::Io {
            path: dir.to_path_buf(),
            source,
        };
        fs::create_dir_all(dir).map_err(io)?;
        // (index, path, whether it is a part file), newest first.
        let mut files: Vec<(u64, PathBuf, bool)> = Vec::new();
        for entry in fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(TEMPORARY_SUFFIX) {
                // A snapshot whose writer or receiver stopped before the
                // rename: never read.
                tracing::info!(path = %path.display(), "removing a temporary snapshot file");
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(rest) = name.strip_prefix(SNAPSHOT_PREFIX) else {
                continue;
            };
            let (index, part) = match (
                rest.strip_suffix(SNAPSHOT_SUFFIX),
                rest.strip_suffix(PART_SUFFIX),
            ) {
                (Some(index), _) => (index, false),
                (_, Some(index)) => (index, true),
                _ => continue,
            };
            if let Ok(index) = index.parse::<u64>() {
                files.push((index, path, part));
            }
        }
        files.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)));
        let store_index = match state.records() {
            Some(records) => {
                records
                    .checkpoint_index()
                    .map_err(|e| StateMachineError::Corrupt {
                        path: dir.to_path_buf(),
                        reason: format!("reading the record store: {e}"),
                    })?
            }
            None => None,
        };
        // The newest usable snapshot: a whole file, or a part file whose
        // records the store holds (its checkpoint is of the same index). A
        // newer part file the store is not at is a build that stopped
        // between renaming it and flushing the store: never a snapshot.
        let chosen = files
            .iter()
            .position(|(index, _, part)| !part || store_index == Some(*index));
        let Some(chosen) = chosen else {
            if let Some((index, path, _)) = files.first() {
                let store = match store_index {
                    Some(at) => format!("is at log index {at}"),
                    None => "is empty or missing".to_owned(),
                };
                return Err(StateMachineError::Corrupt {
                    path: path.clone(),
                    reason: format!(
                        "the key records of snapshot {index} lie in the record store \
                         (`state/` beside `snapshots/`), which {store}: restore the store, \
                         or replace this node (docs/operating.md)"
                    ),
                });
            }
            return Self::opened(dir, state, None);
        };
        for (index, path, _) in files
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != chosen)
            .map(|(_, f)| f)
        {
            tracing::info!(log_index = index, path = %path.display(), "removing a snapshot file not in use");
            let _ = fs::remove_file(path);
        }
        let (index, path, part) = files.swap_remove(chosen);
        let corrupt = |reason: String| StateMachineError::Corrupt {
            path: path.clone(),
            reason,
        };
        let mut file = SnapshotFile::open(&path).map_err(|e| corrupt(e.to_string()))?;
        if snapshot_index(file.meta()) != index {
            return Err(corrupt(format!(
                "named for index {index}, its header says {}",
                snapshot_index(file.meta())
            )));
        }
        // Where the store holds this snapshot's key records, they stay
        // there: only the part before them is read. Else (a whole file
        // installed or built before the store was at its index) the
        // file's records are read into memory, and the next build replaces
        // the store.
        let in_store = store_index == Some(index);
        let registry = if in_store {
            file.read_registry_part().map_err(corrupt)?
        } else {
            file.read_registry().map_err(corrupt)?
        };
        tracing::info!(
            log_index = index,
            key_records_in_store = registry.has_key_records_outside(),
            key_records_in_memory = registry.key_records_held(),
            "read snapshot"
        );
        let meta = file.meta().clone();
        let mut applied = state.write();
        applied.registry = registry;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        state.publish_cluster_id(&applied);
        drop(applied);
        let records = match (part, state.records()) {
            (true, Some(records)) => {
                Some(Arc::new(records.view().map_err(|e| {
                    corrupt(format!("reading the record store: {e}"))
                })?))
            }
            _ => None,
        };
        tracing::info!(log_index = index, path = %path.display(), "restored snapshot");
        let base = records
            .is_some()
            .then(|| Arc::new(state.read().registry.records_base()));
        let current = CurrentSnapshot {
            registry_offset: file.registry_offset(),
            meta,
            path,
            records,
            base,
        };
        Self::opened(dir, state, Some(current))
    }

    fn opened(
        dir: &Path,
        state: SharedState,
        current: Option<CurrentSnapshot>,
    ) -> Result<StateMachineStore, StateMachineError> {
        let durable = current
            .as_ref()
            .map_or(0, |current| snapshot_index(&current.meta));
        let builds = Arc::new(tokio::sync::Mutex::new(()));
        let inbox = SnapshotInbox::new(dir.to_path_buf(), state.records().cloned(), builds.clone());
        inbox.set_base(current.as_ref().and_then(CurrentSnapshot::as_base));
        Ok(StateMachineStore {
            state,
            builds,
            key_records_held: None,
            metrics: Arc::default(),
            files: Arc::new(SnapshotFiles {
                dir: dir.to_path_buf(),
                current: Mutex::new(current),
                durable_index: tokio::sync::watch::Sender::new(durable),
                inbox,
            }),
        })
    }

    pub fn state(&self) -> SharedState {
        self.state.clone()
    }

    /// Publishes, after every apply batch, how many key records are held in
    /// memory (changed since the last build), so the node can ask Raft for
    /// a snapshot build, which moves them into the record store: what
    /// bounds them when entries are large batches (64 clients' keyed
    /// requests in one entry) and the entry-count schedule alone would let
    /// hundreds of thousands pile up. Stays 0 without a record store.
    pub fn publish_key_records_held(mut self) -> (StateMachineStore, Arc<AtomicUsize>) {
        let held = Arc::new(AtomicUsize::new(0));
        self.key_records_held = Some(held.clone());
        (self, held)
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

    /// Where the peer service writes the snapshots a leader sends.
    pub fn snapshot_inbox(&self) -> SnapshotInbox {
        self.files.inbox.clone()
    }
}

impl SnapshotFiles {
    /// Makes a written and fsynced temporary snapshot file current: renames
    /// it into place and fsyncs the directory — unless a snapshot at least
    /// as new is already current (a build can finish after an install), in
    /// which case the older one is discarded (its file deleted). Only
    /// strictly older files are ever deleted. Holds the lock throughout, so
    /// concurrent builds and installs are ordered. Returns the file's path
    /// if it became current.
    fn persist(
        &self,
        meta: &SnapshotMeta,
        temporary: TemporaryFile,
        registry_offset: u64,
    ) -> io::Result<Option<PathBuf>> {
        let index = snapshot_index(meta);
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = current.as_ref()
            && snapshot_index(&existing.meta) >= index
            && existing.meta.last_log_id.is_some()
        {
            tracing::debug!(log_index = index, "older snapshot discarded");
            return Ok(None);
        }
        let path = self.dir.join(snapshot_file_name(index));
        self.rename_into_place(temporary, &path)?;
        self.make_current(
            &mut current,
            CurrentSnapshot {
                meta: meta.clone(),
                path: path.clone(),
                registry_offset,
                records: None,
                base: None,
            },
        );
        Ok(Some(path))
    }

    /// Renames a written, fsynced temporary file to `path` and fsyncs the
    /// directory: durable under its final name.
    fn rename_into_place(&self, temporary: TemporaryFile, path: &Path) -> io::Result<()> {
        fs::rename(temporary.path(), path)?;
        temporary.keep();
        fs::File::open(&self.dir)?.sync_all()
    }

    /// Makes `new` (durable) the current snapshot under the lock: deletes
    /// the previous one's file and moves the durable index.
    fn make_current(&self, current: &mut Option<CurrentSnapshot>, new: CurrentSnapshot) {
        let index = snapshot_index(&new.meta);
        let path = new.path.clone();
        self.inbox.set_base(new.as_base());
        if let Some(previous) = current.replace(new)
            && previous.path != path
        {
            let _ = fs::remove_file(previous.path);
        }
        self.durable_index
            .send_modify(|durable| *durable = (*durable).max(index));
    }

    /// Builds the snapshot of `registry` at `meta` whose key records lie in
    /// the record store (§4.5 of docs/state-beyond-ram.md): writes the part
    /// file (everything but the records), fsyncs and renames it into place,
    /// then `flush` moves the records changed since the last build into the
    /// store with this index and returns the store's view of it — from then
    /// on the part file and the view are the snapshot, made current. A crash
    /// before the flush leaves a part file the store is not at (ignored and
    /// deleted at the next start) and the previous snapshot in force.
    fn build_part(
        &self,
        meta: &SnapshotMeta,
        registry: &Registry,
        flush: impl FnOnce() -> io::Result<oncekv_records::View>,
    ) -> io::Result<SnapshotFile> {
        let index = snapshot_index(meta);
        let (temporary, file, registry_offset) =
            crate::shared::snapshot_file::write_temporary(&self.dir, meta, |out| {
                snapshot::write_part_only(registry, out)
            })?;
        let path = self.dir.join(part_file_name(index));
        self.rename_into_place(temporary, &path)?;
        let view = Arc::new(flush()?);
        let base = Some(Arc::new(registry.records_base()));
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        self.make_current(
            &mut current,
            CurrentSnapshot {
                meta: meta.clone(),
                path: path.clone(),
                registry_offset,
                records: Some(view.clone()),
                base: base.clone(),
            },
        );
        drop(current);
        Ok(
            SnapshotFile::written(file, path, meta.clone(), registry_offset)
                .with_records(view)
                .with_base(base),
        )
    }

    /// Writes the snapshot of `registry` at `meta` durably and makes it
    /// current (see [`SnapshotFiles::persist`]): encoded straight into a
    /// temporary file through one buffer, fsynced, renamed, the directory
    /// fsynced. Returns a handle on the file written (still readable if a
    /// newer snapshot made it obsolete at once).
    fn build(&self, meta: &SnapshotMeta, registry: &Registry) -> io::Result<SnapshotFile> {
        let (temporary, file, registry_offset) =
            crate::shared::snapshot_file::write_temporary(&self.dir, meta, |out| {
                snapshot::write(registry, out)
            })?;
        let written_at = temporary.path().to_path_buf();
        let path = self
            .persist(meta, temporary, registry_offset)?
            .unwrap_or(written_at);
        Ok(SnapshotFile::written(
            file,
            path,
            meta.clone(),
            registry_offset,
        ))
    }

    /// Makes `snapshot` the durable current snapshot at `meta` and returns
    /// its state (see [`read_installed`]). A snapshot received into this
    /// directory was checked when it arrived: its temporary file is
    /// fsynced and renamed into place — as the part file, with its staged
    /// generation put in force, where its records went into the record
    /// store as they came. Any other (another state machine's file) is
    /// first copied into a temporary file here, a buffer at a time, and
    /// checked from the copy.
    fn install(
        &self,
        meta: &SnapshotMeta,
        mut snapshot: SnapshotFile,
        records: Option<&OutsideRecords>,
    ) -> io::Result<(Registry, Option<Arc<RecordStore>>)> {
        let invalid = |reason: String| io::Error::new(io::ErrorKind::InvalidData, reason);
        if let Some(mut received) = snapshot.take_received(&self.dir, meta) {
            snapshot.file().sync_all()?;
            let registry_offset = snapshot.registry_offset();
            if let Some(extension) = received.extension.take() {
                let records = records.ok_or_else(|| {
                    io::Error::other("an extension of a record store this node has not")
                })?;
                return self.install_extension(
                    meta,
                    received.temporary,
                    registry_offset,
                    extension,
                    records,
                );
            }
            if let Some(staged) = received.staged.take() {
                let records = records.ok_or_else(|| {
                    io::Error::other("a snapshot staged in a record store this node has not")
                })?;
                return self.install_staged(
                    meta,
                    received.temporary,
                    registry_offset,
                    staged,
                    records,
                );
            }
            self.persist(meta, received.temporary, registry_offset)?;
            return read_installed(meta, &mut snapshot, records);
        }
        let (temporary, file, registry_offset) =
            crate::shared::snapshot_file::write_temporary(&self.dir, meta, |out| {
                io::copy(&mut snapshot.whole_reader()?, out).map(drop)
            })?;
        let mut copy = SnapshotFile::written(
            file,
            temporary.path().to_path_buf(),
            meta.clone(),
            registry_offset,
        );
        copy.read_registry_leaving_keys().map_err(invalid)?;
        self.persist(meta, temporary, registry_offset)?;
        read_installed(meta, &mut copy, records)
    }

    /// Installs a snapshot received as its part (the fsynced temporary
    /// file) and its records' staged generation, in the order a build
    /// writes (§4.5 of docs/state-beyond-ram.md): the part file renamed
    /// into place, then the generation named in force — from then on the
    /// two are the snapshot, made current with a view of the generation. A
    /// crash between the two leaves a part file the store is not at
    /// (ignored and deleted at the next start) and the previous snapshot
    /// in force.
    fn install_staged(
        &self,
        meta: &SnapshotMeta,
        temporary: TemporaryFile,
        registry_offset: u64,
        staged: crate::shared::snapshot_file::Staged,
        records: &OutsideRecords,
    ) -> io::Result<(Registry, Option<Arc<RecordStore>>)> {
        let path = self.dir.join(part_file_name(snapshot_index(meta)));
        self.rename_into_place(temporary, &path)?;
        let store = records.put_in_force(staged.generation)?;
        let view = Arc::new(
            store
                .view()
                .map_err(|e| io::Error::other(format!("reading the record store: {e}")))?,
        );
        let base = Some(Arc::new(staged.registry.records_base()));
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        self.make_current(
            &mut current,
            CurrentSnapshot {
                meta: meta.clone(),
                path,
                registry_offset,
                records: Some(view),
                base,
            },
        );
        Ok((staged.registry, Some(store)))
    }

    /// Installs a snapshot received as an extension of this node's durable
    /// snapshot (its base; §4.9p of docs/state-beyond-ram.md), in the order
    /// a build writes: the part file renamed into place, then the records
    /// added to the store in force in one batch with the snapshot's
    /// checkpoint — the store must still be at the base (builds were held
    /// off since the reception checked it), else nothing is written. Its
    /// records then are the snapshot's. A crash between the two leaves a
    /// part file the store is not at (ignored and deleted at the next
    /// start) and the base in force. Returns no new store: the registry
    /// reads the same one, its layers of the replaced state dropped.
    fn install_extension(
        &self,
        meta: &SnapshotMeta,
        temporary: TemporaryFile,
        registry_offset: u64,
        extension: Extended,
        records: &OutsideRecords,
    ) -> io::Result<(Registry, Option<Arc<RecordStore>>)> {
        let index = snapshot_index(meta);
        let path = self.dir.join(part_file_name(index));
        let Extended {
            registry,
            records: added,
            base,
            builds_held: _,
        } = extension;
        records.check_at(base.index, base.generation)?;
        self.rename_into_place(temporary, &path)?;
        // From here until the registry is switched (under the applied
        // state's lock, right after), a follower-local read may find a
        // record the snapshot adds under the registry it replaces: a
        // committed record seen early, as a read of the newly installed
        // state would. Apply does not run meanwhile (the install is the
        // state machine's current step).
        let view = records.extend(
            added,
            index,
            registry.first_live_key_group_ms(),
            registry
                .rules()
                .finished_claims_grouped()
                .then(|| registry.first_live_claim_group_ms()),
            base.index,
            base.generation,
        )?;
        let base = Some(Arc::new(registry.records_base()));
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        self.make_current(
            &mut current,
            CurrentSnapshot {
                meta: meta.clone(),
                path,
                registry_offset,
                records: Some(Arc::new(view)),
                base,
            },
        );
        Ok((registry, None))
    }

    /// The current snapshot, its file opened under the lock.
    fn current(&self) -> io::Result<Option<SnapshotFile>> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current
            .as_ref()
            .map(|current| {
                let file = SnapshotFile::open_known(
                    &current.path,
                    current.meta.clone(),
                    current.registry_offset,
                )?;
                Ok(match &current.records {
                    Some(view) => file
                        .with_records(view.clone())
                        .with_base(current.base.clone()),
                    None => file,
                })
            })
            .transpose()
    }
}

/// The state an installed (durable, checked) snapshot file holds. With a
/// record store, the key records of a format 8 file stream from the file
/// into a new generation of it (returned, to switch to with the registry),
/// and the registry holds none: nothing proportional to the records is
/// held in memory. Without one, or from an older format, the registry
/// holds every record (a later build moves them into a new generation).
fn read_installed(
    meta: &SnapshotMeta,
    snapshot: &mut SnapshotFile,
    records: Option<&OutsideRecords>,
) -> io::Result<(Registry, Option<Arc<RecordStore>>)> {
    let invalid = |reason: String| io::Error::new(io::ErrorKind::InvalidData, reason);
    let Some(records) = records else {
        return Ok((snapshot.read_registry().map_err(invalid)?, None));
    };
    let reader = snapshot.registry_reader()?;
    let part = snapshot::read_part(reader, true).map_err(|e| invalid(e.to_string()))?;
    match part {
        snapshot::Part::Whole(registry) => {
            check_meta(meta, &registry).map_err(invalid)?;
            Ok((registry, None))
        }
        snapshot::Part::Records(registry, key_records) => {
            check_meta(meta, &registry).map_err(invalid)?;
            let store = records.install_generation(
                key_records,
                snapshot_index(meta),
                registry.first_live_key_group_ms(),
                registry
                    .rules()
                    .finished_claims_grouped()
                    .then(|| registry.first_live_claim_group_ms()),
            )?;
            Ok((registry, Some(store)))
        }
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
    builds: Arc<tokio::sync::Mutex<()>>,
    metrics: Arc<NodeMetrics>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, std::io::Error> {
        // One build at a time: a take's layer is flushed, and the store's
        // view read, before the next build takes.
        let _build = self.builds.clone().lock_owned().await;
        // One point in time: the meta, the key-record changes since the
        // last build and an O(1) copy of the registry are taken under the
        // write lock, which apply waits for only that long; the changes
        // are flushed into the record store and the copy encoded into the
        // file after the lock is released, on the node's lower-priority
        // background thread, so neither apply nor a tokio worker (and the
        // Raft core or RPCs scheduled on it) waits for them, nor competes
        // with them for the CPU on equal terms.
        let (meta, registry, pending) = {
            let mut applied = self.state.write();
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            let pending = self
                .state
                .records()
                .map(|records| records.push(applied.registry.take_record_changes()));
            (meta, applied.registry.clone(), pending)
        };
        let files = self.files.clone();
        let built_meta = meta.clone();
        let records = self.state.records().cloned();
        let snapshot = background::run_io(move || match (records, pending) {
            (Some(records), Some(pending)) => files.build_part(&built_meta, &registry, || {
                records.flush(pending, snapshot_index(&built_meta))?;
                records.view()
            }),
            _ => files.build(&built_meta, &registry),
        })
        .await
        .map_err(|e| snapshot_error(Some(&meta), "writing", e))?;
        self.metrics.snapshots_built.inc();
        tracing::info!(
            log_index = snapshot_index(&meta),
            bytes = snapshot.file().metadata().map_or(0, |m| m.len()),
            path = %snapshot.path().display(),
            "built snapshot"
        );
        Ok(Snapshot { meta, snapshot })
    }
}

/// An entry's outcomes, with the responder waiting for them.
type Reply = (
    Vec<oncekv_core::Outcome>,
    Option<ApplyResponder<TypeConfig>>,
);

impl StateMachineStore {
    /// Applies `batch` under one write lock and returns each entry's reply
    /// with its responder; the replies are sent after the lock is released.
    fn apply_batch(&self, batch: Vec<EntryResponder<TypeConfig>>) -> io::Result<Vec<Reply>> {
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
                    check_rules_known(index, registry_entry)?;
                    let counts = |registry: &oncekv_core::Registry| {
                        (registry.session_count(), registry.key_count())
                    };
                    let before = counts(&applied.registry);
                    // The key and finished claim records the entry reads
                    // that lie in the record store (none while the
                    // registry holds all; claims only from rules version 3).
                    let keys = applied.registry.keys_to_fetch(registry_entry);
                    let claims = applied.registry.claims_to_fetch(registry_entry);
                    let fetched = match self.state.records() {
                        Some(records) if !keys.is_empty() || !claims.is_empty() => {
                            records.fetch(keys, claims)?
                        }
                        _ => oncekv_core::Prefetched::none(),
                    };
                    let outcomes =
                        applied
                            .registry
                            .apply_prefetched(index, registry_entry, &fetched);
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
        if let Some(held) = &self.key_records_held
            && self.state.records().is_some()
        {
            held.store(
                applied.registry.key_records_held() + applied.registry.claim_records_held(),
                Ordering::Relaxed,
            );
        }
        Ok(replies)
    }
}

/// Stops at an entry naming a rules version this build does not know: the
/// nodes that know it apply the entry, and any decision made here instead
/// (even a refusal) would differ from theirs. The leader refuses such a
/// version before proposing it, so only a newer leader's entry gets here:
/// this node needs the newer build.
fn check_rules_known(index: u64, entry: &oncekv_core::Entry) -> io::Result<()> {
    match entry
        .ops
        .iter()
        .filter_map(oncekv_core::Op::rules_named)
        .find_map(|rules| Some((rules, rules.unknown_to_this_build()?)))
    {
        None => Ok(()),
        Some((rules, unknown)) => {
            let why = format!(
                "log entry {index} names rules version {rules}: {unknown}; this node stops \
                 applying rather than decide the entry by other rules: upgrade its build"
            );
            tracing::error!(log_index = index, rules_version = rules.0, "{why}");
            Err(io::Error::other(why))
        }
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
            let replies = self.apply_batch(batch)?;
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
            builds: self.builds.clone(),
            metrics: self.metrics.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        mut snapshot: SnapshotData,
    ) -> Result<(), std::io::Error> {
        // No build between here and the switch: a build's layer of the
        // replaced state must not be flushed into the installed generation.
        // An extension holds builds off since its reception: its hold is
        // this install's.
        let held = snapshot.take_builds_held();
        let extension = held.is_some();
        let _build = match held {
            Some(held) => held,
            None => self.builds.clone().lock_owned().await,
        };
        // Durable before the state changes and before openraft purges.
        let files = self.files.clone();
        let installed_meta = meta.clone();
        let records = self.state.records().cloned();
        // On the lower-priority thread, as the check when it arrived: on a
        // node behind its leader no request waits on the install, and the
        // nodes serving writes get the cores first.
        let (registry, store) = background::run_io(move || {
            files.install(&installed_meta, snapshot, records.as_deref())
        })
        .await
        .map_err(|e| snapshot_error(Some(meta), "installing", e))?;
        let mut applied = self.state.write();
        let previous = std::mem::replace(&mut applied.registry, registry);
        // Readers see the installed generation with the installed registry
        // (the registry holds none of its records); what was on its way to
        // the old store is of the state replaced. From an older format the
        // registry holds every record, and the next build replaces the
        // store.
        if let Some(records) = self.state.records() {
            match store {
                Some(store) => records.switch_to(store),
                None => records.forget_layers(),
            }
        }
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        self.state.publish_cluster_id(&applied);
        drop(applied);
        // The replaced state is freed here, not under the lock.
        drop(previous);
        self.metrics.snapshots_installed.inc();
        if extension {
            self.metrics.snapshot_extensions_installed.inc();
        }
        tracing::info!(
            log_index = snapshot_index(meta),
            extension,
            "installed snapshot"
        );
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, std::io::Error> {
        let files = self.files.clone();
        let current = tokio::task::spawn_blocking(move || files.current())
            .await
            .map_err(|e| snapshot_error(None, "opening", e))?
            .map_err(|e| snapshot_error(None, "opening", e))?;
        Ok(current.map(|snapshot| Snapshot {
            meta: snapshot.meta().clone(),
            snapshot,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ReceiveError;

    fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<TypeConfig>(1, 1, index)),
            last_membership: StoredMembership::default(),
        }
    }

    fn registry_at(index: u64) -> Registry {
        let mut registry = Registry::new();
        registry.apply_other(index);
        registry
    }

    /// A bootstrapped registry with `keys` idempotency-key records, at
    /// index `keys + 1`.
    fn registry_with_keys(keys: u64) -> Registry {
        use oncekv_core::{
            ClusterId, Command, Entry, IdempotencyKey, Op, Principal, RegistryConfig,
        };
        let cluster_id = ClusterId(7);
        let mut registry = Registry::new();
        let bootstrap = Op::Bootstrap {
            cluster_id,
            config: RegistryConfig::default(),
        };
        registry.apply(1, &Entry::single(1_000, bootstrap));
        for n in 0..keys {
            let op = Op::ExecuteKeyed {
                cluster_id,
                key: IdempotencyKey(format!("k{n}").into_bytes()),
                command: Command::Increment {
                    key: b"n".to_vec(),
                    delta: 1,
                },
                principal: Principal::anonymous(),
            };
            registry.apply(n + 2, &Entry::single(1_000 + n, op));
        }
        assert_eq!(registry.key_count() as u64, keys);
        registry
    }

    /// A build moves the key records into the record store and writes a
    /// part file; a restart reads the part alone and leaves the records in
    /// the store, ignoring a newer part file the store never reached; a
    /// store that is not at the part file's index is refused.
    #[tokio::test]
    async fn a_restart_reads_the_part_and_leaves_the_key_records_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (snapshots, records) = (dir.path().join("snapshots"), dir.path().join("state"));
        let mut store = StateMachineStore::open_with_records(&snapshots, &records).unwrap();
        {
            let state = store.state();
            let mut applied = state.write();
            applied.registry = registry_with_keys(3);
            applied.last_applied = meta(4).last_log_id;
        }
        let mut builder = store.get_snapshot_builder().await;
        builder.build_snapshot().await.unwrap();
        let hash = snapshot::state_hash(&store.state().read().registry);
        assert_eq!(store.state().read().registry.key_records_held(), 0);
        drop((builder, store));

        let reopened = StateMachineStore::open_with_records(&snapshots, &records).unwrap();
        {
            let state = reopened.state();
            let applied = state.read();
            assert!(applied.registry.has_key_records_outside());
            assert_eq!(applied.registry.key_records_held(), 0);
            assert_eq!(applied.registry.key_count(), 3);
            assert_eq!(snapshot::state_hash(&applied.registry), hash);
            let view = reopened
                .state()
                .key_view(
                    &applied.registry,
                    &oncekv_core::Principal::anonymous(),
                    &oncekv_core::IdempotencyKey(b"k1".to_vec()),
                )
                .unwrap();
            assert_eq!(view.expect("k1 from the store").created_ms, 1_001);
        }
        // A build that stopped between renaming its part file and flushing
        // the store: that newer part file is not a snapshot, and goes.
        let part = snapshots.join(part_file_name(4));
        let stopped = snapshots.join(part_file_name(9));
        std::fs::copy(&part, &stopped).unwrap();
        drop(reopened);
        let reopened = StateMachineStore::open_with_records(&snapshots, &records).unwrap();
        assert_eq!(
            snapshot::state_hash(&reopened.state().read().registry),
            hash
        );
        assert!(!stopped.exists());
        // A store flushed past every snapshot, or deleted: the part file's
        // records are nowhere else, and the node refuses to start.
        let outside = reopened.state().records().unwrap().clone();
        let pending = outside.push(oncekv_core::RecordChanges::default());
        outside.flush(pending, 9).unwrap();
        drop((outside, reopened));
        let refused = StateMachineStore::open_with_records(&snapshots, &records).err();
        assert!(
            matches!(&refused, Some(StateMachineError::Corrupt { reason, .. }) if reason.contains("record store")),
            "{refused:?}"
        );
        std::fs::remove_dir_all(&records).unwrap();
        assert!(StateMachineStore::open_with_records(&snapshots, &records).is_err());
        assert!(part.exists(), "nothing deleted by a refused start");
    }

    fn file_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A snapshot that finishes after a newer one (a build overtaken by an
    /// install) is discarded: the newer file stays current and on disk.
    #[test]
    fn older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateMachineStore::open(dir.path()).unwrap();
        let durable = store.durable_snapshot_index();
        store.files.build(&meta(9), &registry_at(9)).unwrap();
        let mut discarded = store.files.build(&meta(4), &registry_at(4)).unwrap();
        // The discarded build's handle still reads what it wrote.
        assert_eq!(discarded.read_registry().unwrap().applied_index(), 4);
        let current = store.files.current().unwrap().unwrap();
        assert_eq!(snapshot_index(current.meta()), 9);
        assert!(current.path().exists());
        assert_eq!(*durable.borrow(), 9);
        assert_eq!(
            file_names(dir.path()),
            vec![snapshot_file_name(9)],
            "only the newest snapshot file remains"
        );
        drop(store);
        let reopened = StateMachineStore::open(dir.path()).unwrap();
        assert_eq!(reopened.state().read().registry.applied_index(), 9);
    }

    /// The registry bytes of a snapshot at `index`.
    fn registry_bytes(index: u64) -> Vec<u8> {
        snapshot::to_bytes(&registry_at(index))
    }

    fn temporary_files(dir: &Path) -> Vec<String> {
        file_names(dir)
            .into_iter()
            .filter(|name| name.ends_with(TEMPORARY_SUFFIX))
            .collect()
    }

    /// A reception that does not end in a whole snapshot of its meta — a
    /// stream that ends early, one that breaks off (the sender died), bytes
    /// of another index — replaces nothing and leaves no file behind.
    #[tokio::test]
    async fn a_partial_or_wrong_reception_replaces_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateMachineStore::open(dir.path()).unwrap();
        store.files.build(&meta(5), &registry_at(5)).unwrap();
        let inbox = store.snapshot_inbox();
        let bytes = registry_bytes(12);

        let mut cut_short = inbox.receive(&meta(12)).await.unwrap();
        cut_short
            .write(bytes[..bytes.len() / 2].to_vec())
            .await
            .unwrap();
        assert!(matches!(
            cut_short.finish().await,
            Err(ReceiveError::Invalid(_))
        ));

        let mut broken_off = inbox.receive(&meta(12)).await.unwrap();
        broken_off.write(bytes[..10].to_vec()).await.unwrap();
        assert_eq!(temporary_files(dir.path()).len(), 1, "written as it comes");
        drop(broken_off);

        let mut other_index = inbox.receive(&meta(12)).await.unwrap();
        other_index.write(registry_bytes(11)).await.unwrap();
        assert!(matches!(
            other_index.finish().await,
            Err(ReceiveError::Invalid(_))
        ));

        assert_eq!(file_names(dir.path()), vec![snapshot_file_name(5)]);
        let current = store.files.current().unwrap().unwrap();
        assert_eq!(snapshot_index(current.meta()), 5);
    }

    /// A received snapshot is written as it arrives, decoded from its
    /// file, and installed by renaming that file into place: the state,
    /// the current snapshot, the durable index and a reopened store are
    /// all at its index, and no other file remains.
    #[tokio::test]
    async fn a_received_snapshot_is_installed_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateMachineStore::open(dir.path()).unwrap();
        let durable = store.durable_snapshot_index();
        store.files.build(&meta(5), &registry_at(5)).unwrap();
        let mut incoming = store.snapshot_inbox().receive(&meta(12)).await.unwrap();
        for chunk in registry_bytes(12).chunks(3) {
            incoming.write(chunk.to_vec()).await.unwrap();
        }
        let received = incoming.finish().await.unwrap();
        assert_eq!(temporary_files(dir.path()).len(), 1);
        store.install_snapshot(&meta(12), received).await.unwrap();
        assert_eq!(store.state().read().registry.applied_index(), 12);
        assert_eq!(*durable.borrow(), 12);
        assert_eq!(file_names(dir.path()), vec![snapshot_file_name(12)]);
        let current = store.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, meta(12));
        drop(store);
        let reopened = StateMachineStore::open(dir.path()).unwrap();
        assert_eq!(reopened.state().read().registry.applied_index(), 12);
    }

    /// A received snapshot many write-behind windows long, in chunks of
    /// odd sizes, is written, checked and installed whole: every record
    /// and the registry's hash as sent.
    #[tokio::test]
    async fn a_snapshot_received_over_many_write_behind_windows_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateMachineStore::open(dir.path()).unwrap();
        let sent = registry_with_keys(12_000);
        let index = sent.applied_index();
        let bytes = snapshot::to_bytes(&sent);
        assert!(bytes.len() > 4 * (64 << 10), "{} bytes", bytes.len());
        let mut incoming = store.snapshot_inbox().receive(&meta(index)).await.unwrap();
        for chunk in bytes.chunks(7_777) {
            incoming.write(chunk.to_vec()).await.unwrap();
        }
        let received = incoming.finish().await.unwrap();
        store
            .install_snapshot(&meta(index), received)
            .await
            .unwrap();
        let installed = store.state().read().registry.clone();
        assert_eq!(installed.key_count(), 12_000);
        assert_eq!(snapshot::to_bytes(&installed), bytes);
    }

    /// The bytes `store`'s current snapshot sends.
    async fn current_bytes(store: &mut StateMachineStore) -> Vec<u8> {
        store
            .get_current_snapshot()
            .await
            .unwrap()
            .unwrap()
            .snapshot
            .into_chunks(1 << 16)
            .map(Result::unwrap)
            .concat()
            .await
    }

    /// Two state machines with record stores: a sender holding `keys` key
    /// records, built (its records flushed into its store), and an empty
    /// receiver. Returns them with the sender's current snapshot's bytes
    /// and where the receiver's store lives.
    async fn sender_and_receiver(
        dir: &Path,
        keys: u64,
    ) -> (StateMachineStore, StateMachineStore, Vec<u8>, PathBuf) {
        let sender =
            StateMachineStore::open_with_records(&dir.join("a/snapshots"), &dir.join("a/state"))
                .unwrap();
        {
            let state = sender.state();
            let mut applied = state.write();
            applied.registry = registry_with_keys(keys);
            applied.last_applied = meta(keys + 1).last_log_id;
        }
        let mut sender = sender;
        sender
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let bytes = current_bytes(&mut sender).await;
        let records = dir.join("b/state");
        let receiver =
            StateMachineStore::open_with_records(&dir.join("b/snapshots"), &records).unwrap();
        (sender, receiver, bytes, records)
    }

    fn generations(records: &Path) -> Vec<String> {
        file_names(records)
            .into_iter()
            .filter(|name| name.starts_with("gen-"))
            .collect()
    }

    /// Waits (with a deadline) until `done` holds: what a reception's own
    /// thread leaves once it has seen its stream end short.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// With a record store, a received snapshot's records go into a staged
    /// generation as they arrive and only its part into the file: the
    /// received file is the part file a build writes, no larger; the
    /// install names the generation in force and makes the part file and a
    /// view of it the current snapshot, which sends the very bytes the
    /// sender sent; a restart reads the part and the store.
    #[tokio::test]
    async fn a_received_snapshots_records_go_straight_into_a_staged_generation() {
        let dir = tempfile::tempdir().unwrap();
        let keys = 3_000;
        let (sender, mut receiver, bytes, records) = sender_and_receiver(dir.path(), keys).await;
        let index = keys + 1;
        let hash = snapshot::state_hash(&sender.state().read().registry);
        let sent_part = fs::metadata(dir.path().join("a/snapshots").join(part_file_name(index)))
            .unwrap()
            .len();
        assert!(bytes.len() as u64 > 2 * sent_part, "{} bytes", bytes.len());

        let snapshots = dir.path().join("b/snapshots");
        let mut incoming = receiver
            .snapshot_inbox()
            .receive(&meta(index))
            .await
            .unwrap();
        for chunk in bytes.chunks(7_777) {
            incoming.write(chunk.to_vec()).await.unwrap();
        }
        let received = incoming.finish().await.unwrap();
        assert!(
            received.whole_reader().is_err(),
            "not sent before installed"
        );
        let temporary = temporary_files(&snapshots);
        assert_eq!(temporary.len(), 1);
        assert_eq!(
            fs::metadata(snapshots.join(&temporary[0])).unwrap().len(),
            sent_part,
            "the received file holds the part alone"
        );
        assert_eq!(
            generations(&records).len(),
            2,
            "staged beside the one in force"
        );
        assert_eq!(
            fs::read_to_string(records.join("CURRENT")).unwrap().trim(),
            "gen-000001"
        );

        receiver
            .install_snapshot(&meta(index), received)
            .await
            .unwrap();
        assert_eq!(
            snapshot::state_hash(&receiver.state().read().registry),
            hash
        );
        assert_eq!(receiver.state().read().registry.key_records_held(), 0);
        assert_eq!(file_names(&snapshots), vec![part_file_name(index)]);
        assert_eq!(generations(&records), vec!["gen-000002".to_owned()]);
        let resent = current_bytes(&mut receiver).await;
        assert!(
            resent == bytes,
            "the installed snapshot sends what was received"
        );
        drop(receiver);

        let reopened = StateMachineStore::open_with_records(&snapshots, &records).unwrap();
        let state = reopened.state();
        let applied = state.read();
        assert_eq!(snapshot::state_hash(&applied.registry), hash);
        let k1 = state
            .key_view(
                &applied.registry,
                &oncekv_core::Principal::anonymous(),
                &oncekv_core::IdempotencyKey(b"k1".to_vec()),
            )
            .unwrap();
        assert_eq!(k1.expect("k1 from the store").created_ms, 1_001);
    }

    /// A follower at a base (a snapshot of 2,000 keys installed), its
    /// leader 1,000 keys further: the leader sends the part and the 1,000
    /// keys (plus any of the base's last millisecond) instead of 3,000; the
    /// follower adds them to its store in force, holding its builds off
    /// from the reception to the install, and then sends — and hashes —
    /// exactly what the leader's whole snapshot holds. An extension of a
    /// base the follower no longer has is refused before any byte.
    #[tokio::test]
    async fn a_snapshot_received_as_an_extension_of_the_base_is_the_whole() {
        use oncekv_core::extension::Extension;
        let dir = tempfile::tempdir().unwrap();
        let (mut sender, mut receiver, bytes, records) =
            sender_and_receiver(dir.path(), 2_000).await;
        let mut incoming = receiver
            .snapshot_inbox()
            .receive(&meta(2_001))
            .await
            .unwrap();
        incoming.write(bytes).await.unwrap();
        let received = incoming.finish().await.unwrap();
        receiver
            .install_snapshot(&meta(2_001), received)
            .await
            .unwrap();
        let base = receiver.snapshot_inbox().base().expect("a base");
        assert_eq!(base.id.index, 2_001);

        {
            let state = sender.state();
            let mut applied = state.write();
            applied.registry = registry_with_keys(3_000);
            applied.last_applied = meta(3_001).last_log_id;
        }
        sender
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let whole = current_bytes(&mut sender).await;
        let hash = snapshot::state_hash(&sender.state().read().registry);
        // The leader's extension of a follower's base.
        async fn extension_of(
            sender: &mut StateMachineStore,
            base: &crate::shared::snapshot_file::DurableBase,
        ) -> Vec<u8> {
            let current = sender.get_current_snapshot().await.unwrap().unwrap();
            let plan = Extension::plan(
                current.snapshot.base().expect("a part's base"),
                &base.records,
                base.bytes_max,
            )
            .expect("only keys added");
            current
                .snapshot
                .into_framed_chunks(1 << 16, Some(Arc::new(plan)), std::mem::take)
                .map(Result::unwrap)
                .concat()
                .await
        }
        let extension = extension_of(&mut sender, &base).await;
        assert!(
            extension.len() * 2 < whole.len(),
            "{} of {} bytes",
            extension.len(),
            whole.len()
        );

        let inbox = receiver.snapshot_inbox();
        let moved = crate::shared::snapshot_file::BaseId {
            index: 2_000,
            ..base.id
        };
        assert!(matches!(
            inbox.receive_extension(&meta(3_001), moved).await,
            Err(ReceiveError::NotAnExtension(_))
        ));
        // A build of the follower's own while the records arrive goes on,
        // and moves its base: the extension is refused at its end.
        let mut incoming = inbox
            .receive_extension(&meta(3_001), base.id)
            .await
            .unwrap();
        for chunk in extension.chunks(7_777) {
            incoming.write(chunk.to_vec()).await.unwrap();
        }
        {
            let state = receiver.state();
            let mut applied = state.write();
            applied.registry = registry_with_keys(2_500);
            applied.last_applied = meta(2_501).last_log_id;
        }
        receiver
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert!(matches!(
            incoming.finish().await,
            Err(ReceiveError::NotAnExtension(_))
        ));
        // Asked again, the follower tells its new base, and the extension
        // of that one is taken.
        let base = inbox.base().unwrap();
        assert_eq!(base.id.index, 2_501);
        let extension = extension_of(&mut sender, &base).await;
        let mut incoming = inbox
            .receive_extension(&meta(3_001), base.id)
            .await
            .unwrap();
        for chunk in extension.chunks(7_777) {
            incoming.write(chunk.to_vec()).await.unwrap();
        }
        let received = incoming.finish().await.unwrap();
        assert!(
            receiver.builds.try_lock().is_err(),
            "builds held off until the install"
        );
        receiver
            .install_snapshot(&meta(3_001), received)
            .await
            .unwrap();
        assert!(receiver.builds.try_lock().is_ok());
        assert_eq!(
            snapshot::state_hash(&receiver.state().read().registry),
            hash
        );
        // (The follower's own build wrote a new generation: its registry
        // was set whole here, every record in memory. The extension wrote
        // none.)
        assert_eq!(generations(&records), vec!["gen-000003".to_owned()]);
        assert!(
            current_bytes(&mut receiver).await == whole,
            "the store extended holds the leader's records"
        );
        assert_eq!(inbox.base().unwrap().id.index, 3_001);
        drop((receiver, inbox));
        let reopened =
            StateMachineStore::open_with_records(&dir.path().join("b/snapshots"), &records)
                .unwrap();
        assert_eq!(
            snapshot::state_hash(&reopened.state().read().registry),
            hash
        );
    }

    /// A reception that goes wrong among the records — a byte changed, a
    /// stream cut short, one broken off — is refused or dropped, and
    /// leaves no file and no staged generation: the receiver's store and
    /// snapshot stay as they were.
    #[tokio::test]
    async fn a_bad_or_broken_reception_among_the_records_leaves_nothing_staged() {
        let dir = tempfile::tempdir().unwrap();
        let keys = 3_000;
        let (_sender, receiver, bytes, records) = sender_and_receiver(dir.path(), keys).await;
        let index = keys + 1;
        let snapshots = dir.path().join("b/snapshots");
        let inbox = receiver.snapshot_inbox();
        let untouched = || {
            temporary_files(&snapshots).is_empty()
                && generations(&records) == ["gen-000001".to_owned()]
        };

        let mut changed = bytes.clone();
        let at = changed.len() * 3 / 4;
        changed[at] ^= 0x20;
        let mut incoming = inbox.receive(&meta(index)).await.unwrap();
        let mut refused = None;
        for chunk in changed.chunks(7_777) {
            if let Err(error) = incoming.write(chunk.to_vec()).await {
                refused = Some(error);
                break;
            }
        }
        let refused = match refused {
            Some(error) => error,
            None => incoming.finish().await.unwrap_err(),
        };
        assert!(matches!(refused, ReceiveError::Invalid(_)), "{refused}");
        assert!(untouched());

        let mut cut_short = inbox.receive(&meta(index)).await.unwrap();
        cut_short.write(bytes[..at].to_vec()).await.unwrap();
        let refused = cut_short.finish().await.unwrap_err();
        assert!(matches!(refused, ReceiveError::Invalid(_)), "{refused}");
        assert!(untouched());

        let mut broken_off = inbox.receive(&meta(index)).await.unwrap();
        broken_off.write(bytes[..at].to_vec()).await.unwrap();
        eventually("the records staged as they came", || {
            generations(&records).len() == 2
        })
        .await;
        drop(broken_off);
        eventually("the reception cleaned up", untouched).await;

        // And the inbox is free for the next one.
        let mut whole = inbox.receive(&meta(index)).await.unwrap();
        whole.write(bytes.clone()).await.unwrap();
        whole.finish().await.unwrap();
    }

    /// After a crash, temporary snapshot files — a build killed mid-write,
    /// a reception killed mid-stream, a reception complete but killed
    /// before its install renamed it — are deleted unread: the node
    /// restores the last snapshot renamed into place.
    #[tokio::test]
    async fn torn_temporary_files_are_ignored_at_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateMachineStore::open(dir.path()).unwrap();
            store.files.build(&meta(5), &registry_at(5)).unwrap();
            let bytes = registry_bytes(9);
            let (torn_build, _, _) =
                crate::shared::snapshot_file::write_temporary(dir.path(), &meta(9), |out| {
                    io::Write::write_all(out, &bytes[..bytes.len() / 2])
                })
                .unwrap();
            // A crash runs no destructor.
            torn_build.keep();
            // A reception killed mid-stream: its header and what came.
            let (torn_reception, _, _) =
                crate::shared::snapshot_file::write_temporary(dir.path(), &meta(12), |out| {
                    io::Write::write_all(out, &registry_bytes(12)[..20])
                })
                .unwrap();
            torn_reception.keep();
            let inbox = store.snapshot_inbox();
            let mut uninstalled = inbox.receive(&meta(13)).await.unwrap();
            uninstalled.write(registry_bytes(13)).await.unwrap();
            std::mem::forget(uninstalled.finish().await.unwrap());
            assert_eq!(temporary_files(dir.path()).len(), 3);
        }
        let mut reopened = StateMachineStore::open(dir.path()).unwrap();
        assert_eq!(reopened.state().read().registry.applied_index(), 5);
        let current = reopened.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, meta(5));
        assert_eq!(file_names(dir.path()), vec![snapshot_file_name(5)]);
    }

    /// A snapshot is sent as chunks of at most the chunk size that add up
    /// to its registry bytes, each read from the file only when the stream
    /// is polled for it: bytes changed in the file after the first chunk
    /// was taken show in the later ones, so the sender never held them.
    #[tokio::test]
    async fn chunks_are_read_from_the_file_as_the_stream_is_polled() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateMachineStore::open(dir.path()).unwrap();
        store.files.build(&meta(7), &registry_at(7)).unwrap();
        let bytes = registry_bytes(7);
        let whole: Vec<u8> = store
            .get_current_snapshot()
            .await
            .unwrap()
            .unwrap()
            .snapshot
            .into_chunks(5)
            .map(|chunk| {
                let chunk = chunk.unwrap();
                assert!(!chunk.is_empty() && chunk.len() <= 5);
                chunk
            })
            .concat()
            .await;
        assert_eq!(whole, bytes);

        let current = store.get_current_snapshot().await.unwrap().unwrap();
        let offset = current.snapshot.registry_offset();
        let path = current.snapshot.path().to_path_buf();
        let mut chunks = Box::pin(current.snapshot.into_chunks(5));
        let first = chunks.next().await.unwrap().unwrap();
        assert_eq!(first, bytes[..5]);
        let rewritten = fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&rewritten, &[0xEE; 5], offset + 5).unwrap();
        let second = chunks.next().await.unwrap().unwrap();
        assert_eq!(second, [0xEE; 5], "read after the file changed");
    }
}
