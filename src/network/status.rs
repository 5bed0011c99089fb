//! The server's failures named as wire reasons: what openraft's errors and
//! the cluster clock's mean for a caller (`NOT_LEADER` with the leader's
//! hint, `UNAVAILABLE` for this attempt, `INVALID_ARGUMENT` for a change the
//! membership rules out), and the cluster id a request names checked
//! against the one this node applied. How a reason is spelled on the wire,
//! and every other failure (registry refusals, malformed input, a wrong
//! cluster), is `oncekv_wire::status`; this module must not spell a reason's
//! status itself. The services (`client_api`, `admin_api`, `proposer`)
//! build no status of their own: they call this module or
//! `oncekv_wire::status`. The only statuses spelled here directly carry no
//! reason: a fault hook this build lacks and an entry that applied with the
//! wrong number of outcomes.

use super::leader_contact::LeaderContact;
use crate::clock::ClockError;
use crate::raft_types::{NodeId, NodeInfo, TypeConfig};
use crate::shared::SharedState;
use oncekv_core::ClusterId;
use oncekv_wire::status::{self, ErrorReason, invalid, reason_status};
use openraft::RaftMetrics;
use openraft::error::{
    ChangeMembershipError, ClientWriteError, ForwardReason, LinearizableReadError, RaftError,
};
use tonic::Status;

/// The cluster id a request names (empty when the caller does not know it
/// yet; `required` when the request must name it), checked against the one
/// this node applied: an id other than ours is refused at once with
/// `WRONG_CLUSTER`, since it can never become right (rule 16). See
/// [`oncekv_wire::status::check_cluster`].
pub fn check_cluster(
    state: &SharedState,
    bytes: &[u8],
    required: bool,
) -> Result<Option<ClusterId>, Status> {
    status::check_cluster(state.cluster_id(), bytes, required)
}

/// [`check_cluster`] for a request that must name the cluster (every
/// mutation but `Register`).
pub fn required_cluster(state: &SharedState, bytes: &[u8]) -> Result<ClusterId, Status> {
    status::required_cluster(state.cluster_id(), bytes)
}

/// `NOT_LEADER` for a leader an openraft error names, hinted only if this
/// node heard from it lately (`LeaderContact`): a follower cut off from the
/// others keeps its vote for a leader that may be gone.
fn forwarded(
    contact: &LeaderContact,
    leader_id: Option<NodeId>,
    leader: Option<NodeInfo>,
    nothing_proposed: bool,
) -> Status {
    let (leader_id, leader_client_addr) = match contact.heard(leader_id) {
        Some(id) => (Some(id), leader.map(|node| node.client_addr)),
        None => (None, None),
    };
    reason_status(ErrorReason::NotLeader {
        leader_id,
        leader_client_addr,
        nothing_proposed,
    })
}

/// The cluster clock could not stamp: not the leader, or not yet able to.
pub fn clock_status(error: ClockError, contact: &LeaderContact) -> Status {
    match error {
        // The stamp comes before the proposal: nothing was proposed.
        ClockError::NotLeader { leader_id, leader } => forwarded(contact, leader_id, leader, true),
        ClockError::Unavailable(why) => reason_status(ErrorReason::Unavailable(why)),
    }
}

/// A proposal openraft did not accept or lost.
pub fn write_status(
    error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
    contact: &LeaderContact,
) -> Status {
    match error {
        // A leader whose quorum has not acknowledged it within the lease
        // refuses before appending (openraft's only use of the reason):
        // not an election, and nothing proposed.
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward))
            if forward.reason == ForwardReason::LeaseExpired =>
        {
            reason_status(ErrorReason::LeaseExpired)
        }
        // openraft 0.10 says `LogEntryDiscarded` when a leader change drops
        // an entry it had appended: its outcome is unknown, which a retry of
        // the same request resolves (this attempt only, as `NOT_LEADER`).
        RaftError::APIError(
            ClientWriteError::ForwardToLeader(forward)
            | ClientWriteError::LogEntryDiscarded(forward),
        ) => forwarded(contact, forward.leader_id, forward.leader_node, false),
        other => reason_status(ErrorReason::Unavailable(other.to_string())),
    }
}

/// The read index could not be confirmed: not the leader (with its hint),
/// or not now.
pub fn read_status(
    error: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>,
    contact: &LeaderContact,
) -> Status {
    match error {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(forward)) => {
            forwarded(contact, forward.leader_id, forward.leader_node, false)
        }
        other => reason_status(ErrorReason::Unavailable(other.to_string())),
    }
}

/// Membership errors: a change ruled out by the membership is the caller's
/// to fix; one already in progress is for this attempt only.
pub fn membership_status(
    error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
    contact: &LeaderContact,
) -> Status {
    match error {
        RaftError::APIError(ClientWriteError::ChangeMembershipError(change)) => match change {
            ChangeMembershipError::InProgress(progress) => reason_status(ErrorReason::Unavailable(
                format!("another membership change is in progress: {progress}"),
            )),
            other => invalid(other.to_string()),
        },
        other => write_status(other, contact),
    }
}

/// `NOT_LEADER` with the leader's id and client address, when this node
/// hears from one (`contact`).
pub fn not_leader(metrics: &RaftMetrics<TypeConfig>, contact: &LeaderContact) -> Status {
    let leader_id = contact.leader_of(metrics);
    let leader_client_addr = leader_id
        .and_then(|leader| metrics.membership_config.membership().get_node(&leader))
        .map(|node| node.client_addr.clone());
    reason_status(ErrorReason::NotLeader {
        leader_id,
        leader_client_addr,
        nothing_proposed: false,
    })
}

/// `InjectFault` on a node built without the `fault-injection` feature.
pub fn faults_not_built() -> Status {
    Status::unimplemented("fault injection needs a node built with the fault-injection feature")
}

/// An entry that applied with another number of outcomes than it carried
/// requests: a bug, never a refusal.
pub fn outcomes_miscounted() -> Status {
    Status::internal("an entry applied with a wrong number of outcomes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_wire::proto::{ErrorDetail, Reason};
    use openraft::error::ForwardToLeader;
    use std::time::Duration;

    fn detail(status: &Status) -> ErrorDetail {
        status::error_detail(status).expect("an error detail")
    }

    /// A leader refusing a write because its lease expired is not an
    /// election: the message says what happened, and the refusal proves
    /// nothing was proposed. A plain forward stays what it was.
    #[test]
    fn an_expired_lease_is_told_apart_from_an_election() {
        let lease = ForwardToLeader::<TypeConfig>::empty().with_reason(ForwardReason::LeaseExpired);
        let contact = LeaderContact::new(Duration::from_secs(1));
        let status = write_status(
            RaftError::APIError(ClientWriteError::ForwardToLeader(lease)),
            &contact,
        );
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().contains("leader lease") && !status.message().contains("election"),
            "{}",
            status.message()
        );
        let lease_detail = detail(&status);
        assert_eq!(lease_detail.reason(), Reason::NotLeader);
        assert!(lease_detail.nothing_proposed);

        let forward = ForwardToLeader::<TypeConfig>::empty();
        let status = write_status(
            RaftError::APIError(ClientWriteError::ForwardToLeader(forward)),
            &contact,
        );
        assert!(status.message().contains("election in progress"));
        assert!(!detail(&status).nothing_proposed);
    }

    /// A leader openraft names in an error is passed on only if this node
    /// heard from it lately: a follower cut off from the others keeps its
    /// vote for a leader that may be gone, and must not send clients there.
    #[test]
    fn an_error_names_the_leader_only_if_it_was_heard_from() {
        let contact = LeaderContact::new(Duration::from_secs(60));
        let node = NodeInfo {
            client_addr: "127.0.0.1:7102".into(),
            ..NodeInfo::default()
        };
        let forward = || {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(ForwardToLeader::<
                TypeConfig,
            >::new(
                2, node.clone()
            )))
        };
        let unheard = detail(&read_status(forward(), &contact));
        assert_eq!(
            (unheard.leader_id, unheard.leader_client_addr.as_str()),
            (0, "")
        );
        contact.heard_from(2);
        let heard = detail(&read_status(forward(), &contact));
        assert_eq!(
            (heard.leader_id, heard.leader_client_addr.as_str()),
            (2, "127.0.0.1:7102")
        );
    }
}
