//! The command fingerprint (rule 6): a fixed 128-bit hash of the command
//! alone, stored beside its cached response to detect a seq reused for
//! another command. It must never depend on the floor, the stamp or anything
//! else that may differ between attempts, nor on any serialisation library.
//!
//! Definition (version 1): the first 16 bytes, read little-endian, of the
//! plain BLAKE3 hash of the domain prefix `"oncekv command fingerprint v1\0"`
//! followed by the command's canonical bytes:
//!
//! | command | bytes |
//! | --- | --- |
//! | put | `0x01` key value |
//! | delete | `0x02` key |
//! | increment | `0x03` key delta (i64 LE) |
//! | append | `0x04` key element |
//! | compare-and-swap | `0x05` key (`0x00` \| `0x01` expected-value) new-value |
//!
//! A byte string is its length as u64 LE followed by its bytes. A value is a
//! tag (`0x01` bytes, `0x02` int as i64 LE, `0x03` list: count as u64 LE then
//! each element as a byte string) followed by its payload.
//!
//! A claim's fingerprint (rule 20) is the caller's own description of the
//! effect (any bytes: a request body's hash, "charge order 42 EUR 10"),
//! hashed the same way under the domain `"oncekv claim fingerprint v1\0"`:
//! the first 16 bytes, little-endian, of BLAKE3(domain ‖ bytes).

use super::types::{Command, Fingerprint, Value};

const DOMAIN: &[u8] = b"oncekv command fingerprint v1\0";

/// Computes the fingerprint of `command`.
pub fn fingerprint(command: &Command) -> Fingerprint {
    let mut hasher = Feed::new();
    hasher.update(DOMAIN);
    match command {
        Command::Put { key, value } => {
            hasher.update(&[0x01]);
            bytes(&mut hasher, key);
            self::value(&mut hasher, value);
        }
        Command::Delete { key } => {
            hasher.update(&[0x02]);
            bytes(&mut hasher, key);
        }
        Command::Increment { key, delta } => {
            hasher.update(&[0x03]);
            bytes(&mut hasher, key);
            hasher.update(&delta.to_le_bytes());
        }
        Command::Append { key, element } => {
            hasher.update(&[0x04]);
            bytes(&mut hasher, key);
            bytes(&mut hasher, element);
        }
        Command::CompareAndSwap { key, expected, new } => {
            hasher.update(&[0x05]);
            bytes(&mut hasher, key);
            match expected {
                None => {
                    hasher.update(&[0x00]);
                }
                Some(expected) => {
                    hasher.update(&[0x01]);
                    value(&mut hasher, expected);
                }
            }
            value(&mut hasher, new);
        }
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest.as_bytes()[..16]);
    Fingerprint(u128::from_le_bytes(first))
}

/// The hasher of a command's canonical bytes, fed through a small buffer:
/// a command's bytes come in many short pieces (a tag, a length, a key),
/// and BLAKE3 pays a fixed cost per `update` call. Every request of a
/// session is fingerprinted on every node, so a typical command's bytes
/// reach the hasher in one call. The bytes hashed are the same either way.
struct Feed {
    hasher: blake3::Hasher,
    buffer: [u8; Feed::BUFFER_BYTES],
    buffered: usize,
}

impl Feed {
    const BUFFER_BYTES: usize = 256;

    fn new() -> Feed {
        Feed {
            hasher: blake3::Hasher::new(),
            buffer: [0; Feed::BUFFER_BYTES],
            buffered: 0,
        }
    }

    fn update(&mut self, data: &[u8]) {
        if self.buffered + data.len() > Feed::BUFFER_BYTES {
            self.hasher.update(&self.buffer[..self.buffered]);
            self.buffered = 0;
            if data.len() > Feed::BUFFER_BYTES {
                self.hasher.update(data);
                return;
            }
        }
        self.buffer[self.buffered..self.buffered + data.len()].copy_from_slice(data);
        self.buffered += data.len();
    }

    fn finalize(mut self) -> blake3::Hash {
        self.hasher.update(&self.buffer[..self.buffered]);
        self.hasher.finalize()
    }
}

const CLAIM_DOMAIN: &[u8] = b"oncekv claim fingerprint v1\0";

/// Computes the fingerprint of a claim from the caller's description of
/// its effect.
pub fn claim_fingerprint(description: &[u8]) -> Fingerprint {
    let mut hasher = blake3::Hasher::new();
    hasher.update(CLAIM_DOMAIN);
    hasher.update(description);
    let digest = hasher.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest.as_bytes()[..16]);
    Fingerprint(u128::from_le_bytes(first))
}

fn bytes(hasher: &mut Feed, data: &[u8]) {
    hasher.update(&(data.len() as u64).to_le_bytes());
    hasher.update(data);
}

fn value(hasher: &mut Feed, value: &Value) {
    match value {
        Value::Bytes(data) => {
            hasher.update(&[0x01]);
            bytes(hasher, data);
        }
        Value::Int(number) => {
            hasher.update(&[0x02]);
            hasher.update(&number.to_le_bytes());
        }
        Value::List(items) => {
            hasher.update(&[0x03]);
            hasher.update(&(items.len() as u64).to_le_bytes());
            for item in items {
                bytes(hasher, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprint is a fixed function: this pins its value so that a
    /// change of definition (which would make every cached response look
    /// like a conflict after an upgrade) cannot go unnoticed.
    #[test]
    fn fingerprint_is_pinned() {
        let command = Command::Increment {
            key: b"counter".to_vec(),
            delta: 5,
        };
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"oncekv command fingerprint v1\0");
        hasher.update(&[0x03]);
        hasher.update(&7u64.to_le_bytes());
        hasher.update(b"counter");
        hasher.update(&5i64.to_le_bytes());
        let digest = hasher.finalize();
        let expected = u128::from_le_bytes(digest.as_bytes()[..16].try_into().unwrap());
        assert_eq!(fingerprint(&command), Fingerprint(expected));
        assert_eq!(
            format!("{:032x}", fingerprint(&command).0),
            format!("{expected:032x}")
        );
    }

    /// Commands that differ in any field, including the kind of a value,
    /// have different fingerprints.
    #[test]
    fn fingerprint_separates_commands() {
        let commands = [
            Command::Put {
                key: b"k".to_vec(),
                value: Value::Bytes(b"1".to_vec()),
            },
            Command::Put {
                key: b"k".to_vec(),
                value: Value::Int(1),
            },
            Command::Put {
                key: b"k".to_vec(),
                value: Value::List(vec![b"1".to_vec()]),
            },
            Command::Put {
                key: b"k1".to_vec(),
                value: Value::Bytes(Vec::new()),
            },
            Command::Delete { key: b"k".to_vec() },
            Command::Increment {
                key: b"k".to_vec(),
                delta: 1,
            },
            Command::Increment {
                key: b"k".to_vec(),
                delta: 2,
            },
            Command::Append {
                key: b"k".to_vec(),
                element: b"1".to_vec(),
            },
            Command::CompareAndSwap {
                key: b"k".to_vec(),
                expected: None,
                new: Value::Int(1),
            },
            Command::CompareAndSwap {
                key: b"k".to_vec(),
                expected: Some(Value::Int(0)),
                new: Value::Int(1),
            },
        ];
        let mut seen = std::collections::BTreeSet::new();
        for command in &commands {
            assert!(seen.insert(fingerprint(command)), "{command:?}");
        }
    }

    /// The buffered feed hashes the definition's bytes exactly, whatever
    /// the sizes: a put whose key and value end below, at and beyond the
    /// buffer (and a list that spills it), against BLAKE3 of the whole
    /// byte string at once.
    #[test]
    fn buffering_changes_no_fingerprint() {
        for value_bytes in [0usize, 1, 150, 181, 182, 183, 255, 256, 257, 600, 5_000] {
            let key = b"some-key".to_vec();
            let value = vec![0xa5u8; value_bytes];
            let mut whole = DOMAIN.to_vec();
            whole.push(0x01);
            whole.extend_from_slice(&(key.len() as u64).to_le_bytes());
            whole.extend_from_slice(&key);
            whole.push(0x01);
            whole.extend_from_slice(&(value.len() as u64).to_le_bytes());
            whole.extend_from_slice(&value);
            let digest = blake3::hash(&whole);
            let expected = u128::from_le_bytes(digest.as_bytes()[..16].try_into().unwrap());
            let command = Command::Put {
                key,
                value: Value::Bytes(value),
            };
            assert_eq!(
                fingerprint(&command),
                Fingerprint(expected),
                "{value_bytes}"
            );
        }
        let items: Vec<Vec<u8>> = (0..40).map(|n| vec![n as u8; 20]).collect();
        let mut whole = DOMAIN.to_vec();
        whole.push(0x04);
        whole.extend_from_slice(&1u64.to_le_bytes());
        whole.push(b'k');
        whole.extend_from_slice(&3u64.to_le_bytes());
        whole.extend_from_slice(b"one");
        let append = Command::Append {
            key: b"k".to_vec(),
            element: b"one".to_vec(),
        };
        let digest = blake3::hash(&whole);
        let expected = u128::from_le_bytes(digest.as_bytes()[..16].try_into().unwrap());
        assert_eq!(fingerprint(&append), Fingerprint(expected));
        let mut whole = DOMAIN.to_vec();
        whole.push(0x01);
        whole.extend_from_slice(&1u64.to_le_bytes());
        whole.push(b'k');
        whole.push(0x03);
        whole.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for item in &items {
            whole.extend_from_slice(&(item.len() as u64).to_le_bytes());
            whole.extend_from_slice(item);
        }
        let digest = blake3::hash(&whole);
        let expected = u128::from_le_bytes(digest.as_bytes()[..16].try_into().unwrap());
        let list = Command::Put {
            key: b"k".to_vec(),
            value: Value::List(items),
        };
        assert_eq!(fingerprint(&list), Fingerprint(expected));
    }
}
