//! The on-disk home of the records whose number grows with rate × TTL —
//! idempotency keys and completed claims (DESIGN rule 21; issue 26's phase
//! 2, docs/state-beyond-ram.md §4) — over fjall, the store chosen there by
//! benchmark.
//!
//! It owns: the directory layout (generations of the store, the one in
//! force named by a `CURRENT` file that changes by atomic rename); the
//! framing of a stored value (format byte, creation-time group, record
//! bytes); the **checkpoint** row, written in the same atomic batch as the
//! record changes it covers and fsynced before [`RecordStore::flush`]
//! returns (rule 4: records and the applied state they belong to move
//! together); read **views** that see one checkpoint and its records while
//! flushes go on; the compaction filter that drops the records of expired
//! groups; and installing a received state into a new generation.
//!
//! It must not decide anything about a record: keys and record bytes are
//! opaque here, the registry core says what changed and below which group
//! records are expired (the checkpoint's watermark), and nothing here reads
//! a clock or a random source. It must never drop a record that some
//! checkpoint still readable — the latest, or one a live view holds — says
//! is live: fjall's compaction filter runs whatever snapshots are open, so
//! the filter's watermark is the lowest of the durable one and every open
//! view's.

use fjall::compaction::filter::{
    CompactionFilter, CompactionFilterResult, Context, Factory, ItemAccessor, Verdict,
};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable as _};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// The format of a stored value (its first byte).
pub const VALUE_FORMAT: u8 = 1;
/// The format of the checkpoint row (its first byte).
pub const CHECKPOINT_FORMAT: u8 = 1;
/// The keyspace of the records.
const RECORDS: &str = "records";
/// The keyspace of the checkpoint row.
const META: &str = "meta";
/// The checkpoint row's key.
const CHECKPOINT_KEY: &[u8] = b"checkpoint";
/// The file naming the generation in force.
const CURRENT: &str = "CURRENT";

/// What can go wrong; every variant says which directory.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("record store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("record store {path}: {source}")]
    Store { path: PathBuf, source: fjall::Error },
    #[error("record store {path}: {why}")]
    Corrupt { path: PathBuf, why: String },
    #[error("record store: the expiry watermark would move back from {durable} to {requested}")]
    WatermarkBackwards { durable: u64, requested: u64 },
    #[error("record store install: keys must come in strictly increasing order")]
    OutOfOrder,
    #[error("record store install: reading the incoming state: {0}")]
    Incoming(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// One record as stored: the creation-time group its expiry goes by, and
/// the record's own bytes (the core's codec).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub group: u64,
    pub bytes: Vec<u8>,
}

impl StoredRecord {
    fn encode(&self) -> Vec<u8> {
        frame(VALUE_FORMAT, self.group, &self.bytes)
    }

    fn decode(value: &[u8]) -> Option<StoredRecord> {
        match unframe(value)? {
            (VALUE_FORMAT, group, bytes) => Some(StoredRecord {
                group,
                bytes: bytes.to_vec(),
            }),
            _ => None,
        }
    }
}

/// Both stored shapes, a value and the checkpoint row: a format byte, a
/// big-endian number (the group, the watermark), then opaque bytes.
fn frame(format: u8, number: u64, bytes: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(9 + bytes.len());
    framed.push(format);
    framed.extend_from_slice(&number.to_be_bytes());
    framed.extend_from_slice(bytes);
    framed
}

fn unframe(framed: &[u8]) -> Option<(u8, u64, &[u8])> {
    let (&format, rest) = framed.split_first()?;
    let (number, bytes) = rest.split_first_chunk::<8>()?;
    Some((format, u64::from_be_bytes(*number), bytes))
}

/// The row that says which applied state the records belong to: written
/// in the batch of every flush, read back at open and in every view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Records of groups below it are expired: absent to every reader,
    /// dropped by compaction when no open view is older.
    pub watermark: u64,
    /// The caller's description of the applied state (log id, membership,
    /// the in-memory part's file and hash), opaque here.
    pub applied: Vec<u8>,
}

impl Checkpoint {
    fn encode(&self) -> Vec<u8> {
        frame(CHECKPOINT_FORMAT, self.watermark, &self.applied)
    }

    fn decode(path: &Path, row: &[u8]) -> Result<Checkpoint> {
        let corrupt = |why: String| Error::Corrupt {
            path: path.to_owned(),
            why,
        };
        match unframe(row) {
            Some((CHECKPOINT_FORMAT, watermark, applied)) => Ok(Checkpoint {
                watermark,
                applied: applied.to_vec(),
            }),
            Some((format, _, _)) => Err(corrupt(format!(
                "checkpoint format {format}, this build reads {CHECKPOINT_FORMAT}"
            ))),
            None => Err(corrupt("a truncated checkpoint row".to_owned())),
        }
    }
}

/// Node-local tuning: how a node stores, never what it decides.
#[derive(Clone, Debug)]
pub struct Options {
    /// fjall's block cache.
    pub cache_bytes: u64,
    /// The journal kept before memtables must be flushed to tables: what a
    /// restart replays at most.
    pub max_journaling_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 64 << 20,
            max_journaling_bytes: 128 << 20,
        }
    }
}

/// The expiry watermarks in force: the durable one (the latest flushed
/// checkpoint's) and each open view's. The compaction filter drops only
/// below the lowest of them.
#[derive(Debug, Default)]
struct Pins {
    state: Mutex<PinState>,
}

#[derive(Debug, Default)]
struct PinState {
    durable: u64,
    views: BTreeMap<u64, u64>,
    next_view: u64,
}

impl Pins {
    fn lock(&self) -> MutexGuard<'_, PinState> {
        // A panic elsewhere while holding it leaves plain numbers behind.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn filter_watermark(&self) -> u64 {
        let state = self.lock();
        state.views.values().copied().fold(state.durable, u64::min)
    }

    /// Registers a view at the durable watermark; its id.
    fn pin(&self) -> u64 {
        let mut state = self.lock();
        let id = state.next_view;
        state.next_view += 1;
        let durable = state.durable;
        state.views.insert(id, durable);
        id
    }

    fn unpin(&self, id: u64) {
        self.lock().views.remove(&id);
    }
}

struct ExpiredGroups(Arc<Pins>);

impl Factory for ExpiredGroups {
    fn name(&self) -> &str {
        "oncekv-expired-groups"
    }

    fn make_filter(&self, _: &Context) -> Box<dyn CompactionFilter> {
        Box::new(ExpiredGroupsFilter(self.0.filter_watermark()))
    }
}

/// Drops a record whose group is below the watermark it was made with; a
/// value it cannot read is kept (never drop what we do not understand).
struct ExpiredGroupsFilter(u64);

impl CompactionFilter for ExpiredGroupsFilter {
    fn filter_item(&mut self, item: ItemAccessor<'_>, _: &Context) -> CompactionFilterResult {
        // Only the group is read: compaction meets every record.
        let value = item.value()?;
        Ok(match unframe(&value) {
            Some((VALUE_FORMAT, group, _)) if group < self.0 => Verdict::Remove,
            _ => Verdict::Keep,
        })
    }
}

/// One generation: a fjall database in its own directory.
struct Generation {
    number: u64,
    dir: PathBuf,
    db: Database,
    records: Keyspace,
    meta: Keyspace,
    pins: Arc<Pins>,
    /// Declared last, so dropped after the database closed.
    retired: Retired,
}

/// A generation replaced by an install: its directory is deleted when the
/// last holder (the replaced store, a view) lets it go, not only at the
/// next open.
#[derive(Debug)]
struct Retired {
    dir: PathBuf,
    retired: std::sync::atomic::AtomicBool,
}

impl Drop for Retired {
    fn drop(&mut self) {
        if self.retired.load(std::sync::atomic::Ordering::Acquire)
            && let Err(error) = std::fs::remove_dir_all(&self.dir)
        {
            // The next open deletes it.
            tracing::warn!(
                dir = %self.dir.display(),
                %error,
                "record store: could not delete a replaced generation"
            );
        }
    }
}

impl Generation {
    fn open(root: &Path, number: u64, options: &Options) -> Result<Generation> {
        let dir = generation_dir(root, number);
        let store_error = |source| Error::Store {
            path: dir.clone(),
            source,
        };
        let pins = Arc::new(Pins::default());
        let factory: Arc<dyn Factory> = Arc::new(ExpiredGroups(pins.clone()));
        let db = Database::builder(&dir)
            .cache_size(options.cache_bytes)
            .max_journaling_size(options.max_journaling_bytes)
            // Durability is ours to ask for: one fsync per flush.
            .manual_journal_persist(true)
            .with_compaction_filter_factories(Arc::new(move |name: &str| {
                (name == RECORDS).then(|| factory.clone())
            }))
            .open()
            .map_err(store_error)?;
        let records = db
            .keyspace(RECORDS, KeyspaceCreateOptions::default)
            .map_err(store_error)?;
        let meta = db
            .keyspace(META, KeyspaceCreateOptions::default)
            .map_err(store_error)?;
        let generation = Generation {
            number,
            retired: Retired {
                dir: dir.clone(),
                retired: std::sync::atomic::AtomicBool::new(false),
            },
            dir,
            db,
            records,
            meta,
            pins,
        };
        if let Some(checkpoint) = generation.checkpoint()? {
            generation.pins.lock().durable = checkpoint.watermark;
        }
        Ok(generation)
    }

    fn store_error(&self, source: fjall::Error) -> Error {
        Error::Store {
            path: self.dir.clone(),
            source,
        }
    }

    /// Commits `batch` with `checkpoint` in it, atomically, and fsyncs the
    /// journal; only then may compaction drop below its watermark.
    fn commit(&self, mut batch: fjall::OwnedWriteBatch, checkpoint: &Checkpoint) -> Result<()> {
        batch.insert(&self.meta, CHECKPOINT_KEY, checkpoint.encode());
        batch
            .commit()
            .and_then(|()| self.sync_journal())
            .map_err(|source| self.store_error(source))?;
        self.pins.lock().durable = checkpoint.watermark;
        Ok(())
    }

    /// Makes every write so far durable (`fdatasync` of the journal): the
    /// one place the store asks for it. Built with `sync-ledger` (its own
    /// tests only), it then notes what is on disk, for the simulated power
    /// loss of `tests/store.rs`.
    fn sync_journal(&self) -> fjall::Result<()> {
        self.db.persist(PersistMode::SyncData)?;
        #[cfg(feature = "sync-ledger")]
        sync_ledger::synced(&self.dir);
        Ok(())
    }

    fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        let row = self
            .meta
            .get(CHECKPOINT_KEY)
            .map_err(|source| self.store_error(source))?;
        row.map(|row| Checkpoint::decode(&self.dir, &row))
            .transpose()
    }

    fn decode(&self, value: &[u8]) -> Result<StoredRecord> {
        StoredRecord::decode(value).ok_or_else(|| Error::Corrupt {
            path: self.dir.clone(),
            why: "a record value of an unknown format".to_owned(),
        })
    }
}

/// The record store of one node.
pub struct RecordStore {
    root: PathBuf,
    options: Options,
    generation: Arc<Generation>,
    /// One flush or install at a time.
    writer: Mutex<()>,
}

impl RecordStore {
    /// Opens the store under `root` (created when missing): the generation
    /// `CURRENT` names, with fjall replaying its journal; every other
    /// generation directory (an install that did not finish, a generation
    /// replaced by an install) is deleted.
    pub fn open(root: &Path, options: &Options) -> Result<RecordStore> {
        std::fs::create_dir_all(root).map_err(|source| io_error(root, source))?;
        let number = match read_current(root)? {
            Some(number) => number,
            None if generations(root)?.is_empty() => {
                write_current(root, 1)?;
                1
            }
            // Never guess which generation is whole: deleting the others
            // could delete the only good one.
            None => {
                return Err(Error::Corrupt {
                    path: root.join(CURRENT),
                    why: "missing, but generation directories exist: restore it (it names \
                          the generation in force, `gen-NNNNNN`) or remove the directory to \
                          rebuild this node's records from a snapshot"
                        .to_owned(),
                });
            }
        };
        remove_other_generations(root, number)?;
        let generation = Generation::open(root, number, options)?;
        Ok(RecordStore {
            root: root.to_owned(),
            options: options.clone(),
            generation: Arc::new(generation),
            writer: Mutex::new(()),
        })
    }

    /// The latest flushed checkpoint (`None` for a store never flushed).
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        self.generation.checkpoint()
    }

    /// The stored record of `key`, whatever its group (the caller knows
    /// which groups are live at the state it is applying).
    pub fn get(&self, key: &[u8]) -> Result<Option<StoredRecord>> {
        let generation = &self.generation;
        let value = generation
            .records
            .get(key)
            .map_err(|source| generation.store_error(source))?;
        value.map(|value| generation.decode(&value)).transpose()
    }

    /// Writes `changes` (a record, or `None` for a removal) and the
    /// checkpoint they bring the store to in one atomic batch, and fsyncs
    /// it before returning: after a crash the store holds all of it or
    /// none. The watermark never moves back.
    pub fn flush<I>(&self, changes: I, checkpoint: &Checkpoint) -> Result<()>
    where
        I: IntoIterator<Item = (Vec<u8>, Option<StoredRecord>)>,
    {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let generation = &self.generation;
        let durable = generation.pins.lock().durable;
        if checkpoint.watermark < durable {
            return Err(Error::WatermarkBackwards {
                durable,
                requested: checkpoint.watermark,
            });
        }
        let mut batch = generation.db.batch();
        for (key, record) in changes {
            match record {
                Some(record) => batch.insert(&generation.records, key, record.encode()),
                None => batch.remove(&generation.records, key),
            }
        }
        generation.commit(batch, checkpoint)
    }

    /// A point-in-time view: the checkpoint flushed last when it was taken
    /// and exactly its records, however many flushes follow, for as long as
    /// the view lives (it holds old tables on disk, not in memory).
    pub fn view(&self) -> Result<View> {
        let generation = self.generation.clone();
        // Pinned before the snapshot: a compaction that starts after this
        // keeps every group at or above what any later checkpoint's view
        // needs (watermarks only grow).
        let pin = generation.pins.pin();
        let snapshot = generation.db.snapshot();
        // Built first, so that an error below unpins through its drop.
        let mut view = View {
            snapshot,
            generation,
            checkpoint: None,
            pin,
        };
        let generation = &view.generation;
        let row = view
            .snapshot
            .get(&generation.meta, CHECKPOINT_KEY)
            .map_err(|source| generation.store_error(source))?;
        let checkpoint = row
            .map(|row| Checkpoint::decode(&generation.dir, &row))
            .transpose()?;
        view.checkpoint = checkpoint;
        Ok(view)
    }

    /// Builds a new generation from a received state — `records` in
    /// strictly increasing key order (records below the checkpoint's
    /// watermark are skipped), written as tables directly — commits
    /// `checkpoint` in it, fsyncs, and only then names it in `CURRENT`.
    /// Returns the new store; this one (and its views) go on reading the
    /// old generation until dropped, and its directory is deleted at the
    /// next open. A crash before `CURRENT` changes leaves the old
    /// generation in force.
    pub fn install<I>(&self, records: I, checkpoint: &Checkpoint) -> Result<RecordStore>
    where
        I: IntoIterator<Item = std::result::Result<(Vec<u8>, StoredRecord), String>>,
    {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // The number came from `CURRENT`: a damaged file may name the last
        // one there is.
        let number = self
            .generation
            .number
            .checked_add(1)
            .ok_or_else(|| Error::Corrupt {
                path: self.root.join(CURRENT),
                why: "it names the last generation number there is".to_owned(),
            })?;
        let dir = generation_dir(&self.root, number);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| io_error(&dir, source))?;
        }
        let generation = Generation::open(&self.root, number, &self.options)?;
        {
            let mut ingestion = generation
                .records
                .start_ingestion()
                .map_err(|source| generation.store_error(source))?;
            let mut last: Option<Vec<u8>> = None;
            for item in records {
                let (key, record) = item.map_err(Error::Incoming)?;
                if last.as_ref().is_some_and(|last| *last >= key) {
                    return Err(Error::OutOfOrder);
                }
                if record.group >= checkpoint.watermark {
                    ingestion
                        .write(key.clone(), record.encode())
                        .map_err(|source| generation.store_error(source))?;
                }
                last = Some(key);
            }
            ingestion
                .finish()
                .map_err(|source| generation.store_error(source))?;
        }
        generation.commit(generation.db.batch(), checkpoint)?;
        write_current(&self.root, number)?;
        self.generation
            .retired
            .retired
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(RecordStore {
            root: self.root.clone(),
            options: self.options.clone(),
            generation: Arc::new(generation),
            writer: Mutex::new(()),
        })
    }

    /// Bytes on disk of the generation in force (tables, journal, blobs).
    pub fn disk_bytes(&self) -> u64 {
        self.generation.db.disk_space().unwrap_or(0)
    }

    /// Forces a major compaction of the records (tests and operators): the
    /// records of groups below every readable watermark leave the disk.
    pub fn compact(&self) -> Result<()> {
        let generation = &self.generation;
        // Records still in the memtable go to a table first: compaction
        // (and so the filter) reads tables only.
        generation
            .records
            .rotate_memtable_and_wait()
            .and_then(|()| generation.records.major_compact())
            .map_err(|source| generation.store_error(source))
    }

    /// The generation in force (its directory is `gen-NNNNNN`).
    pub fn generation(&self) -> u64 {
        self.generation.number
    }
}

/// One checkpoint and its records, frozen (see [`RecordStore::view`]).
pub struct View {
    // Dropped before the generation: the last holder of a retired
    // generation closes its database before the directory goes.
    snapshot: fjall::Snapshot,
    generation: Arc<Generation>,
    checkpoint: Option<Checkpoint>,
    pin: u64,
}

impl Drop for View {
    fn drop(&mut self) {
        self.generation.pins.unpin(self.pin);
    }
}

impl View {
    /// The checkpoint this view reads (`None`: the store was empty).
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    fn watermark(&self) -> u64 {
        self.checkpoint.as_ref().map_or(0, |c| c.watermark)
    }

    /// The record of `key` as of this view, whatever its group.
    pub fn get(&self, key: &[u8]) -> Result<Option<StoredRecord>> {
        let generation = &self.generation;
        let value = self
            .snapshot
            .get(&generation.records, key)
            .map_err(|source| generation.store_error(source))?;
        value.map(|value| generation.decode(&value)).transpose()
    }

    /// The live records (groups at or above the watermark) with keys at or
    /// after `start`, in key order: what a snapshot sends and a page lists.
    pub fn records_from<'a>(
        &'a self,
        start: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, StoredRecord)>> + use<'a> {
        let watermark = self.watermark();
        let generation = &self.generation;
        self.snapshot
            .range(&generation.records, start.to_vec()..)
            .filter_map(move |guard| {
                let item = guard
                    .into_inner()
                    .map_err(|source| generation.store_error(source))
                    .and_then(|(key, value)| Ok((key.to_vec(), generation.decode(&value)?)));
                match item {
                    Ok((_, ref record)) if record.group < watermark => None,
                    other => Some(other),
                }
            })
    }

    /// Every live record, in key order.
    pub fn records(&self) -> impl Iterator<Item = Result<(Vec<u8>, StoredRecord)>> + '_ {
        self.records_from(&[])
    }
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_owned(),
        source,
    }
}

fn generation_dir(root: &Path, number: u64) -> PathBuf {
    root.join(format!("gen-{number:06}"))
}

fn read_current(root: &Path) -> Result<Option<u64>> {
    let path = root.join(CURRENT);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io_error(&path, source)),
    };
    text.trim()
        .strip_prefix("gen-")
        .and_then(|number| number.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| Error::Corrupt {
            path,
            why: format!("CURRENT should name a generation (gen-NNNNNN), not {text:?}"),
        })
}

/// Names generation `number` in `CURRENT`: written aside, fsynced, renamed
/// over, and the directory fsynced, so a crash leaves the old name or the
/// new one.
fn write_current(root: &Path, number: u64) -> Result<()> {
    use std::io::Write as _;
    let tmp = root.join("CURRENT.tmp");
    let mut file = std::fs::File::create(&tmp).map_err(|source| io_error(&tmp, source))?;
    file.write_all(format!("gen-{number:06}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error(&tmp, source))?;
    let current = root.join(CURRENT);
    std::fs::rename(&tmp, &current).map_err(|source| io_error(&current, source))?;
    std::fs::File::open(root)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| io_error(root, source))
}

/// The generation directories under `root`: (number, path).
fn generations(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = std::fs::read_dir(root).map_err(|source| io_error(root, source))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| io_error(root, source))?;
        let name = entry.file_name();
        let number = name
            .to_str()
            .and_then(|name| name.strip_prefix("gen-"))
            .and_then(|number| number.parse::<u64>().ok());
        if let Some(number) = number {
            found.push((number, entry.path()));
        }
    }
    Ok(found)
}

fn remove_other_generations(root: &Path, keep: u64) -> Result<()> {
    for (number, path) in generations(root)? {
        if number != keep {
            std::fs::remove_dir_all(&path).map_err(|source| io_error(&path, source))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored value carries its format and group; anything else is not
    /// read as a record (and so never dropped by the filter).
    #[test]
    fn values_round_trip_and_unknown_formats_are_refused() {
        let record = StoredRecord {
            group: 0x0102_0304_0506_0708,
            bytes: b"answer".to_vec(),
        };
        assert_eq!(StoredRecord::decode(&record.encode()), Some(record.clone()));
        let mut other = record.encode();
        other[0] = 2;
        assert_eq!(StoredRecord::decode(&other), None);
        assert_eq!(StoredRecord::decode(&[VALUE_FORMAT, 1, 2]), None);
        assert_eq!(StoredRecord::decode(&[]), None);
    }

    /// The filter's watermark is the lowest of the durable one and every
    /// open view's.
    #[test]
    fn the_filter_watermark_waits_for_the_oldest_view() {
        let pins = Pins::default();
        pins.lock().durable = 5;
        let old = pins.pin();
        pins.lock().durable = 9;
        let new = pins.pin();
        assert_eq!(pins.filter_watermark(), 5);
        pins.unpin(old);
        assert_eq!(pins.filter_watermark(), 9);
        pins.unpin(new);
        pins.lock().durable = 12;
        assert_eq!(pins.filter_watermark(), 12);
    }
}

/// Test-only (feature `sync-ledger`): after every journal sync, appends to
/// the file named by `ONCEKV_RECORDS_SYNC_LEDGER` one line per journal of
/// the generation — `<generation dir name>/<journal file name> <bytes>`,
/// where its data ends (fjall preallocates journals with zeros) — so a
/// test can zero everything past the last sync, as a power loss would
/// lose what the page cache had not written. Nothing is noted for writes
/// that were never synced.
#[cfg(feature = "sync-ledger")]
mod sync_ledger {
    use std::io::Write as _;
    use std::path::Path;

    pub(super) fn synced(generation: &Path) {
        let Some(ledger) = std::env::var_os("ONCEKV_RECORDS_SYNC_LEDGER") else {
            return;
        };
        let Some(name) = generation.file_name() else {
            return;
        };
        let mut lines = String::new();
        for entry in std::fs::read_dir(generation)
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_none_or(|extension| extension != "jnl") {
                continue;
            }
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let end = bytes
                .iter()
                .rposition(|&byte| byte != 0)
                .map_or(0, |at| at + 1);
            lines.push_str(&format!(
                "{}/{} {end}\n",
                name.to_string_lossy(),
                entry.file_name().to_string_lossy()
            ));
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(ledger)
            .and_then(|mut file| file.write_all(lines.as_bytes()));
        written.expect("the sync ledger is writable");
    }
}
