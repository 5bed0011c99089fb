//! Raft traffic between nodes over tonic: the client side openraft calls
//! (`RaftNetworkFactory` / `RaftNetwork`) and the `Raft` gRPC service that
//! hands incoming messages to openraft. Messages travel as codec-encoded
//! bytes with the sender's cluster id (rule 16): a node that knows another
//! cluster id refuses them.

use super::status::{ErrorReason, reason_status};
use crate::proto::RaftMessage;
use crate::proto::raft_client::RaftClient;
use crate::proto::raft_server;
use crate::raft_types::{NodeId, NodeInfo, Raft, TypeConfig};
use crate::registry::{ClusterId, codec};
use crate::storage::ClusterIdentity;
use openraft::error::Timeout;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// Version byte of peer message payloads. 2 since the apply rules of
/// storage format 3, 3 since those of format 4: a node of either side
/// refuses the other's messages, so replicas of different rules never share
/// a log.
pub const PEER_FORMAT_VERSION: u8 = 3;

// Message sizes between peers, and why they fit together:
//
// - A log entry carries a batch of client requests, and a client message is
//   at most `CLIENT_MESSAGE_BYTES_MAX` = 8 MiB (both sides of the client API
//   enforce it). The proposer closes a batch before its estimated payload
//   passes `BATCH_BYTES_MAX` = 4 MiB unless the batch is empty, and at
//   `BATCH_REQUESTS_MAX` = 1,024 requests (`network::proposer`); each request
//   adds its ids, command tags and bincode varints beyond its payload: under
//   1 KiB. So one entry < 8 MiB + 1 MiB.
// - openraft sends at most `MAX_PAYLOAD_ENTRIES` = 64 entries per append
//   (`node::MAX_PAYLOAD_ENTRIES`): 64 × 8 MiB = 512 MiB in the worst case,
//   far above any sane message. So the batch is checked here, not assumed:
//   an encoded append above `PEER_PAYLOAD_BYTES_MAX` = 32 MiB is refused
//   locally as `PayloadTooLarge` with half the entries as the hint, and
//   openraft resends fewer (64 → 32 → … → 1). Four worst-case entries
//   (≈ 36 MiB) may not fit, three (≈ 27 MiB) do; a batch of one
//   (< 9 MiB) always fits, so the shrinking ends.
// - Snapshots travel in chunks of `SNAPSHOT_CHUNK_BYTES` (node; 4 MiB) plus
//   the snapshot meta (the membership: well under 1 MiB).
// - The gRPC message wraps the payload with the cluster id (16 bytes), the
//   sender id (≤ 10 bytes) and field tags: `PEER_MESSAGE_BYTES_MAX` leaves
//   1 MiB for that, and both the peer server and the peer clients set it as
//   their decoding and encoding limit (tonic's default of 4 MiB would refuse
//   a single large entry forever).
// - The payload codec decodes with a hard limit of 64 MiB
//   (`registry::codec`), above 33 MiB: every accepted message decodes.

/// Largest encoded Raft payload a node sends (see the arithmetic above): an
/// append batch above it is refused locally as "payload too large", and
/// openraft retries with fewer entries.
pub const PEER_PAYLOAD_BYTES_MAX: usize = 32 << 20;

/// Largest gRPC message between peers, both directions: the payload bound
/// plus framing, and below the codec's decode limit.
pub const PEER_MESSAGE_BYTES_MAX: usize = PEER_PAYLOAD_BYTES_MAX + (1 << 20);

pub fn cluster_id_bytes(cluster_id: Option<ClusterId>) -> Vec<u8> {
    cluster_id.map_or_else(Vec::new, |id| id.0.to_be_bytes().to_vec())
}

/// A cluster id on the wire that is neither empty nor 16 bytes.
#[derive(Debug, thiserror::Error)]
#[error("cluster id must be 16 bytes (or empty when unknown)")]
pub struct BadClusterId;

/// Parses a 16-byte cluster id; empty means "not known yet".
pub fn parse_cluster_id(bytes: &[u8]) -> Result<Option<ClusterId>, BadClusterId> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let bytes: [u8; 16] = bytes.try_into().map_err(|_| BadClusterId)?;
    Ok(Some(ClusterId(u128::from_be_bytes(bytes))))
}

/// Creates peer clients for openraft.
#[derive(Clone)]
pub struct PeerNetwork {
    node_id: NodeId,
    identity: ClusterIdentity,
    /// Local dial overrides (`--peer-via`): node id → the address this node
    /// connects to instead of the node's announced peer address. Never
    /// replicated: the membership keeps the announced address.
    via: Arc<BTreeMap<NodeId, String>>,
    /// Mutual TLS to the peers (`network::tls`); `None`: plain.
    tls: Option<super::tls::NodeTls>,
}

impl PeerNetwork {
    pub fn new(node_id: NodeId, identity: ClusterIdentity) -> PeerNetwork {
        PeerNetwork {
            node_id,
            identity,
            via: Arc::default(),
            tls: None,
        }
    }

    /// Dials peers over mutual TLS when `tls` is given.
    pub fn with_tls(mut self, tls: Option<super::tls::NodeTls>) -> PeerNetwork {
        self.tls = tls;
        self
    }

    /// Dials each node of `via` through the given address instead of its
    /// announced peer address.
    pub fn with_dial_overrides(mut self, via: BTreeMap<NodeId, String>) -> PeerNetwork {
        self.via = Arc::new(via);
        self
    }

    /// Where to connect to reach `target`, announced at `announced`.
    fn dial_addr<'a>(&'a self, target: NodeId, announced: &'a str) -> &'a str {
        self.via.get(&target).map_or(announced, String::as_str)
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerClient {
        let dial = self.dial_addr(target, &node.peer_addr).to_string();
        if dial != node.peer_addr {
            tracing::info!(node_id = target, announced = %node.peer_addr, via = %dial, "dialling a peer through its override");
        }
        let channel = super::tls::peer_endpoint(self.tls.as_ref(), &dial, target)
            .map(|endpoint| endpoint.tcp_nodelay(true).connect_lazy());
        PeerClient {
            from: self.node_id,
            target,
            identity: self.identity.clone(),
            client: channel.ok().map(|channel| {
                RaftClient::new(channel)
                    .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
            }),
            peer_addr: dial,
        }
    }
}

/// One peer, as openraft sees it.
pub struct PeerClient {
    from: NodeId,
    target: NodeId,
    identity: ClusterIdentity,
    client: Option<RaftClient<Channel>>,
    /// The address dialled (the announced one, or its override).
    peer_addr: String,
}

#[derive(Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

/// Why a peer call failed below Raft.
#[derive(Debug, thiserror::Error)]
enum PeerCallError {
    #[error("invalid peer address {0}")]
    BadAddress(String),
    #[error("peer unreachable: {0}")]
    Unreachable(tonic::Status),
    #[error("peer call timed out: {0}")]
    Timeout(tonic::Status),
    #[error("peer refused: {0}")]
    Refused(tonic::Status),
    #[error("undecodable reply: {0}")]
    Decode(codec::CodecError),
    #[error("message of {0} bytes exceeds the peer payload limit")]
    TooLarge(usize),
}

impl PeerClient {
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        rpc: Rpc,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, PeerCallError> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| PeerCallError::BadAddress(self.peer_addr.clone()))?;
        let payload = codec::encode_versioned(PEER_FORMAT_VERSION, request);
        if payload.len() > PEER_PAYLOAD_BYTES_MAX {
            return Err(PeerCallError::TooLarge(payload.len()));
        }
        let cluster_id = self.identity.get();
        let mut message = tonic::Request::new(RaftMessage {
            cluster_id: cluster_id_bytes(cluster_id),
            from_node_id: self.from,
            payload,
        });
        message.set_timeout(option.hard_ttl());
        let reply = match rpc {
            Rpc::AppendEntries => client.append_entries(message).await,
            Rpc::Vote => client.vote(message).await,
            Rpc::InstallSnapshot => client.install_snapshot(message).await,
        };
        let reply = reply.map_err(|status| match status.code() {
            // A slow peer is not an unreachable one: openraft backs off for
            // half a second after `Unreachable`, which would starve the
            // followers of heartbeats and cause elections.
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                PeerCallError::Timeout(status)
            }
            tonic::Code::Unavailable => PeerCallError::Unreachable(status),
            _ => PeerCallError::Refused(status),
        })?;
        codec::decode_versioned(PEER_FORMAT_VERSION, &reply.into_inner().payload)
            .map_err(PeerCallError::Decode)
    }

    /// Sends `request` and unwraps the remote `Result` openraft returned.
    async fn raft_call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        request: &Req,
        entries_hint: u64,
        option: RPCOption,
    ) -> Result<Resp, RPCError<NodeId, NodeInfo, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let target = self.target;
        match self
            .call::<Req, Result<Resp, E>>(rpc, request, &option)
            .await
        {
            Err(PeerCallError::TooLarge(bytes)) if entries_hint > 1 => {
                tracing::debug!(
                    bytes,
                    entries = entries_hint,
                    "append batch too large; openraft will shrink it"
                );
                Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint((entries_hint / 2).max(1)),
                ))
            }
            Ok(Ok(response)) => Ok(response),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new(target, remote))),
            Err(PeerCallError::Timeout(_)) => Err(RPCError::Timeout(Timeout {
                action: match rpc {
                    Rpc::AppendEntries => RPCTypes::AppendEntries,
                    Rpc::Vote => RPCTypes::Vote,
                    Rpc::InstallSnapshot => RPCTypes::InstallSnapshot,
                },
                id: self.from,
                target,
                timeout: option.hard_ttl(),
            })),
            Err(error @ (PeerCallError::Unreachable(_) | PeerCallError::BadAddress(_))) => {
                Err(RPCError::Unreachable(Unreachable::new(&error)))
            }
            Err(error) => {
                if let PeerCallError::TooLarge(bytes) = &error {
                    // The size arithmetic above says one entry always fits:
                    // if this shows, it is wrong and this link is stuck.
                    tracing::error!(
                        target_node = target,
                        bytes,
                        "a single Raft message exceeds the peer message limit"
                    );
                }
                Err(RPCError::Network(NetworkError::new(&error)))
            }
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let entries = rpc.entries.len() as u64;
        self.raft_call(Rpc::AppendEntries, &rpc, entries, option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeInfo, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.raft_call(Rpc::InstallSnapshot, &rpc, 0, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        self.raft_call(Rpc::Vote, &rpc, 0, option).await
    }

    /// After `Unreachable` (connection refused: the peer is down), retry
    /// soon — a restarted node should rejoin within a heartbeat or two.
    fn backoff(&self) -> Backoff {
        Backoff::new(
            [50u64, 100, 200]
                .into_iter()
                .chain(std::iter::repeat(250))
                .map(Duration::from_millis),
        )
    }
}

/// The `Raft` gRPC service: decodes peer messages and hands them to openraft.
pub struct PeerService {
    raft: Raft,
    identity: ClusterIdentity,
}

impl PeerService {
    pub fn new(raft: Raft, identity: ClusterIdentity) -> PeerService {
        PeerService { raft, identity }
    }

    pub fn into_server(self) -> raft_server::RaftServer<PeerService> {
        raft_server::RaftServer::new(self)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
    }

    /// Checks the sender's cluster id and decodes its payload. A node that
    /// knows no cluster id yet adopts the sender's only from a message that
    /// decodes: bytes that are not a Raft message never bind a fresh node
    /// to a cluster.
    fn open<T: DeserializeOwned>(
        &self,
        message: tonic::Request<RaftMessage>,
    ) -> Result<T, tonic::Status> {
        super::tls::check_peer_claim(&message, message.get_ref().from_node_id)?;
        let message = message.into_inner();
        let theirs = parse_cluster_id(&message.cluster_id)
            .map_err(|error| reason_status(ErrorReason::InvalidArgument(error.to_string())))?;
        match (self.identity.get(), theirs) {
            (Some(ours), Some(theirs)) if ours != theirs => {
                tracing::warn!(from_node_id = message.from_node_id, %theirs, %ours, "peer of another cluster");
                return Err(reason_status(ErrorReason::WrongCluster(ours)));
            }
            // Once this node knows its cluster, unidentified peers are
            // strangers (a node of a wiped cluster, say).
            (Some(ours), None) => {
                tracing::warn!(
                    from_node_id = message.from_node_id,
                    "peer without a cluster id"
                );
                return Err(reason_status(ErrorReason::WrongCluster(ours)));
            }
            _ => {}
        }
        let decoded =
            codec::decode_versioned(PEER_FORMAT_VERSION, &message.payload).map_err(|error| {
                reason_status(ErrorReason::InvalidArgument(format!(
                    "undecodable peer message: {error}"
                )))
            })?;
        if let (None, Some(theirs)) = (self.identity.get(), theirs) {
            self.identity.adopt(theirs).map_err(|error| {
                reason_status(ErrorReason::Unavailable(format!(
                    "cannot record the cluster id: {error}"
                )))
            })?;
        }
        Ok(decoded)
    }
}

fn seal<T: Serialize>(value: &T) -> tonic::Response<RaftMessage> {
    tonic::Response::new(RaftMessage {
        cluster_id: Vec::new(),
        from_node_id: 0,
        payload: codec::encode_versioned(PEER_FORMAT_VERSION, value),
    })
}

#[tonic::async_trait]
impl raft_server::Raft for PeerService {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = self.open(request)?;
        Ok(seal(&self.raft.append_entries(rpc).await))
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let rpc: VoteRequest<NodeId> = self.open(request)?;
        Ok(seal(&self.raft.vote(rpc).await))
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = self.open(request)?;
        Ok(seal(&self.raft.install_snapshot(rpc).await))
    }
}
