//! Replacing a failed node, as an operator would: requests are applied,
//! node 3 dies for good, the survivors snapshot and purge their logs, a
//! fresh node 4 is added as a learner (catching up by snapshot), promoted
//! and node 3 removed — while a writer keeps going without a single failed
//! request. Node 4 then holds the same state hash as the others at the same
//! index, and, once it leads, answers a retry of a request applied before it
//! joined as a duplicate with the original response.

mod support;

use oncekv_core::{Command, CommandResult, Value};
use oncekv_wire::convert;
use oncekv_wire::proto;
use serde_json::Value as Json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use support::admin::{oncekv, wait_hashes_agree};
use support::cluster::Cluster;
use support::raw::{Raw, raw_client};
use tokio::time::Instant;

const CALL_DEADLINE: Duration = Duration::from_secs(60);
/// Requests applied before node 4 exists.
const BEFORE_JOIN: u64 = 60;

fn incr(key: &str) -> Command {
    Command::Increment {
        key: key.as_bytes().to_vec(),
        delta: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_a_dead_node_with_a_fresh_one() {
    let mut cluster = Cluster::start_with(
        "membership-replace",
        &[
            "--snapshot-every-entries",
            "30",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let raw = raw_client(&cluster).await;
    let session = raw.register(7).await;
    for seq in 1..=BEFORE_JOIN {
        let request = raw.execute_request(session.client_id, seq, 1, &incr("k"));
        raw.execute(CALL_DEADLINE, &request).await.unwrap();
    }

    // Node 3 dies for good.
    cluster.kill(3);
    cluster.add_node(4);
    let survivors = [1, 2];
    // From here on, every client knows node 4's address too, in case it leads.
    let raw = Raw::new(cluster.client_addrs(), raw.cluster_id.clone());

    // A writer keeps going through the whole replacement; every one of its
    // requests must succeed.
    let writer_raw = Raw::new(cluster.client_addrs(), raw.cluster_id.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writer = {
        let stop = stop.clone();
        let acked = acked.clone();
        let writer_session = writer_raw.register(8).await;
        tokio::spawn(async move {
            let mut seq = 0;
            while !stop.load(Ordering::SeqCst) {
                seq += 1;
                let request =
                    writer_raw.execute_request(writer_session.client_id, seq, seq, &incr("bg"));
                let (result, _) = writer_raw
                    .execute(CALL_DEADLINE, &request)
                    .await
                    .unwrap_or_else(|error| panic!("writer seq {seq} failed: {error}"));
                assert_eq!(result, CommandResult::Incremented { value: seq as i64 });
                acked.store(seq, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seq
        })
    };

    // The survivors snapshot and purge, so node 4 cannot replay from 1.
    for node in survivors {
        let mut request = tonic::Request::new(proto::TriggerSnapshotRequest {});
        request.set_timeout(CALL_DEADLINE);
        let reply = cluster
            .admin(node)
            .trigger_snapshot(request)
            .await
            .unwrap()
            .into_inner();
        assert!(
            reply.snapshot_index >= BEFORE_JOIN,
            "node {node}: {reply:?}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut purged = Vec::new();
        for node in survivors {
            purged.push(cluster.status(node).await.map_or(0, |s| s.purged_index));
        }
        if purged.iter().all(|&index| index > 1) {
            break;
        }
        assert!(Instant::now() < deadline, "logs never purged: {purged:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Node 4 starts empty and joins as a learner.
    cluster.start_new_node(4).await;
    let add = proto::AddLearnerRequest {
        cluster_id: raw.cluster_id.clone(),
        node_id: 4,
        peer_addr: cluster.peer_addr(4),
        client_addr: cluster.client_addr(4),
        timeout_ms: 90_000,
    };
    let admin_raw = Raw::new(
        survivors.map(|n| cluster.client_addr(n)).to_vec(),
        raw.cluster_id.clone(),
    );
    let added = admin_raw
        .admin_on_leader(Duration::from_secs(120), |mut client| {
            let mut request = tonic::Request::new(add.clone());
            request.set_timeout(Duration::from_secs(100));
            async move { client.add_learner(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("node 4 added as a learner and caught up");
    assert!(added.matched_index >= added.log_index, "{added:?}");
    let learner = added
        .members
        .iter()
        .find(|member| member.node_id == 4)
        .expect("node 4 is a member");
    assert!(!learner.voter);
    let status = cluster.status(4).await.unwrap();
    assert!(
        status.snapshot_index > 0,
        "node 4 caught up by installing a snapshot: {status:?}"
    );

    // Promote 4 and remove 3 with the CLI, as docs/operating.md ("Membership") describes.
    let endpoints = cluster.client_addrs();
    let timeout = ["--timeout-ms", "60000"];
    oncekv(
        &endpoints,
        &[&["admin", "promote", "4"][..], &timeout].concat(),
    )
    .await
    .ok();
    oncekv(
        &endpoints,
        &[&["admin", "remove", "3"][..], &timeout].concat(),
    )
    .await
    .ok();
    let members = oncekv(&endpoints, &["admin", "members", "--json"])
        .await
        .json();
    let mut voters: Vec<u64> = members["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|member| member["voter"] == Json::Bool(true))
        .map(|member| member["node_id"].as_u64().unwrap())
        .collect();
    voters.sort_unstable();
    assert_eq!(voters, [1, 2, 4], "{members}");
    assert_eq!(members["members"].as_array().unwrap().len(), 3, "{members}");

    // The writer never failed across the change.
    let before_stop = acked.load(Ordering::SeqCst);
    let deadline = Instant::now() + CALL_DEADLINE;
    while acked.load(Ordering::SeqCst) < before_stop + 5 {
        assert!(
            Instant::now() < deadline,
            "the writer stalled after the change"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let written = writer.await.expect("the writer never failed");
    assert_eq!(raw.read(b"bg").await, Some(Value::Int(written as i64)));

    // Node 4 holds the same state as the others, at the same index.
    let (index, hash) = wait_hashes_agree(&cluster, &[1, 2, 4], BEFORE_JOIN).await;
    let hashes = oncekv(&endpoints, &["admin", "hash", "--json"])
        .await
        .json();
    assert_eq!(hashes["agree"], true, "{hashes}");
    assert!(!hash.is_empty() && index > BEFORE_JOIN);
    let local = cluster
        .admin(4)
        .local_read(proto::LocalReadRequest { key: b"k".to_vec() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        local
            .value
            .map(|value| convert::value_from_proto(value).unwrap()),
        Some(Value::Int(BEFORE_JOIN as i64))
    );

    // Move leadership to node 4 (kill whoever leads and bring it back, until
    // 4 does; bounded), then retry a request from before it joined there.
    for _ in 0..10 {
        let leader = cluster.wait_for_leader(CALL_DEADLINE).await;
        if leader == 4 {
            break;
        }
        cluster.kill(leader);
        let deadline = Instant::now() + CALL_DEADLINE;
        while cluster
            .leader()
            .await
            .is_none_or(|new_leader| new_leader == leader)
        {
            assert!(Instant::now() < deadline, "no new leader");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster.restart(leader).await;
    }
    assert_eq!(
        cluster.wait_for_leader(CALL_DEADLINE).await,
        4,
        "leadership moved to the new node"
    );
    let retry = raw.execute_request(session.client_id, 30, 1, &incr("k"));
    let reply = cluster
        .client(4)
        .execute(retry)
        .await
        .expect("node 4, leading, answers")
        .into_inner();
    assert!(reply.duplicate, "recognised as a retry");
    assert_eq!(
        convert::result_from_proto(reply.result).unwrap(),
        CommandResult::Incremented { value: 30 },
        "the original response"
    );
    assert_eq!(
        raw.read(b"k").await,
        Some(Value::Int(BEFORE_JOIN as i64)),
        "no second effect"
    );
}
