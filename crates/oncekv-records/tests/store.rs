//! The record store's promises, on a real fjall directory: a flush and its
//! checkpoint are one atomic, durable step (reopened after a clean close,
//! after SIGKILL at any point, after a torn journal tail, after a simulated
//! power loss that drops every write not yet synced); views keep their
//! checkpoint's records while flushes and compactions go on; expired
//! groups leave the disk only when no readable checkpoint needs them; an
//! install replaces the generation in force only once it is whole.

use oncekv_records::{Checkpoint, Error, Options, RecordStore, StoredRecord};
use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Records per flush in the batch workload.
const PER_BATCH: u32 = 50;
/// A flush removes the records of the batch this many flushes back.
const KEPT_BATCHES: u64 = 3;

/// The kind of the batch workload's records (the first byte of a key).
const KIND: u8 = 1;

fn key(batch: u64, n: u32) -> Vec<u8> {
    kind_key(KIND, batch, n)
}

fn kind_key(kind: u8, batch: u64, n: u32) -> Vec<u8> {
    let mut key = vec![kind];
    key.extend_from_slice(format!("{batch:08}-{n:04}").as_bytes());
    key
}

fn record(group: u64, text: &str) -> StoredRecord {
    StoredRecord {
        group,
        bytes: text.as_bytes().to_vec(),
    }
}

/// A checkpoint of the batch workload's one kind (written as format 1).
fn checkpoint(watermark: u64, applied: u64) -> Checkpoint {
    kinds_checkpoint(&[(KIND, watermark)], applied)
}

fn kinds_checkpoint(watermarks: &[(u8, u64)], applied: u64) -> Checkpoint {
    Checkpoint {
        watermarks: watermarks.iter().copied().collect(),
        applied: applied.to_be_bytes().to_vec(),
    }
}

/// Flush `batch` of the batch workload: its own records in, the records of
/// the batch `KEPT_BATCHES` back out, checkpoint "applied = batch".
fn flush_batch(store: &RecordStore, batch: u64) {
    let mut changes: Vec<(Vec<u8>, Option<StoredRecord>)> = (0..PER_BATCH)
        .map(|n| {
            (
                key(batch, n),
                Some(record(batch, &format!("answer {batch} {n}"))),
            )
        })
        .collect();
    if batch > KEPT_BATCHES {
        changes.extend((0..PER_BATCH).map(|n| (key(batch - KEPT_BATCHES, n), None)));
    }
    store.flush(changes, &checkpoint(0, batch)).expect("flush");
}

/// The store holds exactly what its checkpoint says the batch workload
/// flushed: batches (c − KEPT_BATCHES, c] whole, nothing else. Returns c.
fn assert_consistent(store: &RecordStore) -> u64 {
    let view = store.view().expect("view");
    let applied = view.checkpoint().map_or(0, |checkpoint| {
        u64::from_be_bytes(checkpoint.applied.as_slice().try_into().expect("8 bytes"))
    });
    let mut batches: BTreeMap<u64, u32> = BTreeMap::new();
    for item in view.records() {
        let (key, record) = item.expect("record");
        let batch: u64 = std::str::from_utf8(&key[1..9])
            .expect("utf-8")
            .parse()
            .expect("batch");
        assert_eq!(record.group, batch);
        *batches.entry(batch).or_default() += 1;
    }
    let expected: BTreeMap<u64, u32> = (applied.saturating_sub(KEPT_BATCHES) + 1..=applied)
        .map(|batch| (batch, PER_BATCH))
        .collect();
    assert_eq!(
        batches, expected,
        "records of batches (count each) at checkpoint {applied}"
    );
    applied
}

/// A flush is there after the store is closed and opened again; removals
/// too.
#[test]
fn flushes_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
        assert_eq!(store.checkpoint().expect("checkpoint"), None);
        for batch in 1..=10 {
            flush_batch(&store, batch);
        }
        assert_eq!(assert_consistent(&store), 10);
    }
    let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    assert_eq!(assert_consistent(&store), 10);
    assert_eq!(
        store.get(&key(10, 7)).expect("get"),
        Some(record(10, "answer 10 7"))
    );
    assert_eq!(store.get(&key(1, 7)).expect("get"), None);
}

/// A view reads its own checkpoint and records while later flushes
/// change both.
#[test]
fn a_view_is_frozen_at_its_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    for batch in 1..=4 {
        flush_batch(&store, batch);
    }
    let view = store.view().expect("view");
    for batch in 5..=8 {
        flush_batch(&store, batch);
    }
    // Written as format 1 (the batch workload names one kind): it reads
    // back as that watermark for every kind.
    let read = view.checkpoint().expect("a checkpoint");
    assert_eq!(read.applied, checkpoint(0, 4).applied);
    assert_eq!((read.watermark(KIND), read.watermark(2)), (0, 0));
    assert_eq!(
        view.records().count(),
        (KEPT_BATCHES as usize) * PER_BATCH as usize
    );
    assert!(view.get(&key(2, 0)).expect("get").is_some());
    assert!(view.get(&key(8, 0)).expect("get").is_none());
    assert_eq!(assert_consistent(&store), 8);
}

/// Ten records in each of `groups`, keyed by group.
fn ten_per_group(
    groups: std::ops::RangeInclusive<u64>,
) -> impl Iterator<Item = (Vec<u8>, Option<StoredRecord>)> {
    groups.flat_map(|group| (0..10u32).map(move |n| (key(group, n), Some(record(group, "r")))))
}

/// Records below the watermark are absent to views at once and leave the
/// disk at compaction, but not while an older view still reads them.
#[test]
fn expired_groups_leave_only_when_no_view_needs_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    store
        .flush(ten_per_group(1..=5), &checkpoint(0, 1))
        .expect("flush");
    let old_view = store.view().expect("view");
    store
        .flush(Vec::new(), &checkpoint(3, 2))
        .expect("raise the watermark");
    let new_view = store.view().expect("view");
    assert_eq!(new_view.records().count(), 30, "groups 3..=5 live");
    assert_eq!(
        old_view.records().count(),
        50,
        "the old view keeps its records"
    );

    store.compact().expect("compact");
    assert_eq!(
        old_view.records().count(),
        50,
        "compaction waits for the old view"
    );
    assert!(store.get(&key(1, 0)).expect("get").is_some());

    drop(old_view);
    drop(new_view);
    store.compact().expect("compact");
    assert_eq!(store.get(&key(1, 0)).expect("get"), None, "group 1 dropped");
    assert_eq!(store.get(&key(2, 9)).expect("get"), None, "group 2 dropped");
    assert!(
        store.get(&key(3, 0)).expect("get").is_some(),
        "group 3 kept"
    );

    assert!(matches!(
        store.flush(Vec::new(), &checkpoint(2, 3)),
        Err(Error::WatermarkBackwards {
            kind: KIND,
            durable: 3,
            requested: 2
        })
    ));
}

/// A scan read in pieces holds one iterator that holds its view: with the
/// caller's handle dropped, flushes after it and an expiry compacted away,
/// it still reads the view's live records, exactly those of a plain scan —
/// decoded, or as the store holds them (the same keys, groups and bytes).
#[test]
fn a_shared_scan_holds_its_view() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    store
        .flush(ten_per_group(1..=5), &checkpoint(2, 1))
        .expect("flush");
    let view = std::sync::Arc::new(store.view().expect("view"));
    let expected: Vec<(Vec<u8>, StoredRecord)> =
        view.records().map(|item| item.expect("record")).collect();
    assert_eq!(expected.len(), 40, "groups 2..=5 live");
    let mut scan = oncekv_records::View::records_from_shared(&view, &[KIND]);
    let mut raw = oncekv_records::View::raw_records_from_shared(&view, &[KIND]);
    let first = scan.next().expect("a record").expect("read");
    let first_raw = raw.next().expect("a record").expect("read");
    drop(view);
    store
        .flush(ten_per_group(6..=7), &checkpoint(4, 2))
        .expect("flush");
    store.compact().expect("compact");
    let read: Vec<(Vec<u8>, StoredRecord)> = std::iter::once(first)
        .chain(scan.map(|item| item.expect("record")))
        .collect();
    assert_eq!(read, expected);
    let read_raw: Vec<(Vec<u8>, StoredRecord)> = std::iter::once(first_raw)
        .chain(raw.map(|item| item.expect("record")))
        .map(|raw| {
            let record = StoredRecord {
                group: raw.group(),
                bytes: raw.bytes().to_vec(),
            };
            (raw.key().to_vec(), record)
        })
        .collect();
    assert_eq!(read_raw, expected);
}

/// Per kind (the key's first byte), live records of `view`, by group.
fn live_by_kind(view: &oncekv_records::View) -> BTreeMap<u8, BTreeMap<u64, u32>> {
    let mut live: BTreeMap<u8, BTreeMap<u64, u32>> = BTreeMap::new();
    for item in view.records() {
        let (key, record) = item.expect("record");
        *live
            .entry(key[0])
            .or_default()
            .entry(record.group)
            .or_default() += 1;
    }
    live
}

/// Ten records in each of `groups`, for each kind.
fn groups_of(
    kinds: &[u8],
    groups: std::ops::RangeInclusive<u64>,
) -> BTreeMap<u8, BTreeMap<u64, u32>> {
    kinds
        .iter()
        .map(|&kind| (kind, groups.clone().map(|group| (group, 10)).collect()))
        .collect()
}

/// Each kind expires by its own watermark: records below it are absent to
/// views at once and leave the disk at compaction (not while an older view
/// reads them), records of a kind without a watermark stay; no kind's
/// watermark moves back, not even by being left out, after a reopen too.
#[test]
fn each_kind_leaves_by_its_own_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    let changes = [1u8, 2, 7].into_iter().flat_map(|kind| {
        (1..=5u64).flat_map(move |group| {
            (0..10u32).map(move |n| (kind_key(kind, group, n), Some(record(group, "r"))))
        })
    });
    store
        .flush(changes, &kinds_checkpoint(&[(1, 0), (2, 0)], 1))
        .expect("flush");
    let old_view = store.view().expect("view");
    store
        .flush(Vec::new(), &kinds_checkpoint(&[(1, 3), (2, 2)], 2))
        .expect("raise the watermarks");
    let new_view = store.view().expect("view");
    let mut live = groups_of(&[1], 3..=5);
    live.extend(groups_of(&[2], 2..=5));
    live.extend(groups_of(&[7], 1..=5));
    assert_eq!(
        live_by_kind(&new_view),
        live,
        "each kind from its own watermark"
    );
    assert_eq!(
        live_by_kind(&old_view),
        groups_of(&[1, 2, 7], 1..=5),
        "the old view keeps its records"
    );

    store.compact().expect("compact");
    assert_eq!(
        live_by_kind(&old_view),
        groups_of(&[1, 2, 7], 1..=5),
        "compaction waits for the old view"
    );
    assert!(store.get(&kind_key(1, 1, 0)).expect("get").is_some());
    assert!(store.get(&kind_key(2, 1, 0)).expect("get").is_some());

    drop(old_view);
    drop(new_view);
    store.compact().expect("compact");
    let kept = |kind: u8, group: u64| store.get(&kind_key(kind, group, 9)).expect("get").is_some();
    assert!(!kept(1, 1) && !kept(1, 2), "kind 1 below 3 dropped");
    assert!(kept(1, 3), "kind 1 from 3 kept");
    assert!(!kept(2, 1), "kind 2 below 2 dropped");
    assert!(
        kept(2, 2),
        "kind 2 from 2 kept, though below kind 1's watermark"
    );
    assert!(kept(7, 1), "a kind without a watermark is never dropped");

    let refused = |store: &RecordStore, watermarks: &[(u8, u64)]| match store
        .flush(Vec::new(), &kinds_checkpoint(watermarks, 3))
    {
        Err(Error::WatermarkBackwards {
            kind,
            durable,
            requested,
        }) => (kind, durable, requested),
        other => panic!("{watermarks:?}: expected WatermarkBackwards, got {other:?}"),
    };
    assert_eq!(refused(&store, &[(1, 3), (2, 1)]), (2, 2, 1));
    assert_eq!(refused(&store, &[(1, 2), (2, 9)]), (1, 3, 2));
    assert_eq!(refused(&store, &[(1, 4)]), (2, 2, 0), "kind 2 left out");
    drop(store);
    let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    assert_eq!(refused(&store, &[(1, 3), (2, 1)]), (2, 2, 1));
    store
        .flush(Vec::new(), &kinds_checkpoint(&[(1, 3), (2, 2), (7, 1)], 3))
        .expect("no kind moves back");
}

/// A store whose checkpoint is format 1 (one watermark, as written before
/// per-kind watermarks and while only kind 1 is named) reads it for every
/// kind, and after a reopen takes a first format-2 checkpoint that names
/// another kind's first watermark below kind 1's: format 1 binds kind 1
/// only.
#[test]
fn a_format_1_store_takes_another_kinds_first_watermark_below_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
        let changes = (1..=6u64).map(|group| (kind_key(1, group, 0), Some(record(group, "k"))));
        store.flush(changes, &checkpoint(5, 1)).expect("flush");
    }
    let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    let read = store.checkpoint().expect("checkpoint").expect("one");
    assert_eq!((read.watermark(1), read.watermark(2)), (5, 5));
    assert_eq!(
        live_by_kind(&store.view().expect("view")),
        BTreeMap::from([(1, BTreeMap::from([(5, 1), (6, 1)]))])
    );
    assert!(matches!(
        store.flush(Vec::new(), &checkpoint(4, 2)),
        Err(Error::WatermarkBackwards {
            kind: 1,
            durable: 5,
            requested: 4
        })
    ));
    let claims = (2..=3u64).map(|group| (kind_key(2, group, 0), Some(record(group, "c"))));
    store
        .flush(claims, &kinds_checkpoint(&[(1, 5), (2, 2)], 2))
        .expect("kind 2's first watermark, below kind 1's");
    let view = store.view().expect("view");
    let live = live_by_kind(&view);
    assert_eq!(live[&2], BTreeMap::from([(2, 1), (3, 1)]));
    assert_eq!(live[&1], BTreeMap::from([(5, 1), (6, 1)]));
}

/// An install skips the records below their own kind's watermark.
#[test]
fn an_install_skips_each_kind_below_its_own_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    let incoming: Vec<(Vec<u8>, StoredRecord)> = [1u8, 2, 7]
        .into_iter()
        .flat_map(|kind| {
            (1..=4u64).flat_map(move |group| {
                (0..10u32).map(move |n| (kind_key(kind, group, n), record(group, "r")))
            })
        })
        .collect();
    let installed = store
        .install(
            incoming.into_iter().map(Ok),
            &kinds_checkpoint(&[(1, 3), (2, 2)], 9),
        )
        .expect("install");
    let mut live = groups_of(&[1], 3..=4);
    live.extend(groups_of(&[2], 2..=4));
    live.extend(groups_of(&[7], 1..=4));
    assert_eq!(live_by_kind(&installed.view().expect("view")), live);
    assert_eq!(
        installed.get(&kind_key(1, 2, 0)).expect("get"),
        None,
        "not written"
    );
    assert!(installed.get(&kind_key(2, 2, 0)).expect("get").is_some());
    assert_eq!(
        installed.get(&kind_key(2, 1, 0)).expect("get"),
        None,
        "not written"
    );
}

/// An install builds a new generation from streamed records and switches
/// to it only when whole; a failed install leaves the old one in force.
#[test]
fn an_install_replaces_the_generation_only_when_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    for batch in 1..=5 {
        flush_batch(&store, batch);
    }
    let incoming: Vec<(Vec<u8>, StoredRecord)> = (9..=11)
        .flat_map(|batch| {
            (0..PER_BATCH)
                .map(move |n| (key(batch, n), record(batch, &format!("answer {batch} {n}"))))
        })
        .collect();

    // Out of order: refused, and nothing changes.
    let mut shuffled = incoming.clone();
    shuffled.swap(3, 60);
    let refused = store.install(shuffled.into_iter().map(Ok), &checkpoint(0, 11));
    assert!(matches!(refused, Err(Error::OutOfOrder)));
    // A source that fails midway: refused, and nothing changes.
    let failing = incoming
        .iter()
        .cloned()
        .map(Ok)
        .take(70)
        .chain(std::iter::once(Err("connection reset".to_owned())));
    assert!(matches!(
        store.install(failing, &checkpoint(0, 11)),
        Err(Error::Incoming(_))
    ));
    drop(store);
    let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    assert_eq!(assert_consistent(&store), 5);
    assert_eq!(store.generation(), 1);

    let live_before = store.view().expect("view").records().count();
    assert!(live_before > 0);
    let installed = store
        .install(incoming.into_iter().map(Ok), &checkpoint(0, 11))
        .expect("install");
    assert_eq!(assert_consistent(&installed), 11);
    assert_eq!(installed.generation(), 2);
    // The replaced generation goes when its last holder does: a view of it
    // still reads it after the store let go.
    let old_view = store.view().expect("view");
    drop(store);
    assert_eq!(old_view.records().count(), live_before);
    assert!(dir.path().join("gen-000001").exists(), "a view holds it");
    drop(old_view);
    assert!(
        !dir.path().join("gen-000001").exists(),
        "the replaced generation is deleted once nothing holds it"
    );
    drop(installed);
    let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    assert_eq!(store.generation(), 2);
    assert_eq!(assert_consistent(&store), 11);
}

/// A staged generation is read by nothing until put in force: flushes go
/// on into the one in force meanwhile; dropped, it is deleted; left behind
/// by a crash (never dropped), the next open deletes it; put in force, it
/// is what a reopen reads, and a second stage beside it takes a number of
/// its own.
#[test]
fn a_staged_generation_is_in_force_only_once_put_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    flush_batch(&store, 1);
    let incoming = |batches: std::ops::RangeInclusive<u64>| -> Vec<_> {
        batches
            .flat_map(|batch| {
                (0..PER_BATCH).map(move |n| Ok((key(batch, n), record(batch, "staged"))))
            })
            .collect()
    };
    let dropped = store
        .stage(incoming(7..=8), &checkpoint(0, 8))
        .expect("stage");
    let dropped_dir = dir.path().join(format!("gen-{:06}", dropped.generation()));
    assert!(dropped_dir.exists());
    flush_batch(&store, 2);
    drop(dropped);
    assert!(!dropped_dir.exists(), "a dropped stage is deleted");

    let crashed = store
        .stage(incoming(7..=8), &checkpoint(0, 8))
        .expect("stage");
    let staged = store
        .stage(incoming(7..=9), &checkpoint(0, 9))
        .expect("a second stage");
    assert_ne!(crashed.generation(), staged.generation());
    let crashed_dir = dir.path().join(format!("gen-{:06}", crashed.generation()));
    std::mem::forget(crashed);
    assert_eq!(
        assert_consistent(&store),
        2,
        "the store in force, unchanged"
    );
    let installed = store.put_in_force(staged).expect("put in force");
    assert_eq!(assert_consistent(&installed), 9);
    drop((store, installed));
    let reopened = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    assert_eq!(assert_consistent(&reopened), 9);
    assert!(
        !crashed_dir.exists(),
        "a stage left by a crash goes at the next open"
    );
}

/// A store whose `CURRENT` is gone is refused, not guessed at: nothing
/// is deleted, and restoring the file brings everything back.
#[test]
fn a_missing_current_is_refused_and_deletes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_batches_and_close(dir.path(), 4);
    let current = dir.path().join("CURRENT");
    let saved = std::fs::read(&current).expect("CURRENT");
    std::fs::remove_file(&current).expect("remove CURRENT");
    match RecordStore::open(dir.path(), &Options::default()) {
        Err(Error::Corrupt { why, .. }) => assert!(why.contains("generation"), "{why}"),
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("opened without CURRENT"),
    }
    std::fs::write(&current, saved).expect("restore CURRENT");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    assert_eq!(assert_consistent(&store), 4);
}

/// Kills a child process (SIGKILL) and reaps it, whatever happens.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The writer the crash and power-loss tests kill: flushes batches forever
/// (bounded), printing each batch number once its flush returned.
#[test]
#[ignore = "run in a child process by the crash and power-loss tests"]
fn crash_child_writer() {
    let Ok(dir) = std::env::var("ONCEKV_RECORDS_CRASH_DIR") else {
        return;
    };
    let store = RecordStore::open(Path::new(&dir), &Options::default()).expect("open");
    let first = store.checkpoint().expect("checkpoint").map_or(0, |c| {
        u64::from_be_bytes(c.applied.as_slice().try_into().expect("8 bytes"))
    });
    for batch in first + 1..first + 100_000 {
        flush_batch(&store, batch);
        println!("flushed {batch}");
    }
}

/// Runs `crash_child_writer` on the store under `root` (noting its syncs
/// in `ledger`, if given) until `wait_for` of its flushes have returned,
/// then SIGKILLs and reaps it; returns the last flush that returned.
fn kill_writer_after(root: &Path, wait_for: u64, ledger: Option<&Path>) -> Option<u64> {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args(["--exact", "crash_child_writer", "--ignored", "--nocapture"])
        .env("ONCEKV_RECORDS_CRASH_DIR", root)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(ledger) = ledger {
        command.env("ONCEKV_RECORDS_SYNC_LEDGER", ledger);
    }
    let mut child = ChildGuard(command.spawn().expect("spawn the writer"));
    let stdout = child.0.stdout.take().expect("stdout");
    let (mut seen, mut acknowledged) = (0, None);
    #[allow(clippy::disallowed_methods)] // a test's deadline, not the registry's time
    let started = std::time::Instant::now();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("read");
        if let Some(batch) = line.strip_prefix("flushed ") {
            seen += 1;
            acknowledged = Some(batch.parse().expect("batch"));
        }
        if seen >= wait_for {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the writer is too slow"
        );
    }
    drop(child); // SIGKILL mid-stream, then reaped
    acknowledged
}

/// SIGKILL at any point of a stream of flushes: the reopened store holds
/// exactly the records of its checkpoint — never half a batch, never a
/// checkpoint without its records — and nothing acknowledged is lost.
#[test]
fn flushes_are_atomic_under_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut acknowledged = 0;
    for (round, wait_for) in [3u64, 17, 40, 9, 64].into_iter().enumerate() {
        acknowledged = kill_writer_after(dir.path(), wait_for, None).unwrap_or(acknowledged);
        let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
        let applied = assert_consistent(&store);
        assert!(
            applied >= acknowledged,
            "round {round}: checkpoint {applied} but flush {acknowledged} had returned"
        );
        acknowledged = applied;
    }
}

/// The newest journal file of the generation in force.
fn newest_journal(root: &Path) -> PathBuf {
    let generation = std::fs::read_dir(root)
        .expect("root")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("gen-"))
        })
        .max()
        .expect("a generation");
    let mut journals: Vec<(u64, PathBuf)> = std::fs::read_dir(&generation)
        .expect("generation")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            let id = name.strip_suffix(".jnl")?.parse().ok()?;
            Some((id, path))
        })
        .collect();
    journals.sort();
    journals.pop().expect("a journal").1
}

fn write_batches_and_close(root: &Path, batches: u64) {
    let store = RecordStore::open(root, &Options::default()).expect("open");
    for batch in 1..=batches {
        flush_batch(&store, batch);
    }
}

/// Where the journal's data ends: fjall preallocates its journal file
/// (zeros), so a torn write is a tail of the last batch left as zeros.
fn journal_data_end(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .rposition(|&byte| byte != 0)
        .expect("a written journal")
        + 1
}

/// A torn write at the journal's tail (the last batch half on disk) loses
/// that whole flush and nothing else.
#[test]
fn a_torn_journal_tail_loses_the_whole_last_flush() {
    for cut in [1usize, 7, 300] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_batches_and_close(dir.path(), 12);
        let journal = newest_journal(dir.path());
        let mut bytes = std::fs::read(&journal).expect("journal");
        let end = journal_data_end(&bytes);
        bytes[end - cut..end].fill(0);
        std::fs::write(&journal, bytes).expect("journal");
        let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
        let applied = assert_consistent(&store);
        assert_eq!(applied, 11, "{cut} bytes torn: the last flush goes, whole");
    }
}

/// A flipped bit inside the journal's last batch is not read as data:
/// fjall's recovery cuts the journal at the first batch whose checksum
/// fails, so the store opens without that flush — never a half or altered
/// one. (A flip further back would cut every later flush as well: fjall
/// treats the first bad batch as the journal's end.)
#[test]
fn a_corrupt_journal_tail_is_never_read_as_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_batches_and_close(dir.path(), 12);
    let journal = newest_journal(dir.path());
    let mut bytes = std::fs::read(&journal).expect("journal");
    let at = journal_data_end(&bytes) - 200;
    bytes[at] ^= 0x10;
    std::fs::write(&journal, bytes).expect("journal");
    let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
    assert_eq!(assert_consistent(&store), 11);
}

/// Every journal of the store under `root` (any generation), with where
/// its data ends now.
fn journal_ends(root: &Path) -> BTreeMap<PathBuf, usize> {
    let mut ends = BTreeMap::new();
    for generation in std::fs::read_dir(root).expect("root").flatten() {
        let generation = generation.path();
        if !generation.is_dir() {
            continue;
        }
        for journal in std::fs::read_dir(&generation)
            .expect("generation")
            .flatten()
        {
            let path = journal.path();
            if path.extension().is_some_and(|extension| extension == "jnl") {
                let bytes = std::fs::read(&path).expect("journal");
                let end = bytes
                    .iter()
                    .rposition(|&byte| byte != 0)
                    .map_or(0, |at| at + 1);
                ends.insert(path, end);
            }
        }
    }
    ends
}

/// Where each journal's data ended at its last sync, from the ledger the
/// store writes when built with `sync-ledger` (only whole lines: a writer
/// killed mid-line had not synced that far).
fn synced_ends(root: &Path, ledger: &Path) -> BTreeMap<PathBuf, usize> {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let mut ends: BTreeMap<PathBuf, usize> = BTreeMap::new();
    let mut lines: Vec<&str> = text.split('\n').collect();
    lines.pop(); // after the last newline: empty, or a line cut short
    for line in lines {
        let (journal, end) = line.rsplit_once(' ').expect("journal and end");
        let end: usize = end.parse().expect("an end");
        let known = ends.entry(root.join(journal)).or_default();
        *known = (*known).max(end);
    }
    ends
}

/// A power loss: every journal byte past what a sync made durable is lost
/// (zeroed, as fjall's preallocated journals read when never written).
fn lose_unsynced_writes(root: &Path, ledger: &Path) -> usize {
    let synced = synced_ends(root, ledger);
    let mut lost = 0;
    for (journal, end) in journal_ends(root) {
        let durable = synced.get(&journal).copied().unwrap_or(0);
        if end > durable {
            let mut bytes = std::fs::read(&journal).expect("journal");
            bytes[durable..end].fill(0);
            std::fs::write(&journal, bytes).expect("journal");
            lost += end - durable;
        }
    }
    lost
}

/// A power loss during a stream of flushes: what the page cache had not
/// written is gone — every journal byte past the last sync the store asked
/// for (noted by the `sync-ledger` build) is zeroed after the writer is
/// killed. The reopened store holds exactly the records of its
/// checkpoint, and every flush that had returned is there: a flush returns
/// only after its journal sync. Fails when `commit` does not sync.
#[test]
fn acknowledged_flushes_survive_a_power_loss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger_dir = tempfile::tempdir().expect("tempdir");
    let ledger = ledger_dir.path().join("synced");
    let mut acknowledged = 0;
    let mut lost_bytes = 0;
    for (round, wait_for) in [5u64, 23, 2, 40].into_iter().enumerate() {
        // What is on disk now survived the last round's loss and reopen:
        // durable from here on.
        let durable: String = journal_ends(dir.path())
            .into_iter()
            .map(|(journal, end)| {
                let relative = journal.strip_prefix(dir.path()).expect("under the root");
                format!("{} {end}\n", relative.display())
            })
            .collect();
        std::fs::write(&ledger, durable).expect("ledger");
        acknowledged =
            kill_writer_after(dir.path(), wait_for, Some(&ledger)).unwrap_or(acknowledged);
        lost_bytes += lose_unsynced_writes(dir.path(), &ledger);
        let store = RecordStore::open(dir.path(), &Options::default()).expect("reopen");
        let applied = assert_consistent(&store);
        assert!(
            applied >= acknowledged,
            "round {round}: checkpoint {applied} after the power loss, but flush \
             {acknowledged} had returned"
        );
        acknowledged = applied;
    }
    // Not a vacuous loss: the writer was killed mid-flush at least once
    // (and, without the sync, every flush's bytes go).
    println!("power loss: {lost_bytes} unsynced journal bytes zeroed over 4 rounds");
}

/// This thread's, or a thread of this process's, nice value (field 19 of
/// its `stat`; Linux).
#[cfg(target_os = "linux")]
fn nice_of(stat: &str) -> i32 {
    // The name (field 2) is in parentheses and may hold spaces: count
    // from the last `)`, which ends it (field 3 is the first after).
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 2..];
    after_name
        .split(' ')
        .nth(19 - 3)
        .and_then(|field| field.parse().ok())
        .expect("the nice field")
}

/// The nice values of this process's threads named `fjall:worker`.
#[cfg(target_os = "linux")]
fn worker_nice_values() -> Vec<i32> {
    let mut values = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("a task").path();
        // A thread may end between the listing and the read.
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("stat")),
        ) else {
            continue;
        };
        if comm.trim_end() == "fjall:worker" {
            values.push(nice_of(&stat));
        }
    }
    values
}

/// fjall's workers (flushes, compactions), one per generation, run
/// `worker_nice` below the process — those of a staged generation too —
/// and the opening thread keeps its own priority.
#[cfg(target_os = "linux")]
#[test]
fn the_stores_workers_run_below_the_process() {
    let own = || nice_of(&std::fs::read_to_string("/proc/thread-self/stat").expect("stat"));
    let base = nice_of(&std::fs::read_to_string("/proc/self/stat").expect("stat"));
    assert_eq!(
        own(),
        base,
        "the test thread runs at the process's nice value"
    );
    // Only this test lowers by 3; the others' workers run at the default
    // (10 below), so the count of workers at `base + 3` is this test's
    // alone — unless both clamp to 19.
    const NICE: i32 = 3;
    let expected = base + NICE;
    if expected >= (base + oncekv_records::WORKER_NICE).min(19) {
        eprintln!("skipped: the test runs at nice {base}, too low to tell workers apart");
        return;
    }
    let at = |value: i32| {
        worker_nice_values()
            .into_iter()
            .filter(|&nice| nice == value)
            .count()
    };
    let ours = || at(expected);
    assert_eq!(ours(), 0);

    let dir = tempfile::tempdir().expect("tempdir");
    let options = Options {
        worker_nice: NICE,
        ..Options::default()
    };
    let store = RecordStore::open(dir.path(), &options).expect("open");
    let workers = ours();
    // One per generation (`WORKER_THREADS`): with two, fjall's first one
    // spins while the other compacts.
    assert_eq!(
        workers, 1,
        "the store's workers run {NICE} below, one per generation"
    );
    assert_eq!(own(), base, "the opening thread keeps its priority");

    flush_batch(&store, 1);
    let staged = store
        .stage(
            (0..PER_BATCH).map(|n| Ok((key(2, n), record(2, "staged")))),
            &checkpoint(0, 2),
        )
        .expect("stage");
    assert_eq!(ours(), 2 * workers, "a staged generation's workers too");
    assert_eq!(own(), base);

    // Opened from a thread already that low (as the node's background
    // thread opens a generation), the workers are not lowered again.
    let other = tempfile::tempdir().expect("tempdir");
    let opened = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: a plain syscall on this thread's own id.
                let lowered = unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, expected)
                };
                assert_eq!(lowered, 0, "lowering a thread needs no privilege");
                RecordStore::open(other.path(), &options).expect("open")
            })
            .join()
            .expect("the opening thread")
    });
    assert_eq!(ours(), 3 * workers, "opened from a lowered thread");
    assert_eq!(at(expected + NICE), 0, "lowered only once");
    drop((staged, store, opened));
}

/// The bytes of `dir`'s files (and its subdirectories') that are dirty in
/// the page cache — written, not yet handed to the disk — by Linux's
/// `cachestat` (6.5 and later; `None` where the kernel has it not).
#[cfg(target_os = "linux")]
fn dirty_bytes_under(dir: &Path) -> Option<u64> {
    use std::os::fd::AsRawFd;
    /// `struct cachestat_range` of `<linux/mman.h>`.
    #[repr(C)]
    struct Range {
        offset: u64,
        length: u64,
    }
    /// `struct cachestat` of `<linux/mman.h>` (in pages).
    #[repr(C)]
    #[derive(Default)]
    struct CacheStat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    /// `__NR_cachestat`, one number on every architecture.
    const CACHESTAT: libc::c_long = 451;
    // SAFETY: sysconf reads a constant.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    let mut dirty = 0;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            dirty += dirty_bytes_under(&path)?;
            continue;
        }
        // A file fjall renamed or deleted in between is no longer written.
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        // Length 0: to the end of the file.
        let range = Range {
            offset: 0,
            length: 0,
        };
        let mut stat = CacheStat::default();
        // SAFETY: the descriptor is open for the call; both pointers are
        // to locals of the layout the kernel expects, which outlive it.
        let result = unsafe {
            libc::syscall(
                CACHESTAT,
                file.as_raw_fd(),
                &range as *const Range,
                &mut stat as *mut CacheStat,
                0 as libc::c_uint,
            )
        };
        if result != 0 {
            return None;
        }
        dirty += stat.dirty * page;
    }
    Some(dirty)
}

/// Whether `dir` is on a file system in memory (tmpfs, ramfs), whose pages
/// stay dirty: nothing is written back.
#[cfg(target_os = "linux")]
fn in_memory(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: all zeros is a value of the plain C struct; `path` is
    // NUL-terminated, and both outlive the call that fills `fs`.
    let kind = unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        if libc::statfs(path.as_ptr(), &mut fs) != 0 {
            return false;
        }
        fs.f_type
    };
    #[allow(clippy::unnecessary_cast)] // `f_type`'s width differs by target
    let kind = kind as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// A generation being staged reaches the disk as it is written (its
/// write-behind, docs/state-beyond-ram.md §4.9h), not 64 MiB at a time at
/// each table's fsync: 40 MiB into a stage, a few MiB of it at most are
/// dirty in the page cache. (The kernel's own writeback would take 30 s
/// to start on its own, and the stage takes a few.)
#[cfg(target_os = "linux")]
#[test]
fn a_staged_generation_reaches_the_disk_as_it_is_written() {
    const VALUE_BYTES: usize = 1024;
    const RECORDS: u32 = 48 * 1024;
    const CHECKED_AT: u32 = 40 * 1024;
    const MOST_DIRTY: u64 = 16 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    if in_memory(dir.path()) {
        eprintln!("skipped: the temporary directory is in memory, no disk to write back to");
        return;
    }
    let store = RecordStore::open(dir.path(), &Options::default()).expect("open");
    let in_force = dir.path().join(format!("gen-{:06}", store.generation()));
    // Values that do not compress: a xorshift stream.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut noise = move || {
        (0..VALUE_BYTES)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect::<Vec<u8>>()
    };
    let mut dirty_at_check = None;
    let records = (0..RECORDS).map(|n| {
        if n == CHECKED_AT {
            let staging = std::fs::read_dir(dir.path())
                .expect("the store's root")
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.is_dir() && *path != in_force)
                .max()
                .expect("the generation being staged");
            dirty_at_check = Some(dirty_bytes_under(&staging));
        }
        let mut key = vec![KIND];
        key.extend_from_slice(&n.to_be_bytes());
        Ok((
            key,
            StoredRecord {
                group: 1,
                bytes: noise(),
            },
        ))
    });
    let staged = store.stage(records, &checkpoint(0, 1)).expect("stage");
    drop(staged);
    match dirty_at_check.expect("checked during the stage") {
        None => eprintln!("skipped: this kernel has no cachestat (Linux 6.5 and later)"),
        Some(dirty) => assert!(
            dirty <= MOST_DIRTY,
            "{} MiB of the generation being staged were dirty {} MiB into it",
            dirty >> 20,
            (u64::from(CHECKED_AT) * VALUE_BYTES as u64) >> 20
        ),
    }
}
