//! The records of claims (rule 20): for each (principal, key), who holds it
//! (the holder's claim id, its fencing token and lease deadline in cluster
//! time), or that its holder released it, or the result its holder
//! completed it with; an index of the records by the cluster time their
//! TTL counts from, for expiry; and the bookkeeping of their size. It owns
//! those invariants (the index, the byte count and the records' multiset hash
//! always match the records)
//! and the state transitions of one record; it does not decide the order
//! of checks, the limits or the cluster's clock — the registry does.
//!
//! Records are ordered by (principal, key), the index by (TTL base,
//! principal, key): expiry, paging and snapshots walk them in that fixed
//! order (rule 10); the state hash takes their multiset hash instead.
//!
//! The second half is the registry's side of claims: the order of checks
//! of the four claim requests, identical on every replica.
//!
//! `Claim(key, fingerprint, lease_ms, claim_id)`:
//! 1. as every request: advance cluster time, expire idle sessions, keys
//!    and claim records past their TTL; the cluster id must match;
//! 2. an empty key → `INVALID_ARGUMENT`; a key longer than
//!    `claim_key_bytes_max` → `LIMIT_EXCEEDED`; a lease outside
//!    `1..=lease_ms_max` → `INVALID_ARGUMENT` (all final, nothing recorded);
//! 3. (principal, key) has a record with another fingerprint →
//!    `KEY_CONFLICT` (final, record untouched);
//! 4. completed → the recorded result, byte for byte; held by this very
//!    claim (same claim id) → its own win again, same fence (a retry after a
//!    lost reply); held by another whose lease deadline is still ahead in
//!    cluster time → in progress, with the time its lease has left;
//! 5. no record: capacity (`claims_max`, `claim_cached_bytes_max`) →
//!    `RESOURCE_EXHAUSTED` (this attempt; nothing is evicted);
//! 6. won: a new fence, larger than every fence issued before (the larger
//!    of the entry's log index and one past the last fence), the attempt
//!    one past the record's (1 without one), the lease deadline `lease_ms`
//!    after the cluster time. A takeover (a released key, or a lease that
//!    ran out) is a win like any other: the old fence is fenced from now on.
//!
//! `CompleteClaim(key, fence, result)`, `ReleaseClaim(key, fence)`,
//! `ExtendClaim(key, fence, lease_ms)`: after steps 1–2 (the result against
//! `claim_result_bytes_max`, the lease against `lease_ms_max`), the record
//! must name `fence` as its holder — a lease that ran out with no takeover
//! still counts — else `FENCED` (final for that holder). A retry is
//! answered from the record: a complete of the fence that completed gets
//! the recorded completion (`duplicate`), a release of the fence that
//! released gets `duplicate`. Complete charges the result's bytes
//! (`RESOURCE_EXHAUSTED` past `claim_cached_bytes_max`); extend never
//! moves a deadline earlier.

use super::Registry;
use super::grouped::{GroupStore, Grouped, GroupedRecord};
use super::keyed::{KeyId, Prefetched, key_group_width_ms};
use super::snapshot::{RecordsHash, claim_record_hash};
use super::types::{
    Claim, ClaimAnswer, ClaimConfig, ClusterId, Fingerprint, IdempotencyKey, InvalidArgument,
    Limit, LimitExceeded, Nonce, Outcome, Principal, Rejection, claim_record_size_bytes,
};
use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};
use std::ops::Bound;

/// Where a claimed key stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// A holder performs the effect. Its lease runs out at
    /// `lease_deadline_ms` of cluster time; until a later claim takes over,
    /// the holder may still extend, complete or release.
    Held {
        /// The claim id of the holder's `Claim`: a retry of that claim is
        /// answered with the same fence.
        holder: Nonce,
        lease_deadline_ms: u64,
    },
    /// The holder gave up: the effect did not happen. The next claim wins
    /// at once.
    Released { released_ms: u64 },
    /// The holder recorded the effect's result; every later claim replays
    /// it.
    Completed {
        completed_ms: u64,
        #[serde(with = "crate::codec::bytes")]
        result: Vec<u8>,
    },
}

/// One key's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// The fingerprint of the first claim: another one is `KEY_CONFLICT`
    /// for the record's whole life.
    pub fingerprint: Fingerprint,
    /// The fencing token of the current (or last) holder.
    pub fence: u64,
    /// How many holders the key has had, the current one included.
    pub attempt: u64,
    pub state: ClaimState,
}

impl ClaimRecord {
    /// The cluster time the record's TTL counts from: the lease deadline of
    /// a held key (a dead holder's key goes a TTL after its lease), the
    /// release, or the completion.
    pub fn ttl_base_ms(&self) -> u64 {
        match &self.state {
            ClaimState::Held {
                lease_deadline_ms, ..
            } => *lease_deadline_ms,
            ClaimState::Released { released_ms } => *released_ms,
            ClaimState::Completed { completed_ms, .. } => *completed_ms,
        }
    }

    /// The result bytes a completed record keeps (0 otherwise).
    pub fn result_bytes(&self) -> u64 {
        match &self.state {
            ClaimState::Completed { result, .. } => result.len() as u64,
            _ => 0,
        }
    }

    /// The size charged against `claim_cached_bytes_max`.
    pub fn size_bytes(&self, id: &KeyId) -> u64 {
        claim_record_size_bytes(&id.0, &id.1, self.result_bytes())
    }

    /// Whether a holder holds the key now (its lease may have run out).
    pub fn is_held(&self) -> bool {
        matches!(self.state, ClaimState::Held { .. })
    }
}

/// From rules version 3, finished (completed or released) claim records lie
/// in groups by the cluster time their TTL counts from, as key records do.
impl Grouped for ClaimRecord {
    const NOUN: &'static str = "claim";
    const GROUPS_OUT_OF_ORDER: &'static str = "claim groups overlap or out of order";
    const IN_NO_LIVE_GROUP: &'static str = "a finished claim record in no live group";

    fn base_ms(&self) -> u64 {
        self.ttl_base_ms()
    }

    fn size_bytes(&self, id: &KeyId) -> u64 {
        ClaimRecord::size_bytes(self, id)
    }

    fn record_hash(&self, id: &KeyId) -> [u8; 32] {
        claim_record_hash(id, self)
    }
}

/// Where a claim's live record lies (see [`Registry::claim_lookup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lies {
    /// Among the held records in memory (every record before rules
    /// version 3; a held one from it).
    InMemory,
    /// Among the finished records in groups (rules version 3).
    Finished,
    /// Nowhere: the key has no live record.
    Nowhere,
}

/// The finished claim records of rules version 3 (see [`GroupStore`]).
pub(crate) type ClaimGroups = GroupStore<ClaimRecord>;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClaimStore {
    records: OrdMap<KeyId, ClaimRecord>,
    /// (TTL base, principal, key) of every record, oldest first.
    by_age: OrdSet<(u64, KeyId)>,
    /// Sum of `size_bytes` over the records.
    cached_bytes: u64,
    /// Records in the `Held` state.
    held: u64,
    /// Per principal: (records, bytes) — what its quota counts (rule 21).
    by_principal: OrdMap<Principal, (u64, u64)>,
    /// The records' multiset hash (the state hash's part for them).
    hash: RecordsHash,
}

impl ClaimStore {
    /// The multiset hash of the records.
    pub(crate) fn records_hash(&self) -> RecordsHash {
        self.hash
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// Records whose key is held now (their lease may have run out).
    pub fn held(&self) -> u64 {
        self.held
    }

    /// (records, bytes) of `principal`'s claims.
    pub fn usage(&self, principal: &Principal) -> (u64, u64) {
        self.by_principal.get(principal).copied().unwrap_or((0, 0))
    }

    fn count(&mut self, principal: &Principal, records: i64, bytes: i64) {
        let (count, size) = self.usage(principal);
        let count = count.saturating_add_signed(records);
        let size = size.saturating_add_signed(bytes);
        if count == 0 {
            self.by_principal.remove(principal);
        } else {
            self.by_principal.insert(principal.clone(), (count, size));
        }
    }

    pub fn get(&self, id: &KeyId) -> Option<&ClaimRecord> {
        self.records.get(id)
    }

    pub fn contains(&self, id: &KeyId) -> bool {
        self.records.contains_key(id)
    }

    /// Every record in (principal, key) order.
    pub fn iter(&self) -> impl Iterator<Item = (&KeyId, &ClaimRecord)> {
        self.records.iter()
    }

    /// The greatest (principal, key) with a record.
    pub fn last_id(&self) -> Option<&KeyId> {
        self.records.get_max().map(|(id, _)| id)
    }

    /// Records strictly after `after`, in (principal, key) order.
    pub fn after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = (&'a KeyId, &'a ClaimRecord)> + 'a {
        self.records
            .range((Bound::Excluded(after.clone()), Bound::Unbounded))
    }

    /// Sets the record of `id`, replacing any it had.
    /// Sets the record of `id`, replacing any it had. One walk of the
    /// records; the age index moves only when the TTL base does (a claim
    /// or complete on the apply path, where a remove and a reinsert walked
    /// the trees twice as often).
    pub fn put(&mut self, id: KeyId, record: ClaimRecord) {
        let size = record.size_bytes(&id);
        let base = record.ttl_base_ms();
        let held = matches!(record.state, ClaimState::Held { .. });
        self.hash.add(&claim_record_hash(&id, &record));
        match self.records.insert(id.clone(), record) {
            Some(old) => {
                self.forget_accounting(&id, &old);
                if old.ttl_base_ms() != base {
                    let aged = self.by_age.remove(&(old.ttl_base_ms(), id.clone()));
                    assert!(aged.is_some(), "a claim record missing from the age index");
                    self.by_age.insert((base, id.clone()));
                }
            }
            None => {
                self.by_age.insert((base, id.clone()));
            }
        }
        self.cached_bytes += size;
        self.count(&id.0, 1, size as i64);
        self.held += u64::from(held);
    }

    /// Removes a key's record; whether it had one.
    pub fn remove(&mut self, id: &KeyId) -> bool {
        let Some(record) = self.records.remove(id) else {
            return false;
        };
        self.forget_accounting(id, &record);
        let aged = self.by_age.remove(&(record.ttl_base_ms(), id.clone()));
        assert!(aged.is_some(), "a claim record missing from the age index");
        true
    }

    fn forget_accounting(&mut self, id: &KeyId, record: &ClaimRecord) {
        self.hash.subtract(&claim_record_hash(id, record));
        self.cached_bytes -= record.size_bytes(id);
        self.count(&id.0, -1, -(record.size_bytes(id) as i64));
        if matches!(record.state, ClaimState::Held { .. }) {
            self.held -= 1;
        }
    }

    /// Removes, oldest first, every record whose TTL base is more than
    /// `ttl_ms` before `now_ms`; how many went. A held record's base is
    /// its lease deadline, so a live lease never expires here.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64, mut expired: impl FnMut(&KeyId)) {
        while let Some(oldest) = self.by_age.get_min().cloned() {
            if now_ms.saturating_sub(oldest.0) <= ttl_ms {
                break;
            }
            self.by_age.remove(&oldest);
            let record = self.records.remove(&oldest.1);
            let record = record.expect("a claim in the age index without a record");
            self.forget_accounting(&oldest.1, &record);
            expired(&oldest.1);
        }
    }

    /// The age index names exactly the records with their TTL bases, and
    /// the byte and held counts are those of the records.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.by_age.len() != self.records.len() {
            return Err(format!(
                "{} claim records, {} in the age index",
                self.records.len(),
                self.by_age.len()
            ));
        }
        let mut sum = 0u64;
        let mut held = 0u64;
        let mut hash = RecordsHash::default();
        for (id, record) in &self.records {
            if !self.by_age.contains(&(record.ttl_base_ms(), id.clone())) {
                return Err("a claim record missing from the age index".to_owned());
            }
            hash.add(&claim_record_hash(id, record));
            if record.attempt == 0 || record.fence == 0 {
                return Err("a claim record without a holder".to_owned());
            }
            sum += record.size_bytes(id);
            held += u64::from(matches!(record.state, ClaimState::Held { .. }));
        }
        if hash != self.hash {
            return Err("the claim records' hash disagrees with the records".to_owned());
        }
        if sum != self.cached_bytes || held != self.held {
            return Err(format!(
                "claim bytes {} and held {} but records sum to {sum} and {held}",
                self.cached_bytes, self.held
            ));
        }
        let mut usage: OrdMap<Principal, (u64, u64)> = OrdMap::new();
        for (id, record) in &self.records {
            let entry = usage.entry(id.0.clone()).or_insert((0, 0));
            entry.0 += 1;
            entry.1 += record.size_bytes(id);
        }
        if usage != self.by_principal {
            return Err("per-principal claim usage disagrees with the records".to_owned());
        }
        Ok(())
    }
}

/// A read-only view of one claim record, for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    pub principal: Principal,
    pub key: IdempotencyKey,
    pub record: ClaimRecord,
    /// Cluster time after which the record expires under the TTL in force.
    pub expires_after_ms: u64,
    /// Bytes charged against `claim_cached_bytes_max`.
    pub size_bytes: u64,
}

impl Registry {
    /// The TTL and limits of claims in force.
    pub fn claim_config(&self) -> &ClaimConfig {
        &self.claim_config
    }

    /// Live claim records, all principals (held and finished).
    pub fn claim_count(&self) -> usize {
        self.claims
            .len()
            .saturating_add(usize::try_from(self.finished_claims.len()).unwrap_or(usize::MAX))
    }

    /// Claim records whose key is held now (their leases may have run out).
    pub fn claims_held(&self) -> u64 {
        self.claims.held()
    }

    /// Bytes charged for all claim records.
    pub fn claim_cached_bytes(&self) -> u64 {
        self.claims
            .cached_bytes()
            .saturating_add(self.finished_claims.cached_bytes())
    }

    /// (records, bytes) of `principal`'s claims, held and finished.
    fn claim_usage(&self, principal: &Principal) -> (u64, u64) {
        let (held, held_bytes) = self.claims.usage(principal);
        let (finished, finished_bytes) = self.finished_claims.usage(principal);
        (
            held.saturating_add(finished),
            held_bytes.saturating_add(finished_bytes),
        )
    }

    /// The largest fencing token issued so far.
    pub fn last_fence(&self) -> u64 {
        self.last_fence
    }

    /// The claim record of `key` of `principal`, if it is live and held here
    /// (every live record is, unless an adapter took the finished records'
    /// changes: see [`Registry::claim_over`]).
    pub fn claim_record(&self, principal: &Principal, key: &IdempotencyKey) -> Option<ClaimView> {
        self.claim_over(principal, key, None)
    }

    /// The live claim record of `key` of `principal`, when the adapter's
    /// store holds `stored` under it: a held record if there is one, else
    /// the registry's own finished change (a record or a removal) if it
    /// holds one, else `stored` if its group lives.
    pub fn claim_over(
        &self,
        principal: &Principal,
        key: &IdempotencyKey,
        stored: Option<GroupedRecord<ClaimRecord>>,
    ) -> Option<ClaimView> {
        self.claim_reading(&(principal.clone(), key.clone()), |_| stored)
    }

    /// [`Registry::claim_over`] reading the store only when it must: `stored`
    /// is called (once) when the record of `id` is neither held nor among
    /// the registry's own finished changes.
    fn claim_reading(
        &self,
        id: &KeyId,
        stored: impl FnOnce(&KeyId) -> Option<GroupedRecord<ClaimRecord>>,
    ) -> Option<ClaimView> {
        if let Some(record) = self.claims.get(id) {
            return Some(self.claim_view(id, record, None));
        }
        let mut fetched = Prefetched::none();
        if self.finished_claims.must_fetch(id) {
            fetched.insert_claim(id.clone(), stored(id));
        }
        let finished = self.finished_claims.get(id, &fetched.claims)?;
        Some(self.claim_view(id, &finished.record, Some(finished.group_ms)))
    }

    /// Whether the claim record of `id`, if any, lies only in the adapter's
    /// store: what a reader must read there (and hand to
    /// [`Registry::claim_over`]).
    pub fn claim_must_be_fetched(&self, id: &KeyId) -> bool {
        !self.claims.contains(id) && self.finished_claims.must_fetch(id)
    }

    /// One page of live claim records for operators: at most `limit` of
    /// them after (`principal`, `key`) in (principal, key) order, and
    /// whether more follow. Of the records held here (see
    /// [`Registry::claim_record`]): held and finished merged, a held one
    /// first where both name an id (they never both live).
    pub fn claims_after(
        &self,
        principal: &Principal,
        key: &IdempotencyKey,
        limit: usize,
    ) -> (Vec<ClaimView>, bool) {
        let after = (principal.clone(), key.clone());
        let mut held = self.claims.after(&after).peekable();
        let mut finished = self.finished_claims.after(&after).peekable();
        let mut page = Vec::new();
        loop {
            let next = match (held.peek(), finished.peek()) {
                (None, None) => break,
                (Some(_), None) => held.next().map(|(id, r)| self.claim_view(id, r, None)),
                (None, Some(_)) => finished
                    .next()
                    .map(|(id, s)| self.claim_view(id, &s.record, Some(s.group_ms))),
                (Some((held_id, _)), Some((finished_id, _))) => {
                    if held_id <= finished_id {
                        if held_id == finished_id {
                            finished.next();
                        }
                        held.next().map(|(id, r)| self.claim_view(id, r, None))
                    } else {
                        finished
                            .next()
                            .map(|(id, s)| self.claim_view(id, &s.record, Some(s.group_ms)))
                    }
                }
            };
            let Some(view) = next else { break };
            if page.len() == limit {
                return (page, true);
            }
            page.push(view);
        }
        (page, false)
    }

    /// The operator's view of a finished claim record read from the
    /// adapter's store (rules version 3); `None` if its group has expired.
    pub fn live_claim_view(
        &self,
        id: &KeyId,
        stored: &GroupedRecord<ClaimRecord>,
    ) -> Option<ClaimView> {
        self.finished_claims
            .group_end_ms(stored.group_ms)
            .map(|_| self.claim_view(id, &stored.record, Some(stored.group_ms)))
    }

    /// The view of a held record (or of any record before rules version 3).
    pub(crate) fn claim_view_of(&self, id: &KeyId, record: &ClaimRecord) -> ClaimView {
        self.claim_view(id, record, None)
    }

    /// A record's view; `group_ms` is the group of a finished one of rules
    /// version 3 (it lives until its group's newest possible record
    /// expires).
    fn claim_view(&self, id: &KeyId, record: &ClaimRecord, group_ms: Option<u64>) -> ClaimView {
        let ttl_ms = self.claim_config.claim_ttl_ms;
        let expires_after_ms = match group_ms.and_then(|g| self.finished_claims.group_end_ms(g)) {
            Some(end_ms) => (end_ms - 1).saturating_add(ttl_ms),
            None => record.ttl_base_ms().saturating_add(ttl_ms),
        };
        ClaimView {
            principal: id.0.clone(),
            key: id.1.clone(),
            record: record.clone(),
            expires_after_ms,
            size_bytes: record.size_bytes(id),
        }
    }

    /// Every claim record held in memory, in (principal, key) order
    /// (snapshots): all of them before rules version 3, the held ones from
    /// it.
    pub(crate) fn claim_records(&self) -> impl Iterator<Item = (&KeyId, &ClaimRecord)> {
        self.claims.iter()
    }

    /// Restores one claim record from a snapshot, in (principal, key)
    /// order; the caller checked its bounds.
    pub(crate) fn restore_claim(
        &mut self,
        id: KeyId,
        record: ClaimRecord,
    ) -> Result<(), &'static str> {
        if self.claims.last_id().is_some_and(|last| *last >= id) {
            return Err("claims out of order");
        }
        if record.fence > self.last_fence {
            return Err("a claim fence above the last fence issued");
        }
        if record.attempt == 0 || record.fence == 0 {
            return Err("a claim record without a holder");
        }
        if self.rules.finished_claims_grouped() && !record.is_held() {
            return Err("a finished claim among the held ones");
        }
        self.claims.put(id, record);
        Ok(())
    }

    /// Sets the last fence issued (snapshots).
    pub(crate) fn restore_last_fence(&mut self, last_fence: u64) {
        self.last_fence = last_fence;
    }

    /// The width of the groups finished claims open under the claim TTL in
    /// force (rules version 3).
    fn claim_group_width_ms(&self) -> u64 {
        key_group_width_ms(self.claim_config.claim_ttl_ms)
    }

    /// The live record of `id` and where it lies: held in memory, else
    /// (rules version 3) among the finished ones, read from what the
    /// adapter fetched if it lies outside. One lookup in each place at
    /// most: a lookup of a cold id in a large ordered map is the claim
    /// path's largest cost (docs/benchmarks.md, "Claims").
    fn claim_lookup<'a>(
        &'a self,
        id: &KeyId,
        fetched: &'a Prefetched,
    ) -> (Option<&'a ClaimRecord>, Lies) {
        if let Some(record) = self.claims.get(id) {
            return (Some(record), Lies::InMemory);
        }
        match self.finished_claims.get(id, &fetched.claims) {
            Some(stored) => (Some(&stored.record), Lies::Finished),
            None => (None, Lies::Nowhere),
        }
    }

    /// Sets the record of `id`, replacing the one it had, which lay where
    /// `was` says. Before rules version 3 every record is in memory; from
    /// it a held record is, and a finished one goes into the group open
    /// now.
    fn claim_set(&mut self, id: KeyId, record: ClaimRecord, was: Lies, fetched: &Prefetched) {
        if !self.rules.finished_claims_grouped() {
            self.claims.put(id, record);
            return;
        }
        if was == Lies::Finished {
            self.finished_claims.remove(&id, &fetched.claims);
        }
        if record.is_held() {
            self.claims.put(id, record);
        } else {
            if was == Lies::InMemory {
                self.claims.remove(&id);
            }
            let width_ms = self.claim_group_width_ms();
            self.finished_claims.insert(id, record, width_ms);
        }
    }

    /// Expires the claim records older than the claim TTL: the held ones
    /// exactly, the finished ones by group (rules version 3). A held one
    /// that goes while finished records lie outside is noted as removed
    /// among them too, so that a later entry of the same batch — whose ids
    /// were listed for fetching while it was held, so not fetched — finds
    /// it gone rather than unfetched.
    pub(crate) fn expire_claims(&mut self) {
        let (now_ms, ttl_ms) = (self.cluster_time_ms, self.claim_config.claim_ttl_ms);
        let finished = &mut self.finished_claims;
        self.claims
            .expire(now_ms, ttl_ms, |id| finished.mark_removed(id));
        finished.expire(now_ms, ttl_ms);
    }

    /// At the raise to rules version 3: every finished record leaves memory
    /// for the groups, in (TTL base, principal, key) order under the width
    /// in force. Deterministic, once, O(finished); a record's group starts
    /// at or before its base, so none expires earlier than its TTL.
    pub(crate) fn group_finished_claims(&mut self) {
        let mut finished: Vec<(u64, KeyId, ClaimRecord)> = self
            .claims
            .iter()
            .filter(|(_, record)| !record.is_held())
            .map(|(id, record)| (record.ttl_base_ms(), id.clone(), record.clone()))
            .collect();
        finished.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let width_ms = self.claim_group_width_ms();
        for (_, id, record) in finished {
            self.claims.remove(&id);
            self.finished_claims.insert(id, record, width_ms);
        }
    }

    /// Step 2 of every claim request: the key is not empty and within
    /// `claim_key_bytes_max`.
    fn check_claim_key(&self, key: &IdempotencyKey) -> Result<(), Rejection> {
        if key.0.is_empty() {
            return Err(Rejection::InvalidArgument(InvalidArgument::EmptyClaimKey));
        }
        let max = self.claim_config.claim_key_bytes_max;
        if key.0.len() as u64 > max {
            return Err(Rejection::LimitExceeded {
                exceeded: LimitExceeded {
                    limit: Limit::ClaimKeyBytes,
                    max,
                    requested: key.0.len() as u64,
                },
                duplicate: false,
            });
        }
        Ok(())
    }

    fn check_lease(&self, lease_ms: u64) -> Result<(), Rejection> {
        let lease_ms_max = self.claim_config.lease_ms_max;
        if lease_ms == 0 || lease_ms > lease_ms_max {
            return Err(Rejection::InvalidArgument(
                InvalidArgument::LeaseOutOfBounds {
                    lease_ms,
                    lease_ms_max,
                },
            ));
        }
        Ok(())
    }

    /// From rules version 3, finished records lie outside memory: bytes
    /// they bring count against the principal's share of
    /// `claim_cached_bytes_max` (as key records do against theirs), not the
    /// memory budget.
    fn check_claim_bytes_share(&self, principal: &Principal, growth: u64) -> Result<(), Rejection> {
        if !self.rules.finished_claims_grouped() || principal.is_anonymous() || growth == 0 {
            return Ok(());
        }
        let (_, bytes) = self.claim_usage(principal);
        if bytes.saturating_add(growth) > self.quota(self.claim_config.claim_cached_bytes_max) {
            return Err(Rejection::ResourceExhausted(Limit::PrincipalQuota));
        }
        Ok(())
    }

    /// The answer a claim would get from a *completed* record, without
    /// applying anything: `Some` only when applying `claim` now would pass
    /// steps 1–3 and answer the record's result at step 4 while changing
    /// nothing. A leader may serve that answer after a read index (rule
    /// 3's one shortcut: a response already applied); anything else —
    /// no record, another fingerprint, a held or released record, a refused
    /// key or lease — is `None` and goes through the log.
    ///
    /// `now_ms` is the earliest cluster time the claim would be applied at
    /// (a leader's clock): a record that has expired by then is `None`, as
    /// in [`Registry::keyed_duplicate_answer`].
    pub fn completed_claim_answer(&self, claim: &Claim, now_ms: u64) -> Option<ClaimAnswer> {
        self.completed_claim_answer_with(claim, now_ms, |_| None)
    }

    /// [`Registry::completed_claim_answer`], when finished records may lie
    /// in the adapter's store: `stored` reads what it holds under an id
    /// (called only when the registry does not hold the record itself).
    pub fn completed_claim_answer_with(
        &self,
        claim: &Claim,
        now_ms: u64,
        stored: impl FnOnce(&KeyId) -> Option<GroupedRecord<ClaimRecord>>,
    ) -> Option<ClaimAnswer> {
        self.check_cluster(Some(claim.cluster_id)).ok()?;
        self.check_claim_key(&claim.key).ok()?;
        self.check_lease(claim.lease_ms).ok()?;
        let id = (claim.principal.clone(), claim.key.clone());
        let view = self.claim_reading(&id, stored)?;
        if view.expires_after_ms < now_ms {
            return None;
        }
        let record = view.record;
        match record.state {
            ClaimState::Completed {
                completed_ms,
                result,
            } if record.fingerprint == claim.fingerprint => Some(ClaimAnswer::Completed {
                result,
                completed_ms,
                fence: record.fence,
                attempt: record.attempt,
            }),
            _ => None,
        }
    }

    /// A claim, in the order of checks of the module doc.
    pub(crate) fn claim(
        &mut self,
        log_index: u64,
        claim: &Claim,
        fetched: &Prefetched,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(claim.cluster_id))?;
        self.check_claim_key(&claim.key)?;
        self.check_lease(claim.lease_ms)?;
        let now_ms = self.cluster_time_ms;
        let id: KeyId = (claim.principal.clone(), claim.key.clone());
        let (found, was) = self.claim_lookup(&id, fetched);
        let attempt = match found {
            Some(record) if record.fingerprint != claim.fingerprint => {
                return Err(Rejection::KeyConflict);
            }
            Some(record) => match &record.state {
                ClaimState::Completed {
                    completed_ms,
                    result,
                } => {
                    return Ok(Outcome::Claimed(ClaimAnswer::Completed {
                        result: result.clone(),
                        completed_ms: *completed_ms,
                        fence: record.fence,
                        attempt: record.attempt,
                    }));
                }
                ClaimState::Held {
                    holder,
                    lease_deadline_ms,
                } if *holder == claim.claim_id => {
                    return Ok(Outcome::Claimed(ClaimAnswer::Won {
                        fence: record.fence,
                        attempt: record.attempt,
                        lease_deadline_ms: *lease_deadline_ms,
                        cluster_time_ms: now_ms,
                        duplicate: true,
                    }));
                }
                ClaimState::Held {
                    lease_deadline_ms, ..
                } if *lease_deadline_ms > now_ms => {
                    return Ok(Outcome::Claimed(ClaimAnswer::InProgress {
                        retry_after_ms: lease_deadline_ms - now_ms,
                        attempt: record.attempt,
                    }));
                }
                // Released, or a lease that ran out: a takeover.
                ClaimState::Held { .. } => record.attempt + 1,
                ClaimState::Released { .. } => {
                    let attempt = record.attempt + 1;
                    if was == Lies::Finished {
                        // Rules version 3: a released record comes back
                        // into memory, held.
                        let size = claim_record_size_bytes(&id.0, &id.1, 0);
                        self.check_budget(size)?;
                        self.check_quota(&id.0, None, size)?;
                    }
                    attempt
                }
            },
            None => {
                if self.claim_count() as u64 >= self.claim_config.claims_max {
                    return Err(Rejection::ResourceExhausted(Limit::Claims));
                }
                let size = claim_record_size_bytes(&id.0, &id.1, 0);
                if self.claim_cached_bytes().saturating_add(size)
                    > self.claim_config.claim_cached_bytes_max
                {
                    return Err(Rejection::ResourceExhausted(Limit::ClaimCachedBytes));
                }
                self.check_budget(size)?;
                let (claims_held, _) = self.claim_usage(&id.0);
                self.check_quota(
                    &id.0,
                    Some((claims_held, self.claim_config.claims_max)),
                    size,
                )?;
                self.check_claim_bytes_share(&id.0, size)?;
                1
            }
        };
        let fence = self.last_fence.saturating_add(1).max(log_index);
        self.last_fence = fence;
        let lease_deadline_ms = now_ms.saturating_add(claim.lease_ms);
        self.claim_set(
            id,
            ClaimRecord {
                fingerprint: claim.fingerprint,
                fence,
                attempt,
                state: ClaimState::Held {
                    holder: claim.claim_id,
                    lease_deadline_ms,
                },
            },
            was,
            fetched,
        );
        Ok(Outcome::Claimed(ClaimAnswer::Won {
            fence,
            attempt,
            lease_deadline_ms,
            cluster_time_ms: now_ms,
            duplicate: false,
        }))
    }

    /// The record of (principal, key) if `fence` is its current holder's
    /// fence, else `FENCED` with the key's current fence.
    fn fenced_record<'a>(
        &'a self,
        id: &KeyId,
        fence: u64,
        fetched: &'a Prefetched,
    ) -> Result<&'a ClaimRecord, Rejection> {
        match self.claim_lookup(id, fetched).0 {
            Some(record) if record.fence == fence => Ok(record),
            Some(record) => Err(Rejection::Fenced {
                fence: record.fence,
            }),
            None => Err(Rejection::Fenced { fence: 0 }),
        }
    }

    pub(crate) fn complete_claim(
        &mut self,
        cluster_id: ClusterId,
        principal: &Principal,
        key: &IdempotencyKey,
        fence: u64,
        result: &[u8],
        fetched: &Prefetched,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        self.check_claim_key(key)?;
        let max = self.claim_config.claim_result_bytes_max;
        if result.len() as u64 > max {
            return Err(Rejection::LimitExceeded {
                exceeded: LimitExceeded {
                    limit: Limit::ClaimResultBytes,
                    max,
                    requested: result.len() as u64,
                },
                duplicate: false,
            });
        }
        let id: KeyId = (principal.clone(), key.clone());
        // DELIBERATELY BROKEN when built with `broken-no-fence-check` (a
        // fault-injection build for the jepsen-like harness only, to prove
        // its checker catches it): a held key accepts a complete from any
        // fence, a stale holder's included.
        #[cfg(feature = "broken-no-fence-check")]
        let record = match self.claims.get(&id) {
            Some(record) if record.is_held() => record,
            _ => self.fenced_record(&id, fence, fetched)?,
        };
        #[cfg(not(feature = "broken-no-fence-check"))]
        let record = self.fenced_record(&id, fence, fetched)?;
        match &record.state {
            // The same complete again (a retry whose reply was lost): the
            // record's answer.
            ClaimState::Completed {
                completed_ms,
                result: recorded,
            } if recorded.as_slice() == result => Ok(Outcome::ClaimCompleted {
                fence,
                completed_ms: *completed_ms,
                duplicate: true,
            }),
            // A complete with another result than the one recorded changes
            // nothing and must not pass for recorded: the claim is finished
            // under this fence, as after a release.
            ClaimState::Completed { .. } | ClaimState::Released { .. } => {
                Err(Rejection::Fenced { fence })
            }
            ClaimState::Held { .. } => {
                let mut record = record.clone();
                let completed_ms = self.cluster_time_ms;
                let grown = result.len() as u64;
                if self.claim_cached_bytes().saturating_add(grown)
                    > self.claim_config.claim_cached_bytes_max
                {
                    return Err(Rejection::ResourceExhausted(Limit::ClaimCachedBytes));
                }
                if self.rules.finished_claims_grouped() {
                    // The record leaves memory: nothing grows there.
                    self.check_claim_bytes_share(principal, grown)?;
                } else {
                    self.check_budget(grown)?;
                    self.check_quota(principal, None, grown)?;
                }
                record.state = ClaimState::Completed {
                    completed_ms,
                    result: result.to_vec(),
                };
                self.claim_set(id, record, Lies::InMemory, fetched);
                Ok(Outcome::ClaimCompleted {
                    fence,
                    completed_ms,
                    duplicate: false,
                })
            }
        }
    }

    pub(crate) fn release_claim(
        &mut self,
        cluster_id: ClusterId,
        principal: &Principal,
        key: &IdempotencyKey,
        fence: u64,
        fetched: &Prefetched,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        self.check_claim_key(key)?;
        let id: KeyId = (principal.clone(), key.clone());
        let record = self.fenced_record(&id, fence, fetched)?;
        match &record.state {
            ClaimState::Released { .. } => Ok(Outcome::ClaimReleased { duplicate: true }),
            ClaimState::Completed { .. } => Err(Rejection::Fenced { fence }),
            ClaimState::Held { .. } => {
                let mut record = record.clone();
                record.state = ClaimState::Released {
                    released_ms: self.cluster_time_ms,
                };
                self.claim_set(id, record, Lies::InMemory, fetched);
                Ok(Outcome::ClaimReleased { duplicate: false })
            }
        }
    }

    pub(crate) fn extend_claim(
        &mut self,
        cluster_id: ClusterId,
        principal: &Principal,
        key: &IdempotencyKey,
        fence: u64,
        lease_ms: u64,
        fetched: &Prefetched,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        self.check_claim_key(key)?;
        self.check_lease(lease_ms)?;
        let id: KeyId = (principal.clone(), key.clone());
        let record = self.fenced_record(&id, fence, fetched)?;
        let ClaimState::Held {
            holder,
            lease_deadline_ms,
        } = &record.state
        else {
            return Err(Rejection::Fenced { fence });
        };
        let now_ms = self.cluster_time_ms;
        let extended_ms = now_ms.saturating_add(lease_ms).max(*lease_deadline_ms);
        if extended_ms != *lease_deadline_ms {
            let mut record = record.clone();
            record.state = ClaimState::Held {
                holder: *holder,
                lease_deadline_ms: extended_ms,
            };
            self.claim_set(id, record, Lies::InMemory, fetched);
        }
        Ok(Outcome::ClaimExtended {
            lease_deadline_ms: extended_ms,
            cluster_time_ms: now_ms,
        })
    }

    /// An operator's removal of a claim record, through the log.
    pub(crate) fn forget_claim(
        &mut self,
        cluster_id: ClusterId,
        principal: &Principal,
        key: &IdempotencyKey,
        fetched: &Prefetched,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        let id = (principal.clone(), key.clone());
        let existed = if self.claims.remove(&id) {
            // See `expire_claims`: gone from memory, noted gone among the
            // finished too.
            self.finished_claims.mark_removed(&id);
            true
        } else {
            self.finished_claims.remove(&id, &fetched.claims)
        };
        Ok(Outcome::ClaimForgotten { existed })
    }
}
