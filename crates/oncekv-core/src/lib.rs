//! The registry core: applies one decoded log entry to (session registry,
//! key-value data) and returns its outcome. Pure, deterministic and
//! synchronous — it must never read a clock, a random source or the
//! environment, touch IO, or iterate anything in an unspecified order
//! (docs/rules.md, rule 10). Every rule of exactly-once execution lives here.
//!
//! An entry carries a batch of requests (rule 17): the index and the cluster
//! time advance once for the entry, then each request goes through the
//! checks below in order, each with its own outcome.
//!
//! Order of checks for a client request, identical on every replica:
//! 1. advance cluster time to the entry's stamp (never backwards) and expire
//!    idle sessions; the cluster id must match (`WRONG_CLUSTER`);
//! 2. unknown session → `SESSION_EXPIRED`; a session of another principal →
//!    `PERMISSION_DENIED` (rule 19; final, the session untouched);
//! 3. first outstanding seq > seq, or beyond one past the highest seq the
//!    session has had applied (or its floor, if higher) plus the window
//!    (rule 7: no input may brick a session) → `INVALID_ARGUMENT`, the
//!    floor and cache unchanged; else raise the floor and trim the
//!    cached responses below it;
//! 4. seq below the floor → `RESPONSE_DISCARDED`;
//! 5. seq cached → same fingerprint: the cached result, marked duplicate;
//!    other fingerprint: `SEQ_CONFLICT`;
//! 6. seq ≥ floor + window → `TOO_MANY_OUTSTANDING`;
//! 7. limits, before any effect: first an empty key → `INVALID_ARGUMENT`
//!    (a fact of the request alone, so final without being cached); then a
//!    limit the request breaks by itself, given the data it applies to (a
//!    key, value or list too large; a response larger than a whole session
//!    may cache) → `LIMIT_EXCEEDED`, final: the refusal is cached as the
//!    seq's response, so a retry gets it again; then a capacity limit (the
//!    key count, or the session's cached bytes with the response about to
//!    be cached — a refusal to cache included) → `RESOURCE_EXHAUSTED`, this
//!    attempt only;
//! 8. execute, cache the result with the command's fingerprint.
//!
//! A session's activity (what its expiry counts from) is refreshed only by
//! a request that passed every check that can refuse it: one executed or
//! answered from the cache (step 5, or a limit refusal cached at step 7),
//! and a keep-alive whose floor was accepted. A refused request — an
//! invalid or out-of-bound floor, a discarded or conflicting seq, a full
//! window or a capacity limit — changes no activity, so a client that can
//! only be refused (one whose floor the bound refuses forever, say) lets
//! its session expire instead of keeping it alive.
//!
//! Order of checks for a keyed request (`ExecuteKeyed`, rule 18), identical
//! on every replica:
//! 1. as above: advance cluster time, expire idle sessions and, oldest
//!    first, idempotency keys older than their TTL (counted from each key's
//!    first execution); the cluster id must match (`WRONG_CLUSTER`);
//! 2. an empty idempotency key → `INVALID_ARGUMENT`; a key longer than
//!    `idempotency_key_bytes_max` → `LIMIT_EXCEEDED`. Both are final for
//!    the request as sent and *not* cached: caching would store the very
//!    key that is refused (a client checks the key's length before sending);
//! 3. (principal, key) has a record → same fingerprint: the cached
//!    response, marked duplicate; other fingerprint: `KEY_CONFLICT` (final
//!    while the key lives; the record untouched). Keys are scoped by the
//!    principal (rule 19): another principal's equal key is another record.
//!    Without authentication every caller is the anonymous principal and
//!    all share one namespace (a caller may put its own into the key);
//! 4. limits, before any effect, as step 7 above: an empty data key →
//!    `INVALID_ARGUMENT` (final, not cached); a limit the command breaks by
//!    itself, given the data (`RequestLimits::check`, a list grown too
//!    large, a record larger than all of `idempotency_cached_bytes_max`) →
//!    `LIMIT_EXCEEDED`, cached as the key's response; then capacity: the
//!    data's `keys_max`, `idempotency_keys_max` live keys, or the records'
//!    bytes with this one (`idempotency_cached_bytes_max`) →
//!    `RESOURCE_EXHAUSTED`, this attempt only. No live key is ever evicted
//!    to make room;
//! 5. execute, record the key with its creation time, fingerprint and
//!    response.
//!
//! No "in progress" state exists (the IETF idempotency-key draft and AWS
//! Powertools need one, because they check the key before executing): the
//! decision is made when the committed entry applies, in log order, so two
//! concurrent copies of one key both reach the log, the first executes and
//! the second is answered from its record.

mod claims;
pub mod codec;
pub mod extension;
pub mod fingerprint;
mod grouped;
mod keyed;
pub mod kv;
mod session;
pub mod snapshot;
pub mod stored;
pub mod types;

pub use claims::{ClaimRecord, ClaimState, ClaimView};
pub use grouped::{Changes, Fetched, Grouped};
pub use keyed::{
    GroupedRecord, KEY_GROUP_WIDTH_MAX_MS, KEY_GROUPS_PER_TTL, KeyChanges, KeyId, KeyRecord,
    Prefetched, key_group_width_ms,
};
pub use session::CachedResponse;
pub use types::*;

use claims::{ClaimGroups, ClaimStore};
use imbl::{OrdMap, OrdSet};
use keyed::KeyStore;
use kv::{KvStore, Refusal};
use session::{Session, response_size_bytes};
use std::ops::Bound;

/// What an adapter's build takes ([`Registry::take_record_changes`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordChanges {
    pub keys: KeyChanges,
    /// From rules version 3: the finished claims' changes.
    pub claims: Option<Changes<ClaimRecord>>,
}

/// The whole replicated state: sessions, their cached responses, cluster
/// time, config and the key-value data, as of `applied_index`. Its maps are
/// persistent (copy-on-write, ordered): a clone costs O(1), so a snapshot or
/// a state hash can be taken from a clone while apply goes on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registry {
    cluster_id: Option<ClusterId>,
    config: RegistryConfig,
    applied_index: u64,
    cluster_time_ms: u64,
    /// The largest client id ever assigned (rule 1): ids are never reused,
    /// even after their sessions are gone.
    last_client_id: u64,
    sessions: OrdMap<ClientId, Session>,
    /// Nonce → the session it registered; lives and dies with the session.
    nonces: OrdMap<Nonce, ClientId>,
    /// Every session by the time it is filed under, oldest first: expiry
    /// walks it from the front.
    idle: IdleIndex,
    kv: KvStore,
    /// TTL and limits of idempotency keys (rule 18).
    keyed_config: KeyedConfig,
    /// Records of idempotency keys, by (principal, key).
    keys: KeyStore,
    /// TTL and limits of claims (rule 20).
    claim_config: ClaimConfig,
    /// Records of claims, by (principal, key): every one before rules
    /// version 3, the held ones from it.
    claims: ClaimStore,
    /// From rules version 3, the finished (completed or released) claim
    /// records, grouped by the cluster time their TTL counts from, as key
    /// records are. Never holds an id `claims` holds.
    finished_claims: ClaimGroups,
    /// The largest fencing token ever issued: fences only grow, for every
    /// key, even across a record's expiry or an operator's forget.
    last_fence: u64,
    /// The memory budget (rule 21).
    budget: BudgetConfig,
    /// Sum of the sessions' cached bytes (what they charge against the
    /// memory budget beyond their bookkeeping).
    sessions_cached_bytes: u64,
    /// Per owner: (sessions, their cached bytes) — what the owner's quota
    /// counts (rule 21). Derived from the sessions.
    session_usage: OrdMap<Principal, (u64, u64)>,
    /// The rules entries apply under ([`RulesVersion`]).
    rules: RulesVersion,
}

/// (filing time, client id) of every session: each filed at most at its
/// last activity (`Session::filed_ms`). A request only moves its session's
/// `last_active_ms`; expiry, walking from the front, refiles a session it
/// finds active since it was filed instead of expiring it. So a busy
/// session costs the index nothing per request and at most one refiling
/// per session TTL, and what expires — every session idle longer than the
/// TTL — is decided by the activity alone. An index, not state: two
/// registries with equal sessions may file them at different times (a
/// snapshot files each at its last activity), so it takes no part in
/// equality.
#[derive(Clone, Debug, Default)]
struct IdleIndex(OrdSet<(u64, ClientId)>);

impl PartialEq for IdleIndex {
    fn eq(&self, _: &IdleIndex) -> bool {
        true
    }
}

impl Eq for IdleIndex {}

/// A read-only view of one idempotency key's record, for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyView {
    pub principal: Principal,
    pub key: IdempotencyKey,
    /// Cluster time of the key's first execution.
    pub created_ms: u64,
    /// Cluster time minus `created_ms`.
    pub age_ms: u64,
    /// Cluster time after which the key expires under the TTL in force
    /// (it goes at the first entry stamped later).
    pub expires_after_ms: u64,
    pub fingerprint: Fingerprint,
    pub response: Result<CommandResult, LimitExceeded>,
    /// Bytes charged against `idempotency_cached_bytes_max`.
    pub size_bytes: u64,
}

/// A read-only view of one session, for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionView {
    pub client_id: ClientId,
    /// The principal that registered the session.
    pub owner: Principal,
    pub floor: Seq,
    pub last_active_ms: u64,
    /// Cluster time minus `last_active_ms`: how long it has been idle.
    pub idle_ms: u64,
    pub cached_responses: u64,
    pub cached_bytes: u64,
}

impl Registry {
    /// An empty registry, not yet bootstrapped.
    pub fn new() -> Registry {
        Registry::default()
    }

    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.cluster_id
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The log index of the last entry applied.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// The cluster time: the largest stamp applied so far.
    pub fn cluster_time_ms(&self) -> u64 {
        self.cluster_time_ms
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The TTL and limits of idempotency keys in force.
    pub fn keyed_config(&self) -> &KeyedConfig {
        &self.keyed_config
    }

    /// Live idempotency keys, all principals.
    pub fn key_count(&self) -> usize {
        usize::try_from(self.keys.len()).unwrap_or(usize::MAX)
    }

    /// Bytes charged for all idempotency key records.
    pub fn keyed_cached_bytes(&self) -> u64 {
        self.keys.cached_bytes()
    }

    /// The record of `key` of `principal`, if it is live and held here
    /// (every live record is, unless an adapter took the changes: see
    /// [`Registry::take_key_changes`]).
    pub fn key(&self, principal: &Principal, key: &IdempotencyKey) -> Option<KeyView> {
        self.key_over(principal, key, None)
    }

    /// The live record of `key` of `principal`, when the adapter's store
    /// holds `stored` under it: the registry's own change if it holds one
    /// (a newer record, or a removal), else `stored` if its group lives.
    pub fn key_over(
        &self,
        principal: &Principal,
        key: &IdempotencyKey,
        stored: Option<GroupedRecord>,
    ) -> Option<KeyView> {
        let id = (principal.clone(), key.clone());
        let live = self.live_key(&id, stored)?;
        Some(self.key_view(&id, &live))
    }

    /// The live record of `id`: the registry's own (a record or a removal)
    /// if it holds one, else — when records lie outside — `stored`, what
    /// the adapter's store holds under it, if its group lives.
    fn live_key(&self, id: &KeyId, stored: Option<GroupedRecord>) -> Option<GroupedRecord> {
        let mut fetched = Prefetched::none();
        if self.keys.must_fetch(id) {
            fetched.insert(id.clone(), stored);
        }
        self.keys.get(id, &fetched.keys).cloned()
    }

    /// Whether the record of `id`, if any, lies only in the adapter's
    /// store: what a reader must read there (and hand to
    /// [`Registry::key_over`]).
    pub fn key_must_be_fetched(&self, id: &KeyId) -> bool {
        self.keys.must_fetch(id)
    }

    /// Whether records of the group starting at `group_ms` are live.
    pub fn key_group_is_live(&self, group_ms: u64) -> bool {
        self.keys.group_end_ms(group_ms).is_some()
    }

    /// The start of the oldest live key group (where the next opens if none
    /// lives): records of older groups are expired wherever they lie — an
    /// adapter's store may drop them.
    pub fn first_live_key_group_ms(&self) -> u64 {
        self.keys.first_live_group_ms()
    }

    /// The ids of the key records `entry` reads that this registry does not
    /// hold: what an adapter whose store holds the rest must fetch before
    /// applying it ([`Registry::apply_prefetched`]). Empty while every
    /// record is held.
    pub fn keys_to_fetch(&self, entry: &Entry) -> Vec<KeyId> {
        if !self.keys.has_records_outside() {
            return Vec::new();
        }
        entry
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::ExecuteKeyed { key, principal, .. } | Op::ForgetKey { principal, key, .. } => {
                    Some((principal.clone(), key.clone()))
                }
                _ => None,
            })
            .filter(|id| self.keys.must_fetch(id))
            .collect()
    }

    /// The ids of the finished claim records `entry` reads that this
    /// registry does not hold (rules version 3, once an adapter took their
    /// changes): what an adapter whose store holds the rest must fetch
    /// before applying it, as [`Registry::keys_to_fetch`] for keys. A held
    /// claim is always in memory and never named.
    pub fn claims_to_fetch(&self, entry: &Entry) -> Vec<KeyId> {
        if !self.finished_claims.has_records_outside() {
            return Vec::new();
        }
        entry
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Claim(claim) => Some((claim.principal.clone(), claim.key.clone())),
                Op::CompleteClaim { principal, key, .. }
                | Op::ReleaseClaim { principal, key, .. }
                | Op::ExtendClaim { principal, key, .. }
                | Op::ForgetClaim { principal, key, .. } => Some((principal.clone(), key.clone())),
                _ => None,
            })
            .filter(|id| self.claim_must_be_fetched(id))
            .collect()
    }

    /// The finished claim records changed since the last call (every one,
    /// the first time), for an adapter to write into its store, as
    /// [`Registry::take_key_changes`] for keys. Before rules version 3
    /// there are none and nothing is taken: every claim stays in memory
    /// and none is ever to be fetched.
    pub fn take_claim_changes(&mut self) -> Changes<ClaimRecord> {
        if !self.rules.finished_claims_grouped() {
            return Changes::default();
        }
        self.finished_claims.take_changes()
    }

    /// Both kinds' changes at once, for an adapter's build: the key
    /// records', and from rules version 3 the finished claims' (`None`
    /// before it: no claim goes to the store, and the store's checkpoint
    /// names only the keys' watermark, as a build that knows no claims in
    /// the store writes it).
    pub fn take_record_changes(&mut self) -> RecordChanges {
        RecordChanges {
            keys: self.take_key_changes(),
            claims: self
                .rules
                .finished_claims_grouped()
                .then(|| self.finished_claims.take_changes()),
        }
    }

    /// The held claims (always in memory) after `after`, as operators see
    /// them, in (principal, key) order: what a reader merges over the
    /// finished ones wherever they lie.
    pub fn held_claim_views_after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = ClaimView> + 'a {
        self.claims
            .after(after)
            .map(|(id, record)| self.claim_view_of(id, record))
    }

    /// Whether finished claim records may lie outside the registry.
    pub fn has_claim_records_outside(&self) -> bool {
        self.finished_claims.has_records_outside()
    }

    /// The finished claim changes held after `after`, in (principal, key)
    /// order, as [`Registry::key_changes_after`] for keys.
    pub fn claim_changes_after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = (&'a KeyId, &'a Option<GroupedRecord<ClaimRecord>>)> + 'a {
        self.finished_claims.changes_after(after)
    }

    /// The start of the oldest live group of finished claims: records of
    /// older groups are expired wherever they lie.
    pub fn first_live_claim_group_ms(&self) -> u64 {
        self.finished_claims.first_live_group_ms()
    }

    /// Finished claim records (and removals) held in memory.
    pub fn claim_records_held(&self) -> usize {
        self.finished_claims.held()
    }

    /// Claim records (and removals) in memory: the held claims (below
    /// version 3 every claim) and the finished ones not yet taken by an
    /// adapter ([`Registry::claim_records_held`]).
    pub fn claim_records_in_memory(&self) -> usize {
        self.claims.len().saturating_add(self.claim_records_held())
    }

    /// The key records changed since the last call (every record, the
    /// first time), for an adapter to write into its store. From then on
    /// the registry holds only the records changed since, and reads the
    /// others from what the adapter fetches ([`Registry::keys_to_fetch`]);
    /// the decisions, the counts and the state hash do not depend on when
    /// (or whether) changes are taken.
    pub fn take_key_changes(&mut self) -> KeyChanges {
        self.keys.take_changes()
    }

    /// Whether key records may lie outside the registry (an adapter took
    /// its changes): then [`Registry::key`] and [`Registry::keys_after`]
    /// see only those changed since, and readers merge the adapter's store.
    pub fn has_key_records_outside(&self) -> bool {
        self.keys.has_records_outside()
    }

    /// The key-record changes held after `after`, in (principal, key)
    /// order: a record (`None`: removed) — for a reader merging them over
    /// an adapter's store. Records of expired groups may be among them.
    pub fn key_changes_after<'a>(
        &'a self,
        after: &KeyId,
    ) -> impl Iterator<Item = (&'a KeyId, &'a Option<GroupedRecord>)> + 'a {
        self.keys.changes_after(after)
    }

    /// Key records (and removals) held in memory: every live one until an
    /// adapter takes the changes, then those changed since its last take.
    pub fn key_records_held(&self) -> usize {
        self.keys.held()
    }

    /// The operator's view of a live record read from wherever it lies;
    /// `None` if its group has expired.
    pub fn live_key_view(&self, id: &KeyId, stored: &GroupedRecord) -> Option<KeyView> {
        self.key_group_is_live(stored.group_ms)
            .then(|| self.key_view(id, stored))
    }

    /// One page of live idempotency keys for operators: at most `limit` of
    /// them after (`principal`, `key`) in (principal, key) order (the
    /// anonymous principal and the empty key come first: start there), and
    /// whether more follow. Of the records held here (see
    /// [`Registry::key`]).
    pub fn keys_after(
        &self,
        principal: &Principal,
        key: &IdempotencyKey,
        limit: usize,
    ) -> (Vec<KeyView>, bool) {
        let after = (principal.clone(), key.clone());
        let mut following = self
            .keys
            .after(&after)
            .map(|(id, stored)| self.key_view(id, stored));
        let page: Vec<KeyView> = following.by_ref().take(limit).collect();
        let more = following.next().is_some();
        (page, more)
    }

    /// The cluster time after which a key's record expires under the TTL in
    /// force: its group's newest possible record's (created at the group's
    /// end - 1) plus the TTL.
    fn key_expires_after_ms(&self, stored: &GroupedRecord) -> u64 {
        let group_end_ms = self
            .keys
            .group_end_ms(stored.group_ms)
            .unwrap_or(stored.record.created_ms.saturating_add(1));
        (group_end_ms - 1).saturating_add(self.keyed_config.idempotency_key_ttl_ms)
    }

    fn key_view(&self, id: &KeyId, stored: &GroupedRecord) -> KeyView {
        let record = &stored.record;
        KeyView {
            principal: id.0.clone(),
            key: id.1.clone(),
            created_ms: record.created_ms,
            age_ms: self.cluster_time_ms.saturating_sub(record.created_ms),
            expires_after_ms: self.key_expires_after_ms(stored),
            fingerprint: record.response.fingerprint,
            response: record.response.result.clone(),
            size_bytes: record.size_bytes(id),
        }
    }

    pub fn data(&self) -> &KvStore {
        &self.kv
    }

    /// Reads a key from the applied state (no log entry involved).
    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        self.kv.get(key)
    }

    /// The session of `client_id`, if it is live.
    pub fn session(&self, client_id: ClientId) -> Option<SessionView> {
        self.sessions
            .get(&client_id)
            .map(|session| view(client_id, session, self.cluster_time_ms))
    }

    /// All live sessions, in client id order.
    pub fn sessions(&self) -> impl Iterator<Item = SessionView> + '_ {
        self.sessions
            .iter()
            .map(|(id, session)| view(*id, session, self.cluster_time_ms))
    }

    /// One page of live sessions for operators: at most `limit` of them
    /// with ids above `after`, in client id order, and whether more follow.
    pub fn sessions_after(&self, after: ClientId, limit: usize) -> (Vec<SessionView>, bool) {
        let mut following = self
            .sessions
            .range((Bound::Excluded(after), Bound::Unbounded))
            .map(|(id, session)| view(*id, session, self.cluster_time_ms));
        let page: Vec<SessionView> = following.by_ref().take(limit).collect();
        let more = following.next().is_some();
        (page, more)
    }

    /// The response cached for (client id, seq), if any: what a leader may
    /// serve for a retry after confirming its leadership (rule 3).
    pub fn cached_response(&self, client_id: ClientId, seq: Seq) -> Option<&CachedResponse> {
        self.sessions.get(&client_id)?.responses.get(&seq)
    }

    /// Records that the entry at `log_index` carried nothing for the
    /// registry (a blank or membership entry of Raft). Raft's initial
    /// membership entry sits at index 0, which a fresh registry accepts.
    pub fn apply_other(&mut self, log_index: u64) {
        if log_index == 0 && self.applied_index == 0 {
            return;
        }
        self.advance_index(log_index);
    }

    /// The largest client id assigned so far (0: none yet).
    pub fn last_client_id(&self) -> u64 {
        self.last_client_id
    }

    /// Applies the registry entry committed at `log_index`: every request
    /// of its batch in order, one outcome per request, in the same order.
    ///
    /// # Panics
    /// If `log_index` is not above the applied index: the storage layer
    /// applied an entry twice or out of order, and going on would break
    /// exactly-once.
    pub fn apply(&mut self, log_index: u64, entry: &Entry) -> Vec<Outcome> {
        self.apply_prefetched(log_index, entry, &Prefetched::none())
    }

    /// [`Registry::apply`], with the key records an adapter fetched from its
    /// store for the ids [`Registry::keys_to_fetch`] named for `entry`.
    ///
    /// # Panics
    /// As [`Registry::apply`]; and if a key record the entry reads is
    /// neither held nor fetched (an adapter bug: deciding without it could
    /// execute a key twice).
    pub fn apply_prefetched(
        &mut self,
        log_index: u64,
        entry: &Entry,
        fetched: &Prefetched,
    ) -> Vec<Outcome> {
        self.advance_index(log_index);
        self.advance_time(entry.stamp_ms);
        entry
            .ops
            .iter()
            .map(|op| self.apply_op(log_index, op, fetched))
            .collect()
    }

    /// One request of an entry, after the entry advanced index and time.
    fn apply_op(&mut self, log_index: u64, op: &Op, fetched: &Prefetched) -> Outcome {
        // A session's cached bytes change only under its own requests (and
        // its removal, counted there): keep the total in step here.
        let session = match op {
            Op::Execute(execute) => Some(execute.client_id),
            Op::KeepAlive { client_id, .. } => Some(*client_id),
            _ => None,
        };
        let cached_before = session.map_or(0, |id| self.session_cached_bytes(id));
        let outcome = self.apply_op_checked(log_index, op, fetched);
        let Some(id) = session else {
            return outcome;
        };
        // The common case, a response replaced by one of the same size (or
        // a refusal), changes no total: no owner to clone, no usage to
        // rewrite (this runs for every Execute, on every node).
        let (cached_after, owner) = match self.sessions.get(&id) {
            Some(session) if session.cached_bytes == cached_before => return outcome,
            Some(session) => (session.cached_bytes, Some(session.owner.clone())),
            None => (0, None),
        };
        self.sessions_cached_bytes = self.sessions_cached_bytes - cached_before + cached_after;
        if let Some(owner) = owner {
            self.count_session_usage(&owner, 0, cached_after as i64 - cached_before as i64);
        }
        outcome
    }

    /// Adds to `owner`'s session usage.
    fn count_session_usage(&mut self, owner: &Principal, sessions: i64, bytes: i64) {
        if let Some((count, size)) = self.session_usage.get_mut(owner) {
            *count = count.saturating_add_signed(sessions);
            *size = size.saturating_add_signed(bytes);
            if *count == 0 {
                self.session_usage.remove(owner);
            }
            return;
        }
        let count = 0u64.saturating_add_signed(sessions);
        if count > 0 {
            self.session_usage
                .insert(owner.clone(), (count, 0u64.saturating_add_signed(bytes)));
        }
    }

    /// The bytes `principal` holds against its share of the memory budget:
    /// its sessions with their cached responses, its claim records, and its
    /// key records while they count against the budget (rules version 1).
    fn principal_bytes(&self, principal: &Principal) -> u64 {
        let (sessions, cached) = self.session_usage.get(principal).copied().unwrap_or((0, 0));
        let keys = if self.rules.key_records_in_memory_budget() {
            self.keys.usage(principal).1
        } else {
            0
        };
        (sessions * SESSION_MEMORY_BOOKKEEPING_BYTES)
            .saturating_add(cached)
            .saturating_add(keys)
            .saturating_add(self.claims.usage(principal).1)
    }

    /// `principal`'s share of a capacity limit of `limit`.
    fn quota(&self, limit: u64) -> u64 {
        let share = u128::from(limit) * u128::from(self.budget.principal_quota_percent) / 100;
        u64::try_from(share).unwrap_or(u64::MAX).max(1)
    }

    /// Refuses a request of `principal` that would take its count of some
    /// record (`held` now, one more wanted) past its share of `limit`, or
    /// its bytes `growth_bytes` past its share of the memory budget (rule
    /// 21). The anonymous principal is every caller of a node without
    /// authentication: it is held to the limits alone.
    fn check_quota(
        &self,
        principal: &Principal,
        count: Option<(u64, u64)>,
        growth_bytes: u64,
    ) -> Result<(), Rejection> {
        if principal.is_anonymous() {
            return Ok(());
        }
        let over_count = count.is_some_and(|(held, limit)| held + 1 > self.quota(limit));
        let over_bytes = growth_bytes > 0
            && self.principal_bytes(principal).saturating_add(growth_bytes)
                > self.quota(self.budget.memory_budget_bytes);
        if over_count || over_bytes {
            return Err(Rejection::ResourceExhausted(Limit::PrincipalQuota));
        }
        Ok(())
    }

    fn session_cached_bytes(&self, client_id: ClientId) -> u64 {
        self.sessions
            .get(&client_id)
            .map_or(0, |session| session.cached_bytes)
    }

    /// The bytes the applied state accounts for against the memory budget
    /// (rule 21): the data, every session with its cached responses, the
    /// claim records, and the idempotency-key records while they count
    /// against the budget (rules version 1; from version 2 they lie in the
    /// record store and count against `idempotency_cached_bytes_max`).
    pub fn memory_bytes(&self) -> u64 {
        let keys = if self.rules.key_records_in_memory_budget() {
            self.keys.cached_bytes()
        } else {
            0
        };
        self.kv
            .memory_bytes()
            .saturating_add(self.sessions.len() as u64 * SESSION_MEMORY_BOOKKEEPING_BYTES)
            .saturating_add(self.sessions_cached_bytes)
            .saturating_add(keys)
            .saturating_add(self.claims.cached_bytes())
    }

    /// The rules version entries apply under.
    pub fn rules(&self) -> RulesVersion {
        self.rules
    }

    /// The memory budget in force (rule 21).
    pub fn budget_config(&self) -> &BudgetConfig {
        &self.budget
    }

    /// Refuses a request that would take the accounted state `growth_bytes`
    /// past the memory budget (a capacity limit: this attempt only).
    fn check_budget(&self, growth_bytes: u64) -> Result<(), Rejection> {
        if growth_bytes > 0
            && self.memory_bytes().saturating_add(growth_bytes) > self.budget.memory_budget_bytes
        {
            return Err(Rejection::ResourceExhausted(Limit::MemoryBudget));
        }
        Ok(())
    }

    /// One request, in the order of checks.
    fn apply_op_checked(&mut self, log_index: u64, op: &Op, fetched: &Prefetched) -> Outcome {
        let result = match op {
            Op::Bootstrap { cluster_id, config } => {
                self.bootstrap(*cluster_id, config, RulesVersion::V1)
            }
            Op::BootstrapWithRules {
                cluster_id,
                config,
                rules,
            } => self.bootstrap(*cluster_id, config, *rules),
            Op::Register {
                cluster_id,
                nonce,
                principal,
            } => self.register(log_index, *cluster_id, *nonce, principal),
            Op::Execute(execute) => self.execute(execute),
            Op::KeepAlive {
                cluster_id,
                client_id,
                first_outstanding_seq,
                principal,
            } => self.keep_alive(*cluster_id, *client_id, *first_outstanding_seq, principal),
            Op::Unregister {
                cluster_id,
                client_id,
                principal,
            } => self.unregister(*cluster_id, *client_id, principal.as_ref()),
            Op::SetConfig { cluster_id, config } => {
                self.set_config(*cluster_id, &ConfigPatch::replacing_with(config))
            }
            Op::PatchConfig { cluster_id, patch } => self.set_config(*cluster_id, patch),
            Op::ExecutePlain {
                cluster_id,
                command,
            } => self.execute_plain(*cluster_id, command),
            Op::ExecuteKeyed {
                cluster_id,
                key,
                command,
                principal,
            } => self.execute_keyed(*cluster_id, key, command, principal, fetched),
            Op::ForgetKey {
                cluster_id,
                principal,
                key,
            } => self.forget_key(*cluster_id, principal, key, fetched),
            Op::PatchConfigs {
                cluster_id,
                patch,
                keyed,
            } => self
                .patch_configs(
                    *cluster_id,
                    patch,
                    keyed,
                    &ClaimConfigPatch::default(),
                    &BudgetConfigPatch::default(),
                )
                .map(|()| Outcome::ConfigsSet {
                    config: self.config,
                    keyed: self.keyed_config,
                }),
            Op::PatchAllConfigs {
                cluster_id,
                patch,
                keyed,
                claims,
                budget,
            } => self
                .patch_configs(*cluster_id, patch, keyed, claims, budget)
                .map(|()| self.all_configs()),
            Op::RaiseRules { cluster_id, rules } => self
                .raise_rules(*cluster_id, *rules)
                .map(|()| self.all_configs()),
            Op::Claim(claim) => self.claim(log_index, claim, fetched),
            Op::CompleteClaim {
                cluster_id,
                principal,
                key,
                fence,
                result,
            } => self.complete_claim(*cluster_id, principal, key, *fence, result, fetched),
            Op::ReleaseClaim {
                cluster_id,
                principal,
                key,
                fence,
            } => self.release_claim(*cluster_id, principal, key, *fence, fetched),
            Op::ExtendClaim {
                cluster_id,
                principal,
                key,
                fence,
                lease_ms,
            } => self.extend_claim(*cluster_id, principal, key, *fence, *lease_ms, fetched),
            Op::ForgetClaim {
                cluster_id,
                principal,
                key,
            } => self.forget_claim(*cluster_id, principal, key, fetched),
        };
        result.unwrap_or_else(Outcome::Rejected)
    }

    fn advance_index(&mut self, log_index: u64) {
        assert!(
            log_index > self.applied_index,
            "applied index would move from {} to {log_index}",
            self.applied_index
        );
        self.applied_index = log_index;
    }

    /// Step 1: cluster time is the maximum stamp seen; sessions idle longer
    /// than the TTL expire, oldest first, and so do idempotency keys older
    /// than theirs.
    fn advance_time(&mut self, stamp_ms: u64) {
        self.cluster_time_ms = self.cluster_time_ms.max(stamp_ms);
        let ttl_ms = self.config.session_ttl_ms;
        while let Some(&(filed_ms, client_id)) = self.idle.0.get_min() {
            if self.cluster_time_ms.saturating_sub(filed_ms) <= ttl_ms {
                break;
            }
            let session = self
                .sessions
                .get_mut(&client_id)
                .expect("the idle index names live sessions");
            if session.last_active_ms > filed_ms {
                // Active since it was filed: refiled at its last activity
                // (where the walk meets it again if that is past the TTL).
                session.filed_ms = session.last_active_ms;
                self.idle.0.remove(&(filed_ms, client_id));
                self.idle.0.insert((session.last_active_ms, client_id));
                continue;
            }
            self.remove_session(client_id);
        }
        self.keys.expire(
            self.cluster_time_ms,
            self.keyed_config.idempotency_key_ttl_ms,
        );
        self.expire_claims();
    }

    fn remove_session(&mut self, client_id: ClientId) -> bool {
        let Some(session) = self.sessions.remove(&client_id) else {
            return false;
        };
        self.sessions_cached_bytes -= session.cached_bytes;
        self.count_session_usage(&session.owner, -1, -(session.cached_bytes as i64));
        // Sessions, nonces and the idle index agree (see `check_invariants`).
        let nonce_owner = self.nonces.remove(&session.nonce);
        assert_eq!(
            nonce_owner,
            Some(client_id),
            "a session's nonce not indexed"
        );
        let was_idle = self.idle.0.remove(&(session.filed_ms, client_id));
        assert!(was_idle.is_some(), "a session missing from the idle index");
        true
    }

    /// Checks, in time linear in the state, what every apply keeps true:
    /// sessions, nonces and the idle index name the same sessions; every
    /// session's cached responses are at or above its floor and its size is
    /// their sum; no session or activity is from the future (client id above
    /// the last given, activity after cluster time); the records of
    /// idempotency keys agree with their age index and byte count. Tests run
    /// it after every step of a model and after every snapshot round trip;
    /// the cheap halves of it are asserted where the state changes.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.nonces.len() != self.sessions.len() || self.idle.0.len() != self.sessions.len() {
            return Err(format!(
                "{} sessions, {} nonces, {} idle entries",
                self.sessions.len(),
                self.nonces.len(),
                self.idle.0.len()
            ));
        }
        for (&client_id, session) in &self.sessions {
            if self.nonces.get(&session.nonce) != Some(&client_id) {
                return Err(format!("session {} not indexed by its nonce", client_id.0));
            }
            if session.filed_ms > session.last_active_ms
                || !self.idle.0.contains(&(session.filed_ms, client_id))
            {
                return Err(format!("session {} not in the idle index", client_id.0));
            }
            if client_id.0 > self.last_client_id || session.last_active_ms > self.cluster_time_ms {
                return Err(format!("session {} from the future", client_id.0));
            }
            session
                .check_invariants()
                .map_err(|why| format!("session {}: {why}", client_id.0))?;
        }
        self.keys.check_invariants()?;
        self.claims.check_invariants()?;
        self.finished_claims.check_invariants()?;
        if !self.rules.finished_claims_grouped() && self.finished_claims.len() > 0 {
            return Err("finished claims grouped before rules version 3".to_owned());
        }
        if self.rules.finished_claims_grouped()
            && self.claims.iter().any(|(_, record)| !record.is_held())
        {
            return Err("a finished claim in memory at rules version 3".to_owned());
        }
        if self
            .finished_claims
            .iter()
            .any(|(id, stored)| self.claims.contains(id) || stored.record.is_held())
        {
            return Err("a claim both held and finished, or a held one grouped".to_owned());
        }
        self.kv.check_invariants()?;
        let cached: u64 = self
            .sessions
            .values()
            .map(|session| session.cached_bytes)
            .sum();
        let mut usage: OrdMap<Principal, (u64, u64)> = OrdMap::new();
        for session in self.sessions.values() {
            let entry = usage.entry(session.owner.clone()).or_insert((0, 0));
            entry.0 += 1;
            entry.1 += session.cached_bytes;
        }
        if usage != self.session_usage {
            return Err("per-principal session usage disagrees with the sessions".to_owned());
        }
        if cached != self.sessions_cached_bytes {
            return Err(format!(
                "sessions' cached bytes {} but sessions sum to {cached}",
                self.sessions_cached_bytes
            ));
        }
        if self
            .claims
            .iter()
            .map(|(_, record)| record)
            .chain(
                self.finished_claims
                    .iter()
                    .map(|(_, stored)| &stored.record),
            )
            .any(|record| {
                record.fence > self.last_fence || record.fence == 0 || record.attempt == 0
            })
        {
            return Err("a claim fence above the last fence issued".to_owned());
        }
        Ok(())
    }

    fn check_cluster(&self, claimed: Option<ClusterId>) -> Result<(), Rejection> {
        match (self.cluster_id, claimed) {
            (None, _) => Err(Rejection::NotBootstrapped),
            (Some(ours), Some(theirs)) if ours != theirs => {
                Err(Rejection::WrongCluster { expected: ours })
            }
            _ => Ok(()),
        }
    }

    /// Step 2: the live session of `client_id` if `principal` owns it
    /// (`SESSION_EXPIRED` if none, `PERMISSION_DENIED` if another principal
    /// owns it). Nothing about the session changes here: its activity is
    /// refreshed by [`Registry::touch`], once the request has passed every
    /// check that can refuse it.
    fn owned_session(
        &mut self,
        client_id: ClientId,
        principal: &Principal,
    ) -> Result<&mut Session, Rejection> {
        let session = self
            .sessions
            .get_mut(&client_id)
            .ok_or(Rejection::SessionExpired)?;
        if !session.owner.is(principal) {
            return Err(Rejection::PermissionDenied);
        }
        Ok(session)
    }

    /// Refreshes the activity of the live session `client_id`: called only
    /// for a request that passed every check that can refuse it (executed,
    /// answered from the cache, or a keep-alive whose floor was accepted),
    /// so refused requests never keep a session alive.
    /// (Its place in the idle index is left as it is: see [`IdleIndex`].)
    fn touch(&mut self, client_id: ClientId) {
        if let Some(session) = self.sessions.get_mut(&client_id) {
            session.last_active_ms = self.cluster_time_ms;
        }
    }

    /// Fixes the cluster id, the registry config and the rules version,
    /// with that version's idempotency-key config.
    fn bootstrap(
        &mut self,
        cluster_id: ClusterId,
        config: &RegistryConfig,
        rules: RulesVersion,
    ) -> Result<Outcome, Rejection> {
        match self.cluster_id {
            Some(ours) if ours == cluster_id => Ok(Outcome::Bootstrapped {
                cluster_id,
                already: true,
            }),
            Some(ours) => Err(Rejection::WrongCluster { expected: ours }),
            None => {
                check_rules_known(rules)?;
                config.validate().map_err(Rejection::InvalidArgument)?;
                let keyed = KeyedConfig::for_rules(rules);
                keyed.validate(config).map_err(Rejection::InvalidArgument)?;
                let claims = ClaimConfig::for_rules(rules);
                claims.validate().map_err(Rejection::InvalidArgument)?;
                self.budget
                    .validate(config, &keyed, &claims)
                    .map_err(Rejection::InvalidArgument)?;
                self.cluster_id = Some(cluster_id);
                self.config = *config;
                self.keyed_config = keyed;
                self.claim_config = claims;
                self.rules = rules;
                Ok(Outcome::Bootstrapped {
                    cluster_id,
                    already: false,
                })
            }
        }
    }

    fn register(
        &mut self,
        log_index: u64,
        cluster_id: Option<ClusterId>,
        nonce: Nonce,
        principal: &Principal,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(cluster_id)?;
        let registration = |client_id, duplicate| Registration {
            cluster_id: cluster_id.or(self.cluster_id).expect("checked above"),
            client_id,
            session_ttl_ms: self.config.session_ttl_ms,
            window: self.config.window,
            limits: self.config.request_limits(),
            duplicate,
        };
        if let Some(&client_id) = self.nonces.get(&nonce) {
            let reply = registration(client_id, true);
            // A nonce is secret to its client; another principal naming it
            // learns nothing and changes nothing.
            self.owned_session(client_id, principal)?;
            self.touch(client_id);
            return Ok(Outcome::Registered(reply));
        }
        if self.sessions.len() as u64 >= self.config.sessions_max {
            return Err(Rejection::ResourceExhausted(Limit::Sessions));
        }
        self.check_budget(SESSION_MEMORY_BOOKKEEPING_BYTES)?;
        let owned = self.session_usage.get(principal).map_or(0, |usage| usage.0);
        self.check_quota(
            principal,
            Some((owned, self.config.sessions_max)),
            SESSION_MEMORY_BOOKKEEPING_BYTES,
        )?;
        // One above every id assigned before, and at least the entry's log
        // index: a function of the log alone (rule 1), unique forever, and
        // the log index itself for an entry carrying one registration.
        let client_id = ClientId(self.last_client_id.saturating_add(1).max(log_index));
        let reply = registration(client_id, false);
        self.last_client_id = client_id.0;
        self.sessions.insert(
            client_id,
            Session::new(nonce, principal.clone(), self.cluster_time_ms),
        );
        self.nonces.insert(nonce, client_id);
        self.idle.0.insert((self.cluster_time_ms, client_id));
        self.count_session_usage(principal, 1, 0);
        Ok(Outcome::Registered(reply))
    }

    fn execute(&mut self, request: &Execute) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(request.cluster_id))?;
        let config = self.config;
        let session = self.owned_session(request.client_id, &request.principal)?;
        if request.first_outstanding_seq > request.seq {
            return Err(Rejection::InvalidArgument(InvalidArgument::FloorAboveSeq {
                seq: request.seq,
                first_outstanding_seq: request.first_outstanding_seq,
            }));
        }
        check_floor_bound(session, request.first_outstanding_seq, config.window)?;
        session.raise_floor(request.first_outstanding_seq);
        if request.seq < session.floor {
            return Err(Rejection::ResponseDiscarded {
                floor: session.floor,
            });
        }
        let fingerprint = fingerprint::fingerprint(&request.command);
        // DELIBERATELY BROKEN when built with `broken-skip-dedup` (a
        // fault-injection build for the jepsen-like harness only, to prove
        // its checker catches a registry that executes retries again): a
        // cached (client, seq) with the same fingerprint is executed anew.
        #[cfg(feature = "broken-skip-dedup")]
        let skip_dedup = session
            .responses
            .get(&request.seq)
            .is_some_and(|cached| cached.fingerprint == fingerprint);
        #[cfg(not(feature = "broken-skip-dedup"))]
        let skip_dedup = false;
        if let Some(cached) = session.responses.get(&request.seq)
            && !skip_dedup
        {
            if cached.fingerprint != fingerprint {
                return Err(Rejection::SeqConflict);
            }
            let response = cached.result.clone();
            self.touch(request.client_id);
            return Ok(answer(response, true));
        }
        if request.seq >= session.floor.saturating_add(config.window) {
            return Err(Rejection::TooManyOutstanding {
                floor: session.floor,
                window: config.window,
            });
        }
        let cached_bytes = session.cached_bytes;
        // Step 7: limits, before any effect.
        check_key(&request.command)?;
        let planned = match self.kv.plan(&request.command, &config) {
            Ok(plan) => Ok(plan),
            Err(Refusal::Exceeded(exceeded)) => Err(exceeded),
            Err(Refusal::Exhausted(limit)) => return Err(Rejection::ResourceExhausted(limit)),
        };
        // A result no session could cache, even an empty one, can never be
        // answered: a limit of the request (given the data), like the rest.
        let planned = match planned {
            Ok(plan) if plan.result.cached_size_bytes() > config.cached_bytes_per_session_max => {
                Err(LimitExceeded {
                    limit: Limit::CachedBytesPerSession,
                    max: config.cached_bytes_per_session_max,
                    requested: plan.result.cached_size_bytes(),
                })
            }
            other => other,
        };
        let (response, effect) = match planned {
            Ok(plan) => (Ok(plan.result), Some(plan.effect)),
            Err(exceeded) => (Err(exceeded), None),
        };
        if cached_bytes + response_size_bytes(&response) > config.cached_bytes_per_session_max {
            return Err(Rejection::ResourceExhausted(Limit::CachedBytesPerSession));
        }
        let data_growth = effect.as_ref().map_or(0, |effect| {
            self.kv.growth_bytes(request.command.key(), effect)
        });
        self.check_budget(response_size_bytes(&response).saturating_add(data_growth))?;
        self.check_quota(&request.principal, None, response_size_bytes(&response))?;
        let session = self
            .sessions
            .get_mut(&request.client_id)
            .expect("found above");
        session.cache(request.seq, fingerprint, response.clone());
        // Touched (see `touch`) through the lookup just made.
        session.last_active_ms = self.cluster_time_ms;
        if let Some(effect) = effect {
            self.kv.apply(request.command.key(), effect);
        }
        Ok(answer(response, false))
    }

    fn execute_plain(
        &mut self,
        cluster_id: ClusterId,
        command: &Command,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        check_key(command)?;
        let plan = match self.kv.plan(command, &self.config) {
            Ok(plan) => plan,
            Err(Refusal::Exceeded(exceeded)) => return Ok(answer(Err(exceeded), false)),
            Err(Refusal::Exhausted(limit)) => return Err(Rejection::ResourceExhausted(limit)),
        };
        self.check_budget(self.kv.growth_bytes(command.key(), &plan.effect))?;
        self.kv.apply(command.key(), plan.effect);
        Ok(Outcome::Executed {
            result: plan.result,
            duplicate: false,
        })
    }

    fn keep_alive(
        &mut self,
        cluster_id: ClusterId,
        client_id: ClientId,
        first_outstanding_seq: Seq,
        principal: &Principal,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        let window = self.config.window;
        let session = self.owned_session(client_id, principal)?;
        check_floor_bound(session, first_outstanding_seq, window)?;
        session.raise_floor(first_outstanding_seq);
        let floor = session.floor;
        self.touch(client_id);
        Ok(Outcome::KeptAlive {
            floor,
            session_ttl_ms: self.config.session_ttl_ms,
            limits: self.config.request_limits(),
        })
    }

    fn unregister(
        &mut self,
        cluster_id: ClusterId,
        client_id: ClientId,
        principal: Option<&Principal>,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        if let (Some(session), Some(principal)) = (self.sessions.get(&client_id), principal)
            && session.owner != *principal
        {
            return Err(Rejection::PermissionDenied);
        }
        if self.remove_session(client_id) {
            Ok(Outcome::Unregistered)
        } else {
            Err(Rejection::SessionExpired)
        }
    }

    /// Applies a config patch to the config in force now, and the result
    /// only if it is valid as a whole (rule 12).
    fn set_config(
        &mut self,
        cluster_id: ClusterId,
        patch: &ConfigPatch,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        if patch.is_empty() {
            return Err(Rejection::InvalidArgument(
                InvalidArgument::EmptyConfigPatch,
            ));
        }
        let config = patch.applied_to(&self.config);
        config.validate().map_err(Rejection::InvalidArgument)?;
        // The keyed config must still fit the new registry config (with the
        // default keyed config of every log before keys existed, it always
        // does: those entries apply as they did).
        self.keyed_config
            .validate(&config)
            .map_err(Rejection::InvalidArgument)?;
        self.budget
            .validate(&config, &self.keyed_config, &self.claim_config)
            .map_err(Rejection::InvalidArgument)?;
        self.config = config;
        Ok(Outcome::ConfigSet(config))
    }

    /// Applies the patches to the configs in force now, and the results
    /// only if they are valid together; the configs now in force. A shorter
    /// key or claim TTL takes effect at this entry: records older than it
    /// expire here, on every replica; from rules version 4 a changed TTL
    /// also ends the group open here, so later records go in groups of its
    /// width.
    fn patch_configs(
        &mut self,
        cluster_id: ClusterId,
        patch: &ConfigPatch,
        keyed: &KeyedConfigPatch,
        claims: &ClaimConfigPatch,
        budget: &BudgetConfigPatch,
    ) -> Result<(), Rejection> {
        self.check_cluster(Some(cluster_id))?;
        if patch.is_empty() && keyed.is_empty() && claims.is_empty() && budget.is_empty() {
            return Err(Rejection::InvalidArgument(
                InvalidArgument::EmptyConfigPatch,
            ));
        }
        let config = patch.applied_to(&self.config);
        config.validate().map_err(Rejection::InvalidArgument)?;
        let keyed_patched = keyed.applied_to(&self.keyed_config);
        keyed_patched
            .validate(&config)
            .map_err(Rejection::InvalidArgument)?;
        let claim_config = claims.applied_to(&self.claim_config);
        claim_config
            .validate()
            .map_err(Rejection::InvalidArgument)?;
        let budget = budget.applied_to(&self.budget);
        budget
            .validate(&config, &keyed_patched, &claim_config)
            .map_err(Rejection::InvalidArgument)?;
        let key_ttl_changed =
            keyed_patched.idempotency_key_ttl_ms != self.keyed_config.idempotency_key_ttl_ms;
        let claim_ttl_changed = claim_config.claim_ttl_ms != self.claim_config.claim_ttl_ms;
        self.budget = budget;
        self.config = config;
        self.keyed_config = keyed_patched;
        self.claim_config = claim_config;
        if self.rules.ttl_change_ends_open_group() {
            // The next record opens a group of the new TTL's width.
            if key_ttl_changed {
                self.keys.end_open_group(self.cluster_time_ms);
            }
            if claim_ttl_changed {
                self.finished_claims.end_open_group(self.cluster_time_ms);
            }
        }
        self.keys
            .expire(self.cluster_time_ms, keyed_patched.idempotency_key_ttl_ms);
        self.expire_claims();
        Ok(())
    }

    /// Raises the rules version (never lowers it; raising it to the version
    /// in force changes nothing, so a retried raise is harmless).
    fn raise_rules(&mut self, cluster_id: ClusterId, rules: RulesVersion) -> Result<(), Rejection> {
        self.check_cluster(Some(cluster_id))?;
        check_rules_known(rules)?;
        if rules < self.rules {
            return Err(Rejection::InvalidArgument(InvalidArgument::Config(
                format!(
                    "rules_version {rules} is below the version in force ({}): it never goes down",
                    self.rules
                ),
            )));
        }
        let grouping = !self.rules.finished_claims_grouped() && rules.finished_claims_grouped();
        self.rules = rules;
        if grouping {
            self.group_finished_claims();
        }
        Ok(())
    }

    /// Every config and the rules version in force, as an outcome.
    fn all_configs(&self) -> Outcome {
        Outcome::AllConfigsSet {
            config: self.config,
            keyed: self.keyed_config,
            claims: self.claim_config,
            budget: self.budget,
            rules: self.rules,
        }
    }

    /// The answer a keyed request would get from its key's record, without
    /// applying anything: `Some` only when applying it now would pass steps
    /// 1–2 and answer the record's cached response as a duplicate at step 3
    /// (same fingerprint), which changes nothing. A leader may serve that
    /// answer after a read index (rule 3's one shortcut); anything else —
    /// no record, another fingerprint, a refused key — is `None` and goes
    /// through the log.
    ///
    /// `now_ms` is the earliest cluster time the request would be applied
    /// at (a leader's clock: the stamp it would give the request's entry).
    /// A record that has expired by then is `None` too: the log, whose
    /// entry moves cluster time there, expires it and executes the request
    /// anew. Without it an idle cluster, whose cluster time moves only with
    /// entries, would answer a key past its TTL from the record.
    pub fn keyed_duplicate_answer(
        &self,
        cluster_id: ClusterId,
        key: &IdempotencyKey,
        command: &Command,
        principal: &Principal,
        now_ms: u64,
    ) -> Option<Outcome> {
        self.keyed_duplicate_answer_with(cluster_id, key, command, principal, now_ms, |_| None)
    }

    /// [`Registry::keyed_duplicate_answer`] for a registry whose key
    /// records may lie in an adapter's store: `stored` reads what the store
    /// holds under an id (asked only when the registry holds no change for
    /// it; `None` also when it cannot say, which sends the request through
    /// the log).
    pub fn keyed_duplicate_answer_with(
        &self,
        cluster_id: ClusterId,
        key: &IdempotencyKey,
        command: &Command,
        principal: &Principal,
        now_ms: u64,
        stored: impl FnOnce(&KeyId) -> Option<GroupedRecord>,
    ) -> Option<Outcome> {
        self.check_cluster(Some(cluster_id)).ok()?;
        check_idempotency_key(key, &self.keyed_config).ok()?;
        let id = (principal.clone(), key.clone());
        let found = self.keys.must_fetch(&id).then(|| stored(&id)).flatten();
        let stored = self.live_key(&id, found)?;
        if self.key_expires_after_ms(&stored) < now_ms {
            return None;
        }
        let record = stored.record;
        (record.response.fingerprint == fingerprint::fingerprint(command))
            .then(|| answer(record.response.result, true))
    }

    /// A keyed request (rule 18), in the order of checks of the module doc.
    fn execute_keyed(
        &mut self,
        cluster_id: ClusterId,
        key: &IdempotencyKey,
        command: &Command,
        principal: &Principal,
        fetched: &Prefetched,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        let keyed = self.keyed_config;
        // Step 2: the key itself.
        check_idempotency_key(key, &keyed)?;
        // Step 3: a record of the key.
        let id: KeyId = (principal.clone(), key.clone());
        let fingerprint = fingerprint::fingerprint(command);
        // DELIBERATELY BROKEN when built with `broken-skip-dedup` (see
        // `execute`): a repeat of a key with the same command executes anew.
        #[cfg(feature = "broken-skip-dedup")]
        let skip_dedup = self
            .keys
            .get(&id, &fetched.keys)
            .is_some_and(|stored| stored.record.response.fingerprint == fingerprint);
        #[cfg(not(feature = "broken-skip-dedup"))]
        let skip_dedup = false;
        if skip_dedup {
            self.keys.remove(&id, &fetched.keys);
        }
        if let Some(GroupedRecord { record, .. }) = self.keys.get(&id, &fetched.keys) {
            return if record.response.fingerprint == fingerprint {
                Ok(answer(record.response.result.clone(), true))
            } else {
                Err(Rejection::KeyConflict)
            };
        }
        // Step 4: limits, before any effect.
        let (response, effect) = self.plan_keyed(command, principal, key)?;
        if self.keys.len() >= keyed.idempotency_keys_max {
            return Err(Rejection::ResourceExhausted(Limit::IdempotencyKeys));
        }
        let size = key_record_size_bytes(principal, key, response_size_bytes(&response));
        if self.keys.cached_bytes().saturating_add(size) > keyed.idempotency_cached_bytes_max {
            return Err(Rejection::ResourceExhausted(Limit::IdempotencyCachedBytes));
        }
        let data_growth = effect
            .as_ref()
            .map_or(0, |effect| self.kv.growth_bytes(command.key(), effect));
        // From rules version 2 the record lies in the record store: it
        // counts against the principal's share of the records' bytes, not
        // against the budget or the principal's share of it.
        let on_budget = self.rules.key_records_in_memory_budget();
        let memory_growth = if on_budget { size } else { 0 };
        self.check_budget(memory_growth.saturating_add(data_growth))?;
        let (keys_held, key_bytes_held) = self.keys.usage(principal);
        self.check_quota(
            principal,
            Some((keys_held, keyed.idempotency_keys_max)),
            memory_growth,
        )?;
        if !on_budget
            && !principal.is_anonymous()
            && key_bytes_held.saturating_add(size) > self.quota(keyed.idempotency_cached_bytes_max)
        {
            return Err(Rejection::ResourceExhausted(Limit::PrincipalQuota));
        }
        // Step 5: execute and record.
        self.keys.insert(
            id,
            KeyRecord {
                created_ms: self.cluster_time_ms,
                response: CachedResponse {
                    fingerprint,
                    result: response.clone(),
                },
            },
            key_group_width_ms(keyed.idempotency_key_ttl_ms),
        );
        if let Some(effect) = effect {
            self.kv.apply(command.key(), effect);
        }
        Ok(answer(response, false))
    }

    /// A keyed command's response and effect, its limits checked (step 4 of
    /// a keyed request): a command that breaks a limit by itself, or whose
    /// record would not fit even in an empty key store (a limit of the
    /// request, given the data, like the rest), has that refusal as its
    /// recorded response and no effect; a capacity limit reached is a
    /// rejection, recorded nowhere.
    fn plan_keyed(
        &self,
        command: &Command,
        principal: &Principal,
        key: &IdempotencyKey,
    ) -> Result<(Result<CommandResult, LimitExceeded>, Option<kv::Effect>), Rejection> {
        check_key(command)?;
        let plan = match self.kv.plan(command, &self.config) {
            Ok(plan) => plan,
            Err(Refusal::Exceeded(exceeded)) => return Ok((Err(exceeded), None)),
            Err(Refusal::Exhausted(limit)) => return Err(Rejection::ResourceExhausted(limit)),
        };
        let max = self.keyed_config.idempotency_cached_bytes_max;
        let size = key_record_size_bytes(principal, key, plan.result.cached_size_bytes());
        if size > max {
            let exceeded = LimitExceeded {
                limit: Limit::IdempotencyCachedBytes,
                max,
                requested: size,
            };
            return Ok((Err(exceeded), None));
        }
        Ok((Ok(plan.result), Some(plan.effect)))
    }

    /// An operator's removal of a key's record, through the log.
    fn forget_key(
        &mut self,
        cluster_id: ClusterId,
        principal: &Principal,
        key: &IdempotencyKey,
        fetched: &Prefetched,
    ) -> Result<Outcome, Rejection> {
        self.check_cluster(Some(cluster_id))?;
        let existed = self
            .keys
            .remove(&(principal.clone(), key.clone()), &fetched.keys);
        Ok(Outcome::KeyForgotten { existed })
    }
}

/// The outcome of an execute whose response is `response`.
fn answer(response: Result<CommandResult, LimitExceeded>, duplicate: bool) -> Outcome {
    match response {
        Ok(result) => Outcome::Executed { result, duplicate },
        Err(exceeded) => Outcome::Rejected(Rejection::LimitExceeded {
            exceeded,
            duplicate,
        }),
    }
}

/// Step 3: the floor may be raised at most to one past the highest seq
/// the session has had applied (or to its floor, if higher), plus the
/// window (rule 7), so that no single request — a keep-alive with
/// `u64::MAX`, say — can put every later seq of the session below its
/// floor. A correct client stays within it by never sending a floor more
/// than a window past the last one the cluster confirmed to it (the client
/// library's `Seqs`): however many of its requests end unknown while the
/// cluster is out of reach, their fences wait until the cluster
/// acknowledges the floors before them. A floor that does not rise is
/// always accepted. A refusal here leaves the session untouched — floor,
/// cache and activity — so a client that can only be refused lets its
/// session expire.
fn check_floor_bound(
    session: &Session,
    first_outstanding_seq: Seq,
    window: u64,
) -> Result<(), Rejection> {
    let bound_seq = session
        .highest_seq
        .saturating_add(1)
        .max(session.floor)
        .saturating_add(window);
    if first_outstanding_seq > session.floor && first_outstanding_seq > bound_seq {
        return Err(Rejection::InvalidArgument(
            InvalidArgument::FloorBeyondBound {
                first_outstanding_seq,
                bound_seq,
            },
        ));
    }
    Ok(())
}

/// Refuses a rules version this build does not know.
fn check_rules_known(rules: RulesVersion) -> Result<(), Rejection> {
    match rules.unknown_to_this_build() {
        None => Ok(()),
        Some(why) => Err(Rejection::InvalidArgument(InvalidArgument::Config(why))),
    }
}

/// Step 2 of a keyed request: an idempotency key is not empty and within
/// its configured length.
fn check_idempotency_key(key: &IdempotencyKey, keyed: &KeyedConfig) -> Result<(), Rejection> {
    if key.0.is_empty() {
        return Err(Rejection::InvalidArgument(
            InvalidArgument::EmptyIdempotencyKey,
        ));
    }
    if key.0.len() as u64 > keyed.idempotency_key_bytes_max {
        return Err(Rejection::LimitExceeded {
            exceeded: LimitExceeded {
                limit: Limit::IdempotencyKeyBytes,
                max: keyed.idempotency_key_bytes_max,
                requested: key.0.len() as u64,
            },
            duplicate: false,
        });
    }
    Ok(())
}

/// Step 7a: an empty key is malformed (as etcd has it).
fn check_key(command: &Command) -> Result<(), Rejection> {
    if command.key().is_empty() {
        return Err(Rejection::InvalidArgument(InvalidArgument::EmptyKey));
    }
    Ok(())
}

fn view(client_id: ClientId, session: &Session, cluster_time_ms: u64) -> SessionView {
    SessionView {
        client_id,
        owner: session.owner.clone(),
        floor: session.floor,
        last_active_ms: session.last_active_ms,
        idle_ms: cluster_time_ms.saturating_sub(session.last_active_ms),
        cached_responses: session.responses.len() as u64,
        cached_bytes: session.cached_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: ClusterId = ClusterId(7);

    fn entry(stamp_ms: u64, op: Op) -> Entry {
        Entry::single(stamp_ms, op)
    }

    /// A bootstrapped registry with sessions registered at indexes 2..=6.
    fn registry() -> Registry {
        let mut registry = Registry::new();
        let bootstrap = Op::Bootstrap {
            cluster_id: CLUSTER,
            config: RegistryConfig::default(),
        };
        registry.apply(1, &entry(0, bootstrap));
        for index in 2..=6 {
            let register = Op::Register {
                cluster_id: Some(CLUSTER),
                nonce: Nonce(u128::from(index)),
                principal: crate::Principal::anonymous(),
            };
            registry.apply(index, &entry(index * 10, register));
        }
        registry
    }

    /// Pages walk every session once, in client id order, and say when more
    /// follow.
    #[test]
    fn sessions_page_in_client_id_order() {
        let registry = registry();
        let ids = |page: &[SessionView]| page.iter().map(|s| s.client_id.0).collect::<Vec<_>>();
        let (first, more) = registry.sessions_after(ClientId(0), 2);
        assert_eq!((ids(&first), more), (vec![2, 3], true));
        let (second, more) = registry.sessions_after(ClientId(3), 2);
        assert_eq!((ids(&second), more), (vec![4, 5], true));
        let (last, more) = registry.sessions_after(ClientId(5), 2);
        assert_eq!((ids(&last), more), (vec![6], false));
        let (none, more) = registry.sessions_after(ClientId(6), 2);
        assert!(none.is_empty() && !more);
        let (exact, more) = registry.sessions_after(ClientId(0), 5);
        assert_eq!((exact.len(), more), (5, false));
        assert!(registry.sessions_after(ClientId(0), 0).0.is_empty());
    }

    /// A session's view reports its floor, cache and idle time in cluster
    /// time.
    #[test]
    fn session_view_reports_activity_and_cache() {
        let mut registry = registry();
        let execute = Execute {
            cluster_id: CLUSTER,
            client_id: ClientId(3),
            seq: 4,
            first_outstanding_seq: 2,
            command: Command::Increment {
                key: b"k".to_vec(),
                delta: 1,
            },
            principal: crate::Principal::anonymous(),
        };
        registry.apply(7, &entry(100, Op::Execute(execute)));
        registry.apply(
            8,
            &entry(
                250,
                Op::KeepAlive {
                    cluster_id: CLUSTER,
                    client_id: ClientId(2),
                    first_outstanding_seq: 0,
                    principal: crate::Principal::anonymous(),
                },
            ),
        );
        let view = registry.session(ClientId(3)).expect("live");
        assert_eq!(view.floor, 2);
        assert_eq!(view.cached_responses, 1);
        assert_eq!(view.cached_bytes, 32);
        assert_eq!(view.last_active_ms, 100);
        assert_eq!(view.idle_ms, 150);
        assert_eq!(registry.session(ClientId(2)).unwrap().idle_ms, 0);
        assert_eq!(registry.session(ClientId(99)), None);
        assert_eq!(registry.sessions().count(), 5);
    }
}
