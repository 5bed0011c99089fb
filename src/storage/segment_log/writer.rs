//! The one thread that writes segment files. It group-commits: it takes
//! everything queued, writes it with one `pwrite` (two around a segment
//! change), calls `fdatasync` once if anyone waits for durability, and only
//! then completes the waiters. It also rolls to a new segment when the
//! active one is full and deletes segments a durable purge covers. It never
//! decides what is written, and it must never complete a waiter before the
//! `fdatasync` covering its bytes has returned (rule 14).

use std::collections::VecDeque;
use std::fs;
use std::fs::File;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use super::format::segment_header;

/// Largest group buffer kept for reuse between groups.
const BUFFER_KEPT_BYTES: usize = 8 << 20;

/// Called on the writer thread once a job's bytes are durable (or failed).
/// It must not block.
pub(super) type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// Which piece of state a record carries, for copying the newest of each
/// into the head of every new segment: a purge record then survives the
/// deletion of the segment it was written to.
#[derive(Clone, Copy, Debug)]
pub(super) enum MetaKind {
    Vote = 0,
    Committed = 1,
    Purge = 2,
}

/// Framed records to write, and what to do once they are durable.
pub(super) struct Job {
    pub(super) frames: Vec<u8>,
    /// Set when `frames` is exactly one record of this kind.
    pub(super) meta: Option<MetaKind>,
    /// Highest entry index in `frames`, for deciding when a segment may go.
    pub(super) last_index: Option<u64>,
    /// After this job is durable, delete the segments it covers.
    pub(super) purged_index: Option<u64>,
    /// `None`: no one waits; the bytes become durable with the next group
    /// that has a waiter.
    pub(super) done: Option<Done>,
}

impl Job {
    pub(super) fn new(frames: Vec<u8>) -> Self {
        Self {
            frames,
            meta: None,
            last_index: None,
            purged_index: None,
            done: None,
        }
    }
}

/// A full segment; read only by recovery, deleted once purged.
pub(super) struct SealedSegment {
    pub(super) path: PathBuf,
    /// Highest entry index ever written to it (`None`: no entries).
    pub(super) last_index: Option<u64>,
}

/// The segment being appended to.
pub(super) struct ActiveSegment {
    pub(super) sequence: u64,
    pub(super) path: PathBuf,
    pub(super) file: File,
    /// Where the next record goes.
    pub(super) offset: u64,
    /// End of the header and of the state copied into it: a segment with
    /// nothing after this is never rolled (the record would not fit the
    /// next one either).
    pub(super) head_end: u64,
    pub(super) last_index: Option<u64>,
}

/// Everything the writer thread owns.
pub(super) struct WriterState {
    pub(super) dir: PathBuf,
    pub(super) segment_bytes: u64,
    /// Older segments, oldest first.
    pub(super) sealed: VecDeque<SealedSegment>,
    pub(super) active: ActiveSegment,
    /// Newest vote, committed and purge record, indexed by [`MetaKind`].
    pub(super) meta_frames: [Option<Vec<u8>>; 3],
    /// Bytes written since the last `fdatasync`.
    pub(super) dirty: bool,
    /// Tests set this to make every `fdatasync` fail.
    #[cfg(test)]
    pub(super) fail_syncs: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Tests: [`SyncedExtents`] of the segment files, for simulating a
    /// power loss.
    #[cfg(test)]
    pub(super) synced: SyncedExtents,
}

/// Tests only: how much of each segment file an `fdatasync` (or the
/// `sync_all` that created it) covers — its data end at its last sync. A
/// simulated power loss drops every byte past it (the segment tests'
/// `lose_unsynced_writes`), so a write reported durable without its sync
/// is caught. Recorded right after the sync calls themselves.
#[cfg(test)]
pub(super) type SyncedExtents =
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<PathBuf, u64>>>;

/// File name of segment `sequence`: zero-padded so names sort in order.
pub(super) fn segment_file_name(sequence: u64) -> String {
    format!("{sequence:020}.seg")
}

/// Creates segment `sequence` holding the segment header and `head`,
/// preallocated to `segment_bytes`. It is built under a temporary name,
/// fsynced, renamed into place and the directory fsynced, so a segment file
/// under its final name always has a complete header and is still there
/// after a crash.
pub(super) fn create_segment(
    dir: &Path,
    sequence: u64,
    segment_bytes: u64,
    head: &[u8],
) -> io::Result<ActiveSegment> {
    let path = dir.join(segment_file_name(sequence));
    let temporary = dir.join(format!("{}.tmp", segment_file_name(sequence)));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&temporary)?;
    let mut bytes = segment_header(sequence).to_vec();
    bytes.extend_from_slice(head);
    // Preallocated length: appends then never change the file's size, so an
    // fdatasync has no size to write, and recovery reads zeros past the end
    // of the data.
    file.set_len(segment_bytes.max(bytes.len() as u64))?;
    file.write_all_at(&bytes, 0)?;
    file.sync_all()?;
    fs::rename(&temporary, &path)?;
    sync_dir(dir)?;
    Ok(ActiveSegment {
        sequence,
        path,
        file,
        offset: bytes.len() as u64,
        head_end: bytes.len() as u64,
        last_index: None,
    })
}

/// Makes creations, renames and deletions in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A failure remembered by the writer; `io::Error` cannot be cloned.
#[derive(Clone)]
struct Failure {
    kind: io::ErrorKind,
    message: String,
}

impl Failure {
    fn to_error(&self) -> io::Error {
        io::Error::new(self.kind, self.message.clone())
    }
}

fn stopped() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the segment log writer has stopped",
    )
}

impl WriterState {
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.active.file.write_all_at(bytes, self.active.offset)?;
        self.active.offset += bytes.len() as u64;
        self.dirty = true;
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        if self.dirty {
            #[cfg(test)]
            if self.fail_syncs.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::other("injected fdatasync failure"));
            }
            self.active.file.sync_data()?;
            #[cfg(test)]
            self.record_synced();
            self.dirty = false;
        }
        Ok(())
    }

    /// Tests: the active segment is synced up to its current offset.
    #[cfg(test)]
    fn record_synced(&self) {
        self.synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(self.active.path.clone(), self.active.offset);
    }

    /// Starts the next segment, its head holding the newest vote, committed
    /// and purge records. The active one must be synced already.
    fn roll(&mut self) -> io::Result<()> {
        let head: Vec<u8> = self
            .meta_frames
            .iter()
            .flatten()
            .flatten()
            .copied()
            .collect();
        // The sequence came from a file name on disk: a damaged or
        // planted one may be the last there is (wrapping to 0 would sort
        // the new segment first, and recovery would drop it as purged).
        let sequence = self.active.sequence.checked_add(1).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "the active segment has the last sequence number there is",
            )
        })?;
        let next = create_segment(&self.dir, sequence, self.segment_bytes, &head)?;
        let full = std::mem::replace(&mut self.active, next);
        // `create_segment` synced the new segment's head.
        #[cfg(test)]
        self.record_synced();
        tracing::debug!(
            segment_sequence = sequence,
            full_segment_bytes = full.offset,
            "segment log rolled to a new segment"
        );
        self.sealed.push_back(SealedSegment {
            path: full.path,
            last_index: full.last_index,
        });
        Ok(())
    }

    /// Writes one group; syncs it when `sync`. Returns the bytes written.
    fn commit(&mut self, jobs: Vec<Job>, buffer: &mut Vec<u8>, sync: bool) -> io::Result<usize> {
        buffer.clear();
        let mut written_bytes = 0;
        for job in jobs {
            let pending = self.active.offset + buffer.len() as u64;
            if !job.frames.is_empty()
                && pending + job.frames.len() as u64 > self.segment_bytes
                && pending > self.active.head_end
            {
                // Records never span segments; what is queued goes into the
                // full segment, durably, before the next segment exists, so
                // recovery never sees a newer segment beside an unsynced tail.
                self.write(buffer)?;
                written_bytes += buffer.len();
                buffer.clear();
                self.sync()?;
                self.roll()?;
            }
            buffer.extend_from_slice(&job.frames);
            if let Some(index) = job.last_index {
                self.active.last_index = self.active.last_index.max(Some(index));
            }
            if let Some(kind) = job.meta {
                self.meta_frames[kind as usize] = Some(job.frames);
            }
        }
        self.write(buffer)?;
        written_bytes += buffer.len();
        if sync {
            self.sync()?;
        }
        Ok(written_bytes)
    }

    /// Deletes the oldest sealed segments while every entry in them is at or
    /// below `purged_index`: only whole segments, oldest first, never the
    /// active one, and no entry is read to decide. The purge record that
    /// allows it is durable in a newer segment (and copied into the head of
    /// every later one).
    fn delete_covered(&mut self, purged_index: u64) {
        let mut deleted_segments = 0usize;
        while let Some(oldest) = self.sealed.front() {
            if oldest.last_index.is_some_and(|index| index > purged_index) {
                break;
            }
            match fs::remove_file(&oldest.path) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => {
                    // Kept in the list: the next purge tries again.
                    tracing::warn!(path = %oldest.path.display(), %error, "could not delete a purged segment");
                    break;
                }
            }
            self.sealed.pop_front();
            deleted_segments += 1;
        }
        if deleted_segments > 0 {
            // Not needed for correctness (recovery drops segments left over
            // from a deletion), only to keep them from coming back.
            if let Err(error) = sync_dir(&self.dir) {
                tracing::warn!(%error, "could not fsync the segment log directory");
            }
            tracing::debug!(deleted_segments, purged_index, "purged segments deleted");
        }
    }
}

/// Handle to the writer thread. Dropping it lets the thread finish what is
/// queued and waits for it.
pub(super) struct Writer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Writer {
    pub(super) fn spawn(state: WriterState) -> io::Result<Self> {
        // What recovery found (or created) counts as synced.
        #[cfg(test)]
        state.record_synced();
        let (tx, rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("segment-log-writer".into())
            .spawn(move || run(state, &rx))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues `job`; its `done` runs on the writer thread.
    pub(super) fn submit(&self, job: Job) {
        let Some(tx) = &self.tx else {
            if let Some(done) = job.done {
                done(Err(stopped()));
            }
            return;
        };
        if let Err(mpsc::SendError(job)) = tx.send(job)
            && let Some(done) = job.done
        {
            done(Err(stopped()));
        }
    }

    /// Queues `job` and waits until it is durable.
    pub(super) async fn write_durably(&self, mut job: Job) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        job.done = Some(Box::new(move |result| {
            // The waiting future may have been dropped; no one is left to tell.
            let _ = tx.send(result);
        }));
        self.submit(job);
        rx.await.map_err(|_| stopped())?
    }
}

impl Drop for Writer {
    /// Closes the queue, then waits for the thread: at most for the group
    /// in flight, so the files are closed when the store is gone.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("segment log writer thread panicked");
        }
    }
}

fn run(mut state: WriterState, rx: &mpsc::Receiver<Job>) {
    // After a failed write or fdatasync the file's contents are unknown
    // (the kernel may have dropped the dirty pages): every later job fails.
    let mut failure: Option<Failure> = None;
    let mut buffer = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let group_jobs = jobs.len();
        let mut waiters = Vec::new();
        let mut purged_index = None;
        for job in &mut jobs {
            waiters.extend(job.done.take());
            purged_index = purged_index.max(job.purged_index);
        }
        let result = match &failure {
            Some(failure) => Err(failure.clone()),
            None => state
                .commit(jobs, &mut buffer, !waiters.is_empty())
                .map_err(|error| Failure {
                    kind: error.kind(),
                    message: error.to_string(),
                }),
        };
        match &result {
            Ok(group_bytes) => tracing::trace!(
                group_jobs,
                group_waiters = waiters.len(),
                group_bytes,
                "segment log group committed"
            ),
            Err(error) if failure.is_none() => {
                tracing::error!(error = %error.message, group_jobs, "segment log write failed; the log refuses further writes");
                failure = Some(error.clone());
            }
            Err(_) => {}
        }
        for waiter in waiters {
            waiter(result.as_ref().map(drop).map_err(Failure::to_error));
        }
        // One huge group (a snapshot's worth of entries replicated at once)
        // must not pin its buffer for the life of the process.
        if buffer.capacity() > BUFFER_KEPT_BYTES {
            buffer = Vec::new();
        }
        if result.is_ok()
            && let Some(purged_index) = purged_index
        {
            state.delete_covered(purged_index);
        }
    }
}
