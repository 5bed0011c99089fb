"""The oncekv client: exactly-once calls made effortless, with the promises
of the Rust library (crates/oncekv-client):

- a session is registered lazily, idempotently (a random 128-bit nonce,
  the same on every retry of the registration);
- every call gets the next seq, and every retry of it carries the *same*
  (client id, seq, command); the first outstanding seq (the floor) is
  tracked when replies arrive out of order, and never runs more than a
  window past the last floor the cluster confirmed;
- every "this attempt" failure (NOT_LEADER, whose hint is followed at
  once; UNAVAILABLE; a deadline; a broken or refused connection;
  TOO_MANY_OUTSTANDING; RESOURCE_EXHAUSTED) is retried with backoff and
  full jitter until the call's deadline;
- at the deadline the call raises `OutcomeUnknown` and the seq is fenced:
  a keep-alive moves the floor past it, so a late copy is discarded, never
  executed (rule 7);
- after an attempt that may have reached a leader, a final refusal of a
  retry is `OutcomeUnknown` too, unless it proves nothing ran for the seq
  (its cached LIMIT_EXCEEDED, SEQ_CONFLICT) (rule 22);
- a session the cluster no longer knows is never silently replaced under a
  request that may have run: that request's outcome is unknown; only new
  calls get a new session (rule 9);
- a request that can never be sent as it is (beyond a request limit, or
  gRPC's message limit) is refused before it takes a seq: `LimitExceeded`.

`execute_with_key` is exactly-once per idempotency key, with no session
(rule 18); claims and `once` (oncekv.claims) make an effect outside oncekv
happen once (rule 20). The client speaks only the wire
(proto/oncekv.proto). It is thread-safe: share one per process.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import grpc

from . import commands as cmd
from . import errors
from ._proto import oncekv_pb2 as pb
from ._proto import oncekv_pb2_grpc as pb_grpc
from .claims import ClaimsMixin
from .policy import Backoff, Failure, Failures, Leader
from .policy import refused_after_send as _refused_after_send
from .seqs import Seqs

__all__ = ["Client", "KeyedReply", "AttemptEvent"]

#: The node's message size bound (oncekv-wire's CLIENT_MESSAGE_BYTES_MAX).
MESSAGE_BYTES_MAX = cmd.MESSAGE_BYTES_MAX

_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    # A node that was down comes back within a second or two: do not let
    # grpc's reconnect backoff (1 s growing to 120 s by default) keep
    # failing calls to it long after it is up again.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
)


@dataclass(frozen=True)
class KeyedReply:
    """What `execute_with_key` returns: the command's result (this call's or
    the original one), whether the key's record answered (`duplicate`:
    nothing executed now) and the log index of the answered attempt."""

    result: cmd.Result
    duplicate: bool
    log_index: int


@dataclass(frozen=True)
class AttemptEvent:
    """One step of one attempt of an `execute`, as an observer sees it.
    `outcome`: "started", "answered" (with `duplicate`, `log_index`),
    "retry" or "final" (with `reason`)."""

    client_id: int
    seq: int
    attempt: int
    endpoint: str
    outcome: str
    duplicate: bool = False
    log_index: int = 0
    reason: str = ""


class _Refusal(Exception):
    """A synthesized failure (a follower's Status, say) inside a call."""

    def __init__(self, failure: Failure):
        super().__init__(failure.text())
        self.failure = failure


class _CallFinal(Exception):
    def __init__(self, failure: Failure):
        super().__init__(failure.text())
        self.failure = failure


class _CallGaveUp(Exception):
    """The deadline passed with every attempt failed for that attempt only:
    `failure` is the most informative failure (a capacity limit the leader
    named over a follower's NOT_LEADER or a timeout), `failures` all of
    them."""

    def __init__(self, failures: Failures, maybe_applied: bool):
        super().__init__(failures.reason())
        self.failure = failures.best
        self.failures = failures
        self.maybe_applied = maybe_applied


class _Unusable(Exception):
    """The session is unusable and nothing of this request can have run."""


@dataclass
class _Sent:
    """How a call retried with the same request ended: answered, refused
    for good ("refused"), or out of time ("gave_up"); `reached` says
    whether an attempt may have reached a leader that applies it."""

    how: str
    reply: object = None
    failure: Optional[Failure] = None
    failures: Optional[Failures] = None
    reached: bool = False


def _now() -> float:
    return time.monotonic()


def _endpoint_list(endpoints: Any) -> List[str]:
    """`endpoints` (a comma-separated string, or strings) as a list."""
    if isinstance(endpoints, str):
        endpoints = endpoints.split(",")
    try:
        endpoints = list(endpoints)
    except TypeError:
        raise errors.InvalidArgument(
            f"endpoints are 'host:port' strings, not {type(endpoints).__name__}") from None
    for endpoint in endpoints:
        if not isinstance(endpoint, str):
            raise errors.InvalidArgument(
                f"an endpoint is a 'host:port' string, not {type(endpoint).__name__}")
    endpoints = [endpoint.strip() for endpoint in endpoints if endpoint.strip()]
    if not endpoints:
        raise errors.InvalidArgument("no endpoints given")
    return endpoints


def _check_token(token: Any) -> None:
    """A bearer token is sent as gRPC metadata: printable ASCII, no blanks."""
    if not isinstance(token, str) or not (token.isascii() and token.isprintable()) or any(
            c.isspace() for c in token):
        raise errors.InvalidArgument("the token must be printable ASCII without blanks")


def env_arguments(kwargs: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """The endpoints and keyword arguments of `Client.from_env`: those given,
    completed from the environment as the CLI reads it."""
    endpoints = os.environ.get("ONCEKV_ENDPOINTS")
    if not endpoints:
        base = int(os.environ.get("ONCEKV_PORT_BASE", "7100"))
        endpoints = ",".join(f"127.0.0.1:{base + n}" for n in (1, 2, 3))
    kwargs = dict(kwargs)
    for name, env in (("token", "ONCEKV_TOKEN"), ("ca", "ONCEKV_CA"),
                      ("cert", "ONCEKV_CERT"), ("key", "ONCEKV_KEY")):
        if kwargs.get(name) is None and os.environ.get(env):
            kwargs[name] = os.environ[env]
    return endpoints, kwargs


def _read_pem(value) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    with open(os.fspath(value), "rb") as file:
        return file.read()


class _Session:
    """One registered session."""

    def __init__(self, reply: pb.RegisterReply):
        self.client_id = reply.client_id
        self.cluster_id = bytes(reply.cluster_id)
        self.cond = threading.Condition(threading.Lock())
        self.seqs = Seqs(reply.window)
        self.ttl_ms = reply.session_ttl_ms
        self.limits = pb.RequestLimits()
        if reply.HasField("limits"):
            self.limits.CopyFrom(reply.limits)
        else:
            self.limits = None
        self.expired = False
        self.closed = threading.Event()
        self.last_refreshed = _now()

    def first_outstanding(self) -> int:
        with self.cond:
            return self.seqs.first_outstanding()

    def fence_pending(self) -> bool:
        with self.cond:
            return self.seqs.fence_pending()

    def try_begin(self) -> Optional[int]:
        with self.cond:
            return self.seqs.try_begin()

    def finish(self, seq: int) -> None:
        with self.cond:
            self.seqs.finish(seq)
            self.cond.notify_all()

    def confirm(self, floor: int) -> None:
        with self.cond:
            if self.seqs.confirm(floor):
                self.cond.notify_all()

    def refreshed(self) -> None:
        with self.cond:
            self.last_refreshed = _now()

    def unusable(self) -> None:
        with self.cond:
            self.expired = True
            self.cond.notify_all()


class Client(ClaimsMixin):
    """A client of the oncekv cluster reachable at `endpoints` (``host:port``
    of any members, as a list or a comma-separated string). Nothing is
    contacted until the first call.

    Args:
        token: a bearer token shown on every call (clusters with
            authentication on).
        ca: the cluster CA (a PEM file path, or the PEM bytes): turns TLS on.
        cert, key: a client certificate and its key (mutual TLS), PEM.
        call_timeout: the deadline of one call, retries included (seconds).
        attempt_timeout: the deadline of one attempt (seconds).
        observer: called with an `AttemptEvent` on every attempt of every
            session request (cheap, must not block).
        interceptors: grpc client interceptors put on every channel.
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        ca: Union[None, str, bytes, os.PathLike[str]] = None,
        cert: Union[None, str, bytes, os.PathLike[str]] = None,
        key: Union[None, str, bytes, os.PathLike[str]] = None,
        call_timeout: float = 10.0,
        attempt_timeout: float = 2.0,
        backoff: Backoff = Backoff(),
        keep_alive_fraction: float = 1.0 / 3.0,
        observer: Optional[Callable[[AttemptEvent], None]] = None,
        interceptors: Iterable[Any] = (),
    ) -> None:
        endpoints = _endpoint_list(endpoints)
        if token is not None:
            _check_token(token)
        if (cert is None) != (key is None):
            raise errors.InvalidArgument("a client certificate needs its key too (cert= with key=)")
        if cert is not None and ca is None:
            raise errors.InvalidArgument("a certificate without ca=: TLS needs the cluster's CA")
        self.call_timeout = cmd.to_seconds(call_timeout, "call_timeout")
        self.attempt_timeout = cmd.to_seconds(attempt_timeout, "attempt_timeout")
        self.backoff = backoff
        self.keep_alive_fraction = float(keep_alive_fraction)
        self.observer = observer
        self._interceptors = list(interceptors)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._tls = None
        if ca is not None:
            self._tls = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(ca),
                private_key=_read_pem(key),
                certificate_chain=_read_pem(cert),
            )
        self._lock = threading.RLock()
        self._leader = Leader(endpoints)
        self._channels = {}
        self._stubs = {}
        self._cluster_id = b""
        self._session_lock = threading.Lock()
        self._session: Optional[_Session] = None

    @classmethod
    def from_env(cls, **kwargs: Any) -> "Client":
        """A client configured like the CLI: ONCEKV_ENDPOINTS (or the local
        cluster of scripts/cluster.sh at ONCEKV_PORT_BASE, default 7100),
        ONCEKV_TOKEN, ONCEKV_CA, ONCEKV_CERT, ONCEKV_KEY."""
        endpoints, kwargs = env_arguments(kwargs)
        return cls(endpoints, **kwargs)

    # ---- context management ------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> bool:
        """Ends the session (best effort: an unconfirmed one expires later)
        and closes the channels. True when the cluster confirmed that the
        session is gone (or there was none): the Unregister applied, or the
        cluster no longer knows the session (an earlier attempt of this close
        applied with its reply lost, or it had expired). A later call starts
        a new session. It takes at most one `attempt_timeout`, not a
        `call_timeout`: a client closed with the cluster out of reach
        (a process exiting) does not hang."""
        with self._session_lock:
            session, self._session = self._session, None
        confirmed = True
        if session is not None:
            session.closed.set()
            request = pb.UnregisterRequest(cluster_id=session.cluster_id, client_id=session.client_id)
            try:
                self._on_leader(_now() + self.attempt_timeout, lambda stub, t:
                                stub.Unregister(request, timeout=t, metadata=self._metadata))
            except _CallFinal as final:
                confirmed = final.failure.reason == "SESSION_EXPIRED"
            except _CallGaveUp:
                confirmed = False
        with self._lock:
            channels, self._channels, self._stubs = self._channels, {}, {}
        for channel in channels.values():
            channel.close()
        return confirmed

    # ---- the key-value commands ---------------------------------------------

    def put(self, key: cmd.Data, value: cmd.ValueLike) -> None:
        """Stores `value` (bytes, str, int or a list of bytes) exactly once."""
        self._expect(self.execute(cmd.Put(key, value)), cmd.Stored)

    def delete(self, key: cmd.Data) -> bool:
        """Deletes `key` exactly once; returns whether it existed."""
        return self._expect(self.execute(cmd.Delete(key)), cmd.Deleted).existed

    def increment(self, key: cmd.Data, delta: int = 1) -> int:
        """Adds `delta` exactly once and returns the new value. Raises
        `IncrementOverflow` or `WrongType` (nothing changed)."""
        return self._expect(self.execute(cmd.Increment(key, delta)), cmd.Incremented).value

    def append(self, key: cmd.Data, element: cmd.Data) -> int:
        """Appends `element` exactly once; returns the list's new length."""
        return self._expect(self.execute(cmd.Append(key, element)), cmd.Appended).length

    def compare_and_swap(self, key: cmd.Data, expected: Optional[cmd.ValueLike],
                         new: cmd.ValueLike) -> Tuple[bool, Optional[cmd.ValueType]]:
        """Stores `new` if the value equals `expected` (None: the key must be
        absent), exactly once. Returns ``(swapped, current)``, `current`
        being the value stored after the operation (None: absent). A retry
        of a swap that failed replays as failed."""
        result = self._expect(self.execute(cmd.CompareAndSwap(key, expected, new)),
                              cmd.CompareAndSwapped)
        return result.swapped, result.current

    @staticmethod
    def _expect(result: cmd.Result, kind):
        if isinstance(result, kind):
            return result
        if isinstance(result, cmd.WrongTypeResult):
            raise errors.WrongType(f"the key holds a value of type {result.actual}",
                                   actual=result.actual)
        if isinstance(result, cmd.Overflowed):
            raise errors.IncrementOverflow(
                f"the increment would overflow (the value is {result.current}); nothing changed",
                current=result.current)
        raise errors.InvalidArgument(f"unexpected result {result!r}")

    def get(self, key: cmd.Data) -> Optional[cmd.ValueType]:
        """A linearizable read through the leader: bytes, int, a list of
        bytes, or None when the key is absent. Raises `Unavailable` when no
        leader answered before the deadline."""
        key = cmd.to_key(key)
        deadline = self._deadline()
        request = pb.ReadRequest(cluster_id=self._cluster(deadline), key=key)
        try:
            reply = self._on_leader(deadline, lambda stub, t: stub.Read(
                request, timeout=t, metadata=self._metadata))
        except (_CallFinal, _CallGaveUp) as error:
            raise self._give_up(error) from None
        return cmd.value_from_proto(reply.value) if reply.HasField("value") else None

    def status(self, endpoint: Optional[str] = None) -> pb.StatusReply:
        """One node's `Status` (the leader's by default)."""
        deadline = self._deadline()
        if endpoint is not None:
            try:
                return self._stub(endpoint).Status(pb.StatusRequest(), timeout=self.attempt_timeout)
            except grpc.RpcError as error:
                raise errors.Unavailable(Failure.from_rpc_error(error).text()) from None

        def leader_status(stub, timeout):
            reply = stub.Status(pb.StatusRequest(), timeout=timeout)
            if reply.role != "leader":
                raise _Refusal(Failure.not_leader(reply.leader_client_addr))
            return reply

        try:
            return self._on_leader(deadline, leader_status)
        except (_CallFinal, _CallGaveUp) as error:
            raise self._unreachable(error) from None

    # ---- sessions: exactly once per (client id, seq) -------------------------

    def execute(self, command: cmd.Command) -> cmd.Result:
        """Executes `command` exactly once and returns its result, or raises
        `OutcomeUnknown` (the seq fenced) or a definite error.

        A session the cluster refuses as unusable (its floor beyond what it
        may fence) is dropped; when nothing of this request can have run,
        the command is sent once more as a new request of a new session. A
        request whose outcome is unknown is never re-sent (rule 9)."""
        command = cmd.to_command(command)
        deadline = self._deadline()
        sessions_tried = 0
        while True:
            session = self._get_session(deadline)
            sessions_tried += 1
            self._check_limits(session, command)
            # The request as sent, with seq and floor at their largest.
            cmd.check_message_size(pb.ExecuteRequest(
                cluster_id=session.cluster_id, client_id=session.client_id, seq=cmd.UINT64_MAX,
                first_outstanding_seq=cmd.UINT64_MAX, command=command.to_proto()))
            seq = self._take_seq(session, deadline)
            try:
                try:
                    return self._execute_seq(session, seq, command, deadline)
                finally:
                    session.finish(seq)
            except errors.OutcomeUnknown as unknown:
                # Fence before reporting: a late copy can never execute.
                unknown.fenced = (not session.expired) and self._fence(session, seq)
                if session.expired:
                    self._drop_session(session)
                raise
            except _Unusable:
                self._drop_session(session)
                if sessions_tried >= 2:
                    raise errors.InvalidArgument(
                        "the session is unusable (its floor is beyond what it may fence)"
                    ) from None
                # Nothing of this request can have run: a new request of a
                # new session.
                continue
            except errors.OncekvError:
                if session.expired:
                    self._drop_session(session)
                raise

    def _execute_seq(self, session: _Session, seq: int, command: cmd.Command,
                     deadline: float) -> cmd.Result:
        proto_command = command.to_proto()
        attempt = 0
        failures = Failures()
        reached = False
        while True:
            floor_sent = session.first_outstanding()
            request = pb.ExecuteRequest(
                cluster_id=session.cluster_id,
                client_id=session.client_id,
                seq=seq,
                first_outstanding_seq=floor_sent,
                command=proto_command,
            )
            target = self._target()
            self._observe(session, seq, attempt, target, "started")
            try:
                reply = self._stub(target).Execute(
                    request, timeout=self._attempt_timeout(deadline), metadata=self._metadata)
            except grpc.RpcError as error:
                failure = Failure.from_rpc_error(error)
            else:
                self._observe(session, seq, attempt, target, "answered",
                              duplicate=reply.duplicate, log_index=reply.log_index)
                # Applied: the session's floor is at least the one sent and
                # the seq's answer is cached (the bound is past both).
                session.confirm(max(floor_sent, seq + 1))
                session.refreshed()
                try:
                    return cmd.result_from_proto(reply.result)
                except ValueError as undecodable:
                    raise errors.OutcomeUnknown(
                        f"outcome unknown for seq {seq}: undecodable reply: {undecodable}",
                        seq=seq) from None
            retry, hint = failure.retry_hint()
            if not retry:
                self._observe(session, seq, attempt, target, "final", reason=failure.reason or failure.code.name)
                if failure.reason == "LIMIT_EXCEEDED":
                    # The refusal is the seq's cached answer.
                    session.confirm(max(floor_sent, seq + 1))
                if failure.refuses_floor_bound() and not reached:
                    session.unusable()
                    raise _Unusable(failure.text())
                raise self._final_execute_error(session, failure, seq, reached)
            self._observe(session, seq, attempt, target, "retry", reason=failure.reason or failure.code.name)
            if hint is None and failure.refused_by_leader():
                hint = target  # only the leader refuses so: the next attempt goes there
            failures.note(failure)
            reached = reached or failure.may_have_reached()
            if _now() >= deadline:
                exhausted = failures.exhausted_before_any_reach(reached)
                if exhausted is not None:
                    raise exhausted
                raise errors.OutcomeUnknown(
                    f"outcome unknown for seq {seq}: {failures.reason()}",
                    seq=seq, cause=failures.cause())
            self._follow(hint, attempt, deadline)
            exhausted = failures.exhausted_and_out_of_time(reached, deadline, _now())
            if exhausted is not None:
                raise exhausted
            attempt += 1

    def _final_execute_error(self, session: _Session, failure: Failure, seq: int,
                             reached: bool) -> errors.OncekvError:
        """What a refusal for good of `seq` means, given whether an earlier
        attempt may have reached a leader (rule 22)."""
        error = failure.error(seq=seq)
        if error is None:
            # Refused below the registry: it may have followed the log.
            return errors.OutcomeUnknown(f"outcome unknown for seq {seq}: {failure.text()}", seq=seq)
        if isinstance(error, errors.SessionExpired) or failure.refuses_floor_bound():
            session.unusable()
        if isinstance(error, (errors.LimitExceeded, errors.SeqConflict)) or not reached:
            return error
        return errors.OutcomeUnknown(
            f"outcome unknown for seq {seq}: {_refused_after_send(error)}", seq=seq, cause=error)

    def _observe(self, session, seq, attempt, endpoint, outcome, **fields) -> None:
        if self.observer is not None:
            self.observer(AttemptEvent(client_id=session.client_id, seq=seq, attempt=attempt,
                                       endpoint=endpoint, outcome=outcome, **fields))

    def _take_seq(self, session: _Session, deadline: float) -> int:
        """The next seq once the window has room. Room held by requests given
        up but not yet fenced is freed by fencing them (a keep-alive the
        cluster acknowledges)."""
        while True:
            with session.cond:
                seq = session.seqs.try_begin()
                if seq is not None:
                    return seq
                pending = session.seqs.fence_pending()
                if not pending:
                    # Woken when a call of this session finishes (checked
                    # and waited under one lock: no wake-up is missed).
                    session.cond.wait(timeout=max(0.0, deadline - _now()))
            if pending:
                if self._keep_alive(session, min(deadline, _now() + self.attempt_timeout)) is not None:
                    continue
                # Not acknowledged: try again after a pause, or sooner if a
                # call of this session finishes.
                with session.cond:
                    session.cond.wait(timeout=max(0.0, min(deadline, _now() + self.backoff.cap) - _now()))
            if _now() >= deadline:
                raise errors.Unavailable(
                    "the session's window stayed full"
                    + (": requests given up earlier wait for a fence the cluster did not acknowledge"
                       if session.fence_pending() else ""))

    def _fence(self, session: _Session, seq: int) -> bool:
        """Commits, with keep-alives, a floor past `seq` (given up). True once
        the cluster acknowledged one; False when an earlier seq still in
        flight holds the floor (the next request carries it) or the cluster
        did not answer."""
        for _ in range(3):
            if session.first_outstanding() <= seq and not session.fence_pending():
                return False
            floor = self._keep_alive(session, _now() + self.attempt_timeout)
            if floor is None:
                return False
            if floor > seq:
                return True
        return False

    def _check_limits(self, session: _Session, command: cmd.Command) -> None:
        """Refuses, before a seq is taken, a command that breaks a request
        limit; limits that refuse it are refreshed first (a keep-alive), so
        a raised limit never refuses a request wrongly."""
        with session.cond:
            limits = session.limits
        if limits is None:
            return
        try:
            command.check_limits(limits)
            return
        except errors.LimitExceeded:
            pass
        if self._keep_alive(session, _now() + self.attempt_timeout) is None:
            return  # the cluster decides
        with session.cond:
            limits = session.limits
        command.check_limits(limits)

    def _keep_alive(self, session: _Session, deadline: float) -> Optional[int]:
        """A keep-alive carrying the current floor: the floor the cluster
        acknowledged (which confirms it), or None. A refusal because the
        session expired or its floor is beyond the bound makes the session
        unusable."""
        request = pb.KeepAliveRequest(cluster_id=session.cluster_id, client_id=session.client_id,
                                      first_outstanding_seq=session.first_outstanding())
        try:
            reply = self._on_leader(deadline, lambda stub, t: stub.KeepAlive(
                request, timeout=t, metadata=self._metadata))
        except (_CallFinal, _CallGaveUp) as error:
            failure = error.failure
            if failure.refuses_floor_bound() or failure.reason == "SESSION_EXPIRED":
                session.unusable()
            return None
        with session.cond:
            if reply.session_ttl_ms > 0:
                session.ttl_ms = reply.session_ttl_ms
            if reply.HasField("limits"):
                session.limits = pb.RequestLimits()
                session.limits.CopyFrom(reply.limits)
        session.refreshed()
        session.confirm(reply.floor)
        return reply.floor

    def client_id(self) -> int:
        """The current session's client id, registering one if needed."""
        return self._get_session(self._deadline()).client_id

    def _get_session(self, deadline: float) -> _Session:
        with self._session_lock:
            session = self._session
            if session is not None and not session.expired:
                return session
            cluster_id = self._cluster(deadline)
            # Retried with the same nonce: a lost reply never leaks a session.
            request = pb.RegisterRequest(cluster_id=cluster_id, nonce=os.urandom(16))
            try:
                reply = self._on_leader(deadline, lambda stub, t: stub.Register(
                    request, timeout=t, metadata=self._metadata))
            except (_CallFinal, _CallGaveUp) as error:
                raise self._give_up(error) from None
            session = _Session(reply)
            self._session = session
        self._start_keep_alive(session)
        return session

    def _drop_session(self, session: _Session) -> None:
        with self._session_lock:
            if self._session is session:
                self._session = None
        session.closed.set()

    def _start_keep_alive(self, session: _Session) -> None:
        """A daemon thread sends keep-alives while the cluster has not
        refreshed the session for a fraction of its TTL (after a failed one
        it waits that long again). It stops when the session ends or the
        client is garbage."""
        client_ref = weakref.ref(self)
        fraction = self.keep_alive_fraction

        def run():
            while not session.closed.is_set():
                with session.cond:
                    period = max(session.ttl_ms * fraction / 1000.0, 0.01)
                    idle = _now() - session.last_refreshed
                    expired = session.expired
                if expired:
                    return
                if idle < period:
                    session.closed.wait(period - idle)
                    continue
                client = client_ref()
                if client is None:
                    return
                ok = client._keep_alive(session, _now() + client.attempt_timeout) is not None
                del client
                if not ok:
                    session.closed.wait(period)

        thread = threading.Thread(target=run, name=f"oncekv-keepalive-{session.client_id}",
                                  daemon=True)
        thread.start()

    # ---- idempotency keys: exactly once per key, no session ------------------

    def execute_with_key(self, key: cmd.Data, command: cmd.Command) -> KeyedReply:
        """Executes `command` exactly once per idempotency `key` (rule 18),
        with no session: the first request with the key that reaches the
        log executes; a repeat of the same command with the key (a retry,
        another process, a redelivery hours later) gets the original
        result with `duplicate` set. Raises `KeyConflict` when the key was
        used with another command, `KeyOutcomeUnknown` at the deadline (call
        again with the same key and command to learn the outcome)."""
        key = cmd.to_bytes(key, "idempotency key")
        if not key:
            raise errors.InvalidArgument("empty idempotency key")
        if len(key) > cmd.IDEMPOTENCY_KEY_BYTES_HARD_MAX:
            raise errors.InvalidArgument(
                f"idempotency key of {len(key)} bytes is beyond the hard bound of "
                f"{cmd.IDEMPOTENCY_KEY_BYTES_HARD_MAX}")
        command = cmd.to_command(command)
        deadline = self._deadline()
        request = pb.ExecuteKeyedRequest(cluster_id=self._cluster(deadline), idempotency_key=key,
                                         command=command.to_proto())
        cmd.check_message_size(request)
        sent = self._send_retried(deadline, lambda stub, t: stub.ExecuteKeyed(
            request, timeout=t, metadata=self._metadata))
        text = key.decode("utf-8", "replace")

        def unknown(reason, cause=None):
            return errors.KeyOutcomeUnknown(
                f"outcome unknown for idempotency key {text!r}: {reason}; retry with the same key "
                f"and command to learn it", key=key, cause=cause)

        if sent.how == "answered":
            reply = sent.reply
            try:
                result = cmd.result_from_proto(reply.result)
            except ValueError as undecodable:
                raise unknown(f"undecodable reply: {undecodable}") from None
            return KeyedReply(result=result, duplicate=reply.duplicate, log_index=reply.log_index)
        if sent.how == "refused":
            failure = sent.failure
            error = failure.error(key=key)
            if error is None:
                raise unknown(failure.text())
            if isinstance(error, errors.KeyConflict):
                raise errors.KeyConflict(
                    f"idempotency key {text!r} was already used with another command; nothing was "
                    "executed", detail=failure.detail, key=key)
            # A command's LIMIT_EXCEEDED is the key's recorded answer; a key
            # over idempotency_key_bytes_max is judged before the record.
            if isinstance(error, errors.LimitExceeded) and error.limit != "idempotency_key_bytes_max":
                raise error
            if not sent.reached:
                raise error
            raise unknown(_refused_after_send(error), cause=error)
        # Out of time: unknown, whether or not an attempt may have applied
        # (the key's fate can be learnt by calling again) — but for a
        # capacity limit that refused every attempt before any could run.
        exhausted = sent.failures.exhausted_before_any_reach(sent.reached)
        if exhausted is not None:
            raise exhausted
        raise unknown(sent.failures.reason(), cause=sent.failures.cause())

    def execute_plain(self, command: cmd.Command) -> cmd.Result:
        """Executes `command` with no session and no key: AT-LEAST-ONCE. A
        retry after a lost reply may apply it twice. For baselines only.
        After an attempt that may have been applied, a call that ends
        without an answer raises `PlainOutcomeUnknown`."""
        command = cmd.to_command(command)
        deadline = self._deadline()
        request = pb.ExecutePlainRequest(cluster_id=self._cluster(deadline),
                                         command=command.to_proto())
        cmd.check_message_size(request)
        sent = self._send_retried(deadline, lambda stub, t: stub.ExecutePlain(
            request, timeout=t, metadata=self._metadata))
        if sent.how == "answered":
            try:
                return cmd.result_from_proto(sent.reply.result)
            except ValueError as undecodable:
                # Applied, but the answer is unreadable.
                raise errors.PlainOutcomeUnknown(f"undecodable reply: {undecodable}") from None
        if sent.how == "refused":
            error = sent.failure.error()
            if error is None:
                raise errors.PlainOutcomeUnknown(sent.failure.text())
            if not sent.reached:
                raise error
            raise errors.PlainOutcomeUnknown(_refused_after_send(error), cause=error)
        if sent.reached:
            raise errors.PlainOutcomeUnknown(sent.failures.reason(), cause=sent.failures.cause())
        raise (sent.failures.exhausted_before_any_reach(False)
               or errors.Unavailable(sent.failures.reason()))

    # ---- the one leader-following loop ---------------------------------------

    def _deadline(self) -> float:
        return _now() + self.call_timeout

    def _attempt_timeout(self, deadline: float) -> float:
        return max(min(deadline - _now(), self.attempt_timeout), 0.001)

    def _target(self) -> str:
        with self._lock:
            target = self._leader.target()
        if target is None:
            raise errors.InvalidArgument("no endpoints given")
        return target

    def endpoints(self) -> List[str]:
        """Every endpoint known: those given, then leaders learnt from hints."""
        with self._lock:
            return list(self._leader.endpoints)

    def _follow(self, hint: Optional[str], attempt: int, deadline: float) -> None:
        """After a retryable failure: go where the hint points at once, or to
        the next endpoint after a jittered backoff."""
        with self._lock:
            new_target = self._leader.follow(hint)
        if new_target:
            return
        delay = self.backoff.delay(attempt, max(0.0, deadline - _now()))
        if delay > 0:
            time.sleep(delay)

    def _channel(self, endpoint: str):
        with self._lock:
            channel = self._channels.get(endpoint)
            if channel is None:
                if self._tls is not None:
                    channel = grpc.secure_channel(endpoint, self._tls, options=_CHANNEL_OPTIONS)
                else:
                    channel = grpc.insecure_channel(endpoint, options=_CHANNEL_OPTIONS)
                if self._interceptors:
                    channel = grpc.intercept_channel(channel, *self._interceptors)
                self._channels[endpoint] = channel
            return channel

    def _stub(self, endpoint: str) -> pb_grpc.ClientStub:
        with self._lock:
            stub = self._stubs.get(endpoint)
            if stub is None:
                stub = pb_grpc.ClientStub(self._channel(endpoint))
                self._stubs[endpoint] = stub
            return stub

    def _on_leader(self, deadline: float, call):
        """Runs an idempotent call on the leader until it is answered
        (returned), refused for good (`_CallFinal`, whichever node refused)
        or `deadline` passes with every attempt failed for that attempt only
        (`_CallGaveUp`, with the most informative failure, not merely the
        last). After a refusal only the leader makes (a capacity limit) the
        next attempt goes to the same node, not on to the next endpoint."""
        attempt = 0
        maybe_applied = False
        failures = Failures()
        while True:
            target = self._target()
            try:
                return call(self._stub(target), self._attempt_timeout(deadline))
            except grpc.RpcError as error:
                failure = Failure.from_rpc_error(error)
            except _Refusal as refusal:
                failure = refusal.failure
            retry, hint = failure.retry_hint()
            if not retry:
                raise _CallFinal(failure)
            failures.note(failure)
            maybe_applied = maybe_applied or failure.may_have_applied()
            if hint is None and failure.refused_by_leader():
                hint = target  # the node that refused leads: stay there
            if _now() >= deadline:
                raise _CallGaveUp(failures, maybe_applied)
            self._follow(hint, attempt, deadline)
            attempt += 1

    def _send_retried(self, deadline: float, call) -> _Sent:
        """Sends one request until it is answered, refused for good or the
        deadline passes, and says whether an attempt may have reached a
        leader that applies it."""
        attempt = 0
        failures = Failures()
        reached = False
        while True:
            target = self._target()
            try:
                return _Sent("answered", reply=call(self._stub(target), self._attempt_timeout(deadline)))
            except grpc.RpcError as error:
                failure = Failure.from_rpc_error(error)
            retry, hint = failure.retry_hint()
            if not retry:
                return _Sent("refused", failure=failure, reached=reached, failures=failures)
            if hint is None and failure.refused_by_leader():
                hint = target  # only the leader refuses so: the next attempt goes there
            failures.note(failure)
            reached = reached or failure.may_have_reached()
            if _now() >= deadline:
                return _Sent("gave_up", failure=failure, failures=failures, reached=reached)
            self._follow(hint, attempt, deadline)
            if failures.exhausted_and_out_of_time(reached, deadline, _now()) is not None:
                return _Sent("gave_up", failure=failure, failures=failures, reached=reached)
            attempt += 1

    def _give_up(self, error) -> errors.OncekvError:
        """The error of an idempotent call (no seq) on the leader that
        failed (`_on_leader`): a refusal for good is itself, whichever node
        made it; at the deadline, the most informative failure decides — a
        capacity limit that stayed reached (`ResourceExhausted`, naming it),
        else `Unavailable`."""
        failure = error.failure
        if isinstance(error, _CallFinal):
            mapped = failure.error()
            return mapped if mapped is not None else errors.InvalidArgument(failure.text())
        if failure.reason == "RESOURCE_EXHAUSTED":
            return failure.error()
        return errors.Unavailable(f"cluster unavailable: {error.failures.reason()}",
                                  detail=failure.detail)

    def _unreachable(self, error) -> errors.OncekvError:
        """The error of a `Status` call on the leader that failed: a node's
        typed refusal for good is itself; anything else is a cluster out of
        reach (`Unavailable`)."""
        if isinstance(error, _CallFinal):
            mapped = error.failure.error()
            if mapped is not None:
                return mapped
            return errors.Unavailable(f"cluster unavailable: {error.failure.text()}",
                                      detail=error.failure.detail)
        return self._give_up(error)

    def _cluster(self, deadline: float) -> bytes:
        """The cluster's id, asked of the leader once."""
        with self._lock:
            if self._cluster_id:
                return self._cluster_id

        def leader_status(stub, timeout):
            reply = stub.Status(pb.StatusRequest(), timeout=timeout, metadata=self._metadata)
            if not reply.cluster_id or reply.role != "leader":
                raise _Refusal(Failure.not_leader(reply.leader_client_addr))
            return reply

        try:
            reply = self._on_leader(deadline, leader_status)
        except (_CallFinal, _CallGaveUp) as error:
            raise self._unreachable(error) from None
        with self._lock:
            self._cluster_id = bytes(reply.cluster_id)
            return self._cluster_id
