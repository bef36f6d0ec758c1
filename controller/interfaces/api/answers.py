"""The answers an ``up`` shares between deciding it and holding it: refusals and "queued".

:func:`refuse` is every 409 / 429 / 503 of ``up`` (logged, counted, published as
``request.refused``, ``Retry-After`` when known); :func:`queued_answer` the 202 of a
request that waits in the queue; :func:`follow` counts a client among those a queued
request is kept for (:mod:`controller.interfaces.upwait`).

This module formats answers and publishes events; it records nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from loguru import logger

from controller.interfaces.api.context import ApiContext, live_meta
from controller.interfaces.api.errors import error_response
from controller.interfaces.api.guard import DISCONNECTED
from controller.service.request_queue import QueueEntry
from statemachine.answers.up_decision import UpDecision

#: What becomes of a recorded request whose waiting ``up`` a later plan refused.
STAYS_RECORDED = {
    429: "the request stays recorded: the loop starts {serve} once it fits; `down` ends it",
    409: "the request stays recorded, but nothing starts {serve} while the manifest stays "
    "as it is; `down` ends it",
}


def refuse(
    ctx: ApiContext, decision: UpDecision, serve: str, client: str, **extra: Any
) -> JSONResponse:
    """The answer to an ``up`` that is not accepted (409 / 429 / 503), logged."""
    if decision.status == 429:
        ctx.metrics.refused("api")
    ctx.bus.publish(
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
        {"Retry-After": str(decision.retry_after_s)} if decision.retry_after_s is not None else None
    )
    return error_response(
        decision.status,
        decision.message,
        retry_after_s=decision.retry_after_s,
        **{**decision.body, **live_meta(ctx.controller.view()), **extra},
        headers=headers,
    )


def queued_answer(
    ctx: ApiContext, entry: QueueEntry, standing_json: dict[str, Any] | None = None
) -> JSONResponse:
    """202: ``entry`` waits in the queue, at these positions."""
    pos = ctx.queue.positions(entry)
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


def follow(entry: QueueEntry, request: Request, wait_s: float | None, outlive: bool) -> None:
    """Count this ``up`` among those ``entry`` is kept for (see upwait).

    A client that waits (``wait_s``) keeps it only while it is there, unless it
    says ``outlive_client``; one answered at once is told it is queued: it stays.
    """
    gone = request.scope.get(DISCONNECTED)
    if wait_s and not outlive and isinstance(gone, asyncio.Event):
        entry.waiters.append(gone)
    else:
        entry.kept = True
