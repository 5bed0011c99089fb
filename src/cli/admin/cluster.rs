//! The cluster as the admin commands see it ([`Admin`]): the client
//! library's `Admin` service (following the leader by the library's one
//! policy), the endpoints given and the command's deadline. It owns turning
//! a call's failure into the CLI's [`Failure`]: a refusal named by its
//! reason as the client library names it
//! ([`oncekv_client::Error::from_reason`]), a call that did not get through
//! explained by asking every
//! endpoint ([`crate::cli::reach`]), and an unknown outcome of a change at
//! the deadline (exit 3). It composes nothing: the groups' modules do.

use std::future::Future;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use oncekv_client::credentials::{AuthChannel, Credentials};
use oncekv_client::policy::{self, CallError, Verdict};
use oncekv_wire::proto::Reason;
use oncekv_wire::proto::StatusReply;
use oncekv_wire::proto::admin_client::AdminClient;
use oncekv_wire::status::error_detail;

use crate::cli::output::Failure;
use crate::cli::reach::{self, cause_of};

/// Longest wait for one node's `Status` while looking for the leader.
const STATUS_ATTEMPT_MAX: Duration = Duration::from_secs(2);
/// Least time a call to one named node is given, even past the deadline.
const ATTEMPT_MIN: Duration = Duration::from_secs(1);

/// The cluster as the admin commands see it: its Admin service (the client
/// library's, following the leader), the endpoints given and the command's
/// deadline.
pub(super) struct Admin {
    cluster: oncekv_client::admin::Admin,
    endpoints: Vec<String>,
    deadline: Instant,
    /// The command's `--timeout-ms` (bounds the probes that explain a
    /// failure).
    timeout: Duration,
}

impl Admin {
    pub(super) fn new(
        endpoints: Vec<String>,
        timeout: Duration,
        credentials: Credentials,
    ) -> Admin {
        Admin {
            cluster: oncekv_client::admin::Admin::new(endpoints.clone(), credentials),
            endpoints,
            deadline: Instant::now() + timeout,
            timeout,
        }
    }

    /// Why the cluster could not be got through to, from asking every
    /// endpoint once; `detail` is what the failed call saw.
    pub(super) async fn unreachable(&self, detail: Option<&str>) -> Failure {
        tracing::debug!(?detail, endpoints = ?self.endpoints, "the call did not get through");
        let probes = reach::probe(&self.endpoints, self.timeout).await;
        Failure::unreachable(reach::diagnose(&probes, detail))
    }

    /// Moves the deadline by `ms` (for waits the cluster bounds itself).
    pub(super) fn extend(&mut self, ms: u64) {
        self.deadline += Duration::from_millis(ms);
    }

    /// Whether the command's deadline has passed.
    pub(super) fn past_deadline(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// The time left before the deadline (at least 1 ms).
    pub(super) fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    fn client(&self, endpoint: &str) -> Result<AdminClient<AuthChannel>, Failure> {
        self.cluster
            .node(endpoint)
            .map_err(|status| Failure::usage(status.message().to_owned()))
    }

    /// One call to one node, within the deadline, no retries.
    pub(super) async fn at<T, F, Fut>(&self, endpoint: &str, call: F) -> Result<T, Failure>
    where
        F: FnOnce(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client(endpoint)?;
        let timeout = self.remaining().max(ATTEMPT_MIN);
        let failure = match tokio::time::timeout(timeout, call(client)).await {
            Ok(Ok(reply)) => return Ok(reply.into_inner()),
            Ok(Err(status))
                if error_detail(&status).is_none()
                    && policy::verdict(&status) != Verdict::Final =>
            {
                tracing::debug!(%endpoint, ?status, "the call did not get through");
                node_unreachable(endpoint, &cause_of(&status).to_string())
            }
            Ok(Err(status)) => status_failure(&status),
            Err(_) => node_unreachable(endpoint, &format!("no answer within {timeout:?}")),
        };
        Err(failure.with("node", json!(endpoint)))
    }

    /// Runs `call` on the leader: follows `NOT_LEADER` hints, moves on from
    /// unreachable nodes, retries until the deadline. With `mutation`, a
    /// deadline after some attempt may have reached a leader reports an
    /// unknown outcome.
    pub(super) async fn on_leader<T, F, Fut>(&self, mutation: bool, call: F) -> Result<T, Failure>
    where
        F: Fn(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        // A malformed endpoint is the caller's to fix, before any call.
        for endpoint in &self.endpoints {
            self.client(endpoint)?;
        }
        let (status, maybe_applied) = match self.cluster.on_leader(self.deadline, call).await {
            Ok(reply) => return Ok(reply),
            Err(CallError::Final(status)) => return Err(status_failure(&status)),
            Err(CallError::GaveUp {
                status,
                maybe_applied,
            }) => (status, mutation && maybe_applied),
        };
        tracing::debug!(?status, maybe_applied, "giving up at the deadline");
        Err(if maybe_applied {
            Failure::new(
                "outcome_unknown",
                format!(
                    "no answer before the deadline ({}): the change may or may not \
                     have been made",
                    status.message()
                ),
            )
            .hint(
                "check with `oncekv admin members` (or `admin config`) before running \
                 it again",
            )
            .unknown()
        } else if error_detail(&status).is_none() {
            // Below our service: why the nodes could not be reached.
            self.unreachable(Some(status.message())).await
        } else {
            status_failure(&status)
        })
    }

    /// The leader's own `Status` (found through the nodes' leader hints);
    /// when none is found before the deadline, why, from asking every node.
    pub(super) async fn leader_status(&self) -> Result<StatusReply, Failure> {
        match self
            .cluster
            .leader_status(self.deadline, STATUS_ATTEMPT_MAX)
            .await
        {
            Ok(reply) => Ok(reply),
            Err(error) => {
                tracing::debug!(status = ?error.status(), "no leader found");
                Err(self.unreachable(None).await)
            }
        }
    }

    /// Every member's client address, as the leader knows the membership;
    /// the endpoints given when no leader is found before the deadline.
    pub(super) async fn member_addrs(&self) -> Vec<String> {
        match self
            .cluster
            .leader_status(self.deadline, STATUS_ATTEMPT_MAX)
            .await
        {
            Ok(status) => status
                .members
                .iter()
                .map(|member| member.client_addr.clone())
                .collect(),
            Err(_) => self.endpoints.clone(),
        }
    }

    /// The cluster id, as the leader knows it.
    pub(super) async fn cluster_id(&self) -> Result<Vec<u8>, Failure> {
        let status = self.leader_status().await?;
        if status.cluster_id.is_empty() {
            return Err(Failure::new(
                "unavailable",
                "the cluster is not initialised yet",
            ));
        }
        Ok(status.cluster_id)
    }
}

/// One named node could not be talked to: `cause` says why.
fn node_unreachable(endpoint: &str, cause: &str) -> Failure {
    Failure::new("unavailable", format!("cannot reach {endpoint}: {cause}")).hint(
        "is the node running, and is this its client address? `oncekv status` shows every node",
    )
}

/// A failure the cluster answered: a refusal named by its reason as the
/// client library names it ([`oncekv_client::Error::from_reason`], the one
/// mapping of a wire reason to a kind, which the key-value commands print
/// too); a status without a reason (from below the service) by its gRPC
/// code. The text is the node's own.
fn status_failure(status: &tonic::Status) -> Failure {
    if error_detail(status).is_some_and(|detail| detail.reason() == Reason::NotCaughtUp) {
        let failure = Failure::new("not_caught_up", status.message().to_owned());
        return if status.code() == tonic::Code::DeadlineExceeded {
            failure.hint(
                "it stays a learner and keeps catching up: run the same add-learner again \
                 to wait more (`oncekv admin members` lists it), then promote it",
            )
        } else {
            failure.hint(
                "is that node running, and can the leader reach its peer address? Promote \
                 it once it has caught up (`oncekv status` shows its applied index)",
            )
        };
    }
    let kind = match oncekv_client::Error::from_reason(status, 0) {
        Some(error) => error.kind(),
        None => match status.code() {
            tonic::Code::InvalidArgument => "invalid_argument",
            tonic::Code::Unimplemented => "unimplemented",
            _ => "unavailable",
        },
    };
    Failure::new(kind, status.message().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_core::Limit;
    use oncekv_wire::status::{ErrorReason, reason_status};

    /// A refusal is named as the client library names its reason (the
    /// key-value commands' kinds), with the node's own words; a status
    /// without a reason by its code.
    #[test]
    fn refusals_are_named_by_the_client_library() {
        let cases = [
            (
                reason_status(ErrorReason::SessionExpired),
                "session_expired",
            ),
            (
                reason_status(ErrorReason::WrongCluster(oncekv_core::ClusterId(7))),
                "wrong_cluster",
            ),
            (
                reason_status(ErrorReason::InvalidArgument("bad".into())),
                "invalid_argument",
            ),
            (
                reason_status(ErrorReason::ResourceExhausted(Limit::Sessions)),
                "resource_exhausted",
            ),
            (
                reason_status(ErrorReason::NotLeader {
                    leader_id: None,
                    leader_client_addr: None,
                    nothing_proposed: false,
                }),
                "unavailable",
            ),
            (
                reason_status(ErrorReason::Unavailable("no quorum".into())),
                "unavailable",
            ),
            (
                reason_status(ErrorReason::PermissionDenied(
                    "principal p lacks role admin".into(),
                )),
                "permission_denied",
            ),
            (
                reason_status(ErrorReason::Unauthenticated("unknown bearer token".into())),
                "unauthenticated",
            ),
            (tonic::Status::invalid_argument("bad"), "invalid_argument"),
            (
                tonic::Status::unimplemented("no such call"),
                "unimplemented",
            ),
            (tonic::Status::internal("oops"), "unavailable"),
        ];
        for (status, kind) in cases {
            let failure = status_failure(&status);
            assert_eq!(failure.kind(), kind, "{status:?}");
            assert_eq!(failure.message(), status.message(), "{status:?}");
        }
    }
}
