//! A stopped node's Raft log (`wal/`) damaged on disk, on a real 3-node
//! cluster (docs/operating.md, docs/architecture.md "Formats"): a zeroed
//! block with acknowledged records after it, or a deleted segment, makes
//! the node refuse to start, naming the file and the way out (replacing
//! the node) — instead of starting with entries it acknowledged, or its
//! vote, gone (it then never caught up, and the leader retried it in a
//! busy loop). A torn tail — part of a record after the last complete one,
//! nothing valid after it, as a crash leaves — is still cut, and the node
//! catches up.

mod support;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;
use support::cluster::Cluster;

const FIRST_SEGMENT: &str = "00000000000000000001.seg";

/// Offset just past the last non-zero byte of `bytes`, rounded up to the
/// record alignment (8): where the next record would go.
fn data_end(bytes: &[u8]) -> usize {
    let end = bytes
        .iter()
        .rposition(|&byte| byte != 0)
        .map_or(0, |at| at + 1);
    end.div_ceil(8) * 8
}

fn write_at(path: &Path, offset: usize, bytes: &[u8]) {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open the segment")
        .write_all_at(bytes, offset as u64)
        .expect("write the segment");
}

/// Starts `node` on its damaged log, expecting it to refuse: returns what
/// it logged in this start.
async fn refused_start(cluster: &Cluster, node: u64) -> String {
    let before = fs::read(cluster.log_path(node)).map_or(0, |log| log.len());
    let log = cluster.restart_expecting_exit(node).await;
    log.get(before..).unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_log_is_refused_and_a_torn_tail_is_cut() {
    let cluster = Cluster::start("wal-damage").await;
    let client = cluster.patient_client();
    for _ in 0..300 {
        client.increment(b"counter", 1).await.expect("increment");
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let node = if leader == 3 { 2 } else { 3 };
    let applied = cluster.wait_converged(&[1, 2, 3], 300).await;
    assert!(cluster.terminate(node).await.success(), "a clean stop");
    let segment = cluster.data_dir(node).join("wal").join(FIRST_SEGMENT);
    let original = fs::read(&segment).expect("the node's first segment");
    let end = data_end(&original);

    // A zeroed 4 KiB block two thirds into the log: acknowledged entries
    // follow it. Refused, naming the segment and the way out.
    let block = (end * 2 / 3) / 4096 * 4096;
    assert!(block > 0 && block + 4096 < end, "the log spans the block");
    write_at(&segment, block, &[0; 4096]);
    let log = refused_start(&cluster, node).await;
    for expected in [
        FIRST_SEGMENT,
        "damaged record at offset",
        "Replacing a host",
    ] {
        assert!(log.contains(expected), "{expected:?} in the log: {log}");
    }
    assert!(!log.contains("panicked"), "{log}");

    // The only segment deleted: refused, saying the vote went with it.
    fs::remove_file(&segment).expect("delete the segment");
    let log = refused_start(&cluster, node).await;
    for expected in ["no segment file", "vote", "Replacing a host"] {
        assert!(log.contains(expected), "{expected:?} in the log: {log}");
    }
    assert!(
        !segment.exists(),
        "the refused start created no new segment"
    );

    // The log put back with a torn tail (part of a record after the last
    // one): cut, and the node starts and catches up.
    fs::write(&segment, &original).expect("put the segment back");
    write_at(&segment, end, &[0xA5; 100]);
    let before = fs::read(cluster.log_path(node)).map_or(0, |log| log.len());
    cluster.restart(node).await;
    for _ in 0..20 {
        client.increment(b"counter", 1).await.expect("increment");
    }
    cluster.wait_converged(&[1, 2, 3], applied + 20).await;
    let log = fs::read_to_string(cluster.log_path(node)).unwrap_or_default();
    let log = log.get(before..).unwrap_or_default();
    assert!(log.contains("dropped the torn tail"), "{log}");
    assert_eq!(
        client.get(b"counter").await.expect("read"),
        Some(oncekv_core::Value::Int(320))
    );
}
