//! Threads at a lower CPU priority than the rest of the node, for the work
//! no request waits on:
//! - one for building a snapshot (encoding the state, flushing key records
//!   into the record store) and checking and installing one, at nice 10:
//!   on a busy machine the scheduler gives the request path — Raft, apply,
//!   the RPCs — the CPU first, and such work the time left over (at nice 10
//!   it still gets about a tenth of a contended core, so it ends);
//! - a second at the same priority that hashes the state (`Status`,
//!   `oncekv admin hash`), so that a hash never waits behind an install or
//!   a build;
//! - the work of a catch-up, at the idle priority (`SCHED_IDLE`): one
//!   thread reading a snapshot a chunk at a time (and encoding each chunk's
//!   message) to send it to a node that is behind, and, on that node, a
//!   thread of its own per snapshot received, which takes it in as its
//!   chunks arrive ([`spawn`]: it waits on input as it runs, so it holds
//!   no lane; it lowers itself once it has opened the record store's new
//!   generation, whose worker threads would otherwise inherit the idle
//!   policy for good). A node behind serves no request, and the quorum's requests
//!   must not wait for it: a thread at nice 10 keeps a core for up to a
//!   scheduler slice after a request's thread wakes, an idle one gives it
//!   up at once (docs/state-beyond-ram.md §4.9i).
//!
//! Owns those threads and the queue of jobs to each, run one at a time in
//! the order given. It must not run anything a request's reply waits for,
//! nor decide anything: a job is a closure whose result goes back to the
//! awaiting caller as it was returned (a panic included).

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};

/// How much lower than the node's other threads the background thread
/// runs (Linux `nice` increment; no other platform lowers it).
const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// Which of the background threads runs a job.
#[derive(Clone, Copy, Debug)]
enum Lane {
    /// Builds, checks and installs, one at a time in the order given.
    Long,
    /// State hashes: an operator's `oncekv admin hash` or a `Status`
    /// must not wait behind an install or a build, which at tens of
    /// millions of records last tens of seconds.
    Hash,
    /// Snapshot reads for a node that is behind (a catch-up), at the idle
    /// priority ([`Priority::Idle`]).
    Catchup,
}

/// How far below the node's request path a background thread runs.
#[derive(Clone, Copy, Debug)]
enum Priority {
    /// [`NICE`] lower: a share of a contended core (about a tenth), so the
    /// work ends however busy the machine is; but once on a core it keeps
    /// it for up to a scheduler slice after a request's thread wakes.
    Lower,
    /// Linux `SCHED_IDLE`: a core only when nothing else wants it, given
    /// up the moment another thread wakes. For the work of a catch-up —
    /// the snapshot sent to a node that is behind and taken in there —
    /// which may take longer on a busy machine but must not delay the
    /// requests the quorum is serving (docs/state-beyond-ram.md §4.9i).
    /// Its share of a contended core is tiny (weight 3 against 1,024), not
    /// nothing: a catch-up under a load that keeps every core busy crawls.
    Idle,
}

/// The queue to `lane`'s thread, started on first use.
fn queue(lane: Lane) -> &'static Mutex<mpsc::Sender<Job>> {
    static LONG: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    static HASH: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    static CATCHUP: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let (cell, name, priority) = match lane {
        Lane::Long => (&LONG, "oncekv-background", Priority::Lower),
        Lane::Hash => (&HASH, "oncekv-hasher", Priority::Lower),
        Lane::Catchup => (&CATCHUP, "oncekv-snapshot-out", Priority::Idle),
    };
    cell.get_or_init(|| {
        let (sender, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                lower_this_threads_priority(priority);
                for job in jobs {
                    job();
                }
            })
            .expect("spawning a background thread");
        Mutex::new(sender)
    })
}

/// Lowers the calling thread's CPU priority to `priority` (on Linux a
/// thread's nice value and policy are its own, and lowering either needs
/// no privilege); a failure leaves it as it was.
fn lower_this_threads_priority(priority: Priority) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on this thread's own id; the one pointer
    // passed is to a local that outlives the call.
    unsafe {
        let thread = libc::gettid();
        let lowered = match priority {
            Priority::Lower => {
                let now = libc::getpriority(libc::PRIO_PROCESS, thread as libc::id_t);
                libc::setpriority(libc::PRIO_PROCESS, thread as libc::id_t, now + NICE)
            }
            Priority::Idle => {
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(thread, libc::SCHED_IDLE, &param)
            }
        };
        if lowered != 0 {
            tracing::debug!(?priority, "could not lower a background thread's priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = priority;
}

/// Runs `job` on the background thread and returns its result; a panic in
/// `job` is resumed here.
pub async fn run<T, F>(job: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    run_on(Lane::Long, job).await
}

/// Runs `job` — a state hash — on the hashing thread (at the same lower
/// priority), never behind a build, a snapshot read, a check or an
/// install; a panic in `job` is resumed here.
pub async fn run_hash<T, F>(job: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    run_on(Lane::Hash, job).await
}

/// Runs `job` on `lane`'s thread and returns its result; a panic in `job`
/// is resumed here.
async fn run_on<T, F>(lane: Lane, job: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match run_caught(lane, job).await {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Runs `job` on the background thread and returns its result, or an
/// error naming its panic: for callers that answer a failure as an error
/// (a snapshot's storage calls, a peer's RPC) instead of panicking the
/// task that awaits them.
pub async fn run_io<T, F>(job: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    run_io_on(Lane::Long, job).await
}

/// Runs `job` — a read of a snapshot being sent to a node that is behind —
/// on the catch-up thread ([`Priority::Idle`]), as [`run_io`] does.
pub async fn run_catchup_io<T, F>(job: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    run_io_on(Lane::Catchup, job).await
}

/// Runs `job` on `lane`'s thread: its result, or an error naming its panic.
async fn run_io_on<T, F>(lane: Lane, job: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    match run_caught(lane, job).await {
        Ok(result) => result,
        Err(panic) => Err(panicked(panic)),
    }
}

/// The error a job's panic is answered with.
fn panicked(panic: Box<dyn std::any::Any + Send>) -> std::io::Error {
    let what = panic
        .downcast_ref::<&str>()
        .map(|what| what.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    std::io::Error::other(format!("a background job panicked: {what}"))
}

/// A job on a thread of its own (see [`spawn`]); awaiting it gives its
/// result, or an error naming its panic.
pub struct Spawned<T> {
    outcome: tokio::sync::oneshot::Receiver<std::thread::Result<T>>,
}

impl<T> Spawned<T> {
    /// The job's result once it ends (an error if it panicked).
    pub async fn join(self) -> std::io::Result<T> {
        match self.outcome.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) => Err(panicked(panic)),
            Err(_) => Err(std::io::Error::other("a background job's thread ended")),
        }
    }
}

/// Starts `job` — a snapshot received from the leader and taken in as it
/// arrives — on a new thread named `name`, which the job lowers to the
/// idle priority of a catch-up ([`idle_from_now`]) once it has started
/// what must not inherit it: for a job that waits on input as it
/// runs, which would hold a lane (and every job queued behind it) while
/// it waits. The thread ends with the job; nothing waits for it unless
/// [`Spawned::join`] is awaited.
pub fn spawn<T, F>(name: &str, job: F) -> std::io::Result<Spawned<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (reply, outcome) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let _ = reply.send(result);
        })?;
    Ok(Spawned { outcome })
}

/// Lowers the calling thread — a job's own thread started by [`spawn`] —
/// to the idle priority of a catch-up ([`Priority::Idle`]), for good: a
/// thread leaves `SCHED_IDLE` only with a privilege. Called once whatever
/// the job starts that outlives it (a record store's worker threads,
/// which inherit their creator's policy) has been started.
pub fn idle_from_now() {
    lower_this_threads_priority(Priority::Idle);
}

/// Runs `job` on `lane`'s thread; its value, or its panic.
async fn run_caught<T, F>(lane: Lane, job: F) -> std::thread::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (reply, result) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        let _ = reply.send(outcome);
    });
    queue(lane)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send(job)
        .expect("the background thread runs as long as the process");
    result
        .await
        .expect("the background thread answers every job")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_in_order_on_a_lower_priority_thread() {
        let first = run(|| std::thread::current().name().map(str::to_owned)).await;
        assert_eq!(first.as_deref(), Some("oncekv-background"));
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let runs: Vec<_> = (0..5)
            .map(|n| {
                let order = order.clone();
                run(move || order.lock().unwrap().push(n))
            })
            .collect();
        futures::future::join_all(runs).await;
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: getpriority on the calling thread's own id.
            let (mine, background) = unsafe {
                let mine = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
                let background =
                    run(|| libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t))
                        .await;
                (mine, background)
            };
            assert_eq!(background, (mine + NICE).min(19));
        }
    }

    #[tokio::test]
    async fn a_panicking_job_panics_its_caller_and_the_thread_goes_on() {
        let caught = tokio::spawn(run(|| -> u32 { panic!("job failed") })).await;
        assert!(caught.unwrap_err().is_panic());
        assert_eq!(run(|| 7).await, 7);
        let failed = run_io(|| -> std::io::Result<u32> { panic!("install failed") }).await;
        assert!(
            failed
                .unwrap_err()
                .to_string()
                .contains("panicked: install failed")
        );
        assert_eq!(run_io(|| Ok(8)).await.unwrap(), 8);
    }

    /// The calling thread's scheduling policy.
    #[cfg(target_os = "linux")]
    fn policy() -> i32 {
        // SAFETY: sched_getscheduler on the calling thread's own id.
        unsafe { libc::sched_getscheduler(libc::gettid()) }
    }

    #[tokio::test]
    async fn catchup_reads_run_in_order_on_an_idle_priority_thread() {
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let runs: Vec<_> = (0..5)
            .map(|n| {
                let order = order.clone();
                run_catchup_io(move || {
                    order.lock().unwrap().push(n);
                    Ok(std::thread::current().name().map(str::to_owned))
                })
            })
            .collect();
        for name in futures::future::join_all(runs).await {
            assert_eq!(name.unwrap().as_deref(), Some("oncekv-snapshot-out"));
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
        #[cfg(target_os = "linux")]
        {
            assert_eq!(
                run_catchup_io(|| Ok(policy())).await.unwrap(),
                libc::SCHED_IDLE
            );
            assert_eq!(run(policy).await, libc::SCHED_OTHER);
            assert_eq!(policy(), libc::SCHED_OTHER);
        }
        let failed = run_catchup_io(|| -> std::io::Result<u32> { panic!("read failed") }).await;
        assert!(
            failed
                .unwrap_err()
                .to_string()
                .contains("panicked: read failed")
        );
        assert_eq!(run_catchup_io(|| Ok(9)).await.unwrap(), 9);
    }

    #[tokio::test]
    async fn a_spawned_job_runs_on_its_own_idle_priority_thread() {
        let name = spawn("oncekv-test-job", || {
            std::thread::current().name().map(str::to_owned)
        })
        .unwrap();
        assert_eq!(
            name.join().await.unwrap().as_deref(),
            Some("oncekv-test-job")
        );
        #[cfg(target_os = "linux")]
        {
            // At the caller's priority until the job lowers it: what it
            // starts first (a store's workers) keeps the caller's.
            let spawned = spawn("oncekv-test-job", || {
                let before = policy();
                idle_from_now();
                let started_after = std::thread::spawn(policy).join().unwrap();
                (before, policy(), started_after)
            })
            .unwrap();
            assert_eq!(
                spawned.join().await.unwrap(),
                (libc::SCHED_OTHER, libc::SCHED_IDLE, libc::SCHED_IDLE)
            );
            assert_eq!(policy(), libc::SCHED_OTHER);
        }
        let failed = spawn("oncekv-test-job", || -> u32 { panic!("receive failed") }).unwrap();
        let error = failed.join().await.unwrap_err();
        assert!(
            error.to_string().contains("panicked: receive failed"),
            "{error}"
        );
    }
}
