//! Trust with real processes: a 3-node cluster with TLS on both ports and
//! authentication on the client port refuses callers without credentials
//! or with another CA's, refuses a `client` principal the Admin service,
//! refuses peers that are not who they claim, keeps sessions to the
//! principal that registered them (across a leader change), and bounds the
//! floor; a node exposed without TLS and without --insecure refuses to
//! start.

mod support;

use oncekv_client::credentials::{AuthChannel, CredentialPaths, Credentials};
use oncekv_client::{Client, ClientConfig};
use oncekv_wire::proto::raft_client::RaftClient;
use oncekv_wire::proto::{self, Reason, admin_client::AdminClient, client_client::ClientClient};
use std::time::Duration;
use support::admin::run_to_exit;
use support::cluster::{Cluster, make_certs};
use support::raw::reason;
use tonic::Code;

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

/// Calls the leader's `Client` service with `credentials`, again on another
/// node while the answer is NOT_LEADER or UNAVAILABLE (a leader change
/// under a loaded machine), for up to a minute; returns the first other
/// answer.
async fn on_leader<T, F, Fut>(
    cluster: &Cluster,
    credentials: &Credentials,
    call: F,
) -> Result<tonic::Response<T>, tonic::Status>
where
    F: Fn(ClientClient<AuthChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
        let answer = call(client_of(credentials, &cluster.client_addr(leader))).await;
        let again = match &answer {
            Err(status) => matches!(
                reason(status),
                Some(Reason::NotLeader | Reason::Unavailable)
            ),
            Ok(_) => false,
        };
        if !again || tokio::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
