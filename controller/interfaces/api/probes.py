"""``GET /healthz`` and ``GET /metrics``: is the loop alive, and its Prometheus figures.

Read-only, as every GET of the API (docs/design.md §5): no token needed; without it
manifest errors are located only (:mod:`controller.interfaces.redaction`).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from controller.interfaces.api.context import Ctx, Full, detail
from controller.interfaces.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/healthz")
async def healthz(ctx: Ctx, full: Full) -> dict[str, Any]:
    # 200, with the number of cycles and the last cycle's age (no docstring: it would
    # become the route's OpenAPI description)
    view = ctx.controller.view()
    snap = view.snapshot
    age = time.time() - view.at if snap is not None else None
    return {
        "status": "ok" if snap is not None else "starting",
        "cycles": view.cycles,
        "last_cycle_at": view.at if snap is not None else None,
        "last_cycle_age_s": age,
        "last_cycle_duration_s": view.duration_s if snap is not None else None,
        "docker": "unknown" if snap is None else snap.docker,
        "nvml": "unknown" if snap is None else ("ok" if snap.gpus is not None else "unavailable"),
        "manifest_errors": ctx.manifest_errors(view, full),
        "dry_run": view.dry_run,
        **detail(full),
    }


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics_route(ctx: Ctx) -> Response:
    ctx.metrics.update_ledger(ctx.controller)  # live: what the running plan holds counts now
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)
