//! Snapshots of a large state on real nodes: they stream from and to
//! files instead of living in memory. A leader that catches up a follower
//! by a snapshot of tens of MB does not grow its resident memory by more
//! than a fraction of the snapshot; a node killed while writing a snapshot
//! (building it, or receiving one) leaves a torn temporary file that its
//! restart ignores, and it still catches up.

mod support;

use oncekv_client::{Client, ClientConfig};
use oncekv_core::Value;
use oncekv_wire::proto;
use std::path::Path;
use std::time::Duration;
use support::cluster::Cluster;
use tokio::time::Instant;

/// Bytes of each value written.
const VALUE_BYTES: usize = 60 << 10;
/// Values written: about 28 MiB of state, so the snapshot is as large —
/// enough that one copy of it (let alone the two and more that sending
/// from memory took) is far above [`SENDER_GROWTH_MAX_BYTES`].
const VALUES: usize = 480;
/// How much a sender's peak resident memory may grow while it sends the
/// snapshot: a few chunks in flight (read, encoded, in the HTTP/2 buffers),
/// far below one copy of the snapshot. Sending it from memory as before
/// (the current snapshot kept as bytes, cloned to serve it, every chunk
/// encoded up front) grew it by more than twice the snapshot.
const SENDER_GROWTH_MAX_BYTES: u64 = 16 << 20;
/// Concurrent writers filling the state.
const WRITERS: usize = 8;
const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// A `/proc/PID/status` field in bytes (Linux).
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
        * 1024
}

/// Resets the peak resident memory (`VmHWM`) of `pid` to its current one.
fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
}

/// Writes `count` values of `VALUE_BYTES` under fresh keys.
async fn fill(cluster: &Cluster, prefix: &str, count: usize) {
    let client = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            call_timeout: CALL_DEADLINE,
            ..ClientConfig::default()
        },
    );
    let writers = (0..WRITERS).map(|writer| {
        let client = client.clone();
        async move {
            for i in (writer..count).step_by(WRITERS) {
                let key = format!("{prefix}-{i:05}");
                client
                    .put(key.as_bytes(), Value::Bytes(vec![i as u8; VALUE_BYTES]))
                    .await
                    .unwrap_or_else(|error| panic!("put {key}: {error}"));
            }
        }
    });
    futures::future::join_all(writers).await;
}

/// Has `node` build a snapshot now; returns the index it covers.
async fn trigger_snapshot(cluster: &Cluster, node: u64) -> u64 {
    let mut request = tonic::Request::new(proto::TriggerSnapshotRequest {});
    request.set_timeout(CALL_DEADLINE);
    cluster
        .admin(node)
        .trigger_snapshot(request)
        .await
        .unwrap_or_else(|error| panic!("node {node} snapshot: {error}"))
        .into_inner()
        .snapshot_index
}

/// `node`'s `Status`, or why none came. `Status` hashes the whole state,
/// which for tens of MB in a debug build on a loaded machine takes longer
/// than the harness's own `Status` deadline: this one waits up to
/// `CALL_DEADLINE`.
async fn status(cluster: &Cluster, node: u64) -> Result<proto::StatusReply, tonic::Status> {
    let mut request = tonic::Request::new(proto::StatusRequest {});
    request.set_timeout(CALL_DEADLINE);
    cluster
        .client(node)
        .status(request)
        .await
        .map(tonic::Response::into_inner)
}

/// Waits (bounded) until `holds` is true of every node of `nodes`'
/// statuses; returns them.
async fn wait_for(
    cluster: &Cluster,
    nodes: &[u64],
    what: &str,
    holds: impl Fn(&[proto::StatusReply]) -> bool,
) -> Vec<proto::StatusReply> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let mut seen = Vec::new();
        for &node in nodes {
            if let Ok(status) = status(cluster, node).await {
                seen.push(status);
            }
        }
        if seen.len() == nodes.len() && holds(&seen) {
            return seen;
        }
        let brief: Vec<_> = seen
            .iter()
            .map(|s| (s.node_id, s.applied_index, s.snapshot_index, s.purged_index))
            .collect();
        assert!(
            Instant::now() < deadline,
            "[{}] nodes {nodes:?}: {what} never held: {brief:?}",
            cluster.name()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the nodes of `nodes` report the same applied index (at
/// least `at_least`) and state hash; returns the index.
async fn wait_converged(cluster: &Cluster, nodes: &[u64], at_least: u64) -> u64 {
    let seen = wait_for(cluster, nodes, "convergence", |seen| {
        seen[0].applied_index >= at_least
            && seen.iter().all(|s| {
                (s.applied_index, &s.state_hash) == (seen[0].applied_index, &seen[0].state_hash)
            })
    })
    .await;
    seen[0].applied_index
}

/// Starts the killed `node` again and waits until it answers `Status` (with
/// this file's patient deadline: a node that restores tens of MB hashes
/// them for its first answer).
async fn restart(cluster: &Cluster, node: u64) {
    cluster.spawn(node);
    wait_for(cluster, &[node], "an answer", |_| true).await;
}

/// Waits until every node of `nodes` has purged its log past index 1.
async fn wait_purged(cluster: &Cluster, nodes: &[u64]) {
    wait_for(cluster, nodes, "purged logs", |seen| {
        seen.iter().all(|s| s.purged_index > 1)
    })
    .await;
}

/// The sizes of the snapshot files in `node`'s data dir, the temporary
/// ones (`.tmp`) apart.
fn snapshot_files(data_dir: &Path) -> (Vec<u64>, Vec<String>) {
    let mut done = Vec::new();
    let mut temporary = Vec::new();
    let Ok(entries) = std::fs::read_dir(data_dir.join("snapshots")) else {
        return (done, temporary);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            temporary.push(name);
        } else if let Ok(meta) = entry.metadata() {
            done.push(meta.len());
        }
    }
    (done, temporary)
}

/// A leader sending a snapshot of ~48 MiB to a follower that was down
/// while the others snapshotted and purged: its peak resident memory
/// during the catch-up (`VmHWM`, reset just before) grows by at most
/// `SENDER_GROWTH_MAX_BYTES` (16 MiB) — the snapshot streams from the file
/// in chunks; it is never held, copied or chunked up front in memory —
/// and the follower ends with the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_by_a_large_snapshot_keeps_the_leaders_memory_flat() {
    let cluster = Cluster::start_with(
        "snapshot-memory",
        &[
            // Snapshots only when asked; a short log behind them.
            "--snapshot-every-entries",
            "1000000",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let lagging = (1..=3).find(|node| *node != leader).unwrap();
    let others: Vec<u64> = (1..=3).filter(|node| *node != lagging).collect();
    cluster.kill(lagging);
    fill(&cluster, "big", VALUES).await;
    // Every put is acknowledged: the two agree on a state that holds them all
    // (requests are batched, so the index is not the number of puts).
    let index = wait_converged(&cluster, &others, 1).await;
    for &node in &others {
        assert!(trigger_snapshot(&cluster, node).await >= index);
    }
    wait_purged(&cluster, &others).await;
    let (files, _) = snapshot_files(cluster.data_dir(leader));
    let snapshot_bytes = files.iter().copied().max().expect("the leader's snapshot");
    assert!(
        snapshot_bytes >= (VALUES * VALUE_BYTES) as u64,
        "the snapshot holds the state: {snapshot_bytes} bytes"
    );

    // Whichever of the two sends the snapshot (the leader, or the other
    // node if an election on a loaded machine moves leadership meanwhile)
    // must stay within the bound: both are measured.
    let pids: Vec<u32> = others
        .iter()
        .map(|&node| cluster.pid(node).expect("running"))
        .collect();
    // Let the allocator return what building the snapshot freed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: Vec<u64> = pids
        .iter()
        .map(|&pid| proc_status_bytes(pid, "VmRSS:"))
        .collect();
    for &pid in &pids {
        reset_peak_rss(pid);
    }
    cluster.restart(lagging).await;
    wait_converged(&cluster, &[1, 2, 3], index).await;
    let caught_up = status(&cluster, lagging).await.expect("status");
    assert!(
        caught_up.snapshot_index >= index,
        "caught up by the snapshot"
    );
    let led = status(&cluster, leader).await.expect("status");
    let mut growth_max = 0;
    for ((&node, &pid), before) in others.iter().zip(&pids).zip(before) {
        let peak = proc_status_bytes(pid, "VmHWM:");
        let growth = peak.saturating_sub(before);
        eprintln!(
            "snapshot {} MiB; node {node}{} RSS before {} MiB, peak during catch-up {} MiB (+{} MiB)",
            snapshot_bytes >> 20,
            if node == leader { " (leader)" } else { "" },
            before >> 20,
            peak >> 20,
            growth >> 20
        );
        growth_max = growth_max.max(growth);
    }
    if led.role != "leader" {
        eprintln!("leadership moved during the catch-up");
    }
    assert!(
        growth_max <= SENDER_GROWTH_MAX_BYTES,
        "a sender's peak RSS grew by {} MiB sending a {} MiB snapshot (at most {} MiB)",
        growth_max >> 20,
        snapshot_bytes >> 20,
        SENDER_GROWTH_MAX_BYTES >> 20
    );
}

/// Waits (bounded) for a temporary snapshot file to appear in `node`'s
/// snapshot directory, SIGKILLs `node` at once, and returns the temporary
/// files its death left behind.
async fn kill_while_writing(cluster: &Cluster, node: u64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while snapshot_files(cluster.data_dir(node)).1.is_empty() {
        assert!(
            Instant::now() < deadline,
            "node {node} never wrote a snapshot"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    cluster.kill(node);
    snapshot_files(cluster.data_dir(node)).1
}

/// A node killed while it writes a snapshot file — building one, or
/// receiving one from the leader — leaves a torn temporary file behind;
/// restarted, it deletes it unread, starts from its last complete
/// snapshot (the builder) or from nothing (the receiver), and converges
/// with the others, the receiver by a snapshot sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_while_writing_a_snapshot_ignores_the_torn_file() {
    const LOGS_KEPT: u64 = 5;
    let logs_kept = LOGS_KEPT.to_string();
    let cluster = Cluster::start_with(
        "snapshot-torn",
        &[
            "--snapshot-every-entries",
            "1000000",
            "--logs-kept-after-snapshot",
            &logs_kept,
        ],
    )
    .await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let followers: Vec<u64> = (1..=3).filter(|node| *node != leader).collect();
    let (builder, receiver) = (followers[0], followers[1]);

    // The builder: one complete snapshot, then more state, then killed
    // while it builds the next.
    fill(&cluster, "first", 50).await;
    let first = trigger_snapshot(&cluster, builder).await;
    fill(&cluster, "second", VALUES / 2).await;
    wait_converged(&cluster, &[1, 2, 3], first + 1).await;
    let mut admin = cluster.admin(builder);
    let build = tokio::spawn(async move {
        admin
            .trigger_snapshot(proto::TriggerSnapshotRequest {})
            .await
    });
    let torn = kill_while_writing(&cluster, builder).await;
    assert!(
        build.await.expect("the call ends").is_err(),
        "the build never finished"
    );
    assert!(!torn.is_empty(), "the killed build left its file");
    restart(&cluster, builder).await;
    assert!(
        snapshot_files(cluster.data_dir(builder)).1.is_empty(),
        "the torn file is deleted at restart"
    );
    let restarted = status(&cluster, builder).await.expect("status");
    assert_eq!(
        restarted.snapshot_index, first,
        "restored from the last complete snapshot"
    );
    let index = wait_converged(&cluster, &[1, 2, 3], first + 1).await;

    // The receiver: down while the others snapshot and purge past the end
    // of its log, then killed while the leader's snapshot arrives. How
    // many entries a round of writes makes depends on how the proposer
    // batched them (a loaded machine batches more): rounds go on until
    // the snapshots are more than LOGS_KEPT entries past the receiver's
    // log, or it would catch up by the log instead.
    let receivers_last = index;
    cluster.kill(receiver);
    let others = [leader, builder];
    let mut index = index;
    for round in 0.. {
        assert!(round < 20, "20 rounds of writes never got past LOGS_KEPT");
        fill(&cluster, &format!("third-{round}"), 10).await;
        index = wait_converged(&cluster, &others, index + 1).await;
        let mut purgeable = u64::MAX;
        for node in others {
            let snapshot = trigger_snapshot(&cluster, node).await;
            assert!(snapshot >= index);
            purgeable = purgeable.min(snapshot.saturating_sub(LOGS_KEPT));
        }
        if purgeable > receivers_last {
            break;
        }
    }
    wait_for(
        &cluster,
        &others,
        "logs purged past the receiver's",
        |seen| seen.iter().all(|s| s.purged_index > receivers_last),
    )
    .await;
    cluster.spawn(receiver);
    let torn = kill_while_writing(&cluster, receiver).await;
    assert!(!torn.is_empty(), "the killed reception left its file");
    restart(&cluster, receiver).await;
    // It may be receiving the snapshot again already: its log says the
    // torn file went unread.
    let log = std::fs::read_to_string(cluster.log_path(receiver)).expect("the node's log");
    assert!(
        log.contains("removing a temporary snapshot file"),
        "the torn file is deleted at restart"
    );
    wait_converged(&cluster, &[1, 2, 3], index).await;
    let caught_up = status(&cluster, receiver).await.expect("status");
    assert!(
        caught_up.snapshot_index >= index,
        "caught up by a snapshot sent again"
    );
    let (files, temporary) = snapshot_files(cluster.data_dir(receiver));
    assert_eq!(files.len(), 1, "one snapshot file");
    assert!(temporary.is_empty(), "no temporary file left");
}
