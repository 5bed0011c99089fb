//! The applied state both adapters share: the registry as applied on this
//! node (with the Raft log id and membership it was applied at), its cluster
//! id once bootstrapped, and the newest state hash (computed on demand for
//! an operator, in the background at most once a second for everyone
//! else). The storage adapter's
//! state machine is its only writer (`write`, `publish_cluster_id`, both
//! crate-private); the network adapter, the cluster clock and the node's
//! observability only read it. It holds no logic of either adapter and must
//! not depend on `network` or `storage`.

use super::records::OutsideRecords;
use crate::raft_types::{LogId, StoredMembership};
use oncekv_core::{ClusterId, Registry};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};
use std::time::Duration;

/// The applied state, shared between the state machine, snapshot builders
/// and the node's read paths.
#[derive(Debug, Default)]
pub struct AppliedState {
    pub registry: Registry,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

/// Shared handle on the applied state; readers take the lock briefly.
#[derive(Clone, Debug, Default)]
pub struct SharedState {
    state: Arc<RwLock<AppliedState>>,
    /// The newest state hash (`Status`, `Admin.StateHash`, metrics
    /// scrapes): see [`SharedState::latest_hash`] and
    /// [`SharedState::hash_now`].
    hashes: Arc<Hashes>,
    /// The cluster id once the bootstrap entry (or a snapshot holding it) is
    /// applied. It never changes after that, so the client paths check it
    /// without taking the state lock, which apply holds for whole batches.
    cluster_id: Arc<OnceLock<ClusterId>>,
    /// The key records outside the registry (its store and the layers on
    /// their way there); `None` for a state that keeps them all in memory
    /// (tests of the adapters).
    records: Option<Arc<OutsideRecords>>,
}

impl SharedState {
    /// A state whose key records go to `records` at snapshot builds.
    pub(crate) fn with_records(records: Arc<OutsideRecords>) -> SharedState {
        SharedState {
            records: Some(records),
            ..SharedState::default()
        }
    }

    /// The key records outside the registry, if they go anywhere.
    pub fn records(&self) -> Option<&Arc<OutsideRecords>> {
        self.records.as_ref()
    }

    /// The live record of `key` of `principal` in `registry` (this state's,
    /// read under its lock), from wherever it lies.
    pub fn key_view(
        &self,
        registry: &oncekv_core::Registry,
        principal: &oncekv_core::Principal,
        key: &oncekv_core::IdempotencyKey,
    ) -> std::io::Result<Option<oncekv_core::KeyView>> {
        match &self.records {
            Some(records) if registry.has_key_records_outside() => {
                records.key_view(registry, &(principal.clone(), key.clone()))
            }
            _ => Ok(registry.key(principal, key)),
        }
    }

    /// One page of live key records of `registry` (this state's, read
    /// under its lock) after (`principal`, `key`), from wherever they lie.
    pub fn keys_page(
        &self,
        registry: &oncekv_core::Registry,
        principal: &oncekv_core::Principal,
        key: &oncekv_core::IdempotencyKey,
        limit: usize,
    ) -> std::io::Result<(Vec<oncekv_core::KeyView>, bool)> {
        match &self.records {
            Some(records) if registry.has_key_records_outside() => {
                records.page(registry, &(principal.clone(), key.clone()), limit)
            }
            _ => Ok(registry.keys_after(principal, key, limit)),
        }
    }

    /// The live claim record of `key` of `principal` in `registry` (this
    /// state's, read under its lock), from wherever it lies (a finished
    /// one in the record store from rules version 3).
    pub fn claim_view(
        &self,
        registry: &oncekv_core::Registry,
        principal: &oncekv_core::Principal,
        key: &oncekv_core::IdempotencyKey,
    ) -> std::io::Result<Option<oncekv_core::ClaimView>> {
        match &self.records {
            Some(records) if registry.has_claim_records_outside() => {
                records.claim_view(registry, &(principal.clone(), key.clone()))
            }
            _ => Ok(registry.claim_record(principal, key)),
        }
    }

    /// One page of live claim records of `registry` (this state's, read
    /// under its lock) after (`principal`, `key`), from wherever they lie.
    pub fn claims_page(
        &self,
        registry: &oncekv_core::Registry,
        principal: &oncekv_core::Principal,
        key: &oncekv_core::IdempotencyKey,
        limit: usize,
    ) -> std::io::Result<(Vec<oncekv_core::ClaimView>, bool)> {
        match &self.records {
            Some(records) if registry.has_claim_records_outside() => {
                records.claims_page(registry, &(principal.clone(), key.clone()), limit)
            }
            _ => Ok(registry.claims_after(principal, key, limit)),
        }
    }

    /// The applied cluster id, read without the state lock.
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.cluster_id.get().copied()
    }

    /// Publishes the cluster id of `applied`, once it has one. Only the
    /// state machine, which writes the state, calls it.
    pub(crate) fn publish_cluster_id(&self, applied: &AppliedState) {
        if self.cluster_id.get().is_none()
            && let Some(cluster_id) = applied.registry.cluster_id()
        {
            // Set once; the registry's id never changes after bootstrap.
            let _ = self.cluster_id.set(cluster_id);
        }
    }

    pub fn read(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The state for writing: the state machine's alone (apply, snapshot
    /// restore and install).
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, AppliedState> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of the applied registry: O(1) (its maps are persistent), so
    /// the lock is held only for the copy and readers can encode or hash
    /// it at leisure while apply goes on.
    pub fn registry(&self) -> Registry {
        self.read().registry.clone()
    }

    /// The newest state hash computed on this node, with the applied index
    /// it was computed at (`None` before the first), without waiting and
    /// without hashing: what the open `Status` RPC and metrics scrapes
    /// report. Asking also wakes the background hasher, which hashes the
    /// state then applied if the newest hash is of an older index — at most
    /// once per [`HASH_INTERVAL`], however often it is asked. So a loop of
    /// `Status` calls under write load costs one hash a second, not one a
    /// call, and a caller that keeps asking after writes stop sees the hash
    /// of the last applied index within about a second (plus the hash's
    /// own time). Needs a tokio runtime to start the hasher (outside one,
    /// only [`SharedState::hash_now`] hashes).
    pub fn latest_hash(&self) -> Option<StateHashAt> {
        let latest = self.hashes.latest();
        if latest
            .as_ref()
            .is_none_or(|latest| latest.applied_index != self.read().registry.applied_index())
        {
            self.wake_hasher();
        }
        latest
    }

    /// A hash of the state applied now (waiting for it): an operator's
    /// `Admin.StateHash`. Hashing encodes the whole state, so it runs on a
    /// blocking thread and one hash is computed at a time: callers that
    /// arrive while one is computed wait for it and share its result (a
    /// state applied at most as long ago as that hash took), and an index
    /// hashed already is not hashed again. The result is also the newest
    /// hash [`SharedState::latest_hash`] reports.
    pub async fn hash_now(&self) -> StateHashAt {
        hash_now(&self.state, &self.hashes).await
    }

    /// How many state hashes this node has computed (the metric
    /// `oncekv_state_hashes_total`).
    pub fn hash_computations(&self) -> u64 {
        self.hashes.completed.load(Ordering::Acquire)
    }

    /// Wakes the background hasher, starting it on first use. It holds
    /// the state weakly and ends once the state is dropped.
    fn wake_hasher(&self) {
        if self.hashes.hasher_started.get().is_none()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            self.hashes.hasher_started.get_or_init(|| {
                runtime.spawn(background_hasher(
                    Arc::downgrade(&self.state),
                    self.hashes.clone(),
                ));
            });
        }
        self.hashes.wake.notify_one();
    }
}

/// The shortest time between the starts of two background hashes.
pub const HASH_INTERVAL: Duration = Duration::from_secs(1);

/// A state hash and the applied state it describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateHashAt {
    /// The applied index of the hashed state.
    pub applied_index: u64,
    /// The cluster time of the hashed state.
    pub cluster_time_ms: u64,
    /// Hex BLAKE3 of the canonical state (`oncekv_core::snapshot::state_hash`).
    pub hash: String,
}

/// The newest state hash, shared by every reader (see
/// [`SharedState::latest_hash`] and [`SharedState::hash_now`]).
#[derive(Debug, Default)]
struct Hashes {
    /// Hashes computed so far.
    completed: AtomicU64,
    /// The newest hash and when it was stored (its `completed`); its lock
    /// is held while the next is computed, so one is computed at a time.
    computing: tokio::sync::Mutex<Option<(u64, StateHashAt)>>,
    /// The newest hash, readable without waiting for one being computed.
    newest: Mutex<Option<StateHashAt>>,
    /// Wakes the background hasher; a wake while it hashes is kept.
    wake: tokio::sync::Notify,
    hasher_started: OnceLock<()>,
}

impl Hashes {
    fn latest(&self) -> Option<StateHashAt> {
        self.newest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// [`SharedState::hash_now`] on the parts of a shared state.
async fn hash_now(state: &RwLock<AppliedState>, hashes: &Hashes) -> StateHashAt {
    let arrived = hashes.completed.load(Ordering::Acquire);
    let mut last = hashes.computing.lock().await;
    if let Some((generation, hash)) = last.as_ref()
        && *generation > arrived
    {
        return hash.clone();
    }
    // O(1): the registry's maps are persistent; the copy is kept only
    // while it is hashed.
    let registry = state
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .registry
        .clone();
    if let Some((_, hash)) = last.as_ref()
        && hash.applied_index == registry.applied_index()
    {
        return hash.clone();
    }
    let applied_index = registry.applied_index();
    let cluster_time_ms = registry.cluster_time_ms();
    let hash = super::background::run_hash(move || {
        oncekv_core::snapshot::state_hash(&registry).to_string()
    })
    .await;
    let generation = hashes.completed.fetch_add(1, Ordering::AcqRel) + 1;
    let hash = StateHashAt {
        applied_index,
        cluster_time_ms,
        hash,
    };
    *last = Some((generation, hash.clone()));
    *hashes.newest.lock().unwrap_or_else(PoisonError::into_inner) = Some(hash.clone());
    hash
}

/// Hashes the applied state when woken and the newest hash is of an older
/// index, starting at most one hash per [`HASH_INTERVAL`]; ends when the
/// state is gone.
async fn background_hasher(state: Weak<RwLock<AppliedState>>, hashes: Arc<Hashes>) {
    let mut last_start: Option<tokio::time::Instant> = None;
    loop {
        hashes.wake.notified().await;
        if let Some(start) = last_start {
            tokio::time::sleep_until(start + HASH_INTERVAL).await;
        }
        let Some(state) = state.upgrade() else {
            return;
        };
        let applied = state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .registry
            .applied_index();
        if hashes
            .latest()
            .is_some_and(|latest| latest.applied_index == applied)
        {
            continue;
        }
        last_start = Some(tokio::time::Instant::now());
        hash_now(&state, &hashes).await;
    }
}

/// Reads a registry entry's data for the client paths without exposing the
/// lock type.
pub fn read_registry<T>(
    state: &SharedState,
    read: impl FnOnce(&Registry, Option<LogId>) -> T,
) -> T {
    let applied = state.read();
    read(&applied.registry, applied.last_applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advance(state: &SharedState, to: u64) {
        let mut applied = state.write();
        let from = applied.registry.applied_index() + 1;
        for index in from..=to {
            applied.registry.apply_other(index);
        }
    }

    /// A hash is answered while the background thread is held by a long
    /// job (at tens of millions of records, an install or a build lasts
    /// tens of seconds): hashes run on a thread of their own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hash_does_not_wait_behind_a_long_background_job() {
        let (started, running) = tokio::sync::oneshot::channel();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let long_job = tokio::spawn(super::super::background::run(move || {
            let _ = started.send(());
            let _ = held.recv();
        }));
        running.await.unwrap();
        let state = SharedState::default();
        advance(&state, 7);
        let hashed = tokio::time::timeout(Duration::from_secs(60), state.hash_now()).await;
        release.send(()).unwrap();
        long_job.await.unwrap();
        assert_eq!(
            hashed
                .expect("the hash waited behind the long job")
                .applied_index,
            7
        );
    }

    /// Concurrent `hash_now` calls share one computation, and each gets
    /// the index, time and hash of one moment.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_hashes_are_computed_once() {
        let state = SharedState::default();
        advance(&state, 50);
        let calls = (0..64).map(|_| {
            let state = state.clone();
            tokio::spawn(async move { state.hash_now().await })
        });
        let expected = oncekv_core::snapshot::state_hash(&state.registry()).to_string();
        for call in futures::future::join_all(calls).await {
            let hashed = call.unwrap();
            assert_eq!(hashed.applied_index, 50);
            assert_eq!(hashed.hash, expected);
        }
        assert_eq!(state.hash_computations(), 1);
        advance(&state, 51);
        assert_eq!(state.hash_now().await.applied_index, 51);
        assert_eq!(state.hash_computations(), 2);
        assert_eq!(state.latest_hash().unwrap().applied_index, 51);
    }

    /// A tight loop of `latest_hash` calls (what `Status` and scrapes call)
    /// while every call applies a new entry hashes at most once per
    /// `HASH_INTERVAL`, never once per call; when the writes stop, asking
    /// again finds the hash of the last index, equal to a direct hash.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn latest_hash_is_computed_in_the_background_at_most_once_a_second() {
        let state = SharedState::default();
        advance(&state, 100);
        assert_eq!(
            state.latest_hash(),
            None,
            "no hash is computed for a caller"
        );
        let began = tokio::time::Instant::now();
        let mut index = 100;
        let mut calls = 0u64;
        while began.elapsed() < HASH_INTERVAL * 5 / 2 {
            index += 1;
            advance(&state, index);
            if let Some(latest) = state.latest_hash() {
                assert!(latest.applied_index <= index);
            }
            calls += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let computed = state.hash_computations();
        // Starts at about 0, 1 and 2 intervals: three at most.
        assert!(
            (1..=3).contains(&computed),
            "{computed} hashes for {calls} calls"
        );
        assert!(calls > 100, "only {calls} calls");
        let deadline = tokio::time::Instant::now() + HASH_INTERVAL * 10;
        let latest = loop {
            if let Some(latest) = state.latest_hash()
                && latest.applied_index == index
            {
                break latest;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hash never caught up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let registry = state.registry();
        assert_eq!(
            latest.hash,
            oncekv_core::snapshot::state_hash(&registry).to_string()
        );
        assert_eq!(latest.cluster_time_ms, registry.cluster_time_ms());
    }
}
