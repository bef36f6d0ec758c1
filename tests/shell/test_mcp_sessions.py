"""``/mcp``'s sessions opened without the token: bounded in count and in lifetime, and
never in the way of one opened with the token (docs/agents.md, "Its sessions").

The API app served by uvicorn on a free loopback port (``tests/shell/test_mcp_http.py``'s
:func:`run`, as ``vramctl run`` serves it: its lifespan runs the MCP session manager)
over ``tests/shell/test_api.py``'s ``idle`` controller with a scripted observation. Sessions
without the token are opened over plain HTTP and never closed (``tests/mcp_raw.py``),
as a client that leaks them would; whether the server still holds one is asked with a
ping inside it (404: it was ended). The client with the token is the SDK's. Nothing is
mocked. ``tests/shell/test_chaos.py`` floods a real ``vramctl run`` with thousands and
watches its memory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
from mcp_raw import alive, open_session
from support.mcp_stdio import tool_text
from test_api import idle, observe  # noqa: F401
from test_mcp_http import auth, run

from controller.interfaces.api import ApiSettings
from controller.service.loop import Controller


def opened(url: str, n: int) -> list[str]:
    """``n`` new sessions without the token, in order, left open."""
    with httpx.Client(trust_env=False, timeout=30) as http:
        return [open_session(http, url) for _ in range(n)]


def held(url: str, ids: list[str]) -> list[bool]:
    """Whether the server still holds each session (a ping in it is a use)."""
    with httpx.Client(trust_env=False, timeout=30) as http:
        return [alive(http, url, sid) for sid in ids]


async def served(session: Any) -> None:
    """The SDK's client with the token lists the tools and calls one."""
    assert {t.name for t in (await session.list_tools()).tools} >= {"can_fit", "request_up"}
    status = await session.call_tool("reservation_status", {})
    assert not status.is_error, tool_text(status)
    assert status.structured_content["gpu_roles"][0]["committed_mib"] == 3000


def test_sessions_without_the_token_are_bounded_and_the_token_is_served(
    idle: Controller,  # noqa: F811
) -> None:
    observe(idle, {"res": {"state": "running"}})

    async def go(base: str, session: Callable[..., Any]) -> list[bool]:
        url = f"{base}/mcp"
        ids = await asyncio.to_thread(opened, url, 100)  # each answered 200
        still = await asyncio.to_thread(held, url, ids)
        async with session(auth()) as s:
            await served(s)
        return still

    still = run(idle, go)
    assert not still[0], "the first session without the token outlived 99 more"
    limit = ApiSettings().mcp_sessions_without_token
    assert still == [False] * (100 - limit) + [True] * limit, still


def test_the_least_recently_used_makes_room_and_the_token_keeps_its_own(
    idle: Controller,  # noqa: F811
) -> None:
    observe(idle, {"res": {"state": "running"}})

    async def go(base: str, session: Callable[..., Any]) -> tuple[list[bool], list[bool]]:
        url = f"{base}/mcp"
        async with session(auth()) as first:
            a, b, c = await asyncio.to_thread(opened, url, 3)
            assert await asyncio.to_thread(held, url, [a]) == [True]  # a is used: b is oldest
            (d,) = await asyncio.to_thread(opened, url, 1)
            lru = await asyncio.to_thread(held, url, [a, b, c, d])
            flood = await asyncio.to_thread(opened, url, 30)  # the pool is full: all served
            async with session(auth()) as second:  # the token's own allowance: 2
                await served(second)
                await served(first)
            return lru, await asyncio.to_thread(held, url, flood)

    lru, flood = run(idle, go, mcp_sessions_without_token=3, mcp_sessions_with_token=2)
    assert lru == [True, False, True, True], lru
    assert flood == [False] * 27 + [True] * 3, flood


def test_a_session_without_the_token_ends_after_its_lifetime(
    idle: Controller,  # noqa: F811
) -> None:
    observe(idle, {"res": {"state": "running"}})

    async def go(base: str, session: Callable[..., Any]) -> float:
        url = f"{base}/mcp"
        async with session(auth()) as s:
            t0 = time.monotonic()
            (sid,) = await asyncio.to_thread(opened, url, 1)
            while await asyncio.to_thread(held, url, [sid]) == [True]:  # no other request
                assert time.monotonic() - t0 < 30, "the session outlived its lifetime"
                await asyncio.sleep(0.1)
            ended = time.monotonic() - t0
            await served(s)  # the token's session has no such bound
            return ended

    assert run(idle, go, mcp_session_without_token_s=1.0) >= 1.0
