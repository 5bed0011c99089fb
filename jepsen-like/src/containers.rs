//! The container backend of the harness's cluster: three `oncekv node`
//! containers of one image on a private bridge network of their own, one
//! fixed address each, with REAL faults: `docker kill` (SIGKILL) and
//! `docker start` for kills and restarts, `docker pause` / `unpause` (the
//! cgroup freezer) for pauses, and packet filters inside each node's network
//! namespace (`iptables` run through `nsenter`) for partitions of the peer
//! links. The host reaches the nodes at their bridge addresses; nothing is
//! published on any host port.
//!
//! [`Containers`] owns its network and containers: dropping it removes them
//! (`docker rm -f`, `docker network rm`) on every path out. It decides
//! nothing about faults, and it never touches a container or network it did
//! not create (all carry the run's unique prefix).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

use crate::cluster::{Capabilities, NODES};

/// Bound of one docker, nsenter or iptables command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How often [`Containers::check_alive`] really asks the engine.
const ALIVE_EVERY: Duration = Duration::from_secs(2);

/// Client port of node N inside its container: 7100 + N (as in
/// deploy/compose.yaml).
pub fn client_port(node: u64) -> u16 {
    7100 + node as u16
}

/// Peer (Raft) port of node N: 7200 + N.
pub fn peer_port(node: u64) -> u16 {
    7200 + node as u16
}

/// How to start the containers.
#[derive(Clone, Debug)]
pub struct ContainerOptions {
    pub image: String,
    /// `oncekv node` flags for every node beyond identity and addresses.
    pub node_args: Vec<String>,
}

struct ContainerNode {
    name: String,
    ip: Ipv4Addr,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    running: bool,
    paused: bool,
}

/// Three node containers on their own network; removed on drop.
pub struct Containers {
    network: String,
    nodes: BTreeMap<u64, ContainerNode>,
    /// Directed peer links (from, to) now dropped by packet filters.
    blocked: Mutex<BTreeSet<(u64, u64)>>,
    /// Packet filters work inside the nodes' network namespaces.
    partitions: bool,
    last_alive_check: Mutex<Option<Instant>>,
}

impl Containers {
    /// What the image's binary supports, from `oncekv node --help` run in a
    /// throwaway container without network.
    pub async fn probe(image: &str) -> anyhow::Result<Capabilities> {
        let help = docker(&["run", "--rm", "--network", "none", image, "node", "--help"])
            .await
            .with_context(|| format!("run `node --help` in the image {image}"))?;
        Ok(Capabilities {
            peer_via: help.contains("--peer-via"),
            fault_flag: help.contains("--fault"),
            // The harness runs TLS clusters of local processes only.
            tls: false,
        })
    }

    /// Creates the network and starts the three containers (node 1
    /// initialises); nothing waits for a leader here.
    pub async fn start(options: &ContainerOptions) -> anyhow::Result<Containers> {
        // Unique names per run (several runs may share one engine): the
        // pid and the wall clock's nanoseconds. Not registry code.
        #[allow(clippy::disallowed_methods)]
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.subsec_nanos())
            .unwrap_or(0);
        let prefix = format!("oncekv-jepsen-{}-{nanos:08x}", std::process::id());
        let network = format!("{prefix}-net");
        // A subnet the engine considers free: let it pick one, then create
        // the network again with that subnet named, which fixed addresses
        // (`--ip`) need.
        docker(&["network", "create", &network]).await?;
        let mut containers = Containers {
            network: network.clone(),
            nodes: BTreeMap::new(),
            blocked: Mutex::default(),
            partitions: false,
            last_alive_check: Mutex::default(),
        };
        let ipam = docker(&[
            "network",
            "inspect",
            "--format",
            "{{range .IPAM.Config}}{{.Subnet}} {{.Gateway}}{{end}}",
            &network,
        ])
        .await?;
        let (subnet, gateway) = ipam
            .trim()
            .split_once(' ')
            .with_context(|| format!("the subnet of network {network}: {ipam:?}"))?;
        let (base, prefix_len) = subnet
            .split_once('/')
            .with_context(|| format!("subnet {subnet:?}"))?;
        let base: Ipv4Addr = base.parse().with_context(|| format!("subnet {subnet:?}"))?;
        let prefix_len: u32 = prefix_len
            .parse()
            .with_context(|| format!("subnet {subnet:?}"))?;
        if prefix_len > 27 {
            bail!("the subnet {subnet} is too small for fixed node addresses");
        }
        docker(&["network", "rm", &network]).await?;
        docker(&[
            "network",
            "create",
            "--subnet",
            subnet,
            "--gateway",
            gateway,
            &network,
        ])
        .await?;
        for node in NODES {
            let ip = Ipv4Addr::from(u32::from(base) + 10 + node as u32);
            containers.nodes.insert(
                node,
                ContainerNode {
                    name: format!("{prefix}-node-{node}"),
                    ip,
                    state: Mutex::default(),
                },
            );
        }
        for node in NODES {
            containers.create(node, options).await?;
        }
        containers.partitions = containers.probe_filters(NODES[0]).await.is_ok();
        Ok(containers)
    }

    fn node(&self, node: u64) -> &ContainerNode {
        self.nodes
            .get(&node)
            .unwrap_or_else(|| panic!("no node {node}; the members are {NODES:?}"))
    }

    fn state(&self, node: u64) -> MutexGuard<'_, State> {
        self.node(node)
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The address the host reaches node `node`'s client port at.
    pub fn client_addr(&self, node: u64) -> String {
        format!("{}:{}", self.node(node).ip, client_port(node))
    }

    /// Started and not killed by us.
    pub fn is_running(&self, node: u64) -> bool {
        self.state(node).running
    }

    pub fn is_paused(&self, node: u64) -> bool {
        self.state(node).paused
    }

    /// Peer links can be cut (packet filters work in the nodes' network
    /// namespaces).
    pub fn partitions(&self) -> bool {
        self.partitions
    }

    async fn create(&self, node: u64, options: &ContainerOptions) -> anyhow::Result<()> {
        let this = self.node(node);
        let ip = this.ip.to_string();
        let alias = format!("node-{node}");
        let mut args: Vec<String> = [
            "run",
            "--detach",
            "--name",
            &this.name,
            "--hostname",
            &alias,
            "--network",
            &self.network,
            "--network-alias",
            &alias,
            "--ip",
            &ip,
            "--no-healthcheck",
            "--env",
            "RUST_LOG=info",
            &options.image,
            "node",
            "--id",
            &node.to_string(),
            "--insecure",
            "--data-dir",
            "/data/db",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        args.extend([
            "--client-addr".to_owned(),
            format!("0.0.0.0:{}", client_port(node)),
            "--peer-addr".to_owned(),
            format!("0.0.0.0:{}", peer_port(node)),
            "--advertise-client-addr".to_owned(),
            self.client_addr(node),
            "--advertise-peer-addr".to_owned(),
            format!("node-{node}:{}", peer_port(node)),
        ]);
        for other in NODES {
            args.push("--peer".to_owned());
            args.push(format!(
                "{other}=node-{other}:{}/{}",
                peer_port(other),
                self.client_addr(other)
            ));
        }
        if node == 1 {
            // Ignored once the data directory holds Raft state.
            args.push("--initialize".to_owned());
        }
        args.extend(options.node_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args)
            .await
            .with_context(|| format!("start node {node}'s container"))?;
        *self.state(node) = State {
            running: true,
            paused: false,
        };
        Ok(())
    }

    /// SIGKILLs node `node`'s process (`docker kill`) and waits until its
    /// container has stopped.
    pub async fn kill(&self, node: u64) -> anyhow::Result<()> {
        if !self.is_running(node) {
            bail!("node {node} is not running");
        }
        docker(&["kill", "--signal", "KILL", &self.node(node).name]).await?;
        // `docker kill` returns once the signal is sent; the container is
        // down (and can be started again) once `docker wait` returns.
        docker(&["wait", &self.node(node).name]).await?;
        *self.state(node) = State::default();
        Ok(())
    }

    /// Starts node `node`'s container again (same flags, data and address).
    pub async fn restart(&self, node: u64) -> anyhow::Result<()> {
        if self.is_running(node) {
            bail!("node {node} is already running");
        }
        docker(&["start", &self.node(node).name]).await?;
        self.state(node).running = true;
        Ok(())
    }

    /// Freezes node `node` (`docker pause`).
    pub async fn pause(&self, node: u64) -> anyhow::Result<()> {
        if !self.is_running(node) {
            bail!("node {node} is not running");
        }
        docker(&["pause", &self.node(node).name]).await?;
        self.state(node).paused = true;
        Ok(())
    }

    /// Thaws node `node` (`docker unpause`).
    pub async fn resume(&self, node: u64) -> anyhow::Result<()> {
        docker(&["unpause", &self.node(node).name]).await?;
        self.state(node).paused = false;
        Ok(())
    }

    /// An error naming a node whose container stopped without being killed
    /// by us (asked of the engine at most every [`ALIVE_EVERY`]).
    pub async fn check_alive(&self) -> anyhow::Result<()> {
        {
            let mut last = self
                .last_alive_check
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < ALIVE_EVERY) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        for node in NODES {
            if !self.is_running(node) {
                continue;
            }
            let state = self
                .inspect(node, "{{.State.Running}} {{.State.ExitCode}}")
                .await?;
            // A kill by us may have happened while the engine answered.
            if state.trim().starts_with("false") && self.is_running(node) {
                *self.state(node) = State::default();
                bail!(
                    "node {node}'s container stopped by itself (running, exit code: {})",
                    state.trim()
                );
            }
        }
        Ok(())
    }

    /// `docker inspect --format FORMAT` of node `node`'s container.
    async fn inspect(&self, node: u64, format: &str) -> anyhow::Result<String> {
        docker(&["inspect", "--format", format, &self.node(node).name]).await
    }

    /// Writes node `node`'s container log (`docker logs`) to `target`.
    pub fn save_log(&self, node: u64, target: &Path) -> anyhow::Result<()> {
        let output = std::process::Command::new("docker")
            .args(["logs", &self.node(node).name])
            .stdin(Stdio::null())
            .output()
            .context("docker logs")?;
        let mut log = output.stdout;
        log.extend_from_slice(&output.stderr);
        std::fs::write(target, log).with_context(|| format!("write {}", target.display()))
    }

    // ---- partitions: packet filters in the nodes' network namespaces --------

    /// The pid of node `node`'s process, whose network namespace is the
    /// container's.
    async fn pid(&self, node: u64) -> anyhow::Result<String> {
        let pid = self.inspect(node, "{{.State.Pid}}").await?;
        let pid = pid.trim().to_owned();
        if pid.is_empty() || pid == "0" {
            bail!("node {node}'s container runs no process");
        }
        Ok(pid)
    }

    /// `iptables ARGS` inside node `node`'s network namespace.
    async fn iptables(&self, node: u64, args: &[&str]) -> anyhow::Result<()> {
        let pid = self.pid(node).await?;
        let mut full = vec!["--target", &pid, "--net", "iptables", "-w"];
        full.extend_from_slice(args);
        command("nsenter", &full).await.map(drop)
    }

    async fn probe_filters(&self, node: u64) -> anyhow::Result<()> {
        self.iptables(node, &["--list", "--numeric"]).await
    }

    /// Drops the directed peer link from → to: in `from`'s namespace, the
    /// packets of connections `from` opens to `to`'s peer port, both ways.
    /// Connections `to` opens to `from` pass (one-way partitions).
    pub async fn block(&self, from: u64, to: u64) -> anyhow::Result<()> {
        if !self.partitions {
            bail!("packet filters do not work in the nodes' network namespaces");
        }
        let ip = self.node(to).ip.to_string();
        let port = peer_port(to).to_string();
        self.iptables(
            from,
            &[
                "-A", "OUTPUT", "-p", "tcp", "-d", &ip, "--dport", &port, "-j", "DROP",
            ],
        )
        .await?;
        self.iptables(
            from,
            &[
                "-A", "INPUT", "-p", "tcp", "-s", &ip, "--sport", &port, "-j", "DROP",
            ],
        )
        .await?;
        self.blocked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((from, to));
        Ok(())
    }

    /// Drops both directions between `a` and `b`.
    pub async fn cut(&self, a: u64, b: u64) -> anyhow::Result<()> {
        self.block(a, b).await?;
        self.block(b, a).await
    }

    /// Cuts `node` off from every other node (clients still reach it).
    pub async fn isolate(&self, node: u64) -> anyhow::Result<()> {
        for other in NODES {
            if other != node {
                self.cut(node, other).await?;
            }
        }
        Ok(())
    }

    /// Removes every packet filter (of running nodes: a restarted container
    /// has a fresh namespace without any).
    pub async fn heal(&self) -> anyhow::Result<()> {
        let blocked: BTreeSet<u64> =
            std::mem::take(&mut *self.blocked.lock().unwrap_or_else(PoisonError::into_inner))
                .into_iter()
                .map(|(from, _)| from)
                .collect();
        // Every node is tried; the first failure is reported.
        let mut first_error = None;
        for node in blocked {
            if self.is_running(node)
                && let Err(error) = self.iptables(node, &["--flush"]).await
            {
                first_error.get_or_insert(error.context(format!("heal node {node}'s links")));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The directed links now blocked.
    pub fn blocked(&self) -> Vec<(u64, u64)> {
        self.blocked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        let names: Vec<&str> = self.nodes.values().map(|node| node.name.as_str()).collect();
        if !names.is_empty() {
            let mut args = vec!["rm", "--force", "--volumes"];
            args.extend(names);
            if let Err(error) = command_sync("docker", &args) {
                eprintln!("could not remove the node containers: {error:#}");
            }
        }
        if let Err(error) = command_sync("docker", &["network", "rm", &self.network]) {
            eprintln!("could not remove network {}: {error:#}", self.network);
        }
    }
}

async fn docker(args: &[&str]) -> anyhow::Result<String> {
    command("docker", args).await
}

/// Runs `program args` within [`COMMAND_TIMEOUT`]; its stdout, or an error
/// with its stderr.
async fn command(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut child = tokio::process::Command::new(program);
    child
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.output())
        .await
        .with_context(|| format!("{program} {args:?}: no end within {COMMAND_TIMEOUT:?}"))?
        .with_context(|| format!("run {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {args:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn command_sync(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {args:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
