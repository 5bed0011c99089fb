//! Snapshots: a registry restored midway behaves exactly like one that
//! replayed the whole log, and hostile or damaged snapshot bytes give an
//! error — never a panic or a huge allocation.

mod support;

use oncekv_core::snapshot::{self, SnapshotError};
use oncekv_core::{Command, Entry, Execute, Nonce, Op, Registry, RegistryConfig, Value};
use proptest::prelude::*;
use support::registry::{CLUSTER, Driver, append, incr};

/// A deterministic log: registrations (with a retried nonce), pipelined
/// appends and increments, duplicates, a conflict, keep-alives, a config
/// change and an expiry.
fn log() -> Vec<Entry> {
    let mut entries = vec![Entry::single(
        0,
        Op::Bootstrap {
            cluster_id: CLUSTER,
            config: RegistryConfig {
                session_ttl_ms: 2_000,
                ..RegistryConfig::default()
            },
        },
    )];
    let register = |nonce| Op::Register {
        cluster_id: Some(CLUSTER),
        nonce: Nonce(nonce),
        principal: oncekv_core::Principal::anonymous(),
    };
    for nonce in 1..=4u128 {
        entries.push(Entry::single(10, register(nonce)));
    }
    entries.push(Entry::single(11, register(2)));
    let mut stamp = 20;
    for round in 0..40u64 {
        for client in 2..=5u64 {
            if client == 5 && round > 5 {
                continue; // this client goes idle and expires
            }
            stamp += 70;
            let seq = round + 1;
            let command = if round % 3 == 0 {
                incr("counter", client as i64)
            } else {
                append(&format!("list{}", client % 2), &format!("{client}:{seq}"))
            };
            let execute = |seq, floor, command: Command| {
                Op::Execute(Execute {
                    cluster_id: CLUSTER,
                    client_id: oncekv_core::ClientId(client),
                    seq,
                    first_outstanding_seq: floor,
                    command,
                    principal: oncekv_core::Principal::anonymous(),
                })
            };
            entries.push(Entry::single(
                stamp,
                execute(seq, seq.saturating_sub(2).max(1), command.clone()),
            ));
            if round % 5 == 1 {
                // A retry, and a reuse of the seq with another command.
                entries.push(Entry::single(
                    stamp - 3,
                    execute(seq, seq.saturating_sub(1).max(1), command),
                ));
                entries.push(Entry::single(stamp, execute(seq, seq, incr("other", 1))));
            }
        }
        if round == 10 {
            // One entry carrying a batch: two new clients, a retried
            // register, an execute of a live client and one of an unknown
            // client, each with its own outcome.
            entries.push(Entry {
                stamp_ms: stamp,
                ops: std::sync::Arc::from(vec![
                    register(10),
                    register(11),
                    register(2),
                    Op::Execute(Execute {
                        cluster_id: CLUSTER,
                        client_id: oncekv_core::ClientId(3),
                        seq: 500,
                        first_outstanding_seq: 1,
                        command: incr("batched", 1),
                        principal: oncekv_core::Principal::anonymous(),
                    }),
                    Op::Execute(Execute {
                        cluster_id: CLUSTER,
                        client_id: oncekv_core::ClientId(999_999),
                        seq: 1,
                        first_outstanding_seq: 1,
                        command: incr("batched", 1),
                        principal: oncekv_core::Principal::anonymous(),
                    }),
                ]),
            });
        }
        // Idempotency keys of two principals: first executions, repeats,
        // a conflict, a shorter TTL (which expires keys at its entry and
        // later ones as time goes on) and an operator's forget.
        let keyed = |principal: &str, key: String, command: Command| Op::ExecuteKeyed {
            cluster_id: CLUSTER,
            key: oncekv_core::IdempotencyKey(key.into_bytes()),
            command,
            principal: oncekv_core::Principal(principal.into()),
        };
        let principal = ["", "alice"][round as usize % 2];
        entries.push(Entry::single(
            stamp,
            keyed(principal, format!("key{}", round % 7), incr("keyed", 1)),
        ));
        if round % 6 == 3 {
            entries.push(Entry::single(
                stamp,
                keyed(principal, format!("key{}", round % 7), incr("keyed", 2)),
            ));
        }
        if round == 25 {
            entries.push(Entry::single(
                stamp,
                Op::PatchConfigs {
                    cluster_id: CLUSTER,
                    patch: oncekv_core::ConfigPatch::default(),
                    keyed: oncekv_core::KeyedConfigPatch {
                        idempotency_key_ttl_ms: Some(1_500),
                        ..Default::default()
                    },
                },
            ));
        }
        if round == 30 {
            entries.push(Entry::single(
                stamp,
                Op::ForgetKey {
                    cluster_id: CLUSTER,
                    principal: oncekv_core::Principal::anonymous(),
                    key: oncekv_core::IdempotencyKey(b"key2".to_vec()),
                },
            ));
        }
        if round == 20 {
            entries.push(Entry::single(
                stamp,
                Op::SetConfig {
                    cluster_id: CLUSTER,
                    config: RegistryConfig {
                        session_ttl_ms: 1_000,
                        window: 8,
                        ..RegistryConfig::default()
                    },
                },
            ));
        }
    }
    entries
}

/// Two registries apply the same entries; one is snapshotted and restored
/// midway. They give equal answers to every later entry and end with equal
/// hashes (rules 13 and 15).
#[test]
fn restored_midway_equals_full_replay() {
    let entries = log();
    for cut in [1, 5, 37, entries.len() / 2, entries.len() - 1] {
        let mut replayed = Registry::new();
        let mut restored = Registry::new();
        for (position, entry) in entries.iter().enumerate() {
            let index = position as u64 + 1;
            if position == cut {
                let bytes = snapshot::to_bytes(&restored);
                restored = snapshot::from_bytes(&bytes).expect("snapshot reads back");
                assert_eq!(
                    snapshot::state_hash(&restored),
                    snapshot::state_hash(&replayed)
                );
            }
            assert_eq!(
                restored.apply(index, entry),
                replayed.apply(index, entry),
                "entry {index}"
            );
        }
        assert_eq!(
            snapshot::state_hash(&restored),
            snapshot::state_hash(&replayed)
        );
        assert_eq!(restored, replayed);
        assert!(replayed.session_count() < 4, "a session expired");
        assert!(
            (1..14).contains(&replayed.key_count()),
            "keys live, some expired: {}",
            replayed.key_count()
        );
        assert!(replayed.get(b"counter").is_some());
    }
}

fn sample() -> Vec<u8> {
    let mut driver = Driver::new();
    let client = driver.register(9);
    driver.execute(client, 1, 1, append("l", "x"));
    driver.execute(
        client,
        2,
        1,
        Command::Put {
            key: b"b".to_vec(),
            value: Value::Bytes(vec![1, 2, 3]),
        },
    );
    snapshot::to_bytes(&driver.registry)
}

/// Every truncation of a valid snapshot is refused.
#[test]
fn truncated_snapshot_is_refused() {
    let bytes = sample();
    for length in 0..bytes.len() {
        assert!(
            snapshot::from_bytes(&bytes[..length]).is_err(),
            "truncated to {length}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(snapshot::from_bytes(&longer).is_err());
}

/// Every single-bit flip of a valid snapshot is refused (the checksum, or
/// an earlier check, catches it).
#[test]
fn corrupted_snapshot_is_refused() {
    let bytes = sample();
    for position in 0..bytes.len() {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[position] ^= 1 << bit;
            assert!(
                snapshot::from_bytes(&damaged).is_err(),
                "bit {bit} of byte {position}"
            );
        }
    }
}

/// A record length far beyond the limit is refused before any buffer is
/// sized for it.
#[test]
fn huge_record_length_is_refused() {
    let mut bytes = snapshot::MAGIC.to_vec();
    bytes.extend_from_slice(&snapshot::SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        snapshot::from_bytes(&bytes),
        Err(SnapshotError::RecordTooLarge(_))
    ));
    bytes.truncate(12);
    bytes.extend_from_slice(&(1u32 << 20).to_le_bytes());
    bytes.extend_from_slice(&[0; 10]);
    assert!(matches!(
        snapshot::from_bytes(&bytes),
        Err(SnapshotError::Truncated)
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Arbitrary bytes after a valid magic and version never panic.
    #[test]
    fn hostile_snapshot_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = snapshot::MAGIC.to_vec();
        bytes.extend_from_slice(&snapshot::SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&tail);
        prop_assert!(snapshot::from_bytes(&bytes).is_err());
    }

    /// Arbitrary bytes never decode as a log entry by accident into a panic.
    #[test]
    fn hostile_entry_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = oncekv_core::codec::decode_entry(&bytes);
    }
}

/// A copy of the registry (what snapshots and state hashes encode, outside
/// the state lock) is a point in time: applying more entries to the
/// original changes nothing in the copy, and vice versa.
#[test]
fn a_copy_is_unaffected_by_later_applies() {
    let entries = log();
    let (first, rest) = entries.split_at(entries.len() / 2);
    let mut registry = Registry::new();
    for (position, entry) in first.iter().enumerate() {
        registry.apply(position as u64 + 1, entry);
    }
    let hash_before = snapshot::state_hash(&registry);
    let bytes_before = snapshot::to_bytes(&registry);
    let copy = registry.clone();
    for (position, entry) in rest.iter().enumerate() {
        registry.apply((first.len() + position) as u64 + 1, entry);
    }
    assert_ne!(snapshot::state_hash(&registry), hash_before);
    assert_eq!(snapshot::state_hash(&copy), hash_before);
    assert_eq!(snapshot::to_bytes(&copy), bytes_before);
}
