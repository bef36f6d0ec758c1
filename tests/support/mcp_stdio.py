"""``vramctl mcp`` reached as an MCP client reaches it, over stdio: the single-card
example and its saved observation, a session on a freshly spawned server, a tool
result's text.

Shared by the MCP tests; what the tools must answer stays in them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from support.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
OBSERVED = ROOT / "manifests" / "examples" / "single-card.observed.json"
ARGS = ["-m", str(EXAMPLE), "--observed", str(OBSERVED)]
#: what the tools add to the command line's JSON (where it was answered from, notes)
ADDED = {"hypothetical", "notes", "source"}

T = TypeVar("T")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMCTL_")}
    env.update(COLUMNS="200", NO_COLOR="1", TERM="dumb")
    return env


def vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=_env(), cwd=ROOT)


def with_session(
    fn: Callable[[ClientSession], Awaitable[T]],
    args: list[str] = ARGS,
    launcher: list[str] | None = None,
) -> T:
    """``fn``'s answer on a session with a freshly spawned ``vramctl mcp ARGS``
    (``launcher``: the command that runs ``vramctl``; default this interpreter's
    module)."""
    command = launcher or [sys.executable, "-m", "controller.interfaces.cli"]
    server = StdioServerParameters(
        command=command[0],
        args=[*command[1:], "mcp", *args],
        env=_env(),
        cwd=ROOT,
    )

    async def main() -> T:
        with anyio.fail_after(60):
            async with stdio_client(server) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                await s.list_tools()  # the client validates results against these schemas
                return await fn(s)

    return anyio.run(main)


def tool_text(result: Any) -> str:
    """The text of a tool call's result (its text contents, one a line)."""
    return "\n".join(getattr(c, "text", "") for c in result.content)
