//! The records of idempotency keys (rule 18): for each (principal, key), the
//! cluster time of its first execution and its cached response with the
//! command's fingerprint, grouped by creation time so that expiry costs per
//! group, not per record (docs/state-beyond-ram.md §4.3).
//!
//! It owns those invariants and nothing else (the order of checks and the
//! limits live in the registry):
//! - **groups**: every record belongs to the creation-time group open when
//!   it was made; groups are disjoint intervals of cluster time, opened in
//!   order, each `key_group_width_ms(ttl)` wide when opened. A group expires
//!   whole once its newest possible record is older than the TTL, so a key
//!   lives at least its TTL and less than its TTL plus one group's width;
//! - **summaries**: per group, the count, bytes, multiset hash and
//!   per-principal usage of its records, and their totals — what the limits
//!   check and the state hash covers, so neither walks the records;
//! - **the overlay**: the records it holds. Until an adapter first takes the
//!   changes ([`KeyStore::take_changes`]) that is every live record; after,
//!   the records changed since the last take (a removal kept as `None`, for
//!   the adapter's store to delete), and a record it does not hold must be
//!   handed to it, read from the adapter's store, as [`Prefetched`]. A
//!   record found there whose group has expired is absent, wherever it
//!   still lies.
//!
//! It does no IO: the adapter fetches what the registry names and stores
//! what it changed. Records are ordered by (principal, key), groups by start
//! time: expiry, paging and snapshots walk them in that fixed order (rule 10).

use super::session::CachedResponse;
use super::snapshot::{RecordsHash, key_record_hash};
use super::types::{IdempotencyKey, Principal, key_record_size_bytes};
use imbl::{OrdMap, OrdSet};
use std::collections::BTreeMap;
use std::ops::Bound;

/// Who owns a key and the key: the address of a record.
pub type KeyId = (Principal, IdempotencyKey);

/// Groups per TTL: a key lives at most its TTL plus 1/1024 of it.
pub const KEY_GROUPS_PER_TTL: u64 = 1024;
/// The widest group, whatever the TTL: a key lives at most a minute past it.
pub const KEY_GROUP_WIDTH_MAX_MS: u64 = 60_000;

/// The width of the groups opened under a key TTL of `ttl_ms`: a 1,024th of
/// it, at least 1 ms (so a TTL under 2,048 ms expires keys exactly as it
/// says) and at most [`KEY_GROUP_WIDTH_MAX_MS`].
pub fn key_group_width_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / KEY_GROUPS_PER_TTL).clamp(1, KEY_GROUP_WIDTH_MAX_MS)
}

/// One key's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    /// Cluster time of the key's first execution: its TTL counts from here
    /// (a duplicate does not refresh it).
    pub created_ms: u64,
    pub response: CachedResponse,
}

impl KeyRecord {
    /// The size charged against `idempotency_cached_bytes_max`.
    pub fn size_bytes(&self, id: &KeyId) -> u64 {
        key_record_size_bytes(&id.0, &id.1, self.response.cached_size_bytes())
    }
}

/// A record with the start of the creation-time group it belongs to: what
/// an adapter stores and hands back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupedRecord {
    pub group_ms: u64,
    pub record: KeyRecord,
}

/// Records an adapter read from its store for the entries about to apply:
/// for each id the registry named ([`crate::Registry::keys_to_fetch`]), the
/// record stored under it or `None`.
#[derive(Clone, Debug, Default)]
pub struct Prefetched {
    records: BTreeMap<KeyId, Option<GroupedRecord>>,
}

impl Prefetched {
    /// Nothing fetched: for a registry that holds all of its records.
    pub fn none() -> Prefetched {
        Prefetched::default()
    }

    /// Adds what the store holds under `id`.
    pub fn insert(&mut self, id: KeyId, stored: Option<GroupedRecord>) {
        self.records.insert(id, stored);
    }
}

/// The record changes since the last take, for the adapter's store: a
/// record to write, or `None` to delete; the start of the oldest live
/// group (records of older groups are expired wherever they lie); and
/// whether they are every live record (the first take: whatever a store
/// held before is not of this state and must be replaced, not updated).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyChanges {
    pub records: OrdMap<KeyId, Option<GroupedRecord>>,
    pub first_live_group_ms: u64,
    pub complete: bool,
}

/// What a group holds, without its records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupSummary {
    /// The group covers records created in [start, end_ms).
    pub(crate) end_ms: u64,
    pub(crate) usage: Usage,
}

/// Counts of a set of records: how many, their bytes, their multiset hash
/// and, per principal, (records, bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) hash: RecordsHash,
    pub(crate) by_principal: OrdMap<Principal, (u64, u64)>,
}

/// What one record counts for in a [`Usage`]: its size and hash, computed
/// once for its group and the totals.
pub(crate) struct Counted<'a> {
    principal: &'a Principal,
    size: u64,
    hash: [u8; 32],
}

impl<'a> Counted<'a> {
    pub(crate) fn of(id: &'a KeyId, record: &KeyRecord) -> Counted<'a> {
        Counted::hashed(id, record, key_record_hash(id, record))
    }

    /// A record whose hash is known (a snapshot reader hashes the bytes it
    /// read instead of encoding the record again).
    pub(crate) fn hashed(id: &'a KeyId, record: &KeyRecord, hash: [u8; 32]) -> Counted<'a> {
        Counted {
            principal: &id.0,
            size: record.size_bytes(id),
            hash,
        }
    }
}

impl Usage {
    pub(crate) fn add(&mut self, record: &Counted<'_>) {
        self.records += 1;
        self.bytes += record.size;
        self.hash.add(&record.hash);
        let entry = self
            .by_principal
            .entry(record.principal.clone())
            .or_insert((0, 0));
        entry.0 += 1;
        entry.1 += record.size;
    }

    /// Takes one record out. Saturating: a record handed back by an
    /// adapter's store is counted here only if the store is the state's
    /// own; a foreign or damaged store must not panic the node or wrap the
    /// limits' counts (its record's hash, subtracted, makes this replica's
    /// state hash disagree with the others', which is how it shows).
    fn subtract(&mut self, record: &Counted<'_>) {
        self.records = self.records.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(record.size);
        self.hash.subtract(&record.hash);
        self.count(record.principal, 1, record.size);
    }

    /// Takes `records` and `bytes` of `principal` out (saturating, as
    /// [`Usage::subtract`]).
    fn count(&mut self, principal: &Principal, records: u64, bytes: u64) {
        if let Some(entry) = self.by_principal.get_mut(principal) {
            entry.0 = entry.0.saturating_sub(records);
            entry.1 = entry.1.saturating_sub(bytes);
            if entry.0 == 0 {
                self.by_principal.remove(principal);
            }
        }
    }

    /// Counts a whole group's usage in.
    pub(crate) fn add_all(&mut self, group: &Usage) {
        self.records += group.records;
        self.bytes += group.bytes;
        self.hash.add_sum(&group.hash);
        for (principal, &(records, bytes)) in &group.by_principal {
            let entry = self.by_principal.entry(principal.clone()).or_insert((0, 0));
            entry.0 += records;
            entry.1 += bytes;
        }
    }

    /// Takes a whole group's usage out.
    fn subtract_all(&mut self, group: &Usage) {
        self.records = self.records.saturating_sub(group.records);
        self.bytes = self.bytes.saturating_sub(group.bytes);
        self.hash.subtract_sum(&group.hash);
        for (principal, &(records, bytes)) in &group.by_principal {
            self.count(principal, records, bytes);
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyStore {
    /// The records held (see the module doc): every live record while
    /// `outside` is false, else the changes since the last take.
    overlay: OrdMap<KeyId, Option<GroupedRecord>>,
    /// (group, id) of every record in the overlay (not of removals).
    by_group: OrdSet<(u64, KeyId)>,
    /// Live groups by start.
    groups: OrdMap<u64, GroupSummary>,
    /// The end of the newest group ever opened: a new group never starts
    /// before it, so groups never overlap, even across expiry and TTL
    /// changes.
    groups_floor_ms: u64,
    /// The sum of the live groups' usage.
    totals: Usage,
    /// Whether records may lie outside the overlay (changes were taken).
    outside: bool,
}

impl KeyStore {
    /// Live records.
    pub fn len(&self) -> u64 {
        self.totals.records
    }

    pub fn cached_bytes(&self) -> u64 {
        self.totals.bytes
    }

    /// (records, bytes) of `principal`'s keys.
    pub fn usage(&self, principal: &Principal) -> (u64, u64) {
        self.totals
            .by_principal
            .get(principal)
            .copied()
            .unwrap_or((0, 0))
    }

    /// The live groups, oldest first: (start, summary).
    pub(crate) fn groups(&self) -> impl Iterator<Item = (&u64, &GroupSummary)> {
        self.groups.iter()
    }

    /// The end of the live group starting at `start`, if it lives.
    pub(crate) fn group_end_ms(&self, start: u64) -> Option<u64> {
        self.groups.get(&start).map(|group| group.end_ms)
    }

    pub(crate) fn groups_floor_ms(&self) -> u64 {
        self.groups_floor_ms
    }

    /// The start of the oldest live group, or where the next group will
    /// start if none lives: records of older groups are expired.
    pub fn first_live_group_ms(&self) -> u64 {
        self.groups
            .get_min()
            .map_or(self.groups_floor_ms, |(start, _)| *start)
    }

    /// Whether records may lie outside the overlay.
    pub fn has_records_outside(&self) -> bool {
        self.outside
    }

    /// Whether the record of `id`, if any, must be fetched from outside.
    pub fn must_fetch(&self, id: &KeyId) -> bool {
        self.outside && !self.overlay.contains_key(id)
    }

    /// The live record of `id`: from the overlay, else from what was
    /// fetched.
    ///
    /// # Panics
    /// If records lie outside and `id`'s was neither held nor fetched: the
    /// adapter did not fetch what the registry named, and deciding without
    /// the record could execute a key twice.
    pub fn get<'a>(&'a self, id: &KeyId, fetched: &'a Prefetched) -> Option<&'a GroupedRecord> {
        let stored = match self.overlay.get(id) {
            Some(held) => held.as_ref(),
            None if !self.outside => None,
            None => fetched
                .records
                .get(id)
                .unwrap_or_else(|| panic!("key record {id:?} neither held nor fetched"))
                .as_ref(),
        };
        stored.filter(|stored| self.groups.contains_key(&stored.group_ms))
    }

    /// The changes held after `after`, in (principal, key) order: a record
    /// (possibly of an expired group) or a removal.
    pub fn changes_after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = (&'a KeyId, &'a Option<GroupedRecord>)> + 'a {
        self.overlay
            .range((Bound::Excluded(after.clone()), Bound::Unbounded))
    }

    /// Records and removals held (all live records while none lies
    /// outside).
    pub fn held(&self) -> usize {
        self.overlay.len()
    }

    /// Held live records in (principal, key) order.
    pub fn iter(&self) -> impl Iterator<Item = (&KeyId, &GroupedRecord)> {
        self.overlay
            .iter()
            .filter_map(|(id, stored)| Some((id, stored.as_ref()?)))
    }

    /// Held live records strictly after `after`, in (principal, key) order.
    pub fn after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = (&'a KeyId, &'a GroupedRecord)> + 'a {
        self.overlay
            .range((Bound::Excluded(after.clone()), Bound::Unbounded))
            .filter_map(|(id, stored)| Some((id, stored.as_ref()?)))
    }

    /// The group a record created at `created_ms` belongs in, opening it
    /// (`width_ms` wide, aligned to it, never before the floor) if the
    /// newest group has ended. Cluster time never goes back, so the newest
    /// group starts at or before `created_ms`.
    fn group_for(&mut self, created_ms: u64, width_ms: u64) -> u64 {
        if let Some((start, group)) = self.groups.get_max()
            && created_ms < group.end_ms
        {
            return *start;
        }
        let start = (created_ms - created_ms % width_ms).max(self.groups_floor_ms);
        let end_ms = start.saturating_add(width_ms);
        self.groups.insert(
            start,
            GroupSummary {
                end_ms,
                usage: Usage::default(),
            },
        );
        self.groups_floor_ms = end_ms;
        start
    }

    /// Records a key's first execution, in the group open at its creation
    /// time (groups `width_ms` wide are opened as needed). The caller
    /// checked that the key has no live record.
    pub fn insert(&mut self, id: KeyId, record: KeyRecord, width_ms: u64) {
        let group_ms = self.group_for(record.created_ms, width_ms);
        self.insert_into(id, GroupedRecord { group_ms, record });
    }

    fn insert_into(&mut self, id: KeyId, stored: GroupedRecord) {
        self.count_in(&id, stored.group_ms, &stored.record);
        self.by_group.insert((stored.group_ms, id.clone()));
        let previous = self.overlay.insert(id, Some(stored));
        debug_assert!(
            previous.is_none_or(|previous| previous.is_none()),
            "a key executed twice"
        );
    }

    /// Removes a key's live record; whether it had one.
    pub fn remove(&mut self, id: &KeyId, fetched: &Prefetched) -> bool {
        let Some(stored) = self.get(id, fetched).cloned() else {
            return false;
        };
        let counted = Counted::of(id, &stored.record);
        let group = self
            .groups
            .get_mut(&stored.group_ms)
            .expect("a live record's group");
        group.usage.subtract(&counted);
        self.totals.subtract(&counted);
        self.by_group.remove(&(stored.group_ms, id.clone()));
        if self.outside {
            self.overlay.insert(id.clone(), None);
        } else {
            self.overlay.remove(id);
        }
        true
    }

    /// Expires, oldest first, every group whose newest possible record is
    /// older than `ttl_ms` at `now_ms` (created at or before `now_ms -
    /// ttl_ms - 1`): its summary goes, and so do the records of it held
    /// here (those outside are expired where they lie). How many records
    /// went.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64) -> u64 {
        let mut expired = 0;
        while let Some(&(start, ref group)) = self.groups.get_min() {
            if group.end_ms.saturating_sub(1).saturating_add(ttl_ms) >= now_ms {
                break;
            }
            let group = self.groups.remove(&start).expect("the oldest group");
            self.totals.subtract_all(&group.usage);
            expired += group.usage.records;
            let from = (
                start,
                (Principal(String::new()), IdempotencyKey(Vec::new())),
            );
            let held: Vec<(u64, KeyId)> = self
                .by_group
                .range(from..)
                .take_while(|(group_ms, _)| *group_ms == start)
                .cloned()
                .collect();
            for entry in held {
                self.by_group.remove(&entry);
                // While records lie outside, kept as a removal: an entry
                // whose ids were fetched before this expiry (found held,
                // so not fetched) must still find the id held. Whatever
                // the store holds under it is of this group or an older
                // one: deleting it loses nothing live.
                if self.outside {
                    self.overlay.insert(entry.1, None);
                } else {
                    self.overlay.remove(&entry.1);
                }
            }
        }
        expired
    }

    /// The changes since the last take (every record, the first time):
    /// from now on records may lie outside, and the registry reads them
    /// from what the adapter fetches.
    pub fn take_changes(&mut self) -> KeyChanges {
        let complete = !self.outside;
        self.outside = true;
        self.by_group = OrdSet::new();
        KeyChanges {
            records: std::mem::take(&mut self.overlay),
            first_live_group_ms: self.first_live_group_ms(),
            complete,
        }
    }

    /// Restores the groups of a snapshot: (start, end) in start order,
    /// before any record. Whether they are disjoint, ordered and below the
    /// floor.
    pub(crate) fn restore_groups(
        &mut self,
        groups: &[(u64, u64)],
        floor_ms: u64,
    ) -> Result<(), &'static str> {
        let mut previous_end = 0;
        for &(start, end_ms) in groups {
            if start < previous_end || end_ms <= start || end_ms > floor_ms {
                return Err("idempotency key groups overlap or out of order");
            }
            previous_end = end_ms;
            self.groups.insert(
                start,
                GroupSummary {
                    end_ms,
                    usage: Usage::default(),
                },
            );
        }
        self.groups_floor_ms = floor_ms;
        Ok(())
    }

    /// Restores the groups of a snapshot with their summaries ((start,
    /// summary) in start order, before any record): the totals are their
    /// sums, and the records lie outside (a reader holds them only through
    /// [`KeyStore::hold_restored`]). Whether the groups are disjoint,
    /// ordered and below the floor.
    pub(crate) fn restore_summaries(
        &mut self,
        groups: Vec<(u64, GroupSummary)>,
        floor_ms: u64,
    ) -> Result<(), &'static str> {
        let intervals: Vec<(u64, u64)> = groups
            .iter()
            .map(|(start, group)| (*start, group.end_ms))
            .collect();
        self.restore_groups(&intervals, floor_ms)?;
        for (start, group) in groups {
            self.totals.add_all(&group.usage);
            self.groups.insert(start, group);
        }
        self.outside = true;
        Ok(())
    }

    /// Holds a record of a snapshot whose groups were restored with their
    /// summaries (it is counted there already).
    pub(crate) fn hold_restored(&mut self, id: KeyId, stored: GroupedRecord) {
        self.by_group.insert((stored.group_ms, id.clone()));
        self.overlay.insert(id, Some(stored));
    }

    /// Every record is held (a reader held each with
    /// [`KeyStore::hold_restored`]).
    pub(crate) fn mark_inside(&mut self) {
        self.outside = false;
    }

    /// The live group covering `created_ms` (its start), or why none does.
    pub(crate) fn group_covering(&self, created_ms: u64) -> Result<u64, &'static str> {
        let (&group_ms, group) = self
            .groups
            .range(..=created_ms)
            .next_back()
            .ok_or("an idempotency key record in no live group")?;
        if created_ms >= group.end_ms {
            return Err("an idempotency key record in no live group");
        }
        Ok(group_ms)
    }

    /// Restores a record of a snapshot into the restored group that covers
    /// its creation time.
    pub(crate) fn restore(&mut self, id: KeyId, record: KeyRecord) -> Result<(), &'static str> {
        let group_ms = self.restored_group(&record)?;
        self.insert_into(id, GroupedRecord { group_ms, record });
        Ok(())
    }

    /// Counts a record of a snapshot into the restored group that covers
    /// its creation time, without holding it (it lies in an adapter's
    /// store: see [`KeyStore::mark_outside`]).
    pub(crate) fn restore_counted(
        &mut self,
        id: &KeyId,
        record: &KeyRecord,
    ) -> Result<(), &'static str> {
        let group_ms = self.restored_group(record)?;
        self.count_in(id, group_ms, record);
        Ok(())
    }

    /// Counts a record into its (live) group's usage and the totals.
    fn count_in(&mut self, id: &KeyId, group_ms: u64, record: &KeyRecord) {
        let counted = Counted::of(id, record);
        self.groups
            .get_mut(&group_ms)
            .expect("a record counted into a live group")
            .usage
            .add(&counted);
        self.totals.add(&counted);
    }

    /// Records lie outside from now on (a restore that counts them only).
    pub(crate) fn mark_outside(&mut self) {
        self.outside = true;
    }

    fn restored_group(&self, record: &KeyRecord) -> Result<u64, &'static str> {
        self.group_covering(record.created_ms)
    }

    /// Groups are disjoint, ordered and live; their summaries add up to the
    /// totals; the overlay's records lie in their groups and the group
    /// index names exactly them; while no record lies outside, every
    /// group's summary is the sum of its held records.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut previous_end = 0;
        let mut totals = Usage::default();
        for (&start, group) in &self.groups {
            if start < previous_end || group.end_ms <= start {
                return Err("idempotency key groups overlap".to_owned());
            }
            previous_end = group.end_ms;
            totals.add_all(&group.usage);
        }
        if previous_end > self.groups_floor_ms {
            return Err("an idempotency key group beyond the floor".to_owned());
        }
        if totals != self.totals {
            return Err("key record totals disagree with the groups".to_owned());
        }
        let mut held: OrdMap<u64, Usage> = OrdMap::new();
        let mut indexed = 0;
        for (id, stored) in &self.overlay {
            let Some(stored) = stored else {
                if !self.outside {
                    return Err("a removal kept while no record lies outside".to_owned());
                }
                continue;
            };
            let Some(group) = self.groups.get(&stored.group_ms) else {
                return Err("a held key record of an expired group".to_owned());
            };
            if stored.record.created_ms < stored.group_ms
                || stored.record.created_ms >= group.end_ms
            {
                return Err("a key record outside its group's interval".to_owned());
            }
            if !self.by_group.contains(&(stored.group_ms, id.clone())) {
                return Err("a key record missing from the group index".to_owned());
            }
            indexed += 1;
            held.entry(stored.group_ms)
                .or_default()
                .add(&Counted::of(id, &stored.record));
        }
        if indexed != self.by_group.len() {
            return Err("the group index names records not held".to_owned());
        }
        if !self.outside {
            for (start, group) in &self.groups {
                let sum = held.get(start).cloned().unwrap_or_default();
                if sum != group.usage {
                    return Err(format!(
                        "key group {start}: summary disagrees with its records"
                    ));
                }
            }
        }
        Ok(())
    }
}
