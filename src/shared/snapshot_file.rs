//! Snapshot files as openraft handles them: a snapshot is an open file
//! ([`SnapshotFile`], openraft's `SnapshotData`), never its bytes in
//! memory. This module owns the file format, reads a snapshot's registry
//! bytes a chunk at a time for sending, and reads a received snapshot as
//! its chunks arrive, on a thread of its own: its part to a temporary file,
//! its key records and finished claims straight into a staged generation
//! of the record store, everything checked on the way
//! ([`IncomingSnapshot`]). It does not decide which snapshot is current,
//! and it neither renames nor fsyncs anything into place nor puts a
//! generation in force: that is `state_machine`'s.
//!
//! File format: meta length (u32 LE) | meta (codec, version byte 1) |
//! registry snapshot bytes (`oncekv_core::snapshot`). A whole snapshot
//! (`snapshot-<index>.snap`) holds every byte of the registry's snapshot;
//! a *part* file (`snapshot-<index>.part`) holds only its part, its key
//! records lying in the record store: such a snapshot is the file and a
//! store view frozen at the same index ([`SnapshotFile::with_records`]),
//! and it is read and sent as the whole snapshot would be — the part's
//! bytes, each live record of the view (its stored bytes passed through
//! after its id, not decoded: the receiver checks them), then the trailer
//! computed on the way ([`WholeSnapshot`]). Temporary files (a snapshot
//! being built, copied or received) end in `.tmp`; a restart deletes them
//! unread.

use crate::raft_types::SnapshotMeta;
use crate::shared::records::OutsideRecords;
use futures::Stream;
use oncekv_core::extension::{Extension, RecordsBase};
use oncekv_core::{Registry, codec, snapshot};
use oncekv_records::{RawRecord, StoredRecord, View};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const META_FORMAT_VERSION: u8 = 1;
pub(crate) const SNAPSHOT_PREFIX: &str = "snapshot-";
pub(crate) const SNAPSHOT_SUFFIX: &str = ".snap";
pub(crate) const PART_SUFFIX: &str = ".part";
pub(crate) const TEMPORARY_SUFFIX: &str = ".tmp";
/// Buffer of the readers and writers of snapshot files: large enough that
/// a read or write system call moves a useful amount, small against any
/// state.
const FILE_BUFFER_BYTES: usize = 1 << 20;
/// Bytes of a received snapshot written between two steps of its
/// write-behind ([`WriteBehind`]); 64 KiB in tests, so that small
/// snapshots take many steps.
const WRITE_BEHIND_BYTES: u64 = if cfg!(test) { 64 << 10 } else { 8 << 20 };

/// The log index a snapshot covers (0 for none).
pub(crate) fn snapshot_index(meta: &SnapshotMeta) -> u64 {
    meta.last_log_id.as_ref().map_or(0, |id| id.index)
}

/// The final name of the snapshot file covering `index`.
pub(crate) fn snapshot_file_name(index: u64) -> String {
    format!("{SNAPSHOT_PREFIX}{index:020}{SNAPSHOT_SUFFIX}")
}

/// The final name of the part file covering `index`.
pub(crate) fn part_file_name(index: u64) -> String {
    format!("{SNAPSHOT_PREFIX}{index:020}{PART_SUFFIX}")
}

/// Key records sent after a part, per batch read from the view.
const RECORDS_PER_BATCH: usize = 4096;

/// Checks that a decoded registry is at the index its meta names.
pub(crate) fn check_meta(meta: &SnapshotMeta, registry: &Registry) -> Result<(), String> {
    let index = snapshot_index(meta);
    if index != registry.applied_index() {
        return Err(format!(
            "meta says index {index}, registry says {}",
            registry.applied_index()
        ));
    }
    Ok(())
}

fn invalid(reason: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason.to_string())
}

/// Writes the header (meta length and meta); returns its length, where the
/// registry bytes start.
fn write_header(out: &mut impl Write, meta: &SnapshotMeta) -> io::Result<u64> {
    let meta_bytes = codec::encode_versioned(META_FORMAT_VERSION, meta);
    let length = u32::try_from(meta_bytes.len())
        .ok()
        .filter(|length| (*length as usize) <= codec::DECODE_LIMIT_BYTES)
        .ok_or_else(|| io::Error::other("snapshot meta beyond the decode limit"))?;
    out.write_all(&length.to_le_bytes())?;
    out.write_all(&meta_bytes)?;
    Ok(4 + u64::from(length))
}

/// Reads the header; returns the meta and where the registry bytes start.
/// The meta length is checked before anything is allocated for it.
fn read_header(input: &mut impl Read) -> io::Result<(SnapshotMeta, u64)> {
    let mut length = [0u8; 4];
    input
        .read_exact(&mut length)
        .map_err(|e| invalid(format!("header: {e}")))?;
    let length = u32::from_le_bytes(length);
    if length as usize > codec::DECODE_LIMIT_BYTES {
        return Err(invalid(format!("meta length {length} beyond the limit")));
    }
    let mut meta_bytes = Vec::new();
    input.take(u64::from(length)).read_to_end(&mut meta_bytes)?;
    if meta_bytes.len() != length as usize {
        return Err(invalid("meta length beyond the file"));
    }
    let meta = codec::decode_versioned(META_FORMAT_VERSION, &meta_bytes).map_err(invalid)?;
    Ok((meta, 4 + u64::from(length)))
}

/// Deletes its file when dropped, unless kept: the guard of every
/// temporary snapshot file, so that no failure (an error, a cancelled
/// stream, a refused install) leaves one behind in a running node.
pub(crate) struct TemporaryFile {
    path: Option<PathBuf>,
}

impl TemporaryFile {
    pub(crate) fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    /// The file is no longer temporary (renamed into place, or gone).
    pub(crate) fn keep(mut self) -> PathBuf {
        self.path.take().unwrap_or_default()
    }
}

impl Drop for TemporaryFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Creates a new temporary file for a snapshot at `index` in `dir`, open
/// for reading and writing. Names are unique within the process (a build,
/// a copy and receptions may run at once); a restart deletes them all.
pub(crate) fn create_temporary(dir: &Path, index: u64) -> io::Result<(TemporaryFile, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(
            "{}.{n}{TEMPORARY_SUFFIX}",
            snapshot_file_name(index)
        ));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => return Ok((TemporaryFile { path: Some(path) }, file)),
            // Left by an earlier process of this data directory.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Writes a whole snapshot file to a new temporary file: the header of
/// `meta`, then the registry bytes `body` writes, through one buffer; then
/// fsyncs it. Returns the guard, the open file and where its registry
/// bytes start. Nothing of the snapshot is held in memory beyond the
/// buffer.
pub(crate) fn write_temporary(
    dir: &Path,
    meta: &SnapshotMeta,
    body: impl FnOnce(&mut BufWriter<&File>) -> io::Result<()>,
) -> io::Result<(TemporaryFile, File, u64)> {
    let (temporary, file) = create_temporary(dir, snapshot_index(meta))?;
    let registry_offset = {
        let mut out = BufWriter::with_capacity(FILE_BUFFER_BYTES, &file);
        let offset = write_header(&mut out, meta)?;
        body(&mut out)?;
        out.flush()?;
        offset
    };
    file.sync_all()?;
    Ok((temporary, file, registry_offset))
}

/// A snapshot received from a leader, not installed yet: checked as its
/// stream came (every record decoded and verified), its file still
/// temporary.
pub(crate) struct Received {
    pub(crate) temporary: TemporaryFile,
    /// Where the file holds only the part: the part's registry and the
    /// staged generation of the record store holding the records.
    pub(crate) staged: Option<Staged>,
    /// Where the snapshot came as an extension of this node's base: the
    /// part's registry and the records to add to the store in force.
    pub(crate) extension: Option<Extended>,
    /// Held until installed or dropped: one snapshot is received, checked
    /// and installed at a time.
    _receiving: tokio::sync::OwnedSemaphorePermit,
}

/// A snapshot received as an extension of this node's durable snapshot
/// (its *base*, docs/state-beyond-ram.md §4.9p): the part's registry, and
/// the records that, added to the base's in the store in force, make the
/// snapshot's. Holds the node's snapshot builds off from the end of its
/// reception (where its base is found still in force) to its install, so
/// that the store stays at the base: no flush moves it.
pub(crate) struct Extended {
    pub(crate) registry: Registry,
    pub(crate) records: Vec<(Vec<u8>, StoredRecord)>,
    pub(crate) base: BaseId,
    pub(crate) builds_held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// Names a node's durable snapshot as the base of an extension: its log
/// index and the record store generation holding its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseId {
    pub index: u64,
    pub generation: u64,
}

/// What a node answers a leader asking for its base: the durable
/// snapshot's id, its records in summary, and the most bytes of records
/// (as their groups charge them) it takes as an extension.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurableBase {
    pub id: BaseId,
    pub records: RecordsBase,
    pub bytes_max: u64,
}

/// The most bytes of records (as their groups charge them) a node takes as
/// an extension: they are held in memory from their reception to the
/// install, and written there in one batch, as a build's flush writes at
/// most its overlay's. Beyond it the snapshot is sent whole.
pub const EXTENSION_BYTES_MAX: u64 = 64 << 20;
/// The most bytes of stored records an extension may actually bring (key
/// and stored bytes, what the receiver holds): the groups' charge of a
/// record leaves out a few bytes of its framing.
const EXTENSION_STORED_BYTES_MAX: u64 = 2 * EXTENSION_BYTES_MAX;

/// This node's durable snapshot as a base, while it is current: what a
/// leader is told, and the view of its records an extension is checked
/// against.
#[derive(Clone)]
pub(crate) struct CurrentBase {
    pub(crate) id: BaseId,
    pub(crate) records: Arc<RecordsBase>,
    pub(crate) view: Arc<View>,
}

/// A received snapshot's state, ready to switch to: the part's registry
/// (its key records outside it) and the generation holding its records,
/// written and fsynced but not in force.
pub(crate) struct Staged {
    pub(crate) registry: Registry,
    pub(crate) generation: oncekv_records::Staged,
}

/// A snapshot as openraft handles it (`SnapshotData`): an open snapshot
/// file and where its registry bytes start. Built and current snapshots
/// are read-only handles on their file (which stays readable even if a
/// newer snapshot deletes it meanwhile); a received one owns its
/// temporary file, deleted if it is dropped without being installed.
pub struct SnapshotFile {
    file: File,
    path: PathBuf,
    meta: SnapshotMeta,
    registry_offset: u64,
    received: Option<Received>,
    /// For a part file: the view of the record store holding its key
    /// records.
    records: Option<Arc<View>>,
    /// For a part file: its records in summary, to send it as an
    /// extension of a receiver's base.
    base: Option<Arc<RecordsBase>>,
}

impl fmt::Debug for SnapshotFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotFile")
            .field("path", &self.path)
            .field("log_index", &snapshot_index(&self.meta))
            .field("received", &self.received.is_some())
            .finish()
    }
}

impl SnapshotFile {
    /// Opens a snapshot file and reads its header.
    pub(crate) fn open(path: &Path) -> io::Result<SnapshotFile> {
        let mut file = File::open(path)?;
        let (meta, registry_offset) = read_header(&mut BufReader::new(&mut file))?;
        Ok(SnapshotFile {
            file,
            path: path.to_path_buf(),
            meta,
            registry_offset,
            received: None,
            records: None,
            base: None,
        })
    }

    /// Opens a snapshot file whose header is known.
    pub(crate) fn open_known(
        path: &Path,
        meta: SnapshotMeta,
        registry_offset: u64,
    ) -> io::Result<SnapshotFile> {
        Ok(SnapshotFile {
            file: File::open(path)?,
            path: path.to_path_buf(),
            meta,
            registry_offset,
            received: None,
            records: None,
            base: None,
        })
    }

    /// A handle on a file just written (`write_temporary`), now at `path`.
    pub(crate) fn written(
        file: File,
        path: PathBuf,
        meta: SnapshotMeta,
        registry_offset: u64,
    ) -> SnapshotFile {
        SnapshotFile {
            file,
            path,
            meta,
            registry_offset,
            received: None,
            records: None,
            base: None,
        }
    }

    /// A part file's snapshot: its key records are `view`'s (a view of the
    /// record store taken right after the flush of the same index).
    pub(crate) fn with_records(mut self, view: Arc<View>) -> SnapshotFile {
        self.records = Some(view);
        self
    }

    /// A part file's records in summary (see [`SnapshotFile::base`]).
    pub(crate) fn with_base(mut self, base: Option<Arc<RecordsBase>>) -> SnapshotFile {
        self.base = base;
        self
    }

    /// A part file's records in summary, if known: what an extension of a
    /// receiver's base is planned from.
    pub fn base(&self) -> Option<&RecordsBase> {
        self.base.as_deref()
    }

    /// Another handle on the same snapshot to send (its own file
    /// descriptor and position): for a sender that may send it twice, as
    /// an extension and then whole. Not for a received snapshot.
    pub fn duplicate(&self) -> io::Result<SnapshotFile> {
        if self.received.is_some() {
            return Err(io::Error::other("a received snapshot is not sent"));
        }
        Ok(SnapshotFile {
            file: self.file.try_clone()?,
            path: self.path.clone(),
            meta: self.meta.clone(),
            registry_offset: self.registry_offset,
            received: None,
            records: self.records.clone(),
            base: self.base.clone(),
        })
    }

    /// The hold on the node's snapshot builds a snapshot received as an
    /// extension keeps until it is installed: taken by the install, which
    /// would otherwise wait for it.
    pub(crate) fn take_builds_held(&mut self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.received
            .as_mut()?
            .extension
            .as_mut()?
            .builds_held
            .take()
    }

    /// The whole snapshot's registry bytes, from the file or, for a part
    /// file, its part then the records of its view and the trailer.
    pub(crate) fn whole_reader(&self) -> io::Result<WholeSnapshot> {
        self.reader(None)
    }

    /// The registry bytes to send: the whole snapshot's
    /// ([`SnapshotFile::whole_reader`]), or, under an extension's plan, the
    /// part, the records the plan sends with each kind ended, and the
    /// trailer of those bytes.
    fn reader(&self, plan: Option<Arc<Extension>>) -> io::Result<WholeSnapshot> {
        if plan.is_some() && self.records.is_none() {
            return Err(io::Error::other(
                "only a snapshot whose records lie in a store is sent as an extension",
            ));
        }
        if self
            .received
            .as_ref()
            .is_some_and(|received| received.staged.is_some() || received.extension.is_some())
        {
            // Its file holds the part; its records are in a staged
            // generation no view reads.
            return Err(io::Error::other(
                "a received snapshot is read once installed, not before",
            ));
        }
        // Read at its own offset (positional reads): a clone of the
        // descriptor shares the file position with every other clone, and
        // two sends of one snapshot (an extension given up, then the whole)
        // may read at once.
        let file = self.file.try_clone()?;
        Ok(WholeSnapshot {
            file,
            file_at: self.registry_offset,
            records: self.records.clone(),
            hasher: blake3::Hasher::new(),
            pending: Vec::new(),
            at: 0,
            phase: Phase::Part,
            plan,
        })
    }

    /// The meta in the file's header.
    pub fn meta(&self) -> &SnapshotMeta {
        &self.meta
    }

    pub(crate) fn registry_offset(&self) -> u64 {
        self.registry_offset
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A buffered reader of the registry bytes, from their start.
    pub(crate) fn registry_reader(&mut self) -> io::Result<BufReader<&File>> {
        self.file.seek(SeekFrom::Start(self.registry_offset))?;
        Ok(BufReader::with_capacity(FILE_BUFFER_BYTES, &self.file))
    }

    /// Decodes the registry from the file, checking everything the
    /// snapshot format checks and that it is at the meta's index.
    pub(crate) fn read_registry(&mut self) -> Result<Registry, String> {
        let reader = self.registry_reader().map_err(|e| e.to_string())?;
        let registry = snapshot::read(reader).map_err(|e| e.to_string())?;
        check_meta(&self.meta, &registry)?;
        Ok(registry)
    }

    /// [`SnapshotFile::read_registry`], leaving the key records out of the
    /// registry (counted, checked, then dropped: see
    /// `snapshot::read_leaving_keys`), for a node whose record store holds
    /// them.
    pub(crate) fn read_registry_leaving_keys(&mut self) -> Result<Registry, String> {
        let reader = self.registry_reader().map_err(|e| e.to_string())?;
        let registry = snapshot::read_leaving_keys(reader).map_err(|e| e.to_string())?;
        check_meta(&self.meta, &registry)?;
        Ok(registry)
    }

    /// Decodes the registry from the file without its key records when it
    /// has them apart (format 8: the records are not even read, for a node
    /// whose record store holds them), else as
    /// [`SnapshotFile::read_registry_leaving_keys`] does.
    pub(crate) fn read_registry_part(&mut self) -> Result<Registry, String> {
        let reader = self.registry_reader().map_err(|e| e.to_string())?;
        let registry = match snapshot::read_part(reader, false).map_err(|e| e.to_string())? {
            snapshot::Part::Records(registry, _) => registry,
            snapshot::Part::Whole(registry) => registry,
        };
        check_meta(&self.meta, &registry)?;
        Ok(registry)
    }

    /// Takes a received snapshot's temporary file, if
    /// this is one received into `dir` with `meta` in its header; the file
    /// stays open here (for its fsync).
    pub(crate) fn take_received(&mut self, dir: &Path, meta: &SnapshotMeta) -> Option<Received> {
        if self.meta != *meta || self.path.parent() != Some(dir) {
            return None;
        }
        self.received.take()
    }

    /// The open file (for an fsync).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The whole snapshot's registry bytes ([`SnapshotFile::whole_reader`]),
    /// `chunk_bytes` at a time, each read (on a blocking thread) only when
    /// the stream is polled for it: a sender holds one chunk and a batch of
    /// records, never the snapshot.
    pub fn into_chunks(
        self,
        chunk_bytes: usize,
    ) -> impl Stream<Item = io::Result<Vec<u8>>> + Send + 'static {
        self.into_framed_chunks(chunk_bytes, None, std::mem::take)
    }

    /// As [`SnapshotFile::into_chunks`], each chunk handed to `frame` (a
    /// sender's message encoding) on the same thread that read it: the
    /// stream yields what `frame` made. `frame` may take the chunk's buffer
    /// (the next chunk is read into a new one) or leave it, to be reused
    /// for the next chunk: then the chunk is neither allocated afresh nor
    /// copied again on the request path's threads.
    pub fn into_framed_chunks<T, F>(
        self,
        chunk_bytes: usize,
        plan: Option<Arc<Extension>>,
        frame: F,
    ) -> impl Stream<Item = io::Result<T>> + Send + 'static
    where
        T: Send + 'static,
        F: FnMut(&mut Vec<u8>) -> T + Send + 'static,
    {
        let reader = self
            .reader(plan)
            .map(|reader| (self, reader, Vec::new(), frame));
        futures::stream::unfold(Some(reader), move |state| async move {
            let (snapshot, mut reader, mut chunk, mut frame) = match state? {
                Ok(opened) => opened,
                Err(error) => return Some((Err(error), None)),
            };
            // Read (the record store walked and its records encoded) and
            // framed on the catch-up thread, at idle priority, a chunk per
            // job: the sender is usually the leader, and its request path
            // gets the cores first.
            let read = super::background::run_catchup_io(move || {
                chunk.clear();
                chunk.reserve_exact(chunk_bytes);
                let read = (&mut reader)
                    .take(chunk_bytes as u64)
                    .read_to_end(&mut chunk)
                    .map(|_| (!chunk.is_empty()).then(|| frame(&mut chunk)));
                Ok((reader, chunk, frame, read))
            })
            .await;
            match read {
                Err(error) | Ok((_, _, _, Err(error))) => Some((Err(error), None)),
                Ok((_, _, _, Ok(None))) => None,
                Ok((reader, chunk, frame, Ok(Some(framed)))) => {
                    Some((Ok(framed), Some(Ok((snapshot, reader, chunk, frame)))))
                }
            }
        })
    }
}

/// A view's live records of one kind as stored, in order, as one iterator
/// for the whole scan (see [`OutsideRecords::all_stored_key_records`]).
type Rows = Box<dyn Iterator<Item = io::Result<RawRecord>> + Send>;

/// Where a [`WholeSnapshot`] is.
enum Phase {
    /// The file's bytes.
    Part,
    /// The view's key records not yet read.
    Records(Rows),
    /// Then its finished claim records (rules version 3; none before).
    Claims(Rows),
    Trailer,
    Done,
}

/// The registry bytes of a snapshot as one reader (see the module doc): a
/// whole file's bytes, or a part file's then its records and trailer.
pub(crate) struct WholeSnapshot {
    /// Read as asked (no buffer here: a sender's chunk is its buffer), at
    /// `file_at`.
    file: File,
    file_at: u64,
    records: Option<Arc<View>>,
    /// Of every byte from the part's start: the trailer of a part file's
    /// snapshot.
    hasher: blake3::Hasher,
    pending: Vec<u8>,
    at: usize,
    phase: Phase,
    /// An extension's plan: which records are sent, each kind's ended by
    /// `snapshot::END_OF_KIND`.
    plan: Option<Arc<Extension>>,
}

/// Appends one record, from its store key and stored bytes, to a snapshot
/// being sent (`snapshot::encode_stored_key_record` and its claim twin).
type EncodeStored = fn(&[u8], &[u8], &mut Vec<u8>) -> io::Result<()>;

/// Whether an extension's plan sends a record of a group, from its stored
/// bytes (`Extension::sends_key` and its claim twin).
type Sends = fn(&Extension, u64, &[u8]) -> Result<bool, oncekv_core::codec::CodecError>;

/// Encodes the next of `records` into `pending` with `encode` (each
/// record's stored bytes passed through, not decoded) — those `sends`
/// passes under an extension's plan — up to [`RECORDS_PER_BATCH`] read;
/// `true` when the batch filled (more may follow), `false` when the
/// records ran out.
fn encode_batch(
    records: &mut Rows,
    pending: &mut Vec<u8>,
    encode: EncodeStored,
    plan: Option<(&Extension, Sends)>,
) -> io::Result<bool> {
    for (count, item) in records.enumerate() {
        let raw = item?;
        let sent = match plan {
            Some((plan, sends)) => sends(plan, raw.group(), raw.bytes()).map_err(invalid)?,
            None => true,
        };
        if sent {
            encode(raw.key(), raw.bytes(), pending)?;
        }
        if count + 1 == RECORDS_PER_BATCH {
            return Ok(true);
        }
    }
    Ok(false)
}

impl WholeSnapshot {
    /// Fills `pending` with the next records (or the trailer); `false` at
    /// the end.
    fn refill(&mut self) -> io::Result<bool> {
        self.pending.clear();
        self.at = 0;
        let Some(view) = self.records.as_ref() else {
            self.phase = Phase::Done;
            return Ok(false);
        };
        let plan = self.plan.as_deref();
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Records(mut rows) => {
                let full = encode_batch(
                    &mut rows,
                    &mut self.pending,
                    snapshot::encode_stored_key_record,
                    plan.map(|plan| (plan, Extension::sends_key as Sends)),
                )?;
                self.phase = if full {
                    Phase::Records(rows)
                } else {
                    if plan.is_some() {
                        self.pending.extend_from_slice(&snapshot::END_OF_KIND);
                    }
                    Phase::Claims(Box::new(OutsideRecords::all_stored_claim_records(view)))
                };
                self.hasher.update(&self.pending);
            }
            Phase::Claims(mut rows) => {
                let full = encode_batch(
                    &mut rows,
                    &mut self.pending,
                    snapshot::encode_stored_claim_record,
                    plan.map(|plan| (plan, Extension::sends_claim as Sends)),
                )?;
                self.phase = if full {
                    Phase::Claims(rows)
                } else {
                    if plan.is_some() {
                        self.pending.extend_from_slice(&snapshot::END_OF_KIND);
                    }
                    Phase::Trailer
                };
                self.hasher.update(&self.pending);
            }
            Phase::Trailer => {
                let trailer = *self.hasher.finalize().as_bytes();
                self.pending.extend_from_slice(&trailer);
            }
            Phase::Part | Phase::Done => return Ok(false),
        }
        Ok(true)
    }
}

impl Read for WholeSnapshot {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.at < self.pending.len() {
                let n = out.len().min(self.pending.len() - self.at);
                out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
                self.at += n;
                return Ok(n);
            }
            match self.phase {
                Phase::Part => {
                    let n = std::os::unix::fs::FileExt::read_at(&self.file, out, self.file_at)?;
                    self.file_at += n as u64;
                    if n > 0 {
                        if self.records.is_some() {
                            self.hasher.update(&out[..n]);
                        }
                        return Ok(n);
                    }
                    let Some(view) = self.records.as_ref() else {
                        self.phase = Phase::Done;
                        return Ok(0);
                    };
                    self.phase =
                        Phase::Records(Box::new(OutsideRecords::all_stored_key_records(view)));
                }
                Phase::Done => return Ok(0),
                _ => {
                    if !self.refill()? {
                        return Ok(0);
                    }
                }
            }
        }
    }
}

/// Writeback of a file written front to back, started as it grows rather
/// than all at once by the fsync at its end: every [`WRITE_BEHIND_BYTES`]
/// the range written since the last step is handed to the disk
/// (`sync_file_range` on Linux, without waiting) and the range before it
/// waited for. So a received snapshot holds at most two such ranges of
/// dirty pages, and the stream slows to the disk's pace instead of leaving
/// the whole file — hundreds of MB at 10 M keys — to one fsync that stalls
/// every other writer of the disk (the Raft log's fsyncs of all three
/// nodes; seen as a 1–2 s stop of the cluster in a catch-up by snapshot,
/// docs/state-beyond-ram.md §4.9f). Durability is unchanged: the install
/// still fsyncs the whole file before it renames it into place. Elsewhere
/// than Linux the steps do nothing.
#[derive(Clone, Copy, Debug, Default)]
struct WriteBehind {
    /// Where the ranges handed to the disk end.
    started: u64,
    /// Where the ranges waited for end.
    waited: u64,
}

impl WriteBehind {
    /// Whether a file written up to `end` is due a step.
    fn due(&self, end: u64) -> bool {
        end.saturating_sub(self.started) >= WRITE_BEHIND_BYTES
    }

    /// Waits for the range started at the last step and starts the
    /// writeback of the bytes written since (`file` flushed up to `end`).
    fn step(&mut self, file: &File, end: u64) -> io::Result<()> {
        sync_range(file, self.waited, self.started - self.waited, true)?;
        self.waited = self.started;
        sync_range(file, self.started, end - self.started, false)?;
        self.started = end;
        Ok(())
    }
}

/// Starts the writeback of `length` bytes of `file` from `offset`, and with
/// `wait` waits for it (and any already under way in the range) to end.
#[cfg(target_os = "linux")]
fn sync_range(file: &File, offset: u64, length: u64, wait: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if length == 0 {
        return Ok(());
    }
    let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else {
        return Ok(());
    };
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    // SAFETY: a plain syscall on an open descriptor `file` keeps open for
    // the call; no memory is passed.
    let result = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, length, flags) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn sync_range(_file: &File, _offset: u64, _length: u64, _wait: bool) -> io::Result<()> {
    Ok(())
}

/// Why a received snapshot was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The bytes are not a snapshot of the meta they came with: the
    /// sender's fault.
    #[error("invalid snapshot: {0}")]
    Invalid(String),
    /// This node could not write or read its temporary file.
    #[error("snapshot file: {0}")]
    Io(#[from] io::Error),
    /// An extension of a base this node no longer has, or whose records do
    /// not add up to the snapshot's over its base: to be sent whole.
    #[error("{0}")]
    NotAnExtension(String),
}

/// Where a node receives snapshots from a leader: temporary files in its
/// snapshot directory, and, for the key records of a snapshot whose part
/// comes apart (format 8 on), a staged generation of its record store.
/// Handed to the network adapter by the state machine
/// (`StateMachineStore::snapshot_inbox`).
#[derive(Clone)]
pub struct SnapshotInbox {
    dir: PathBuf,
    records: Option<Arc<OutsideRecords>>,
    /// One snapshot received, checked and installed at a time.
    receiving: Arc<tokio::sync::Semaphore>,
    /// Receptions begun since the node started.
    begun: Arc<std::sync::atomic::AtomicU64>,
    /// The durable snapshot as a base, while its records lie in the store
    /// (set by the state machine as snapshots become current).
    base: Arc<std::sync::Mutex<Option<CurrentBase>>>,
    /// The state machine's snapshot builds, held off while an extension is
    /// received and installed.
    builds: Arc<tokio::sync::Mutex<()>>,
}

/// Buffer of a received snapshot's file.
const RECEIVE_BUFFER_BYTES: usize = 64 << 10;
/// Chunks queued between the network and the receiving thread: enough to
/// keep both busy, few enough that a slow disk slows the sender.
const CHUNKS_QUEUED: usize = 1;

impl SnapshotInbox {
    pub(crate) fn new(
        dir: PathBuf,
        records: Option<Arc<OutsideRecords>>,
        builds: Arc<tokio::sync::Mutex<()>>,
    ) -> SnapshotInbox {
        SnapshotInbox {
            dir,
            records,
            receiving: Arc::new(tokio::sync::Semaphore::new(1)),
            begun: Arc::default(),
            base: Arc::default(),
            builds,
        }
    }

    fn current_base(&self) -> std::sync::MutexGuard<'_, Option<CurrentBase>> {
        self.base.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the durable snapshot's base (`None`: its records are not in
    /// the store, or there is none).
    pub(crate) fn set_base(&self, base: Option<CurrentBase>) {
        *self.current_base() = base;
    }

    /// What this node answers a leader asking for its base.
    pub fn base(&self) -> Option<DurableBase> {
        self.current_base().as_ref().map(|base| DurableBase {
            id: base.id,
            records: RecordsBase::clone(&base.records),
            bytes_max: EXTENSION_BYTES_MAX,
        })
    }

    /// Whether a snapshot is being received or installed.
    pub fn is_receiving(&self) -> bool {
        self.receiving.available_permits() == 0
    }

    /// How many receptions have begun since the node started (one that
    /// began and ended between two looks shows here).
    pub fn receptions_begun(&self) -> u64 {
        self.begun.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts receiving the snapshot `meta` describes (after any reception
    /// still being received or installed): a new temporary file with its
    /// header written, and a thread that reads the chunks as they come
    /// ([`IncomingSnapshot`]).
    pub async fn receive(&self, meta: &SnapshotMeta) -> io::Result<IncomingSnapshot> {
        let permit = self
            .receiving
            .clone()
            .acquire_owned()
            .await
            .map_err(io::Error::other)?;
        self.receive_with(meta, permit, None).await
    }

    /// Starts receiving the snapshot `meta` describes as an extension of
    /// the base `base` names (see [`Extended`]): refused unless that base
    /// is still this node's durable snapshot — checked with the node's
    /// snapshot builds held off, as they stay until the install.
    pub async fn receive_extension(
        &self,
        meta: &SnapshotMeta,
        base: BaseId,
    ) -> Result<IncomingSnapshot, ReceiveError> {
        let permit = self
            .receiving
            .clone()
            .acquire_owned()
            .await
            .map_err(io::Error::other)?;
        let current = self.current_base().clone();
        let current = match current {
            Some(current) if current.id == base => current,
            other => {
                return Err(ReceiveError::NotAnExtension(format!(
                    "an extension of base {base:?}; this node's is {:?}",
                    other.map(|current| current.id)
                )));
            }
        };
        let mut incoming = self
            .receive_with(meta, permit, Some(Extending { current }))
            .await?;
        incoming.settle = Some(Settle {
            builds: self.builds.clone(),
            base: self.base.clone(),
        });
        Ok(incoming)
    }

    async fn receive_with(
        &self,
        meta: &SnapshotMeta,
        permit: tokio::sync::OwnedSemaphorePermit,
        extending: Option<Extending>,
    ) -> io::Result<IncomingSnapshot> {
        self.begun
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.dir.clone();
        let header_meta = meta.clone();
        let (temporary, writer, registry_offset) = tokio::task::spawn_blocking(move || {
            let (temporary, file) = create_temporary(&dir, snapshot_index(&header_meta))?;
            // Chunks come whole (a MiB each from a node of this build):
            // the buffer gathers only the header and the part's pieces.
            let mut writer = BufWriter::with_capacity(RECEIVE_BUFFER_BYTES, file);
            let offset = write_header(&mut writer, &header_meta)?;
            Ok::<_, io::Error>((temporary, writer, offset))
        })
        .await
        .map_err(io::Error::other)??;
        let (chunks, arriving) = tokio::sync::mpsc::channel(CHUNKS_QUEUED);
        let reception = Reception {
            meta: meta.clone(),
            records: self.records.clone(),
            temporary,
            registry_offset,
            permit,
            extending,
        };
        let taking_in = super::background::spawn("oncekv-snapshot-in", move || {
            reception.take_in(arriving, writer)
        })?;
        Ok(IncomingSnapshot {
            chunks: Some(chunks),
            taking_in: Some(taking_in),
            received_bytes: 0,
            settle: None,
        })
    }
}

/// A snapshot being received. Its chunks go to a thread of its own (at a
/// catch-up's idle priority: the node receiving a snapshot is behind, and
/// no request waits on it) that reads them as they arrive,
/// checking everything the snapshot format checks:
///
/// - the part (everything but the key records and finished claims) goes to
///   a temporary file;
/// - the records stream straight into a staged generation of the record
///   store, each checked as it comes and the groups' sums and the trailer
///   after the last — so they are written and decoded once, not written to
///   the file, decoded to check them and decoded again to install them;
/// - without a record store, or from a snapshot before format 8, every
///   byte goes to the file, as the whole snapshot.
///
/// Dropped before [`IncomingSnapshot::finish`] (the sender died, the
/// stream broke or was refused), the thread sees the stream end short and
/// deletes the file and the staged generation: a partial snapshot never
/// replaces anything.
pub struct IncomingSnapshot {
    /// To the receiving thread; dropped for the end of the stream.
    chunks: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    taking_in: Option<super::background::Spawned<Result<SnapshotFile, ReceiveError>>>,
    received_bytes: u64,
    /// For an extension: what its end waits for and checks (see
    /// [`Settle`]).
    settle: Option<Settle>,
}

/// The end of an extension's reception: the node's snapshot builds held
/// off from there to the install, once its base is found still in force.
/// Not held while the records arrive: the lookups read the base's own
/// view, and the sums its summary, neither of which a build moves — only
/// the store the install writes to must stay at the base.
struct Settle {
    builds: Arc<tokio::sync::Mutex<()>>,
    base: Arc<std::sync::Mutex<Option<CurrentBase>>>,
}

impl Settle {
    async fn hold(self, snapshot: &mut SnapshotFile) -> Result<(), ReceiveError> {
        let Some(extension) = snapshot
            .received
            .as_mut()
            .and_then(|received| received.extension.as_mut())
        else {
            return Ok(());
        };
        let held = self.builds.lock_owned().await;
        let current = self
            .base
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|current| current.id);
        if current != Some(extension.base) {
            return Err(ReceiveError::NotAnExtension(format!(
                "an extension of base {:?}; this node's moved to {current:?} meanwhile",
                extension.base
            )));
        }
        extension.builds_held = Some(held);
        Ok(())
    }
}

impl IncomingSnapshot {
    /// Registry bytes received so far.
    pub fn received_bytes(&self) -> u64 {
        self.received_bytes
    }

    /// Hands the next chunk of registry bytes to the receiving thread
    /// (waiting while it is [`CHUNKS_QUEUED`] chunks behind). An error is
    /// what stopped it: bytes that are not a snapshot of the meta
    /// ([`ReceiveError::Invalid`]), or a write that failed.
    pub async fn write(&mut self, chunk: Vec<u8>) -> Result<(), ReceiveError> {
        let length = chunk.len() as u64;
        let chunks = self
            .chunks
            .as_ref()
            .ok_or_else(|| io::Error::other("this snapshot's reception already stopped"))?;
        if chunks.send(chunk).await.is_err() {
            // The thread stopped before the stream's end: on an error.
            self.chunks = None;
            return match self.outcome().await {
                Err(error) => Err(error),
                Ok(_) => Err(ReceiveError::Invalid(
                    "bytes after the snapshot's end".to_owned(),
                )),
            };
        }
        self.received_bytes += length;
        Ok(())
    }

    /// The stream ended: waits for the receiving thread to read and check
    /// the rest. The result is ready for openraft to install; the file is
    /// fsynced and renamed into place, and the staged generation put in
    /// force, by the install, not here.
    pub async fn finish(mut self) -> Result<SnapshotFile, ReceiveError> {
        self.chunks = None;
        let mut snapshot = self.outcome().await?;
        if let Some(settle) = self.settle.take() {
            settle.hold(&mut snapshot).await?;
        }
        Ok(snapshot)
    }

    async fn outcome(&mut self) -> Result<SnapshotFile, ReceiveError> {
        self.taking_in
            .take()
            .ok_or_else(|| io::Error::other("this snapshot's reception already stopped"))?
            .join()
            .await?
    }
}

/// What the receiving thread owns.
struct Reception {
    meta: SnapshotMeta,
    records: Option<Arc<OutsideRecords>>,
    temporary: TemporaryFile,
    registry_offset: u64,
    permit: tokio::sync::OwnedSemaphorePermit,
    /// For an extension: the base and the hold on builds.
    extending: Option<Extending>,
}

/// An extension's reception: the base it extends (see [`Extended`]).
struct Extending {
    current: CurrentBase,
}

/// The file a received snapshot's bytes are copied to as they are read,
/// while the copy is on.
struct Copy {
    writer: BufWriter<File>,
    /// The file's writeback, started as it grows.
    behind: WriteBehind,
    /// Bytes written so far (the header included).
    end: u64,
    /// The first write that failed: this node's disk, not the sender.
    failed: Option<io::Error>,
}

impl Copy {
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let written = self.writer.write_all(bytes).and_then(|()| {
            self.end += bytes.len() as u64;
            if self.behind.due(self.end) {
                self.writer.flush()?;
                self.behind.step(self.writer.get_ref(), self.end)?;
            }
            Ok(())
        });
        if let Err(error) = &written {
            self.failed = Some(io::Error::new(error.kind(), error.to_string()));
        }
        written
    }
}

/// A received snapshot's bytes, read on the receiving thread as the chunks
/// arrive; every byte read is also copied to the file while the copy is
/// on (`copy` is the receiving thread's, which takes it once the part is
/// read). The stream's end is the end of the input.
struct Arriving<'a> {
    chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
    copy: &'a RefCell<Option<Copy>>,
}

impl Read for Arriving<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.chunks.blocking_recv() {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let length = out.len().min(self.chunk.len() - self.at);
        let bytes = &self.chunk[self.at..self.at + length];
        if let Some(copy) = self.copy.borrow_mut().as_mut() {
            copy.write(bytes)?;
        }
        out[..length].copy_from_slice(bytes);
        self.at += length;
        Ok(length)
    }
}

/// Records streamed into a staged generation, the first error of the
/// snapshot's own kept aside: it says the sender's bytes were bad, where
/// an error of the store says this node could not write them.
struct Watched<'a, I> {
    records: I,
    invalid: &'a RefCell<Option<String>>,
    /// Whether the thread has lowered itself: on the first record asked
    /// for, once the staged generation (and its worker threads) exist.
    idle: bool,
}

impl<I> Iterator for Watched<'_, I>
where
    I: Iterator<Item = Result<oncekv_core::snapshot::Streamed, snapshot::SnapshotError>>,
{
    type Item = I::Item;

    fn next(&mut self) -> Option<Self::Item> {
        if !self.idle {
            self.idle = true;
            super::background::idle_from_now();
        }
        let item = self.records.next()?;
        if let Err(error) = &item {
            self.invalid.borrow_mut().get_or_insert(error.to_string());
        }
        Some(item)
    }
}

impl Reception {
    /// Reads the snapshot as it arrives, checks it against its meta, and
    /// returns it ready to install: the file (the part, or the whole
    /// snapshot) and the staged generation holding its records, if any.
    fn take_in(
        mut self,
        mut chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
        writer: BufWriter<File>,
    ) -> Result<SnapshotFile, ReceiveError> {
        let mut copy = Copy {
            writer,
            behind: WriteBehind::default(),
            end: self.registry_offset,
            failed: None,
        };
        if let Some(extending) = self.extending.take() {
            return self.take_in_extension(chunks, copy, extending);
        }
        let Some(store) = self.records.clone() else {
            // Without a record store the file is the whole snapshot:
            // copied as it comes, then checked from the file, every record
            // counted and dropped (the install reads the file again).
            super::background::idle_from_now();
            while let Some(chunk) = chunks.blocking_recv() {
                copy.write(&chunk)?;
            }
            let file = copy.writer.into_inner().map_err(|e| e.into_error())?;
            let mut snapshot = self.into_file(file, None);
            snapshot
                .read_registry_leaving_keys()
                .map_err(ReceiveError::Invalid)?;
            return Ok(snapshot);
        };
        let copy = RefCell::new(Some(copy));
        let input = Arriving {
            chunks,
            chunk: Vec::new(),
            at: 0,
            copy: &copy,
        };
        let fault = |error| copy_fault(&copy, error);
        let staged = match snapshot::read_part(input, false).map_err(fault)? {
            // Before format 8: read whole, the file holding every byte.
            snapshot::Part::Whole(registry) => {
                super::background::idle_from_now();
                check_meta(&self.meta, &registry).map_err(ReceiveError::Invalid)?;
                None
            }
            snapshot::Part::Records(registry, records) => {
                check_meta(&self.meta, &registry).map_err(ReceiveError::Invalid)?;
                // The file keeps the part: what a build writes as its part
                // file, byte for byte.
                let part = copy.borrow_mut().take();
                let invalid = RefCell::new(None);
                let watched = Watched {
                    records,
                    invalid: &invalid,
                    idle: false,
                };
                let generation = store
                    .stage_generation(
                        watched,
                        snapshot_index(&self.meta),
                        registry.first_live_key_group_ms(),
                        registry
                            .rules()
                            .finished_claims_grouped()
                            .then(|| registry.first_live_claim_group_ms()),
                    )
                    .map_err(|error| match invalid.borrow_mut().take() {
                        Some(reason) => ReceiveError::Invalid(reason),
                        None => ReceiveError::Io(error),
                    })?;
                *copy.borrow_mut() = part;
                Some(Staged {
                    registry,
                    generation,
                })
            }
        };
        let copy = copy
            .into_inner()
            .ok_or_else(|| io::Error::other("a received snapshot's file went missing"))?;
        let file = copy.writer.into_inner().map_err(|e| e.into_error())?;
        Ok(self.into_file(file, staged))
    }

    /// Reads an extension of `extending`'s base as it arrives: the part to
    /// the file, as a whole snapshot's; the records sent into memory (at
    /// most [`EXTENSION_STORED_BYTES_MAX`] of them), each checked, a record
    /// of the base's own cluster time looked up in the base's view (held
    /// byte for byte, it does not count as added); after the last, the
    /// groups' sums over the base's.
    fn take_in_extension(
        self,
        chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
        copy: Copy,
        extending: Extending,
    ) -> Result<SnapshotFile, ReceiveError> {
        let Extending { current } = extending;
        let copy = RefCell::new(Some(copy));
        let input = Arriving {
            chunks,
            chunk: Vec::new(),
            at: 0,
            copy: &copy,
        };
        let fault = |error| copy_fault(&copy, error);
        let view = current.view.clone();
        // A failed lookup answers "not held": the record then counts as
        // added, and the sums refuse the extension (sent whole instead).
        let held: snapshot::HeldByBase = Box::new(move |streamed| {
            let (key, group, bytes) = stored_row(streamed);
            view.get(&key)
                .ok()
                .flatten()
                .is_some_and(|stored| stored.group == group && stored.bytes == *bytes)
        });
        let (registry, records) =
            snapshot::read_part_extending(input, &current.records, held).map_err(fault)?;
        check_meta(&self.meta, &registry).map_err(ReceiveError::Invalid)?;
        let part = copy.borrow_mut().take();
        super::background::idle_from_now();
        let mut added = Vec::new();
        let mut bytes = 0u64;
        for record in *records {
            let record = record.map_err(extension_error)?;
            let (key, group, stored) = stored_row(&record);
            bytes += (key.len() + stored.len()) as u64;
            if bytes > EXTENSION_STORED_BYTES_MAX {
                // More than planned (records removed meanwhile, say): to
                // be sent whole, not refused again at every try.
                return Err(ReceiveError::NotAnExtension(format!(
                    "an extension of more than {EXTENSION_STORED_BYTES_MAX} bytes of records"
                )));
            }
            let bytes = match record {
                snapshot::Streamed::Key(_, _, bytes) | snapshot::Streamed::Claim(_, _, bytes) => {
                    bytes
                }
            };
            added.push((key, StoredRecord { group, bytes }));
        }
        *copy.borrow_mut() = part;
        let copy = copy
            .into_inner()
            .ok_or_else(|| io::Error::other("a received snapshot's file went missing"))?;
        let file = copy.writer.into_inner().map_err(|e| e.into_error())?;
        let extension = Extended {
            registry,
            records: added,
            base: current.id,
            builds_held: None,
        };
        Ok(self.into_file_with(file, None, Some(extension)))
    }

    /// The received snapshot: its (temporary) file, and its staged state.
    fn into_file(self, file: File, staged: Option<Staged>) -> SnapshotFile {
        self.into_file_with(file, staged, None)
    }

    fn into_file_with(
        self,
        file: File,
        staged: Option<Staged>,
        extension: Option<Extended>,
    ) -> SnapshotFile {
        SnapshotFile {
            file,
            path: self.temporary.path().to_path_buf(),
            meta: self.meta,
            registry_offset: self.registry_offset,
            received: Some(Received {
                temporary: self.temporary,
                staged,
                extension,
                _receiving: self.permit,
            }),
            records: None,
            base: None,
        }
    }
}

/// A reception's reading error: the copy's own write failure if there was
/// one (this node's disk), else the snapshot's (see [`extension_error`]).
fn copy_fault(copy: &RefCell<Option<Copy>>, error: snapshot::SnapshotError) -> ReceiveError {
    match copy
        .borrow_mut()
        .as_mut()
        .and_then(|copy| copy.failed.take())
    {
        Some(failed) => ReceiveError::Io(failed),
        None => extension_error(error),
    }
}

/// An extension's reading error: one that says it is not an extension of
/// the base is the sender's cue to send the snapshot whole; any other says
/// its bytes are bad.
fn extension_error(error: snapshot::SnapshotError) -> ReceiveError {
    match error {
        snapshot::SnapshotError::NotAnExtension => ReceiveError::NotAnExtension(error.to_string()),
        error => ReceiveError::Invalid(error.to_string()),
    }
}

/// A streamed record's row in the record store: its store key, group and
/// stored bytes.
fn stored_row(streamed: &snapshot::Streamed) -> (Vec<u8>, u64, &Vec<u8>) {
    match streamed {
        snapshot::Streamed::Key(id, record, bytes) => (
            oncekv_core::stored::key_id_bytes(id),
            record.group_ms,
            bytes,
        ),
        snapshot::Streamed::Claim(id, record, bytes) => (
            oncekv_core::stored::claim_id_bytes(id),
            record.group_ms,
            bytes,
        ),
    }
}

impl Reception {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step waits for the range started at the step before and starts
    /// the range written since: at most two windows are ever left to the
    /// final fsync, and every byte is handed to the disk exactly once.
    #[test]
    fn write_behind_starts_each_window_once_and_waits_for_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = File::create(dir.path().join("received")).unwrap();
        let window = WRITE_BEHIND_BYTES;
        let mut behind = WriteBehind::default();
        assert!(!behind.due(window - 1));
        assert!(behind.due(window));
        let mut end = 0;
        for (written, started_before) in [
            (window, 0),
            (window + 7, window),
            (3 * window, 2 * window + 7),
        ] {
            file.write_all(&vec![7u8; written as usize]).unwrap();
            end += written;
            assert!(behind.due(end));
            behind.step(&file, end).unwrap();
            assert_eq!(
                behind.waited, started_before,
                "the range before is waited for"
            );
            assert_eq!(behind.started, end, "everything written is started");
            assert!(!behind.due(end + window - 1));
        }
        file.sync_all().unwrap();
        assert_eq!(file.metadata().unwrap().len(), end);
    }
}
