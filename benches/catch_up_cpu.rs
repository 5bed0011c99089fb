//! The CPU a catch-up by snapshot costs per record, without Raft or
//! network: a state machine with a record store applies KEYS keyed
//! requests (entries of 64, each a new key and a 64-byte put, as
//! `scripts/bench-state.sh` loads a cluster) and builds a snapshot; then,
//! ROUNDS times each, the snapshot is
//!
//! - *sent*: read as a sender does, in 1 MiB chunks, each dropped;
//! - *sent and received*: the same chunks handed to a fresh node's
//!   snapshot inbox (checked and staged into its record store as they
//!   arrive), then installed.
//!
//! It reports the process's CPU time (user + system, every thread: the
//! reading and receiving threads and the store's workers) of the fastest
//! round of each, and the receiver's as the difference. On a machine of
//! two cores this is the work a catch-up adds beside the quorum's request
//! path (docs/state-beyond-ram.md §4.9m):
//!
//! ```text
//! cargo bench --bench catch_up_cpu -- [KEYS] [ROUNDS]
//! ```
//!
//! KEYS defaults to 1,000,000, ROUNDS to 3. The last line:
//! `keys=N send_ns_per_key=S receive_ns_per_key=R snapshot_bytes=B`.

use futures::StreamExt;
use oncekv::raft_types::{Entry, TypeConfig};
use oncekv::storage::StateMachineStore;
use oncekv_core::{
    ClusterId, Command, IdempotencyKey, Op, Principal, RegistryConfig, RulesVersion, Value,
};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use std::time::{Duration, Instant};

const CLUSTER: ClusterId = ClusterId(7);
const OPS_PER_ENTRY: u64 = 64;
const CHUNK_BYTES: usize = 1 << 20;

/// The process's CPU time so far (user + system, all threads).
fn cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes the struct it is given.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let of = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

fn keyed(n: u64) -> Op {
    Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(format!("m-{n:012}").into_bytes()),
        command: Command::Put {
            key: format!("k{}", n % 64_000).into_bytes(),
            value: Value::Bytes(vec![b'v'; 64]),
        },
        principal: Principal::anonymous(),
    }
}

fn with_store(dir: &std::path::Path) -> StateMachineStore {
    StateMachineStore::open_with_records(&dir.join("snapshots"), &dir.join("state"))
        .expect("the state machine opens")
}

/// A state machine under `dir` holding `keys` key records, its snapshot
/// built.
async fn loaded(dir: &std::path::Path, keys: u64) -> StateMachineStore {
    let mut state_machine = with_store(dir);
    // The latest rules: key records on disk, 50 M of them allowed.
    let bootstrap = Op::BootstrapWithRules {
        cluster_id: CLUSTER,
        config: RegistryConfig::default(),
        rules: RulesVersion::LATEST,
    };
    let mut index = 1u64;
    let first = std::iter::once(Ok((
        Entry {
            log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
            payload: EntryPayload::Normal(oncekv_core::Entry::single(1_000, bootstrap)),
        },
        None,
    )));
    state_machine
        .apply(futures::stream::iter(first))
        .await
        .expect("apply");
    let mut next = 0;
    while next < keys {
        let mut entries = Vec::new();
        // A batch of entries per apply call, as openraft hands them over.
        for _ in 0..16 {
            if next == keys {
                break;
            }
            index += 1;
            let count = OPS_PER_ENTRY.min(keys - next);
            let ops: Vec<Op> = (next..next + count).map(keyed).collect();
            next += count;
            entries.push(Ok((
                Entry {
                    log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
                    payload: EntryPayload::Normal(oncekv_core::Entry {
                        stamp_ms: 1_000 + index,
                        ops: ops.into(),
                    }),
                },
                None,
            )));
        }
        state_machine
            .apply(futures::stream::iter(entries))
            .await
            .expect("apply");
    }
    assert_eq!(
        state_machine.state().read().registry.key_count() as u64,
        keys
    );
    state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
    state_machine
}

/// Reads `leader`'s current snapshot as a sender does; its bytes.
async fn send(leader: &mut StateMachineStore) -> u64 {
    let current = leader.get_current_snapshot().await.unwrap().unwrap();
    let mut chunks = std::pin::pin!(current.snapshot.into_chunks(CHUNK_BYTES));
    let mut bytes = 0;
    while let Some(chunk) = chunks.next().await {
        bytes += chunk.expect("read").len() as u64;
    }
    bytes
}

/// Sends `leader`'s current snapshot to a fresh node under `dir`, which
/// receives and installs it.
async fn send_and_receive(leader: &mut StateMachineStore, dir: &std::path::Path, keys: u64) {
    let mut follower = with_store(dir);
    let current = leader.get_current_snapshot().await.unwrap().unwrap();
    let meta = current.meta.clone();
    let inbox = follower.snapshot_inbox();
    let mut incoming = inbox.receive(&meta).await.expect("receive");
    let mut chunks = std::pin::pin!(current.snapshot.into_chunks(CHUNK_BYTES));
    while let Some(chunk) = chunks.next().await {
        incoming.write(chunk.expect("read")).await.expect("write");
    }
    let received = incoming.finish().await.expect("a whole snapshot");
    follower
        .install_snapshot(&meta, received)
        .await
        .expect("install");
    assert_eq!(follower.state().read().registry.key_count() as u64, keys);
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn main() {
    // `cargo bench` passes `--bench`; the numbers are ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let keys: u64 = args
        .first()
        .map(|keys| keys.parse().expect("KEYS: a number"))
        .unwrap_or(1_000_000);
    let rounds: u32 = args
        .get(1)
        .map(|rounds| rounds.parse().expect("ROUNDS: a number"))
        .unwrap_or(3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let started = Instant::now();
        let mut leader = loaded(&dir.path().join("leader"), keys).await;
        println!(
            "keys={keys} loaded_s={:.1}",
            started.elapsed().as_secs_f64()
        );
        let (mut send_best, mut both_best, mut bytes) = (Duration::MAX, Duration::MAX, 0);
        for round in 0..rounds {
            let (cpu_at, wall_at) = (cpu(), Instant::now());
            bytes = send(&mut leader).await;
            let (sent, sent_wall) = (cpu() - cpu_at, wall_at.elapsed());
            let follower = dir.path().join(format!("follower-{round}"));
            let (cpu_at, wall_at) = (cpu(), Instant::now());
            send_and_receive(&mut leader, &follower, keys).await;
            let (both, both_wall) = (cpu() - cpu_at, wall_at.elapsed());
            std::fs::remove_dir_all(&follower).expect("the follower's directory goes");
            println!(
                "round={round} send_cpu_s={:.2} send_wall_s={:.2} send_and_receive_cpu_s={:.2} send_and_receive_wall_s={:.2}",
                sent.as_secs_f64(),
                sent_wall.as_secs_f64(),
                both.as_secs_f64(),
                both_wall.as_secs_f64()
            );
            send_best = send_best.min(sent);
            both_best = both_best.min(both);
        }
        let per_key = |cpu: Duration| cpu.as_nanos() as u64 / keys.max(1);
        println!(
            "keys={keys} send_ns_per_key={} receive_ns_per_key={} snapshot_bytes={bytes}",
            per_key(send_best),
            per_key(both_best.saturating_sub(send_best))
        );
    });
}
