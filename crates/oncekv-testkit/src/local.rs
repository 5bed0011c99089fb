//! The one controller of a local oncekv cluster: `oncekv node` processes on
//! free loopback ports, each with its data directory and log file under one
//! directory, started, killed, paused, signalled and restarted on demand,
//! and known only through their `Status` replies. The test suite, the
//! jepsen-like harness, the failover benchmark and the examples all run
//! their clusters through it.
//!
//! A [`LocalCluster`] owns its processes: dropping it SIGKILLs and reaps
//! every child it still runs, on every path out (errors and panics
//! included); when the thread is panicking it also prints the tail of every
//! node's log. Paths out that run no drop (the controller SIGKILLed, or
//! ended by a signal it does not handle) are covered on Linux by the kernel:
//! every node is spawned with the parent-death signal SIGKILL, from one
//! spawning thread that lives as long as the process (see `spawn_tied`).
//! It decides nothing about faults or load, and it must not depend on the
//! server: nodes are driven over the wire and by signals only.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oncekv_client::credentials::{AuthChannel, Credentials};
use oncekv_wire::proto::client_client::ClientClient;
use oncekv_wire::proto::{StatusReply, StatusRequest};
use tempfile::TempDir;
use tokio::time::{Instant, sleep};

use crate::{agreed_leader, describe, free_ports, log_tail};

/// The `Status` of each asked node, or why it did not answer.
pub type Statuses = BTreeMap<u64, Result<StatusReply, String>>;

/// The members a cluster starts with, in order; the first one initialises.
pub const NODES: [u64; 3] = [1, 2, 3];
/// Pause between two rounds of `Status` polling.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Lines of each node's log printed when the owner panics.
const PANIC_LOG_LINES: usize = 60;

/// A node's Raft timing, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
}

impl Timing {
    /// Raft timing for a loaded 2-core machine (see docs/benchmarks.md,
    /// "Raft timing"): what the test suite runs with.
    pub const TESTS: Timing = Timing {
        heartbeat_ms: 100,
        election_timeout_min_ms: 400,
        election_timeout_max_ms: 800,
    };

    /// No new leader can acknowledge a write sooner than this after the
    /// old one died: a follower's election timer (at least the minimum
    /// timeout) started at most one heartbeat before the death. An
    /// acknowledgement sooner than half of it is a reply the dead leader
    /// sent just before dying.
    pub fn new_leader_floor(self) -> Duration {
        Duration::from_millis(
            self.election_timeout_min_ms
                .saturating_sub(self.heartbeat_ms)
                / 2,
        )
    }

    /// The `oncekv node` flags that set this timing.
    pub fn flags(self) -> Vec<String> {
        [
            ("--heartbeat-ms", self.heartbeat_ms),
            ("--election-timeout-min-ms", self.election_timeout_min_ms),
            ("--election-timeout-max-ms", self.election_timeout_max_ms),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value.to_string()])
        .collect()
    }
}

/// How to make a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Names the cluster in messages and prefixes its temporary directory.
    pub name: String,
    /// The `oncekv` executable every node runs.
    pub server_bin: PathBuf,
    /// Where data directories and logs go [default: a temporary directory
    /// of the cluster's own, removed on drop unless `keep_dir`].
    pub dir: Option<PathBuf>,
    /// Keep the temporary directory after the drop (its path is printed).
    pub keep_dir: bool,
    /// Raft timing of every node [default: the node's own defaults].
    pub timing: Option<Timing>,
    /// Flags given to every node after its identity, addresses and timing.
    pub args: Vec<String>,
    /// Give every node a metrics port (`--metrics-addr`).
    pub metrics: bool,
    /// Give every node an HTTP/JSON API port (`--http-addr`).
    pub http: bool,
    /// `--worker-threads` of every node [default: the node's own].
    /// [`crate::worker_threads_per_node`] shares the machine's cores out.
    pub worker_threads: Option<usize>,
    /// What `Status` calls show a node: plain, or the cluster's CA when the
    /// nodes serve TLS (`Status` needs no identity).
    pub status_credentials: Credentials,
    /// Deadline of one `Status` call (and of connecting for it).
    pub status_timeout: Duration,
    /// How long [`LocalCluster::start`] waits for the cluster to be ready.
    pub start_timeout: Duration,
}

impl Options {
    /// Options for a cluster of `server_bin` named `name`, everything else
    /// at its default.
    pub fn new(name: &str, server_bin: impl Into<PathBuf>) -> Options {
        Options {
            name: name.to_owned(),
            server_bin: server_bin.into(),
            dir: None,
            keep_dir: false,
            timing: None,
            args: Vec::new(),
            metrics: false,
            http: false,
            worker_threads: None,
            status_credentials: Credentials::none(),
            status_timeout: Duration::from_secs(1),
            start_timeout: Duration::from_secs(60),
        }
    }
}

/// A local cluster of `oncekv node` processes; dropping it kills every node.
pub struct LocalCluster {
    name: String,
    server_bin: PathBuf,
    /// Every node's flags after its identity, addresses and timing.
    args: Vec<String>,
    metrics: bool,
    http: bool,
    worker_threads: Option<usize>,
    status_credentials: Credentials,
    status_timeout: Duration,
    root: PathBuf,
    nodes: BTreeMap<u64, Node>,
    keep_dir: bool,
    // Declared last: removed after the nodes are gone.
    temp: Option<TempDir>,
}

struct Node {
    id: u64,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    data_dir: PathBuf,
    log_path: PathBuf,
    status_client: StatusClient,
    /// Locked only briefly, never across an await, so every method can
    /// take `&self` and a cluster can be shared (say, with a nemesis task).
    state: Mutex<NodeState>,
}

#[derive(Default)]
struct NodeState {
    child: Option<Child>,
    paused: bool,
    /// Raft timing of its next start (`None`: the node's defaults).
    timing: Option<Timing>,
    /// This node's own flags of its next start (TLS files, `--peer-via`).
    args: Vec<String>,
}

impl Node {
    fn state(&self) -> MutexGuard<'_, NodeState> {
        // A panic elsewhere must not stop Drop from killing the process.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl LocalCluster {
    /// Makes room for nodes [`NODES`] (ports, directories, `Status`
    /// clients) without starting any: set per-node flags, then
    /// [`LocalCluster::spawn_all`] and [`LocalCluster::wait_ready`].
    pub fn create(options: &Options) -> anyhow::Result<LocalCluster> {
        let (root, temp) = match &options.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("create {}", dir.display()))?;
                (dir.clone(), None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix(&format!("oncekv-{}-", options.name))
                    .tempdir()
                    .context("create the cluster's temporary directory")?;
                (temp.path().to_owned(), Some(temp))
            }
        };
        let mut cluster = LocalCluster {
            name: options.name.clone(),
            server_bin: options.server_bin.clone(),
            args: options.args.clone(),
            metrics: options.metrics,
            http: options.http,
            worker_threads: options.worker_threads,
            status_credentials: options.status_credentials.clone(),
            status_timeout: options.status_timeout,
            root,
            nodes: BTreeMap::new(),
            keep_dir: options.keep_dir,
            temp,
        };
        for id in NODES {
            cluster.add_node(id)?;
            cluster.node(id).state().timing = options.timing;
        }
        Ok(cluster)
    }

    /// Makes the cluster, starts every node (the first one initialises)
    /// and waits up to `options.start_timeout` until all answer `Status`,
    /// agree on one leader and know the cluster id.
    pub async fn start(options: &Options) -> anyhow::Result<LocalCluster> {
        let cluster = LocalCluster::create(options)?;
        cluster.spawn_all()?;
        cluster.wait_ready(options.start_timeout).await?;
        Ok(cluster)
    }

    /// Makes room for a node `id` (free ports, a data dir) without
    /// starting it; it is killed and reaped on drop like the others. Every
    /// node started from now on lists it as a peer.
    pub fn add_node(&mut self, id: u64) -> anyhow::Result<()> {
        if self.nodes.contains_key(&id) {
            bail!("node {id} exists already");
        }
        let extra = usize::from(self.metrics) + usize::from(self.http);
        let ports = free_ports(2 + extra).context("free loopback ports")?;
        let mut more = ports[2..].iter().copied();
        let metrics_addr = self.metrics.then(|| more.next()).flatten();
        let http_addr = self.http.then(|| more.next()).flatten();
        let status_client = StatusClient::new(
            &ports[0].to_string(),
            &self.status_credentials,
            self.status_timeout,
        )?;
        let node = Node {
            id,
            client_addr: ports[0],
            peer_addr: ports[1],
            metrics_addr,
            http_addr,
            data_dir: self.root.join(format!("n{id}")),
            log_path: self.root.join(format!("n{id}.log")),
            status_client,
            state: Mutex::default(),
        };
        self.nodes.insert(id, node);
        Ok(())
    }

    /// Sets `node`'s own flags from its next start on (after everyone's).
    pub fn set_node_args(&self, node: u64, args: Vec<String>) {
        self.node(node).state().args = args;
    }

    /// Sets the Raft timing `node` runs with from its next start on.
    pub fn set_timing(&self, node: u64, timing: Timing) {
        self.node(node).state().timing = Some(timing);
    }

    /// Waits up to `timeout` until every member answers `Status`, knows the
    /// cluster id, and all agree on one leader.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<Statuses> {
        let members = self.nodes.len();
        self.wait_until(
            timeout,
            "a leader known by all and a cluster id",
            |statuses| {
                let replies: Vec<&StatusReply> =
                    statuses.values().filter_map(|s| s.as_ref().ok()).collect();
                replies.len() == members
                    && replies.iter().all(|reply| !reply.cluster_id.is_empty())
                    && agreed_leader(statuses).is_some()
            },
        )
        .await
    }

    /// The name given in [`Options::name`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory holding every node's data dir and log.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The node ids, in order.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// `127.0.0.1:port` of `node`'s client service.
    pub fn client_addr(&self, node: u64) -> String {
        self.node(node).client_addr.to_string()
    }

    /// The client endpoints of all nodes, in node order.
    pub fn client_addrs(&self) -> Vec<String> {
        self.nodes
            .values()
            .map(|n| n.client_addr.to_string())
            .collect()
    }

    /// `127.0.0.1:port` of `node`'s peer service.
    pub fn peer_addr(&self, node: u64) -> SocketAddr {
        self.node(node).peer_addr
    }

    /// Where `node` serves metrics (with [`Options::metrics`]).
    pub fn metrics_addr(&self, node: u64) -> Option<SocketAddr> {
        self.node(node).metrics_addr
    }

    /// Where `node` serves its HTTP/JSON API (with [`Options::http`]).
    pub fn http_addr(&self, node: u64) -> Option<SocketAddr> {
        self.node(node).http_addr
    }

    pub fn data_dir(&self, node: u64) -> &Path {
        &self.node(node).data_dir
    }

    pub fn log_path(&self, node: u64) -> &Path {
        &self.node(node).log_path
    }

    /// The pid of `node`'s process, while it runs.
    pub fn pid(&self, node: u64) -> Option<u32> {
        self.node(node).state().child.as_ref().map(Child::id)
    }

    /// Whether a process runs for `node` (started, and not killed or
    /// terminated by us; it may have exited by itself, see
    /// [`LocalCluster::check_alive`]).
    pub fn is_running(&self, node: u64) -> bool {
        self.node(node).state().child.is_some()
    }

    /// Whether `node` is stopped by [`LocalCluster::pause`].
    pub fn is_paused(&self, node: u64) -> bool {
        self.node(node).state().paused
    }

    /// Starts every node that is not running.
    pub fn spawn_all(&self) -> anyhow::Result<()> {
        for &id in self.nodes.keys() {
            if !self.is_running(id) {
                self.spawn(id)?;
            }
        }
        Ok(())
    }

    /// Starts `node`'s process (it must not be running), stdout and stderr
    /// appended to its log. Only the first node of [`NODES`] initialises,
    /// and only once: the flag is ignored when its data dir holds Raft
    /// state.
    pub fn spawn(&self, id: u64) -> anyhow::Result<()> {
        let node = self.node(id);
        let mut state = node.state();
        if state.child.is_some() {
            bail!("node {id} is already running");
        }
        std::fs::create_dir_all(&node.data_dir)
            .with_context(|| format!("create {}", node.data_dir.display()))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .with_context(|| format!("open {}", node.log_path.display()))?;
        let mut command = Command::new(&self.server_bin);
        command
            .arg("node")
            .args(["--id", &id.to_string()])
            .args(["--client-addr", &node.client_addr.to_string()])
            .args(["--peer-addr", &node.peer_addr.to_string()])
            .arg("--data-dir")
            .arg(&node.data_dir);
        if let Some(threads) = self.worker_threads {
            command.args(["--worker-threads", &threads.to_string()]);
        }
        if let Some(addr) = node.metrics_addr {
            command.args(["--metrics-addr", &addr.to_string()]);
        }
        if let Some(addr) = node.http_addr {
            command.args(["--http-addr", &addr.to_string()]);
        }
        if let Some(timing) = state.timing {
            command.args(timing.flags());
        }
        command.args(&self.args).args(&state.args);
        for other in self.nodes.values() {
            let peer = format!("{}={}/{}", other.id, other.peer_addr, other.client_addr);
            command.arg("--peer").arg(peer);
        }
        if id == NODES[0] {
            command.arg("--initialize");
        }
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("clone a log file handle")?)
            .stderr(log);
        state.child = Some(
            spawn_tied(command)
                .with_context(|| format!("spawn node {id} ({})", self.server_bin.display()))?,
        );
        state.paused = false;
        Ok(())
    }

    /// SIGKILLs `node` and reaps it: a crash, nothing flushed (a paused
    /// node too).
    pub fn kill(&self, node: u64) -> anyhow::Result<()> {
        let mut child = self.take_child(node)?;
        // SIGKILL; an error only means it has already exited, and `wait`
        // reaps it either way.
        let _ = child.kill();
        child
            .wait()
            .with_context(|| format!("reap killed node {node}"))?;
        Ok(())
    }

    /// SIGSTOPs `node`: alive but silent, like a long pause of its VM.
    pub fn pause(&self, node: u64) -> anyhow::Result<()> {
        self.signal(node, Signal::SIGSTOP)?;
        self.node(node).state().paused = true;
        Ok(())
    }

    /// SIGCONTs a paused `node`.
    pub fn resume(&self, node: u64) -> anyhow::Result<()> {
        self.signal(node, Signal::SIGCONT)?;
        self.node(node).state().paused = false;
        Ok(())
    }

    /// Sends `signal` to `node`'s process (say SIGHUP: reload certificates).
    pub fn signal(&self, node: u64, signal: Signal) -> anyhow::Result<()> {
        let state = self.node(node).state();
        let child = state
            .child
            .as_ref()
            .with_context(|| format!("node {node} is not running"))?;
        let pid = Pid::from_raw(i32::try_from(child.id()).context("a pid fits in i32")?);
        // No ESRCH: the child is not reaped yet, so its pid is still ours.
        kill(pid, signal).with_context(|| format!("send {signal} to node {node}"))?;
        Ok(())
    }

    /// SIGTERMs `node` and waits up to `timeout` for it to exit (a clean
    /// shutdown); its exit status, or an error after SIGKILLing it.
    pub async fn terminate(&self, node: u64, timeout: Duration) -> anyhow::Result<ExitStatus> {
        self.signal(node, Signal::SIGTERM)?;
        let mut child = self.take_child(node)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(exit) = child.try_wait().context("poll a terminating node")? {
                return Ok(exit);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("node {node} did not exit within {timeout:?} of SIGTERM");
            }
            sleep(POLL_INTERVAL).await;
        }
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
            let mut state = node.state();
            if let Some(process) = state.child.as_mut()
                && let Some(exit) = process.try_wait().context("poll a node process")?
            {
                state.child = None;
                bail!("node {} exited by itself: {exit}", node.id);
            }
        }
        Ok(())
    }

    /// `node`'s answer to `Status` within the status timeout, or why none
    /// came.
    pub async fn status(&self, node: u64) -> Result<StatusReply, String> {
        self.node(node).status_client.status().await
    }

    /// Every running node's `Status`, asked concurrently; a node not running
    /// is absent, a paused one answers nothing without being asked.
    pub async fn statuses(&self) -> Statuses {
        let running: Vec<u64> = self
            .nodes
            .keys()
            .copied()
            .filter(|&id| self.is_running(id))
            .collect();
        ask_all(running, |id| async move {
            if self.is_paused(id) {
                Err("paused (SIGSTOP)".to_owned())
            } else {
                self.status(id).await
            }
        })
        .await
    }

    /// The leader as the running nodes see it now (see [`agreed_leader`]).
    pub async fn leader(&self) -> Option<u64> {
        agreed_leader(&self.statuses().await)
    }

    /// The leader all running nodes agree on, waiting up to `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let statuses = self
            .wait_until(timeout, "a leader agreed by all running nodes", |s| {
                agreed_leader(s).is_some()
            })
            .await?;
        agreed_leader(&statuses).context("the condition just held")
    }

    /// Polls every running node's `Status` until `condition` holds and
    /// returns those statuses; an error (with the last statuses) when
    /// `timeout` passes or a node exits by itself.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        condition: impl Fn(&Statuses) -> bool,
    ) -> anyhow::Result<Statuses> {
        poll_until(
            timeout,
            what,
            || async { self.check_alive() },
            || self.statuses(),
            condition,
        )
        .await
    }

    /// The last `lines` lines of every node's log, for a report of trouble.
    pub fn log_tails(&self, lines: usize) -> String {
        self.nodes
            .values()
            .map(|node| {
                format!(
                    "----- [{}] node {} log ({}), last {lines} lines -----\n{}",
                    self.name,
                    node.id,
                    node.log_path.display(),
                    log_tail(&node.log_path, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn node(&self, node: u64) -> &Node {
        self.nodes.get(&node).unwrap_or_else(|| {
            panic!(
                "[{}] no node {node}; the nodes are {:?}",
                self.name,
                self.ids()
            )
        })
    }

    fn take_child(&self, node: u64) -> anyhow::Result<Child> {
        let mut state = self.node(node).state();
        state.paused = false;
        state
            .child
            .take()
            .with_context(|| format!("node {node} is not running"))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in self.nodes.values() {
            if let Some(mut child) = node.state().child.take() {
                // SIGKILL ends stopped processes too; an error only means it
                // has already exited, and wait still reaps it.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails(PANIC_LOG_LINES));
        }
        if self.keep_dir
            && let Some(temp) = self.temp.take()
        {
            let kept = temp.keep();
            eprintln!(
                "kept the [{}] cluster's data and logs in {}",
                self.name,
                kept.display()
            );
        }
    }
}

/// Spawns `command` so that the child dies with this process, however this
/// process ends (a SIGKILL, a signal it does not handle, an abort): on Linux
/// the child gets the parent-death signal SIGKILL. The kernel sends it when
/// the *thread* that forked the child exits, not the process, so every
/// child is forked by one thread of this process that never exits (started
/// on first use). Forking from the caller's thread would tie the nodes to
/// it: a tokio blocking-pool thread exits after 10 s idle, a runtime's
/// workers when the runtime is dropped, and the nodes would be killed under
/// a controller that still runs. Elsewhere a plain spawn: only `Drop`
/// kills the nodes.
fn spawn_tied(command: Command) -> std::io::Result<Child> {
    #[cfg(target_os = "linux")]
    {
        tied::spawn(command)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut command = command;
        command.spawn()
    }
}

#[cfg(target_os = "linux")]
mod tied {
    use std::io;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};
    use std::sync::OnceLock;
    use std::sync::mpsc::{Sender, SyncSender, channel, sync_channel};

    use nix::errno::Errno;
    use nix::sys::signal::Signal;

    /// A command to spawn and where its result goes.
    type Job = (Command, SyncSender<io::Result<Child>>);

    /// The spawning thread's queue; the sender lives as long as the
    /// process, so the thread never runs out of work to wait for.
    static SPAWNER: OnceLock<Result<Sender<Job>, String>> = OnceLock::new();

    pub(super) fn spawn(mut command: Command) -> io::Result<Child> {
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec and
        // only makes two system calls (no allocation, no lock).
        unsafe {
            command.pre_exec(move || die_with_parent(parent));
        }
        let spawner = SPAWNER
            .get_or_init(|| {
                let (jobs, queue) = channel::<Job>();
                std::thread::Builder::new()
                    .name("oncekv-node-spawner".to_owned())
                    .spawn(move || {
                        for (mut command, reply) in queue {
                            // The caller may have given up; nothing to do.
                            let _ = reply.send(command.spawn());
                        }
                    })
                    .map(|_| jobs)
                    .map_err(|error| format!("start the node-spawning thread: {error}"))
            })
            .as_ref()
            .map_err(|error| io::Error::other(error.clone()))?;
        let (reply, result) = sync_channel(1);
        spawner
            .send((command, reply))
            .map_err(|_| io::Error::other("the node-spawning thread is gone"))?;
        result
            .recv()
            .map_err(|_| io::Error::other("the node-spawning thread is gone"))?
    }

    /// In the forked child: SIGKILL when the spawning thread exits, and
    /// fail the spawn if the parent already died before that was set (the
    /// child would be an orphan nobody kills).
    fn die_with_parent(parent: u32) -> io::Result<()> {
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
        if u32::try_from(nix::unistd::getppid().as_raw()) != Ok(parent) {
            return Err(io::Error::from(Errno::ESRCH));
        }
        Ok(())
    }
}

/// One node's `Status`, over one lazily connected channel that reconnects
/// after a restart, each call within a deadline.
#[derive(Clone)]
pub struct StatusClient {
    client: ClientClient<AuthChannel>,
    timeout: Duration,
}

impl StatusClient {
    /// A client of the node at `host_port`, showing it `credentials` (the
    /// CA of a node with TLS; `Status` needs no identity); `timeout` bounds
    /// connecting and each call.
    pub fn new(
        host_port: &str,
        credentials: &Credentials,
        timeout: Duration,
    ) -> anyhow::Result<StatusClient> {
        let endpoint = credentials
            .endpoint(host_port)
            .with_context(|| format!("a Status endpoint for {host_port}"))?
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        Ok(StatusClient {
            client: ClientClient::new(credentials.wrap(endpoint.connect_lazy())),
            timeout,
        })
    }

    /// The node's answer to `Status` within the deadline, or why none came.
    pub async fn status(&self) -> Result<StatusReply, String> {
        let mut client = self.client.clone();
        match tokio::time::timeout(self.timeout, client.status(StatusRequest {})).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }
}

/// Asks every node of `nodes` its status concurrently with `status`.
pub async fn ask_all<F, Fut>(nodes: Vec<u64>, status: F) -> Statuses
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<StatusReply, String>>,
{
    let replies = futures::future::join_all(nodes.iter().map(|&id| status(id))).await;
    nodes.into_iter().zip(replies).collect()
}

/// Polls `statuses` until `condition` holds and returns them: before each
/// round `check_alive` may end the wait with its error; after `timeout` an
/// error names `what` and shows the last statuses. Every controller of
/// nodes (local processes, containers) waits this way.
pub async fn poll_until<A, S>(
    timeout: Duration,
    what: &str,
    check_alive: impl Fn() -> A,
    statuses: impl Fn() -> S,
    condition: impl Fn(&Statuses) -> bool,
) -> anyhow::Result<Statuses>
where
    A: Future<Output = anyhow::Result<()>>,
    S: Future<Output = Statuses>,
{
    let deadline = Instant::now() + timeout;
    loop {
        check_alive().await?;
        let statuses = statuses().await;
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
