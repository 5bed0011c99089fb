//! The server's failures named as wire reasons: what openraft's errors and
//! the cluster clock's mean for a caller (`NOT_LEADER` with the leader's
//! hint, `UNAVAILABLE` for this attempt, `INVALID_ARGUMENT` for a change the
//! membership rules out). How a reason is spelled on the wire, and every
//! other failure (registry refusals, malformed input, a wrong cluster), is
//! `oncekv_wire::status`; this module must not spell a status itself.

use crate::clock::ClockError;
use crate::raft_types::TypeConfig;
use oncekv_wire::status::{ErrorReason, invalid, reason_status};
use openraft::RaftMetrics;
use openraft::error::{ChangeMembershipError, ClientWriteError, LinearizableReadError, RaftError};
use tonic::Status;

/// The cluster clock could not stamp: not the leader, or not yet able to.
pub fn clock_status(error: ClockError) -> Status {
    match error {
        ClockError::NotLeader { leader_id, leader } => reason_status(ErrorReason::NotLeader {
            leader_id,
            leader_client_addr: leader.map(|node| node.client_addr),
        }),
        ClockError::Unavailable(why) => reason_status(ErrorReason::Unavailable(why)),
    }
}

/// A proposal openraft did not accept or lost.
pub fn write_status(error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Status {
    match error {
        // openraft 0.10 says `LogEntryDiscarded` when a leader change drops
        // an entry it had appended: its outcome is unknown, which a retry of
        // the same request resolves (this attempt only, as `NOT_LEADER`).
        RaftError::APIError(
            ClientWriteError::ForwardToLeader(forward)
            | ClientWriteError::LogEntryDiscarded(forward),
        ) => reason_status(ErrorReason::NotLeader {
            leader_id: forward.leader_id,
            leader_client_addr: forward.leader_node.map(|node| node.client_addr),
        }),
        other => reason_status(ErrorReason::Unavailable(other.to_string())),
    }
}

/// The read index could not be confirmed: not the leader (with its hint),
/// or not now.
pub fn read_status(error: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> Status {
    match error {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(forward)) => {
            reason_status(ErrorReason::NotLeader {
                leader_id: forward.leader_id,
                leader_client_addr: forward.leader_node.map(|node| node.client_addr),
            })
        }
        other => reason_status(ErrorReason::Unavailable(other.to_string())),
    }
}

/// Membership errors: a change ruled out by the membership is the caller's
/// to fix; one already in progress is for this attempt only.
pub fn membership_status(error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Status {
    match error {
        RaftError::APIError(ClientWriteError::ChangeMembershipError(change)) => match change {
            ChangeMembershipError::InProgress(progress) => reason_status(ErrorReason::Unavailable(
                format!("another membership change is in progress: {progress}"),
            )),
            other => invalid(other.to_string()),
        },
        other => write_status(other),
    }
}

/// `NOT_LEADER` with the leader's id and client address, when known.
pub fn not_leader(metrics: &RaftMetrics<TypeConfig>) -> Status {
    let leader_client_addr = metrics
        .current_leader
        .and_then(|leader| metrics.membership_config.membership().get_node(&leader))
        .map(|node| node.client_addr.clone());
    reason_status(ErrorReason::NotLeader {
        leader_id: metrics.current_leader,
        leader_client_addr,
    })
}
