//! The one place where failures become gRPC statuses and statuses become
//! reasons again: each reason of the error table of docs/rules.md maps to a
//! status code, an `ErrorDetail` in the status details and the
//! `oncekv-reason` metadata entry (see the table at the top of
//! `proto/oncekv.proto`); a registry `Rejection` maps to its reason here and
//! nowhere else, and so do malformed input and a wrong cluster id. The
//! server's own failures (Raft's errors) are named as reasons by the server
//! (`network::status` there); what a caller does about a reason is the
//! client library's one policy (`oncekv_client::policy`). It must not
//! decide whether a request is refused, only how a refusal is spelled.

use crate::convert::{ConvertError, parse_cluster_id};
use crate::proto::{ErrorDetail, Reason};
use oncekv_core::{ClusterId, InvalidArgument, Limit, LimitExceeded, Outcome, Rejection, Seq};
use prost::Message;
use tonic::Code;

/// Metadata key carrying the reason name.
pub const REASON_METADATA_KEY: &str = "oncekv-reason";

/// Why a client call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorReason {
    NotLeader {
        leader_id: Option<u64>,
        leader_client_addr: Option<String>,
        /// This node refused without proposing: proof that this attempt
        /// never applies (`ErrorDetail.nothing_proposed`).
        nothing_proposed: bool,
    },
    Unavailable(String),
    /// This node leads but refused the write because no majority has
    /// acknowledged it within its leader lease (openraft's
    /// `ForwardReason::LeaseExpired`: followers slow or unreachable); it
    /// proposed nothing. On the wire a `NOT_LEADER` with no hint and
    /// `nothing_proposed`, so clients retry as for any leader change.
    LeaseExpired,
    Deadline,
    TooManyOutstanding {
        floor: Seq,
        window: u64,
    },
    ResourceExhausted(Limit),
    SessionExpired,
    WrongCluster(ClusterId),
    SeqConflict,
    /// An idempotency key reused with another command: final.
    KeyConflict,
    /// A claim key claimed before with another fingerprint: `KEY_CONFLICT`,
    /// worded for claims.
    ClaimConflict,
    ResponseDiscarded {
        floor: Seq,
    },
    InvalidArgument(String),
    /// `INVALID_ARGUMENT` for a floor beyond what the session may fence
    /// (rule 7), with the bound in `ErrorDetail.floor_bound`: the client
    /// must stop using the session.
    FloorBeyondBound {
        first_outstanding_seq: Seq,
        bound_seq: Seq,
    },
    /// The request itself breaks a replicated limit: final.
    LimitExceeded(LimitExceeded),
    /// No credentials, or unknown ones: final.
    Unauthenticated(String),
    /// A known principal not allowed this (role, or another's session): final.
    PermissionDenied(String),
    /// A claim's holder whose fence no longer holds the key: final for that
    /// holder. The key's current fence (0: none).
    Fenced {
        current_fence: u64,
    },
    /// `FENCED` for a release or extend (or a complete after a release) by
    /// the holder whose fence is still the key's: its claim is finished
    /// already (completed or released), so there is nothing to change.
    FinishedUnderThisFence {
        fence: u64,
    },
    /// Admin: learner `node_id` has not matched the leader's log up to
    /// `log_index` within `waited` — after `AddLearner` added it
    /// (`added`: `DEADLINE_EXCEEDED`, it stays a learner and keeps catching
    /// up), or before `ChangeVoters` would promote it (`UNAVAILABLE`,
    /// nothing proposed). `NOT_CAUGHT_UP`, final for the call.
    NotCaughtUp {
        node_id: u64,
        log_index: u64,
        waited: std::time::Duration,
        added: bool,
    },
}

impl From<Rejection> for ErrorReason {
    fn from(rejection: Rejection) -> ErrorReason {
        match rejection {
            Rejection::SessionExpired => ErrorReason::SessionExpired,
            Rejection::WrongCluster { expected } => ErrorReason::WrongCluster(expected),
            Rejection::SeqConflict => ErrorReason::SeqConflict,
            Rejection::ResponseDiscarded { floor } => ErrorReason::ResponseDiscarded { floor },
            Rejection::TooManyOutstanding { floor, window } => {
                ErrorReason::TooManyOutstanding { floor, window }
            }
            Rejection::ResourceExhausted(limit) => ErrorReason::ResourceExhausted(limit),
            Rejection::LimitExceeded { exceeded, .. } => ErrorReason::LimitExceeded(exceeded),
            Rejection::InvalidArgument(InvalidArgument::FloorBeyondBound {
                first_outstanding_seq,
                bound_seq,
            }) => ErrorReason::FloorBeyondBound {
                first_outstanding_seq,
                bound_seq,
            },
            Rejection::InvalidArgument(invalid) => {
                ErrorReason::InvalidArgument(invalid.to_string())
            }
            Rejection::PermissionDenied => ErrorReason::PermissionDenied(
                "the session belongs to another principal; it is untouched".into(),
            ),
            Rejection::NotBootstrapped => {
                ErrorReason::Unavailable("the cluster is not initialised yet".into())
            }
            Rejection::KeyConflict => ErrorReason::KeyConflict,
            Rejection::Fenced { fence } => ErrorReason::Fenced {
                current_fence: fence,
            },
        }
    }
}

/// Builds the gRPC status for `reason`.
pub fn reason_status(reason: ErrorReason) -> tonic::Status {
    let mut detail = ErrorDetail::default();
    let (code, wire_reason, message) = match reason {
        ErrorReason::NotLeader {
            leader_id,
            leader_client_addr,
            nothing_proposed,
        } => {
            detail.nothing_proposed = nothing_proposed;
            detail.leader_id = leader_id.unwrap_or(0);
            detail.leader_client_addr = leader_client_addr.clone().unwrap_or_default();
            let message = match leader_client_addr {
                Some(addr) => format!("not the leader; the leader is at {addr}"),
                None => "not the leader; no leader known (election in progress)".into(),
            };
            (Code::Unavailable, Reason::NotLeader, message)
        }
        ErrorReason::Unavailable(why) => (Code::Unavailable, Reason::Unavailable, why),
        ErrorReason::LeaseExpired => {
            detail.nothing_proposed = true;
            (
                Code::Unavailable,
                Reason::NotLeader,
                "this node leads, but no majority has acknowledged it within its leader \
                 lease (followers slow or unreachable): this attempt was not proposed; retry"
                    .into(),
            )
        }
        ErrorReason::Deadline => (
            Code::DeadlineExceeded,
            Reason::Unavailable,
            "no answer before the deadline; the request may still be applied".into(),
        ),
        ErrorReason::TooManyOutstanding { floor, window } => {
            detail.floor = floor;
            detail.window = window;
            (
                Code::ResourceExhausted,
                Reason::TooManyOutstanding,
                format!("seq at or beyond floor {floor} + window {window}"),
            )
        }
        ErrorReason::ResourceExhausted(limit) => {
            detail.limit = limit.to_string();
            (
                Code::ResourceExhausted,
                Reason::ResourceExhausted,
                format!("replicated limit {limit} reached"),
            )
        }
        ErrorReason::SessionExpired => (
            Code::NotFound,
            Reason::SessionExpired,
            "unknown or expired session".into(),
        ),
        ErrorReason::WrongCluster(expected) => {
            detail.expected_cluster_id = expected.0.to_be_bytes().to_vec();
            (
                Code::FailedPrecondition,
                Reason::WrongCluster,
                format!("this node belongs to cluster {expected}"),
            )
        }
        ErrorReason::SeqConflict => (
            Code::AlreadyExists,
            Reason::SeqConflict,
            "seq already used with another command".into(),
        ),
        ErrorReason::KeyConflict => (
            Code::AlreadyExists,
            Reason::KeyConflict,
            "idempotency key already used with another command; its record is untouched".into(),
        ),
        ErrorReason::ClaimConflict => (
            Code::AlreadyExists,
            Reason::KeyConflict,
            "claim key already claimed with another fingerprint; its record is untouched".into(),
        ),
        ErrorReason::ResponseDiscarded { floor } => {
            detail.floor = floor;
            (
                Code::OutOfRange,
                Reason::ResponseDiscarded,
                format!("seq below the acknowledged floor {floor}"),
            )
        }
        ErrorReason::InvalidArgument(why) => (Code::InvalidArgument, Reason::InvalidArgument, why),
        ErrorReason::FloorBeyondBound {
            first_outstanding_seq,
            bound_seq,
        } => {
            detail.floor_bound = bound_seq;
            let refusal = InvalidArgument::FloorBeyondBound {
                first_outstanding_seq,
                bound_seq,
            };
            (
                Code::InvalidArgument,
                Reason::InvalidArgument,
                refusal.to_string(),
            )
        }
        ErrorReason::LimitExceeded(exceeded) => {
            detail.limit = exceeded.limit.to_string();
            detail.limit_max = exceeded.max;
            detail.limit_requested = exceeded.requested;
            (
                Code::InvalidArgument,
                Reason::LimitExceeded,
                format!("{exceeded}; final: nothing was executed, fix the request"),
            )
        }
        ErrorReason::Unauthenticated(why) => (Code::Unauthenticated, Reason::Unauthenticated, why),
        ErrorReason::PermissionDenied(why) => {
            (Code::PermissionDenied, Reason::PermissionDenied, why)
        }
        ErrorReason::Fenced { current_fence } => {
            detail.current_fence = current_fence;
            (
                Code::FailedPrecondition,
                Reason::Fenced,
                taken_over_message(current_fence),
            )
        }
        ErrorReason::FinishedUnderThisFence { fence } => {
            detail.current_fence = fence;
            (
                Code::FailedPrecondition,
                Reason::Fenced,
                finished_claim_message(fence),
            )
        }
        ErrorReason::NotCaughtUp {
            node_id,
            log_index,
            waited,
            added: true,
        } => (
            Code::DeadlineExceeded,
            Reason::NotCaughtUp,
            format!(
                "node {node_id} was added as a learner but has not caught up to index \
                 {log_index} within {waited:?}; it keeps catching up"
            ),
        ),
        ErrorReason::NotCaughtUp {
            node_id,
            log_index,
            waited,
            added: false,
        } => (
            Code::Unavailable,
            Reason::NotCaughtUp,
            format!(
                "node {node_id} has not caught up to index {log_index} within {waited:?}: \
                 nothing was changed"
            ),
        ),
    };
    detail.reason = wire_reason as i32;
    let mut status = tonic::Status::with_details(code, message, detail.encode_to_vec().into());
    if let Ok(value) = wire_reason.as_str_name().parse() {
        status.metadata_mut().insert(REASON_METADATA_KEY, value);
    }
    status
}

/// `INVALID_ARGUMENT` (final): the request as sent is malformed.
pub fn invalid(why: impl Into<String>) -> tonic::Status {
    reason_status(ErrorReason::InvalidArgument(why.into()))
}

/// A wire message that did not convert is malformed input.
pub fn convert_status(error: ConvertError) -> tonic::Status {
    invalid(error.to_string())
}

/// The status of an applied outcome that is not a result: the registry's
/// refusal. Anything else here is a bug of the caller (`INTERNAL`).
pub fn rejected(outcome: Outcome) -> tonic::Status {
    match outcome {
        Outcome::Rejected(rejection) => reason_status(rejection.into()),
        other => tonic::Status::internal(format!("unexpected outcome {other:?}")),
    }
}

/// The words of a `FENCED` whose fence is not the caller's: a later claim
/// took over (or the record is gone, fence 0). Shared by the gRPC status
/// and the HTTP API, as [`finished_claim_message`] is.
pub fn taken_over_message(current_fence: u64) -> String {
    format!(
        "fenced: this fence no longer holds the key (its fence is now {current_fence}); nothing \
         was recorded — the new holder owns the effect"
    )
}

/// The one wording of FENCED under the caller's own fence (its claim is
/// finished), for the gRPC status and the HTTP API alike.
pub fn finished_claim_message(fence: u64) -> String {
    format!(
        "fenced: the claim of fence {fence} is finished already (released, or completed: a \
         result other than the one recorded does not replace it); this call changed nothing"
    )
}

/// A claim call's refusal: as [`rejected`], but worded for claims where
/// the generic words would mislead. `KEY_CONFLICT` names the fingerprint,
/// and a `FENCED` naming `fence` itself — the caller's own fence still
/// holds the key, but its claim is completed or released — says so
/// instead of pointing at a new holder there is none of.
pub fn rejected_claim(outcome: Outcome, fence: Option<u64>) -> tonic::Status {
    match outcome {
        Outcome::Rejected(Rejection::KeyConflict) => reason_status(ErrorReason::ClaimConflict),
        Outcome::Rejected(Rejection::Fenced { fence: current })
            if current != 0 && Some(current) == fence =>
        {
            reason_status(ErrorReason::FinishedUnderThisFence { fence: current })
        }
        other => rejected(other),
    }
}

/// The cluster id a request names (`bytes`, empty when the caller does not
/// know it yet; `required` when the request must name it), checked against
/// `ours` (the node's, once it knows one): an id other than ours is refused
/// at once with `WRONG_CLUSTER`, since it can never become right (rule 16).
pub fn check_cluster(
    ours: Option<ClusterId>,
    bytes: &[u8],
    required: bool,
) -> Result<Option<ClusterId>, tonic::Status> {
    let claimed = parse_cluster_id(bytes).map_err(|error| invalid(error.to_string()))?;
    if required && claimed.is_none() {
        return Err(invalid("cluster_id is required"));
    }
    if let (Some(ours), Some(theirs)) = (ours, claimed)
        && ours != theirs
    {
        return Err(reason_status(ErrorReason::WrongCluster(ours)));
    }
    Ok(claimed)
}

/// [`check_cluster`] for a request that must name the cluster.
pub fn required_cluster(ours: Option<ClusterId>, bytes: &[u8]) -> Result<ClusterId, tonic::Status> {
    check_cluster(ours, bytes, true)?.ok_or_else(|| invalid("cluster_id is required"))
}

/// Whether `status` refuses a floor beyond what the session may fence
/// (`ErrorDetail.floor_bound` set): the session is unusable to its client.
pub fn refuses_floor_bound(status: &tonic::Status) -> bool {
    error_detail(status)
        .is_some_and(|detail| detail.reason() == Reason::InvalidArgument && detail.floor_bound > 0)
}

/// Reads the `ErrorDetail` of a status produced by [`reason_status`];
/// `None` for any other status (a transport failure, say).
pub fn error_detail(status: &tonic::Status) -> Option<ErrorDetail> {
    ErrorDetail::decode(status.details())
        .ok()
        .filter(|detail| detail.reason() != Reason::Unspecified)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason survives the trip through a status, with its code.
    #[test]
    fn reasons_round_trip() {
        let cases = [
            (
                ErrorReason::NotLeader {
                    leader_id: Some(2),
                    leader_client_addr: Some("127.0.0.1:7102".into()),
                    nothing_proposed: false,
                },
                Code::Unavailable,
                Reason::NotLeader,
            ),
            (
                ErrorReason::SessionExpired,
                Code::NotFound,
                Reason::SessionExpired,
            ),
            (
                ErrorReason::SeqConflict,
                Code::AlreadyExists,
                Reason::SeqConflict,
            ),
            (
                ErrorReason::KeyConflict,
                Code::AlreadyExists,
                Reason::KeyConflict,
            ),
            (
                ErrorReason::ResponseDiscarded { floor: 4 },
                Code::OutOfRange,
                Reason::ResponseDiscarded,
            ),
            (
                ErrorReason::WrongCluster(ClusterId(9)),
                Code::FailedPrecondition,
                Reason::WrongCluster,
            ),
            (
                ErrorReason::LimitExceeded(LimitExceeded {
                    limit: Limit::ValueBytes,
                    max: 65_536,
                    requested: 65_537,
                }),
                Code::InvalidArgument,
                Reason::LimitExceeded,
            ),
            (
                ErrorReason::Unauthenticated("no credentials".into()),
                Code::Unauthenticated,
                Reason::Unauthenticated,
            ),
            (
                ErrorReason::PermissionDenied("role client".into()),
                Code::PermissionDenied,
                Reason::PermissionDenied,
            ),
            (
                ErrorReason::Fenced { current_fence: 9 },
                Code::FailedPrecondition,
                Reason::Fenced,
            ),
            (
                ErrorReason::FinishedUnderThisFence { fence: 9 },
                Code::FailedPrecondition,
                Reason::Fenced,
            ),
            (
                ErrorReason::ClaimConflict,
                Code::AlreadyExists,
                Reason::KeyConflict,
            ),
            (
                ErrorReason::NotCaughtUp {
                    node_id: 4,
                    log_index: 9,
                    waited: std::time::Duration::from_secs(5),
                    added: true,
                },
                Code::DeadlineExceeded,
                Reason::NotCaughtUp,
            ),
            (
                ErrorReason::NotCaughtUp {
                    node_id: 4,
                    log_index: 9,
                    waited: std::time::Duration::from_secs(5),
                    added: false,
                },
                Code::Unavailable,
                Reason::NotCaughtUp,
            ),
        ];
        for (reason, code, wire) in cases {
            let status = reason_status(reason);
            assert_eq!(status.code(), code);
            let detail = error_detail(&status).expect("detail");
            assert_eq!(detail.reason(), wire);
            assert_eq!(
                status.metadata().get(REASON_METADATA_KEY).unwrap(),
                wire.as_str_name()
            );
        }
    }

    /// A cluster id is optional or required, malformed input when neither
    /// empty nor 16 bytes, and refused at once when it is not ours.
    /// A claim's refusals are worded for claims: a conflict names the
    /// fingerprint, and a FENCED naming the caller's own (non-zero) fence
    /// says its claim is finished; any other fence keeps the generic words.
    #[test]
    fn claim_refusals_are_worded_for_claims() {
        let conflict = rejected_claim(Outcome::Rejected(Rejection::KeyConflict), None);
        assert_eq!(conflict.code(), Code::AlreadyExists);
        assert!(conflict.message().contains("fingerprint"), "{conflict:?}");
        let fenced = |current, own| {
            rejected_claim(
                Outcome::Rejected(Rejection::Fenced { fence: current }),
                Some(own),
            )
        };
        let finished = fenced(5, 5);
        assert_eq!(finished.code(), Code::FailedPrecondition);
        let detail = error_detail(&finished).expect("detail");
        assert_eq!((detail.reason(), detail.current_fence), (Reason::Fenced, 5));
        assert!(
            finished.message().contains("finished already"),
            "{finished:?}"
        );
        for (current, own) in [(7, 5), (0, 0)] {
            let taken = fenced(current, own);
            assert!(taken.message().contains("new holder"), "{taken:?}");
            assert_eq!(error_detail(&taken).unwrap().current_fence, current);
        }
    }

    #[test]
    fn cluster_ids_are_checked_once() {
        let ours = ClusterId(7);
        let bytes = crate::convert::cluster_id_bytes(Some(ours));
        assert_eq!(check_cluster(Some(ours), &bytes, true).unwrap(), Some(ours));
        assert_eq!(check_cluster(None, &bytes, false).unwrap(), Some(ours));
        assert_eq!(check_cluster(Some(ours), &[], false).unwrap(), None);
        assert_eq!(required_cluster(Some(ours), &bytes).unwrap(), ours);
        let reason = |status: tonic::Status| error_detail(&status).unwrap().reason();
        assert_eq!(
            reason(check_cluster(Some(ours), &[], true).unwrap_err()),
            Reason::InvalidArgument
        );
        assert_eq!(
            reason(required_cluster(None, &[1, 2, 3]).unwrap_err()),
            Reason::InvalidArgument
        );
        let other = crate::convert::cluster_id_bytes(Some(ClusterId(8)));
        let wrong = check_cluster(Some(ours), &other, false).unwrap_err();
        assert_eq!(wrong.code(), Code::FailedPrecondition);
        assert_eq!(
            error_detail(&wrong).unwrap().expected_cluster_id,
            bytes,
            "names the node's cluster"
        );
    }

    /// A floor beyond the bound is an INVALID_ARGUMENT marked with the
    /// bound, so a client can tell it from any other malformed input.
    #[test]
    fn floor_beyond_bound_is_marked() {
        let refused: ErrorReason = Rejection::InvalidArgument(InvalidArgument::FloorBeyondBound {
            first_outstanding_seq: 9,
            bound_seq: 3,
        })
        .into();
        let status = reason_status(refused);
        assert_eq!(status.code(), Code::InvalidArgument);
        let detail = error_detail(&status).expect("detail");
        assert_eq!(
            (detail.reason(), detail.floor_bound),
            (Reason::InvalidArgument, 3)
        );
        assert!(refuses_floor_bound(&status));
        assert!(
            status
                .message()
                .contains("beyond what this session may fence")
        );
        let other: ErrorReason = Rejection::InvalidArgument(InvalidArgument::FloorAboveSeq {
            seq: 1,
            first_outstanding_seq: 2,
        })
        .into();
        assert!(!refuses_floor_bound(&reason_status(other)));
    }

    /// A limit the request breaks travels with its name, value and what
    /// the request needed.
    #[test]
    fn limit_exceeded_names_the_limit() {
        let status = reason_status(ErrorReason::LimitExceeded(LimitExceeded {
            limit: Limit::ValueBytes,
            max: 65_536,
            requested: 65_537,
        }));
        let detail = error_detail(&status).expect("detail");
        assert_eq!(
            (
                detail.limit.as_str(),
                detail.limit_max,
                detail.limit_requested
            ),
            ("value_bytes_max", 65_536, 65_537)
        );
        assert!(status.message().contains("value_bytes_max"));
    }
}
