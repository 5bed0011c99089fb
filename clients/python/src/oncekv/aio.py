"""The asyncio flavour: `AsyncClient` has the methods of `Client`, as
coroutines (each defined here, so that type checkers see them; a test
keeps them in step with `Client`). Each call runs the synchronous
client's call in a worker thread (`asyncio.to_thread`), with the same
promises, retries and errors; so at most as many calls are in flight as
the default executor has threads. Cancelling a coroutine does not cancel
its call, which runs on in its thread to its own end (an answer, or a
deadline and a fence): a cancelled caller does not learn the outcome.
`from_env`, `endpoints` and `once` send nothing and are not coroutines.

`AsyncClient.once(...)` decorates an `async def` handler (or serves as an
`async with` block) with the semantics of `Client.once`: the claim,
completion and release run in worker threads, the heartbeat in its own
thread, the handler on the event loop. A handler cancelled
(`CancelledError`) leaves its claim held, as a dead holder does: the next
caller takes over after the lease. One `AsyncOnce` may be shared by many
tasks (a module-level `once`, like a lock): each `async with` keeps its
run per task, as `Once` keeps it per thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union

from . import claims as _claims
from . import commands as cmd
from ._proto import oncekv_pb2 as pb
from .client import Client, KeyedReply, env_arguments

__all__ = ["AsyncClient", "AsyncOnce"]

_F = TypeVar("_F", bound=Callable[..., Any])
_Token = contextvars.Token  # of `current_claim()`'s variable


def _as(method: Callable[..., Any]) -> Callable[[_F], _F]:
    """Gives the method the docstring of the `Client` method it runs."""

    def attach(function: _F) -> _F:
        function.__doc__ = method.__doc__
        return function

    return attach


class AsyncClient:
    """`oncekv.Client` for asyncio: the same constructor arguments; every call
    a coroutine. `async with AsyncClient(...) as client:` closes it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sync = Client(*args, **kwargs)

    @classmethod
    def from_env(cls, **kwargs: Any) -> "AsyncClient":
        """As `Client.from_env`: configured like the CLI (ONCEKV_ENDPOINTS,
        ONCEKV_TOKEN, ONCEKV_CA, ONCEKV_CERT, ONCEKV_KEY)."""
        endpoints, kwargs = env_arguments(kwargs)
        return cls(endpoints, **kwargs)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @_as(Client.endpoints)
    def endpoints(self) -> List[str]:
        return self.sync.endpoints()

    @_as(Client.put)
    async def put(self, key: cmd.Data, value: cmd.ValueLike) -> None:
        return await asyncio.to_thread(self.sync.put, key, value)

    @_as(Client.delete)
    async def delete(self, key: cmd.Data) -> bool:
        return await asyncio.to_thread(self.sync.delete, key)

    @_as(Client.increment)
    async def increment(self, key: cmd.Data, delta: int = 1) -> int:
        return await asyncio.to_thread(self.sync.increment, key, delta)

    @_as(Client.append)
    async def append(self, key: cmd.Data, element: cmd.Data) -> int:
        return await asyncio.to_thread(self.sync.append, key, element)

    @_as(Client.compare_and_swap)
    async def compare_and_swap(self, key: cmd.Data, expected: Optional[cmd.ValueLike],
                               new: cmd.ValueLike) -> Tuple[bool, Optional[cmd.ValueType]]:
        return await asyncio.to_thread(self.sync.compare_and_swap, key, expected, new)

    @_as(Client.get)
    async def get(self, key: cmd.Data) -> Optional[cmd.ValueType]:
        return await asyncio.to_thread(self.sync.get, key)

    @_as(Client.status)
    async def status(self, endpoint: Optional[str] = None) -> pb.StatusReply:
        return await asyncio.to_thread(self.sync.status, endpoint)

    @_as(Client.execute)
    async def execute(self, command: cmd.Command) -> cmd.Result:
        return await asyncio.to_thread(self.sync.execute, command)

    @_as(Client.execute_with_key)
    async def execute_with_key(self, key: cmd.Data, command: cmd.Command) -> KeyedReply:
        return await asyncio.to_thread(self.sync.execute_with_key, key, command)

    @_as(Client.execute_plain)
    async def execute_plain(self, command: cmd.Command) -> cmd.Result:
        return await asyncio.to_thread(self.sync.execute_plain, command)

    @_as(Client.client_id)
    async def client_id(self) -> int:
        return await asyncio.to_thread(self.sync.client_id)

    @_as(Client.claim)
    async def claim(self, key: cmd.Data, fingerprint: cmd.Data, lease: float = 30.0,
                    claim_id: Optional[bytes] = None) -> _claims.ClaimAnswer:
        return await asyncio.to_thread(self.sync.claim, key, fingerprint, lease, claim_id)

    @_as(Client.complete)
    async def complete(self, key: cmd.Data, fence: int, result: cmd.Data) -> int:
        return await asyncio.to_thread(self.sync.complete, key, fence, result)

    @_as(Client.release)
    async def release(self, key: cmd.Data, fence: int) -> None:
        return await asyncio.to_thread(self.sync.release, key, fence)

    @_as(Client.extend)
    async def extend(self, key: cmd.Data, fence: int, lease: float) -> float:
        return await asyncio.to_thread(self.sync.extend, key, fence, lease)

    @_as(Client.close)
    async def close(self) -> bool:
        return await asyncio.to_thread(self.sync.close)

    def once(self, key: Union[cmd.Data, Callable[..., cmd.Data]],
             fingerprint: Union[None, cmd.Data, Callable[..., cmd.Data]] = None,
             **options: Any) -> "AsyncOnce":
        """As `Client.once`, for `async def` handlers and `async with`."""
        return AsyncOnce(_claims.Once(self.sync, key, fingerprint, **options))


class AsyncOnce:
    """`Once` for coroutines: a decorator of `async def` handlers, and an
    `async with` block (see `Once` for the semantics). Each task's
    `async with` has its own run: one `AsyncOnce` may serve many tasks."""

    def __init__(self, once: _claims.Once):
        self.once = once
        # The run of each task inside `async with` this once, and the token
        # that restores its `current_claim()` on exit.
        self._active: Dict[asyncio.Task[Any], Tuple[_claims.OnceRun, Optional[_Token]]] = {}

    def __call__(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        once = self.once
        passed, default_fingerprint = _claims._handler_shape(handler)

        @functools.wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = once._resolve_key(args, kwargs)
            fingerprint = once._resolve_fingerprint(args, kwargs, default_fingerprint)
            run = await asyncio.to_thread(once._begin, key, fingerprint)
            if run.replayed:
                return run.result
            _claims._pass_claim(run, passed, kwargs)
            token = _claims._current_run.set(run)
            try:
                value = await handler(*args, **kwargs)
            except Exception as failure:
                await asyncio.to_thread(once._failed, run, failure)
                raise
            except BaseException:
                run._stop.set()  # held: the next caller takes over after the lease
                raise
            finally:
                _claims._current_run.reset(token)
            await asyncio.to_thread(once._finish, run, value)
            return value

        wrapper.once = once  # type: ignore[attr-defined]
        return wrapper

    async def __aenter__(self) -> _claims.OnceRun:
        once = self.once
        if callable(once.key):
            raise TypeError("a once used as a context manager needs a fixed key, not a callable")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("async with a once needs a running asyncio task")
        if task in self._active:
            raise RuntimeError("this once is already active in this task")
        fingerprint = once._resolve_fingerprint((), {}, once.key)
        run = await asyncio.to_thread(once._begin, once.key, fingerprint)
        token = None if run.replayed else _claims._current_run.set(run)
        self._active[task] = (run, token)
        return run

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], traceback: Any) -> bool:
        run, token = self._active.pop(asyncio.current_task())  # type: ignore[arg-type]
        if token is not None:
            _claims._current_run.reset(token)
        if run.replayed:
            return False
        if exc is not None:
            if isinstance(exc, Exception):
                await asyncio.to_thread(self.once._failed, run, exc)
            else:
                run._stop.set()
            return False
        await asyncio.to_thread(self.once._finish, run, run._value)
        return False
