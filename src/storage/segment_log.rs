//! Append-only, group-committing Raft log storage (openraft 0.10 `RaftLogStorage`)
//! in a directory of preallocated segment files, the way etcd's WAL and
//! TiKV's raft-engine keep theirs: owns the log entries, the vote, the
//! committed log id and the last purged log id.
//!
//! Entries after the last purge live in memory, so reads and the log state
//! never touch the disk; each `append` is encoded once into framed records
//! (length, type, CRC32) that one writer thread writes and fdatasyncs in
//! groups. Truncate, purge and vote are records too; purging deletes whole
//! segment files, never rewrites one. Opening replays the segments, cuts
//! a torn tail off the last one, and refuses a log with damage before its
//! end or with segments missing (`recovery`'s module doc says which is
//! which).
//!
//! It only translates openraft's log calls into durable records and back; it
//! decides nothing about consensus. It must never report data as persisted
//! before the `fdatasync` covering it has returned (rule 14), never block the
//! tokio runtime on disk IO after opening, and never panic on bytes read from
//! disk.

mod format;
mod memory;
mod recovery;
mod writer;

#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::fs;
use std::fs::File;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::PoisonError;
use std::sync::RwLock;
use std::sync::RwLockReadGuard;
use std::sync::RwLockWriteGuard;

use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::RaftTypeConfig;
use openraft::entry::RaftEntry;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;
use openraft::type_config::alias::LogIdOf;
use openraft::type_config::alias::VoteOf;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::half_open;
use format::RecordType;
use memory::MemoryLog;
use oncekv_core::codec::CodecError;
use writer::Job;
use writer::MetaKind;
use writer::Writer;

/// Name of the lock file that keeps a second store off the directory.
const LOCK_FILE: &str = "LOCK";

/// Failures of the segment log store, before they are wrapped into openraft's [`StorageError`].
#[derive(Debug, thiserror::Error)]
pub enum SegmentLogError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is in use by another segment log store")]
    Locked { path: PathBuf },
    #[error("{path}: bad segment header (found sequence {found_sequence:?})")]
    BadSegmentHeader {
        path: PathBuf,
        found_sequence: Option<u64>,
    },
    #[error("{}", corrupt_message(.path, *.offset, *.valid_record_offset))]
    Corrupt {
        path: PathBuf,
        offset: u64,
        valid_record_offset: Option<u64>,
    },
    #[error(
        "{dir} holds no segment file (*.seg), but a log was kept there (its LOCK file is \
         there): its segments were deleted, and with them the Raft log, the saved vote and \
         the purge point (a node that forgot its vote could vote twice in a term); refusing \
         to start. Put the segment files back, or replace this node with a new node id \
         (docs/deploy.md, \"Replacing a host\")"
    )]
    NoSegments { dir: PathBuf },
    #[error("{}", missing_segment_message(.path, *.first_index, *.purged_index))]
    MissingSegment {
        /// The segment just before the oldest one left.
        path: PathBuf,
        /// The first entry the segments left hold.
        first_index: Option<u64>,
        /// The last purged index the segments left hold.
        purged_index: Option<u64>,
    },
    #[error("{path}: unknown record type {type_byte} at offset {offset}")]
    UnknownRecord {
        path: PathBuf,
        offset: u64,
        type_byte: u8,
    },
    #[error("{path}: undecodable record at offset {offset}: {source}")]
    Decode {
        path: PathBuf,
        offset: u64,
        #[source]
        source: CodecError,
    },
    #[error(
        "{path}: entry {found_index} at offset {offset} where entry {expected_index} was expected"
    )]
    ReplayOutOfOrder {
        path: PathBuf,
        offset: u64,
        expected_index: u64,
        found_index: u64,
    },
    #[error("appending entry {found_index} where entry {expected_index} was expected")]
    OutOfOrder {
        expected_index: u64,
        found_index: u64,
    },
    #[error("a record of {payload_bytes} bytes is over the codec's decode limit")]
    TooLarge { payload_bytes: usize },
    #[error("segment log write: {0}")]
    Write(#[source] io::Error),
    #[error("could not start the segment log writer thread: {0}")]
    SpawnWriter(#[source] io::Error),
}

/// What to do about a log that damage or a deletion made unusable.
const REPLACE_THE_NODE: &str = "replace this node with a new node id (docs/deploy.md, \
     \"Replacing a host\"): the other replicas hold the log";

fn corrupt_message(path: &Path, offset: u64, valid_record_offset: Option<u64>) -> String {
    let found = match valid_record_offset {
        Some(next) => format!(
            "a valid record follows at offset {next}, so this is damage on the disk, not a \
             write a crash cut short, and cutting the log here would drop entries after it \
             that may have been acknowledged"
        ),
        None => "it is not the last segment, so the damage is not a write a crash cut \
                 short"
            .to_string(),
    };
    format!(
        "{}: damaged record at offset {offset}: {found}; refusing to start. Keep a copy \
         of the file for diagnosis and {REPLACE_THE_NODE}",
        path.display()
    )
}

fn missing_segment_message(
    path: &Path,
    first_index: Option<u64>,
    purged_index: Option<u64>,
) -> String {
    let first = first_index.map_or("no entry".to_string(), |index| format!("entry {index}"));
    let purged = purged_index.map_or("the log was never purged".to_string(), |index| {
        format!("the log is purged only up to entry {index}")
    });
    format!(
        "{} is missing: the oldest segment left starts with {first} but {purged}, so \
         entries in between (and the vote saved with them) are lost; refusing to start. \
         Put the file back, or {REPLACE_THE_NODE}",
        path.display()
    )
}

impl From<format::TooLarge> for SegmentLogError {
    fn from(too_large: format::TooLarge) -> Self {
        Self::TooLarge {
            payload_bytes: too_large.payload_bytes,
        }
    }
}

impl From<memory::OutOfOrder> for SegmentLogError {
    fn from(gap: memory::OutOfOrder) -> Self {
        Self::OutOfOrder {
            expected_index: gap.expected_index,
            found_index: gap.found_index,
        }
    }
}

/// openraft 0.10's storage calls fail with `io::Error`: a segment log
/// error keeps its kind (IO errors) and its message.
fn storage_error(error: impl Into<SegmentLogError>) -> io::Error {
    match error.into() {
        SegmentLogError::Write(source) => source,
        SegmentLogError::Io { path, source } => {
            io::Error::new(source.kind(), format!("{}: {source}", path.display()))
        }
        other => io::Error::other(other),
    }
}

/// Tuning of a [`SegmentLogStore`].
#[derive(Clone, Debug)]
pub struct SegmentLogConfig {
    /// Size a segment file is preallocated to; a new segment starts when the
    /// next record would not fit (a record larger than this gets a segment
    /// of its own). Small values are for tests.
    pub segment_bytes: u64,
}

impl Default for SegmentLogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 64 << 20,
        }
    }
}

/// The in-memory log shared by the store and its readers.
struct Shared<C: RaftTypeConfig>(Arc<RwLock<MemoryLog<C>>>);

impl<C: RaftTypeConfig> Clone for Shared<C> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<C: RaftTypeConfig> Shared<C> {
    // A panic while the lock is held cannot leave the log half-changed (no
    // method of `MemoryLog` panics midway), so a poisoned lock is still good.
    fn read(&self) -> RwLockReadGuard<'_, MemoryLog<C>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, MemoryLog<C>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads log entries from memory; cheap to clone and safe to use
/// concurrently with the store. The lock is held only to clone entries out.
pub struct SegmentLogReader<C: RaftTypeConfig> {
    log: Shared<C>,
    /// The durable vote (openraft 0.10 reads it through the reader too).
    vote: Arc<RwLock<Option<VoteOf<C>>>>,
}

impl<C: RaftTypeConfig> Clone for SegmentLogReader<C> {
    fn clone(&self) -> Self {
        Self {
            log: self.log.clone(),
            vote: self.vote.clone(),
        }
    }
}

/// The Raft log store. All writes go through `&mut self`, so they reach the
/// writer thread in call order.
pub struct SegmentLogStore<C: RaftTypeConfig> {
    reader: SegmentLogReader<C>,
    committed: Option<LogIdOf<C>>,
    // Field order matters: the writer (joined on drop) goes before the lock.
    writer: Writer,
    _lock: File,
    /// Index covered by the newest durable snapshot, when attached: a purge
    /// waits until the snapshot behind it is on disk (openraft may purge
    /// while an installed snapshot is still being written).
    durable_snapshot: Option<tokio::sync::watch::Receiver<u64>>,
    /// Where the committed index is reported, when attached (a metric).
    commit_index: Option<prometheus_client::metrics::gauge::Gauge>,
    /// Makes the writer's `fdatasync`s fail (tests only).
    #[cfg(test)]
    fail_syncs: Arc<std::sync::atomic::AtomicBool>,
    /// How far each segment file is synced (tests only).
    #[cfg(test)]
    synced: writer::SyncedExtents,
}

impl<C> SegmentLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Clone + Serialize + DeserializeOwned,
{
    /// Opens (or creates) the log in directory `dir` with 64 MiB segments.
    /// Blocks while it replays the segments: call it before serving.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, SegmentLogError> {
        Self::open_with_config(dir, SegmentLogConfig::default())
    }

    /// Opens (or creates) the log in directory `dir`.
    pub fn open_with_config(
        dir: impl AsRef<Path>,
        config: SegmentLogConfig,
    ) -> Result<Self, SegmentLogError> {
        let dir = dir.as_ref();
        let io_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SegmentLogError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        // The lock file is created when the log is first opened, just
        // before its first segment, and never removed: a directory that
        // has it held a log, and cannot have lost every segment but by
        // damage (recovery tells a crash during that first creation apart).
        let held_a_log = fs::symlink_metadata(&lock_path).is_ok();
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        // Two stores appending to the same segments would corrupt them.
        lock.try_lock().map_err(|error| match error {
            fs::TryLockError::WouldBlock => SegmentLogError::Locked {
                path: dir.to_path_buf(),
            },
            fs::TryLockError::Error(source) => SegmentLogError::Io {
                path: lock_path.clone(),
                source,
            },
        })?;
        let recovered = recovery::recover::<C>(dir, config.segment_bytes, held_a_log)?;
        #[cfg(test)]
        let fail_syncs = recovered.writer.fail_syncs.clone();
        #[cfg(test)]
        let synced = recovered.writer.synced.clone();
        let writer = Writer::spawn(recovered.writer).map_err(SegmentLogError::SpawnWriter)?;
        Ok(Self {
            reader: SegmentLogReader {
                log: Shared(Arc::new(RwLock::new(recovered.memory))),
                vote: Arc::new(RwLock::new(recovered.vote)),
            },
            committed: recovered.committed,
            writer,
            _lock: lock,
            durable_snapshot: None,
            commit_index: None,
            #[cfg(test)]
            fail_syncs,
            #[cfg(test)]
            synced,
        })
    }

    /// Makes purges wait until a snapshot covering the purged entries is
    /// durable (rule 14).
    pub fn purge_after_durable_snapshots(&mut self, durable: tokio::sync::watch::Receiver<u64>) {
        self.durable_snapshot = Some(durable);
    }

    /// Reports every committed index openraft saves into `gauge`.
    pub fn report_commit_index(&mut self, gauge: prometheus_client::metrics::gauge::Gauge) {
        self.commit_index = Some(gauge);
    }

    /// The last purged log index. Never fails (the state is in memory); the
    /// `Result` keeps the signature of the sled store's.
    pub fn last_purged_index(&self) -> Result<Option<u64>, SegmentLogError> {
        Ok(self
            .reader
            .log
            .read()
            .last_purged()
            .map(|log_id| log_id.index))
    }

    fn log(&self) -> &Shared<C> {
        &self.reader.log
    }

    /// Test-only (a fault-injection build, `--fault rewind-commit-record`):
    /// takes the recovered committed id back to the first entry of the last
    /// term in the log, as a power loss can (the record is not fsynced on
    /// its own). Returns the committed id now in force.
    #[cfg(feature = "fault-injection")]
    pub fn rewind_committed_to_term_start(&mut self) -> Option<LogIdOf<C>> {
        let log = self.log().read();
        let last = log.last_log_id();
        let first_of_term = log
            .range(0, None)
            .iter()
            .map(|entry| entry.log_id())
            .find(|log_id| Some(&log_id.leader_id) == last.as_ref().map(|last| &last.leader_id));
        drop(log);
        if let Some(first_of_term) = first_of_term {
            self.committed = self.committed.clone().min(Some(first_of_term));
        }
        self.committed.clone()
    }

    /// Test-only (a fault-injection build, `--fault lose-term-tail`): drops
    /// every entry of the last term in the log after the term's first, and
    /// takes the committed id back to that first entry, as a power loss can
    /// on a leader whose entries went to its followers before its own
    /// fdatasync (they are committed on the followers' copies). Returns the
    /// last log id now in force.
    #[cfg(feature = "fault-injection")]
    pub async fn lose_term_tail(&mut self) -> Result<Option<LogIdOf<C>>, SegmentLogError> {
        let first_of_term = self.rewind_committed_to_term_start();
        if let Some(first_of_term) = first_of_term {
            self.truncate_from(first_of_term.index.saturating_add(1))
                .await?;
        }
        Ok(self.log().read().last_log_id())
    }

    /// One framed record of `record_type` holding `value`.
    fn record<T: Serialize + ?Sized>(
        record_type: RecordType,
        value: &T,
    ) -> Result<Vec<u8>, SegmentLogError> {
        let mut frames = Vec::new();
        format::push_record(&mut frames, record_type, value)?;
        Ok(frames)
    }

    async fn persist_vote(&mut self, vote: &VoteOf<C>) -> Result<(), SegmentLogError> {
        // Through the writer thread like everything else: one file, one
        // fsync path, ordered with the entries, and it shares the fdatasync
        // of a concurrent group. A vote is rare; its latency is one group.
        let job = Job {
            meta: Some(MetaKind::Vote),
            ..Job::new(Self::record(RecordType::Vote, vote)?)
        };
        self.writer
            .write_durably(job)
            .await
            .map_err(SegmentLogError::Write)?;
        *self
            .reader
            .vote
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(vote.clone());
        Ok(())
    }

    /// Deletes entries with index `>= index`, durably: removed from memory
    /// now (readers stop seeing them), and a record makes replay drop them
    /// too, wherever in older segments they were written.
    ///
    /// It returns only once that record is fdatasynced, and openraft awaits
    /// it before it queues the entries that replace the truncated ones. That
    /// is what keeps a power loss from reviving them: openraft 0.10 applies
    /// committed entries as soon as they are queued, before their fdatasync,
    /// and a snapshot can be fsynced over them; a power loss then drops only
    /// writes after the last fdatasync — the new entries, never this record —
    /// so the log comes back ending below the snapshot (a hole openraft
    /// purges at start-up), not with the old term's entries at or above the
    /// snapshot's index, on which openraft refuses to start ("inverted log
    /// order"). Test: `a_snapshot_over_unsynced_entries_survives_a_power_loss`.
    async fn truncate_from(&mut self, index: u64) -> Result<(), SegmentLogError> {
        let frames = Self::record(RecordType::Truncate, &index)?;
        self.log().write().truncate(index);
        self.writer
            .write_durably(Job::new(frames))
            .await
            .map_err(SegmentLogError::Write)
    }

    async fn purge_upto(&mut self, log_id: &LogIdOf<C>) -> Result<(), SegmentLogError> {
        if let Some(durable) = &self.durable_snapshot {
            let mut durable = durable.clone();
            // An error means the state machine is gone: nothing to wait for.
            let _ = durable.wait_for(|index| *index >= log_id.index).await;
        }
        if self
            .log()
            .read()
            .last_purged()
            .is_some_and(|purged| purged.index >= log_id.index)
        {
            return Ok(());
        }
        // The record first, then memory: the entries stay readable until the
        // purge is durable. The writer deletes covered segments after the
        // fdatasync, off the runtime.
        let job = Job {
            meta: Some(MetaKind::Purge),
            purged_index: Some(log_id.index),
            ..Job::new(Self::record(RecordType::Purge, log_id)?)
        };
        self.writer
            .write_durably(job)
            .await
            .map_err(SegmentLogError::Write)?;
        self.log().write().purge(log_id.clone());
        Ok(())
    }

    /// Puts `entries` in memory and queues them to be written; `done` runs
    /// once they are durable.
    fn append_entries(
        &mut self,
        mut entries: Vec<C::Entry>,
        done: writer::Done,
    ) -> Result<(), SegmentLogError> {
        // Only `&mut self` changes the log, so nothing can come between
        // this check and the append below.
        let skip = self.log().read().accept(&entries)?;
        if skip > 0 {
            tracing::warn!(
                skipped_entries = skip,
                first_log_index = entries[0].index(),
                "appended entries at or below the last purged index are skipped"
            );
            entries.drain(..skip);
        }
        let Some(last) = entries.last() else {
            // Nothing to write, but the callback still waits for every
            // earlier write, as openraft's ordering expects.
            self.writer.submit(Job {
                done: Some(done),
                ..Job::new(Vec::new())
            });
            return Ok(());
        };
        let last_index = last.index();
        let count = entries.len();
        // Encoded once, outside the lock.
        let frames = Self::record(RecordType::Entries, &entries)?;
        self.log().write().append(entries);
        tracing::trace!(count, last_log_index = last_index, "log entries queued");
        self.writer.submit(Job {
            last_index: Some(last_index),
            done: Some(done),
            ..Job::new(frames)
        });
        Ok(())
    }
}

impl<C> RaftLogReader<C> for SegmentLogReader<C>
where
    C: RaftTypeConfig,
    C::Entry: Clone,
{
    /// The entries of `range` still in the log. A range at or below the
    /// last purge reads as empty, one partly below it as its unpurged part —
    /// never an error. openraft asks for such a range (while it leads, it
    /// postpones a purge of what a replication stream still reads) from a
    /// replication stream of a leader that has just stepped down: the
    /// stream is closed by dropping its channels, not aborted, so a read it
    /// had started can land after the purge openraft then runs without
    /// waiting for the stream (logged by openraft as "limited_get_log_entries
    /// … returned empty; this violates the API contract"); the stream sends
    /// nothing from it (after the read it sees the new vote, which openraft
    /// saved before the purge, and quits). An error here
    /// would stop the node (openraft takes a replication read error as
    /// fatal). The store itself never drops an entry openraft did not name
    /// in a purge or truncation.
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        Ok(match half_open(&range) {
            Some((start, end)) => self.log.read().range(start, end),
            None => Vec::new(),
        })
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(self
            .vote
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }
}

impl<C> RaftLogReader<C> for SegmentLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Clone + Serialize + DeserializeOwned,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        self.reader.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        self.reader.read_vote().await
    }
}

impl<C> RaftLogStorage<C> for SegmentLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Clone + Serialize + DeserializeOwned,
{
    type LogReader = SegmentLogReader<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        let log = self.log().read();
        Ok(LogState {
            last_purged_log_id: log.last_purged(),
            last_log_id: log.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), io::Error> {
        self.persist_vote(vote).await.map_err(storage_error)?;
        tracing::debug!(%vote, "vote persisted");
        Ok(())
    }

    /// Not fsynced on its own: a committed id that reverts after a crash is
    /// safe, and the record becomes durable with the next group that is.
    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        if let (Some(gauge), Some(committed)) = (&self.commit_index, &committed) {
            gauge.set(i64::try_from(committed.index).unwrap_or(i64::MAX));
        }
        let frames = Self::record(RecordType::Committed, &committed).map_err(storage_error)?;
        self.writer.submit(Job {
            meta: Some(MetaKind::Committed),
            ..Job::new(frames)
        });
        self.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        Ok(self.committed.clone())
    }

    /// Returns once the entries are in memory and queued; `callback` runs
    /// from the writer thread once the `fdatasync` covering them returned
    /// (rule 14). openraft 0.10 may replicate them meanwhile.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let done: writer::Done = Box::new(move |result| callback.io_completed(result));
        self.append_entries(entries.into_iter().collect(), done)
            .map_err(storage_error)
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let from = last_log_id
            .as_ref()
            .map_or(0, |last| last.index.saturating_add(1));
        self.truncate_from(from).await.map_err(storage_error)?;
        tracing::debug!(?last_log_id, "log truncated after");
        Ok(())
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), io::Error> {
        self.purge_upto(&log_id).await.map_err(storage_error)?;
        tracing::debug!(%log_id, "log purged up to");
        Ok(())
    }
}
