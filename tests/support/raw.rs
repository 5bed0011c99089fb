//! A raw gRPC test client: exact control of (client id, seq, command), with
//! leader discovery by following `NOT_LEADER` hints and retrying "this
//! attempt" failures until a deadline — the client library's one
//! leader-following policy (`oncekv_client::policy`) — never changing the
//! request.

use oncekv_client::policy::{CallError, Follower};
use oncekv_client::retry::Backoff;
use oncekv_core::{Command, CommandResult};
use oncekv_wire::convert;
use oncekv_wire::proto::{self, Reason, admin_client::AdminClient, client_client::ClientClient};
use oncekv_wire::status::error_detail;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::Channel;

/// A raw client of `cluster`, once it has a leader and a cluster id.
pub async fn raw_client(cluster: &super::cluster::Cluster) -> Raw {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
        if let Ok(status) = cluster.status(leader).await
            && !status.cluster_id.is_empty()
        {
            return Raw::new(cluster.client_addrs(), status.cluster_id);
        }
        assert!(Instant::now() < deadline, "cluster never bootstrapped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn connect(addr: &str) -> ClientClient<Channel> {
    ClientClient::new(channel(addr))
}

/// A lazily connecting channel to `addr`, each call bounded to 10 s.
pub fn channel(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid address")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy()
}

/// The reason carried by a status, if it is one of ours.
pub fn reason(status: &tonic::Status) -> Option<Reason> {
    error_detail(status).map(|detail| detail.reason())
}

/// Whether a failure is for this attempt only, for tests that assert it
/// (stricter than the policy, which retries a capacity refusal too).
pub fn retryable(status: &tonic::Status) -> bool {
    match reason(status) {
        Some(Reason::NotLeader | Reason::Unavailable | Reason::TooManyOutstanding) => true,
        Some(_) => false,
        // No detail: the call failed below our service (connection refused
        // or reset, a deadline): nothing is known of this attempt.
        None => matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
        ),
    }
}

/// The pause between attempts that no leader hint sends elsewhere.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(50),
    cap: Duration::from_millis(50),
};

/// A cluster seen through its client addresses.
#[derive(Clone)]
pub struct Raw {
    pub addrs: Vec<String>,
    pub cluster_id: Vec<u8>,
    /// Where the leader was last found; shared by clones.
    follower: std::sync::Arc<Follower>,
}

impl Raw {
    pub fn new(addrs: Vec<String>, cluster_id: Vec<u8>) -> Raw {
        Raw {
            follower: std::sync::Arc::new(Follower::new(addrs.clone(), BACKOFF)),
            addrs,
            cluster_id,
        }
    }

    /// Runs `call` against the leader, following hints and retrying
    /// retryable failures with a short backoff until `deadline` passes.
    pub async fn on_leader<T, F, Fut>(
        &self,
        deadline: Duration,
        call: F,
    ) -> Result<T, tonic::Status>
    where
        F: Fn(ClientClient<Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        self.on_leader_of(deadline, ClientClient::new, call).await
    }

    /// [`Raw::on_leader`] for the Admin service.
    pub async fn admin_on_leader<T, F, Fut>(
        &self,
        deadline: Duration,
        call: F,
    ) -> Result<T, tonic::Status>
    where
        F: Fn(AdminClient<Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        self.on_leader_of(deadline, AdminClient::new, call).await
    }

    /// `Admin.SetConfig` with `patch` on the leader, retried until
    /// `deadline`; panics if it never succeeds.
    pub async fn set_config(
        &self,
        deadline: Duration,
        patch: proto::RegistryConfigPatch,
    ) -> proto::SetConfigReply {
        let request = proto::SetConfigRequest {
            cluster_id: self.cluster_id.clone(),
            patch: Some(patch),
        };
        self.admin_on_leader(deadline, |mut admin: AdminClient<Channel>| {
            let request = request.clone();
            async move { admin.set_config(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("SetConfig")
    }

    /// [`Raw::on_leader`] for any service client `make` builds on a channel.
    async fn on_leader_of<C, T, F, Fut>(
        &self,
        deadline: Duration,
        make: fn(Channel) -> C,
        call: F,
    ) -> Result<T, tonic::Status>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let until = Instant::now() + deadline;
        let connect = |addr: &str| Ok(make(channel(addr)));
        let (result, _attempts) = self
            .follower
            .call(until, Duration::MAX, connect, call)
            .await;
        result.map_err(CallError::into_status)
    }

    pub async fn register(&self, nonce: u128) -> proto::RegisterReply {
        let request = proto::RegisterRequest {
            cluster_id: self.cluster_id.clone(),
            nonce: nonce.to_be_bytes().to_vec(),
        };
        self.on_leader(Duration::from_secs(30), |mut client| {
            let request = request.clone();
            async move {
                client
                    .register(request)
                    .await
                    .map(|reply| reply.into_inner())
            }
        })
        .await
        .expect("register")
    }

    pub fn execute_request(
        &self,
        client_id: u64,
        seq: u64,
        first_outstanding_seq: u64,
        command: &Command,
    ) -> proto::ExecuteRequest {
        proto::ExecuteRequest {
            cluster_id: self.cluster_id.clone(),
            client_id,
            seq,
            first_outstanding_seq,
            command: Some(convert::command_to_proto(command)),
        }
    }

    /// Executes (client id, seq, command), retrying the same request.
    pub async fn execute(
        &self,
        deadline: Duration,
        request: &proto::ExecuteRequest,
    ) -> Result<(CommandResult, bool), tonic::Status> {
        let reply = self
            .on_leader(deadline, |mut client| {
                let request = request.clone();
                async move {
                    client
                        .execute(request)
                        .await
                        .map(|reply| reply.into_inner())
                }
            })
            .await?;
        let result = convert::result_from_proto(reply.result).expect("well-formed result");
        Ok((result, reply.duplicate))
    }

    /// A linearizable read through the leader.
    pub async fn read(&self, key: &[u8]) -> Option<oncekv_core::Value> {
        let request = proto::ReadRequest {
            cluster_id: self.cluster_id.clone(),
            key: key.to_vec(),
        };
        let reply = self
            .on_leader(Duration::from_secs(30), |mut client| {
                let request = request.clone();
                async move { client.read(request).await.map(|reply| reply.into_inner()) }
            })
            .await
            .expect("read");
        reply
            .value
            .map(|value| convert::value_from_proto(value).expect("well-formed value"))
    }
}

/// A codec that sends and receives message bodies as raw bytes, so a test
/// can put anything on the wire — garbage included — where a protobuf
/// message belongs.
#[derive(Clone, Copy, Debug, Default)]
pub struct BytesCodec;

impl tonic::codec::Codec for BytesCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> BytesCodec {
        BytesCodec
    }

    fn decoder(&mut self) -> BytesCodec {
        BytesCodec
    }
}

impl tonic::codec::Encoder for BytesCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        prost::bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for BytesCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

/// One unary call of `path` (e.g. `/oncekv.v1.Client/Execute`) at `addr`
/// whose request message is exactly `body`; the reply's raw bytes.
pub async fn raw_call(
    addr: &str,
    path: &'static str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel(addr));
    grpc.ready()
        .await
        .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    grpc.unary(
        tonic::Request::new(body),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        BytesCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// Sends `frames` — raw gRPC body bytes (flag, length, message), framed as
/// the caller wants, well-formed or not — to `path` at `addr`, with
/// `grpc-encoding: encoding` when given, and returns the status the node
/// answered (from the headers of a trailers-only reply, or the trailers).
pub async fn raw_frames(
    addr: &str,
    path: &str,
    encoding: Option<&str>,
    frames: Vec<u8>,
) -> tonic::Status {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut request = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(encoding) = encoding {
        request = request.header("grpc-encoding", encoding);
    }
    let body = http_body_util::Full::new(tonic::codegen::Bytes::from(frames));
    let request = request
        .body(tonic::body::Body::new(body))
        .expect("a request");
    let response = channel(addr)
        .oneshot(request)
        .await
        .expect("the node answers");
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return status;
    }
    let collected = response.into_body().collect().await.expect("a body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    tonic::Status::from_header_map(&trailers).expect("a status in the trailers")
}
