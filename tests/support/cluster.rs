//! A real 3-node oncekv cluster for integration tests: the `oncekv node`
//! binary run as three child processes on free loopback ports, each with its
//! own data directory under one temporary directory. It owns those processes
//! for the life of the `Cluster` value — every child is SIGKILLed and reaped
//! when it drops, also when a test panics, and then the tail of every node's
//! log is printed — and it knows nodes only through their `Status` replies.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oncekv::cli::status::query_with;
use oncekv_client::credentials::{CredentialPaths, Credentials};
use oncekv_testkit::{agreed_leader, describe, free_ports, log_tail};
use oncekv_wire::proto::StatusReply;
use oncekv_wire::proto::admin_client::AdminClient;
use oncekv_wire::proto::client_client::ClientClient;
use tempfile::TempDir;
use tokio::time::{Instant, sleep};
use tonic::transport::{Channel, Endpoint};

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

/// The members, in order.
pub const NODES: [u64; 3] = [1, 2, 3];
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
/// Lines of each node's log printed when a test panics.
const LOG_TAIL_LINES: usize = 60;
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A node's Raft timing, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
}

impl Timing {
    /// Raft timing for a loaded 2-core machine (see docs/benchmarks.md, "Raft timing").
    pub const TESTS: Timing = Timing {
        heartbeat_ms: 100,
        election_min_ms: 400,
        election_max_ms: 800,
    };

    fn flags(self) -> [String; 6] {
        [
            "--heartbeat-ms".into(),
            self.heartbeat_ms.to_string(),
            "--election-timeout-min-ms".into(),
            self.election_min_ms.to_string(),
            "--election-timeout-max-ms".into(),
            self.election_max_ms.to_string(),
        ]
    }
}

/// A running 3-node cluster; dropping it kills every node.
pub struct Cluster {
    name: String,
    nodes: BTreeMap<u64, Node>,
    /// Extra `oncekv node` flags given to every node.
    extra_args: Vec<String>,
    /// With TLS and authentication: the directory `oncekv certs` filled
    /// (node certificates, identities `alice`, `bob` (role client) and
    /// `root` (admin), their tokens and the token file).
    pki: Option<PathBuf>,
    // Declared last: dropped after the nodes are gone.
    dir: TempDir,
}

struct Node {
    id: u64,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    /// Where the node serves `GET /metrics`.
    metrics_addr: SocketAddr,
    /// Where the node serves its HTTP/JSON API (`--http-addr`).
    http_addr: SocketAddr,
    data_dir: PathBuf,
    log_path: PathBuf,
    /// The Raft timing of its next start.
    timing: Mutex<Timing>,
    /// Locked only briefly, never across an await, so every method can take
    /// `&self` and a test may share the cluster (say, with a nemesis task).
    child: Mutex<Option<Child>>,
}

impl Node {
    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        // A panic elsewhere must not stop Drop from killing the process.
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
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

    /// What the harness shows a node: the CA only (enough for `Status`).
    fn harness_credentials(&self) -> Credentials {
        match &self.pki {
            None => Credentials::none(),
            Some(pki) => Credentials::load(&CredentialPaths {
                ca: Some(pki.join("ca.pem")),
                ..CredentialPaths::default()
            })
            .expect("load the CA"),
        }
    }

    async fn start_full(name: &str, extra_args: &[&str], timing: Timing, secure: bool) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix(&format!("oncekv-{name}-"))
            .tempdir()
            .expect("create the cluster's temporary directory");
        let pki = secure.then(|| {
            let pki = dir.path().join("pki");
            make_certs(
                &pki,
                &[
                    "--node", "1", "--node", "2", "--node", "3", "--node", "4", "--client",
                    "alice", "--client", "bob", "--admin", "root",
                ],
            );
            pki
        });
        let ports = free_ports(4 * NODES.len()).expect("free loopback ports");
        let nodes = NODES
            .iter()
            .zip(ports.chunks(4))
            .map(|(&id, ports)| {
                let node = Node {
                    id,
                    client_addr: ports[0],
                    peer_addr: ports[1],
                    metrics_addr: ports[2],
                    http_addr: ports[3],
                    data_dir: dir.path().join(format!("n{id}")),
                    log_path: dir.path().join(format!("n{id}.log")),
                    timing: Mutex::new(timing),
                    child: Mutex::new(None),
                };
                (id, node)
            })
            .collect();
        let cluster = Cluster {
            name: name.to_owned(),
            nodes,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            pki,
            dir,
        };
        for id in NODES {
            cluster.spawn(id);
        }
        cluster
            .wait_until(
                START_TIMEOUT,
                "a leader known by all and a cluster id",
                |statuses| {
                    let replies: Vec<&StatusReply> =
                        statuses.values().filter_map(|s| s.as_ref().ok()).collect();
                    replies.len() == NODES.len()
                        && replies.iter().all(|reply| !reply.cluster_id.is_empty())
                        && agreed_leader(statuses).is_some()
                },
            )
            .await;
        cluster
    }

    /// Sets the Raft timing `node` starts with from now on (a restart).
    pub fn set_timing(&self, node: u64, timing: Timing) {
        *self
            .node(node)
            .timing
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = timing;
    }

    /// The cluster's name, as given to `start`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The temporary directory holding every node's data dir and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `127.0.0.1:port` of `node`'s client service.
    pub fn client_addr(&self, node: u64) -> String {
        self.node(node).client_addr.to_string()
    }

    /// `127.0.0.1:port` of `node`'s Raft service.
    pub fn peer_addr(&self, node: u64) -> String {
        self.node(node).peer_addr.to_string()
    }

    /// `127.0.0.1:port` of `node`'s metrics endpoint (`GET /metrics`).
    pub fn metrics_addr(&self, node: u64) -> String {
        self.node(node).metrics_addr.to_string()
    }

    /// `127.0.0.1:port` of `node`'s HTTP/JSON API.
    pub fn http_addr(&self, node: u64) -> String {
        self.node(node).http_addr.to_string()
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
        self.node(node).child().as_ref().map(Child::id)
    }

    /// The client endpoints of all nodes (those added later included), in
    /// node order.
    pub fn client_addrs(&self) -> Vec<String> {
        self.nodes.keys().map(|&id| self.client_addr(id)).collect()
    }

    /// Makes room for a new node `id` (free ports, a data dir under the
    /// cluster's directory) without starting it; it is killed and reaped on
    /// drop like the others. Every node started from now on lists it as a
    /// peer, which only matters with `--initialize`.
    pub fn add_node(&mut self, id: u64) {
        assert!(!self.nodes.contains_key(&id), "node {id} exists already");
        let ports = free_ports(4).expect("free loopback ports");
        let node = Node {
            id,
            client_addr: ports[0],
            peer_addr: ports[1],
            metrics_addr: ports[2],
            http_addr: ports[3],
            data_dir: self.dir.path().join(format!("n{id}")),
            log_path: self.dir.path().join(format!("n{id}.log")),
            timing: Mutex::new(Timing::TESTS),
            child: Mutex::new(None),
        };
        self.nodes.insert(id, node);
    }

    /// Starts a node made with [`Cluster::add_node`] (never with
    /// `--initialize`: it waits to be added as a learner) and waits until it
    /// answers `Status`.
    pub async fn start_new_node(&self, node: u64) {
        assert_ne!(node, 1, "node 1 initialises the cluster");
        self.spawn(node);
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
        let endpoint = Endpoint::from_shared(format!("http://{}", self.client_addr(node)))
            .expect("a loopback address is a valid URI")
            .connect_timeout(STATUS_TIMEOUT);
        AdminClient::new(endpoint.connect_lazy())
    }

    pub fn data_dir(&self, node: u64) -> &Path {
        &self.node(node).data_dir
    }

    pub fn log_path(&self, node: u64) -> &Path {
        &self.node(node).log_path
    }

    /// Whether the harness has a process for `node` (started and not
    /// killed or terminated by the harness; it may have exited by itself).
    pub fn is_running(&self, node: u64) -> bool {
        self.node(node).child().is_some()
    }

    /// A client of `node`'s client service. The channel connects lazily and
    /// reconnects after a restart; calls carry no deadline of their own.
    pub fn client(&self, node: u64) -> ClientClient<Channel> {
        let endpoint = Endpoint::from_shared(format!("http://{}", self.client_addr(node)))
            .expect("a loopback address is a valid URI")
            .connect_timeout(STATUS_TIMEOUT);
        ClientClient::new(endpoint.connect_lazy())
    }

    /// `node`'s answer to `Status` (within [`STATUS_TIMEOUT`]), or why none
    /// came.
    pub async fn status(&self, node: u64) -> Result<StatusReply, String> {
        query_with(
            &self.client_addr(node),
            STATUS_TIMEOUT,
            &self.harness_credentials(),
        )
        .await
        .map_err(|error| error.to_string())
    }

    /// The leader as the running nodes see it now: a node that says it is
    /// leader and that every running node names as leader. `None` while
    /// there is none, or while they disagree (an election, a stale leader).
    pub async fn leader(&self) -> Option<u64> {
        agreed_leader(&self.statuses().await)
    }

    /// Waits up to `timeout` for [`Cluster::leader`] to name one; panics
    /// with every node's status otherwise.
    pub async fn wait_for_leader(&self, timeout: Duration) -> u64 {
        let statuses = self
            .wait_until(
                timeout,
                "a leader agreed by all running nodes",
                |statuses| agreed_leader(statuses).is_some(),
            )
            .await;
        agreed_leader(&statuses).expect("the condition just held")
    }

    /// Waits (up to a minute) until a node other than `old` says it leads;
    /// returns it.
    pub async fn wait_for_new_leader(&self, old: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            for &node in self.nodes.keys().filter(|&&node| node != old) {
                if let Ok(status) = self.status(node).await
                    && status.role == "leader"
                {
                    return node;
                }
            }
            assert!(
                Instant::now() < deadline,
                "[{}] no new leader after {old}",
                self.name
            );
            sleep(POLL_INTERVAL).await;
        }
    }

    /// SIGKILLs `node` and reaps it: a crash, nothing flushed.
    pub fn kill(&self, node: u64) {
        let mut child = self.take_child(node);
        signal(&child, Signal::SIGKILL);
        child.wait().expect("reap a killed node");
    }

    /// SIGSTOPs `node`: alive but silent, like a long pause of its VM.
    pub fn pause(&self, node: u64) {
        let child = self.node(node).child();
        signal(child.as_ref().expect("node is running"), Signal::SIGSTOP);
    }

    /// SIGCONTs a paused `node`.
    pub fn resume(&self, node: u64) {
        let child = self.node(node).child();
        signal(child.as_ref().expect("node is running"), Signal::SIGCONT);
    }

    /// SIGHUPs `node`: it reloads its certificates and token file.
    pub fn hangup(&self, node: u64) {
        let child = self.node(node).child();
        signal(child.as_ref().expect("node is running"), Signal::SIGHUP);
    }

    /// SIGTERMs `node` and waits for it to exit (a clean shutdown), returning
    /// its exit status. Panics if it has not exited within
    /// [`TERMINATE_TIMEOUT`] (it is SIGKILLed first).
    pub async fn terminate(&self, node: u64) -> ExitStatus {
        let mut child = self.take_child(node);
        signal(&child, Signal::SIGTERM);
        let deadline = Instant::now() + TERMINATE_TIMEOUT;
        loop {
            if let Some(exit) = child.try_wait().expect("poll a terminating node") {
                return exit;
            }
            if Instant::now() >= deadline {
                signal(&child, Signal::SIGKILL);
                child.wait().expect("reap a killed node");
                panic!(
                    "[{}] node {node} did not exit within {TERMINATE_TIMEOUT:?} of SIGTERM",
                    self.name
                );
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// SIGKILLs `node` if the harness runs it, then starts it again with the
    /// same flags and data dir, and waits until it answers `Status` (not
    /// until it has caught up or a leader is known).
    pub async fn restart(&self, node: u64) {
        if self.is_running(node) {
            self.kill(node);
        }
        self.spawn(node);
        self.wait_until(
            RESTART_TIMEOUT,
            &format!("node {node} to answer Status"),
            |statuses| statuses.get(&node).is_some_and(Result::is_ok),
        )
        .await;
    }

    fn node(&self, node: u64) -> &Node {
        self.nodes
            .get(&node)
            .unwrap_or_else(|| panic!("no node {node}; the members are {NODES:?}"))
    }

    fn take_child(&self, node: u64) -> Child {
        self.node(node)
            .child()
            .take()
            .unwrap_or_else(|| panic!("[{}] node {node} is not running", self.name))
    }

    /// Starts `node`'s process, stdout and stderr appended to its log.
    fn spawn(&self, node: u64) {
        let peers: Vec<String> = self
            .nodes
            .values()
            .map(|n| format!("{}={}/{}", n.id, n.peer_addr, n.client_addr))
            .collect();
        let node = self.node(node);
        let mut child = node.child();
        assert!(child.is_none(), "node {} is already running", node.id);
        std::fs::create_dir_all(&node.data_dir).expect("create a node's data dir");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .expect("open a node's log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_oncekv"));
        command
            .arg("node")
            .arg("--id")
            .arg(node.id.to_string())
            .arg("--client-addr")
            .arg(node.client_addr.to_string())
            .arg("--peer-addr")
            .arg(node.peer_addr.to_string())
            .arg("--metrics-addr")
            .arg(node.metrics_addr.to_string())
            .arg("--http-addr")
            .arg(node.http_addr.to_string())
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(
                node.timing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .flags(),
            )
            .args(&self.extra_args);
        if let Some(pki) = &self.pki {
            command
                .arg("--tls-cert")
                .arg(pki.join(format!("node-{}.pem", node.id)))
                .arg("--tls-key")
                .arg(pki.join(format!("node-{}-key.pem", node.id)))
                .arg("--tls-ca")
                .arg(pki.join("ca.pem"))
                .arg("--token-file")
                .arg(pki.join("tokens"));
        }
        for peer in &peers {
            command.arg("--peer").arg(peer);
        }
        if node.id == 1 {
            // Ignored by the node once its data dir holds Raft state.
            command.arg("--initialize");
        }
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a log file handle"))
            .stderr(log);
        *child = Some(
            command
                .spawn()
                .unwrap_or_else(|error| panic!("spawn node {}: {error}", node.id)),
        );
    }

    /// Every node's `Status`, asked concurrently; a node the harness does not
    /// run is absent.
    pub async fn statuses(&self) -> BTreeMap<u64, Result<StatusReply, String>> {
        let running: Vec<u64> = self
            .nodes
            .keys()
            .copied()
            .filter(|&id| self.is_running(id))
            .collect();
        let replies = futures::future::join_all(running.iter().map(|&id| self.status(id))).await;
        running.into_iter().zip(replies).collect()
    }

    /// Waits (up to 90 s) until every node in `nodes` reports, through the
    /// open `Status` RPC, the same applied index (at least `at_least`) and
    /// the same state hash; returns that index.
    pub async fn wait_converged(&self, nodes: &[u64], at_least: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let mut seen = Vec::new();
            for &node in nodes {
                if let Ok(status) = self.status(node).await {
                    seen.push((status.applied_index, status.state_hash));
                }
            }
            if seen.len() == nodes.len()
                && seen[0].0 >= at_least
                && seen.iter().all(|entry| *entry == seen[0])
            {
                return seen[0].0;
            }
            assert!(
                Instant::now() < deadline,
                "[{}] replicas {nodes:?} did not converge: {seen:?}",
                self.name
            );
            sleep(POLL_INTERVAL).await;
        }
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
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive();
            let statuses = self.statuses().await;
            if condition(&statuses) {
                return statuses;
            }
            if Instant::now() >= deadline {
                panic!(
                    "[{}] no {what} within {timeout:?}; last statuses:\n{}",
                    self.name,
                    describe(&statuses)
                );
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// Panics if a node the harness runs has exited without being told to.
    fn check_alive(&self) {
        for node in self.nodes.values() {
            let mut child = node.child();
            if let Some(process) = child.as_mut()
                && let Some(exit) = process.try_wait().expect("poll a node process")
            {
                *child = None;
                drop(child);
                panic!(
                    "[{}] node {} exited unexpectedly: {exit}",
                    self.name, node.id
                );
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.values() {
            if let Some(mut child) = node.child().take() {
                // An error only means it has already exited; wait still reaps.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            for node in self.nodes.values() {
                eprintln!(
                    "----- [{}] node {} log ({}), last {LOG_TAIL_LINES} lines -----\n{}",
                    self.name,
                    node.id,
                    node.log_path.display(),
                    log_tail(&node.log_path, LOG_TAIL_LINES)
                );
            }
        }
    }
}

fn signal(child: &Child, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid fits in i32"));
    // ESRCH cannot happen: the child is not reaped yet, so its pid is ours
    // even if it has exited.
    kill(pid, signal).unwrap_or_else(|error| panic!("send {signal} to pid {pid}: {error}"));
}
