//! One or more tests per DESIGN.md rule that the registry core owns, each
//! named after its rule and written so that breaking the rule fails it.

mod support;

use oncekv::registry::snapshot;
use oncekv::registry::{
    ClientId, ClusterId, Command, CommandResult, Entry, InvalidArgument, Limit, Nonce, Op, Outcome,
    Registry, RegistryConfig, Rejection, Value, ValueKind,
};
use support::registry::{CLUSTER, Driver, append, incr, put};

fn executed(result: CommandResult) -> Outcome {
    Outcome::Executed {
        result,
        duplicate: false,
    }
}

fn duplicate(result: CommandResult) -> Outcome {
    Outcome::Executed {
        result,
        duplicate: true,
    }
}

fn rejected(rejection: Rejection) -> Outcome {
    Outcome::Rejected(rejection)
}

/// Rule 1: a client id is the log index of the entry that registered it,
/// so every replica derives the same id.
#[test]
fn rule01_client_id_is_the_register_entry_index() {
    let mut driver = Driver::new();
    driver.advance(1);
    let first = driver.register(1);
    assert_eq!(first, ClientId(driver.index));
    driver.execute(first, 1, 1, incr("a", 1));
    let second = driver.register(2);
    assert_eq!(second, ClientId(driver.index));
    assert_ne!(first, second);
}

/// Rule 2: a retried register with the same nonce returns the same id and
/// creates no second session; the reply carries the TTL and the window.
#[test]
fn rule02_register_is_idempotent_by_nonce() {
    let config = RegistryConfig {
        session_ttl_ms: 5_000,
        window: 16,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let register = Op::Register {
        cluster_id: Some(CLUSTER),
        nonce: Nonce(77),
    };
    let Outcome::Registered(first) = driver.apply(register.clone()) else {
        panic!("register failed")
    };
    assert!(!first.duplicate);
    assert_eq!((first.session_ttl_ms, first.window), (5_000, 16));
    assert_eq!(first.cluster_id, CLUSTER);
    let Outcome::Registered(again) = driver.apply(register) else {
        panic!("retried register failed")
    };
    assert_eq!(again.client_id, first.client_id);
    assert!(again.duplicate);
    assert_eq!(driver.registry.session_count(), 1);
}

/// Rule 2: the nonce lives and dies with its session: once the session has
/// expired, the same nonce registers a new session with a new id.
#[test]
fn rule02_nonce_dies_with_its_session() {
    let mut driver = Driver::new();
    let first = driver.register(5);
    driver.advance(RegistryConfig::default().session_ttl_ms + 1);
    let second = driver.register(5);
    assert_ne!(first, second);
    assert!(driver.registry.session(first).is_none());
    assert_eq!(driver.registry.session_count(), 1);
}

/// Rule 4: a snapshot holds the effect, the cached response and the applied
/// index of the same log index, so a restored node neither loses the effect
/// nor executes the request again.
#[test]
fn rule04_effect_record_and_applied_index_move_together() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    driver.execute(client, 1, 1, incr("n", 5));
    let index = driver.index;
    let restored = snapshot::from_bytes(&snapshot::to_bytes(&driver.registry)).unwrap();
    assert_eq!(restored.applied_index(), index);
    assert_eq!(restored.get(b"n"), Some(&Value::Int(5)));
    let cached = restored
        .cached_response(client, 1)
        .expect("response cached");
    assert_eq!(cached.result, CommandResult::Incremented { value: 5 });
    driver.registry = restored;
    assert_eq!(
        driver.execute(client, 1, 1, incr("n", 5)),
        duplicate(CommandResult::Incremented { value: 5 })
    );
    assert_eq!(driver.int("n"), Some(5));
}

/// Rule 4: re-applying an index that was already applied is a storage bug;
/// the core refuses it loudly instead of executing twice.
#[test]
#[should_panic(expected = "applied index would move")]
fn rule04_applied_index_never_moves_backwards() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    let entry = Entry::single(
        driver.now_ms,
        Op::Execute(oncekv::registry::Execute {
            cluster_id: CLUSTER,
            client_id: client,
            seq: 1,
            first_outstanding_seq: 1,
            command: incr("n", 1),
        }),
    );
    let index = driver.index;
    driver.registry.apply(index, &entry);
}

/// Rule 5: a repeat of (client id, seq) with the same command gets the
/// cached response, marked duplicate, and changes nothing.
#[test]
fn rule05_repeat_gets_the_original_answer_and_changes_nothing() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    let first = driver.execute(client, 1, 1, incr("n", 3));
    assert_eq!(first, executed(CommandResult::Incremented { value: 3 }));
    for _ in 0..3 {
        assert_eq!(
            driver.execute(client, 1, 1, incr("n", 3)),
            duplicate(CommandResult::Incremented { value: 3 })
        );
    }
    assert_eq!(driver.int("n"), Some(3));
}

/// Rule 5: a failed compare-and-swap replays as failed even after the data
/// changed so that the swap would now succeed.
#[test]
fn rule05_failed_cas_replays_as_failed_after_data_changed() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    driver.execute(client, 1, 1, put("k", Value::Int(1)));
    let cas = Command::CompareAndSwap {
        key: b"k".to_vec(),
        expected: Some(Value::Int(2)),
        new: Value::Int(3),
    };
    let failed = CommandResult::CompareAndSwap {
        swapped: false,
        current: Some(Value::Int(1)),
    };
    assert_eq!(
        driver.execute(client, 2, 1, cas.clone()),
        executed(failed.clone())
    );
    driver.execute(client, 3, 1, put("k", Value::Int(2)));
    assert_eq!(driver.execute(client, 2, 1, cas), duplicate(failed));
    assert_eq!(driver.registry.get(b"k"), Some(&Value::Int(2)));
}

/// Rule 5 (application results): overflow and wrong-type results are cached
/// and replayed like successes.
#[test]
fn rule05_application_results_are_cached_and_replayed() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    driver.execute(client, 1, 1, put("max", Value::Int(i64::MAX)));
    let overflow = CommandResult::Overflow { current: i64::MAX };
    assert_eq!(
        driver.execute(client, 2, 1, incr("max", 1)),
        executed(overflow.clone())
    );
    driver.execute(client, 3, 1, put("max", Value::Int(0)));
    assert_eq!(
        driver.execute(client, 2, 1, incr("max", 1)),
        duplicate(overflow)
    );
    assert_eq!(driver.int("max"), Some(0));

    driver.execute(client, 4, 1, put("text", Value::Bytes(b"x".to_vec())));
    let wrong = CommandResult::WrongType {
        actual: ValueKind::Bytes,
    };
    assert_eq!(
        driver.execute(client, 5, 1, append("text", "y")),
        executed(wrong.clone())
    );
    driver.execute(
        client,
        6,
        1,
        Command::Delete {
            key: b"text".to_vec(),
        },
    );
    assert_eq!(
        driver.execute(client, 5, 1, append("text", "y")),
        duplicate(wrong)
    );
    assert_eq!(driver.registry.get(b"text"), None);
}

/// Rule 6: the same (client id, seq) with another command is SEQ_CONFLICT;
/// nothing executes and the cached response stays.
#[test]
fn rule06_reused_seq_with_another_command_is_a_conflict() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    driver.execute(client, 1, 1, incr("n", 1));
    assert_eq!(
        driver.execute(client, 1, 1, incr("n", 2)),
        rejected(Rejection::SeqConflict)
    );
    assert_eq!(
        driver.execute(client, 1, 1, incr("m", 1)),
        rejected(Rejection::SeqConflict)
    );
    assert_eq!(driver.int("n"), Some(1));
    assert_eq!(driver.int("m"), None);
    assert_eq!(
        driver.execute(client, 1, 1, incr("n", 1)),
        duplicate(CommandResult::Incremented { value: 1 })
    );
}

/// Rule 6: the fingerprint covers the command alone, so a retry carrying a
/// higher floor (the client learnt of other responses meanwhile) is still a
/// duplicate, not a conflict.
#[test]
fn rule06_fingerprint_ignores_the_floor() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    driver.execute(client, 1, 1, incr("n", 1));
    driver.execute(client, 2, 1, incr("n", 1));
    assert_eq!(
        driver.execute(client, 2, 2, incr("n", 1)),
        duplicate(CommandResult::Incremented { value: 2 })
    );
}

/// Rule 7: responses below the floor are trimmed; a request below the floor
/// gets RESPONSE_DISCARDED and never executes; the floor never goes back.
#[test]
fn rule07_acknowledged_responses_are_trimmed_never_re_executed() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    for seq in 1..=3 {
        driver.execute(client, seq, 1, incr("n", 1));
    }
    assert_eq!(driver.registry.session(client).unwrap().cached_responses, 3);
    driver.execute(client, 4, 3, incr("n", 1));
    let session = driver.registry.session(client).unwrap();
    assert_eq!((session.floor, session.cached_responses), (3, 2));
    assert_eq!(
        driver.execute(client, 1, 1, incr("n", 1)),
        rejected(Rejection::ResponseDiscarded { floor: 3 })
    );
    // A lower floor on a later request does not move the floor back.
    driver.execute(client, 5, 2, incr("n", 1));
    assert_eq!(driver.registry.session(client).unwrap().floor, 3);
    assert_eq!(driver.int("n"), Some(5));
}

/// Rule 7: a client that gives up on a request fences it by moving its
/// floor past it; a late copy is then discarded, never executed.
#[test]
fn rule07_fenced_request_is_never_executed() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    assert_eq!(
        driver.keep_alive(client, 2),
        Outcome::KeptAlive {
            floor: 2,
            session_ttl_ms: RegistryConfig::default().session_ttl_ms
        }
    );
    assert_eq!(
        driver.execute(client, 1, 1, incr("n", 1)),
        rejected(Rejection::ResponseDiscarded { floor: 2 })
    );
    assert_eq!(driver.int("n"), None);
}

/// Rule 7: the first outstanding seq must not exceed the request's seq.
#[test]
fn rule07_floor_above_seq_is_invalid_and_not_applied() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    assert_eq!(
        driver.execute(client, 3, 4, incr("n", 1)),
        rejected(Rejection::InvalidArgument(InvalidArgument::FloorAboveSeq {
            seq: 3,
            first_outstanding_seq: 4
        }))
    );
    assert_eq!(driver.registry.session(client).unwrap().floor, 0);
    assert_eq!(driver.int("n"), None);
}

/// Rule 8: many requests may be in flight and commit in any order; a seq at
/// or beyond floor + window is TOO_MANY_OUTSTANDING until the floor rises.
#[test]
fn rule08_pipelining_within_the_window() {
    let config = RegistryConfig {
        window: 4,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    for seq in [4, 2, 1, 3] {
        assert!(matches!(
            driver.execute(client, seq, 1, append("log", &seq.to_string())),
            Outcome::Executed {
                duplicate: false,
                ..
            }
        ));
    }
    assert_eq!(
        driver.execute(client, 5, 1, append("log", "5")),
        rejected(Rejection::TooManyOutstanding {
            floor: 1,
            window: 4
        })
    );
    assert!(matches!(
        driver.execute(client, 5, 2, append("log", "5")),
        Outcome::Executed {
            duplicate: false,
            ..
        }
    ));
    let expected: Vec<Vec<u8>> = ["4", "2", "1", "3", "5"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    assert_eq!(driver.registry.get(b"log"), Some(&Value::List(expected)));
}

/// Rule 9: a request of an unknown or expired session is SESSION_EXPIRED and
/// never executes.
#[test]
fn rule09_unknown_session_is_never_executed() {
    let mut driver = Driver::new();
    assert_eq!(
        driver.execute(ClientId(999), 1, 1, incr("n", 1)),
        rejected(Rejection::SessionExpired)
    );
    let client = driver.register(1);
    driver.advance(RegistryConfig::default().session_ttl_ms + 1);
    assert_eq!(
        driver.execute(client, 1, 1, incr("n", 1)),
        rejected(Rejection::SessionExpired)
    );
    assert_eq!(driver.int("n"), None);
}

/// Rule 10: cluster time is the maximum stamp seen, so a stamp that goes
/// backwards neither moves time back nor refreshes anything into the past.
#[test]
fn rule10_cluster_time_is_the_maximum_stamp() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    driver.now_ms = 50_000;
    driver.keep_alive(client, 0);
    driver.now_ms = 10_000;
    driver.keep_alive(client, 0);
    assert_eq!(driver.registry.cluster_time_ms(), 50_000);
    assert_eq!(
        driver.registry.session(client).unwrap().last_active_ms,
        50_000
    );
}

/// Rule 10: applying the same entries gives the same outcomes and the same
/// snapshot bytes, whatever else the process did in between.
#[test]
fn rule10_same_entries_same_bytes() {
    let run = || {
        let mut driver = Driver::new();
        let mut outcomes = Vec::new();
        for nonce in (1..=20u128).rev() {
            let client = driver.register(nonce * 7919);
            for seq in 1..=3 {
                driver.advance(3);
                outcomes.push(driver.execute(
                    client,
                    seq,
                    1,
                    append(&format!("k{}", nonce % 5), &format!("{nonce}:{seq}")),
                ));
            }
        }
        (outcomes, snapshot::to_bytes(&driver.registry))
    };
    assert_eq!(run(), run());
}

/// Rule 11: a session idle longer than the TTL in cluster time expires at
/// the same log index on every replica; one idle exactly the TTL survives.
#[test]
fn rule11_idle_sessions_expire_deterministically() {
    let config = RegistryConfig {
        session_ttl_ms: 1_000,
        ..RegistryConfig::default()
    };
    let mut replicas = [Driver::with_config(config), Driver::with_config(config)];
    let mut expired_at = Vec::new();
    for driver in &mut replicas {
        let idle = driver.register(1);
        let busy = driver.register(2);
        driver.advance(1_000);
        driver.keep_alive(busy, 0);
        assert!(
            driver.registry.session(idle).is_some(),
            "idle for exactly the TTL"
        );
        driver.advance(1);
        driver.keep_alive(busy, 0);
        assert!(driver.registry.session(idle).is_none());
        assert!(driver.registry.session(busy).is_some());
        expired_at.push((driver.index, snapshot::state_hash(&driver.registry)));
    }
    assert_eq!(expired_at[0], expired_at[1]);
}

/// Rule 11: keep-alives are log entries that refresh activity and carry the
/// floor; a kept-alive session outlives many TTLs.
#[test]
fn rule11_keep_alive_refreshes_activity_and_floor() {
    let config = RegistryConfig {
        session_ttl_ms: 1_000,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    driver.execute(client, 1, 1, incr("n", 1));
    for _ in 0..10 {
        driver.advance(900);
        assert!(matches!(
            driver.keep_alive(client, 2),
            Outcome::KeptAlive {
                floor: 2,
                session_ttl_ms: 1_000
            }
        ));
    }
    let session = driver.registry.session(client).unwrap();
    assert_eq!((session.floor, session.cached_responses), (2, 0));
}

/// Rule 12: at the session limit a register is RESOURCE_EXHAUSTED; nothing
/// is evicted to make room.
#[test]
fn rule12_session_limit_rejects_without_evicting() {
    let config = RegistryConfig {
        sessions_max: 2,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let first = driver.register(1);
    let second = driver.register(2);
    assert_eq!(
        driver.apply(Op::Register {
            cluster_id: Some(CLUSTER),
            nonce: Nonce(3)
        }),
        rejected(Rejection::ResourceExhausted(Limit::Sessions))
    );
    assert!(driver.registry.session(first).is_some());
    assert!(driver.registry.session(second).is_some());
    // A retry of an existing registration still succeeds at the limit.
    assert_eq!(driver.register(1), first);
}

/// Rule 12: the size of the response about to be cached counts: a
/// compare-and-swap whose result carries a large value is refused before
/// its effect, and cached responses at or above the floor are never
/// dropped to make room.
#[test]
fn rule12_cached_bytes_limit_counts_the_response_about_to_be_cached() {
    let config = RegistryConfig {
        cached_bytes_per_session_max: 1_000,
        value_bytes_max: 4_096,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    let writer = driver.register(2);
    driver.execute(writer, 1, 1, put("big", Value::Bytes(vec![7; 2_000])));
    driver.execute(client, 1, 1, incr("n", 1));
    let cas = Command::CompareAndSwap {
        key: b"big".to_vec(),
        expected: None,
        new: Value::Int(0),
    };
    assert_eq!(
        driver.execute(client, 2, 1, cas),
        rejected(Rejection::ResourceExhausted(Limit::CachedBytesPerSession))
    );
    assert_eq!(
        driver.registry.get(b"big"),
        Some(&Value::Bytes(vec![7; 2_000]))
    );
    assert!(driver.registry.cached_response(client, 1).is_some());
    // A swap that would succeed is refused just the same: no effect.
    let swap = Command::CompareAndSwap {
        key: b"big".to_vec(),
        expected: Some(Value::Bytes(vec![7; 2_000])),
        new: Value::Bytes(vec![8; 2_000]),
    };
    assert_eq!(
        driver.execute(client, 3, 1, swap),
        rejected(Rejection::ResourceExhausted(Limit::CachedBytesPerSession))
    );
    assert_eq!(
        driver.registry.get(b"big"),
        Some(&Value::Bytes(vec![7; 2_000]))
    );
}

/// Rule 12: key, value, list and key-count limits reject before the effect.
#[test]
fn rule12_data_limits_reject_before_the_effect() {
    let config = RegistryConfig {
        key_bytes_max: 4,
        value_bytes_max: 32,
        list_elements_max: 2,
        keys_max: 3,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    let exhausted = |limit| rejected(Rejection::ResourceExhausted(limit));
    assert_eq!(
        driver.execute(client, 1, 1, incr("long-key", 1)),
        exhausted(Limit::KeyBytes)
    );
    assert_eq!(
        driver.execute(client, 2, 1, put("v", Value::Bytes(vec![0; 33]))),
        exhausted(Limit::ValueBytes)
    );
    driver.execute(client, 3, 1, append("l", "a"));
    driver.execute(client, 4, 1, append("l", "b"));
    assert_eq!(
        driver.execute(client, 5, 1, append("l", "c")),
        exhausted(Limit::ListElements)
    );
    driver.execute(client, 6, 1, incr("x", 1));
    driver.execute(client, 7, 1, incr("y", 1));
    assert_eq!(
        driver.execute(client, 8, 1, incr("z", 1)),
        exhausted(Limit::Keys)
    );
    // Rejections are for this attempt only: the same seq may succeed later.
    driver.execute(client, 9, 1, Command::Delete { key: b"y".to_vec() });
    assert_eq!(
        driver.execute(client, 8, 1, incr("z", 1)),
        executed(CommandResult::Incremented { value: 1 })
    );
    assert_eq!(driver.registry.data().len(), 3);
    assert_eq!(driver.int("long-key"), None);
}

/// Rule 12: the TTL and limits change only through a config entry, which
/// every replica applies at the same index; an invalid config is refused.
#[test]
fn rule12_config_changes_only_through_the_log() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    let smaller = RegistryConfig {
        window: 2,
        ..RegistryConfig::default()
    };
    assert_eq!(
        driver.apply(Op::SetConfig {
            cluster_id: CLUSTER,
            config: smaller
        }),
        Outcome::ConfigSet(smaller)
    );
    assert_eq!(driver.registry.config(), &smaller);
    // A keep-alive tells the client the TTL now in force, so it can pace
    // its keep-alives by a TTL changed since it registered.
    let shorter = RegistryConfig {
        session_ttl_ms: 5_000,
        ..smaller
    };
    driver.apply(Op::SetConfig {
        cluster_id: CLUSTER,
        config: shorter,
    });
    assert_eq!(
        driver.keep_alive(client, 1),
        Outcome::KeptAlive {
            floor: 1,
            session_ttl_ms: 5_000
        }
    );
    assert_eq!(
        driver.execute(client, 3, 1, incr("n", 1)),
        rejected(Rejection::TooManyOutstanding {
            floor: 1,
            window: 2
        })
    );
    let invalid = RegistryConfig {
        window: 0,
        ..RegistryConfig::default()
    };
    assert!(matches!(
        driver.apply(Op::SetConfig {
            cluster_id: CLUSTER,
            config: invalid
        }),
        Outcome::Rejected(Rejection::InvalidArgument(InvalidArgument::Config(_)))
    ));
    assert_eq!(driver.registry.config(), &shorter);
}

/// Rule 13: a node restored from a snapshot detects duplicates of requests
/// applied before the snapshot and keeps nonces, floors and activity.
#[test]
fn rule13_snapshot_carries_the_whole_registry() {
    let mut driver = Driver::new();
    let client = driver.register(42);
    driver.execute(client, 1, 1, incr("n", 1));
    driver.execute(client, 2, 2, append("l", "x"));
    driver.advance(10);
    let bytes = snapshot::to_bytes(&driver.registry);
    let restored = snapshot::from_bytes(&bytes).unwrap();
    assert_eq!(restored, driver.registry);
    assert_eq!(
        snapshot::state_hash(&restored),
        snapshot::state_hash(&driver.registry)
    );
    driver.registry = restored;
    assert_eq!(driver.register(42), client, "nonce survives the snapshot");
    assert_eq!(
        driver.execute(client, 1, 1, incr("n", 1)),
        rejected(Rejection::ResponseDiscarded { floor: 2 })
    );
    assert_eq!(
        driver.execute(client, 2, 2, append("l", "x")),
        duplicate(CommandResult::Appended { length: 1 })
    );
}

/// Rule 15: equal state gives equal hashes; any replicated difference —
/// data, a floor, a nonce, activity, time, config — changes the hash.
#[test]
fn rule15_state_hash_tracks_every_part_of_the_state() {
    let base = {
        let mut driver = Driver::new();
        let client = driver.register(1);
        driver.execute(client, 1, 1, incr("n", 1));
        driver
    };
    let hash = |driver: &Driver| snapshot::state_hash(&driver.registry);
    type Change = Box<dyn Fn(&mut Driver)>;
    let variants: Vec<Change> = vec![
        Box::new(|d| {
            d.execute(ClientId(2), 2, 1, incr("n", 0));
        }),
        Box::new(|d| {
            d.keep_alive(ClientId(2), 2);
        }),
        Box::new(|d| {
            d.keep_alive(ClientId(2), 0);
        }),
        Box::new(|d| {
            d.register(9);
        }),
        Box::new(|d| {
            d.apply(Op::SetConfig {
                cluster_id: CLUSTER,
                config: RegistryConfig {
                    keys_max: 5,
                    ..RegistryConfig::default()
                },
            });
        }),
        Box::new(|d| d.registry.apply_other(d.index + 1)),
    ];
    let mut seen = vec![hash(&base)];
    for variant in &variants {
        let mut driver = Driver {
            registry: base.registry.clone(),
            index: base.index,
            now_ms: base.now_ms,
        };
        driver.advance(1);
        variant(&mut driver);
        let changed = hash(&driver);
        assert!(!seen.contains(&changed), "hash did not change");
        seen.push(changed);
    }
    let mut twin = Driver::new();
    let client = twin.register(1);
    twin.execute(client, 1, 1, incr("n", 1));
    assert_eq!(hash(&twin), hash(&base));
}

/// Rule 16: an entry naming another cluster is WRONG_CLUSTER and takes no
/// effect; bootstrap happens once.
#[test]
fn rule16_wrong_cluster_is_rejected() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    let other = ClusterId(5);
    let wrong = rejected(Rejection::WrongCluster { expected: CLUSTER });
    let attempts = [
        Op::Register {
            cluster_id: Some(other),
            nonce: Nonce(2),
        },
        Op::Execute(oncekv::registry::Execute {
            cluster_id: other,
            client_id: client,
            seq: 1,
            first_outstanding_seq: 1,
            command: incr("n", 1),
        }),
        Op::KeepAlive {
            cluster_id: other,
            client_id: client,
            first_outstanding_seq: 5,
        },
        Op::Unregister {
            cluster_id: other,
            client_id: client,
        },
        Op::SetConfig {
            cluster_id: other,
            config: RegistryConfig::default(),
        },
        Op::Bootstrap {
            cluster_id: other,
            config: RegistryConfig::default(),
        },
    ];
    for op in attempts {
        assert_eq!(driver.apply(op), wrong);
    }
    assert_eq!(driver.registry.session_count(), 1);
    assert_eq!(driver.registry.session(client).unwrap().floor, 0);
    assert_eq!(driver.int("n"), None);
    assert_eq!(driver.registry.cluster_id(), Some(CLUSTER));
}

/// Before bootstrap there is no cluster id or config: client entries are
/// refused for this attempt, and nothing is created.
#[test]
fn entries_before_bootstrap_are_refused() {
    let mut registry = Registry::new();
    let outcome = registry.apply(
        1,
        &Entry::single(
            1,
            Op::Register {
                cluster_id: None,
                nonce: Nonce(1),
            },
        ),
    );
    assert_eq!(outcome, vec![rejected(Rejection::NotBootstrapped)]);
    assert_eq!(registry.session_count(), 0);
}

/// The documented order of checks: each pair below has two reasons to
/// refuse, and the earlier check must win on every replica.
#[test]
fn order_of_checks_is_the_documented_one() {
    let config = RegistryConfig {
        window: 2,
        value_bytes_max: 8,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    driver.execute(client, 1, 1, incr("n", 1));
    driver.keep_alive(client, 1);
    // Unknown session beats an invalid floor.
    assert_eq!(
        driver.execute(ClientId(999), 1, 5, incr("n", 1)),
        rejected(Rejection::SessionExpired)
    );
    // Invalid floor beats a conflict.
    assert!(matches!(
        driver.execute(client, 1, 2, incr("n", 9)),
        Outcome::Rejected(Rejection::InvalidArgument(_))
    ));
    // The floor rises before the duplicate check: discarded beats duplicate.
    driver.execute(client, 2, 1, incr("n", 1));
    assert_eq!(
        driver.execute(client, 3, 3, incr("n", 1)),
        executed(CommandResult::Incremented { value: 3 })
    );
    assert_eq!(
        driver.execute(client, 2, 2, incr("n", 1)),
        rejected(Rejection::ResponseDiscarded { floor: 3 })
    );
    // A cached duplicate is answered even beyond a window that shrank.
    driver.execute(client, 4, 3, incr("n", 1));
    driver.apply(Op::SetConfig {
        cluster_id: CLUSTER,
        config: RegistryConfig {
            window: 1,
            ..config
        },
    });
    assert_eq!(
        driver.execute(client, 4, 3, incr("n", 1)),
        duplicate(CommandResult::Incremented { value: 4 })
    );
    // Window beats a limit.
    assert_eq!(
        driver.execute(client, 9, 3, put("v", Value::Bytes(vec![0; 64]))),
        rejected(Rejection::TooManyOutstanding {
            floor: 3,
            window: 1
        })
    );
    assert_eq!(driver.int("n"), Some(4));
}

/// Unregister ends a session and its nonce; a second unregister finds no
/// session.
#[test]
fn unregister_ends_the_session() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    let unregister = Op::Unregister {
        cluster_id: CLUSTER,
        client_id: client,
    };
    assert_eq!(driver.apply(unregister.clone()), Outcome::Unregistered);
    assert_eq!(
        driver.apply(unregister),
        rejected(Rejection::SessionExpired)
    );
    assert_ne!(driver.register(1), client);
}

/// The plain path (no session) executes every copy it is given: it is
/// at-least-once, the baseline the registry's cost is measured against.
#[test]
fn plain_execute_is_at_least_once() {
    let mut driver = Driver::new();
    for expected in 1..=2 {
        assert_eq!(
            driver.apply(Op::ExecutePlain {
                cluster_id: CLUSTER,
                command: incr("plain", 1),
            }),
            executed(CommandResult::Incremented { value: expected })
        );
    }
    assert_eq!(driver.int("plain"), Some(2));
}

fn execute_op(client_id: ClientId, seq: u64, command: Command) -> Op {
    Op::Execute(oncekv::registry::Execute {
        cluster_id: CLUSTER,
        client_id,
        seq,
        first_outstanding_seq: seq,
        command,
    })
}

/// Rule 17: the requests of one entry apply in order, each through the full
/// check order with its own outcome; a refusal in the middle of a batch
/// changes nothing for the requests around it.
#[test]
fn rule17_batch_applies_each_request_with_its_own_outcome() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    let outcomes = driver.apply_batch(vec![
        execute_op(client, 1, incr("n", 5)),
        execute_op(ClientId(9_999), 1, incr("n", 100)),
        execute_op(client, 1, incr("n", 5)),
        execute_op(client, 1, incr("n", 7)),
        execute_op(client, 2, incr("n", 1)),
    ]);
    assert_eq!(
        outcomes,
        vec![
            executed(CommandResult::Incremented { value: 5 }),
            rejected(Rejection::SessionExpired),
            duplicate(CommandResult::Incremented { value: 5 }),
            rejected(Rejection::SeqConflict),
            executed(CommandResult::Incremented { value: 6 }),
        ]
    );
    assert_eq!(driver.int("n"), Some(6));
}

/// Rule 17: nothing about a request's outcome depends on the batch it rode
/// in: the same requests at the same cluster time give the same outcomes
/// and the same data one per entry or all in one entry.
#[test]
fn rule17_outcomes_do_not_depend_on_batching() {
    let requests = |client: ClientId| {
        vec![
            execute_op(client, 1, incr("n", 2)),
            execute_op(client, 3, append("l", "x")),
            execute_op(client, 1, incr("n", 2)),
            execute_op(client, 2, put("n", Value::Bytes(b"text".to_vec()))),
            execute_op(client, 4, incr("n", 1)),
            execute_op(client, 3, incr("n", 1)),
        ]
    };
    let mut single = Driver::new();
    let client = single.register(1);
    let one_by_one: Vec<Outcome> = requests(client)
        .into_iter()
        .map(|op| single.apply(op))
        .collect();
    let mut batched = Driver::new();
    assert_eq!(batched.register(1), client);
    let together = batched.apply_batch(requests(client));
    assert_eq!(together, one_by_one);
    assert_eq!(batched.registry.data(), single.registry.data());
}

/// Rule 1: registrations batched into one entry get distinct ids, and an id
/// is never given twice — not even after its session is gone.
#[test]
fn rule01_batched_registrations_get_unique_ids_never_reused() {
    let mut driver = Driver::new();
    let register = |nonce| Op::Register {
        cluster_id: Some(CLUSTER),
        nonce: Nonce(nonce),
    };
    let outcomes = driver.apply_batch(vec![register(1), register(2), register(1), register(3)]);
    let ids: Vec<(u64, bool)> = outcomes
        .iter()
        .map(|outcome| match outcome {
            Outcome::Registered(registration) => (registration.client_id.0, registration.duplicate),
            other => panic!("register failed: {other:?}"),
        })
        .collect();
    let index = driver.index;
    assert_eq!(
        ids,
        vec![
            (index, false),
            (index + 1, false),
            (index, true),
            (index + 2, false)
        ]
    );
    // The next entry's index is below the ids just given: the id moves on.
    let unregister = Op::Unregister {
        cluster_id: CLUSTER,
        client_id: ClientId(index + 2),
    };
    assert_eq!(driver.apply(unregister), Outcome::Unregistered);
    assert_eq!(driver.index, index + 1);
    assert_eq!(driver.register(4), ClientId(index + 3));
    // Once the log index passes the counter, ids follow the log index again.
    for _ in 0..5 {
        driver.keep_alive(ClientId(index), 0);
    }
    let next = driver.register(5);
    assert_eq!(next, ClientId(driver.index));
    assert_eq!(driver.registry.last_client_id(), next.0);
}
