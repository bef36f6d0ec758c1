"""``/mcp`` inside ``vramctl run``: the MCP server over Streamable HTTP (docs/agents.md).

The API app (:func:`controller.interfaces.api.create_app`) over a controller that has
not cycled (``tests/shell/test_api.py``'s ``idle`` fixture) and then one with a scripted
observation (its ``observe``), served by uvicorn on a free loopback port in the test's
own event loop (its lifespan runs the MCP session manager, as ``vramctl run``'s does);
the SDK's own client (``mcp.client.streamable_http``) and plain HTTP against it. The
tools must answer what the API's ``/v1`` answers, from the same live view. Nothing
is mocked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
import uvicorn
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from support.mcp_stdio import tool_text
from support.serving import free_port
from test_api import TOKEN, Live, calm, idle, live, observe  # noqa: F401

from controller.interfaces.api import ApiSettings, create_app
from controller.interfaces.mcp_server import PUBLIC_NO_SERVE
from controller.service.loop import Controller

T = TypeVar("T")
HOST = "127.0.0.1"
READS = {"reservation_status", "serves_status", "can_fit", "plan_preview"}
WRITES = {"request_up", "release"}


@asynccontextmanager
async def serving(
    controller: Controller, token: str | None = TOKEN, **settings_: Any
) -> AsyncIterator[str]:
    """The API app served on a free loopback port (``settings_``: more of its
    :class:`ApiSettings`); yields its base URL."""
    port = free_port()
    settings = ApiSettings(
        token=token, retry_after_s=5.0, bind_host=HOST, bind_port=port, **settings_
    )
    app = create_app(controller, settings)
    config = uvicorn.Config(app, host=HOST, port=port, lifespan="on", log_config=None)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        assert not task.done(), task
        await asyncio.sleep(0.02)
    try:
        yield f"http://{HOST}:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def run(
    controller: Controller,
    fn: Callable[[str, Callable[..., Any]], Awaitable[T]],
    token: str | None = TOKEN,
    **settings: Any,
) -> T:
    """``fn(base_url, session)`` against the served app (``settings``: more of its
    :class:`ApiSettings`); ``session(headers)`` opens an initialized SDK client session
    with those headers."""

    async def main() -> T:
        async with serving(controller, token, **settings) as base:

            @asynccontextmanager
            async def session(
                headers: dict[str, str] | None = None,
            ) -> AsyncIterator[ClientSession]:
                async with (
                    httpx2.AsyncClient(headers=headers or {}, timeout=30) as http,
                    streamable_http_client(f"{base}/mcp", http_client=http) as (read, write),
                    ClientSession(read, write) as s,
                ):
                    await s.initialize()
                    await s.list_tools()  # results are validated against these schemas
                    yield s

            return await asyncio.wait_for(fn(base, session), 60)

    return asyncio.run(main())


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def test_tools_answer_from_the_live_view_as_v1_does(idle: Controller) -> None:  # noqa: F811
    now = time.time()
    observe(idle, {"res": {"state": "running"}, "omni": {"state": "running", "started_at": now}})

    async def go(base: str, session: Callable[..., Any]) -> None:
        async with httpx2.AsyncClient(base_url=base) as http:
            ledger = (await http.get("/v1/ledger")).json()
            fit = (await http.get("/v1/fit/llm")).json()
            big = (await http.get("/v1/fit/big")).json()
            serves = (await http.get("/v1/serves")).json()
        async with session() as s:  # no token: reads are allowed, as the API's are
            listed = {t.name: t for t in (await s.list_tools()).tools}
            assert set(listed) == READS | WRITES
            for name in READS:
                assert listed[name].annotations.read_only_hint is True
            up, release = listed["request_up"].annotations, listed["release"].annotations
            assert up.read_only_hint is False and up.idempotent_hint is False
            assert release.destructive_hint is True
            status = await s.call_tool("reservation_status", {})
            can = await s.call_tool("can_fit", {"serve": "llm"})
            cannot = await s.call_tool("can_fit", {"serve": "big"})
            rows = await s.call_tool("serves_status", {})
            size = await s.call_tool("can_fit", {"vram_mib": 5000, "gpu_role": "a"})
            typo = await s.call_tool("can_fit", {"serve": "lml"})
        for result in (status, can, cannot, rows, size):
            assert not result.is_error, tool_text(result)
        answer = status.structured_content
        assert answer["gpu_roles"] == ledger["gpu_roles"]
        assert answer["docker"] == ledger["docker"] == "ok"
        assert answer["source"]["observed"] == "live"
        assert answer["source"]["controller"] == "vramctl run"
        [role] = answer["gpu_roles"]
        assert role["committed_mib"] == 7000 and role["budget_mib"] == 9000
        # can_fit is GET /v1/fit's answer (less its live_meta), from the same live view
        for result, api in ((can, fit), (cannot, big)):
            mine = result.structured_content
            for key in ("serve", "fits", "reason", "gpu_roles", "drain", "evict", "blockers"):
                assert mine[key] == api[key], key
        assert can.structured_content["fits"] is True
        assert can.structured_content["evict"] == ["omni"]
        assert cannot.structured_content["fits"] is False
        # N MiB on a role: the same arithmetic as llm's 5000 MiB
        assert size.structured_content["hypothetical"] is True
        assert size.structured_content["evict"] == ["omni"]
        mine_rows = rows.structured_content["serves"]
        assert [r["serve"] for r in mine_rows] == [r["serve"] for r in serves["serves"]]
        for mine, theirs in zip(mine_rows, serves["serves"], strict=True):
            assert mine["lifecycle"] == theirs["lifecycle"], mine["serve"]
            assert mine["reservation_mib"] == theirs["reservation_mib"], mine["serve"]
        # without the token: names, states and figures only, as GET /v1/serves; a
        # refusal in a fixed wording that echoes nothing (tests/e2e/test_mcp_tokenless.py)
        assert typo.is_error and tool_text(typo) == PUBLIC_NO_SERVE
        assert any("shown only to a request with" in n for n in answer["notes"]), answer
        async with session(auth()) as s:
            full = (await s.call_tool("reservation_status", {})).structured_content
            typo = await s.call_tool("can_fit", {"serve": "lml"})
        assert full["gpu_roles"] == answer["gpu_roles"]
        assert len(full["notes"]) == len(answer["notes"]) - 1
        assert typo.is_error and 'did you mean "llm"?' in tool_text(typo)

    run(idle, go)


def test_before_the_first_cycle_the_tools_say_unknown(idle: Controller) -> None:  # noqa: F811
    async def go(_base: str, session: Callable[..., Any]) -> None:
        async with session(auth()) as s:
            status = await s.call_tool("reservation_status", {})
            fit = await s.call_tool("can_fit", {"serve": "llm"})
        [role] = status.structured_content["gpu_roles"]
        assert status.structured_content["docker"] == "unknown"
        assert role["committed_mib"] is None and role["free_mib"] is None
        assert fit.is_error and "no observation yet" in tool_text(fit)

    run(idle, go)


def test_a_foreign_origin_or_host_is_refused(idle: Controller) -> None:  # noqa: F811
    observe(idle, {})
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}

    async def go(base: str, _session: Callable[..., Any]) -> None:
        async with httpx2.AsyncClient(base_url=base) as http:
            ok = await http.post("/mcp", json=init, headers=accept)
            foreign = await http.post(
                "/mcp", json=init, headers={**accept, "Origin": "http://evil.example"}
            )
            rebound = await http.post(
                "/mcp", json=init, headers={**accept, "Host": "evil.example:80"}
            )
            wrong = await http.post(
                "/mcp", json=init, headers={**accept, "Authorization": "Bearer nope"}
            )
            wrong_get = await http.get(
                "/mcp", headers={"Accept": "text/event-stream", "Authorization": "Bearer nope"}
            )
            # the API's guard checks the host's name; the SDK's protection, behind it, has
            # the API's own port too: loopback on another port is refused there
            other_port = await http.post(
                "/mcp", json=init, headers={**accept, "Host": "127.0.0.1:1"}
            )
        assert ok.status_code == 200, ok.text
        assert wrong_get.status_code == 403
        assert other_port.status_code == 421 and "Host" in other_port.text
        assert foreign.status_code == 403 and "origin" in foreign.text
        assert rebound.status_code == 403
        assert wrong.status_code == 403 and "wrong" in wrong.text

    run(idle, go)


def test_a_write_without_the_token_is_refused(idle: Controller) -> None:  # noqa: F811
    observe(idle, {"res": {"state": "running"}})

    async def go(_base: str, session: Callable[..., Any]) -> None:
        async with session() as s:
            up = await s.call_tool("request_up", {"serve": "llm"})
            down = await s.call_tool("release", {"serve": "llm"})
        for result in (up, down):
            assert result.is_error and "Authorization: Bearer" in tool_text(result)
        assert idle.journal.active_requests() == []

    run(idle, go)


def test_the_writes_go_through_the_api_verbs(idle: Controller) -> None:  # noqa: F811
    """In-process, on a scripted observation (no loop runs: nothing becomes ready)."""
    now = time.time()
    observe(idle, {"res": {"state": "running"}, "omni": {"state": "running", "started_at": now}})
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(str(message))

    async def go(_base: str, session: Callable[..., Any]) -> list[Any]:
        async with session(auth()) as s:
            return [
                await s.call_tool("request_up", {"serve": "big"}),
                await s.call_tool("request_up", {"serve": "off"}),
                await s.call_tool("request_up", {"serve": "llm", "ttl_s": -1}),
                await s.call_tool(
                    "request_up",
                    {"serve": "llm", "ttl_s": 90, "wait_s": 1},
                    progress_callback=on_progress,
                ),
                await s.call_tool("release", {"serve": "llm"}),
                await s.call_tool("release", {"serve": "llm"}),
            ]

    big, off, bad, up, down, again = run(idle, go)
    # 429 with every term of the arithmetic, as POST .../up answers
    assert big.is_error and tool_text(big).startswith("big does not fit")
    assert '"status": 429' in tool_text(big) and '"shortfall_mib"' in tool_text(big)
    assert (
        off.is_error
        and 'desired = "stopped"' in tool_text(off)
        and '"status": 409' in tool_text(off)
    )
    assert bad.is_error and "ttl_s must be more than 0" in tool_text(bad)
    assert not up.is_error, tool_text(up)
    answer = up.structured_content
    assert answer["status"] == 202 and answer["ready"] is False  # no loop here
    assert answer["fit"]["evict"] == ["omni"] and answer["request"]["ttl_s"] == 90
    assert "llm: request.admitted" in progress
    assert not down.is_error and down.structured_content["ended"] is True
    assert again.is_error and "no active on-demand request" in tool_text(again)


@pytest.mark.docker
def test_request_up_waits_with_progress_on_the_real_daemon(calm: Live) -> None:  # noqa: F811
    """``vramctl run`` over real containers: request_up with wait_s reports the plan's
    steps as progress and answers when llm is ready; release brings omni back."""
    lv = calm
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(str(message))

    async def main() -> list[Any]:
        async with (
            httpx2.AsyncClient(headers=auth(), timeout=60, trust_env=False) as http,
            streamable_http_client(f"{lv.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            await s.list_tools()
            up = await s.call_tool(
                "request_up",
                {"serve": "llm", "ttl_s": 120, "wait_s": 30},
                progress_callback=on_progress,
            )
            status = await s.call_tool("reservation_status", {})
            down = await s.call_tool("release", {"serve": "llm"})
            return [up, status, down]

    up, status, down = asyncio.run(asyncio.wait_for(main(), 90))
    assert not up.is_error, tool_text(up)
    assert up.structured_content["status"] == 200 and up.structured_content["ready"] is True
    assert "stop omni: ok" in progress and "start llm: ok" in progress, progress
    assert any(p.startswith("plan of cycle") for p in progress), progress
    reservations = status.structured_content["gpu_roles"][0]["reservations"]
    assert {r["serve"] for r in reservations} == {"res", "llm"}
    assert not down.is_error and down.structured_content["ended"] is True
    lv.converged(llm="down", omni="running")


@pytest.mark.docker
def test_run_stops_promptly_with_an_mcp_session_open(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    """SIGTERM while an agent holds a session (its GET stream open): the sessions are
    ended first, so the API does not wait out its graceful timeout and cut them with
    a traceback in the log."""
    lv = Live(docker_client, test_image, tmp_path)
    try:
        for serve in ("res", "omni", "llm", "big", "off"):
            lv.create(serve, running=serve in ("res", "omni"))
        lv.create("alt", running=False, port="res")
        lv.start()

        async def main() -> float:
            async with (
                httpx2.AsyncClient(headers=auth(), timeout=30, trust_env=False) as http,
                streamable_http_client(f"{lv.url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as s,
            ):
                await s.initialize()
                await s.list_tools()
                await asyncio.sleep(0.5)  # the client's GET stream is open by now
                t0 = time.monotonic()
                assert await asyncio.to_thread(lv.stop) == 0
                return time.monotonic() - t0

        took = asyncio.run(asyncio.wait_for(main(), 60))
        assert took < 2.5, took  # uvicorn's graceful timeout is 3 s
        assert "Traceback" not in lv.logs() and "graceful shutdown exceeded" not in lv.logs()
    finally:
        lv.close()
