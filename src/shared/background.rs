//! One thread, at a lower CPU priority than the rest of the node, for the
//! work no request waits on: building a snapshot (encoding the state,
//! flushing key records into the record store), reading a snapshot a
//! chunk at a time to send it to a node that is behind, and checking and
//! installing a snapshot received from the leader (the node receiving one
//! is behind: no request waits on it). A second one, at the same priority,
//! hashes the state (`Status`, `oncekv admin hash`), so that a hash never
//! waits behind an install or a build.
//! On a busy machine the scheduler then gives the request path — Raft,
//! apply, the RPCs — the CPU first, and such work the time left over (at
//! nice 10 it still gets about a tenth of a contended core, so it ends).
//!
//! A job that waits on input as it runs — a snapshot received and written
//! into the record store as its chunks arrive — gets a thread of its own at
//! the same priority ([`spawn`]), so that it holds neither lane while it
//! waits.
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

/// Which of the two background threads runs a job.
#[derive(Clone, Copy, Debug)]
enum Lane {
    /// Builds, snapshot reads, checks and installs, one at a time in the
    /// order given.
    Long,
    /// State hashes: an operator's `oncekv admin hash` or a `Status`
    /// must not wait behind an install or a build, which at tens of
    /// millions of records last tens of seconds.
    Hash,
}

/// The queue to `lane`'s thread, started on first use.
fn queue(lane: Lane) -> &'static Mutex<mpsc::Sender<Job>> {
    static LONG: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    static HASH: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let (cell, name) = match lane {
        Lane::Long => (&LONG, "oncekv-background"),
        Lane::Hash => (&HASH, "oncekv-hasher"),
    };
    cell.get_or_init(|| {
        let (sender, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                lower_this_threads_priority();
                for job in jobs {
                    job();
                }
            })
            .expect("spawning a background thread");
        Mutex::new(sender)
    })
}

/// Lowers the calling thread's CPU priority by [`NICE`] (on Linux a
/// thread's nice value is its own); a failure leaves it as it was.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on this thread's own id, no memory passed.
    unsafe {
        let thread = libc::gettid();
        let now = libc::getpriority(libc::PRIO_PROCESS, thread as libc::id_t);
        if libc::setpriority(libc::PRIO_PROCESS, thread as libc::id_t, now + NICE) != 0 {
            tracing::debug!("could not lower the background thread's priority");
        }
    }
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
    match run_caught(Lane::Long, job).await {
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

/// Starts `job` on a new thread named `name`, at the background threads'
/// lower priority: for a job that waits on input as it runs, which would
/// hold a lane (and every job queued behind it) while it waits. The
/// thread ends with the job; nothing waits for it unless
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
            lower_this_threads_priority();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let _ = reply.send(result);
        })?;
    Ok(Spawned { outcome })
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

    #[tokio::test]
    async fn a_spawned_job_runs_on_its_own_lower_priority_thread() {
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
            let priority = || {
                // SAFETY: getpriority on the calling thread's own id.
                unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
            };
            let mine = priority();
            let spawned = spawn("oncekv-test-job", priority).unwrap();
            assert_eq!(spawned.join().await.unwrap(), (mine + NICE).min(19));
        }
        let failed = spawn("oncekv-test-job", || -> u32 { panic!("receive failed") }).unwrap();
        let error = failed.join().await.unwrap_err();
        assert!(
            error.to_string().contains("panicked: receive failed"),
            "{error}"
        );
    }
}
