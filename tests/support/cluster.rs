//! A real 3-node oncekv cluster for integration tests: the project's one
//! local-cluster controller (`oncekv_testkit::LocalCluster`) running the
//! `oncekv` binary under test, with the suite's Raft timing, metrics and
//! HTTP ports, optional TLS and authentication, and deadlines generous
//! enough for a loaded 2-core machine. Every method panics (naming the
//! cluster) instead of returning an error: a test's failure. Dropping it
//! kills and reaps every node, and a panicking test prints their log tails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use nix::sys::signal::Signal;
use oncekv_client::credentials::{CredentialPaths, Credentials};
use oncekv_testkit::{
    HashAgreement, LocalCluster, Options, describe, hash_agreement, hashes_caught_up,
};
use oncekv_wire::proto::StatusReply;
use oncekv_wire::proto::admin_client::AdminClient;
use oncekv_wire::proto::client_client::ClientClient;
use tempfile::TempDir;
use tokio::time::{Instant, sleep};
use tonic::transport::{Channel, Endpoint};

pub use oncekv_testkit::{NODES, Timing};

/// Runs `oncekv certs --dir DIR ARGS...`; panics on failure.
pub fn make_certs(dir: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .arg("certs")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .expect("run oncekv certs");
    assert!(
        output.status.success(),
        "oncekv certs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// How long `start` waits for a leader known by all and a cluster id: a
/// minute was seen to run out once, on a 2-core machine with a load average
/// of 11 (several builds and a harness run beside the suite).
pub const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Deadline of one `Status` call made by the harness.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a restarted node may take to answer `Status`.
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node may take to exit after SIGTERM.
pub const TERMINATE_TIMEOUT: Duration = Duration::from_secs(20);
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A running 3-node cluster; dropping it kills every node.
pub struct Cluster {
    nodes: LocalCluster,
    /// With TLS and authentication: the directory `oncekv certs` filled
    /// (node certificates, identities `alice`, `bob` (role client) and
    /// `root` (admin), their tokens and the token file).
    pki: Option<PathBuf>,
    // Declared last: removed after the nodes are gone.
    dir: TempDir,
}

impl Cluster {
    /// Starts nodes 1..=3 (node 1 with `--initialize`) and waits until all
    /// three answer `Status`, agree on one leader that says it leads, and
    /// know the cluster id. Panics (printing the node logs) otherwise.
    pub async fn start(name: &str) -> Cluster {
        Cluster::start_with(name, &[]).await
    }

    /// Like [`Cluster::start`], with extra `oncekv node` flags for every node.
    pub async fn start_with(name: &str, extra_args: &[&str]) -> Cluster {
        Cluster::start_timed(name, extra_args, Timing::TESTS).await
    }

    /// Like [`Cluster::start_with`], every node with the Raft `timing`.
    pub async fn start_timed(name: &str, extra_args: &[&str], timing: Timing) -> Cluster {
        Cluster::start_full(name, extra_args, timing, false).await
    }

    /// Like [`Cluster::start_with`], with TLS on both ports and
    /// authentication on the client port (see [`Cluster::pki`]).
    pub async fn start_secure(name: &str, extra_args: &[&str]) -> Cluster {
        Cluster::start_full(name, extra_args, Timing::TESTS, true).await
    }

    async fn start_full(name: &str, extra_args: &[&str], timing: Timing, secure: bool) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix(&format!("oncekv-{name}-"))
            .tempdir()
            .expect("create the cluster's temporary directory");
        let mut options = Options::new(name, env!("CARGO_BIN_EXE_oncekv"));
        options.dir = Some(dir.path().to_owned());
        options.timing = Some(timing);
        options.args = extra_args.iter().map(|arg| arg.to_string()).collect();
        options.metrics = true;
        options.http = true;
        options.status_timeout = STATUS_TIMEOUT;
        let pki = secure.then(|| {
            let pki = dir.path().join("pki");
            make_certs(
                &pki,
                &[
                    "--node", "1", "--node", "2", "--node", "3", "--node", "4", "--client",
                    "alice", "--client", "bob", "--admin", "root",
                ],
            );
            // `Status` needs no identity, only the CA.
            options.status_credentials = Credentials::load(&CredentialPaths {
                ca: Some(pki.join("ca.pem")),
                ..CredentialPaths::default()
            })
            .expect("load the CA");
            pki
        });
        let nodes = LocalCluster::create(&options)
            .unwrap_or_else(|error| panic!("[{name}] make the cluster: {error:#}"));
        let cluster = Cluster { nodes, pki, dir };
        for id in NODES {
            cluster.set_node_flags(id);
        }
        cluster.expect(cluster.nodes.spawn_all());
        cluster.expect(cluster.nodes.wait_ready(START_TIMEOUT).await);
        cluster
    }

    /// The value of `result`, or a panic naming the cluster and the error.
    fn expect<T>(&self, result: anyhow::Result<T>) -> T {
        result.unwrap_or_else(|error| panic!("[{}] {error:#}", self.name()))
    }

    /// `node`'s own flags: its TLS certificate and the token file on a
    /// secure cluster.
    fn set_node_flags(&self, node: u64) {
        if let Some(pki) = &self.pki {
            let file = |name: String| pki.join(name).display().to_string();
            self.nodes.set_node_args(
                node,
                vec![
                    "--tls-cert".into(),
                    file(format!("node-{node}.pem")),
                    "--tls-key".into(),
                    file(format!("node-{node}-key.pem")),
                    "--tls-ca".into(),
                    file("ca.pem".into()),
                    "--token-file".into(),
                    file("tokens".into()),
                ],
            );
        }
    }

    /// The directory of the secure cluster's CA, certificates and tokens:
    /// `ca.pem`, `node-<id>.pem`, `<name>.pem`, `<name>-key.pem`,
    /// `<name>.token` for `alice`, `bob` and `root`.
    pub fn pki(&self) -> &Path {
        self.pki
            .as_deref()
            .expect("a cluster started with start_secure")
    }

    /// Credentials of identity `name` of the secure cluster: the CA, and
    /// its certificate (`cert`) or its token (else).
    pub fn credentials(&self, name: &str, cert: bool) -> Credentials {
        let pki = self.pki();
        let paths = if cert {
            CredentialPaths {
                ca: Some(pki.join("ca.pem")),
                cert: Some(pki.join(format!("{name}.pem"))),
                key: Some(pki.join(format!("{name}-key.pem"))),
                token: None,
            }
        } else {
            CredentialPaths {
                ca: Some(pki.join("ca.pem")),
                token: Some(
                    std::fs::read_to_string(pki.join(format!("{name}.token")))
                        .expect("read a token"),
                ),
                ..CredentialPaths::default()
            }
        };
        Credentials::load(&paths).expect("load credentials")
    }

    /// Sets the Raft timing `node` starts with from now on (a restart).
    pub fn set_timing(&self, node: u64, timing: Timing) {
        self.nodes.set_timing(node, timing);
    }

    /// The cluster's name, as given to `start`.
    pub fn name(&self) -> &str {
        self.nodes.name()
    }

    /// The temporary directory holding every node's data dir and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `127.0.0.1:port` of `node`'s client service.
    pub fn client_addr(&self, node: u64) -> String {
        self.nodes.client_addr(node)
    }

    /// `127.0.0.1:port` of `node`'s Raft service.
    pub fn peer_addr(&self, node: u64) -> String {
        self.nodes.peer_addr(node).to_string()
    }

    /// `127.0.0.1:port` of `node`'s metrics endpoint (`GET /metrics`).
    pub fn metrics_addr(&self, node: u64) -> String {
        let addr = self.nodes.metrics_addr(node).expect("metrics ports");
        addr.to_string()
    }

    /// `127.0.0.1:port` of `node`'s HTTP/JSON API.
    pub fn http_addr(&self, node: u64) -> String {
        let addr = self.nodes.http_addr(node).expect("HTTP ports");
        addr.to_string()
    }

    /// How many client requests the running nodes answered from their
    /// applied state after a read index, with no log entry (rule 3's one
    /// shortcut), for `method` (`claim`, `execute_keyed`).
    pub async fn answered_from_applied(&self, method: &str) -> f64 {
        let mut total = 0.0;
        for node in self.nodes.ids() {
            if self.is_running(node) {
                let text = self.scrape(node).await.expect("scrapes");
                total += super::metrics::counter(
                    &text,
                    "oncekv_answered_from_applied_total",
                    &[("method", method)],
                );
            }
        }
        total
    }

    /// `node`'s Prometheus exposition, scraped once (within
    /// [`STATUS_TIMEOUT`]; over HTTPS on a secure cluster), or why it could
    /// not be.
    pub async fn scrape(&self, node: u64) -> Result<String, String> {
        match &self.pki {
            None => super::metrics::scrape(&self.metrics_addr(node), STATUS_TIMEOUT).await,
            Some(pki) => {
                super::metrics::scrape_tls(
                    &self.metrics_addr(node),
                    &pki.join("ca.pem"),
                    STATUS_TIMEOUT,
                )
                .await
            }
        }
    }

    /// The pid of `node`'s process, while the harness runs it.
    pub fn pid(&self, node: u64) -> Option<u32> {
        self.nodes.pid(node)
    }

    /// A client library handle on this cluster that waits out elections
    /// and restarts: a 60 s call deadline, 2 s per attempt.
    pub fn patient_client(&self) -> oncekv_client::Client {
        oncekv_client::Client::with_config(
            self.client_addrs(),
            oncekv_client::ClientConfig {
                call_timeout: Duration::from_secs(60),
                attempt_timeout: Duration::from_secs(2),
                ..oncekv_client::ClientConfig::default()
            },
        )
    }

    /// The client endpoints of all nodes (those added later included), in
    /// node order.
    pub fn client_addrs(&self) -> Vec<String> {
        self.nodes.client_addrs()
    }

    /// Makes room for a new node `id` (free ports, a data dir under the
    /// cluster's directory) without starting it; it is killed and reaped on
    /// drop like the others. Every node started from now on lists it as a
    /// peer, which only matters with `--initialize`.
    pub fn add_node(&mut self, id: u64) {
        let added = self.nodes.add_node(id);
        self.expect(added);
        self.nodes.set_timing(id, Timing::TESTS);
        self.set_node_flags(id);
    }

    /// Starts a node made with [`Cluster::add_node`] (never with
    /// `--initialize`: it waits to be added as a learner) and waits until it
    /// answers `Status`.
    pub async fn start_new_node(&self, node: u64) {
        assert_ne!(node, 1, "node 1 initialises the cluster");
        self.expect(self.nodes.spawn(node));
        self.wait_until(
            RESTART_TIMEOUT,
            &format!("node {node} to answer Status"),
            |statuses| statuses.get(&node).is_some_and(Result::is_ok),
        )
        .await;
    }

    /// A client of `node`'s Admin service (on its client port), connecting
    /// lazily; calls carry no deadline of their own.
    pub fn admin(&self, node: u64) -> AdminClient<Channel> {
        AdminClient::new(self.channel(node))
    }

    /// A client of `node`'s client service. The channel connects lazily and
    /// reconnects after a restart; calls carry no deadline of their own.
    pub fn client(&self, node: u64) -> ClientClient<Channel> {
        ClientClient::new(self.channel(node))
    }

    fn channel(&self, node: u64) -> Channel {
        let endpoint = Endpoint::from_shared(format!("http://{}", self.client_addr(node)))
            .expect("a loopback address is a valid URI")
            .connect_timeout(STATUS_TIMEOUT);
        endpoint.connect_lazy()
    }

    pub fn data_dir(&self, node: u64) -> &Path {
        self.nodes.data_dir(node)
    }

    pub fn log_path(&self, node: u64) -> &Path {
        self.nodes.log_path(node)
    }

    /// Whether the harness has a process for `node` (started and not
    /// killed or terminated by the harness; it may have exited by itself).
    pub fn is_running(&self, node: u64) -> bool {
        self.nodes.is_running(node)
    }

    /// `node`'s answer to `Status` (within [`STATUS_TIMEOUT`]), or why none
    /// came.
    pub async fn status(&self, node: u64) -> Result<StatusReply, String> {
        self.nodes.status(node).await
    }

    /// Every running node's `Status`, asked concurrently; a node the harness
    /// does not run is absent.
    pub async fn statuses(&self) -> BTreeMap<u64, Result<StatusReply, String>> {
        self.nodes.statuses().await
    }

    /// The leader as the running nodes see it now: a node that says it is
    /// leader and that every running node names as leader. `None` while
    /// there is none, or while they disagree (an election, a stale leader).
    pub async fn leader(&self) -> Option<u64> {
        self.nodes.leader().await
    }

    /// Waits up to `timeout` for [`Cluster::leader`] to name one; panics
    /// with every node's status otherwise.
    pub async fn wait_for_leader(&self, timeout: Duration) -> u64 {
        let leader = self.nodes.wait_for_leader(timeout).await;
        self.expect(leader)
    }

    /// Waits (up to a minute) until a node other than `old` says it leads;
    /// returns it.
    pub async fn wait_for_new_leader(&self, old: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            for node in self.nodes.ids().into_iter().filter(|&node| node != old) {
                if let Ok(status) = self.status(node).await
                    && status.role == "leader"
                {
                    return node;
                }
            }
            assert!(
                Instant::now() < deadline,
                "[{}] no new leader after {old}",
                self.name()
            );
            sleep(POLL_INTERVAL).await;
        }
    }

    /// SIGKILLs `node` and reaps it: a crash, nothing flushed.
    pub fn kill(&self, node: u64) {
        self.expect(self.nodes.kill(node));
    }

    /// SIGSTOPs `node`: alive but silent, like a long pause of its VM.
    pub fn pause(&self, node: u64) {
        self.expect(self.nodes.pause(node));
    }

    /// SIGCONTs a paused `node`.
    pub fn resume(&self, node: u64) {
        self.expect(self.nodes.resume(node));
    }

    /// SIGHUPs `node`: it reloads its certificates and token file.
    pub fn hangup(&self, node: u64) {
        self.expect(self.nodes.signal(node, Signal::SIGHUP));
    }

    /// SIGTERMs `node` and waits for it to exit (a clean shutdown), returning
    /// its exit status. Panics if it has not exited within
    /// [`TERMINATE_TIMEOUT`] (it is SIGKILLed first).
    pub async fn terminate(&self, node: u64) -> ExitStatus {
        let exit = self.nodes.terminate(node, TERMINATE_TIMEOUT).await;
        self.expect(exit)
    }

    /// SIGKILLs `node` if the harness runs it, then starts it again with the
    /// same flags and data dir, and waits until it answers `Status` (not
    /// until it has caught up or a leader is known).
    pub async fn restart(&self, node: u64) {
        let restarted = self.nodes.restart(node, RESTART_TIMEOUT).await;
        self.expect(restarted);
    }

    /// Starts `node` again (it must have been killed or terminated) and
    /// returns at once, without waiting for it to answer: for tests that
    /// act on what it does while it starts.
    pub fn spawn(&self, node: u64) {
        self.expect(self.nodes.spawn(node));
    }

    /// Starts `node` again (SIGKILLing it first if it runs), expecting it
    /// to refuse to start: waits (up to 60 s) until it exits by itself and
    /// returns its log. Panics if it is still running then.
    pub async fn restart_expecting_exit(&self, node: u64) -> String {
        if self.nodes.is_running(node) {
            self.kill(node);
        }
        self.expect(self.nodes.spawn(node));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.nodes.check_alive().is_err() {
                return std::fs::read_to_string(self.log_path(node)).unwrap_or_default();
            }
            assert!(
                Instant::now() < deadline,
                "[{}] node {node} kept running",
                self.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (up to 90 s) until every node in `nodes` reports, through the
    /// open `Status` RPC, the same applied index (at least `at_least`) and
    /// a state hash of that very index, all equal (each node hashes in the
    /// background at most once a second, so this also waits for the hashes
    /// to catch up); returns that index. Panics at once if hashes of one
    /// index differ.
    pub async fn wait_converged(&self, nodes: &[u64], at_least: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let mut statuses = BTreeMap::new();
            for &node in nodes {
                statuses.insert(node, self.status(node).await);
            }
            match hash_agreement(&statuses) {
                HashAgreement::Agree { index, .. }
                    if index >= at_least && hashes_caught_up(&statuses) =>
                {
                    return index;
                }
                HashAgreement::Differ { index } => panic!(
                    "[{}] replicas {nodes:?} diverge at index {index}:\n{}",
                    self.name(),
                    describe(&statuses)
                ),
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "[{}] replicas {nodes:?} did not converge:\n{}",
                self.name(),
                describe(&statuses)
            );
            sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits (up to 60 s) until every node in `nodes` has built a snapshot
    /// and purged its log up to it. Purging follows the snapshot's
    /// completion asynchronously, so a single `Status` read right after the
    /// hashes agree can still see the log unpurged.
    pub async fn wait_snapshotted_and_purged(&self, nodes: &[u64]) {
        self.wait_until(
            Duration::from_secs(60),
            "every node built a snapshot and purged its log",
            |statuses| {
                nodes.iter().all(|node| {
                    statuses.get(node).is_some_and(|status| {
                        status.as_ref().is_ok_and(|status| {
                            status.snapshot_index > 0 && status.purged_index > 0
                        })
                    })
                })
            },
        )
        .await;
    }

    /// Polls every running node's `Status` until `condition` holds, and
    /// returns the statuses that satisfied it. Panics, with the last
    /// statuses, when `timeout` passes or a node process exits by itself.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        condition: impl Fn(&BTreeMap<u64, Result<StatusReply, String>>) -> bool,
    ) -> BTreeMap<u64, Result<StatusReply, String>> {
        let statuses = self.nodes.wait_until(timeout, what, condition).await;
        self.expect(statuses)
    }
}
