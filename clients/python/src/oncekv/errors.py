"""The errors of the oncekv client: one exception class per wire reason
(proto/oncekv.proto, "ERRORS"), plus the outcomes only a client can name
(an unknown outcome, a claim still in progress, a result not recorded).

Every error has `.may_have_taken_effect`. It is True only for
`OutcomeUnknown` (and its subclasses) and `ResultNotRecorded`: the request
may or may not have executed. Every other error means that nothing was
executed by the call that raised it.

This module decides nothing about retries: it names refusals. Which
refusals are retried, and when a final refusal becomes an unknown outcome
(rule 22), is the client's (`oncekv.client`).
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "OncekvError",
    "NotLeader",
    "Unavailable",
    "TooManyOutstanding",
    "ResourceExhausted",
    "SessionExpired",
    "WrongCluster",
    "SeqConflict",
    "ResponseDiscarded",
    "InvalidArgument",
    "LimitExceeded",
    "Unauthenticated",
    "PermissionDenied",
    "KeyConflict",
    "Fenced",
    "OutcomeUnknown",
    "KeyOutcomeUnknown",
    "PlainOutcomeUnknown",
    "ClaimInProgress",
    "ResultNotRecorded",
    "CommandError",
    "WrongType",
    "IncrementOverflow",
    "REASON_ERRORS",
]


class OncekvError(Exception):
    """Base class of every error the client raises.

    Attributes:
        reason: the wire reason (``"KEY_CONFLICT"``, ...) when a node named
            one, else None.
        final: True when the refusal is final for the request it answers
            (a later attempt gets the same answer); False for a "this
            attempt" refusal.
        may_have_taken_effect: whether the request may have executed.
        detail: the node's ``ErrorDetail`` message, when it sent one.
    """

    reason: Optional[str] = None
    final: bool = True
    may_have_taken_effect: bool = False

    def __init__(self, message: str = "", *, detail=None):
        super().__init__(message)
        self.message = message
        self.detail = detail

    @property
    def kind(self) -> str:
        """The error's stable name, as the Rust CLI's ``--json`` ``kind``."""
        return _KINDS.get(type(self), "error")


# ---- "this attempt" reasons: the client retries them until the deadline ----


class NotLeader(OncekvError):
    """NOT_LEADER: the node is not the leader; `leader_client_addr` names the
    leader when the node knows it. Retried by the client (it follows the
    hint); never raised by the high-level calls."""

    reason = "NOT_LEADER"
    final = False

    @property
    def leader_client_addr(self) -> str:
        return self.detail.leader_client_addr if self.detail is not None else ""


class Unavailable(OncekvError):
    """UNAVAILABLE: no quorum, an election, an overloaded node, or the cluster
    could not be reached before the deadline. Raised by a call only when
    nothing of it can have executed: a read, `execute_plain` with no
    attempt that may have reached a leader, a call that could not learn
    the cluster's id or register its session, a session's window that
    stayed full. A change sent and out of time raises `OutcomeUnknown`,
    even when every connection was refused (as in the Rust client)."""

    reason = "UNAVAILABLE"
    final = False


class TooManyOutstanding(OncekvError):
    """TOO_MANY_OUTSTANDING: the seq is beyond the session's in-flight window.
    The client keeps its seqs within the window, so a call never raises it."""

    reason = "TOO_MANY_OUTSTANDING"
    final = False


class ResourceExhausted(OncekvError):
    """RESOURCE_EXHAUSTED: a replicated capacity limit (`limit`) stayed reached
    until the deadline; nothing was executed. Back off; operator action."""

    reason = "RESOURCE_EXHAUSTED"
    final = False

    @property
    def limit(self) -> str:
        return self.detail.limit if self.detail is not None else ""


# ---- final reasons ----------------------------------------------------------


class SessionExpired(OncekvError):
    """SESSION_EXPIRED: the session is unknown or expired; the request was not
    executed. The next call registers a new session (nothing is re-sent)."""

    reason = "SESSION_EXPIRED"


class WrongCluster(OncekvError):
    """WRONG_CLUSTER: the node belongs to another cluster (`expected`, hex)."""

    reason = "WRONG_CLUSTER"

    @property
    def expected(self) -> str:
        return self.detail.expected_cluster_id.hex() if self.detail is not None else ""


class SeqConflict(OncekvError):
    """SEQ_CONFLICT: the seq was used with another command (a client bug)."""

    reason = "SEQ_CONFLICT"

    def __init__(self, message: str = "", *, detail=None, seq: int = 0):
        super().__init__(message, detail=detail)
        self.seq = seq


class ResponseDiscarded(OncekvError):
    """RESPONSE_DISCARDED: the seq is below the session's acknowledged floor
    (a client bug or a fenced request)."""

    reason = "RESPONSE_DISCARDED"

    def __init__(self, message: str = "", *, detail=None, seq: int = 0):
        super().__init__(message, detail=detail)
        self.seq = seq

    @property
    def floor(self) -> int:
        return self.detail.floor if self.detail is not None else 0


class InvalidArgument(OncekvError, ValueError):
    """INVALID_ARGUMENT: malformed input (an empty key, a value of the wrong
    Python type, a field out of its bounds); also a `ValueError`."""

    reason = "INVALID_ARGUMENT"


class LimitExceeded(OncekvError):
    """LIMIT_EXCEEDED: the request itself breaks a replicated limit (`limit`
    = `limit_max`, it needs `limit_requested`): a key, value or list too
    large, a claim key or result too large; or, found by the client before
    sending, gRPC's message limit (`grpc_message_bytes_max`, 8 MiB
    encoded). It can never succeed as sent; nothing was executed."""

    reason = "LIMIT_EXCEEDED"

    def __init__(self, message: str = "", *, detail=None, limit: str = "", limit_max: int = 0,
                 limit_requested: int = 0):
        super().__init__(message, detail=detail)
        if detail is not None:
            limit = limit or detail.limit
            limit_max = limit_max or detail.limit_max
            limit_requested = limit_requested or detail.limit_requested
        self.limit = limit
        self.limit_max = limit_max
        self.limit_requested = limit_requested


class Unauthenticated(OncekvError):
    """UNAUTHENTICATED: no or unknown credentials (fix `token=`, `ca=`)."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(OncekvError):
    """PERMISSION_DENIED: the principal may not do this (its role, or a
    session or key of another principal)."""

    reason = "PERMISSION_DENIED"


class KeyConflict(OncekvError):
    """KEY_CONFLICT: the idempotency key (or claim key) was used before with
    another command (another fingerprint); nothing executed. A caller bug,
    or a key reused for new work: never retry with the same key."""

    reason = "KEY_CONFLICT"

    def __init__(self, message: str = "", *, detail=None, key: bytes = b""):
        super().__init__(message, detail=detail)
        self.key = key


class Fenced(OncekvError):
    """FENCED: a claim's complete, extend or release by a holder whose fence
    no longer holds the key (a later claim took over after its lease ran
    out, or it had released it). Nothing was recorded. Stop: the new holder
    owns the effect."""

    reason = "FENCED"

    @property
    def current_fence(self) -> int:
        return self.detail.current_fence if self.detail is not None else 0


# ---- outcomes only the client can name --------------------------------------


class OutcomeUnknown(OncekvError):
    """The request may or may not have executed: the deadline passed (a
    change out of time is unknown whatever its attempts met, as in the
    Rust client), or a retry was refused for good after an attempt that
    may have reached a leader (rule 22). For a session request, the client fences the
    seq (moves its floor past it) so that a late copy never executes;
    `fenced` says whether that fence is committed (when False, the next
    request of the session carries it).

    Attributes: `seq` (0 for requests without one), `fenced`, and `cause`:
    the most informative failure seen (an `OncekvError`), when there is one.
    """

    final = True
    may_have_taken_effect = True

    def __init__(self, message: str = "", *, seq: int = 0, fenced: bool = False, cause=None,
                 detail=None):
        super().__init__(message, detail=detail)
        self.seq = seq
        self.fenced = fenced
        self.cause = cause

    @property
    def reason(self) -> Optional[str]:  # type: ignore[override]
        return getattr(self.cause, "reason", None)

    def __str__(self) -> str:
        text = super().__str__()
        if self.seq:
            text += ("; the seq is fenced: no copy of it can execute any more" if self.fenced
                     else "; the seq is not fenced yet: the session's next request carries the fence")
        return text


class KeyOutcomeUnknown(OutcomeUnknown):
    """`execute_with_key` or a claim call: the outcome is unknown, but it can be
    learnt: call again with the same key (and the same command) while the
    key lives; a duplicate answer is the original result."""

    def __init__(self, message: str = "", *, key: bytes = b"", cause=None):
        super().__init__(message, cause=cause)
        self.key = key


class PlainOutcomeUnknown(OutcomeUnknown):
    """`execute_plain` (at-least-once, no session, no key): an attempt may have
    executed, and may still; nothing can fence it."""


class ClaimInProgress(OncekvError):
    """Another holder's lease on the key was still live when the caller's
    patience (`wait`) ran out. Nothing ran; claim again after
    `retry_after_ms`."""

    final = False

    def __init__(self, message: str = "", *, retry_after_ms: int = 0, attempt: int = 0):
        super().__init__(message)
        self.retry_after_ms = retry_after_ms
        self.attempt = attempt


class ResultNotRecorded(OncekvError):
    """`once`: the handler ran (its effect may have happened) but its result
    was not recorded: `error` is `Fenced` (another holder took over after
    this one's lease ran out: the downstream must refuse this holder's
    fence), an `OutcomeUnknown` (calling `once` again with the key learns
    it), or the exception the encoder raised. `result` is what the handler
    returned."""

    may_have_taken_effect = True

    def __init__(self, message: str = "", *, result=None, error: Optional[BaseException] = None,
                 fence: int = 0, attempt: int = 0):
        super().__init__(message)
        self.result = result
        self.error = error
        self.fence = fence
        self.attempt = attempt

    @property
    def fenced(self) -> bool:
        return isinstance(self.error, Fenced)


# ---- application results that a typed call turns into errors ---------------


class CommandError(OncekvError):
    """A command executed (its result is cached and replayed like any other)
    but its result is not what the typed call returns: nothing changed."""


class WrongType(CommandError):
    """The key holds a value of another type (`actual`: "bytes", "int",
    "list")."""

    def __init__(self, message: str = "", *, actual: str = ""):
        super().__init__(message)
        self.actual = actual


class IncrementOverflow(CommandError):
    """The increment would overflow a signed 64-bit integer; `current` is the
    value, unchanged."""

    def __init__(self, message: str = "", *, current: int = 0):
        super().__init__(message)
        self.current = current


#: The class of each wire reason.
REASON_ERRORS = {
    cls.reason: cls
    for cls in (
        NotLeader,
        Unavailable,
        TooManyOutstanding,
        ResourceExhausted,
        SessionExpired,
        WrongCluster,
        SeqConflict,
        ResponseDiscarded,
        InvalidArgument,
        LimitExceeded,
        Unauthenticated,
        PermissionDenied,
        KeyConflict,
        Fenced,
    )
}

_KINDS = {
    OutcomeUnknown: "outcome_unknown",
    KeyOutcomeUnknown: "outcome_unknown",
    PlainOutcomeUnknown: "outcome_unknown",
    NotLeader: "unavailable",
    Unavailable: "unavailable",
    TooManyOutstanding: "unavailable",
    ResourceExhausted: "resource_exhausted",
    SessionExpired: "session_expired",
    WrongCluster: "wrong_cluster",
    SeqConflict: "seq_conflict",
    ResponseDiscarded: "response_discarded",
    InvalidArgument: "invalid_argument",
    LimitExceeded: "limit_exceeded",
    Unauthenticated: "unauthenticated",
    PermissionDenied: "permission_denied",
    KeyConflict: "key_conflict",
    Fenced: "fenced",
    ClaimInProgress: "in_progress",
    ResultNotRecorded: "not_recorded",
    WrongType: "wrong_type",
    IncrementOverflow: "overflow",
}
