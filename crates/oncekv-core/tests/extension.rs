//! A snapshot sent as an extension of its receiver's base
//! (oncekv_core::extension): the receiver that adds the records it
//! accepted to the records its base holds holds exactly the snapshot's;
//! one whose base is not extended by the snapshot (a record forgotten
//! since) refuses the stream, and the sender's plan refuses what the
//! summaries already show.

use oncekv_core::extension::{Extension, RecordsBase};
use oncekv_core::snapshot::{self, SnapshotError, Streamed};
use oncekv_core::stored::{claim_record_bytes, key_record_bytes};
use oncekv_core::{
    ClusterId, Command, Entry, GroupedRecord, IdempotencyKey, KeyId, Op, Outcome, Principal,
    Registry, RegistryConfig, RulesVersion, Value,
};
use std::collections::BTreeMap;

const CLUSTER: ClusterId = ClusterId(0x0e57_e4d5);

/// What a store holds: (kind, id) → (group, stored bytes).
type Store = BTreeMap<(u8, KeyId), (u64, Vec<u8>)>;

struct Replica {
    registry: Registry,
    index: u64,
}

impl Replica {
    fn new() -> Replica {
        let mut replica = Replica {
            registry: Registry::new(),
            index: 0,
        };
        let outcome = replica.apply(
            1_000,
            Op::BootstrapWithRules {
                cluster_id: CLUSTER,
                config: RegistryConfig::default(),
                rules: RulesVersion::V3,
            },
        );
        assert!(
            matches!(outcome, Outcome::Bootstrapped { .. }),
            "{outcome:?}"
        );
        replica
    }

    fn apply(&mut self, now_ms: u64, op: Op) -> Outcome {
        self.index += 1;
        let entry = Entry {
            stamp_ms: now_ms,
            ops: vec![op].into(),
        };
        self.registry.apply(self.index, &entry).remove(0)
    }

    fn put(&mut self, now_ms: u64, k: u32) {
        let outcome = self.apply(
            now_ms,
            Op::ExecuteKeyed {
                cluster_id: CLUSTER,
                key: key(k),
                command: Command::Put {
                    key: b"data".to_vec(),
                    value: Value::Bytes(vec![k as u8; 64]),
                },
                principal: Principal::anonymous(),
            },
        );
        assert!(
            matches!(
                outcome,
                Outcome::Executed {
                    duplicate: false,
                    ..
                }
            ),
            "{outcome:?}"
        );
    }

    fn forget(&mut self, now_ms: u64, k: u32) {
        self.apply(
            now_ms,
            Op::ForgetKey {
                cluster_id: CLUSTER,
                principal: Principal::anonymous(),
                key: key(k),
            },
        );
    }

    /// Every live record as a store would hold it (the registry holds them
    /// all: nothing was ever taken out of it).
    fn store(&self) -> Store {
        let changes = self.registry.clone().take_record_changes();
        let mut store = Store::new();
        for (id, record) in changes.keys.records {
            let record = record.expect("a first take holds records only");
            let bytes = key_record_bytes(&record.record);
            store.insert((0, id), (record.group_ms, bytes));
        }
        for (id, record) in changes.claims.into_iter().flat_map(|c| c.records) {
            let record = record.expect("a first take holds records only");
            let bytes = claim_record_bytes(&record.record);
            store.insert((1, id), (record.group_ms, bytes));
        }
        store
    }
}

fn key(k: u32) -> IdempotencyKey {
    IdempotencyKey(format!("key-{k:06}").into_bytes())
}

/// The extension of `base` a sender streams for `this` under `plan`:
/// the part, the records the plan sends, each kind ended, the trailer.
fn extension_bytes(this: &Replica, plan: &Extension) -> Vec<u8> {
    let mut bytes = Vec::new();
    snapshot::write_part_only(&this.registry, &mut bytes).unwrap();
    let store = this.store();
    for kind in [0u8, 1] {
        for ((of, id), (group, stored)) in &store {
            if *of != kind {
                continue;
            }
            let sends = match kind {
                0 => plan.sends_key(*group, stored),
                _ => plan.sends_claim(*group, stored),
            }
            .unwrap();
            if sends {
                let store_key = match kind {
                    0 => oncekv_core::stored::key_id_bytes(id),
                    _ => oncekv_core::stored::claim_id_bytes(id),
                };
                let encode = match kind {
                    0 => snapshot::encode_stored_key_record,
                    _ => snapshot::encode_stored_claim_record,
                };
                encode(&store_key, stored, &mut bytes).unwrap();
            }
        }
        bytes.extend_from_slice(&snapshot::END_OF_KIND);
    }
    let trailer = *blake3::hash(&bytes).as_bytes();
    bytes.extend_from_slice(&trailer);
    bytes
}

/// Reads `bytes` as an extension of `base` whose records `held` are;
/// returns the records it sent, or the stream's error.
fn receive(bytes: &[u8], base: &RecordsBase, held: &Store) -> Result<Store, SnapshotError> {
    let held = held.clone();
    let (_, records) = snapshot::read_part_extending(
        bytes,
        base,
        Box::new(move |streamed| match streamed {
            Streamed::Key(id, GroupedRecord { group_ms, .. }, bytes) => {
                held.get(&(0, id.clone())) == Some(&(*group_ms, bytes.clone()))
            }
            Streamed::Claim(id, GroupedRecord { group_ms, .. }, bytes) => {
                held.get(&(1, id.clone())) == Some(&(*group_ms, bytes.clone()))
            }
        }),
    )?;
    let mut received = Store::new();
    for record in *records {
        match record? {
            Streamed::Key(id, record, bytes) => received.insert((0, id), (record.group_ms, bytes)),
            Streamed::Claim(id, record, bytes) => {
                received.insert((1, id), (record.group_ms, bytes))
            }
        };
    }
    Ok(received)
}

/// A follower's base at some point, the leader's state later: keys added
/// after it (some at the base's very millisecond), none forgotten. The
/// plan sends only those; the receiver accepts them, and its base's
/// records with them are the leader's, exactly.
#[test]
fn a_base_plus_the_records_sent_is_the_snapshot() {
    let mut leader = Replica::new();
    for k in 0..40 {
        leader.put(1_000 + u64::from(k) * 10, k);
    }
    let base_state = leader.store();
    let base = leader.registry.records_base();
    // At the base's millisecond (one entry after it), then later.
    let base_ms = base.cluster_time_ms;
    leader.put(base_ms, 100);
    for k in 101..130 {
        leader.put(base_ms + u64::from(k), k);
    }
    let this = leader.registry.records_base();
    let plan = Extension::plan(&this, &base, u64::MAX).expect("only keys added: an extension");
    let bytes = extension_bytes(&leader, &plan);
    let received = receive(&bytes, &base, &base_state).expect("accepted");
    // The 30 keys added, and the base's last (its TTL base is the base's
    // cluster time: sent again, found held, not counted).
    assert_eq!(received.len(), 31);
    assert!(received.contains_key(&(0, (Principal::anonymous(), key(39)))));
    let mut extended = base_state.clone();
    extended.extend(received);
    assert_eq!(extended, leader.store());
    // The whole snapshot is smaller than nothing: the plan counts the
    // added records' bytes only.
    assert!(plan.bytes() > 0);
    assert!(Extension::plan(&this, &base, plan.bytes() - 1).is_none());
    // A base whose group sums to something else (another record set of
    // the same count and bytes): refused by the sum alone.
    let mut other = base.clone();
    other.keys[0].hash[0] ^= 1;
    assert!(matches!(
        receive(&bytes, &other, &base_state),
        Err(SnapshotError::NotAnExtension)
    ));
    // A receiver whose store does not hold the base's record sent again
    // counts it as added: one too many for its group.
    let mut short = base_state.clone();
    short.retain(|(_, id), _| id.1 != key(39));
    assert!(matches!(
        receive(&bytes, &base, &short),
        Err(SnapshotError::NotAnExtension)
    ));
}

/// A key forgotten since the base, another added into its group: the
/// counts and bytes still grow as the plan checks, but the records do not
/// add up to the base's plus the new ones — the receiver refuses, nothing
/// says the bytes are bad. A key forgotten alone shrinks its group: the
/// sender plans no extension at all.
#[test]
fn a_base_the_snapshot_does_not_extend_is_refused() {
    let mut leader = Replica::new();
    for k in 0..20 {
        leader.put(1_000 + u64::from(k), k);
    }
    let base_state = leader.store();
    let base = leader.registry.records_base();
    let now = base.cluster_time_ms + 5;
    leader.forget(now, 3);
    let shrunk = leader.registry.records_base();
    assert!(Extension::plan(&shrunk, &base, u64::MAX).is_none());
    leader.put(now + 1, 50);
    let this = leader.registry.records_base();
    let plan = Extension::plan(&this, &base, u64::MAX).expect("the counts grew back");
    let bytes = extension_bytes(&leader, &plan);
    assert!(matches!(
        receive(&bytes, &base, &base_state),
        Err(SnapshotError::NotAnExtension)
    ));
    // The same stream read against a base that is the leader's own state
    // before the forget, but told it holds key 3 no longer: still refused
    // (the groups' sums are the judge, not the store's word).
    let mut without = base_state.clone();
    without.retain(|(_, id), _| id.1 != key(3));
    assert!(receive(&bytes, &base, &without).is_err());
}

/// Finished claims grow their groups as keys do: completed after the base,
/// they are sent and accepted; a claim of the base's taken again (out of
/// its group, into memory) leaves its group short: refused.
#[test]
fn finished_claims_extend_as_keys_do() {
    use oncekv_core::fingerprint::claim_fingerprint;
    use oncekv_core::{Claim, ClaimAnswer, Nonce};
    let mut leader = Replica::new();
    let cycle = |leader: &mut Replica, now: u64, k: u32, claim_id: u128| {
        let won = leader.apply(
            now,
            Op::Claim(Claim {
                cluster_id: CLUSTER,
                principal: Principal::anonymous(),
                key: key(k),
                fingerprint: claim_fingerprint(&[1]),
                lease_ms: 10_000,
                claim_id: Nonce(claim_id),
            }),
        );
        let Outcome::Claimed(ClaimAnswer::Won { fence, .. }) = won else {
            panic!("{won:?}");
        };
        fence
    };
    for k in 0..10 {
        let fence = cycle(&mut leader, 1_000 + u64::from(k), k, u128::from(k) + 1);
        leader.apply(
            1_000 + u64::from(k),
            Op::CompleteClaim {
                cluster_id: CLUSTER,
                principal: Principal::anonymous(),
                key: key(k),
                fence,
                result: vec![7; 16],
            },
        );
    }
    // One released, to be claimed again after the base.
    let fence = cycle(&mut leader, 1_050, 10, 11);
    leader.apply(
        1_050,
        Op::ReleaseClaim {
            cluster_id: CLUSTER,
            principal: Principal::anonymous(),
            key: key(10),
            fence,
        },
    );
    let base_state = leader.store();
    let base = leader.registry.records_base();
    assert!(base.claims.is_some());
    let now = base.cluster_time_ms + 1;
    for k in 20..25 {
        let fence = cycle(&mut leader, now, k, u128::from(k) + 1);
        leader.apply(
            now,
            Op::CompleteClaim {
                cluster_id: CLUSTER,
                principal: Principal::anonymous(),
                key: key(k),
                fence,
                result: vec![8; 16],
            },
        );
    }
    let this = leader.registry.records_base();
    let plan = Extension::plan(&this, &base, u64::MAX).expect("claims only added");
    let received = receive(&extension_bytes(&leader, &plan), &base, &base_state).unwrap();
    // The five completed, and the release at the base's cluster time.
    assert_eq!(received.len(), 6);
    let mut extended = base_state.clone();
    extended.extend(received);
    assert_eq!(extended, leader.store());
    // Claimed again: out of its group, which still grew by the five (the
    // plan cannot tell); the receiver's sums can.
    cycle(&mut leader, now + 1, 10, 99);
    let this = leader.registry.records_base();
    let plan = Extension::plan(&this, &base, u64::MAX).expect("the group grew overall");
    assert!(matches!(
        receive(&extension_bytes(&leader, &plan), &base, &base_state),
        Err(SnapshotError::NotAnExtension)
    ));
}
