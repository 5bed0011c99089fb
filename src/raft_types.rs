//! openraft's type configuration for oncekv: what a log entry carries (a
//! registry entry), what applying one returns, and what the cluster knows of
//! each node (its peer and client addresses). Types only.

use crate::registry;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Cursor;

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

/// The response of one applied log entry: the registry's outcome, or
/// `None` for Raft's own blank and membership entries.
pub type Applied = Option<registry::Outcome>;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = registry::Entry,
        R = Applied,
        NodeId = u64,
        Node = NodeInfo,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeInfo>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeInfo>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
