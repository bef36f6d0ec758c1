"""What every request meets before a route: Host, Origin, the token of a write, the body cap.

- :func:`install_guards` adds, innermost first, :class:`WriteGuard` (a write's token
  checked on its headers before any of its body is read; bodies counted as they
  arrive, over the limit 413), CORS for the allowed origins, and the Host / Origin
  check (403 for a Host that is not the loopback address the API is bound to, and
  for an ``Origin`` not in ``--allow-origin``).
- ``/mcp`` (the MCP endpoint, every message a POST) is read as the reads are: no
  token needed, a wrong one refused (403); whether it was right is left in the scope
  for its write tools (:func:`_mcp_problem`, :data:`MCP_AUTHORIZED`).
- :func:`auth_problem` is the one token rule; reads use it too
  (:meth:`controller.interfaces.api.context.ApiContext.full_detail`).

This module refuses or passes requests; it reads no controller state and changes nothing.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response
from loguru import logger
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.interfaces.api.errors import ApiError, error_response
from controller.interfaces.api.settings import (
    MAX_BODY_BYTES,
    NO_TOKEN_MESSAGE,
    ApiSettings,
    host_allowed,
)

#: The scope key of the event set when a write's client has gone away.
DISCONNECTED = "vramctl.disconnected"

#: The scope key set on a request to ``/mcp``: whether it carried the right token.
MCP_AUTHORIZED = "vramctl.mcp_authorized"

#: The MCP endpoint: read as the API's reads are, its writes authorised per tool call.
MCP_PATH = "/mcp"

#: Methods that change nothing: they need no token (every other one does).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def auth_problem(settings: ApiSettings, header: str | None, what: str) -> ApiError | None:
    """Why ``Authorization: header`` does not authorise ``what``; ``None`` when it does.

    503 when no token is configured, 401 without a bearer credential, 403 for a
    wrong one (compared in constant time).
    """
    if settings.token is None:
        return ApiError(503, NO_TOKEN_MESSAGE)
    scheme, _, credential = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return ApiError(
            401,
            "this route changes state and needs 'Authorization: Bearer TOKEN' "
            "(the token of --token-file / VRAMCTL_TOKEN)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(credential.strip().encode("utf-8"), settings.token.encode("utf-8")):
        logger.warning("api: wrong token for {}", what)
        return ApiError(403, "the bearer token is wrong")
    return None


class WriteGuard:
    """ASGI middleware: a write is authorised before its body is read, and bodies are capped.

    For every method but GET / HEAD / OPTIONS, the token is checked on the headers
    alone (a refused request's body is never read), then the body is read as it
    arrives, counting bytes: past ``limit`` the answer is 413 at once, whatever the
    ``Content-Length`` said or whether there was one (chunked). The body read (at
    most ``limit`` bytes) is handed on to the route. A ``Content-Length`` over the
    limit is 413 on any method. Refusals close the connection, so the server does
    not go on receiving what is left of the body.
    """

    def __init__(self, app: ASGIApp, *, settings: ApiSettings, limit: int) -> None:
        self.app = app
        self.settings = settings
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method = str(scope["method"]).upper()
        too_big = error_response(413, f"request body over {self.limit} bytes")
        too_big.headers["Connection"] = "close"
        if method in SAFE_METHODS:
            await self._safe(scope, receive, send, headers, too_big)
            return
        problem = _mcp_problem(scope, self._problem(headers, method, scope))
        if problem is not None:
            refusal = error_response(
                problem.status, problem.message, **problem.body, headers=problem.headers or None
            )
            refusal.headers["Connection"] = "close"
            await refusal(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await too_big(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > self.limit:
                await too_big(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        delivered = False
        # the body is read: what the client sends next can only be its disconnect; it is
        # watched for here, so that a held answer (``up`` with ``wait_s``) ends with it
        gone = asyncio.Event()
        scope[DISCONNECTED] = gone

        async def watch() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            return message

        watcher = asyncio.ensure_future(watch())

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await asyncio.shield(watcher)

        try:
            await self.app(scope, replay, send)
        finally:
            watcher.cancel()

    async def _safe(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, too_big: Response
    ) -> None:
        """A GET / HEAD / OPTIONS: no token needed (one sent to ``/mcp``, for its event
        stream, refused when wrong), and a ``Content-Length`` over the limit 413."""
        if scope.get("path") == MCP_PATH and headers.get("authorization") is not None:
            problem = _mcp_problem(scope, self._problem(headers, str(scope["method"]), scope))
            if problem is not None:
                await error_response(problem.status, problem.message)(scope, receive, send)
                return
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await too_big(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _problem(self, headers: Headers, method: str, scope: Scope) -> ApiError | None:
        return auth_problem(
            self.settings, headers.get("authorization"), f"{method} {scope.get('path', '')}"
        )


def _mcp_problem(scope: Scope, problem: ApiError | None) -> ApiError | None:
    """``/mcp``'s rule: every MCP message is a POST, and a read there is a read (no
    token needed, as for ``GET /v1/...``; a wrong bearer token refused, 403, as on a
    read). Whether the token was right is left in the scope (:data:`MCP_AUTHORIZED`):
    the write tools check it per call (:mod:`controller.interfaces.api.agents`)."""
    if scope.get("path") != MCP_PATH:
        return problem
    scope[MCP_AUTHORIZED] = problem is None
    return problem if problem is not None and problem.status == 403 else None


def install_guards(app: FastAPI, settings: ApiSettings) -> None:
    """Add the request guards to ``app`` (see the module doc), in their order."""
    allowed = frozenset(settings.allow_origins)
    # innermost: its refusals still get CORS headers for an allowed origin
    app.add_middleware(WriteGuard, settings=settings, limit=MAX_BODY_BYTES)
    if allowed:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=sorted(allowed),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )

    @app.middleware("http")
    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        refusal = _host_or_origin_refusal(request, settings, allowed)
        return refusal if refusal is not None else await call_next(request)


def _host_or_origin_refusal(
    request: Request, settings: ApiSettings, allowed: frozenset[str]
) -> Response | None:
    """403 for a Host that is not this API's loopback address, or a foreign Origin."""
    if not host_allowed(request.headers.get("host"), settings.bind_host):
        return error_response(
            403,
            f"host {request.headers.get('host')!r} is not this API's address: vramctl "
            "listens on loopback and answers only requests addressed to it",
        )
    origin = request.headers.get("origin")
    if origin is not None and origin not in allowed:
        logger.warning(
            "api: refused {} {} from origin {!r} (not in --allow-origin)",
            request.method,
            request.url.path,
            origin,
        )
        return error_response(
            403,
            f"origin {origin!r} is not allowed: vramctl refuses browser requests from "
            "origins not listed with --allow-origin",
        )
    return None
