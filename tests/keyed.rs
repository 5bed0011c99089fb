//! Idempotency keys (rule 18) on real 3-node clusters, through the client
//! library's `execute_with_key`: a keyed increment retried across a leader
//! kill applies once and answers the original result; the same key with
//! another command is KEY_CONFLICT; a node that was down and caught up by
//! snapshot still answers a repeat as a duplicate; a TTL shortened through
//! `SetConfig` forgets the keys on every replica alike (equal state hashes
//! at equal indexes, no record anywhere), after which a key executes anew.

mod support;

use oncekv_client::{Error, KeyedReply};
use oncekv_core::{Command, CommandResult, Value};
use oncekv_wire::convert;
use oncekv_wire::proto::{self, admin_client::AdminClient};
use std::time::Duration;
use support::admin::wait_hashes_agree;
use support::cluster::Cluster;
use support::raw::raw_client;
use tokio::time::Instant;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(60);

fn incr(key: &str, delta: i64) -> Command {
    Command::Increment {
        key: key.as_bytes().to_vec(),
        delta,
    }
}

fn executed(value: i64, duplicate: bool) -> (CommandResult, bool) {
    (CommandResult::Incremented { value }, duplicate)
}

fn answer(reply: KeyedReply) -> (CommandResult, bool) {
    (reply.result, reply.duplicate)
}

/// The anonymous principal's record of `key` on `node`, with the applied
/// index it reflects.
async fn key_on(cluster: &Cluster, node: u64, key: &[u8]) -> proto::GetKeyReply {
    cluster
        .admin(node)
        .get_key(proto::GetKeyRequest {
            principal: String::new(),
            idempotency_key: key.to_vec(),
        })
        .await
        .unwrap_or_else(|status| panic!("GetKey on node {node}: {status}"))
        .into_inner()
}

/// Waits until the increment carried by `key` is applied on `node` (its
/// record is there).
async fn wait_key_applied(cluster: &Cluster, node: u64, key: &[u8]) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(reply) = cluster
            .admin(node)
            .get_key(proto::GetKeyRequest {
                principal: String::new(),
                idempotency_key: key.to_vec(),
            })
            .await
            && reply.into_inner().key.is_some()
        {
            return;
        }
        assert!(Instant::now() < deadline, "key never applied on {node}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A keyed increment whose reply is lost (a fault-injection build drops
/// it; otherwise the call simply completes) and whose leader is then
/// killed: the library retries the same key at the new leader, which
/// answers the original result as a duplicate. A later call with the key
/// is a duplicate too, another command with it is KEY_CONFLICT, and the
/// counter moved once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_increment_retried_across_a_leader_kill_applies_once() {
    let cluster = Cluster::start("keyed-failover").await;
    let raw = raw_client(&cluster).await;
    let client = cluster.patient_client();
    // Warm the library up (cluster id, leader) and show a first execution.
    assert_eq!(
        answer(
            client
                .execute_with_key(b"warm", incr("w", 1))
                .await
                .unwrap()
        ),
        executed(1, false)
    );
    let leader = cluster.wait_for_leader(DEADLINE).await;
    let dropping = cfg!(feature = "fault-injection");
    if dropping {
        cluster
            .admin(leader)
            .inject_fault(proto::InjectFaultRequest {
                drop_execute_replies: 1,
            })
            .await
            .expect("a fault-injection build drops replies");
    }
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.execute_with_key(b"pay-1", incr("n", 5)).await })
    };
    // The increment is applied on the leader (its reply, in a
    // fault-injection build, never sent); then the leader dies.
    wait_key_applied(&cluster, leader, b"pay-1").await;
    cluster.kill(leader);
    let reply = call.await.unwrap().expect("answered by the next leader");
    if dropping {
        assert!(
            reply.duplicate,
            "the retry was answered from the key's record"
        );
    }
    assert_eq!(reply.result, CommandResult::Incremented { value: 5 });
    let new_leader = cluster.wait_for_new_leader(leader).await;
    assert_ne!(new_leader, leader);

    // Again, now certainly at another node: the original answer.
    assert_eq!(
        answer(
            client
                .execute_with_key(b"pay-1", incr("n", 5))
                .await
                .unwrap()
        ),
        executed(5, true)
    );
    // Rule 3's one shortcut: once the leader has applied the record (it
    // has, having answered from it), a repeat is answered from it after a
    // read index, with no log entry.
    let repeat = client.execute_with_key(b"pay-1", incr("n", 5)).await;
    assert_eq!(answer(repeat.unwrap()), executed(5, true));
    assert!(cluster.answered_from_applied("execute_keyed").await >= 1.0);
    let error = client
        .execute_with_key(b"pay-1", incr("n", 6))
        .await
        .expect_err("another command with the key");
    assert!(matches!(error, Error::KeyConflict { .. }), "{error}");
    assert_eq!(raw.read(b"n").await, Some(Value::Int(5)), "applied once");

    cluster.restart(leader).await;
    let status = cluster.status(new_leader).await.unwrap();
    let (index, _) = wait_hashes_agree(&cluster, &[1, 2, 3], status.applied_index).await;
    for node in 1..=3 {
        let reply = key_on(&cluster, node, b"pay-1").await;
        assert!(reply.applied_index >= index);
        let record = convert::key_from_proto(reply.key.expect("every replica has the record"))
            .expect("a valid record");
        assert_eq!(record.response, Ok(CommandResult::Incremented { value: 5 }));
    }
}

/// A follower whose own durable snapshot already holds most of the keys is
/// caught up by an *extension* of it (docs/state-beyond-ram.md §4.9p): the
/// leader sends only the keys added since, the follower adds them to its
/// store, and its state hash, key count and records agree with the others'
/// — a key of before its stop and one of after both read from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_is_sent_only_the_keys_added_since_its_snapshot() {
    let cluster = Cluster::start_with(
        "keyed-extension",
        &[
            "--snapshot-every-entries",
            "40",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let client = cluster.patient_client();
    let write = |from: u32, to: u32| {
        let client = &client;
        async move {
            for message in from..to {
                let key = format!("msg-{message}");
                let reply = client
                    .execute_with_key(key.as_bytes(), incr("s", 1))
                    .await
                    .unwrap();
                assert!(!reply.duplicate, "{key}");
            }
        }
    };
    write(0, 150).await;
    let leader = cluster.wait_for_leader(DEADLINE).await;
    let status = cluster.status(leader).await.unwrap();
    wait_hashes_agree(&cluster, &[1, 2, 3], status.applied_index).await;
    cluster.wait_snapshotted_and_purged(&[1, 2, 3]).await;
    let lagging = (1..=3).find(|node| *node != leader).unwrap();
    cluster.kill(lagging);
    write(150, 300).await;
    let others: Vec<u64> = (1..=3).filter(|node| *node != lagging).collect();
    let status = cluster.status(leader).await.unwrap();
    let (index, _) = wait_hashes_agree(&cluster, &others, status.applied_index).await;
    cluster.wait_snapshotted_and_purged(&others).await;
    cluster.restart(lagging).await;
    wait_hashes_agree(&cluster, &[1, 2, 3], index).await;
    let metrics = cluster.scrape(lagging).await.unwrap();
    assert!(
        support::metrics::counter(&metrics, "oncekv_snapshot_extensions_installed_total", &[])
            >= 1.0,
        "caught up by an extension: {}",
        metrics
            .lines()
            .filter(|line| line.contains("snapshot"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(cluster.status(lagging).await.unwrap().idempotency_keys, 300);
    for key in [&b"msg-3"[..], b"msg-299"] {
        let record = key_on(&cluster, lagging, key).await;
        assert!(record.key.is_some(), "{}", String::from_utf8_lossy(key));
    }
}

/// With frequent snapshots and short logs, a node that was down catches up
/// by snapshot and — made leader — still answers a repeat of a keyed
/// increment applied while it was away as a duplicate. Then the key TTL is
/// shortened through SetConfig: every replica forgets the keys alike, and
/// the key executes anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_survive_snapshot_install_and_expire_on_every_replica() {
    let cluster = Cluster::start_with(
        "keyed-snapshot",
        &[
            "--snapshot-every-entries",
            "40",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let raw = raw_client(&cluster).await;
    let client = cluster.patient_client();
    // The default 24 h TTL: keys go in minute-wide creation-time groups.
    let leader = cluster.wait_for_leader(DEADLINE).await;
    let lagging = (1..=3).find(|node| *node != leader).unwrap();
    cluster.kill(lagging);
    assert_eq!(
        answer(
            client
                .execute_with_key(b"msg-0", incr("s", 3))
                .await
                .unwrap()
        ),
        executed(3, false)
    );
    for message in 1..=120 {
        let key = format!("msg-{message}");
        let reply = client
            .execute_with_key(key.as_bytes(), incr("s", 1))
            .await
            .unwrap();
        assert!(!reply.duplicate, "{key}");
    }
    let others: Vec<u64> = (1..=3).filter(|node| *node != lagging).collect();
    let status = cluster.status(leader).await.unwrap();
    let (index, _) = wait_hashes_agree(&cluster, &others, status.applied_index).await;
    cluster.wait_snapshotted_and_purged(&others).await;
    for &node in &others {
        let status = cluster.status(node).await.unwrap();
        assert_eq!(status.idempotency_keys, 121);
    }
    cluster.restart(lagging).await;
    wait_hashes_agree(&cluster, &[1, 2, 3], index).await;
    let status = cluster.status(lagging).await.unwrap();
    assert!(
        status.snapshot_index > 0,
        "the lagging node installed a snapshot"
    );
    assert_eq!(
        status.idempotency_keys, 121,
        "the snapshot carried the keys"
    );

    // Move leadership to the node that came back: kill whoever leads (and
    // bring it back) until it does; bounded.
    for _ in 0..10 {
        let leader = cluster.wait_for_leader(DEADLINE).await;
        if leader == lagging {
            break;
        }
        cluster.kill(leader);
        cluster.wait_for_new_leader(leader).await;
        cluster.restart(leader).await;
    }
    assert_eq!(
        cluster.wait_for_leader(DEADLINE).await,
        lagging,
        "leadership moved to the node that caught up"
    );
    assert_eq!(
        answer(
            client
                .execute_with_key(b"msg-0", incr("s", 3))
                .await
                .unwrap()
        ),
        executed(3, true)
    );
    let error = client
        .execute_with_key(b"msg-0", incr("s", 4))
        .await
        .expect_err("another command with the key");
    assert!(matches!(error, Error::KeyConflict { .. }), "{error}");
    assert_eq!(raw.read(b"s").await, Some(Value::Int(123)));

    // A TTL of one second. Keys whose group is older than it are forgotten
    // at the config entry itself, the rest at the first entry stamped a
    // second after their group's end — and the change ends the group open
    // at it (rules version 4), so that is a second after the change, not
    // after the end of the minute it fell in: plain increments (no key)
    // move cluster time on until the leader holds no key.
    let reply = raw
        .set_config(
            DEADLINE,
            proto::RegistryConfigPatch {
                idempotency_key_ttl_ms: Some(1_000),
                ..Default::default()
            },
        )
        .await;
    let config = reply.config.expect("the config in force");
    assert_eq!(config.idempotency_key_ttl_ms, 1_000);
    // Well under the minute the open group would have lasted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let expired_at = loop {
        client.execute_plain(incr("tick", 1)).await.unwrap();
        let leader = cluster.wait_for_leader(DEADLINE).await;
        let status = cluster.status(leader).await.unwrap();
        if status.idempotency_keys == 0 {
            break status.applied_index;
        }
        assert!(
            Instant::now() < deadline,
            "the keys did not expire soon after the TTL was lowered to a second"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Equal hashes at an equal index at or after the config entry: equal
    // key records; and no replica has the key (nothing can bring it back
    // but a new request with it).
    let (index, _) = wait_hashes_agree(&cluster, &[1, 2, 3], expired_at).await;
    for node in 1..=3 {
        let reply = key_on(&cluster, node, b"msg-0").await;
        assert!(reply.applied_index >= index, "node {node}");
        assert_eq!(reply.key, None, "node {node} still has the key");
        let status = cluster.status(node).await.unwrap();
        assert_eq!(status.idempotency_keys, 0, "node {node}");
        let listed = cluster
            .admin(node)
            .list_keys(proto::ListKeysRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(listed.keys.is_empty() && !listed.more, "node {node}");
    }
    // Forgotten: the key executes anew.
    assert_eq!(
        answer(
            client
                .execute_with_key(b"msg-0", incr("s", 3))
                .await
                .unwrap()
        ),
        executed(126, false)
    );
    // Retried with no other entry in between (an idle cluster, whose
    // applied cluster time stands still), the key is answered from its
    // record only until the leader's clock passes its TTL; then the retry
    // goes through the log, whose entry moves cluster time on, expires the
    // key and executes anew.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let got = answer(
            client
                .execute_with_key(b"msg-0", incr("s", 3))
                .await
                .unwrap(),
        );
        if got == executed(129, false) {
            break;
        }
        assert_eq!(got, executed(126, true));
        assert!(
            Instant::now() < deadline,
            "an idle cluster kept the key past its TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of gauge `name` on `node`'s metrics.
async fn gauge(cluster: &Cluster, node: u64, name: &str) -> f64 {
    let text = cluster.scrape(node).await.expect("metrics");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} on node {node}"))
}

/// Every live key of `node`, paged `limit` at a time through ListKeys.
async fn all_keys(cluster: &Cluster, node: u64, limit: u32) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut after = Vec::new();
    loop {
        let page = cluster
            .admin(node)
            .list_keys(proto::ListKeysRequest {
                after_principal: String::new(),
                after_key: after.clone(),
                limit,
            })
            .await
            .unwrap_or_else(|status| panic!("ListKeys on node {node}: {status}"))
            .into_inner();
        keys.extend(page.keys.iter().map(|key| key.idempotency_key.clone()));
        match page.keys.last() {
            Some(last) if page.more => after = last.idempotency_key.clone(),
            _ => return keys,
        }
    }
}

/// Key records move out of memory into the record store (`state/`) at
/// every snapshot build (docs/state-beyond-ram.md §4.5). With a build
/// asked for whenever 25 key records are held in memory (and none by the
/// entry count), keys written across many builds live in the store:
/// repeats of the oldest are still duplicates (the record is fetched from
/// the store before its entry applies), GetKey and ListKeys see every key
/// through the layers and the store (in order, across pages, on every
/// node), a forgotten stored key executes anew, and a restarted node
/// agrees with the others and still answers repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_records_in_the_record_store_still_answer_repeats() {
    let cluster = Cluster::start_with(
        "keyed-store",
        &[
            "--snapshot-every-entries",
            "1000000",
            "--snapshot-every-key-records",
            "25",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let raw = raw_client(&cluster).await;
    let client = cluster.patient_client();
    let count = 150;
    let name = |n: u32| format!("store-{n:03}").into_bytes();
    for n in 0..count {
        let reply = client
            .execute_with_key(&name(n), incr("s", 1))
            .await
            .unwrap();
        assert_eq!(answer(reply), executed(i64::from(n) + 1, false));
    }
    for node in 1..=3 {
        let store = cluster.data_dir(node).join("state");
        assert!(
            store.join("CURRENT").exists(),
            "node {node} has a record store"
        );
        let status = cluster.status(node).await.unwrap();
        assert!(status.snapshot_index > 0, "node {node} built a snapshot");
        let in_memory = gauge(&cluster, node, "oncekv_idempotency_keys_in_memory").await;
        assert!(
            in_memory < 60.0,
            "node {node} holds {in_memory} key records"
        );
    }
    // The oldest keys went to the store many builds ago: their repeats
    // are answered by the leader from the store after a read index (rule
    // 3's shortcut), with no log entry.
    let shortcuts = cluster.answered_from_applied("execute_keyed").await;
    for n in [0, 1, 70] {
        let reply = client
            .execute_with_key(&name(n), incr("s", 1))
            .await
            .unwrap();
        assert_eq!(answer(reply), executed(i64::from(n) + 1, true), "key {n}");
    }
    assert_eq!(
        cluster.answered_from_applied("execute_keyed").await,
        shortcuts + 3.0,
        "repeats of stored keys answered from the applied state"
    );
    let error = client
        .execute_with_key(&name(2), incr("s", 9))
        .await
        .expect_err("another command with a stored key");
    assert!(matches!(error, Error::KeyConflict { .. }), "{error}");
    let leader = cluster.wait_for_leader(DEADLINE).await;
    let status = cluster.status(leader).await.unwrap();
    wait_hashes_agree(&cluster, &[1, 2, 3], status.applied_index).await;
    let expected: Vec<Vec<u8>> = (0..count).map(name).collect();
    for node in 1..=3 {
        assert_eq!(all_keys(&cluster, node, 7).await, expected, "node {node}");
        let reply = key_on(&cluster, node, &name(0)).await;
        let key = reply.key.expect("the oldest key");
        assert_eq!(key.idempotency_key, name(0));
    }

    // Forget a stored key: it executes anew, as new.
    let request = proto::ForgetKeyRequest {
        cluster_id: raw.cluster_id.clone(),
        principal: String::new(),
        idempotency_key: name(3),
    };
    let forgotten = raw
        .admin_on_leader(DEADLINE, |mut admin: AdminClient<Channel>| {
            let request = request.clone();
            async move { admin.forget_key(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("ForgetKey");
    assert!(forgotten.existed, "the stored key existed");
    let reply = client
        .execute_with_key(&name(3), incr("s", 1))
        .await
        .unwrap();
    assert_eq!(answer(reply), executed(i64::from(count) + 1, false));

    // Every node restarted in turn (whichever leads next restarted from
    // its snapshot and store): the nodes agree, a restarted node holds in
    // memory only what changed after its snapshot (the rest stayed in its
    // store), and repeats of stored keys are still duplicates.
    for node in 1..=3 {
        cluster.restart(node).await;
        let leader = cluster.wait_for_leader(DEADLINE).await;
        let status = cluster.status(leader).await.unwrap();
        wait_hashes_agree(&cluster, &[1, 2, 3], status.applied_index).await;
        assert_eq!(all_keys(&cluster, node, 50).await, expected, "node {node}");
        let in_memory = gauge(&cluster, node, "oncekv_idempotency_keys_in_memory").await;
        assert!(
            in_memory < 30.0,
            "node {node} holds {in_memory} key records in memory after a restart"
        );
    }
    for n in [0, 3, 149] {
        let reply = client
            .execute_with_key(&name(n), incr("s", 1))
            .await
            .unwrap();
        assert!(reply.duplicate, "key {n} after the restart");
    }
    assert_eq!(raw.read(b"s").await, Some(Value::Int(i64::from(count) + 1)));
}
