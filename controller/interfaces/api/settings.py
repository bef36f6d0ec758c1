"""The API's configuration: what ``vramctl run`` was told (token, origins, address).

Holds no state and serves nothing; :mod:`controller.interfaces.api.guard` applies it to
each request (docs/design.md §5, "Security" in :mod:`controller.interfaces.api`).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.interfaces.client import HEARTBEAT_S
from controller.interfaces.upwait import MAX_WAIT_S

MAX_BODY_BYTES = 64 * 1024
NO_TOKEN_MESSAGE = (
    "this vramctl run has no API token configured, so state-changing requests are refused: "
    "restart it with --token-file FILE (or VRAMCTL_TOKEN_FILE=FILE, or VRAMCTL_TOKEN=TOKEN) "
    "and send 'Authorization: Bearer TOKEN'"
)


# ── configuration ────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """What the API was configured with."""

    token: str | None = None
    allow_origins: tuple[str, ...] = ()
    retry_after_s: float = 5.0
    #: the longest an ``up`` holds its answer (``wait_s`` is cut to this)
    max_wait_s: float = MAX_WAIT_S
    #: the address the API listens on; on loopback, a request whose Host header names
    #: anything else is refused (a DNS-rebinding page cannot read the ledger)
    bind_host: str | None = None
    #: the port it listens on (the MCP transport's allowed Host values name it)
    bind_port: int | None = None
    #: seconds of silence before the event stream sends a keepalive comment
    events_heartbeat_s: float = HEARTBEAT_S
    #: ``/mcp`` sessions opened without the token held at once (each about 40 KiB): a
    #: new one ends the one used least recently (docs/agents.md, "Its sessions")
    mcp_sessions_without_token: int = 32
    #: seconds a session opened without the token lives at most, used or not
    mcp_session_without_token_s: float = 600.0
    #: ``/mcp`` sessions opened with the token: their own room, beside those; past it a
    #: new one is refused (503) until one ends (the SDK's idle timeout: 30 minutes)
    mcp_sessions_with_token: int = 1000


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def host_allowed(host_header: str | None, bind_host: str | None) -> bool:
    """True when the Host header is acceptable for an API bound to ``bind_host``."""
    if bind_host is None or bind_host not in LOOPBACK_NAMES:
        return True  # bound elsewhere on purpose: the operator guards the network
    if not host_header:
        return True  # HTTP/1.0 clients send none; a browser always does
    name = host_header.strip().lower()
    if name.startswith("["):
        name = name[: name.find("]") + 1]
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    return name in LOOPBACK_NAMES
