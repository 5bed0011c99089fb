//! The idempotency-key records of the applied state that lie outside the
//! registry (docs/state-beyond-ram.md §4.5): the on-disk record store
//! (`crates/oncekv-records`) and the layers of changes on their way into
//! it. The registry holds the changes since the last snapshot build; each
//! build takes them (`Registry::take_key_changes`) into a *layer* here and
//! flushes the layer into the store; a read goes registry → layers, newest
//! first → store, so a record is found in exactly one place at every
//! moment.
//!
//! It owns that lookup order, the layers' lifetime (a layer leaves only
//! after its flush committed) and the switch to a new store generation
//! when a take held every record (the first after a restart or an install:
//! what the store held before is not of this state). It decides nothing
//! about a record (the registry does, from what is fetched here) and must
//! not be read without the applied state's lock held, for reading or
//! writing: the registry's changes, the layers and the store agree only
//! under it.

use oncekv_core::snapshot::Streamed;
use oncekv_core::stored::{
    KIND_KEY, key_id_bytes, key_id_from_bytes, key_record_bytes, key_record_from_bytes,
};
use oncekv_core::{GroupedRecord, KeyChanges, KeyId, KeyView, Prefetched, Registry};
use oncekv_records::{Checkpoint, Options, RecordStore, StoredRecord, View};
use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

/// One take of changes, on its way into the store.
#[derive(Debug)]
struct Layer {
    changes: KeyChanges,
}

/// The records outside the registry: see the module doc.
pub struct OutsideRecords {
    store: RwLock<Arc<RecordStore>>,
    /// Layers not yet flushed, oldest first.
    layers: Mutex<Vec<Arc<Layer>>>,
    /// One flush at a time, in the order the layers were taken.
    flushing: Mutex<()>,
}

impl std::fmt::Debug for OutsideRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutsideRecords")
            .field("layers", &self.layers.lock().map_or(0, |l| l.len()))
            .finish_non_exhaustive()
    }
}

/// A flush's position in the order of takes.
pub struct PendingFlush {
    layer: Arc<Layer>,
}

fn store_error(error: oncekv_records::Error) -> io::Error {
    io::Error::other(error.to_string())
}

fn corrupt(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// The stored form of a grouped record.
fn to_stored(record: &GroupedRecord) -> StoredRecord {
    StoredRecord {
        group: record.group_ms,
        bytes: key_record_bytes(&record.record),
    }
}

/// The record a store holds, checked.
fn from_stored(stored: StoredRecord) -> io::Result<GroupedRecord> {
    let record = key_record_from_bytes(&stored.bytes)
        .map_err(|e| corrupt(format!("a stored key record does not decode: {e}")))?;
    Ok(GroupedRecord {
        group_ms: stored.group,
        record,
    })
}

/// What a flush's checkpoint says of the applied state: the log index it
/// covers (big-endian), for restarts to match the store with a snapshot.
pub fn applied_bytes(index: u64) -> Vec<u8> {
    index.to_be_bytes().to_vec()
}

impl OutsideRecords {
    /// Opens (or creates) the store under `root`.
    pub fn open(root: &Path) -> io::Result<OutsideRecords> {
        let store = RecordStore::open(root, &Options::default()).map_err(store_error)?;
        Ok(OutsideRecords {
            store: RwLock::new(Arc::new(store)),
            layers: Mutex::new(Vec::new()),
            flushing: Mutex::new(()),
        })
    }

    /// The log index of the store's latest checkpoint (`None`: never
    /// flushed).
    pub fn checkpoint_index(&self) -> io::Result<Option<u64>> {
        let Some(checkpoint) = self.store().checkpoint().map_err(store_error)? else {
            return Ok(None);
        };
        let index = <[u8; 8]>::try_from(checkpoint.applied.as_slice()).map_err(|_| {
            corrupt(format!(
                "a checkpoint of {} bytes, not a log index",
                checkpoint.applied.len()
            ))
        })?;
        Ok(Some(u64::from_be_bytes(index)))
    }

    fn store(&self) -> Arc<RecordStore> {
        self.store.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What lies outside the registry under `id`, from the newest layer
    /// holding it, else the store — stopping at a layer that held every
    /// record (below it, the store is of another state).
    pub fn get(&self, id: &KeyId) -> io::Result<Option<GroupedRecord>> {
        {
            let layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
            for layer in layers.iter().rev() {
                if let Some(change) = layer.changes.records.get(id) {
                    return Ok(change.clone());
                }
                if layer.changes.complete {
                    return Ok(None);
                }
            }
        }
        self.store()
            .get(&key_id_bytes(id))
            .map_err(store_error)?
            .map(from_stored)
            .transpose()
    }

    /// The records of `ids`, for the entry about to apply.
    pub fn fetch(&self, ids: Vec<KeyId>) -> io::Result<Prefetched> {
        let mut fetched = Prefetched::none();
        for id in ids {
            let stored = self.get(&id)?;
            fetched.insert(id, stored);
        }
        Ok(fetched)
    }

    /// Adds a take of changes as the newest layer: call it under the
    /// applied state's write lock, in the same critical section as the
    /// take, then [`OutsideRecords::flush`] the result.
    pub fn push(&self, changes: KeyChanges) -> PendingFlush {
        let layer = Arc::new(Layer { changes });
        self.layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(layer.clone());
        PendingFlush { layer }
    }

    /// Drops every layer: the applied state was replaced (an install), and
    /// what they hold is of the old one. Under the state's write lock.
    pub fn forget_layers(&self) {
        self.layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Writes a layer into the store with the checkpoint of `index` —
    /// replacing the store by a new generation if the layer holds every
    /// record — fsynced, and only then drops the layer. Blocking: run it
    /// off the async workers.
    pub fn flush(&self, pending: PendingFlush, index: u64) -> io::Result<()> {
        let _order = self.flushing.lock().unwrap_or_else(|p| p.into_inner());
        let changes = &pending.layer.changes;
        let checkpoint = Checkpoint {
            watermarks: BTreeMap::from([(KIND_KEY, changes.first_live_group_ms)]),
            applied: applied_bytes(index),
        };
        let store = self.store();
        if changes.complete {
            let records = changes.records.iter().filter_map(|(id, change)| {
                let record = change.as_ref()?;
                Some(Ok((key_id_bytes(id), to_stored(record))))
            });
            let replaced = store.install(records, &checkpoint).map_err(store_error)?;
            *self.store.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(replaced);
        } else {
            let records = changes
                .records
                .iter()
                .map(|(id, change)| (key_id_bytes(id), change.as_ref().map(to_stored)));
            store.flush(records, &checkpoint).map_err(store_error)?;
        }
        self.layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|layer| !Arc::ptr_eq(layer, &pending.layer));
        Ok(())
    }

    /// Builds a new store generation from an installed snapshot's key
    /// records (in (principal, key) order, each in a live group; an error
    /// among them — the snapshot's last checks come as its last item —
    /// leaves the generation in force) with the checkpoint of `index` and
    /// `watermark` (the key records'), fsynced and named current on disk.
    /// The records are streamed, never held. Returns it for
    /// [`OutsideRecords::switch_to`], which readers see only once the
    /// registry is replaced with it. Blocking: run it off the async
    /// workers.
    pub fn install_generation<I>(
        &self,
        records: I,
        index: u64,
        watermark: u64,
    ) -> io::Result<Arc<RecordStore>>
    where
        I: IntoIterator<Item = Result<Streamed, oncekv_core::snapshot::SnapshotError>>,
    {
        let _order = self.flushing.lock().unwrap_or_else(|p| p.into_inner());
        let checkpoint = Checkpoint {
            watermarks: BTreeMap::from([(KIND_KEY, watermark)]),
            applied: applied_bytes(index),
        };
        let stored = records.into_iter().map(|item| match item {
            Ok(Streamed::Key(id, record)) => Ok((key_id_bytes(&id), to_stored(&record))),
            // Rules version 3 is not released: no serving build makes
            // such a snapshot (docs/state-beyond-ram.md 4.12).
            Ok(Streamed::Claim(..)) => {
                Err("a snapshot with finished claim records (rules version 3), which this build does not store yet".to_owned())
            }
            Err(e) => Err(e.to_string()),
        });
        let store = self
            .store()
            .install(stored, &checkpoint)
            .map_err(store_error)?;
        Ok(Arc::new(store))
    }

    /// Reads from `store` from now on (an installed generation), dropping
    /// every layer (of the state replaced). Under the applied state's write
    /// lock, with the registry of the same install.
    pub fn switch_to(&self, store: Arc<RecordStore>) {
        *self.store.write().unwrap_or_else(|p| p.into_inner()) = store;
        self.forget_layers();
    }

    /// A frozen view of the store as of its latest flush.
    pub fn view(&self) -> io::Result<View> {
        self.store().view().map_err(store_error)
    }

    /// The live key records of `view` (by group), in (principal, key)
    /// order, from `after` (exclusive) on. Only the key records' kind is
    /// read: the scan stops at the first row of another kind (the store
    /// keeps finished claims after every key record).
    pub fn records_after<'a>(
        view: &'a View,
        after: Option<&KeyId>,
    ) -> impl Iterator<Item = io::Result<(KeyId, GroupedRecord)>> + 'a {
        let start = after.map_or_else(|| vec![KIND_KEY], key_id_bytes);
        let after = after.cloned();
        view.records_from(&start)
            .take_while(|item| !matches!(item, Ok((key, _)) if key.first() != Some(&KIND_KEY)))
            .map(|item| {
                let (key, stored) = item.map_err(store_error)?;
                let id = key_id_from_bytes(&key)
                    .ok_or_else(|| corrupt(format!("a stored key {key:?} does not decode")))?;
                Ok((id, from_stored(stored)?))
            })
            .filter(
                move |item| !matches!((item, &after), (Ok((id, _)), Some(after)) if id <= after),
            )
    }

    /// The live record of `id` for an operator, from wherever it lies.
    pub fn key_view(&self, registry: &Registry, id: &KeyId) -> io::Result<Option<KeyView>> {
        let stored = if registry.key_must_be_fetched(id) {
            self.get(id)?
        } else {
            None
        };
        Ok(registry.key_over(&id.0, &id.1, stored))
    }

    /// One page of live key records for operators: at most `limit` after
    /// `after` in (principal, key) order, and whether more follow — the
    /// registry's changes over the layers over the store, merged.
    pub fn page(
        &self,
        registry: &Registry,
        after: &KeyId,
        limit: usize,
    ) -> io::Result<(Vec<KeyView>, bool)> {
        type Stream<'a> = std::iter::Peekable<
            Box<dyn Iterator<Item = io::Result<(KeyId, Option<GroupedRecord>)>> + 'a>,
        >;
        let mut layers = Vec::new();
        let mut store_below = true;
        for layer in self
            .layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .rev()
        {
            layers.push(layer.clone());
            if layer.changes.complete {
                store_below = false;
                break;
            }
        }
        let view = store_below.then(|| self.view()).transpose()?;
        let range = (Bound::Excluded(after.clone()), Bound::Unbounded);
        // Highest priority first: the registry, the layers newest first,
        // the store.
        let mut streams: Vec<Stream<'_>> = Vec::new();
        let registry_changes = registry
            .key_changes_after(after)
            .map(|(id, change)| Ok((id.clone(), change.clone())));
        streams.push((Box::new(registry_changes) as Box<dyn Iterator<Item = _>>).peekable());
        for layer in &layers {
            let changes = layer
                .changes
                .records
                .range(range.clone())
                .map(|(id, change)| Ok((id.clone(), change.clone())));
            streams.push((Box::new(changes) as Box<dyn Iterator<Item = _>>).peekable());
        }
        if let Some(view) = &view {
            let stored = OutsideRecords::records_after(view, Some(after))
                .map(|item| item.map(|(id, record)| (id, Some(record))));
            streams.push((Box::new(stored) as Box<dyn Iterator<Item = _>>).peekable());
        }
        let mut page = Vec::new();
        while page.len() <= limit {
            let mut least: Option<KeyId> = None;
            for stream in &mut streams {
                match stream.peek() {
                    Some(Ok((id, _))) if least.as_ref().is_none_or(|least| id < least) => {
                        least = Some(id.clone());
                    }
                    Some(Err(_)) => {
                        return Err(stream.next().and_then(Result::err).expect("an error"));
                    }
                    _ => {}
                }
            }
            let Some(least) = least else { break };
            let mut resolved = None;
            for stream in &mut streams {
                if matches!(stream.peek(), Some(Ok((id, _))) if *id == least) {
                    let (_, change) = stream.next().expect("peeked")?;
                    resolved.get_or_insert(change);
                }
            }
            if let Some(Some(stored)) = resolved
                && let Some(view) = registry.live_key_view(&least, &stored)
            {
                page.push(view);
            }
        }
        let more = page.len() > limit;
        page.truncate(limit);
        Ok((page, more))
    }

    /// Bytes on disk of the store.
    pub fn disk_bytes(&self) -> u64 {
        self.store().disk_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_core::stored::{claim_id_bytes, claim_record_bytes};
    use oncekv_core::{
        CachedResponse, ClaimRecord, ClaimState, CommandResult, Fingerprint, IdempotencyKey,
        KeyRecord, Principal,
    };

    fn id(principal: &str, key: &[u8]) -> KeyId {
        (
            Principal(principal.to_owned()),
            IdempotencyKey(key.to_vec()),
        )
    }

    fn key_record(created_ms: u64) -> GroupedRecord {
        GroupedRecord {
            group_ms: created_ms,
            record: KeyRecord {
                created_ms,
                response: CachedResponse {
                    fingerprint: Fingerprint(created_ms.into()),
                    result: Ok(CommandResult::Stored),
                },
            },
        }
    }

    /// A store holding finished claims (kind 2, after every key record)
    /// lists its key records and nothing else: a claim row never reaches
    /// the key records' decoding (which would fail the scan), from the
    /// start or from any key.
    #[test]
    fn a_key_scan_stops_before_claim_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = OutsideRecords::open(dir.path()).expect("open");
        let keys = [id("a", b"1"), id("a", b"2"), id("b", b"1")];
        let claim = ClaimRecord {
            fingerprint: Fingerprint(1),
            fence: 3,
            attempt: 1,
            state: ClaimState::Released { released_ms: 10 },
        };
        let mut rows: Vec<(Vec<u8>, Option<StoredRecord>)> = keys
            .iter()
            .map(|id| (key_id_bytes(id), Some(to_stored(&key_record(10)))))
            .collect();
        for claim_id in [id("", b"0"), id("a", b"1"), id("z", b"9")] {
            let stored = StoredRecord {
                group: 10,
                bytes: claim_record_bytes(&claim),
            };
            rows.push((claim_id_bytes(&claim_id), Some(stored)));
        }
        let checkpoint = Checkpoint {
            watermarks: BTreeMap::from([(KIND_KEY, 0)]),
            applied: applied_bytes(1),
        };
        records.store().flush(rows, &checkpoint).expect("flush");
        let view = records.view().expect("view");
        let listed = |after: Option<&KeyId>| -> Vec<KeyId> {
            OutsideRecords::records_after(&view, after)
                .map(|item| item.expect("every listed row decodes").0)
                .collect()
        };
        assert_eq!(listed(None), keys);
        assert_eq!(listed(Some(&keys[0])), keys[1..]);
        assert_eq!(listed(Some(&keys[2])), Vec::<KeyId>::new());
        assert_eq!(listed(Some(&id("zz", b"z"))), Vec::<KeyId>::new());
    }
}
