//! Records grouped by the cluster time their TTL counts from (rules 18 and
//! 20; docs/state-beyond-ram.md §4.3), whatever the record: a generic store
//! of [`Grouped`] records so that expiry costs per group, not per record,
//! and the records may lie in an adapter's store outside the registry.
//! Idempotency keys ([`crate::KeyRecord`]) are its first kind.
//!
//! It owns those invariants and nothing else (the order of checks and the
//! limits live in the registry; a record's TTL base, size and hash are the
//! record type's):
//! - **groups**: every record belongs to the group open at its TTL base
//!   when it was inserted; groups are disjoint intervals of cluster time,
//!   opened in order, each `width_ms` wide when opened (see
//!   [`crate::key_group_width_ms`]). A group expires whole once its newest
//!   possible record is older than the TTL, so a record lives at least its
//!   TTL and less than its TTL plus one group's width;
//! - **summaries**: per group, the count, bytes, multiset hash and
//!   per-principal usage of its records, and their totals — what the limits
//!   check and the state hash covers, so neither walks the records;
//! - **the overlay**: the records it holds. Until an adapter first takes the
//!   changes ([`GroupStore::take_changes`]) that is every live record; after,
//!   the records changed since the last take (a removal kept as `None`, for
//!   the adapter's store to delete; a record whose group expired since is
//!   left in place, dead), and a record it does not hold must be handed to
//!   it, read from the adapter's store, as [`Fetched`]. A record whose
//!   group has expired is absent, wherever it still lies: every read
//!   checks the group.
//!
//! It does no IO: the adapter fetches what the registry names and stores
//! what it changed. Records are ordered by (principal, key), groups by start
//! time: expiry, paging and snapshots walk them in that fixed order (rule 10).

use super::snapshot::RecordsHash;
use super::types::{IdempotencyKey, Principal};
use imbl::{OrdMap, OrdSet};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::Bound;

/// Who owns a key and the key: the address of a record.
pub type KeyId = (Principal, IdempotencyKey);

/// A record a [`GroupStore`] can hold: where its TTL counts from, what it
/// is charged, and its hash for the state hash. The texts name the kind in
/// errors (a snapshot's or an invariant's).
pub trait Grouped: Clone + Debug + PartialEq + Eq {
    /// The kind, in error texts ("key", "claim").
    const NOUN: &'static str;
    /// A snapshot's groups overlap or come out of order.
    const GROUPS_OUT_OF_ORDER: &'static str;
    /// A snapshot's record falls in no live group.
    const IN_NO_LIVE_GROUP: &'static str;

    /// The cluster time the record's TTL counts from: the group it goes in.
    fn base_ms(&self) -> u64;
    /// The bytes charged against its kind's limit.
    fn size_bytes(&self, id: &KeyId) -> u64;
    /// Its hash in its kind's multiset hash.
    fn record_hash(&self, id: &KeyId) -> [u8; 32];
}

/// A record with the start of the creation-time group it belongs to: what
/// an adapter stores and hands back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupedRecord<R = crate::KeyRecord> {
    pub group_ms: u64,
    pub record: R,
}

/// Records of one kind an adapter read from its store for the entries about
/// to apply: for each id the registry named, the record stored under it or
/// `None`.
#[derive(Clone, Debug)]
pub struct Fetched<R> {
    records: BTreeMap<KeyId, Option<GroupedRecord<R>>>,
}

impl<R> Default for Fetched<R> {
    fn default() -> Fetched<R> {
        Fetched {
            records: BTreeMap::new(),
        }
    }
}

impl<R> Fetched<R> {
    /// Adds what the store holds under `id`.
    pub fn insert(&mut self, id: KeyId, stored: Option<GroupedRecord<R>>) {
        self.records.insert(id, stored);
    }
}

/// The record changes since the last take, for the adapter's store: a
/// record to write, or `None` to delete; the start of the oldest live
/// group (records of older groups are expired wherever they lie); and
/// whether they are every live record (the first take: whatever a store
/// held before is not of this state and must be replaced, not updated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changes<R = crate::KeyRecord> {
    pub records: OrdMap<KeyId, Option<GroupedRecord<R>>>,
    pub first_live_group_ms: u64,
    pub complete: bool,
}

impl<R: Clone> Default for Changes<R> {
    fn default() -> Changes<R> {
        Changes {
            records: OrdMap::new(),
            first_live_group_ms: 0,
            complete: false,
        }
    }
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
    pub(crate) fn of<R: Grouped>(id: &'a KeyId, record: &R) -> Counted<'a> {
        Counted::hashed(id, record, record.record_hash(id))
    }

    /// A record whose hash is known (a snapshot reader hashes the bytes it
    /// read instead of encoding the record again).
    pub(crate) fn hashed<R: Grouped>(id: &'a KeyId, record: &R, hash: [u8; 32]) -> Counted<'a> {
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

/// What the records of a snapshot add up to, group by group, as a reader
/// counts them in — to be checked against the groups' summaries once the
/// last is read ([`GroupTally::agrees_with`]). Built for a stream of
/// millions of records: a record's group is found by a binary search over
/// the groups' bounds (not an ordered map's range per record), and its
/// principal is counted without a map: records come in id order, so within
/// a group their principals come sorted, each the last one counted there
/// or a new one (records out of order count a principal twice, which
/// disagrees with any summary; the reader refuses them first anyway).
pub(crate) struct GroupTally<R> {
    /// The live groups' starts, in order, and their ends.
    starts: Vec<u64>,
    ends: Vec<u64>,
    tallies: Vec<Tally>,
    kind: std::marker::PhantomData<R>,
}

/// One group's count so far (a [`Usage`] whose principals are a sorted
/// list, appended to).
#[derive(Default)]
struct Tally {
    records: u64,
    bytes: u64,
    hash: RecordsHash,
    by_principal: Vec<(Principal, u64, u64)>,
}

impl<R: Grouped> GroupTally<R> {
    /// Nothing counted yet into `store`'s live groups.
    pub(crate) fn of(store: &GroupStore<R>) -> Self {
        let (starts, ends) = store
            .groups()
            .map(|(start, group)| (*start, group.end_ms))
            .unzip::<_, _, Vec<_>, Vec<_>>();
        let tallies = std::iter::repeat_with(Tally::default)
            .take(starts.len())
            .collect();
        GroupTally {
            starts,
            ends,
            tallies,
            kind: std::marker::PhantomData,
        }
    }

    /// Counts `record` into the live group covering `base_ms` and returns
    /// that group's start (as [`GroupStore::group_covering`] finds it), or
    /// why none covers it.
    pub(crate) fn count(
        &mut self,
        base_ms: u64,
        record: &Counted<'_>,
    ) -> Result<u64, &'static str> {
        let after = self.starts.partition_point(|start| *start <= base_ms);
        let index = after.checked_sub(1).ok_or(R::IN_NO_LIVE_GROUP)?;
        if base_ms >= self.ends[index] {
            return Err(R::IN_NO_LIVE_GROUP);
        }
        let tally = &mut self.tallies[index];
        tally.records += 1;
        tally.bytes += record.size;
        tally.hash.add(&record.hash);
        match tally.by_principal.last_mut() {
            Some((principal, records, bytes)) if principal == record.principal => {
                *records += 1;
                *bytes += record.size;
            }
            _ => tally
                .by_principal
                .push((record.principal.clone(), 1, record.size)),
        }
        Ok(self.starts[index])
    }

    /// Takes back the record counted last into the group starting at
    /// `group_ms` ([`GroupTally::count`] returned it): a record an
    /// extension's receiver already holds.
    pub(crate) fn uncount_last(&mut self, group_ms: u64, record: &Counted<'_>) {
        let Ok(index) = self.starts.binary_search(&group_ms) else {
            return;
        };
        let tally = &mut self.tallies[index];
        tally.records -= 1;
        tally.bytes -= record.size;
        tally.hash.subtract(&record.hash);
        if let Some((principal, records, bytes)) = tally.by_principal.last_mut()
            && principal == record.principal
        {
            *records -= 1;
            *bytes -= record.size;
            if *records == 0 {
                tally.by_principal.pop();
            }
        }
    }

    /// Whether every live group of `store` (the one this tally was made
    /// of) holds exactly `base`'s group of the same interval (if any) and
    /// what was counted into it, and every group of `base` that `store`
    /// lacks is expired by it: the receiver of an extension
    /// (crate::extension) then holds `store`'s records once it adds those
    /// counted to its base's. Per-principal usage is not compared: a base
    /// does not carry it, and the multiset hash covers each record's
    /// principal.
    pub(crate) fn extends(
        &self,
        store: &GroupStore<R>,
        base: &BTreeMap<u64, crate::extension::GroupDigest>,
    ) -> bool {
        let first_live_ms = store.first_live_group_ms();
        let lacked_expired = base
            .keys()
            .all(|start| *start < first_live_ms || store.groups.contains_key(start));
        lacked_expired
            && store.groups.len() == self.tallies.len()
            && store
                .groups()
                .zip(self.starts.iter().zip(&self.tallies))
                .all(|((start, group), (counted_start, tally))| {
                    let usage = &group.usage;
                    let (mut records, mut bytes, mut hash) =
                        (tally.records, tally.bytes, tally.hash);
                    if let Some(held) = base.get(start) {
                        if held.end_ms != group.end_ms {
                            return false;
                        }
                        records = records.saturating_add(held.records);
                        bytes = bytes.saturating_add(held.bytes);
                        hash.add_sum(&crate::extension::digest_hash(held));
                    }
                    start == counted_start
                        && usage.records == records
                        && usage.bytes == bytes
                        && usage.hash == hash
                })
    }

    /// Whether every live group of `store` (the one this tally was made
    /// of) holds exactly what was counted into it.
    pub(crate) fn agrees_with(&self, store: &GroupStore<R>) -> bool {
        store.groups.len() == self.tallies.len()
            && store
                .groups()
                .zip(self.starts.iter().zip(&self.tallies))
                .all(|((start, group), (counted_start, tally))| {
                    let usage = &group.usage;
                    start == counted_start
                        && usage.records == tally.records
                        && usage.bytes == tally.bytes
                        && usage.hash == tally.hash
                        && usage.by_principal.len() == tally.by_principal.len()
                        && usage.by_principal.iter().zip(&tally.by_principal).all(
                            |((principal, counts), (counted, records, bytes))| {
                                principal == counted && *counts == (*records, *bytes)
                            },
                        )
                })
    }
}

/// The grouped records of one kind: see the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupStore<R: Grouped> {
    /// The records held (see the module doc): every live record while
    /// `outside` is false, else the changes since the last take.
    overlay: OrdMap<KeyId, Option<GroupedRecord<R>>>,
    /// (group, id) of every record in the overlay (not of removals) while
    /// no record lies outside: what expiry takes out of the overlay. Empty
    /// once records lie outside: the overlay then holds only the changes
    /// since the last take, a record of an expired group in it is dead
    /// where it lies (every read checks the group) and goes with the next
    /// take, so neither a record's insert nor a group's expiry pays for an
    /// index (an ordered-set insert of a cold key per record written).
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

impl<R: Grouped> Default for GroupStore<R> {
    fn default() -> GroupStore<R> {
        GroupStore {
            overlay: OrdMap::new(),
            by_group: OrdSet::new(),
            groups: OrdMap::new(),
            groups_floor_ms: 0,
            totals: Usage::default(),
            outside: false,
        }
    }
}

impl<R: Grouped> GroupStore<R> {
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
    pub fn get<'a>(&'a self, id: &KeyId, fetched: &'a Fetched<R>) -> Option<&'a GroupedRecord<R>> {
        let stored = match self.overlay.get(id) {
            Some(held) => held.as_ref(),
            None if !self.outside => None,
            None => fetched
                .records
                .get(id)
                .unwrap_or_else(|| panic!("{} record {id:?} neither held nor fetched", R::NOUN))
                .as_ref(),
        };
        stored.and_then(|stored| self.live(stored))
    }

    /// The changes held after `after`, in (principal, key) order: a record
    /// (possibly of an expired group) or a removal.
    pub fn changes_after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = (&'a KeyId, &'a Option<GroupedRecord<R>>)> + 'a {
        self.overlay
            .range((Bound::Excluded(after.clone()), Bound::Unbounded))
    }

    /// Records and removals held (all live records while none lies
    /// outside).
    pub fn held(&self) -> usize {
        self.overlay.len()
    }

    /// Held live records in (principal, key) order.
    pub fn iter(&self) -> impl Iterator<Item = (&KeyId, &GroupedRecord<R>)> {
        self.overlay
            .iter()
            .filter_map(|(id, stored)| Some((id, self.live(stored.as_ref()?)?)))
    }

    /// `stored` if its group lives (a record of an expired group may stay
    /// in the overlay while records lie outside: see `by_group`).
    fn live<'a>(&self, stored: &'a GroupedRecord<R>) -> Option<&'a GroupedRecord<R>> {
        self.groups.contains_key(&stored.group_ms).then_some(stored)
    }

    /// Whether `previous`, what the overlay held under an id, is no live
    /// record: nothing, a removal, or — only while records lie outside —
    /// a record of an expired group.
    fn is_dead(&self, previous: Option<&Option<GroupedRecord<R>>>) -> bool {
        previous.is_none_or(|previous| {
            previous
                .as_ref()
                .is_none_or(|p| self.outside && self.live(p).is_none())
        })
    }

    /// Held live records strictly after `after`, in (principal, key) order.
    pub fn after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = (&'a KeyId, &'a GroupedRecord<R>)> + 'a {
        self.overlay
            .range((Bound::Excluded(after.clone()), Bound::Unbounded))
            .filter_map(|(id, stored)| Some((id, self.live(stored.as_ref()?)?)))
    }

    /// The group a record based at `base_ms` belongs in, opening it
    /// (`width_ms` wide, aligned to it, never before the floor) if the
    /// newest group has ended. Bases are cluster times of the apply that
    /// inserts, which never go back, so the newest group starts at or
    /// before `base_ms`.
    fn group_for(&mut self, base_ms: u64, width_ms: u64) -> u64 {
        if let Some((start, group)) = self.groups.get_max()
            && base_ms < group.end_ms
        {
            return *start;
        }
        let start = (base_ms - base_ms % width_ms).max(self.groups_floor_ms);
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

    /// Ends the newest group at `now_ms` (its end becomes `now_ms + 1`: a
    /// record based at `now_ms` may lie in it already) if it is open past
    /// that, so that the next record opens a group of the width then in
    /// force (a TTL change, rules version 4). The floor comes back with it:
    /// the newest group is the newest ever opened, so nothing reached past
    /// it. Records keep their groups; the state hash covers the interval.
    pub fn end_open_group(&mut self, now_ms: u64) {
        let end_ms = now_ms.saturating_add(1);
        let Some(&(start, ref group)) = self.groups.get_max() else {
            return;
        };
        if group.end_ms <= end_ms || start > now_ms || group.end_ms != self.groups_floor_ms {
            return;
        }
        if let Some(group) = self.groups.get_mut(&start) {
            group.end_ms = end_ms;
            self.groups_floor_ms = end_ms;
        }
    }

    /// Inserts a record in the group open at its TTL base (groups
    /// `width_ms` wide are opened as needed). The caller checked that the id
    /// has no live record.
    pub fn insert(&mut self, id: KeyId, record: R, width_ms: u64) {
        let group_ms = self.group_for(record.base_ms(), width_ms);
        self.insert_into(id, GroupedRecord { group_ms, record });
    }

    fn insert_into(&mut self, id: KeyId, stored: GroupedRecord<R>) {
        self.count_in(&id, stored.group_ms, &stored.record);
        if !self.outside {
            self.by_group.insert((stored.group_ms, id.clone()));
        }
        let previous = self.overlay.insert(id, Some(stored));
        debug_assert!(
            self.is_dead(previous.as_ref()),
            "a record inserted over a live one"
        );
    }

    /// Removes an id's live record; whether it had one.
    pub fn remove(&mut self, id: &KeyId, fetched: &Fetched<R>) -> bool {
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
        if self.outside {
            self.overlay.insert(id.clone(), None);
        } else {
            self.by_group.remove(&(stored.group_ms, id.clone()));
            self.overlay.remove(id);
        }
        true
    }

    /// Notes that `id` has no live record, while records lie outside: for a
    /// record that left by another way than this store (a held claim
    /// expiring or forgotten in memory: see `Registry::expire_claims`), so
    /// that a lookup finds it gone rather than unfetched. The caller knows
    /// this store holds no live record of `id`.
    pub fn mark_removed(&mut self, id: &KeyId) {
        if self.outside {
            let previous = self.overlay.insert(id.clone(), None);
            debug_assert!(
                self.is_dead(previous.as_ref()),
                "a live record marked removed"
            );
        }
    }

    /// Expires, oldest first, every group whose newest possible record is
    /// older than `ttl_ms` at `now_ms` (created at or before `now_ms -
    /// ttl_ms - 1`): its summary goes, and while no record lies outside so
    /// do the records of it held here; once records lie outside, those of
    /// it in the overlay are dead where they lie (see `by_group`), as are
    /// those in the adapter's store. How many records went.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64) -> u64 {
        let mut expired = 0;
        while let Some(&(start, ref group)) = self.groups.get_min() {
            if group.end_ms.saturating_sub(1).saturating_add(ttl_ms) >= now_ms {
                break;
            }
            let group = self.groups.remove(&start).expect("the oldest group");
            self.totals.subtract_all(&group.usage);
            expired += group.usage.records;
            if self.outside {
                continue;
            }
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
                self.overlay.remove(&entry.1);
            }
        }
        expired
    }

    /// The changes since the last take (every record, the first time):
    /// from now on records may lie outside, and the registry reads them
    /// from what the adapter fetches.
    pub fn take_changes(&mut self) -> Changes<R> {
        let complete = !self.outside;
        self.outside = true;
        self.by_group = OrdSet::new();
        Changes {
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
                return Err(R::GROUPS_OUT_OF_ORDER);
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
    /// [`GroupStore::hold_restored`]). Whether the groups are disjoint,
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
    pub(crate) fn hold_restored(&mut self, id: KeyId, stored: GroupedRecord<R>) {
        self.by_group.insert((stored.group_ms, id.clone()));
        self.overlay.insert(id, Some(stored));
    }

    /// Every record is held (a reader held each with
    /// [`GroupStore::hold_restored`]).
    pub(crate) fn mark_inside(&mut self) {
        self.outside = false;
    }

    /// The live group covering `base_ms` (its start), or why none does.
    pub(crate) fn group_covering(&self, base_ms: u64) -> Result<u64, &'static str> {
        let (&group_ms, group) = self
            .groups
            .range(..=base_ms)
            .next_back()
            .ok_or(R::IN_NO_LIVE_GROUP)?;
        if base_ms >= group.end_ms {
            return Err(R::IN_NO_LIVE_GROUP);
        }
        Ok(group_ms)
    }

    /// Restores a record of a snapshot into the restored group that covers
    /// its TTL base.
    pub(crate) fn restore(&mut self, id: KeyId, record: R) -> Result<(), &'static str> {
        let group_ms = self.restored_group(&record)?;
        self.insert_into(id, GroupedRecord { group_ms, record });
        Ok(())
    }

    /// Counts a record of a snapshot into the restored group that covers
    /// its TTL base, without holding it (it lies in an adapter's store: see
    /// [`GroupStore::mark_outside`]).
    pub(crate) fn restore_counted(&mut self, id: &KeyId, record: &R) -> Result<(), &'static str> {
        let group_ms = self.restored_group(record)?;
        self.count_in(id, group_ms, record);
        Ok(())
    }

    /// Counts a record into its (live) group's usage and the totals.
    fn count_in(&mut self, id: &KeyId, group_ms: u64, record: &R) {
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

    fn restored_group(&self, record: &R) -> Result<u64, &'static str> {
        self.group_covering(record.base_ms())
    }

    /// Groups are disjoint, ordered and live; their summaries add up to the
    /// totals; the overlay's records of live groups lie in their groups'
    /// intervals; while no record lies outside, the overlay holds no
    /// record of an expired group, the group index names exactly its
    /// records, and every group's summary is the sum of its held records
    /// (once records lie outside the index is empty).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut previous_end = 0;
        let mut totals = Usage::default();
        for (&start, group) in &self.groups {
            if start < previous_end || group.end_ms <= start {
                return Err(format!("{} groups overlap", R::NOUN));
            }
            previous_end = group.end_ms;
            totals.add_all(&group.usage);
        }
        if previous_end > self.groups_floor_ms {
            return Err(format!("a {} group beyond the floor", R::NOUN));
        }
        if totals != self.totals {
            return Err(format!(
                "{} record totals disagree with the groups",
                R::NOUN
            ));
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
                if self.outside {
                    // Dead where it lies; goes with the next take.
                    continue;
                }
                return Err(format!("a held {} record of an expired group", R::NOUN));
            };
            let base_ms = stored.record.base_ms();
            if base_ms < stored.group_ms || base_ms >= group.end_ms {
                return Err(format!("a {} record outside its group's interval", R::NOUN));
            }
            if !self.outside {
                if !self.by_group.contains(&(stored.group_ms, id.clone())) {
                    return Err(format!("a {} record missing from the group index", R::NOUN));
                }
                indexed += 1;
            }
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
                        "{} group {start}: summary disagrees with its records",
                        R::NOUN
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::{KeyRecord, KeyStore};
    use crate::session::CachedResponse;
    use crate::types::{CommandResult, Fingerprint};

    fn id(principal: &str, key: &str) -> KeyId {
        (
            Principal(principal.into()),
            IdempotencyKey(key.as_bytes().to_vec()),
        )
    }

    fn record(created_ms: u64) -> KeyRecord {
        KeyRecord {
            created_ms,
            response: CachedResponse {
                fingerprint: Fingerprint(created_ms.into()),
                result: Ok(CommandResult::Stored),
            },
        }
    }

    /// Records in groups [0, 100), [100, 200) and (after a gap) [300, 400).
    fn store() -> (KeyStore, Vec<(KeyId, KeyRecord)>) {
        let records = vec![
            (id("alice", "a"), record(10)),
            (id("alice", "b"), record(150)),
            (id("bob", "c"), record(20)),
            (id("bob", "d"), record(30)),
            (id("carol", "f"), record(40)),
            (id("carol", "e"), record(399)),
        ];
        // Inserted as the cluster's time goes: each in the group open then.
        let mut by_time = records.clone();
        by_time.sort_by_key(|(_, record)| record.created_ms);
        let mut store = KeyStore::default();
        for (id, record) in by_time {
            store.insert(id, record, 100);
        }
        (store, records)
    }

    /// A snapshot reader's tally finds each record's group as the store
    /// does — the bounds included, a time in a gap or past the last group
    /// in none — and agrees with the summaries exactly when the records
    /// add up to them, principal by principal.
    #[test]
    fn a_tally_finds_the_store_s_groups_and_agrees_only_with_their_exact_sums() {
        let (store, records) = store();
        let starts: Vec<u64> = store.groups().map(|(start, _)| *start).collect();
        assert_eq!(starts, [0, 100, 300], "the groups as built");
        let mut tally = GroupTally::<KeyRecord>::of(&store);
        for base_ms in [0, 99, 100, 199, 300, 399, 200, 250, 299, 400, u64::MAX] {
            let counted = (id("x", "y"), record(base_ms));
            let counting = Counted::of(&counted.0, &counted.1);
            assert_eq!(
                GroupTally::<KeyRecord>::of(&store).count(base_ms, &counting),
                store.group_covering(base_ms),
                "at {base_ms}"
            );
        }
        assert!(!tally.agrees_with(&store), "nothing counted yet");
        for (id, record) in &records {
            let group = tally.count(record.created_ms, &Counted::of(id, record));
            assert_eq!(group, store.group_covering(record.created_ms));
        }
        assert!(tally.agrees_with(&store));

        // The same records, one of them under another principal: every
        // group's count and bytes agree (the names are as long), not its
        // split by principal nor its hash.
        let mut tally = GroupTally::<KeyRecord>::of(&store);
        for (n, (id, record)) in records.iter().enumerate() {
            let id = if n == 2 {
                self::id("dan", "c")
            } else {
                id.clone()
            };
            tally
                .count(record.created_ms, &Counted::of(&id, record))
                .unwrap();
        }
        assert!(!tally.agrees_with(&store));

        // Summaries whose count, bytes and hash agree but whose split by
        // principal does not (as a crafted snapshot's may): one of bob's
        // two records counted as alice's, carol's as they are.
        let mut crafted = store.clone();
        let (start, mut group) = crafted.groups.get_min().cloned().expect("a group");
        let by_principal = &mut group.usage.by_principal;
        let bob = by_principal.get_mut(&Principal("bob".into())).unwrap();
        let one = bob.1 / 2;
        *bob = (1, bob.1 - one);
        let alice = by_principal.get_mut(&Principal("alice".into())).unwrap();
        *alice = (alice.0 + 1, alice.1 + one);
        crafted.groups.insert(start, group);
        let mut tally = GroupTally::<KeyRecord>::of(&crafted);
        for (id, record) in &records {
            tally
                .count(record.created_ms, &Counted::of(id, record))
                .unwrap();
        }
        assert!(!tally.agrees_with(&crafted));

        // One record short, or one twice.
        let mut tally = GroupTally::<KeyRecord>::of(&store);
        for (id, record) in &records[1..] {
            tally
                .count(record.created_ms, &Counted::of(id, record))
                .unwrap();
        }
        assert!(!tally.agrees_with(&store));
        let (id, record) = &records[0];
        tally
            .count(record.created_ms, &Counted::of(id, record))
            .unwrap();
        tally
            .count(record.created_ms, &Counted::of(id, record))
            .unwrap();
        assert!(!tally.agrees_with(&store));
    }
}
