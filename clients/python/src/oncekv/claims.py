"""Claims (rule 20): an effect outside oncekv (a payment, an e-mail, a job)
made to happen once. The four calls (`claim`, `complete`, `release`,
`extend`), each retried with the *same* request (the same claim id, the
same fence) until the call's deadline, and `once`: the reserve → do →
record → (release) cycle around a handler, as a decorator or a context
manager, in the spirit of AWS Powertools' ``@idempotent``.

It owns that cycle and the retry of each call; it never decides who holds
a key (the registry does, when the claim's entry applies) and never
re-claims under a new claim id within one `once`.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from . import commands as cmd
from . import errors
from ._proto import oncekv_pb2 as pb
from .policy import refused_after_send

__all__ = ["Won", "InProgress", "Completed", "Once", "OnceRun", "current_claim", "ClaimsMixin"]

#: The largest fingerprint a claim may carry (the cluster keeps its hash).
FINGERPRINT_BYTES_MAX = 16 << 10

_current_run: contextvars.ContextVar = contextvars.ContextVar("oncekv_current_claim", default=None)


def current_claim() -> Optional["OnceRun"]:
    """The `OnceRun` of the `once` handler running in this context (thread
    or task), or None outside one: its `fence`, `attempt` and `fenced`."""
    return _current_run.get()


# ---- the answers of a claim -------------------------------------------------


@dataclass(frozen=True)
class Won:
    """The caller holds the key: perform the effect with `fence`, then
    complete or release it before the lease runs out (or extend it).
    `attempt` > 1: an earlier holder may have half-done the effect —
    reconcile before redoing it. `duplicate`: a retry of the winning claim
    (same claim id) answered from the record."""

    fence: int
    attempt: int
    lease_ms_left: int
    lease_deadline_ms: int
    cluster_time_ms: int
    duplicate: bool
    log_index: int


@dataclass(frozen=True)
class InProgress:
    """Another holder's lease is live: claim again after `retry_after_ms`."""

    retry_after_ms: int
    attempt: int
    log_index: int


@dataclass(frozen=True)
class Completed:
    """The effect was done: its recorded result (bytes), when, and the
    fence and attempt of the holder that completed it."""

    result: bytes
    completed_ms: int
    fence: int
    attempt: int
    log_index: int


def _claim_answer(reply: pb.ClaimReply):
    kind = reply.WhichOneof("answer")
    if kind == "won":
        won = reply.won
        return Won(fence=won.fence, attempt=won.attempt, lease_ms_left=won.lease_ms_left,
                   lease_deadline_ms=won.lease_deadline_ms, cluster_time_ms=won.cluster_time_ms,
                   duplicate=won.duplicate, log_index=reply.log_index)
    if kind == "in_progress":
        return InProgress(retry_after_ms=reply.in_progress.retry_after_ms,
                          attempt=reply.in_progress.attempt, log_index=reply.log_index)
    if kind == "completed":
        done = reply.completed
        return Completed(result=bytes(done.result), completed_ms=done.completed_ms,
                         fence=done.fence, attempt=done.attempt, log_index=reply.log_index)
    raise ValueError("a claim reply without an answer")


#: What `claim` answers.
ClaimAnswer = Union[Won, InProgress, Completed]


def _lease_ms(lease: float) -> int:
    seconds = cmd.to_seconds(lease, "a lease")
    return cmd.to_uint64(max(1, int(round(seconds * 1000))), "a lease in ms")


def _claim_key(key: Any) -> bytes:
    key = cmd.to_bytes(key, "claim key")
    if not key:
        raise errors.InvalidArgument("empty claim key")
    if len(key) > cmd.IDEMPOTENCY_KEY_BYTES_HARD_MAX:
        raise errors.InvalidArgument(
            f"claim key of {len(key)} bytes is beyond the hard bound of "
            f"{cmd.IDEMPOTENCY_KEY_BYTES_HARD_MAX}")
    return key


class ClaimsMixin:
    """The claim calls of `oncekv.Client`."""

    def claim(self, key: cmd.Data, fingerprint: cmd.Data, lease: float = 30.0,
              claim_id: Optional[bytes] = None) -> ClaimAnswer:
        """Claims `key` for an effect described by `fingerprint` (any bytes or
        str, at most 16 KiB; another description on the key is
        `KeyConflict`) with a lease of `lease` seconds of cluster time.
        Returns `Won`, `InProgress` or `Completed`. Retried with the same
        `claim_id` (16 random bytes, chosen here unless given) until the
        call's deadline, so a lost reply is answered with this call's own
        win. Raises `KeyOutcomeUnknown` when no answer came by the deadline
        (claim again with the same `claim_id` to learn it)."""
        key = _claim_key(key)
        lease_ms = _lease_ms(lease)
        fingerprint = cmd.to_bytes(fingerprint, "fingerprint")
        if len(fingerprint) > FINGERPRINT_BYTES_MAX:
            raise errors.InvalidArgument(
                f"a fingerprint is at most {FINGERPRINT_BYTES_MAX} bytes, not {len(fingerprint)}")
        if claim_id is None:
            claim_id = os.urandom(16)
        if not isinstance(claim_id, (bytes, bytearray, memoryview)) or len(bytes(claim_id)) != 16:
            raise errors.InvalidArgument(f"a claim id is 16 bytes, not {claim_id!r}")
        deadline = self._deadline()
        request = pb.ClaimRequest(cluster_id=self._cluster(deadline), key=key,
                                  fingerprint=fingerprint, lease_ms=lease_ms,
                                  claim_id=bytes(claim_id))
        reply = self._claim_call(key, deadline, lambda stub, t: stub.Claim(
            request, timeout=t, metadata=self._metadata))
        try:
            return _claim_answer(reply)
        except ValueError as undecodable:
            raise errors.KeyOutcomeUnknown(f"undecodable claim reply: {undecodable}", key=key) from None

    def complete(self, key: cmd.Data, fence: int, result: cmd.Data) -> int:
        """Records `result` (bytes) as the effect's result under `fence`;
        every later claim of the key replays it. Returns the cluster time of
        the completion. The same complete again (a retry) is answered from
        the record. Raises `Fenced` when the fence no longer holds the key,
        and when this fence completed it already with another result
        (`current_fence` is then `fence`: the first result stands); nothing
        is recorded either way."""
        key = _claim_key(key)
        fence = cmd.to_uint64(fence, "fence")
        result = cmd.to_bytes(result, "result")
        deadline = self._deadline()
        request = pb.CompleteClaimRequest(cluster_id=self._cluster(deadline), key=key, fence=fence,
                                          result=result)
        cmd.check_message_size(request)
        reply = self._claim_call(key, deadline, lambda stub, t: stub.CompleteClaim(
            request, timeout=t, metadata=self._metadata))
        return reply.completed_ms

    def release(self, key: cmd.Data, fence: int) -> None:
        """Gives the key up under `fence` (the effect did not happen): the
        next claim wins at once. Raises `Fenced` when the fence no longer
        holds the key."""
        key = _claim_key(key)
        fence = cmd.to_uint64(fence, "fence")
        deadline = self._deadline()
        request = pb.ReleaseClaimRequest(cluster_id=self._cluster(deadline), key=key, fence=fence)
        self._claim_call(key, deadline, lambda stub, t: stub.ReleaseClaim(
            request, timeout=t, metadata=self._metadata))

    def extend(self, key: cmd.Data, fence: int, lease: float) -> float:
        """Moves the lease of `fence` to `lease` seconds after now (cluster
        time); returns the lease left, in seconds. Raises `Fenced` when the
        fence no longer holds the key."""
        key = _claim_key(key)
        fence = cmd.to_uint64(fence, "fence")
        lease_ms = _lease_ms(lease)
        deadline = self._deadline()
        request = pb.ExtendClaimRequest(cluster_id=self._cluster(deadline), key=key, fence=fence,
                                        lease_ms=lease_ms)
        reply = self._claim_call(key, deadline, lambda stub, t: stub.ExtendClaim(
            request, timeout=t, metadata=self._metadata))
        return reply.lease_ms_left / 1000.0

    def _claim_call(self, key: bytes, deadline: float, call):
        """One claim call, retried with the same request until `deadline`.
        A refusal for good is definite only before any attempt that may
        have reached a leader that applies it, or when it proves the call
        did not take effect: KEY_CONFLICT (the key's record holds another
        fingerprint; had this claim won, its record would answer every
        retry with the win). After such an attempt (a lost reply, a
        timeout), any other refusal of a retry says nothing of it — FENCED
        (a release that was applied lets the next claim in at once),
        INVALID_ARGUMENT (a lease beyond a lease_ms_max lowered since),
        LIMIT_EXCEEDED (a key or result beyond a limit lowered since),
        WRONG_CLUSTER, PERMISSION_DENIED... — and the outcome is unknown
        (`KeyOutcomeUnknown`, the refusal as `.cause`; rule 22). So is the
        deadline, whether or not an attempt may have reached a leader (the
        same request again learns the outcome; as the Rust client's
        `keyed_fate`) — unless a capacity limit refused every attempt
        before any could run (`ResourceExhausted`)."""
        text = key.decode("utf-8", "replace")
        sent = self._send_retried(deadline, call)
        if sent.how == "answered":
            return sent.reply

        def unknown(reason, cause=None):
            return errors.KeyOutcomeUnknown(
                f"outcome unknown for claim key {text!r}: {reason}", key=key, cause=cause)

        if sent.how == "refused":
            failure = sent.failure
            error = failure.error(key=key)
            if error is None:
                raise unknown(failure.text())
            if isinstance(error, errors.KeyConflict):
                raise errors.KeyConflict(
                    f"claim key {text!r} was claimed for another effect (another fingerprint); "
                    "nothing ran", detail=failure.detail, key=key)
            if not sent.reached:
                raise error
            raise unknown(refused_after_send(error), cause=error)
        exhausted = sent.failures.exhausted_before_any_reach(sent.reached)
        if exhausted is not None:
            raise exhausted
        raise unknown(sent.failures.reason(), cause=sent.failures.cause())

    def once(self, key: Union[cmd.Data, Callable[..., cmd.Data]],
             fingerprint: Union[None, cmd.Data, Callable[..., cmd.Data]] = None, *,
             lease: float = 30.0, wait: float = 60.0, heartbeat: Optional[float] = None,
             encode: Optional[Callable[[Any], bytes]] = None,
             decode: Optional[Callable[[bytes], Any]] = None) -> "Once":
        """Runs a handler at most once per `key` across every process that
        asks; use the result as a decorator or a context manager (see
        `Once`). `key`: bytes or str, or (decorator only) a callable given
        the handler's arguments that returns it. `fingerprint`: describes
        the effect (bytes or str, or a callable like `key`); another
        fingerprint on a claimed key is `KeyConflict`. Defaults: the
        handler's qualified name (decorator), the key itself (context
        manager). `lease`: seconds a holder that dies blocks the key;
        `wait`: how long to wait out another holder (then
        `ClaimInProgress`); `heartbeat`: how often the lease is extended
        while the handler runs (default lease / 3); `encode`/`decode`: how
        the handler's return value is recorded (default JSON)."""
        return Once(self, key, fingerprint, lease=lease, wait=wait, heartbeat=heartbeat,
                    encode=encode, decode=decode)


# ---- once ---------------------------------------------------------------------


def _handler_shape(handler):
    """Which of `fence`, `attempt`, `claim` the handler's signature names,
    and its default fingerprint ("py:" + module.qualname)."""
    try:
        parameters = inspect.signature(handler).parameters
    except (TypeError, ValueError):
        parameters = {}
    passed = [name for name in ("fence", "attempt", "claim") if name in parameters]
    module = getattr(handler, "__module__", None) or "?"
    name = getattr(handler, "__qualname__", None) or repr(handler)
    return passed, f"py:{module}.{name}".encode("utf-8")


def _pass_claim(run, passed, kwargs) -> None:
    extra = {"fence": run.fence, "attempt": run.attempt, "claim": run}
    for name in passed:
        kwargs.setdefault(name, extra[name])


def _json_encode(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _json_decode(data: bytes):
    return json.loads(data.decode("utf-8"))


class OnceRun:
    """One `once`: what the claim gave this caller.

    Attributes:
        key: the claim key (bytes).
        replayed: True when the effect had been done (by anyone, earlier):
            `result` is its recorded value (decoded) and nothing must run.
        result: the recorded value (replay), or the value recorded by this
            run once it completed.
        fence: the fencing token — this holder's (pass it to the downstream
            that performs the effect, so it can refuse a stale holder), or
            on a replay the one of the holder that completed.
        attempt: holders so far, this one included; above 1 an earlier
            holder may have half-done the effect: reconcile before redoing.
        completed_ms: cluster time of the completion (replays only).
    """

    def __init__(self, key: bytes, *, replayed: bool, fence: int, attempt: int,
                 result=None, completed_ms: int = 0):
        self.key = key
        self.replayed = replayed
        self.fence = fence
        self.attempt = attempt
        self.result = result
        self.completed_ms = completed_ms
        self._value = None
        self._recorded = False
        self._fenced = threading.Event()
        self._stop = threading.Event()

    @property
    def fenced(self) -> bool:
        """Whether a heartbeat learnt that another holder took the key over
        (this holder's lease ran out): stop, the effect is theirs."""
        return self._fenced.is_set()

    def record(self, value) -> None:
        """(Context manager) the value to record when the block ends without
        an exception; without a call, None is recorded."""
        if self.replayed:
            raise RuntimeError("a replayed run records nothing: its result is in .result")
        self._value = value
        self._recorded = True

    def __repr__(self) -> str:
        return (f"OnceRun(key={self.key!r}, replayed={self.replayed}, fence={self.fence}, "
                f"attempt={self.attempt}, result={self.result!r})")


class Once:
    """The reserve → do → record → (release) cycle of `Client.once`.

    As a decorator::

        @client.once(lambda order: f"charge/{order['id']}", lease=30)
        def charge(order, fence, attempt):   # fence/attempt: optional parameters
            return provider.charge(order["id"], order["cents"], fence=fence)

    Calling ``charge(order)`` claims the key (waiting out another holder's
    lease up to `wait`, claiming again after each "in progress"), then:

    - if the key was completed, returns the recorded value (decoded) without
      calling the handler;
    - else calls the handler while a heartbeat thread extends the lease,
      passing ``fence=``, ``attempt=`` and ``claim=`` (the `OnceRun`) as
      keyword arguments to those of them the handler's signature names
      (`oncekv.current_claim()` gives the same from anywhere inside it);
    - records its return value (``encode``, JSON by default) and returns it
      (the handler's own object; a replay returns the decoded record);
    - if the handler raises an `Exception`, releases the key (the effect is
      taken as not done: the next call runs the handler again) and re-raises
      it; a `BaseException` that is not an `Exception` (KeyboardInterrupt,
      SystemExit) leaves the claim held: after the lease, the next caller
      takes over with attempt + 1;
    - if the value cannot be recorded (the lease ran out and another holder
      took over: `Fenced`; an unknown outcome; a value the encoder refuses
      or too large), raises `ResultNotRecorded` (`.result` the value,
      `.error` why).

    After a takeover (a holder died or stalled past its lease) the new
    holder's handler gets a larger `fence` and `attempt` > 1.

    As a context manager (a fixed key)::

        with client.once(f"charge/{order_id}", fingerprint=f"charge {order_id} {cents}") as run:
            if run.replayed:
                receipt = run.result
            else:
                receipt = provider.charge(order_id, cents, fence=run.fence)
                run.record(receipt)

    The block always runs (Python cannot skip it): check `run.replayed`.
    On a clean exit the value given to `run.record` is recorded; on an
    exception the key is released and the exception propagates.
    """

    def __init__(self, client, key, fingerprint=None, *, lease: float = 30.0, wait: float = 60.0,
                 heartbeat: Optional[float] = None, encode=None, decode=None):
        if not callable(key):
            key = _claim_key(key)
        if fingerprint is not None and not callable(fingerprint):
            fingerprint = cmd.to_bytes(fingerprint, "fingerprint")
        _lease_ms(lease)
        self.client = client
        self.key = key
        self.fingerprint = fingerprint
        self.lease = cmd.to_seconds(lease, "a lease")
        self.wait = cmd.to_seconds(wait, "wait", zero_ok=True)
        self.heartbeat = (cmd.to_seconds(heartbeat, "heartbeat") if heartbeat is not None
                          else self.lease / 3.0)
        self.encode = encode or _json_encode
        self.decode = decode or _json_decode
        self._active = threading.local()

    # ---- the decorator -------------------------------------------------------

    def __call__(self, handler: Callable) -> Callable:
        passed, default_fingerprint = _handler_shape(handler)

        @functools.wraps(handler)
        def wrapper(*args, **kwargs):
            key = self._resolve_key(args, kwargs)
            fingerprint = self._resolve_fingerprint(args, kwargs, default_fingerprint)
            run = self._begin(key, fingerprint)
            if run.replayed:
                return run.result
            _pass_claim(run, passed, kwargs)
            value = self._run(run, handler, args, kwargs)
            self._finish(run, value)
            return value

        wrapper.once = self
        return wrapper

    def _resolve_key(self, args, kwargs) -> bytes:
        if callable(self.key):
            return _claim_key(self.key(*args, **kwargs))
        return self.key

    def _resolve_fingerprint(self, args, kwargs, default: bytes) -> bytes:
        if callable(self.fingerprint):
            value = cmd.to_bytes(self.fingerprint(*args, **kwargs), "fingerprint")
        elif self.fingerprint is not None:
            value = self.fingerprint
        else:
            value = default
        if len(value) > FINGERPRINT_BYTES_MAX:
            value = b"sha256:" + hashlib.sha256(value).hexdigest().encode("ascii")
        return value

    # ---- the context manager -------------------------------------------------

    def __enter__(self) -> OnceRun:
        if callable(self.key):
            raise TypeError("a once used as a context manager needs a fixed key, not a callable")
        if getattr(self._active, "run", None) is not None:
            raise RuntimeError("this once is already active in this thread")
        fingerprint = self._resolve_fingerprint((), {}, self.key)
        run = self._begin(self.key, fingerprint)
        self._active.run = run
        if not run.replayed:
            self._active.token = _current_run.set(run)
        return run

    def __exit__(self, exc_type, exc, traceback) -> bool:
        run = self._active.run
        self._active.run = None
        if run.replayed:
            return False
        _current_run.reset(self._active.token)
        if exc is not None:
            self._failed(run, exc)
            return False
        self._finish(run, run._value)
        return False

    # ---- the cycle -----------------------------------------------------------

    def _begin(self, key: bytes, fingerprint: bytes) -> OnceRun:
        """Claims `key` with one claim id until won or completed, waiting out
        "in progress" answers up to `wait`."""
        claim_id = os.urandom(16)
        give_up = time.monotonic() + self.wait
        while True:
            answer = self.client.claim(key, fingerprint, self.lease, claim_id=claim_id)
            if isinstance(answer, Won):
                run = OnceRun(key, replayed=False, fence=answer.fence, attempt=answer.attempt)
                self._start_heartbeat(run)
                return run
            if isinstance(answer, Completed):
                try:
                    result = self.decode(answer.result)
                except Exception as undecodable:
                    raise errors.InvalidArgument(
                        f"the recorded result of {key!r} is not decodable ({undecodable}); "
                        f"raw bytes: {answer.result[:64]!r}") from undecodable
                return OnceRun(key, replayed=True, fence=answer.fence, attempt=answer.attempt,
                               result=result, completed_ms=answer.completed_ms)
            now = time.monotonic()
            if now >= give_up:
                raise errors.ClaimInProgress(
                    f"another holder's claim of {key!r} is in progress; retry after "
                    f"{answer.retry_after_ms} ms", retry_after_ms=answer.retry_after_ms,
                    attempt=answer.attempt)
            # Claim again when the holder's lease would run out (or sooner, to
            # see a completion early), never past the caller's patience.
            pause = min(max(answer.retry_after_ms, 10), 1000) / 1000.0
            time.sleep(min(pause, give_up - now))

    def _start_heartbeat(self, run: OnceRun) -> None:
        client, lease, every = self.client, self.lease, max(self.heartbeat, 0.01)

        def beat():
            while not run._stop.wait(every):
                try:
                    client.extend(run.key, run.fence, lease)
                except errors.Fenced:
                    run._fenced.set()
                    return
                except errors.OncekvError:
                    # Unreachable for now: the next beat tries again, and
                    # the lease covers the gap until it runs out.
                    continue

        threading.Thread(target=beat, name="oncekv-heartbeat", daemon=True).start()

    def _run(self, run: OnceRun, handler, args, kwargs):
        token = _current_run.set(run)
        try:
            return handler(*args, **kwargs)
        except Exception as failure:
            self._failed(run, failure)
            raise
        except BaseException:
            run._stop.set()  # held: the next caller takes over after the lease
            raise
        finally:
            _current_run.reset(token)

    def _failed(self, run: OnceRun, failure: BaseException) -> None:
        run._stop.set()
        if not isinstance(failure, Exception):
            return
        try:
            self.client.release(run.key, run.fence)
        except errors.OncekvError as release_error:
            if hasattr(failure, "add_note"):
                failure.add_note(f"oncekv: the claim of {run.key!r} was not released "
                                 f"({release_error}); the next holder takes over after the lease")

    def _finish(self, run: OnceRun, value) -> None:
        run._stop.set()
        try:
            data = self.encode(value)
        except Exception as refused:
            # The effect happened: releasing would run it again at once.
            # The key stays held; after the lease a new holder (attempt + 1)
            # must reconcile.
            raise errors.ResultNotRecorded(
                f"the handler ran but its result could not be encoded ({refused}); the claim "
                "stays held until its lease runs out", result=value, error=refused,
                fence=run.fence, attempt=run.attempt) from refused
        try:
            self.client.complete(run.key, run.fence, data)
        except errors.OncekvError as error:
            raise errors.ResultNotRecorded(
                f"the handler ran but its result was not recorded: {error}", result=value,
                error=error, fence=run.fence, attempt=run.attempt) from error
        run.result = value
