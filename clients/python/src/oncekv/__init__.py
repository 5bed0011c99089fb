"""oncekv: the Python client of oncekv, a replicated exactly-once service on
Raft. See clients/python/README.md.

    import oncekv
    client = oncekv.Client(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])
    balance = client.increment("balance", 5)   # exactly once, or OutcomeUnknown
"""

from .aio import AsyncClient
from .claims import Completed, InProgress, Once, OnceRun, Won, current_claim
from .client import AttemptEvent, Client, KeyedReply
from .commands import (
    Append,
    Appended,
    Command,
    CompareAndSwap,
    CompareAndSwapped,
    Delete,
    Deleted,
    Increment,
    Incremented,
    Overflowed,
    Put,
    Result,
    Stored,
    WrongTypeResult,
)
from .errors import (
    REASON_ERRORS,
    ClaimInProgress,
    CommandError,
    Fenced,
    IncrementOverflow,
    InvalidArgument,
    KeyConflict,
    KeyOutcomeUnknown,
    LimitExceeded,
    NotLeader,
    OncekvError,
    OutcomeUnknown,
    PermissionDenied,
    PlainOutcomeUnknown,
    ResourceExhausted,
    ResponseDiscarded,
    ResultNotRecorded,
    SeqConflict,
    SessionExpired,
    TooManyOutstanding,
    Unauthenticated,
    Unavailable,
    WrongCluster,
    WrongType,
)
from .policy import Backoff

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "KeyedReply",
    "AttemptEvent",
    "Backoff",
    "Once",
    "OnceRun",
    "Won",
    "InProgress",
    "Completed",
    "current_claim",
    "Command",
    "Put",
    "Delete",
    "Increment",
    "Append",
    "CompareAndSwap",
    "Result",
    "Stored",
    "Deleted",
    "Incremented",
    "Overflowed",
    "Appended",
    "CompareAndSwapped",
    "WrongTypeResult",
    # oncekv.errors (a test keeps this list equal to its __all__)
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
