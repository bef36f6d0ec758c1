"""The ``/mcp`` session flood: sessions opened without the token against the running
controller's API and never closed; then the controller's memory and a client with the token.

:func:`flood_round` warms the route up with one session of the SDK's client with the
token, reads the controller process's resident memory (``VmRSS`` in
``/proc/PID/status``), opens N sessions without the token over plain HTTP
(``tests/mcp_raw.py``: ``initialize`` only, no ``DELETE``, a few at a time), reads the
memory again, and has the SDK's client with the token list the tools and call one.
:class:`FloodRound` holds what was seen and says what is wrong with it: the memory more
than 20 % above what it was, an opening not answered 200 (the bounds on sessions end
the one used least recently to make room: nobody is refused, docs/agents.md), or the
client with the token not served (before those bounds, 10,000 such sessions took
every new session's room, one with the token too).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_raw import flood

#: how far above its memory before the flood the controller may be after it
RSS_BOUND = 0.20


@dataclass(frozen=True)
class FloodRound:
    """One flood: its size, the answers by status, the memory, the token's client."""

    sessions: int
    answers: dict[int, int]
    rss_before_kib: int
    rss_after_kib: int
    seconds: float
    #: what failed for the client with the token after the flood (None: it was served)
    token_failure: str | None

    @property
    def ratio(self) -> float:
        """The memory after the flood over the memory before."""
        return self.rss_after_kib / self.rss_before_kib

    def problems(self) -> list[str]:
        """What is wrong with this round (empty: nothing)."""
        out = []
        if self.ratio > 1 + RSS_BOUND:
            out.append(
                f"the controller's memory went {self.rss_before_kib // 1024} -> "
                f"{self.rss_after_kib // 1024} MiB ({self.ratio:.2f}x) over {self.sessions} "
                "sessions without the token"
            )
        if set(self.answers) != {200}:
            out.append(f"openings without the token answered {self.answers}, not all 200")
        if self.token_failure is not None:
            out.append(f"after the flood, the client with the token: {self.token_failure}")
        return out

    def brief(self) -> str:
        """One line for the campaign's log."""
        return (
            f"{self.sessions} sessions in {self.seconds:.1f}s, answers {self.answers}, RSS "
            f"{self.rss_before_kib // 1024} -> {self.rss_after_kib // 1024} MiB "
            f"({self.ratio:.2f}x), token {'served' if self.token_failure is None else 'refused'}"
        )


def rss_kib(pid: int) -> int:
    """The process's resident memory (``VmRSS``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def with_token(url: str, token: str) -> str | None:
    """The SDK's client with the token: lists the tools and calls one; what failed, or
    None when it was served."""

    async def main() -> str | None:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30, trust_env=False) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            if "reservation_status" not in tools:
                return f"tools/list answered {sorted(tools)}"
            status = await session.call_tool("reservation_status", {})
            return "reservation_status: an error" if status.is_error else None

    try:
        return asyncio.run(asyncio.wait_for(main(), 60))
    except Exception as exc:  # the SDK's task groups: say what, never a traceback
        return f"{type(exc).__name__}: {exc}"


def flood_round(url: str, pid: int, token: str, sessions: int) -> FloodRound:
    """Flood ``url`` (a controller's ``/mcp``, process ``pid``) with ``sessions``
    sessions without the token (see the module doc)."""
    warm = with_token(url, token)
    if warm is not None:
        raise AssertionError(f"the client with the token was not served before the flood: {warm}")
    before = rss_kib(pid)
    t0 = time.monotonic()
    answers: Counter[int] = flood(url, sessions)
    took = time.monotonic() - t0
    after = rss_kib(pid)
    return FloodRound(sessions, dict(answers), before, after, took, with_token(url, token))
