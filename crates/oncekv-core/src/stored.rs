//! The byte forms of the records an adapter keeps in its own store
//! (docs/state-beyond-ram.md §4.1): the store key of a record's id and the
//! bytes of the record. It owns those encodings and their checks (a store
//! is input from the disk: decoding refuses what the registry could not
//! have written) and nothing else; the store itself, and when it is
//! written, are the adapter's.
//!
//! A store key is `kind u8 ‖ escaped principal ‖ 0x00 0x01 ‖ key`, the
//! principal's 0x00 bytes written as 0x00 0xFF: byte order of store keys is
//! exactly (kind, principal, key) order, so a store scanned in key order
//! yields each kind's records in the order snapshots and paging walk them
//! (rule 10), key records ([`KIND_KEY`]) before finished claim records
//! ([`KIND_CLAIM`]).
//!
//! A record's stored bytes are also part of the snapshot format: a
//! snapshot record is its id's encoding followed by exactly these bytes,
//! which senders pass through and receivers store as read
//! (`snapshot::encode_stored_key_record`; the test
//! `records_passed_through_from_the_store_are_the_records_encoded`). So
//! [`key_record_bytes`] and [`claim_record_bytes`] must stay the codec's
//! plain encoding of the fields after the id: no version byte or framing
//! of their own.

use super::claims::{ClaimRecord, ClaimState};
use super::codec::{self, CodecError};
use super::keyed::{KeyId, KeyRecord};
use super::session::CachedResponse;
use super::types::{IdempotencyKey, Principal, bounds};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The kind byte of idempotency-key records.
pub const KIND_KEY: u8 = 1;
/// The kind byte of finished (completed or released) claim records: every
/// claim's store key sorts after every key record's, so one scan of a store
/// yields the key records, then the claim records.
pub const KIND_CLAIM: u8 = 2;

/// The store key of `id` under `kind`: `kind ‖ escaped principal ‖ 00 01 ‖
/// key` (see the module doc).
fn id_bytes(kind: u8, id: &KeyId) -> Vec<u8> {
    let (principal, key) = id;
    let mut bytes = Vec::with_capacity(3 + principal.0.len() + key.0.len());
    bytes.push(kind);
    for &byte in principal.0.as_bytes() {
        bytes.push(byte);
        if byte == 0 {
            bytes.push(0xFF);
        }
    }
    bytes.extend_from_slice(&[0x00, 0x01]);
    bytes.extend_from_slice(&key.0);
    bytes
}

/// The id a store key of `kind` names; `None` if it is not one
/// [`id_bytes`] writes for `kind` (another kind, a bad escape, a principal
/// beyond its bound, an empty key or one longer than `key_bytes_max`).
fn id_from_bytes(kind: u8, key_bytes_max: u64, bytes: &[u8]) -> Option<KeyId> {
    let (principal, key) = id_parts(kind, key_bytes_max, bytes)?;
    Some((
        Principal(principal.into_owned()),
        IdempotencyKey(key.to_vec()),
    ))
}

/// The principal and key a store key of `kind` names, borrowed from it
/// where the principal holds no escaped byte (the common case: no copy);
/// `None` as [`id_from_bytes`].
fn id_parts(kind: u8, key_bytes_max: u64, bytes: &[u8]) -> Option<(Cow<'_, str>, &[u8])> {
    let (&found, rest) = bytes.split_first()?;
    if found != kind {
        return None;
    }
    // The principal ends at the first 00 not followed by FF.
    let mut end = 0;
    let mut escaped = false;
    loop {
        match rest.get(end..)? {
            [0x00, 0xFF, ..] => {
                escaped = true;
                end += 2;
            }
            [0x00, 0x01, ..] => break,
            [0x00, ..] | [] => return None,
            [_, ..] => end += 1,
        }
    }
    let (principal, key) = (&rest[..end], &rest[end + 2..]);
    let principal = if escaped {
        let mut unescaped = Vec::with_capacity(principal.len());
        let mut bytes = principal.iter();
        while let Some(&byte) = bytes.next() {
            unescaped.push(byte);
            if byte == 0 {
                bytes.next();
            }
        }
        Cow::Owned(String::from_utf8(unescaped).ok()?)
    } else {
        Cow::Borrowed(std::str::from_utf8(principal).ok()?)
    };
    if principal.len() > Principal::BYTES_MAX || key.is_empty() || key.len() as u64 > key_bytes_max
    {
        return None;
    }
    Some((principal, key))
}

/// The principal and key of a key record's store key, borrowed where it
/// can be ([`key_id_from_bytes`] without the copies).
pub fn key_id_parts(bytes: &[u8]) -> Option<(Cow<'_, str>, &[u8])> {
    id_parts(KIND_KEY, bounds::IDEMPOTENCY_KEY_BYTES_MAX, bytes)
}

/// The principal and key of a claim record's store key, borrowed where it
/// can be ([`claim_id_from_bytes`] without the copies).
pub fn claim_id_parts(bytes: &[u8]) -> Option<(Cow<'_, str>, &[u8])> {
    id_parts(KIND_CLAIM, bounds::CLAIM_KEY_BYTES_MAX, bytes)
}

/// The store key of key record `id`.
pub fn key_id_bytes(id: &KeyId) -> Vec<u8> {
    id_bytes(KIND_KEY, id)
}

/// The id a store key names; `None` if it is not one [`key_id_bytes`]
/// writes (another kind, a bad escape, a name or key beyond its bound).
pub fn key_id_from_bytes(bytes: &[u8]) -> Option<KeyId> {
    id_from_bytes(KIND_KEY, bounds::IDEMPOTENCY_KEY_BYTES_MAX, bytes)
}

/// The store key of the finished claim record of `id` (principal, claim
/// key).
pub fn claim_id_bytes(id: &KeyId) -> Vec<u8> {
    id_bytes(KIND_CLAIM, id)
}

/// The claim id a store key names; `None` if it is not one
/// [`claim_id_bytes`] writes (another kind, a bad escape, a name or key
/// beyond its bound).
pub fn claim_id_from_bytes(bytes: &[u8]) -> Option<KeyId> {
    id_from_bytes(KIND_CLAIM, bounds::CLAIM_KEY_BYTES_MAX, bytes)
}

#[derive(Serialize)]
struct KeyRecordRef<'a> {
    created_ms: u64,
    response: &'a CachedResponse,
}

#[derive(Deserialize)]
struct KeyRecordOwned {
    created_ms: u64,
    response: CachedResponse,
}

/// The stored bytes of a key record (the codec's encoding of its creation
/// time and cached response; the id is the store key).
pub fn key_record_bytes(record: &KeyRecord) -> Vec<u8> {
    codec::encode(&KeyRecordRef {
        created_ms: record.created_ms,
        response: &record.response,
    })
}

/// The key record stored as `bytes`.
pub fn key_record_from_bytes(bytes: &[u8]) -> Result<KeyRecord, CodecError> {
    let record: KeyRecordOwned = codec::decode(bytes)?;
    Ok(KeyRecord {
        created_ms: record.created_ms,
        response: record.response,
    })
}

/// The stored bytes of a finished claim record (the codec's encoding of the
/// record, as a snapshot carries it; the id is the store key). Only
/// completed and released records are stored: held ones stay in memory,
/// and [`claim_record_from_bytes`] refuses them.
pub fn claim_record_bytes(record: &ClaimRecord) -> Vec<u8> {
    debug_assert!(
        !matches!(record.state, ClaimState::Held { .. }),
        "a held claim record is never stored"
    );
    codec::encode(record)
}

/// The finished claim record stored as `bytes`; refused (as the registry
/// could not have written it) when it is held, has a fence or attempt of
/// 0, or keeps a result beyond the hard bound.
pub fn claim_record_from_bytes(bytes: &[u8]) -> Result<ClaimRecord, CodecError> {
    let record: ClaimRecord = codec::decode(bytes)?;
    let refused = |why: &str| {
        Err(CodecError::Malformed(format!(
            "a stored claim record {why}"
        )))
    };
    if matches!(record.state, ClaimState::Held { .. }) {
        return refused("is held (only finished claims are stored)");
    }
    if record.fence == 0 {
        return refused("has fence 0");
    }
    if record.attempt == 0 {
        return refused("has attempt 0");
    }
    if record.result_bytes() > bounds::CLAIM_RESULT_BYTES_MAX {
        return refused("keeps a result beyond its hard bound");
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(principal: &str, key: &[u8]) -> KeyId {
        (
            Principal(principal.to_owned()),
            IdempotencyKey(key.to_vec()),
        )
    }

    /// Store keys sort as (principal, key) tuples do — a shorter principal,
    /// one with a NUL, a longer key — and read back to their ids.
    #[test]
    fn store_keys_keep_the_order_of_ids_and_read_back() {
        let mut ids = vec![
            id("", b"a"),
            id("", b"b\x00"),
            id("a", b"\x00"),
            id("a", b"z"),
            id("a\u{0}", b"a"),
            id("a\u{0}b", b"a"),
            id("a\u{1}", b"a"),
            id("ab", b"a"),
            id("b", b"\x00\x00"),
        ];
        ids.sort();
        let mut bytes: Vec<Vec<u8>> = ids.iter().map(key_id_bytes).collect();
        let in_id_order = bytes.clone();
        bytes.sort();
        assert_eq!(bytes, in_id_order);
        for id in &ids {
            assert_eq!(key_id_from_bytes(&key_id_bytes(id)).as_ref(), Some(id));
        }
        for bad in [
            &b""[..],
            b"\x02\x00\x01k",
            b"\x01abc",
            b"\x01a\x00\x02k",
            b"\x01a\x00\x01",
            b"\x01\xff\x00\x01k",
        ] {
            assert_eq!(key_id_from_bytes(bad), None, "{bad:?}");
        }
    }

    /// Claim ids keep (principal, key) order under kind 2 and read back;
    /// every claim's store key sorts after every key record's, whatever the
    /// ids; and a claim store key is not read as a key record's, nor the
    /// other way round.
    #[test]
    fn claim_store_keys_keep_their_order_and_sort_after_key_records() {
        let longest_principal = "\u{10FFFF}".repeat(Principal::BYTES_MAX / 4);
        let mut ids = vec![
            id("", b"\x00"),
            id("", b"b"),
            id("a", b"z"),
            id("a\u{0}", b"a"),
            id("a\u{0}b", b"\xff"),
            id("ab", b"a"),
            id(&longest_principal, &[0xFF; 4_096]),
        ];
        ids.sort();
        let mut bytes: Vec<Vec<u8>> = ids.iter().map(claim_id_bytes).collect();
        let in_id_order = bytes.clone();
        bytes.sort();
        assert_eq!(bytes, in_id_order);
        for id in &ids {
            let stored = claim_id_bytes(id);
            assert_eq!(stored[0], KIND_CLAIM);
            assert_eq!(claim_id_from_bytes(&stored).as_ref(), Some(id));
            assert_eq!(key_id_from_bytes(&stored), None, "a claim is not a key");
            assert_eq!(
                claim_id_from_bytes(&key_id_bytes(id)),
                None,
                "nor the reverse"
            );
        }
        let mut both: Vec<Vec<u8>> = ids
            .iter()
            .map(claim_id_bytes)
            .chain(ids.iter().map(key_id_bytes))
            .collect();
        both.sort();
        let (keys, claims) = both.split_at(ids.len());
        assert!(keys.iter().all(|key| key[0] == KIND_KEY), "{keys:?}");
        assert!(claims.iter().all(|key| key[0] == KIND_CLAIM), "{claims:?}");
    }

    /// A claim store key that [`claim_id_bytes`] could not have written is
    /// refused: another kind, a bad escape, no separator, an empty key, a
    /// key or principal beyond its bound, a principal that is not UTF-8.
    #[test]
    fn bad_claim_store_keys_are_refused() {
        let too_long_key = claim_id_bytes(&id("p", &[7; bounds::CLAIM_KEY_BYTES_MAX as usize + 1]));
        let longest_key = claim_id_bytes(&id("p", &[7; bounds::CLAIM_KEY_BYTES_MAX as usize]));
        assert!(claim_id_from_bytes(&longest_key).is_some());
        let too_long_principal = claim_id_bytes(&id(&"p".repeat(Principal::BYTES_MAX + 1), b"k"));
        for bad in [
            &b""[..],
            b"\x01\x00\x01k",
            b"\x03\x00\x01k",
            b"\x02abc",
            b"\x02a\x00\x02k",
            b"\x02a\x00",
            b"\x02a\x00\x01",
            b"\x02\xff\x00\x01k",
            &too_long_key,
            &too_long_principal,
        ] {
            assert_eq!(claim_id_from_bytes(bad), None, "{bad:?}");
        }
    }

    fn claim(fence: u64, attempt: u64, state: ClaimState) -> ClaimRecord {
        ClaimRecord {
            fingerprint: crate::Fingerprint(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            fence,
            attempt,
            state,
        }
    }

    /// A completed and a released record read back as they were written.
    #[test]
    fn finished_claim_records_round_trip() {
        for record in [
            claim(
                41,
                2,
                ClaimState::Completed {
                    completed_ms: 1_700_000_000_123,
                    result: b"charged 12 EUR".to_vec(),
                },
            ),
            claim(
                7,
                1,
                ClaimState::Completed {
                    completed_ms: 0,
                    result: Vec::new(),
                },
            ),
            claim(u64::MAX, u64::MAX, ClaimState::Released { released_ms: 9 }),
        ] {
            let bytes = claim_record_bytes(&record);
            assert_eq!(claim_record_from_bytes(&bytes).ok(), Some(record));
        }
    }

    /// Stored claim bytes the registry could not have written are an
    /// error, never a panic: a held record, a fence or attempt of 0, a
    /// result beyond its bound, truncated or trailing bytes.
    #[test]
    fn bad_claim_records_are_refused() {
        let released = ClaimState::Released { released_ms: 5 };
        let refused = |record: &ClaimRecord| {
            // Encoded as the codec would, past `claim_record_bytes`' own
            // check.
            let bytes = codec::encode(record);
            claim_record_from_bytes(&bytes).expect_err("refused")
        };
        let held = claim(
            3,
            1,
            ClaimState::Held {
                holder: crate::Nonce(9),
                lease_deadline_ms: 100,
            },
        );
        for (record, why) in [
            (held, "held"),
            (claim(0, 1, released.clone()), "fence 0"),
            (claim(3, 0, released.clone()), "attempt 0"),
            (
                claim(
                    3,
                    1,
                    ClaimState::Completed {
                        completed_ms: 1,
                        result: vec![0; bounds::CLAIM_RESULT_BYTES_MAX as usize + 1],
                    },
                ),
                "beyond its hard bound",
            ),
        ] {
            let error = refused(&record).to_string();
            assert!(error.contains(why), "{why}: {error}");
        }
        let bytes = claim_record_bytes(&claim(3, 1, released));
        for cut in 0..bytes.len() {
            assert!(
                claim_record_from_bytes(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(
            claim_record_from_bytes(&trailing),
            Err(CodecError::TrailingBytes(1))
        ));
        let mut bad_state = bytes;
        let state_at = bad_state.len() - 2;
        bad_state[state_at] = 7;
        assert!(claim_record_from_bytes(&bad_state).is_err());
    }
}
