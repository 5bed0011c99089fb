//! Rules 19 and 7 in the registry core: a session belongs to the principal
//! that registered it — another principal's execute, keep-alive or
//! unregister is PERMISSION_DENIED and changes nothing — and no request may
//! raise a floor beyond the highest seq applied plus the window.

mod support;

use oncekv_core::snapshot;
use oncekv_core::{
    ClientId, Execute, InvalidArgument, Nonce, Op, Outcome, Principal, Registry, Rejection, Seq,
};
use proptest::prelude::*;
use support::registry::{CLUSTER, Driver, incr};

fn alice() -> Principal {
    Principal("alice".into())
}

fn bob() -> Principal {
    Principal("bob".into())
}

fn register(driver: &mut Driver, nonce: u128, principal: Principal) -> Outcome {
    driver.apply(Op::Register {
        cluster_id: Some(CLUSTER),
        nonce: Nonce(nonce),
        principal,
    })
}

fn execute(
    driver: &mut Driver,
    client_id: ClientId,
    seq: Seq,
    floor: Seq,
    who: Principal,
) -> Outcome {
    driver.apply(Op::Execute(Execute {
        cluster_id: CLUSTER,
        client_id,
        seq,
        first_outstanding_seq: floor,
        command: incr("n", 1),
        principal: who,
    }))
}

fn keep_alive(driver: &mut Driver, client_id: ClientId, floor: Seq, who: Principal) -> Outcome {
    driver.apply(Op::KeepAlive {
        cluster_id: CLUSTER,
        client_id,
        first_outstanding_seq: floor,
        principal: who,
    })
}

fn unregister(driver: &mut Driver, client_id: ClientId, who: Option<Principal>) -> Outcome {
    driver.apply(Op::Unregister {
        cluster_id: CLUSTER,
        client_id,
        principal: who,
    })
}

fn alices_session(driver: &mut Driver) -> ClientId {
    match register(driver, 1, alice()) {
        Outcome::Registered(registration) => registration.client_id,
        other => panic!("{other:?}"),
    }
}

const DENIED: Outcome = Outcome::Rejected(Rejection::PermissionDenied);

/// Bob's execute, keep-alive (even with a huge floor) and unregister on
/// Alice's session are refused, and her session — floor, cache, activity —
/// is exactly as before; she goes on using it; an operator's expiry (no
/// principal) still ends it.
#[test]
fn another_principal_cannot_touch_a_session() {
    let mut driver = Driver::new();
    let id = alices_session(&mut driver);
    assert!(matches!(
        execute(&mut driver, id, 1, 1, alice()),
        Outcome::Executed {
            duplicate: false,
            ..
        }
    ));
    let before = driver.registry.session(id).expect("live");
    assert_eq!(before.owner, alice());
    let facts = |view: oncekv_core::SessionView| {
        (
            view.owner,
            view.floor,
            view.last_active_ms,
            view.cached_responses,
            view.cached_bytes,
        )
    };
    driver.advance(100);
    assert_eq!(execute(&mut driver, id, 2, 2, bob()), DENIED);
    assert_eq!(
        execute(&mut driver, id, 1, 1, bob()),
        DENIED,
        "not even a cached seq"
    );
    assert_eq!(keep_alive(&mut driver, id, 5, bob()), DENIED);
    assert_eq!(unregister(&mut driver, id, Some(bob())), DENIED);
    assert_eq!(register(&mut driver, 1, bob()), DENIED, "Alice's nonce");
    assert_eq!(
        execute(&mut driver, id, 2, 2, Principal::anonymous()),
        DENIED,
        "anonymous is a principal like any other"
    );
    assert_eq!(facts(driver.registry.session(id).unwrap()), facts(before));
    assert_eq!(driver.int("n"), Some(1));
    assert!(matches!(
        execute(&mut driver, id, 1, 1, alice()),
        Outcome::Executed {
            duplicate: true,
            ..
        }
    ));
    assert!(matches!(
        execute(&mut driver, id, 2, 2, alice()),
        Outcome::Executed {
            duplicate: false,
            ..
        }
    ));
    assert!(
        matches!(register(&mut driver, 1, alice()), Outcome::Registered(r) if r.duplicate && r.client_id == id)
    );
    assert_eq!(unregister(&mut driver, id, None), Outcome::Unregistered);
    assert_eq!(
        execute(&mut driver, id, 3, 3, alice()),
        Outcome::Rejected(Rejection::SessionExpired)
    );
}

/// The unknown-session check comes first: another principal naming an
/// unknown session learns SESSION_EXPIRED, like anyone.
#[test]
fn unknown_session_before_ownership() {
    let mut driver = Driver::new();
    alices_session(&mut driver);
    let unknown = ClientId(999);
    for outcome in [
        execute(&mut driver, unknown, 1, 1, bob()),
        keep_alive(&mut driver, unknown, 1, bob()),
        unregister(&mut driver, unknown, Some(bob())),
    ] {
        assert_eq!(outcome, Outcome::Rejected(Rejection::SessionExpired));
    }
}

/// `KeepAlive(u64::MAX)` is INVALID_ARGUMENT, the floor stays, and the
/// session keeps working.
#[test]
fn keep_alive_with_u64_max_is_refused() {
    let mut driver = Driver::new();
    let id = alices_session(&mut driver);
    assert!(matches!(
        execute(&mut driver, id, 1, 1, alice()),
        Outcome::Executed { .. }
    ));
    assert!(matches!(
        keep_alive(&mut driver, id, u64::MAX, alice()),
        Outcome::Rejected(Rejection::InvalidArgument(
            InvalidArgument::FloorBeyondBound { .. }
        ))
    ));
    assert_eq!(driver.registry.session(id).unwrap().floor, 1);
    assert!(matches!(
        execute(&mut driver, id, 2, 2, alice()),
        Outcome::Executed {
            duplicate: false,
            ..
        }
    ));
    assert!(matches!(
        execute(&mut driver, id, u64::MAX, u64::MAX, alice()),
        Outcome::Rejected(Rejection::InvalidArgument(
            InvalidArgument::FloorBeyondBound { .. }
        ))
    ));
    assert!(matches!(
        execute(&mut driver, id, 3, 3, alice()),
        Outcome::Executed {
            duplicate: false,
            ..
        }
    ));
}

/// The bound is exactly one past the highest applied seq (or the floor, if
/// higher) plus the window: a floor there is accepted (fencing everything
/// the window allowed), one above is not; a floor that does not rise is
/// always accepted.
#[test]
fn floor_bound_is_highest_applied_plus_window() {
    let mut driver = Driver::new();
    let window = driver.registry.config().window;
    let id = alices_session(&mut driver);
    let refused = |outcome: Outcome| match outcome {
        Outcome::Rejected(Rejection::InvalidArgument(InvalidArgument::FloorBeyondBound {
            bound_seq,
            ..
        })) => Some(bound_seq),
        _ => None,
    };
    let floor = |outcome: Outcome| match outcome {
        Outcome::KeptAlive { floor, .. } => Some(floor),
        _ => None,
    };
    // Nothing applied yet: one past seq 0, plus the window.
    assert_eq!(
        refused(keep_alive(&mut driver, id, window + 2, alice())),
        Some(window + 1)
    );
    assert_eq!(
        floor(keep_alive(&mut driver, id, window + 1, alice())),
        Some(window + 1)
    );
    assert!(matches!(
        execute(&mut driver, id, window + 5, window + 5, alice()),
        Outcome::Executed { .. }
    ));
    let bound = window + 5 + 1 + window;
    assert_eq!(
        refused(keep_alive(&mut driver, id, bound + 1, alice())),
        Some(bound)
    );
    assert_eq!(
        floor(keep_alive(&mut driver, id, 3, alice())),
        Some(window + 5)
    );
    assert_eq!(
        floor(keep_alive(&mut driver, id, bound, alice())),
        Some(bound)
    );
    // The floor is now above the highest applied seq: the bound follows it.
    assert_eq!(
        refused(keep_alive(&mut driver, id, bound + window + 1, alice())),
        Some(bound + window)
    );
}

/// The owner and the highest seq travel in snapshots: a restored registry
/// is identical (same bytes, same state hash) and still refuses Bob.
#[test]
fn owner_survives_a_snapshot() {
    let mut driver = Driver::new();
    let id = alices_session(&mut driver);
    assert!(matches!(
        execute(&mut driver, id, 7, 7, alice()),
        Outcome::Executed { .. }
    ));
    let bytes = snapshot::to_bytes(&driver.registry);
    let restored = snapshot::from_bytes(&bytes).expect("reads");
    assert_eq!(restored, driver.registry);
    assert_eq!(
        snapshot::state_hash(&restored),
        snapshot::state_hash(&driver.registry)
    );
    let mut other = Driver::new();
    let other_id = match register(&mut other, 1, bob()) {
        Outcome::Registered(registration) => registration.client_id,
        outcome => panic!("{outcome:?}"),
    };
    assert_eq!(other_id, id);
    assert_ne!(
        snapshot::state_hash(&other.registry),
        snapshot::state_hash(&{
            let mut same = Driver::new();
            alices_session(&mut same);
            same.registry
        }),
        "the owner is part of the state hash"
    );
    let mut driver = Driver {
        registry: restored,
        index: driver.index,
        now_ms: driver.now_ms,
    };
    assert_eq!(keep_alive(&mut driver, id, 8, bob()), DENIED);
    assert_eq!(driver.registry.session(id).unwrap().owner, alice());
}

#[derive(Clone, Debug)]
enum Step {
    Execute {
        seq: Seq,
        floor: Seq,
        by_alice: bool,
    },
    KeepAlive {
        floor: Seq,
        by_alice: bool,
    },
    Unregister {
        by_alice: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let seq = prop_oneof![0..3_000u64, Just(u64::MAX), any::<u64>()];
    prop_oneof![
        (seq.clone(), seq.clone(), any::<bool>()).prop_map(|(seq, floor, by_alice)| {
            Step::Execute {
                seq,
                floor,
                by_alice,
            }
        }),
        (seq, any::<bool>()).prop_map(|(floor, by_alice)| Step::KeepAlive { floor, by_alice }),
        any::<bool>().prop_map(|by_alice| Step::Unregister { by_alice }),
    ]
}

proptest! {
    /// Whatever Alice and Bob send: Bob never changes Alice's session, and
    /// no single request of Alice's moves her floor past one beyond the
    /// highest seq she had applied (or her floor) plus the window.
    #[test]
    fn no_input_breaks_ownership_or_the_floor_bound(steps in proptest::collection::vec(step(), 1..60)) {
        let mut driver = Driver::new();
        let window = driver.registry.config().window;
        let id = alices_session(&mut driver);
        let mut highest: Seq = 0;
        for step in steps {
            let before = driver.registry.session(id);
            let highest_before = highest;
            let by_alice = match step {
                Step::Execute { by_alice, .. } | Step::KeepAlive { by_alice, .. } | Step::Unregister { by_alice } => by_alice,
            };
            let who = if by_alice { alice() } else { bob() };
            let outcome = match step {
                Step::Execute { seq, floor, .. } => execute(&mut driver, id, seq, floor, who),
                Step::KeepAlive { floor, .. } => keep_alive(&mut driver, id, floor, who),
                Step::Unregister { .. } => unregister(&mut driver, id, Some(who)),
            };
            if let (Step::Execute { seq, .. }, Outcome::Executed { duplicate: false, .. }) = (&step, &outcome) {
                highest = highest.max(*seq);
            }
            let after = driver.registry.session(id);
            if !by_alice {
                prop_assert_eq!(&after, &before);
                if before.is_some() {
                    prop_assert_eq!(&outcome, &DENIED);
                }
            }
            if let Some(session) = &after {
                prop_assert_eq!(&session.owner, &alice());
                let old_floor = before.as_ref().map_or(0, |view| view.floor);
                let bound = (highest_before + 1).max(old_floor).saturating_add(window);
                prop_assert!(session.floor <= bound.max(old_floor), "{:?} {}", session, bound);
            }
            if after.is_none() {
                break;
            }
        }
    }
}

/// A registry is indistinguishable after a snapshot whatever the owners.
#[test]
fn empty_registry_round_trips() {
    let registry = Registry::new();
    assert_eq!(
        snapshot::from_bytes(&snapshot::to_bytes(&registry)).unwrap(),
        registry
    );
}
