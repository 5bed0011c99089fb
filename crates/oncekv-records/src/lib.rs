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
//! groups; installing a received state into a new generation, staged
//! whole while the one in force goes on, then put in force; and fjall's
//! worker threads: how many (one) and at what priority (below the
//! process's, like the node's other background work).
//!
//! A record's **kind** is the first byte of its store key (the core's
//! `stored` module: 1 for idempotency keys, 2 for finished claims). Kinds
//! expire apart, as their TTLs differ: the checkpoint carries one expiry
//! watermark per kind, and a record is expired when its group is below its
//! own kind's watermark. A kind the checkpoint does not name has watermark
//! 0 (nothing of it is expired), and so does a record with an empty key.
//!
//! It must not decide anything about a record: beyond the kind byte, keys
//! and record bytes are opaque here; the registry core says what changed
//! and below which group each kind's records are expired (the checkpoint's
//! watermarks), and nothing here reads a clock or a random source. It must
//! never drop a record that some checkpoint still readable — the latest,
//! or one a live view holds — says is live: fjall's compaction filter runs
//! whatever snapshots are open, so the filter's watermark for a kind is
//! the lowest of the durable one and every open view's for that kind.

use fjall::compaction::filter::{
    CompactionFilter, CompactionFilterResult, Context, Factory, ItemAccessor, Verdict,
};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable as _};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// The format of a stored value (its first byte).
pub const VALUE_FORMAT: u8 = 1;
/// The format of the checkpoint row (its first byte): `2 ‖ n u16 ‖ (kind u8,
/// watermark u64)ⁿ ‖ applied` (numbers big-endian, kinds strictly
/// increasing), written when a checkpoint names a kind other than
/// [`FORMAT_1_KIND`].
pub const CHECKPOINT_FORMAT: u8 = 2;
/// The checkpoint format of one watermark: `1 ‖ watermark u64 ‖ applied`.
/// Still read, as that watermark for every kind; still written for a
/// checkpoint that names no kind but [`FORMAT_1_KIND`], byte for byte as
/// builds before per-kind watermarks wrote it, so that they read such a
/// store.
pub const CHECKPOINT_FORMAT_1: u8 = 1;
/// The one kind a format-1 checkpoint is written for (the core's
/// idempotency keys): the only kind of record stores had before kinds
/// expired apart.
pub const FORMAT_1_KIND: u8 = 1;
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
    #[error(
        "record store: the expiry watermark of kind {kind} would move back from {durable} to \
         {requested}"
    )]
    WatermarkBackwards {
        kind: u8,
        durable: u64,
        requested: u64,
    },
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

    /// [`StoredRecord::encode`] appended to `out`.
    fn encode_into(&self, out: &mut Vec<u8>) {
        frame_into(out, VALUE_FORMAT, self.group, &self.bytes);
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

/// One live row of a [`View`] as the store holds it, read without a copy
/// ([`View::raw_records_from_shared`]).
pub struct RawRecord {
    key: fjall::UserKey,
    value: fjall::UserValue,
    group: u64,
}

impl RawRecord {
    /// The store key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The creation-time group the record's expiry goes by.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// The record's own bytes, as [`StoredRecord::bytes`].
    pub fn bytes(&self) -> &[u8] {
        // The frame was checked when the row was read.
        &self.value[VALUE_HEADER_BYTES..]
    }
}

/// A stored value's frame before the record's bytes: the format byte and
/// the group ([`frame`]).
const VALUE_HEADER_BYTES: usize = 1 + std::mem::size_of::<u64>();

/// A stored value and a format-1 checkpoint row: a format byte, a
/// big-endian number (the group, the watermark), then opaque bytes.
fn frame(format: u8, number: u64, bytes: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(9 + bytes.len());
    frame_into(&mut framed, format, number, bytes);
    framed
}

fn frame_into(out: &mut Vec<u8>, format: u8, number: u64, bytes: &[u8]) {
    out.push(format);
    out.extend_from_slice(&number.to_be_bytes());
    out.extend_from_slice(bytes);
}

fn unframe(framed: &[u8]) -> Option<(u8, u64, &[u8])> {
    let (&format, rest) = framed.split_first()?;
    let (number, bytes) = rest.split_first_chunk::<8>()?;
    Some((format, u64::from_be_bytes(*number), bytes))
}

/// The row that says which applied state the records belong to: written
/// in the batch of every flush, read back at open and in every view.
///
/// A checkpoint that names kind [`FORMAT_1_KIND`] alone is written as
/// format 1 and so reads back naming every kind at that watermark: the
/// same for that kind's records, and no other kind's records lie under
/// such a checkpoint (the registry names one kind only while it stores one
/// kind). Compare checkpoints read back by [`Checkpoint::watermark`], not
/// as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Per kind (a store key's first byte): records of that kind whose
    /// group is below it are expired — absent to every reader, dropped by
    /// compaction when no open view is older. A kind not named has
    /// watermark 0.
    pub watermarks: BTreeMap<u8, u64>,
    /// The caller's description of the applied state (log id, membership,
    /// the in-memory part's file and hash), opaque here.
    pub applied: Vec<u8>,
}

/// A format-2 checkpoint's bytes before its watermarks: format, count.
const CHECKPOINT_HEAD_BYTES: usize = 3;
/// One watermark of a format-2 checkpoint: kind, watermark.
const CHECKPOINT_ENTRY_BYTES: usize = 9;

impl Checkpoint {
    /// The watermark of records of `kind` (0 when the checkpoint does not
    /// name it).
    pub fn watermark(&self, kind: u8) -> u64 {
        self.watermarks.get(&kind).copied().unwrap_or(0)
    }

    /// The watermark of the record stored under `key`: its kind's (0 for
    /// an empty key).
    fn watermark_of(&self, key: &[u8]) -> u64 {
        key.first().map_or(0, |&kind| self.watermark(kind))
    }

    /// Whether this checkpoint is written in format 1: it names no kind but
    /// [`FORMAT_1_KIND`].
    fn is_format_1(&self) -> bool {
        self.watermarks.keys().all(|&kind| kind == FORMAT_1_KIND)
    }

    fn encode(&self) -> Vec<u8> {
        if self.is_format_1() {
            return frame(
                CHECKPOINT_FORMAT_1,
                self.watermark(FORMAT_1_KIND),
                &self.applied,
            );
        }
        let count = u16::try_from(self.watermarks.len()).expect("at most 256 kinds");
        let mut row = Vec::with_capacity(
            CHECKPOINT_HEAD_BYTES
                + CHECKPOINT_ENTRY_BYTES * self.watermarks.len()
                + self.applied.len(),
        );
        row.push(CHECKPOINT_FORMAT);
        row.extend_from_slice(&count.to_be_bytes());
        for (&kind, watermark) in &self.watermarks {
            row.push(kind);
            row.extend_from_slice(&watermark.to_be_bytes());
        }
        row.extend_from_slice(&self.applied);
        row
    }

    /// The checkpoint of `row`, and the watermarks it binds: those the
    /// next checkpoint may not move back, and that compaction goes by.
    /// They are the checkpoint's own, except for format 1: it reads as
    /// one watermark for every kind, but binds [`FORMAT_1_KIND`]'s only —
    /// it was only ever written over records of that kind, and the first
    /// format-2 checkpoint may name another kind's first watermark below
    /// it.
    fn decode(path: &Path, row: &[u8]) -> Result<(Checkpoint, Watermarks)> {
        let corrupt = |why: String| Error::Corrupt {
            path: path.to_owned(),
            why,
        };
        match row.split_first() {
            Some((&CHECKPOINT_FORMAT_1, _)) => {
                let Some((_, watermark, applied)) = unframe(row) else {
                    return Err(corrupt("a truncated checkpoint row (format 1)".to_owned()));
                };
                let checkpoint = Checkpoint {
                    watermarks: (0..=u8::MAX).map(|kind| (kind, watermark)).collect(),
                    applied: applied.to_vec(),
                };
                Ok((checkpoint, BTreeMap::from([(FORMAT_1_KIND, watermark)])))
            }
            Some((&CHECKPOINT_FORMAT, rest)) => {
                let truncated = || corrupt("a truncated checkpoint row (format 2)".to_owned());
                let (count, mut rest) = rest.split_first_chunk::<2>().ok_or_else(truncated)?;
                let mut watermarks = BTreeMap::new();
                for _ in 0..u16::from_be_bytes(*count) {
                    let (&kind, tail) = rest.split_first().ok_or_else(truncated)?;
                    let (watermark, tail) = tail.split_first_chunk::<8>().ok_or_else(truncated)?;
                    if watermarks
                        .last_key_value()
                        .is_some_and(|(&last, _)| last >= kind)
                    {
                        return Err(corrupt(format!(
                            "a checkpoint row whose kinds are not in strictly increasing order \
                             (kind {kind})"
                        )));
                    }
                    watermarks.insert(kind, u64::from_be_bytes(*watermark));
                    rest = tail;
                }
                let checkpoint = Checkpoint {
                    watermarks,
                    applied: rest.to_vec(),
                };
                let binding = checkpoint.watermarks.clone();
                Ok((checkpoint, binding))
            }
            Some((format, _)) => Err(corrupt(format!(
                "checkpoint format {format}, this build reads {CHECKPOINT_FORMAT_1} and \
                 {CHECKPOINT_FORMAT}"
            ))),
            None => Err(corrupt("an empty checkpoint row".to_owned())),
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
    /// How many steps of Linux `nice` below the process fjall's worker
    /// threads run (0: at the priority of the thread that opens a
    /// generation). They flush and compact, which no request waits on —
    /// lookups read the store, only snapshot builds and installs write it
    /// — yet after a build they can take every core for seconds; the
    /// node's own background work runs 10 below too
    /// (docs/state-beyond-ram.md §4.9k). No other platform lowers them.
    pub worker_nice: i32,
    /// fjall's worker threads per generation (at least 1; see
    /// [`WORKER_THREADS`]).
    pub worker_threads: usize,
}

/// The default [`Options::worker_nice`]: as low as the node's background
/// threads.
pub const WORKER_NICE: i32 = 10;

/// The default [`Options::worker_threads`]: one. With more, fjall
/// (3.1.13) leaves every compaction to the others and its first worker
/// takes each compaction request off the queue only to put it back: while
/// a compaction runs and another request waits, that worker spins on a
/// core (docs/state-beyond-ram.md §4.9l). One worker flushes and compacts
/// in turn, and a flush then waits behind a compaction — which nothing on
/// the request path waits for: only builds and installs write the store,
/// a build with one batch, an install by ingestion. (fjall's worker also
/// blocks on its own bounded queue should writers fill it with a
/// thousand memtable-rotation requests during one compaction; one batch
/// per build never comes near.)
pub const WORKER_THREADS: usize = 1;

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 64 << 20,
            max_journaling_bytes: 128 << 20,
            worker_nice: WORKER_NICE,
            worker_threads: WORKER_THREADS,
        }
    }
}

/// Per kind, the watermark records of that kind are expired below (a kind
/// not named: 0).
type Watermarks = BTreeMap<u8, u64>;

/// The expiry watermarks in force, per kind: the durable ones (those the
/// latest flushed checkpoint binds) and each open view's. The compaction
/// filter drops a kind's records only below the lowest of them for that
/// kind.
#[derive(Debug, Default)]
struct Pins {
    state: Mutex<PinState>,
}

#[derive(Debug, Default)]
struct PinState {
    durable: Watermarks,
    views: BTreeMap<u64, Watermarks>,
    next_view: u64,
}

impl Pins {
    fn lock(&self) -> MutexGuard<'_, PinState> {
        // A panic elsewhere while holding it leaves plain numbers behind.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Per kind, the lowest of the durable watermark and every open
    /// view's: a kind some of them do not name is not in it (watermark 0).
    fn filter_watermarks(&self) -> Watermarks {
        let state = self.lock();
        let mut lowest = state.durable.clone();
        for view in state.views.values() {
            lowest.retain(|kind, watermark| match view.get(kind) {
                Some(&pinned) => {
                    *watermark = (*watermark).min(pinned);
                    true
                }
                None => false,
            });
        }
        lowest
    }

    /// Registers a view at the durable watermarks; its id.
    fn pin(&self) -> u64 {
        let mut state = self.lock();
        let id = state.next_view;
        state.next_view += 1;
        let durable = state.durable.clone();
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
        Box::new(ExpiredGroupsFilter(self.0.filter_watermarks()))
    }
}

/// Drops a record whose group is below its kind's watermark as the filter
/// was made; a record of a kind without one, with an empty key, or whose
/// value it cannot read is kept (never drop what we do not understand).
struct ExpiredGroupsFilter(Watermarks);

impl ExpiredGroupsFilter {
    /// The watermark of the record stored under `key`: its kind's, `None`
    /// for a kind without one or an empty key (kept).
    fn watermark_of(&self, key: &[u8]) -> Option<u64> {
        key.first().and_then(|kind| self.0.get(kind)).copied()
    }
}

/// Whether the stored `value` is of a group below `watermark`.
fn below(watermark: u64, value: &[u8]) -> bool {
    matches!(unframe(value), Some((VALUE_FORMAT, group, _)) if group < watermark)
}

impl CompactionFilter for ExpiredGroupsFilter {
    fn filter_item(&mut self, item: ItemAccessor<'_>, _: &Context) -> CompactionFilterResult {
        // The kind first, from the key: a record of a kind without a
        // watermark is kept without reading its value. Then only the group
        // is read: compaction meets every record.
        let Some(watermark) = self.watermark_of(item.key()) else {
            return Ok(Verdict::Keep);
        };
        let value = item.value()?;
        Ok(if below(watermark, &value) {
            Verdict::Remove
        } else {
            Verdict::Keep
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

/// Runs `open` — a fjall database's open, which starts the database's
/// worker threads — on a thread of its own at `nice` steps below the
/// process (its main thread's nice value), and returns its result: a
/// thread inherits its creator's nice value, so the workers run that low
/// for the database's life, whichever thread opens it (the node's startup,
/// its background thread already as low, a snapshot's intake), and the
/// caller's own priority is untouched (an unprivileged thread could not
/// raise it back). The open's journal replay runs there too. Where no
/// thread can be started, or `nice` is 0, or off Linux, `open` runs here,
/// with the workers at the caller's priority.
fn with_workers_lowered<T: Send>(nice: i32, open: impl FnOnce() -> T + Send) -> T {
    if nice == 0 || !cfg!(target_os = "linux") {
        return open();
    }
    // `open` goes to the thread through a slot it can be taken back from,
    // should the thread not start.
    let open = Mutex::new(Some(open));
    let outcome = std::thread::scope(|scope| {
        let started = std::thread::Builder::new()
            .name("oncekv-records-open".into())
            .spawn_scoped(scope, || {
                lower_this_thread_below_process(nice);
                let open = take(&open).expect("taken only once");
                open()
            });
        started.map(|thread| thread.join())
    });
    match outcome {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(error) => {
            tracing::warn!(
                %error,
                "record store: could not start a thread to open a generation on; its workers \
                 keep this thread's priority"
            );
            let open = take(&open).expect("the thread never started");
            open()
        }
    }
}

/// What `slot` holds, taken out.
fn take<F>(slot: &Mutex<Option<F>>) -> Option<F> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Sets the calling thread's nice value to `nice` above the process's
/// (at most 19), unless it already is as low (on Linux a thread's nice
/// value is its own, and raising it needs no privilege; lowering it back
/// would); a failure leaves it as it was.
fn lower_this_thread_below_process(nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on this process's and this thread's own ids.
    unsafe {
        let process = libc::getpriority(libc::PRIO_PROCESS, libc::getpid() as libc::id_t);
        let thread = libc::gettid() as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, thread);
        let target = process.saturating_add(nice).min(19);
        if now < target && libc::setpriority(libc::PRIO_PROCESS, thread, target) != 0 {
            tracing::debug!("record store: could not lower the workers' priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
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
        let builder = Database::builder(&dir)
            .cache_size(options.cache_bytes)
            .max_journaling_size(options.max_journaling_bytes)
            // Durability is ours to ask for: one fsync per flush.
            .manual_journal_persist(true)
            .worker_threads(options.worker_threads.max(1))
            .with_compaction_filter_factories(Arc::new(move |name: &str| {
                (name == RECORDS).then(|| factory.clone())
            }));
        let db = with_workers_lowered(options.worker_nice, move || builder.open())
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
        if let Some((_, binding)) = generation.checkpoint_and_binding()? {
            generation.pins.lock().durable = binding;
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
    /// journal; only then may compaction drop below its watermarks.
    fn commit(&self, mut batch: fjall::OwnedWriteBatch, checkpoint: &Checkpoint) -> Result<()> {
        batch.insert(&self.meta, CHECKPOINT_KEY, checkpoint.encode());
        batch
            .commit()
            .and_then(|()| self.sync_journal())
            .map_err(|source| self.store_error(source))?;
        // What the row binds as read back (see `Checkpoint::decode`): a
        // format-1 row binds its one kind, which is all it names.
        self.pins.lock().durable = checkpoint.watermarks.clone();
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
        Ok(self
            .checkpoint_and_binding()?
            .map(|(checkpoint, _)| checkpoint))
    }

    /// The latest checkpoint and the watermarks it binds.
    fn checkpoint_and_binding(&self) -> Result<Option<(Checkpoint, Watermarks)>> {
        let row = self
            .meta
            .get(CHECKPOINT_KEY)
            .map_err(|source| self.store_error(source))?;
        row.map(|row| Checkpoint::decode(&self.dir, &row))
            .transpose()
    }

    fn decode(&self, value: &[u8]) -> Result<StoredRecord> {
        StoredRecord::decode(value).ok_or_else(|| self.unknown_format())
    }

    fn unknown_format(&self) -> Error {
        Error::Corrupt {
            path: self.dir.clone(),
            why: "a record value of an unknown format".to_owned(),
        }
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
    /// none. No kind's watermark moves back (leaving out a kind the
    /// durable checkpoint names moves it back to 0).
    pub fn flush<I>(&self, changes: I, checkpoint: &Checkpoint) -> Result<()>
    where
        I: IntoIterator<Item = (Vec<u8>, Option<StoredRecord>)>,
    {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let generation = &self.generation;
        let backwards = generation
            .pins
            .lock()
            .durable
            .iter()
            .map(|(&kind, &durable)| (kind, durable))
            .find(|&(kind, durable)| checkpoint.watermark(kind) < durable);
        if let Some((kind, durable)) = backwards {
            return Err(Error::WatermarkBackwards {
                kind,
                durable,
                requested: checkpoint.watermark(kind),
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
        view.checkpoint = checkpoint.map(|(checkpoint, _)| checkpoint);
        Ok(view)
    }

    /// Builds a new generation from a received state — `records` in
    /// strictly increasing key order (records below their kind's watermark
    /// in the checkpoint are skipped), written as tables directly — commits
    /// `checkpoint` in it, fsyncs, and only then names it in `CURRENT`.
    /// Returns the new store; this one (and its views) go on reading the
    /// old generation until dropped, and its directory is deleted at the
    /// next open. A crash before `CURRENT` changes leaves the old
    /// generation in force. [`RecordStore::stage`] then
    /// [`RecordStore::put_in_force`].
    pub fn install<I>(&self, records: I, checkpoint: &Checkpoint) -> Result<RecordStore>
    where
        I: IntoIterator<Item = std::result::Result<(Vec<u8>, StoredRecord), String>>,
    {
        let staged = self.stage(records, checkpoint)?;
        self.put_in_force(staged)
    }

    /// The first half of [`RecordStore::install`]: builds the new
    /// generation whole — records written as tables, `checkpoint`
    /// committed, everything fsynced — in a directory of its own, but does
    /// not name it in `CURRENT`: nothing reads it, a restart deletes it,
    /// and so does dropping the [`Staged`] generation. It takes no lock of
    /// this store, so a node can stage a state as it arrives while its
    /// store in force goes on flushing. An error among `records` (a
    /// received state's last checks come as its last item) or out of
    /// order leaves nothing behind.
    pub fn stage<I>(&self, records: I, checkpoint: &Checkpoint) -> Result<Staged>
    where
        I: IntoIterator<Item = std::result::Result<(Vec<u8>, StoredRecord), String>>,
    {
        let generation = self.new_generation()?;
        // Deleted with its directory on every early return: retired until
        // put in force.
        generation
            .retired
            .retired
            .store(true, std::sync::atomic::Ordering::Release);
        {
            let mut ingestion = generation
                .records
                .start_ingestion()
                .map_err(|source| generation.store_error(source))?;
            let mut last: Option<Vec<u8>> = None;
            let mut behind = WriteBehind::default();
            // Each row's value is framed here, then copied once into the
            // store's own buffer: no allocation of ours per record.
            let mut value = Vec::new();
            for item in records {
                let (key, record) = item.map_err(Error::Incoming)?;
                if last.as_ref().is_some_and(|last| *last >= key) {
                    return Err(Error::OutOfOrder);
                }
                if record.group >= checkpoint.watermark_of(&key) {
                    value.clear();
                    record.encode_into(&mut value);
                    behind.wrote(&generation.dir, key.len() + value.len());
                    ingestion
                        .write(key.as_slice(), value.as_slice())
                        .map_err(|source| generation.store_error(source))?;
                }
                last = Some(key);
            }
            ingestion
                .finish()
                .map_err(|source| generation.store_error(source))?;
        }
        generation.commit(generation.db.batch(), checkpoint)?;
        Ok(Staged { generation })
    }

    /// The second half of [`RecordStore::install`]: names the staged
    /// generation in `CURRENT` (atomic rename, fsynced) and returns it as
    /// the store; this one (and its views) go on reading the replaced
    /// generation until dropped, and its directory goes with the last of
    /// them (or at the next open).
    pub fn put_in_force(&self, staged: Staged) -> Result<RecordStore> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let generation = staged.generation;
        write_current(&self.root, generation.number)?;
        generation
            .retired
            .retired
            .store(false, std::sync::atomic::Ordering::Release);
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

    /// Opens an empty generation under a number no directory under the
    /// root has: above the one in force and every other present (a staged
    /// one, one being staged), chosen and created under a lock, so two
    /// stages never share a directory.
    fn new_generation(&self) -> Result<Generation> {
        static NUMBERING: Mutex<()> = Mutex::new(());
        let _numbering = NUMBERING.lock().unwrap_or_else(|p| p.into_inner());
        let highest = generations(&self.root)?
            .into_iter()
            .map(|(number, _)| number)
            .chain([self.generation.number])
            .max()
            .unwrap_or(0);
        // The number came from `CURRENT` or a directory's name: a damaged
        // one may be the last there is.
        let number = highest.checked_add(1).ok_or_else(|| Error::Corrupt {
            path: self.root.join(CURRENT),
            why: "a generation has the last number there is".to_owned(),
        })?;
        Generation::open(&self.root, number, &self.options)
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

/// Bytes of records staged between two steps of a staged generation's
/// write-behind.
const WRITE_BEHIND_BYTES: usize = 4 << 20;

/// The write-behind of a generation being staged. fjall writes a staged
/// generation's tables (64 MiB each) into the page cache and fsyncs each
/// when it is whole: every few seconds 64 MiB went to the disk at once,
/// and every other writer of the disk — the Raft log's fsyncs of every
/// node on it — waited behind it (docs/state-beyond-ram.md §4.9h). Every
/// [`WRITE_BEHIND_BYTES`] staged, the writeback of every file of the
/// generation is started, so the tables reach the disk a few MiB at a time
/// as they are written; their fsyncs are unchanged, and find little left
/// to write. Elsewhere than Linux it does nothing.
#[derive(Default)]
struct WriteBehind {
    since: usize,
}

impl WriteBehind {
    fn wrote(&mut self, dir: &Path, bytes: usize) {
        self.since += bytes;
        if self.since >= WRITE_BEHIND_BYTES {
            self.since = 0;
            start_writeback(dir);
        }
    }
}

/// Starts the writeback of every regular file under `dir` (not waiting
/// for it); a file that cannot be opened is skipped: this only moves
/// writes earlier.
#[cfg(target_os = "linux")]
fn start_writeback(dir: &Path) {
    use std::os::fd::AsRawFd;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            start_writeback(&entry.path());
        } else if kind.is_file()
            && let Ok(file) = std::fs::File::open(entry.path())
        {
            // SAFETY: a plain syscall on a descriptor `file` keeps open for
            // the call; no memory is passed. Offset and length 0: the
            // whole file.
            unsafe {
                libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_dir: &Path) {}

/// A generation built whole but not in force (see [`RecordStore::stage`]):
/// put in force by [`RecordStore::put_in_force`], or, dropped, closed and
/// its directory deleted.
pub struct Staged {
    generation: Generation,
}

impl Staged {
    /// Its number (its directory is `gen-NNNNNN`).
    pub fn generation(&self) -> u64 {
        self.generation.number
    }
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged")
            .field("generation", &self.generation.number)
            .finish()
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

    /// The generation this view reads.
    pub fn generation(&self) -> u64 {
        self.generation.number
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

    /// The live records (groups at or above their kind's watermark) with
    /// keys at or after `start`, in key order (so kind by kind): what a
    /// page lists. A scan read in pieces holds one iterator instead
    /// ([`View::records_from_shared`]): each new one seeks again.
    pub fn records_from<'a>(
        &'a self,
        start: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, StoredRecord)>> + use<'a> {
        self.snapshot
            .range(&self.generation.records, start.to_vec()..)
            .filter_map(move |guard| self.live(guard))
    }

    /// [`View::records_from`] as one iterator that holds the view: what a
    /// snapshot sends, read a chunk at a time by another thread. It must
    /// stay one iterator for the whole scan: an iterator opened again at
    /// each piece seeks again, and a seek steps one by one over every
    /// entry of the memtables newer than the view up to the next one it
    /// may see — with keys that grow with time, every entry written since
    /// the view, at every piece (docs/state-beyond-ram.md §4.9l).
    pub fn records_from_shared(
        view: &Arc<View>,
        start: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, StoredRecord)>> + Send + 'static {
        let held = Arc::clone(view);
        view.snapshot
            .range(&view.generation.records, start.to_vec()..)
            .filter_map(move |guard| held.live(guard))
    }

    /// [`View::records_from_shared`] without a copy: each live row's key
    /// and record bytes as the store's own buffers hold them
    /// ([`RawRecord`]). What a snapshot's sender reads: it passes the bytes
    /// on instead of decoding each record and encoding it again.
    pub fn raw_records_from_shared(
        view: &Arc<View>,
        start: &[u8],
    ) -> impl Iterator<Item = Result<RawRecord>> + Send + 'static {
        let held = Arc::clone(view);
        view.snapshot
            .range(&view.generation.records, start.to_vec()..)
            .filter_map(move |guard| held.live_raw(guard))
    }

    /// A stored row as a record, `None` when its group is expired by this
    /// view's checkpoint.
    fn live(&self, guard: fjall::Guard) -> Option<Result<(Vec<u8>, StoredRecord)>> {
        self.live_raw(guard).map(|raw| {
            raw.map(|raw| {
                let record = StoredRecord {
                    group: raw.group,
                    bytes: raw.bytes().to_vec(),
                };
                (raw.key.to_vec(), record)
            })
        })
    }

    /// A stored row, its value's frame checked, `None` when its group is
    /// expired by this view's checkpoint.
    fn live_raw(&self, guard: fjall::Guard) -> Option<Result<RawRecord>> {
        let generation = &self.generation;
        let item = guard
            .into_inner()
            .map_err(|source| generation.store_error(source))
            .and_then(|(key, value)| match unframe(&value) {
                Some((VALUE_FORMAT, group, _)) => Ok(RawRecord { key, value, group }),
                _ => Err(generation.unknown_format()),
            });
        match item {
            Ok(ref raw)
                if self
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| raw.group < c.watermark_of(&raw.key)) =>
            {
                None
            }
            other => Some(other),
        }
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

    /// The filter's watermark for a kind is the lowest of the durable one
    /// and every open view's for that kind; a kind some of them do not name
    /// has none (nothing of it is dropped).
    #[test]
    fn the_filter_watermark_waits_for_the_oldest_view() {
        let pins = Pins::default();
        pins.lock().durable = BTreeMap::from([(1, 5), (2, 40)]);
        let old = pins.pin();
        pins.lock().durable = BTreeMap::from([(1, 9), (2, 30), (3, 7)]);
        let new = pins.pin();
        assert_eq!(pins.filter_watermarks(), BTreeMap::from([(1, 5), (2, 30)]));
        pins.unpin(old);
        assert_eq!(
            pins.filter_watermarks(),
            BTreeMap::from([(1, 9), (2, 30), (3, 7)])
        );
        pins.unpin(new);
        pins.lock().durable = BTreeMap::from([(1, 12)]);
        assert_eq!(pins.filter_watermarks(), BTreeMap::from([(1, 12)]));
    }

    /// The filter goes by the record's kind, from its key: a record below
    /// its own kind's watermark is dropped, one of a kind without a
    /// watermark or with an empty key, or with a value it cannot read, is
    /// kept.
    #[test]
    fn the_filter_drops_only_below_the_records_own_kind() {
        let filter = ExpiredGroupsFilter(BTreeMap::from([(1, 10), (2, 3)]));
        let group = |group: u64| {
            StoredRecord {
                group,
                bytes: b"r".to_vec(),
            }
            .encode()
        };
        let dropped = |key: &[u8], value: &[u8]| {
            filter
                .watermark_of(key)
                .is_some_and(|watermark| below(watermark, value))
        };
        assert!(dropped(b"\x01k", &group(9)));
        assert!(!dropped(b"\x01k", &group(10)));
        assert!(!dropped(b"\x02k", &group(9)));
        assert!(dropped(b"\x02k", &group(2)));
        assert!(!dropped(b"\x03k", &group(0)), "a kind without a watermark");
        assert!(!dropped(b"", &group(0)), "an empty key");
        let mut unknown = group(0);
        unknown[0] = 9;
        assert!(!dropped(b"\x01k", &unknown), "a value of an unknown format");
    }

    fn decode(row: &[u8]) -> Result<(Checkpoint, Watermarks)> {
        Checkpoint::decode(Path::new("store"), row)
    }

    /// A format-1 row (the one watermark builds before per-kind
    /// watermarks wrote) reads as that watermark for every kind; of them
    /// it binds the next checkpoint and compaction by kind 1's only.
    #[test]
    fn a_format_1_checkpoint_reads_as_one_watermark_for_every_kind() {
        let mut row = vec![1, 0, 0, 0, 0, 0, 0, 0x30, 0x39];
        row.extend_from_slice(b"applied");
        let (checkpoint, binding) = decode(&row).expect("format 1");
        for kind in 0..=u8::MAX {
            assert_eq!(checkpoint.watermark(kind), 12_345, "kind {kind}");
        }
        assert_eq!(checkpoint.applied, b"applied");
        assert_eq!(binding, BTreeMap::from([(FORMAT_1_KIND, 12_345)]));
    }

    /// A checkpoint that names kind 1 alone (or no kind) is written as
    /// format 1, byte for byte as before per-kind watermarks.
    #[test]
    fn a_kind_1_checkpoint_is_written_as_format_1() {
        let checkpoint = Checkpoint {
            watermarks: BTreeMap::from([(1, 0x0102_0304_0506_0708)]),
            applied: vec![0xAA, 0xBB],
        };
        assert_eq!(
            checkpoint.encode(),
            [1, 1, 2, 3, 4, 5, 6, 7, 8, 0xAA, 0xBB],
            "format 1: the watermark, then the applied bytes"
        );
        // Read back, it names every kind at that watermark (format 1 is
        // written only while kind 1 is the only kind stored), and binds
        // kind 1's, as the checkpoint did.
        let (read, binding) = decode(&checkpoint.encode()).expect("read back");
        assert_eq!(read.watermark(1), 0x0102_0304_0506_0708);
        assert_eq!(read.watermark(2), 0x0102_0304_0506_0708);
        assert_eq!(read.applied, checkpoint.applied);
        assert_eq!(binding, checkpoint.watermarks);
        let none = Checkpoint {
            watermarks: BTreeMap::new(),
            applied: Vec::new(),
        };
        assert_eq!(none.encode(), [1, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// A checkpoint naming another kind is written as format 2 and reads
    /// back as it was; a kind it does not name has watermark 0.
    #[test]
    fn a_two_kind_checkpoint_round_trips_as_format_2() {
        for watermarks in [
            BTreeMap::from([(1, 500), (2, 70)]),
            BTreeMap::from([(2, 70)]),
            BTreeMap::from([(0, 1), (1, u64::MAX), (255, 3)]),
        ] {
            let checkpoint = Checkpoint {
                watermarks,
                applied: b"index 7".to_vec(),
            };
            let row = checkpoint.encode();
            assert_eq!(row[0], CHECKPOINT_FORMAT);
            assert_eq!(
                row.len(),
                CHECKPOINT_HEAD_BYTES
                    + CHECKPOINT_ENTRY_BYTES * checkpoint.watermarks.len()
                    + checkpoint.applied.len()
            );
            let (read, binding) = decode(&row).expect("format 2");
            assert_eq!(read, checkpoint);
            assert_eq!(binding, checkpoint.watermarks);
            assert_eq!(read.watermark(9), 0, "a kind not named");
        }
        let row = Checkpoint {
            watermarks: BTreeMap::from([(1, 0x0102), (2, 0x0304)]),
            applied: vec![0xEE],
        }
        .encode();
        assert_eq!(
            row,
            [
                2, 0, 2, 1, 0, 0, 0, 0, 0, 0, 1, 2, 2, 0, 0, 0, 0, 0, 0, 3, 4, 0xEE
            ]
        );
    }

    /// A truncated or garbled checkpoint row is a clear error, never a
    /// panic: every cut of a format-2 row short of its watermarks, a
    /// format-1 row short of its one, kinds repeated or out of order, a
    /// count beyond the row, an unknown format, an empty row.
    #[test]
    fn a_truncated_or_garbled_checkpoint_is_an_error() {
        let why = |row: &[u8]| match decode(row) {
            Err(Error::Corrupt { why, .. }) => why,
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(read) => panic!("read {row:?} as {read:?}"),
        };
        let row = Checkpoint {
            watermarks: BTreeMap::from([(1, 500), (2, 70)]),
            applied: b"applied".to_vec(),
        }
        .encode();
        let watermarks_end = CHECKPOINT_HEAD_BYTES + 2 * CHECKPOINT_ENTRY_BYTES;
        assert!(why(&row[..1]).contains("truncated"));
        for cut in 1..watermarks_end {
            assert!(why(&row[..cut]).contains("truncated"), "cut at {cut}");
        }
        for cut in watermarks_end..=row.len() {
            let (read, _) = decode(&row[..cut]).expect("the applied bytes are opaque");
            assert_eq!(read.applied, row[watermarks_end..cut]);
        }
        for cut in 1..9 {
            assert!(
                why(&[1; 9][..cut]).contains("truncated"),
                "format 1 cut at {cut}"
            );
        }
        let mut repeated = row.clone();
        repeated[CHECKPOINT_HEAD_BYTES + CHECKPOINT_ENTRY_BYTES] = 1;
        assert!(why(&repeated).contains("increasing"));
        let mut descending = row.clone();
        descending[CHECKPOINT_HEAD_BYTES] = 3;
        assert!(why(&descending).contains("increasing"));
        let mut too_many = row.clone();
        too_many[1..3].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(why(&too_many).contains("truncated"));
        let mut unknown = row;
        unknown[0] = 3;
        assert!(why(&unknown).contains("format 3"));
        assert!(why(&[]).contains("empty"));
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
