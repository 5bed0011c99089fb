//! Benchmark of the registry core alone (no Raft, no IO): applies per second
//! for new executes, duplicates and a mix, and for keyed executes
//! (`Op::ExecuteKeyed`: new keys, duplicates); bytes of memory per idle
//! session and per live idempotency key; and the loadgen's shape (batches of
//! 64 puts of 64 bytes over 256 clients' existing keys) through a session
//! (`Op::Execute`) and without one (`Op::ExecutePlain`), the registry's
//! share of Execute's cost over ExecutePlain's. Run with `cargo bench -p
//! oncekv-core --bench registry`.

use criterion::{Criterion, Throughput};
use oncekv_core::{
    ClientId, ClusterId, Command, ConfigPatch, Entry, Execute, IdempotencyKey, KeyedConfigPatch,
    Nonce, Op, Principal, Registry, RegistryConfig,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

/// Counts live heap bytes, to measure memory per session.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CLUSTER: ClusterId = ClusterId(1);
const SESSIONS: u64 = 1_000;

/// A registry with `SESSIONS` sessions (client ids 2..) and the index of
/// its last entry.
fn registry_with_sessions(sessions: u64) -> (Registry, u64) {
    let mut registry = Registry::new();
    let config = RegistryConfig {
        sessions_max: sessions + 1,
        ..RegistryConfig::default()
    };
    registry.apply(
        1,
        &Entry::single(
            0,
            Op::Bootstrap {
                cluster_id: CLUSTER,
                config,
            },
        ),
    );
    for index in 2..sessions + 2 {
        registry.apply(
            index,
            &Entry::single(
                0,
                Op::Register {
                    cluster_id: Some(CLUSTER),
                    nonce: Nonce(u128::from(index) * 0x9e37_79b9_7f4a_7c15),
                    principal: oncekv_core::Principal::anonymous(),
                },
            ),
        );
    }
    (registry, sessions + 1)
}

/// The `n`-th small execute of a round-robin over the sessions: an
/// increment of a per-client counter, acknowledging everything before it.
fn small_execute(n: u64) -> Entry {
    let client = 2 + n % SESSIONS;
    let seq = 1 + n / SESSIONS;
    Entry::single(
        n / 100,
        Op::Execute(Execute {
            cluster_id: CLUSTER,
            client_id: ClientId(client),
            seq,
            first_outstanding_seq: seq,
            command: Command::Increment {
                key: format!("counter-{client}").into_bytes(),
                delta: 1,
            },
            principal: oncekv_core::Principal::anonymous(),
        }),
    )
}

/// Live keys in the `keyed_new_key` bench's steady state: entries are
/// stamped 1 ms apart every 100, so a TTL of `LIVE_KEYS / 100` ms keeps
/// this many keys live, and each new key's apply also expires the oldest.
const LIVE_KEYS: u64 = 100_000;

/// The `n`-th idempotency key: `order-` and 10 digits (16 bytes).
fn idempotency_key(n: u64) -> IdempotencyKey {
    IdempotencyKey(format!("order-{n:010}").into_bytes())
}

/// The keyed execute of key `n` stamped at `stamp_ms`: an increment of one
/// shared counter (so the key-value store does not grow with the keys; a
/// key's record caches the small result).
fn keyed_execute(n: u64, stamp_ms: u64) -> Entry {
    Entry::single(
        stamp_ms,
        Op::ExecuteKeyed {
            cluster_id: CLUSTER,
            key: idempotency_key(n),
            command: Command::Increment {
                key: b"counter".to_vec(),
                delta: 1,
            },
            principal: Principal::anonymous(),
        },
    )
}

/// A bootstrapped registry, no sessions, whose keys live `ttl_ms`; and
/// the index of its last entry.
fn registry_for_keys(ttl_ms: u64) -> (Registry, u64) {
    let (mut registry, index) = registry_with_sessions(0);
    registry.apply(
        index + 1,
        &Entry::single(
            0,
            Op::PatchConfigs {
                cluster_id: CLUSTER,
                patch: ConfigPatch::default(),
                keyed: KeyedConfigPatch {
                    idempotency_key_ttl_ms: Some(ttl_ms),
                    ..KeyedConfigPatch::default()
                },
            },
        ),
    );
    (registry, index + 1)
}

/// Applies `iterations` entries produced by `entry`, timing only the applies.
fn time_applies(
    registry: &mut Registry,
    index: &mut u64,
    entries: impl Iterator<Item = Entry>,
) -> Duration {
    let entries: Vec<Entry> = entries.collect();
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let start = std::time::Instant::now();
    for entry in &entries {
        *index += 1;
        black_box(registry.apply(*index, entry));
    }
    start.elapsed()
}

fn applies(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("apply");
    group.throughput(Throughput::Elements(1));

    group.bench_function("new_execute", |bench| {
        let (mut registry, mut index) = registry_with_sessions(SESSIONS);
        let mut next = 0u64;
        bench.iter_custom(|iterations| {
            let first = next;
            next += iterations;
            time_applies(&mut registry, &mut index, (first..next).map(small_execute))
        });
    });

    group.bench_function("duplicate", |bench| {
        let (mut registry, mut index) = registry_with_sessions(SESSIONS);
        for n in 0..SESSIONS {
            index += 1;
            registry.apply(index, &small_execute(n));
        }
        bench.iter_custom(|iterations| {
            let retries = (0..iterations).map(|n| small_execute(n % SESSIONS));
            time_applies(&mut registry, &mut index, retries)
        });
    });

    group.bench_function("mix_80_new_20_duplicate", |bench| {
        let (mut registry, mut index) = registry_with_sessions(SESSIONS);
        let mut next = 0u64;
        bench.iter_custom(|iterations| {
            let mut entries = Vec::with_capacity(iterations as usize);
            for n in 0..iterations {
                if n % 5 == 4 && next > 0 {
                    entries.push(small_execute(next - 1));
                } else {
                    entries.push(small_execute(next));
                    next += 1;
                }
            }
            time_applies(&mut registry, &mut index, entries.into_iter())
        });
    });
    group.finish();
}

fn keyed_applies(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("apply_keyed");
    group.throughput(Throughput::Elements(1));

    // New keys at a steady LIVE_KEYS live keys: each apply records its key
    // and expires the oldest (as a cluster at its TTL does).
    group.bench_function("new_key", |bench| {
        let (mut registry, mut index) = registry_for_keys(LIVE_KEYS / 100);
        for n in 0..LIVE_KEYS {
            index += 1;
            registry.apply(index, &keyed_execute(n, n / 100));
        }
        assert_eq!(registry.key_count() as u64, LIVE_KEYS, "keys are live");
        let mut next = LIVE_KEYS;
        bench.iter_custom(|iterations| {
            let first = next;
            next += iterations;
            let entries = (first..next).map(|n| keyed_execute(n, n / 100));
            time_applies(&mut registry, &mut index, entries)
        });
    });

    // Repeats of live keys' commands: answered from the keys' records.
    group.bench_function("duplicate", |bench| {
        let (mut registry, mut index) = registry_for_keys(24 * 3_600_000);
        for n in 0..SESSIONS {
            index += 1;
            registry.apply(index, &keyed_execute(n, 0));
        }
        bench.iter_custom(|iterations| {
            let retries = (0..iterations).map(|n| keyed_execute(n % SESSIONS, 0));
            time_applies(&mut registry, &mut index, retries)
        });
    });
    group.finish();
}

/// Heap bytes per idle session (registered, no cached responses).
fn memory_per_idle_session() {
    const COUNT: u64 = 100_000;
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let (registry, _) = registry_with_sessions(COUNT);
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    let per_session = (after - before) as f64 / COUNT as f64;
    println!(
        "memory per idle session: {per_session:.0} bytes ({COUNT} sessions, {} live)",
        registry.session_count()
    );
}

/// Heap bytes per live idempotency key (a 16-byte key of the anonymous
/// principal, its record caching an increment's result), measured as
/// [`memory_per_idle_session`] measures sessions.
fn memory_per_live_key() {
    const COUNT: u64 = 100_000;
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let (mut registry, mut index) = registry_for_keys(24 * 3_600_000);
    for n in 0..COUNT {
        index += 1;
        registry.apply(index, &keyed_execute(n, 0));
    }
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    let per_key = (after - before) as f64 / COUNT as f64;
    println!(
        "memory per live idempotency key: {per_key:.0} bytes ({COUNT} keys of 16 bytes, {} live)",
        registry.key_count()
    );
}

/// The state hash and the snapshot encoding of a registry holding 200,000
/// live idempotency keys (and nothing else to speak of): what a node pays
/// for a `Status` hash or a snapshot at that size.
#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn hash_and_snapshot_with_keys() {
    const COUNT: u64 = 200_000;
    let (mut registry, mut index) = registry_for_keys(24 * 3_600_000);
    for n in 0..COUNT {
        index += 1;
        registry.apply(index, &keyed_execute(n, 0));
    }
    let started = Instant::now();
    let hash = oncekv_core::snapshot::state_hash(&registry);
    let hashed = started.elapsed();
    let started = Instant::now();
    let bytes = oncekv_core::snapshot::to_bytes(&registry);
    let encoded = started.elapsed();
    println!(
        "with {COUNT} keys: state hash {:.2} ms ({}…), snapshot {:.1} ms ({} bytes)",
        hashed.as_secs_f64() * 1e3,
        &hash.to_string()[..8],
        encoded.as_secs_f64() * 1e3,
        bytes.len()
    );
}

/// Clients of the `loadgen_batch` benches, requests per entry, keys per client.
const LOADGEN_CLIENTS: u64 = 256;
const LOADGEN_BATCH: u64 = 64;
const LOADGEN_KEYS: u64 = 1_000;

/// The `n`-th put of the load generator's pattern: client `n % 256` writes
/// 64 bytes to its key `(n / 256) % 1000`; `session` chooses Execute (the
/// client's session, acknowledging everything before) or ExecutePlain.
fn loadgen_put(n: u64, session: bool) -> Op {
    let worker = n % LOADGEN_CLIENTS;
    let round = n / LOADGEN_CLIENTS;
    let command = Command::Put {
        key: format!("k{worker}-{}", round % LOADGEN_KEYS).into_bytes(),
        value: oncekv_core::Value::Bytes(vec![b'x'; 64]),
    };
    if session {
        Op::Execute(Execute {
            cluster_id: CLUSTER,
            client_id: ClientId(2 + worker),
            seq: round + 1,
            first_outstanding_seq: round + 1,
            command,
            principal: Principal::anonymous(),
        })
    } else {
        Op::ExecutePlain {
            cluster_id: CLUSTER,
            command,
        }
    }
}

/// Entries of [`LOADGEN_BATCH`] puts starting at put `first`, one per ms.
fn loadgen_entries(first: u64, count: u64, session: bool) -> Vec<Entry> {
    (0..count)
        .map(|entry| {
            let start = first + entry * LOADGEN_BATCH;
            Entry {
                stamp_ms: start / LOADGEN_BATCH,
                ops: (start..start + LOADGEN_BATCH)
                    .map(|n| loadgen_put(n, session))
                    .collect(),
            }
        })
        .collect()
}

fn loadgen_batches(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("loadgen_batch");
    group.throughput(Throughput::Elements(LOADGEN_BATCH));
    for (name, session) in [("execute", true), ("execute_plain", false)] {
        group.bench_function(name, |bench| {
            let (mut registry, mut index) = registry_with_sessions(LOADGEN_CLIENTS);
            // Every key exists first, as after the benchmark's first run.
            let warm = LOADGEN_CLIENTS * LOADGEN_KEYS;
            for entry in loadgen_entries(0, warm / LOADGEN_BATCH, false) {
                index += 1;
                registry.apply(index, &entry);
            }
            let mut next = warm;
            bench.iter_custom(|iterations| {
                let entries = loadgen_entries(next, iterations, session);
                next += iterations * LOADGEN_BATCH;
                time_applies(&mut registry, &mut index, entries.into_iter())
            });
        });
    }
    group.finish();
}

fn main() {
    memory_per_idle_session();
    memory_per_live_key();
    hash_and_snapshot_with_keys();
    let mut criterion = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    applies(&mut criterion);
    keyed_applies(&mut criterion);
    loadgen_batches(&mut criterion);
    criterion.final_summary();
}
