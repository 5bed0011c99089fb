//! The records of idempotency keys (rule 18): for each (principal, key), the
//! cluster time of its first execution and its cached response with the
//! command's fingerprint — what a key's record is, what it is charged and
//! how it hashes, and the width of its creation-time groups. It owns the
//! record type and nothing else: the grouping, the overlay over an
//! adapter's store and expiry by group are [`crate::grouped`]'s
//! (`KeyStore` is a [`GroupStore`] of key records), the order of checks
//! and the limits the registry's (docs/state-beyond-ram.md §4.3).

use super::grouped::{Fetched, GroupStore, Grouped};
use super::session::CachedResponse;
use super::snapshot::key_record_hash;
use super::types::key_record_size_bytes;

pub use super::grouped::{Changes, GroupedRecord, KeyId};

/// The idempotency-key records: a [`GroupStore`] of [`KeyRecord`]s.
pub(crate) type KeyStore = GroupStore<KeyRecord>;

/// The key-record changes an adapter takes (see [`Changes`]).
pub type KeyChanges = Changes<KeyRecord>;

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

impl Grouped for KeyRecord {
    const NOUN: &'static str = "key";
    const GROUPS_OUT_OF_ORDER: &'static str = "idempotency key groups overlap or out of order";
    const IN_NO_LIVE_GROUP: &'static str = "an idempotency key record in no live group";

    /// A key's TTL counts from its first execution (a duplicate does not
    /// refresh it).
    fn base_ms(&self) -> u64 {
        self.created_ms
    }

    fn size_bytes(&self, id: &KeyId) -> u64 {
        KeyRecord::size_bytes(self, id)
    }

    fn record_hash(&self, id: &KeyId) -> [u8; 32] {
        key_record_hash(id, self)
    }
}

/// Records an adapter read from its store for the entries about to apply:
/// for each id the registry named ([`crate::Registry::keys_to_fetch`],
/// [`crate::Registry::claims_to_fetch`]), the record stored under it or
/// `None`.
#[derive(Clone, Debug, Default)]
pub struct Prefetched {
    pub(crate) keys: Fetched<KeyRecord>,
    pub(crate) claims: Fetched<crate::ClaimRecord>,
}

impl Prefetched {
    /// Nothing fetched: for a registry that holds all of its records.
    pub fn none() -> Prefetched {
        Prefetched::default()
    }

    /// Adds what the store holds under key `id`.
    pub fn insert(&mut self, id: KeyId, stored: Option<GroupedRecord>) {
        self.keys.insert(id, stored);
    }

    /// Adds what the store holds under finished claim `id` (rules version
    /// 3).
    pub fn insert_claim(&mut self, id: KeyId, stored: Option<GroupedRecord<crate::ClaimRecord>>) {
        self.claims.insert(id, stored);
    }
}
