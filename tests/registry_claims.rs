//! Claims in the registry core (docs/rules.md, rule 20): one or more tests
//! per property, each written so that breaking it fails the test, and a
//! property test that checks the promises a downstream relies on (one live
//! lease per key, fences that only grow, a completion replayed forever)
//! over random histories, with snapshot round trips.

mod support;

use oncekv_core::fingerprint::claim_fingerprint;
use oncekv_core::snapshot;
use oncekv_core::{
    Claim, ClaimAnswer, ClaimConfig, ClaimConfigPatch, ClaimState, ConfigPatch, IdempotencyKey,
    InvalidArgument, KeyedConfigPatch, Limit, LimitExceeded, Nonce, Op, Outcome, Principal,
    Rejection, RulesVersion,
};
use proptest::prelude::*;
use support::registry::{CLUSTER, Driver};

const LEASE_MS: u64 = 1_000;

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey(name.as_bytes().to_vec())
}

fn claim_as(principal: &str, name: &str, effect: &str, lease_ms: u64, claim_id: u128) -> Op {
    Op::Claim(Claim {
        cluster_id: CLUSTER,
        principal: Principal(principal.to_owned()),
        key: key(name),
        fingerprint: claim_fingerprint(effect.as_bytes()),
        lease_ms,
        claim_id: Nonce(claim_id),
    })
}

fn claim(name: &str, effect: &str, claim_id: u128) -> Op {
    claim_as("", name, effect, LEASE_MS, claim_id)
}

fn complete(name: &str, fence: u64, result: &[u8]) -> Op {
    Op::CompleteClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(name),
        fence,
        result: result.to_vec(),
    }
}

fn release(name: &str, fence: u64) -> Op {
    Op::ReleaseClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(name),
        fence,
    }
}

fn extend(name: &str, fence: u64, lease_ms: u64) -> Op {
    Op::ExtendClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(name),
        fence,
        lease_ms,
    }
}

fn patch_claims(patch: ClaimConfigPatch) -> Op {
    Op::PatchAllConfigs {
        cluster_id: CLUSTER,
        patch: ConfigPatch::default(),
        keyed: KeyedConfigPatch::default(),
        claims: patch,
        budget: oncekv_core::BudgetConfigPatch::default(),
    }
}

/// The (fence, attempt, lease left) of a won claim; panics on anything else.
fn won(outcome: Outcome) -> (u64, u64, u64, bool) {
    match outcome {
        Outcome::Claimed(ClaimAnswer::Won {
            fence,
            attempt,
            lease_deadline_ms,
            cluster_time_ms,
            duplicate,
        }) => (
            fence,
            attempt,
            lease_deadline_ms - cluster_time_ms,
            duplicate,
        ),
        other => panic!("expected a win, got {other:?}"),
    }
}

/// Rule 20: the first claim of a key wins a fence (at least its log index)
/// as attempt 1; a concurrent claim of another caller is in progress and
/// told how much of the lease is left.
#[test]
fn rule20_first_claim_wins_and_others_are_in_progress() {
    let mut driver = Driver::new();
    let (fence, attempt, left, duplicate) = won(driver.apply(claim("job", "run", 1)));
    assert!(fence >= driver.index, "the fence is at least the log index");
    assert_eq!((attempt, left, duplicate), (1, LEASE_MS, false));
    driver.advance(300);
    assert_eq!(
        driver.apply(claim("job", "run", 2)),
        Outcome::Claimed(ClaimAnswer::InProgress {
            retry_after_ms: 700,
            attempt: 1
        })
    );
}

/// Rule 3's one shortcut for claims: a completed record's answer, read
/// without a log entry, exists only where the log would give that very
/// answer and change nothing; another fingerprint (KEY_CONFLICT), a lease
/// or key the log refuses, another principal's or another cluster's
/// request, and a held or released record all go through the log.
#[test]
fn rule3_a_completed_claim_may_be_answered_without_the_log() {
    let request = |op: Op| match op {
        Op::Claim(claim) => claim,
        other => panic!("not a claim: {other:?}"),
    };
    let mut driver = Driver::new();
    let (fence, ..) = won(driver.apply(claim("paid", "charge 10", 1)));
    assert_eq!(
        driver
            .registry
            .completed_claim_answer(&request(claim("paid", "charge 10", 2))),
        None,
        "held"
    );
    driver.apply(complete("paid", fence, b"receipt"));
    let again = request(claim("paid", "charge 10", 2));
    let shortcut = driver.registry.completed_claim_answer(&again);
    assert!(matches!(
        &shortcut,
        Some(ClaimAnswer::Completed { result, fence: f, attempt: 1, .. })
            if result == b"receipt" && *f == fence
    ));
    let before = driver.registry.clone();
    assert_eq!(
        driver.apply(Op::Claim(again)),
        Outcome::Claimed(shortcut.unwrap())
    );
    assert_eq!(driver.registry.claim_count(), before.claim_count());
    for refused in [
        claim("paid", "charge 20", 3),
        claim_as("", "paid", "charge 10", 0, 3),
        claim_as("", "paid", "charge 10", u64::MAX, 3),
        claim_as("other", "paid", "charge 10", LEASE_MS, 3),
    ] {
        let refused = request(refused);
        assert_eq!(driver.registry.completed_claim_answer(&refused), None);
        assert!(!matches!(
            driver.apply(Op::Claim(refused)),
            Outcome::Claimed(ClaimAnswer::Completed { .. })
        ));
    }
    let mut elsewhere = request(claim("paid", "charge 10", 3));
    elsewhere.cluster_id = oncekv_core::ClusterId(CLUSTER.0 + 1);
    assert_eq!(driver.registry.completed_claim_answer(&elsewhere), None);
    let (fence, ..) = won(driver.apply(claim("gone", "mail", 4)));
    driver.apply(release("gone", fence));
    assert_eq!(
        driver
            .registry
            .completed_claim_answer(&request(claim("gone", "mail", 5))),
        None,
        "released"
    );
}

/// Rule 20: a claim retried after a lost reply (same claim id) gets its own
/// win back, same fence and deadline, marked duplicate — never "in
/// progress" against itself.
#[test]
fn rule20_a_retried_claim_gets_its_own_win() {
    let mut driver = Driver::new();
    let (fence, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    driver.advance(400);
    let (again, attempt, left, duplicate) = won(driver.apply(claim("job", "run", 1)));
    assert_eq!((again, attempt, left, duplicate), (fence, 1, 600, true));
}

/// Rule 20: a completed key replays its result byte for byte to every later
/// claim, whatever its claim id; a retried complete of the same fence is
/// answered from the record; no new fence is issued for it.
#[test]
fn rule20_completion_is_replayed_and_complete_is_idempotent() {
    let mut driver = Driver::new();
    let (fence, _, _, _) = won(driver.apply(claim("pay", "charge 10", 1)));
    driver.advance(10);
    let completed_ms = driver.now_ms;
    assert_eq!(
        driver.apply(complete("pay", fence, b"receipt-7")),
        Outcome::ClaimCompleted {
            fence,
            completed_ms,
            duplicate: false
        }
    );
    driver.advance(10);
    assert_eq!(
        driver.apply(complete("pay", fence, b"receipt-7")),
        Outcome::ClaimCompleted {
            fence,
            completed_ms,
            duplicate: true
        }
    );
    for claim_id in [1, 2, 3] {
        driver.advance(5_000);
        assert_eq!(
            driver.apply(claim("pay", "charge 10", claim_id)),
            Outcome::Claimed(ClaimAnswer::Completed {
                result: b"receipt-7".to_vec(),
                completed_ms,
                fence,
                attempt: 1
            })
        );
    }
    assert_eq!(driver.registry.last_fence(), fence, "no new fence issued");
}

/// Rule 20: a lease that runs out in cluster time lets the next claim take
/// over with a larger fence and the attempt count; from then on the old
/// holder's complete, extend and release are FENCED and change nothing.
#[test]
fn rule20_takeover_fences_the_old_holder() {
    let mut driver = Driver::new();
    let (old, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    driver.advance(LEASE_MS);
    let (new, attempt, _, _) = won(driver.apply(claim("job", "run", 2)));
    assert!(new > old);
    assert_eq!(attempt, 2);
    let fenced = Outcome::Rejected(Rejection::Fenced { fence: new });
    assert_eq!(driver.apply(complete("job", old, b"late")), fenced);
    assert_eq!(driver.apply(extend("job", old, LEASE_MS)), fenced);
    assert_eq!(driver.apply(release("job", old)), fenced);
    // The old holder's claim id is no longer the holder: claiming again is
    // in progress behind the new holder, not a win.
    assert!(matches!(
        driver.apply(claim("job", "run", 1)),
        Outcome::Claimed(ClaimAnswer::InProgress { .. })
    ));
    driver.apply(complete("job", new, b"done"));
    match driver.apply(claim("job", "run", 3)) {
        Outcome::Claimed(ClaimAnswer::Completed { result, fence, .. }) => {
            assert_eq!((result.as_slice(), fence), (b"done".as_slice(), new))
        }
        other => panic!("{other:?}"),
    }
}

/// Rule 20 with rule 11: leases count in cluster time only — an entry
/// stamped earlier than the cluster time (a leader whose clock is behind)
/// does not move time back, and a lease is not over until an entry stamped
/// at or past its deadline applies.
#[test]
fn rule20_leases_count_in_cluster_time() {
    let mut driver = Driver::new();
    won(driver.apply(claim("job", "run", 1)));
    driver.advance(LEASE_MS - 1);
    assert!(matches!(
        driver.apply(claim("job", "run", 2)),
        Outcome::Claimed(ClaimAnswer::InProgress {
            retry_after_ms: 1,
            ..
        })
    ));
    driver.now_ms -= 500;
    assert!(matches!(
        driver.apply(claim("job", "run", 2)),
        Outcome::Claimed(ClaimAnswer::InProgress {
            retry_after_ms: 1,
            ..
        })
    ));
    driver.now_ms += 501;
    assert_eq!(won(driver.apply(claim("job", "run", 2))).1, 2);
}

/// Rule 20: a release says the effect did not happen: the next claim wins
/// at once with a larger fence; a retried release is answered from the
/// record; a released holder can no longer complete.
#[test]
fn rule20_release_lets_the_next_claim_win_at_once() {
    let mut driver = Driver::new();
    let (first, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    assert_eq!(
        driver.apply(release("job", first)),
        Outcome::ClaimReleased { duplicate: false }
    );
    assert_eq!(
        driver.apply(release("job", first)),
        Outcome::ClaimReleased { duplicate: true }
    );
    assert_eq!(
        driver.apply(complete("job", first, b"x")),
        Outcome::Rejected(Rejection::Fenced { fence: first })
    );
    let (second, attempt, _, _) = won(driver.apply(claim("job", "run", 2)));
    assert!(second > first);
    assert_eq!(attempt, 2);
}

/// Rule 20: fences strictly grow per key even inside one entry (claim,
/// release, claim in one batch) and across a forgotten record.
#[test]
fn rule20_fences_only_grow() {
    let mut driver = Driver::new();
    let first = driver.index + 1;
    let outcomes = driver.apply_batch(vec![
        claim("job", "run", 1),
        release("job", first),
        claim("job", "run", 2),
    ]);
    let (a, _, _, _) = won(outcomes[0].clone());
    let (b, _, _, _) = won(outcomes[2].clone());
    assert_eq!(a, first);
    assert!(b > a, "{b} > {a}");
    driver.apply(Op::ForgetClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key("job"),
    });
    let (c, attempt, _, _) = won(driver.apply(claim("job", "run", 3)));
    assert!(c > b);
    assert_eq!(attempt, 1, "a forgotten key starts over");
}

/// Rule 20: another fingerprint on a claimed key is KEY_CONFLICT, whatever
/// the record's state, and leaves the record untouched.
#[test]
fn rule20_another_fingerprint_is_a_conflict() {
    let mut driver = Driver::new();
    let (fence, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    let before = driver
        .registry
        .claim_record(&Principal::anonymous(), &key("job"));
    assert_eq!(
        driver.apply(claim("job", "other", 1)),
        Outcome::Rejected(Rejection::KeyConflict)
    );
    assert_eq!(
        driver
            .registry
            .claim_record(&Principal::anonymous(), &key("job")),
        before
    );
    driver.apply(complete("job", fence, b"ok"));
    assert_eq!(
        driver.apply(claim("job", "other", 2)),
        Outcome::Rejected(Rejection::KeyConflict)
    );
}

/// Rules 19 and 20: principals own their claims: another principal's key
/// of the same name is another claim.
#[test]
fn rule20_claims_belong_to_their_principal() {
    let mut driver = Driver::new();
    won(driver.apply(claim_as("alice", "job", "run", LEASE_MS, 1)));
    let (_, attempt, _, _) = won(driver.apply(claim_as("bob", "job", "other", LEASE_MS, 2)));
    assert_eq!(attempt, 1);
    assert_eq!(driver.registry.claim_count(), 2);
}

/// Rule 20: an extend moves the lease to `lease_ms` after now, never
/// earlier than it was; a lease extended in time is not taken over.
#[test]
fn rule20_extend_keeps_the_lease() {
    let mut driver = Driver::new();
    let (fence, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    let start = driver.now_ms;
    driver.advance(800);
    assert_eq!(
        driver.apply(extend("job", fence, 1_000)),
        Outcome::ClaimExtended {
            lease_deadline_ms: start + 1_800,
            cluster_time_ms: start + 800
        }
    );
    assert_eq!(
        driver.apply(extend("job", fence, 100)),
        Outcome::ClaimExtended {
            lease_deadline_ms: start + 1_800,
            cluster_time_ms: start + 800
        },
        "never earlier"
    );
    driver.advance(900);
    assert!(matches!(
        driver.apply(claim("job", "run", 2)),
        Outcome::Claimed(ClaimAnswer::InProgress {
            retry_after_ms: 100,
            ..
        })
    ));
}

/// Rule 20 with rule 12: malformed claims are refused before anything is
/// recorded: an empty key, a key, a result or a lease beyond its limit.
#[test]
fn rule20_malformed_requests_are_refused_without_a_record() {
    let mut driver = Driver::new();
    assert_eq!(
        driver.apply(claim("", "run", 1)),
        Outcome::Rejected(Rejection::InvalidArgument(InvalidArgument::EmptyClaimKey))
    );
    let long = "k".repeat(257);
    assert_eq!(
        driver.apply(claim(&long, "run", 1)),
        Outcome::Rejected(Rejection::LimitExceeded {
            exceeded: LimitExceeded {
                limit: Limit::ClaimKeyBytes,
                max: 256,
                requested: 257
            },
            duplicate: false
        })
    );
    for lease_ms in [0, ClaimConfig::default().lease_ms_max + 1] {
        assert!(matches!(
            driver.apply(claim_as("", "job", "run", lease_ms, 1)),
            Outcome::Rejected(Rejection::InvalidArgument(
                InvalidArgument::LeaseOutOfBounds { .. }
            ))
        ));
    }
    assert_eq!(driver.registry.claim_count(), 0);
    let (fence, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    let big = vec![0u8; (64 << 10) + 1];
    assert!(matches!(
        driver.apply(complete("job", fence, &big)),
        Outcome::Rejected(Rejection::LimitExceeded { .. })
    ));
    assert!(
        matches!(
            driver
                .registry
                .claim_record(&Principal::anonymous(), &key("job"))
                .unwrap()
                .record
                .state,
            ClaimState::Held { .. }
        ),
        "a refused complete leaves the key held"
    );
}

/// Rule 20 with rule 12: at `claims_max` a new key is RESOURCE_EXHAUSTED
/// (this attempt) and nothing is evicted; a live key still answers.
#[test]
fn rule20_capacity_refuses_and_never_evicts() {
    let mut driver = Driver::new();
    driver.apply(patch_claims(ClaimConfigPatch {
        claims_max: Some(2),
        ..ClaimConfigPatch::default()
    }));
    won(driver.apply(claim("a", "run", 1)));
    won(driver.apply(claim("b", "run", 2)));
    assert_eq!(
        driver.apply(claim("c", "run", 3)),
        Outcome::Rejected(Rejection::ResourceExhausted(Limit::Claims))
    );
    assert_eq!(driver.registry.claim_count(), 2);
    assert!(matches!(
        driver.apply(claim("a", "run", 1)),
        Outcome::Claimed(ClaimAnswer::Won {
            duplicate: true,
            ..
        })
    ));
}

/// Rule 20: records expire deterministically `claim_ttl_ms` after their
/// completion (a held one after its lease deadline); then the key may be
/// claimed anew, with a fence larger than any issued before.
#[test]
fn rule20_records_expire_after_their_ttl() {
    let mut driver = Driver::new();
    driver.apply(patch_claims(ClaimConfigPatch {
        claim_ttl_ms: Some(10_000),
        ..ClaimConfigPatch::default()
    }));
    let (done, _, _, _) = won(driver.apply(claim("done", "run", 1)));
    driver.apply(complete("done", done, b"r"));
    let (_, _, _, _) = won(driver.apply(claim("dead", "run", 2)));
    driver.advance(10_000);
    driver.apply(claim("other", "run", 3));
    assert_eq!(driver.registry.claim_count(), 3, "exactly the TTL: kept");
    driver.advance(1);
    driver.apply(claim("other", "run", 3));
    assert!(
        driver
            .registry
            .claim_record(&Principal::anonymous(), &key("done"))
            .is_none()
    );
    assert!(
        driver
            .registry
            .claim_record(&Principal::anonymous(), &key("dead"))
            .is_some(),
        "a held record lives a TTL after its lease deadline"
    );
    driver.advance(LEASE_MS);
    driver.apply(claim("other", "run", 3));
    assert_eq!(driver.registry.claim_count(), 1);
    let (again, attempt, _, _) = won(driver.apply(claim("done", "run", 4)));
    assert!(again > done);
    assert_eq!(attempt, 1);
}

/// Rule 13: a snapshot carries every claim record, the claim config and
/// the last fence; the restored registry hashes and behaves the same.
#[test]
fn rule13_snapshots_carry_claims() {
    let mut driver = Driver::new();
    driver.apply(patch_claims(ClaimConfigPatch {
        lease_ms_max: Some(5_000),
        ..ClaimConfigPatch::default()
    }));
    let (a, _, _, _) = won(driver.apply(claim("a", "run", 1)));
    driver.apply(complete("a", a, b"result"));
    won(driver.apply(claim("b", "run", 2)));
    let (c, _, _, _) = won(driver.apply(claim("c", "run", 3)));
    driver.apply(release("c", c));
    let bytes = snapshot::to_bytes(&driver.registry);
    let restored = snapshot::from_bytes(&bytes).expect("reads back");
    assert_eq!(restored, driver.registry);
    assert_eq!(
        snapshot::state_hash(&restored),
        snapshot::state_hash(&driver.registry)
    );
    assert_eq!(restored.last_fence(), driver.registry.last_fence());
    assert_eq!(restored.claim_config().lease_ms_max, 5_000);
    // The hash covers claims: a registry without the release differs.
    let mut other = Driver::new();
    other.apply(patch_claims(ClaimConfigPatch {
        lease_ms_max: Some(5_000),
        ..ClaimConfigPatch::default()
    }));
    assert_ne!(
        snapshot::state_hash(&other.registry),
        snapshot::state_hash(&driver.registry)
    );
}

/// A step of the property test: one request against a few keys, holders
/// and results, or time passing.
#[derive(Clone, Debug)]
enum Step {
    Claim { key: u8, holder: u8 },
    Complete { key: u8, holder: u8 },
    Release { key: u8, holder: u8 },
    Extend { key: u8, holder: u8 },
    Advance(u64),
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..3, 0u8..4).prop_map(|(key, holder)| Step::Claim { key, holder }),
        2 => (0u8..3, 0u8..4).prop_map(|(key, holder)| Step::Complete { key, holder }),
        1 => (0u8..3, 0u8..4).prop_map(|(key, holder)| Step::Release { key, holder }),
        1 => (0u8..3, 0u8..4).prop_map(|(key, holder)| Step::Extend { key, holder }),
        3 => (0u64..1_500).prop_map(Step::Advance),
        1 => Just(Step::Snapshot),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Over random histories of four holders on three keys: no claim wins
    /// while another holder's lease is live; every fence issued for a key
    /// is larger than the last; a holder's complete is accepted only with
    /// the key's latest fence; once a complete is accepted, every later
    /// claim replays its result; and a snapshot round trip at any point
    /// gives an equal registry with an equal hash.
    #[test]
    fn claims_keep_their_promises(steps in proptest::collection::vec(step(), 1..80)) {
        // At version 1 (every claim in memory, exact expiry) and at the
        // latest (finished claims in creation-time groups).
        for rules in [RulesVersion::V1, RulesVersion::LATEST] {
            let mut driver = match rules {
                RulesVersion::V1 => Driver::new(),
                rules => Driver::with_rules(rules),
            };
            driver.apply(patch_claims(ClaimConfigPatch {
                claim_ttl_ms: Some(1_000_000),
                ..ClaimConfigPatch::default()
            }));
            // Per key: the latest fence issued, its holder and lease deadline,
            // and the completed result.
            let mut latest: [Option<(u64, u8, u64)>; 3] = [None; 3];
            let mut done: [Option<Vec<u8>>; 3] = [None, None, None];
            // Per (key, holder): the fence that holder last won.
            let mut holding = std::collections::BTreeMap::<(u8, u8), u64>::new();
            for step in steps.clone() {
                match step {
                    Step::Claim { key: k, holder } => {
                        let name = format!("k{k}");
                        let now = driver.now_ms;
                        let op = claim(&name, "run", u128::from(holder) + 1);
                        // The shortcut a leader may take (rule 3) answers
                        // exactly what the log would, and only for a
                        // completed record.
                        let Op::Claim(request) = &op else { unreachable!() };
                        let shortcut = driver.registry.completed_claim_answer(request);
                        let outcome = driver.apply(op);
                        match &shortcut {
                            Some(answer) => prop_assert_eq!(&outcome, &Outcome::Claimed(answer.clone())),
                            None => prop_assert!(
                                !matches!(outcome, Outcome::Claimed(ClaimAnswer::Completed { .. })),
                                "the log replayed a completion the shortcut did not see"
                            ),
                        }
                        match outcome {
                            Outcome::Claimed(ClaimAnswer::Won { fence, lease_deadline_ms, duplicate, .. }) => {
                                prop_assert!(done[k as usize].is_none(), "won a completed key");
                                match latest[k as usize] {
                                    Some((last, last_holder, deadline)) if duplicate => {
                                        prop_assert_eq!((fence, holder), (last, last_holder));
                                        prop_assert_eq!(lease_deadline_ms, deadline);
                                    }
                                    Some((last, last_holder, deadline)) => {
                                        prop_assert!(fence > last);
                                        prop_assert!(
                                            last_holder == holder || deadline <= now
                                                || !holding.contains_key(&(k, last_holder)),
                                            "won while another lease was live"
                                        );
                                    }
                                    None => prop_assert!(!duplicate),
                                }
                                latest[k as usize] = Some((fence, holder, lease_deadline_ms));
                                holding.insert((k, holder), fence);
                            }
                            Outcome::Claimed(ClaimAnswer::Completed { result, .. }) => {
                                prop_assert_eq!(Some(result), done[k as usize].clone());
                            }
                            Outcome::Claimed(ClaimAnswer::InProgress { retry_after_ms, .. }) => {
                                let (_, last_holder, deadline) = latest[k as usize].expect("held");
                                prop_assert!(last_holder != holder);
                                prop_assert_eq!(retry_after_ms, deadline - now);
                            }
                            other => prop_assert!(false, "claim answered {:?}", other),
                        }
                    }
                    Step::Complete { key: k, holder } => {
                        let Some(&fence) = holding.get(&(k, holder)) else { continue };
                        let result = format!("by {holder} with {fence}").into_bytes();
                        let outcome = driver.apply(complete(&format!("k{k}"), fence, &result));
                        let current = latest[k as usize].map(|(fence, _, _)| fence);
                        match outcome {
                            Outcome::ClaimCompleted { duplicate: false, .. } => {
                                prop_assert_eq!(current, Some(fence), "a stale fence completed");
                                prop_assert!(done[k as usize].is_none());
                                done[k as usize] = Some(result);
                            }
                            Outcome::ClaimCompleted { duplicate: true, .. } => {
                                prop_assert_eq!(current, Some(fence));
                                prop_assert_eq!(done[k as usize].clone(), Some(result));
                            }
                            Outcome::Rejected(Rejection::Fenced { .. }) => {
                                prop_assert!(current != Some(fence) || done[k as usize].is_none());
                            }
                            other => prop_assert!(false, "complete answered {:?}", other),
                        }
                    }
                    Step::Release { key: k, holder } => {
                        let Some(&fence) = holding.get(&(k, holder)) else { continue };
                        if let Outcome::ClaimReleased { .. } = driver.apply(release(&format!("k{k}"), fence)) {
                            prop_assert_eq!(latest[k as usize].map(|(fence, _, _)| fence), Some(fence));
                            holding.remove(&(k, holder));
                        }
                    }
                    Step::Extend { key: k, holder } => {
                        let Some(&fence) = holding.get(&(k, holder)) else { continue };
                        if let Outcome::ClaimExtended { lease_deadline_ms, .. } =
                            driver.apply(extend(&format!("k{k}"), fence, LEASE_MS))
                        {
                            let entry = latest[k as usize].as_mut().expect("held");
                            prop_assert_eq!(entry.0, fence);
                            prop_assert!(lease_deadline_ms >= entry.2);
                            entry.2 = lease_deadline_ms;
                        }
                    }
                    Step::Advance(ms) => driver.advance(ms),
                    Step::Snapshot => {
                        let restored = snapshot::from_bytes(&snapshot::to_bytes(&driver.registry))
                            .expect("reads back");
                        prop_assert_eq!(snapshot::state_hash(&restored), snapshot::state_hash(&driver.registry));
                        prop_assert_eq!(&restored, &driver.registry);
                        driver.registry = restored;
                    }
                }
            }
        }
    }
}
