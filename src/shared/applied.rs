//! The applied state both adapters share: the registry as applied on this
//! node (with the Raft log id and membership it was applied at), its cluster
//! id once bootstrapped, and the newest state hash. The storage adapter's
//! state machine is its only writer (`write`, `publish_cluster_id`, both
//! crate-private); the network adapter, the cluster clock and the node's
//! observability only read it. It holds no logic of either adapter and must
//! not depend on `network` or `storage`.

use crate::raft_types::{LogId, StoredMembership};
use oncekv_core::{ClusterId, Registry};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

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
    /// scrapes): see [`SharedState::hashed`].
    hashes: Arc<Hashes>,
    /// The cluster id once the bootstrap entry (or a snapshot holding it) is
    /// applied. It never changes after that, so the client paths check it
    /// without taking the state lock, which apply holds for whole batches.
    cluster_id: Arc<OnceLock<ClusterId>>,
}

impl SharedState {
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

    /// A copy of the applied registry and its hex state hash, of one moment
    /// (the copy's applied index). Hashing encodes the whole state, so it
    /// runs on a blocking thread and one hash is computed at a time: callers
    /// that arrive while one is computed wait for it and share its result (a
    /// state applied at most as long ago as that hash took), and a state
    /// whose index was hashed already is not hashed again. So any number of
    /// concurrent `Status` calls, `Admin.StateHash` calls and metrics
    /// scrapes cost one hash, not one each.
    pub async fn hashed(&self) -> (Registry, String) {
        let arrived = self.hashes.completed.load(Ordering::Acquire);
        let mut last = self.hashes.last.lock().await;
        if let Some(last) = last.as_ref()
            && last.generation > arrived
        {
            return (last.registry.clone(), last.hash.clone());
        }
        let registry = self.registry();
        if let Some(last) = last.as_ref()
            && last.registry.applied_index() == registry.applied_index()
        {
            return (last.registry.clone(), last.hash.clone());
        }
        let copy = registry.clone();
        let hash = tokio::task::spawn_blocking(move || {
            oncekv_core::snapshot::state_hash(&copy).to_string()
        })
        .await
        .unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()));
        let generation = self.hashes.completed.fetch_add(1, Ordering::AcqRel) + 1;
        *last = Some(LastHash {
            generation,
            registry: registry.clone(),
            hash: hash.clone(),
        });
        (registry, hash)
    }
}

/// The newest state hash, shared by every reader (see
/// [`SharedState::hashed`]).
#[derive(Debug, Default)]
struct Hashes {
    /// Hashes computed so far.
    completed: AtomicU64,
    /// The newest one; its lock is held while the next is computed.
    last: tokio::sync::Mutex<Option<LastHash>>,
}

#[derive(Debug)]
struct LastHash {
    /// `completed` when this hash was stored.
    generation: u64,
    registry: Registry,
    hash: String,
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

    /// Concurrent hash requests share one computation, and each gets a
    /// hash of the copy it is given back (index and hash of one moment).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_hashes_are_computed_once() {
        let state = SharedState::default();
        {
            let mut applied = state.write();
            for index in 1..=50 {
                applied.registry.apply_other(index);
            }
        }
        let calls = (0..64).map(|_| {
            let state = state.clone();
            tokio::spawn(async move { state.hashed().await })
        });
        for call in futures::future::join_all(calls).await {
            let (registry, hash) = call.unwrap();
            assert_eq!(
                hash,
                oncekv_core::snapshot::state_hash(&registry).to_string()
            );
        }
        assert_eq!(state.hashes.completed.load(Ordering::Acquire), 1);
        state.write().registry.apply_other(51);
        let (registry, _) = state.hashed().await;
        assert_eq!(registry.applied_index(), 51);
        assert_eq!(state.hashes.completed.load(Ordering::Acquire), 2);
    }
}
