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
- ``/mcp`` — the agents' tools (the MCP server of ``vramctl mcp``) over Streamable
  HTTP, answering from this controller's live view: :mod:`controller.interfaces.api.agents`
  (docs/agents.md); its reads need no token, its writes the token.
- ``POST /v1/serves/{serve}/down`` — ends the serve's on-demand request: 202 (the loop
  stops the serve unless the manifest wants it running, and evicted neighbours that
  are desired running come back); 404 unknown serve; 409 no active request, or the
  serve runs with a router tier and no router is configured (it could not be stopped:
  the request stays).

Every answer is live (:mod:`controller.service.live`): the newest observation plus
what the executor has done and holds since, never less than may be held, with
``observed_at`` and the steps ``in_flight``. ``up`` and ``GET /v1/fit`` also count the
requests accepted and not yet planned (:mod:`statemachine.answers.pending`: what the next
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
use is :mod:`controller.interfaces.client`. The listening socket is bound *before* the
loop starts so that a port already in use stops ``vramctl run`` at once (exit 1) with a
clear message instead of running without an API.

The package, one module per family of routes (``APIRouter``), this module only wiring
them (:func:`create_app`, :func:`attach_api`):

- :mod:`~controller.interfaces.api.settings` (:class:`ApiSettings`),
  :mod:`~controller.interfaces.api.errors` (the error body, 422),
  :mod:`~controller.interfaces.api.guard` (Host, Origin, token, body cap),
  :mod:`~controller.interfaces.api.context` (what the routes read through: ``Depends``);
- :mod:`~controller.interfaces.api.probes` (``/healthz``, ``/metrics``),
  :mod:`~controller.interfaces.api.reads` (ledger, serves, queue, fit),
  :mod:`~controller.interfaces.api.verbs` (``up``, ``down``), with
  :mod:`~controller.interfaces.api.answers` and :mod:`~controller.interfaces.api.hold`
  (``wait_s``); the page (:mod:`controller.interfaces.ui`) and the event stream
  (:mod:`controller.interfaces.stream`) register their own routes;
- :mod:`~controller.interfaces.api.serving` (the socket, uvicorn as a loop service).

The request queue's pump (:class:`~controller.service.queue_pump.QueuePump`) runs
beside the loop as one of its services; the up decision itself is pure
(:mod:`statemachine.answers.up_decision`); what a reader without the token sees is
:mod:`controller.interfaces.redaction`.
"""

from __future__ import annotations

import socket
from typing import Any

from fastapi import FastAPI

from controller.interfaces.api import probes, reads, verbs
from controller.interfaces.api.agents import mount_mcp
from controller.interfaces.api.context import ApiContext
from controller.interfaces.api.errors import ApiError, install_error_handlers
from controller.interfaces.api.guard import install_guards
from controller.interfaces.api.serving import api_service, bind_socket
from controller.interfaces.api.settings import (
    MAX_BODY_BYTES,
    NO_TOKEN_MESSAGE,
    ApiSettings,
    host_allowed,
)
from controller.interfaces.metrics import Metrics
from controller.interfaces.redaction import public_manifest_errors
from controller.interfaces.stream import events_router
from controller.interfaces.ui import ui_router
from controller.service.events import EventBus
from controller.service.loop import Controller
from controller.service.loop_port import LoopPort
from controller.service.queue_pump import QueuePump

__all__ = [
    "MAX_BODY_BYTES",
    "NO_TOKEN_MESSAGE",
    "ApiError",
    "ApiSettings",
    "attach_api",
    "bind_socket",
    "create_app",
    "host_allowed",
    "public_manifest_errors",
]


def create_app(
    controller: LoopPort,
    settings: ApiSettings,
    metrics: Metrics | None = None,
    events: EventBus | None = None,
    pump: QueuePump | None = None,
) -> FastAPI:
    """The FastAPI app over a controller (not yet serving).

    It reads the loop only through its read-only view (``controller.view()``, a frozen
    copy) and the requests; it changes it only by ``request_up`` / ``request_down``.
    ``events``: the bus ``GET /v1/events`` streams and ``up`` / ``down`` publish on
    (the controller's, from :func:`attach_api`; default: one of its own).
    ``pump``: the request queue's pump, which publishes ``request.queued``,
    ``request.admitted`` and ``request.ended`` on that bus (default: one of its own,
    which nothing runs unless the caller does: :func:`attach_api` runs it beside the loop).
    ``app.state.up_queue`` and ``app.state.queue_pump`` name the queue and the pump's
    coroutine function, for a caller that runs the app without the loop (tests).
    """
    bus = events if events is not None else EventBus()
    ctx = ApiContext(
        controller,
        settings,
        metrics or Metrics(),
        bus,
        pump if pump is not None else QueuePump(controller, bus, settings.retry_after_s),
    )
    app = FastAPI(
        title="vramctl",
        summary="GPU-memory reconciliation controller: ledger, fit and on-demand requests.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.api = ctx
    app.state.up_queue = ctx.queue
    app.state.queue_pump = ctx.pump.run
    install_guards(app, settings)
    install_error_handlers(app)
    for family in (probes, reads, verbs):
        app.include_router(family.router)
    full_detail = ctx.full_detail

    def meta(full: bool) -> dict[str, Any]:
        return ctx.meta(controller.view(), full)

    app.include_router(ui_router(controller.history, full_detail, meta))
    app.include_router(events_router(bus, full_detail, ApiError, settings.events_heartbeat_s))
    mount_mcp(app, ctx)
    return app


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
    pump = QueuePump(controller, controller.events, settings.retry_after_s)
    app = create_app(controller, settings, metrics, controller.events, pump)
    controller.services.append(api_service(app, sock))

    async def queue_service(_controller: Controller) -> None:
        await pump.run()

    controller.services.append(queue_service)
    return metrics
