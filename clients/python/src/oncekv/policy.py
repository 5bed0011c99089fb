"""Leader following and retries, as the Rust library's `policy.rs` and
`retry.rs` have them: what a failed attempt means (`Failure.verdict`: retry
this attempt, at the leader a NOT_LEADER names if it names one, or stop),
where the next attempt goes (`Leader.follow`: the hinted leader at once,
else the next endpoint in turn after a jittered backoff; the same node
again after a refusal only the leader makes, `Failure.refused_by_leader`),
whether a failed attempt may have reached a leader that applies it (rule
22), and which of a call's failures says most about why it could not
complete (`Failure.informativeness`, `Failures`).

Pure apart from the jitter: it sends nothing and never changes a request
between attempts; what a refusal means for seqs, floors and unknown
outcomes is the client's.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import List, Optional

import grpc

from . import errors
from ._proto import oncekv_pb2 as pb

#: How many endpoints learnt from hints are kept beside the ones given.
LEARNT_ENDPOINTS_MAX = 8

#: The metadata entries a node sends with every refusal.
DETAILS_METADATA_KEY = "grpc-status-details-bin"
REASON_METADATA_KEY = "oncekv-reason"

# Phrases of grpc's own errors when no connection could be made: the
# request was never sent.
_NOT_SENT_PHRASES = (
    "failed to connect to all addresses",
    "connection refused",
    "dns resolution failed",
    "name resolution failure",
)


@dataclass
class Failure:
    """One failed attempt: the gRPC status code, its message, and the
    node's `ErrorDetail` when it sent one (None for a failure below the
    service: a refused or broken connection, a deadline)."""

    code: grpc.StatusCode
    message: str
    detail: Optional[pb.ErrorDetail] = None

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "Failure":
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = error.details() if hasattr(error, "details") else str(error)
        detail = None
        metadata = ()
        try:
            metadata = error.trailing_metadata() or ()
        except Exception:  # an error raised without a call behind it
            metadata = ()
        reason_name = None
        for key, value in metadata:
            if key == DETAILS_METADATA_KEY and isinstance(value, bytes):
                try:
                    parsed = pb.ErrorDetail.FromString(value)
                except Exception:
                    parsed = None
                if parsed is not None and parsed.reason != pb.REASON_UNSPECIFIED:
                    detail = parsed
            elif key == REASON_METADATA_KEY:
                reason_name = value
        if detail is None and reason_name in pb.Reason.keys() and reason_name != "REASON_UNSPECIFIED":
            detail = pb.ErrorDetail(reason=pb.Reason.Value(reason_name))
        return cls(code=code or grpc.StatusCode.UNKNOWN, message=message or "", detail=detail)

    @classmethod
    def not_leader(cls, hint: str) -> "Failure":
        """NOT_LEADER pointing at `hint` (empty: no leader known)."""
        return cls(
            code=grpc.StatusCode.UNAVAILABLE,
            message="not the leader" + (f"; the leader is at {hint}" if hint else ""),
            detail=pb.ErrorDetail(reason=pb.NOT_LEADER, leader_client_addr=hint),
        )

    @property
    def reason(self) -> Optional[str]:
        """The wire reason's name, or None without a detail."""
        if self.detail is None:
            return None
        return pb.Reason.Name(self.detail.reason)

    def retry_hint(self):
        """`(True, hint)` when an attempt of the same request may succeed
        (hint: the leader's address a NOT_LEADER names, else None);
        `(False, None)` when the refusal is final."""
        reason = self.reason
        if reason is not None:
            if reason == "NOT_LEADER":
                return True, (self.detail.leader_client_addr or None)
            if reason in ("UNAVAILABLE", "TOO_MANY_OUTSTANDING", "RESOURCE_EXHAUSTED"):
                return True, None
            return False, None
        if self.code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.UNKNOWN,
        ):
            return True, None
        return False, None

    def refused_by_leader(self) -> bool:
        """Whether this is the registry's refusal of the attempt when its
        entry applied — a capacity limit (RESOURCE_EXHAUSTED) or the window
        (TOO_MANY_OUTSTANDING): only the node that leads answers so, so the
        next attempt goes to it again, after a backoff, rather than on to
        another endpoint (a follower would only send it back, and one that
        does not answer would hide the refusal behind its timeout)."""
        return self.reason in ("RESOURCE_EXHAUSTED", "TOO_MANY_OUTSTANDING")

    def never_sent(self) -> bool:
        """Whether grpc could not connect at all (nothing was sent)."""
        if self.detail is not None or self.code != grpc.StatusCode.UNAVAILABLE:
            return False
        text = self.message.lower()
        return any(phrase in text for phrase in _NOT_SENT_PHRASES)

    def may_have_reached(self) -> bool:
        """Whether this failed attempt of a change may have reached a leader
        that applies it, now or later (rule 22). Only three failures prove
        it did not: a refusal the registry made when the attempt's entry
        applied (TOO_MANY_OUTSTANDING, RESOURCE_EXHAUSTED), a NOT_LEADER
        whose node says it proposed nothing (`nothing_proposed`), and a
        connection that could not be made (nothing sent). A timeout, a
        broken connection, UNAVAILABLE, any other NOT_LEADER (a node also
        answers it after appending the entry, when a leader change drops
        it) may have."""
        reason = self.reason
        if reason == "NOT_LEADER":
            return not self.detail.nothing_proposed
        if reason is not None:
            return reason not in ("TOO_MANY_OUTSTANDING", "RESOURCE_EXHAUSTED")
        return not self.never_sent()

    def may_have_applied(self) -> bool:
        """The looser judgement of idempotent and admin calls: the node said
        it could not answer in time, or the answer never came."""
        if self.detail is not None:
            return self.reason == "UNAVAILABLE"
        return self.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)

    def informativeness(self) -> int:
        """How much this failure tells about why a call could not complete:
        the registry's own refusal of the attempt (a capacity limit, the
        window) most, a node saying why it cannot serve next, then
        NOT_LEADER, a failure below the service least."""
        reason = self.reason
        if reason in ("RESOURCE_EXHAUSTED", "TOO_MANY_OUTSTANDING"):
            return 3
        if reason == "NOT_LEADER":
            return 1
        if reason is not None:
            return 2
        return 0

    def text(self) -> str:
        if self.detail is not None:
            return self.message
        return f"{self.code.name}: {self.message}"

    def error(self, seq: int = 0, key: bytes = b"") -> Optional[errors.OncekvError]:
        """The error class of this failure's reason, or None without one."""
        reason = self.reason
        if reason is None:
            return None
        cls = errors.REASON_ERRORS.get(reason)
        if cls is None:
            return errors.InvalidArgument(self.message, detail=self.detail)
        if cls in (errors.SeqConflict, errors.ResponseDiscarded):
            return cls(self.message, detail=self.detail, seq=seq)
        if cls is errors.KeyConflict:
            return cls(self.message, detail=self.detail, key=key)
        return cls(self.message, detail=self.detail)

    def refuses_floor_bound(self) -> bool:
        """INVALID_ARGUMENT for a floor beyond what the session may fence:
        the session is unusable."""
        return self.reason == "INVALID_ARGUMENT" and self.detail.floor_bound > 0

    def __str__(self) -> str:
        return self.text()


def refused_after_send(error) -> str:
    """The reason of an unknown outcome whose last attempt was refused for
    good (`error`) after an earlier one that may have been applied."""
    return f"a retry was refused ({error}) after an earlier attempt that may have been applied"


# An attempt given less than this (seconds) before the deadline would be cut
# off in flight: a loopback round trip with the leader's and a follower's
# fdatasync takes about a millisecond, tens on a loaded machine — or less
# than twice the slowest attempt of the call so far, whichever is more.
MIN_ATTEMPT_TIME = 0.020


class Failures:
    """The failed attempts of one call, so that an unknown outcome reports
    the most informative reason seen, and the last one when it differs."""

    def __init__(self) -> None:
        self.best: Optional[Failure] = None
        self.last: Optional[Failure] = None
        self.count = 0
        # The latest refusal by a capacity limit, if any.
        self.exhausted: Optional[Failure] = None
        # When the attempt in flight started, if known (from the second
        # attempt on), and the slowest attempt measured (seconds).
        self.attempt_started: Optional[float] = None
        self.slowest_attempt = 0.0

    def note(self, failure: Failure) -> None:
        if self.attempt_started is not None:
            self.slowest_attempt = max(self.slowest_attempt,
                                       time.monotonic() - self.attempt_started)
            self.attempt_started = None
        if self.best is None or failure.informativeness() >= self.best.informativeness():
            self.best = failure
        self.last = failure
        self.count += 1
        if failure.reason == "RESOURCE_EXHAUSTED":
            self.exhausted = failure

    def exhausted_before_any_reach(self, reached: bool) -> Optional[errors.OncekvError]:
        """For a call out of time: when a capacity limit refused its
        attempts and none may have reached a leader, nothing ran, and the
        caller is told the limit (`ResourceExhausted`) instead of "unknown"
        or "unavailable". None otherwise."""
        if reached or self.exhausted is None:
            return None
        return self.exhausted.error()

    def exhausted_and_out_of_time(self, reached: bool, deadline: float,
                                  now: float) -> Optional[errors.OncekvError]:
        """After the backoff, right before the next attempt: the same, when
        too little time is left for another attempt (MIN_ATTEMPT_TIME, or
        twice the slowest attempt so far), which the deadline would likely
        cut off in flight, turning "refused, nothing ran" into "unknown".
        Otherwise None, and the next attempt is timed from now."""
        if deadline - now >= max(MIN_ATTEMPT_TIME, 2 * self.slowest_attempt):
            self.attempt_started = time.monotonic()
            return None
        return self.exhausted_before_any_reach(reached)

    def reason(self) -> str:
        if self.best is None:
            return "no attempt was answered"
        best, last = self.best.text(), self.last.text()
        if best != last:
            return f"{best} (the last of {self.count} failed attempts: {last})"
        return best

    def cause(self) -> Optional[errors.OncekvError]:
        return self.best.error() if self.best is not None else None


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: before retry `attempt` (0 for
    the first) wait uniformly in [0, min(cap, base * 2**attempt)], never
    past the deadline. Low cap: after a leader crash the wait drawn just
    before the new leader appears adds directly to the failover time."""

    base: float = 0.010
    cap: float = 0.100

    def ceiling(self, attempt: int) -> float:
        return min(self.cap, self.base * (2 ** min(attempt, 20)))

    def delay(self, attempt: int, remaining: float, unit: Optional[float] = None) -> float:
        if unit is None:
            unit = random.random()
        unit = min(max(unit, 0.0), 1.0)
        return max(0.0, min(self.ceiling(attempt) * unit, remaining))


class Leader:
    """The endpoints a caller knows and the one it believes leads. Not
    thread-safe by itself: the client guards it with a lock."""

    def __init__(self, endpoints: List[str]):
        self.endpoints = list(endpoints)
        self.given = len(self.endpoints)
        self.leader = 0
        self.rotation = 0

    def target(self) -> Optional[str]:
        if not self.endpoints:
            return None
        return self.endpoints[self.leader % len(self.endpoints)]

    def follow(self, hint: Optional[str]) -> bool:
        """After a retryable failure: point at the hinted leader (learning it
        when unknown, the oldest learnt endpoint making room beyond
        LEARNT_ENDPOINTS_MAX) and return True when that is a new target
        worth trying at once. Without a hint, move on to the next endpoint
        in turn and return False (back off first)."""
        if hint:
            if hint in self.endpoints:
                index = self.endpoints.index(hint)
            else:
                if len(self.endpoints) - self.given >= LEARNT_ENDPOINTS_MAX:
                    self._forget_oldest_learnt()
                self.endpoints.append(hint)
                index = len(self.endpoints) - 1
            new_target = self.leader != index
            self.leader = index
            return new_target
        self.rotation = (self.rotation + 1) % max(len(self.endpoints), 1)
        self.leader = self.rotation
        return False

    def _forget_oldest_learnt(self) -> None:
        oldest = self.given
        if oldest >= len(self.endpoints):
            return
        del self.endpoints[oldest]
        count = max(len(self.endpoints), 1)

        def shift(index: int) -> int:
            return (index - 1 if index > oldest else index) % count

        self.leader = shift(self.leader)
        self.rotation = shift(self.rotation)
