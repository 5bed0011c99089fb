//! Finished claims in creation-time groups (rules version 3:
//! docs/state-beyond-ram.md §4.12). At version 3 a completed or released
//! claim leaves memory for a group by the cluster time its TTL counts from,
//! as idempotency keys do, so that an adapter can keep it in its record
//! store; a held claim stays in memory. These tests check that this moves
//! records and nothing else: every answer, view and count equals version
//! 2's, whether the finished records are held or lie in an adapter's store,
//! across the raise from 2 to 3; a finished claim lives at least its TTL
//! and less than one group's width more; and snapshot format 10 carries
//! them, streamed after the key records, checked as it is read.

use oncekv_core::fingerprint::claim_fingerprint;
use oncekv_core::snapshot::{self, Part, Streamed};
use oncekv_core::{
    BudgetConfigPatch, Claim, ClaimAnswer, ClaimConfigPatch, ClaimRecord, ClaimState, ClaimView,
    ClusterId, ConfigPatch, Entry, GroupedRecord, IdempotencyKey, KeyId, KeyedConfigPatch, Nonce,
    Op, Outcome, Prefetched, Principal, Registry, RegistryConfig, RulesVersion, key_group_width_ms,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

const CLUSTER: ClusterId = ClusterId(0x00c1_a1e5);
const KEYS: u8 = 4;

fn key(k: u8) -> IdempotencyKey {
    IdempotencyKey(vec![b'k', k])
}

fn id(k: u8) -> KeyId {
    (Principal::anonymous(), key(k))
}

/// A registry fed entries at increasing indexes, optionally with an
/// adapter's store of finished claims beside it (flushed on demand, read
/// for what the registry names before each entry), as the node's state
/// machine will do.
struct Replica {
    registry: Registry,
    index: u64,
    store: Option<BTreeMap<KeyId, GroupedRecord<ClaimRecord>>>,
}

impl Replica {
    fn new(flushing: bool, claim_ttl_ms: u64) -> Replica {
        let mut replica = Replica {
            registry: Registry::new(),
            index: 0,
            store: flushing.then(BTreeMap::new),
        };
        let bootstrapped = replica.apply(
            1_000,
            Op::BootstrapWithRules {
                cluster_id: CLUSTER,
                config: RegistryConfig::default(),
                rules: RulesVersion::V2,
            },
        );
        assert!(matches!(bootstrapped, Outcome::Bootstrapped { .. }));
        let patched = replica.apply(
            1_000,
            Op::PatchAllConfigs {
                cluster_id: CLUSTER,
                patch: ConfigPatch::default(),
                keyed: KeyedConfigPatch::default(),
                claims: ClaimConfigPatch {
                    claim_ttl_ms: Some(claim_ttl_ms),
                    ..ClaimConfigPatch::default()
                },
                budget: BudgetConfigPatch::default(),
            },
        );
        assert!(
            matches!(patched, Outcome::AllConfigsSet { .. }),
            "{patched:?}"
        );
        replica
    }

    fn apply_all(&mut self, now_ms: u64, ops: Vec<Op>) -> Vec<Outcome> {
        self.index += 1;
        let entry = Entry {
            stamp_ms: now_ms,
            ops: ops.into(),
        };
        let mut fetched = Prefetched::none();
        if let Some(store) = &self.store {
            for id in self.registry.claims_to_fetch(&entry) {
                let stored = store.get(&id).cloned();
                fetched.insert_claim(id, stored);
            }
        }
        let outcomes = self.registry.apply_prefetched(self.index, &entry, &fetched);
        self.registry
            .check_invariants()
            .expect("invariants after apply");
        outcomes
    }

    fn apply(&mut self, now_ms: u64, op: Op) -> Outcome {
        self.apply_all(now_ms, vec![op]).remove(0)
    }

    /// The adapter's flush: the changes into the store; a first take
    /// replaces it; records of expired groups may go (compaction).
    fn flush(&mut self) {
        let Some(store) = &mut self.store else {
            return;
        };
        let changes = self.registry.take_claim_changes();
        if changes.complete {
            store.clear();
        }
        for (id, change) in changes.records {
            match change {
                Some(record) => store.insert(id, record),
                None => store.remove(&id),
            };
        }
        store.retain(|_, record| record.group_ms >= changes.first_live_group_ms);
    }

    /// The operator's view of claim `k`, from wherever it lies.
    fn view(&self, k: u8) -> Option<ClaimView> {
        let id = id(k);
        match &self.store {
            Some(store) if self.registry.claim_must_be_fetched(&id) => {
                self.registry
                    .claim_over(&id.0, &id.1, store.get(&id).cloned())
            }
            _ => self.registry.claim_record(&id.0, &id.1),
        }
    }
}

fn claim(k: u8, effect: u8, claim_id: u8, lease_ms: u64) -> Op {
    Op::Claim(Claim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(k),
        fingerprint: claim_fingerprint(&[effect]),
        lease_ms,
        claim_id: Nonce(u128::from(claim_id) + 1),
    })
}

fn complete(k: u8, fence: u64, result: &[u8]) -> Op {
    Op::CompleteClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(k),
        fence,
        result: result.to_vec(),
    }
}

fn release(k: u8, fence: u64) -> Op {
    Op::ReleaseClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(k),
        fence,
    }
}

fn extend(k: u8, fence: u64, lease_ms: u64) -> Op {
    Op::ExtendClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(k),
        fence,
        lease_ms,
    }
}

fn forget(k: u8) -> Op {
    Op::ForgetClaim {
        cluster_id: CLUSTER,
        principal: Principal::anonymous(),
        key: key(k),
    }
}

fn raise() -> Op {
    Op::RaiseRules {
        cluster_id: CLUSTER,
        rules: RulesVersion::V3,
    }
}

fn won_fence(outcome: &Outcome) -> Option<u64> {
    match outcome {
        Outcome::Claimed(ClaimAnswer::Won { fence, .. }) => Some(*fence),
        _ => None,
    }
}

#[derive(Clone, Debug)]
enum Request {
    Claim {
        k: u8,
        effect: u8,
        claim_id: u8,
        lease_ms: u64,
    },
    /// `fence`: 0 the key's last won fence, 1 one below it (stale), 2 none.
    Complete {
        k: u8,
        fence: u8,
        result: u8,
    },
    Release {
        k: u8,
        fence: u8,
    },
    Extend {
        k: u8,
        fence: u8,
        lease_ms: u64,
    },
    Forget {
        k: u8,
    },
}

#[derive(Clone, Debug)]
enum Step {
    /// One entry of one or more requests (ids fetched before all of them).
    Entry(Vec<Request>),
    Advance(u64),
    Flush,
    Raise,
    /// A snapshot round trip of the in-memory replicas.
    RoundTrip,
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        4 => (0..KEYS, 0..2u8, 0..3u8, 100..2_000u64).prop_map(|(k, effect, claim_id, lease_ms)| {
            Request::Claim { k, effect, claim_id, lease_ms }
        }),
        3 => (0..KEYS, 0..3u8, 0..3u8).prop_map(|(k, fence, result)| Request::Complete { k, fence, result }),
        2 => (0..KEYS, 0..3u8).prop_map(|(k, fence)| Request::Release { k, fence }),
        1 => (0..KEYS, 0..3u8, 100..2_000u64).prop_map(|(k, fence, lease_ms)| Request::Extend { k, fence, lease_ms }),
        1 => (0..KEYS).prop_map(|k| Request::Forget { k }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => prop::collection::vec(request(), 1..4).prop_map(Step::Entry),
        3 => (0..1_500u64).prop_map(Step::Advance),
        2 => Just(Step::Flush),
        1 => Just(Step::Raise),
        1 => Just(Step::RoundTrip),
    ]
}

fn op(request: &Request, fences: &BTreeMap<u8, u64>) -> Op {
    let fence = |k: &u8, pick: &u8| {
        let last = fences.get(k).copied().unwrap_or(0);
        match pick {
            0 => last,
            1 => last.saturating_sub(1),
            _ => 0,
        }
    };
    match request {
        Request::Claim {
            k,
            effect,
            claim_id,
            lease_ms,
        } => claim(*k, *effect, *claim_id, *lease_ms),
        Request::Complete {
            k,
            fence: f,
            result,
        } => complete(*k, fence(k, f), &[*result; 3]),
        Request::Release { k, fence: f } => release(*k, fence(k, f)),
        Request::Extend {
            k,
            fence: f,
            lease_ms,
        } => extend(*k, fence(k, f), *lease_ms),
        Request::Forget { k } => forget(*k),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Three replicas of one log: `v2` stays at rules version 2 (every
    /// claim in memory); `held` and `flushed` are raised to 3 where the
    /// history says, `flushed` handing its finished records to a store on
    /// every flush and reading them back when the registry names them. A
    /// claim TTL under 2,048 ms makes groups 1 ms wide, so version 3's
    /// expiry is exactly version 2's: every answer, view and count must
    /// agree, and the two at version 3 hash alike.
    #[test]
    fn finished_claims_in_groups_change_no_answer(steps in prop::collection::vec(step(), 1..60)) {
        let ttl_ms = 1_000;
        let mut v2 = Replica::new(false, ttl_ms);
        let mut held = Replica::new(false, ttl_ms);
        let mut flushed = Replica::new(true, ttl_ms);
        let mut now_ms = 1_000;
        let mut fences: BTreeMap<u8, u64> = BTreeMap::new();
        for step in &steps {
            match step {
                Step::Entry(requests) => {
                    let ops: Vec<Op> = requests.iter().map(|r| op(r, &fences)).collect();
                    let expected = v2.apply_all(now_ms, ops.clone());
                    prop_assert_eq!(&held.apply_all(now_ms, ops.clone()), &expected);
                    prop_assert_eq!(&flushed.apply_all(now_ms, ops), &expected);
                    for (request, outcome) in requests.iter().zip(&expected) {
                        if let (Request::Claim { k, .. }, Some(fence)) = (request, won_fence(outcome)) {
                            fences.insert(*k, fence);
                        }
                    }
                }
                Step::Advance(ms) => now_ms += ms,
                Step::Flush => flushed.flush(),
                Step::Raise => {
                    // The version-2 replica takes an entry too (indexes
                    // stay aligned): a no-op forget of a key never used.
                    v2.apply(now_ms, forget(KEYS));
                    let raised = held.apply(now_ms, raise());
                    prop_assert!(matches!(raised, Outcome::AllConfigsSet { .. }), "{:?}", raised);
                    prop_assert_eq!(flushed.apply(now_ms, raise()), raised);
                }
                Step::RoundTrip => {
                    for replica in [&mut v2, &mut held] {
                        let bytes = snapshot::to_bytes(&replica.registry);
                        let read = snapshot::from_bytes(&bytes).expect("a snapshot reads back");
                        prop_assert_eq!(snapshot::state_hash(&read), snapshot::state_hash(&replica.registry));
                        prop_assert_eq!(&read, &replica.registry);
                        replica.registry = read;
                    }
                }
            }
            for k in 0..KEYS {
                let expected = v2.view(k);
                prop_assert_eq!(&held.view(k), &expected, "claim {} held", k);
                prop_assert_eq!(&flushed.view(k), &expected, "claim {} flushed", k);
            }
            prop_assert_eq!(held.registry.claim_count(), v2.registry.claim_count());
            prop_assert_eq!(flushed.registry.claim_count(), v2.registry.claim_count());
            prop_assert_eq!(held.registry.claim_cached_bytes(), v2.registry.claim_cached_bytes());
            prop_assert_eq!(
                snapshot::state_hash(&flushed.registry),
                snapshot::state_hash(&held.registry)
            );
            if !held.registry.rules().finished_claims_grouped() {
                prop_assert_eq!(
                    snapshot::state_hash(&held.registry),
                    snapshot::state_hash(&v2.registry)
                );
            }
        }
    }
}

/// A registry at version 3 with finished claims in two groups (a 24 h TTL:
/// groups 84,375 ms wide) and one held claim.
fn three_finished_one_held() -> (Replica, u64) {
    let ttl_ms = 24 * 3_600_000;
    let mut replica = Replica::new(false, ttl_ms);
    assert!(matches!(
        replica.apply(1_000, raise()),
        Outcome::AllConfigsSet { .. }
    ));
    let mut now_ms = 2_000;
    for k in 0..3u8 {
        let fence = won_fence(&replica.apply(now_ms, claim(k, 0, k, 1_000))).expect("won");
        let finished = if k == 1 {
            replica.apply(now_ms, release(k, fence))
        } else {
            replica.apply(now_ms, complete(k, fence, b"done"))
        };
        assert!(
            matches!(
                finished,
                Outcome::ClaimCompleted {
                    duplicate: false,
                    ..
                } | Outcome::ClaimReleased { duplicate: false }
            ),
            "{finished:?}"
        );
        now_ms += 50_000;
    }
    won_fence(&replica.apply(now_ms, claim(3, 0, 3, 1_000))).expect("won");
    (replica, ttl_ms)
}

/// The raise to version 3 moves every finished record into groups in one
/// entry, deterministically: counts, bytes and views unchanged, the held
/// claim still in memory, the state hash that of the same state read back
/// from its snapshot (format 10), and no record expires earlier than its
/// TTL said.
#[test]
fn the_raise_to_3_groups_finished_claims_and_loses_nothing() {
    let ttl_ms = 24 * 3_600_000;
    let mut before = Replica::new(false, ttl_ms);
    let mut now_ms = 2_000;
    let mut completed_at = BTreeMap::new();
    for k in 0..3u8 {
        let fence = won_fence(&before.apply(now_ms, claim(k, 0, k, 1_000))).expect("won");
        if k == 1 {
            before.apply(now_ms, release(k, fence));
        } else {
            before.apply(now_ms, complete(k, fence, b"done"));
        }
        completed_at.insert(k, now_ms);
        now_ms += 50_000;
    }
    won_fence(&before.apply(now_ms, claim(3, 0, 3, 1_000))).expect("won");
    let views: Vec<_> = (0..KEYS).map(|k| before.view(k)).collect();
    let (count, bytes, held) = (
        before.registry.claim_count(),
        before.registry.claim_cached_bytes(),
        before.registry.claims_held(),
    );
    assert_eq!((count, held), (4, 1));
    let mut raised = before;
    assert!(matches!(
        raised.apply(now_ms, raise()),
        Outcome::AllConfigsSet { .. }
    ));
    assert_eq!(raised.registry.claim_count(), count);
    assert_eq!(raised.registry.claim_cached_bytes(), bytes);
    assert_eq!(raised.registry.claims_held(), held);
    for k in 0..KEYS {
        let view = raised.view(k).expect("still live");
        let old = views[usize::from(k)].clone().expect("was live");
        assert_eq!(view.record, old.record);
        // A group ends after its records' bases: never an earlier expiry.
        assert!(view.expires_after_ms >= old.expires_after_ms, "claim {k}");
        assert!(
            view.expires_after_ms < old.expires_after_ms + key_group_width_ms(ttl_ms),
            "claim {k}"
        );
    }
    let bytes = snapshot::to_bytes(&raised.registry);
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        snapshot::SNAPSHOT_FORMAT_VERSION_10
    );
    let read = snapshot::from_bytes(&bytes).expect("reads back");
    assert_eq!(read, raised.registry);
    assert_eq!(
        snapshot::state_hash(&read),
        snapshot::state_hash(&raised.registry)
    );
    // The state hash covers the finished claims (their groups' sums).
    let mut forgotten = raised.registry.clone();
    forgotten.apply(raised.index + 1, &Entry::single(now_ms, forget(0)));
    assert_ne!(
        snapshot::state_hash(&forgotten),
        snapshot::state_hash(&raised.registry)
    );
    // Still there a TTL after completion; gone once its group's newest
    // possible record is older than the TTL.
    let completed_ms = completed_at[&0];
    let view = raised.view(0).unwrap();
    raised.apply(completed_ms + ttl_ms, forget(KEYS));
    assert!(
        matches!(
            raised.apply(completed_ms + ttl_ms, claim(0, 0, 9, 1_000)),
            Outcome::Claimed(ClaimAnswer::Completed { .. })
        ),
        "a completed claim lives its TTL"
    );
    let outcome = raised.apply(view.expires_after_ms + 1, claim(0, 0, 9, 1_000));
    assert!(
        matches!(
            outcome,
            Outcome::Claimed(ClaimAnswer::Won { attempt: 1, .. })
        ),
        "{outcome:?}"
    );
}

/// A finished claim lives at least its TTL after it finished and less than
/// the TTL plus one group's width, both when held and when it lies in the
/// adapter's store; a released one taken over comes back into memory.
#[test]
fn a_finished_claim_lives_its_ttl_and_less_than_one_group_more() {
    let ttl_ms = 24 * 3_600_000;
    let width_ms = key_group_width_ms(ttl_ms);
    for flushing in [false, true] {
        let mut replica = Replica::new(flushing, ttl_ms);
        replica.apply(1_000, raise());
        let done_ms = 1_000 + width_ms / 2;
        let fence = won_fence(&replica.apply(done_ms, claim(0, 0, 0, 1_000))).unwrap();
        replica.apply(done_ms, complete(0, fence, b"r"));
        let fence = won_fence(&replica.apply(done_ms, claim(1, 0, 0, 1_000))).unwrap();
        replica.apply(done_ms, release(1, fence));
        replica.flush();
        assert_eq!(replica.registry.claims_held(), 0);
        if flushing {
            assert_eq!(replica.registry.claim_records_held(), 0, "all in the store");
        }
        let taken = replica.apply(done_ms + 10, claim(1, 0, 5, 1_000));
        assert!(
            matches!(taken, Outcome::Claimed(ClaimAnswer::Won { attempt: 2, .. })),
            "{taken:?}"
        );
        assert_eq!(replica.registry.claims_held(), 1, "back in memory, held");
        let at_ttl = replica.apply(done_ms + ttl_ms, claim(0, 0, 7, 1_000));
        assert!(
            matches!(at_ttl, Outcome::Claimed(ClaimAnswer::Completed { .. })),
            "{at_ttl:?}"
        );
        replica.flush();
        let past = replica.apply(done_ms + ttl_ms + width_ms, claim(0, 0, 7, 1_000));
        assert!(
            matches!(past, Outcome::Claimed(ClaimAnswer::Won { attempt: 1, .. })),
            "{past:?}"
        );
    }
}

/// Format 10: a part written alone, then the finished claims encoded one
/// by one after the (no) key records, then the trailer, is byte for byte
/// the whole snapshot; the part alone restores every count and the state
/// hash, and its stream yields the finished claims in order.
#[test]
fn a_version_10_part_then_its_claims_is_the_whole_snapshot() {
    let (replica, _) = three_finished_one_held();
    let registry = &replica.registry;
    let whole = snapshot::to_bytes(registry);
    let mut parted = Vec::new();
    snapshot::write_part_only(registry, &mut parted).unwrap();
    let Part::Records(part, records) = snapshot::read_part(&whole[..], true).unwrap() else {
        panic!("a version 10 snapshot has a part");
    };
    assert_eq!(part.claim_count(), 4);
    assert_eq!(part.claims_held(), 1);
    assert_eq!(part.claim_records_held(), 0);
    assert_eq!(snapshot::state_hash(&part), snapshot::state_hash(registry));
    assert_eq!(records.remaining(), 3);
    let streamed: Vec<Streamed> = records.map(Result::unwrap).collect();
    let mut expected = Vec::new();
    for k in [0u8, 1, 2] {
        let (id, stored) = (id(k), part_record(registry, k));
        snapshot::encode_claim_record(&id, &stored.record, &mut parted).unwrap();
        let bytes = oncekv_core::stored::claim_record_bytes(&stored.record);
        expected.push(Streamed::Claim(id, stored, bytes));
    }
    assert_eq!(streamed, expected);
    parted.extend_from_slice(blake3::hash(&parted).as_bytes());
    assert_eq!(parted, whole);
}

/// The grouped record of finished claim `k` as the registry holds it.
fn part_record(registry: &Registry, k: u8) -> GroupedRecord<ClaimRecord> {
    let id = id(k);
    let view = registry.claim_record(&id.0, &id.1).expect("live");
    let mut changes = registry.clone();
    let taken = changes.take_claim_changes();
    let stored = taken.records.get(&id).cloned().flatten().expect("held");
    assert_eq!(stored.record, view.record);
    stored
}

/// What a version 10 reader refuses in the stream: a held claim among the
/// finished ones, a record altered (its group's sum), one missing (the
/// header's count, then the trailer).
#[test]
fn a_version_10_stream_is_checked() {
    let (replica, _) = three_finished_one_held();
    let registry = &replica.registry;
    let finished: Vec<(KeyId, GroupedRecord<ClaimRecord>)> = (0..3u8)
        .map(|k| (id(k), part_record(registry, k)))
        .collect();
    let with = |records: &[(KeyId, ClaimRecord)]| {
        let mut bytes = Vec::new();
        snapshot::write_part_only(registry, &mut bytes).unwrap();
        for (id, record) in records {
            snapshot::encode_claim_record(id, record, &mut bytes).unwrap();
        }
        let trailer = blake3::hash(&bytes);
        bytes.extend_from_slice(trailer.as_bytes());
        snapshot::from_bytes(&bytes)
    };
    let good: Vec<(KeyId, ClaimRecord)> = finished
        .iter()
        .map(|(id, stored)| (id.clone(), stored.record.clone()))
        .collect();
    assert_eq!(with(&good).expect("the good stream reads"), *registry);
    let mut held = good.clone();
    held[1].1.state = ClaimState::Held {
        holder: Nonce(1),
        lease_deadline_ms: 5_000,
    };
    let error = with(&held).expect_err("a held claim streamed").to_string();
    assert!(error.contains("held claim among the finished"), "{error}");
    let mut altered = good.clone();
    altered[2].1.attempt += 1;
    let error = with(&altered).expect_err("an altered claim").to_string();
    assert!(error.contains("summary"), "{error}");
    let error = with(&good[..2]).expect_err("a claim missing").to_string();
    // The reader takes the trailer's bytes for the third record.
    assert!(
        ["truncated", "checksum", "exceeds the limit"]
            .iter()
            .any(|why| error.contains(why)),
        "{error}"
    );
}
