//! The Admin service against real 3-node clusters: a registry config change
//! applies on every replica at one log index (equal hashes), after which the
//! shorter TTL really expires an idle session and the smaller window is
//! enforced; sessions are listed, inspected and force-expired through the
//! log; local reads and state hashes on followers; a triggered snapshot;
//! leader-only RPCs refused on followers with the leader's hint, bad input
//! refused as INVALID_ARGUMENT. At most two clusters run at once here.

mod support;

use oncekv_core::{Command, CommandResult, RegistryConfig, Value};
use oncekv_wire::convert;
use oncekv_wire::proto::{self, Reason};
use oncekv_wire::status::error_detail;
use std::time::Duration;
use support::admin::{oncekv, wait_hashes_agree};
use support::cluster::Cluster;
use support::raw::{Raw, raw_client, reason};
use tokio::time::Instant;

const CALL_DEADLINE: Duration = Duration::from_secs(60);

fn incr(key: &str) -> Command {
    Command::Increment {
        key: key.as_bytes().to_vec(),
        delta: 1,
    }
}

/// Runs an Admin call on the leader (following hints), panicking on failure.
async fn on_leader<T, F, Fut>(raw: &Raw, call: F) -> Result<T, tonic::Status>
where
    F: Fn(proto::admin_client::AdminClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    raw.admin_on_leader(CALL_DEADLINE, |client| {
        let reply = call(client);
        async move { reply.await.map(tonic::Response::into_inner) }
    })
    .await
}

/// A follower of the current leader.
async fn a_follower(cluster: &Cluster) -> u64 {
    let leader = cluster.wait_for_leader(CALL_DEADLINE).await;
    (1..=3).find(|node| *node != leader).unwrap()
}

/// A config change (shorter TTL, smaller window), made with the CLI, applies
/// on every replica at the same index with equal hashes; then an idle
/// session expires under the new TTL while an active one lives, and the
/// smaller window refuses a seq beyond it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_change_applies_everywhere_and_takes_effect() {
    let cluster = Cluster::start("admin-config").await;
    let raw = raw_client(&cluster).await;
    let endpoints = cluster.client_addrs();
    let idle = raw.register(1).await;
    let request = raw.execute_request(idle.client_id, 1, 1, &incr("n"));
    raw.execute(CALL_DEADLINE, &request).await.unwrap();

    let shown = oncekv(&endpoints, &["admin", "config", "--json"])
        .await
        .json();
    assert_eq!(shown["config"]["session_ttl_ms"], 60_000);
    // A new cluster starts at the latest rules version, with its limits:
    // idempotency-key records and finished claims on disk, 50 M of each.
    assert_eq!(shown["config"]["rules_version"], 4);
    assert_eq!(shown["config"]["idempotency_keys_max"], 50_000_000u64);
    assert_eq!(shown["config"]["idempotency_cached_bytes_max"], 16u64 << 30);
    assert_eq!(shown["config"]["claims_max"], 50_000_000u64);
    assert_eq!(shown["config"]["claim_cached_bytes_max"], 16u64 << 30);
    // The version never goes down, and is raised alone.
    for (args, why) in [
        (&["--rules-version", "2"][..], "never goes down"),
        (&["--rules-version", "9"][..], "unknown to this build"),
        (
            &["--rules-version", "4", "--window", "4"][..],
            "raised alone",
        ),
    ] {
        let refused = oncekv(
            &endpoints,
            &[&["admin", "config", "set"][..], args, &["--json"]].concat(),
        )
        .await;
        assert_ne!(refused.code, 0, "{args:?} was accepted");
        assert!(
            refused.stdout.contains(why) || refused.stderr.contains(why),
            "{args:?}: {refused:?}"
        );
    }
    let same = oncekv(
        &endpoints,
        &["admin", "config", "set", "--rules-version", "4", "--json"],
    )
    .await
    .json();
    assert_eq!(
        same["config"]["rules_version"], 4,
        "a raise to the version in force"
    );
    let set = oncekv(
        &endpoints,
        &[
            "admin",
            "config",
            "set",
            "--session-ttl-ms",
            "3000",
            "--window",
            "2",
            "--json",
        ],
    )
    .await
    .json();
    let log_index = set["log_index"].as_u64().expect("the config's log index");
    assert_eq!(set["config"]["session_ttl_ms"], 3000);
    assert_eq!(set["config"]["window"], 2);
    assert_eq!(
        set["config"]["sessions_max"],
        RegistryConfig::default().sessions_max,
        "fields not given stay as they were"
    );

    // Every replica holds the new config once it applied that index, and
    // all agree on the hash at one index.
    for node in 1..=3 {
        let deadline = Instant::now() + CALL_DEADLINE;
        loop {
            let reply = cluster
                .admin(node)
                .get_config(proto::GetConfigRequest {})
                .await
                .unwrap()
                .into_inner();
            if reply.applied_index >= log_index {
                let config = reply.config.expect("bootstrapped");
                assert_eq!(
                    (config.session_ttl_ms, config.window),
                    (3000, 2),
                    "node {node}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} never applied the config"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    wait_hashes_agree(&cluster, &[1, 2, 3], log_index).await;
    // Registered only now, so that it cannot idle out under the new TTL
    // while the replicas are compared.
    let active = raw.register(2).await;

    // The smaller window: floor 1, window 2 → seq 3 is refused, 2 is not.
    let first = raw.execute_request(active.client_id, 1, 1, &incr("w"));
    raw.execute(CALL_DEADLINE, &first).await.unwrap();
    let second = raw.execute_request(active.client_id, 2, 1, &incr("w"));
    raw.execute(CALL_DEADLINE, &second).await.unwrap();
    let beyond = raw.execute_request(active.client_id, 3, 1, &incr("w"));
    // Straight to the leader: the raw client would retry this "this
    // attempt" refusal until its deadline.
    let error = loop {
        let leader = cluster.wait_for_leader(CALL_DEADLINE).await;
        let error = cluster
            .client(leader)
            .execute(beyond.clone())
            .await
            .expect_err("seq 3 is beyond floor 1 + window 2");
        if reason(&error) != Some(Reason::NotLeader) {
            break error;
        }
    };
    assert_eq!(reason(&error), Some(Reason::TooManyOutstanding), "{error}");
    assert_eq!(error_detail(&error).unwrap().window, 2);

    // The shorter TTL: the idle session goes, the active one stays.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let keep_alive = proto::KeepAliveRequest {
            cluster_id: raw.cluster_id.clone(),
            client_id: active.client_id,
            first_outstanding_seq: 3,
        };
        raw.on_leader(CALL_DEADLINE, |mut client| {
            let request = keep_alive.clone();
            async move { client.keep_alive(request).await }
        })
        .await
        .expect("the active session lives");
        let gone = on_leader(&raw, |mut client| async move {
            client
                .get_session(proto::GetSessionRequest {
                    client_id: idle.client_id,
                })
                .await
        })
        .await;
        match gone {
            Err(error) => {
                assert_eq!(reason(&error), Some(Reason::SessionExpired), "{error}");
                break;
            }
            Ok(session) => assert!(
                Instant::now() < deadline,
                "the idle session never expired: {session:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let late = raw.execute_request(idle.client_id, 2, 2, &incr("n"));
    let error = raw.execute(CALL_DEADLINE, &late).await.unwrap_err();
    assert_eq!(reason(&error), Some(Reason::SessionExpired));

    let (index, _) = wait_hashes_agree(&cluster, &[1, 2, 3], log_index + 1).await;
    let hashes = oncekv(&endpoints, &["admin", "hash", "--json"])
        .await
        .json();
    assert_eq!(hashes["agree"], true, "{hashes}");
    assert!(hashes["applied_index"].as_u64().unwrap() >= index);
}

/// Sessions are listed (paged, in client id order), inspected and expired
/// through the log; local reads and state hashes on a follower; a snapshot
/// on demand; leader-only RPCs on a follower get NOT_LEADER with the hint;
/// bad input is INVALID_ARGUMENT and a foreign cluster id WRONG_CLUSTER.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_reads_snapshots_and_refusals() {
    let cluster = Cluster::start("admin-sessions").await;
    let raw = raw_client(&cluster).await;
    let mut ids = Vec::new();
    for nonce in 1..=3 {
        ids.push(raw.register(nonce).await.client_id);
    }
    for seq in 1..=4 {
        let request = raw.execute_request(ids[1], seq, seq.min(3), &incr("k"));
        raw.execute(CALL_DEADLINE, &request).await.unwrap();
    }
    let (index, _) = wait_hashes_agree(&cluster, &[1, 2, 3], 1).await;
    let follower = a_follower(&cluster).await;
    let mut admin = cluster.admin(follower);

    // Listing, paged, on a follower.
    let first = admin
        .list_sessions(proto::ListSessionsRequest {
            after_client_id: 0,
            limit: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(first.applied_index >= index);
    assert!(first.more);
    let rest = admin
        .list_sessions(proto::ListSessionsRequest {
            after_client_id: first.sessions[1].client_id,
            limit: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!rest.more);
    let listed: Vec<u64> = first
        .sessions
        .iter()
        .chain(&rest.sessions)
        .map(|session| session.client_id)
        .collect();
    assert_eq!(listed, ids, "every session once, in client id order");

    // One session: floor 3 trimmed seqs 1 and 2; 3 and 4 are cached.
    let session = admin
        .get_session(proto::GetSessionRequest { client_id: ids[1] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(session.floor, 3);
    assert_eq!(session.cached_responses, 2);
    assert_eq!(session.cached_bytes, 64);
    assert!(session.last_activity_ms > 0);

    // Local read on a follower, without a read index.
    let read = admin
        .local_read(proto::LocalReadRequest { key: b"k".to_vec() })
        .await
        .unwrap()
        .into_inner();
    assert!(read.applied_index >= index);
    assert_eq!(
        read.value
            .map(|value| convert::value_from_proto(value).unwrap()),
        Some(Value::Int(4))
    );
    let absent = admin
        .local_read(proto::LocalReadRequest {
            key: b"none".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(absent.value.is_none());

    // A snapshot on demand, on the follower.
    let snapshot = admin
        .trigger_snapshot(proto::TriggerSnapshotRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(snapshot.snapshot_index >= index, "{snapshot:?} vs {index}");
    let status = cluster.status(follower).await.unwrap();
    assert!(status.snapshot_index >= snapshot.snapshot_index);

    // Leader-only RPCs on a follower: NOT_LEADER with the leader's address.
    let expire = proto::ExpireSessionRequest {
        cluster_id: raw.cluster_id.clone(),
        client_id: ids[0],
    };
    let leader = cluster.wait_for_leader(CALL_DEADLINE).await;
    let error = admin
        .expire_session(expire.clone())
        .await
        .expect_err("a follower does not propose");
    assert_eq!(reason(&error), Some(Reason::NotLeader), "{error}");
    let remove = proto::RemoveNodeRequest {
        cluster_id: raw.cluster_id.clone(),
        node_id: leader,
    };
    let error = admin.remove_node(remove).await.expect_err("not the leader");
    assert_eq!(reason(&error), Some(Reason::NotLeader));
    assert_eq!(
        error_detail(&error).unwrap().leader_client_addr,
        cluster.client_addr(cluster.wait_for_leader(CALL_DEADLINE).await)
    );

    // Expire through the log: gone everywhere; its client is refused.
    let expired = on_leader(&raw, |mut client| {
        let request = expire.clone();
        async move { client.expire_session(request).await }
    })
    .await
    .unwrap();
    assert!(expired.log_index > index);
    wait_hashes_agree(&cluster, &[1, 2, 3], expired.log_index).await;
    for node in 1..=3 {
        let error = cluster
            .admin(node)
            .get_session(proto::GetSessionRequest { client_id: ids[0] })
            .await
            .expect_err("expired on every replica");
        assert_eq!(reason(&error), Some(Reason::SessionExpired));
    }
    let again = on_leader(&raw, |mut client| {
        let request = expire.clone();
        async move { client.expire_session(request).await }
    })
    .await
    .expect_err("already gone");
    assert_eq!(reason(&again), Some(Reason::SessionExpired));
    let late = raw.execute_request(ids[0], 1, 1, &incr("k"));
    let error = raw.execute(CALL_DEADLINE, &late).await.unwrap_err();
    assert_eq!(reason(&error), Some(Reason::SessionExpired));

    // Bad input, at the leader.
    let cluster_id = raw.cluster_id.clone();
    let bad_config = proto::SetConfigRequest {
        cluster_id: cluster_id.clone(),
        patch: Some(proto::RegistryConfigPatch {
            window: Some(0),
            ..Default::default()
        }),
    };
    let error = on_leader(&raw, |mut client| {
        let request = bad_config.clone();
        async move { client.set_config(request).await }
    })
    .await
    .expect_err("window 0 is out of bounds");
    assert_eq!(reason(&error), Some(Reason::InvalidArgument), "{error}");
    let wrong_cluster = proto::ExpireSessionRequest {
        cluster_id: vec![0xab; 16],
        client_id: ids[2],
    };
    let error = on_leader(&raw, |mut client| {
        let request = wrong_cluster.clone();
        async move { client.expire_session(request).await }
    })
    .await
    .expect_err("another cluster's id");
    assert_eq!(reason(&error), Some(Reason::WrongCluster));
    let cases: Vec<(&str, proto::ChangeVotersRequest)> = vec![
        (
            "empty voter set",
            proto::ChangeVotersRequest {
                cluster_id: cluster_id.clone(),
                voters: vec![],
            },
        ),
        (
            "unknown node",
            proto::ChangeVotersRequest {
                cluster_id: cluster_id.clone(),
                voters: vec![1, 2, 3, 9],
            },
        ),
    ];
    for (what, request) in cases {
        let error = on_leader(&raw, |mut client| {
            let request = request.clone();
            async move { client.change_voters(request).await }
        })
        .await
        .expect_err(what);
        assert_eq!(
            reason(&error),
            Some(Reason::InvalidArgument),
            "{what}: {error}"
        );
    }
    let unknown = proto::RemoveNodeRequest {
        cluster_id: cluster_id.clone(),
        node_id: 9,
    };
    let error = on_leader(&raw, |mut client| {
        let request = unknown.clone();
        async move { client.remove_node(request).await }
    })
    .await
    .expect_err("node 9 is no member");
    assert_eq!(reason(&error), Some(Reason::InvalidArgument));
    let no_cluster = proto::AddLearnerRequest {
        node_id: 4,
        peer_addr: "127.0.0.1:1".into(),
        client_addr: "127.0.0.1:2".into(),
        ..Default::default()
    };
    let error = on_leader(&raw, |mut client| {
        let request = no_cluster.clone();
        async move { client.add_learner(request).await }
    })
    .await
    .expect_err("the cluster id is required");
    assert_eq!(reason(&error), Some(Reason::InvalidArgument));

    // Test-only faults exist only in a fault-injection build.
    let injected = cluster
        .admin(leader)
        .inject_fault(proto::InjectFaultRequest {
            drop_execute_replies: 0,
        })
        .await;
    if cfg!(feature = "fault-injection") {
        assert_eq!(
            injected.unwrap().into_inner().drop_execute_replies_pending,
            0
        );
    } else {
        assert_eq!(injected.unwrap_err().code(), tonic::Code::Unimplemented);
    }

    // The CLI's view of the same.
    let endpoints = cluster.client_addrs();
    let listed = oncekv(&endpoints, &["admin", "sessions", "--json"])
        .await
        .json();
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 2, "{listed}");
    let one = oncekv(&endpoints, &["admin", "session", &ids[1].to_string()]).await;
    assert!(one.ok().contains("floor 3  cached 2 (64 bytes)"), "{one:?}");
    let missing = oncekv(&endpoints, &["admin", "session", &ids[0].to_string()]).await;
    assert_eq!(missing.code, 1, "{missing:?}");
    let local = oncekv(
        &endpoints,
        &[
            "admin",
            "local-get",
            "k",
            "--node",
            &cluster.client_addr(follower),
        ],
    )
    .await;
    assert_eq!(local.ok(), "4\n");
    let members = oncekv(&endpoints, &["admin", "members", "--json"])
        .await
        .json();
    assert_eq!(members["members"].as_array().unwrap().len(), 3, "{members}");
    let final_value = raw.read(b"k").await;
    assert_eq!(final_value, Some(Value::Int(4)));
    let retry = raw.execute_request(ids[1], 4, 3, &incr("k"));
    assert_eq!(
        raw.execute(CALL_DEADLINE, &retry).await.unwrap(),
        (CommandResult::Incremented { value: 4 }, true)
    );
}
