//! Idempotency-key records at scale, without Raft or network (issue 26's
//! core-level benchmark): the registry core applies entries of 64 keyed
//! requests — each a new key, a 64-byte put cycling over 64,000 data keys,
//! as `scripts/bench-state.sh` loads a cluster — with the records read
//! from and flushed into the node's record store exactly as the state
//! machine does (`keys_to_fetch` → `OutsideRecords::fetch` →
//! `apply_prefetched`; every 100,000 records, the node's default
//! `--snapshot-every-key-records`, `take_key_changes` → `push` → `flush`
//! at the entry's index). Every 10 % of the way, and at the end, it prints
//! the live keys, the apply rate of the last stretch (requests/s, flushes
//! included), the process RSS and the store's bytes on disk per key:
//!
//! ```text
//! cargo bench --bench records_at_scale -- [KEYS] [DIR] [sequential|random]
//! ```
//!
//! KEYS defaults to 1,000,000 (50,000,000 is the issue's figure); DIR, a
//! directory on the disk to measure (default: a temporary directory; one
//! given is left as it is). Keys are `m-` and the request's number
//! (`sequential`, the default: each flush appends after the previous one
//! in the store's key order) or a 64-bit mix of it in hex (`random`, as
//! message ids or UUIDs are: each flush spans the whole key range, so the
//! store's compaction rewrites what it overlaps). One process, one thread: the figures are the
//! core's and the store's, not a cluster's. The last line:
//! `keys=N rss_mb=M disk_bytes_per_key=B apply_ops_s=R` (R: the last
//! stretch's rate).

use std::time::Instant;

use oncekv::shared::records::OutsideRecords;
use oncekv_core::{
    ClusterId, Command, Entry, IdempotencyKey, Op, Outcome, Principal, Registry, RegistryConfig,
    RulesVersion, Value,
};

const CLUSTER: ClusterId = ClusterId(7);
const OPS_PER_ENTRY: u64 = 64;
const RECORDS_PER_FLUSH: u64 = 100_000;
const DATA_KEYS: u64 = 64_000;

fn rss_mb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

/// splitmix64's finalizer: a bijection, so every key stays distinct.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn keyed(n: u64, random: bool) -> Op {
    let key = if random {
        format!("m-{:016x}", mix(n))
    } else {
        format!("m-{n:012}")
    };
    Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(key.into_bytes()),
        command: Command::Put {
            key: format!("k{}", n % DATA_KEYS).into_bytes(),
            value: Value::Bytes(vec![b'v'; 64]),
        },
        principal: Principal::anonymous(),
    }
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
    let temporary;
    let dir = match args.get(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            temporary = tempfile::tempdir().expect("a temporary directory");
            temporary.path().join("state")
        }
    };
    let random = match args.get(2).map(String::as_str) {
        None | Some("sequential") => false,
        Some("random") => true,
        Some(other) => panic!("key pattern {other}: sequential or random"),
    };
    let records = OutsideRecords::open(&dir).expect("the record store opens");
    let mut registry = Registry::new();
    let bootstrap = Op::BootstrapWithRules {
        cluster_id: CLUSTER,
        config: RegistryConfig::default(),
        rules: RulesVersion::LATEST,
    };
    registry.apply(1, &Entry::single(1_000, bootstrap));
    assert!(
        registry.keyed_config().idempotency_keys_max >= keys,
        "more keys than the default limit"
    );
    println!("keys={keys} dir={} random={random}", dir.display());

    let mut index = 1;
    let mut next = 0u64;
    let mut since_flush = 0u64;
    let report_every = (keys / 10).max(OPS_PER_ENTRY);
    let mut stretch = (Instant::now(), 0u64);
    let started = Instant::now();
    let mut last_rate = 0.0;
    while next < keys {
        index += 1;
        let count = OPS_PER_ENTRY.min(keys - next);
        let ops: Vec<Op> = (next..next + count).map(|n| keyed(n, random)).collect();
        // One millisecond of cluster time per entry: no key expires.
        let entry = Entry {
            stamp_ms: 1_000 + index,
            ops: ops.into(),
        };
        let fetched = records
            .fetch(registry.keys_to_fetch(&entry), Vec::new())
            .expect("the store reads");
        for outcome in registry.apply_prefetched(index, &entry, &fetched) {
            assert!(
                matches!(
                    outcome,
                    Outcome::Executed {
                        duplicate: false,
                        ..
                    }
                ),
                "{outcome:?}"
            );
        }
        next += count;
        since_flush += count;
        if since_flush >= RECORDS_PER_FLUSH || next == keys {
            let pending = records.push(registry.take_record_changes());
            records.flush(pending, index).expect("the store flushes");
            since_flush = 0;
        }
        if next % report_every < OPS_PER_ENTRY || next == keys {
            let seconds = stretch.0.elapsed().as_secs_f64();
            last_rate = (next - stretch.1) as f64 / seconds;
            println!(
                "keys={next} stretch_ops_s={last_rate:.0} rss_mb={} disk_bytes_per_key={} elapsed_s={:.0}",
                rss_mb(),
                records.disk_bytes() / next,
                started.elapsed().as_secs_f64()
            );
            stretch = (Instant::now(), next);
        }
    }
    assert_eq!(registry.key_count() as u64, keys);
    println!(
        "keys={keys} rss_mb={} disk_bytes_per_key={} apply_ops_s={last_rate:.0}",
        rss_mb(),
        records.disk_bytes() / keys
    );
}
