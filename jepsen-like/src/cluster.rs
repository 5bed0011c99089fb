//! Control of the harness's throwaway 3-node cluster: start, kill,
//! pause / resume, restart, partitions of the peer links, statuses. One
//! interface ([`Cluster`]) over two backends: local processes
//! ([`Processes`]: the one local-cluster controller `oncekv_testkit::LocalCluster`
//! with SIGKILL, SIGSTOP / SIGCONT, and partitions through the
//! per-link TCP proxies when the server supports `--peer-via`) and
//! containers ([`Containers`]: `docker kill`, `docker pause`, packet filters
//! in each node's network namespace). Local processes may run with TLS and
//! authentication on (certificates from `crate::pki`); the proxies then
//! forward TLS untouched. The cluster owns its nodes: dropping
//! it kills and removes every one of them, on every path out. It decides
//! nothing about faults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use oncekv_client::credentials::Credentials;
use oncekv_testkit::{LocalCluster, Options, StatusClient, Statuses, Timing, ask_all, poll_until};
use oncekv_wire::proto::StatusReply;

use crate::containers::{ContainerOptions, Containers};
use crate::pki::Pki;
use crate::proxy::Proxies;
pub use oncekv_testkit::{NODES, agreed_leader, describe, free_ports, log_tail};

/// Deadline of one `Status` call.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// What the server binary under test supports, from its `node --help`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// `--peer-via ID=ADDR`: peer links can go through proxies.
    pub peer_via: bool,
    /// `--fault`: a fault-injection build.
    pub fault_flag: bool,
    /// `--tls-cert` and `--token-file`: TLS and authentication (with the
    /// `certs` command that makes their files).
    pub tls: bool,
}

impl Capabilities {
    /// Asks `server_bin node --help`.
    pub fn probe(server_bin: &Path) -> anyhow::Result<Capabilities> {
        let output = Command::new(server_bin)
            .args(["node", "--help"])
            .output()
            .with_context(|| format!("run {} node --help", server_bin.display()))?;
        if !output.status.success() {
            bail!(
                "{} node --help failed: {}",
                server_bin.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let help = String::from_utf8_lossy(&output.stdout);
        Ok(Capabilities {
            peer_via: help.contains("--peer-via"),
            fault_flag: help.contains("--fault"),
            tls: help.contains("--tls-cert") && help.contains("--token-file"),
        })
    }
}

/// How to start a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub server_bin: PathBuf,
    /// Where data directories and logs go.
    pub dir: PathBuf,
    /// Raft timing of every node.
    pub timing: Timing,
    pub snapshot_every_entries: u64,
    pub logs_kept_after_snapshot: u64,
    pub session_ttl_ms: u64,
    /// Route peer links through proxies (needs `--peer-via`).
    pub proxies: bool,
    /// Extra flags for every node.
    pub extra_args: Vec<String>,
    /// TLS on both ports and authentication on the client port, with these
    /// certificates and token file.
    pub pki: Option<Pki>,
}

impl ClusterOptions {
    /// The `oncekv node` flags of every node beyond its identity and
    /// addresses: Raft timing, snapshots, session TTL, worker threads, the
    /// extra flags.
    pub fn node_args(&self) -> Vec<String> {
        let mut args = self.timing.flags();
        let more = [
            (
                "--worker-threads",
                oncekv_testkit::worker_threads_per_node(3) as u64,
            ),
            ("--snapshot-every-entries", self.snapshot_every_entries),
            ("--logs-kept-after-snapshot", self.logs_kept_after_snapshot),
            ("--session-ttl-ms", self.session_ttl_ms),
        ];
        args.extend(
            more.into_iter()
                .flat_map(|(flag, value)| [flag.to_owned(), value.to_string()]),
        );
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// A running 3-node cluster of local processes (the project's one
/// local-cluster controller, `oncekv_testkit::LocalCluster`), with the
/// per-link proxies its peer links go through; dropping it kills every node.
pub struct Processes {
    nodes: LocalCluster,
    proxies: Option<Proxies>,
}

impl Processes {
    /// Starts nodes 1..=3 (node 1 initialises); [`Cluster::start`] waits
    /// for them.
    pub async fn start(options: ClusterOptions) -> anyhow::Result<Processes> {
        let mut local = Options::new("jepsen", &options.server_bin);
        local.dir = Some(options.dir.clone());
        local.args = options.node_args();
        let nodes = LocalCluster::create(&local)?;
        let proxies = if options.proxies {
            let peers = NODES.iter().map(|&id| (id, nodes.peer_addr(id))).collect();
            Some(Proxies::start(&peers).await?)
        } else {
            None
        };
        for id in NODES {
            let mut args = Vec::new();
            for other in NODES.into_iter().filter(|&other| other != id) {
                if let Some(via) = proxies.as_ref().and_then(|p| p.addr(id, other)) {
                    args.extend(["--peer-via".to_owned(), format!("{other}={via}")]);
                }
            }
            if let Some(pki) = &options.pki {
                // Peers dial each other through the proxies, by address; the
                // certificate they check is the one naming `node-<id>`,
                // which the TCP proxies pass through untouched.
                args.extend(pki.node_args(id));
            }
            nodes.set_node_args(id, args);
        }
        nodes.spawn_all()?;
        Ok(Processes { nodes, proxies })
    }

    pub fn proxies(&self) -> Option<&Proxies> {
        self.proxies.as_ref()
    }

    fn proxies_or_error(&self) -> anyhow::Result<&Proxies> {
        self.proxies
            .as_ref()
            .context("partitions need the per-link proxies (a server with --peer-via)")
    }

    /// The node controller itself (kill, pause, restart, logs, ...).
    pub fn nodes(&self) -> &LocalCluster {
        &self.nodes
    }
}

/// Which nodes a [`Cluster`] runs.
pub enum Backend {
    /// Local processes on 127.0.0.1.
    Processes(ClusterOptions),
    /// Containers on a private network of their own.
    Containers(ContainerOptions),
}

/// A running 3-node cluster of either backend; dropping it removes every
/// node.
pub struct Cluster {
    nodes: Nodes,
    status_clients: BTreeMap<u64, StatusClient>,
}

enum Nodes {
    Processes(Box<Processes>),
    Containers(Containers),
}

impl Cluster {
    /// Starts nodes 1..=3 (node 1 initialises) and waits up to
    /// `start_timeout` until all answer, agree on a leader and know the
    /// cluster id. `Status` calls connect with `status_credentials` (TLS
    /// with the cluster CA, or plain).
    pub async fn start(
        backend: Backend,
        start_timeout: Duration,
        status_credentials: &Credentials,
    ) -> anyhow::Result<Cluster> {
        let nodes = match backend {
            Backend::Processes(options) => {
                Nodes::Processes(Box::new(Processes::start(options).await?))
            }
            Backend::Containers(options) => Nodes::Containers(Containers::start(&options).await?),
        };
        let mut status_clients = BTreeMap::new();
        for node in NODES {
            let addr = match &nodes {
                Nodes::Processes(processes) => processes.nodes.client_addr(node),
                Nodes::Containers(containers) => containers.client_addr(node),
            };
            let client = StatusClient::new(&addr, status_credentials, STATUS_TIMEOUT)?;
            status_clients.insert(node, client);
        }
        let cluster = Cluster {
            nodes,
            status_clients,
        };
        cluster
            .wait_until(
                start_timeout,
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

    /// `processes` or `containers`.
    pub fn backend_name(&self) -> &'static str {
        match &self.nodes {
            Nodes::Processes(_) => "processes",
            Nodes::Containers(_) => "containers",
        }
    }

    /// How partitions are made, or `None` if this cluster cannot make them.
    pub fn partitions(&self) -> Option<&'static str> {
        match &self.nodes {
            Nodes::Processes(processes) => processes
                .proxies()
                .map(|_| "per-link TCP proxies (--peer-via)"),
            Nodes::Containers(containers) => containers
                .partitions()
                .then_some("iptables DROP rules in the nodes' network namespaces"),
        }
    }

    pub fn client_addr(&self, node: u64) -> String {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.client_addr(node),
            Nodes::Containers(containers) => containers.client_addr(node),
        }
    }

    /// The client endpoints of all nodes, in node order.
    pub fn client_addrs(&self) -> Vec<String> {
        NODES.iter().map(|&id| self.client_addr(id)).collect()
    }

    /// Started and not killed by us.
    pub fn is_running(&self, node: u64) -> bool {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.is_running(node),
            Nodes::Containers(containers) => containers.is_running(node),
        }
    }

    pub fn is_paused(&self, node: u64) -> bool {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.is_paused(node),
            Nodes::Containers(containers) => containers.is_paused(node),
        }
    }

    /// Kills `node` (SIGKILL of its process or container).
    pub async fn kill(&self, node: u64) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.kill(node),
            Nodes::Containers(containers) => containers.kill(node).await,
        }
    }

    /// Starts `node` again with the same flags and data (it must not be
    /// running).
    pub async fn restart(&self, node: u64) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.spawn(node),
            Nodes::Containers(containers) => containers.restart(node).await,
        }
    }

    /// Freezes `node` (SIGSTOP, or `docker pause`).
    pub async fn pause(&self, node: u64) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.pause(node),
            Nodes::Containers(containers) => containers.pause(node).await,
        }
    }

    /// Thaws `node` (SIGCONT, or `docker unpause`).
    pub async fn resume(&self, node: u64) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.resume(node),
            Nodes::Containers(containers) => containers.resume(node).await,
        }
    }

    /// Blocks the directed peer link from → to: `from`'s connections to
    /// `to` fail, `to`'s connections to `from` pass.
    pub async fn block(&self, from: u64, to: u64) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => {
                processes.proxies_or_error()?.block(from, to);
                Ok(())
            }
            Nodes::Containers(containers) => containers.block(from, to).await,
        }
    }

    /// Blocks both directions between `a` and `b`.
    pub async fn cut(&self, a: u64, b: u64) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => {
                processes.proxies_or_error()?.cut(a, b);
                Ok(())
            }
            Nodes::Containers(containers) => containers.cut(a, b).await,
        }
    }

    /// Cuts `node` off from every other node (clients still reach it).
    pub async fn isolate(&self, node: u64) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => {
                processes.proxies_or_error()?.isolate(node);
                Ok(())
            }
            Nodes::Containers(containers) => containers.isolate(node).await,
        }
    }

    /// Passes traffic on every peer link again (nothing to do without
    /// partitions).
    pub async fn heal_links(&self) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => {
                if let Some(proxies) = processes.proxies() {
                    proxies.heal();
                }
                Ok(())
            }
            Nodes::Containers(containers) => containers.heal().await,
        }
    }

    /// The directed peer links now blocked.
    pub fn blocked(&self) -> Vec<(u64, u64)> {
        match &self.nodes {
            Nodes::Processes(processes) => processes
                .proxies()
                .map(Proxies::blocked)
                .unwrap_or_default(),
            Nodes::Containers(containers) => containers.blocked(),
        }
    }

    /// An error naming a node that stopped without being killed by us.
    pub async fn check_alive(&self) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => processes.nodes.check_alive(),
            Nodes::Containers(containers) => containers.check_alive().await,
        }
    }

    /// Copies `node`'s log to `target`.
    pub fn save_log(&self, node: u64, target: &Path) -> anyhow::Result<()> {
        match &self.nodes {
            Nodes::Processes(processes) => {
                std::fs::copy(processes.nodes.log_path(node), target)
                    .with_context(|| format!("copy node {node}'s log"))?;
                Ok(())
            }
            Nodes::Containers(containers) => containers.save_log(node, target),
        }
    }

    /// `node`'s `Status` within [`STATUS_TIMEOUT`].
    pub async fn status(&self, node: u64) -> Result<StatusReply, String> {
        self.status_clients
            .get(&node)
            .unwrap_or_else(|| panic!("no node {node}; the members are {NODES:?}"))
            .status()
            .await
    }

    /// Every running, unpaused node's `Status`, asked concurrently.
    pub async fn statuses(&self) -> BTreeMap<u64, Result<StatusReply, String>> {
        let live: Vec<u64> = NODES
            .into_iter()
            .filter(|&id| self.is_running(id) && !self.is_paused(id))
            .collect();
        ask_all(live, |id| self.status(id)).await
    }

    /// Polls the live nodes' `Status` until `condition` holds; an error
    /// with the last statuses when `timeout` passes or a node died.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        condition: impl Fn(&Statuses) -> bool,
    ) -> anyhow::Result<Statuses> {
        poll_until(
            timeout,
            what,
            || self.check_alive(),
            || self.statuses(),
            condition,
        )
        .await
    }

    /// The leader all live nodes agree on, waiting up to `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let statuses = self
            .wait_until(timeout, "agreed leader", |s| agreed_leader(s).is_some())
            .await?;
        agreed_leader(&statuses).context("a leader")
    }
}
