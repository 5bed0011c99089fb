"""The key-value commands and their results, and the one conversion between
Python values and the wire's (proto/oncekv.proto: `Value`, `Command`,
`CommandResult`).

Keys are bytes (a `str` is taken as its UTF-8 bytes) and never empty.
Values are typed as on the wire: `bytes` (a `str` is stored as its UTF-8
bytes), a signed 64-bit `int`, or a list of bytes. Reads give back `bytes`,
`int` or `list` of `bytes`.

The `to_*` functions are the one check of what a caller passes to a public
call (a key, a value, a fence, a lease, a timeout): a wrong type or a value
out of range is `InvalidArgument`, raised before anything is sent.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Union

from . import errors
from ._proto import oncekv_pb2 as pb

__all__ = [
    "Put",
    "Delete",
    "Increment",
    "Append",
    "CompareAndSwap",
    "Stored",
    "Deleted",
    "Incremented",
    "Overflowed",
    "Appended",
    "CompareAndSwapped",
    "WrongTypeResult",
    "Command",
    "Result",
    "ValueType",
    "Data",
    "ValueLike",
]

#: A value as a read gives it back.
ValueType = Union[bytes, int, List[bytes]]
#: What a call takes as a key or bytes (a `str` is taken as its UTF-8 bytes).
Data = Union[bytes, bytearray, memoryview, str]
#: What a call takes as a value.
ValueLike = Union[Data, int, Sequence[Data]]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
#: The wire's hard bound on a key (the cluster's `key_bytes_max` is lower).
KEY_BYTES_HARD_MAX = 64 << 10
#: The wire's hard bound on an idempotency or claim key.
IDEMPOTENCY_KEY_BYTES_HARD_MAX = 4096


def to_bytes(data: Any, what: str = "key") -> bytes:
    """`data` as bytes: bytes-like as is, `str` as UTF-8."""
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as bad:  # a lone surrogate
            raise errors.InvalidArgument(
                f"{what} is not encodable as UTF-8 ({bad.reason} at index {bad.start})") from None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise errors.InvalidArgument(f"{what} must be bytes or str, not {type(data).__name__}")


def to_key(key: Any) -> bytes:
    """A data key: non-empty, within the wire's hard bound."""
    key = to_bytes(key, "key")
    if not key:
        raise errors.InvalidArgument("empty key: a key is at least one byte")
    if len(key) > KEY_BYTES_HARD_MAX:
        raise errors.InvalidArgument(
            f"key of {len(key)} bytes is beyond the hard bound of {KEY_BYTES_HARD_MAX}"
        )
    return key


def to_int(number: Any, what: str, low: int, high: int) -> int:
    """`number` as an int in [low, high]: an integer (not a bool)."""
    if isinstance(number, bool) or not isinstance(number, numbers.Integral):
        raise errors.InvalidArgument(f"{what} must be an int, not {type(number).__name__}")
    number = int(number)
    if not low <= number <= high:
        raise errors.InvalidArgument(f"{what} {number} is outside {low}..={high}")
    return number


def to_int64(number: Any, what: str = "integer") -> int:
    """A signed 64-bit integer (a delta, a value)."""
    return to_int(number, what, INT64_MIN, INT64_MAX)


def to_uint64(number: Any, what: str) -> int:
    """An unsigned 64-bit integer (a fence)."""
    return to_int(number, what, 0, UINT64_MAX)


def to_seconds(value: Any, what: str, *, zero_ok: bool = False) -> float:
    """A duration in seconds (a lease, a timeout, a wait): a finite int or
    float, positive (or zero when `zero_ok`)."""
    seconds = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float
            pass
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        kind = "a non-negative" if zero_ok else "a positive"
        raise errors.InvalidArgument(f"{what} is {kind} finite number of seconds, not {value!r}")
    return seconds


def to_command(command: Any) -> "Command":
    """`command` if it is one of the commands (`Put`, `Increment`, ...)."""
    if not isinstance(command, Command):
        raise errors.InvalidArgument(
            f"not a command (Put, Delete, Increment, Append, CompareAndSwap): {command!r}")
    return command


def value_to_proto(value: Any) -> pb.Value:
    """bytes/str → bytes, int → int (64-bit), list/tuple of bytes/str → list."""
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return pb.Value(bytes=to_bytes(value, "value"))
    if isinstance(value, int) and not isinstance(value, bool):
        return pb.Value(int=to_int64(value, "value"))
    if isinstance(value, (list, tuple)):
        return pb.Value(list=pb.ListValue(items=[to_bytes(item, "list item") for item in value]))
    raise errors.InvalidArgument(
        f"a value is bytes, str, int or a list of bytes, not {type(value).__name__}"
    )


def value_from_proto(value: Optional[pb.Value]) -> Optional[ValueType]:
    """A wire value as bytes, int or list of bytes; None when unset."""
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind == "bytes":
        return bytes(value.bytes)
    if kind == "int":
        return int(value.int)
    if kind == "list":
        return [bytes(item) for item in value.list.items]
    return None


def value_size_bytes(value: pb.Value) -> int:
    """The size charged against `value_bytes_max` (RequestLimits): bytes
    their length, an int 8, a list its elements' bytes plus 8 each."""
    kind = value.WhichOneof("kind")
    if kind == "bytes":
        return len(value.bytes)
    if kind == "int":
        return 8
    if kind == "list":
        return sum(len(item) + 8 for item in value.list.items)
    return 0


# ---- commands ---------------------------------------------------------------


class Command:
    """A command on the key-value store (deliberately not idempotent)."""

    key: bytes

    def to_proto(self) -> pb.Command:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_limits(self, limits: Optional[pb.RequestLimits]) -> None:
        """Raises `LimitExceeded` when the command breaks a request limit by
        itself (RequestLimits in proto/oncekv.proto); delete never does."""
        if limits is None:
            return
        _over("key_bytes_max", limits.key_bytes_max, len(self.key))


#: The largest request gRPC sends (oncekv-wire's CLIENT_MESSAGE_BYTES_MAX,
#: the node's bound too): beyond it grpc refuses to send, in the client.
MESSAGE_BYTES_MAX = 8 << 20


def check_message_size(request: Any) -> None:
    """Raises `LimitExceeded` (`grpc_message_bytes_max`) when `request`, a
    wire message, encodes to more than MESSAGE_BYTES_MAX: grpc would refuse
    to send it, so it is refused here, before anything is sent."""
    size = request.ByteSize()
    if size > MESSAGE_BYTES_MAX:
        raise errors.LimitExceeded(
            f"the request is {size} bytes encoded, beyond the gRPC message limit of "
            f"{MESSAGE_BYTES_MAX} bytes; nothing was sent",
            limit="grpc_message_bytes_max", limit_max=MESSAGE_BYTES_MAX, limit_requested=size)


def _over(limit: str, limit_max: int, requested: int) -> None:
    if requested > limit_max:
        raise errors.LimitExceeded(
            f"the request breaks the replicated limit {limit} = {limit_max} "
            f"(it needs {requested}); nothing was executed",
            limit=limit,
            limit_max=limit_max,
            limit_requested=requested,
        )


def _check_value(limits: pb.RequestLimits, value: pb.Value) -> None:
    _over("value_bytes_max", limits.value_bytes_max, value_size_bytes(value))
    if value.WhichOneof("kind") == "list":
        _over("list_elements_max", limits.list_elements_max, len(value.list.items))


@dataclass(init=False)
class Put(Command):
    """Stores `value` under `key`."""

    key: bytes
    value: pb.Value = field(repr=False)

    def __init__(self, key: Data, value: ValueLike) -> None:
        self.key = to_key(key)
        self.value = value_to_proto(value)

    def to_proto(self) -> pb.Command:
        return pb.Command(put=pb.Put(key=self.key, value=self.value))

    def check_limits(self, limits):
        super().check_limits(limits)
        if limits is not None:
            _check_value(limits, self.value)


@dataclass(init=False)
class Delete(Command):
    """Removes `key`; the result says whether it existed."""

    key: bytes

    def __init__(self, key: Data) -> None:
        self.key = to_key(key)

    def to_proto(self) -> pb.Command:
        return pb.Command(delete=pb.Delete(key=self.key))

    def check_limits(self, limits):
        return None


@dataclass(init=False)
class Increment(Command):
    """Adds `delta` to an integer (an absent key counts as 0)."""

    key: bytes
    delta: int

    def __init__(self, key: Data, delta: int = 1) -> None:
        self.key = to_key(key)
        self.delta = to_int64(delta, "delta")

    def to_proto(self) -> pb.Command:
        return pb.Command(increment=pb.Increment(key=self.key, delta=self.delta))


@dataclass(init=False)
class Append(Command):
    """Appends one element to a list (an absent key counts as empty)."""

    key: bytes
    element: bytes

    def __init__(self, key: Data, element: Data) -> None:
        self.key = to_key(key)
        self.element = to_bytes(element, "element")

    def to_proto(self) -> pb.Command:
        return pb.Command(append=pb.Append(key=self.key, element=self.element))

    def check_limits(self, limits):
        super().check_limits(limits)
        if limits is not None:
            _over("value_bytes_max", limits.value_bytes_max, len(self.element) + 8)
            _over("list_elements_max", limits.list_elements_max, 1)


@dataclass(init=False)
class CompareAndSwap(Command):
    """Stores `new` if the current value equals `expected` (None: the key
    must be absent)."""

    key: bytes
    expected: Optional[pb.Value] = field(repr=False)
    new: pb.Value = field(repr=False)

    def __init__(self, key: Data, expected: Optional[ValueLike], new: ValueLike) -> None:
        self.key = to_key(key)
        self.expected = None if expected is None else value_to_proto(expected)
        self.new = value_to_proto(new)

    def to_proto(self) -> pb.Command:
        cas = pb.CompareAndSwap(key=self.key, new_value=self.new)
        if self.expected is not None:
            cas.expected.CopyFrom(self.expected)
        return pb.Command(compare_and_swap=cas)

    def check_limits(self, limits):
        super().check_limits(limits)
        if limits is not None:
            _check_value(limits, self.new)


# ---- results ----------------------------------------------------------------


class Result:
    """A command's result (cached and replayed like any other: a failed
    compare-and-swap replays as failed)."""


@dataclass(frozen=True)
class Stored(Result):
    pass


@dataclass(frozen=True)
class Deleted(Result):
    existed: bool


@dataclass(frozen=True)
class Incremented(Result):
    value: int


@dataclass(frozen=True)
class Overflowed(Result):
    """The increment would overflow; nothing changed."""

    current: int


@dataclass(frozen=True)
class Appended(Result):
    length: int


@dataclass(frozen=True)
class CompareAndSwapped(Result):
    """`current`: the value stored after the operation (None: absent)."""

    swapped: bool
    current: Optional[ValueType]


@dataclass(frozen=True)
class WrongTypeResult(Result):
    """The key holds another type: "bytes", "int" or "list"."""

    actual: str


_KIND_NAMES = {
    pb.VALUE_KIND_BYTES: "bytes",
    pb.VALUE_KIND_INT: "int",
    pb.VALUE_KIND_LIST: "list",
}


def result_from_proto(result: pb.CommandResult) -> Result:
    kind = result.WhichOneof("result")
    if kind == "stored":
        return Stored()
    if kind == "deleted":
        return Deleted(existed=result.deleted.existed)
    if kind == "incremented":
        return Incremented(value=result.incremented.value)
    if kind == "overflow":
        return Overflowed(current=result.overflow.current)
    if kind == "appended":
        return Appended(length=result.appended.length)
    if kind == "compare_and_swap":
        cas = result.compare_and_swap
        current = value_from_proto(cas.current) if cas.HasField("current") else None
        return CompareAndSwapped(swapped=cas.swapped, current=current)
    if kind == "wrong_type":
        return WrongTypeResult(actual=_KIND_NAMES.get(result.wrong_type.actual, "unknown"))
    raise ValueError(f"undecodable command result {result!r}")
