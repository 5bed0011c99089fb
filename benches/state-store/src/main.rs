//! Embedded stores for the records of idempotency keys beyond RAM (issue 26,
//! phase 1): sled 0.34.7 (already in the tree) against fjall 3 (a
//! maintained LSM), on the registry's workload, so that phase 2 picks its
//! store by figures. A plain bench binary (`harness = false`) printing one
//! table, because the figures that matter at 1 M and 10 M records (bytes on
//! disk per record, RSS, rates at size) are one long run each, not the
//! repeated short iterations criterion times.
//!
//! The workload, per record: a 32-byte key (what a (principal, idempotency
//! key) hashes to) and a ~100-byte record (16-byte fingerprint, cluster
//! time, a 64-byte answer, the principal), incompressible. Records are
//! created in time order and belong to creation-time groups (`--groups`,
//! the records split evenly), as expiry by group would keep them.
//!
//! - insert: every record, in batches of `--batch`, each batch one durable
//!   commit (sled `flush`, fjall `persist(SyncData)`), as apply would commit
//!   one batch of entries with its applied index;
//! - get-hit / get-miss: point lookups of random existing keys / of keys
//!   never written (a new idempotency key is a miss first);
//! - expire: the oldest groups, oldest first, until a tenth of the records
//!   went, each group one durable commit;
//! - scan: every live record through the store's most consistent view (a
//!   fjall snapshot; sled has no point-in-time read), what sending a
//!   snapshot of the store to a new node would read;
//! - disk bytes per live record after the load and after expiry (allocated
//!   blocks of every file, once background flushes and compactions settle),
//!   and the process's RSS (the block caches are `--cache-mb` each).
//!
//! Two layouts, for both stores:
//! - `flat`: one key space; a record at `r` ‖ key (its group first in the
//!   value), an age index entry at `a` ‖ group ‖ key. Lookup is one get;
//!   expiry scans the group's age entries and deletes both, per record.
//! - `grouped`: one tree (sled) / keyspace (fjall) per group. Lookup probes
//!   the live groups newest first (fjall skips most by its bloom filters);
//!   expiry drops the group's tree / keyspace whole.
//! - `lazy` (fjall only: sled has no compaction filter): `flat` without the
//!   age index. Expiry moves a watermark (groups below it are gone: a
//!   lookup that finds a record of such a group treats it as absent), O(1);
//!   a compaction filter drops those records when compaction rewrites
//!   their tables. `reclaim_s` is a forced major compaction after expiry,
//!   the work the background would do.
//!
//! Every configuration runs in its own process (this binary re-run with
//! `--run STORE LAYOUT`) so its RSS is its own. Each phase is bounded by
//! `--seconds`; a phase cut short says so (its `n`).
//!
//! Run from the repository root:
//! `cargo run --release --manifest-path benches/state-store/Cargo.toml -- --records 1000000` (add
//! `--stores fjall --layouts grouped` to narrow it, `--dir PATH` to place
//! the stores on another disk than the system's temporary directory).

// A benchmark measures time: it reads the clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const KEY_BYTES: usize = 32;
const RECORD_BYTES: usize = 100;
const PRINCIPAL: &[u8] = b"tenant-1";

#[derive(Clone, Debug)]
struct Options {
    records: u64,
    groups: u64,
    batch: usize,
    cache_mb: u64,
    seconds: u64,
    lookups: u64,
    stores: Vec<String>,
    layouts: Vec<String>,
    dir: Option<PathBuf>,
    run: Option<(String, String)>,
}

fn parse() -> Options {
    let mut options = Options {
        records: 1_000_000,
        groups: 32,
        batch: 1_000,
        cache_mb: 256,
        seconds: 600,
        lookups: 200_000,
        stores: vec!["sled".into(), "fjall".into()],
        layouts: vec!["flat".into(), "grouped".into(), "lazy".into()],
        dir: None,
        run: None,
    };
    let mut args = std::env::args().skip(1);
    let number = |value: Option<String>, name: &str| -> u64 {
        value
            .and_then(|value| value.replace('_', "").parse().ok())
            .unwrap_or_else(|| panic!("{name} takes a number"))
    };
    let list = |value: Option<String>| -> Vec<String> {
        value
            .unwrap_or_default()
            .split(',')
            .map(str::to_owned)
            .collect()
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--records" => options.records = number(args.next(), "--records"),
            "--groups" => options.groups = number(args.next(), "--groups").max(1),
            "--batch" => options.batch = number(args.next(), "--batch").max(1) as usize,
            "--cache-mb" => options.cache_mb = number(args.next(), "--cache-mb"),
            "--seconds" => options.seconds = number(args.next(), "--seconds"),
            "--lookups" => options.lookups = number(args.next(), "--lookups"),
            "--stores" => options.stores = list(args.next()),
            "--layouts" => options.layouts = list(args.next()),
            "--dir" => options.dir = args.next().map(PathBuf::from),
            "--run" => {
                let store = args.next().expect("--run STORE LAYOUT");
                let layout = args.next().expect("--run STORE LAYOUT");
                options.run = Some((store, layout));
            }
            // What cargo bench passes to every bench binary.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    options
}

// ---- the workload -----------------------------------------------------------

fn key(i: u64) -> [u8; KEY_BYTES] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"key");
    hasher.update(&i.to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// Fingerprint 16 | created_ms 8 | answer 64 | principal length 1 |
/// principal 8 | padding to 100.
fn record(i: u64, group: u64) -> [u8; RECORD_BYTES] {
    let mut out = [0u8; RECORD_BYTES];
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"record");
    hasher.update(&i.to_le_bytes());
    let mut stream = hasher.finalize_xof();
    stream.fill(&mut out[..16]);
    out[16..24].copy_from_slice(&(group * 3_600_000 + i % 3_600_000).to_le_bytes());
    stream.fill(&mut out[24..88]);
    out[88] = PRINCIPAL.len() as u8;
    out[89..89 + PRINCIPAL.len()].copy_from_slice(PRINCIPAL);
    out
}

fn group_of(i: u64, options: &Options) -> u64 {
    i * options.groups / options.records.max(1)
}

/// A small deterministic generator for the lookups' indexes.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn flat_record_key(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + KEY_BYTES);
    out.push(b'r');
    out.extend_from_slice(key);
    out
}

fn flat_age_key(group: u64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + KEY_BYTES);
    out.push(b'a');
    out.extend_from_slice(&group.to_be_bytes());
    out.extend_from_slice(key);
    out
}

fn flat_age_prefix(group: u64) -> Vec<u8> {
    let mut out = vec![b'a'];
    out.extend_from_slice(&group.to_be_bytes());
    out
}

fn flat_value(group: u64, record: &[u8]) -> Vec<u8> {
    let mut out = group.to_be_bytes().to_vec();
    out.extend_from_slice(record);
    out
}

fn group_name(group: u64) -> String {
    format!("g{group:010}")
}

// ---- the stores -----------------------------------------------------------------

trait Store {
    /// Writes `batch` (all of `group`) and makes it durable.
    fn insert_batch(&mut self, group: u64, batch: &[([u8; KEY_BYTES], [u8; RECORD_BYTES])]);
    /// The record's length, if the key has one.
    fn get(&self, key: &[u8]) -> Option<usize>;
    /// Removes every record of `group` durably (it holds `records`, as the
    /// registry's per-group summary would say); how many went.
    fn expire_group(&mut self, group: u64, batch: usize, records: u64) -> u64;
    /// Lets background flushes and compactions finish (bounded).
    fn settle(&mut self);
    /// Reads every live record (the most consistent view the store has);
    /// (records, bytes).
    fn scan(&self) -> (u64, u64);
    /// Reclaims the space of expired records now, if the store defers it;
    /// whether it did.
    fn reclaim(&mut self) -> bool {
        false
    }
    /// Bytes of the store's current files (fjall: the tables of the
    /// current version, without obsolete files whose deletion is pending
    /// and without the preallocated journal), if it tells.
    fn live_bytes(&self) -> Option<u64> {
        None
    }
}

struct SledStore {
    db: sled::Db,
    flat: Option<sled::Tree>,
    groups: BTreeMap<u64, sled::Tree>,
}

impl SledStore {
    fn open(dir: &Path, cache_mb: u64, layout: &str) -> SledStore {
        assert!(
            layout != "lazy",
            "sled has no compaction filter: no lazy layout"
        );
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_mb << 20)
            .open()
            .expect("open sled");
        let flat = (layout == "flat").then(|| db.open_tree("records").expect("tree"));
        // Reopened: the group trees there are.
        let mut groups = BTreeMap::new();
        if layout == "grouped" {
            for name in db.tree_names() {
                let group = std::str::from_utf8(&name)
                    .ok()
                    .and_then(|name| name.strip_prefix('g'))
                    .and_then(|group| group.parse::<u64>().ok());
                if let Some(group) = group {
                    groups.insert(group, db.open_tree(&name).expect("tree"));
                }
            }
        }
        SledStore { db, flat, groups }
    }
}

impl Store for SledStore {
    fn insert_batch(&mut self, group: u64, batch: &[([u8; KEY_BYTES], [u8; RECORD_BYTES])]) {
        let mut writes = sled::Batch::default();
        let tree = match &self.flat {
            Some(tree) => {
                for (key, record) in batch {
                    writes.insert(flat_record_key(key), flat_value(group, record));
                    writes.insert(flat_age_key(group, key), &[] as &[u8]);
                }
                tree.clone()
            }
            None => {
                let db = &self.db;
                let tree = self
                    .groups
                    .entry(group)
                    .or_insert_with(|| db.open_tree(group_name(group)).expect("tree"));
                for (key, record) in batch {
                    writes.insert(&key[..], &record[..]);
                }
                tree.clone()
            }
        };
        // One tree: the batch is atomic (a group tree and a meta tree
        // would need a transaction).
        tree.apply_batch(writes).expect("apply_batch");
        self.db.flush().expect("flush");
    }

    fn get(&self, key: &[u8]) -> Option<usize> {
        match &self.flat {
            Some(tree) => tree
                .get(flat_record_key(key))
                .expect("get")
                .map(|v| v.len()),
            None => self
                .groups
                .values()
                .rev()
                .find_map(|tree| tree.get(key).expect("get"))
                .map(|v| v.len()),
        }
    }

    fn expire_group(&mut self, group: u64, batch: usize, _: u64) -> u64 {
        match &self.flat {
            Some(tree) => {
                let mut removed = 0;
                let mut keys = Vec::with_capacity(batch);
                let mut iter = tree.scan_prefix(flat_age_prefix(group));
                loop {
                    keys.clear();
                    for entry in iter.by_ref().take(batch) {
                        keys.push(entry.expect("scan").0);
                    }
                    if keys.is_empty() {
                        break;
                    }
                    let mut writes = sled::Batch::default();
                    for age_key in &keys {
                        writes.remove(flat_record_key(&age_key[9..]));
                        writes.remove(age_key.clone());
                    }
                    tree.apply_batch(writes).expect("apply_batch");
                    self.db.flush().expect("flush");
                    removed += keys.len() as u64;
                }
                removed
            }
            None => {
                let Some(tree) = self.groups.remove(&group) else {
                    return 0;
                };
                let removed = tree.len() as u64;
                drop(tree);
                self.db.drop_tree(group_name(group)).expect("drop_tree");
                self.db.flush().expect("flush");
                removed
            }
        }
    }

    fn settle(&mut self) {
        self.db.flush().expect("flush");
        std::thread::sleep(Duration::from_secs(2));
    }

    fn scan(&self) -> (u64, u64) {
        let mut count = (0, 0);
        let mut add = |value: &[u8]| {
            count.0 += 1;
            count.1 += value.len() as u64;
        };
        match &self.flat {
            Some(tree) => {
                for entry in tree.scan_prefix([b'r']) {
                    add(&entry.expect("scan").1);
                }
            }
            None => {
                for tree in self.groups.values() {
                    for entry in tree.iter() {
                        add(&entry.expect("scan").1);
                    }
                }
            }
        }
        count
    }
}

struct FjallStore {
    db: fjall::Database,
    flat: Option<fjall::Keyspace>,
    groups: BTreeMap<u64, fjall::Keyspace>,
    /// Lazy layout: groups below it are expired; the compaction filter
    /// reads it.
    watermark: Option<Arc<AtomicU64>>,
}

/// Drops records of expired groups (lazy layout) as compaction meets them.
struct ExpiredGroups(Arc<AtomicU64>);

impl fjall::compaction::filter::Factory for ExpiredGroups {
    fn name(&self) -> &str {
        "expired-groups"
    }

    fn make_filter(
        &self,
        _: &fjall::compaction::filter::Context,
    ) -> Box<dyn fjall::compaction::filter::CompactionFilter> {
        Box::new(ExpiredGroupsFilter(self.0.load(Ordering::Acquire)))
    }
}

struct ExpiredGroupsFilter(u64);

impl fjall::compaction::filter::CompactionFilter for ExpiredGroupsFilter {
    fn filter_item(
        &mut self,
        item: fjall::compaction::filter::ItemAccessor<'_>,
        _: &fjall::compaction::filter::Context,
    ) -> fjall::compaction::filter::CompactionFilterResult {
        let value = item.value()?;
        Ok(if value_group(&value) < self.0 {
            fjall::compaction::filter::Verdict::Remove
        } else {
            fjall::compaction::filter::Verdict::Keep
        })
    }
}

/// The group a flat value names first.
fn value_group(value: &[u8]) -> u64 {
    value
        .get(..8)
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(u64::MAX, u64::from_be_bytes)
}

impl FjallStore {
    fn open(dir: &Path, cache_mb: u64, layout: &str) -> FjallStore {
        let watermark = (layout == "lazy").then(|| Arc::new(AtomicU64::new(0)));
        let mut builder = fjall::Database::builder(dir)
            .cache_size(cache_mb << 20)
            .manual_journal_persist(true);
        if let Some(watermark) = &watermark {
            let factory: Arc<dyn fjall::compaction::filter::Factory> =
                Arc::new(ExpiredGroups(watermark.clone()));
            builder = builder.with_compaction_filter_factories(Arc::new(move |name: &str| {
                (name == "records").then(|| factory.clone())
            }));
        }
        let db = builder.open().expect("open fjall");
        let flat = (layout != "grouped").then(|| {
            db.keyspace("records", fjall::KeyspaceCreateOptions::default)
                .expect("keyspace")
        });
        // Reopened: the group keyspaces there are.
        let mut groups = BTreeMap::new();
        if layout == "grouped" {
            for name in db.list_keyspace_names() {
                let group = name
                    .strip_prefix('g')
                    .and_then(|group| group.parse::<u64>().ok());
                if let Some(group) = group {
                    let keyspace = db
                        .keyspace(&name, fjall::KeyspaceCreateOptions::default)
                        .expect("keyspace");
                    groups.insert(group, keyspace);
                }
            }
        }
        FjallStore {
            db,
            flat,
            groups,
            watermark,
        }
    }

    /// Whether a flat value's group is live (always, but in the lazy
    /// layout).
    fn live(&self, value: &[u8]) -> bool {
        self.watermark
            .as_ref()
            .is_none_or(|watermark| value_group(value) >= watermark.load(Ordering::Acquire))
    }

    fn persist(&self) {
        self.db
            .persist(fjall::PersistMode::SyncData)
            .expect("persist");
    }
}

impl Store for FjallStore {
    fn insert_batch(&mut self, group: u64, batch: &[([u8; KEY_BYTES], [u8; RECORD_BYTES])]) {
        let mut writes = self.db.batch();
        match &self.flat {
            Some(keyspace) => {
                for (key, record) in batch {
                    writes.insert(keyspace, flat_record_key(key), flat_value(group, record));
                    if self.watermark.is_none() {
                        writes.insert(keyspace, flat_age_key(group, key), []);
                    }
                }
            }
            None => {
                let db = &self.db;
                let keyspace = self.groups.entry(group).or_insert_with(|| {
                    db.keyspace(&group_name(group), fjall::KeyspaceCreateOptions::default)
                        .expect("keyspace")
                });
                for (key, record) in batch {
                    writes.insert(keyspace, key.to_vec(), record.to_vec());
                }
            }
        }
        // Atomic across keyspaces (the applied index could ride along).
        writes.commit().expect("commit");
        self.persist();
    }

    fn get(&self, key: &[u8]) -> Option<usize> {
        match &self.flat {
            Some(keyspace) => keyspace
                .get(flat_record_key(key))
                .expect("get")
                .filter(|v| self.live(v))
                .map(|v| v.len()),
            None => self
                .groups
                .values()
                .rev()
                .find_map(|keyspace| keyspace.get(key).expect("get"))
                .map(|v| v.len()),
        }
    }

    fn expire_group(&mut self, group: u64, batch: usize, records: u64) -> u64 {
        if let Some(watermark) = &self.watermark {
            // The registry's side: one number moves (and would be
            // committed with the applied index); the records go later.
            watermark.fetch_max(group + 1, Ordering::AcqRel);
            self.persist();
            return records;
        }
        match &self.flat {
            Some(keyspace) => {
                let mut removed = 0;
                let mut keys = Vec::with_capacity(batch);
                let mut iter = keyspace.prefix(flat_age_prefix(group));
                loop {
                    keys.clear();
                    for guard in iter.by_ref().take(batch) {
                        keys.push(guard.key().expect("scan"));
                    }
                    if keys.is_empty() {
                        break;
                    }
                    let mut writes = self.db.batch();
                    for age_key in &keys {
                        writes.remove(keyspace, flat_record_key(&age_key[9..]));
                        writes.remove(keyspace, age_key.clone());
                    }
                    writes.commit().expect("commit");
                    self.persist();
                    removed += keys.len() as u64;
                }
                removed
            }
            None => {
                let Some(keyspace) = self.groups.remove(&group) else {
                    return 0;
                };
                let removed = keyspace.approximate_len() as u64;
                self.db.delete_keyspace(keyspace).expect("delete_keyspace");
                self.persist();
                removed
            }
        }
    }

    fn settle(&mut self) {
        // Memtables into tables, so that the journals behind them can go:
        // what is left on disk is the tables (and a short journal).
        for keyspace in self.flat.iter().chain(self.groups.values()) {
            keyspace.rotate_memtable_and_wait().expect("flush memtable");
        }
        self.persist();
        let deadline = Instant::now() + Duration::from_secs(120);
        std::thread::sleep(Duration::from_millis(500));
        while (self.db.outstanding_flushes() > 0 || self.db.active_compactions() > 0)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn scan(&self) -> (u64, u64) {
        use fjall::Readable as _;
        // One point in time for every keyspace, while writes could go on.
        let snapshot = self.db.snapshot();
        let mut count = (0, 0);
        let mut add = |guard: fjall::Guard| {
            let (_, value) = guard.into_inner().expect("scan");
            if self.live(&value) {
                count.0 += 1;
                count.1 += value.len() as u64;
            }
        };
        match &self.flat {
            Some(keyspace) => snapshot.prefix(keyspace, [b'r']).for_each(&mut add),
            None => {
                for keyspace in self.groups.values() {
                    snapshot.iter(keyspace).for_each(&mut add);
                }
            }
        }
        count
    }

    fn live_bytes(&self) -> Option<u64> {
        Some(
            self.flat
                .iter()
                .chain(self.groups.values())
                .map(fjall::Keyspace::disk_space)
                .sum(),
        )
    }

    fn reclaim(&mut self) -> bool {
        match (&self.flat, &self.watermark) {
            (Some(keyspace), Some(_)) => {
                keyspace.major_compact().expect("major compaction");
                true
            }
            _ => false,
        }
    }
}

// ---- measuring ------------------------------------------------------------------

/// (VmRSS, VmHWM) of this process, in MiB.
fn rss_mb() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Allocated bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_bytes(&entry.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

fn rate(count: u64, elapsed: Duration) -> u64 {
    (count as f64 / elapsed.as_secs_f64().max(1e-9)) as u64
}

/// Runs one configuration in this process; prints one `result` line of
/// `name=value` pairs.
fn run_one(options: &Options, store_name: &str, layout: &str) {
    let base = options.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("oncekv-state-store-")
        .tempdir_in(base)
        .expect("temporary directory");
    let open = || -> Box<dyn Store> {
        match store_name {
            "sled" => Box::new(SledStore::open(dir.path(), options.cache_mb, layout)),
            "fjall" => Box::new(FjallStore::open(dir.path(), options.cache_mb, layout)),
            other => panic!("unknown store {other}"),
        }
    };
    let mut store = open();
    let budget = Duration::from_secs(options.seconds);
    let mut line = format!("result store={store_name} layout={layout}");

    // insert
    let started = Instant::now();
    let mut inserted = 0u64;
    let mut batch = Vec::with_capacity(options.batch);
    let tail_from = options.records - options.records / 10;
    let mut tail_started = None;
    while inserted < options.records && started.elapsed() < budget {
        if inserted >= tail_from && tail_started.is_none() {
            tail_started = Some((Instant::now(), inserted));
        }
        let group = group_of(inserted, options);
        batch.clear();
        while batch.len() < options.batch
            && inserted < options.records
            && group_of(inserted, options) == group
        {
            batch.push((key(inserted), record(inserted, group)));
            inserted += 1;
        }
        store.insert_batch(group, &batch);
    }
    let insert_rate = rate(inserted, started.elapsed());
    let tail_rate = tail_started.map_or(0, |(at, from)| rate(inserted - from, at.elapsed()));
    let _ = write!(
        line,
        " records={inserted} insert_ops_s={insert_rate} insert_last10pct_ops_s={tail_rate}"
    );
    let (rss, _) = rss_mb();
    let _ = write!(line, " rss_after_load_mb={rss}");
    // A restart right after the load (nothing settled: the journal holds
    // what the memtables did): closing, then opening until the first
    // lookup answers.
    let started = Instant::now();
    drop(store);
    let closed_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    store = open();
    assert!(store.get(&key(0)).is_some(), "record 0 after reopening");
    let _ = write!(
        line,
        " close_s={closed_s:.2} reopen_s={:.2}",
        started.elapsed().as_secs_f64()
    );
    store.settle();
    let disk = disk_bytes(dir.path());
    let _ = write!(
        line,
        " disk_mb={} disk_b_per_record={}",
        disk >> 20,
        disk / inserted.max(1)
    );

    // lookups
    let lookup = |store: &dyn Store, offset: u64, expect_hit: bool| {
        let mut random = SplitMix(offset + 7);
        let started = Instant::now();
        let mut done = 0u64;
        while done < options.lookups && started.elapsed() < budget {
            let i = if expect_hit {
                random.next() % inserted
            } else {
                options.records + random.next() % options.records.max(1)
            };
            let found = store.get(&key(i));
            assert_eq!(found.is_some(), expect_hit, "lookup of record {i}");
            done += 1;
        }
        (done, rate(done, started.elapsed()))
    };
    let (hits, hit_rate) = lookup(store.as_ref(), 1, true);
    let (misses, miss_rate) = lookup(store.as_ref(), 2, false);
    let _ = write!(
        line,
        " get_hit_ops_s={hit_rate} get_miss_ops_s={miss_rate} lookups={}",
        hits.min(misses)
    );

    // scan (a snapshot's read)
    let started = Instant::now();
    let (scanned, scanned_bytes) = store.scan();
    let _ = write!(
        line,
        " scan_s={:.2} scan_records={scanned} scan_mb={}",
        started.elapsed().as_secs_f64(),
        scanned_bytes >> 20
    );

    // expire the oldest groups until a tenth went
    let started = Instant::now();
    let mut expired = 0u64;
    let mut groups = 0u64;
    let last_group = group_of(inserted.saturating_sub(1), options);
    while expired < inserted / 10 && groups < last_group && started.elapsed() < budget {
        // i is in group g when g * N <= i * G < (g + 1) * N.
        let first = |g: u64| (g * options.records).div_ceil(options.groups);
        let records = first(groups + 1).min(inserted) - first(groups).min(inserted);
        expired += store.expire_group(groups, options.batch, records);
        groups += 1;
    }
    let elapsed = started.elapsed();
    let _ = write!(
        line,
        " expired={expired} expired_groups={groups} expire_ms_per_group={} expire_records_s={}",
        elapsed.as_millis() as u64 / groups.max(1),
        rate(expired, elapsed)
    );
    let started = Instant::now();
    if store.reclaim() {
        let _ = write!(line, " reclaim_s={:.2}", started.elapsed().as_secs_f64());
    }
    store.settle();
    let live = inserted - expired;
    let disk = disk_bytes(dir.path());
    if let Some(bytes) = store.live_bytes() {
        let _ = write!(line, " tables_b_per_live_record={}", bytes / live.max(1));
    }
    if std::env::var_os("STATE_BENCH_DU").is_some() {
        let _ = Command::new("du").arg("-ab").arg(dir.path()).status();
    }
    let (rss, hwm) = rss_mb();
    let _ = write!(
        line,
        " disk_after_expiry_b_per_live_record={} rss_mb={rss} rss_peak_mb={hwm} cache_mb={}",
        disk / live.max(1),
        options.cache_mb
    );
    println!("{line}");
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or("-")
}

fn main() {
    let options = parse();
    if let Some((store, layout)) = &options.run {
        run_one(&options, store, layout);
        return;
    }
    let exe = std::env::current_exe().expect("this binary");
    let passed: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    println!(
        "state_store: {} records in {} groups, batches of {} (one durable commit each), \
         caches {} MiB, phases bounded at {} s",
        options.records, options.groups, options.batch, options.cache_mb, options.seconds
    );
    let mut lines = Vec::new();
    for store in &options.stores {
        for layout in &options.layouts {
            let output = Command::new(&exe)
                .args(&passed)
                .args(["--run", store, layout])
                .output()
                .expect("run a configuration");
            let text = String::from_utf8_lossy(&output.stdout);
            match text.lines().find(|line| line.starts_with("result ")) {
                Some(line) if output.status.success() => {
                    println!("{line}");
                    lines.push(line.to_owned());
                }
                _ => println!(
                    "result store={store} layout={layout} failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ),
            }
        }
    }
    let columns = [
        ("records", "records"),
        ("insert_ops_s", "insert/s"),
        ("insert_last10pct_ops_s", "insert/s last 10%"),
        ("get_hit_ops_s", "get hit/s"),
        ("get_miss_ops_s", "get miss/s"),
        ("expire_ms_per_group", "expire ms/group"),
        ("expire_records_s", "expired records/s"),
        ("reopen_s", "reopen s"),
        ("scan_s", "scan s"),
        ("reclaim_s", "reclaim s"),
        ("disk_b_per_record", "disk B/record"),
        (
            "tables_b_per_live_record",
            "tables B/live record after expiry",
        ),
        (
            "disk_after_expiry_b_per_live_record",
            "disk B/live record after expiry",
        ),
        ("rss_after_load_mb", "RSS MiB after load"),
        ("rss_peak_mb", "RSS MiB peak"),
    ];
    println!();
    let mut header = String::from("| store | layout |");
    for (_, title) in columns {
        let _ = write!(header, " {title} |");
    }
    println!("{header}");
    println!("{}", header.replace(|c: char| c != '|', "-"));
    for line in &lines {
        let mut row = format!("| {} | {} |", field(line, "store"), field(line, "layout"));
        for (name, _) in columns {
            let _ = write!(row, " {} |", field(line, name));
        }
        println!("{row}");
    }
}
