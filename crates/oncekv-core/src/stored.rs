//! The byte forms of the records an adapter keeps in its own store
//! (docs/state-beyond-ram.md §4.1): the store key of a record's id and the
//! bytes of the record. It owns those encodings and their checks (a store
//! is input from the disk: decoding refuses what the registry could not
//! have written) and nothing else; the store itself, and when it is
//! written, are the adapter's.
//!
//! A store key is `kind u8 ‖ escaped principal ‖ 0x00 0x01 ‖ key`, the
//! principal's 0x00 bytes written as 0x00 0xFF: byte order of store keys is
//! exactly (principal, key) order, so a store scanned in key order yields
//! records in the order snapshots and paging walk them (rule 10).

use super::codec::{self, CodecError};
use super::keyed::{KeyId, KeyRecord};
use super::session::CachedResponse;
use super::types::{IdempotencyKey, Principal, bounds};
use serde::{Deserialize, Serialize};

/// The kind byte of idempotency-key records.
pub const KIND_KEY: u8 = 1;

/// The store key of key record `id`.
pub fn key_id_bytes(id: &KeyId) -> Vec<u8> {
    let (principal, key) = id;
    let mut bytes = Vec::with_capacity(3 + principal.0.len() + key.0.len());
    bytes.push(KIND_KEY);
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

/// The id a store key names; `None` if it is not one [`key_id_bytes`]
/// writes (another kind, a bad escape, a name or key beyond its bound).
pub fn key_id_from_bytes(bytes: &[u8]) -> Option<KeyId> {
    let (&KIND_KEY, mut rest) = bytes.split_first()? else {
        return None;
    };
    let mut principal = Vec::new();
    loop {
        match rest {
            [0x00, 0xFF, tail @ ..] => {
                principal.push(0);
                rest = tail;
            }
            [0x00, 0x01, tail @ ..] => {
                rest = tail;
                break;
            }
            [0x00, ..] | [] => return None,
            [byte, tail @ ..] => {
                principal.push(*byte);
                rest = tail;
            }
        }
    }
    let principal = String::from_utf8(principal).ok()?;
    if principal.len() > Principal::BYTES_MAX
        || rest.is_empty()
        || rest.len() as u64 > bounds::IDEMPOTENCY_KEY_BYTES_MAX
    {
        return None;
    }
    Some((Principal(principal), IdempotencyKey(rest.to_vec())))
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
}
