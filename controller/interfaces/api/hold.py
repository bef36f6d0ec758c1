"""``up`` with ``wait_s``: the answer held until ready, failed, ended, or out of time.

:func:`hold` follows a recorded (or queued) request through the loop's cycles (see
:mod:`controller.interfaces.upwait`): 200 when the serve is ready, 502 when its start
failed, 409 / 429 when a later plan refuses it (the request stays recorded), 409 when
the request ended, the queue's own answer when a queued request left it otherwise,
a dry run's answer at once, and 202 with where it stands when ``wait_s`` runs out. A
client that goes away ends the wait (and withdraws a queued request only it held).

It changes nothing itself: the pump admits queued requests (``QueuePump.process``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from loguru import logger

from controller.interfaces.api.answers import STAYS_RECORDED, queued_answer, refuse
from controller.interfaces.api.context import ApiContext, client_of
from controller.interfaces.api.errors import error_response
from controller.interfaces.api.guard import DISCONNECTED
from controller.interfaces.upwait import dry_run_answer, standing
from controller.service.loop_port import LoopView
from controller.service.queue_pump import active_requests
from controller.service.request_queue import QueueEntry, blocked_now
from statemachine.domain.types import ServeSpec


async def hold(
    ctx: ApiContext,
    spec: ServeSpec,
    request: Request,
    wait_s: float,
    entry: QueueEntry | None,
    since: float | None,
    accepted: dict[str, Any],
) -> JSONResponse:
    """Hold the answer until ready, failed, ended, or ``wait_s`` (see the module doc)."""
    wait_s = min(wait_s, ctx.settings.max_wait_s)
    deadline = time.monotonic() + wait_s
    t0 = time.time()
    while True:
        now = time.time()
        if entry is not None and entry.outcome is None:
            ctx.pump.process()
        if entry is not None and entry.outcome not in (None, "admitted"):
            return _left_queue(entry, now - t0)
        if entry is not None and entry.outcome == "admitted" and since is None:
            since = entry.left_at
        view = ctx.controller.view()
        if since is not None:
            answer = _recorded(ctx, view, spec, request, since, entry, accepted, now, t0)
            if answer is not None:
                return answer
        left = deadline - time.monotonic()
        if left <= 0:
            return _out_of_time(ctx, view, spec, wait_s, since, entry, accepted, now, t0)
        gone = request.scope.get(DISCONNECTED)
        if isinstance(gone, asyncio.Event) and gone.is_set():
            logger.info(
                "api: the client waiting for up {} went away (from {})",
                spec.name,
                client_of(request),
            )
            ctx.pump.withdraw_abandoned(now)
            return JSONResponse({"status": 202, "serve": spec.name}, status_code=202)
        await ctx.controller.wait_change(min(left, 0.5))


def _left_queue(entry: QueueEntry, waited_s: float) -> JSONResponse:
    """The answer of a queued request that left the queue without being admitted."""
    body = dict(entry.answer)
    message = str(body.pop("error", body.pop("message", entry.outcome)))
    body.pop("status", None)
    return error_response(
        entry.status or 409, message, queue=entry.to_json(), waited_s=waited_s, **body
    )


def _recorded(
    ctx: ApiContext,
    view: LoopView,
    spec: ServeSpec,
    request: Request,
    since: float,
    entry: QueueEntry | None,
    accepted: dict[str, Any],
    now: float,
    t0: float,
) -> JSONResponse | None:
    """The final answer for a request recorded at ``since``, or ``None``: still waiting."""
    serve = spec.name
    if serve not in active_requests(ctx.controller, now):
        return error_response(
            409,
            f"the request of {serve} ended (down, or its TTL) before it was ready",
            waited_s=now - t0,
        )
    st = standing(view, spec, ctx.controller.steps_since(since, serve), since, now, entry)
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
        decision = ctx.decide_now(view, serve)
        if decision.status in (409, 429):
            where = {k: v for k, v in st.to_json().items() if k != "message"}
            return refuse(
                ctx,
                decision,
                serve,
                client_of(request),
                **where,
                note=STAYS_RECORDED[decision.status].format(serve=serve),
                waited_s=round(now - t0, 3),
            )
    dry = dry_run_answer(view, spec) if view.at >= since else None
    if dry is None:
        return None
    # a dry run executes nothing: it never becomes ready
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


def _out_of_time(
    ctx: ApiContext,
    view: LoopView,
    spec: ServeSpec,
    wait_s: float,
    since: float | None,
    entry: QueueEntry | None,
    accepted: dict[str, Any],
    now: float,
    t0: float,
) -> JSONResponse:
    """``wait_s`` ran out: still queued (it stays so), or where the request stands."""
    if entry is not None and entry.outcome is None:
        entry.kept = True  # the client is told it is queued: it stays so
        return queued_answer(ctx, entry, {"waited_s": round(now - t0, 3)})
    st = standing(
        view,
        spec,
        ctx.controller.steps_since(since or now, spec.name),
        since or now,
        now,
        entry,
    )
    return JSONResponse(
        {
            **accepted,
            "status": 202,
            "serve": spec.name,
            "ready": False,
            **st.to_json(),
            "message": f"not ready after wait_s {wait_s:g}: {st.message}",
            "waited_s": round(now - t0, 3),
        },
        status_code=202,
    )
