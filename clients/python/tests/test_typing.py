"""What a type checker sees of the package (it ships py.typed): every call
of `Client` defined on `AsyncClient` as a coroutine in its class body (not
attached at run time, which checkers cannot follow), with the same
parameters; `oncekv.__all__` a literal list naming the errors too (under
`--no-implicit-reexport` nothing else counts as exported); and, where mypy
is installed, `mypy --strict` passing on a script using the client."""

import ast
import inspect
import os
import textwrap

import pytest

import oncekv
from oncekv import aio, errors
from oncekv.client import Client

# Sends nothing, so plain methods on both (not coroutines).
PLAIN = {"once", "endpoints", "from_env"}


def public_calls(cls):
    return {name for name, member in inspect.getmembers(cls)
            if not name.startswith("_") and callable(member)}


def test_async_client_defines_every_call_of_client_in_its_body():
    tree = ast.parse(inspect.getsource(aio))
    body = next(node for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == "AsyncClient").body
    coroutines = {node.name for node in body if isinstance(node, ast.AsyncFunctionDef)}
    plain = {node.name for node in body if isinstance(node, ast.FunctionDef)}
    calls = public_calls(Client)
    assert calls - PLAIN <= coroutines, f"not coroutines: {calls - PLAIN - coroutines}"
    assert PLAIN <= plain
    for name in calls - {"once"}:
        sync, coroutine = inspect.signature(getattr(Client, name)), inspect.signature(
            getattr(aio.AsyncClient, name))
        assert list(coroutine.parameters) == list(sync.parameters), name
        assert inspect.iscoroutinefunction(getattr(aio.AsyncClient, name)) == (name not in PLAIN)


def test_all_is_a_literal_list_that_names_the_errors():
    tree = ast.parse(inspect.getsource(oncekv))
    assigned = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(target, "id", None) == "__all__" for target in node.targets)]
    assert len(assigned) == 1 and isinstance(assigned[0], ast.List)
    names = [ast.literal_eval(element) for element in assigned[0].elts]
    assert names == oncekv.__all__ and len(set(names)) == len(names)
    assert set(errors.__all__) <= set(names)
    assert all(hasattr(oncekv, name) for name in names)


USER_SCRIPT = '''
import asyncio
from typing import List, Optional, Union

import oncekv


def use(client: oncekv.Client) -> None:
    total: int = client.increment("paid", 10)
    client.put("name", "ada")
    swapped, current = client.compare_and_swap("name", "ada", b"eve")
    value: Union[None, bytes, int, List[bytes]] = client.get("paid")
    reply = client.execute_with_key("order-42", oncekv.Increment("paid", 10))
    if isinstance(reply.result, oncekv.Incremented):
        print(reply.result.value, reply.duplicate, total, swapped, current, value)
    answer = client.claim("job", "fingerprint", 30)
    if isinstance(answer, oncekv.Won):
        client.complete("job", answer.fence, b"done")
    with client.once("migrate", lease=60) as run:
        if not run.replayed:
            run.record(1)
    try:
        client.delete("name")
    except oncekv.OutcomeUnknown as unknown:
        print(unknown.seq, unknown.fenced, unknown.cause)
    except oncekv.LimitExceeded as exceeded:
        print(exceeded.limit, exceeded.limit_max, exceeded.limit_requested)
    except oncekv.OncekvError as error:
        print(error.reason, error.may_have_taken_effect)
    endpoints: List[str] = client.endpoints()
    closed: bool = client.close()
    print(endpoints, closed, oncekv.Client.from_env(call_timeout=5.0))


async def use_async() -> None:
    async with oncekv.AsyncClient(["127.0.0.1:7101"]) as client:
        total: int = await client.increment("paid")
        value: Optional[object] = await client.get("paid")
        reply = await client.execute_with_key("m", oncekv.Put("k", b"v"))
        left: float = await client.extend("job", 3, 30.0)
        async with client.once("job") as run:
            print(run.fence, oncekv.current_claim())
        print(total, value, reply.duplicate, left, client.endpoints())
    other = oncekv.AsyncClient.from_env()
    closed: bool = await other.close()
    print(closed)


asyncio.run(use_async())
'''


def test_a_user_script_passes_mypy_strict(tmp_path):
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (not a CI requirement)")
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    out, err, status = api.run(["--strict", "--no-incremental", "--cache-dir", os.devnull,
                                str(script)])
    assert status == 0, out + err
