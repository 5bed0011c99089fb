//! One or more tests per rule (docs/rules.md) that the registry core owns, each
//! named after its rule and written so that breaking the rule fails it.

mod support;

use oncekv_core::snapshot;
use oncekv_core::{
    CACHED_RESPONSE_BOOKKEEPING_BYTES, ClientId, ClusterId, Command, CommandResult, ConfigPatch,
    Entry, InvalidArgument, Limit, LimitExceeded, Nonce, Op, Outcome, Registry, RegistryConfig,
    Rejection, Value, ValueKind,
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
        principal: oncekv_core::Principal::anonymous(),
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
    assert_eq!(cached.result, Ok(CommandResult::Incremented { value: 5 }));
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
        Op::Execute(oncekv_core::Execute {
            cluster_id: CLUSTER,
            client_id: client,
            seq: 1,
            first_outstanding_seq: 1,
            command: incr("n", 1),
            principal: oncekv_core::Principal::anonymous(),
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
            session_ttl_ms: RegistryConfig::default().session_ttl_ms,
            limits: RegistryConfig::default().request_limits(),
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
                session_ttl_ms: 1_000,
                ..
            }
        ));
    }
    let session = driver.registry.session(client).unwrap();
    assert_eq!((session.floor, session.cached_responses), (2, 0));
}

/// Rule 11 with rule 7: a refused request does not keep a session alive. A
/// session whose client can only be refused — its floor beyond the bound,
/// sent again and again by keep-alives and executes, as a client that
/// fenced too many unknown outcomes during an outage would — expires after
/// the TTL like an idle one, so its client learns `SESSION_EXPIRED` and
/// registers anew instead of being refused forever; the refusals change
/// neither its floor nor its activity, and an accepted keep-alive does
/// refresh it.
#[test]
fn rule11_refused_requests_do_not_keep_a_session_alive() {
    let config = RegistryConfig {
        session_ttl_ms: 1_000,
        window: 2,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let wedged = driver.register(1);
    let kept = driver.register(2);
    let active_ms = driver.registry.session(wedged).unwrap().last_active_ms;
    // The bound is max(highest + 1, floor) + window = 1 + 2: 6 is beyond it.
    for _ in 0..3 {
        driver.advance(300);
        assert!(matches!(
            driver.keep_alive(wedged, 6),
            Outcome::Rejected(Rejection::InvalidArgument(
                InvalidArgument::FloorBeyondBound { bound_seq: 3, .. }
            ))
        ));
        assert!(matches!(
            driver.execute(wedged, 7, 6, incr("n", 1)),
            Outcome::Rejected(Rejection::InvalidArgument(
                InvalidArgument::FloorBeyondBound { .. }
            ))
        ));
        assert!(matches!(
            driver.keep_alive(kept, 1),
            Outcome::KeptAlive { floor: 1, .. }
        ));
        if let Some(session) = driver.registry.session(wedged) {
            assert_eq!((session.floor, session.last_active_ms), (0, active_ms));
        }
    }
    // 1,200 ms after its last accepted request, the wedged session is gone
    // (at the first entry past the TTL); the kept one lives.
    driver.advance(300);
    assert!(matches!(
        driver.keep_alive(kept, 1),
        Outcome::KeptAlive { floor: 1, .. }
    ));
    assert!(driver.registry.session(wedged).is_none());
    assert_eq!(
        driver.execute(wedged, 7, 6, incr("n", 1)),
        rejected(Rejection::SessionExpired)
    );
    assert!(driver.registry.session(kept).is_some());
    assert_eq!(driver.int("n"), None, "nothing executed");
}

/// Rule 11: which requests refresh a session's activity, over random
/// requests of one session: exactly those that passed every check that can
/// refuse them — executed, answered from the cache (a result or a cached
/// limit refusal), or a keep-alive whose floor was accepted. Every other
/// refusal (an invalid or out-of-bound floor, a discarded or conflicting
/// seq, a full window, a capacity limit) leaves the activity as it was.
#[test]
fn rule11_only_requests_that_pass_the_checks_refresh_activity() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let request = (0u8..3, 0u64..12, 0u64..14, 0u8..4, 1u64..400);
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(request, 1..60), |requests| {
            let config = RegistryConfig {
                session_ttl_ms: 1_000_000,
                window: 3,
                value_bytes_max: 8,
                keys_max: 2,
                ..RegistryConfig::default()
            };
            let mut driver = Driver::with_config(config);
            let client = driver.register(1);
            for (kind, seq, floor, command, advance_ms) in requests {
                driver.advance(advance_ms);
                let before = driver.registry.session(client).unwrap();
                let command = match command {
                    0 => incr("a", 1),
                    1 => incr("b", 2),
                    2 => put(&format!("k{seq}"), Value::Int(1)),
                    _ => put("a", Value::Bytes(vec![0; 9])),
                };
                let outcome = match kind {
                    0 => driver.keep_alive(client, floor),
                    _ => driver.execute(client, seq, floor.min(seq), command),
                };
                let after = driver.registry.session(client).unwrap();
                let refreshes = matches!(
                    outcome,
                    Outcome::Executed { .. }
                        | Outcome::KeptAlive { .. }
                        | Outcome::Rejected(Rejection::LimitExceeded { .. })
                );
                let expected_ms = if refreshes {
                    driver.now_ms
                } else {
                    before.last_active_ms
                };
                prop_assert_eq!(after.last_active_ms, expected_ms, "{:?}", outcome);
                if matches!(outcome, Outcome::Rejected(Rejection::InvalidArgument(_))) {
                    prop_assert_eq!(after.floor, before.floor);
                }
            }
            Ok(())
        })
        .unwrap();
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
            nonce: Nonce(3),
            principal: oncekv_core::Principal::anonymous(),
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
/// its effect while the session's cache is too full for it, and cached
/// responses at or above the floor are never dropped to make room. It is a
/// capacity limit (this attempt only): once the floor trims the cache, the
/// same seq succeeds.
#[test]
fn rule12_cached_bytes_limit_counts_the_response_about_to_be_cached() {
    let config = RegistryConfig {
        cached_bytes_per_session_max: 2_100,
        value_bytes_max: 2_048,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    let writer = driver.register(2);
    driver.execute(writer, 1, 1, put("big", Value::Bytes(vec![7; 2_000])));
    for seq in 1..=3 {
        driver.execute(client, seq, 1, incr("n", 1));
    }
    let cas = Command::CompareAndSwap {
        key: b"big".to_vec(),
        expected: None,
        new: Value::Int(0),
    };
    // 3 × 32 bytes cached + 32 + 2,000 for the answer > 2,100.
    assert_eq!(
        driver.execute(client, 4, 1, cas.clone()),
        rejected(Rejection::ResourceExhausted(Limit::CachedBytesPerSession))
    );
    assert_eq!(
        driver.registry.get(b"big"),
        Some(&Value::Bytes(vec![7; 2_000]))
    );
    for seq in 1..=3 {
        assert!(driver.registry.cached_response(client, seq).is_some());
    }
    // A swap that would succeed is refused just the same: no effect.
    let swap = Command::CompareAndSwap {
        key: b"big".to_vec(),
        expected: Some(Value::Bytes(vec![7; 2_000])),
        new: Value::Bytes(vec![8; 2_000]),
    };
    assert_eq!(
        driver.execute(client, 5, 1, swap),
        rejected(Rejection::ResourceExhausted(Limit::CachedBytesPerSession))
    );
    assert_eq!(
        driver.registry.get(b"big"),
        Some(&Value::Bytes(vec![7; 2_000]))
    );
    // Not cached: once the floor trims the cache, the same seq succeeds.
    assert_eq!(
        driver.execute(client, 4, 4, cas),
        executed(CommandResult::CompareAndSwap {
            swapped: false,
            current: Some(Value::Bytes(vec![7; 2_000])),
        })
    );
}

fn exceeded(limit: Limit, max: u64, requested: u64) -> LimitExceeded {
    LimitExceeded {
        limit,
        max,
        requested,
    }
}

fn limit_refused(exceeded: LimitExceeded, duplicate: bool) -> Outcome {
    rejected(Rejection::LimitExceeded {
        exceeded,
        duplicate,
    })
}

/// Rule 12: a limit the request breaks by itself — a key, value or list
/// too large, measured on what the command would store — is refused before
/// any effect, and the refusal is final for the seq: cached like a result,
/// so a retry gets it again as a duplicate even after the limit was raised
/// (a retry never executes what an earlier copy was refused), while a new
/// seq is judged under the new limit.
#[test]
fn rule12_request_limits_are_final_and_cached() {
    let config = RegistryConfig {
        key_bytes_max: 4,
        value_bytes_max: 32,
        list_elements_max: 2,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    let long_key = incr("long-key", 1);
    let big_value = put("v", Value::Bytes(vec![0; 33]));
    let long_list = put("w", Value::List(vec![b"a".to_vec(); 3]));
    let big_new = Command::CompareAndSwap {
        key: b"c".to_vec(),
        expected: None,
        new: Value::Bytes(vec![0; 40]),
    };
    assert_eq!(
        driver.execute(client, 1, 1, long_key.clone()),
        limit_refused(exceeded(Limit::KeyBytes, 4, 8), false)
    );
    assert_eq!(
        driver.execute(client, 2, 1, big_value.clone()),
        limit_refused(exceeded(Limit::ValueBytes, 32, 33), false)
    );
    assert_eq!(
        driver.execute(client, 3, 1, long_list),
        limit_refused(exceeded(Limit::ListElements, 2, 3), false)
    );
    assert_eq!(
        driver.execute(client, 4, 1, big_new),
        limit_refused(exceeded(Limit::ValueBytes, 32, 40), false)
    );
    // A list grown past a limit by an append: the third element.
    driver.execute(client, 5, 1, append("l", "a"));
    driver.execute(client, 6, 1, append("l", "b"));
    assert_eq!(
        driver.execute(client, 7, 1, append("l", "c")),
        limit_refused(exceeded(Limit::ListElements, 2, 3), false)
    );
    assert!(driver.registry.data().iter().all(|(key, _)| key == b"l"));
    // Final: the retry gets the cached refusal, even under a raised limit.
    driver.apply(Op::PatchConfig {
        cluster_id: CLUSTER,
        patch: ConfigPatch {
            key_bytes_max: Some(64),
            value_bytes_max: Some(1_024),
            ..ConfigPatch::default()
        },
    });
    assert_eq!(
        driver.execute(client, 1, 1, long_key.clone()),
        limit_refused(exceeded(Limit::KeyBytes, 4, 8), true)
    );
    assert_eq!(
        driver.execute(client, 2, 1, big_value.clone()),
        limit_refused(exceeded(Limit::ValueBytes, 32, 33), true)
    );
    // The seq is taken: another command under it is a conflict.
    assert_eq!(
        driver.execute(client, 2, 1, incr("v", 1)),
        rejected(Rejection::SeqConflict)
    );
    // A new seq is judged under the new limits.
    assert_eq!(
        driver.execute(client, 8, 1, long_key),
        executed(CommandResult::Incremented { value: 1 })
    );
    assert_eq!(
        driver.execute(client, 9, 1, big_value),
        executed(CommandResult::Stored)
    );
    // The cached refusal is charged like a response, and trimmed like one.
    let session = driver.registry.session(client).unwrap();
    assert_eq!(session.cached_responses, 9);
    driver.keep_alive(client, 10);
    assert_eq!(driver.registry.session(client).unwrap().cached_bytes, 0);
}

/// Rule 12: the sessionless path refuses a limit the request breaks the
/// same way (nothing to cache: it has no seq).
#[test]
fn rule12_plain_execute_refuses_request_limits() {
    let config = RegistryConfig {
        value_bytes_max: 16,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    assert_eq!(
        driver.apply(Op::ExecutePlain {
            cluster_id: CLUSTER,
            command: put("v", Value::Bytes(vec![0; 17])),
        }),
        limit_refused(exceeded(Limit::ValueBytes, 16, 17), false)
    );
    assert!(driver.registry.data().is_empty());
}

/// Rule 12: capacity limits (the key count) refuse for this attempt only:
/// nothing is cached, and the same seq succeeds once room is made. A
/// request that also breaks a limit by itself gets the final refusal.
#[test]
fn rule12_capacity_limits_are_for_this_attempt_only() {
    let config = RegistryConfig {
        keys_max: 2,
        value_bytes_max: 32,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    driver.execute(client, 1, 1, incr("x", 1));
    driver.execute(client, 2, 1, incr("y", 1));
    assert_eq!(
        driver.execute(client, 3, 1, incr("z", 1)),
        rejected(Rejection::ResourceExhausted(Limit::Keys))
    );
    assert!(driver.registry.cached_response(client, 3).is_none());
    // Can never succeed beats not now.
    assert_eq!(
        driver.execute(client, 4, 1, put("z", Value::Bytes(vec![0; 33]))),
        limit_refused(exceeded(Limit::ValueBytes, 32, 33), false)
    );
    driver.execute(client, 5, 1, Command::Delete { key: b"y".to_vec() });
    assert_eq!(
        driver.execute(client, 3, 1, incr("z", 1)),
        executed(CommandResult::Incremented { value: 1 })
    );
    assert_eq!(driver.registry.data().len(), 2);
}

/// Rule 12: data written under larger limits stays usable after they are
/// lowered: it can be read and deleted, and a response that no session
/// could cache — a failed compare-and-swap answering with a value larger
/// than a whole session's cache — is a final refusal, not a capacity
/// refusal retried forever.
#[test]
fn rule12_a_response_no_session_could_cache_is_final() {
    let config = RegistryConfig {
        key_bytes_max: 16,
        value_bytes_max: 4_096,
        cached_bytes_per_session_max: 8_192,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    driver.execute(client, 1, 1, put("big", Value::Bytes(vec![7; 4_000])));
    driver.execute(client, 2, 1, incr("a-long-key", 1));
    assert!(matches!(
        driver.apply(Op::PatchConfig {
            cluster_id: CLUSTER,
            patch: ConfigPatch {
                key_bytes_max: Some(4),
                value_bytes_max: Some(64),
                cached_bytes_per_session_max: Some(100),
                ..ConfigPatch::default()
            },
        }),
        Outcome::ConfigSet(_)
    ));
    let cas = Command::CompareAndSwap {
        key: b"big".to_vec(),
        expected: None,
        new: Value::Int(1),
    };
    let refused = exceeded(Limit::CachedBytesPerSession, 100, 4_032);
    assert_eq!(
        driver.execute(client, 3, 3, cas.clone()),
        limit_refused(refused, false)
    );
    assert_eq!(
        driver.execute(client, 3, 3, cas),
        limit_refused(refused, true)
    );
    assert_eq!(
        driver.registry.get(b"big"),
        Some(&Value::Bytes(vec![7; 4_000]))
    );
    assert_eq!(
        driver.execute(
            client,
            4,
            3,
            Command::Delete {
                key: b"a-long-key".to_vec()
            }
        ),
        executed(CommandResult::Deleted { existed: true })
    );
}

/// Rule 12: a config that would refuse requests forever is refused — at
/// bootstrap and in a config entry — naming both fields: a session's cache
/// must hold the largest response a command can produce, a compare-and-swap
/// answering with a value of `value_bytes_max` (plus 32 bytes of
/// bookkeeping). At the boundary, such a response is cached on an empty
/// session, whatever the value's type.
#[test]
fn rule12_config_cross_check_keeps_every_response_cacheable() {
    let at = |value_bytes_max: u64, cached_bytes_per_session_max: u64| RegistryConfig {
        value_bytes_max,
        cached_bytes_per_session_max,
        ..RegistryConfig::default()
    };
    // A list limit of 0 would refuse every append forever.
    let no_lists = RegistryConfig {
        list_elements_max: 0,
        ..RegistryConfig::default()
    };
    assert!(
        matches!(no_lists.validate(), Err(InvalidArgument::Config(why)) if why.contains("list_elements_max"))
    );
    for invalid in [at(64, 0), at(64, 95), at(4 << 20, 1 << 20)] {
        let Err(InvalidArgument::Config(why)) = invalid.validate() else {
            panic!("{invalid:?} accepted");
        };
        assert!(
            why.contains("cached_bytes_per_session_max") && why.contains("value_bytes_max"),
            "{why}"
        );
        let mut registry = Registry::new();
        let outcomes = registry.apply(
            1,
            &Entry::single(
                0,
                Op::Bootstrap {
                    cluster_id: CLUSTER,
                    config: invalid,
                },
            ),
        );
        assert!(matches!(
            outcomes[..],
            [Outcome::Rejected(Rejection::InvalidArgument(_))]
        ));
    }
    assert_eq!(
        CommandResult::largest_cached_size_bytes(64),
        64 + CACHED_RESPONSE_BOOKKEEPING_BYTES
    );
    let boundary = at(64, 96);
    assert_eq!(boundary.validate(), Ok(()));
    let values = [
        Value::Bytes(vec![1; 64]),
        Value::List(vec![vec![2; 8]; 4]),
        Value::List(vec![Vec::new(); 8]),
        Value::Int(3),
    ];
    for (n, value) in values.into_iter().enumerate() {
        assert!(value.size_bytes() <= 64);
        let mut driver = Driver::with_config(boundary);
        let client = driver.register(1);
        let key = format!("k{n}");
        let swap = Command::CompareAndSwap {
            key: key.clone().into_bytes(),
            expected: None,
            new: value.clone(),
        };
        assert_eq!(
            driver.execute(client, 1, 1, swap),
            executed(CommandResult::CompareAndSwap {
                swapped: true,
                current: Some(value.clone()),
            })
        );
        let failed = Command::CompareAndSwap {
            key: key.into_bytes(),
            expected: None,
            new: Value::Int(0),
        };
        assert_eq!(
            driver.execute(client, 2, 2, failed),
            executed(CommandResult::CompareAndSwap {
                swapped: false,
                current: Some(value),
            })
        );
    }
    // A config entry is checked as a whole against the config in force:
    // raising value_bytes_max past what the cache holds is refused.
    let mut driver = Driver::with_config(boundary);
    let raise = Op::PatchConfig {
        cluster_id: CLUSTER,
        patch: ConfigPatch {
            value_bytes_max: Some(65),
            ..ConfigPatch::default()
        },
    };
    assert!(matches!(
        driver.apply(raise),
        Outcome::Rejected(Rejection::InvalidArgument(InvalidArgument::Config(_)))
    ));
    assert_eq!(driver.registry.config(), &boundary);
}

/// Rule 12: a config patch changes only the fields it sets, on the config
/// in force when it applies, so two operators changing different fields
/// both get their change; a patch that sets nothing is refused. An entry
/// of the whole-config kind older builds wrote still replaces every field.
#[test]
fn rule12_config_patch_changes_only_the_fields_it_sets() {
    let mut driver = Driver::new();
    let operator_a = Op::PatchConfig {
        cluster_id: CLUSTER,
        patch: ConfigPatch {
            window: Some(8),
            ..ConfigPatch::default()
        },
    };
    let operator_b = Op::PatchConfig {
        cluster_id: CLUSTER,
        patch: ConfigPatch {
            session_ttl_ms: Some(5_000),
            ..ConfigPatch::default()
        },
    };
    let outcomes = driver.apply_batch(vec![operator_a.clone(), operator_b]);
    let expected = RegistryConfig {
        window: 8,
        session_ttl_ms: 5_000,
        ..RegistryConfig::default()
    };
    assert_eq!(outcomes.last(), Some(&Outcome::ConfigSet(expected)));
    assert_eq!(driver.registry.config(), &expected);
    // A retried patch sets the same values again.
    assert_eq!(driver.apply(operator_a), Outcome::ConfigSet(expected));
    assert_eq!(
        driver.apply(Op::PatchConfig {
            cluster_id: CLUSTER,
            patch: ConfigPatch::default(),
        }),
        rejected(Rejection::InvalidArgument(
            InvalidArgument::EmptyConfigPatch
        ))
    );
    let whole = RegistryConfig {
        keys_max: 7,
        ..RegistryConfig::default()
    };
    assert_eq!(
        driver.apply(Op::SetConfig {
            cluster_id: CLUSTER,
            config: whole,
        }),
        Outcome::ConfigSet(whole)
    );
}

/// An empty key is malformed on every path that executes a command (as
/// etcd has it): INVALID_ARGUMENT, nothing executed, nothing cached — it is
/// a fact of the request alone, so a retry gets it again.
#[test]
fn empty_key_is_invalid_on_every_path() {
    let mut driver = Driver::new();
    let client = driver.register(1);
    let empties = [
        put("", Value::Int(1)),
        incr("", 1),
        append("", "e"),
        Command::Delete { key: Vec::new() },
        Command::CompareAndSwap {
            key: Vec::new(),
            expected: None,
            new: Value::Int(1),
        },
    ];
    let invalid = rejected(Rejection::InvalidArgument(InvalidArgument::EmptyKey));
    for (seq, command) in (1..).zip(empties) {
        assert_eq!(driver.execute(client, seq, 1, command.clone()), invalid);
        assert_eq!(driver.execute(client, seq, 1, command.clone()), invalid);
        assert_eq!(
            driver.apply(Op::ExecutePlain {
                cluster_id: CLUSTER,
                command,
            }),
            invalid
        );
        assert!(driver.registry.cached_response(client, seq).is_none());
    }
    assert!(driver.registry.data().is_empty());
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
            session_ttl_ms: 5_000,
            limits: shorter.request_limits(),
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

/// Rule 13: a cached refusal of a request that broke a limit travels in the
/// snapshot like any cached response: a node restored from it (a new
/// leader) answers the retry with the same final refusal, and hashes alike.
#[test]
fn rule13_snapshot_carries_cached_limit_refusals() {
    let config = RegistryConfig {
        value_bytes_max: 16,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    let big = put("v", Value::Bytes(vec![0; 17]));
    let refused = limit_refused(exceeded(Limit::ValueBytes, 16, 17), false);
    assert_eq!(driver.execute(client, 1, 1, big.clone()), refused);
    let bytes = snapshot::to_bytes(&driver.registry);
    let restored = snapshot::from_bytes(&bytes).unwrap();
    assert_eq!(restored, driver.registry);
    assert_eq!(snapshot::to_bytes(&restored), bytes);
    assert_eq!(
        snapshot::state_hash(&restored),
        snapshot::state_hash(&driver.registry)
    );
    driver.registry = restored;
    assert_eq!(
        driver.execute(client, 1, 1, big),
        limit_refused(exceeded(Limit::ValueBytes, 16, 17), true)
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
            principal: oncekv_core::Principal::anonymous(),
        },
        Op::Execute(oncekv_core::Execute {
            cluster_id: other,
            client_id: client,
            seq: 1,
            first_outstanding_seq: 1,
            command: incr("n", 1),
            principal: oncekv_core::Principal::anonymous(),
        }),
        Op::KeepAlive {
            cluster_id: other,
            client_id: client,
            first_outstanding_seq: 5,
            principal: oncekv_core::Principal::anonymous(),
        },
        Op::Unregister {
            cluster_id: other,
            client_id: client,
            principal: Some(oncekv_core::Principal::anonymous()),
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
                principal: oncekv_core::Principal::anonymous(),
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

/// Step 7 in its documented order: an empty key, then a limit the request
/// breaks by itself (final, cached), then capacity limits (this attempt):
/// the key count, then the session's cached bytes — which a refusal about
/// to be cached needs too.
#[test]
fn order_of_limit_checks_is_the_documented_one() {
    let config = RegistryConfig {
        keys_max: 1,
        value_bytes_max: 8,
        cached_bytes_per_session_max: 64,
        ..RegistryConfig::default()
    };
    let mut driver = Driver::with_config(config);
    let client = driver.register(1);
    driver.execute(client, 1, 1, incr("a", 1));
    // Empty key beats a limit the request breaks.
    assert_eq!(
        driver.execute(client, 2, 1, put("", Value::Bytes(vec![0; 9]))),
        rejected(Rejection::InvalidArgument(InvalidArgument::EmptyKey))
    );
    // A limit the request breaks beats the key count.
    assert_eq!(
        driver.execute(client, 2, 1, put("b", Value::Bytes(vec![0; 9]))),
        limit_refused(exceeded(Limit::ValueBytes, 8, 9), false)
    );
    // Now 64 bytes are cached: the key count refuses first...
    assert_eq!(
        driver.execute(client, 3, 1, incr("b", 1)),
        rejected(Rejection::ResourceExhausted(Limit::Keys))
    );
    // ...and a refusal that cannot be cached is not final yet.
    assert_eq!(
        driver.execute(client, 4, 1, put("a", Value::Bytes(vec![0; 9]))),
        rejected(Rejection::ResourceExhausted(Limit::CachedBytesPerSession))
    );
    assert!(driver.registry.cached_response(client, 4).is_none());
    assert_eq!(
        driver.execute(client, 4, 3, put("a", Value::Bytes(vec![0; 9]))),
        limit_refused(exceeded(Limit::ValueBytes, 8, 9), false)
    );
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
        principal: Some(oncekv_core::Principal::anonymous()),
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
    Op::Execute(oncekv_core::Execute {
        cluster_id: CLUSTER,
        client_id,
        seq,
        first_outstanding_seq: seq,
        command,
        principal: oncekv_core::Principal::anonymous(),
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

/// Rule 17: a request refused for a limit it breaks, or for an empty key,
/// changes nothing for the requests around it in its batch — of its own
/// session or another — and gets the same outcome it gets alone.
#[test]
fn rule17_a_refused_request_never_affects_another_in_its_batch() {
    let config = RegistryConfig {
        value_bytes_max: 16,
        ..RegistryConfig::default()
    };
    let requests = |first: ClientId, second: ClientId| {
        vec![
            execute_op(first, 1, incr("n", 1)),
            execute_op(first, 2, put("v", Value::Bytes(vec![0; 17]))),
            execute_op(second, 1, incr("", 1)),
            execute_op(first, 2, put("v", Value::Bytes(vec![0; 17]))),
            execute_op(first, 3, incr("n", 1)),
            execute_op(second, 2, append("l", "x")),
        ]
    };
    let mut single = Driver::with_config(config);
    let (first, second) = (single.register(1), single.register(2));
    let one_by_one: Vec<Outcome> = requests(first, second)
        .into_iter()
        .map(|op| single.apply(op))
        .collect();
    let mut batched = Driver::with_config(config);
    assert_eq!((batched.register(1), batched.register(2)), (first, second));
    let together = batched.apply_batch(requests(first, second));
    assert_eq!(together, one_by_one);
    assert_eq!(
        together,
        vec![
            executed(CommandResult::Incremented { value: 1 }),
            limit_refused(exceeded(Limit::ValueBytes, 16, 17), false),
            rejected(Rejection::InvalidArgument(InvalidArgument::EmptyKey)),
            limit_refused(exceeded(Limit::ValueBytes, 16, 17), true),
            executed(CommandResult::Incremented { value: 2 }),
            executed(CommandResult::Appended { length: 1 }),
        ]
    );
    assert_eq!(batched.registry.data(), single.registry.data());
    for seq in 1..=3 {
        assert_eq!(
            batched.registry.cached_response(first, seq),
            single.registry.cached_response(first, seq)
        );
    }
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
        principal: oncekv_core::Principal::anonymous(),
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
        principal: Some(oncekv_core::Principal::anonymous()),
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
