"""``vramctl mcp --api``: the stdio server answering from a running controller's ``/mcp``.

The API app is served in-process by uvicorn on a free loopback port
(``tests/shell/test_mcp_http.py``'s :func:`serving`, over ``tests/shell/test_api.py``'s ``idle``
controller and its scripted observation); ``python -m controller.interfaces.cli mcp
--api`` is spawned as an MCP client would (the SDK's stdio client, as
``tests/shell/test_mcp.py`` does) in the same event loop. Its answers must be the ones
``/mcp`` gives directly; an API that does not answer is a tool error saying how to
fix it, or with ``-m`` a direct observation that says so. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from support.mcp_stdio import ARGS, ROOT, _env, tool_text
from support.serving import free_port
from test_api import TOKEN, idle, observe  # noqa: F401
from test_mcp_http import auth, serving

from controller.service.loop import Controller

T = TypeVar("T")


@asynccontextmanager
async def stdio_session(args: list[str]) -> AsyncIterator[ClientSession]:
    """An initialized session with a freshly spawned ``vramctl mcp ARGS``."""
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "controller.interfaces.cli", "mcp", *args],
        env=_env(),
        cwd=ROOT,
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        await s.list_tools()  # results are validated against these schemas
        yield s


def with_api(
    controller: Controller, fn: Callable[[str], Awaitable[T]], token: str | None = TOKEN
) -> T:
    """``fn(address)`` while the API app is served (address: HOST:PORT)."""

    async def main() -> T:
        async with serving(controller, token) as base:
            return await asyncio.wait_for(fn(base.removeprefix("http://")), 90)

    return asyncio.run(main())


def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


def test_reads_are_the_api_s_own_answers(idle: Controller, tmp_path: Path) -> None:  # noqa: F811
    now = time.time()
    observe(idle, {"res": {"state": "running"}, "omni": {"state": "running", "started_at": now}})
    calls: list[tuple[str, dict[str, Any]]] = [
        ("reservation_status", {}),
        ("serves_status", {}),
        ("can_fit", {"serve": "llm"}),
        ("can_fit", {"serve": "lml"}),
    ]

    async def go(address: str) -> tuple[list[Any], list[Any]]:
        async with stdio_session(["--api", address, "--token-file", token_file(tmp_path)]) as s:
            mine = [await s.call_tool(name, args) for name, args in calls]
        async with (
            httpx2.AsyncClient(headers=auth(), timeout=30, trust_env=False) as http,
            streamable_http_client(f"http://{address}/mcp", http_client=http) as (r, w),
            ClientSession(r, w) as direct,
        ):
            await direct.initialize()
            theirs = [await direct.call_tool(name, args) for name, args in calls]
        return mine, theirs

    mine, theirs = with_api(idle, go)
    for (name, _args), a, b in zip(calls, mine, theirs, strict=True):
        assert a.is_error == b.is_error, name
        assert tool_text(a) == tool_text(b), name
        assert a.structured_content == b.structured_content, name
    status = mine[0].structured_content
    assert status["source"]["controller"] == "vramctl run"
    assert status["gpu_roles"][0]["committed_mib"] == 7000
    # with the token: the full answer (no "shown only to a request with" note)
    assert not any("shown only to a request with" in n for n in status["notes"])
    assert mine[3].is_error and 'did you mean "llm"?' in tool_text(mine[3])


def test_writes_need_allow_writes_and_go_through_with_progress(
    idle: Controller,  # noqa: F811
    tmp_path: Path,
) -> None:
    now = time.time()
    observe(idle, {"res": {"state": "running"}, "omni": {"state": "running", "started_at": now}})
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(str(message))

    async def go(address: str) -> list[Any]:
        token = ["--token-file", token_file(tmp_path)]
        async with stdio_session(["--api", address, *token]) as s:
            refused = await s.call_tool("request_up", {"serve": "llm"})
        async with stdio_session(["--api", address, "--allow-writes"]) as s:
            no_token = await s.call_tool("request_up", {"serve": "llm"})
        async with stdio_session(["--api", address, "--allow-writes", *token]) as s:
            up = await s.call_tool(
                "request_up",
                {"serve": "llm", "ttl_s": 90, "wait_s": 1},
                progress_callback=on_progress,
            )
            big = await s.call_tool("request_up", {"serve": "big"})
            down = await s.call_tool("release", {"serve": "llm"})
        return [refused, no_token, up, big, down]

    refused, no_token, up, big, down = with_api(idle, go)
    assert refused.is_error and "--allow-writes" in tool_text(refused)
    assert no_token.is_error and "token" in tool_text(no_token)
    assert not up.is_error, tool_text(up)
    assert up.structured_content["status"] == 202 and up.structured_content["ready"] is False
    assert "llm: request.admitted" in progress, progress
    # the remote's refusal as it is: 429 with every term of the arithmetic
    assert big.is_error and tool_text(big).startswith("big does not fit")
    assert '"status": 429' in tool_text(big)
    assert not down.is_error and down.structured_content["ended"] is True


def test_an_unreachable_api_says_how_to_fix_it_or_observes_directly() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there

    async def go() -> list[Any]:
        async with stdio_session(["--api", address]) as s:
            status = await s.call_tool("reservation_status", {})
            up = await s.call_tool("request_up", {"serve": "stt"})
        async with stdio_session(["--api", address, *ARGS]) as s:
            observed = await s.call_tool("reservation_status", {})
        return [status, up, observed]

    status, up, observed = asyncio.run(asyncio.wait_for(go(), 90))
    assert status.is_error, tool_text(status)
    assert f"no vramctl run answers at http://{address}/mcp" in tool_text(status)
    assert "start `vramctl run`" in tool_text(status) and "drop --api" in tool_text(status)
    assert "Traceback" not in tool_text(status)
    assert up.is_error and "--allow-writes" in tool_text(up)  # refused before it is sent
    assert not observed.is_error, tool_text(observed)
    answer = observed.structured_content
    assert answer["source"]["controller"] is None and answer["source"]["api"] == "unreachable"
    assert answer["source"]["observed"].endswith("single-card.observed.json")
    assert any("observed directly" in n for n in answer["notes"]), answer["notes"]
    assert answer["gpu_roles"], answer


def test_a_wrong_token_is_a_tool_error(idle: Controller, tmp_path: Path) -> None:  # noqa: F811
    observe(idle, {"res": {"state": "running"}})
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    wrong.chmod(0o600)

    async def go(address: str) -> Any:
        async with stdio_session(["--api", address, "--token-file", str(wrong), *ARGS]) as s:
            return await s.call_tool("reservation_status", {})

    status = with_api(idle, go)
    # refused by the API: not an unreachable API, so no direct observation either
    assert status.is_error, status.structured_content
    assert "failed" in tool_text(status) and "token" in tool_text(status), tool_text(status)
    assert "Traceback" not in tool_text(status)
