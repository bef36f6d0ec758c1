"""The operator's page of ``vramctl run``: ``GET /`` and what it needs (docs/operations.md).

:func:`ui_router` is the API's router of these routes (the API includes it):

- ``GET /`` - the page (HTML), and ``GET /ui/app.js``, ``GET /ui/app.css`` - its
  assets, all shipped in this package (``controller/interfaces/ui/static``): no CDN, a serving
  host may be offline. Nothing else is served from the folder (a fixed list of names).
- ``GET /v1/plans?limit=N`` (1-100, default 10) - the last plans the journal recorded,
  newest first: each step with its outcome, what was blocked and why, the notes.

The page is read-only and polls the existing GET routes (``/healthz``, ``/v1/ledger``,
``/v1/serves``, ``/v1/plans``) once a second; it renders only what those answers
hold (a ``null`` figure is printed as ``unknown``, never 0) and draws a set of
answers only when they come from the same cycle. The read rules are the API's: no
token needed; without it the free text of a failure is withheld (``"detail":
"redacted"``); with the operator's token (typed into the page, kept in the tab's
``sessionStorage`` only) the answers are full; a wrong token is 403.

This module must not decide, compute or change anything: it reads the journal and
formats what was recorded. Its responses carry a Content-Security-Policy that allows
nothing but this origin's own scripts, styles and requests.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from controller.interfaces.redaction import public_blocked, public_failure
from controller.service.loop_port import JournalHistory

__all__ = ["ASSETS", "recent_plans", "ui_router"]

#: What ``/`` and ``/ui/NAME`` serve: name -> content type. Nothing else is served.
ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}

#: Headers of every page response: this origin only, no framing, no referrer.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

MAX_PLANS = 100


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _public_detail(detail: str | None) -> str | None:
    return None if detail is None else public_failure(detail)


def recent_plans(journal: JournalHistory, limit: int, *, full: bool) -> list[dict[str, Any]]:
    """The last ``limit`` recorded cycles, newest first, as the page shows them.

    Each: the cycle id, when it was planned, dry run or not, the steps in plan order
    with their recorded outcome (``null`` until the executor reported one), what was
    blocked and why, the planner's notes, and the executor's verdict. Without the
    token (``full`` false), a step's detail is kept only when it is states and figures
    (``container exited 1``), and a blocked reason that quotes a failure is withheld,
    as in ``GET /v1/serves``.
    """
    ids = journal.cycle_ids()[-limit:] if limit > 0 else []
    if not ids:
        return []
    records = journal.cycles(since_id=ids[0] - 1)
    out: list[dict[str, Any]] = []
    for rec in reversed(records):
        unused = journal.steps(rec.id)
        steps = []
        for idx, step in enumerate(rec.plan.get("steps", [])):
            # a step's outcome is recorded at its index in plan order; matched on the
            # action and serve too, so a report of fewer steps never shifts them
            same = [
                r for r in unused if (r.action, r.serve) == (step.get("action"), step.get("serve"))
            ]
            done = next((r for r in same if r.idx == idx), same[0] if same else None)
            if done is not None:
                unused.remove(done)
            detail = None if done is None else done.detail
            steps.append(
                {
                    "index": idx,
                    "action": step.get("action"),
                    "serve": step.get("serve"),
                    "gpu_roles": step.get("gpu_roles", []),
                    "mib": step.get("mib"),
                    "to_mib": step.get("to_mib"),
                    "reason": step.get("reason"),
                    "outcome": None if done is None else done.outcome,
                    "duration_s": None if done is None else done.duration_s,
                    "detail": detail if full else _public_detail(detail),
                }
            )
        blocked = [
            {
                "serve": b.get("serve"),
                "reason": b.get("reason")
                if full
                else public_blocked(str(b.get("serve")), b.get("reason")),
            }
            for b in rec.plan.get("blocked", [])
        ]
        outcome = rec.outcome
        out.append(
            {
                "cycle": rec.id,
                "at": rec.at,
                "dry_run": rec.dry_run,
                "manifest_digest": rec.manifest_digest,
                "steps": steps,
                "blocked": blocked,
                "notes": list(rec.plan.get("notes", [])),
                "outcome": None
                if outcome is None
                else {
                    "ok": outcome.get("ok"),
                    "stopped_early": outcome.get("stopped_early"),
                    "preflight_problems": len(outcome.get("preflight", [])),
                    "preflight": list(outcome.get("preflight", [])) if full else None,
                },
            }
        )
    return out


def ui_router(
    journal: Callable[[], JournalHistory],
    full_detail: Callable[[Request], bool],
    meta: Callable[[bool], dict[str, Any]],
) -> APIRouter:
    """The router of the page, its assets and ``GET /v1/plans`` (the API includes it).

    ``journal`` gives the controller's journal at request time; ``full_detail`` is
    the API's rule for a read (True with the right token, 403 with a wrong one);
    ``meta`` the API's common answer fields (cycles, observed_at, detail).
    """
    assets = {name: _asset(name) for name in ASSETS}
    router = APIRouter()

    def page(name: str) -> Response:
        return Response(assets[name], media_type=ASSETS[name], headers=PAGE_HEADERS)

    @router.get("/", include_in_schema=False)
    async def index() -> Response:
        return page("index.html")

    @router.get("/ui/app.js", include_in_schema=False)
    async def script() -> Response:
        return page("app.js")

    @router.get("/ui/app.css", include_in_schema=False)
    async def style() -> Response:
        return page("app.css")

    @router.get("/v1/plans")
    async def plans(
        request: Request, limit: Annotated[int, Query(ge=1, le=MAX_PLANS)] = 10
    ) -> dict[str, Any]:
        full = full_detail(request)
        return {**meta(full), "plans": recent_plans(journal(), limit, full=full)}

    return router
