//! A client of the `Admin` service for operators' tools (the CLI's `admin`
//! commands, the harness): one node's service, or a call run on the leader
//! by the one leader-following policy ([`crate::policy`]), and the
//! leader's own `Status`. It only calls and retries; composing operations
//! and presenting them is the tool's, and deciding them the cluster's.

use crate::credentials::{AuthChannel, Credentials};
use crate::policy::{CallError, Follower, leader_only};
use crate::retry::Backoff;
use oncekv_wire::proto::admin_client::AdminClient;
use oncekv_wire::proto::client_client::ClientClient;
use oncekv_wire::proto::{StatusReply, StatusRequest};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// The pause between attempts that no hint sends elsewhere: operators'
/// calls are few, and a membership change takes a while to settle.
pub const ADMIN_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(50),
    cap: Duration::from_millis(500),
};

/// How long one node is given to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The Admin service of a cluster reachable at some endpoints.
#[derive(Debug)]
pub struct Admin {
    follower: Follower,
    credentials: Credentials,
}

impl Admin {
    /// A client of the cluster at `endpoints` (`host:port` of any members;
    /// an `http://` prefix is accepted); nothing is contacted until a call.
    pub fn new(endpoints: Vec<String>, credentials: Credentials) -> Admin {
        Admin {
            follower: Follower::new(endpoints, ADMIN_BACKOFF),
            credentials,
        }
    }

    /// The Admin service of the node at `endpoint`, lazily connected.
    pub fn node(&self, endpoint: &str) -> Result<AdminClient<AuthChannel>, tonic::Status> {
        Ok(AdminClient::new(self.channel(endpoint)?))
    }

    fn channel(&self, endpoint: &str) -> Result<AuthChannel, tonic::Status> {
        let endpoint = endpoint.strip_prefix("http://").unwrap_or(endpoint);
        let channel = self
            .credentials
            .endpoint(endpoint)
            .map_err(|error| {
                tonic::Status::invalid_argument(format!("endpoint {endpoint:?}: {error}"))
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .connect_lazy();
        Ok(self.credentials.wrap(channel))
    }

    /// Runs `call` on the leader until it is answered, refused for good, or
    /// `deadline` passes (one attempt may take until the deadline: some
    /// calls wait for the cluster, a learner catching up, say).
    pub async fn on_leader<T, F, Fut>(&self, deadline: Instant, call: F) -> Result<T, CallError>
    where
        F: Fn(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let call = |client| {
            let reply = call(client);
            async move { reply.await.map(tonic::Response::into_inner) }
        };
        let connect = |endpoint: &str| self.node(endpoint);
        self.follower
            .call(deadline, Duration::MAX, connect, call)
            .await
            .0
    }

    /// The leader's own `Status` (the client service's), found through the
    /// nodes' leader hints, each attempt within `attempt_timeout`.
    pub async fn leader_status(
        &self,
        deadline: Instant,
        attempt_timeout: Duration,
    ) -> Result<StatusReply, CallError> {
        let connect = |endpoint: &str| Ok(ClientClient::new(self.channel(endpoint)?));
        let call = |mut client: ClientClient<AuthChannel>| async move {
            leader_only(client.status(StatusRequest {}).await?.into_inner())
        };
        self.follower
            .call(deadline, attempt_timeout, connect, call)
            .await
            .0
    }
}
