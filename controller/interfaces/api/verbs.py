"""The serve verbs: ``POST /v1/serves/{serve}/up`` and ``POST /v1/serves/{serve}/down``.

``up`` decides before anything is recorded or stopped, on the live observation
(:func:`statemachine.answers.up_decision.decide_up`): 202 recorded (or queued, with
``"queue": true``), 404, 409, 429 + ``Retry-After``, 503, as the module doc of
:mod:`controller.interfaces.api` says; with ``wait_s`` the answer is held
(:mod:`controller.interfaces.api.hold`). ``down`` ends a queued or recorded request.
Both publish ``request.admitted`` / ``request.refused`` / ``request.ended`` on the bus.

Every POST is authorised by :class:`~controller.interfaces.api.guard.WriteGuard` before
its body is read. These routes change the loop only through the port's
``request_up`` / ``request_down`` and the request queue.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from controller.interfaces.api.answers import follow, queued_answer, refuse
from controller.interfaces.api.context import ApiContext, Ctx, client_of, live_meta
from controller.interfaces.api.errors import ApiError
from controller.interfaces.api.hold import hold
from controller.interfaces.host_answers import request_json
from controller.interfaces.upwait import MAX_WAIT_S, timings
from controller.service.loop_port import LoopView
from controller.service.queue_pump import recorded_requests
from controller.service.request_queue import DEFAULT_QUEUE_S, MAX_QUEUE_S
from statemachine.answers.up_decision import UpDecision
from statemachine.domain.types import DesiredRun, Observed, OnDemandRequest, ServeSpec, SleepState
from statemachine.planning.admission import (
    can_request,
    could_fit_later,
    down_needs_router,
    no_router_reason,
)
from statemachine.planning.idleness import in_force

router = APIRouter()


def _seconds(most: float, description: str) -> Any:
    """An optional field: a finite number of seconds, more than 0 and at most ``most``."""
    return Field(
        default=None, gt=0, le=most, strict=True, allow_inf_nan=False, description=description
    )


def _flag(description: str) -> Any:
    """An optional true/false field, false by default."""
    return Field(default=False, strict=True, description=description)


class UpBody(BaseModel):
    """Body of ``POST /v1/serves/{serve}/up``; every field optional."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: Annotated[
        float | None,
        _seconds(
            366 * 86400,
            "Seconds the request lasts (default: until the serve has had no "
            "request in flight for its idle_ttl_s, else none).",
        ),
    ] = None
    wait_s: Annotated[
        float | None,
        _seconds(MAX_WAIT_S, "Hold the answer until ready, failed, or this many seconds."),
    ] = None
    queue: Annotated[
        bool,
        _flag("Wait in the role's FIFO queue instead of a 429 (when it could fit)."),
    ] = False
    queue_s: Annotated[
        float | None,
        _seconds(MAX_QUEUE_S, "How long a queued request waits for room (default 600)."),
    ] = None
    outlive_client: Annotated[
        bool,
        _flag(
            "A queued request stays queued when the client waiting for it "
            "(wait_s) goes away (default: it is withdrawn)."
        ),
    ] = False


@router.post("/v1/serves/{serve}/up", status_code=202)
async def up(serve: str, request: Request, ctx: Ctx, body: UpBody | None = None) -> JSONResponse:
    spec = ctx.spec_of(serve)
    _refuse_unrequestable(ctx, serve)
    body = body or UpBody()
    view = ctx.controller.view()
    observed = ctx.observed_or_503(view)
    now = time.time()
    client = client_of(request)
    waiting = ctx.queue.get(serve)
    if waiting is not None:  # queued already: this asks about the same entry
        follow(waiting, request, body.wait_s, body.outlive_client)
        if body.wait_s:
            return await hold(ctx, spec, request, body.wait_s, waiting, None, {})
        return queued_answer(ctx, waiting)
    decision = ctx.decide_now(view, serve)
    to_queue = _queue_or_refuse(ctx, spec, body, observed, decision, client)
    if isinstance(to_queue, JSONResponse):
        return to_queue
    if to_queue:
        return await _enqueue(ctx, spec, request, body, decision, now, client)
    if decision.status != 202:
        return refuse(ctx, decision, serve, client)
    return await _admit(ctx, spec, request, body, view, observed, decision, now)


def _refuse_unrequestable(ctx: ApiContext, serve: str) -> None:
    """409 (published) when ``serve`` cannot be requested on demand at all."""
    why_not = can_request(ctx.controller.view().desired, serve)
    if why_not is None:
        return
    ctx.bus.publish(
        "request.refused",
        private=("message",),
        serve=serve,
        status=409,
        message=why_not,
        retry_after_s=None,
    )
    raise ApiError(409, f"{serve} cannot be requested on demand: {why_not}")


def _queue_or_refuse(
    ctx: ApiContext,
    spec: ServeSpec,
    body: UpBody,
    observed: Observed,
    decision: UpDecision,
    client: str,
) -> JSONResponse | bool:
    """Whether the request waits in the queue, or the refusal the queue makes it.

    A request that fits while others wait ahead on its roles is 429 unless it asks to
    queue; one that does not fit queues when it asks to and could fit later.
    """
    serve = spec.name
    ahead = ctx.queue.ahead_on(spec.gpu_roles)
    if decision.status == 202 and ahead and not observed.container(spec.container).holds:
        if body.queue:
            return True
        names = ", ".join(e.serve for e in ahead)
        roles = ", ".join(spec.gpu_roles)
        return refuse(
            ctx,
            UpDecision(
                429,
                f"{serve} fits now, but {len(ahead)} queued request(s) wait ahead of it "
                f"on {roles} ({names}): requests on a role are admitted in order; "
                'send "queue": true to wait behind them',
                {"fit": decision.body.get("fit")},
                max(1, math.ceil(ctx.settings.retry_after_s)),
            ),
            serve,
            client,
            queued_ahead=[e.serve for e in ahead],
        )
    if decision.status == 429 and body.queue:
        desired = ctx.controller.desired()
        never = could_fit_later(desired, observed, serve, recorded_requests(ctx.controller))
        if never is not None:
            return refuse(ctx, decision, serve, client, queue=f"not queued: {never}")
        return True
    return False


async def _enqueue(
    ctx: ApiContext,
    spec: ServeSpec,
    request: Request,
    body: UpBody,
    decision: UpDecision,
    now: float,
    client: str,
) -> JSONResponse:
    """Queue the request (429 when a role's queue is full); hold or answer "queued"."""
    serve = spec.name
    full = ctx.queue.full_on(spec.gpu_roles)
    if full:
        return refuse(
            ctx,
            UpDecision(
                429,
                f"{decision.message}; and the queue of {', '.join(full)} holds "
                f"{ctx.queue.max_per_role} requests already (the most it may)",
                decision.body,
                decision.retry_after_s or max(1, math.ceil(ctx.settings.retry_after_s)),
            ),
            serve,
            client,
        )
    entry = ctx.queue.add(spec, body.ttl_s, body.queue_s or DEFAULT_QUEUE_S, now)
    follow(entry, request, body.wait_s, body.outlive_client)
    logger.info(
        "api: up {} from {} queued (position {}): {}",
        serve,
        client,
        ", ".join(f"{p} on {r}" for r, p in ctx.queue.positions(entry).items()),
        decision.message,
    )
    ctx.pump.notify("request_queued", serve=serve, position=ctx.queue.positions(entry))
    if body.wait_s:
        return await hold(ctx, spec, request, body.wait_s, entry, None, {})
    return queued_answer(ctx, entry)


def _already_running(ctx: ApiContext, serve: str) -> JSONResponse:
    """202, nothing recorded: the serve runs, and not because of a request.

    Recording one would make the loop stop it when the request ends, which nobody
    asked for (a serve that sleeps is woken by the request instead).
    """
    ctx.bus.publish("request.admitted", serve=serve, recorded=False, ttl_s=None, steps=[])
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


async def _admit(
    ctx: ApiContext,
    spec: ServeSpec,
    request: Request,
    body: UpBody,
    view: LoopView,
    observed: Observed,
    decision: UpDecision,
    now: float,
) -> JSONResponse:
    """Record the request (202), or say it runs already; with ``wait_s``, hold."""
    serve = spec.name
    active = {r.serve for r in ctx.controller.requests()}
    asleep = observed.sleep_of(serve).asleep
    if observed.container(spec.container).holds and serve not in active and not asleep:
        return _already_running(ctx, serve)
    accepted = _record(ctx, spec, body.ttl_s, view, observed, decision, now, client_of(request))
    if not body.wait_s:
        return JSONResponse(accepted, status_code=202)
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
    return await hold(ctx, spec, request, body.wait_s, None, now - 0.001, accepted)


def _record(
    ctx: ApiContext,
    spec: ServeSpec,
    ttl: float | None,
    view: LoopView,
    observed: Observed,
    decision: UpDecision,
    now: float,
    client: str,
) -> dict[str, Any]:
    """Record the request, publish it, log it; the 202 body that says so."""
    serve = spec.name
    ctx.controller.request_up(serve, ttl)
    effective_ttl = ttl if ttl is not None else spec.idle_ttl_s
    ctx.bus.publish(
        "request.admitted",
        serve=serve,
        recorded=True,
        ttl_s=effective_ttl,
        steps=[f"{st['action']} {st['serve']}" for st in decision.body["steps"]],
    )
    record = next((r for r in ctx.controller.requests() if r.serve == serve), None)
    req_json = (
        request_json(record, now, spec, observed)
        if record is not None
        else request_json(OnDemandRequest(serve, now, effective_ttl), now, spec, observed)
    )
    held = ctx.controller.view().backoff.get(serve)
    note = None
    if held is not None and held.until > now:
        note = (
            f"{serve} is backing off after {held.failures} failure(s) ({held.last_failure}); "
            f"it is tried again in {held.until - now:.0f}s"
        )
    logger.info(
        "api: up {} from {} accepted (ttl {}): {}", serve, client, effective_ttl, decision.message
    )
    return {
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


@router.post("/v1/serves/{serve}/down", status_code=202)
async def down(serve: str, request: Request, ctx: Ctx) -> JSONResponse:
    spec = ctx.spec_of(serve)
    now = time.time()
    entry = ctx.queue.get(serve)
    if entry is not None:
        ctx.queue.leave(
            entry,
            "cancelled",
            now,
            409,
            {"error": f"the queued request of {serve} was ended by down"},
        )
        ctx.pump.notify("request_ended", serve=serve, outcome="cancelled")
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
    sit = ctx.controller.situation()
    live = [
        r
        for r in sit.desired.requests
        if r.serve == serve and in_force(r, spec, sit.observed, sit.now)
    ]
    need = None if sit.router else down_needs_router(spec, sit.observed)
    if live and need is not None:
        why = f"{no_router_reason(f'down {serve}', [need])}; the request stays in force"
        logger.info("api: down {} refused: {}", serve, why)
        raise ApiError(409, why, {"needs_router": [need.to_json()]})
    if not live or not ctx.controller.request_down(serve):
        raise ApiError(
            409,
            f"{serve} has no active on-demand request (none was made, or it ended or expired)",
        )
    now_seen = ctx.controller.view().observed()
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
    ctx.bus.publish("request.ended", serve=serve, reason="down", running=running, stays=stays)
    return JSONResponse(
        {"status": 202, "serve": serve, "ended": True, "message": message},
        status_code=202,
    )
