//! Trust with real processes: a 3-node cluster with TLS on both ports and
//! authentication on the client port refuses callers without credentials
//! or with another CA's, refuses a `client` principal the Admin service,
//! refuses peers that are not who they claim, keeps sessions to the
//! principal that registered them (across a leader change and a snapshot
//! install), and bounds the floor; a node exposed without TLS and without
//! --insecure refuses to start.

mod support;

use oncekv_client::credentials::{AuthChannel, CredentialPaths, Credentials};
use oncekv_client::policy::{CallError, Follower};
use oncekv_client::retry::Backoff;
use oncekv_client::{Client, ClientConfig};
use oncekv_wire::proto::raft_client::RaftClient;
use oncekv_wire::proto::{self, Reason, admin_client::AdminClient, client_client::ClientClient};
use std::time::Duration;
use support::admin::run_to_exit;
use support::cluster::{Cluster, NODES, Timing, make_certs};
use support::metrics::counter;
use support::raw::reason;
use tonic::Code;

/// Pause between tries of [`on_leader`].
const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(50),
    cap: Duration::from_millis(50),
};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn channel(credentials: &Credentials, addr: &str) -> AuthChannel {
    let endpoint = credentials
        .endpoint(addr)
        .expect("valid address")
        .connect_timeout(Duration::from_secs(2))
        .timeout(CALL_TIMEOUT);
    credentials.wrap(endpoint.connect_lazy())
}

fn client_of(credentials: &Credentials, addr: &str) -> ClientClient<AuthChannel> {
    ClientClient::new(channel(credentials, addr))
}

fn admin_of(credentials: &Credentials, addr: &str) -> AdminClient<AuthChannel> {
    AdminClient::new(channel(credentials, addr))
}

/// The CA only: the server is trusted, the caller shows nothing.
fn anonymous(cluster: &Cluster) -> Credentials {
    Credentials::load(&CredentialPaths {
        ca: Some(cluster.pki().join("ca.pem")),
        ..CredentialPaths::default()
    })
    .unwrap()
}

fn assert_refused<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
    code: Code,
    wire: Reason,
    what: &str,
) {
    let status = result.expect_err(what);
    assert_eq!(status.code(), code, "{what}: {status:?}");
    assert_eq!(reason(&status), Some(wire), "{what}: {status:?}");
}

/// Calls the leader's `Client` service with `credentials` by the client
/// library's one leader-following policy (hints followed, NOT_LEADER and
/// UNAVAILABLE tried again elsewhere), for up to a minute; returns the
/// first other answer.
async fn on_leader<T, F, Fut>(
    cluster: &Cluster,
    credentials: &Credentials,
    call: F,
) -> Result<tonic::Response<T>, tonic::Status>
where
    F: Fn(ClientClient<AuthChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let follower = Follower::new(cluster.client_addrs(), BACKOFF);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let connect = |addr: &str| Ok(client_of(credentials, addr));
    let (answer, _attempts) = follower.call(deadline, Duration::MAX, connect, call).await;
    answer.map_err(CallError::into_status)
}

fn register_request(nonce: u128) -> proto::RegisterRequest {
    proto::RegisterRequest {
        cluster_id: Vec::new(),
        nonce: nonce.to_be_bytes().to_vec(),
    }
}

/// Every protected method of both services refuses a caller without
/// credentials, a token not in the file, and a certificate of another CA;
/// Status and health answer; a `client` principal gets PERMISSION_DENIED
/// from Admin (a stranger's AddLearner included); peers with another CA's
/// certificate or naming another node are refused while the cluster keeps
/// serving; another principal cannot touch a session, whose owner survives
/// a leader change; `KeepAlive(u64::MAX)` is INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_cluster_keeps_strangers_out() {
    let cluster = Cluster::start_secure("security", &[]).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let addr = cluster.client_addr(leader);
    let status = cluster.status(leader).await.expect("status over TLS");
    let cluster_id = status.cluster_id.clone();

    // -- authentication ------------------------------------------------
    let nobody = anonymous(&cluster);
    let unknown_token = Credentials::load(&CredentialPaths {
        ca: Some(cluster.pki().join("ca.pem")),
        token: Some("0123456789abcdef0123456789abcdef".into()),
        ..CredentialPaths::default()
    })
    .unwrap();
    for (name, credentials) in [
        ("no credentials", &nobody),
        ("unknown token", &unknown_token),
    ] {
        let mut client = client_of(credentials, &addr);
        let mut admin = admin_of(credentials, &addr);
        let what = |method: &str| format!("{name}: {method}");
        assert_refused(
            client.register(register_request(1)).await,
            Code::Unauthenticated,
            Reason::Unauthenticated,
            &what("Register"),
        );
        assert_refused(
            client
                .execute(proto::ExecuteRequest {
                    cluster_id: cluster_id.clone(),
                    client_id: 1,
                    seq: 1,
                    first_outstanding_seq: 1,
                    command: None,
                })
                .await,
            Code::Unauthenticated,
            Reason::Unauthenticated,
            &what("Execute"),
        );
        assert_refused(
            client
                .read(proto::ReadRequest {
                    cluster_id: cluster_id.clone(),
                    key: b"k".to_vec(),
                })
                .await,
            Code::Unauthenticated,
            Reason::Unauthenticated,
            &what("Read"),
        );
        assert_refused(
            admin
                .add_learner(proto::AddLearnerRequest {
                    node_id: 9,
                    peer_addr: "127.0.0.1:1".into(),
                    client_addr: "127.0.0.1:2".into(),
                    ..Default::default()
                })
                .await,
            Code::Unauthenticated,
            Reason::Unauthenticated,
            &what("AddLearner"),
        );
        assert_refused(
            admin.set_config(proto::SetConfigRequest::default()).await,
            Code::Unauthenticated,
            Reason::Unauthenticated,
            &what("SetConfig"),
        );
        assert_refused(
            admin
                .list_sessions(proto::ListSessionsRequest::default())
                .await,
            Code::Unauthenticated,
            Reason::Unauthenticated,
            &what("ListSessions"),
        );
        // Open to everyone.
        client
            .status(proto::StatusRequest {})
            .await
            .expect("Status is open");
        let mut health =
            tonic_health::pb::health_client::HealthClient::new(channel(credentials, &addr));
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health is open");
    }

    // A certificate of another CA does not get through the handshake, so
    // nothing at all is served to it.
    let other = cluster.pki().parent().unwrap().join("other-pki");
    make_certs(
        &other,
        &["--node", "2", "--client", "alice", "--admin", "root"],
    );
    let foreign = Credentials::load(&CredentialPaths {
        ca: Some(cluster.pki().join("ca.pem")),
        cert: Some(other.join("root.pem")),
        key: Some(other.join("root-key.pem")),
        token: None,
    })
    .unwrap();
    let refused = client_of(&foreign, &addr)
        .register(register_request(2))
        .await;
    assert!(refused.is_err(), "another CA's certificate: {refused:?}");
    let refused = admin_of(&foreign, &addr)
        .list_sessions(proto::ListSessionsRequest::default())
        .await;
    assert!(refused.is_err(), "another CA's certificate: {refused:?}");

    // -- roles -----------------------------------------------------------
    for (name, by_cert) in [("alice", false), ("alice", true)] {
        let alice = cluster.credentials(name, by_cert);
        assert_refused(
            admin_of(&alice, &addr)
                .add_learner(proto::AddLearnerRequest {
                    node_id: 9,
                    peer_addr: "127.0.0.1:1".into(),
                    client_addr: "127.0.0.1:2".into(),
                    ..Default::default()
                })
                .await,
            Code::PermissionDenied,
            Reason::PermissionDenied,
            &format!("client role (cert: {by_cert}) calling AddLearner"),
        );
    }
    for by_cert in [false, true] {
        let root = cluster.credentials("root", by_cert);
        admin_of(&root, &addr)
            .list_sessions(proto::ListSessionsRequest::default())
            .await
            .unwrap_or_else(|status| panic!("admin (cert: {by_cert}) lists sessions: {status:?}"));
    }

    // -- sessions belong to their principal -----------------------------
    let alice = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            credentials: cluster.credentials("alice", false),
            ..ClientConfig::default()
        },
    );
    assert_eq!(alice.increment(b"n", 1).await.expect("alice increments"), 1);
    let alice_id = alice.client_id().await.expect("alice's session");
    let bob = cluster.credentials("bob", true);
    let denied = |method: &str| format!("bob's {method} on alice's session");
    assert_refused(
        on_leader(&cluster, &bob, |mut client| {
            let request = proto::ExecuteRequest {
                cluster_id: cluster_id.clone(),
                client_id: alice_id,
                seq: 2,
                first_outstanding_seq: 2,
                command: Some(oncekv_wire::convert::command_to_proto(
                    &oncekv_core::Command::Increment {
                        key: b"n".to_vec(),
                        delta: 100,
                    },
                )),
            };
            async move { client.execute(request).await }
        })
        .await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        &denied("Execute"),
    );
    assert_refused(
        on_leader(&cluster, &bob, |mut client| {
            let request = proto::KeepAliveRequest {
                cluster_id: cluster_id.clone(),
                client_id: alice_id,
                first_outstanding_seq: 500,
            };
            async move { client.keep_alive(request).await }
        })
        .await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        &denied("KeepAlive"),
    );
    assert_refused(
        on_leader(&cluster, &bob, |mut client| {
            let request = proto::UnregisterRequest {
                cluster_id: cluster_id.clone(),
                client_id: alice_id,
            };
            async move { client.unregister(request).await }
        })
        .await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        &denied("Unregister"),
    );
    let root = cluster.credentials("root", false);
    let session = admin_of(&root, &addr)
        .get_session(proto::GetSessionRequest {
            client_id: alice_id,
        })
        .await
        .expect("alice's session")
        .into_inner();
    assert_eq!(session.owner, "alice");
    assert_eq!(session.floor, 1, "bob's keep-alive moved nothing");
    assert_eq!(alice.increment(b"n", 1).await.expect("alice goes on"), 2);

    // -- the floor's bound ------------------------------------------------
    let alice_raw = cluster.credentials("alice", false);
    assert_refused(
        on_leader(&cluster, &alice_raw, |mut client| {
            let request = proto::KeepAliveRequest {
                cluster_id: cluster_id.clone(),
                client_id: alice_id,
                first_outstanding_seq: u64::MAX,
            };
            async move { client.keep_alive(request).await }
        })
        .await,
        Code::InvalidArgument,
        Reason::InvalidArgument,
        "KeepAlive(u64::MAX)",
    );
    assert_eq!(
        alice
            .increment(b"n", 1)
            .await
            .expect("the session still works"),
        3
    );

    // -- peers --------------------------------------------------------------
    // Node 4's certificate is of the cluster CA but names node-4: claiming
    // to be node 2 is refused. Another CA's node-2 certificate does not get
    // through the handshake.
    let peer_addr = cluster.peer_addr(leader);
    let pki = cluster.pki();
    let as_node = |dir: &std::path::Path, node: u64| {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(
                std::fs::read(pki.join("ca.pem")).unwrap(),
            ))
            .identity(tonic::transport::Identity::from_pem(
                std::fs::read(dir.join(format!("node-{node}.pem"))).unwrap(),
                std::fs::read(dir.join(format!("node-{node}-key.pem"))).unwrap(),
            ))
            .domain_name(format!("node-{leader}"));
        let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{peer_addr}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .timeout(CALL_TIMEOUT);
        RaftClient::new(endpoint.connect_lazy())
    };
    let claim = |from_node_id| proto::RaftMessage {
        cluster_id: cluster_id.clone(),
        from_node_id,
        payload: vec![0xFF; 8],
    };
    let claimed = if leader == 2 { 3 } else { 2 };
    assert_refused(
        as_node(pki, 4).vote(claim(claimed)).await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        "node 4's certificate claiming another node",
    );
    // The same certificate claiming its own id gets past the identity check
    // (and is refused only because the payload is garbage).
    assert_refused(
        as_node(pki, 4).vote(claim(4)).await,
        Code::InvalidArgument,
        Reason::InvalidArgument,
        "node 4 as itself, with garbage",
    );
    // Node 4's certificate, as itself, asking votes for node 2 — or for
    // itself at a term where an election's +1 would wrap — is refused: a
    // peer speaks only for itself, and terms stay far from the wrap.
    let vote_for = |candidate: u64, term: u64| proto::RaftMessage {
        cluster_id: cluster_id.clone(),
        from_node_id: 4,
        payload: oncekv_core::codec::encode_versioned(
            oncekv::network::peer::PEER_FORMAT_VERSION,
            &openraft::raft::VoteRequest::<oncekv::raft_types::TypeConfig>::new(
                oncekv::raft_types::Vote::new(term, candidate),
                None,
            ),
        ),
    };
    assert_refused(
        as_node(pki, 4).vote(vote_for(claimed, 1_000)).await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        "node 4's certificate asking votes for another node",
    );
    assert_refused(
        as_node(pki, 4).pre_vote(vote_for(claimed, 1_000)).await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        "node 4's certificate asking pre-votes for another node",
    );
    assert_refused(
        as_node(pki, 4).vote(vote_for(4, u64::MAX)).await,
        Code::InvalidArgument,
        Reason::InvalidArgument,
        "a vote request at the last term",
    );
    let foreign_peer = as_node(&other, 2).vote(claim(2)).await;
    assert!(
        foreign_peer.is_err(),
        "another CA's node certificate: {foreign_peer:?}"
    );
    // A plain connection to a TLS peer port gets nothing.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{peer_addr}"))
        .unwrap()
        .timeout(CALL_TIMEOUT)
        .connect_lazy();
    assert!(RaftClient::new(plain).vote(claim(2)).await.is_err());
    assert_eq!(
        alice.increment(b"n", 1).await.expect("the cluster serves"),
        4
    );

    // -- metrics: HTTPS with the node's certificate -------------------------
    let metrics = cluster.scrape(leader).await.expect("metrics over HTTPS");
    assert!(metrics.contains("oncekv_"), "{metrics}");
    let plain = support::metrics::scrape(&cluster.metrics_addr(leader), CALL_TIMEOUT).await;
    assert!(
        plain.is_err(),
        "plain HTTP to a TLS node's metrics: {plain:?}"
    );

    // -- the CLI -------------------------------------------------------------
    let ca = cluster.pki().join("ca.pem");
    let ca = ca.to_str().unwrap();
    let token = std::fs::read_to_string(cluster.pki().join("alice.token")).unwrap();
    let endpoints = cluster.client_addrs().join(",");
    let cli = |args: Vec<&str>| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncekv"));
        command
            .args(&args)
            .env_remove("ONCEKV_CA")
            .env_remove("ONCEKV_TOKEN")
            .env_remove("ONCEKV_CERT")
            .env_remove("ONCEKV_KEY");
        let owned: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        async move {
            let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
            run_to_exit(command, &refs).await
        }
    };
    let run = cli(vec![
        "incr",
        "cli",
        "--endpoints",
        &endpoints,
        "--ca",
        ca,
        "--token",
        &token,
    ])
    .await;
    assert_eq!(run.ok(), "1\n");
    let run = cli(vec![
        "incr",
        "cli",
        "--endpoints",
        &endpoints,
        "--ca",
        ca,
        "--timeout-ms",
        "3000",
        "--json",
    ])
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("unauthenticated"), "{run:?}");
    let run = cli(vec![
        "admin",
        "sessions",
        "--endpoints",
        &endpoints,
        "--ca",
        ca,
        "--token",
        &token,
    ])
    .await;
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("role admin"), "{run:?}");
    let run = cli(vec!["status", "--endpoints", &endpoints, "--ca", ca]).await;
    assert!(run.ok().contains("leader"), "{run:?}");

    // -- the owner survives a leader change --------------------------------
    cluster.kill(leader);
    let new_leader = cluster.wait_for_new_leader(leader).await;
    let new_addr = cluster.client_addr(new_leader);
    assert_eq!(
        alice
            .increment(b"n", 1)
            .await
            .expect("alice after failover"),
        5
    );
    assert_refused(
        on_leader(&cluster, &bob, |mut client| {
            let request = proto::KeepAliveRequest {
                cluster_id: cluster_id.clone(),
                client_id: alice_id,
                first_outstanding_seq: 6,
            };
            async move { client.keep_alive(request).await }
        })
        .await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        "bob after the leader change",
    );
    let session = admin_of(&root, &new_addr)
        .get_session(proto::GetSessionRequest {
            client_id: alice_id,
        })
        .await
        .expect("alice's session on the new leader")
        .into_inner();
    assert_eq!(session.owner, "alice");
    // The operator's expiry is the override.
    admin_of(&root, &new_addr)
        .expire_session(proto::ExpireSessionRequest {
            cluster_id: cluster_id.clone(),
            client_id: alice_id,
        })
        .await
        .expect("root expires alice's session");
}

/// A node asked to bind its client port to 0.0.0.0 without TLS and without
/// --insecure exits at once, saying what to do.
#[tokio::test]
async fn an_exposed_node_without_tls_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "node",
        "--id",
        "1",
        "--client-addr",
        "0.0.0.0:0",
        "--peer-addr",
        "127.0.0.1:0",
        "--data-dir",
    ];
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncekv"));
    command.args(args).arg(dir.path().join("n1"));
    let run = run_to_exit(command, &args).await;
    assert_ne!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("--insecure") && run.stderr.contains("--tls-cert"),
        "{run:?}"
    );
    assert!(
        !dir.path().join("n1").exists(),
        "nothing was written: {run:?}"
    );
}

/// Raft timing of a node that should not win the next election: it stands
/// only after seconds of silence, so a node with the test timing gets
/// there first (and collects its vote once its leader lease has run out).
const SLOW: Timing = Timing {
    heartbeat_ms: 100,
    election_timeout_min_ms: 2_500,
    election_timeout_max_ms: 3_000,
};

/// Makes `target` the leader: kills whoever else leads and starts it again
/// with [`SLOW`] timing, until `target` leads (bounded).
async fn move_leadership_to(cluster: &Cluster, target: u64) {
    for _ in 0..6 {
        let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
        if leader == target {
            return;
        }
        cluster.kill(leader);
        let new_leader = cluster.wait_for_new_leader(leader).await;
        cluster.set_timing(leader, SLOW);
        cluster.restart(leader).await;
        if new_leader == target {
            break;
        }
    }
    assert_eq!(
        cluster.wait_for_leader(Duration::from_secs(60)).await,
        target,
        "leadership moved to node {target}"
    );
}

/// A session's owner survives a snapshot install (rules 13 and 19): alice
/// registers and executes; a follower is stopped while enough entries pass
/// that the others snapshot and purge their logs; restarted, it is caught
/// up by installing a snapshot, then made leader. As leader it refuses
/// bob's Execute, KeepAlive and Unregister on alice's session
/// (PERMISSION_DENIED), names alice as the owner, and alice goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_owner_survives_a_snapshot_install() {
    const WRITES: i64 = 120;
    let cluster = Cluster::start_secure(
        "owner-snapshot",
        &[
            "--snapshot-every-entries",
            "40",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let cluster_id = cluster
        .status(cluster.wait_for_leader(Duration::from_secs(60)).await)
        .await
        .expect("status over TLS")
        .cluster_id;
    let alice = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            credentials: cluster.credentials("alice", false),
            ..ClientConfig::default()
        },
    );
    assert_eq!(alice.increment(b"n", 1).await.expect("alice increments"), 1);
    let alice_id = alice.client_id().await.expect("alice's session");
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let lagging = NODES.into_iter().find(|node| *node != leader).unwrap();
    // It knows the session already (its owner came to it in a log entry).
    cluster.wait_converged(&NODES, 1).await;
    cluster.kill(lagging);

    for expected in 2..=WRITES {
        assert_eq!(
            alice.increment(b"n", 1).await.expect("alice increments"),
            expected
        );
    }
    let others: Vec<u64> = NODES.into_iter().filter(|n| *n != lagging).collect();
    let index = cluster.wait_converged(&others, WRITES as u64).await;
    cluster.wait_snapshotted_and_purged(&others).await;
    cluster.restart(lagging).await;
    // Caught up; its state hash is compared at the end, after the checks
    // that name what a lost owner breaks.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while cluster
        .status(lagging)
        .await
        .map_or(true, |status| status.applied_index < index)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {lagging} did not catch up to index {index}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = cluster.scrape(lagging).await.expect("scrape the metrics");
    assert!(
        counter(&metrics, "oncekv_snapshots_installed_total", &[]) >= 1.0,
        "node {lagging} caught up by installing a snapshot"
    );
    assert!(
        cluster.status(lagging).await.unwrap().snapshot_index > 0,
        "node {lagging} holds the installed snapshot"
    );

    move_leadership_to(&cluster, lagging).await;
    let addr = cluster.client_addr(lagging);
    let bob = cluster.credentials("bob", false);
    let denied =
        |method: &str| format!("bob's {method} on alice's session, node {lagging} leading");
    let execute = proto::ExecuteRequest {
        cluster_id: cluster_id.clone(),
        client_id: alice_id,
        seq: WRITES as u64 + 1,
        first_outstanding_seq: WRITES as u64 + 1,
        command: Some(oncekv_wire::convert::command_to_proto(
            &oncekv_core::Command::Increment {
                key: b"n".to_vec(),
                delta: 100,
            },
        )),
    };
    assert_refused(
        client_of(&bob, &addr).execute(execute).await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        &denied("Execute"),
    );
    assert_refused(
        client_of(&bob, &addr)
            .keep_alive(proto::KeepAliveRequest {
                cluster_id: cluster_id.clone(),
                client_id: alice_id,
                first_outstanding_seq: WRITES as u64 + 1,
            })
            .await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        &denied("KeepAlive"),
    );
    assert_refused(
        client_of(&bob, &addr)
            .unregister(proto::UnregisterRequest {
                cluster_id: cluster_id.clone(),
                client_id: alice_id,
            })
            .await,
        Code::PermissionDenied,
        Reason::PermissionDenied,
        &denied("Unregister"),
    );
    let root = cluster.credentials("root", false);
    let session = admin_of(&root, &addr)
        .get_session(proto::GetSessionRequest {
            client_id: alice_id,
        })
        .await
        .expect("alice's session on the node that installed the snapshot")
        .into_inner();
    assert_eq!(session.owner, "alice");
    assert_eq!(
        alice.increment(b"n", 1).await.expect("alice goes on"),
        WRITES + 1
    );
    assert_eq!(
        cluster.wait_for_leader(Duration::from_secs(60)).await,
        lagging,
        "the refusals came from the node that installed the snapshot"
    );
    cluster.wait_converged(&NODES, index).await;
}

/// How many times `needle` occurs in `node`'s log.
fn log_count(cluster: &Cluster, node: u64, needle: &str) -> usize {
    std::fs::read_to_string(cluster.log_path(node))
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// SIGHUPs every node and waits (bounded) until each has logged `needle`
/// once more than before.
async fn hangup_all(cluster: &Cluster, needle: &str) {
    let before: Vec<usize> = NODES
        .iter()
        .map(|&node| log_count(cluster, node, needle))
        .collect();
    for node in NODES {
        cluster.hangup(node);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for (node, before) in NODES.into_iter().zip(before) {
        while log_count(cluster, node, needle) <= before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {node} did not log {needle:?} after SIGHUP"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether `node` lets `credentials` read: an answer or NOT_LEADER (the
/// call got past authentication) is true, UNAUTHENTICATED false; anything
/// else (a node busy electing) is asked again, for up to a minute.
async fn authenticated(cluster: &Cluster, node: u64, credentials: &Credentials) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let cluster_id = cluster.status(node).await.expect("status").cluster_id;
    loop {
        let answer = client_of(credentials, &cluster.client_addr(node))
            .read(proto::ReadRequest {
                cluster_id: cluster_id.clone(),
                key: b"k".to_vec(),
            })
            .await;
        match answer {
            Ok(_) => return true,
            Err(status) => match reason(&status) {
                Some(Reason::NotLeader) => return true,
                Some(Reason::Unauthenticated) => return false,
                _ => assert!(
                    tokio::time::Instant::now() < deadline,
                    "node {node}: {status:?}"
                ),
            },
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a handshake with `addr` checking the name `name` (and showing
/// node 4's certificate, for the peer port) succeeds: the call reaches the
/// server and is answered (`Status`), or refused by it as a peer message
/// of garbage (INVALID_ARGUMENT) rather than failing in TLS.
async fn presents_name(cluster: &Cluster, addr: &str, name: &str, peer: bool) -> bool {
    let pki = cluster.pki();
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(pki.join("ca.pem")).unwrap(),
        ))
        .domain_name(name);
    if peer {
        tls = tls.identity(tonic::transport::Identity::from_pem(
            std::fs::read(pki.join("node-4.pem")).unwrap(),
            std::fs::read(pki.join("node-4-key.pem")).unwrap(),
        ));
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .timeout(CALL_TIMEOUT)
        .connect_lazy();
    if peer {
        let cluster_id = cluster
            .status(cluster.wait_for_leader(Duration::from_secs(60)).await)
            .await
            .expect("status")
            .cluster_id;
        let answer = RaftClient::new(channel)
            .vote(proto::RaftMessage {
                cluster_id,
                from_node_id: 4,
                payload: vec![0xFF; 8],
            })
            .await;
        matches!(answer, Err(status) if reason(&status) == Some(Reason::InvalidArgument))
    } else {
        ClientClient::new(channel)
            .status(proto::StatusRequest {})
            .await
            .is_ok()
    }
}

/// SIGHUP reloads the token file and the TLS certificate, key and CA of a
/// running node, without dropping it: a token added to the file works and
/// a removed one is refused; new node certificates (naming one more host)
/// are presented on the client and peer ports; a bad token file or key
/// leaves the previous ones in force, and says so in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_and_tokens_reload_on_sighup() {
    let cluster = Cluster::start_secure("reload", &[]).await;
    let pki = cluster.pki().to_path_buf();
    let alice = cluster.credentials("alice", false);
    let carol_token = "carol-0123456789abcdef0123456789";
    let carol = Credentials::load(&CredentialPaths {
        ca: Some(pki.join("ca.pem")),
        token: Some(carol_token.into()),
        ..CredentialPaths::default()
    })
    .unwrap();
    for node in NODES {
        assert!(authenticated(&cluster, node, &alice).await, "node {node}");
        assert!(!authenticated(&cluster, node, &carol).await, "node {node}");
    }
    let pids: Vec<Option<u32>> = NODES.iter().map(|&node| cluster.pid(node)).collect();

    // -- tokens: alice's removed, carol's added ----------------------------
    let tokens = pki.join("tokens");
    let alice_token = std::fs::read_to_string(pki.join("alice.token")).unwrap();
    let old = std::fs::read_to_string(&tokens).unwrap();
    let mut new: String = old
        .lines()
        .filter(|line| !line.starts_with(alice_token.trim()))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_ne!(new, old, "alice's line is gone");
    new.push_str(&format!("{carol_token} carol client\n"));
    let replace = |text: &str| {
        let staged = pki.join("tokens.new");
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, &tokens).unwrap();
    };
    replace(&new);
    hangup_all(&cluster, "reloaded the token file").await;
    for node in NODES {
        assert!(
            authenticated(&cluster, node, &carol).await,
            "node {node}: carol's new token works"
        );
        assert!(
            !authenticated(&cluster, node, &alice).await,
            "node {node}: alice's removed token is refused"
        );
    }

    // -- a bad token file changes nothing -----------------------------------
    replace("too-short carol client\n");
    hangup_all(&cluster, "token file not reloaded").await;
    for node in NODES {
        assert!(
            authenticated(&cluster, node, &carol).await,
            "node {node}: the previous tokens stay"
        );
        assert!(!authenticated(&cluster, node, &alice).await, "node {node}");
    }
    replace(&new);

    // -- certificates: re-issued naming one more host -----------------------
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let client_addr = cluster.client_addr(leader);
    let peer_addr = cluster.peer_addr(leader);
    const NEW_HOST: &str = "reloaded.example";
    assert!(!presents_name(&cluster, &client_addr, NEW_HOST, false).await);
    assert!(!presents_name(&cluster, &peer_addr, NEW_HOST, true).await);
    make_certs(
        &pki,
        &[
            "--node",
            "1",
            "--node",
            "2",
            "--node",
            "3",
            "--host",
            "127.0.0.1",
            "--host",
            "localhost",
            "--host",
            NEW_HOST,
        ],
    );
    hangup_all(&cluster, "reloaded the TLS certificate, key and CA").await;
    for node in NODES {
        assert!(
            presents_name(&cluster, &cluster.client_addr(node), NEW_HOST, false).await,
            "node {node}'s client port presents the new certificate"
        );
        assert!(
            presents_name(&cluster, &cluster.peer_addr(node), NEW_HOST, true).await,
            "node {node}'s peer port presents the new certificate"
        );
    }

    // -- a bad key changes nothing --------------------------------------------
    let key = pki.join(format!("node-{leader}-key.pem"));
    let good_key = std::fs::read(&key).unwrap();
    std::fs::write(&key, "not a key").unwrap();
    let before = log_count(&cluster, leader, "TLS not reloaded");
    cluster.hangup(leader);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while log_count(&cluster, leader, "TLS not reloaded") <= before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no log of the refusal"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(&key, good_key).unwrap();
    assert!(
        presents_name(&cluster, &client_addr, NEW_HOST, false).await,
        "the previous certificate stays in force"
    );

    // The nodes were never restarted, and the cluster still serves.
    let pids_after: Vec<Option<u32>> = NODES.iter().map(|&node| cluster.pid(node)).collect();
    assert_eq!(pids, pids_after);
    let client = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            credentials: carol,
            ..ClientConfig::default()
        },
    );
    assert_eq!(
        client.increment(b"after", 1).await.expect("carol writes"),
        1
    );
}

/// Rule 22, the library's side: a retry refused for credentials after an
/// attempt that may have been applied is an unknown outcome, never "not
/// executed". The leader applies alice's increment and its reply is lost
/// (the `drop-first-execute-reply` fault); the retry goes to a follower
/// whose token file no longer has alice's token (the documented rotation:
/// edit the file, SIGHUP the node) and answers UNAUTHENTICATED. The call
/// must say its outcome is unknown — the leader's applied state shows the
/// increment executed — where a definite `Unauthenticated` would lead the
/// application to fix its credentials and run the increment again.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_refused_for_credentials_is_an_unknown_outcome() {
    use oncekv_client::Error;
    use oncekv_core::Value;

    let cluster =
        Cluster::start_secure("auth-retry", &["--fault", "drop-first-execute-reply"]).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let followers: Vec<u64> = NODES.into_iter().filter(|&node| node != leader).collect();
    let stripped = followers[0];
    // The leader first: the first attempt goes there; after it times out
    // (no hint), the next goes to the next endpoint, the stripped follower.
    let endpoints: Vec<String> = [leader, stripped, followers[1]]
        .iter()
        .map(|&node| cluster.client_addr(node))
        .collect();
    let client = Client::with_config(
        endpoints,
        ClientConfig {
            call_timeout: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(2),
            // No background keep-alive: the increment is alone on the wire.
            keep_alive_fraction: 1_000.0,
            credentials: cluster.credentials("alice", false),
            ..ClientConfig::default()
        },
    );
    client
        .client_id()
        .await
        .expect("alice registers on the leader");

    // Alice's token leaves the file; only the stripped follower reloads it.
    let pki = cluster.pki().to_path_buf();
    let tokens = pki.join("tokens");
    let alice_token = std::fs::read_to_string(pki.join("alice.token")).unwrap();
    let kept: String = std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with(alice_token.trim()))
        .map(|line| format!("{line}\n"))
        .collect();
    let staged = pki.join("tokens.new");
    std::fs::write(&staged, kept).unwrap();
    std::fs::rename(&staged, &tokens).unwrap();
    let before = log_count(&cluster, stripped, "reloaded the token file");
    cluster.hangup(stripped);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while log_count(&cluster, stripped, "reloaded the token file") <= before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {stripped} did not reload its token file"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let alice = cluster.credentials("alice", false);
    assert!(!authenticated(&cluster, stripped, &alice).await);
    assert!(authenticated(&cluster, leader, &alice).await);

    let error = client
        .increment(b"paid", 1)
        .await
        .expect_err("the leader's reply is dropped");
    assert!(
        matches!(&error, Error::OutcomeUnknown { seq: 1, reason, .. } if reason.contains("unauthenticated")),
        "a refusal after an attempt that may have been applied is unknown, got {error:?}"
    );

    // It did execute: the leader's applied state has it (a local read, no
    // leadership needed; the leader did not change).
    assert_eq!(
        cluster.leader().await,
        Some(leader),
        "the scenario needs one leader"
    );
    let local = admin_of(
        &cluster.credentials("root", false),
        &cluster.client_addr(leader),
    )
    .local_read(proto::LocalReadRequest {
        key: b"paid".to_vec(),
    })
    .await
    .expect("a local read")
    .into_inner();
    let value = local
        .value
        .map(|value| oncekv_wire::convert::value_from_proto(value).unwrap());
    assert_eq!(value, Some(Value::Int(1)), "the increment was applied once");
}
