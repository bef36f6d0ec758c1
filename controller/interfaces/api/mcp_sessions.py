"""The bounds on ``/mcp``'s sessions: those opened without the token are few and short-lived,
and never take the room of those opened with it.

An MCP session (Streamable HTTP) is opened by an ``initialize`` without a session id and
lives on the server (its transport, streams and task: about 40 KiB) until its client ends
it (``DELETE``), it has been idle for the SDK's timeout (30 minutes; an open event stream
counts as busy), or the server stops. A client that never ends its sessions, or one that
opens them on purpose, would otherwise fill memory and then the SDK's table, after which
every new session is refused, one with the token too.

:class:`SessionPools` stands in front of the SDK's endpoint (its own ASGI app, after the
API's guards, which leave in the scope whether the request carried the right token:
:data:`~controller.interfaces.api.guard.MCP_AUTHORIZED`):

- a session opened without the token counts in a pool of
  ``settings.mcp_sessions_without_token``; when the pool is full, a new one ends the one
  used least recently, so the new caller is always served and a client that leaks its
  sessions is not locked out by its own leftovers (refusing the new one instead would
  keep a flood's sessions and shut out whoever comes next, for the whole lifetime);
- each is ended ``settings.mcp_session_without_token_s`` after it opened, used or not
  (:meth:`SessionPools.expiring` runs that beside the session manager);
- sessions opened with the token are not counted here: the SDK's table holds
  ``settings.mcp_sessions_with_token`` beyond the pool, so the pool can never take
  their room (:func:`sdk_max_sessions`).

This module only counts and ends sessions; it answers no tool and reads no controller
state.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

from loguru import logger
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from controller.interfaces.api.errors import error_response
from controller.interfaces.api.guard import MCP_AUTHORIZED
from controller.interfaces.api.settings import ApiSettings
from controller.interfaces.mcp_server import HttpTransport

#: the header that names a request's session (the protocol's)
SESSION_HEADER = "mcp-session-id"
#: the answer when more sessions without the token are being opened at once than the
#: pool holds (nothing is left to end to make room for them)
TOO_MANY_OPENING = (
    "too many sessions without the API's token are being opened at once: try again, or "
    "send 'Authorization: Bearer TOKEN'"
)


def sdk_max_sessions(settings: ApiSettings) -> int:
    """The SDK's own cap: the token's allowance beyond the pool's."""
    return settings.mcp_sessions_with_token + settings.mcp_sessions_without_token


class SessionPools:
    """ASGI: the SDK's ``/mcp`` endpoint, its sessions without the token bounded (see
    the module doc)."""

    def __init__(
        self,
        transport: HttpTransport,
        settings: ApiSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.limit = settings.mcp_sessions_without_token
        self.lifetime_s = settings.mcp_session_without_token_s
        self.clock = clock
        #: the sessions opened without the token: id -> when it opened, least recently
        #: used first
        self.anonymous: OrderedDict[str, float] = OrderedDict()
        #: openings without the token being answered now (counted in the pool)
        self.opening = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.transport.app(scope, receive, send)
            return
        sid = Headers(scope=scope).get(SESSION_HEADER)
        if sid is not None and sid in self.anonymous:
            self.anonymous.move_to_end(sid)  # used now
        if sid is not None or scope.get(MCP_AUTHORIZED) or scope["method"] != "POST":
            await self.transport.app(scope, receive, send)
            return
        await self._open_anonymous(scope, receive, send)

    async def _open_anonymous(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A session opened without the token: room made first, then counted from the
        moment the SDK answers with its id."""
        if not await self._make_room():
            await error_response(503, TOO_MANY_OPENING)(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                sid = Headers(raw=message["headers"]).get(SESSION_HEADER)
                if sid is not None:
                    self.anonymous[sid] = self.clock()
            await send(message)

        self.opening += 1
        try:
            await self.transport.app(scope, receive, counted)
        finally:
            self.opening -= 1

    async def _make_room(self) -> bool:
        """End the sessions past their lifetime, then the least recently used ones until
        a new one fits; False when the openings under way fill the pool by themselves."""
        ending = self._due()
        while self.anonymous and len(self.anonymous) + self.opening >= self.limit:
            sid, _opened = self.anonymous.popitem(last=False)
            ending.append(sid)
        await self._end(ending)
        return len(self.anonymous) + self.opening < self.limit

    def _due(self) -> list[str]:
        """Take out of the pool the sessions the SDK ended itself (a DELETE, its idle
        timeout) and those past their lifetime; the latter are returned, to be ended."""
        held = self.transport.open_sessions()
        now = self.clock()
        due: list[str] = []
        for sid, opened in list(self.anonymous.items()):
            if sid not in held or now - opened >= self.lifetime_s:
                del self.anonymous[sid]
                if sid in held:
                    due.append(sid)
        return due

    async def _end(self, ids: list[str]) -> None:
        for sid in ids:
            await self.transport.end_session(sid)
        if ids:
            logger.debug("api: ended {} /mcp session(s) opened without the token", len(ids))

    @asynccontextmanager
    async def expiring(self) -> AsyncIterator[None]:
        """While inside: each session without the token is ended when its lifetime is up
        (beside the session manager's run, in the API's lifespan)."""
        task = asyncio.ensure_future(self._expire_forever())
        try:
            yield
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    async def _expire_forever(self) -> None:
        """Wake when the oldest session's lifetime is up (a newer one's comes later); a
        session that fails to end is logged, and the next wake tries the others."""
        while True:
            try:
                await self._end(self._due())
            except Exception:
                logger.exception("api: ending /mcp sessions past their lifetime failed")
            first = min(self.anonymous.values(), default=self.clock())
            await asyncio.sleep(max(0.05, first + self.lifetime_s - self.clock()))
