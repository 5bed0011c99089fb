//! A node: wiring from a validated config to storage, Raft and the gRPC
//! servers, then cluster initialisation and graceful shutdown. It holds no
//! logic of its own beyond the order in which things start and stop (and
//! the reload of certificates and tokens on SIGHUP).

mod catch_up;
pub mod config;
pub mod observability;
mod snapshot_schedule;

use crate::clock::{ClockTiming, ClusterClock};
use crate::metrics::NodeMetrics;
use crate::network::admin_api::AdminApi;
use crate::network::auth::{AuthLayer, AuthPolicy, SharedPolicy};
use crate::network::client_api::ClientApi;
use crate::network::client_wire::ClientWireLayer;
use crate::network::connections::Gate;
use crate::network::leader_contact::LeaderContact;
use crate::network::peer::{PeerNetwork, PeerService, SnapshotSends};
use crate::network::proposer::Proposer;
use crate::network::tls::{NodeTls, Port};
use crate::raft_types::{NodeId, Raft, TypeConfig};
use crate::read_index::{self, ReadIndex};
use crate::shared::{ClusterIdentity, SharedState, replace_file_durably};
use crate::storage::{SegmentLogStore, SnapshotInbox, StateMachineStore};
use anyhow::{Context, bail};
use config::NodeConfig;
use oncekv_core::{ClusterId, Entry, Op, Outcome, RulesVersion};
use openraft::SnapshotPolicy;
use openraft::async_runtime::WatchReceiver;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tonic_health::server::HealthReporter;

/// Most entries in one append message. Large entries can make a full
/// batch exceed the peer payload limit; the peer client then splits it (see
/// the size arithmetic in `network::peer`).
const MAX_PAYLOAD_ENTRIES: u64 = 64;

/// Accepted connections with Nagle off: request/response traffic would
/// otherwise wait for delayed acknowledgements (tens of milliseconds).
/// (`Server::tcp_nodelay` applies only to listeners tonic binds itself.)
fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The storage format this build reads and writes. Format 2: log entries
/// carry batches of requests (rule 17) and snapshots the last client id.
/// Format 3: final request limits. Format 4: session requests carry their
/// principal, sessions their owner (rule 19) and the floor its bound
/// (rule 7). Format 5: idempotency keys (rule 18) — new requests after
/// every earlier one, snapshot format 5. A format 4 directory is read (its
/// entries decode and apply unchanged, its snapshots restore with no keys)
/// and marked format 5 before anything is written to it, since an earlier
/// build could not read what this one writes. Format 1 (one request per
/// entry, no `format` file) is refused.
const DATA_FORMAT_VERSION: u32 = 5;
/// The previous storage format, upgraded in place (see above).
const DATA_FORMAT_VERSION_4: u32 = 4;

/// Refuses a data directory written by another node id; records ours in a
/// fresh one.
fn claim_data_dir(dir: &Path, id: NodeId) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("node_id");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let owner: NodeId = text
                .trim()
                .parse()
                .with_context(|| format!("{} is not a node id", path.display()))?;
            if owner != id {
                bail!(
                    "data directory {} belongs to node {owner}, not node {id}",
                    dir.display()
                );
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            replace_file_durably(&path, format!("{id}\n").as_bytes())?;
        }
        Err(error) => {
            return Err(error).with_context(|| format!("reading {}", path.display()));
        }
    }
    check_data_format(dir)
}

/// Refuses a data directory of another storage format with a clear message
/// (never reads it as ours); records ours in a fresh one.
fn check_data_format(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join("format");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let found: u32 = text
                .trim()
                .parse()
                .with_context(|| format!("{} is not a format number", path.display()))?;
            if found == 2 || found == 3 {
                bail!(
                    "data directory {} holds storage format {found}, written by an earlier \
                     oncekv whose log entries were decided under other apply rules (format 2: \
                     before final request limits, empty keys and config checks; format 3: \
                     before session owners and the floor's bound); replaying them under this \
                     build's rules could \
                     make replicas disagree. This build reads formats {DATA_FORMAT_VERSION_4} and \
                     {DATA_FORMAT_VERSION}. \
                     Move the directory aside and re-create the cluster on empty directories \
                     (all nodes: builds of different formats do not talk to each other)",
                    dir.display()
                );
            }
            if found == DATA_FORMAT_VERSION_4 {
                tracing::info!(
                    dir = %dir.display(),
                    "storage format 4 upgraded to {DATA_FORMAT_VERSION} (idempotency keys); \
                     earlier builds will refuse this directory from now on"
                );
                replace_file_durably(&path, format!("{DATA_FORMAT_VERSION}\n").as_bytes())?;
                return Ok(());
            }
            if found != DATA_FORMAT_VERSION {
                bail!(
                    "data directory {} holds storage format {found}; this build reads \
                     formats {DATA_FORMAT_VERSION_4} and {DATA_FORMAT_VERSION}",
                    dir.display()
                );
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if dir.join("log").exists() || dir.join("snapshots").exists() {
                bail!(
                    "data directory {} was written by an earlier oncekv (storage format 1: one \
                     request per log entry); this build writes format {DATA_FORMAT_VERSION} \
                     (batched entries) and cannot read it. Move it aside and start the node \
                     on an empty directory (a cluster is re-created on new directories)",
                    dir.display()
                );
            }
            replace_file_durably(&path, format!("{DATA_FORMAT_VERSION}\n").as_bytes())?;
            Ok(())
        }
        Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
    }
}

/// Runs a node until `shutdown` completes, then stops it gracefully.
pub async fn run(config: NodeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    // SIGHUP reloads the certificates and tokens; without a handler it would
    // end the process, so it is installed before anything else.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    // Certificates and tokens first: a node that cannot use them writes
    // nothing.
    let (tls, auth) = security(&config)?;
    claim_data_dir(&config.data_dir, config.id)?;
    let metrics = Arc::new(NodeMetrics::new(config.id));
    let (mut log_store, state_machine, identity, key_records_held) =
        open_storage(&config, &metrics).await?;
    let state = state_machine.state();
    let snapshots = state_machine.snapshot_inbox();

    let raft_config = raft_config(&config)?;
    let snapshot_sends = Arc::new(SnapshotSends::default());
    let network = PeerNetwork::new(config.id, identity.clone())
        .with_dial_overrides(config.peer_via.clone())
        .with_tls(tls.clone())
        .with_snapshot_sends(snapshot_sends.clone());
    let restored = read_index::restored_from(config.id, &mut log_store)
        .await
        .context("reading the Raft log state")?;
    let raft = Raft::new(
        config.id,
        Arc::new(raft_config),
        network,
        log_store,
        state_machine,
    )
    .await
    .context("starting Raft")?;
    let builds_scheduled = tokio::spawn(snapshot_schedule::build_on_schedule(
        raft.clone(),
        config.id,
        snapshot_schedule::Schedule {
            every_entries: config.snapshot_every_entries,
            logs_kept: config.logs_kept_after_snapshot,
            key_records_max: usize::try_from(config.snapshot_every_key_records)
                .unwrap_or(usize::MAX),
            key_records_held,
            snapshot_sends,
        },
    ));

    let contact = LeaderContact::new(LeaderContact::window_for(config.election_timeout_max));
    let catch_up = tokio::spawn(catch_up::watch(
        config.id,
        raft.clone(),
        snapshots.clone(),
        contact.clone(),
        config.heartbeat,
        config.catch_up_nice,
        metrics.clone(),
    ));
    let read_index = ReadIndex::new(raft.clone(), restored);
    let clock = Arc::new(ClusterClock::new(
        raft.clone(),
        state.clone(),
        read_index.clone(),
        ClockTiming {
            sample_every: config.heartbeat,
            quorum_gap: config.election_timeout_min,
        },
    ));
    let (stop_servers, servers_stopped) = tokio::sync::watch::channel(false);
    let node = Wiring {
        config: &config,
        raft: raft.clone(),
        state: state.clone(),
        identity: identity.clone(),
        snapshots,
        metrics,
        contact,
        tls,
        auth,
        stop: servers_stopped,
    };
    let (servers, watcher) = node.serve(read_index, clock.clone()).await?;

    let reloader = tokio::spawn(reload_on_hangup(
        hangups,
        config.id,
        node.tls.clone(),
        node.auth.clone(),
        config.token_file.clone(),
    ));

    let bootstrap = if config.initialize {
        initialize(&raft, &config, &identity).await?;
        Some(tokio::spawn(ensure_bootstrapped(
            raft.clone(),
            state,
            identity,
            config.clone(),
            clock,
        )))
    } else {
        None
    };

    shutdown.await;
    tracing::info!(node_id = config.id, "shutting down");
    if let Some(task) = bootstrap {
        task.abort();
    }
    let _ = stop_servers.send(true);
    watcher.abort();
    reloader.abort();
    builds_scheduled.abort();
    // A group lowered for a catch-up ends with the process, which leads it.
    catch_up.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        for server in servers {
            let _ = server.await;
        }
    })
    .await;
    raft.shutdown().await.ok();
    tracing::info!(node_id = config.id, "stopped");
    Ok(())
}

/// Opens the Raft log and the snapshots, refuses a log purged beyond the
/// newest snapshot, and reads the cluster id (adopting the applied one);
/// with the count of key records held in memory, which the state machine
/// publishes after each apply batch (a build moves them out).
async fn open_storage(
    config: &NodeConfig,
    metrics: &Arc<NodeMetrics>,
) -> anyhow::Result<(
    SegmentLogStore<TypeConfig>,
    StateMachineStore,
    ClusterIdentity,
    Arc<std::sync::atomic::AtomicUsize>,
)> {
    let mut log_store =
        SegmentLogStore::open(config.data_dir.join("wal")).context("opening the Raft log")?;
    log_store.report_commit_index(metrics.commit_index.clone());
    #[cfg(feature = "fault-injection")]
    if config.faults.rewinds_commit_record() {
        let committed = log_store.rewind_committed_to_term_start();
        tracing::warn!(?committed, "test fault: the commit record is rewound");
    }
    #[cfg(feature = "fault-injection")]
    if config.faults.loses_term_tail() {
        let last = log_store
            .lose_term_tail()
            .await
            .context("test fault: dropping the tail of the last term")?;
        tracing::warn!(
            ?last,
            "test fault: the log lost its last term after the first entry"
        );
    }
    // Snapshots hold the whole state; the record store (`state/`) holds the
    // idempotency-key records flushed at each build, which the registry
    // then no longer keeps in memory (docs/state-beyond-ram.md §4.5).
    let state_machine = StateMachineStore::open_with_records(
        &config.data_dir.join("snapshots"),
        &config.data_dir.join("state"),
    )
    .context("opening the snapshots and the record store")?
    .with_metrics(metrics.clone());
    let (state_machine, key_records_held) = state_machine.publish_key_records_held();
    let snapshot_index = *state_machine.durable_snapshot_index().borrow();
    if let Some(purged) = log_store.last_purged_index()?
        && purged > snapshot_index
    {
        bail!(
            "the log is purged up to index {purged} but the newest snapshot covers only \
             {snapshot_index}: entries in between are lost; refusing to start"
        );
    }
    log_store.purge_after_durable_snapshots(state_machine.durable_snapshot_index());
    let budget = state_machine
        .state()
        .read()
        .registry
        .budget_config()
        .memory_budget_bytes;
    check_machine_memory(budget, config.allow_small_memory)?;
    let identity = ClusterIdentity::open(&config.data_dir).context("reading the cluster id")?;
    let applied_cluster_id = state_machine.state().read().registry.cluster_id();
    if let Some(applied) = applied_cluster_id {
        // A data directory from before the id file existed, or a crash
        // between adopting and persisting: the applied state knows.
        identity
            .adopt(applied)
            .context("the applied state names another cluster than the id file")?;
    }
    Ok((log_store, state_machine, identity, key_records_held))
}

/// What a replica needs besides its accounted state: the process, the
/// runtime, and buffers (a snapshot is written, sent and received through
/// 1 MiB buffers, never held whole).
const MEMORY_OVERHEAD_BYTES: u64 = 128 << 20;

/// The memory a node needs for a memory budget of `budget_bytes` (rule
/// 21): the accounted state, as much again for the working copies that
/// persistent maps hold and for a snapshot install (the old and the new
/// state at once), and the process's own.
pub fn memory_needed_bytes(budget_bytes: u64) -> u64 {
    budget_bytes
        .saturating_mul(2)
        .saturating_add(MEMORY_OVERHEAD_BYTES)
}

/// The memory this process may use: the machine's (`MemTotal`), or its
/// cgroup's limit if lower; `None` when neither can be read.
fn machine_memory_bytes() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map(|kib| kib.saturating_mul(1024));
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|path| std::fs::read_to_string(path).ok())
    .filter_map(|limit| limit.trim().parse::<u64>().ok())
    .min();
    match (total, cgroup) {
        (Some(total), Some(limit)) => Some(total.min(limit)),
        (total, limit) => total.or(limit),
    }
}

/// Refuses to start a node whose machine cannot hold the state the
/// replicated memory budget allows (rule 21): it would run out of memory
/// once the state grows, and crash-loop replaying the same state.
fn check_machine_memory(budget_bytes: u64, allow_small: bool) -> anyhow::Result<()> {
    let needed = memory_needed_bytes(budget_bytes);
    let Some(available) = machine_memory_bytes() else {
        tracing::warn!("cannot read this machine's memory; the memory budget is not checked");
        return Ok(());
    };
    if available >= needed {
        return Ok(());
    }
    let mib = |bytes: u64| bytes >> 20;
    if allow_small {
        tracing::warn!(
            budget_mib = mib(budget_bytes),
            needed_mib = mib(needed),
            available_mib = mib(available),
            "this machine has less memory than the memory budget needs (--allow-small-memory)"
        );
        return Ok(());
    }
    bail!(
        "this machine (or its cgroup) has {} MiB of memory, but the cluster's memory budget \
         (memory_budget_bytes = {} MiB) needs {} MiB per node (twice the budget plus 128 MiB): \
         lower the budget on the running cluster (`oncekv admin config set \
         --memory-budget-bytes N`), give the node more memory, or pass --allow-small-memory \
         (tests only)",
        mib(available),
        mib(budget_bytes),
        mib(needed)
    )
}

/// openraft's configuration from the node's: timing and snapshot policy
/// as configured, and the choices below fixed.
fn raft_config(config: &NodeConfig) -> anyhow::Result<openraft::Config> {
    openraft::Config {
        cluster_name: "oncekv".into(),
        heartbeat_interval: config.heartbeat.as_millis() as u64,
        election_timeout_min: config.election_timeout_min.as_millis() as u64,
        election_timeout_max: config.election_timeout_max.as_millis() as u64,
        // Builds are asked for by `snapshot_schedule`, staggered across the
        // members, not at the same index on every node.
        snapshot_policy: SnapshotPolicy::Never,
        // Purges too: `snapshot_schedule` asks for them, keeping
        // `logs_kept_after_snapshot` entries and the log a snapshot's
        // receiver needs; Raft's own purge after each build never comes.
        max_in_snapshot_log_to_keep: u64::MAX,
        install_snapshot_timeout: 5_000,
        max_payload_entries: MAX_PAYLOAD_ENTRIES,
        // On: a follower that stalled past the election timeout (a paused
        // process, a VM stall, a long snapshot install) asks first whether
        // the others would vote, instead of raising its term at once and
        // making a healthy leader step down (docs/benchmarks.md, "Raft
        // timing"). A follower cut off from the others so keeps its vote
        // for its last leader; it names that leader only while it hears
        // from it (`LeaderContact`).
        enable_pre_vote: Some(true),
        // Entries go to the followers as soon as the append is queued, not
        // after the leader's own fdatasync; commit still waits for a quorum
        // of durable copies, the leader's own counted only after its flush.
        broadcast_submitted_on_append: Some(true),
        // Off, because of the line above: a leader that crashes and comes
        // back within its term must not lead that term again. Its followers
        // may hold entries of the term that its own log lost (they were sent
        // before its fdatasync); leading on, it would give the same index a
        // different entry under the same log id, which a follower holding
        // the old one keeps (same log id, same entry, says Raft) — replicas
        // diverge. Restarted as a follower it needs a new term, whose leader
        // overwrites whatever the lost entries were on every replica.
        // (`scripts/jepsen.sh long` found it: 3 of 11 runs diverged after a
        // leader restarted in its term.)
        enable_leader_restore: Some(false),
        // openraft merges client writes queued at once into one append; the
        // proposer already batches, so this only bounds a burst.
        api_batch_capacity: 4096,
        ..openraft::Config::default()
    }
    .validate()
    .context("Raft configuration")
}

/// What a started node's servers are built from: Raft, the applied state,
/// the cluster identity, metrics, TLS and authentication, and the signal
/// that stops them.
struct Wiring<'a> {
    config: &'a NodeConfig,
    raft: Raft,
    state: SharedState,
    identity: ClusterIdentity,
    /// Where the peer service writes snapshots a leader sends.
    snapshots: SnapshotInbox,
    metrics: Arc<NodeMetrics>,
    /// Whom this node hears as its leader: told by the peer service, read
    /// by every service that names a leader.
    contact: LeaderContact,
    tls: Option<NodeTls>,
    auth: SharedPolicy,
    /// Turns `true` when the servers are to stop.
    stop: tokio::sync::watch::Receiver<bool>,
}

/// A spawned server; its result is of no further interest once it runs.
type ServerTask = tokio::task::JoinHandle<()>;

impl Wiring<'_> {
    /// Builds the services, binds every configured address and spawns the
    /// servers (peer, client, then metrics and HTTP when configured, the
    /// order they are awaited in at shutdown) and the health watcher; the
    /// node has started once it returns.
    async fn serve(
        &self,
        read_index: ReadIndex,
        clock: Arc<ClusterClock>,
    ) -> anyhow::Result<(Vec<ServerTask>, ServerTask)> {
        let config = self.config;
        let proposer = Proposer::new(
            self.raft.clone(),
            clock,
            config.request_timeout,
            config.max_pending_proposals,
            self.metrics.clone(),
            self.contact.clone(),
        );
        let admin_api = AdminApi::new(
            config.id,
            self.raft.clone(),
            self.state.clone(),
            proposer.clone(),
            config.faults.clone(),
        );
        let client_api = ClientApi::new(
            config.id,
            self.raft.clone(),
            self.state.clone(),
            proposer,
            read_index,
            config.request_timeout,
            config.faults.clone(),
        );
        let peer_listener = tokio::net::TcpListener::bind(config.peer_addr)
            .await
            .with_context(|| format!("binding the peer address {}", config.peer_addr))?;
        let client_listener = tokio::net::TcpListener::bind(config.client_addr)
            .await
            .with_context(|| format!("binding the client address {}", config.client_addr))?;
        let mut servers = vec![self.serve_peers(peer_listener)];
        let (health, client_server) = self.serve_clients(client_listener, client_api, admin_api)?;
        servers.push(client_server);
        let watcher = tokio::spawn(observability::watch(
            config.id,
            self.raft.clone(),
            self.state.clone(),
            self.metrics.clone(),
            health,
            self.contact.clone(),
        ));
        if let Some(addr) = config.metrics_addr {
            servers.push(self.serve_metrics(addr).await?);
        }
        if let Some(addr) = config.http_addr {
            servers.push(self.serve_http(addr).await?);
        }
        tracing::info!(
            node_id = config.id,
            client_addr = %config.client_addr,
            peer_addr = %config.peer_addr,
            advertise_client_addr = %config.advertise_client_addr,
            advertise_peer_addr = %config.advertise_peer_addr,
            metrics_addr = ?config.metrics_addr,
            http_addr = ?config.http_addr,
            max_pending_proposals = config.max_pending_proposals,
            "node started"
        );
        Ok((servers, watcher))
    }

    /// Completes once the servers are to stop.
    fn stopped(&self) -> impl Future<Output = ()> + use<> {
        let mut stop = self.stop.clone();
        async move {
            let _ = stop.wait_for(|stop| *stop).await;
        }
    }

    /// The peer port: Raft's RPCs, tagged with the cluster id.
    fn serve_peers(&self, listener: tokio::net::TcpListener) -> ServerTask {
        let router = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(
                PeerService::new(
                    self.raft.clone(),
                    self.identity.clone(),
                    self.snapshots.clone(),
                    self.contact.clone(),
                    self.config.faults.clone(),
                )
                .into_server(),
            );
        let stopped = self.stopped();
        match &self.tls {
            None => tokio::spawn(async move {
                let _ = router
                    .serve_with_incoming_shutdown(incoming(listener), stopped)
                    .await;
            }),
            Some(tls) => {
                let incoming = tls.incoming(listener, Port::Peer, None);
                tokio::spawn(async move {
                    let _ = router.serve_with_incoming_shutdown(incoming, stopped).await;
                })
            }
        }
    }

    /// The client port: the `Client` and `Admin` services behind the wire
    /// layer (reply counts, oversized requests) and authentication, with
    /// gRPC health and reflection. Returns the health reporter with it.
    fn serve_clients(
        &self,
        listener: tokio::net::TcpListener,
        client_api: ClientApi,
        admin_api: AdminApi,
    ) -> anyhow::Result<(HealthReporter, ServerTask)> {
        let (health, health_service) = tonic_health::server::health_reporter();
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(oncekv_wire::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .context("building the reflection service")?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(oncekv_wire::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .context("building the reflection service")?;
        let router = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .layer(ClientWireLayer::new(self.metrics.clone()))
            .layer(AuthLayer::new(self.auth.clone()))
            .add_service(client_api.into_server())
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(admin_api.into_server());
        let stopped = self.stopped();
        let gate = Gate::new(self.config.grpc_limits);
        let server = match &self.tls {
            None => {
                let incoming =
                    futures::StreamExt::filter_map(incoming(listener), move |accepted| {
                        std::future::ready(match accepted {
                            Ok(stream) => {
                                let peer = stream.peer_addr().map(|addr| addr.ip());
                                // Closed at once (dropped) past either bound.
                                peer.ok().and_then(|peer| gate.admit(stream, peer)).map(Ok)
                            }
                            Err(error) => Some(Err(error)),
                        })
                    });
                tokio::spawn(async move {
                    let _ = router.serve_with_incoming_shutdown(incoming, stopped).await;
                })
            }
            Some(tls) => {
                let incoming = tls.incoming(listener, Port::Client, Some(gate));
                tokio::spawn(async move {
                    let _ = router.serve_with_incoming_shutdown(incoming, stopped).await;
                })
            }
        };
        Ok((health, server))
    }

    /// `GET /metrics` on `addr`.
    async fn serve_metrics(&self, addr: std::net::SocketAddr) -> anyhow::Result<ServerTask> {
        let server = observability::metrics_server(
            addr,
            self.raft.clone(),
            self.state.clone(),
            self.metrics.clone(),
            self.contact.clone(),
            self.tls.clone(),
            self.stopped(),
        )
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
        Ok(tokio::spawn(async move {
            let _ = server.await;
        }))
    }

    /// The HTTP/JSON API on `addr`: HTTPS with the node's certificate when
    /// it has TLS. Callers are authenticated by the client port's live
    /// policy before their bodies are read; requests go through this
    /// node's own client port (authentication, leader forwarding): the
    /// advertised address, which the certificate names.
    async fn serve_http(&self, addr: std::net::SocketAddr) -> anyhow::Result<ServerTask> {
        let config = self.config;
        let api = crate::network::http_api::HttpApi::new(
            config.advertise_client_addr.clone(),
            config.tls.as_ref().map(|tls| tls.ca.as_path()),
            self.auth.clone(),
            &config.http_limits,
        )?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the HTTP address {addr}"))?;
        let server = crate::network::http_api::serve(
            listener,
            self.tls.clone(),
            api.router(),
            config.http_limits,
            self.stopped(),
        );
        Ok(tokio::spawn(async move {
            let _ = server.await;
        }))
    }
}

/// The node's TLS material and the client port's authentication policy,
/// loaded and checked before anything binds.
fn security(config: &NodeConfig) -> anyhow::Result<(Option<NodeTls>, SharedPolicy)> {
    let tls = config
        .tls
        .as_ref()
        .map(NodeTls::load)
        .transpose()
        .context("loading the TLS certificate, key and CA")?;
    let auth = match &config.token_file {
        Some(path) => AuthPolicy::load(path, tls.is_some()).context("reading the token file")?,
        None if tls.is_some() => AuthPolicy::certificates_only(),
        None => AuthPolicy::off(),
    };
    Ok((tls, SharedPolicy::new(auth)))
}

/// On every SIGHUP, reads the TLS certificate, key and CA and the token
/// file again (those the node was started with). Each that reads and
/// checks cleanly replaces the old for every new connection (TLS) or
/// request (tokens); one that does not leaves the old in force. Either way
/// the log says which, and why.
async fn reload_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    node_id: NodeId,
    tls: Option<NodeTls>,
    auth: SharedPolicy,
    token_file: Option<std::path::PathBuf>,
) {
    while hangups.recv().await.is_some() {
        tracing::info!(node_id, "SIGHUP: reloading certificates and tokens");
        match &tls {
            None => tracing::info!(node_id, "no TLS configured: no certificates to reload"),
            Some(tls) => match tls.reload() {
                Ok(()) => tracing::info!(
                    node_id,
                    cert = %tls.paths().cert.display(),
                    key = %tls.paths().key.display(),
                    ca = %tls.paths().ca.display(),
                    "reloaded the TLS certificate, key and CA: new connections on the client, \
                     peer and HTTP ports and to peers use them"
                ),
                Err(error) => tracing::warn!(
                    node_id,
                    %error,
                    "TLS not reloaded: the previous certificate, key and CA stay in force"
                ),
            },
        }
        match &token_file {
            None => tracing::info!(node_id, "no token file configured: no tokens to reload"),
            Some(path) => match AuthPolicy::load(path, tls.is_some()) {
                Ok(policy) => {
                    let summary = policy.summary();
                    auth.replace(policy);
                    tracing::info!(
                        node_id,
                        path = %path.display(),
                        grants = %summary,
                        "reloaded the token file: every request from now on is decided by it"
                    );
                }
                Err(error) => tracing::warn!(
                    node_id,
                    %error,
                    "token file not reloaded: the previous tokens stay in force"
                ),
            },
        }
    }
}

/// Initialises Raft membership with the configured members, once: a node
/// whose storage already holds Raft state skips it. A fresh cluster id is
/// recorded first, so the very first peer messages carry it.
async fn initialize(
    raft: &Raft,
    config: &NodeConfig,
    identity: &ClusterIdentity,
) -> anyhow::Result<()> {
    if raft.is_initialized().await.context("reading Raft state")? {
        tracing::info!(
            node_id = config.id,
            "already initialised; --initialize ignored"
        );
        return Ok(());
    }
    if identity.get().is_none() {
        #[allow(clippy::disallowed_methods)] // a cluster id is random by definition (rule 16)
        let cluster_id = ClusterId(rand::random::<u128>());
        identity
            .adopt(cluster_id)
            .context("recording the new cluster id")?;
    }
    raft.initialize(config.members.clone())
        .await
        .context("initialising the cluster")?;
    tracing::info!(
        node_id = config.id,
        members = config.members.len(),
        "cluster initialised"
    );
    Ok(())
}

/// Makes sure the cluster has its id and initial registry config: when this
/// node leads and, with everything before its term applied, the registry
/// still has no cluster id, it proposes the bootstrap entry with the id
/// recorded at initialisation. Ends once the id is applied here.
async fn ensure_bootstrapped(
    raft: Raft,
    state: SharedState,
    identity: ClusterIdentity,
    config: NodeConfig,
    clock: Arc<ClusterClock>,
) {
    let mut metrics = raft.metrics();
    loop {
        if state.read().registry.cluster_id().is_some() {
            return;
        }
        let leading = metrics.borrow_watched().state == openraft::ServerState::Leader;
        if leading && let Ok(stamp_ms) = clock.stamp().await {
            if state.read().registry.cluster_id().is_some() {
                return;
            }
            let cluster_id = match identity.get() {
                Some(cluster_id) => cluster_id,
                // Initialised by an older build or before the id file was
                // written: no peer can know an id yet, so make one now.
                None => {
                    #[allow(clippy::disallowed_methods)] // random by definition (rule 16)
                    let cluster_id = ClusterId(rand::random::<u128>());
                    if let Err(error) = identity.adopt(cluster_id) {
                        tracing::error!(%error, "cannot record a cluster id");
                        return;
                    }
                    cluster_id
                }
            };
            let entry = Entry::single(
                stamp_ms,
                // A new cluster starts under the latest rules, with their
                // default limits (records beyond RAM: 50 M keys and claims).
                Op::BootstrapWithRules {
                    cluster_id,
                    config: config.initial_registry,
                    rules: config
                        .faults
                        .bootstrap_rules()
                        .unwrap_or(RulesVersion::LATEST),
                },
            );
            match raft.client_write(entry).await {
                Ok(written) => {
                    if let Some(Outcome::Bootstrapped { cluster_id, .. }) = written.data.first() {
                        tracing::info!(%cluster_id, log_index = written.log_id.index, "cluster bootstrapped");
                    }
                }
                Err(error) => tracing::warn!(%error, "bootstrap entry not written; will retry"),
            }
            continue;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), metrics.changed()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data directory of storage format 4 (before idempotency keys) is
    /// accepted and marked format 5, so an earlier build refuses it from
    /// then on; formats 2 and 3 and unknown ones are still refused.
    #[test]
    fn storage_format_4_is_upgraded_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let format = dir.path().join("format");
        std::fs::write(&format, "4\n").unwrap();
        check_data_format(dir.path()).expect("format 4 is read");
        assert_eq!(std::fs::read_to_string(&format).unwrap(), "5\n");
        check_data_format(dir.path()).expect("format 5 is read");
        for refused in ["2", "3", "6"] {
            std::fs::write(&format, format!("{refused}\n")).unwrap();
            assert!(check_data_format(dir.path()).is_err(), "format {refused}");
        }
    }
}
