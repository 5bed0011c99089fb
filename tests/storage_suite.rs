//! The storage adapter against openraft's own conformance suite (with the
//! sled log store and with the segment log store), plus reopen tests: log
//! entries, vote, committed id and purge come back from either log store's
//! files in the same shape, and the state machine comes back from its
//! snapshot file with the same state hash (rule 13).
//!
//! A reopen in the same process reads what the page cache holds, so these
//! tests cannot tell a missing fsync. Durability of the node's log (rule
//! 14) is shown by the segment log's simulated power loss, which drops
//! every write no fdatasync covered (`src/storage/segment_log/tests.rs`,
//! `acknowledged_writes_survive_a_power_loss`).
#![allow(
    clippy::result_large_err,
    reason = "openraft's StorageError is fixed by its traits"
)]

use oncekv::raft_types::{StorageError, TypeConfig, Vote};
use oncekv::storage::{SegmentLogStore, SledLogStore, StateMachineStore};
use oncekv_core::{ClusterId, Entry, Nonce, Op, RegistryConfig, RulesVersion, snapshot};
use openraft::storage::{EntryResponder, RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftLogReader, RaftSnapshotBuilder};
use std::time::Duration;
use tempfile::TempDir;

type LogStore = SledLogStore<TypeConfig>;
type Payload = openraft::type_config::alias::PayloadOf<TypeConfig>;

fn io_error(e: impl std::error::Error) -> StorageError {
    StorageError::from_io_error(
        ErrorSubject::Store,
        ErrorVerb::Write,
        std::io::Error::other(e.to_string()),
    )
}

fn open_store(dir: &TempDir) -> Result<LogStore, StorageError> {
    let db = sled::open(dir.path().join("sled")).map_err(io_error)?;
    LogStore::open(db).map_err(io_error)
}

/// Reopens after a simulated restart. sled's threads can hold the file lock
/// for a moment after the last handle drops, so an in-process reopen retries
/// that one error (a real restart is a new process).
async fn reopen_store(dir: &TempDir) -> Result<LogStore, StorageError> {
    for _ in 0..100 {
        match sled::open(dir.path().join("sled")) {
            Ok(db) => return LogStore::open(db).map_err(io_error),
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(io_error(e)),
        }
    }
    open_store(dir)
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().map_err(io_error)?;
        let store = open_store(&dir)?;
        let state_machine =
            StateMachineStore::open(&dir.path().join("snapshots")).map_err(io_error)?;
        Ok((dir, store, state_machine))
    }
}

/// openraft's conformance suite for log store and state machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(Builder).await
}

type SegmentStore = SegmentLogStore<TypeConfig>;

fn open_segment_store(dir: &TempDir) -> Result<SegmentStore, StorageError> {
    SegmentStore::open(dir.path().join("log")).map_err(io_error)
}

struct SegmentBuilder;

impl StoreBuilder<TypeConfig, SegmentStore, StateMachineStore, TempDir> for SegmentBuilder {
    async fn build(&self) -> Result<(TempDir, SegmentStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().map_err(io_error)?;
        let store = open_segment_store(&dir)?;
        let state_machine =
            StateMachineStore::open(&dir.path().join("snapshots")).map_err(io_error)?;
        Ok((dir, store, state_machine))
    }
}

/// openraft's conformance suite for the segment log store (and the state
/// machine beside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_segment_log() -> Result<(), StorageError> {
    Suite::test_all(SegmentBuilder).await
}

fn registry_entry(op: Op) -> Payload {
    EntryPayload::Normal(Entry::single(5, op))
}

/// `ops` as log entries 1, 2, … of term 1 (leader 1), one request each, in
/// the stream the state machine's `apply` takes.
fn entry_stream(
    ops: Vec<Op>,
) -> impl futures::Stream<Item = Result<EntryResponder<TypeConfig>, std::io::Error>> + Unpin {
    futures::stream::iter(ops.into_iter().zip(1..).map(|(op, index)| {
        let entry = oncekv::raft_types::Entry {
            log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
            payload: registry_entry(op),
        };
        Ok((entry, None))
    }))
}

/// Appended entries, the vote, the committed id and a purge read back the
/// same from the sled log store's files after a clean close and reopen (a
/// round trip of its key layout; not a durability test, see the module
/// doc).
#[tokio::test]
async fn sled_log_reads_back_after_reopen() -> Result<(), StorageError> {
    let dir = tempfile::tempdir().map_err(io_error)?;
    let store = open_store(&dir)?;
    write_then_check_after_reopen(store, || reopen_store(&dir)).await
}

/// The same with the segment log store, through its public API.
#[tokio::test]
async fn segment_log_reads_back_after_reopen() -> Result<(), StorageError> {
    let dir = tempfile::tempdir().map_err(io_error)?;
    let store = open_segment_store(&dir)?;
    write_then_check_after_reopen(store, || async { open_segment_store(&dir) }).await
}

/// Appends entries, saves a vote and a committed id and purges the first
/// entry through `store`, drops it, then checks what `reopen` gives back.
async fn write_then_check_after_reopen<S, F>(
    mut store: S,
    reopen: impl FnOnce() -> F,
) -> Result<(), StorageError>
where
    S: RaftLogStorage<TypeConfig> + RaftLogReader<TypeConfig>,
    F: Future<Output = Result<S, StorageError>>,
{
    let log_id = |term, index| openraft::testing::log_id::<TypeConfig>(term, 1, index);
    let entry = |term, index, payload| oncekv::raft_types::Entry {
        log_id: log_id(term, index),
        payload,
    };
    let vote = Vote::new_committed(2, 1);
    let committed = Some(log_id(2, 3));
    let register = registry_entry(Op::Register {
        cluster_id: None,
        nonce: Nonce(9),
        principal: oncekv_core::Principal::anonymous(),
    });
    store
        .blocking_append([
            entry(1, 1, EntryPayload::Blank),
            entry(1, 2, register.clone()),
            entry(2, 3, EntryPayload::Blank),
        ])
        .await?;
    store.save_vote(&vote).await.map_err(io_error)?;
    store.save_committed(committed).await.map_err(io_error)?;
    store.purge(log_id(1, 1)).await.map_err(io_error)?;
    drop(store);
    let mut store = reopen().await?;
    let state = store.get_log_state().await.map_err(io_error)?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1)));
    assert_eq!(state.last_log_id, Some(log_id(2, 3)));
    assert_eq!(store.read_vote().await.map_err(io_error)?, Some(vote));
    assert_eq!(store.read_committed().await.map_err(io_error)?, committed);
    let entries = store
        .get_log_reader()
        .await
        .try_get_log_entries(..)
        .await
        .map_err(io_error)?;
    let ids: Vec<_> = entries.iter().map(|e| e.log_id).collect();
    assert_eq!(ids, vec![log_id(1, 2), log_id(2, 3)]);
    assert_eq!(entries[0].payload, register);
    Ok(())
}

/// A built snapshot is durable: a state machine reopened from the same
/// directory restores the registry at the snapshot's index with the same
/// state hash, and still knows the session registered before it.
#[tokio::test]
async fn state_machine_restores_from_its_snapshot() -> Result<(), StorageError> {
    let dir = tempfile::tempdir().map_err(io_error)?;
    let snapshots = dir.path().join("snapshots");
    let log_id = |index| openraft::testing::log_id::<TypeConfig>(1, 1, index);
    let cluster_id = ClusterId(77);
    let hash_before;
    {
        let mut state_machine = StateMachineStore::open(&snapshots).map_err(io_error)?;
        state_machine
            .apply(entry_stream(vec![
                Op::Bootstrap {
                    cluster_id,
                    config: RegistryConfig::default(),
                },
                Op::Register {
                    cluster_id: Some(cluster_id),
                    nonce: Nonce(3),
                    principal: oncekv_core::Principal::anonymous(),
                },
            ]))
            .await
            .map_err(io_error)?;
        assert_eq!(state_machine.state().read().registry.applied_index(), 2);
        let built = state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .map_err(io_error)?;
        assert_eq!(built.meta.last_log_id, Some(log_id(2)));
        hash_before = snapshot::state_hash(&state_machine.state().read().registry);
    }
    let mut reopened = StateMachineStore::open(&snapshots).map_err(io_error)?;
    let (applied, _) = reopened.applied_state().await.map_err(io_error)?;
    assert_eq!(applied, Some(log_id(2)));
    {
        let state = reopened.state();
        let registry = &state.read().registry;
        assert_eq!(snapshot::state_hash(registry), hash_before);
        assert_eq!(registry.cluster_id(), Some(cluster_id));
        assert_eq!(registry.session_count(), 1);
    }
    let current = reopened
        .get_current_snapshot()
        .await
        .map_err(io_error)?
        .expect("current snapshot");
    assert_eq!(current.meta.last_log_id, Some(log_id(2)));
    Ok(())
}

/// An entry naming a rules version this build does not know (only a newer
/// leader could have proposed it) is not applied at all — not even
/// refused, which would be a decision the nodes that know the version make
/// otherwise: the state machine stops with an error naming the version, and
/// its applied index stays before the entry.
#[tokio::test]
async fn an_entry_of_an_unknown_rules_version_stops_apply() -> Result<(), StorageError> {
    let dir = tempfile::tempdir().map_err(io_error)?;
    let mut state_machine =
        StateMachineStore::open(&dir.path().join("snapshots")).map_err(io_error)?;
    let cluster_id = ClusterId(78);
    let error = state_machine
        .apply(entry_stream(vec![
            Op::BootstrapWithRules {
                cluster_id,
                config: RegistryConfig::default(),
                rules: RulesVersion::LATEST,
            },
            Op::RaiseRules {
                cluster_id,
                rules: RulesVersion(RulesVersion::HIGHEST_KNOWN.0 + 1),
            },
        ]))
        .await
        .expect_err("an unknown rules version is not applied");
    let unknown = format!("rules version {}", RulesVersion::HIGHEST_KNOWN.0 + 1);
    assert!(
        error.to_string().contains(&unknown) && error.to_string().contains("upgrade"),
        "{error}"
    );
    let state = state_machine.state();
    let registry = &state.read().registry;
    assert_eq!(registry.applied_index(), 1);
    assert_eq!(registry.rules(), RulesVersion::LATEST);
    Ok(())
}
