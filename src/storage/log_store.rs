//! Sled-backed Raft log storage (openraft 0.10 `RaftLogStorage`) — the node's log store before the
//! segment log, kept as the baseline of `benches/log_store.rs` (see `storage`'s doc; note that
//! sled 0.34's flush is `sync_file_range` on Linux, not a full fsync). Owns the log entries, the vote, the
//! committed log id and the last purged log id. It only translates openraft's log calls into
//! durable sled writes and reads; it decides nothing about consensus and must never report data as
//! persisted before the single [`Flusher`] has fsynced it.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::Bound;
use std::ops::RangeBounds;

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
use sled::Transactional;
use sled::transaction::ConflictableTransactionError;
use sled::transaction::TransactionError;

use super::flusher::FlushError;
use super::flusher::Flusher;
use super::half_open;
use oncekv_core::codec;
use oncekv_core::codec::CodecError;

/// Tree holding log entries keyed by big-endian `u64` index.
const LOG_TREE: &str = "raft_log";
/// Tree holding the log's metadata under the keys below.
const META_TREE: &str = "raft_log_meta";
const VOTE_KEY: &[u8] = b"vote";
const COMMITTED_KEY: &[u8] = b"committed";
const LAST_PURGED_KEY: &[u8] = b"last_purged";

/// Version byte of every value this store writes.
const FORMAT_VERSION: u8 = 1;

/// Failures of the log store, before they are wrapped into openraft's [`StorageError`].
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Flush(#[from] FlushError),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    #[error("could not start the flusher thread: {0}")]
    SpawnFlusher(#[source] std::io::Error),
    #[error("log key of {len} bytes is not a big-endian u64 index")]
    BadKey { len: usize },
    #[error("entry stored under index {key} carries log index {index}")]
    IndexMismatch { key: u64, index: u64 },
}

impl From<TransactionError<std::convert::Infallible>> for LogStoreError {
    fn from(e: TransactionError<std::convert::Infallible>) -> Self {
        match e {
            TransactionError::Storage(e) => Self::Sled(e),
            TransactionError::Abort(never) => match never {},
        }
    }
}

/// openraft 0.10's storage calls fail with `io::Error`.
fn storage_error(error: impl Into<LogStoreError>) -> std::io::Error {
    std::io::Error::other(error.into())
}

/// Reads log entries; cheap to clone and safe to use concurrently with the store.
pub struct SledLogReader<C> {
    log: sled::Tree,
    meta: sled::Tree,
    _config: PhantomData<C>,
}

impl<C> Clone for SledLogReader<C> {
    fn clone(&self) -> Self {
        Self {
            log: self.log.clone(),
            meta: self.meta.clone(),
            _config: PhantomData,
        }
    }
}

/// The Raft log store. All writes go through `&mut self`, so they are applied in call order.
pub struct SledLogStore<C> {
    reader: SledLogReader<C>,
    flusher: Flusher,
    /// Index covered by the newest durable snapshot, when attached: a purge
    /// waits until the snapshot behind it is on disk (openraft may purge
    /// while an installed snapshot is still being written).
    durable_snapshot: Option<tokio::sync::watch::Receiver<u64>>,
    /// Where the committed index is reported, when attached (a metric).
    commit_index: Option<prometheus_client::metrics::gauge::Gauge>,
}

impl<C> SledLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned,
{
    /// Opens (or creates) the log trees in `db` and starts the flusher for it.
    pub fn open(db: sled::Db) -> Result<Self, LogStoreError> {
        let log = db.open_tree(LOG_TREE)?;
        let meta = db.open_tree(META_TREE)?;
        let flusher = Flusher::spawn(db).map_err(LogStoreError::SpawnFlusher)?;
        Ok(Self {
            durable_snapshot: None,
            commit_index: None,
            reader: SledLogReader {
                log,
                meta,
                _config: PhantomData,
            },
            flusher,
        })
    }

    /// The flusher of this store's database, for other components writing to the same `Db`
    /// (all fsyncs of one database must go through one flusher).
    pub fn flusher(&self) -> Flusher {
        self.flusher.clone()
    }

    fn log(&self) -> &sled::Tree {
        &self.reader.log
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, LogStoreError> {
        read_meta(&self.reader.meta, key)
    }

    fn write_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<(), LogStoreError> {
        self.reader
            .meta
            .insert(key, codec::encode_versioned(FORMAT_VERSION, value))?;
        Ok(())
    }

    /// A batch removing every log key in `range`.
    fn removals_in(&self, range: impl RangeBounds<[u8; 8]>) -> Result<sled::Batch, LogStoreError> {
        let mut batch = sled::Batch::default();
        for key in self.log().range(range).keys() {
            batch.remove(key?);
        }
        Ok(batch)
    }

    async fn persist_vote(&self, vote: &VoteOf<C>) -> Result<(), LogStoreError> {
        self.write_meta(VOTE_KEY, vote)?;
        self.flusher.flush().await?;
        Ok(())
    }

    /// Deletes entries with index `>= index`, durably.
    async fn truncate_from(&self, index: u64) -> Result<(), LogStoreError> {
        let removals = self.removals_in(index.to_be_bytes()..)?;
        self.log().apply_batch(removals)?;
        self.flusher.flush().await?;
        Ok(())
    }

    /// Deletes entries up to `log_id` and records it as last purged, atomically and durably, so
    /// the log state never shows a purged id beyond the entries still present.
    /// Makes purges wait until a snapshot covering the purged entries is
    /// durable (rule 14).
    pub fn purge_after_durable_snapshots(&mut self, durable: tokio::sync::watch::Receiver<u64>) {
        self.durable_snapshot = Some(durable);
    }

    /// Reports every committed index openraft saves into `gauge`.
    pub fn report_commit_index(&mut self, gauge: prometheus_client::metrics::gauge::Gauge) {
        self.commit_index = Some(gauge);
    }

    /// The last purged log index, as stored.
    pub fn last_purged_index(&self) -> Result<Option<u64>, LogStoreError> {
        Ok(self
            .read_meta::<LogIdOf<C>>(LAST_PURGED_KEY)?
            .map(|log_id| log_id.index))
    }

    async fn purge_upto(&self, log_id: &LogIdOf<C>) -> Result<(), LogStoreError> {
        if let Some(durable) = &self.durable_snapshot {
            let mut durable = durable.clone();
            // An error means the state machine is gone: nothing to wait for.
            let _ = durable.wait_for(|index| *index >= log_id.index).await;
        }
        let removals = self.removals_in(..=log_id.index.to_be_bytes())?;
        let purged = codec::encode_versioned(FORMAT_VERSION, log_id);
        (self.log(), &self.reader.meta).transaction(|(log, meta)| {
            log.apply_batch(&removals)?;
            meta.insert(LAST_PURGED_KEY, purged.as_slice())?;
            Ok::<_, ConflictableTransactionError<std::convert::Infallible>>(())
        })?;
        self.flusher.flush().await?;
        Ok(())
    }
}

fn read_meta<T: DeserializeOwned>(
    meta: &sled::Tree,
    key: &[u8],
) -> Result<Option<T>, LogStoreError> {
    meta.get(key)?
        .map(|bytes| codec::decode_versioned(FORMAT_VERSION, &bytes))
        .transpose()
        .map_err(LogStoreError::from)
}

fn decode_index(key: &[u8]) -> Result<u64, LogStoreError> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| LogStoreError::BadKey { len: key.len() })?;
    Ok(u64::from_be_bytes(bytes))
}

fn decode_entry<C>(key: &[u8], value: &[u8]) -> Result<C::Entry, LogStoreError>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    let key = decode_index(key)?;
    let entry: C::Entry = codec::decode_versioned(FORMAT_VERSION, value)?;
    let index = entry.index();
    if index != key {
        return Err(LogStoreError::IndexMismatch { key, index });
    }
    Ok(entry)
}

impl<C> SledLogReader<C>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    fn entries(&self, range: &impl RangeBounds<u64>) -> Result<Vec<C::Entry>, LogStoreError> {
        let Some((start, end)) = half_open(range) else {
            return Ok(Vec::new());
        };
        let start = Bound::Included(start.to_be_bytes());
        let end = end.map_or(Bound::Unbounded, |e| Bound::Excluded(e.to_be_bytes()));
        self.log
            .range((start, end))
            .map(|kv| {
                let (key, value) = kv?;
                decode_entry::<C>(&key, &value)
            })
            .collect()
    }

    fn last_entry(&self) -> Result<Option<C::Entry>, LogStoreError> {
        self.log
            .last()?
            .map(|(key, value)| decode_entry::<C>(&key, &value))
            .transpose()
    }
}

impl<C> RaftLogReader<C> for SledLogReader<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, std::io::Error> {
        self.entries(&range).map_err(storage_error)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, std::io::Error> {
        read_meta(&self.meta, VOTE_KEY).map_err(storage_error)
    }
}

impl<C> RaftLogReader<C> for SledLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, std::io::Error> {
        self.reader.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, std::io::Error> {
        self.reader.read_vote().await
    }
}

impl<C> RaftLogStorage<C> for SledLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned,
{
    type LogReader = SledLogReader<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, std::io::Error> {
        let last_purged_log_id: Option<LogIdOf<C>> =
            self.read_meta(LAST_PURGED_KEY).map_err(storage_error)?;
        let last_entry = self.reader.last_entry().map_err(storage_error)?;
        let last_log_id = last_entry
            .map(|entry| entry.log_id())
            .or_else(|| last_purged_log_id.clone());
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), std::io::Error> {
        self.persist_vote(vote).await.map_err(storage_error)?;
        tracing::debug!(%vote, "vote persisted");
        Ok(())
    }

    /// Not fsynced on its own: a committed id that reverts after a crash is safe, and the next
    /// flush (sled flushes are ordered) persists it.
    async fn save_committed(
        &mut self,
        committed: Option<LogIdOf<C>>,
    ) -> Result<(), std::io::Error> {
        if let (Some(gauge), Some(committed)) = (&self.commit_index, &committed) {
            gauge.set(i64::try_from(committed.index).unwrap_or(i64::MAX));
        }
        self.write_meta(COMMITTED_KEY, &committed)
            .map_err(storage_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, std::io::Error> {
        let committed: Option<Option<LogIdOf<C>>> =
            self.read_meta(COMMITTED_KEY).map_err(storage_error)?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), std::io::Error>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        let mut count = 0usize;
        let mut last = None;
        for entry in entries {
            let index = entry.index();
            let value = codec::encode_versioned(FORMAT_VERSION, &entry);
            batch.insert(&index.to_be_bytes(), value);
            count += 1;
            last = Some(index);
        }
        self.log().apply_batch(batch).map_err(storage_error)?;
        tracing::trace!(count, last_index = ?last, "log entries appended; awaiting flush");
        self.flusher.flush_then(move |res| {
            callback.io_completed(res.map_err(std::io::Error::other));
        });
        Ok(())
    }

    async fn truncate_after(
        &mut self,
        last_log_id: Option<LogIdOf<C>>,
    ) -> Result<(), std::io::Error> {
        let from = last_log_id
            .as_ref()
            .map_or(0, |last| last.index.saturating_add(1));
        self.truncate_from(from).await.map_err(storage_error)?;
        tracing::debug!(?last_log_id, "log truncated after");
        Ok(())
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), std::io::Error> {
        self.purge_upto(&log_id).await.map_err(storage_error)?;
        tracing::debug!(%log_id, "log purged up to");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    openraft::declare_raft_types!(TestConfig: D = u64, R = ());

    #[tokio::test]
    async fn corrupt_values_become_storage_errors() -> Result<(), LogStoreError> {
        let db = sled::Config::new().temporary(true).open()?;
        let mut store = SledLogStore::<TestConfig>::open(db.clone())?;
        let log = db.open_tree(LOG_TREE)?;
        let meta = db.open_tree(META_TREE)?;

        log.insert(1u64.to_be_bytes(), &[FORMAT_VERSION, 0xFF, 0xFF])?;
        assert!(store.try_get_log_entries(..).await.is_err());
        assert!(store.get_log_state().await.is_err());

        log.clear()?;
        log.insert(b"short", codec::encode_versioned(FORMAT_VERSION, &0u8))?;
        assert!(store.get_log_state().await.is_err());

        meta.insert(VOTE_KEY, &[7u8, 0])?;
        assert!(store.read_vote().await.is_err());
        Ok(())
    }

    /// With a durable-snapshot watch attached, a purge waits until a
    /// snapshot covering the purged entries is on disk.
    #[tokio::test]
    async fn purge_waits_for_a_durable_snapshot() -> Result<(), LogStoreError> {
        let db = sled::Config::new().temporary(true).open()?;
        let mut store = SledLogStore::<TestConfig>::open(db)?;
        let (durable, watch) = tokio::sync::watch::channel(0u64);
        store.purge_after_durable_snapshots(watch);
        let log_id = openraft::testing::log_id::<TestConfig>(1, 1, 5);
        let purge = store.purge_upto(&log_id);
        tokio::pin!(purge);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut purge)
                .await
                .is_err(),
            "no snapshot covers index 5 yet"
        );
        durable.send_replace(5);
        purge.await?;
        assert_eq!(store.last_purged_index()?, Some(5));
        Ok(())
    }

    #[test]
    fn half_open_ranges() {
        assert_eq!(half_open(&(..)), Some((0, None)));
        assert_eq!(half_open(&(3..7)), Some((3, Some(7))));
        assert_eq!(half_open(&(3..=7)), Some((3, Some(8))));
        assert_eq!(half_open(&(5..5)), None);
        assert_eq!(half_open(&(..=u64::MAX)), Some((0, None)));
        assert_eq!(
            half_open(&(Bound::Excluded(u64::MAX), Bound::Unbounded)),
            None
        );
    }
}
