"""The asyncio flavour: calls as coroutines, and `once` around an async
handler (recorded, replayed without calling, released on an exception,
one run among concurrent callers); one `async with` once shared by
concurrent tasks, `current_claim()` inside it; `from_env` and
`endpoints` as on `Client`."""

import asyncio

import pytest

import oncekv
from oncekv.aio import AsyncClient


def test_async_calls_and_once(cluster, key):
    async def main():
        async with AsyncClient(cluster.endpoints) as client:
            counter = key("counter")
            assert await asyncio.gather(*(client.increment(counter, 1) for _ in range(5))) != []
            assert await client.get(counter) == 5
            reply = await client.execute_with_key(key("msg"), oncekv.Increment(counter, 10))
            assert reply.result == oncekv.Incremented(15)

            runs = []

            @client.once(lambda order: key(f"charge-{order}"), lease=5)
            async def charge(order, fence, attempt):
                runs.append((order, attempt))
                await asyncio.sleep(0.2)
                if order == 2 and len(runs) == 2:
                    raise RuntimeError("provider down")
                return {"order": order, "fence": fence}

            first, second = await asyncio.gather(charge(1), charge(1))
            assert first == second and first["order"] == 1
            with pytest.raises(RuntimeError):
                await charge(2)
            assert (await charge(2))["order"] == 2
            assert runs == [(1, 1), (2, 1), (2, 2)]

            async with client.once(key("job"), lease=5) as run:
                assert not run.replayed
                run.record([1, 2])
            async with client.once(key("job"), lease=5) as run:
                assert run.replayed and run.result == [1, 2]

    asyncio.run(main())


def test_one_async_once_serves_concurrent_tasks(cluster, key):
    """One `AsyncOnce` (a module-level `once`, like a lock) used by several
    tasks at once: each `async with` has its own run, and inside it
    `current_claim()` is that run."""

    async def main():
        async with AsyncClient(cluster.endpoints) as client:
            job = client.once(key("job"), lease=5)

            async def worker(number):
                async with job as run:
                    if not run.replayed:
                        assert oncekv.current_claim() is run
                        run.record(number)
                    await asyncio.sleep(0.1 * (3 - number))  # leave in another order
                assert oncekv.current_claim() is None
                return run

            runs = await asyncio.gather(*(worker(number) for number in range(3)))
            assert [run.replayed for run in runs].count(False) == 1, runs
            winner = next(run for run in runs if not run.replayed)
            assert all(run.result == winner.result for run in runs if run.replayed)
            # A completed key: every task replays, all inside the block at once.
            replays = await asyncio.gather(*(worker(number) for number in range(3)))
            assert all(run.replayed and run.result == winner.result for run in replays)

    asyncio.run(main())


def test_async_client_from_env_and_endpoints(cluster, key, monkeypatch):
    monkeypatch.setenv("ONCEKV_ENDPOINTS", ",".join(cluster.endpoints))

    async def main():
        async with AsyncClient.from_env(call_timeout=5.0) as client:
            assert client.endpoints()[:3] == cluster.endpoints
            assert client.sync.call_timeout == 5.0
            assert await client.increment(key("counter"), 2) == 2

    asyncio.run(main())
