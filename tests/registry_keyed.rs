//! Idempotency keys in the registry core (docs/rules.md, rules 18 and 19): one
//! or more tests per property, each written so that breaking it fails the
//! test, and a property test against a plain reference model.

mod support;

use oncekv_core::snapshot;
use oncekv_core::{
    Command, CommandResult, ConfigPatch, Entry, GroupedRecord, IdempotencyKey, InvalidArgument,
    KEY_GROUP_WIDTH_MAX_MS, KEY_RECORD_BOOKKEEPING_BYTES, KeyId, KeyedConfig, KeyedConfigPatch,
    Limit, LimitExceeded, Op, Outcome, Prefetched, Principal, Registry, RegistryConfig, Rejection,
    RulesVersion, Value, key_record_size_bytes,
};
use proptest::prelude::*;
use support::registry::{CLUSTER, Driver, append, incr, put};

fn keyed(principal: &str, key: &str, command: Command) -> Op {
    Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(key.as_bytes().to_vec()),
        command,
        principal: Principal(principal.to_string()),
    }
}

fn anonymous(key: &str, command: Command) -> Op {
    keyed("", key, command)
}

fn patch_keyed(patch: KeyedConfigPatch) -> Op {
    Op::PatchConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: patch,
    }
}

fn forget(principal: &str, key: &str) -> Op {
    Op::ForgetKey {
        cluster_id: CLUSTER,
        principal: Principal(principal.to_string()),
        key: IdempotencyKey(key.as_bytes().to_vec()),
    }
}

fn executed(result: CommandResult, duplicate: bool) -> Outcome {
    Outcome::Executed { result, duplicate }
}

fn incremented(value: i64, duplicate: bool) -> Outcome {
    executed(CommandResult::Incremented { value }, duplicate)
}

fn ttl(ms: u64) -> KeyedConfigPatch {
    KeyedConfigPatch {
        idempotency_key_ttl_ms: Some(ms),
        ..KeyedConfigPatch::default()
    }
}

/// Rule 18: the first request with a key executes; a repeat with the same
/// command gets the original result, marked duplicate, and changes nothing
/// — even after the data changed.
#[test]
fn rule18_same_key_same_command_executes_once() {
    let mut driver = Driver::new();
    assert_eq!(
        driver.apply(anonymous("pay-1", incr("n", 5))),
        incremented(5, false)
    );
    driver.advance(10);
    assert_eq!(
        driver.apply(anonymous("pay-1", incr("n", 5))),
        incremented(5, true)
    );
    driver.apply(anonymous("pay-2", incr("n", 1)));
    assert_eq!(
        driver.apply(anonymous("pay-1", incr("n", 5))),
        incremented(5, true),
        "the original answer, though the data changed since"
    );
    assert_eq!(driver.int("n"), Some(6));
    assert_eq!(driver.registry.key_count(), 2);
}

/// Rule 18: two copies of one key in one batch: the first executes, the
/// second is answered from its record (decided at apply, no in-progress
/// state).
#[test]
fn rule18_two_copies_in_one_batch_apply_once() {
    let mut driver = Driver::new();
    let outcomes = driver.apply_batch(vec![
        anonymous("k", incr("n", 1)),
        anonymous("k", incr("n", 1)),
    ]);
    assert_eq!(outcomes, vec![incremented(1, false), incremented(1, true)]);
    assert_eq!(driver.int("n"), Some(1));
}

/// Rule 18: the same key with another command is KEY_CONFLICT: nothing
/// executes, and the record still answers the original command.
#[test]
fn rule18_other_command_is_a_key_conflict() {
    let mut driver = Driver::new();
    driver.apply(anonymous("k", incr("n", 1)));
    assert_eq!(
        driver.apply(anonymous("k", incr("n", 2))),
        Outcome::Rejected(Rejection::KeyConflict)
    );
    assert_eq!(
        driver.apply(anonymous("k", append("l", "x"))),
        Outcome::Rejected(Rejection::KeyConflict)
    );
    assert_eq!(driver.int("n"), Some(1));
    assert_eq!(driver.registry.get(b"l"), None);
    assert_eq!(
        driver.apply(anonymous("k", incr("n", 1))),
        incremented(1, true)
    );
}

/// Rules 18 and 19: keys are scoped by principal: alice's key k and bob's
/// key k are two records, each executing once; the anonymous principal's
/// k is a third.
#[test]
fn rule19_keys_are_scoped_by_principal() {
    let mut driver = Driver::new();
    assert_eq!(
        driver.apply(keyed("alice", "k", incr("n", 1))),
        incremented(1, false)
    );
    assert_eq!(
        driver.apply(keyed("bob", "k", incr("n", 1))),
        incremented(2, false)
    );
    assert_eq!(
        driver.apply(keyed("bob", "k", incr("n", 1))),
        incremented(2, true)
    );
    assert_eq!(
        driver.apply(keyed("bob", "other", incr("n", 7))),
        incremented(9, false)
    );
    assert_eq!(
        driver.apply(keyed("alice", "k", incr("n", 1))),
        incremented(1, true)
    );
    // Bob's k with another command conflicts with bob's record only.
    assert_eq!(
        driver.apply(keyed("bob", "k", incr("n", 100))),
        Outcome::Rejected(Rejection::KeyConflict)
    );
    assert_eq!(
        driver.apply(anonymous("k", incr("n", 100))),
        incremented(109, false)
    );
    assert_eq!(driver.registry.key_count(), 4);
    let alice = driver
        .registry
        .key(&Principal("alice".into()), &IdempotencyKey(b"k".to_vec()))
        .expect("alice's k");
    assert_eq!(alice.response, Ok(CommandResult::Incremented { value: 1 }));
}

/// Rule 18: keys expire a TTL after their first execution, in cluster
/// time (a duplicate does not refresh them), oldest first, at the same log
/// index on two replicas applying the same entries; then the key executes
/// anew.
#[test]
fn rule18_keys_expire_at_the_same_index_on_replicas() {
    let mut first = Driver::new();
    first.apply(patch_keyed(ttl(1_000)));
    let mut second = Driver {
        registry: first.registry.clone(),
        index: first.index,
        now_ms: first.now_ms,
    };
    let mut gone_at = [None, None];
    let mut entries = Vec::new();
    let mut stamp = first.now_ms;
    for step in 0..40u64 {
        stamp += 100;
        // k0, k1, k2, then k0 repeated: duplicates, which do not refresh it.
        let key = if step < 3 {
            format!("k{step}")
        } else {
            "k0".into()
        };
        entries.push(Entry::single(stamp, anonymous(&key, incr("n", 1))));
    }
    for (replica, driver) in [&mut first, &mut second].into_iter().enumerate() {
        let base = driver.index;
        for (offset, entry) in entries.iter().enumerate() {
            let index = base + offset as u64 + 1;
            driver.registry.apply(index, entry);
            let k1 = driver
                .registry
                .key(&Principal::anonymous(), &IdempotencyKey(b"k1".to_vec()));
            if k1.is_none() && gone_at[replica].is_none() {
                gone_at[replica] = Some(index);
            }
        }
    }
    assert_eq!(gone_at[0], gone_at[1]);
    assert!(gone_at[0].is_some());
    assert_eq!(
        snapshot::state_hash(&first.registry),
        snapshot::state_hash(&second.registry)
    );
    // k0, first executed at step 0 and repeated every 100 ms, expired
    // 1.1 s after each execution regardless (at steps 11, 22 and 33) and
    // executed anew there: three executions more than the three keys.
    assert_eq!(first.int("n"), Some(3 + 3));
    let k0 = first
        .registry
        .key(&Principal::anonymous(), &IdempotencyKey(b"k0".to_vec()))
        .expect("k0 executed anew");
    assert!(k0.age_ms <= 1_000);
}

/// Rule 18: oldest first, by creation time: of two keys, the older one
/// goes first; a key exactly TTL old is still live.
#[test]
fn rule18_expiry_is_oldest_first_and_inclusive() {
    let mut driver = Driver::new();
    driver.apply(patch_keyed(ttl(1_000)));
    driver.apply(anonymous("b-older", incr("n", 1)));
    driver.advance(400);
    driver.apply(anonymous("a-newer", incr("n", 1)));
    driver.advance(600);
    driver.apply(anonymous("a-newer", incr("n", 1)));
    assert_eq!(driver.registry.key_count(), 2, "exactly TTL old: live");
    driver.advance(1);
    driver.apply(anonymous("a-newer", incr("n", 1)));
    let principal = Principal::anonymous();
    assert!(
        driver
            .registry
            .key(&principal, &IdempotencyKey(b"b-older".to_vec()))
            .is_none()
    );
    assert!(
        driver
            .registry
            .key(&principal, &IdempotencyKey(b"a-newer".to_vec()))
            .is_some()
    );
    assert_eq!(driver.int("n"), Some(2));
}

/// Rule 18 with creation-time groups: a key lives at least its TTL and
/// less than its TTL plus its group's width (a 1,024th of the TTL): it goes
/// with its whole group, at the first entry stamped past the group's end -
/// 1 + TTL, as `expires_after_ms` says.
#[test]
fn rule18_a_key_lives_its_ttl_and_less_than_one_group_more() {
    let mut driver = Driver::new();
    let ttl_ms = 1_024_000;
    assert_eq!(oncekv_core::key_group_width_ms(ttl_ms), 1_000);
    driver.apply(patch_keyed(ttl(ttl_ms)));
    driver.now_ms = 1_500;
    driver.apply(anonymous("k", incr("n", 1)));
    let id = (Principal::anonymous(), IdempotencyKey(b"k".to_vec()));
    let view = driver.registry.key(&id.0, &id.1).expect("live");
    assert_eq!(view.created_ms, 1_500);
    // Its group is [1000, 2000): its newest record could be made at 1999.
    assert_eq!(view.expires_after_ms, 1_999 + ttl_ms);
    for now_ms in [1_500 + ttl_ms, 1_999 + ttl_ms] {
        driver.now_ms = now_ms;
        assert_eq!(
            driver.apply(anonymous("k", incr("n", 1))),
            incremented(1, true),
            "at {now_ms}"
        );
    }
    driver.now_ms = 2_000 + ttl_ms;
    assert_eq!(
        driver.apply(anonymous("k", incr("n", 1))),
        incremented(2, false)
    );
}

/// Rule 18: a shorter TTL takes effect at the config entry itself, on
/// every replica: keys whose whole creation-time group is older than it
/// are gone at that index (under the default 24 h TTL groups are a minute
/// wide: a key made in the last minute may live up to a minute more).
#[test]
fn rule18_shorter_ttl_expires_keys_at_its_entry() {
    let mut driver = Driver::new();
    driver.apply(anonymous("k", incr("n", 1)));
    driver.advance(KEY_GROUP_WIDTH_MAX_MS + 1_000);
    assert_eq!(driver.registry.key_count(), 1);
    let outcome = driver.apply(patch_keyed(ttl(1_000)));
    let Outcome::ConfigsSet { keyed, config } = outcome else {
        panic!("config not set: {outcome:?}")
    };
    assert_eq!(keyed.idempotency_key_ttl_ms, 1_000);
    assert_eq!(config, RegistryConfig::default());
    assert_eq!(driver.registry.key_count(), 0);
    assert_eq!(
        driver.apply(anonymous("k", incr("n", 1))),
        incremented(2, false)
    );
}

/// Rule 12 for keys: at `idempotency_keys_max` a new key is refused
/// (RESOURCE_EXHAUSTED, this attempt) before its effect, and no live key
/// is evicted: each still answers as a duplicate. Once one expires, the
/// refused key executes.
#[test]
fn rule18_key_count_limit_refuses_never_evicts() {
    let mut driver = Driver::new();
    driver.apply(patch_keyed(KeyedConfigPatch {
        idempotency_keys_max: Some(2),
        idempotency_key_ttl_ms: Some(10_000),
        ..KeyedConfigPatch::default()
    }));
    driver.apply(anonymous("a", incr("n", 1)));
    driver.advance(1_000);
    driver.apply(anonymous("b", incr("n", 1)));
    assert_eq!(
        driver.apply(anonymous("c", incr("n", 1))),
        Outcome::Rejected(Rejection::ResourceExhausted(Limit::IdempotencyKeys))
    );
    assert_eq!(driver.int("n"), Some(2), "nothing executed");
    assert_eq!(
        driver.apply(anonymous("a", incr("n", 1))),
        incremented(1, true)
    );
    assert_eq!(
        driver.apply(anonymous("b", incr("n", 1))),
        incremented(2, true)
    );
    driver.advance(9_500);
    assert_eq!(
        driver.apply(anonymous("c", incr("n", 1))),
        incremented(3, false),
        "a expired, so there is room"
    );
    assert_eq!(
        driver.apply(anonymous("b", incr("n", 1))),
        incremented(2, true)
    );
}

/// Rule 12 for keys: the records' bytes are limited too, counting the
/// record about to be made; the refusal is for this attempt, nothing is
/// evicted, and the charged size is documented arithmetic.
#[test]
fn rule18_cached_bytes_limit_refuses_never_evicts() {
    let config = RegistryConfig {
        value_bytes_max: 64,
        cached_bytes_per_session_max: 1_024,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let largest = KeyedConfig::default().largest_record_bytes(&config);
    let key = |n: u32| format!("key-{n:02}");
    // Room for the largest record plus two small ones.
    let small = key_record_size_bytes(
        &Principal::anonymous(),
        &IdempotencyKey(key(1).into_bytes()),
        32,
    );
    assert_eq!(small, KEY_RECORD_BOOKKEEPING_BYTES + 6 + 32);
    driver.apply(patch_keyed(KeyedConfigPatch {
        idempotency_cached_bytes_max: Some(largest + 1),
        ..KeyedConfigPatch::default()
    }));
    let mut n = 0;
    let mut charged = 0;
    while charged + small <= largest + 1 {
        n += 1;
        assert_eq!(
            driver.apply(anonymous(&key(n), incr("n", 1))),
            incremented(i64::from(n), false)
        );
        charged += small;
    }
    assert_eq!(driver.registry.keyed_cached_bytes(), charged);
    assert_eq!(
        driver.apply(anonymous(&key(n + 1), incr("n", 1))),
        Outcome::Rejected(Rejection::ResourceExhausted(Limit::IdempotencyCachedBytes))
    );
    assert_eq!(driver.registry.key_count(), n as usize);
    assert_eq!(
        driver.apply(anonymous(&key(1), incr("n", 1))),
        incremented(1, true)
    );
}

/// The key itself: empty → INVALID_ARGUMENT, longer than
/// `idempotency_key_bytes_max` → LIMIT_EXCEEDED; both final for the
/// request as sent and not cached (no record, no effect), so under a larger
/// limit the same key executes.
#[test]
fn rule18_bad_keys_are_refused_and_not_cached() {
    let mut driver = Driver::new();
    assert_eq!(
        driver.apply(anonymous("", incr("n", 1))),
        Outcome::Rejected(Rejection::InvalidArgument(
            InvalidArgument::EmptyIdempotencyKey
        ))
    );
    let long = "x".repeat(257);
    let refused = Outcome::Rejected(Rejection::LimitExceeded {
        exceeded: LimitExceeded {
            limit: Limit::IdempotencyKeyBytes,
            max: 256,
            requested: 257,
        },
        duplicate: false,
    });
    assert_eq!(driver.apply(anonymous(&long, incr("n", 1))), refused);
    assert_eq!(driver.apply(anonymous(&long, incr("n", 1))), refused);
    assert_eq!(driver.registry.key_count(), 0);
    assert_eq!(driver.int("n"), None);
    driver.apply(patch_keyed(KeyedConfigPatch {
        idempotency_key_bytes_max: Some(300),
        ..KeyedConfigPatch::default()
    }));
    assert_eq!(
        driver.apply(anonymous(&long, incr("n", 1))),
        incremented(1, false)
    );
    // An empty data key is malformed too, and not cached.
    assert_eq!(
        driver.apply(anonymous("e", incr("", 1))),
        Outcome::Rejected(Rejection::InvalidArgument(InvalidArgument::EmptyKey))
    );
    assert_eq!(driver.registry.key_count(), 1);
}

/// A command that breaks a request limit by itself is refused with
/// LIMIT_EXCEEDED, and the refusal is the key's cached response: a retry
/// gets it again (marked duplicate), even after the limit was raised, and
/// another command is KEY_CONFLICT.
#[test]
fn rule18_request_limits_are_cached_as_the_keys_response() {
    let mut driver = Driver::new();
    let big = Value::Bytes(vec![0; 65 << 10]);
    let exceeded = LimitExceeded {
        limit: Limit::ValueBytes,
        max: 64 << 10,
        requested: 65 << 10,
    };
    assert_eq!(
        driver.apply(anonymous("k", put("v", big.clone()))),
        Outcome::Rejected(Rejection::LimitExceeded {
            exceeded,
            duplicate: false
        })
    );
    driver.apply(Op::PatchConfig {
        cluster_id: CLUSTER,
        patch: ConfigPatch {
            value_bytes_max: Some(128 << 10),
            cached_bytes_per_session_max: Some(1 << 20),
            ..ConfigPatch::default()
        },
    });
    assert_eq!(
        driver.apply(anonymous("k", put("v", big))),
        Outcome::Rejected(Rejection::LimitExceeded {
            exceeded,
            duplicate: true
        })
    );
    assert_eq!(driver.registry.get(b"v"), None);
    assert_eq!(
        driver.apply(anonymous("k", incr("n", 1))),
        Outcome::Rejected(Rejection::KeyConflict)
    );
}

/// A capacity limit of the data (`keys_max`) refuses a keyed request for
/// this attempt, without recording the key.
#[test]
fn rule18_data_capacity_refusal_is_not_cached() {
    let mut driver = Driver::with_config(RegistryConfig {
        keys_max: 1,
        ..RegistryConfig::default()
    });
    driver.apply(anonymous("k1", incr("a", 1)));
    assert_eq!(
        driver.apply(anonymous("k2", incr("b", 1))),
        Outcome::Rejected(Rejection::ResourceExhausted(Limit::Keys))
    );
    assert_eq!(driver.registry.key_count(), 1);
    driver.apply(anonymous("k3", Command::Delete { key: b"a".to_vec() }));
    assert_eq!(
        driver.apply(anonymous("k2", incr("b", 1))),
        incremented(1, false)
    );
}

/// An operator's ForgetKey goes through the log: the key's record goes,
/// and the key executes anew; forgetting an absent key says so.
#[test]
fn rule18_forget_key_removes_the_record() {
    let mut driver = Driver::new();
    driver.apply(keyed("alice", "k", incr("n", 1)));
    assert_eq!(
        driver.apply(forget("bob", "k")),
        Outcome::KeyForgotten { existed: false }
    );
    assert_eq!(
        driver.apply(forget("alice", "k")),
        Outcome::KeyForgotten { existed: true }
    );
    assert_eq!(driver.registry.key_count(), 0);
    assert_eq!(driver.registry.keyed_cached_bytes(), 0);
    assert_eq!(
        driver.apply(keyed("alice", "k", incr("n", 1))),
        incremented(2, false)
    );
}

/// Keyed configs are validated as a whole, with the registry config: an
/// empty patch, a value outside the bounds or a cached-bytes limit below
/// the largest record is refused and changes nothing; so is a registry
/// config change (even by the older PatchConfig entry) that the keyed
/// config could then not hold.
#[test]
fn rule18_keyed_config_is_validated_with_the_registry_config() {
    let mut driver = Driver::new();
    let invalid =
        |outcome: Outcome| matches!(outcome, Outcome::Rejected(Rejection::InvalidArgument(_)));
    assert_eq!(
        driver.apply(patch_keyed(KeyedConfigPatch::default())),
        Outcome::Rejected(Rejection::InvalidArgument(
            InvalidArgument::EmptyConfigPatch
        ))
    );
    assert!(invalid(driver.apply(patch_keyed(ttl(99)))));
    assert!(invalid(driver.apply(patch_keyed(KeyedConfigPatch {
        idempotency_key_bytes_max: Some(0),
        ..KeyedConfigPatch::default()
    }))));
    let largest = KeyedConfig::default().largest_record_bytes(&RegistryConfig::default());
    assert!(invalid(driver.apply(patch_keyed(KeyedConfigPatch {
        idempotency_cached_bytes_max: Some(largest - 1),
        ..KeyedConfigPatch::default()
    }))));
    assert_eq!(*driver.registry.keyed_config(), KeyedConfig::default());
    assert!(matches!(
        driver.apply(patch_keyed(KeyedConfigPatch {
            idempotency_cached_bytes_max: Some(largest),
            ..KeyedConfigPatch::default()
        })),
        Outcome::ConfigsSet { .. }
    ));
    let bigger_values = ConfigPatch {
        value_bytes_max: Some(128 << 10),
        cached_bytes_per_session_max: Some(1 << 20),
        ..ConfigPatch::default()
    };
    assert!(invalid(driver.apply(Op::PatchConfig {
        cluster_id: CLUSTER,
        patch: bigger_values,
    })));
    assert_eq!(driver.registry.config(), &RegistryConfig::default());
    // Both together, in one entry, are fine.
    let outcome = driver.apply(Op::PatchConfigs {
        cluster_id: CLUSTER,
        patch: bigger_values,
        keyed: KeyedConfigPatch {
            idempotency_cached_bytes_max: Some(1 << 20),
            ..KeyedConfigPatch::default()
        },
    });
    assert!(matches!(outcome, Outcome::ConfigsSet { .. }), "{outcome:?}");
    assert_eq!(driver.registry.config().value_bytes_max, 128 << 10);
}

/// Rules 13 and 15: key records and the keyed config are in the snapshot
/// (which reads back identical) and in the state hash.
#[test]
fn rule18_keys_are_in_snapshots_and_the_state_hash() {
    let mut driver = Driver::new();
    driver.apply(patch_keyed(ttl(60_000)));
    driver.apply(keyed("alice", "k", incr("n", 1)));
    driver.apply(keyed("bob", "k", append("l", "x")));
    driver.apply(anonymous("big", put("v", Value::Bytes(vec![0; 65 << 10]))));
    let bytes = snapshot::to_bytes(&driver.registry);
    let restored = snapshot::from_bytes(&bytes).expect("reads back");
    assert_eq!(restored, driver.registry);
    assert_eq!(snapshot::to_bytes(&restored), bytes);
    assert_eq!(restored.key_count(), 3);
    assert_eq!(
        restored.keyed_cached_bytes(),
        driver.registry.keyed_cached_bytes()
    );

    let before = snapshot::state_hash(&driver.registry);
    let mut forgotten = driver.registry.clone();
    forgotten.apply(
        driver.index + 1,
        &Entry::single(driver.now_ms, forget("bob", "k")),
    );
    let mut noop = driver.registry.clone();
    noop.apply(
        driver.index + 1,
        &Entry::single(driver.now_ms, forget("carol", "k")),
    );
    assert_ne!(
        snapshot::state_hash(&forgotten),
        snapshot::state_hash(&noop)
    );
    assert_ne!(before, snapshot::state_hash(&noop), "the index moved");
    let mut ttl_changed = driver.registry.clone();
    ttl_changed.apply(
        driver.index + 1,
        &Entry::single(driver.now_ms, patch_keyed(ttl(50_000))),
    );
    assert_ne!(
        snapshot::state_hash(&ttl_changed),
        snapshot::state_hash(&noop)
    );
}

/// A snapshot whose key records are out of order or empty is refused.
#[test]
fn rule18_inconsistent_key_records_are_refused() {
    let mut driver = Driver::new();
    driver.apply(anonymous("a", incr("n", 1)));
    driver.apply(anonymous("b", incr("n", 1)));
    let bytes = snapshot::to_bytes(&driver.registry);
    // Swap the two key records' keys ("a" and "b", each after an empty
    // principal and a length of 1): the records then come out of order,
    // and the checksum is recomputed so only the order check can catch it.
    let body = &bytes[..bytes.len() - 32];
    let find = |key: u8| {
        body.windows(3)
            .rposition(|window| window == [0, 1, key])
            .unwrap()
            + 2
    };
    let (a, b) = (find(b'a'), find(b'b'));
    assert!(a < b);
    let mut swapped = body.to_vec();
    swapped.swap(a, b);
    swapped.extend_from_slice(blake3::hash(&swapped).as_bytes());
    assert!(matches!(
        snapshot::from_bytes(&swapped),
        Err(snapshot::SnapshotError::Inconsistent(_))
    ));
}

// ---- property test ---------------------------------------------------------

const PRINCIPALS: [&str; 2] = ["", "alice"];
const KEYS: [&str; 3] = ["k1", "k2", "k3"];

#[derive(Clone, Debug)]
enum Step {
    Keyed {
        principal: usize,
        key: usize,
        command: u8,
    },
    Forget {
        principal: usize,
        key: usize,
    },
    Ttl {
        ttl_ms: u64,
    },
    Clock {
        delta_ms: i64,
    },
    SnapshotRestore,
    /// The flushing replica writes its changes into its store; with
    /// `compact`, the store also drops the records of expired groups (what
    /// the store's compaction filter may do at any time).
    Flush {
        compact: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => (0..PRINCIPALS.len(), 0..KEYS.len(), 0u8..3)
            .prop_map(|(principal, key, command)| Step::Keyed { principal, key, command }),
        1 => (0..PRINCIPALS.len(), 0..KEYS.len())
            .prop_map(|(principal, key)| Step::Forget { principal, key }),
        1 => prop_oneof![Just(200u64), Just(1_000), Just(5_000), Just(20_000), Just(2_000_000)]
            .prop_map(|ttl_ms| Step::Ttl { ttl_ms }),
        4 => (-1_000i64..2_000).prop_map(|delta_ms| Step::Clock { delta_ms }),
        1 => Just(Step::SnapshotRestore),
        2 => any::<bool>().prop_map(|compact| Step::Flush { compact }),
    ]
}

fn model_command(kind: u8) -> Command {
    match kind {
        0 => incr("n", 1),
        1 => incr("n", 2),
        _ => append("l", "x"),
    }
}

/// A literal reading of rule 18 with a vector and linear scans: a record
/// lives until its creation-time group's newest possible record is older
/// than the TTL (groups opened as the module doc of the core's `keyed`
/// says: `key_group_width_ms(ttl)` wide, aligned, never overlapping).
#[derive(Default)]
struct Model {
    now_ms: u64,
    ttl_ms: u64,
    keys_max: usize,
    /// (principal, key, end of its group, command, result).
    records: Vec<(usize, usize, u64, Command, CommandResult)>,
    /// The newest group opened: (start, end).
    group: Option<(u64, u64)>,
    /// Rules version 4: a TTL change ends the group open at it (its end
    /// becomes now + 1), so the next record opens one of the new width.
    ttl_change_ends_open_group: bool,
    n: i64,
    l: u64,
}

impl Model {
    fn advance(&mut self, stamp_ms: u64) {
        self.now_ms = self.now_ms.max(stamp_ms);
        self.expire();
    }

    fn set_ttl(&mut self, ttl_ms: u64) {
        if self.ttl_change_ends_open_group
            && ttl_ms != self.ttl_ms
            && let Some((start, end)) = self.group
            && end > self.now_ms + 1
        {
            let ended = self.now_ms + 1;
            self.group = Some((start, ended));
            for record in &mut self.records {
                if record.2 == end {
                    record.2 = ended;
                }
            }
        }
        self.ttl_ms = ttl_ms;
        self.expire();
    }

    fn expire(&mut self) {
        let (now, ttl) = (self.now_ms, self.ttl_ms);
        self.records
            .retain(|(_, _, group_end, ..)| group_end - 1 + ttl >= now);
    }

    /// The end of the group a record made now belongs in.
    fn group_end(&mut self) -> u64 {
        let now = self.now_ms;
        match self.group {
            Some((_, end)) if now < end => end,
            _ => {
                let width = oncekv_core::key_group_width_ms(self.ttl_ms);
                let floor = self.group.map_or(0, |(_, end)| end);
                let start = (now - now % width).max(floor);
                self.group = Some((start, start + width));
                start + width
            }
        }
    }

    fn keyed(&mut self, principal: usize, key: usize, command: Command) -> Outcome {
        if let Some((.., cached_command, result)) = self
            .records
            .iter()
            .find(|(p, k, ..)| (*p, *k) == (principal, key))
        {
            return if *cached_command == command {
                executed(result.clone(), true)
            } else {
                Outcome::Rejected(Rejection::KeyConflict)
            };
        }
        if self.records.len() >= self.keys_max {
            return Outcome::Rejected(Rejection::ResourceExhausted(Limit::IdempotencyKeys));
        }
        let result = match &command {
            Command::Increment { delta, .. } => {
                self.n += delta;
                CommandResult::Incremented { value: self.n }
            }
            _ => {
                self.l += 1;
                CommandResult::Appended { length: self.l }
            }
        };
        let group_end = self.group_end();
        self.records
            .push((principal, key, group_end, command, result.clone()));
        executed(result, false)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random keyed requests, repeats, conflicts, forgets, TTL changes,
    /// clock jumps and snapshot restores: every outcome equals the model's,
    /// a second replica applying the same entries stays identical, and the
    /// data shows each (principal, key) applied once per life.
    #[test]
    fn keyed_registry_matches_the_model(
        steps in prop::collection::vec(step(), 1..150),
        latest in any::<bool>(),
    ) {
        let keys_max = 4;
        // An old log (rules version 1), or a cluster this build starts:
        // from version 4 a TTL change ends the open group.
        let mut driver = if latest {
            Driver::with_rules(RulesVersion::LATEST)
        } else {
            Driver::new()
        };
        driver.apply(patch_keyed(KeyedConfigPatch {
            idempotency_key_ttl_ms: Some(1_000),
            idempotency_keys_max: Some(keys_max),
            ..KeyedConfigPatch::default()
        }));
        // The model has no per-principal quota (rule 21): let each
        // principal hold all of the key limit, as the model does.
        driver.apply(Op::PatchAllConfigs {
            cluster_id: support::registry::CLUSTER,
            patch: ConfigPatch::default(),
            keyed: KeyedConfigPatch::default(),
            claims: oncekv_core::ClaimConfigPatch::default(),
            budget: oncekv_core::BudgetConfigPatch {
                principal_quota_percent: Some(100),
                ..oncekv_core::BudgetConfigPatch::default()
            },
        });
        let mut replica = driver.registry.clone();
        let mut flushing = FlushingReplica::new(driver.registry.clone());
        let mut model = Model {
            now_ms: driver.now_ms,
            ttl_ms: 1_000,
            keys_max: keys_max as usize,
            ttl_change_ends_open_group: latest,
            ..Model::default()
        };
        let keyed_config = *driver.registry.keyed_config();
        for step in &steps {
            let op = match step {
                Step::Keyed { principal, key, command } => {
                    keyed(PRINCIPALS[*principal], KEYS[*key], model_command(*command))
                }
                Step::Forget { principal, key } => forget(PRINCIPALS[*principal], KEYS[*key]),
                Step::Ttl { ttl_ms } => patch_keyed(ttl(*ttl_ms)),
                Step::Clock { delta_ms } => {
                    driver.now_ms = driver.now_ms.saturating_add_signed(*delta_ms);
                    continue;
                }
                Step::SnapshotRestore => {
                    let bytes = snapshot::to_bytes(&driver.registry);
                    driver.registry = snapshot::from_bytes(&bytes).expect("reads back");
                    prop_assert_eq!(&driver.registry, &replica);
                    continue;
                }
                Step::Flush { compact } => {
                    flushing.flush(*compact);
                    continue;
                }
            };
            model.advance(driver.now_ms);
            let expected = match step {
                Step::Keyed { principal, key, command } => {
                    model.keyed(*principal, *key, model_command(*command))
                }
                Step::Forget { principal, key } => {
                    let before = model.records.len();
                    model.records.retain(|(p, k, ..)| (*p, *k) != (*principal, *key));
                    Outcome::KeyForgotten { existed: model.records.len() < before }
                }
                Step::Ttl { ttl_ms } => {
                    model.set_ttl(*ttl_ms);
                    Outcome::ConfigsSet {
                        config: RegistryConfig::default(),
                        keyed: KeyedConfig {
                            idempotency_key_ttl_ms: *ttl_ms,
                            ..keyed_config
                        },
                    }
                }
                _ => unreachable!(),
            };
            let entry = Entry::single(driver.now_ms, op.clone());
            // The shortcut a leader may take (rule 3), read before the
            // entry applies, at the entry's stamp (the leader's clock): it
            // answers exactly what the log answers, and it sees every
            // duplicate — also where the stamp moves the clock past a
            // record's TTL, which the applied state has not seen yet.
            let shortcut = match &op {
                Op::ExecuteKeyed { cluster_id, key, command, principal } => driver
                    .registry
                    .keyed_duplicate_answer(*cluster_id, key, command, principal, driver.now_ms),
                _ => None,
            };
            let outcome = driver.apply(op);
            prop_assert_eq!(&outcome, &expected, "step {:?}", step);
            if matches!(outcome, Outcome::Executed { duplicate: true, .. }) {
                prop_assert_eq!(shortcut.as_ref(), Some(&outcome), "step {:?}", step);
            } else {
                prop_assert_eq!(shortcut.as_ref(), None, "the shortcut saw a duplicate the log did not: {:?}", step);
            }
            replica.apply(driver.index, &entry);
            prop_assert_eq!(&flushing.apply(driver.index, &entry), &outcome, "step {:?}", step);
            prop_assert_eq!(driver.registry.key_count(), model.records.len());
            prop_assert_eq!(flushing.registry.key_count(), model.records.len());
        }
        prop_assert_eq!(
            snapshot::state_hash(&driver.registry),
            snapshot::state_hash(&replica)
        );
        // The replica whose records went to its store at random points
        // decided the same, hashes the same and shows the same records.
        prop_assert_eq!(
            snapshot::state_hash(&driver.registry),
            snapshot::state_hash(&flushing.registry)
        );
        for principal in PRINCIPALS {
            for key in KEYS {
                let principal = Principal(principal.to_owned());
                let key = IdempotencyKey(key.as_bytes().to_vec());
                prop_assert_eq!(
                    driver.registry.key(&principal, &key),
                    flushing.key(&principal, &key)
                );
            }
        }
        prop_assert_eq!(driver.int("n").unwrap_or(0), model.n);
    }
}

/// A registry whose key records go to a store (here a map) at random
/// points, as the storage adapter's do at snapshots: it fetches what the
/// registry names before each entry and writes what it took.
struct FlushingReplica {
    registry: Registry,
    store: std::collections::BTreeMap<KeyId, GroupedRecord>,
}

impl FlushingReplica {
    fn new(registry: Registry) -> FlushingReplica {
        FlushingReplica {
            registry,
            store: std::collections::BTreeMap::new(),
        }
    }

    fn apply(&mut self, index: u64, entry: &Entry) -> Outcome {
        let mut fetched = Prefetched::none();
        for id in self.registry.keys_to_fetch(entry) {
            let stored = self.store.get(&id).cloned();
            fetched.insert(id, stored);
        }
        let outcomes = self.registry.apply_prefetched(index, entry, &fetched);
        if let Err(broken) = self.registry.check_invariants() {
            panic!("flushing replica after entry {index}: {broken}");
        }
        outcomes.into_iter().next().expect("one outcome")
    }

    fn flush(&mut self, compact: bool) {
        let changes = self.registry.take_key_changes();
        for (id, change) in changes.records {
            match change {
                Some(stored) => self.store.insert(id, stored),
                None => self.store.remove(&id),
            };
        }
        if compact {
            self.store
                .retain(|_, stored| stored.group_ms >= changes.first_live_group_ms);
        }
    }

    fn key(&self, principal: &Principal, key: &IdempotencyKey) -> Option<oncekv_core::KeyView> {
        let stored = self.store.get(&(principal.clone(), key.clone())).cloned();
        self.registry.key_over(principal, key, stored)
    }
}

/// Replaying the same keyed log on a fresh registry gives the same bytes
/// (no dependence on anything but the log).
#[test]
fn rule18_same_entries_same_bytes() {
    let run = || {
        let mut registry = Registry::new();
        let mut index = 0;
        let mut apply = |registry: &mut Registry, stamp, op| {
            index += 1;
            registry.apply(index, &Entry::single(stamp, op));
        };
        apply(
            &mut registry,
            0,
            Op::Bootstrap {
                cluster_id: CLUSTER,
                config: RegistryConfig::default(),
            },
        );
        for n in 0..50u64 {
            let key = format!("k{}", n % 13);
            apply(
                &mut registry,
                n * 10,
                keyed(["a", "b"][n as usize % 2], &key, incr("n", 1)),
            );
        }
        snapshot::to_bytes(&registry)
    };
    assert_eq!(run(), run());
}

/// Rule 18, once records lie outside: a key whose group expires while its
/// record still waits in the registry's changes (not yet taken into the
/// store) is gone like any other — read as absent, listed nowhere,
/// executed anew when it comes back — and the record of an older key the
/// store still holds is gone too. The registry keeps no index of those
/// changes by group: it reads them as dead where they lie.
#[test]
fn rule18_a_key_that_expires_before_reaching_the_store_is_gone() {
    let ttl_ms = 1_024_000;
    let mut driver = Driver::new();
    driver.apply(patch_keyed(ttl(ttl_ms)));
    let mut replica = FlushingReplica::new(driver.registry.clone());
    let mut index = driver.index;
    let mut apply = |replica: &mut FlushingReplica, now_ms: u64, op: Op| {
        index += 1;
        replica.apply(index, &Entry::single(now_ms, op))
    };
    let start_ms = driver.now_ms + 1_500;
    assert_eq!(
        apply(&mut replica, start_ms, anonymous("stored", incr("n", 1))),
        incremented(1, false)
    );
    replica.flush(false);
    assert_eq!(
        apply(&mut replica, start_ms, anonymous("waiting", incr("n", 1))),
        incremented(2, false)
    );
    assert_eq!(replica.registry.key_records_held(), 1, "only the change");
    let live = |replica: &FlushingReplica| {
        replica
            .registry
            .keys_after(&Principal::anonymous(), &IdempotencyKey(Vec::new()), 10)
            .0
            .len()
    };
    assert_eq!(live(&replica), 1);
    // Both keys' group (1 s wide under this TTL) is older than the TTL.
    let later_ms = start_ms + ttl_ms + 1_000;
    assert_eq!(
        apply(&mut replica, later_ms, anonymous("other", incr("m", 1))),
        incremented(1, false)
    );
    assert_eq!(replica.registry.key_count(), 1);
    for key in ["stored", "waiting"] {
        assert_eq!(
            replica.key(&Principal::anonymous(), &IdempotencyKey(key.into())),
            None,
            "{key}"
        );
    }
    assert_eq!(live(&replica), 1, "only the new key is listed");
    assert_eq!(
        apply(&mut replica, later_ms, anonymous("waiting", incr("n", 1))),
        incremented(3, false),
        "a key back after expiry executes anew"
    );
    assert_eq!(
        apply(&mut replica, later_ms, anonymous("stored", incr("n", 1))),
        incremented(4, false)
    );
    // What the registry hands the store next: the live records, whatever
    // dead ones it held.
    replica.flush(true);
    assert_eq!(replica.store.len(), 3);
    assert_eq!(replica.registry.key_count(), 3);
}

/// A store that hands back a record the registry never counted (a state
/// directory of another node or cluster, or one damaged past fjall's
/// checksums) must not panic the node: removing it takes the counts down
/// no further than zero, and the replica's state hash departs from an
/// honest one's — which is how `oncekv admin hash` shows it.
#[test]
fn a_record_the_store_should_not_hold_does_not_panic_the_registry() {
    let mut driver = Driver::new();
    driver.apply(anonymous("small", put("v", Value::Int(1))));
    let honest = driver.registry.clone();
    let mut registry = driver.registry.clone();
    registry.take_key_changes();
    let stranger: KeyId = (
        Principal(String::new()),
        IdempotencyKey(b"never-executed".to_vec()),
    );
    // The only live group, holding one small record; the stranger is
    // "of" that group and far larger.
    let mut foreign = honest
        .clone()
        .take_key_changes()
        .records
        .into_iter()
        .find_map(|(_, stored)| stored)
        .expect("the small key's stored record");
    foreign.record.response.result = Ok(oncekv_core::CommandResult::CompareAndSwap {
        swapped: false,
        current: Some(Value::Bytes(vec![7; 4096])),
    });
    let forget_stranger = Entry::single(driver.now_ms, forget("", "never-executed"));
    let mut fetched = Prefetched::none();
    for id in registry.keys_to_fetch(&forget_stranger) {
        assert_eq!(id, stranger);
        fetched.insert(id, Some(foreign.clone()));
    }
    let outcomes = registry.apply_prefetched(driver.index + 1, &forget_stranger, &fetched);
    assert_eq!(outcomes, vec![Outcome::KeyForgotten { existed: true }]);
    assert_eq!(registry.key_count(), 0);
    assert_eq!(registry.keyed_cached_bytes(), 0, "saturated, not wrapped");
    let mut replayed = honest;
    replayed.apply(driver.index + 1, &forget_stranger);
    assert_ne!(
        snapshot::state_hash(&registry),
        snapshot::state_hash(&replayed)
    );
}
