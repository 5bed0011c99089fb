//! Claims in the registry core (docs/rules.md, rule 20): one or more tests
//! per property, each written so that breaking it fails the test, and a
//! property test that checks the promises a downstream relies on (one live
//! lease per key, fences that only grow, a completion replayed forever)
//! over random histories, with snapshot round trips.
//!
//! Every test runs in three [`Variant`]s: at rules version 1 (every claim
//! in memory, exact expiry); at the latest rules (version 3: finished
//! claims in creation-time groups, held by the registry); and at the latest
//! rules with an adapter's store beside the registry ([`Harness`]: after
//! every entry the finished claims' changes go into a map, and the registry
//! reads them back from there, as `claims_to_fetch` names them, so no
//! finished record is left in memory between entries and every one an
//! entry reads that an earlier entry finished comes from outside; snapshots
//! are built and installed as a node does, the part then the stored
//! records). A rule test is a fn taking the variant, run once per variant
//! by `in_every_variant!` (tests named `<rule test>::at_v1`,
//! `::at_latest`, `::at_latest_with_a_store`); the property test loops over
//! the variants. Where version 3 documents other behaviour — a finished
//! claim expires with its whole group, at least its TTL and less than its
//! TTL plus one group's width after it finished; snapshots in format 10
//! stream the finished claims after the part — that is what its variants
//! assert.

mod support;

use oncekv_core::fingerprint::claim_fingerprint;
use oncekv_core::snapshot::{self, Part, Streamed};
use oncekv_core::{
    Claim, ClaimAnswer, ClaimConfigPatch, ClaimRecord, ClaimState, ClaimView, ConfigPatch, Entry,
    GroupedRecord, IdempotencyKey, InvalidArgument, KeyId, KeyedConfigPatch, Limit, LimitExceeded,
    Nonce, Op, Outcome, Prefetched, Principal, Rejection, RulesVersion, key_group_width_ms,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use support::registry::{CLUSTER, Driver, one};

const LEASE_MS: u64 = 1_000;

/// The rules and the place of the finished claims a test runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// Rules version 1: every claim in memory, expiring exactly.
    V1,
    /// [`RulesVersion::LATEST`] (version 3): finished claims in
    /// creation-time groups, all held by the registry.
    Latest,
    /// The latest rules, the finished claims in an adapter's store.
    LatestWithStore,
}

const VARIANTS: [Variant; 3] = [Variant::V1, Variant::Latest, Variant::LatestWithStore];

impl Variant {
    /// Whether finished claims lie in groups (and expire a group at once).
    fn grouped(self) -> bool {
        self != Variant::V1
    }
}

/// Runs each named test body (a fn taking the [`Variant`]) once per
/// variant: a module of the body's name with one test per variant.
macro_rules! in_every_variant {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::Variant;

            #[test]
            fn at_v1() {
                super::$name(Variant::V1)
            }

            #[test]
            fn at_latest() {
                super::$name(Variant::Latest)
            }

            #[test]
            fn at_latest_with_a_store() {
                super::$name(Variant::LatestWithStore)
            }
        }
    )*};
}

/// An adapter's store of finished claims: the record last written under
/// each id, in (principal, key) order.
type Store = BTreeMap<KeyId, GroupedRecord<ClaimRecord>>;

/// The [`Driver`] of a variant. With a store (`LatestWithStore`) it plays
/// the node's state machine: before each entry it reads from the store what
/// `claims_to_fetch` names and applies with it; after, it writes the
/// changes the registry hands over into the store (a first take replaces
/// it) and checks no finished record is left in memory. It never deletes
/// records of expired groups from the store: the registry must take them
/// as absent wherever they lie.
struct Harness {
    driver: Driver,
    variant: Variant,
    store: Option<Store>,
    /// Fetches the store answered with a record.
    read_from_store: u64,
}

impl Deref for Harness {
    type Target = Driver;

    fn deref(&self) -> &Driver {
        &self.driver
    }
}

impl DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Driver {
        &mut self.driver
    }
}

impl Harness {
    fn new(variant: Variant) -> Harness {
        let driver = match variant {
            Variant::V1 => Driver::new(),
            Variant::Latest | Variant::LatestWithStore => {
                let driver = Driver::with_rules(RulesVersion::LATEST);
                assert!(driver.registry.rules().finished_claims_grouped());
                driver
            }
        };
        let mut harness = Harness {
            driver,
            variant,
            store: (variant == Variant::LatestWithStore).then(Store::new),
            read_from_store: 0,
        };
        harness.flush();
        harness
    }

    fn apply(&mut self, op: Op) -> Outcome {
        one(self.apply_batch(vec![op]))
    }

    /// Applies one entry carrying `ops` as a batch; one outcome per op.
    fn apply_batch(&mut self, ops: Vec<Op>) -> Vec<Outcome> {
        let Some(store) = &self.store else {
            return self.driver.apply_batch(ops);
        };
        let entry = Entry {
            stamp_ms: self.driver.now_ms,
            ops: ops.into(),
        };
        let registry = &mut self.driver.registry;
        assert!(
            registry.keys_to_fetch(&entry).is_empty(),
            "no keyed requests"
        );
        let mut fetched = Prefetched::none();
        for id in registry.claims_to_fetch(&entry) {
            let stored = store.get(&id).cloned();
            self.read_from_store += u64::from(stored.is_some());
            fetched.insert_claim(id, stored);
        }
        self.driver.index += 1;
        let outcomes = registry.apply_prefetched(self.driver.index, &entry, &fetched);
        if let Err(broken) = registry.check_invariants() {
            panic!(
                "invariant broken after entry {}: {broken}",
                self.driver.index
            );
        }
        self.flush();
        outcomes
    }

    /// The adapter's build: the registry's changes into the store.
    fn flush(&mut self) {
        let Some(store) = &mut self.store else {
            return;
        };
        let changes = self.driver.registry.take_record_changes();
        assert!(changes.keys.records.is_empty(), "no idempotency keys here");
        let claims = changes
            .claims
            .expect("the latest rules hand finished claims over");
        if claims.complete {
            store.clear();
        }
        for (id, change) in claims.records {
            match change {
                Some(stored) => store.insert(id, stored),
                None => store.remove(&id),
            };
        }
        assert_eq!(
            self.driver.registry.claim_records_held(),
            0,
            "every finished claim lies in the store"
        );
    }

    fn patch(&mut self, patch: ClaimConfigPatch) {
        let outcome = self.apply(patch_claims(patch));
        assert!(
            matches!(outcome, Outcome::AllConfigsSet { .. }),
            "{outcome:?}"
        );
    }

    /// The live record of the anonymous principal's `name`, wherever it
    /// lies.
    fn view(&self, name: &str) -> Option<ClaimView> {
        let (principal, key) = (Principal::anonymous(), key(name));
        match &self.store {
            None => self.registry.claim_record(&principal, &key),
            Some(store) => {
                let stored = store.get(&(principal.clone(), key.clone())).cloned();
                self.registry.claim_over(&principal, &key, stored)
            }
        }
    }

    /// The shortcut's answer (rule 3) to a claim the next entry would
    /// carry (stamped `now_ms`), reading the store if it must.
    fn completed_answer(&self, claim: &Claim) -> Option<ClaimAnswer> {
        let now_ms = self.driver.now_ms;
        match &self.store {
            None => self.registry.completed_claim_answer(claim, now_ms),
            Some(store) => self
                .registry
                .completed_claim_answer_with(claim, now_ms, |id| store.get(id).cloned()),
        }
    }

    /// With a store: whether at least `min` fetches were answered from it.
    fn check_read_from_store(&self, min: u64) {
        if self.store.is_some() {
            assert!(
                self.read_from_store >= min,
                "{} records read from the store, expected at least {min}",
                self.read_from_store
            );
        }
    }

    /// The snapshot, as a node sends it: with a store, the part, then the
    /// stored records of live groups in (principal, key) order, then the
    /// trailer.
    fn snapshot(&self) -> Vec<u8> {
        let Some(store) = &self.store else {
            return snapshot::to_bytes(&self.registry);
        };
        assert_eq!(self.registry.key_count(), 0, "no idempotency keys here");
        let mut bytes = Vec::new();
        snapshot::write_part_only(&self.registry, &mut bytes).expect("into memory");
        for (id, stored) in store {
            if self.registry.live_claim_view(id, stored).is_some() {
                snapshot::encode_claim_record(id, &stored.record, &mut bytes).expect("into memory");
            }
        }
        let trailer = blake3::hash(&bytes);
        bytes.extend_from_slice(trailer.as_bytes());
        bytes
    }

    /// A replica installed from `bytes` at this one's index and time: with
    /// a store, the part read alone and the streamed records into a store of
    /// its own, as a node installs.
    fn installed(&self, bytes: &[u8]) -> Harness {
        let (registry, store) = match self.store {
            None => (snapshot::from_bytes(bytes).expect("reads back"), None),
            Some(_) => {
                let Part::Records(registry, records) =
                    snapshot::read_part(bytes, true).expect("the part reads")
                else {
                    panic!("a version 10 snapshot has a part");
                };
                let mut store = Store::new();
                for streamed in records {
                    match streamed.expect("a streamed record reads") {
                        Streamed::Claim(id, stored, _) => store.insert(id, stored),
                        Streamed::Key(..) => panic!("no idempotency keys here"),
                    };
                }
                assert!(registry.has_claim_records_outside());
                (registry, Some(store))
            }
        };
        Harness {
            driver: Driver {
                registry,
                index: self.index,
                now_ms: self.now_ms,
            },
            variant: self.variant,
            store,
            read_from_store: 0,
        }
    }

    /// A snapshot round trip: the installed replica hashes alike and is
    /// equal (with a store, the adapter's snapshot is also byte for byte
    /// the one of the whole state read back), and takes this one's place.
    fn round_trip(&mut self) {
        let bytes = self.snapshot();
        let installed = self.installed(&bytes);
        let hash = snapshot::state_hash(&self.registry);
        assert_eq!(snapshot::state_hash(&installed.registry), hash);
        assert_eq!(installed.registry, self.registry);
        if self.store.is_some() {
            let whole = snapshot::from_bytes(&bytes).expect("reads back whole");
            assert_eq!(snapshot::state_hash(&whole), hash);
            assert_eq!(snapshot::to_bytes(&whole), bytes);
        }
        *self = installed;
    }
}

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

in_every_variant!(
    rule20_first_claim_wins_and_others_are_in_progress,
    rule3_a_completed_claim_may_be_answered_without_the_log,
    rule20_a_retried_claim_gets_its_own_win,
    rule20_completion_is_replayed_and_complete_is_idempotent,
    rule20_takeover_fences_the_old_holder,
    rule20_leases_count_in_cluster_time,
    rule20_release_lets_the_next_claim_win_at_once,
    rule20_fences_only_grow,
    rule20_another_fingerprint_is_a_conflict,
    rule20_claims_belong_to_their_principal,
    rule20_extend_keeps_the_lease,
    rule20_malformed_requests_are_refused_without_a_record,
    rule20_capacity_refuses_and_never_evicts,
    rule20_records_expire_after_their_ttl,
    rule13_snapshots_carry_claims,
);

/// Rule 20: the first claim of a key wins a fence (at least its log index)
/// as attempt 1; a concurrent claim of another caller is in progress and
/// told how much of the lease is left.
fn rule20_first_claim_wins_and_others_are_in_progress(variant: Variant) {
    let mut driver = Harness::new(variant);
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
/// request, and a held or released record all go through the log. With a
/// store the completed record is read from there.
fn rule3_a_completed_claim_may_be_answered_without_the_log(variant: Variant) {
    let request = |op: Op| match op {
        Op::Claim(claim) => claim,
        other => panic!("not a claim: {other:?}"),
    };
    let mut driver = Harness::new(variant);
    let (fence, ..) = won(driver.apply(claim("paid", "charge 10", 1)));
    assert_eq!(
        driver.completed_answer(&request(claim("paid", "charge 10", 2))),
        None,
        "held"
    );
    driver.apply(complete("paid", fence, b"receipt"));
    let again = request(claim("paid", "charge 10", 2));
    let shortcut = driver.completed_answer(&again);
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
        assert_eq!(driver.completed_answer(&refused), None);
        assert!(!matches!(
            driver.apply(Op::Claim(refused)),
            Outcome::Claimed(ClaimAnswer::Completed { .. })
        ));
    }
    let mut elsewhere = request(claim("paid", "charge 10", 3));
    elsewhere.cluster_id = oncekv_core::ClusterId(CLUSTER.0 + 1);
    assert_eq!(driver.completed_answer(&elsewhere), None);
    let (fence, ..) = won(driver.apply(claim("gone", "mail", 4)));
    driver.apply(release("gone", fence));
    assert_eq!(
        driver.completed_answer(&request(claim("gone", "mail", 5))),
        None,
        "released"
    );
    // Past its TTL at the next entry's stamp, though no entry has moved the
    // applied clock there (an idle cluster): the log would expire it and
    // run the claim anew, so the shortcut has no answer.
    let expires_after_ms = driver.view("paid").expect("live").expires_after_ms;
    driver.now_ms = expires_after_ms;
    assert!(
        driver
            .completed_answer(&request(claim("paid", "charge 10", 6)))
            .is_some(),
        "live through its last millisecond"
    );
    driver.now_ms = expires_after_ms + 1;
    assert_eq!(
        driver.completed_answer(&request(claim("paid", "charge 10", 6))),
        None,
        "expired at the stamp"
    );
    assert!(matches!(
        driver.apply(claim("paid", "charge 10", 6)),
        Outcome::Claimed(ClaimAnswer::Won { .. })
    ));
}

/// Rule 20: a claim retried after a lost reply (same claim id) gets its own
/// win back, same fence and deadline, marked duplicate — never "in
/// progress" against itself.
fn rule20_a_retried_claim_gets_its_own_win(variant: Variant) {
    let mut driver = Harness::new(variant);
    let (fence, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    driver.advance(400);
    let (again, attempt, left, duplicate) = won(driver.apply(claim("job", "run", 1)));
    assert_eq!((again, attempt, left, duplicate), (fence, 1, 600, true));
}

/// Rule 20: a completed key replays its result byte for byte to every later
/// claim, whatever its claim id; a retried complete of the same fence is
/// answered from the record, one with another result is FENCED and changes
/// nothing; no new fence is issued for it. With a store,
/// each of those is answered from the record read back from it.
fn rule20_completion_is_replayed_and_complete_is_idempotent(variant: Variant) {
    let mut driver = Harness::new(variant);
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
    // A complete of the same fence with another result records nothing and
    // says so: the claim is finished under this fence.
    assert_eq!(
        driver.apply(complete("pay", fence, b"receipt-8")),
        Outcome::Rejected(Rejection::Fenced { fence })
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
    assert_eq!(driver.registry.claims_held(), 0);
    driver.check_read_from_store(4);
}

/// Rule 20: a lease that runs out in cluster time lets the next claim take
/// over with a larger fence and the attempt count; from then on the old
/// holder's complete, extend and release are FENCED and change nothing.
fn rule20_takeover_fences_the_old_holder(variant: Variant) {
    let mut driver = Harness::new(variant);
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
    // The old holder stays fenced by the completed record.
    assert_eq!(
        driver.apply(complete("job", old, b"late")),
        Outcome::Rejected(Rejection::Fenced { fence: new })
    );
}

/// Rule 20 with rule 11: leases count in cluster time only — an entry
/// stamped earlier than the cluster time (a leader whose clock is behind)
/// does not move time back, and a lease is not over until an entry stamped
/// at or past its deadline applies.
fn rule20_leases_count_in_cluster_time(variant: Variant) {
    let mut driver = Harness::new(variant);
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
/// record; a released holder can no longer complete. The released record is
/// not held (from version 3 it lies among the finished ones, with a store
/// in the store); the takeover holds the key again.
fn rule20_release_lets_the_next_claim_win_at_once(variant: Variant) {
    let mut driver = Harness::new(variant);
    let (first, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    assert_eq!(
        driver.apply(release("job", first)),
        Outcome::ClaimReleased { duplicate: false }
    );
    assert_eq!(driver.registry.claims_held(), 0);
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
    assert_eq!(driver.registry.claims_held(), 1);
    assert_eq!(driver.registry.claim_count(), 1);
    driver.check_read_from_store(3);
}

/// Rule 20: fences strictly grow per key even inside one entry (claim,
/// release, claim in one batch) and across a forgotten record.
fn rule20_fences_only_grow(variant: Variant) {
    let mut driver = Harness::new(variant);
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
    // A forgotten finished record (from version 3 a finished one, with a
    // store in the store) starts over too, with a larger fence.
    driver.apply(complete("job", c, b"ok"));
    assert_eq!(
        driver.apply(Op::ForgetClaim {
            cluster_id: CLUSTER,
            principal: Principal::anonymous(),
            key: key("job"),
        }),
        Outcome::ClaimForgotten { existed: true }
    );
    let (d, attempt, _, _) = won(driver.apply(claim("job", "run", 4)));
    assert!(d > c);
    assert_eq!(attempt, 1);
}

/// Rule 20: another fingerprint on a claimed key is KEY_CONFLICT, whatever
/// the record's state, and leaves the record untouched.
fn rule20_another_fingerprint_is_a_conflict(variant: Variant) {
    let mut driver = Harness::new(variant);
    let (fence, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    let before = driver.view("job");
    assert_eq!(
        driver.apply(claim("job", "other", 1)),
        Outcome::Rejected(Rejection::KeyConflict)
    );
    assert_eq!(driver.view("job"), before);
    driver.apply(complete("job", fence, b"ok"));
    let before = driver.view("job");
    assert!(before.is_some());
    assert_eq!(
        driver.apply(claim("job", "other", 2)),
        Outcome::Rejected(Rejection::KeyConflict)
    );
    assert_eq!(driver.view("job"), before);
}

/// Rules 19 and 20: principals own their claims: another principal's key
/// of the same name is another claim.
fn rule20_claims_belong_to_their_principal(variant: Variant) {
    let mut driver = Harness::new(variant);
    won(driver.apply(claim_as("alice", "job", "run", LEASE_MS, 1)));
    let (_, attempt, _, _) = won(driver.apply(claim_as("bob", "job", "other", LEASE_MS, 2)));
    assert_eq!(attempt, 1);
    assert_eq!(driver.registry.claim_count(), 2);
}

/// Rule 20: an extend moves the lease to `lease_ms` after now, never
/// earlier than it was; a lease extended in time is not taken over.
fn rule20_extend_keeps_the_lease(variant: Variant) {
    let mut driver = Harness::new(variant);
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
fn rule20_malformed_requests_are_refused_without_a_record(variant: Variant) {
    let mut driver = Harness::new(variant);
    let config = *driver.registry.claim_config();
    assert_eq!(
        driver.apply(claim("", "run", 1)),
        Outcome::Rejected(Rejection::InvalidArgument(InvalidArgument::EmptyClaimKey))
    );
    let long = "k".repeat(257);
    assert_eq!(config.claim_key_bytes_max, 256);
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
    for lease_ms in [0, config.lease_ms_max + 1] {
        assert!(matches!(
            driver.apply(claim_as("", "job", "run", lease_ms, 1)),
            Outcome::Rejected(Rejection::InvalidArgument(
                InvalidArgument::LeaseOutOfBounds { .. }
            ))
        ));
    }
    assert_eq!(driver.registry.claim_count(), 0);
    let (fence, _, _, _) = won(driver.apply(claim("job", "run", 1)));
    let big = vec![0u8; config.claim_result_bytes_max as usize + 1];
    assert!(matches!(
        driver.apply(complete("job", fence, &big)),
        Outcome::Rejected(Rejection::LimitExceeded { .. })
    ));
    assert!(
        matches!(
            driver.view("job").unwrap().record.state,
            ClaimState::Held { .. }
        ),
        "a refused complete leaves the key held"
    );
}

/// Rule 20 with rule 12: at `claims_max` a new key is RESOURCE_EXHAUSTED
/// (this attempt) and nothing is evicted; a live key still answers. A
/// finished record counts as a held one does (from version 3 it lies in
/// its group, with a store in the store) and still answers.
fn rule20_capacity_refuses_and_never_evicts(variant: Variant) {
    let mut driver = Harness::new(variant);
    driver.patch(ClaimConfigPatch {
        claims_max: Some(2),
        ..ClaimConfigPatch::default()
    });
    won(driver.apply(claim("a", "run", 1)));
    let (b, _, _, _) = won(driver.apply(claim("b", "run", 2)));
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
    driver.apply(complete("b", b, b"done"));
    assert_eq!(
        driver.apply(claim("c", "run", 3)),
        Outcome::Rejected(Rejection::ResourceExhausted(Limit::Claims))
    );
    assert_eq!(driver.registry.claim_count(), 2);
    assert!(matches!(
        driver.apply(claim("b", "run", 4)),
        Outcome::Claimed(ClaimAnswer::Completed { .. })
    ));
}

/// Rule 20: records expire deterministically `claim_ttl_ms` after they
/// finished (a held one after its lease deadline); then the key may be
/// claimed anew, with a fence larger than any issued before. At version 1
/// a finished record goes exactly a TTL after it finished; from version 3
/// it goes with its whole group (a completed and a released record
/// finished together go at once), at least a TTL and less than a TTL plus
/// one group's width after it finished, at the `expires_after_ms` its view
/// names — and a stored record of an expired group that still lies in the
/// store is absent. A held record expires exactly in every version.
fn rule20_records_expire_after_their_ttl(variant: Variant) {
    let mut driver = Harness::new(variant);
    let ttl_ms = 10_000;
    driver.patch(ClaimConfigPatch {
        claim_ttl_ms: Some(ttl_ms),
        ..ClaimConfigPatch::default()
    });
    let (done, _, _, _) = won(driver.apply(claim("done", "run", 1)));
    driver.apply(complete("done", done, b"r"));
    let (freed, _, _, _) = won(driver.apply(claim("freed", "run", 2)));
    driver.apply(release("freed", freed));
    let finished_ms = driver.now_ms;
    let (_, _, _, _) = won(driver.apply(claim("dead", "run", 3)));
    let deadline_ms = finished_ms + LEASE_MS;
    // The last cluster time the finished records live.
    let last_ms = driver.view("done").unwrap().expires_after_ms;
    if variant.grouped() {
        let width_ms = key_group_width_ms(ttl_ms);
        assert!(
            (finished_ms + ttl_ms..finished_ms + ttl_ms + width_ms).contains(&last_ms),
            "{last_ms} within [{}, {})",
            finished_ms + ttl_ms,
            finished_ms + ttl_ms + width_ms
        );
    } else {
        assert_eq!(last_ms, finished_ms + ttl_ms);
    }
    assert_eq!(driver.view("freed").unwrap().expires_after_ms, last_ms);
    assert_eq!(
        driver.view("dead").unwrap().expires_after_ms,
        deadline_ms + ttl_ms
    );
    driver.now_ms = finished_ms + ttl_ms;
    driver.apply(claim("other", "run", 4));
    assert_eq!(driver.registry.claim_count(), 4, "exactly the TTL: kept");
    driver.now_ms = last_ms;
    driver.apply(claim("other", "run", 4));
    assert_eq!(driver.registry.claim_count(), 4, "to the last: kept");
    assert!(driver.view("done").is_some() && driver.view("freed").is_some());
    driver.now_ms = last_ms + 1;
    driver.apply(claim("other", "run", 4));
    assert!(driver.view("done").is_none());
    assert!(driver.view("freed").is_none());
    assert_eq!(driver.registry.claim_count(), 2);
    driver.now_ms = deadline_ms + ttl_ms;
    driver.apply(claim("other", "run", 4));
    assert!(
        driver.view("dead").is_some(),
        "a held record lives a TTL after its lease deadline"
    );
    driver.now_ms += 1;
    driver.apply(claim("other", "run", 4));
    assert!(driver.view("dead").is_none());
    assert_eq!(driver.registry.claim_count(), 1);
    if let Some(store) = &driver.store {
        let id = (Principal::anonymous(), key("done"));
        assert!(
            store.contains_key(&id),
            "the expired record still lies there"
        );
    }
    let (again, attempt, _, _) = won(driver.apply(claim("done", "run", 5)));
    assert!(again > done);
    assert_eq!(attempt, 1);
    let (again, attempt, _, _) = won(driver.apply(claim("freed", "run", 6)));
    assert!(again > freed);
    assert_eq!(attempt, 1);
}

/// Rule 13: a snapshot carries every claim record, the claim config and
/// the last fence; the restored registry hashes, answers and goes on the
/// same. A state at version 1 is written in format 8, every claim in its
/// part; one at version 3 in format 10, the held claims in its part and the
/// finished ones streamed after it (with a store, the snapshot a node
/// sends, installed with the streamed records into a store).
fn rule13_snapshots_carry_claims(variant: Variant) {
    let history = |release_c: bool| {
        let mut driver = Harness::new(variant);
        driver.patch(ClaimConfigPatch {
            lease_ms_max: Some(5_000),
            ..ClaimConfigPatch::default()
        });
        let (a, _, _, _) = won(driver.apply(claim("a", "run", 1)));
        driver.apply(complete("a", a, b"result"));
        won(driver.apply(claim("b", "run", 2)));
        let (c, _, _, _) = won(driver.apply(claim("c", "run", 3)));
        // Without the release, an entry that changes nothing in its place.
        driver.apply(if release_c {
            release("c", c)
        } else {
            claim("c", "run", 3)
        });
        driver
    };
    let mut driver = history(true);
    // The hash covers claims: the same history without the release differs.
    assert_ne!(
        snapshot::state_hash(&history(false).registry),
        snapshot::state_hash(&driver.registry)
    );
    let bytes = driver.snapshot();
    let format = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    let Part::Records(part, records) = snapshot::read_part(&bytes[..], true).expect("reads") else {
        panic!("a snapshot of format 8 or later has a part");
    };
    assert_eq!(part.claim_count(), 3);
    assert_eq!(part.claims_held(), 1);
    let streamed: Vec<KeyId> = records
        .map(|record| match record.expect("reads") {
            Streamed::Claim(id, stored, _) => {
                assert!(!stored.record.is_held());
                id
            }
            Streamed::Key(..) => panic!("no idempotency keys here"),
        })
        .collect();
    if variant.grouped() {
        assert_eq!(format, snapshot::SNAPSHOT_FORMAT_VERSION_10);
        let finished = ["a", "c"].map(|name| (Principal::anonymous(), key(name)));
        assert_eq!(streamed, finished);
    } else {
        assert_eq!(format, snapshot::SNAPSHOT_FORMAT_VERSION_8);
        assert!(streamed.is_empty());
    }
    let mut restored = driver.installed(&bytes);
    assert_eq!(restored.registry, driver.registry);
    assert_eq!(
        snapshot::state_hash(&restored.registry),
        snapshot::state_hash(&driver.registry)
    );
    assert_eq!(restored.registry.last_fence(), driver.registry.last_fence());
    assert_eq!(restored.registry.claim_config().lease_ms_max, 5_000);
    for name in ["a", "b", "c"] {
        assert_eq!(restored.view(name), driver.view(name), "{name}");
    }
    // Both go on alike: a completion replayed, a lease in progress, a
    // released key taken over, the held one completed.
    driver.advance(10);
    restored.advance(10);
    for op in [
        claim("a", "run", 9),
        claim("b", "run", 9),
        claim("c", "run", 9),
        complete("b", driver.view("b").unwrap().record.fence, b"late"),
    ] {
        assert_eq!(restored.apply(op.clone()), driver.apply(op));
    }
    assert_eq!(
        snapshot::state_hash(&restored.registry),
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
    /// gives an equal registry with an equal hash ([`Harness::round_trip`]).
    #[test]
    fn claims_keep_their_promises(steps in proptest::collection::vec(step(), 1..80)) {
        // At version 1 (every claim in memory, exact expiry), at the latest
        // (finished claims in creation-time groups), and at the latest with
        // the finished claims in an adapter's store.
        for variant in VARIANTS {
            let mut driver = Harness::new(variant);
            driver.patch(ClaimConfigPatch {
                claim_ttl_ms: Some(1_000_000),
                ..ClaimConfigPatch::default()
            });
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
                        let shortcut = driver.completed_answer(request);
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
                    Step::Snapshot => driver.round_trip(),
                }
            }
        }
    }
}
