//! The replicated memory budget in the registry core (docs/rules.md, rule
//! 21): the applied state's accounted bytes are counted exactly as the
//! records say, every kind of growth is refused past the budget with
//! RESOURCE_EXHAUSTED naming it — before its effect, nothing evicted —
//! shrinking frees room, the budget is replicated config validated as a
//! whole, and it survives a snapshot.

mod support;

use oncekv_core::fingerprint::claim_fingerprint;
use oncekv_core::snapshot;
use oncekv_core::{
    BudgetConfigPatch, Claim, ClaimConfigPatch, Command, ConfigPatch, IdempotencyKey,
    KV_ENTRY_MEMORY_BOOKKEEPING_BYTES, KeyedConfigPatch, Limit, Nonce, Op, Outcome, Principal,
    Rejection, SESSION_MEMORY_BOOKKEEPING_BYTES, Value,
};
use support::registry::{CLUSTER, Driver};

const BUDGET: u64 = 16 << 20;

fn set_budget(bytes: u64) -> Op {
    Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: KeyedConfigPatch::default(),
        claims: ClaimConfigPatch::default(),
        budget: BudgetConfigPatch {
            memory_budget_bytes: Some(bytes),
            ..BudgetConfigPatch::default()
        },
    }
}

fn put_plain(key: String, bytes: usize) -> Op {
    Op::ExecutePlain {
        cluster_id: CLUSTER,
        command: Command::Put {
            key: key.into_bytes(),
            value: Value::Bytes(vec![7; bytes]),
        },
    }
}

fn exhausted() -> Outcome {
    Outcome::Rejected(Rejection::ResourceExhausted(Limit::MemoryBudget))
}

/// Rule 21: the accounted bytes are exactly the data's, sessions' and
/// records' charges; writes past the budget are refused before their
/// effect, nothing is evicted, and a delete makes room again.
#[test]
fn rule21_writes_past_the_budget_are_refused_and_nothing_is_evicted() {
    let mut driver = Driver::new();
    assert!(matches!(
        driver.apply(set_budget(BUDGET)),
        Outcome::AllConfigsSet { .. }
    ));
    let empty = driver.registry.memory_bytes();
    assert_eq!(empty, 0);
    let value_bytes = 60 << 10;
    let mut written = 0u64;
    let refused_at = loop {
        let key = format!("k{written:05}");
        match driver.apply(put_plain(key.clone(), value_bytes)) {
            Outcome::Executed { .. } => written += 1,
            outcome => {
                assert_eq!(outcome, exhausted());
                assert!(driver.registry.get(key.as_bytes()).is_none(), "no effect");
                break written;
            }
        }
        assert!(written < 1_000, "the budget never refused");
    };
    let per_entry = KV_ENTRY_MEMORY_BOOKKEEPING_BYTES + 6 + value_bytes as u64;
    assert_eq!(driver.registry.memory_bytes(), refused_at * per_entry);
    assert!(driver.registry.memory_bytes() <= BUDGET);
    assert!(driver.registry.memory_bytes() + per_entry > BUDGET);
    assert_eq!(
        driver.registry.data().len() as u64,
        refused_at,
        "nothing evicted"
    );
    // A session, a keyed record and a claim are refused alike.
    let register = Op::Register {
        cluster_id: Some(CLUSTER),
        nonce: Nonce(1),
        principal: Principal::anonymous(),
    };
    let keyed = Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(b"msg".to_vec()),
        command: Command::Put {
            key: b"x".to_vec(),
            value: Value::Bytes(vec![0; 30_000]),
        },
        principal: Principal::anonymous(),
    };
    let claim = Op::Claim(Claim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: IdempotencyKey(vec![b'c'; 200]),
        fingerprint: claim_fingerprint(b"job"),
        lease_ms: 1_000,
        claim_id: Nonce(9),
    });
    let room = BUDGET - driver.registry.memory_bytes();
    assert!(room < SESSION_MEMORY_BOOKKEEPING_BYTES + (60 << 10));
    // Fill what is left with small entries (198 bytes each) until even one
    // is refused: a session, a key record or a claim no longer fits.
    let mut filler = 0;
    while driver.apply(put_plain(format!("f{filler:05}"), 64)) != exhausted() {
        filler += 1;
        assert!(filler < 1_000);
    }
    assert_eq!(driver.apply(register.clone()), exhausted());
    assert_eq!(driver.apply(keyed), exhausted());
    assert_eq!(driver.apply(claim), exhausted());
    // Deleting frees room: the refused session now registers.
    let delete = Op::ExecutePlain {
        cluster_id: CLUSTER,
        command: Command::Delete {
            key: b"k00000".to_vec(),
        },
    };
    assert!(matches!(driver.apply(delete), Outcome::Executed { .. }));
    assert!(matches!(driver.apply(register), Outcome::Registered(_)));
}

/// Rule 21 with rule 12: a budget below the most one request can add (or
/// outside its bounds) is refused as a whole and changes nothing.
#[test]
fn rule21_a_budget_too_small_for_one_request_is_refused() {
    let mut driver = Driver::new();
    let before = *driver.registry.budget_config();
    for bytes in [0, 1 << 20, (1u64 << 40) + 1] {
        assert!(
            matches!(
                driver.apply(set_budget(bytes)),
                Outcome::Rejected(Rejection::InvalidArgument(_))
            ),
            "{bytes}"
        );
    }
    assert_eq!(*driver.registry.budget_config(), before);
    // The defaults allow 4 MiB values and 32 MiB session caches once
    // raised: a 16 MiB budget then no longer holds one request.
    driver.apply(set_budget(BUDGET));
    let raise = Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch {
            value_bytes_max: Some(4 << 20),
            cached_bytes_per_session_max: Some(32 << 20),
            ..ConfigPatch::default()
        },
        keyed: KeyedConfigPatch::default(),
        claims: ClaimConfigPatch::default(),
        budget: BudgetConfigPatch::default(),
    };
    assert!(matches!(
        driver.apply(raise),
        Outcome::Rejected(Rejection::InvalidArgument(_))
    ));
}

/// Rules 13 and 21: the budget and the accounted bytes survive a snapshot.
#[test]
fn rule21_the_budget_survives_a_snapshot() {
    let mut driver = Driver::new();
    driver.apply(set_budget(64 << 20));
    let client = driver.register(5);
    driver.execute(
        client,
        1,
        1,
        Command::Put {
            key: b"a".to_vec(),
            value: Value::Bytes(vec![1; 100]),
        },
    );
    driver.apply(put_plain("b".into(), 1_000));
    let restored = snapshot::from_bytes(&snapshot::to_bytes(&driver.registry)).expect("reads");
    assert_eq!(restored.budget_config().memory_budget_bytes, 64 << 20);
    assert_eq!(restored.memory_bytes(), driver.registry.memory_bytes());
    assert!(restored.memory_bytes() > SESSION_MEMORY_BOOKKEEPING_BYTES + 1_100);
}

/// Rule 21: one authenticated principal may hold only its share of each
/// capacity limit (sessions, keys, claims), so another still gets in; the
/// anonymous principal is held to the limits alone.
#[test]
fn rule21_one_principal_cannot_take_every_session_key_or_claim() {
    let mut driver = Driver::new();
    driver.apply(Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch {
            sessions_max: Some(4),
            ..ConfigPatch::default()
        },
        keyed: KeyedConfigPatch {
            idempotency_keys_max: Some(4),
            ..KeyedConfigPatch::default()
        },
        claims: ClaimConfigPatch {
            claims_max: Some(4),
            ..ClaimConfigPatch::default()
        },
        budget: BudgetConfigPatch::default(),
    });
    assert_eq!(driver.registry.budget_config().principal_quota_percent, 50);
    let quota = Outcome::Rejected(Rejection::ResourceExhausted(Limit::PrincipalQuota));
    let register = |who: &str, nonce: u128| Op::Register {
        cluster_id: Some(CLUSTER),
        nonce: Nonce(nonce),
        principal: Principal(who.to_owned()),
    };
    let keyed = |who: &str, key: &str| Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(key.as_bytes().to_vec()),
        command: Command::Increment {
            key: b"n".to_vec(),
            delta: 1,
        },
        principal: Principal(who.to_owned()),
    };
    let claim = |who: &str, key: &str, id: u128| {
        Op::Claim(Claim {
            cluster_id: CLUSTER,
            principal: Principal(who.to_owned()),
            key: IdempotencyKey(key.as_bytes().to_vec()),
            fingerprint: claim_fingerprint(b"job"),
            lease_ms: 1_000,
            claim_id: Nonce(id),
        })
    };
    for (nonce, key) in [(1, "a"), (2, "b")] {
        assert!(matches!(
            driver.apply(register("alice", nonce)),
            Outcome::Registered(_)
        ));
        assert!(matches!(
            driver.apply(keyed("alice", key)),
            Outcome::Executed { .. }
        ));
        assert!(matches!(
            driver.apply(claim("alice", key, nonce)),
            Outcome::Claimed(_)
        ));
    }
    assert_eq!(driver.apply(register("alice", 3)), quota);
    assert_eq!(driver.apply(keyed("alice", "c")), quota);
    assert_eq!(driver.apply(claim("alice", "c", 3)), quota);
    // Bob gets his share; a duplicate of Alice's is still answered.
    assert!(matches!(
        driver.apply(register("bob", 4)),
        Outcome::Registered(_)
    ));
    assert!(matches!(
        driver.apply(keyed("bob", "a")),
        Outcome::Executed { .. }
    ));
    assert!(matches!(
        driver.apply(keyed("alice", "a")),
        Outcome::Executed {
            duplicate: true,
            ..
        }
    ));
    // The anonymous principal is held to the limits alone: one session
    // left of four.
    assert!(matches!(
        driver.apply(register("", 5)),
        Outcome::Registered(_)
    ));
    assert_eq!(
        driver.apply(register("", 6)),
        Outcome::Rejected(Rejection::ResourceExhausted(Limit::Sessions))
    );
    let restored = snapshot::from_bytes(&snapshot::to_bytes(&driver.registry)).expect("reads");
    restored
        .check_invariants()
        .expect("usage rebuilt from the records");
}
