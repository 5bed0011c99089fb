//! A node's configuration: command-line flags over an optional TOML file
//! over defaults, validated into a `NodeConfig` before anything starts.
//! The registry TTL and limits given here are only the initial values
//! proposed when the cluster is initialised (rule 12); afterwards they are
//! replicated state.

use crate::raft_types::{NodeId, NodeInfo};
use crate::registry::RegistryConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of `oncekv node`; every one may also come from `--config FILE`
/// (same names with underscores). Flags win over the file.
#[derive(Clone, Debug, Default, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeOptions {
    /// This node's id (a positive integer, fixed for its data directory).
    #[arg(long)]
    pub id: Option<NodeId>,
    /// Address of the client gRPC API.
    #[arg(long)]
    pub client_addr: Option<SocketAddr>,
    /// Address of the peer (Raft) gRPC API.
    #[arg(long)]
    pub peer_addr: Option<SocketAddr>,
    /// Directory for the log (sled), snapshots and the node id file.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// A cluster member as ID=PEER_ADDR/CLIENT_ADDR; repeat for each member,
    /// this node included.
    #[arg(long = "peer", value_name = "ID=PEER_ADDR/CLIENT_ADDR")]
    #[serde(rename = "peer")]
    pub peers: Vec<String>,
    /// Initialise the cluster with the --peer members if this node's data
    /// directory holds no Raft state yet (ignored otherwise).
    #[arg(long)]
    pub initialize: bool,
    /// Raft heartbeat interval [default: 100].
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Raft election timeout, lower bound [default: 400].
    #[arg(long)]
    pub election_timeout_min_ms: Option<u64>,
    /// Raft election timeout, upper bound [default: 800].
    #[arg(long)]
    pub election_timeout_max_ms: Option<u64>,
    /// How long a client request may wait for its entry to apply [default: 5000].
    #[arg(long)]
    pub request_timeout_ms: Option<u64>,
    /// Build a snapshot every this many applied entries [default: 10000].
    #[arg(long)]
    pub snapshot_every_entries: Option<u64>,
    /// Log entries kept behind a snapshot for lagging followers [default: 1000].
    #[arg(long)]
    pub logs_kept_after_snapshot: Option<u64>,
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
    /// `drop-first-execute-reply`.
    #[cfg(feature = "fault-injection")]
    #[arg(long)]
    pub fault: Vec<String>,
}

/// A validated node configuration.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: NodeId,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub members: BTreeMap<NodeId, NodeInfo>,
    pub initialize: bool,
    pub heartbeat: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    pub request_timeout: Duration,
    pub snapshot_every_entries: u64,
    pub logs_kept_after_snapshot: u64,
    pub initial_registry: RegistryConfig,
    pub faults: crate::network::faults::FaultControl,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("missing required option --{0}")]
    Missing(&'static str),
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Toml {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid --peer {0:?}: expected ID=PEER_ADDR/CLIENT_ADDR")]
    Peer(String),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

fn parse_peer(spec: &str) -> Result<(NodeId, NodeInfo), ConfigError> {
    let bad = || ConfigError::Peer(spec.to_string());
    let (id, addrs) = spec.split_once('=').ok_or_else(bad)?;
    let (peer_addr, client_addr) = addrs.split_once('/').ok_or_else(bad)?;
    let id: NodeId = id.trim().parse().map_err(|_| bad())?;
    for addr in [peer_addr, client_addr] {
        addr.parse::<SocketAddr>().map_err(|_| bad())?;
    }
    Ok((
        id,
        NodeInfo {
            peer_addr: peer_addr.to_string(),
            client_addr: client_addr.to_string(),
        },
    ))
}

fn read_file(path: &Path) -> Result<NodeOptions, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::File {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Toml {
        path: path.to_path_buf(),
        source,
    })
}

impl NodeOptions {
    /// Merges the flags over the optional file and the defaults, and
    /// validates the result.
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
        let specs = if self.peers.is_empty() {
            &file.peers
        } else {
            &self.peers
        };
        let mut members = BTreeMap::new();
        for spec in specs {
            let (member, info) = parse_peer(spec)?;
            if members.insert(member, info).is_some() {
                return Err(ConfigError::Invalid(format!("node {member} listed twice")));
            }
        }
        if id == 0 {
            return Err(ConfigError::Invalid("node id 0 is reserved".into()));
        }
        if let Some(me) = members.get(&id)
            && me.peer_addr.parse::<SocketAddr>().ok() != Some(peer_addr)
        {
            return Err(ConfigError::Invalid(format!(
                "--peer for node {id} names peer address {} but --peer-addr is {peer_addr}",
                me.peer_addr
            )));
        }
        let initialize = self.initialize || file.initialize;
        if initialize && !members.contains_key(&id) {
            return Err(ConfigError::Invalid(
                "--initialize needs --peer entries including this node".into(),
            ));
        }
        let millis = |flag: Option<u64>, file: Option<u64>, default: u64| {
            Duration::from_millis(flag.or(file).unwrap_or(default))
        };
        let heartbeat = millis(self.heartbeat_ms, file.heartbeat_ms, 100);
        let election_timeout_min = millis(
            self.election_timeout_min_ms,
            file.election_timeout_min_ms,
            400,
        );
        let election_timeout_max = millis(
            self.election_timeout_max_ms,
            file.election_timeout_max_ms,
            800,
        );
        if heartbeat.is_zero()
            || heartbeat >= election_timeout_min
            || election_timeout_min >= election_timeout_max
        {
            return Err(ConfigError::Invalid(
                "need 0 < heartbeat < election timeout min < election timeout max".into(),
            ));
        }
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
        let snapshot_every_entries = self
            .snapshot_every_entries
            .or(file.snapshot_every_entries)
            .unwrap_or(10_000);
        if snapshot_every_entries == 0 {
            return Err(ConfigError::Invalid(
                "snapshot_every_entries must be positive".into(),
            ));
        }
        Ok(NodeConfig {
            id,
            client_addr,
            peer_addr,
            data_dir,
            members,
            initialize,
            heartbeat,
            election_timeout_min,
            election_timeout_max,
            request_timeout: millis(self.request_timeout_ms, file.request_timeout_ms, 5_000),
            snapshot_every_entries,
            logs_kept_after_snapshot: self
                .logs_kept_after_snapshot
                .or(file.logs_kept_after_snapshot)
                .unwrap_or(1_000),
            initial_registry,
            faults: self.faults()?,
        })
    }

    #[cfg(feature = "fault-injection")]
    fn faults(&self) -> Result<crate::network::faults::FaultControl, ConfigError> {
        let mut drop_execute_replies = 0;
        for fault in &self.fault {
            match fault.as_str() {
                "drop-first-execute-reply" => drop_execute_replies = 1,
                other => return Err(ConfigError::Invalid(format!("unknown fault {other:?}"))),
            }
        }
        Ok(crate::network::faults::FaultControl::new(
            drop_execute_replies,
        ))
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
        assert_eq!(config.heartbeat, Duration::from_millis(100));
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
             data_dir = \"d\"\nheartbeat_ms = 50\nelection_timeout_min_ms = 300\nwindow = 8\n",
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
}
