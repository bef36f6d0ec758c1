"""The HTTP API of ``vramctl run`` (docs/design.md §5): FastAPI on uvicorn, in the loop's process.

The server runs as one of the :class:`~controller.service.loop.Controller`'s ``services``, on
the loop's own event loop, so every handler (all ``async``) sees the controller
between two awaits of the loop and never races it. Handlers only *read* the last
cycle and *record* requests (journal) and ask for a cycle; the loop does everything
else. Nothing a request names is executed beyond a serve the manifest set declares.

Routes:

- ``GET /healthz`` — 200, with the number of cycles and the last cycle's age.
- ``GET /metrics`` — Prometheus text (:mod:`controller.interfaces.metrics`).
- ``GET /`` (the operator's page) and ``GET /v1/plans`` (the journal's last plans):
  :mod:`controller.interfaces.ui`, registered at the end of :func:`create_app`, same read rules.
- ``GET /v1/ledger`` — per role: capacity, reserve, budget, committed, free, each
  reservation, NVML used / total, drift, from the last cycle's snapshot and the
  manifest set (``null`` = unknown, e.g. before the first cycle or with docker down).
- ``GET /v1/serves`` — per serve: container state, lifecycle, reservation, backoff,
  requests in flight (``in_flight``, ``in_flight_source``, ``idle_since``), the active
  on-demand request and when it ends (``ttl_basis``: measured idleness, from the
  request, or unknown; docs/eviction.md), whether it may be requested, and its
  measured ``footprint`` (declared vs measured, how, how many samples, whether it
  exceeds its reservation; ``null`` where nothing was measured).
- ``GET /v1/events`` — the event stream (Server-Sent Events, ``Last-Event-ID`` resume):
  :mod:`controller.interfaces.stream`, same read rules; ``up`` and ``down`` publish
  ``request.admitted`` / ``request.refused`` / ``request.ended`` on it.
- ``GET /v1/fit/{serve}`` — the fit JSON (docs/design.md §5) on the last snapshot; no side
  effects. 200 whether it fits or not; 404 unknown serve; 503 before the first cycle.
- ``POST /v1/serves/{serve}/up`` (body optional: ``{"ttl_s": N}``, N > 0 seconds;
  default the serve's ``idle_ttl_s``, else no TTL; ``"wait_s"`` and ``"queue"``:
  :mod:`controller.interfaces.upwait`) — see below.
- ``GET /v1/queue`` — the requests waiting for room, per GPU role in order.
- ``POST /v1/serves/{serve}/down`` — ends the serve's on-demand request: 202 (the loop
  stops the serve unless the manifest wants it running, and evicted neighbours that
  are desired running come back); 404 unknown serve; 409 no active request, or the
  serve runs with a router tier and no router is configured (it could not be stopped:
  the request stays).

Every answer is live (:mod:`controller.service.live`): the newest observation plus
what the executor has done and holds since, never less than may be held, with
``observed_at`` and the steps ``in_flight``. ``up`` and ``GET /v1/fit`` also count the
requests accepted and not yet planned (:mod:`statemachine.pending`: what the next
cycle starts for the recorded requests), marked ``"requested, not yet planned"`` and
listed under ``pending``: two requests are never promised the same room.
``GET /v1/ledger`` tells the two apart: committed, free and ``overcommitted`` count
what is held; each role's ``pending`` (with the room being made for each request),
``pending_mib``, ``making_room_mib`` and ``promised_mib`` what is promised beside it
(:func:`ledger_roles`).

``up`` decides *before anything is recorded or stopped*, on that live observation, by
asking the planner what this request alone would do (as ``GET /v1/fit`` does):

- **202** it fits now (possibly after draining / shrinking / evicting): the request is
  recorded in the journal (it survives a controller restart) and a cycle is asked
  for; the body has the steps the request implies, the fit, and the TTL. A serve in a
  failure backoff is still accepted; the body says when it will be tried.
- **404** the manifest set declares no such serve.
- **409** it cannot be requested, or it is blocked by something no eviction can ever
  fix while the manifest stays as it is: ``desired = "stopped"``; a resident that the
  loop runs already; a port or exclusive-mode (``dual-gpu-exclusive``) conflict with a
  serve the controller never stops implicitly (a resident, a serve without a residency
  class, an on-demand serve the manifest keeps running or that runs without a request;
  for a requester that is not on-demand, any running serve, since only on-demand
  serves evict). The body names the blockers. Also 409: no router is configured and
  the request drains a router tier (a victim's, or the serve's own when its request
  ends): no cycle could carry it out; ``needs_router`` names each tier, and the
  message the fix (docs/operations.md#without-a-router).
- **429** + ``Retry-After`` it does not fit *now* even with every admissible eviction:
  a capacity shortfall that eviction (and elastic shrink) cannot cover, or a conflict
  with a serve that goes away by itself (an evictable serve inside its
  ``min_runtime_s``, an on-demand serve whose request ends). The body is the fit JSON
  with every term (capacity, reserve, budget, committed, each reservation, requested,
  shortfall) plus ``evictable_mib``, ``shrinkable_mib`` and ``protected``.
  ``Retry-After`` is the soonest a protected serve frees up (its ``min_runtime_s``
  running out, or its request's TTL), else the resync period.
- **503** + ``Retry-After: 1`` no cycle has observed the host yet; **503** docker could
  not be read in the last cycle (nothing is admitted: fail closed).

Security: the server binds 127.0.0.1 unless told otherwise. Every state-changing
route (``POST``) needs ``Authorization: Bearer <token>``; the token comes from
``--token-file`` or ``VRAMCTL_TOKEN`` and is compared in constant time: no header (or
not a bearer one) → 401, a wrong token → 403. When no token is configured the
state-changing routes answer **503** with how to configure one: no credential a client
could send would be accepted, and mutation is never allowed unauthenticated. Read-only
routes need no token, but without it they show names, states and figures only: the
free text of a failed start (its ``up`` command line and output) and the values quoted
by manifest errors are withheld (``"detail": "redacted"``); a read with the token gets
them (``"detail": "full"``), one with a wrong token 403. A request carrying an
``Origin`` header that is not in the allow-list (``--allow-origin``, default empty) is
refused with 403 on every route; requests without ``Origin`` (curl, routers, the CLI)
are fine. The token of a write is
checked on its headers before any of its body is read, and a body is counted as it
arrives: over 64 KiB is 413, chunked or not (:class:`WriteGuard`); a refusal closes the
connection. Bodies are validated by pydantic: 422 with one readable line per problem
(non-finite numbers such as ``NaN`` included).

The client side (the address, the token, :func:`call_api`) that ``vramctl up`` / ``down``
use is :mod:`controller.interfaces.client` (named here too, for older callers); this
module holds the listening socket, which is bound *before* the loop
starts so that a port already in use stops ``vramctl run`` at once (exit 1) with a
clear message instead of running without an API.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import errno
import hmac
import math
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.interfaces.client import (
    HEARTBEAT_S,
    ApiConfigError,
    base_url,
)
from controller.interfaces.metrics import CONTENT_TYPE, Metrics
from controller.interfaces.redaction import (
    REDACTED_NOTE,
    public_blocked,
    public_failure,
    public_manifest_errors,
)
from controller.interfaces.stream import register_events
from controller.interfaces.upwait import (
    DEFAULT_QUEUE_S,
    MAX_QUEUE_S,
    MAX_WAIT_S,
    SETTLE_S,
    QueueEntry,
    RequestQueue,
    blocked_now,
    dry_run_answer,
    standing,
    timings,
)
from controller.service.events import EventBus
from controller.service.loop import Controller
from controller.service.view import LoopPort, LoopView
from statemachine.admission import (
    can_request,
    could_fit_later,
    down_needs_router,
    no_router_reason,
)
from statemachine.fit import fit_serve
from statemachine.idleness import request_end
from statemachine.pending import (
    PENDING_STATE,
    PendingStart,
    pending_starts,
    role_pending,
    with_pending,
)
from statemachine.planner import Policy
from statemachine.status import host_status
from statemachine.types import (
    DesiredRun,
    Observed,
    OnDemandRequest,
    ServeSpec,
    SleepState,
)
from statemachine.up_decision import UpDecision, decide_up, mark_pending

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
    #: seconds of silence before the event stream sends a keepalive comment
    events_heartbeat_s: float = HEARTBEAT_S


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


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for the API (listening starts with the server).

    Bound before the loop starts, so that an address in use is reported at once.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ApiConfigError(f"--api {host}:{port}: cannot resolve {host!r}: {exc}") from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        hint = (
            " (is another `vramctl run` running? choose another --api HOST:PORT, or --no-api)"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise ApiConfigError(
            f"the API cannot listen on {host}:{port}: {exc.strerror or exc}{hint}"
        ) from None
    sock.set_inheritable(False)
    return sock


# ── errors ───────────────────────────────────────────────────────────────────


class ApiError(Exception):
    """An answer other than success: status, message, and extra body fields."""

    def __init__(
        self,
        status: int,
        message: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body or {}
        self.headers = headers or {}


def _error_response(status: int, message: str, /, **extra: Any) -> JSONResponse:
    """``{"status", "error", **extra}``; ``headers`` in ``extra`` are the answer's headers.

    Positional-only, so that a body field named ``status`` or ``message`` is a field.
    """
    headers = extra.pop("headers", None)
    return JSONResponse(
        {"status": status, "error": message, **extra}, status_code=status, headers=headers
    )


class UpBody(BaseModel):
    """Body of ``POST /v1/serves/{serve}/up``; every field optional."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: Annotated[
        float | None,
        Field(
            default=None,
            gt=0,
            le=366 * 86400,
            strict=True,
            allow_inf_nan=False,
            description="Seconds the request lasts (default: until the serve has had no "
            "request in flight for its idle_ttl_s, else none).",
        ),
    ] = None
    wait_s: Annotated[
        float | None,
        Field(
            default=None,
            gt=0,
            le=MAX_WAIT_S,
            strict=True,
            allow_inf_nan=False,
            description="Hold the answer until ready, failed, or this many seconds.",
        ),
    ] = None
    queue: Annotated[
        bool,
        Field(
            default=False,
            strict=True,
            description="Wait in the role's FIFO queue instead of a 429 (when it could fit).",
        ),
    ] = False
    queue_s: Annotated[
        float | None,
        Field(
            default=None,
            gt=0,
            le=MAX_QUEUE_S,
            strict=True,
            allow_inf_nan=False,
            description="How long a queued request waits for room (default 600).",
        ),
    ] = None
    outlive_client: Annotated[
        bool,
        Field(
            default=False,
            strict=True,
            description="A queued request stays queued when the client waiting for it "
            "(wait_s) goes away (default: it is withdrawn).",
        ),
    ] = False


def _spelled(text: str) -> str:
    """``text`` with each lone surrogate written out as ``\\udXXX`` (UTF-8 cannot carry it)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_safe(value: Any) -> Any:
    """``value`` with what strict JSON in UTF-8 cannot carry spelled as text.

    Python's JSON reader accepts ``NaN``, ``Infinity`` and ``1e309`` (infinite), and a
    string escape of a lone surrogate (``"\\ud800"``), so a 422 that echoes the input
    must spell them, or the answer itself fails (a 500).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return _spelled(value)
    if isinstance(value, dict):
        return {_spelled(str(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _validation_lines(exc: RequestValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            why = (err.get("ctx") or {}).get("error", "")
            lines.append(f"body: not valid JSON{f' ({why})' if why else ''}")
            continue
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        lines.append(f"{where}: {err.get('msg', 'invalid')}")
    return lines


# ── authorisation and the body, before any route ─────────────────────────────

#: The scope key of the event set when a write's client has gone away.
DISCONNECTED = "vramctl.disconnected"

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
        too_big = _error_response(413, f"request body over {self.limit} bytes")
        too_big.headers["Connection"] = "close"
        if method in SAFE_METHODS:
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.limit:
                await too_big(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        problem = auth_problem(
            self.settings, headers.get("authorization"), f"{method} {scope.get('path', '')}"
        )
        if problem is not None:
            refusal = _error_response(
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


#: What becomes of a recorded request whose waiting ``up`` a later plan refused.
STAYS_RECORDED = {
    429: "the request stays recorded: the loop starts {serve} once it fits; `down` ends it",
    409: "the request stays recorded, but nothing starts {serve} while the manifest stays "
    "as it is; `down` ends it",
}


# ── what GET /v1/ledger adds beside what is held ─────────────────────────────


def ledger_roles(data: dict[str, Any], pending: tuple[PendingStart, ...]) -> list[dict[str, Any]]:
    """``GET /v1/ledger``'s roles: what is held, and beside it what is promised.

    ``data``: the status JSON of what is held (the live observation, no pending
    request): its committed, free and ``overcommitted`` stand. Each role adds its
    pending requests (``pending``, each with the room its plan is still making there),
    ``pending_mib``, ``making_room_mib`` and ``promised_mib`` (committed + pending:
    what ``up`` counts, every MiB that may be held; ``null`` when committed is unknown).
    """
    rows = []
    for row in data.get("gpu_roles", []):
        here, taken, freed = role_pending(pending, row["gpu_role"])
        committed = row.get("committed_mib")
        rows.append(
            {
                **row,
                "pending": [
                    {
                        "serve": p.serve,
                        "mib": p.mib,
                        "state": PENDING_STATE,
                        "making_room": [
                            r.to_json() for r in p.making_room if row["gpu_role"] in r.gpu_roles
                        ],
                    }
                    for p in here
                ],
                "pending_mib": taken,
                "making_room_mib": freed,
                "promised_mib": None if committed is None else committed + taken,
            }
        )
    return rows


# ── the app ──────────────────────────────────────────────────────────────────


def _request_json(
    r: OnDemandRequest,
    now: float,
    spec: ServeSpec | None = None,
    observed: Observed | None = None,
) -> dict[str, Any]:
    """A request's JSON: when it ends and what that counts from (``ttl_basis``: its own
    ``ttl``; ``measured`` idleness; ``request``: no source, from the request;
    ``unknown``: a source whose count is unknown now; ``pending``: a source, and the
    serve has not run since the request; ``none``: no TTL)."""
    end = request_end(r, spec, observed if observed is not None else Observed(docker_ok=False))
    return {"requested_at": r.requested_at, **end.to_json(now)}


def create_app(
    controller: LoopPort,
    settings: ApiSettings,
    metrics: Metrics | None = None,
    events: EventBus | None = None,
) -> FastAPI:
    """The FastAPI app over a controller (not yet serving).

    It reads the loop only through its read-only view (``controller.view()``, a frozen
    copy) and the requests; it changes it only by ``request_up`` / ``request_down``.
    ``events``: the bus ``GET /v1/events`` streams and ``up`` / ``down`` publish on
    (the controller's, from :func:`attach_api`; default: one of its own).
    The request queue's events (``request.queued``, ``request.admitted``,
    ``request.ended``) are published on it too. ``app.state.queue_pump`` is the
    coroutine that admits queued requests beside the loop (:func:`attach_api` runs it).
    """
    queue = RequestQueue()
    app = FastAPI(
        title="vramctl",
        summary="GPU-memory reconciliation controller: ledger, fit and on-demand requests.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    allowed = frozenset(settings.allow_origins)
    metrics = metrics or Metrics()
    bus = events if events is not None else EventBus()

    def notify(kind: str, **data: Any) -> None:
        """A request queue's event (``request_queued`` ...) on the bus (``request.queued``)."""
        bus.publish("request." + kind.removeprefix("request_"), **data)

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
        if not host_allowed(request.headers.get("host"), settings.bind_host):
            return _error_response(
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
            return _error_response(
                403,
                f"origin {origin!r} is not allowed: vramctl refuses browser requests from "
                "origins not listed with --allow-origin",
            )
        return await call_next(request)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc.status, exc.message, **exc.body, headers=exc.headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        lines = [_spelled(line) for line in _validation_lines(exc)]
        return _error_response(
            422,
            "invalid request: " + "; ".join(lines),
            problems=lines,
            detail=_json_safe(jsonable_encoder(exc.errors(), custom_encoder={Exception: str})),
        )

    def spec_of(serve: str) -> ServeSpec:
        desired = controller.view().desired
        spec = desired.serves.get(serve)
        if spec is None:
            close = difflib.get_close_matches(serve, list(desired.serves), n=1, cutoff=0.6)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise ApiError(404, f'no serve named "{serve}" in the manifest set{hint}')
        return spec

    def observed_or_503(view: LoopView | None = None) -> Observed:
        """The live observation (the last one plus what the executor did since)."""
        observed = (view or controller.view()).observed()
        if observed is None:
            raise ApiError(
                503,
                "no observation yet: the loop has not completed its first cycle",
                headers={"Retry-After": "1"},
            )
        return observed

    def full_detail(request: Request) -> bool:
        """Whether this read may see free text: it carries the right token.

        No ``Authorization`` header (or no token configured): names, states and
        figures only. A wrong bearer token is refused (403), not answered with less.
        """
        header = request.headers.get("authorization")
        if header is None or settings.token is None:
            return False
        problem = auth_problem(settings, header, f"{request.method} {request.url.path}")
        if problem is None:
            return True
        if problem.status == 401:  # not a bearer credential: as if none were sent
            return False
        raise problem

    def manifest_errors(view: LoopView, full: bool) -> list[str]:
        if full:
            return list(view.manifest_errors)
        return public_manifest_errors(list(view.manifest_errors), list(view.manifest_issues))

    def detail(full: bool) -> dict[str, Any]:
        if full:
            return {"detail": "full"}
        return {"detail": "redacted", "detail_note": REDACTED_NOTE}

    def meta(view: LoopView, full: bool) -> dict[str, Any]:
        return {
            **live_meta(view),
            "cycles": view.cycles,
            "manifest_digest": view.manifest_digest,
            "manifest_errors": manifest_errors(view, full),
            **detail(full),
        }

    def live_meta(view: LoopView) -> dict[str, Any]:
        """When the observation was taken, and what the executor did and does since."""
        at = view.observed_at
        return {
            "observed_at": at,
            "observation_age_s": None if at is None else round(max(0.0, time.time() - at), 3),
            "in_flight": [f.to_json() for f in view.live.in_flight],
            "since_observed": view.live.to_json(),
        }

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, Any]:
        full = full_detail(request)
        view = controller.view()
        snap = view.snapshot
        age = time.time() - view.at if snap is not None else None
        return {
            "status": "ok" if snap is not None else "starting",
            "cycles": view.cycles,
            "last_cycle_at": view.at if snap is not None else None,
            "last_cycle_age_s": age,
            "last_cycle_duration_s": view.duration_s if snap is not None else None,
            "docker": "unknown" if snap is None else snap.docker,
            "nvml": "unknown"
            if snap is None
            else ("ok" if snap.gpus is not None else "unavailable"),
            "manifest_errors": manifest_errors(view, full),
            "dry_run": view.dry_run,
            **detail(full),
        }

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
    )
    async def metrics_route() -> Response:
        metrics.update_ledger(controller)  # live: what the running plan holds counts now
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def pending_now(
        view: LoopView, observed: Observed, requester: str | None = None
    ) -> tuple[PendingStart, ...]:
        """The recorded requests the next cycle starts that nothing holds yet."""
        return pending_starts(
            controller.desired(),
            observed,
            policy=Policy(no_shrink=view.no_shrink),
            now=time.time(),
            requester=requester,
        )

    def _status_now(view: LoopView) -> tuple[dict[str, Any], Any]:
        """The host status on the live observation: what is held (the requests accepted
        and not yet planned are told apart by ``GET /v1/ledger``, :func:`ledger_roles`)."""
        snap = view.snapshot
        observed = view.observed() or Observed(docker_ok=False)
        report = host_status(controller.desired(), observed)
        data = report.to_json()
        if snap is None:
            data["docker"] = "unknown"
            data["nvml"] = "unknown"
        return data, report

    @app.get("/v1/ledger")
    async def ledger(request: Request) -> dict[str, Any]:
        full = full_detail(request)
        view = controller.view()
        data, _ = _status_now(view)  # what is held; what is promised beside it
        pending = pending_now(view, view.observed() or Observed(docker_ok=False))
        return {
            **meta(view, full),
            "docker": data["docker"],
            "nvml": data["nvml"],
            "gpu_roles": ledger_roles(data, pending),
            "pending": [p.to_json() for p in pending],
            "undeclared_gpu_containers": data["undeclared_gpu_containers"],
            "no_longer_declared": data["no_longer_declared"],
        }

    @app.get("/v1/serves")
    async def serves(request: Request) -> dict[str, Any]:
        full = full_detail(request)
        view = controller.view()
        data, _ = _status_now(view)
        now = time.time()
        requests = {r.serve: r for r in controller.requests()}
        # the live observation, as the row's own figures: a start that ended healthy since
        # the snapshot has run (its request's idleness counts), not still "pending"
        seen = view.observed()
        plan = view.plan
        blocked = {b.serve: b.reason for b in plan.blocked} if plan is not None else {}
        out = []
        for row in data["serves"]:
            name = row["serve"]
            b = view.backoff.get(name)
            req = requests.get(name)
            why_not = can_request(view.desired, name)
            out.append(
                {
                    **row,
                    "requestable": why_not is None,
                    "not_requestable_reason": why_not,
                    "request": None
                    if req is None
                    else _request_json(req, now, view.desired.serves.get(name), seen),
                    # declared vs measured (docs/limits.md): null before any sample
                    "footprint": view.footprints.get(name),
                    "queued": None
                    if (entry := queue.get(name)) is None
                    else entry.to_json(queue.positions(entry)),
                    "blocked": blocked.get(name)
                    if full
                    else public_blocked(name, blocked.get(name)),
                    "backoff": None
                    if b is None or not b.failures
                    else {
                        "failures": b.failures,
                        "last_failure": b.last_failure if full else public_failure(b.last_failure),
                        "until": b.until,
                        "retry_in_s": max(0.0, b.until - now),
                    },
                }
            )
        return {**meta(view, full), "docker": data["docker"], "serves": out}

    @app.get("/v1/queue")
    async def queue_route() -> dict[str, Any]:
        return {**live_meta(controller.view()), **queue.to_json()}

    @app.get("/v1/fit/{serve}")
    async def fit(serve: str) -> dict[str, Any]:
        spec_of(serve)
        view = controller.view()
        observed = observed_or_503(view)
        now = time.time()
        policy = Policy(no_shrink=view.no_shrink)
        desired = controller.desired()
        pending = pending_starts(desired, observed, policy=policy, now=now, requester=serve)
        result = fit_serve(desired, with_pending(observed, pending), serve, policy=policy, now=now)
        return {**mark_pending(result.to_json(), pending), **live_meta(view)}

    # every POST is authorised by WriteGuard before its body is read
    def refuse(decision: UpDecision, serve: str, client: str, **extra: Any) -> JSONResponse:
        """The answer to an ``up`` that is not accepted (409 / 429 / 503), logged."""
        if decision.status == 429:
            metrics.refused("api")
        bus.publish(
            "request.refused",
            private=("message",),
            serve=serve,
            status=decision.status,
            message=decision.message,
            retry_after_s=decision.retry_after_s,
        )
        logger.info(
            "api: up {} from {} refused ({}): {}", serve, client, decision.status, decision.message
        )
        headers = (
            {"Retry-After": str(decision.retry_after_s)}
            if decision.retry_after_s is not None
            else None
        )
        return _error_response(
            decision.status,
            decision.message,
            retry_after_s=decision.retry_after_s,
            **{**decision.body, **live_meta(controller.view()), **extra},
            headers=headers,
        )

    def decide_now(view: LoopView, serve: str) -> UpDecision:
        """``decide_up`` on the live observation of ``view``."""
        return decide_up(
            controller.desired(),
            observed_or_503(view),
            serve,
            policy=Policy(no_shrink=view.no_shrink),
            now=time.time(),
            default_retry_s=settings.retry_after_s,
            router=view.router,
        )

    def active_requests(now: float) -> dict[str, OnDemandRequest]:
        return {r.serve: r for r in controller.requests() if not r.expired(now)}

    def recorded_requests() -> dict[str, OnDemandRequest]:
        """Every recorded request, expired ones included (their serve is being stopped)."""
        return {r.serve: r for r in controller.requests()}

    def process_queue() -> None:
        """Admit the heads of the queues that fit now; end those that never will, and
        those nobody waits for any more."""
        if not queue.waiting() and not queue.settling():
            return
        withdraw_abandoned(time.time())
        view = controller.view()
        observed = view.observed()
        if observed is None or not observed.docker_ok:
            return  # nothing is decided on an unknown host: they wait
        now = time.time()
        active = active_requests(now)
        for entry in queue.settling():
            counted = (
                entry.serve in observed.starting
                or observed.container(view.desired.serves[entry.serve].container).holds
                if entry.serve in view.desired.serves
                else True
            )
            gone = entry.serve not in active
            stale = entry.left_at is not None and now - entry.left_at > SETTLE_S
            if counted or gone or stale or blocked_now(view, entry.serve, entry.left_at or now):
                queue.settled(entry)
        desired = controller.desired()
        for entry in queue.eligible():
            if entry.serve not in desired.serves:
                queue.leave(entry, "impossible", now, 404, {"error": f"{entry.serve} is gone"})
                notify("request_ended", serve=entry.serve, outcome="impossible")
                continue
            decision = decide_now(view, entry.serve)
            if decision.status == 202:
                controller.request_up(entry.serve, entry.ttl_s)
                queue.leave(entry, "admitted", now, 202, {"message": decision.message})
                logger.info(
                    "api: queued up {} admitted after {:.1f}s: {}",
                    entry.serve,
                    now - entry.enqueued_at,
                    decision.message,
                )
                notify("request_admitted", serve=entry.serve)
                continue
            never = None
            if decision.status == 429:
                never = could_fit_later(desired, observed, entry.serve, recorded_requests())
            if decision.status == 409 or never is not None:
                why = never or decision.message
                queue.leave(
                    entry,
                    "impossible",
                    now,
                    decision.status,
                    {**decision.body, "error": f"the queued request cannot fit any more: {why}"},
                )
                logger.info("api: queued up {} ended: {}", entry.serve, why)
                notify("request_ended", serve=entry.serve, outcome="impossible")
            elif now >= entry.deadline:
                queue.leave(
                    entry,
                    "deadline",
                    now,
                    429,
                    {
                        **decision.body,
                        "error": f"waited {now - entry.enqueued_at:.0f}s in the queue, its "
                        f"queue_s, and it does not fit yet: {decision.message}",
                    },
                )
                logger.info("api: queued up {} ended at its deadline", entry.serve)
                notify("request_ended", serve=entry.serve, outcome="deadline")

    def follow(entry: QueueEntry, request: Request, body: UpBody) -> None:
        """Count this ``up`` among those ``entry`` is kept for (see upwait).

        A client that waits (``wait_s``) keeps it only while it is there, unless it
        says ``outlive_client``; one answered at once is told it is queued: it stays.
        """
        gone = request.scope.get(DISCONNECTED)
        if body.wait_s and not body.outlive_client and isinstance(gone, asyncio.Event):
            entry.waiters.append(gone)
        else:
            entry.kept = True

    def withdraw_abandoned(now: float) -> None:
        """End the queued requests whose every waiting client went away."""
        for entry in queue.abandoned():
            queue.leave(
                entry,
                "withdrawn",
                now,
                None,
                {
                    "error": f"the client waiting for the queued request of {entry.serve} "
                    "went away before it was admitted: nothing was recorded or started for it"
                },
            )
            logger.info(
                "api: queued up {} withdrawn after {:.1f}s: its waiting client went away",
                entry.serve,
                now - entry.enqueued_at,
            )
            notify("request_ended", serve=entry.serve, outcome="withdrawn")

    async def queue_pump() -> None:
        """Beside the loop: the queue is looked at after every change, and each second."""
        while True:
            await controller.wait_change(1.0)
            try:
                process_queue()
            except ApiError:
                pass  # no observation yet
            except Exception:  # a bug must not end the pump
                logger.exception("api: the request queue failed")

    app.state.queue_pump = queue_pump
    app.state.up_queue = queue

    def queued_answer(
        entry: QueueEntry, standing_json: dict[str, Any] | None = None
    ) -> JSONResponse:
        pos = queue.positions(entry)
        where = ", ".join(f"{p} on {r}" for r, p in pos.items())
        return JSONResponse(
            {
                "status": 202,
                "serve": entry.serve,
                "accepted": True,
                "queued": True,
                "message": f"queued: position {where}; it is admitted when it fits",
                "queue": entry.to_json(pos),
                **(standing_json or {}),
            },
            status_code=202,
        )

    async def hold(
        spec: ServeSpec,
        request: Request,
        wait_s: float,
        entry: QueueEntry | None,
        since: float | None,
        accepted: dict[str, Any],
    ) -> JSONResponse:
        """Hold the answer until ready, failed, ended, or ``wait_s`` (see upwait)."""
        serve = spec.name
        client = request.client.host if request.client else "?"
        wait_s = min(wait_s, settings.max_wait_s)
        deadline = time.monotonic() + wait_s
        t0 = time.time()
        while True:
            now = time.time()
            if entry is not None and entry.outcome is None:
                with contextlib.suppress(ApiError):
                    process_queue()
            if entry is not None and entry.outcome not in (None, "admitted"):
                body = dict(entry.answer)
                message = str(body.pop("error", body.pop("message", entry.outcome)))
                body.pop("status", None)
                return _error_response(
                    entry.status or 409, message, queue=entry.to_json(), waited_s=now - t0, **body
                )
            if entry is not None and entry.outcome == "admitted" and since is None:
                since = entry.left_at
            view = controller.view()
            if since is not None:
                if serve not in active_requests(now):
                    return _error_response(
                        409,
                        f"the request of {serve} ended (down, or its TTL) before it was ready",
                        waited_s=now - t0,
                    )
                st = standing(view, spec, controller.steps_since(since, serve), since, now, entry)
                if st.final is not None:
                    return JSONResponse(
                        {
                            "status": st.final,
                            "serve": serve,
                            "ready": st.final == 200,
                            **({"error": st.message} if st.final != 200 else {}),
                            "note": None
                            if st.final == 200
                            else "the request stays recorded: the loop tries again after its "
                            "backoff; `down` ends it",
                            **st.to_json(),
                            "waited_s": round(now - t0, 3),
                        },
                        status_code=st.final,
                    )
                if blocked_now(view, serve, since):
                    decision = decide_now(view, serve)
                    if decision.status in (409, 429):
                        where = {k: v for k, v in st.to_json().items() if k != "message"}
                        return refuse(
                            decision,
                            serve,
                            client,
                            **where,
                            note=STAYS_RECORDED[decision.status].format(serve=serve),
                            waited_s=round(now - t0, 3),
                        )
                dry = dry_run_answer(view, spec) if view.at >= since else None
                if dry is not None:  # a dry run executes nothing: it never becomes ready
                    return JSONResponse(
                        {
                            **accepted,
                            "status": 202,
                            "serve": serve,
                            **st.to_json(),
                            **dry,
                            "waited_s": round(now - t0, 3),
                        },
                        status_code=202,
                    )
            left = deadline - time.monotonic()
            if left <= 0:
                if entry is not None and entry.outcome is None:
                    entry.kept = True  # the client is told it is queued: it stays so
                    return queued_answer(entry, {"waited_s": round(now - t0, 3)})
                st = standing(
                    view,
                    spec,
                    controller.steps_since(since or now, serve),
                    since or now,
                    now,
                    entry,
                )
                return JSONResponse(
                    {
                        **accepted,
                        "status": 202,
                        "serve": serve,
                        "ready": False,
                        **st.to_json(),
                        "message": f"not ready after wait_s {wait_s:g}: {st.message}",
                        "waited_s": round(now - t0, 3),
                    },
                    status_code=202,
                )
            gone = request.scope.get(DISCONNECTED)
            if isinstance(gone, asyncio.Event) and gone.is_set():
                logger.info("api: the client waiting for up {} went away (from {})", serve, client)
                withdraw_abandoned(now)
                return JSONResponse({"status": 202, "serve": serve}, status_code=202)
            await controller.wait_change(min(left, 0.5))

    # every POST is authorised by WriteGuard before its body is read
    @app.post("/v1/serves/{serve}/up", status_code=202)
    async def up(serve: str, request: Request, body: UpBody | None = None) -> JSONResponse:
        spec = spec_of(serve)
        why_not = can_request(controller.view().desired, serve)
        if why_not is not None:
            bus.publish(
                "request.refused",
                private=("message",),
                serve=serve,
                status=409,
                message=why_not,
                retry_after_s=None,
            )
            raise ApiError(409, f"{serve} cannot be requested on demand: {why_not}")
        body = body or UpBody()
        view = controller.view()
        observed = observed_or_503(view)
        now = time.time()
        desired = controller.desired()
        client = request.client.host if request.client else "?"
        waiting = queue.get(serve)
        if waiting is not None:  # queued already: this asks about the same entry
            follow(waiting, request, body)
            if body.wait_s:
                return await hold(spec, request, body.wait_s, waiting, None, {})
            return queued_answer(waiting)
        decision = decide_now(view, serve)
        ahead = queue.ahead_on(spec.gpu_roles)
        to_queue = False
        if decision.status == 202 and ahead and not observed.container(spec.container).holds:
            if not body.queue:
                names = ", ".join(e.serve for e in ahead)
                roles = ", ".join(spec.gpu_roles)
                return refuse(
                    UpDecision(
                        429,
                        f"{serve} fits now, but {len(ahead)} queued request(s) wait ahead of it "
                        f"on {roles} ({names}): requests on a role are admitted in order; "
                        'send "queue": true to wait behind them',
                        {"fit": decision.body.get("fit")},
                        max(1, math.ceil(settings.retry_after_s)),
                    ),
                    serve,
                    client,
                    queued_ahead=[e.serve for e in ahead],
                )
            to_queue = True
        elif decision.status == 429 and body.queue:
            never = could_fit_later(desired, observed, serve, recorded_requests())
            if never is not None:
                return refuse(decision, serve, client, queue=f"not queued: {never}")
            to_queue = True
        if to_queue:
            full = queue.full_on(spec.gpu_roles)
            if full:
                return refuse(
                    UpDecision(
                        429,
                        f"{decision.message}; and the queue of {', '.join(full)} holds "
                        f"{queue.max_per_role} requests already (the most it may)",
                        decision.body,
                        decision.retry_after_s or max(1, math.ceil(settings.retry_after_s)),
                    ),
                    serve,
                    client,
                )
            entry = queue.add(spec, body.ttl_s, body.queue_s or DEFAULT_QUEUE_S, now)
            follow(entry, request, body)
            logger.info(
                "api: up {} from {} queued (position {}): {}",
                serve,
                client,
                ", ".join(f"{p} on {r}" for r, p in queue.positions(entry).items()),
                decision.message,
            )
            notify("request_queued", serve=serve, position=queue.positions(entry))
            if body.wait_s:
                return await hold(spec, request, body.wait_s, entry, None, {})
            return queued_answer(entry)
        if decision.status != 202:
            return refuse(decision, serve, client)
        ttl = body.ttl_s
        active = {r.serve for r in controller.requests()}
        asleep = observed.sleep_of(serve).asleep
        if observed.container(spec.container).holds and serve not in active and not asleep:
            # running already, and not because of a request: recording one would make the
            # loop stop it when the request ends, which nobody asked for (a serve that
            # sleeps is woken by the request instead)
            bus.publish("request.admitted", serve=serve, recorded=False, ttl_s=None, steps=[])
            return JSONResponse(
                {
                    "status": 202,
                    "serve": serve,
                    "message": f"{serve} is already running (not started by a request): "
                    "nothing to do, and no request is recorded, so nothing will stop it",
                    "steps": [],
                    "request": None,
                },
                status_code=202,
            )
        controller.request_up(serve, ttl)
        effective_ttl = ttl if ttl is not None else spec.idle_ttl_s
        bus.publish(
            "request.admitted",
            serve=serve,
            recorded=True,
            ttl_s=effective_ttl,
            steps=[f"{st['action']} {st['serve']}" for st in decision.body["steps"]],
        )
        record = next((r for r in controller.requests() if r.serve == serve), None)
        req_json = (
            _request_json(record, now, spec, observed)
            if record is not None
            else _request_json(OnDemandRequest(serve, now, effective_ttl), now)
        )
        held = controller.view().backoff.get(serve)
        note = None
        if held is not None and held.until > now:
            note = (
                f"{serve} is backing off after {held.failures} failure(s) ({held.last_failure}); "
                f"it is tried again in {held.until - now:.0f}s"
            )
        logger.info(
            "api: up {} from {} accepted (ttl {}): {}",
            serve,
            client,
            effective_ttl,
            decision.message,
        )
        accepted = {
            "status": 202,
            "serve": serve,
            "accepted": True,
            "message": decision.message,
            "request": req_json,
            "steps": decision.body["steps"],
            "fit": decision.body["fit"],
            "note": note,
            **live_meta(view),
        }
        if body.wait_s:
            already = (
                observed.container(spec.container).holds
                and serve not in observed.starting
                and observed.sleep_of(serve).state is SleepState.AWAKE
            )
            if already:  # running for an earlier request: ready as far as the loop knows
                # (a container whose engine sleeps, or may, is not ready: it is woken first)
                return JSONResponse(
                    {
                        **accepted,
                        "status": 200,
                        "ready": True,
                        "stage": "ready",
                        "timings": timings(spec, [], now, time.time()),
                    },
                    status_code=200,
                )
            return await hold(spec, request, body.wait_s, None, now - 0.001, accepted)
        return JSONResponse(accepted, status_code=202)

    @app.post("/v1/serves/{serve}/down", status_code=202)
    async def down(serve: str, request: Request) -> JSONResponse:
        spec = spec_of(serve)
        now = time.time()
        entry = queue.get(serve)
        if entry is not None:
            queue.leave(
                entry,
                "cancelled",
                now,
                409,
                {"error": f"the queued request of {serve} was ended by down"},
            )
            notify("request_ended", serve=serve, outcome="cancelled")
            logger.info("api: down {}: its queued request ended", serve)
            return JSONResponse(
                {
                    "status": 202,
                    "serve": serve,
                    "ended": True,
                    "message": "the queued request ended; nothing was recorded or started for it",
                },
                status_code=202,
            )
        last = controller.view().snapshot
        seen = last.to_observed() if last is not None else Observed(docker_ok=False)
        live = [
            r
            for r in controller.requests()
            if r.serve == serve and not request_end(r, spec, seen).expired(now)
        ]
        view = controller.view()
        need = None if view.router else down_needs_router(spec, view.observed() or seen)
        if live and need is not None:
            why = f"{no_router_reason(f'down {serve}', [need])}; the request stays in force"
            logger.info("api: down {} refused: {}", serve, why)
            raise ApiError(409, why, {"needs_router": [need.to_json()]})
        if not live or not controller.request_down(serve):
            raise ApiError(
                409,
                f"{serve} has no active on-demand request (none was made, or it ended or expired)",
            )
        now_seen = controller.view().observed()
        running = now_seen is not None and now_seen.container(spec.container).holds
        stays = spec.desired is DesiredRun.RUNNING
        if stays:
            message = f'request ended; {serve} stays up: the manifest says desired = "running"'
        elif running:
            message = f"request ended; the loop stops {serve} and brings back what it evicted"
        else:
            message = f"request ended; {serve} is not running"
        client = request.client.host if request.client else "?"
        logger.info("api: down {} from {}: {}", serve, client, message)
        bus.publish("request.ended", serve=serve, reason="down", running=running, stays=stays)
        return JSONResponse(
            {"status": 202, "serve": serve, "ended": True, "message": message},
            status_code=202,
        )

    # the operator's page (GET /, its assets, GET /v1/plans): controller/interfaces/ui
    from controller.interfaces.ui import register_ui

    register_ui(app, controller.history, full_detail, lambda full: meta(controller.view(), full))
    register_events(app, bus, full_detail, ApiError, settings.events_heartbeat_s)
    return app


# ── serving ──────────────────────────────────────────────────────────────────


class _LoopServer(uvicorn.Server):
    """uvicorn without its own signal handling: SIGTERM / SIGINT belong to the loop.

    uvicorn >= 0.29 installs handlers in ``capture_signals`` around ``serve``; the
    controller stops on the signal and cancels its services, which shuts this down.

    Its housekeeping tick (the ``Date`` header, once a second) runs once a second
    instead of ten times, and asking it to exit wakes it at once: an idle controller
    with the API would otherwise wake ten times a second for nothing.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_now = asyncio.Event()
        self._should_exit = False
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:
            self._exit_now.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864_000  # each tick is a second: the header each tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_now.wait(), 1.0)
            should_exit = await self.on_tick(counter)


def api_service(
    app: FastAPI, sock: socket.socket
) -> Callable[[Controller], Coroutine[Any, Any, None]]:
    """A ``Controller.services`` entry serving ``app`` on the already bound ``sock``."""

    async def service(_controller: Controller) -> None:
        config = uvicorn.Config(
            app,
            log_config=None,
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=3,
            server_header=False,
        )
        server = _LoopServer(config)
        sock.listen(config.backlog)
        host, port = sock.getsockname()[:2]
        logger.info(
            "api: listening on {}",
            base_url(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"),
        )
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            server.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 5.0)
            raise
        except Exception:
            logger.exception("api: the HTTP server failed; the loop goes on without it")
            return
        if not server.should_exit:
            logger.error("api: the HTTP server stopped; the loop goes on without it")

    return service


def attach_api(
    controller: Controller,
    settings: ApiSettings,
    sock: socket.socket,
) -> Metrics:
    """Wire the HTTP API and its metrics into ``controller`` (served once it runs).

    The metrics follow each cycle (``on_cycle``); the app, over the controller's
    read-only view, is served on the already bound ``sock`` as one of its services,
    and its request queue's pump beside it; ``up``, ``down`` and the queue publish on
    the controller's event bus (see :func:`create_app`).
    """
    metrics = Metrics()
    controller.on_cycle.append(metrics.on_cycle)
    app = create_app(controller, settings, metrics, controller.events)
    controller.services.append(api_service(app, sock))
    pump = app.state.queue_pump

    async def queue_service(_controller: Controller) -> None:
        await pump()

    controller.services.append(queue_service)
    return metrics
