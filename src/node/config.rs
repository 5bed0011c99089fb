//! A node's configuration: command-line flags over an optional TOML file
//! over defaults, validated into a `NodeConfig` before anything starts.
//! The registry TTL and limits given here are only the initial values
//! proposed when the cluster is initialised (rule 12); afterwards they are
//! replicated state.

use crate::raft_types::{NodeId, NodeInfo, is_host_port, same_addr};
use oncekv_core::RegistryConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

// Raft timing defaults, measured on a 2-core machine with three nodes (see
// docs/benchmarks.md, "Raft timing"). openraft (0.9 and 0.10) makes a follower wait its leader
// lease (the maximum election timeout) plus its own election timeout (drawn
// once in [min, max)) after the last message of the leader before it stands,
// so a crashed leader is replaced after about max + min..max, plus a tick of
// 1.5 heartbeats. A follower also stands spuriously when the leader is silent
// that long: 30 / 120–240 ms tolerates 360–480 ms of silence. With batched
// proposals and the segment log the leader's stalls under load stay far
// below that (p999 latency ~20–50 ms at 256 clients, ~115 ms with a release
// build running beside it), and no spurious election was seen in 60 s at 256
// clients, with or without that build; failover under 32 load clients fell
// from ~800 ms (50 / 200–400) to ~490 ms at the median.
/// Default Raft heartbeat interval.
pub const HEARTBEAT_MS_DEFAULT: u64 = 30;
/// Default lower bound of the Raft election timeout.
pub const ELECTION_TIMEOUT_MIN_MS_DEFAULT: u64 = 120;
/// Default upper bound of the Raft election timeout (also the leader lease).
pub const ELECTION_TIMEOUT_MAX_MS_DEFAULT: u64 = 240;

/// Default of `--max-pending-proposals`: the client library's in-flight
/// window (1024) of one session fits whole; a proposal holds at most one
/// client message (8 MiB, typically well under 1 KiB) until Raft answers.
pub const DEFAULT_MAX_PENDING_PROPOSALS: usize = 1024;
/// Largest `--worker-threads` accepted.
pub const WORKER_THREADS_MAX: usize = 1_024;
/// Largest `--max-pending-proposals` accepted.
pub const MAX_PENDING_PROPOSALS_MAX: usize = 1 << 20;

/// Flags of `oncekv node`; every one may also come from `--config FILE`
/// (same names with underscores). Flags win over the file.
#[derive(Clone, Debug, Default, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeOptions {
    /// This node's id (a positive integer, fixed for its data directory).
    #[arg(long)]
    pub id: Option<NodeId>,
    /// Address the client gRPC API binds to.
    #[arg(long)]
    pub client_addr: Option<SocketAddr>,
    /// Address the peer (Raft) gRPC API binds to.
    #[arg(long)]
    pub peer_addr: Option<SocketAddr>,
    /// Client address this node announces (membership, NOT_LEADER hints,
    /// Status), as HOST:PORT [default: --client-addr].
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_client_addr: Option<String>,
    /// Peer address this node announces to the other members, as HOST:PORT
    /// [default: --peer-addr].
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_peer_addr: Option<String>,
    /// Dial node ID through ADDR instead of its announced peer address
    /// (local to this node, never replicated; a test harness puts a proxy on
    /// each link this way). Repeatable.
    #[arg(long = "peer-via", value_name = "ID=HOST:PORT")]
    pub peer_via: Vec<String>,
    /// Serve Prometheus metrics here (`GET /metrics`): HTTPS with the
    /// node's certificate when the node has TLS, plain HTTP otherwise
    /// [default: off].
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Serve the HTTP/JSON API here (`/v1/kv/...`, docs/http.md): HTTPS with
    /// the node's certificate when the node has TLS, plain HTTP otherwise
    /// (then loopback only, unless --insecure) [default: off].
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// Most HTTP API connections open at once, all peers together (TLS
    /// handshakes and idle keep-alive connections count); one more is
    /// answered 503 and closed [default: 1024].
    #[arg(long)]
    pub http_connections_max: Option<usize>,
    /// Most HTTP API connections open at once from one peer IP address;
    /// one more is answered 503 and closed. Behind a proxy every caller is
    /// the proxy's address: raise it there [default: 64].
    #[arg(long)]
    pub http_connections_per_ip_max: Option<usize>,
    /// Most gRPC connections open at once on the client port, all peers
    /// together (TLS handshakes and idle connections count); one more is
    /// closed at once [default: 4096].
    #[arg(long)]
    pub grpc_connections_max: Option<usize>,
    /// Most gRPC connections open at once on the client port from one peer
    /// IP address; one more is closed at once. A client library holds one
    /// per node; behind a NAT or a proxy every caller shares an address
    /// [default: 1024].
    #[arg(long)]
    pub grpc_connections_per_ip_max: Option<usize>,
    /// How long an HTTP request's body may take to arrive, in all, from
    /// when its headers are read; later it is answered 408 and nothing runs
    /// [default: 10000].
    #[arg(long)]
    pub http_body_timeout_ms: Option<u64>,
    /// Most bytes of HTTP request bodies the node holds at once, all
    /// requests together (at least 12 MiB, one largest body); past it a
    /// request is answered 503 [default: 67108864, 64 MiB].
    #[arg(long)]
    pub http_body_buffer_bytes_max: Option<usize>,
    /// Most client proposals this node has in flight at once; beyond it a
    /// request is refused at once with UNAVAILABLE ("overloaded") [default: 1024].
    #[arg(long)]
    pub max_pending_proposals: Option<usize>,
    /// Threads of the node's async runtime [default: one per core]. Nodes
    /// sharing one machine (a local cluster) do better with their share of
    /// the cores than with one thread per core each: fewer threads to wake
    /// and switch between (`scripts/cluster.sh` gives each node cores / 3).
    /// One thread runs tokio's current-thread scheduler, which writes the
    /// responses of a whole batch to a connection at once.
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Directory for the Raft log (wal/), snapshots and the node id file.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// A cluster member as ID=PEER_ADDR/CLIENT_ADDR (announced addresses,
    /// HOST:PORT each); repeat for each member, this node included.
    #[arg(long = "peer", value_name = "ID=PEER_ADDR/CLIENT_ADDR")]
    #[serde(rename = "peer")]
    pub peers: Vec<String>,
    /// Initialise the cluster with the --peer members if this node's data
    /// directory holds no Raft state yet (ignored otherwise).
    #[arg(long)]
    pub initialize: bool,
    /// Bind the client and peer ports to non-loopback addresses although
    /// they have no TLS and no authentication: anyone who can reach them
    /// can read and change everything, join the cluster or take it over.
    /// Without it a node binds only to loopback (127.0.0.0/8, ::1). Use it
    /// only on a private network you trust.
    #[arg(long)]
    pub insecure: bool,
    /// Start even when this machine's memory (or the cgroup's limit) is
    /// below what the replicated memory budget needs (twice
    /// `memory_budget_bytes` plus 128 MiB): a node that runs out of memory
    /// crash-loops on the same state. For tests and small demos only.
    #[arg(long)]
    pub allow_small_memory: bool,
    /// This node's certificate (PEM) for the client and peer ports. With
    /// --tls-key and --tls-ca it turns TLS on for both ports (mutual TLS
    /// between peers), and authentication on the client port; a node with
    /// TLS may bind to any address. See docs/security.md.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA (PEM): peers and client certificates must be signed
    /// by it.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Bearer tokens and roles of the client port, one grant a line:
    /// `TOKEN PRINCIPAL ROLE` (role client or admin; TOKEN `-` grants the
    /// role to a client certificate named PRINCIPAL). Turns authentication
    /// on.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Raft heartbeat interval [default: 30].
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Raft election timeout, lower bound [default: 120].
    #[arg(long)]
    pub election_timeout_min_ms: Option<u64>,
    /// Raft election timeout, upper bound [default: 240].
    #[arg(long)]
    pub election_timeout_max_ms: Option<u64>,
    /// How long a client request may wait for its entry to apply [default: 5000].
    #[arg(long)]
    pub request_timeout_ms: Option<u64>,
    /// Build a snapshot every this many applied entries, each member at its
    /// own phase of that cycle (staggered) [default: 10000].
    #[arg(long)]
    pub snapshot_every_entries: Option<u64>,
    /// Log entries kept behind a snapshot for lagging followers [default: 1000].
    #[arg(long)]
    pub logs_kept_after_snapshot: Option<u64>,
    /// Also build a snapshot once this many idempotency-key records and
    /// finished claims (rules version 3) changed since the last build: they
    /// are held in memory until a build moves them into the record store
    /// (node-local) [default: 100000].
    #[arg(long)]
    pub snapshot_every_key_records: Option<u64>,
    /// While this node catches up (a snapshot arriving, or 2,000 or more
    /// entries behind the cluster's commit, until 100 or fewer), the nice
    /// value of its scheduling group (Linux autogroup, when the node leads
    /// its own session), 1 to 19; 0 keeps its priority. On a machine shared
    /// with other nodes, the catch-up then takes the CPU the quorum leaves
    /// over (docs/operating.md "Nodes sharing a machine") [default: 19].
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=19))]
    pub catch_up_nice: Option<u8>,
    /// Initial session TTL, proposed at initialisation [default: 60000].
    #[arg(long)]
    pub session_ttl_ms: Option<u64>,
    /// Initial in-flight window per session, proposed at initialisation [default: 1024].
    #[arg(long)]
    pub window: Option<u64>,
    /// Initial maximum number of sessions, proposed at initialisation [default: 100000].
    #[arg(long)]
    pub sessions_max: Option<u64>,
    /// A TOML file with any of these options.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Test-only fault (built with the `fault-injection` feature only):
    /// `drop-first-execute-reply`, `rewind-commit-record` (start with the
    /// committed index back at the first entry of the log's last term, as
    /// a power loss can leave it), `lose-term-tail` (start with the entries
    /// of the log's last term after its first dropped, as a power loss can
    /// on a leader whose followers stored them before its own fdatasync),
    /// `bootstrap-at-rules-N` (a new cluster starts at rules version N, as
    /// an older build started it), `hold-snapshot-intake-ms-N` (each
    /// snapshot received waits N ms before its intake begins: a catch-up
    /// that lasts).
    #[cfg(feature = "fault-injection")]
    #[arg(long)]
    pub fault: Vec<String>,
}

/// A validated node configuration.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: NodeId,
    /// Where the client API binds.
    pub client_addr: SocketAddr,
    /// Where the peer API binds.
    pub peer_addr: SocketAddr,
    /// The client address this node announces (HOST:PORT).
    pub advertise_client_addr: String,
    /// The peer address this node announces (HOST:PORT).
    pub advertise_peer_addr: String,
    /// Local dial overrides: node id → the address to connect to instead of
    /// its announced peer address.
    pub peer_via: BTreeMap<NodeId, String>,
    /// Where `GET /metrics` is served; `None`: no metrics server.
    pub metrics_addr: Option<SocketAddr>,
    /// Where the HTTP/JSON API is served; `None`: no HTTP API.
    pub http_addr: Option<SocketAddr>,
    /// The HTTP API's bounds on its callers (`network::http_api::limits`).
    pub http_limits: crate::network::http_api::HttpLimits,
    /// The client port's bounds on its connections (`network::connections`).
    pub grpc_limits: crate::network::connections::ConnectionLimits,
    /// Admission control of the client API (see `network::client_api`).
    pub max_pending_proposals: usize,
    /// Threads of the async runtime; `None`: one per core.
    pub worker_threads: Option<usize>,
    pub data_dir: PathBuf,
    pub members: BTreeMap<NodeId, NodeInfo>,
    pub initialize: bool,
    /// Start below the memory the budget needs (see `--allow-small-memory`).
    pub allow_small_memory: bool,
    pub heartbeat: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    pub request_timeout: Duration,
    pub snapshot_every_entries: u64,
    pub logs_kept_after_snapshot: u64,
    pub snapshot_every_key_records: u64,
    /// The scheduling group's nice value while catching up (0: unchanged).
    pub catch_up_nice: u8,
    pub initial_registry: RegistryConfig,
    pub faults: crate::network::faults::FaultControl,
    /// TLS of both ports; `None`: plain (loopback only, or --insecure).
    pub tls: Option<crate::network::tls::TlsPaths>,
    /// Bearer tokens and roles of the client port (`network::auth`).
    pub token_file: Option<PathBuf>,
}

impl NodeConfig {
    /// Whether the client port authenticates its callers.
    pub fn authenticates(&self) -> bool {
        self.tls.is_some() || self.token_file.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("missing required option --{0}")]
    Missing(&'static str),
    // The cause is in the message and not also the error's `source`: the
    // binary prints an error with its chain (`{:#}`), which said it twice.
    #[error("reading {path}: {cause}")]
    File {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("parsing {path}: {cause}")]
    Toml {
        path: PathBuf,
        cause: toml::de::Error,
    },
    #[error("invalid --peer {0:?}: expected ID=PEER_ADDR/CLIENT_ADDR")]
    Peer(String),
    #[error("invalid --peer-via {0:?}: expected ID=HOST:PORT")]
    PeerVia(String),
    #[error("invalid --{flag} {value:?}: expected HOST:PORT")]
    Address { flag: &'static str, value: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

fn parse_peer(spec: &str) -> Result<(NodeId, NodeInfo), ConfigError> {
    let bad = || ConfigError::Peer(spec.to_string());
    let (id, addrs) = spec.split_once('=').ok_or_else(bad)?;
    let (peer_addr, client_addr) = addrs.split_once('/').ok_or_else(bad)?;
    let id: NodeId = id.trim().parse().map_err(|_| bad())?;
    if !is_host_port(peer_addr) || !is_host_port(client_addr) {
        return Err(bad());
    }
    Ok((
        id,
        NodeInfo {
            peer_addr: peer_addr.to_string(),
            client_addr: client_addr.to_string(),
        },
    ))
}

/// Whether `addr` is HOST:PORT: an IP socket address, or a host name of
/// letters, digits, '-' and '.' with a port. What a peer dials and a client
/// is told must be usable as `http://HOST:PORT`.
fn parse_peer_via(spec: &str) -> Result<(NodeId, String), ConfigError> {
    let bad = || ConfigError::PeerVia(spec.to_string());
    let (id, addr) = spec.split_once('=').ok_or_else(bad)?;
    let id: NodeId = id.trim().parse().map_err(|_| bad())?;
    let addr = addr.trim();
    if id == 0 || !is_host_port(addr) {
        return Err(bad());
    }
    Ok((id, addr.to_string()))
}

/// An announced address from a flag or the file, or the bind address.
fn advertised(
    flag: &'static str,
    value: Option<String>,
    bind: SocketAddr,
) -> Result<String, ConfigError> {
    match value {
        Some(value) if is_host_port(value.trim()) => Ok(value.trim().to_string()),
        Some(value) => Err(ConfigError::Address { flag, value }),
        None => Ok(bind.to_string()),
    }
}

/// A duration in milliseconds: the flag, else the file, else `default`.
fn millis(flag: Option<u64>, file: Option<u64>, default: u64) -> Duration {
    Duration::from_millis(flag.or(file).unwrap_or(default))
}

fn read_file(path: &Path) -> Result<NodeOptions, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::File {
        path: path.to_path_buf(),
        cause,
    })?;
    toml::from_str(&text).map_err(|cause| ConfigError::Toml {
        path: path.to_path_buf(),
        cause,
    })
}

/// `flags` when it lists any, else `file`: a repeated option given on the
/// command line replaces the file's list whole.
fn flags_or_file<'a>(flags: &'a [String], file: &'a [String]) -> &'a [String] {
    if flags.is_empty() { file } else { flags }
}

/// The `--peer` members, each once.
fn parse_members(specs: &[String]) -> Result<BTreeMap<NodeId, NodeInfo>, ConfigError> {
    let mut members = BTreeMap::new();
    for spec in specs {
        let (member, info) = parse_peer(spec)?;
        if members.insert(member, info).is_some() {
            return Err(ConfigError::Invalid(format!("node {member} listed twice")));
        }
    }
    Ok(members)
}

/// Without TLS (and so without authentication) a node binds to loopback
/// only, unless told `--insecure`.
fn refuse_exposed_binds(
    binds: impl IntoIterator<Item = (&'static str, SocketAddr)>,
) -> Result<(), ConfigError> {
    for (flag, addr) in binds {
        if !addr.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "--{flag} {addr} is not a loopback address, and this node has no TLS \
                 and no authentication: anyone who can reach it could read and \
                 change every key and session, or join and take over the cluster. \
                 Configure TLS (--tls-cert, --tls-key, --tls-ca; authentication comes \
                 with it), bind to 127.0.0.1, or pass --insecure (insecure = true in the \
                 config file) to accept that on a private network you trust"
            )));
        }
    }
    Ok(())
}

/// What the membership records of this node (its `--peer` entry, if any)
/// must be what it announces.
fn check_own_member(
    members: &BTreeMap<NodeId, NodeInfo>,
    id: NodeId,
    advertise_peer_addr: &str,
    advertise_client_addr: &str,
) -> Result<(), ConfigError> {
    let Some(me) = members.get(&id) else {
        return Ok(());
    };
    if !same_addr(&me.peer_addr, advertise_peer_addr) {
        return Err(ConfigError::Invalid(format!(
            "--peer for node {id} names peer address {} but this node announces \
             {advertise_peer_addr} (--advertise-peer-addr, else --peer-addr)",
            me.peer_addr
        )));
    }
    if !same_addr(&me.client_addr, advertise_client_addr) {
        return Err(ConfigError::Invalid(format!(
            "--peer for node {id} names client address {} but this node announces \
             {advertise_client_addr} (--advertise-client-addr, else --client-addr)",
            me.client_addr
        )));
    }
    Ok(())
}

/// The `--peer-via` dial overrides: each node once, never this one.
fn parse_dial_overrides(
    specs: &[String],
    id: NodeId,
) -> Result<BTreeMap<NodeId, String>, ConfigError> {
    let mut peer_via = BTreeMap::new();
    for spec in specs {
        let (node, addr) = parse_peer_via(spec)?;
        if node == id {
            return Err(ConfigError::Invalid(format!(
                "--peer-via names this node ({id}); a node never dials itself"
            )));
        }
        if peer_via.insert(node, addr).is_some() {
            return Err(ConfigError::Invalid(format!(
                "--peer-via for node {node} given twice"
            )));
        }
    }
    Ok(peer_via)
}

/// Raft's timing: heartbeat, then the election timeout's bounds.
struct RaftTiming {
    heartbeat: Duration,
    election_timeout_min: Duration,
    election_timeout_max: Duration,
}

impl NodeOptions {
    /// Merges the flags over the optional file and the defaults, and
    /// validates the result. The checks run in a fixed order, so a
    /// configuration with several faults is always refused for the same
    /// one.
    pub fn resolve(self) -> Result<NodeConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => NodeOptions::default(),
        };
        let id = self.id.or(file.id).ok_or(ConfigError::Missing("id"))?;
        let client_addr = self
            .client_addr
            .or(file.client_addr)
            .ok_or(ConfigError::Missing("client-addr"))?;
        let peer_addr = self
            .peer_addr
            .or(file.peer_addr)
            .ok_or(ConfigError::Missing("peer-addr"))?;
        let data_dir = self
            .data_dir
            .clone()
            .or(file.data_dir.clone())
            .ok_or(ConfigError::Missing("data-dir"))?;
        let members = parse_members(flags_or_file(&self.peers, &file.peers))?;
        if id == 0 {
            return Err(ConfigError::Invalid("node id 0 is reserved".into()));
        }
        let tls = self.tls_paths(&file)?;
        let token_file = self.token_file.clone().or(file.token_file.clone());
        // TLS on both ports brings authentication on the client port (client
        // certificates of the cluster CA, tokens if a file is given) and
        // mutual TLS between peers: safe to expose.
        let http_addr = self.http_addr.or(file.http_addr);
        if tls.is_none() && !(self.insecure || file.insecure) {
            let http = http_addr.map(|addr| ("http-addr", addr));
            refuse_exposed_binds(
                [("client-addr", client_addr), ("peer-addr", peer_addr)]
                    .into_iter()
                    .chain(http),
            )?;
        }
        let advertise_client_addr = advertised(
            "advertise-client-addr",
            self.advertise_client_addr
                .clone()
                .or(file.advertise_client_addr.clone()),
            client_addr,
        )?;
        let advertise_peer_addr = advertised(
            "advertise-peer-addr",
            self.advertise_peer_addr
                .clone()
                .or(file.advertise_peer_addr.clone()),
            peer_addr,
        )?;
        check_own_member(&members, id, &advertise_peer_addr, &advertise_client_addr)?;
        let peer_via = parse_dial_overrides(flags_or_file(&self.peer_via, &file.peer_via), id)?;
        let metrics_addr = self.metrics_addr.or(file.metrics_addr);
        let (max_pending_proposals, worker_threads) = self.load_bounds(&file)?;
        let http_limits = self.http_limits(&file)?;
        let grpc_limits = self.grpc_limits(&file)?;
        let initialize = self.initialize || file.initialize;
        if initialize && !members.contains_key(&id) {
            return Err(ConfigError::Invalid(
                "--initialize needs --peer entries including this node".into(),
            ));
        }
        let timing = self.raft_timing(&file)?;
        let initial_registry = self.initial_registry(&file)?;
        let snapshot_every_entries = self
            .snapshot_every_entries
            .or(file.snapshot_every_entries)
            .unwrap_or(10_000);
        let snapshot_every_key_records = self
            .snapshot_every_key_records
            .or(file.snapshot_every_key_records)
            .unwrap_or(100_000);
        if snapshot_every_key_records == 0 {
            return Err(ConfigError::Invalid(
                "snapshot_every_key_records must be positive".into(),
            ));
        }
        if snapshot_every_entries == 0 {
            return Err(ConfigError::Invalid(
                "snapshot_every_entries must be positive".into(),
            ));
        }
        let catch_up_nice = self.catch_up_nice.or(file.catch_up_nice).unwrap_or(19);
        if catch_up_nice > 19 {
            return Err(ConfigError::Invalid(
                "catch_up_nice is 0 (unchanged) to 19".into(),
            ));
        }
        Ok(NodeConfig {
            id,
            client_addr,
            peer_addr,
            advertise_client_addr,
            advertise_peer_addr,
            peer_via,
            metrics_addr,
            http_addr,
            http_limits,
            grpc_limits,
            max_pending_proposals,
            worker_threads,
            data_dir,
            members,
            initialize,
            allow_small_memory: self.allow_small_memory || file.allow_small_memory,
            heartbeat: timing.heartbeat,
            election_timeout_min: timing.election_timeout_min,
            election_timeout_max: timing.election_timeout_max,
            request_timeout: millis(self.request_timeout_ms, file.request_timeout_ms, 5_000),
            snapshot_every_entries,
            logs_kept_after_snapshot: self
                .logs_kept_after_snapshot
                .or(file.logs_kept_after_snapshot)
                .unwrap_or(1_000),
            snapshot_every_key_records,
            catch_up_nice,
            initial_registry,
            faults: self.faults()?,
            tls,
            token_file,
        })
    }

    /// The TLS files: all three, or none.
    fn tls_paths(
        &self,
        file: &NodeOptions,
    ) -> Result<Option<crate::network::tls::TlsPaths>, ConfigError> {
        match (
            self.tls_cert.clone().or(file.tls_cert.clone()),
            self.tls_key.clone().or(file.tls_key.clone()),
            self.tls_ca.clone().or(file.tls_ca.clone()),
        ) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => {
                Ok(Some(crate::network::tls::TlsPaths { cert, key, ca }))
            }
            _ => Err(ConfigError::Invalid(
                "TLS needs all of --tls-cert, --tls-key and --tls-ca".into(),
            )),
        }
    }

    /// The bounds of the node's load: proposals in flight (admission
    /// control) and the async runtime's threads.
    fn load_bounds(&self, file: &NodeOptions) -> Result<(usize, Option<usize>), ConfigError> {
        let max_pending_proposals = self
            .max_pending_proposals
            .or(file.max_pending_proposals)
            .unwrap_or(DEFAULT_MAX_PENDING_PROPOSALS);
        if max_pending_proposals == 0 || max_pending_proposals > MAX_PENDING_PROPOSALS_MAX {
            return Err(ConfigError::Invalid(format!(
                "max_pending_proposals must be in 1..={MAX_PENDING_PROPOSALS_MAX}"
            )));
        }
        let worker_threads = self.worker_threads.or(file.worker_threads);
        if worker_threads.is_some_and(|threads| !(1..=WORKER_THREADS_MAX).contains(&threads)) {
            return Err(ConfigError::Invalid(format!(
                "worker_threads must be in 1..={WORKER_THREADS_MAX}"
            )));
        }
        Ok((max_pending_proposals, worker_threads))
    }

    /// The HTTP API's bounds on its callers, checked as a whole.
    fn http_limits(
        &self,
        file: &NodeOptions,
    ) -> Result<crate::network::http_api::HttpLimits, ConfigError> {
        let defaults = crate::network::http_api::HttpLimits::default();
        let limits = crate::network::http_api::HttpLimits {
            connections_max: self
                .http_connections_max
                .or(file.http_connections_max)
                .unwrap_or(defaults.connections_max),
            connections_per_ip_max: self
                .http_connections_per_ip_max
                .or(file.http_connections_per_ip_max)
                .unwrap_or(defaults.connections_per_ip_max),
            body_timeout: self
                .http_body_timeout_ms
                .or(file.http_body_timeout_ms)
                .map_or(defaults.body_timeout, Duration::from_millis),
            body_buffer_bytes_max: self
                .http_body_buffer_bytes_max
                .or(file.http_body_buffer_bytes_max)
                .unwrap_or(defaults.body_buffer_bytes_max),
        };
        limits.validate().map_err(ConfigError::Invalid)?;
        Ok(limits)
    }

    /// The client port's bounds on its connections, checked as a whole.
    fn grpc_limits(
        &self,
        file: &NodeOptions,
    ) -> Result<crate::network::connections::ConnectionLimits, ConfigError> {
        let defaults = crate::network::connections::ConnectionLimits::default();
        let limits = crate::network::connections::ConnectionLimits {
            connections_max: self
                .grpc_connections_max
                .or(file.grpc_connections_max)
                .unwrap_or(defaults.connections_max),
            connections_per_ip_max: self
                .grpc_connections_per_ip_max
                .or(file.grpc_connections_per_ip_max)
                .unwrap_or(defaults.connections_per_ip_max),
        };
        limits.validate("grpc").map_err(ConfigError::Invalid)?;
        Ok(limits)
    }

    /// Heartbeat and election timeout, each strictly below the next.
    fn raft_timing(&self, file: &NodeOptions) -> Result<RaftTiming, ConfigError> {
        let timing = RaftTiming {
            heartbeat: millis(self.heartbeat_ms, file.heartbeat_ms, HEARTBEAT_MS_DEFAULT),
            election_timeout_min: millis(
                self.election_timeout_min_ms,
                file.election_timeout_min_ms,
                ELECTION_TIMEOUT_MIN_MS_DEFAULT,
            ),
            election_timeout_max: millis(
                self.election_timeout_max_ms,
                file.election_timeout_max_ms,
                ELECTION_TIMEOUT_MAX_MS_DEFAULT,
            ),
        };
        if timing.heartbeat.is_zero()
            || timing.heartbeat >= timing.election_timeout_min
            || timing.election_timeout_min >= timing.election_timeout_max
        {
            return Err(ConfigError::Invalid(
                "need 0 < heartbeat < election timeout min < election timeout max".into(),
            ));
        }
        Ok(timing)
    }

    /// The registry config proposed at initialisation, validated as the
    /// core would.
    fn initial_registry(&self, file: &NodeOptions) -> Result<RegistryConfig, ConfigError> {
        let defaults = RegistryConfig::default();
        let initial_registry = RegistryConfig {
            session_ttl_ms: self
                .session_ttl_ms
                .or(file.session_ttl_ms)
                .unwrap_or(defaults.session_ttl_ms),
            window: self.window.or(file.window).unwrap_or(defaults.window),
            sessions_max: self
                .sessions_max
                .or(file.sessions_max)
                .unwrap_or(defaults.sessions_max),
            ..defaults
        };
        initial_registry
            .validate()
            .map_err(|error| ConfigError::Invalid(error.to_string()))?;
        Ok(initial_registry)
    }

    #[cfg(feature = "fault-injection")]
    fn faults(&self) -> Result<crate::network::faults::FaultControl, ConfigError> {
        let mut drop_execute_replies = 0;
        let mut rewind_commit_record = false;
        let mut lose_term_tail = false;
        let mut bootstrap_rules = None;
        let mut snapshot_intake_hold = None;
        for fault in &self.fault {
            if let Some(ms) = fault.strip_prefix("hold-snapshot-intake-ms-") {
                let ms = ms.parse().map_err(|_| {
                    ConfigError::Invalid(format!(
                        "invalid fault {fault:?}: hold-snapshot-intake-ms-N takes N in milliseconds"
                    ))
                })?;
                snapshot_intake_hold = Some(std::time::Duration::from_millis(ms));
                continue;
            }
            match fault.as_str() {
                "drop-first-execute-reply" => drop_execute_replies = 1,
                "rewind-commit-record" => rewind_commit_record = true,
                "lose-term-tail" => lose_term_tail = true,
                other => match other
                    .strip_prefix("bootstrap-at-rules-")
                    .and_then(|rules| rules.parse().ok())
                    .map(oncekv_core::RulesVersion)
                    .filter(|rules| rules.is_known())
                {
                    Some(rules) => bootstrap_rules = Some(rules),
                    None => return Err(ConfigError::Invalid(format!("unknown fault {other:?}"))),
                },
            }
        }
        let mut faults = crate::network::faults::FaultControl::new(drop_execute_replies);
        if rewind_commit_record {
            faults = faults.rewinding_commit_record();
        }
        if lose_term_tail {
            faults = faults.losing_term_tail();
        }
        if let Some(rules) = bootstrap_rules {
            faults = faults.bootstrapping_at_rules(rules);
        }
        if let Some(hold) = snapshot_intake_hold {
            faults = faults.holding_snapshot_intake(hold);
        }
        Ok(faults)
    }

    #[cfg(not(feature = "fault-injection"))]
    fn faults(&self) -> Result<crate::network::faults::FaultControl, ConfigError> {
        Ok(crate::network::faults::FaultControl::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> NodeOptions {
        NodeOptions {
            id: Some(1),
            client_addr: Some("127.0.0.1:7101".parse().unwrap()),
            peer_addr: Some("127.0.0.1:7201".parse().unwrap()),
            data_dir: Some("data/n1".into()),
            peers: vec!["1=127.0.0.1:7201/127.0.0.1:7101".into()],
            ..NodeOptions::default()
        }
    }

    /// A complete set of flags resolves, with the documented defaults.
    #[test]
    fn flags_resolve_with_defaults() {
        let config = options().resolve().unwrap();
        assert_eq!(config.heartbeat, Duration::from_millis(30));
        assert_eq!(config.election_timeout_min, Duration::from_millis(120));
        assert_eq!(config.election_timeout_max, Duration::from_millis(240));
        assert_eq!(config.members.len(), 1);
        assert_eq!(config.initial_registry, RegistryConfig::default());
    }

    /// Inconsistent or malformed options are refused with a clear error.
    #[test]
    fn bad_options_are_refused() {
        let mut missing = options();
        missing.id = None;
        assert!(matches!(missing.resolve(), Err(ConfigError::Missing("id"))));
        let mut peer = options();
        peer.peers = vec!["1=nonsense".into()];
        assert!(matches!(peer.resolve(), Err(ConfigError::Peer(_))));
        let mut timing = options();
        timing.heartbeat_ms = Some(500);
        assert!(matches!(timing.resolve(), Err(ConfigError::Invalid(_))));
        let mut mismatch = options();
        mismatch.peer_addr = Some("127.0.0.1:9999".parse().unwrap());
        assert!(matches!(mismatch.resolve(), Err(ConfigError::Invalid(_))));
    }

    /// The file supplies what the flags leave out; flags win.
    #[test]
    fn file_under_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "id = 1\nclient_addr = \"127.0.0.1:7101\"\npeer_addr = \"127.0.0.1:7201\"\n\
             data_dir = \"d\"\nheartbeat_ms = 50\nelection_timeout_min_ms = 300\n\
             election_timeout_max_ms = 600\nwindow = 8\n",
        )
        .unwrap();
        let options = NodeOptions {
            config: Some(path),
            heartbeat_ms: Some(60),
            ..NodeOptions::default()
        };
        let config = options.resolve().unwrap();
        assert_eq!(config.heartbeat, Duration::from_millis(60));
        assert_eq!(config.election_timeout_min, Duration::from_millis(300));
        assert_eq!(config.initial_registry.window, 8);
    }

    /// The HTTP API's bounds: documented defaults; flags over the file;
    /// a combination that cannot work (more per address than in total, a
    /// body buffer smaller than one largest body, zero) is refused.
    #[test]
    fn http_limits_resolve_and_are_checked() {
        use crate::network::http_api::{BODY_BYTES_MAX, HttpLimits};
        assert_eq!(
            options().resolve().unwrap().http_limits,
            HttpLimits::default()
        );
        assert_eq!(
            HttpLimits::default(),
            HttpLimits {
                connections_max: 1024,
                connections_per_ip_max: 64,
                body_timeout: Duration::from_secs(10),
                body_buffer_bytes_max: 64 << 20,
            }
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "http_connections_max = 100\nhttp_connections_per_ip_max = 10\n\
             http_body_timeout_ms = 2500\n",
        )
        .unwrap();
        let given = NodeOptions {
            config: Some(path),
            http_connections_per_ip_max: Some(20),
            ..options()
        };
        let limits = given.resolve().unwrap().http_limits;
        assert_eq!(
            (
                limits.connections_max,
                limits.connections_per_ip_max,
                limits.body_timeout
            ),
            (100, 20, Duration::from_millis(2500))
        );
        for bad in [
            NodeOptions {
                http_connections_max: Some(10),
                http_connections_per_ip_max: Some(11),
                ..options()
            },
            NodeOptions {
                http_body_buffer_bytes_max: Some(BODY_BYTES_MAX - 1),
                ..options()
            },
            NodeOptions {
                http_body_timeout_ms: Some(0),
                ..options()
            },
        ] {
            assert!(matches!(bad.resolve(), Err(ConfigError::Invalid(_))));
        }
    }

    /// Announced addresses default to the bind addresses; given ones (host
    /// names allowed) must match this node's --peer entry; --peer-via
    /// parses into a dial map; the file supplies all of them under flags.
    #[test]
    fn addresses_and_dial_overrides() {
        let config = options().resolve().unwrap();
        assert_eq!(config.advertise_client_addr, "127.0.0.1:7101");
        assert_eq!(config.advertise_peer_addr, "127.0.0.1:7201");
        assert!(config.peer_via.is_empty());
        assert_eq!(config.metrics_addr, None);
        assert_eq!(config.max_pending_proposals, DEFAULT_MAX_PENDING_PROPOSALS);

        let mut behind_nat = options();
        behind_nat.client_addr = Some("0.0.0.0:7101".parse().unwrap());
        behind_nat.peer_addr = Some("0.0.0.0:7201".parse().unwrap());
        behind_nat.advertise_client_addr = Some("node-1.example:7101".into());
        behind_nat.advertise_peer_addr = Some("node-1.example:7201".into());
        behind_nat.peers = vec!["1=node-1.example:7201/node-1.example:7101".into()];
        behind_nat.peer_via = vec!["2=127.0.0.1:9012".into(), "3=proxy:9013".into()];
        behind_nat.insecure = true;
        let config = behind_nat.resolve().unwrap();
        assert_eq!(config.client_addr.to_string(), "0.0.0.0:7101");
        assert_eq!(config.advertise_client_addr, "node-1.example:7101");
        assert_eq!(config.advertise_peer_addr, "node-1.example:7201");
        assert_eq!(
            config.peer_via.get(&2).map(String::as_str),
            Some("127.0.0.1:9012")
        );
        assert_eq!(
            config.peer_via.get(&3).map(String::as_str),
            Some("proxy:9013")
        );

        // The --peer entry of this node must name what it announces.
        let mut mismatch = options();
        mismatch.advertise_client_addr = Some("127.0.0.1:9999".into());
        assert!(matches!(mismatch.resolve(), Err(ConfigError::Invalid(_))));
        let mut advertised = options();
        advertised.peer_addr = Some("0.0.0.0:7201".parse().unwrap());
        advertised.advertise_peer_addr = Some("127.0.0.1:7201".into());
        advertised.insecure = true;
        assert!(advertised.resolve().is_ok());

        for bad in ["nonsense", "host:", ":80", "host:0", "a b:1", "http://h:1"] {
            let mut address = options();
            address.advertise_peer_addr = Some(bad.into());
            assert!(
                matches!(address.resolve(), Err(ConfigError::Address { .. })),
                "{bad}"
            );
        }
        for bad in ["2", "x=127.0.0.1:1", "2=nowhere", "0=127.0.0.1:1"] {
            let mut via = options();
            via.peer_via = vec![bad.into()];
            assert!(
                matches!(via.resolve(), Err(ConfigError::PeerVia(_))),
                "{bad}"
            );
        }
        let mut twice = options();
        twice.peer_via = vec!["2=127.0.0.1:1".into(), "2=127.0.0.1:2".into()];
        assert!(matches!(twice.resolve(), Err(ConfigError::Invalid(_))));
        let mut itself = options();
        itself.peer_via = vec!["1=127.0.0.1:1".into()];
        assert!(matches!(itself.resolve(), Err(ConfigError::Invalid(_))));
        let mut zero = options();
        zero.max_pending_proposals = Some(0);
        assert!(matches!(zero.resolve(), Err(ConfigError::Invalid(_))));
    }

    /// Without TLS and authentication a node binds its client and peer
    /// ports only to loopback, unless told `--insecure` (rule 19).
    #[test]
    fn non_loopback_binds_need_insecure() {
        for (client, peer) in [
            ("0.0.0.0:7101", "127.0.0.1:7201"),
            ("127.0.0.1:7101", "10.0.0.5:7201"),
            ("[::]:7101", "127.0.0.1:7201"),
        ] {
            let mut exposed = options();
            exposed.client_addr = Some(client.parse().unwrap());
            exposed.peer_addr = Some(peer.parse().unwrap());
            exposed.advertise_client_addr = Some("127.0.0.1:7101".into());
            exposed.advertise_peer_addr = Some("127.0.0.1:7201".into());
            match exposed.clone().resolve() {
                Err(ConfigError::Invalid(message)) => {
                    assert!(message.contains("--insecure"), "{message}")
                }
                other => panic!("{client} {peer}: {other:?}"),
            }
            exposed.insecure = true;
            assert!(exposed.resolve().is_ok(), "{client} {peer} with --insecure");
        }
        // The HTTP port follows the same rule.
        let mut http = options();
        http.http_addr = Some("0.0.0.0:7301".parse().unwrap());
        match http.clone().resolve() {
            Err(ConfigError::Invalid(message)) => {
                assert!(message.contains("--http-addr"), "{message}")
            }
            other => panic!("http 0.0.0.0: {other:?}"),
        }
        http.insecure = true;
        assert!(http.resolve().is_ok());
        let mut http_loopback = options();
        http_loopback.http_addr = Some("127.0.0.1:7301".parse().unwrap());
        assert_eq!(
            http_loopback.resolve().unwrap().http_addr,
            Some("127.0.0.1:7301".parse().unwrap())
        );
        let mut loopback = options();
        loopback.client_addr = Some("127.0.0.2:7101".parse().unwrap());
        loopback.advertise_client_addr = Some("127.0.0.1:7101".into());
        assert!(loopback.resolve().is_ok());
        let mut v6 = options();
        v6.peer_addr = Some("[::1]:7201".parse().unwrap());
        v6.advertise_peer_addr = Some("127.0.0.1:7201".into());
        assert!(v6.resolve().is_ok());
    }

    /// The new options come from the file too, and flags still win.
    #[test]
    fn addresses_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "id = 2\nclient_addr = \"0.0.0.0:7102\"\npeer_addr = \"0.0.0.0:7202\"\n\
             data_dir = \"d\"\nadvertise_client_addr = \"n2.local:7102\"\n\
             advertise_peer_addr = \"n2.local:7202\"\npeer_via = [\"1=127.0.0.1:9021\"]\n\
             metrics_addr = \"127.0.0.1:7302\"\nmax_pending_proposals = 16\n\
             http_addr = \"127.0.0.1:7402\"\n\
             insecure = true\n",
        )
        .unwrap();
        let options = NodeOptions {
            config: Some(path),
            max_pending_proposals: Some(32),
            ..NodeOptions::default()
        };
        let config = options.resolve().unwrap();
        assert_eq!(config.advertise_client_addr, "n2.local:7102");
        assert_eq!(config.advertise_peer_addr, "n2.local:7202");
        assert_eq!(
            config.peer_via.get(&1).map(String::as_str),
            Some("127.0.0.1:9021")
        );
        assert_eq!(config.metrics_addr, Some("127.0.0.1:7302".parse().unwrap()));
        assert_eq!(config.max_pending_proposals, 32);
        assert_eq!(config.http_addr, Some("127.0.0.1:7402".parse().unwrap()));
    }
}
