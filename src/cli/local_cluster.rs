//! A throwaway local 3-node cluster run by this very binary: `oncekv node`
//! started three times as child processes on free loopback ports, with data
//! directories and logs in one temporary directory. Made for tools that must
//! kill and restart nodes (`oncekv bench --failover`); it knows the nodes only
//! through their `Status` replies.
//!
//! The [`LocalCluster`] value owns the processes: dropping it SIGKILLs and
//! reaps every child it still runs, on every path out (errors and panics
//! included), then removes the temporary directory unless asked to keep it.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use tempfile::TempDir;
use tokio::time::{Instant, sleep};
use tonic::transport::{Channel, Endpoint};

pub use oncekv_testkit::{agreed_leader, describe, free_ports, log_tail};
use oncekv_wire::proto::client_client::ClientClient;
use oncekv_wire::proto::{StatusReply, StatusRequest};

/// The members, in order.
pub const NODES: [u64; 3] = [1, 2, 3];
/// Deadline of one `Status` call.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(1);
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Raft timing given to every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
}

impl Default for Timing {
    /// The node defaults.
    fn default() -> Timing {
        use crate::node::config::{
            ELECTION_TIMEOUT_MAX_MS_DEFAULT, ELECTION_TIMEOUT_MIN_MS_DEFAULT, HEARTBEAT_MS_DEFAULT,
        };
        Timing {
            heartbeat_ms: HEARTBEAT_MS_DEFAULT,
            election_timeout_min_ms: ELECTION_TIMEOUT_MIN_MS_DEFAULT,
            election_timeout_max_ms: ELECTION_TIMEOUT_MAX_MS_DEFAULT,
        }
    }
}

/// How to start a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Prefix of the temporary directory's name.
    pub name: String,
    pub timing: Timing,
    /// Extra `oncekv node` flags for every node.
    pub extra_args: Vec<String>,
    /// How long `start` waits for a leader known by all and a cluster id.
    pub start_timeout: Duration,
    /// Keep the temporary directory (data and logs) after the drop.
    pub keep_dir: bool,
    /// The `oncekv` executable the nodes run [default: the running
    /// executable, which is `oncekv` itself for its own commands; an
    /// example or another program names the binary here].
    pub server_bin: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            name: "local".to_owned(),
            timing: Timing::default(),
            extra_args: Vec::new(),
            start_timeout: Duration::from_secs(60),
            keep_dir: false,
            server_bin: None,
        }
    }
}

/// A running local 3-node cluster; dropping it kills every node.
pub struct LocalCluster {
    exe: PathBuf,
    nodes: BTreeMap<u64, Node>,
    timing: Timing,
    extra_args: Vec<String>,
    keep_dir: bool,
    // Declared last: dropped after the nodes are gone.
    dir: Option<TempDir>,
}

struct Node {
    id: u64,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    data_dir: PathBuf,
    log_path: PathBuf,
    /// A lazily connected channel (it reconnects after a restart).
    status_client: ClientClient<Channel>,
    /// Locked only briefly, never across an await.
    child: Mutex<Option<Child>>,
}

impl Node {
    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        // A panic elsewhere must not stop Drop from killing the process.
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl LocalCluster {
    /// Starts nodes 1..=3 (node 1 with `--initialize`) from the running
    /// executable (or `options.server_bin`) and waits until all three
    /// answer `Status`, agree on one leader and know the cluster id.
    pub async fn start(options: &Options) -> anyhow::Result<LocalCluster> {
        let exe = match &options.server_bin {
            Some(path) => path.clone(),
            None => std::env::current_exe().context("find the oncekv executable")?,
        };
        let dir = tempfile::Builder::new()
            .prefix(&format!("oncekv-{}-", options.name))
            .tempdir()
            .context("create the cluster's temporary directory")?;
        let ports = free_ports(2 * NODES.len()).context("free loopback ports")?;
        let mut nodes = BTreeMap::new();
        for (&id, ports) in NODES.iter().zip(ports.chunks(2)) {
            let endpoint = Endpoint::from_shared(format!("http://{}", ports[0]))?
                .connect_timeout(STATUS_TIMEOUT)
                .tcp_nodelay(true);
            nodes.insert(
                id,
                Node {
                    id,
                    client_addr: ports[0],
                    peer_addr: ports[1],
                    data_dir: dir.path().join(format!("n{id}")),
                    log_path: dir.path().join(format!("n{id}.log")),
                    status_client: ClientClient::new(endpoint.connect_lazy()),
                    child: Mutex::new(None),
                },
            );
        }
        let cluster = LocalCluster {
            exe,
            nodes,
            timing: options.timing,
            extra_args: options.extra_args.clone(),
            keep_dir: options.keep_dir,
            dir: Some(dir),
        };
        for id in NODES {
            cluster.spawn(id)?;
        }
        cluster
            .wait_until(
                options.start_timeout,
                "a leader known by all and a cluster id",
                |statuses| {
                    let replies: Vec<&StatusReply> =
                        statuses.values().filter_map(|s| s.as_ref().ok()).collect();
                    replies.len() == NODES.len()
                        && replies.iter().all(|reply| !reply.cluster_id.is_empty())
                        && agreed_leader(statuses).is_some()
                },
            )
            .await?;
        Ok(cluster)
    }

    /// The temporary directory holding every node's data dir and log.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), TempDir::path)
    }

    /// The Raft timing every node runs with.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// `127.0.0.1:port` of `node`'s client service.
    pub fn client_addr(&self, node: u64) -> String {
        self.node(node).client_addr.to_string()
    }

    /// The client endpoints of all nodes, in node order.
    pub fn client_addrs(&self) -> Vec<String> {
        NODES.iter().map(|&id| self.client_addr(id)).collect()
    }

    pub fn log_path(&self, node: u64) -> &Path {
        &self.node(node).log_path
    }

    /// Whether a process runs for `node` (started, and not killed by us; it
    /// may have exited by itself, see [`LocalCluster::check_alive`]).
    pub fn is_running(&self, node: u64) -> bool {
        self.node(node).child().is_some()
    }

    /// `node`'s answer to `Status` within [`STATUS_TIMEOUT`], or why none
    /// came. Uses one long-lived connection per node.
    pub async fn status(&self, node: u64) -> Result<StatusReply, String> {
        let mut client = self.node(node).status_client.clone();
        match tokio::time::timeout(STATUS_TIMEOUT, client.status(StatusRequest {})).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {STATUS_TIMEOUT:?}")),
        }
    }

    /// Every running node's `Status`, asked concurrently; a node not running
    /// is absent.
    pub async fn statuses(&self) -> BTreeMap<u64, Result<StatusReply, String>> {
        let running: Vec<u64> = NODES
            .into_iter()
            .filter(|&id| self.is_running(id))
            .collect();
        let replies = futures::future::join_all(running.iter().map(|&id| self.status(id))).await;
        running.into_iter().zip(replies).collect()
    }

    /// The leader as the running nodes see it now (see [`agreed_leader`]).
    pub async fn leader(&self) -> Option<u64> {
        agreed_leader(&self.statuses().await)
    }

    /// SIGKILLs `node` and reaps it: a crash, nothing flushed.
    pub fn kill(&self, node: u64) -> anyhow::Result<()> {
        let mut child = self
            .node(node)
            .child()
            .take()
            .with_context(|| format!("node {node} is not running"))?;
        // `Child::kill` is SIGKILL on Unix; an error only means it has
        // already exited, and `wait` reaps it either way.
        let _ = child.kill();
        child
            .wait()
            .with_context(|| format!("reap killed node {node}"))?;
        Ok(())
    }

    /// Starts `node` again (SIGKILLing it first if it runs) with the same
    /// flags and data dir, and waits up to `timeout` until it answers
    /// `Status` (not until it has caught up).
    pub async fn restart(&self, node: u64, timeout: Duration) -> anyhow::Result<()> {
        if self.is_running(node) {
            self.kill(node)?;
        }
        self.spawn(node)?;
        self.wait_until(timeout, &format!("node {node} to answer Status"), |s| {
            s.get(&node).is_some_and(Result::is_ok)
        })
        .await?;
        Ok(())
    }

    /// An error naming the first node that has exited without being killed
    /// by us (it is then no longer running).
    pub fn check_alive(&self) -> anyhow::Result<()> {
        for node in self.nodes.values() {
            let mut child = node.child();
            if let Some(process) = child.as_mut()
                && let Some(exit) = process.try_wait().context("poll a node process")?
            {
                *child = None;
                bail!("node {} exited by itself: {exit}", node.id);
            }
        }
        Ok(())
    }

    /// The last `lines` lines of every node's log, for a report of trouble.
    pub fn log_tails(&self, lines: usize) -> String {
        self.nodes
            .values()
            .map(|node| {
                format!(
                    "----- node {} log ({}), last {lines} lines -----\n{}",
                    node.id,
                    node.log_path.display(),
                    log_tail(&node.log_path, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Polls every running node's `Status` until `condition` holds and
    /// returns those statuses; an error (with the last statuses) when
    /// `timeout` passes or a node exits by itself.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        condition: impl Fn(&BTreeMap<u64, Result<StatusReply, String>>) -> bool,
    ) -> anyhow::Result<BTreeMap<u64, Result<StatusReply, String>>> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let statuses = self.statuses().await;
            if condition(&statuses) {
                return Ok(statuses);
            }
            if Instant::now() >= deadline {
                bail!(
                    "no {what} within {timeout:?}; last statuses:\n{}",
                    describe(&statuses)
                );
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    fn node(&self, node: u64) -> &Node {
        self.nodes
            .get(&node)
            .unwrap_or_else(|| panic!("no node {node}; the members are {NODES:?}"))
    }

    /// Starts `node`'s process, stdout and stderr appended to its log.
    fn spawn(&self, node: u64) -> anyhow::Result<()> {
        let peers: Vec<String> = self
            .nodes
            .values()
            .map(|n| format!("{}={}/{}", n.id, n.peer_addr, n.client_addr))
            .collect();
        let node = self.node(node);
        let mut child = node.child();
        if child.is_some() {
            bail!("node {} is already running", node.id);
        }
        std::fs::create_dir_all(&node.data_dir)
            .with_context(|| format!("create {}", node.data_dir.display()))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .with_context(|| format!("open {}", node.log_path.display()))?;
        let mut command = Command::new(&self.exe);
        command
            .arg("node")
            .arg("--id")
            .arg(node.id.to_string())
            .arg("--client-addr")
            .arg(node.client_addr.to_string())
            .arg("--peer-addr")
            .arg(node.peer_addr.to_string())
            .arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--heartbeat-ms")
            .arg(self.timing.heartbeat_ms.to_string())
            .arg("--election-timeout-min-ms")
            .arg(self.timing.election_timeout_min_ms.to_string())
            .arg("--election-timeout-max-ms")
            .arg(self.timing.election_timeout_max_ms.to_string())
            .arg("--worker-threads")
            .arg(oncekv_testkit::worker_threads_per_node(self.nodes.len()).to_string())
            .args(&self.extra_args);
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
            .stdout(log.try_clone().context("clone a log file handle")?)
            .stderr(log);
        *child = Some(
            command
                .spawn()
                .with_context(|| format!("spawn node {}", node.id))?,
        );
        Ok(())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in self.nodes.values() {
            if let Some(mut child) = node.child().take() {
                // SIGKILL; an error only means it has already exited, and
                // wait still reaps it.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if self.keep_dir
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            eprintln!(
                "kept the local cluster's data and logs in {}",
                kept.display()
            );
        }
    }
}
