//! The one place that fsyncs the sled database. Every durability wait in the node goes through a
//! single dedicated thread that group-commits: it drains all pending requests, calls
//! `Db::flush` once, then completes every waiter. It only flushes; it must not write data, and it
//! exists so that concurrent `flush_async` calls (which can deadlock sled 0.34) never happen and
//! the tokio runtime is never blocked by an fsync.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

/// Why a flush did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FlushError {
    #[error("sled flush failed: {0}")]
    Sled(#[from] sled::Error),
    #[error("the flusher thread has stopped")]
    Stopped,
}

type Waiter = Box<dyn FnOnce(Result<(), FlushError>) + Send>;

/// Handle to the dedicated flusher thread. Cheap to clone; the thread stops (and is joined) when
/// the last handle is dropped, releasing its reference to the database.
#[derive(Clone)]
pub struct Flusher {
    // Field order matters: `tx` is dropped before `_joiner`, so when the last handle goes away the
    // channel is already closed by the time `Joiner::drop` waits for the thread.
    tx: mpsc::Sender<Waiter>,
    _joiner: Arc<Joiner>,
}

struct Joiner(Option<thread::JoinHandle<()>>);

impl Flusher {
    /// Starts the flusher thread for `db`.
    pub fn spawn(db: sled::Db) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Waiter>();
        let thread = thread::Builder::new()
            .name("sled-flusher".into())
            .spawn(move || run(&db, &rx))?;
        Ok(Self {
            tx,
            _joiner: Arc::new(Joiner(Some(thread))),
        })
    }

    /// Calls `done` once every write made before this call is on disk (or the flush failed).
    /// `done` runs on the flusher thread and must not block.
    pub fn flush_then(&self, done: impl FnOnce(Result<(), FlushError>) + Send + 'static) {
        if let Err(mpsc::SendError(waiter)) = self.tx.send(Box::new(done)) {
            waiter(Err(FlushError::Stopped));
        }
    }

    /// Waits until every write made before this call is on disk.
    pub async fn flush(&self) -> Result<(), FlushError> {
        let (tx, rx) = oneshot::channel();
        self.flush_then(move |res| {
            // The waiting future may have been dropped; nothing is left to tell then.
            let _ = tx.send(res);
        });
        rx.await.map_err(|_| FlushError::Stopped)?
    }
}

fn run(db: &sled::Db, rx: &mpsc::Receiver<Waiter>) {
    while let Ok(first) = rx.recv() {
        let mut waiters = vec![first];
        waiters.extend(rx.try_iter());
        let res = db.flush().map_err(FlushError::from);
        match &res {
            Ok(bytes) => tracing::trace!(waiters = waiters.len(), bytes, "group flush"),
            Err(error) => tracing::error!(waiters = waiters.len(), %error, "group flush failed"),
        }
        let res = res.map(drop);
        for waiter in waiters {
            waiter(res.clone());
        }
    }
}

impl Drop for Joiner {
    /// Runs after every sender is gone, so the thread finishes its current group and exits; this
    /// waits at most for that one in-flight flush.
    fn drop(&mut self) {
        if let Some(thread) = self.0.take()
            && thread.join().is_err()
        {
            tracing::error!("sled flusher thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn concurrent_flushes_all_complete() -> Result<(), FlushError> {
        let db = sled::Config::new().temporary(true).open()?;
        let flusher = Flusher::spawn(db.clone()).map_err(|_| FlushError::Stopped)?;
        let waits = (0..64u32).map(|i| {
            let flusher = flusher.clone();
            let db = db.clone();
            tokio::spawn(async move {
                db.insert(i.to_be_bytes(), &[1])?;
                flusher.flush().await
            })
        });
        for wait in futures::future::join_all(waits).await {
            wait.map_err(|_| FlushError::Stopped)??;
        }
        Ok(())
    }
}
