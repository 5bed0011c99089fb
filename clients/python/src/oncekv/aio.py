"""The asyncio flavour: `AsyncClient` has the methods of `Client`, as
coroutines. Each call runs the synchronous client's call in a worker
thread (`asyncio.to_thread`), with the same promises, retries and errors;
so at most as many calls are in flight as the default executor has
threads. Cancelling a coroutine does not cancel its call, which runs on in
its thread to its own end (an answer, or a deadline and a fence): a
cancelled caller does not learn the outcome.

`AsyncClient.once(...)` decorates an `async def` handler (or serves as an
`async with` block) with the semantics of `Client.once`: the claim,
completion and release run in worker threads, the heartbeat in its own
thread, the handler on the event loop. A handler cancelled
(`CancelledError`) leaves its claim held, as a dead holder does: the next
caller takes over after the lease.
"""

from __future__ import annotations

import asyncio
import functools

from . import claims as _claims
from .client import Client

__all__ = ["AsyncClient", "AsyncOnce"]

_CALLS = ("put", "delete", "increment", "append", "compare_and_swap", "get", "status", "execute",
          "execute_with_key", "execute_plain", "client_id", "claim", "complete", "release",
          "extend", "close")


class AsyncClient:
    """`oncekv.Client` for asyncio: the same constructor arguments; every call
    a coroutine. `async with AsyncClient(...) as client:` closes it."""

    def __init__(self, *args, **kwargs):
        self.sync = Client(*args, **kwargs)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def once(self, key, fingerprint=None, **options) -> "AsyncOnce":
        """As `Client.once`, for `async def` handlers and `async with`."""
        return AsyncOnce(_claims.Once(self.sync, key, fingerprint, **options))


def _delegate(name):
    method = getattr(Client, name)

    @functools.wraps(method)
    async def call(self, *args, **kwargs):
        return await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)

    return call


for _name in _CALLS:
    setattr(AsyncClient, _name, _delegate(_name))


class AsyncOnce:
    """`Once` for coroutines: a decorator of `async def` handlers, and an
    `async with` block (see `Once` for the semantics)."""

    def __init__(self, once: _claims.Once):
        self.once = once

    def __call__(self, handler):
        once = self.once
        passed, default_fingerprint = _claims._handler_shape(handler)

        @functools.wraps(handler)
        async def wrapper(*args, **kwargs):
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

        wrapper.once = once
        return wrapper

    async def __aenter__(self) -> _claims.OnceRun:
        once = self.once
        if callable(once.key):
            raise TypeError("a once used as a context manager needs a fixed key, not a callable")
        fingerprint = once._resolve_fingerprint((), {}, once.key)
        self._run = await asyncio.to_thread(once._begin, once.key, fingerprint)
        return self._run

    async def __aexit__(self, exc_type, exc, traceback) -> bool:
        run, self._run = self._run, None
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
