//! Raft traffic between nodes over tonic: the client side openraft calls
//! (`RaftNetworkFactory` / `RaftNetworkV2`) and the `Raft` gRPC service that
//! hands incoming messages to openraft. Messages travel as codec-encoded
//! bytes with the sender's cluster id (rule 16): a node that knows another
//! cluster id refuses them, and a node that knows none adopts the sender's
//! only from a message that decodes.
//!
//! Replication is pipelined (openraft 0.10's `stream_append`): one gRPC
//! stream per leader-follower session carries appends back to back, and the
//! follower answers each in order. Snapshots travel as one client stream,
//! read from the sender's snapshot file a chunk at a time as the stream is
//! sent, and written to a temporary file by the receiver as they arrive:
//! neither side holds a whole snapshot's bytes in memory.
//!
//! The service tells `leader_contact` of each append that arrives under a
//! committed vote, so that the node names a leader only while it hears
//! from it.

use super::faults::FaultControl;
use super::leader_contact::LeaderContact;
use super::tls::PeerClaim;
use crate::raft_types::{NodeId, NodeInfo, Raft, Snapshot, SnapshotMeta, TypeConfig, Vote};
use crate::shared::ClusterIdentity;
use crate::shared::snapshot_file::{BaseId, DurableBase, ReceiveError, SnapshotInbox};
use futures::{Stream, StreamExt};
use oncekv_core::codec;
use oncekv_core::extension::Extension;
use oncekv_wire::convert::{cluster_id_bytes, parse_cluster_id};
use oncekv_wire::proto::RaftMessage;
use oncekv_wire::proto::raft_client::RaftClient;
use oncekv_wire::proto::raft_server;
use oncekv_wire::status::{ErrorReason, reason_status};
use openraft::OptionalSend;
use openraft::RaftNetworkFactory;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Timeout,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Version byte of peer message payloads. 2 since the apply rules of
/// storage format 3: a node of either side refuses the other's messages, so
/// replicas of different rules never share a log. 3 since openraft 0.10,
/// whose messages are shaped differently (nodes of 0.9 and 0.10 must not
/// mix); 4 since the apply rules of storage format 4 (sessions owned by
/// principals); 5 since storage format 5 (idempotency keys: entries and
/// snapshots a node of version 4 could not read).
pub const PEER_FORMAT_VERSION: u8 = 5;

/// Bytes of snapshot data per message of a snapshot stream: what a sender
/// reads from its file at a time (a receiver accepts any size that fits a
/// message).
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// How long a leader waits for a peer's base before it sends a snapshot
/// whole: the answer is a few kilobytes read from memory.
const SNAPSHOT_BASE_TIMEOUT: Duration = Duration::from_secs(2);
/// Extensions tried (each after asking the peer's base again) before a
/// snapshot is sent whole.
const EXTENSION_ATTEMPTS: u32 = 2;

/// Most bytes a received snapshot may hold in all: the stream is refused
/// beyond it instead of filling the disk with whatever a peer sends. Far
/// above any state the registry's limits allow on a machine of this class.
const SNAPSHOT_BYTES_MAX: u64 = 16 << 30;

/// The largest term a peer message may carry. A term grows by one per
/// election: 2^48 is one election a millisecond for 8,900 years. Near
/// `u64::MAX` a node standing for election would wrap its term to 0, which
/// every node refuses: one message would leave the cluster without a leader
/// for good (and the term is durable, so no restart would mend it).
const TERM_MAX: u64 = 1 << 48;

// Message sizes between peers, and why they fit together:
//
// - A log entry carries a batch of client requests, and a client message is
//   at most `CLIENT_MESSAGE_BYTES_MAX` = 8 MiB (both sides of the client API
//   enforce it). The proposer closes a batch before its estimated payload
//   passes `BATCH_BYTES_MAX` = 4 MiB unless the batch is empty, and at
//   `BATCH_REQUESTS_MAX` = 1,024 requests (`network::proposer`); each request
//   adds its ids, command tags and bincode varints beyond its payload: under
//   1 KiB. So one entry < 8 MiB + 1 MiB.
// - openraft sends at most `MAX_PAYLOAD_ENTRIES` entries per append
//   (`node::MAX_PAYLOAD_ENTRIES`): with 8 MiB entries far above any sane
//   message. So the batch is checked here, not assumed: an encoded append
//   above `PEER_PAYLOAD_BYTES_MAX` = 32 MiB is split here into appends of
//   consecutive halves (each with the previous one's last log id as its
//   `prev_log_id`), sent in order (openraft 0.10 has no "payload too
//   large" answer). Four worst-case entries (≈ 36 MiB) may not fit, three
//   (≈ 27 MiB) do; an append of one entry (< 9 MiB) always fits, so the
//   splitting ends.
// - Snapshots travel in chunks of `SNAPSHOT_CHUNK_BYTES` (1 MiB) after a
//   first message with the vote and the snapshot meta (the membership:
//   well under 1 MiB); a receiver writes at most `SNAPSHOT_BYTES_MAX`
//   (16 GiB) of them to its temporary file.
// - The gRPC message wraps the payload with the cluster id (16 bytes), the
//   sender id (≤ 10 bytes) and field tags: `PEER_MESSAGE_BYTES_MAX` leaves
//   1 MiB for that, and both the peer server and the peer clients set it as
//   their decoding and encoding limit (tonic's default of 4 MiB would refuse
//   a single large entry forever).
// - The payload codec decodes with a hard limit of 64 MiB
//   (`oncekv_core::codec`), above 33 MiB: every accepted message decodes.

/// Largest encoded Raft payload a node sends (see the arithmetic above): an
/// append above it is split into smaller appends before it is sent.
pub const PEER_PAYLOAD_BYTES_MAX: usize = 32 << 20;

/// Largest gRPC message between peers, both directions: the payload bound
/// plus framing, and below the codec's decode limit.
pub const PEER_MESSAGE_BYTES_MAX: usize = PEER_PAYLOAD_BYTES_MAX + (1 << 20);

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
    /// The snapshots being sent to peers.
    sends: Arc<SnapshotSends>,
}

impl PeerNetwork {
    pub fn new(node_id: NodeId, identity: ClusterIdentity) -> PeerNetwork {
        PeerNetwork {
            node_id,
            identity,
            via: Arc::default(),
            tls: None,
            sends: Arc::default(),
        }
    }

    /// The snapshots this node's clients send to peers are counted in
    /// `sends`.
    pub fn with_snapshot_sends(mut self, sends: Arc<SnapshotSends>) -> PeerNetwork {
        self.sends = sends;
        self
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
        // HTTP/2 keepalives end a replication stream whose peer went silent
        // (a stream has no per-message deadline); openraft then opens a new
        // one.
        // With TLS every connection handshakes with the node's TLS settings
        // current when it opens (they may be reloaded), checking the name
        // `node-<target>` whatever address is dialled.
        let channel = Endpoint::from_shared(format!("http://{dial}")).map(|endpoint| {
            let endpoint = endpoint
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_millis(500))
                .keep_alive_timeout(Duration::from_millis(1_000))
                .keep_alive_while_idle(true);
            match &self.tls {
                None => endpoint.connect_lazy(),
                Some(tls) => tls.peer_channel(endpoint, &dial, target),
            }
        });
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
            sends: self.sends.clone(),
        }
    }
}

/// The snapshots this node is sending to its peers, for the snapshot
/// schedule (`node::snapshot_schedule`): a leader that builds a newer
/// snapshot while one is on its way, and purges its log up to it, purges
/// the log the receiver needs right after the one it is installing; the
/// receiver then needs another snapshot — under steady writes, at a size
/// whose install outlasts a few builds, forever.
#[derive(Debug, Default)]
pub struct SnapshotSends {
    state: Mutex<SendsState>,
}

#[derive(Debug, Default)]
struct SendsState {
    /// The index of each snapshot being sent.
    active: Vec<u64>,
    /// When the last send ended, and its snapshot's index.
    last_ended: Option<(tokio::time::Instant, u64)>,
}

impl SnapshotSends {
    fn state(&self) -> std::sync::MutexGuard<'_, SendsState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lowest index of the snapshots being sent, or of the last one
    /// sent if it ended less than `grace` ago: its receiver needs the log
    /// from the entry after it. `None`: no receiver is catching up.
    pub fn log_needed_after(&self, grace: Duration) -> Option<u64> {
        let state = self.state();
        let ended = state
            .last_ended
            .filter(|(ended, _)| ended.elapsed() < grace)
            .map(|(_, index)| index);
        state.active.iter().copied().chain(ended).min()
    }

    /// Counts a send of the snapshot at `index` until the guard is dropped.
    fn start(self: &Arc<Self>, index: u64) -> SendInProgress {
        self.state().active.push(index);
        SendInProgress(self.clone(), index)
    }
}

/// A snapshot send in progress (see [`SnapshotSends`]), and its snapshot's
/// index.
struct SendInProgress(Arc<SnapshotSends>, u64);

impl Drop for SendInProgress {
    fn drop(&mut self) {
        let mut state = self.0.state();
        if let Some(at) = state.active.iter().position(|index| *index == self.1) {
            state.active.swap_remove(at);
        }
        state.last_ended = Some((tokio::time::Instant::now(), self.1));
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
    /// Where the snapshots sent to this peer are counted.
    sends: Arc<SnapshotSends>,
}

#[derive(Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    PreVote,
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
    #[error("snapshot stream closed: {0}")]
    Closed(String),
}

impl From<tonic::Status> for PeerCallError {
    fn from(status: tonic::Status) -> Self {
        match status.code() {
            // A slow peer is not an unreachable one: openraft backs off
            // longer after `Unreachable`, which would starve the followers
            // of heartbeats and cause elections.
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                PeerCallError::Timeout(status)
            }
            tonic::Code::Unavailable => PeerCallError::Unreachable(status),
            _ => PeerCallError::Refused(status),
        }
    }
}

/// One message of a snapshot stream.
#[derive(Serialize, Deserialize)]
enum SnapshotPart {
    /// First: the leader's vote and the snapshot's meta.
    Head { vote: Vote, meta: SnapshotMeta },
    /// Then the snapshot's bytes, in order.
    Data(#[serde(with = "chunk_bytes")] Vec<u8>),
    /// Right after the head of an extension (docs/state-beyond-ram.md
    /// §4.9p): the receiver's base it extends, as `SnapshotBase` answered
    /// it. Sent only to a node that answered that call.
    Extends(BaseId),
}

/// A [`SnapshotPart::Data`] of `chunk` as a peer message's payload: the
/// bytes `codec::encode_versioned(PEER_FORMAT_VERSION,
/// &SnapshotPart::Data(chunk))` gives, written from the borrowed chunk into
/// one buffer of their size (a chunk is a MiB: growing a buffer to it
/// would copy it again and fault in fresh pages at every step).
fn data_part_payload(chunk: &[u8]) -> Vec<u8> {
    /// `SnapshotPart::Data`, borrowed.
    struct DataPart<'a>(&'a [u8]);
    impl Serialize for DataPart<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_newtype_variant(
                "SnapshotPart",
                1,
                "Data",
                &chunk_bytes::Borrowed(self.0),
            )
        }
    }
    // The version byte, the variant's index and the length (each at most
    // nine bytes in the codec's varints), then the chunk.
    let mut payload = Vec::with_capacity(chunk.len() + 32);
    payload.push(PEER_FORMAT_VERSION);
    codec::encode_into(&DataPart(chunk), &mut payload);
    payload
}

/// Chunk bytes on the wire: written as one byte string (a length and the
/// bytes, copied whole) instead of serde's element by element encoding of
/// a `Vec<u8>`, which gives the same bytes in bincode but costs a call per
/// byte. Reads either form.
mod chunk_bytes {
    use serde::{Deserializer, Serializer, de};
    use std::fmt;

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    /// Borrowed chunk bytes, written as [`serialize`] writes them.
    pub(super) struct Borrowed<'a>(pub(super) &'a [u8]);

    impl serde::Serialize for Borrowed<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serialize(self.0, serializer)
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> de::Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
                Ok(bytes.to_vec())
            }
            fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(bytes)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                // Grows only with elements actually read.
                let mut bytes = Vec::new();
                while let Some(byte) = seq.next_element::<u8>()? {
                    bytes.push(byte);
                }
                Ok(bytes)
            }
        }
        deserializer.deserialize_byte_buf(Bytes)
    }
}

/// An append split until each part encodes within the payload limit; each
/// part continues where the previous one ends. A single entry that does not
/// fit stays as it is (and fails to send, loudly).
fn encode_append(request: AppendEntriesRequest<TypeConfig>) -> Vec<Vec<u8>> {
    encode_append_within(request, PEER_PAYLOAD_BYTES_MAX)
}

fn encode_append_within(request: AppendEntriesRequest<TypeConfig>, limit: usize) -> Vec<Vec<u8>> {
    let payload = codec::encode_versioned(PEER_FORMAT_VERSION, &request);
    if payload.len() <= limit {
        return vec![payload];
    }
    if request.entries.len() <= 1 {
        // The size arithmetic above says one entry always fits: if this
        // shows, it is wrong and this link is stuck.
        tracing::error!(
            bytes = payload.len(),
            "a single Raft entry exceeds the peer message limit"
        );
        return vec![payload];
    }
    let AppendEntriesRequest {
        vote,
        prev_log_id,
        mut entries,
        leader_commit,
    } = request;
    let second = entries.split_off(entries.len() / 2);
    let middle = entries.last().map(|entry| entry.log_id);
    tracing::debug!(
        bytes = payload.len(),
        entries = entries.len() + second.len(),
        "append too large for one message; split in two"
    );
    let mut parts = encode_append_within(
        AppendEntriesRequest {
            vote,
            prev_log_id,
            entries,
            leader_commit,
        },
        limit,
    );
    parts.extend(encode_append_within(
        AppendEntriesRequest {
            vote,
            prev_log_id: middle,
            entries: second,
            leader_commit,
        },
        limit,
    ));
    parts
}

impl PeerClient {
    fn client(&self) -> Result<RaftClient<Channel>, PeerCallError> {
        self.client
            .clone()
            .ok_or_else(|| PeerCallError::BadAddress(self.peer_addr.clone()))
    }

    fn message(&self, payload: Vec<u8>) -> RaftMessage {
        RaftMessage {
            cluster_id: cluster_id_bytes(self.identity.get()),
            from_node_id: self.from,
            payload,
        }
    }

    /// One unary call with an encoded payload.
    async fn call<Resp: DeserializeOwned>(
        &self,
        rpc: Rpc,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, PeerCallError> {
        let mut client = self.client()?;
        if payload.len() > PEER_PAYLOAD_BYTES_MAX {
            return Err(PeerCallError::TooLarge(payload.len()));
        }
        let mut message = tonic::Request::new(self.message(payload));
        message.set_timeout(option.hard_ttl());
        let reply = match rpc {
            Rpc::AppendEntries => client.append_entries(message).await,
            Rpc::Vote => client.vote(message).await,
            Rpc::PreVote => client.pre_vote(message).await,
        }?;
        codec::decode_versioned(PEER_FORMAT_VERSION, &reply.into_inner().payload)
            .map_err(PeerCallError::Decode)
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        rpc: RPCTypes,
        option: &RPCOption,
        error: PeerCallError,
    ) -> RPCError<TypeConfig, E> {
        match error {
            PeerCallError::Timeout(_) => RPCError::Timeout(Timeout {
                action: rpc,
                id: self.from,
                target: self.target,
                timeout: option.hard_ttl(),
            }),
            error @ (PeerCallError::Unreachable(_) | PeerCallError::BadAddress(_)) => {
                RPCError::Unreachable(Unreachable::new(&error))
            }
            error => RPCError::Network(NetworkError::new(&error)),
        }
    }

    /// Sends an encoded request and unwraps the remote `Result` openraft
    /// returned.
    async fn raft_call<Resp: DeserializeOwned>(
        &self,
        rpc: Rpc,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let kind = match rpc {
            Rpc::AppendEntries => RPCTypes::AppendEntries,
            Rpc::Vote | Rpc::PreVote => RPCTypes::Vote,
        };
        match self
            .call::<Result<Resp, RaftError<TypeConfig>>>(rpc, payload, option)
            .await
        {
            Ok(Ok(response)) => Ok(response),
            // `RaftError<C>` carries only `Fatal`: the peer's Raft stopped.
            Ok(Err(remote)) => Err(RPCError::Unreachable(Unreachable::new(&remote))),
            Err(error) => Err(self.rpc_error(kind, option, error)),
        }
    }

    /// Sends `snapshot` as one stream: its meta, then its registry bytes
    /// read from the file a chunk at a time as the stream is sent (one
    /// chunk in memory, never the snapshot). A chunk that cannot be read
    /// ends the stream early and fails the call; the receiver, which
    /// decodes and checks (checksum included) what it received before
    /// offering it to Raft, refuses the truncated snapshot and keeps
    /// nothing.
    ///
    /// Under an extension's `plan` (see [`PeerClient::plan_extension`]) the
    /// base it extends follows the meta, and the bytes are only the part
    /// and the records the plan sends.
    async fn send_snapshot(
        &self,
        vote: Vote,
        snapshot: Snapshot,
        plan: Option<(BaseId, Arc<Extension>)>,
    ) -> Result<SnapshotResponse<TypeConfig>, PeerCallError> {
        let mut client = self.client()?;
        let Snapshot { meta, snapshot } = snapshot;
        let head = self.message(codec::encode_versioned(
            PEER_FORMAT_VERSION,
            &SnapshotPart::Head { vote, meta },
        ));
        let (extends, plan) = match plan {
            Some((base, plan)) => (
                Some(self.message(codec::encode_versioned(
                    PEER_FORMAT_VERSION,
                    &SnapshotPart::Extends(base),
                ))),
                Some(plan),
            ),
            None => (None, None),
        };
        let cluster_id = cluster_id_bytes(self.identity.get());
        let from = self.from;
        let (failed, mut read_failure) = tokio::sync::mpsc::unbounded_channel::<std::io::Error>();
        // Each chunk is encoded into its message on the thread that read
        // it (the catch-up's, at idle priority), not on the runtime's.
        let data = snapshot
            .into_framed_chunks(SNAPSHOT_CHUNK_BYTES, plan, move |chunk| RaftMessage {
                cluster_id: cluster_id.clone(),
                from_node_id: from,
                payload: data_part_payload(chunk),
            })
            .filter_map(move |message| {
                let message = match message {
                    Ok(message) => Some(message),
                    // The chunk stream ends after an error.
                    Err(error) => {
                        let _ = failed.send(error);
                        None
                    }
                };
                std::future::ready(message)
            });
        let reply = client
            .install_snapshot(
                futures::stream::iter(std::iter::once(head).chain(extends)).chain(data),
            )
            .await;
        // A read error is reported before the stream ends, so before any
        // reply: it wins over whatever the receiver answered.
        if let Ok(error) = read_failure.try_recv() {
            return Err(PeerCallError::Closed(format!(
                "reading the snapshot file: {error}"
            )));
        }
        let result: Result<SnapshotResponse<TypeConfig>, Fatal<TypeConfig>> =
            codec::decode_versioned(PEER_FORMAT_VERSION, &reply?.into_inner().payload)
                .map_err(PeerCallError::Decode)?;
        result.map_err(|fatal| PeerCallError::Closed(fatal.to_string()))
    }
}

impl PeerClient {
    /// What the peer's durable snapshot holds of its records: `None` when
    /// it has none in a store or does not know the call (a node of an
    /// earlier build). An error when it does not answer — stopped, paused
    /// or cut off: a snapshot would not reach it either, and Raft tries
    /// again later.
    async fn snapshot_base(&self) -> Result<Option<DurableBase>, PeerCallError> {
        let mut client = self.client()?;
        let mut message =
            tonic::Request::new(self.message(codec::encode_versioned(PEER_FORMAT_VERSION, &())));
        message.set_timeout(SNAPSHOT_BASE_TIMEOUT);
        let reply = match client.snapshot_base(message).await {
            Ok(reply) => reply,
            Err(status) if status.code() == tonic::Code::Unimplemented => return Ok(None),
            Err(status) => return Err(status.into()),
        };
        codec::decode_versioned(PEER_FORMAT_VERSION, &reply.into_inner().payload)
            .map_err(PeerCallError::Decode)
    }

    /// An extension's plan for sending `snapshot` to this peer (§4.9p of
    /// docs/state-beyond-ram.md): asked for its base, a peer behind this
    /// snapshot whose records the snapshot only adds to is sent those
    /// records alone; `None` sends it whole. An error: the peer did not
    /// answer.
    async fn plan_extension(
        &self,
        snapshot: &Snapshot,
    ) -> Result<Option<(BaseId, Arc<Extension>)>, PeerCallError> {
        let Some(ours) = snapshot.snapshot.base() else {
            return Ok(None);
        };
        let Some(theirs) = self.snapshot_base().await? else {
            return Ok(None);
        };
        let index = crate::shared::snapshot_file::snapshot_index(&snapshot.meta);
        if theirs.id.index >= index {
            return Ok(None);
        }
        let plan = Extension::plan(ours, &theirs.records, theirs.bytes_max);
        tracing::info!(
            target_node = self.target,
            log_index = index,
            base_index = theirs.id.index,
            extension_bytes = plan.as_ref().map(Extension::bytes),
            "snapshot to send: {}",
            if plan.is_some() {
                "as an extension of the peer's base"
            } else {
                "whole (the peer's base is not one it extends)"
            }
        );
        Ok(plan.map(|plan| (theirs.id, Arc::new(plan))))
    }

    /// Sends `snapshot` as an extension of the peer's base where a plan
    /// allows, whole otherwise — and whole, at once, when the peer refuses
    /// the extension (its base moved, or the records do not add up to the
    /// snapshot's over it).
    async fn send_snapshot_planned(
        &self,
        vote: Vote,
        snapshot: Snapshot,
    ) -> Result<SnapshotResponse<TypeConfig>, PeerCallError> {
        // Twice at most: a follower resumed with entries to apply may
        // build a snapshot of its own while the first is sent, moving its
        // base; asked again, its new base is usually the one it keeps.
        for attempt in 1..=EXTENSION_ATTEMPTS {
            let Some(plan) = self.plan_extension(&snapshot).await? else {
                break;
            };
            let Ok(copy) = snapshot.snapshot.duplicate() else {
                break;
            };
            let extension = Snapshot {
                meta: snapshot.meta.clone(),
                snapshot: copy,
            };
            // Each send boxed: two of them inline make a future too large
            // for a worker's stack in a debug build.
            match Box::pin(self.send_snapshot(vote, extension, Some(plan))).await {
                Err(PeerCallError::Refused(status))
                    if status.code() == tonic::Code::FailedPrecondition =>
                {
                    tracing::info!(
                        target_node = self.target,
                        attempt,
                        reason = status.message(),
                        "extension refused"
                    );
                }
                sent => return sent,
            }
        }
        tracing::info!(target_node = self.target, "sending the snapshot whole");
        Box::pin(self.send_snapshot(vote, snapshot, None)).await
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = crate::raft_types::SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // A split append is sent part by part; the first that is not a
        // plain success answers for the whole.
        let mut last = None;
        for payload in encode_append(rpc) {
            let response: AppendEntriesResponse<TypeConfig> =
                self.raft_call(Rpc::AppendEntries, payload, &option).await?;
            if !response.is_success() {
                return Ok(response);
            }
            last = Some(response);
        }
        last.ok_or_else(|| {
            RPCError::Network(NetworkError::new(&PeerCallError::Closed(
                "empty append".into(),
            )))
        })
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        Box::pin(async move {
            // openraft's replication waits out its backoff inside the
            // request stream: connect only once the first append is there,
            // or a peer that refuses connections is redialled in a tight
            // loop.
            let mut input = input.peekable();
            if Pin::new(&mut input).peek().await.is_none() {
                return Ok(Box::pin(futures::stream::empty()) as BoxStream<'s, _>);
            }
            let mut client = self
                .client()
                .map_err(|error| self.rpc_error(RPCTypes::AppendEntries, &option, error))?;
            let cluster_id = cluster_id_bytes(self.identity.get());
            let from = self.from;
            let requests = input.flat_map(move |request| {
                let cluster_id = cluster_id.clone();
                futures::stream::iter(encode_append(request).into_iter().map(move |payload| {
                    RaftMessage {
                        cluster_id: cluster_id.clone(),
                        from_node_id: from,
                        payload,
                    }
                }))
            });
            let replies = client
                .stream_append(requests)
                .await
                .map_err(|status| self.rpc_error(RPCTypes::AppendEntries, &option, status.into()))?
                .into_inner();
            let target = self.target;
            let replies = replies.map(move |reply| {
                let reply = reply.map_err(|status| {
                    RPCError::Network(NetworkError::new(&PeerCallError::from(status)))
                })?;
                let decoded: Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>> =
                    codec::decode_versioned(PEER_FORMAT_VERSION, &reply.payload).map_err(
                        |error| RPCError::Network(NetworkError::new(&PeerCallError::Decode(error))),
                    )?;
                decoded.map_err(|fatal| {
                    tracing::warn!(target_node = target, %fatal, "peer's Raft stopped");
                    RPCError::Unreachable(Unreachable::new(&fatal))
                })
            });
            Ok(Box::pin(replies) as BoxStream<'s, _>)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let payload = codec::encode_versioned(PEER_FORMAT_VERSION, &rpc);
        self.raft_call(Rpc::Vote, payload, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let payload = codec::encode_versioned(PEER_FORMAT_VERSION, &rpc);
        self.raft_call(Rpc::PreVote, payload, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let _counted = self
            .sends
            .start(crate::shared::snapshot_file::snapshot_index(&snapshot.meta));
        let send = Box::pin(self.send_snapshot_planned(vote, snapshot));
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = send => sent.map_err(|error| match self.rpc_error::<std::convert::Infallible>(RPCTypes::InstallSnapshot, &option, error) {
                RPCError::Timeout(timeout) => StreamingError::Timeout(timeout),
                RPCError::Unreachable(unreachable) => StreamingError::Unreachable(unreachable),
                RPCError::Network(network) => StreamingError::Network(network),
                RPCError::RemoteError(remote) => StreamingError::Network(NetworkError::new(&remote)),
            }),
        }
    }

    /// After `Unreachable` (connection refused: the peer is down), retry
    /// soon — a restarted node should rejoin within a heartbeat or two.
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(
            [50u64, 100, 200]
                .into_iter()
                .chain(std::iter::repeat(250))
                .map(Duration::from_millis),
        ))
    }
}

/// The `Raft` gRPC service: decodes peer messages and hands them to openraft.
pub struct PeerService {
    raft: Raft,
    identity: ClusterIdentity,
    /// Where a received snapshot is written as it arrives.
    snapshots: SnapshotInbox,
    /// Told of each append that arrives under a committed vote.
    contact: LeaderContact,
    /// Test-only faults (a received snapshot held before its intake).
    faults: FaultControl,
}

impl PeerService {
    pub fn new(
        raft: Raft,
        identity: ClusterIdentity,
        snapshots: SnapshotInbox,
        contact: LeaderContact,
        faults: FaultControl,
    ) -> PeerService {
        PeerService {
            raft,
            identity,
            snapshots,
            contact,
            faults,
        }
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
        claim: &PeerClaim,
        message: RaftMessage,
    ) -> Result<T, tonic::Status> {
        open_message(&self.identity, claim, message)
    }
}

fn open_message<T: DeserializeOwned>(
    identity: &ClusterIdentity,
    claim: &PeerClaim,
    message: RaftMessage,
) -> Result<T, tonic::Status> {
    claim.check(message.from_node_id)?;
    let theirs = parse_cluster_id(&message.cluster_id)
        .map_err(|error| reason_status(ErrorReason::InvalidArgument(error.to_string())))?;
    match (identity.get(), theirs) {
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
    if let (None, Some(theirs)) = (identity.get(), theirs) {
        identity.adopt(theirs).map_err(|error| {
            reason_status(ErrorReason::Unavailable(format!(
                "cannot record the cluster id: {error}"
            )))
        })?;
    }
    Ok(decoded)
}

/// What a peer may say in its own name (`from`, the sender a message
/// names, which `open_message` binds to the peer's certificate): only its
/// own vote — the candidate's of a vote request, the leader's of an append
/// or a snapshot — so one node's certificate cannot campaign or lead as
/// another; and no term beyond [`TERM_MAX`], nor a log id (`log_ids`: the
/// entries, the one before them, the commit) of a term above the vote's,
/// which no leader or candidate holds.
#[allow(clippy::result_large_err)] // tonic::Status is what the handlers return
fn check_speaks_for_itself<'a>(
    from: NodeId,
    vote: &Vote,
    log_ids: impl IntoIterator<Item = &'a crate::raft_types::LogId>,
) -> Result<(), tonic::Status> {
    let leader = vote.leader_id();
    if leader.node_id != from {
        tracing::warn!(
            from_node_id = from,
            vote_node_id = leader.node_id,
            "peer message under another node's vote"
        );
        return Err(reason_status(ErrorReason::PermissionDenied(format!(
            "node {from} sent a message under the vote of node {}",
            leader.node_id
        ))));
    }
    if leader.term > TERM_MAX {
        return Err(reason_status(ErrorReason::InvalidArgument(format!(
            "term {} is beyond {TERM_MAX}",
            leader.term
        ))));
    }
    if let Some(log_id) = log_ids
        .into_iter()
        .find(|log_id| log_id.leader_id.term > leader.term)
    {
        return Err(reason_status(ErrorReason::InvalidArgument(format!(
            "log id {log_id} of a term above the vote's ({})",
            leader.term
        ))));
    }
    Ok(())
}

/// An append's message opened and checked ([`check_speaks_for_itself`]).
#[allow(clippy::result_large_err)] // tonic::Status is what the handlers return
fn open_append(
    identity: &ClusterIdentity,
    claim: &PeerClaim,
    message: RaftMessage,
) -> Result<AppendEntriesRequest<TypeConfig>, tonic::Status> {
    let from = message.from_node_id;
    let append: AppendEntriesRequest<TypeConfig> = open_message(identity, claim, message)?;
    check_speaks_for_itself(
        from,
        &append.vote,
        append
            .prev_log_id
            .iter()
            .chain(append.leader_commit.iter())
            .chain(append.entries.iter().map(|entry| &entry.log_id)),
    )?;
    Ok(append)
}

/// A vote request's message opened and checked ([`check_speaks_for_itself`]).
#[allow(clippy::result_large_err)] // tonic::Status is what the handlers return
fn open_vote(
    identity: &ClusterIdentity,
    claim: &PeerClaim,
    message: RaftMessage,
) -> Result<VoteRequest<TypeConfig>, tonic::Status> {
    let from = message.from_node_id;
    let vote: VoteRequest<TypeConfig> = open_message(identity, claim, message)?;
    check_speaks_for_itself(from, &vote.vote, vote.last_log_id.iter())?;
    Ok(vote)
}

/// Records a message sent under `vote` (an append, a heartbeat, a
/// snapshot's head) as news from its leader, if the vote is committed.
fn heard(contact: &LeaderContact, vote: &Vote) {
    if vote.is_committed() {
        contact.heard_from(vote.leader_id().node_id);
    }
}

fn seal<T: Serialize>(value: &T) -> RaftMessage {
    RaftMessage {
        cluster_id: Vec::new(),
        from_node_id: 0,
        payload: codec::encode_versioned(PEER_FORMAT_VERSION, value),
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<RaftMessage, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl raft_server::Raft for PeerService {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let claim = PeerClaim::of(&request);
        let rpc = open_append(&self.identity, &claim, request.into_inner())?;
        heard(&self.contact, &rpc.vote);
        Ok(tonic::Response::new(seal(
            &self.raft.append_entries(rpc).await,
        )))
    }

    type StreamAppendStream = ReplyStream;

    /// Appends are decoded (and their sender checked) one by one as they
    /// arrive; the first that is refused ends the stream with its status,
    /// after the replies to the appends before it.
    async fn stream_append(
        &self,
        request: tonic::Request<tonic::Streaming<RaftMessage>>,
    ) -> Result<tonic::Response<ReplyStream>, tonic::Status> {
        let identity = self.identity.clone();
        let contact = self.contact.clone();
        let claim = PeerClaim::of(&request);
        let refused: Arc<Mutex<Option<tonic::Status>>> = Arc::default();
        let refusal = refused.clone();
        let appends = request
            .into_inner()
            .map(move |message| {
                let opened = message.and_then(|message| open_append(&identity, &claim, message));
                if let Ok(append) = &opened {
                    heard(&contact, &append.vote);
                }
                opened
            })
            .take_while(move |opened| {
                let go_on = match opened {
                    Ok(_) => true,
                    Err(status) => {
                        *refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(status.clone());
                        false
                    }
                };
                std::future::ready(go_on)
            })
            .filter_map(|opened| std::future::ready(opened.ok()));
        let replies = self
            .raft
            .stream_append(appends)
            .map(|result| Ok(seal(&result)))
            .chain(
                futures::stream::once(async move {
                    refused.lock().unwrap_or_else(|p| p.into_inner()).take()
                })
                .filter_map(|refused| std::future::ready(refused.map(Err))),
            );
        Ok(tonic::Response::new(Box::pin(replies)))
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let claim = PeerClaim::of(&request);
        let rpc = open_vote(&self.identity, &claim, request.into_inner())?;
        Ok(tonic::Response::new(seal(&self.raft.vote(rpc).await)))
    }

    async fn pre_vote(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let claim = PeerClaim::of(&request);
        let rpc = open_vote(&self.identity, &claim, request.into_inner())?;
        Ok(tonic::Response::new(seal(&self.raft.pre_vote(rpc).await)))
    }

    async fn snapshot_base(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let claim = PeerClaim::of(&request);
        self.open::<()>(&claim, request.into_inner())?;
        Ok(tonic::Response::new(seal(&self.snapshots.base())))
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<tonic::Streaming<RaftMessage>>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let claim = PeerClaim::of(&request);
        let mut parts = request.into_inner();
        let invalid = |what: &str| reason_status(ErrorReason::InvalidArgument(what.to_string()));
        let first = parts
            .next()
            .await
            .ok_or_else(|| invalid("empty snapshot stream"))??;
        let from_node_id = first.from_node_id;
        let SnapshotPart::Head { vote, meta } = self.open(&claim, first)? else {
            return Err(invalid("a snapshot stream must start with its meta"));
        };
        check_speaks_for_itself(from_node_id, &vote, meta.last_log_id.iter())?;
        heard(&self.contact, &vote);
        let unavailable = |error: std::io::Error| {
            tracing::warn!(%error, "cannot write a received snapshot");
            reason_status(ErrorReason::Unavailable(format!(
                "cannot write the snapshot: {error}"
            )))
        };
        // Bytes that are not a snapshot of this meta are the sender's
        // fault, refused here (as they come, or when the stream ends)
        // instead of failing the install (a storage error stops Raft).
        let refused = |error: ReceiveError| match error {
            ReceiveError::Invalid(reason) => {
                tracing::warn!(from_node_id, %reason, "received snapshot refused");
                invalid(&format!("invalid snapshot: {reason}"))
            }
            ReceiveError::Io(error) => unavailable(error),
            // The sender's cue to send the snapshot whole.
            ReceiveError::NotAnExtension(reason) => {
                tracing::info!(from_node_id, %reason, "extension refused");
                tonic::Status::failed_precondition(reason)
            }
        };
        // An extension names its base right after the head.
        let mut first = None;
        let mut base = None;
        if let Some(part) = parts.next().await {
            match self.open(&claim, part?)? {
                SnapshotPart::Extends(id) => base = Some(id),
                part => first = Some(part),
            }
        }
        // Read and checked as it arrives (its part to a temporary file, its
        // records into a staged generation of the record store, or, for an
        // extension, into memory); on any early return (a broken stream, a
        // refused part) `incoming` is dropped and everything it wrote
        // deleted, so nothing is replaced.
        let mut incoming = match base {
            Some(base) => self
                .snapshots
                .receive_extension(&meta, base)
                .await
                .map_err(refused)?,
            None => self.snapshots.receive(&meta).await.map_err(unavailable)?,
        };
        if let Some(hold) = self.faults.snapshot_intake_hold() {
            tokio::time::sleep(hold).await;
        }
        let mut next = first;
        loop {
            let part = match next.take() {
                Some(part) => part,
                None => match parts.next().await {
                    Some(part) => self.open(&claim, part?)?,
                    None => break,
                },
            };
            match part {
                SnapshotPart::Data(chunk) => {
                    if incoming.received_bytes().saturating_add(chunk.len() as u64)
                        > SNAPSHOT_BYTES_MAX
                    {
                        return Err(invalid("a snapshot larger than SNAPSHOT_BYTES_MAX"));
                    }
                    incoming.write(chunk).await.map_err(refused)?;
                }
                SnapshotPart::Head { .. } => {
                    return Err(invalid("a snapshot stream has one meta"));
                }
                SnapshotPart::Extends(_) => {
                    return Err(invalid("an extension names its base once, after the meta"));
                }
            }
        }
        let snapshot = incoming.finish().await.map_err(refused)?;
        let snapshot = Snapshot { meta, snapshot };
        Ok(tonic::Response::new(seal(
            &self.raft.install_full_snapshot(vote, snapshot).await,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft_types::Entry;
    use oncekv_core::{Nonce, Op};

    /// A peer speaks only under its own vote, at a term far from the wrap,
    /// with no log id of a later term than its vote's.
    #[test]
    fn a_peer_speaks_only_for_itself() {
        use crate::raft_types::{CommittedLeaderId, LogId};
        let log_id = |term, index| LogId::new(CommittedLeaderId { term, node_id: 2 }, index);
        let code = |result: Result<(), tonic::Status>| result.map_err(|status| status.code());
        let vote = Vote::new(5, 2);
        assert_eq!(
            code(check_speaks_for_itself(
                2,
                &vote,
                &[log_id(5, 9), log_id(3, 4)]
            )),
            Ok(())
        );
        assert_eq!(
            code(check_speaks_for_itself(3, &vote, &[])),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(
            code(check_speaks_for_itself(2, &vote, &[log_id(6, 9)])),
            Err(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            code(check_speaks_for_itself(2, &Vote::new(TERM_MAX, 2), &[])),
            Ok(())
        );
        assert_eq!(
            code(check_speaks_for_itself(2, &Vote::new(TERM_MAX + 1, 2), &[])),
            Err(tonic::Code::InvalidArgument)
        );
    }

    #[tokio::test]
    async fn a_receiver_is_catching_up_during_a_send_and_for_the_grace_after_it() {
        let sends = Arc::new(SnapshotSends::default());
        // Long enough that the checks right after a drop fall within it on
        // a loaded machine.
        let grace = Duration::from_secs(5);
        assert_eq!(sends.log_needed_after(grace), None, "nothing sent yet");
        let first = sends.start(700);
        let second = sends.start(500);
        assert_eq!(sends.log_needed_after(grace), Some(500), "the older one");
        drop(second);
        assert!(
            sends.log_needed_after(Duration::ZERO).is_some(),
            "one send still runs"
        );
        assert_eq!(
            sends.log_needed_after(Duration::ZERO),
            Some(700),
            "the one still running, once the other's grace is over"
        );
        assert_eq!(
            sends.log_needed_after(grace),
            Some(500),
            "the ended one's receiver is still catching up"
        );
        drop(first);
        assert!(sends.log_needed_after(grace).is_some(), "within the grace");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            sends.log_needed_after(Duration::from_millis(10)).is_none(),
            "past the grace"
        );
        assert_eq!(sends.log_needed_after(Duration::from_millis(10)), None);
    }

    fn append(indexes: std::ops::RangeInclusive<u64>) -> AppendEntriesRequest<TypeConfig> {
        let log_id = |index| openraft::testing::log_id::<TypeConfig>(2, 1, index);
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(indexes.start() - 1)),
            entries: indexes
                .map(|index| Entry {
                    log_id: log_id(index),
                    payload: openraft::EntryPayload::Normal(oncekv_core::Entry::single(
                        index,
                        Op::Register {
                            cluster_id: None,
                            nonce: Nonce(u128::from(index)),
                            principal: oncekv_core::Principal::anonymous(),
                        },
                    )),
                })
                .collect(),
            leader_commit: Some(log_id(3)),
        }
    }

    /// An append over the limit goes as several that each fit (but for a
    /// single entry), that keep every entry in order, and whose
    /// `prev_log_id` is the last entry of the part before.
    #[test]
    fn an_oversized_append_is_split_into_consecutive_parts() {
        let whole = append(5..=14);
        let one_entry = codec::encode_versioned(PEER_FORMAT_VERSION, &append(5..=5)).len();
        let limit = one_entry * 3;
        let parts: Vec<AppendEntriesRequest<TypeConfig>> =
            encode_append_within(whole.clone(), limit)
                .iter()
                .map(|payload| codec::decode_versioned(PEER_FORMAT_VERSION, payload).unwrap())
                .collect();
        assert!(parts.len() > 1);
        let mut prev = whole.prev_log_id;
        let mut entries = Vec::new();
        for (part, payload) in parts.iter().zip(encode_append_within(whole.clone(), limit)) {
            assert!(payload.len() <= limit || part.entries.len() == 1);
            assert_eq!(part.prev_log_id, prev, "each part continues the one before");
            assert_eq!(
                (part.vote, part.leader_commit),
                (whole.vote, whole.leader_commit)
            );
            prev = part.entries.last().map(|entry| entry.log_id);
            entries.extend(part.entries.iter().map(|entry| entry.log_id));
        }
        let expected: Vec<_> = whole.entries.iter().map(|entry| entry.log_id).collect();
        assert_eq!(entries, expected);
        // Within the limit: one message, unchanged.
        assert_eq!(encode_append_within(whole, usize::MAX).len(), 1);
    }

    /// Snapshot chunks are written as one byte string, which in the codec
    /// is byte for byte what the element-wise encoding of a `Vec<u8>`
    /// gives: a node of either encoding reads the other's chunks.
    #[test]
    fn snapshot_chunks_keep_their_wire_encoding() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        enum ElementWise {
            Head { vote: Vote, meta: SnapshotMeta },
            Data(Vec<u8>),
        }
        let chunk: Vec<u8> = (0..=255u8).cycle().take(1_000).collect();
        let ours = codec::encode_versioned(PEER_FORMAT_VERSION, &SnapshotPart::Data(chunk.clone()));
        let theirs =
            codec::encode_versioned(PEER_FORMAT_VERSION, &ElementWise::Data(chunk.clone()));
        assert_eq!(ours, theirs);
        let borrowed = data_part_payload(&chunk);
        assert_eq!(borrowed, ours);
        assert!(borrowed.capacity() - borrowed.len() < 32);
        let SnapshotPart::Data(read) =
            codec::decode_versioned(PEER_FORMAT_VERSION, &theirs).unwrap()
        else {
            panic!("a data part");
        };
        assert_eq!(read, chunk);
        assert_eq!(
            codec::decode_versioned::<ElementWise>(PEER_FORMAT_VERSION, &ours).unwrap(),
            ElementWise::Data(chunk)
        );
    }
}
