//! The records of idempotency keys (rule 18): for each (principal, key), the
//! cluster time of its first execution and its cached response with the
//! command's fingerprint, an index of the records oldest first for expiry,
//! and the bookkeeping of their size. It owns those invariants (the index
//! and the byte count always match the records; so does the records'
//! multiset hash, kept at every insert and removal so that the state hash
//! never walks the records) and nothing else: the order of checks and the
//! limits live in the registry.
//!
//! Records are ordered by (principal, key), the index by (creation time,
//! principal, key): expiry, paging and snapshots walk them in that fixed
//! order (rule 10); the state hash takes their multiset hash instead.

use super::session::CachedResponse;
use super::snapshot::{RecordsHash, key_record_hash};
use super::types::{IdempotencyKey, Principal, key_record_size_bytes};
use imbl::{OrdMap, OrdSet};
use std::ops::Bound;

/// Who owns a key and the key: the address of a record.
pub type KeyId = (Principal, IdempotencyKey);

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

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyStore {
    records: OrdMap<KeyId, KeyRecord>,
    /// (created, principal, key) of every record, oldest first.
    by_age: OrdSet<(u64, Principal, IdempotencyKey)>,
    /// Sum of `size_bytes` over the records.
    cached_bytes: u64,
    /// Per principal: (records, bytes) — what its quota counts (rule 21).
    by_principal: OrdMap<Principal, (u64, u64)>,
    /// The records' multiset hash (the state hash's part for them).
    hash: RecordsHash,
}

impl KeyStore {
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

    /// (records, bytes) of `principal`'s keys.
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

    pub fn get(&self, id: &KeyId) -> Option<&KeyRecord> {
        self.records.get(id)
    }

    /// Every record in (principal, key) order.
    pub fn iter(&self) -> impl Iterator<Item = (&KeyId, &KeyRecord)> {
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
    ) -> impl Iterator<Item = (&'a KeyId, &'a KeyRecord)> + 'a {
        self.records
            .range((Bound::Excluded(after.clone()), Bound::Unbounded))
    }

    /// Records a key's first execution. The caller checked that the key
    /// has no record.
    pub fn insert(&mut self, id: KeyId, record: KeyRecord) {
        self.cached_bytes += record.size_bytes(&id);
        self.count(&id.0, 1, record.size_bytes(&id) as i64);
        self.by_age
            .insert((record.created_ms, id.0.clone(), id.1.clone()));
        self.hash.add(&key_record_hash(&id, &record));
        let previous = self.records.insert(id, record);
        debug_assert!(previous.is_none(), "a key executed twice");
    }

    /// Removes a key's record; whether it had one.
    pub fn remove(&mut self, id: &KeyId) -> bool {
        let Some(record) = self.records.remove(id) else {
            return false;
        };
        self.cached_bytes -= record.size_bytes(id);
        self.count(&id.0, -1, -(record.size_bytes(id) as i64));
        self.hash.subtract(&key_record_hash(id, &record));
        let aged = self
            .by_age
            .remove(&(record.created_ms, id.0.clone(), id.1.clone()));
        assert!(aged.is_some(), "a key record missing from the age index");
        true
    }

    /// Removes, oldest first, every record older than `ttl_ms` at
    /// `now_ms`; how many went.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64) -> usize {
        let mut expired = 0;
        while let Some(oldest) = self.by_age.get_min().cloned() {
            if now_ms.saturating_sub(oldest.0) <= ttl_ms {
                break;
            }
            self.by_age.remove(&oldest);
            let id = (oldest.1, oldest.2);
            let record = self.records.remove(&id);
            let record = record.expect("a key in the age index without a record");
            self.cached_bytes -= record.size_bytes(&id);
            self.count(&id.0, -1, -(record.size_bytes(&id) as i64));
            self.hash.subtract(&key_record_hash(&id, &record));
            expired += 1;
        }
        expired
    }

    /// The age index names exactly the records, with their creation times,
    /// and the byte count is the sum of the records' sizes.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.by_age.len() != self.records.len() {
            return Err(format!(
                "{} key records, {} in the age index",
                self.records.len(),
                self.by_age.len()
            ));
        }
        let mut sum = 0u64;
        let mut hash = RecordsHash::default();
        for (id, record) in &self.records {
            if !self
                .by_age
                .contains(&(record.created_ms, id.0.clone(), id.1.clone()))
            {
                return Err("a key record missing from the age index".to_owned());
            }
            sum += record.size_bytes(id);
            hash.add(&key_record_hash(id, record));
        }
        if hash != self.hash {
            return Err("the key records' hash disagrees with the records".to_owned());
        }
        if sum != self.cached_bytes {
            return Err(format!(
                "key bytes {} but records sum to {sum}",
                self.cached_bytes
            ));
        }
        let mut usage: OrdMap<Principal, (u64, u64)> = OrdMap::new();
        for (id, record) in &self.records {
            let entry = usage.entry(id.0.clone()).or_insert((0, 0));
            entry.0 += 1;
            entry.1 += record.size_bytes(id);
        }
        if usage != self.by_principal {
            return Err("per-principal key usage disagrees with the records".to_owned());
        }
        Ok(())
    }
}
