"""The reads of the host: ``GET /v1/ledger``, ``/v1/serves``, ``/v1/queue``, ``/v1/fit/{serve}``.

Every answer is the loop's live situation (``Controller.situation``: the newest
observation plus what the executor has done and holds since, the loop's whole policy,
now), rendered by the one builder of each answer (:mod:`controller.interfaces.host_answers`,
the same the MCP tools render), with ``observed_at`` and the steps ``in_flight``.
``GET /v1/ledger`` tells what is held (committed, free, ``overcommitted``) from what is
promised beside it to requests accepted and not yet planned; ``GET /v1/fit`` counts
those as held. No side effects; what the module doc of :mod:`controller.interfaces.api`
says of each route holds here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from controller.interfaces import host_answers
from controller.interfaces.api.context import ApiContext, Ctx, Full, live_meta
from controller.service.loop_port import LoopView

router = APIRouter()


def row_extras(ctx: ApiContext, view: LoopView) -> host_answers.RowExtras:
    """What the loop knows of each serve beside its situation: backoff, footprints,
    model estimates, the queue."""

    def queued(serve: str) -> dict[str, Any] | None:
        entry = ctx.queue.get(serve)
        return None if entry is None else entry.to_json(ctx.queue.positions(entry))

    return host_answers.RowExtras(
        backoff=view.backoff, footprints=view.footprints, models=view.models, queued=queued
    )


@router.get("/v1/ledger")
async def ledger(ctx: Ctx, full: Full) -> dict[str, Any]:
    view = ctx.controller.view()
    sit = ctx.controller.situation()
    answer = host_answers.ledger_answer(sit, observed=view.snapshot is not None)
    answer.pop("host", None)
    return {**ctx.meta(view, full), **answer}


@router.get("/v1/serves")
async def serves(ctx: Ctx, full: Full) -> dict[str, Any]:
    view = ctx.controller.view()
    sit = ctx.controller.situation()
    docker, rows = host_answers.serve_rows(
        sit, row_extras(ctx, view), full=full, observed=view.snapshot is not None
    )
    return {**ctx.meta(view, full), "docker": docker, "serves": rows}


@router.get("/v1/queue")
async def queue_route(ctx: Ctx) -> dict[str, Any]:
    return {**live_meta(ctx.controller.view()), **ctx.queue.to_json()}


@router.get("/v1/fit/{serve}")
async def fit(serve: str, ctx: Ctx, full: Full) -> dict[str, Any]:
    ctx.spec_of(serve)
    view = ctx.controller.view()
    ctx.observed_or_503(view)
    answer = host_answers.fit_json(ctx.controller.situation(), serve, full=full)
    return {**answer, **live_meta(view)}
