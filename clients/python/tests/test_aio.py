"""The asyncio flavour: calls as coroutines, and `once` around an async
handler (recorded, replayed without calling, released on an exception,
one run among concurrent callers)."""

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
