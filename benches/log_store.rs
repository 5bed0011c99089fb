//! Benchmark of the two Raft log stores, the sled one (`SledLogStore`, one
//! flusher thread calling sled's flush) and the segment log
//! (`SegmentLogStore`, one writer thread, one pwrite + fdatasync per group):
//! appends of 1, 16 and 64 entries of about 100 bytes, each awaited until
//! its callback reports it durable, one at a time; and
//! 8 appenders at once (group commit). Throughput is in entries (elements);
//! an append is one iteration.
//!
//! Two baselines put the figures in proportion: a bare 128-byte `pwrite` +
//! `fdatasync` on a preallocated file (the floor of any durable append), and
//! the same with `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)`, which
//! is what sled 0.34 calls when it flushes on Linux (`pagecache/iobuf.rs`):
//! it writes the pages out but neither flushes the disk's write cache nor
//! the file's metadata, so it is cheaper than an fdatasync and not durable
//! against power loss.
//!
//! The stores live under cargo's target temporary directory, on the disk the
//! target directory is on: run it where that is a real disk, not tmpfs.
//! Run with `cargo bench --bench log_store`.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use oncekv::raft_types::{LogId, TypeConfig, Vote};
use oncekv::storage::{SegmentLogStore, SledLogStore};
use oncekv_core::{ClientId, ClusterId, Command, Entry, Execute, Op, Value};
use openraft::entry::RaftEntry as _;
use openraft::storage::{IOFlushed, RaftLogStorage, RaftLogStorageExt};
use openraft::{LogState, OptionalSend, RaftLogReader};
use std::io;
use tokio::runtime::Runtime;
use tokio::sync::Mutex;

type RaftEntry = oncekv::raft_types::Entry;

/// Appenders in the concurrent case.
const APPENDERS: u64 = 8;

/// A client write of a 16-byte key and a 64-byte value: about 100 bytes
/// encoded, like a small `Execute`.
fn raft_entry(index: u64) -> RaftEntry {
    openraft::Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: openraft::EntryPayload::Normal(Entry::single(
            index,
            Op::Execute(Execute {
                cluster_id: ClusterId(1),
                client_id: ClientId(2 + index % 64),
                seq: index,
                first_outstanding_seq: index,
                command: Command::Put {
                    key: format!("key-{index:012}").into_bytes(),
                    value: Value::Bytes(vec![0x5a; 64]),
                },
                principal: oncekv_core::Principal::anonymous(),
            }),
        )),
    }
}

/// A fresh, empty directory for one store.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("log_store_bench")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(error) = std::fs::create_dir_all(&dir) {
        panic!("creating {}: {error}", dir.display());
    }
    dir
}

fn open_sled(dir: &Path) -> SledLogStore<TypeConfig> {
    // As the node opens it: no background flushes, every fsync through the
    // store's flusher.
    let opened = sled::Config::new()
        .path(dir)
        .cache_capacity(64 << 20)
        .flush_every_ms(None)
        .open()
        .map_err(|e| e.to_string())
        .and_then(|db| SledLogStore::open(db).map_err(|e| e.to_string()));
    opened.unwrap_or_else(|error| panic!("opening sled in {}: {error}", dir.display()))
}

fn open_segments(dir: &Path) -> SegmentLogStore<TypeConfig> {
    SegmentLogStore::open(dir)
        .unwrap_or_else(|error| panic!("opening segments in {}: {error}", dir.display()))
}

/// A log store shared by several appenders, each holding a clone. The lock
/// is held only while `append` queues the entries (renumbering them so the
/// log stays contiguous whatever order appenders arrive in); each appender
/// then waits for its own callback without it, so appends overlap the way
/// they would with a pipelining Raft. openraft's callback type cannot be
/// built outside openraft, so this goes through its `blocking_append`.
struct Shared<S> {
    inner: Arc<Mutex<(S, u64)>>,
}

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: RaftLogStorage<TypeConfig> + RaftLogReader<TypeConfig>> RaftLogReader<TypeConfig>
    for Shared<S>
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RaftEntry>, io::Error> {
        self.inner.lock().await.0.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.inner.lock().await.0.read_vote().await
    }
}

impl<S: RaftLogStorage<TypeConfig> + RaftLogReader<TypeConfig>> RaftLogStorage<TypeConfig>
    for Shared<S>
{
    type LogReader = S::LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        self.inner.lock().await.0.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.inner.lock().await.0.get_log_reader().await
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.inner.lock().await.0.save_vote(vote).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.inner.lock().await.0.save_committed(committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        self.inner.lock().await.0.read_committed().await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut guard = self.inner.lock().await;
        let (store, next_index) = &mut *guard;
        let entries: Vec<RaftEntry> = entries
            .into_iter()
            .map(|mut entry| {
                entry.set_log_id(openraft::testing::log_id::<TypeConfig>(1, 1, *next_index));
                *next_index += 1;
                entry
            })
            .collect();
        store.append(entries, callback).await
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        self.inner.lock().await.0.truncate_after(last_log_id).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.inner.lock().await.0.purge(log_id).await
    }
}

/// Appends `iters` batches of `batch` entries to `store`, one after the
/// other, each awaited until durable; the log continues at `next_index`.
async fn append_batches<S: RaftLogStorage<TypeConfig>>(
    store: &mut S,
    next_index: &mut u64,
    batch: u64,
    iters: u64,
) -> Duration {
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let start = Instant::now();
    for _ in 0..iters {
        let first = *next_index;
        *next_index += batch;
        if let Err(error) = store
            .blocking_append((first..first + batch).map(raft_entry))
            .await
        {
            panic!("append failed: {error}");
        }
    }
    start.elapsed()
}

/// `iters` single-entry appends spread over [`APPENDERS`] concurrent appenders.
async fn append_concurrently<S>(store: &Shared<S>, iters: u64) -> Duration
where
    S: RaftLogStorage<TypeConfig> + RaftLogReader<TypeConfig> + Send + 'static,
{
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let start = Instant::now();
    let appenders: Vec<_> = (0..APPENDERS)
        .map(|appender| {
            let mut store = store.clone();
            let appends = iters / APPENDERS + u64::from(appender < iters % APPENDERS);
            tokio::spawn(async move {
                for _ in 0..appends {
                    // The index is replaced under the lock.
                    if let Err(error) = store.blocking_append([raft_entry(0)]).await {
                        panic!("append failed: {error}");
                    }
                }
            })
        })
        .collect();
    for appender in appenders {
        if let Err(error) = appender.await {
            panic!("appender failed: {error}");
        }
    }
    start.elapsed()
}

fn bench_store<S, F>(c: &mut Criterion, runtime: &Runtime, name: &str, open: F)
where
    S: RaftLogStorage<TypeConfig> + RaftLogReader<TypeConfig> + Send + 'static,
    F: Fn(&Path) -> S,
{
    let mut group = c.benchmark_group(format!("log_store/{name}"));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for batch in [1u64, 16, 64] {
        let mut store = open(&fresh_dir(&format!("{name}-batch-{batch}")));
        let mut next_index = 1;
        group.throughput(Throughput::Elements(batch));
        group.bench_function(BenchmarkId::new("append_batch", batch), |b| {
            b.iter_custom(|iters| {
                runtime.block_on(append_batches(&mut store, &mut next_index, batch, iters))
            });
        });
    }
    let shared = Shared {
        inner: Arc::new(Mutex::new((
            open(&fresh_dir(&format!("{name}-concurrent"))),
            1,
        ))),
    };
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("append_1_concurrent", APPENDERS), |b| {
        b.iter_custom(|iters| runtime.block_on(append_concurrently(&shared, iters)))
    });
    group.finish();
}

/// Which call follows each `pwrite` in the baselines.
#[derive(Clone, Copy)]
enum Sync {
    Fdatasync,
    SyncFileRange,
}

/// `iters` appends of 128 bytes to a preallocated file, each followed by `sync`.
fn raw_appends(file: &std::fs::File, offset: &mut u64, sync: Sync, iters: u64) -> Duration {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    const RECORD_BYTES: u64 = 128;
    let record = [0x5au8; RECORD_BYTES as usize];
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let start = Instant::now();
    for _ in 0..iters {
        if *offset + RECORD_BYTES > BASELINE_FILE_BYTES {
            *offset = 0;
        }
        let synced = file
            .write_all_at(&record, *offset)
            .and_then(|()| match sync {
                Sync::Fdatasync => file.sync_data(),
                Sync::SyncFileRange => {
                    // SAFETY: a plain syscall on a file descriptor `file` keeps open.
                    let result = unsafe {
                        libc::sync_file_range(
                            file.as_raw_fd(),
                            *offset as libc::off64_t,
                            RECORD_BYTES as libc::off64_t,
                            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                                | libc::SYNC_FILE_RANGE_WRITE
                                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                        )
                    };
                    if result == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                }
            });
        if let Err(error) = synced {
            panic!("baseline append failed: {error}");
        }
        *offset += RECORD_BYTES;
    }
    start.elapsed()
}

const BASELINE_FILE_BYTES: u64 = 64 << 20;

fn bench_baselines(c: &mut Criterion) {
    let mut group = c.benchmark_group("log_store/baseline");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for (name, sync) in [
        ("pwrite_fdatasync", Sync::Fdatasync),
        ("pwrite_sync_file_range", Sync::SyncFileRange),
    ] {
        let path = fresh_dir(name).join("file");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .and_then(|file| file.set_len(BASELINE_FILE_BYTES).map(|()| file))
            .and_then(|file| file.sync_all().map(|()| file))
            .unwrap_or_else(|error| panic!("creating {}: {error}", path.display()));
        let mut offset = 0;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| raw_appends(&file, &mut offset, sync, iters));
        });
    }
    group.finish();
}

fn main() {
    let runtime = match Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => panic!("tokio runtime: {error}"),
    };
    let payload_bytes = oncekv_core::codec::encode(&raft_entry(1_000_000)).len();
    eprintln!("one entry encodes to {payload_bytes} bytes");
    let mut c = Criterion::default().configure_from_args();
    bench_baselines(&mut c);
    bench_store(&mut c, &runtime, "sled", open_sled);
    bench_store(&mut c, &runtime, "segments", open_segments);
    c.final_summary();
    let _ = std::fs::remove_dir_all(Path::new(env!("CARGO_TARGET_TMPDIR")).join("log_store_bench"));
}
