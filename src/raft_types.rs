//! openraft's type configuration for oncekv: what a log entry carries (a
//! registry entry), what applying one returns, and what the cluster knows of
//! each node (its peer and client addresses). Types only.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What the membership records of a node: where peers reach it and where
/// clients do (the latter is the `NOT_LEADER` hint).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub peer_addr: String,
    pub client_addr: String,
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer {} client {}", self.peer_addr, self.client_addr)
    }
}

/// Whether `addr` is HOST:PORT: a socket address, or a DNS-style host name
/// and a non-zero port (what a node may announce).
pub fn is_host_port(addr: &str) -> bool {
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && port.parse::<u16>().is_ok_and(|port| port != 0)
}

/// Two announced addresses name the same endpoint (socket addresses are
/// compared parsed, so `127.0.0.1:1` and `127.0.0.1:01` agree).
pub fn same_addr(a: &str, b: &str) -> bool {
    match (
        a.parse::<std::net::SocketAddr>(),
        b.parse::<std::net::SocketAddr>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The response of one applied log entry: the registry's outcome of each
/// request of its batch, in order; empty for Raft's own blank and
/// membership entries.
pub type Applied = Vec<oncekv_core::Outcome>;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = oncekv_core::Entry,
        R = Applied,
        NodeId = u64,
        Node = NodeInfo,
);

pub type NodeId = u64;
/// A snapshot as it is built, served, sent and installed: an open snapshot
/// file, never its bytes in memory (`shared::snapshot_file`).
pub type SnapshotData = crate::storage::SnapshotFile;
pub type Raft = openraft::Raft<TypeConfig, crate::storage::StateMachineStore>;
pub type CommittedLeaderId = openraft::type_config::alias::CommittedLeaderIdOf<TypeConfig>;
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type Membership = openraft::Membership<NodeId, NodeInfo>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type StorageError = openraft::StorageError<TypeConfig>;
pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;
