//! The registry's vocabulary: ids, log entries, commands, values, results and
//! rejections. Plain data only — no behaviour that depends on state lives here.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A client's id, assigned when its registration is applied (rule 1): one
/// above the largest id ever assigned, and at least the log index of the
/// entry that carried the registration. It depends only on the log, so every
/// replica agrees on it, and it is never reused (see `Registry::register`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClientId(pub u64);

/// The random identity a cluster receives when it is initialised (rule 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClusterId(pub u128);

/// The 128-bit random value a client chooses for one logical registration (rule 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Nonce(pub u128);

/// A per-client request number, chosen by the client and reused on every retry.
pub type Seq = u64;

/// Who made a request: the authenticated identity the client port saw (a
/// certificate name or a token's principal), or [`Principal::anonymous`]
/// when authentication is off. The registry records the principal that
/// registered a session and refuses requests of any other on it (rule 19);
/// it never interprets the name.
///
/// Compared as its name is (byte order), but never by `memcmp` when a name
/// is empty: the anonymous principal's name has no buffer (a dangling
/// pointer), and this machine's glibc `memcmp` (2.36, its EVEX variant)
/// takes ~100 ns on a zero-length compare there — a masked load of a page
/// that is not mapped, which the CPU completes by a microcode assist —
/// against ~2 ns for a short name. Every id of every idempotency key of a
/// cluster without authentication leads with it, so each comparison of
/// two ids in a map lookup, a snapshot's order check or a group's tally
/// paid that (docs/state-beyond-ram.md §4.9n).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Principal(pub String);

impl std::hash::Hash for Principal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As the name hashes: equal principals have equal names.
        self.0.hash(state);
    }
}

impl PartialEq for Principal {
    fn eq(&self, other: &Principal) -> bool {
        self.0.len() == other.0.len() && (self.0.is_empty() || self.0 == other.0)
    }
}

impl Eq for Principal {}

impl PartialOrd for Principal {
    fn partial_cmp(&self, other: &Principal) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Principal {
    fn cmp(&self, other: &Principal) -> std::cmp::Ordering {
        if self.0.is_empty() || other.0.is_empty() {
            // The empty name sorts first; two are equal.
            self.0.len().cmp(&other.0.len())
        } else {
            self.0.cmp(&other.0)
        }
    }
}

impl Principal {
    /// Most bytes in a principal's name (the client port refuses longer
    /// ones before anything is proposed).
    pub const BYTES_MAX: usize = 256;

    /// The one principal of a node without authentication (the empty name).
    pub fn anonymous() -> Principal {
        Principal(String::new())
    }

    pub fn is_anonymous(&self) -> bool {
        self.0.is_empty()
    }

    /// Equality (`==`, which decides the anonymous case without comparing
    /// bytes: see the type's doc).
    pub fn is(&self, other: &Principal) -> bool {
        self == other
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_anonymous() {
            f.write_str("(anonymous)")
        } else {
            f.write_str(&self.0)
        }
    }
}

/// The 128-bit fingerprint of a command (see [`crate::fingerprint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fingerprint(pub u128);

/// A caller's idempotency key (rule 18): opaque bytes naming one logical
/// request of a producer that has no session (a message id, a webhook's
/// delivery id, an HTTP `Idempotency-Key`). The registry addresses a key's
/// record by (principal, key), so two principals' equal keys are distinct;
/// without authentication every caller is the anonymous principal and all
/// share one namespace, so a caller that shares the cluster with others
/// should put its own namespace into its keys (`"billing/msg-42"`).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IdempotencyKey(#[serde(with = "crate::codec::bytes")] pub Vec<u8>);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// One registry entry of the replicated log: a batch of requests (rule 17).
///
/// `stamp_ms` is the proposing leader's cluster clock (rule 11), stamped
/// once for the whole batch; the state machine's cluster time is the maximum
/// stamp seen so far, so a stamp that goes backwards never moves time back.
/// The requests are applied in order, each through the full check order and
/// each with its own outcome; one request's refusal never affects another's.
///
/// The batch is shared (`Arc`): the Raft log hands out copies of an entry
/// for every follower's append and again for apply, and those copies must
/// not duplicate every key and value. It encodes exactly like a `Vec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub stamp_ms: u64,
    pub ops: Arc<[Op]>,
}

/// A short summary (Raft logs entries by their `Display`): the stamp and
/// how many requests the batch carries, never the payloads.
impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "entry(stamp_ms={}, requests={})",
            self.stamp_ms,
            self.ops.len()
        )
    }
}

impl Entry {
    /// An entry carrying one request.
    pub fn single(stamp_ms: u64, op: Op) -> Entry {
        Entry {
            stamp_ms,
            ops: Arc::new([op]),
        }
    }
}

/// What a registry entry asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Fixes the cluster id and the initial registry config. Proposed once
    /// when the cluster is initialised; later copies change nothing.
    Bootstrap {
        cluster_id: ClusterId,
        config: RegistryConfig,
    },
    /// Registers a client. `cluster_id` is `None` only for a client that has
    /// not learnt the cluster's id yet; the reply tells it.
    Register {
        cluster_id: Option<ClusterId>,
        nonce: Nonce,
        /// Who registers: the session's owner from now on (rule 19).
        principal: Principal,
    },
    /// A request of a registered client against the key-value store.
    Execute(Execute),
    /// Refreshes a session's activity and carries its floor.
    KeepAlive {
        cluster_id: ClusterId,
        client_id: ClientId,
        first_outstanding_seq: Seq,
        /// Who asks; must be the session's owner.
        principal: Principal,
    },
    /// Ends a session (a client's graceful close, or an operator's expiry).
    Unregister {
        cluster_id: ClusterId,
        client_id: ClientId,
        /// Who asks; must be the session's owner. `None`: an operator's
        /// expiry (`Admin.ExpireSession`), the one override of ownership.
        principal: Option<Principal>,
    },
    /// Replaces the whole TTL and limits (rule 12). Builds before
    /// `PatchConfig` proposed this; it stays so that every later request
    /// kind keeps its number, and is still applied (as a patch setting
    /// every field), but nothing proposes it any more: two operators each
    /// writing back a whole config could undo each other's change.
    SetConfig {
        cluster_id: ClusterId,
        config: RegistryConfig,
    },
    /// A command outside any session: executed every time it is applied,
    /// never cached — at-least-once, for comparison and for callers that
    /// accept duplicates. Data limits still apply.
    ExecutePlain {
        cluster_id: ClusterId,
        command: Command,
    },
    /// Changes the fields the patch sets, on the config in force when the
    /// entry applies (rule 12); the combination is validated then. Added
    /// after every other variant, so entries written before it decode
    /// unchanged.
    PatchConfig {
        cluster_id: ClusterId,
        patch: ConfigPatch,
    },
    /// A command executed exactly once per (principal, idempotency key)
    /// (rule 18), with no session: the first committed request with the key
    /// executes and its result is kept with the command's fingerprint until
    /// the key expires. Added after every other variant (entry format 5),
    /// so entries written before it decode unchanged.
    ExecuteKeyed {
        cluster_id: ClusterId,
        key: IdempotencyKey,
        command: Command,
        /// Who asks: the key's namespace (rule 19).
        principal: Principal,
    },
    /// Removes the record of (principal, key) before its TTL: an
    /// operator's action (`Admin.ForgetKey`), through the log. A later
    /// request with the key executes anew.
    ForgetKey {
        cluster_id: ClusterId,
        principal: Principal,
        key: IdempotencyKey,
    },
    /// Changes the fields the patches set, of the registry config and of
    /// the idempotency-key config together, on the configs in force when
    /// the entry applies; the combination is validated then, as a whole.
    /// What `Admin.SetConfig` proposes since entry format 5.
    PatchConfigs {
        cluster_id: ClusterId,
        patch: ConfigPatch,
        keyed: KeyedConfigPatch,
    },
    /// Claims (principal, key) for an effect performed outside oncekv
    /// (rule 20): won when the key has no record, was released, or its
    /// holder's lease ran out in cluster time; otherwise answered from the
    /// record (in progress, completed, or `KEY_CONFLICT`). Added with entry
    /// format 6, after every earlier variant.
    Claim(Claim),
    /// Records the result of the effect of the holder of `fence`; any other
    /// fence is `FENCED`.
    CompleteClaim {
        cluster_id: ClusterId,
        principal: Principal,
        key: IdempotencyKey,
        fence: u64,
        #[serde(with = "crate::codec::bytes")]
        result: Vec<u8>,
    },
    /// The holder of `fence` gives up: the effect did not happen, the next
    /// claim wins at once.
    ReleaseClaim {
        cluster_id: ClusterId,
        principal: Principal,
        key: IdempotencyKey,
        fence: u64,
    },
    /// The holder of `fence` moves its lease deadline to `lease_ms` after
    /// the entry's cluster time (never earlier than it was).
    ExtendClaim {
        cluster_id: ClusterId,
        principal: Principal,
        key: IdempotencyKey,
        fence: u64,
        lease_ms: u64,
    },
    /// Removes the claim record of (principal, key) before its TTL: an
    /// operator's action (`Admin.ForgetClaim`). Fences keep growing: a
    /// later claim of the key gets a larger one than any issued before.
    ForgetClaim {
        cluster_id: ClusterId,
        principal: Principal,
        key: IdempotencyKey,
    },
    /// Changes the fields the patches set, of the registry, idempotency-key
    /// and claim configs together, validated as a whole when the entry
    /// applies. What `Admin.SetConfig` proposes since entry format 6.
    PatchAllConfigs {
        cluster_id: ClusterId,
        patch: ConfigPatch,
        keyed: KeyedConfigPatch,
        claims: ClaimConfigPatch,
        budget: BudgetConfigPatch,
    },
    /// `Bootstrap` under `rules` (not version 1) with that version's
    /// default configs ([`KeyedConfig::for_rules`]): what a node proposes
    /// to start a new cluster since entry format 7.
    BootstrapWithRules {
        cluster_id: ClusterId,
        config: RegistryConfig,
        rules: RulesVersion,
    },
    /// Raises the rules version to `rules` at this entry, on every replica
    /// alike; never lowers it, and changes no config. What `Admin.SetConfig`
    /// proposes for `rules_version` (entry format 7).
    RaiseRules {
        cluster_id: ClusterId,
        rules: RulesVersion,
    },
}

impl Op {
    /// The rules version this request names (a bootstrap under one, or a
    /// raise): a node whose build does not know it must not apply the
    /// entry at all — refusing it would be a decision the nodes that know
    /// the version make otherwise — but stop ([`RulesVersion::is_known`]).
    pub fn rules_named(&self) -> Option<RulesVersion> {
        match self {
            Op::BootstrapWithRules { rules, .. } | Op::RaiseRules { rules, .. } => Some(*rules),
            _ => None,
        }
    }

    /// The entry format that first holds this request: an entry is written
    /// in the lowest format holding all of its requests, so a build that
    /// reads an older format still follows a cluster until an operator
    /// asks for something new ([`crate::codec::encode_entry`]).
    pub fn entry_format(&self) -> u8 {
        match self {
            Op::BootstrapWithRules { .. } | Op::RaiseRules { .. } => 7,
            _ => 6,
        }
    }
}

/// The version of the rules by which entries apply, replicated: a change
/// of how a request is decided that replicas must all make at one log
/// index, never as each node happens to be upgraded (a node replaying its
/// log after an upgrade would otherwise decide old entries by new rules).
/// A state made before versions existed is at version 1; a new cluster
/// starts at [`RulesVersion::LATEST`]; an operator raises an older cluster
/// when every node runs a build that knows the new version (`Op::RaiseRules`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RulesVersion(pub u32);

impl RulesVersion {
    /// Idempotency-key records count against the memory budget and their
    /// principal's share of it, as when they were all held in memory.
    pub const V1: RulesVersion = RulesVersion(1);
    /// Idempotency-key records lie in the node's record store, not in
    /// memory: they count against `idempotency_cached_bytes_max` (and
    /// their principal's share of it), not the memory budget. A cluster
    /// started at this version gets [`KeyedConfig::for_rules`]'s limits
    /// (50 M keys, 16 GiB).
    pub const V2: RulesVersion = RulesVersion(2);
    /// Finished claims (completed or released) lie in creation-time groups
    /// like idempotency keys, so that they can lie in the node's record
    /// store: a finished claim lives at least `claim_ttl_ms` and less than
    /// that plus one group's width ([`crate::key_group_width_ms`] of the
    /// claim TTL); a held one stays in memory, exact. Finished claims count
    /// against `claim_cached_bytes_max` (and their principal's share of
    /// it), not the memory budget; a released claim taken over comes back
    /// under the budget. A cluster started at this version gets
    /// [`ClaimConfig::for_rules`]'s limits (50 M claims, 16 GiB).
    pub const V3: RulesVersion = RulesVersion(3);
    /// A change of the key TTL (or the claim TTL) ends the group open at
    /// that entry, so that the next record opens a group of the width the
    /// new TTL gives ([`crate::key_group_width_ms`]): a key (or finished
    /// claim) made after the change lives at least the new TTL and less
    /// than that plus the new width. Before, the group open at the change
    /// kept the old TTL's width (up to a minute), so after lowering a
    /// 24 h TTL to a second a key made in that minute lived until its end.
    pub const V4: RulesVersion = RulesVersion(4);
    /// What this build starts new clusters at.
    pub const LATEST: RulesVersion = RulesVersion::V4;
    /// The highest version this build knows (a version in progress is
    /// defined beside the others but known only once it is released).
    pub const HIGHEST_KNOWN: RulesVersion = RulesVersion::LATEST;

    /// Whether this build knows the version.
    pub fn is_known(self) -> bool {
        (RulesVersion::V1..=RulesVersion::HIGHEST_KNOWN).contains(&self)
    }

    /// Why this build refuses the version, when it does not know it: the
    /// one wording of the leader's refusal, apply's and a stopped node's.
    pub fn unknown_to_this_build(self) -> Option<String> {
        (!self.is_known()).then(|| {
            format!(
                "rules_version {self} is unknown to this build (it knows {} to {})",
                RulesVersion::V1,
                RulesVersion::HIGHEST_KNOWN
            )
        })
    }

    /// Whether idempotency-key records are charged against the memory
    /// budget (version 1) or against `idempotency_cached_bytes_max` alone.
    pub fn key_records_in_memory_budget(self) -> bool {
        self < RulesVersion::V2
    }

    /// Whether finished claims lie in creation-time groups (version 3),
    /// not in memory beside the held ones.
    pub fn finished_claims_grouped(self) -> bool {
        self >= RulesVersion::V3
    }

    /// Whether a TTL change ends the group open at it (version 4).
    pub fn ttl_change_ends_open_group(self) -> bool {
        self >= RulesVersion::V4
    }
}

impl Default for RulesVersion {
    /// The version of every state made before versions existed.
    fn default() -> Self {
        RulesVersion::V1
    }
}

impl fmt::Display for RulesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A caller's claim of a key (rule 20).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub cluster_id: ClusterId,
    /// Who claims: the key's namespace (rule 19).
    pub principal: Principal,
    pub key: IdempotencyKey,
    /// The fingerprint of what the caller means to do under this key
    /// ([`crate::fingerprint::claim_fingerprint`]).
    pub fingerprint: Fingerprint,
    /// How long the lease lasts, in cluster time, from the entry's stamp.
    pub lease_ms: u64,
    /// The caller's random identity for this one logical claim, the same
    /// on every retry: a retry of the winning claim gets its own win back
    /// (same fence), never "in progress" against itself.
    pub claim_id: Nonce,
}

/// A client's request, tagged for exactly-once execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execute {
    pub cluster_id: ClusterId,
    pub client_id: ClientId,
    pub seq: Seq,
    /// The lowest seq whose response the client has not received yet.
    pub first_outstanding_seq: Seq,
    pub command: Command,
    /// Who asks; must be the session's owner (rule 19).
    pub principal: Principal,
}

/// A typed value of the key-value store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Value {
    Bytes(#[serde(with = "crate::codec::bytes")] Vec<u8>),
    Int(i64),
    List(Vec<Vec<u8>>),
}

/// The type of a [`Value`], reported by `WRONG_TYPE` results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValueKind {
    Bytes,
    Int,
    List,
}

impl Value {
    pub fn kind(&self) -> ValueKind {
        match self {
            Value::Bytes(_) => ValueKind::Bytes,
            Value::Int(_) => ValueKind::Int,
            Value::List(_) => ValueKind::List,
        }
    }

    /// The size charged against `value_bytes_max`: payload bytes, 8 for an
    /// integer, and for a list its elements' bytes plus 8 per element.
    pub fn size_bytes(&self) -> u64 {
        match self {
            Value::Bytes(bytes) => bytes.len() as u64,
            Value::Int(_) => 8,
            Value::List(items) => items.iter().map(|item| list_element_size_bytes(item)).sum(),
        }
    }
}

/// What one list element adds to its list's [`Value::size_bytes`].
pub const fn list_element_size_bytes(element: &[u8]) -> u64 {
    element.len() as u64 + 8
}

/// A deliberately non-idempotent operation on the key-value store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Put {
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        value: Value,
    },
    Delete {
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
    },
    /// Adds `delta` to an integer (an absent key counts as 0).
    Increment {
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        delta: i64,
    },
    /// Appends one element to a list (an absent key counts as empty).
    Append {
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        #[serde(with = "crate::codec::bytes")]
        element: Vec<u8>,
    },
    /// Stores `new` if the current value equals `expected` (`None`: absent).
    CompareAndSwap {
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        expected: Option<Value>,
        new: Value,
    },
}

impl Command {
    pub fn key(&self) -> &[u8] {
        match self {
            Command::Put { key, .. }
            | Command::Delete { key }
            | Command::Increment { key, .. }
            | Command::Append { key, .. }
            | Command::CompareAndSwap { key, .. } => key,
        }
    }
}

/// The result of a command: cached and replayed as it was first returned.
/// A failed compare-and-swap, an overflow or a wrong type are results, not
/// registry errors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    Stored,
    Deleted {
        existed: bool,
    },
    Incremented {
        value: i64,
    },
    /// The increment would overflow; nothing changed.
    Overflow {
        current: i64,
    },
    Appended {
        length: u64,
    },
    /// `current` is the value stored after the operation.
    CompareAndSwap {
        swapped: bool,
        current: Option<Value>,
    },
    WrongType {
        actual: ValueKind,
    },
}

/// The fixed size charged against `cached_bytes_per_session_max` for every
/// cached response, on top of any value it carries.
pub const CACHED_RESPONSE_BOOKKEEPING_BYTES: u64 = 32;

impl CommandResult {
    /// The size charged against `cached_bytes_per_session_max` for caching
    /// this result: a fixed 32 bytes of bookkeeping plus any value it carries.
    pub fn cached_size_bytes(&self) -> u64 {
        match self {
            CommandResult::CompareAndSwap {
                current: Some(value),
                ..
            } => CACHED_RESPONSE_BOOKKEEPING_BYTES + value.size_bytes(),
            _ => CACHED_RESPONSE_BOOKKEEPING_BYTES,
        }
    }

    /// The largest [`cached_size_bytes`](Self::cached_size_bytes) a command
    /// can produce when every value is at most `value_bytes_max`: a
    /// compare-and-swap answering with a value of that size. (A list is
    /// measured by the same `size_bytes`, so its length does not add to it.)
    pub fn largest_cached_size_bytes(value_bytes_max: u64) -> u64 {
        CACHED_RESPONSE_BOOKKEEPING_BYTES.saturating_add(value_bytes_max)
    }
}

/// A replicated limit the request breaks by itself, given the data it
/// applies to: it can never succeed as sent (docs/rules.md, rule 12: a
/// limit the request itself breaks). Final for its seq: the refusal is cached like a
/// result, so a retry gets it again, under any leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitExceeded {
    pub limit: Limit,
    /// The limit's value when the request applied.
    pub max: u64,
    /// What the request needed, in the limit's unit (bytes or elements).
    pub requested: u64,
}

impl LimitExceeded {
    /// The size charged against `cached_bytes_per_session_max` for caching
    /// this refusal.
    pub fn cached_size_bytes(&self) -> u64 {
        CACHED_RESPONSE_BOOKKEEPING_BYTES
    }
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request breaks the replicated limit {} = {} (it needs {})",
            self.limit, self.max, self.requested
        )
    }
}

/// The limits a request can break by itself, whatever the data: the part of
/// the replicated config a client learns at register and keep-alive so it
/// can refuse such a request before sending it. The registry applies the
/// same check ([`RequestLimits::check`]), so the two never disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestLimits {
    pub key_bytes_max: u64,
    pub value_bytes_max: u64,
    pub list_elements_max: u64,
}

impl RequestLimits {
    /// The first limit `command` breaks by itself: a command that stores a
    /// value (all but delete) with a key longer than `key_bytes_max`, a
    /// value (a put's, a compare-and-swap's new one, an append's element)
    /// larger than `value_bytes_max`, or a list with more elements than
    /// `list_elements_max`. Delete is never refused by them, so a key
    /// written under a larger limit can still be removed.
    pub fn check(&self, command: &Command) -> Result<(), LimitExceeded> {
        let over = |limit, max, requested| {
            if requested > max {
                Err(LimitExceeded {
                    limit,
                    max,
                    requested,
                })
            } else {
                Ok(())
            }
        };
        if matches!(command, Command::Delete { .. }) {
            return Ok(());
        }
        over(
            Limit::KeyBytes,
            self.key_bytes_max,
            command.key().len() as u64,
        )?;
        match command {
            Command::Put { value, .. } | Command::CompareAndSwap { new: value, .. } => {
                over(Limit::ValueBytes, self.value_bytes_max, value.size_bytes())?;
                if let Value::List(items) = value {
                    over(
                        Limit::ListElements,
                        self.list_elements_max,
                        items.len() as u64,
                    )?;
                }
            }
            Command::Append { element, .. } => {
                over(
                    Limit::ValueBytes,
                    self.value_bytes_max,
                    list_element_size_bytes(element),
                )?;
                over(Limit::ListElements, self.list_elements_max, 1)?;
            }
            Command::Increment { .. } | Command::Delete { .. } => {}
        }
        Ok(())
    }
}

/// The TTL and limits of the registry: replicated state, fixed at bootstrap
/// and changed only by a `SetConfig` entry (rule 12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryConfig {
    /// A session idle longer than this, in cluster time, expires.
    pub session_ttl_ms: u64,
    pub sessions_max: u64,
    /// In-flight window: a seq at or beyond floor + window is refused.
    pub window: u64,
    pub cached_bytes_per_session_max: u64,
    pub key_bytes_max: u64,
    /// Largest value, as measured by [`Value::size_bytes`].
    pub value_bytes_max: u64,
    pub list_elements_max: u64,
    pub keys_max: u64,
}

/// Hard bounds on any config, so that one record of a snapshot or one log
/// entry always stays far below the codec's decode limits.
pub mod bounds {
    pub const SESSION_TTL_MS_MIN: u64 = 100;
    pub const WINDOW_MAX: u64 = 65_536;
    pub const CACHED_BYTES_PER_SESSION_MAX: u64 = 32 << 20;
    pub const KEY_BYTES_MAX: u64 = 64 << 10;
    pub const VALUE_BYTES_MAX: u64 = 4 << 20;
    pub const IDEMPOTENCY_KEY_TTL_MS_MIN: u64 = 100;
    /// A year: keys are for retries, not archives.
    pub const IDEMPOTENCY_KEY_TTL_MS_MAX: u64 = 366 * 24 * 3_600_000;
    pub const IDEMPOTENCY_KEY_BYTES_MAX: u64 = 4_096;
    pub const IDEMPOTENCY_CACHED_BYTES_MAX: u64 = 16 << 30;
    pub const CLAIM_TTL_MS_MIN: u64 = 100;
    pub const CLAIM_TTL_MS_MAX: u64 = 366 * 24 * 3_600_000;
    pub const CLAIM_KEY_BYTES_MAX: u64 = 4_096;
    pub const CLAIM_RESULT_BYTES_MAX: u64 = 4 << 20;
    pub const CLAIM_CACHED_BYTES_MAX: u64 = 16 << 30;
    /// The shortest `lease_ms_max` a config may set.
    pub const LEASE_MS_MIN: u64 = 100;
    /// A week: longer effects heartbeat with extends.
    pub const LEASE_MS_MAX: u64 = 7 * 24 * 3_600_000;
    pub const MEMORY_BUDGET_BYTES_MIN: u64 = 16 << 20;
    pub const MEMORY_BUDGET_BYTES_MAX: u64 = 1 << 40;
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            session_ttl_ms: 60_000,
            sessions_max: 100_000,
            window: 1_024,
            cached_bytes_per_session_max: 1 << 20,
            key_bytes_max: 1_024,
            value_bytes_max: 64 << 10,
            list_elements_max: 10_000,
            keys_max: 1_000_000,
        }
    }
}

impl RegistryConfig {
    /// The limits a request can break by itself.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            key_bytes_max: self.key_bytes_max,
            value_bytes_max: self.value_bytes_max,
            list_elements_max: self.list_elements_max,
        }
    }

    /// Checks the config against [`bounds`] and checks that its limits
    /// agree with each other; a config that fails is refused with
    /// `INVALID_ARGUMENT` and never applied.
    ///
    /// The combination rule: a session must be able to cache the largest
    /// response a command can produce (a compare-and-swap answering with a
    /// value of `value_bytes_max`), else every such request would be
    /// refused forever.
    pub fn validate(&self) -> Result<(), InvalidArgument> {
        self.validate_bounds()?;
        let largest = CommandResult::largest_cached_size_bytes(self.value_bytes_max);
        if self.cached_bytes_per_session_max < largest {
            return Err(InvalidArgument::Config(format!(
                "cached_bytes_per_session_max ({}) must be at least value_bytes_max ({}) + {} \
                 ({largest}): the largest response a command can cache, a compare-and-swap \
                 answering with a value of value_bytes_max, must fit in a session",
                self.cached_bytes_per_session_max,
                self.value_bytes_max,
                CACHED_RESPONSE_BOOKKEEPING_BYTES,
            )));
        }
        Ok(())
    }

    fn validate_bounds(&self) -> Result<(), InvalidArgument> {
        let checks = [
            (
                self.session_ttl_ms >= bounds::SESSION_TTL_MS_MIN,
                "session_ttl_ms below 100",
            ),
            (self.sessions_max >= 1, "sessions_max must be at least 1"),
            (
                (1..=bounds::WINDOW_MAX).contains(&self.window),
                "window must be 1..=65536",
            ),
            (
                self.cached_bytes_per_session_max <= bounds::CACHED_BYTES_PER_SESSION_MAX,
                "cached_bytes_per_session_max above 32 MiB",
            ),
            (
                (1..=bounds::KEY_BYTES_MAX).contains(&self.key_bytes_max),
                "key_bytes_max must be 1..=65536",
            ),
            (
                (8..=bounds::VALUE_BYTES_MAX).contains(&self.value_bytes_max),
                "value_bytes_max must be 8..=4 MiB",
            ),
            (self.keys_max >= 1, "keys_max must be at least 1"),
            (
                self.list_elements_max >= 1,
                "list_elements_max must be at least 1 (0 would refuse every append forever)",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, reason)) => Err(InvalidArgument::Config(reason.to_string())),
            None => Ok(()),
        }
    }
}

/// A change of some fields of the [`RegistryConfig`] (`None`: unchanged),
/// applied to the config in force when its entry applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigPatch {
    pub session_ttl_ms: Option<u64>,
    pub sessions_max: Option<u64>,
    pub window: Option<u64>,
    pub cached_bytes_per_session_max: Option<u64>,
    pub key_bytes_max: Option<u64>,
    pub value_bytes_max: Option<u64>,
    pub list_elements_max: Option<u64>,
    pub keys_max: Option<u64>,
}

impl ConfigPatch {
    /// A patch that sets every field to `config`'s.
    pub fn replacing_with(config: &RegistryConfig) -> ConfigPatch {
        ConfigPatch {
            session_ttl_ms: Some(config.session_ttl_ms),
            sessions_max: Some(config.sessions_max),
            window: Some(config.window),
            cached_bytes_per_session_max: Some(config.cached_bytes_per_session_max),
            key_bytes_max: Some(config.key_bytes_max),
            value_bytes_max: Some(config.value_bytes_max),
            list_elements_max: Some(config.list_elements_max),
            keys_max: Some(config.keys_max),
        }
    }

    /// Whether the patch sets no field.
    pub fn is_empty(&self) -> bool {
        *self == ConfigPatch::default()
    }

    /// `config` with the fields this patch sets replaced.
    pub fn applied_to(&self, config: &RegistryConfig) -> RegistryConfig {
        RegistryConfig {
            session_ttl_ms: self.session_ttl_ms.unwrap_or(config.session_ttl_ms),
            sessions_max: self.sessions_max.unwrap_or(config.sessions_max),
            window: self.window.unwrap_or(config.window),
            cached_bytes_per_session_max: self
                .cached_bytes_per_session_max
                .unwrap_or(config.cached_bytes_per_session_max),
            key_bytes_max: self.key_bytes_max.unwrap_or(config.key_bytes_max),
            value_bytes_max: self.value_bytes_max.unwrap_or(config.value_bytes_max),
            list_elements_max: self.list_elements_max.unwrap_or(config.list_elements_max),
            keys_max: self.keys_max.unwrap_or(config.keys_max),
        }
    }
}

/// The fixed size charged against `idempotency_cached_bytes_max` for every
/// idempotency key record, on top of its key, its principal's name and its
/// cached response ([`CommandResult::cached_size_bytes`]): the creation
/// time, the fingerprint and the record's place in the expiry index.
pub const KEY_RECORD_BOOKKEEPING_BYTES: u64 = 64;

/// The size charged against `idempotency_cached_bytes_max` for the record
/// of `key` of `principal` caching a response of `response_bytes`.
pub fn key_record_size_bytes(
    principal: &Principal,
    key: &IdempotencyKey,
    response_bytes: u64,
) -> u64 {
    KEY_RECORD_BOOKKEEPING_BYTES
        .saturating_add(principal.0.len() as u64)
        .saturating_add(key.0.len() as u64)
        .saturating_add(response_bytes)
}

/// The TTL and limits of idempotency keys (rule 18): replicated state like
/// [`RegistryConfig`], kept beside it (entries and snapshots written before
/// keys existed carry the registry config alone; they get this default).
/// The bootstrap entry does not carry it: a new cluster starts with the
/// default and changes it with a config entry (`Op::PatchConfigs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedConfig {
    /// A key's record is kept this long after the key's first execution,
    /// in cluster time; then it expires and the key may execute anew.
    pub idempotency_key_ttl_ms: u64,
    /// Live keys, all principals together.
    pub idempotency_keys_max: u64,
    /// Longest key; a longer one is refused (`LIMIT_EXCEEDED`, not cached).
    pub idempotency_key_bytes_max: u64,
    /// Bytes charged for all key records together (see
    /// [`key_record_size_bytes`]).
    pub idempotency_cached_bytes_max: u64,
}

impl Default for KeyedConfig {
    fn default() -> Self {
        KeyedConfig {
            // 24 hours, as payment APIs keep their keys.
            idempotency_key_ttl_ms: 24 * 3_600_000,
            idempotency_keys_max: 1_000_000,
            idempotency_key_bytes_max: 256,
            idempotency_cached_bytes_max: 256 << 20,
        }
    }
}

impl KeyedConfig {
    /// The configs a cluster bootstrapped under `rules` starts with:
    /// [`KeyedConfig::default`] at version 1 (what states made before
    /// versions existed hold); from version 2, whose records lie on disk,
    /// 50 M live keys and 16 GiB of records — a day of 580 new keys per
    /// second under the 24 h TTL, about 8 GB of record store per node at
    /// 64-byte answers (docs/state-beyond-ram.md).
    pub fn for_rules(rules: RulesVersion) -> KeyedConfig {
        if rules.key_records_in_memory_budget() {
            KeyedConfig::default()
        } else {
            KeyedConfig {
                idempotency_keys_max: 50_000_000,
                idempotency_cached_bytes_max: bounds::IDEMPOTENCY_CACHED_BYTES_MAX,
                ..KeyedConfig::default()
            }
        }
    }

    /// The largest record a key can need under `config`: the longest key,
    /// the longest principal name and the largest response a command can
    /// cache.
    pub fn largest_record_bytes(&self, config: &RegistryConfig) -> u64 {
        KEY_RECORD_BOOKKEEPING_BYTES
            .saturating_add(Principal::BYTES_MAX as u64)
            .saturating_add(self.idempotency_key_bytes_max)
            .saturating_add(CommandResult::largest_cached_size_bytes(
                config.value_bytes_max,
            ))
    }

    /// Checks the keyed config against [`bounds`], and against `config`:
    /// the largest record a key can need must fit in
    /// `idempotency_cached_bytes_max`, else such a request would be
    /// refused forever.
    pub fn validate(&self, config: &RegistryConfig) -> Result<(), InvalidArgument> {
        let checks = [
            (
                (bounds::IDEMPOTENCY_KEY_TTL_MS_MIN..=bounds::IDEMPOTENCY_KEY_TTL_MS_MAX)
                    .contains(&self.idempotency_key_ttl_ms),
                "idempotency_key_ttl_ms must be 100..=31622400000 (a year)",
            ),
            (
                self.idempotency_keys_max >= 1,
                "idempotency_keys_max must be at least 1",
            ),
            (
                (1..=bounds::IDEMPOTENCY_KEY_BYTES_MAX).contains(&self.idempotency_key_bytes_max),
                "idempotency_key_bytes_max must be 1..=4096",
            ),
            (
                self.idempotency_cached_bytes_max <= bounds::IDEMPOTENCY_CACHED_BYTES_MAX,
                "idempotency_cached_bytes_max above 16 GiB",
            ),
        ];
        if let Some((_, reason)) = checks.iter().find(|(ok, _)| !ok) {
            return Err(InvalidArgument::Config(reason.to_string()));
        }
        let largest = self.largest_record_bytes(config);
        if self.idempotency_cached_bytes_max < largest {
            return Err(InvalidArgument::Config(format!(
                "idempotency_cached_bytes_max ({}) must be at least {largest}: the largest \
                 record of one key ({KEY_RECORD_BOOKKEEPING_BYTES} + a principal of {} + \
                 idempotency_key_bytes_max ({}) + value_bytes_max ({}) + \
                 {CACHED_RESPONSE_BOOKKEEPING_BYTES}) must fit",
                self.idempotency_cached_bytes_max,
                Principal::BYTES_MAX,
                self.idempotency_key_bytes_max,
                config.value_bytes_max,
            )));
        }
        Ok(())
    }
}

/// The fixed size charged against `claim_cached_bytes_max` for every claim
/// record, on top of its key, its principal's name and its result: the
/// fingerprint, fence, attempt, holder, times and the expiry index entry.
pub const CLAIM_RECORD_BOOKKEEPING_BYTES: u64 = 96;

/// The size charged against `claim_cached_bytes_max` for the claim record
/// of `key` of `principal` keeping a result of `result_bytes`.
pub fn claim_record_size_bytes(
    principal: &Principal,
    key: &IdempotencyKey,
    result_bytes: u64,
) -> u64 {
    CLAIM_RECORD_BOOKKEEPING_BYTES
        .saturating_add(principal.0.len() as u64)
        .saturating_add(key.0.len() as u64)
        .saturating_add(result_bytes)
}

/// The TTL and limits of claims (rule 20): replicated state beside the
/// other configs (entries and snapshots written before claims existed get
/// this default), changed by `Op::PatchAllConfigs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimConfig {
    /// A completed or released claim is kept this long after it completed
    /// or was released (a held one this long after its lease deadline), in
    /// cluster time; then it expires and the key may be claimed anew.
    pub claim_ttl_ms: u64,
    /// Live claim records, all principals together.
    pub claims_max: u64,
    /// Longest claim key; a longer one is refused (`LIMIT_EXCEEDED`).
    pub claim_key_bytes_max: u64,
    /// Largest result a `CompleteClaim` may record (`LIMIT_EXCEEDED`).
    pub claim_result_bytes_max: u64,
    /// Bytes charged for all claim records together (see
    /// [`claim_record_size_bytes`]).
    pub claim_cached_bytes_max: u64,
    /// Longest lease a claim or an extend may ask for.
    pub lease_ms_max: u64,
}

impl Default for ClaimConfig {
    fn default() -> Self {
        ClaimConfig {
            claim_ttl_ms: 24 * 3_600_000,
            claims_max: 1_000_000,
            claim_key_bytes_max: 256,
            claim_result_bytes_max: 64 << 10,
            claim_cached_bytes_max: 256 << 20,
            lease_ms_max: 3_600_000,
        }
    }
}

impl ClaimConfig {
    /// The configs a cluster bootstrapped under `rules` starts with:
    /// [`ClaimConfig::default`] below version 3 (every claim in memory);
    /// from version 3, whose finished claims lie on disk, 50 M live claims
    /// and 16 GiB of claim records — as [`KeyedConfig::for_rules`] for
    /// keys. Held claims stay bounded by the memory budget.
    pub fn for_rules(rules: RulesVersion) -> ClaimConfig {
        if rules.finished_claims_grouped() {
            ClaimConfig {
                claims_max: 50_000_000,
                claim_cached_bytes_max: bounds::CLAIM_CACHED_BYTES_MAX,
                ..ClaimConfig::default()
            }
        } else {
            ClaimConfig::default()
        }
    }

    /// The largest record one claim can need: the longest key, the longest
    /// principal name and the largest result.
    pub fn largest_record_bytes(&self) -> u64 {
        CLAIM_RECORD_BOOKKEEPING_BYTES
            .saturating_add(Principal::BYTES_MAX as u64)
            .saturating_add(self.claim_key_bytes_max)
            .saturating_add(self.claim_result_bytes_max)
    }

    /// Checks the claim config against [`bounds`], and that the largest
    /// record fits in `claim_cached_bytes_max` (else such a completion
    /// would be refused forever).
    pub fn validate(&self) -> Result<(), InvalidArgument> {
        let checks = [
            (
                (bounds::CLAIM_TTL_MS_MIN..=bounds::CLAIM_TTL_MS_MAX).contains(&self.claim_ttl_ms),
                "claim_ttl_ms must be 100..=31622400000 (a year)",
            ),
            (self.claims_max >= 1, "claims_max must be at least 1"),
            (
                (1..=bounds::CLAIM_KEY_BYTES_MAX).contains(&self.claim_key_bytes_max),
                "claim_key_bytes_max must be 1..=4096",
            ),
            (
                self.claim_result_bytes_max <= bounds::CLAIM_RESULT_BYTES_MAX,
                "claim_result_bytes_max above 4 MiB",
            ),
            (
                self.claim_cached_bytes_max <= bounds::CLAIM_CACHED_BYTES_MAX,
                "claim_cached_bytes_max above 16 GiB",
            ),
            (
                (bounds::LEASE_MS_MIN..=bounds::LEASE_MS_MAX).contains(&self.lease_ms_max),
                "lease_ms_max must be 100..=604800000 (a week)",
            ),
        ];
        if let Some((_, reason)) = checks.iter().find(|(ok, _)| !ok) {
            return Err(InvalidArgument::Config(reason.to_string()));
        }
        let largest = self.largest_record_bytes();
        if self.claim_cached_bytes_max < largest {
            return Err(InvalidArgument::Config(format!(
                "claim_cached_bytes_max ({}) must be at least {largest}: the largest claim \
                 record ({CLAIM_RECORD_BOOKKEEPING_BYTES} + a principal of {} + \
                 claim_key_bytes_max ({}) + claim_result_bytes_max ({})) must fit",
                self.claim_cached_bytes_max,
                Principal::BYTES_MAX,
                self.claim_key_bytes_max,
                self.claim_result_bytes_max,
            )));
        }
        Ok(())
    }
}

/// What one key-value entry charges against the memory budget, on top of
/// its key and value: the map node, the allocation headers and the value's
/// enum (an approximation of its cost in memory, fixed so that every
/// replica counts alike).
pub const KV_ENTRY_MEMORY_BOOKKEEPING_BYTES: u64 = 128;

/// What one session charges against the memory budget, on top of its
/// cached responses: the session, its nonce and idle index entries.
pub const SESSION_MEMORY_BOOKKEEPING_BYTES: u64 = 512;

/// What the entry `key` = `value` charges against the memory budget.
pub fn kv_entry_memory_bytes(key: &[u8], value: &Value) -> u64 {
    KV_ENTRY_MEMORY_BOOKKEEPING_BYTES
        .saturating_add(key.len() as u64)
        .saturating_add(value.size_bytes())
}

/// The replicated memory budget (rule 21): the bytes the applied state may
/// account for — data, sessions with their cached responses, idempotency
/// key records and claim records — whatever the other limits allow. A
/// request that would take the state past it is refused
/// (`RESOURCE_EXHAUSTED`, limit `memory_budget_bytes`) before its effect;
/// nothing is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetConfig {
    pub memory_budget_bytes: u64,
    /// The share, in percent, of each capacity limit — `sessions_max`,
    /// `idempotency_keys_max`, `claims_max` and the memory budget — that
    /// one authenticated principal may hold (rule 21: no tenant takes
    /// all). The anonymous principal (no authentication: every caller) is
    /// held to the limits alone.
    pub principal_quota_percent: u64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        // Fits a small machine: three replicas of 1 GiB of accounted state
        // (plus the process's own overhead) on a host with a few GiB.
        BudgetConfig {
            memory_budget_bytes: 1 << 30,
            principal_quota_percent: 50,
        }
    }
}

impl BudgetConfig {
    /// Checks the budget against its bounds and against the largest growth
    /// one request can cause under the other configs (else such a request
    /// would be refused even from an empty state).
    pub fn validate(
        &self,
        config: &RegistryConfig,
        keyed: &KeyedConfig,
        claims: &ClaimConfig,
    ) -> Result<(), InvalidArgument> {
        if !(bounds::MEMORY_BUDGET_BYTES_MIN..=bounds::MEMORY_BUDGET_BYTES_MAX)
            .contains(&self.memory_budget_bytes)
        {
            return Err(InvalidArgument::Config(
                "memory_budget_bytes must be 16 MiB..=1 TiB".to_owned(),
            ));
        }
        if !(1..=100).contains(&self.principal_quota_percent) {
            return Err(InvalidArgument::Config(
                "principal_quota_percent must be 1..=100".to_owned(),
            ));
        }
        let largest = KV_ENTRY_MEMORY_BOOKKEEPING_BYTES
            .saturating_add(config.key_bytes_max)
            .saturating_add(config.value_bytes_max)
            .saturating_add(SESSION_MEMORY_BOOKKEEPING_BYTES)
            .saturating_add(config.cached_bytes_per_session_max)
            .max(keyed.largest_record_bytes(config))
            .max(claims.largest_record_bytes());
        if self.memory_budget_bytes < largest {
            return Err(InvalidArgument::Config(format!(
                "memory_budget_bytes ({}) must be at least {largest}: the most one request can \
                 add (a value of value_bytes_max under a key of key_bytes_max, and a session \
                 holding cached_bytes_per_session_max)",
                self.memory_budget_bytes
            )));
        }
        Ok(())
    }
}

/// A change of the [`BudgetConfig`] (`None`: unchanged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetConfigPatch {
    pub memory_budget_bytes: Option<u64>,
    pub principal_quota_percent: Option<u64>,
}

impl BudgetConfigPatch {
    pub fn is_empty(&self) -> bool {
        *self == BudgetConfigPatch::default()
    }

    pub fn applied_to(&self, config: &BudgetConfig) -> BudgetConfig {
        BudgetConfig {
            memory_budget_bytes: self
                .memory_budget_bytes
                .unwrap_or(config.memory_budget_bytes),
            principal_quota_percent: self
                .principal_quota_percent
                .unwrap_or(config.principal_quota_percent),
        }
    }
}

/// A change of some fields of the [`ClaimConfig`] (`None`: unchanged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimConfigPatch {
    pub claim_ttl_ms: Option<u64>,
    pub claims_max: Option<u64>,
    pub claim_key_bytes_max: Option<u64>,
    pub claim_result_bytes_max: Option<u64>,
    pub claim_cached_bytes_max: Option<u64>,
    pub lease_ms_max: Option<u64>,
}

impl ClaimConfigPatch {
    /// Whether the patch sets no field.
    pub fn is_empty(&self) -> bool {
        *self == ClaimConfigPatch::default()
    }

    /// `config` with the fields this patch sets replaced.
    pub fn applied_to(&self, config: &ClaimConfig) -> ClaimConfig {
        ClaimConfig {
            claim_ttl_ms: self.claim_ttl_ms.unwrap_or(config.claim_ttl_ms),
            claims_max: self.claims_max.unwrap_or(config.claims_max),
            claim_key_bytes_max: self
                .claim_key_bytes_max
                .unwrap_or(config.claim_key_bytes_max),
            claim_result_bytes_max: self
                .claim_result_bytes_max
                .unwrap_or(config.claim_result_bytes_max),
            claim_cached_bytes_max: self
                .claim_cached_bytes_max
                .unwrap_or(config.claim_cached_bytes_max),
            lease_ms_max: self.lease_ms_max.unwrap_or(config.lease_ms_max),
        }
    }
}

/// A change of some fields of the [`KeyedConfig`] (`None`: unchanged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedConfigPatch {
    pub idempotency_key_ttl_ms: Option<u64>,
    pub idempotency_keys_max: Option<u64>,
    pub idempotency_key_bytes_max: Option<u64>,
    pub idempotency_cached_bytes_max: Option<u64>,
}

impl KeyedConfigPatch {
    /// A patch that sets every field to `config`'s.
    pub fn replacing_with(config: &KeyedConfig) -> KeyedConfigPatch {
        KeyedConfigPatch {
            idempotency_key_ttl_ms: Some(config.idempotency_key_ttl_ms),
            idempotency_keys_max: Some(config.idempotency_keys_max),
            idempotency_key_bytes_max: Some(config.idempotency_key_bytes_max),
            idempotency_cached_bytes_max: Some(config.idempotency_cached_bytes_max),
        }
    }

    /// Whether the patch sets no field.
    pub fn is_empty(&self) -> bool {
        *self == KeyedConfigPatch::default()
    }

    /// `config` with the fields this patch sets replaced.
    pub fn applied_to(&self, config: &KeyedConfig) -> KeyedConfig {
        KeyedConfig {
            idempotency_key_ttl_ms: self
                .idempotency_key_ttl_ms
                .unwrap_or(config.idempotency_key_ttl_ms),
            idempotency_keys_max: self
                .idempotency_keys_max
                .unwrap_or(config.idempotency_keys_max),
            idempotency_key_bytes_max: self
                .idempotency_key_bytes_max
                .unwrap_or(config.idempotency_key_bytes_max),
            idempotency_cached_bytes_max: self
                .idempotency_cached_bytes_max
                .unwrap_or(config.idempotency_cached_bytes_max),
        }
    }
}

/// What applying one registry entry produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Bootstrapped {
        cluster_id: ClusterId,
        /// The cluster had already been bootstrapped with this id.
        already: bool,
    },
    Registered(Registration),
    Executed {
        result: CommandResult,
        /// Answered from the cache; nothing executed.
        duplicate: bool,
    },
    KeptAlive {
        floor: Seq,
        /// The TTL in force when the keep-alive applied, so a client paces
        /// its keep-alives by the current TTL, not the one it registered
        /// under (the TTL is replicated config and may change, rule 12).
        session_ttl_ms: u64,
        /// The request limits in force then, for the same reason.
        limits: RequestLimits,
    },
    Unregistered,
    ConfigSet(RegistryConfig),
    Rejected(Rejection),
    /// An operator's `ForgetKey` applied; `existed`: the key had a record.
    KeyForgotten {
        existed: bool,
    },
    /// A `PatchConfigs` applied: both configs now in force.
    ConfigsSet {
        config: RegistryConfig,
        keyed: KeyedConfig,
    },
    /// A `Claim` applied: what the record said (rule 20).
    Claimed(ClaimAnswer),
    /// A `CompleteClaim` applied: the result is recorded under `fence`.
    /// `duplicate`: the record already held it (a retried complete).
    ClaimCompleted {
        fence: u64,
        completed_ms: u64,
        duplicate: bool,
    },
    /// A `ReleaseClaim` applied. `duplicate`: it was released already.
    ClaimReleased {
        duplicate: bool,
    },
    /// An `ExtendClaim` applied: the lease runs to `lease_deadline_ms`.
    ClaimExtended {
        lease_deadline_ms: u64,
        cluster_time_ms: u64,
    },
    /// An operator's `ForgetClaim` applied; `existed`: the key had a record.
    ClaimForgotten {
        existed: bool,
    },
    /// A `PatchAllConfigs` or `RaiseRules` applied: every config and the
    /// rules version now in force.
    AllConfigsSet {
        config: RegistryConfig,
        keyed: KeyedConfig,
        claims: ClaimConfig,
        budget: BudgetConfig,
        rules: RulesVersion,
    },
}

/// What a `Claim` is answered (rule 20).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimAnswer {
    /// The caller holds the key: perform the effect, then complete (or
    /// release) with `fence`, before `lease_deadline_ms` of cluster time
    /// (the lease has `lease_deadline_ms - cluster_time_ms` left) or extend.
    Won {
        fence: u64,
        /// Holders so far, this one included: above 1, an earlier holder
        /// may have half-done the effect (reconcile before redoing it).
        attempt: u64,
        lease_deadline_ms: u64,
        /// Cluster time when the answer was made.
        cluster_time_ms: u64,
        /// A retry of the winning claim (same claim id), answered from the
        /// record: nothing changed.
        duplicate: bool,
    },
    /// Another holder's lease is live: claim again after `retry_after_ms`
    /// (of cluster time: when its lease runs out if it does not extend).
    InProgress { retry_after_ms: u64, attempt: u64 },
    /// The effect was done: its recorded result, replayed byte for byte.
    Completed {
        #[serde(with = "crate::codec::bytes")]
        result: Vec<u8>,
        completed_ms: u64,
        fence: u64,
        attempt: u64,
    },
}

/// The register reply: the client's id and the session's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub cluster_id: ClusterId,
    pub client_id: ClientId,
    pub session_ttl_ms: u64,
    pub window: u64,
    /// The request limits in force, so the client can refuse a request
    /// that breaks one before sending it.
    pub limits: RequestLimits,
    /// A retried register answered with the session it already created.
    pub duplicate: bool,
}

/// Why a registry entry took no effect. Only `LimitExceeded` is cached (as
/// the seq's response); every other one is either final by construction
/// (the state that caused it never reverts, or it is a fact of the request
/// alone) or valid for this attempt only (see the error table of docs/rules.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    /// Unknown or expired client id. Final.
    SessionExpired,
    /// The entry names another cluster. Final.
    WrongCluster { expected: ClusterId },
    /// The seq was used before with another command. Final.
    SeqConflict,
    /// The seq is below the acknowledged floor. Final.
    ResponseDiscarded { floor: Seq },
    /// The seq is at or beyond floor + window. This attempt only.
    TooManyOutstanding { floor: Seq, window: u64 },
    /// A replicated capacity limit (sessions, keys, the session's cached
    /// bytes) would be exceeded; it may free up. This attempt only.
    ResourceExhausted(Limit),
    /// The request itself breaks a replicated limit. Final: cached as the
    /// seq's response (for a sessionless execute, nothing is cached).
    LimitExceeded {
        exceeded: LimitExceeded,
        /// Answered from the cache: a retry of a request already refused.
        duplicate: bool,
    },
    /// The session belongs to another principal (rule 19). Final; the
    /// session is untouched.
    PermissionDenied,
    /// Malformed input. Final.
    InvalidArgument(InvalidArgument),
    /// The cluster has no id and config yet. This attempt only.
    NotBootstrapped,
    /// The idempotency key was used before with another command (rule
    /// 18), or the claim key with another fingerprint (rule 20). Final
    /// while the key lives; the key's record is untouched.
    KeyConflict,
    /// A claim's complete, extend or release named a fence that no longer
    /// holds the key (a later claim took over, the holder already
    /// completed or released, or the record is gone). Final for that
    /// holder: the new holder owns the effect. `fence`: the key's current
    /// fence (0: no record).
    Fenced { fence: u64 },
}

/// The replicated limit a request ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Limit {
    Sessions,
    CachedBytesPerSession,
    KeyBytes,
    ValueBytes,
    ListElements,
    Keys,
    /// Live idempotency keys, all principals (capacity).
    IdempotencyKeys,
    /// Bytes of one idempotency key (the request's own).
    IdempotencyKeyBytes,
    /// Bytes charged for all idempotency key records together (capacity;
    /// also the largest one record may take, see [`KeyedConfig`]).
    IdempotencyCachedBytes,
    /// Live claim records, all principals (capacity).
    Claims,
    /// Bytes of one claim key (the request's own).
    ClaimKeyBytes,
    /// Bytes of one claim's result (the request's own).
    ClaimResultBytes,
    /// Bytes charged for all claim records together (capacity).
    ClaimCachedBytes,
    /// The applied state's accounted bytes (capacity, rule 21).
    MemoryBudget,
    /// One principal's share of a capacity limit (capacity, rule 21).
    PrincipalQuota,
}

/// Malformed requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum InvalidArgument {
    #[error("first outstanding seq {first_outstanding_seq} is above the request's seq {seq}")]
    FloorAboveSeq {
        seq: Seq,
        first_outstanding_seq: Seq,
    },
    #[error(
        "first outstanding seq {first_outstanding_seq} is beyond what this session may fence \
         ({bound_seq}: one past its highest applied seq, or its floor, plus the window)"
    )]
    FloorBeyondBound {
        first_outstanding_seq: Seq,
        bound_seq: Seq,
    },
    #[error("invalid registry config: {0}")]
    Config(String),
    #[error("empty key: a key is at least one byte long")]
    EmptyKey,
    #[error("the config patch sets no field")]
    EmptyConfigPatch,
    #[error("empty idempotency key: a key is at least one byte long")]
    EmptyIdempotencyKey,
    #[error("empty claim key: a key is at least one byte long")]
    EmptyClaimKey,
    #[error("lease_ms {lease_ms} is outside 1..={lease_ms_max} (lease_ms_max)")]
    LeaseOutOfBounds { lease_ms: u64, lease_ms_max: u64 },
}

impl Limit {
    /// The limit named as in [`RegistryConfig`] (what `Display` prints).
    pub fn from_name(name: &str) -> Option<Limit> {
        [
            Limit::Sessions,
            Limit::CachedBytesPerSession,
            Limit::KeyBytes,
            Limit::ValueBytes,
            Limit::ListElements,
            Limit::Keys,
            Limit::IdempotencyKeys,
            Limit::IdempotencyKeyBytes,
            Limit::IdempotencyCachedBytes,
            Limit::Claims,
            Limit::ClaimKeyBytes,
            Limit::ClaimResultBytes,
            Limit::ClaimCachedBytes,
            Limit::MemoryBudget,
            Limit::PrincipalQuota,
        ]
        .into_iter()
        .find(|limit| limit.to_string() == name)
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Limit::Sessions => "sessions_max",
            Limit::CachedBytesPerSession => "cached_bytes_per_session_max",
            Limit::KeyBytes => "key_bytes_max",
            Limit::ValueBytes => "value_bytes_max",
            Limit::ListElements => "list_elements_max",
            Limit::Keys => "keys_max",
            Limit::IdempotencyKeys => "idempotency_keys_max",
            Limit::IdempotencyKeyBytes => "idempotency_key_bytes_max",
            Limit::IdempotencyCachedBytes => "idempotency_cached_bytes_max",
            Limit::Claims => "claims_max",
            Limit::ClaimKeyBytes => "claim_key_bytes_max",
            Limit::ClaimResultBytes => "claim_result_bytes_max",
            Limit::ClaimCachedBytes => "claim_cached_bytes_max",
            Limit::MemoryBudget => "memory_budget_bytes",
            Limit::PrincipalQuota => "principal_quota_percent",
        };
        f.write_str(name)
    }
}

#[cfg(test)]
mod tests {
    use super::Principal;
    use proptest::prelude::*;

    proptest! {
        /// Principals compare exactly as their names do, the empty
        /// (anonymous) one included, though its comparisons skip `memcmp`.
        #[test]
        fn principals_compare_as_their_names(
            a in prop_oneof![Just(String::new()), ".{0,6}"],
            other in prop_oneof![Just(String::new()), ".{0,6}"],
            same in any::<bool>(),
        ) {
            // Half the pairs equal names (a copy: another buffer).
            let b = if same { a.clone() } else { other };
            let (pa, pb) = (Principal(a.clone()), Principal(b.clone()));
            prop_assert_eq!(pa.cmp(&pb), a.cmp(&b));
            prop_assert_eq!(pa.partial_cmp(&pb), a.partial_cmp(&b));
            prop_assert_eq!(pa == pb, a == b);
            prop_assert_eq!(pa.is(&pb), a == b);
            if pa == pb {
                prop_assert_eq!(hash(&pa), hash(&pb));
            }
        }
    }

    fn hash(principal: &Principal) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault};
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(principal)
    }
}
