//! The one place that turns persisted and replicated values into bytes and
//! back: bincode 2 (standard config: little-endian, variable-length
//! integers, identical on every platform) with a hard decode limit, so that
//! a length prefix in hostile bytes can never allocate more than
//! [`DECODE_LIMIT_BYTES`]. Formats that outlive a process carry a version
//! byte in front; swapping the encoding means changing this module only.

use serde::{Serialize, de::DeserializeOwned};

/// Upper bound on what decoding one value may claim. The registry's config
/// bounds keep any entry or snapshot record far below it.
pub const DECODE_LIMIT_BYTES: usize = 64 << 20;

/// Version byte of log entries written by this build. Version 2 entries carry
/// a batch of requests (version 1 carried one); version 3 changed the apply
/// rules (final request limits); version 4 carries the requesting principal
/// in every session request and applies ownership (rule 19) and the floor's
/// bound (rule 7); version 5 adds requests after every earlier one
/// (idempotency keys, rule 18), so a version 4 body decodes and applies
/// exactly as before and is still read; version 6 adds claims (rule 20)
/// after every earlier request the same way, so versions 4 and 5 are still
/// read (a build that knows only 5 refuses a version 6 entry by its version
/// byte, never by misreading it); version 7 adds rules versions (a
/// bootstrap under a version, and raising it) the same way. Older versions
/// are refused: they were decided under other rules (storage formats 4 and
/// 5 refuse their data directories).
///
/// An entry is written in the lowest of versions 6 and 7 that holds every
/// request in it ([`crate::Op::entry_format`]): a build that reads only 6
/// follows a cluster of this build until someone asks for what only 7
/// holds (a new cluster's bootstrap, or raising the rules version).
pub const ENTRY_FORMAT_VERSION: u8 = 7;
/// The previous entry formats, still read (see [`ENTRY_FORMAT_VERSION`]).
pub const ENTRY_FORMAT_VERSION_6: u8 = 6;
pub const ENTRY_FORMAT_VERSION_5: u8 = 5;
pub const ENTRY_FORMAT_VERSION_4: u8 = 4;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty input")]
    Empty,
    #[error("unsupported format version {found} (this build reads {supported})")]
    UnsupportedVersion { found: u8, supported: u8 },
    #[error("malformed bytes: {0}")]
    Malformed(String),
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT_BYTES>()
}

/// Appends the encoding of `value` to `out`.
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    bincode::serde::encode_into_std_write(value, out, config())
        .expect("encoding into memory cannot fail");
}

/// Encodes `value` without a version byte.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(value, &mut out);
    out
}

/// Decodes exactly one value from `bytes`; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, used) = decode_prefix(bytes)?;
    match bytes.len() - used {
        0 => Ok(value),
        extra => Err(CodecError::TrailingBytes(extra)),
    }
}

/// Decodes one value from the start of `bytes`: the value and how many
/// bytes it took (what follows is the caller's to read).
pub fn decode_prefix<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), CodecError> {
    bincode::serde::decode_from_slice(bytes, config())
        .map_err(|error| CodecError::Malformed(error.to_string()))
}

/// Encodes `value` behind a version byte.
pub fn encode_versioned<T: Serialize + ?Sized>(version: u8, value: &T) -> Vec<u8> {
    let mut out = vec![version];
    encode_into(value, &mut out);
    out
}

/// Decodes a value written by [`encode_versioned`] with `version`.
pub fn decode_versioned<T: DeserializeOwned>(version: u8, bytes: &[u8]) -> Result<T, CodecError> {
    let (&found, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if found != version {
        return Err(CodecError::UnsupportedVersion {
            found,
            supported: version,
        });
    }
    decode(body)
}

/// Encodes a registry log entry in the lowest entry format that holds its
/// requests (6 or 7, see [`ENTRY_FORMAT_VERSION`]).
pub fn encode_entry(entry: &super::Entry) -> Vec<u8> {
    let version = entry
        .ops
        .iter()
        .map(super::Op::entry_format)
        .max()
        .unwrap_or(ENTRY_FORMAT_VERSION_6);
    encode_versioned(version, entry)
}

/// Decodes a registry log entry of format 4 to 7; hostile bytes give an
/// error, never a panic. The variants of requests only ever grow at the
/// end, so one decoder reads every version; the version byte tells an older
/// build what it cannot read.
pub fn decode_entry(bytes: &[u8]) -> Result<super::Entry, CodecError> {
    match bytes.first() {
        Some(&version @ ENTRY_FORMAT_VERSION_4..=ENTRY_FORMAT_VERSION) => {
            let entry: super::Entry = decode_versioned(version, bytes)?;
            // A request newer than its entry's version: not what any build
            // writes.
            if entry
                .ops
                .iter()
                .any(|op| op.entry_format() > version.max(6))
            {
                return Err(CodecError::Malformed(format!(
                    "a request of a later entry format in a version {version} entry"
                )));
            }
            Ok(entry)
        }
        _ => decode_versioned(ENTRY_FORMAT_VERSION, bytes),
    }
}

/// `#[serde(with = "crate::codec::bytes")]` on a `Vec<u8>` field: the same
/// bytes as the field's plain derive (bincode writes a sequence of `u8` and
/// a byte string alike, length then bytes, and JSON both as an array of
/// numbers), but read in one piece instead of one element at a time. The
/// snapshot's receiver and every apply decode keys and values this way.
/// (The `serde_bytes` crate does this; the core may depend on serde and
/// bincode only.)
pub(crate) mod bytes {
    use serde::{Deserializer, Serializer, de};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(Bytes)
    }

    struct Bytes;

    impl<'de> de::Visitor<'de> for Bytes {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
            Ok(bytes.to_vec())
        }

        fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(bytes)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
            Ok(text.as_bytes().to_vec())
        }

        /// What a self-describing format hands over for a sequence (JSON's
        /// array of numbers).
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(byte) = seq.next_element()? {
                bytes.push(byte);
            }
            Ok(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientId, ClusterId, Command, Entry, Execute, Op, Value};

    /// An entry survives the round trip, and a wrong version is refused.
    #[test]
    fn entry_round_trip_and_version() {
        let entry = Entry {
            stamp_ms: 42,
            ops: std::sync::Arc::new([Op::Execute(Execute {
                cluster_id: ClusterId(7),
                client_id: ClientId(3),
                seq: 9,
                first_outstanding_seq: 8,
                command: Command::Put {
                    key: b"k".to_vec(),
                    value: Value::List(vec![b"a".to_vec()]),
                },
                principal: crate::Principal::anonymous(),
            })]),
        };
        let bytes = encode_entry(&entry);
        assert_eq!(decode_entry(&bytes).unwrap(), entry);
        let mut wrong = bytes.clone();
        wrong[0] = 99;
        assert!(matches!(
            decode_entry(&wrong),
            Err(CodecError::UnsupportedVersion { found: 99, .. })
        ));
        let mut longer = bytes;
        longer.push(0);
        assert!(matches!(
            decode_entry(&longer),
            Err(CodecError::TrailingBytes(1))
        ));
    }

    /// A version 4 entry (written before idempotency keys) and a version 5
    /// one (before claims) decode to the same entry as their version 6
    /// twin: the body did not change.
    #[test]
    fn version_4_entries_are_read() {
        let entry = Entry::single(
            7,
            Op::PatchConfig {
                cluster_id: ClusterId(7),
                patch: crate::ConfigPatch {
                    window: Some(8),
                    ..Default::default()
                },
            },
        );
        let current = encode_entry(&entry);
        let mut previous = current.clone();
        previous[0] = ENTRY_FORMAT_VERSION_4;
        assert_eq!(current[0], 6);
        assert_eq!(decode_entry(&previous).unwrap(), entry);
        previous[0] = ENTRY_FORMAT_VERSION_5;
        assert_eq!(decode_entry(&previous).unwrap(), entry);
        let mut older = current;
        older[0] = 3;
        assert!(matches!(
            decode_entry(&older),
            Err(CodecError::UnsupportedVersion { found: 3, .. })
        ));
    }

    /// An entry is written in the lowest format holding its requests: an
    /// ordinary one in 6 (what a build reading 6 follows), one raising the
    /// rules version or bootstrapping under one in 7; a request of format 7
    /// inside a version 6 entry is refused.
    #[test]
    fn entries_are_written_in_the_lowest_format_that_holds_them() {
        let ordinary = Entry::single(
            3,
            Op::ExecutePlain {
                cluster_id: ClusterId(7),
                command: Command::Delete { key: b"k".to_vec() },
            },
        );
        assert_eq!(encode_entry(&ordinary)[0], ENTRY_FORMAT_VERSION_6);
        let raise = Entry {
            stamp_ms: 4,
            ops: std::sync::Arc::new([
                ordinary.ops[0].clone(),
                Op::RaiseRules {
                    cluster_id: ClusterId(7),
                    rules: crate::RulesVersion::V2,
                },
            ]),
        };
        let mut bytes = encode_entry(&raise);
        assert_eq!(bytes[0], ENTRY_FORMAT_VERSION);
        assert_eq!(decode_entry(&bytes).unwrap(), raise);
        bytes[0] = ENTRY_FORMAT_VERSION_6;
        assert!(matches!(
            decode_entry(&bytes),
            Err(CodecError::Malformed(_))
        ));
    }

    /// A length prefix claiming far more than the limit is refused before
    /// anything is allocated for it.
    #[test]
    fn huge_length_prefix_is_refused() {
        // stamp 0, one op: Op::Execute, ..., a key whose varint length
        // claims 2^62 bytes.
        let mut bytes = vec![ENTRY_FORMAT_VERSION, 0, 1, 2, 7, 3, 9, 8, 0];
        bytes.push(0xFD);
        bytes.extend_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(decode_entry(&bytes).is_err());
    }

    /// The byte fields read in one piece are written exactly as their plain
    /// derive writes them, and read back from it: the log, the snapshots and
    /// the state hash do not change. Lengths cross the varint's boundaries.
    mod bytes_as_before {
        use super::super::{decode, encode};
        use crate::{ClaimState, Command, IdempotencyKey, Value};
        use proptest::prelude::*;
        use serde::Serialize;

        #[derive(Serialize)]
        enum PlainValue {
            Bytes(Vec<u8>),
            Int(i64),
        }

        #[derive(Serialize)]
        enum PlainCommand {
            Put { key: Vec<u8>, value: PlainValue },
            Delete { key: Vec<u8> },
            Increment { key: Vec<u8>, delta: i64 },
            Append { key: Vec<u8>, element: Vec<u8> },
        }

        fn bytes() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..4),
                proptest::collection::vec(any::<u8>(), 120..300),
                proptest::collection::vec(any::<u8>(), 65_530..65_540),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn byte_fields_keep_their_encoding(key in bytes(), value in bytes(), delta in any::<i64>()) {
                let pairs = [
                    (
                        encode(&Command::Put { key: key.clone(), value: Value::Bytes(value.clone()) }),
                        encode(&PlainCommand::Put { key: key.clone(), value: PlainValue::Bytes(value.clone()) }),
                    ),
                    (
                        encode(&Command::Put { key: key.clone(), value: Value::Int(delta) }),
                        encode(&PlainCommand::Put { key: key.clone(), value: PlainValue::Int(delta) }),
                    ),
                    (
                        encode(&Command::Delete { key: key.clone() }),
                        encode(&PlainCommand::Delete { key: key.clone() }),
                    ),
                    (
                        encode(&Command::Increment { key: key.clone(), delta }),
                        encode(&PlainCommand::Increment { key: key.clone(), delta }),
                    ),
                    (
                        encode(&Command::Append { key: key.clone(), element: value.clone() }),
                        encode(&PlainCommand::Append { key: key.clone(), element: value.clone() }),
                    ),
                    (encode(&IdempotencyKey(key.clone())), encode(&key)),
                ];
                for (ours, plain) in &pairs {
                    prop_assert_eq!(ours, plain);
                }
                prop_assert_eq!(
                    decode::<Command>(&pairs[0].1).unwrap(),
                    Command::Put { key: key.clone(), value: Value::Bytes(value.clone()) }
                );
                prop_assert_eq!(
                    decode::<Command>(&pairs[4].1).unwrap(),
                    Command::Append { key: key.clone(), element: value.clone() }
                );
                prop_assert_eq!(decode::<IdempotencyKey>(&pairs[5].1).unwrap(), IdempotencyKey(key.clone()));
                let completed = ClaimState::Completed { completed_ms: 9, result: value.clone() };
                prop_assert_eq!(encode(&completed)[1..].to_vec(), encode(&(9u64, value.clone())));
                prop_assert_eq!(decode::<ClaimState>(&encode(&completed)).unwrap(), completed);
            }
        }

        /// A byte field is still refused past the decode limit, and a length
        /// beyond its input is an error, not a panic.
        #[test]
        fn byte_fields_refuse_a_hostile_length() {
            let mut bytes = encode(&IdempotencyKey(b"k".to_vec()));
            bytes[0] = 0xFD;
            bytes.truncate(1);
            bytes.extend_from_slice(&(1u64 << 62).to_le_bytes());
            assert!(decode::<IdempotencyKey>(&bytes).is_err());
            let mut short = encode(&IdempotencyKey(vec![7; 10]));
            short.truncate(5);
            assert!(decode::<IdempotencyKey>(&short).is_err());
        }
    }
}
