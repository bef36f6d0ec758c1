"""The reads of the host: ``GET /v1/ledger``, ``/v1/serves``, ``/v1/queue``, ``/v1/fit/{serve}``.

Every answer is live (:mod:`controller.service.live`): the newest observation plus what
the executor has done and holds since, with ``observed_at`` and the steps ``in_flight``.
``GET /v1/ledger`` tells what is held (committed, free, ``overcommitted``) from what is
promised beside it to requests accepted and not yet planned (:func:`ledger_roles`);
``GET /v1/fit`` counts those as held. No side effects; what the module doc of
:mod:`controller.interfaces.api` says of each route holds here.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from controller.interfaces.api.context import ApiContext, Ctx, Full, live_meta
from controller.interfaces.redaction import public_blocked, public_failure
from controller.service.view import LoopView
from statemachine.admission import can_request
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
from statemachine.types import Observed, OnDemandRequest, ServeSpec
from statemachine.up_decision import mark_pending

router = APIRouter()


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


def request_json(
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


def pending_now(ctx: ApiContext, view: LoopView, observed: Observed) -> tuple[PendingStart, ...]:
    """The recorded requests the next cycle starts that nothing holds yet."""
    return pending_starts(
        ctx.controller.desired(),
        observed,
        policy=Policy(no_shrink=view.no_shrink),
        now=time.time(),
        requester=None,
    )


def status_now(ctx: ApiContext, view: LoopView) -> dict[str, Any]:
    """The host status on the live observation: what is held (the requests accepted
    and not yet planned are told apart by ``GET /v1/ledger``, :func:`ledger_roles`)."""
    snap = view.snapshot
    observed = view.observed() or Observed(docker_ok=False)
    controller = ctx.controller
    data = host_status(
        controller.desired(), observed, view.records, controller.reload_estimates()
    ).to_json()
    if snap is None:
        data["docker"] = "unknown"
        data["nvml"] = "unknown"
    return data


@router.get("/v1/ledger")
async def ledger(ctx: Ctx, full: Full) -> dict[str, Any]:
    view = ctx.controller.view()
    data = status_now(ctx, view)  # what is held; what is promised beside it
    pending = pending_now(ctx, view, view.observed() or Observed(docker_ok=False))
    return {
        **ctx.meta(view, full),
        "docker": data["docker"],
        "nvml": data["nvml"],
        "gpu_roles": ledger_roles(data, pending),
        "pending": [p.to_json() for p in pending],
        "undeclared_gpu_containers": data["undeclared_gpu_containers"],
        "no_longer_declared": data["no_longer_declared"],
    }


@router.get("/v1/serves")
async def serves(ctx: Ctx, full: Full) -> dict[str, Any]:
    view = ctx.controller.view()
    data = status_now(ctx, view)
    now = time.time()
    requests = {r.serve: r for r in ctx.controller.requests()}
    # the live observation, as the row's own figures: a start that ended healthy since
    # the snapshot has run (its request's idleness counts), not still "pending"
    seen = view.observed()
    plan = view.plan
    blocked = {b.serve: b.reason for b in plan.blocked} if plan is not None else {}
    out = [
        serve_row(ctx, view, row, requests.get(row["serve"]), blocked, seen, now, full)
        for row in data["serves"]
    ]
    return {**ctx.meta(view, full), "docker": data["docker"], "serves": out}


def serve_row(
    ctx: ApiContext,
    view: LoopView,
    row: dict[str, Any],
    req: OnDemandRequest | None,
    blocked: dict[str, str],
    seen: Observed | None,
    now: float,
    full: bool,
) -> dict[str, Any]:
    """One serve of ``GET /v1/serves``: its status row and what the API adds."""
    name = row["serve"]
    b = view.backoff.get(name)
    why_not = can_request(view.desired, name)
    entry = ctx.queue.get(name)
    return {
        **row,
        "requestable": why_not is None,
        "not_requestable_reason": why_not,
        "request": None
        if req is None
        else request_json(req, now, view.desired.serves.get(name), seen),
        # declared vs measured (docs/limits.md): null before any sample
        "footprint": view.footprints.get(name),
        # [serve.model]: weights + KV beside the reservation and the footprint (docs/sizing.md)
        "model": view.models.get(name),
        "queued": None if entry is None else entry.to_json(ctx.queue.positions(entry)),
        "blocked": blocked.get(name) if full else public_blocked(name, blocked.get(name)),
        "backoff": None
        if b is None or not b.failures
        else {
            "failures": b.failures,
            "last_failure": b.last_failure if full else public_failure(b.last_failure),
            "until": b.until,
            "retry_in_s": max(0.0, b.until - now),
        },
    }


@router.get("/v1/queue")
async def queue_route(ctx: Ctx) -> dict[str, Any]:
    return {**live_meta(ctx.controller.view()), **ctx.queue.to_json()}


@router.get("/v1/fit/{serve}")
async def fit(serve: str, ctx: Ctx) -> dict[str, Any]:
    ctx.spec_of(serve)
    view = ctx.controller.view()
    observed = ctx.observed_or_503(view)
    now = time.time()
    policy = Policy(no_shrink=view.no_shrink)
    desired = ctx.controller.desired()
    pending = pending_starts(desired, observed, policy=policy, now=now, requester=serve)
    result = fit_serve(desired, with_pending(observed, pending), serve, policy=policy, now=now)
    return {**mark_pending(result.to_json(), pending), **live_meta(view)}
