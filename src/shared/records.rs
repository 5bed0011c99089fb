//! The records of the applied state that lie outside the registry
//! (docs/state-beyond-ram.md §4.5, §4.12): idempotency keys, and from rules
//! version 3 finished claims, in the on-disk record store
//! (`crates/oncekv-records`, one kind byte per store key) and the layers of
//! changes on their way into it. The registry holds the changes since the
//! last snapshot build; each build takes them
//! (`Registry::take_record_changes`) into a *layer* here and flushes the
//! layer into the store; a read goes registry → layers, newest first →
//! store, so a record is found in exactly one place at every moment.
//!
//! It owns that lookup order, the layers' lifetime (a layer leaves only
//! after its flush committed), each kind's store forms and watermark, and
//! the switch to a new store generation when a take held every record (the
//! first after a restart or an install: what the store held before is not
//! of this state). It decides nothing about a record (the registry does,
//! from what is fetched here) and must not be read without the applied
//! state's lock held, for reading or writing: the registry's changes, the
//! layers and the store agree only under it.

use oncekv_core::codec::CodecError;
use oncekv_core::snapshot::Streamed;
use oncekv_core::stored::{
    KIND_CLAIM, KIND_KEY, claim_id_bytes, claim_id_from_bytes, claim_record_bytes,
    claim_record_from_bytes, key_id_bytes, key_id_from_bytes, key_record_bytes,
    key_record_from_bytes,
};
use oncekv_core::{
    Changes, ClaimRecord, ClaimView, GroupedRecord, KeyChanges, KeyId, KeyRecord, KeyView,
    Prefetched, RecordChanges, Registry,
};
use oncekv_records::{Checkpoint, Options, RawRecord, RecordStore, Staged, StoredRecord, View};
use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

/// One take of changes, on its way into the store.
#[derive(Debug)]
struct Layer {
    keys: KeyChanges,
    /// Finished claims' changes (rules version 3; `None` before).
    claims: Option<Changes<ClaimRecord>>,
}

impl Layer {
    /// Whether the take held every record: below it, the store is of
    /// another state (a complete keys' take replaces the store; a complete
    /// claims' take alone is the first after the raise to version 3, when
    /// the store holds no claim).
    fn replaces_below<R: StoredKind>(&self) -> bool {
        self.keys.complete || R::changes(self).is_some_and(|changes| changes.complete)
    }
}

/// A kind of record the store holds: its kind byte and byte forms.
trait StoredKind: Clone + Sized {
    const KIND: u8;
    const NOUN: &'static str;
    fn id_bytes(id: &KeyId) -> Vec<u8>;
    fn id_from_bytes(bytes: &[u8]) -> Option<KeyId>;
    fn record_bytes(&self) -> Vec<u8>;
    fn record_from_bytes(bytes: &[u8]) -> Result<Self, CodecError>;
    /// This kind's changes in a layer.
    fn changes(layer: &Layer) -> Option<&Changes<Self>>;
}

impl StoredKind for KeyRecord {
    const KIND: u8 = KIND_KEY;
    const NOUN: &'static str = "key";
    fn id_bytes(id: &KeyId) -> Vec<u8> {
        key_id_bytes(id)
    }
    fn id_from_bytes(bytes: &[u8]) -> Option<KeyId> {
        key_id_from_bytes(bytes)
    }
    fn record_bytes(&self) -> Vec<u8> {
        key_record_bytes(self)
    }
    fn record_from_bytes(bytes: &[u8]) -> Result<Self, CodecError> {
        key_record_from_bytes(bytes)
    }
    fn changes(layer: &Layer) -> Option<&Changes<Self>> {
        Some(&layer.keys)
    }
}

impl StoredKind for ClaimRecord {
    const KIND: u8 = KIND_CLAIM;
    const NOUN: &'static str = "claim";
    fn id_bytes(id: &KeyId) -> Vec<u8> {
        claim_id_bytes(id)
    }
    fn id_from_bytes(bytes: &[u8]) -> Option<KeyId> {
        claim_id_from_bytes(bytes)
    }
    fn record_bytes(&self) -> Vec<u8> {
        claim_record_bytes(self)
    }
    fn record_from_bytes(bytes: &[u8]) -> Result<Self, CodecError> {
        claim_record_from_bytes(bytes)
    }
    fn changes(layer: &Layer) -> Option<&Changes<Self>> {
        layer.claims.as_ref()
    }
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
fn to_stored<R: StoredKind>(record: &GroupedRecord<R>) -> StoredRecord {
    StoredRecord {
        group: record.group_ms,
        bytes: record.record.record_bytes(),
    }
}

/// A grouped record as stored, its bytes already encoded.
fn stored<R>(record: &GroupedRecord<R>, bytes: Vec<u8>) -> StoredRecord {
    StoredRecord {
        group: record.group_ms,
        bytes,
    }
}

/// The record a store holds, checked.
fn from_stored<R: StoredKind>(stored: StoredRecord) -> io::Result<GroupedRecord<R>> {
    let record = R::record_from_bytes(&stored.bytes)
        .map_err(|e| corrupt(format!("a stored {} record does not decode: {e}", R::NOUN)))?;
    Ok(GroupedRecord {
        group_ms: stored.group,
        record,
    })
}

/// A layer's rows for the store, in store-key order (kind 1 before kind 2).
fn layer_rows(layer: &Layer) -> impl Iterator<Item = (Vec<u8>, Option<StoredRecord>)> + '_ {
    let claims = layer.claims.iter().flat_map(|claims| claims.records.iter());
    layer
        .keys
        .records
        .iter()
        .map(|(id, change)| (key_id_bytes(id), change.as_ref().map(to_stored)))
        .chain(claims.map(|(id, change)| (claim_id_bytes(id), change.as_ref().map(to_stored))))
}

/// The checkpoint of a layer (or an install) at `index`: the keys'
/// watermark, and the claims' from rules version 3 (a checkpoint naming
/// kind 1 alone is written in the format a build without claims in the
/// store reads).
fn checkpoint(index: u64, keys_watermark: u64, claims_watermark: Option<u64>) -> Checkpoint {
    let mut watermarks = BTreeMap::from([(KIND_KEY, keys_watermark)]);
    if let Some(watermark) = claims_watermark {
        watermarks.insert(KIND_CLAIM, watermark);
    }
    Checkpoint {
        watermarks,
        applied: applied_bytes(index),
    }
}

/// What a flush's checkpoint says of the applied state: the log index it
/// covers (big-endian), for restarts to match the store with a snapshot.
pub fn applied_bytes(index: u64) -> Vec<u8> {
    index.to_be_bytes().to_vec()
}

/// One operator's view in a merged page, or a record to check first.
enum Listed<R> {
    /// A view already made (a held claim: always live).
    View(ClaimView),
    /// A record or removal from the registry's changes, a layer or the
    /// store.
    Change(Option<GroupedRecord<R>>),
}

type Stream<'a, R> =
    std::iter::Peekable<Box<dyn Iterator<Item = io::Result<(KeyId, Listed<R>)>> + 'a>>;

fn stream<'a, R: 'a>(
    items: impl Iterator<Item = io::Result<(KeyId, Listed<R>)>> + 'a,
) -> Stream<'a, R> {
    (Box::new(items) as Box<dyn Iterator<Item = _>>).peekable()
}

/// At most `limit` views of the least ids over `streams` (highest priority
/// first: where several name an id, the first one's says), and whether
/// more follow; `live` makes a view of a record, `None` if it has expired.
fn merged_page<R, V>(
    mut streams: Vec<Stream<'_, R>>,
    limit: usize,
    view: impl Fn(&KeyId, Listed<R>) -> Option<V>,
) -> io::Result<(Vec<V>, bool)> {
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
                let (_, listed) = stream.next().expect("peeked")?;
                resolved.get_or_insert(listed);
            }
        }
        if let Some(listed) = resolved
            && let Some(view) = view(&least, listed)
        {
            page.push(view);
        }
    }
    let more = page.len() > limit;
    page.truncate(limit);
    Ok((page, more))
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

    /// What lies outside the registry under `id` of kind `R`, from the
    /// newest layer holding it, else the store — stopping at a layer that
    /// held every record (below it, the store is of another state).
    fn get_kind<R: StoredKind>(&self, id: &KeyId) -> io::Result<Option<GroupedRecord<R>>> {
        {
            let layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
            for layer in layers.iter().rev() {
                if let Some(change) = R::changes(layer).and_then(|changes| changes.records.get(id))
                {
                    return Ok(change.clone());
                }
                if layer.replaces_below::<R>() {
                    return Ok(None);
                }
            }
        }
        self.store()
            .get(&R::id_bytes(id))
            .map_err(store_error)?
            .map(from_stored)
            .transpose()
    }

    /// The key record outside the registry under `id`.
    pub fn get(&self, id: &KeyId) -> io::Result<Option<GroupedRecord>> {
        self.get_kind(id)
    }

    /// The finished claim record outside the registry under `id`.
    pub fn get_claim(&self, id: &KeyId) -> io::Result<Option<GroupedRecord<ClaimRecord>>> {
        self.get_kind(id)
    }

    /// The records the registry named for the entry about to apply.
    pub fn fetch(&self, keys: Vec<KeyId>, claims: Vec<KeyId>) -> io::Result<Prefetched> {
        let mut fetched = Prefetched::none();
        for id in keys {
            let stored = self.get(&id)?;
            fetched.insert(id, stored);
        }
        for id in claims {
            let stored = self.get_claim(&id)?;
            fetched.insert_claim(id, stored);
        }
        Ok(fetched)
    }

    /// Adds a take of changes as the newest layer: call it under the
    /// applied state's write lock, in the same critical section as the
    /// take, then [`OutsideRecords::flush`] the result.
    pub fn push(&self, changes: RecordChanges) -> PendingFlush {
        let layer = Arc::new(Layer {
            keys: changes.keys,
            claims: changes.claims,
        });
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
        let layer = &pending.layer;
        let checkpoint = checkpoint(
            index,
            layer.keys.first_live_group_ms,
            layer
                .claims
                .as_ref()
                .map(|claims| claims.first_live_group_ms),
        );
        let store = self.store();
        if layer.keys.complete {
            // Every key record, and (at rules version 3, where both kinds
            // are taken whole together) every finished claim.
            let records = layer_rows(layer).filter_map(|(key, change)| Some(Ok((key, change?))));
            let replaced = store.install(records, &checkpoint).map_err(store_error)?;
            *self.store.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(replaced);
        } else {
            store
                .flush(layer_rows(layer), &checkpoint)
                .map_err(store_error)?;
        }
        self.layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|layer| !Arc::ptr_eq(layer, &pending.layer));
        Ok(())
    }

    /// Checks that the store in force is generation `generation` at the
    /// checkpoint of `index`: the base an extension was received over.
    pub fn check_at(&self, index: u64, generation: u64) -> io::Result<()> {
        let store = self.store();
        let at = self.checkpoint_index()?;
        if store.generation() != generation || at != Some(index) {
            return Err(io::Error::other(format!(
                "an extension of generation {generation} at index {index}, but the store \
                 in force is generation {} at {at:?}",
                store.generation()
            )));
        }
        Ok(())
    }

    /// Adds an extension's records (docs/state-beyond-ram.md §4.9p) to the
    /// store in force — which must be generation `generation` at the
    /// checkpoint of `base_index` (else nothing is written) — in one atomic
    /// batch with the checkpoint of `index` and the snapshot's watermarks,
    /// fsynced; returns the store's view of it. Blocking.
    pub fn extend(
        &self,
        records: Vec<(Vec<u8>, StoredRecord)>,
        index: u64,
        keys_watermark: u64,
        claims_watermark: Option<u64>,
        base_index: u64,
        generation: u64,
    ) -> io::Result<View> {
        let _order = self.flushing.lock().unwrap_or_else(|p| p.into_inner());
        self.check_at(base_index, generation)?;
        let checkpoint = checkpoint(index, keys_watermark, claims_watermark);
        let store = self.store();
        store
            .flush(
                records.into_iter().map(|(key, record)| (key, Some(record))),
                &checkpoint,
            )
            .map_err(store_error)?;
        store.view().map_err(store_error)
    }

    /// Builds a new store generation from an installed snapshot's streamed
    /// records (keys, then finished claims, each in (principal, key) order
    /// and in a live group; an error among them — the snapshot's last
    /// checks come as its last item — leaves the generation in force) with
    /// the checkpoint of `index` and the watermarks, fsynced and named
    /// current on disk. The records are streamed, never held. Returns it
    /// for [`OutsideRecords::switch_to`], which readers see only once the
    /// registry is replaced with it. Blocking: run it off the async
    /// workers. [`OutsideRecords::stage_generation`], then
    /// [`OutsideRecords::put_in_force`].
    pub fn install_generation<I>(
        &self,
        records: I,
        index: u64,
        keys_watermark: u64,
        claims_watermark: Option<u64>,
    ) -> io::Result<Arc<RecordStore>>
    where
        I: IntoIterator<Item = Result<Streamed, oncekv_core::snapshot::SnapshotError>>,
    {
        let staged = self.stage_generation(records, index, keys_watermark, claims_watermark)?;
        self.put_in_force(staged)
    }

    /// The first half of [`OutsideRecords::install_generation`]: the new
    /// generation written whole and fsynced, but not in force — what a
    /// node receiving a snapshot does as the records arrive, while its
    /// store in force goes on as it was. Dropped, it is deleted. Blocking.
    pub fn stage_generation<I>(
        &self,
        records: I,
        index: u64,
        keys_watermark: u64,
        claims_watermark: Option<u64>,
    ) -> io::Result<Staged>
    where
        I: IntoIterator<Item = Result<Streamed, oncekv_core::snapshot::SnapshotError>>,
    {
        let checkpoint = checkpoint(index, keys_watermark, claims_watermark);
        let stored = records.into_iter().map(|item| match item {
            // The record's bytes as the snapshot carried them: its stored
            // form, not encoded again.
            Ok(Streamed::Key(id, record, bytes)) => Ok((key_id_bytes(&id), stored(&record, bytes))),
            Ok(Streamed::Claim(id, record, bytes)) => {
                Ok((claim_id_bytes(&id), stored(&record, bytes)))
            }
            Err(e) => Err(e.to_string()),
        });
        self.store().stage(stored, &checkpoint).map_err(store_error)
    }

    /// The second half of [`OutsideRecords::install_generation`]: names a
    /// staged generation current on disk (ordered after any flush under
    /// way) and returns it for [`OutsideRecords::switch_to`]. Blocking.
    pub fn put_in_force(&self, staged: Staged) -> io::Result<Arc<RecordStore>> {
        let _order = self.flushing.lock().unwrap_or_else(|p| p.into_inner());
        let store = self.store().put_in_force(staged).map_err(store_error)?;
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

    /// The live records of kind `R` in `view` (by their kind's watermark),
    /// in (principal, key) order, from `after` (exclusive) on. Only that
    /// kind's rows are read: the scan stops at the first row of another.
    fn rows_after<'a, R: StoredKind + 'a>(
        view: &'a View,
        after: Option<&KeyId>,
    ) -> impl Iterator<Item = io::Result<(KeyId, GroupedRecord<R>)>> + 'a {
        let start = after.map_or_else(|| vec![R::KIND], R::id_bytes);
        OutsideRecords::rows_of(view.records_from(&start), after.cloned())
    }

    /// The rows of kind `R` among `rows` (a view's, from the first of that
    /// kind or from `after`), decoded, those up to `after` left out.
    fn rows_of<R: StoredKind>(
        rows: impl Iterator<Item = oncekv_records::Result<(Vec<u8>, StoredRecord)>>,
        after: Option<KeyId>,
    ) -> impl Iterator<Item = io::Result<(KeyId, GroupedRecord<R>)>> {
        rows.take_while(|item| !matches!(item, Ok((key, _)) if key.first() != Some(&R::KIND)))
            .map(|item| {
                let (key, stored) = item.map_err(store_error)?;
                let id = R::id_from_bytes(&key).ok_or_else(|| {
                    corrupt(format!("a stored {} {key:?} does not decode", R::NOUN))
                })?;
                Ok((id, from_stored(stored)?))
            })
            .filter(
                move |item| !matches!((item, &after), (Ok((id, _)), Some(after)) if id <= after),
            )
    }

    /// Every live record of kind `R` in `view`, in (principal, key) order,
    /// as the store holds it (store key and bytes, neither decoded), as one
    /// iterator that holds the view: a whole scan read in pieces (a
    /// snapshot sent a chunk at a time), which must not seek again at each
    /// piece ([`View::raw_records_from_shared`]).
    fn all_stored<R: StoredKind>(
        view: &Arc<View>,
    ) -> impl Iterator<Item = io::Result<RawRecord>> + Send + 'static {
        View::raw_records_from_shared(view, &[R::KIND])
            .take_while(|item| !matches!(item, Ok(raw) if raw.key().first() != Some(&R::KIND)))
            .map(|item| item.map_err(store_error))
    }

    /// Every live key record of `view` as stored, in (principal, key)
    /// order, as one iterator for a whole scan read in pieces (see
    /// [`Self::all_stored`]).
    pub fn all_stored_key_records(
        view: &Arc<View>,
    ) -> impl Iterator<Item = io::Result<RawRecord>> + Send + 'static {
        OutsideRecords::all_stored::<KeyRecord>(view)
    }

    /// Every live finished claim record of `view` as stored, as
    /// [`Self::all_stored_key_records`].
    pub fn all_stored_claim_records(
        view: &Arc<View>,
    ) -> impl Iterator<Item = io::Result<RawRecord>> + Send + 'static {
        OutsideRecords::all_stored::<ClaimRecord>(view)
    }

    /// The live key records of `view`, in (principal, key) order, from
    /// `after` (exclusive) on.
    pub fn records_after<'a>(
        view: &'a View,
        after: Option<&KeyId>,
    ) -> impl Iterator<Item = io::Result<(KeyId, GroupedRecord)>> + 'a {
        OutsideRecords::rows_after::<KeyRecord>(view, after)
    }

    /// The live finished claim records of `view`, in (principal, key)
    /// order, from `after` (exclusive) on.
    pub fn claim_records_after<'a>(
        view: &'a View,
        after: Option<&KeyId>,
    ) -> impl Iterator<Item = io::Result<(KeyId, GroupedRecord<ClaimRecord>)>> + 'a {
        OutsideRecords::rows_after::<ClaimRecord>(view, after)
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

    /// The live claim record of `id` for an operator, from wherever it
    /// lies.
    pub fn claim_view(&self, registry: &Registry, id: &KeyId) -> io::Result<Option<ClaimView>> {
        let stored = if registry.claim_must_be_fetched(id) {
            self.get_claim(id)?
        } else {
            None
        };
        Ok(registry.claim_over(&id.0, &id.1, stored))
    }

    /// The layers a reader merges, newest first, down to one that replaced
    /// the store below it for kind `R`; and whether the store is below.
    fn layers_for<R: StoredKind>(&self) -> (Vec<Arc<Layer>>, bool) {
        let mut layers = Vec::new();
        for layer in self
            .layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .rev()
        {
            layers.push(layer.clone());
            if layer.replaces_below::<R>() {
                return (layers, false);
            }
        }
        (layers, true)
    }

    /// The layers' changes of kind `R` after `after`, newest layer first.
    fn layer_streams<'a, R: StoredKind + 'a>(
        layers: &'a [Arc<Layer>],
        after: &KeyId,
    ) -> Vec<Stream<'a, R>> {
        let range = (Bound::Excluded(after.clone()), Bound::Unbounded);
        layers
            .iter()
            .filter_map(|layer| R::changes(layer))
            .map(|changes| {
                stream(
                    changes
                        .records
                        .range(range.clone())
                        .map(|(id, change)| Ok((id.clone(), Listed::Change(change.clone())))),
                )
            })
            .collect()
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
        let (layers, store_below) = self.layers_for::<KeyRecord>();
        let view = store_below.then(|| self.view()).transpose()?;
        // Highest priority first: the registry, the layers newest first,
        // the store.
        let mut streams: Vec<Stream<'_, KeyRecord>> =
            vec![stream(registry.key_changes_after(after).map(
                |(id, change)| Ok((id.clone(), Listed::Change(change.clone()))),
            ))];
        streams.extend(OutsideRecords::layer_streams(&layers, after));
        if let Some(view) = &view {
            streams.push(stream(
                OutsideRecords::records_after(view, Some(after))
                    .map(|item| item.map(|(id, record)| (id, Listed::Change(Some(record))))),
            ));
        }
        merged_page(streams, limit, |id, listed| match listed {
            Listed::Change(Some(stored)) => registry.live_key_view(id, &stored),
            Listed::Change(None) | Listed::View(_) => None,
        })
    }

    /// One page of live claim records for operators (rules version 3,
    /// finished ones outside the registry): at most `limit` after `after`
    /// in (principal, key) order, and whether more follow — the held
    /// claims (always in memory, and live), then the registry's finished
    /// changes, the layers newest first and the store, merged.
    pub fn claims_page(
        &self,
        registry: &Registry,
        after: &KeyId,
        limit: usize,
    ) -> io::Result<(Vec<ClaimView>, bool)> {
        let (layers, store_below) = self.layers_for::<ClaimRecord>();
        let view = store_below.then(|| self.view()).transpose()?;
        let mut streams: Vec<Stream<'_, ClaimRecord>> = vec![
            stream(registry.held_claim_views_after(after).map(|view| {
                Ok((
                    (view.principal.clone(), view.key.clone()),
                    Listed::View(view),
                ))
            })),
            stream(
                registry
                    .claim_changes_after(after)
                    .map(|(id, change)| Ok((id.clone(), Listed::Change(change.clone())))),
            ),
        ];
        streams.extend(OutsideRecords::layer_streams(&layers, after));
        if let Some(view) = &view {
            streams.push(stream(
                OutsideRecords::claim_records_after(view, Some(after))
                    .map(|item| item.map(|(id, record)| (id, Listed::Change(Some(record))))),
            ));
        }
        merged_page(streams, limit, |id, listed| match listed {
            Listed::View(view) => Some(view),
            Listed::Change(Some(stored)) => registry.live_claim_view(id, &stored),
            Listed::Change(None) => None,
        })
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
