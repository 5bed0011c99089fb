//! What the snapshot path of the storage adapter allocates, measured
//! exactly with a counting allocator over a state of ~24 MiB: building a
//! snapshot, serving the current one, sending it chunk by chunk, and
//! installing one (received, or copied from another state machine's file)
//! hold at most a few MiB beyond the state itself — never a copy of the
//! snapshot's bytes. Before snapshots streamed to and from files, building
//! held about three copies of the snapshot, serving one more, and
//! installing two besides the decoded state. With a record store, an
//! install holds none of a snapshot's idempotency-key records or finished
//! claims (rules version 3): they stream into the store as they arrive.
//!
//! The allocator counts every thread of the process (blocking threads
//! included), so the tests of this binary run one at a time.

use futures::StreamExt;
use oncekv::raft_types::{Entry, TypeConfig};
use oncekv::storage::StateMachineStore;
use oncekv_core::fingerprint::claim_fingerprint;
use oncekv_core::{
    Claim, ClusterId, Command, IdempotencyKey, Nonce, Op, Principal, Registry, RegistryConfig,
    RulesVersion, Value,
};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Bytes live on the heap now, and the most since the last reset.
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

struct Counting;

impl Counting {
    fn grew(size: usize) {
        let live = LIVE.fetch_add(size as isize, Ordering::SeqCst) + size as isize;
        PEAK.fetch_max(live, Ordering::SeqCst);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are only bookkeeping.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        Counting::grew(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        Counting::grew(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: forwarded unchanged.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // Counted as the new block allocated before the old one is freed,
        // as a moving realloc does.
        Counting::grew(new_size);
        LIVE.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: forwarded unchanged.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One test at a time: the counters are the process's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `f` and returns its output, the most bytes that were live at once
/// above those live when it started, and the bytes live at its end above
/// the start.
async fn measure<T>(f: impl Future<Output = T>) -> (T, u64, i64) {
    let start = LIVE.load(Ordering::SeqCst);
    PEAK.store(start, Ordering::SeqCst);
    let output = f.await;
    let peak = PEAK.load(Ordering::SeqCst) - start;
    let end = LIVE.load(Ordering::SeqCst) - start;
    (output, peak.max(0) as u64, end as i64)
}

/// What the adapter may hold beyond the state: its 1 MiB file buffers, a
/// chunk or two and a record being encoded or decoded.
const OVERHEAD_MAX_BYTES: u64 = 4 << 20;
const VALUE_BYTES: usize = 60 << 10;
const VALUES: u64 = 400;

/// Applies a bootstrap then one entry per op of `ops` (log index 1, 2, …)
/// to `state_machine`.
async fn apply_all(state_machine: &mut StateMachineStore, ops: impl Iterator<Item = Op> + Send) {
    let bootstrap = Op::Bootstrap {
        cluster_id: ClusterId(7),
        config: RegistryConfig::default(),
    };
    apply_after(state_machine, bootstrap, ops).await;
}

/// Applies `bootstrap` then one entry per op of `ops` (log index 1, 2, …;
/// each stamped with its index as its cluster time) to `state_machine`.
async fn apply_after(
    state_machine: &mut StateMachineStore,
    bootstrap: Op,
    ops: impl Iterator<Item = Op> + Send,
) {
    let entries = std::iter::once(bootstrap)
        .chain(ops)
        .zip(1u64..)
        .map(|(op, index)| {
            Ok((
                Entry {
                    log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
                    payload: EntryPayload::Normal(oncekv_core::Entry::single(index, op)),
                },
                None,
            ))
        });
    state_machine
        .apply(futures::stream::iter(entries))
        .await
        .expect("apply");
}

/// A state machine holding `VALUES` values of `VALUE_BYTES` (~24 MiB).
async fn filled(dir: &std::path::Path) -> StateMachineStore {
    let mut state_machine = StateMachineStore::open(dir).expect("open");
    let puts = (0..VALUES).map(|i| Op::ExecutePlain {
        cluster_id: ClusterId(7),
        command: Command::Put {
            key: format!("key-{i:05}").into_bytes(),
            value: Value::Bytes(vec![i as u8; VALUE_BYTES]),
        },
    });
    apply_all(&mut state_machine, puts).await;
    assert_eq!(
        state_machine.state().read().registry.applied_index(),
        VALUES + 1
    );
    state_machine
}

/// The size of the largest file in `dir` (its snapshot).
fn snapshot_file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.metadata().unwrap().len())
        .max()
        .unwrap_or(0)
}

/// Building a snapshot encodes the state straight into its file, and
/// serving the current snapshot opens that file: neither holds the
/// snapshot's bytes. Installing it into another state machine (a copy of
/// the file, as openraft's suite does) holds the decoded state and the
/// buffers, nothing more.
#[tokio::test(flavor = "current_thread")]
async fn building_serving_and_installing_hold_no_copy_of_the_snapshot() {
    let _serial = SERIAL.lock().await;
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = filled(leader_dir.path()).await;

    let (built, build_peak, _) = measure(async {
        leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build")
    })
    .await;
    let snapshot_bytes = snapshot_file_bytes(leader_dir.path());
    assert!(snapshot_bytes > VALUES * VALUE_BYTES as u64);
    eprintln!(
        "snapshot {} KiB; building held {} KiB",
        snapshot_bytes >> 10,
        build_peak >> 10
    );
    assert!(
        build_peak <= OVERHEAD_MAX_BYTES,
        "building a {} KiB snapshot held {} KiB",
        snapshot_bytes >> 10,
        build_peak >> 10
    );
    drop(built);

    let (current, serve_peak, _) =
        measure(async { leader.get_current_snapshot().await.expect("serve") }).await;
    let current = current.expect("a current snapshot");
    eprintln!("serving held {} KiB", serve_peak >> 10);
    assert!(
        serve_peak <= OVERHEAD_MAX_BYTES,
        "serving held {} KiB",
        serve_peak >> 10
    );

    let follower_dir = tempfile::tempdir().unwrap();
    let mut follower = StateMachineStore::open(follower_dir.path()).expect("open");
    let ((), install_peak, state_bytes) = measure(async {
        follower
            .install_snapshot(&current.meta, current.snapshot)
            .await
            .expect("install")
    })
    .await;
    eprintln!(
        "installing held {} KiB beyond the {} KiB of state it keeps",
        install_peak.saturating_sub(state_bytes.max(0) as u64) >> 10,
        state_bytes >> 10
    );
    assert_eq!(follower.state().read().registry.applied_index(), VALUES + 1);
    assert!(
        install_peak <= state_bytes.max(0) as u64 + OVERHEAD_MAX_BYTES,
        "installing held {} KiB for {} KiB of state",
        install_peak >> 10,
        state_bytes >> 10
    );
}

/// Sending reads the snapshot from its file a chunk at a time, and a
/// receiver writes each chunk to a temporary file as it arrives: the whole
/// transfer holds a chunk or two, never the snapshot. Finishing the
/// reception decodes the state from the file and installing it renames the
/// file into place: together they hold the decoded state and buffers.
#[tokio::test(flavor = "current_thread")]
async fn sending_and_receiving_hold_a_chunk_then_the_state() {
    let _serial = SERIAL.lock().await;
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = filled(leader_dir.path()).await;
    leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
    let snapshot_bytes = snapshot_file_bytes(leader_dir.path());
    let current = leader
        .get_current_snapshot()
        .await
        .expect("serve")
        .expect("a current snapshot");
    let meta = current.meta.clone();

    let follower_dir = tempfile::tempdir().unwrap();
    let mut follower = StateMachineStore::open(follower_dir.path()).expect("open");
    let inbox = follower.snapshot_inbox();
    let (incoming, transfer_peak, _) = measure(async {
        let mut incoming = inbox.receive(&meta).await.expect("receive");
        let mut chunks = std::pin::pin!(current.snapshot.into_chunks(1 << 20));
        while let Some(chunk) = chunks.next().await {
            incoming.write(chunk.expect("read")).await.expect("write");
        }
        incoming
    })
    .await;
    eprintln!(
        "snapshot {} KiB; sending and receiving held {} KiB",
        snapshot_bytes >> 10,
        transfer_peak >> 10
    );
    assert!(
        transfer_peak <= OVERHEAD_MAX_BYTES,
        "sending and receiving a {} KiB snapshot held {} KiB",
        snapshot_bytes >> 10,
        transfer_peak >> 10
    );

    let ((), install_peak, state_bytes) = measure(async {
        let received = incoming.finish().await.expect("a whole snapshot");
        follower
            .install_snapshot(&meta, received)
            .await
            .expect("install")
    })
    .await;
    eprintln!(
        "decoding and installing held {} KiB beyond the {} KiB of state it keeps",
        install_peak.saturating_sub(state_bytes.max(0) as u64) >> 10,
        state_bytes >> 10
    );
    assert_eq!(follower.state().read().registry.applied_index(), VALUES + 1);
    assert!(
        install_peak <= state_bytes.max(0) as u64 + OVERHEAD_MAX_BYTES,
        "decoding and installing held {} KiB for {} KiB of state",
        install_peak >> 10,
        state_bytes >> 10
    );
}

/// Enough key records that the install into memory keeps four times what
/// the install into the store holds at its peak — a fixed ~4 MiB of
/// chunks in flight and the store's write buffers, whatever the count.
/// (At 30,000 records, ~15 MiB kept, the margin was a few hundred KiB, and
/// the test failed on a loaded machine at 3,985 KiB against 3,846.)
const KEYS: u64 = 60_000;

/// A state machine with a record store holding `KEYS` idempotency-key
/// records, and a snapshot built (its records flushed into the store).
async fn with_key_records(dir: &std::path::Path) -> StateMachineStore {
    let mut state_machine =
        StateMachineStore::open_with_records(&dir.join("snapshots"), &dir.join("state"))
            .expect("open");
    let keyed = (0..KEYS).map(|i| Op::ExecuteKeyed {
        cluster_id: ClusterId(7),
        key: oncekv_core::IdempotencyKey(format!("message-{i:08}").into_bytes()),
        command: Command::Put {
            key: format!("key-{:05}", i % 1000).into_bytes(),
            value: Value::Bytes(vec![i as u8; 64]),
        },
        principal: oncekv_core::Principal::anonymous(),
    });
    apply_all(&mut state_machine, keyed).await;
    assert_eq!(
        state_machine.state().read().registry.key_count() as u64,
        KEYS
    );
    state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
    state_machine
}

/// `follower` after receiving (in 1 MiB chunks) and installing `current`.
async fn install(
    mut follower: StateMachineStore,
    current: oncekv::raft_types::Snapshot,
) -> StateMachineStore {
    let meta = current.meta.clone();
    let inbox = follower.snapshot_inbox();
    let mut incoming = inbox.receive(&meta).await.expect("receive");
    let mut chunks = std::pin::pin!(current.snapshot.into_chunks(1 << 20));
    while let Some(chunk) = chunks.next().await {
        incoming.write(chunk.expect("read")).await.expect("write");
    }
    let received = incoming.finish().await.expect("a whole snapshot");
    follower
        .install_snapshot(&meta, received)
        .await
        .expect("install");
    follower
}

/// A fresh state machine with a record store under `dir`.
fn with_store(dir: &std::path::Path) -> StateMachineStore {
    StateMachineStore::open_with_records(&dir.join("snapshots"), &dir.join("state")).expect("open")
}

/// Receiving and installing a snapshot of idempotency-key records on a
/// node with a record store streams them into the store as they arrive:
/// the node holds none of them after, and while it installs holds far
/// less than the same install into memory keeps (measured here too).
#[tokio::test(flavor = "current_thread")]
async fn installing_key_records_into_the_store_holds_none_of_them() {
    let _serial = SERIAL.lock().await;
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = with_key_records(leader_dir.path()).await;
    let (follower, _store_dir) = install_into_memory_then_store(
        &mut leader,
        "key records",
        KEYS,
        Registry::key_records_held,
    )
    .await;
    assert_eq!(follower.state().read().registry.key_count() as u64, KEYS);
}

/// Installs `leader`'s current snapshot twice: into a node without a
/// record store, which keeps all `records` in memory (`held` counts them),
/// then into a fresh node with one, which must hold none of them after and
/// at most a quarter of what the first install kept while it installs.
/// Returns the second node and its directory.
async fn install_into_memory_then_store(
    leader: &mut StateMachineStore,
    what: &str,
    records: u64,
    held: fn(&Registry) -> usize,
) -> (StateMachineStore, tempfile::TempDir) {
    let memory_dir = tempfile::tempdir().unwrap();
    let in_memory = StateMachineStore::open(memory_dir.path()).expect("open");
    let current = leader.get_current_snapshot().await.unwrap().unwrap();
    let (in_memory, _, held_bytes) = measure(install(in_memory, current)).await;
    assert_eq!(held(&in_memory.state().read().registry), records as usize);
    drop(in_memory);

    let store_dir = tempfile::tempdir().unwrap();
    let follower = with_store(store_dir.path());
    let current = leader.get_current_snapshot().await.unwrap().unwrap();
    let (follower, peak, kept) = measure(install(follower, current)).await;
    eprintln!(
        "{records} {what}: installed into memory, kept {} KiB; into the store, held {} KiB at most and kept {} KiB",
        held_bytes >> 10,
        peak >> 10,
        kept >> 10
    );
    assert_eq!(held(&follower.state().read().registry), 0);
    assert!(
        peak * 4 <= held_bytes.max(0) as u64,
        "installing into the store held {} KiB at most; into memory kept {} KiB",
        peak >> 10,
        held_bytes >> 10
    );
    (follower, store_dir)
}

const CLAIMS: u64 = 40_000;

/// A state machine with a record store at rules version 3 holding `CLAIMS`
/// completed claims (64-byte results), and a snapshot built (the finished
/// claims flushed into the store).
async fn with_claim_records(dir: &std::path::Path) -> StateMachineStore {
    let mut state_machine = with_store(dir);
    let bootstrap = Op::BootstrapWithRules {
        cluster_id: ClusterId(7),
        config: RegistryConfig::default(),
        rules: RulesVersion::V3,
    };
    let key = |i: u64| IdempotencyKey(format!("job-{i:08}").into_bytes());
    // Claim i is at log index 2 + 2i, its fence.
    let cycles = (0..CLAIMS).flat_map(move |i| {
        [
            Op::Claim(Claim {
                cluster_id: ClusterId(7),
                principal: Principal::anonymous(),
                key: key(i),
                fingerprint: claim_fingerprint(b"job"),
                lease_ms: 60_000,
                claim_id: Nonce(u128::from(i) + 1),
            }),
            Op::CompleteClaim {
                cluster_id: ClusterId(7),
                principal: Principal::anonymous(),
                key: key(i),
                fence: 2 + 2 * i,
                result: vec![i as u8; 64],
            },
        ]
    });
    apply_after(&mut state_machine, bootstrap, cycles).await;
    {
        let state = state_machine.state();
        let applied = state.read();
        assert_eq!(applied.registry.claim_count() as u64, CLAIMS);
        assert_eq!(applied.registry.claims_held(), 0, "every claim completed");
    }
    state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
    assert_eq!(
        state_machine
            .state()
            .read()
            .registry
            .claim_records_in_memory(),
        0,
        "the build moved the finished claims into the store"
    );
    state_machine
}

/// The same for finished claims (rules version 3): installed into a node
/// with a record store they stream into it, none held after, and the
/// install holds far less than one into memory keeps.
#[tokio::test(flavor = "current_thread")]
async fn installing_finished_claims_into_the_store_holds_none_of_them() {
    let _serial = SERIAL.lock().await;
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = with_claim_records(leader_dir.path()).await;
    let (follower, _store_dir) = install_into_memory_then_store(
        &mut leader,
        "finished claims",
        CLAIMS,
        Registry::claim_records_in_memory,
    )
    .await;
    {
        let state = follower.state();
        let applied = state.read();
        assert_eq!(applied.registry.claim_count() as u64, CLAIMS);
        assert_eq!(
            oncekv_core::snapshot::state_hash(&applied.registry),
            oncekv_core::snapshot::state_hash(&leader.state().read().registry),
            "the follower's state hash is the leader's"
        );
        // And the records themselves are in its store.
        for i in [0, CLAIMS / 2, CLAIMS - 1] {
            let key = IdempotencyKey(format!("job-{i:08}").into_bytes());
            let view = state
                .claim_view(&applied.registry, &Principal::anonymous(), &key)
                .expect("read the store")
                .unwrap_or_else(|| panic!("claim {i} in the follower's store"));
            assert_eq!(
                view.record.state,
                oncekv_core::ClaimState::Completed {
                    completed_ms: 3 + 2 * i,
                    result: vec![i as u8; 64],
                },
                "claim {i}"
            );
        }
    }
}
