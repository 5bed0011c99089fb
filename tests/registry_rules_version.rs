//! The replicated rules version in the registry core (rule 21: records
//! whose number grows with rate × TTL are not bounded by RAM): a new
//! cluster starts at the latest version with its limits (50 M keys), a
//! state made before versions existed is at version 1 and keeps its rules
//! until an entry raises it — at one log index, on every replica alike —
//! and from version 2 idempotency-key records count against
//! `idempotency_cached_bytes_max` and each principal's share of it, not
//! against the memory budget. The version survives a snapshot and is part
//! of the state hash.

mod support;

use oncekv_core::fingerprint::claim_fingerprint;
use oncekv_core::snapshot;
use oncekv_core::{
    BudgetConfigPatch, Claim, ClaimAnswer, ClaimConfig, ClaimConfigPatch, Command, ConfigPatch,
    IdempotencyKey, KeyedConfig, KeyedConfigPatch, Limit, Nonce, Op, Outcome, Principal, Rejection,
    RulesVersion, Value,
};
use support::registry::{CLUSTER, Driver};

/// 16 MiB, the smallest budget: a few thousand 4 KiB keys fill it.
const BUDGET: u64 = 16 << 20;
const KEY_BYTES: usize = 4_000;

/// The smallest budget, and keys long enough to fill it quickly.
fn small_budget_long_keys() -> Op {
    Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: KeyedConfigPatch {
            idempotency_key_bytes_max: Some(4_096),
            ..KeyedConfigPatch::default()
        },
        claims: ClaimConfigPatch::default(),
        budget: BudgetConfigPatch {
            memory_budget_bytes: Some(BUDGET),
            ..BudgetConfigPatch::default()
        },
    }
}

/// A new key (`n`, padded to [`KEY_BYTES`]) of `who` incrementing a counter.
fn keyed(who: &str, n: u64) -> Op {
    let mut key = format!("{n:08}").into_bytes();
    key.resize(KEY_BYTES, b'.');
    Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(key),
        command: Command::Increment {
            key: b"n".to_vec(),
            delta: 1,
        },
        principal: if who.is_empty() {
            Principal::anonymous()
        } else {
            Principal(who.to_owned())
        },
    }
}

fn raise(rules: RulesVersion) -> Op {
    Op::RaiseRules {
        cluster_id: CLUSTER,
        rules,
    }
}

fn exhausted(limit: Limit) -> Outcome {
    Outcome::Rejected(Rejection::ResourceExhausted(limit))
}

/// Applies new keys of `who` from `from` on, in batches, until one is
/// refused (every later one of its batch must be refused too); the
/// refusal and how many were accepted.
fn fill(driver: &mut Driver, who: &str, from: u64, bound: u64) -> (Outcome, u64) {
    const BATCH: u64 = 1_024;
    let mut next = from;
    while next < from + bound {
        let outcomes = driver.apply_batch((next..next + BATCH).map(|n| keyed(who, n)).collect());
        let accepted = outcomes
            .iter()
            .take_while(|outcome| {
                matches!(
                    outcome,
                    Outcome::Executed {
                        duplicate: false,
                        ..
                    }
                )
            })
            .count();
        if let Some(refusal) = outcomes.get(accepted) {
            assert!(
                outcomes[accepted..]
                    .iter()
                    .all(|outcome| outcome == refusal),
                "a key accepted after a refusal"
            );
            return (refusal.clone(), next - from + accepted as u64);
        }
        next += BATCH;
    }
    panic!("{bound} keys of {who} were all accepted");
}

/// A node of this build starts a cluster at the latest version, with that
/// version's limits; the plain bootstrap (what every cluster started
/// before versions existed has in its log) stays at version 1 with its
/// limits, so replaying an old log decides as it did.
#[test]
fn a_new_cluster_starts_at_the_latest_rules_and_an_old_log_stays_at_version_1() {
    let new = Driver::with_rules(RulesVersion::LATEST);
    assert_eq!(new.registry.rules(), RulesVersion::V4);
    assert_eq!(new.registry.keyed_config().idempotency_keys_max, 50_000_000);
    assert_eq!(
        new.registry.keyed_config().idempotency_cached_bytes_max,
        16 << 30
    );
    assert_eq!(new.registry.claim_config().claims_max, 50_000_000);
    assert_eq!(new.registry.claim_config().claim_cached_bytes_max, 16 << 30);
    // A cluster started at version 2 (by the build before 3) keeps the
    // claim limits it started with: every claim is in memory there.
    let two = Driver::with_rules(RulesVersion::V2);
    assert_eq!(two.registry.keyed_config().idempotency_keys_max, 50_000_000);
    assert_eq!(*two.registry.claim_config(), ClaimConfig::default());
    let old = Driver::new();
    assert_eq!(old.registry.rules(), RulesVersion::V1);
    assert_eq!(*old.registry.keyed_config(), KeyedConfig::default());
    assert_eq!(old.registry.keyed_config().idempotency_keys_max, 1_000_000);
    assert_eq!(*old.registry.claim_config(), ClaimConfig::default());
    // A version this build does not know is refused at bootstrap too.
    let mut unknown = Driver {
        registry: oncekv_core::Registry::new(),
        index: 0,
        now_ms: 1_000,
    };
    let outcome = unknown.apply(Op::BootstrapWithRules {
        cluster_id: CLUSTER,
        config: Default::default(),
        rules: RulesVersion(RulesVersion::HIGHEST_KNOWN.0 + 1),
    });
    assert!(
        matches!(
            outcome,
            Outcome::Rejected(Rejection::InvalidArgument(ref reason)) if reason.to_string().contains("unknown")
        ),
        "{outcome:?}"
    );
    assert_eq!(unknown.registry.cluster_id(), None);
}

/// Version 1 charges key records against the memory budget; raising the
/// version at an entry moves them off it from that entry on (the next key
/// is accepted where it was refused), and the records then stop at
/// `idempotency_cached_bytes_max` instead.
#[test]
fn from_version_2_key_records_count_against_their_own_limit_not_the_memory_budget() {
    let mut driver = Driver::new();
    driver.apply(small_budget_long_keys());
    let (refusal, accepted) = fill(&mut driver, "", 0, 10_000);
    assert_eq!(refusal, exhausted(Limit::MemoryBudget));
    assert!(driver.registry.memory_bytes() <= BUDGET);
    assert!(
        accepted > 3_000,
        "{accepted} keys of 4 KiB fill 16 MiB of budget"
    );
    let refused = keyed("", accepted);
    assert_eq!(
        driver.apply(refused.clone()),
        exhausted(Limit::MemoryBudget)
    );

    let outcome = driver.apply(raise(RulesVersion::V2));
    assert!(
        matches!(
            outcome,
            Outcome::AllConfigsSet {
                rules: RulesVersion::V2,
                ..
            }
        ),
        "{outcome:?}"
    );
    let data_only = driver.registry.memory_bytes();
    assert!(data_only < 1 << 10, "only the counter: {data_only} bytes");
    assert!(matches!(
        driver.apply(refused),
        Outcome::Executed {
            duplicate: false,
            ..
        }
    ));
    // Now the records' own byte limit refuses, whatever the budget.
    let cached_max = 2 * BUDGET;
    driver.apply(Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: KeyedConfigPatch {
            idempotency_cached_bytes_max: Some(cached_max),
            ..KeyedConfigPatch::default()
        },
        claims: ClaimConfigPatch::default(),
        budget: BudgetConfigPatch::default(),
    });
    let (refusal, more) = fill(&mut driver, "", accepted + 1, 20_000);
    assert_eq!(refusal, exhausted(Limit::IdempotencyCachedBytes));
    assert!(driver.registry.keyed_cached_bytes() <= cached_max);
    assert!(
        driver.registry.keyed_cached_bytes() + 5_000 > cached_max,
        "{more} more"
    );
    assert_eq!(driver.registry.memory_bytes(), data_only);
    // The data itself still counts against the budget: fill it with plain
    // puts, and a keyed put of new data is refused by it.
    let put = |key: String| Op::ExecutePlain {
        cluster_id: CLUSTER,
        command: Command::Put {
            key: key.into_bytes(),
            value: Value::Bytes(vec![0; 60 << 10]),
        },
    };
    let outcomes = driver.apply_batch((0..400).map(|n| put(format!("fill{n}"))).collect());
    assert_eq!(outcomes.last(), Some(&exhausted(Limit::MemoryBudget)));
    driver.apply(Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: KeyedConfigPatch {
            idempotency_cached_bytes_max: Some(4 * BUDGET),
            ..KeyedConfigPatch::default()
        },
        claims: ClaimConfigPatch::default(),
        budget: BudgetConfigPatch::default(),
    });
    let big = Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(b"big".to_vec()),
        command: Command::Put {
            key: b"big".to_vec(),
            value: Value::Bytes(vec![0; 60 << 10]),
        },
        principal: Principal::anonymous(),
    };
    assert_eq!(driver.apply(big), exhausted(Limit::MemoryBudget));
}

/// From version 2 one authenticated principal's key records may take only
/// its share of `idempotency_cached_bytes_max` (rule 21: no tenant takes
/// all): past it PRINCIPAL_QUOTA, while another principal still gets its
/// own share.
#[test]
fn from_version_2_a_principal_holds_its_share_of_the_records_bytes() {
    let mut driver = Driver::with_rules(RulesVersion::V2);
    let cached_max = 8 << 20;
    driver.apply(Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: KeyedConfigPatch {
            idempotency_key_bytes_max: Some(4_096),
            idempotency_cached_bytes_max: Some(cached_max),
            ..KeyedConfigPatch::default()
        },
        claims: ClaimConfigPatch::default(),
        budget: BudgetConfigPatch {
            principal_quota_percent: Some(40),
            ..BudgetConfigPatch::default()
        },
    });
    let (refusal, ann) = fill(&mut driver, "ann", 0, 10_000);
    assert_eq!(refusal, exhausted(Limit::PrincipalQuota));
    let share = cached_max * 40 / 100;
    let record = driver.registry.keyed_cached_bytes() / ann;
    assert!(ann * record <= share && (ann + 1) * record > share);
    let (refusal, bob) = fill(&mut driver, "bob", 0, 10_000);
    assert_eq!(refusal, exhausted(Limit::PrincipalQuota));
    assert_eq!(bob, ann, "bob gets his own share");
}

/// The version never goes down, an unknown one is refused, raising it to
/// the version in force changes nothing (a retry is harmless), and each
/// refusal leaves the state as it was.
#[test]
fn the_rules_version_only_goes_up_to_what_the_build_knows() {
    let mut driver = Driver::new();
    for (rules, why) in [
        (RulesVersion(RulesVersion::HIGHEST_KNOWN.0 + 1), "unknown"),
        (RulesVersion(0), "unknown"),
    ] {
        let outcome = driver.apply(raise(rules));
        assert!(
            matches!(&outcome, Outcome::Rejected(Rejection::InvalidArgument(reason)) if reason.to_string().contains(why)),
            "{outcome:?}"
        );
    }
    assert_eq!(driver.registry.rules(), RulesVersion::V1);
    assert!(matches!(
        driver.apply(raise(RulesVersion::V1)),
        Outcome::AllConfigsSet {
            rules: RulesVersion::V1,
            ..
        }
    ));
    assert!(matches!(
        driver.apply(raise(RulesVersion::V2)),
        Outcome::AllConfigsSet {
            rules: RulesVersion::V2,
            ..
        }
    ));
    assert!(matches!(
        driver.apply(raise(RulesVersion::V2)),
        Outcome::AllConfigsSet {
            rules: RulesVersion::V2,
            ..
        }
    ));
    let outcome = driver.apply(raise(RulesVersion::V1));
    assert!(
        matches!(&outcome, Outcome::Rejected(Rejection::InvalidArgument(reason)) if reason.to_string().contains("never goes down")),
        "{outcome:?}"
    );
    assert_eq!(driver.registry.rules(), RulesVersion::V2);
}

/// Rules 13 and 15: the version survives a snapshot (version 9 from rules
/// version 2; a state at version 1 is still written as version 8, byte for
/// byte what a build without versions writes), and two states that differ
/// only in their version hash apart.
#[test]
fn the_rules_version_survives_a_snapshot_and_is_in_the_state_hash() {
    let mut driver = Driver::new();
    driver.apply(keyed("", 1));
    let v1 = driver.registry.clone();
    let bytes = snapshot::to_bytes(&v1);
    assert_eq!(bytes[8..12], 8u32.to_le_bytes(), "version 1: format 8");
    assert_eq!(
        snapshot::from_bytes(&bytes).expect("reads").rules(),
        RulesVersion::V1
    );

    let mut raised = Driver::new();
    raised.apply(keyed("", 1));
    raised.apply(raise(RulesVersion::V2));
    let bytes = snapshot::to_bytes(&raised.registry);
    assert_eq!(bytes[8..12], 9u32.to_le_bytes(), "version 2: format 9");
    let restored = snapshot::from_bytes(&bytes).expect("reads");
    assert_eq!(restored.rules(), RulesVersion::V2);
    assert_eq!(
        snapshot::state_hash(&restored),
        snapshot::state_hash(&raised.registry)
    );
    // The same state but for the version (and the index of the raise).
    let mut same = Driver::new();
    same.apply(keyed("", 1));
    same.apply(raise(RulesVersion::V1));
    assert_eq!(
        same.registry.applied_index(),
        raised.registry.applied_index()
    );
    assert_ne!(
        snapshot::state_hash(&same.registry),
        snapshot::state_hash(&raised.registry)
    );
}

/// The key TTL patched to `ttl_ms`.
fn key_ttl(ttl_ms: u64) -> Op {
    Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: KeyedConfigPatch {
            idempotency_key_ttl_ms: Some(ttl_ms),
            ..KeyedConfigPatch::default()
        },
        claims: ClaimConfigPatch::default(),
        budget: BudgetConfigPatch::default(),
    }
}

/// Whether `outcome` executed a keyed request anew (not a replay).
fn executed_anew(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Executed {
            duplicate: false,
            ..
        }
    )
}

/// A new short key of the anonymous principal incrementing a counter.
fn short_key(n: u64) -> Op {
    Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(format!("key-{n}").into_bytes()),
        command: Command::Increment {
            key: b"n".to_vec(),
            delta: 1,
        },
        principal: Principal::anonymous(),
    }
}

/// From version 4 a TTL change ends the group open at it: a key made
/// after the 24 h TTL (minute-wide groups) is lowered to a second lives a
/// second, not until the end of the minute the change fell in. Version 3
/// keeps the old width for that group, as its logs decided; raising a
/// cluster to 4 changes nothing else.
#[test]
fn from_version_4_a_changed_ttl_ends_the_open_group() {
    for (rules, ended) in [(RulesVersion::V3, false), (RulesVersion::V4, true)] {
        let mut driver = Driver::with_rules(rules);
        assert!(executed_anew(&driver.apply(short_key(1))), "{rules}");
        driver.advance(1_000);
        assert!(matches!(
            driver.apply(key_ttl(1_000)),
            Outcome::AllConfigsSet { .. }
        ));
        driver.advance(1);
        assert!(executed_anew(&driver.apply(short_key(2))), "{rules}");
        // Within the new TTL it is a replay under every version.
        driver.advance(1_000);
        assert!(!executed_anew(&driver.apply(short_key(2))), "{rules}");
        driver.advance(1);
        assert_eq!(
            executed_anew(&driver.apply(short_key(2))),
            ended,
            "rules {rules}: a key made after the TTL change lives the new TTL only from version 4"
        );
        let mut raised = Driver::with_rules(rules);
        raised.apply(raise(RulesVersion::V4));
        assert_eq!(raised.registry.rules(), RulesVersion::V4);
    }
}

/// A claim of `name` by `claim_id`, with a minute's lease.
fn claim(name: &str, claim_id: u128) -> Op {
    Op::Claim(Claim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: IdempotencyKey(name.as_bytes().to_vec()),
        fingerprint: claim_fingerprint(b"the effect"),
        lease_ms: 60_000,
        claim_id: Nonce(claim_id),
    })
}

fn complete(name: &str, fence: u64) -> Op {
    Op::CompleteClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: IdempotencyKey(name.as_bytes().to_vec()),
        fence,
        result: b"done".to_vec(),
    }
}

/// Claims `name` (it must win) and completes it.
fn claim_and_complete(driver: &mut Driver, name: &str, claim_id: u128) {
    let Outcome::Claimed(ClaimAnswer::Won { fence, .. }) = driver.apply(claim(name, claim_id))
    else {
        panic!("the claim of {name} wins");
    };
    let done = driver.apply(complete(name, fence));
    assert!(matches!(done, Outcome::ClaimCompleted { .. }), "{done:?}");
}

/// The same for finished claims and the claim TTL: a claim completed
/// after the 24 h claim TTL is lowered to a second is forgotten a second
/// later from version 4 (the key may be claimed anew), and replayed until
/// the minute the change fell in ends under version 3.
#[test]
fn from_version_4_a_changed_claim_ttl_ends_the_open_group() {
    for (rules, ended) in [(RulesVersion::V3, false), (RulesVersion::V4, true)] {
        let mut driver = Driver::with_rules(rules);
        // A claim finished before the change opens a minute-wide group.
        claim_and_complete(&mut driver, "before", 1);
        driver.advance(1_000);
        let lowered = driver.apply(Op::PatchAllConfigs {
            cluster_id: CLUSTER,
            patch: ConfigPatch::default(),
            keyed: KeyedConfigPatch::default(),
            claims: ClaimConfigPatch {
                claim_ttl_ms: Some(1_000),
                ..ClaimConfigPatch::default()
            },
            budget: BudgetConfigPatch::default(),
        });
        assert!(
            matches!(lowered, Outcome::AllConfigsSet { .. }),
            "{lowered:?}"
        );
        driver.advance(1);
        claim_and_complete(&mut driver, "after", 2);
        driver.advance(1_000);
        let replay = driver.apply(claim("after", 3));
        assert!(
            matches!(replay, Outcome::Claimed(ClaimAnswer::Completed { .. })),
            "{replay:?}"
        );
        driver.advance(1);
        let again = driver.apply(claim("after", 4));
        assert_eq!(
            matches!(again, Outcome::Claimed(ClaimAnswer::Won { .. })),
            ended,
            "rules {rules}: {again:?}"
        );
    }
}
