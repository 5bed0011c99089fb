//! Real 3-node clusters on loopback: election and writes through the
//! leader, `NOT_LEADER` hints, a follower woken from a long pause (no
//! election: pre-vote), a whole-cluster SIGKILL under load, and a
//! node that catches up by snapshot and, as leader, still recognises
//! retries of requests applied before it came back.

mod support;

use oncekv_core::{Command, CommandResult, Value};
use oncekv_wire::proto::{Reason, StatusRequest};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use support::cluster::Cluster;
use support::raw::{raw_client, reason};
use tokio::time::Instant;

const CALL_DEADLINE: Duration = Duration::from_secs(60);

fn incr(key: &str) -> Command {
    Command::Increment {
        key: key.as_bytes().to_vec(),
        delta: 1,
    }
}

/// A leader is elected; writes go through it; a follower answers with
/// `NOT_LEADER` and the leader's client address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_writes_and_not_leader_hint() {
    let cluster = Cluster::start("election").await;
    let raw = raw_client(&cluster).await;
    let session = raw.register(1).await;
    for seq in 1..=5 {
        let request = raw.execute_request(session.client_id, seq, seq, &incr("n"));
        let (result, duplicate) = raw.execute(CALL_DEADLINE, &request).await.unwrap();
        assert_eq!(result, CommandResult::Incremented { value: seq as i64 });
        assert!(!duplicate);
    }
    assert_eq!(raw.read(b"n").await, Some(Value::Int(5)));

    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let follower = (1..=3).find(|node| *node != leader).unwrap();
    let request = raw.execute_request(session.client_id, 6, 6, &incr("n"));
    let error = cluster
        .client(follower)
        .execute(request)
        .await
        .expect_err("a follower does not execute");
    assert_eq!(reason(&error), Some(Reason::NotLeader));
    let detail = oncekv_wire::status::error_detail(&error).unwrap();
    let leader_now = cluster.wait_for_leader(Duration::from_secs(60)).await;
    assert_eq!(detail.leader_client_addr, cluster.client_addr(leader_now));

    // Every node serves its status, and all agree on the members.
    for node in 1..=3 {
        let status = cluster
            .client(node)
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status.node_id, node);
        assert_eq!(status.members.len(), 3);
    }
    cluster.wait_converged(&[1, 2, 3], 1).await;
}

/// A follower paused for several election timeouts (SIGSTOP: its timer has
/// run out the moment it wakes) asks the others first (pre-vote); they
/// still hear the leader, so it stays a follower: nobody's term moves, the
/// leader keeps leading, and the woken follower catches up and names it
/// again. (With pre-vote off it stood for election at once, at a higher
/// term, and the leader stepped down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_woken_from_a_long_pause_does_not_depose_the_leader() {
    let cluster = Cluster::start("woken-follower").await;
    let raw = raw_client(&cluster).await;
    let session = raw.register(1).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let term = cluster.status(leader).await.unwrap().term;
    let follower = (1..=3).find(|node| *node != leader).unwrap();
    cluster.pause(follower);
    // Writes while it is paused, for at least three of the largest election
    // timeouts (800 ms in tests): the follower misses them and its timer
    // runs out.
    let paused_at = Instant::now();
    let mut seq = 0;
    while paused_at.elapsed() < Duration::from_millis(2_400) && seq < 10_000 {
        seq += 1;
        let request = raw.execute_request(session.client_id, seq, seq, &incr("n"));
        let (result, _) = raw.execute(CALL_DEADLINE, &request).await.unwrap();
        assert_eq!(result, CommandResult::Incremented { value: seq as i64 });
    }
    let written = cluster.status(leader).await.unwrap();
    assert_eq!(
        written.term, term,
        "the leader lost its term during the pause"
    );
    cluster.resume(follower);
    cluster
        .wait_until(
            Duration::from_secs(60),
            "the woken follower naming the leader and holding the writes",
            |statuses| {
                statuses[&follower].as_ref().is_ok_and(|status| {
                    status.leader_id == leader && status.applied_index >= written.applied_index
                })
            },
        )
        .await;
    for (node, status) in cluster.statuses().await {
        let status = status.unwrap_or_else(|error| panic!("node {node}: {error}"));
        assert_eq!(
            (status.term, status.leader_id),
            (term, leader),
            "node {node} after the follower woke"
        );
    }
    let request = raw.execute_request(session.client_id, seq + 1, seq + 1, &incr("n"));
    let (result, _) = raw.execute(CALL_DEADLINE, &request).await.unwrap();
    assert_eq!(
        result,
        CommandResult::Incremented {
            value: seq as i64 + 1
        }
    );
}

/// Rule 17 end to end: requests of many sessions arriving together share
/// log entries (the log grows by fewer entries than there were requests),
/// every registration gets its own id, every request its own answer, and
/// each increment takes effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_entries_each_with_its_own_answer() {
    const SESSIONS: u64 = 32;
    const ROUNDS: u64 = 10;
    let cluster = Cluster::start("batches").await;
    let raw = raw_client(&cluster).await;
    let last_log_index = || async {
        let mut highest = 0;
        for node in 1..=3 {
            if let Ok(status) = cluster.status(node).await {
                highest = highest.max(status.last_log_index);
            }
        }
        highest
    };
    let before = last_log_index().await;
    let sessions =
        futures::future::join_all((0..SESSIONS).map(|i| raw.register(5_000 + u128::from(i)))).await;
    let ids: std::collections::BTreeSet<u64> =
        sessions.iter().map(|session| session.client_id).collect();
    assert_eq!(ids.len() as u64, SESSIONS, "one id per registration");
    let tasks = sessions.iter().map(|session| {
        let raw = raw.clone();
        let client_id = session.client_id;
        async move {
            let own = format!("own-{client_id}");
            for round in 1..=ROUNDS {
                for (key, seq) in [("shared", 2 * round - 1), (own.as_str(), 2 * round)] {
                    let request = raw.execute_request(client_id, seq, seq, &incr(key));
                    let (result, duplicate) = raw.execute(CALL_DEADLINE, &request).await.unwrap();
                    assert!(!duplicate);
                    if key != "shared" {
                        let value = round as i64;
                        assert_eq!(result, CommandResult::Incremented { value });
                    }
                }
            }
        }
    });
    futures::future::join_all(tasks).await;
    assert_eq!(
        raw.read(b"shared").await,
        Some(Value::Int((SESSIONS * ROUNDS) as i64))
    );
    let requests = SESSIONS * (1 + 2 * ROUNDS);
    let entries = last_log_index().await - before;
    assert!(
        entries < requests,
        "{requests} requests took {entries} log entries: none shared an entry"
    );
}

/// SIGKILL all three nodes under load and restart them: every acknowledged
/// increment is present exactly once (each task's counter equals its last
/// acknowledged seq, and every reply equals its seq), and cached requests
/// are still answered as duplicates with their original responses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_all_under_load_loses_nothing_acknowledged() {
    const TASKS: u64 = 4;
    const OPS_MAX: u64 = 400;
    let cluster = Cluster::start("kill-all").await;
    let raw = raw_client(&cluster).await;
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let raw = raw.clone();
        let acked = acked.clone();
        let stop = stop.clone();
        let session = raw.register(100 + u128::from(task)).await;
        tasks.push(tokio::spawn(async move {
            let key = format!("counter-{task}");
            let mut last = 0;
            for seq in 1..=OPS_MAX {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let request = raw.execute_request(session.client_id, seq, seq, &incr(&key));
                let (result, _) = raw
                    .execute(CALL_DEADLINE, &request)
                    .await
                    .unwrap_or_else(|error| panic!("{key} seq {seq}: {error}"));
                assert_eq!(
                    result,
                    CommandResult::Incremented { value: seq as i64 },
                    "{key}: the counter must equal the number of increments"
                );
                last = seq;
                acked.fetch_add(1, Ordering::SeqCst);
            }
            (session.client_id, key, last)
        }));
    }
    let wait_acked = |at_least: u64| {
        let acked = acked.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while acked.load(Ordering::SeqCst) < at_least {
                assert!(Instant::now() < deadline, "load made no progress");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_acked(40).await;
    for node in 1..=3 {
        cluster.kill(node);
    }
    let before = acked.load(Ordering::SeqCst);
    for node in 1..=3 {
        cluster.restart(node).await;
    }
    wait_acked(before + 40).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let (client_id, key, last) = task.await.unwrap();
        assert!(last > 0);
        assert_eq!(
            raw.read(key.as_bytes()).await,
            Some(Value::Int(last as i64))
        );
        let retry = raw.execute_request(client_id, last, last, &incr(&key));
        assert_eq!(
            raw.execute(CALL_DEADLINE, &retry).await.unwrap(),
            (CommandResult::Incremented { value: last as i64 }, true),
            "{key}: the last request is recognised after the restart"
        );
    }
    cluster.wait_converged(&[1, 2, 3], 1).await;
}

/// A node that was down while the others snapshotted and purged their logs
/// catches up by snapshot; made leader, it still answers a retry of a
/// request applied before it came back with the original response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_node_catches_up_by_snapshot_and_recognises_retries() {
    let cluster = Cluster::start_with(
        "snapshot-catch-up",
        &[
            "--snapshot-every-entries",
            "40",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let raw = raw_client(&cluster).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let lagging = (1..=3).find(|node| *node != leader).unwrap();
    cluster.kill(lagging);
    let session = raw.register(7).await;
    for seq in 1..=150 {
        let request = raw.execute_request(session.client_id, seq, 1, &incr("k"));
        raw.execute(CALL_DEADLINE, &request).await.unwrap();
    }
    let others: Vec<u64> = (1..=3).filter(|node| *node != lagging).collect();
    let index = cluster.wait_converged(&others, 150).await;
    cluster.wait_snapshotted_and_purged(&others).await;
    cluster.restart(lagging).await;
    cluster.wait_converged(&[1, 2, 3], index).await;
    let status = cluster.status(lagging).await.unwrap();
    assert!(
        status.snapshot_index > 0,
        "the lagging node installed a snapshot"
    );

    // Move leadership to the node that came back: kill whoever leads (and
    // bring it back) until it does; bounded.
    for _ in 0..10 {
        let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
        if leader == lagging {
            break;
        }
        cluster.kill(leader);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let new_leader = cluster.leader().await;
            if new_leader.is_some_and(|new_leader| new_leader != leader) {
                break;
            }
            assert!(Instant::now() < deadline, "no new leader");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster.restart(leader).await;
    }
    assert_eq!(
        cluster.wait_for_leader(Duration::from_secs(60)).await,
        lagging,
        "leadership moved to the node that caught up"
    );
    let retry = raw.execute_request(session.client_id, 75, 1, &incr("k"));
    let reply = cluster
        .client(lagging)
        .execute(retry)
        .await
        .expect("the new leader answers")
        .into_inner();
    assert!(reply.duplicate, "recognised as a retry");
    assert_eq!(
        oncekv_wire::convert::result_from_proto(reply.result).unwrap(),
        CommandResult::Incremented { value: 75 }
    );
    assert_eq!(raw.read(b"k").await, Some(Value::Int(150)));
}

/// The nodes of a cluster build their snapshots a third of a cycle apart
/// (`--snapshot-every-entries`, staggered by each member's place), not at
/// the same index: node N, the (N-1)th member by id, builds at indexes
/// just past `k × every + (N-1) × every / 3`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_build_their_snapshots_a_third_of_a_cycle_apart() {
    const EVERY: u64 = 600;
    // How far past its point a build may start: the schedule looks at the
    // applied index every 50 ms, and sequential requests on a busy machine
    // apply far fewer than this in that time.
    const LATE: u64 = 150;
    let cluster = Cluster::start_with(
        "snapshot-phases",
        &["--snapshot-every-entries", &EVERY.to_string()],
    )
    .await;
    let raw = raw_client(&cluster).await;
    let session = raw.register(1).await;
    let mut seen: std::collections::BTreeMap<u64, std::collections::BTreeSet<u64>> =
        Default::default();
    for seq in 1..=1_500 {
        let request = raw.execute_request(session.client_id, seq, seq, &incr("n"));
        raw.execute(CALL_DEADLINE, &request).await.unwrap();
        if seq % 25 == 0 {
            for node in 1..=3 {
                let index = cluster.status(node).await.unwrap().snapshot_index;
                if index > 0 {
                    seen.entry(node).or_default().insert(index);
                }
            }
        }
    }
    for node in 1..=3u64 {
        let phase = (node - 1) * EVERY / 3;
        let built = seen.get(&node).cloned().unwrap_or_default();
        assert!(!built.is_empty(), "node {node} built no snapshot: {seen:?}");
        for index in &built {
            let past_point = (index + EVERY - phase) % EVERY;
            assert!(
                past_point < LATE,
                "node {node} built at {index}, {past_point} entries past its phase {phase} \
                 of every {EVERY}: {seen:?}"
            );
        }
    }
}
