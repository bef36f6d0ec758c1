"""What every route of the API reads through: :class:`ApiContext` and its FastAPI dependencies.

The context holds the controller's port (its read-only view, the requests, and
``request_up`` / ``request_down``), the settings, the metrics, the event bus and the
request queue's pump; the app factory puts it on the app, and the routes get it with
``Depends`` (:data:`Ctx`), and whether a read may see free text with :data:`Full`.
Its helpers are the read rules every answer shares: an unknown serve is 404 with the
nearest name, no observation yet 503, a read with the right token gets full detail
(``"detail": "full"``), one without it names, states and figures only
(:mod:`controller.interfaces.redaction`), one with a wrong token 403.

This module reads; it changes nothing.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from controller.interfaces.api.errors import ApiError
from controller.interfaces.api.guard import auth_problem
from controller.interfaces.api.settings import ApiSettings
from controller.interfaces.metrics import Metrics
from controller.interfaces.redaction import REDACTED_NOTE, public_manifest_errors
from controller.service.events import EventBus
from controller.service.loop_port import LoopPort, LoopView
from controller.service.queue_pump import QueuePump, decide_up_on_live
from controller.service.request_queue import RequestQueue
from statemachine.answers.up_decision import UpDecision
from statemachine.domain.types import Observed, ServeSpec


def live_meta(view: LoopView) -> dict[str, Any]:
    """When the observation was taken, and what the executor did and does since."""
    at = view.observed_at
    return {
        "observed_at": at,
        "observation_age_s": None if at is None else round(max(0.0, time.time() - at), 3),
        "in_flight": [f.to_json() for f in view.live.in_flight],
        "since_observed": view.live.to_json(),
    }


def detail(full: bool) -> dict[str, Any]:
    """How much a read answer holds (``full`` or ``redacted``, with why)."""
    if full:
        return {"detail": "full"}
    return {"detail": "redacted", "detail_note": REDACTED_NOTE}


def client_of(request: Request) -> str:
    """The client's address as the log names it."""
    return request.client.host if request.client else "?"


@dataclass(frozen=True, slots=True)
class ApiContext:
    """The controller and what the API was wired with (see the module doc)."""

    controller: LoopPort
    settings: ApiSettings
    metrics: Metrics
    bus: EventBus
    pump: QueuePump

    @property
    def queue(self) -> RequestQueue:
        """The requests that wait for room (the pump's)."""
        return self.pump.queue

    def spec_of(self, serve: str) -> ServeSpec:
        """The serve's spec; 404 (with the nearest name) when the manifest set has none."""
        desired = self.controller.view().desired
        spec = desired.serves.get(serve)
        if spec is None:
            close = difflib.get_close_matches(serve, list(desired.serves), n=1, cutoff=0.6)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise ApiError(404, f'no serve named "{serve}" in the manifest set{hint}')
        return spec

    def observed_or_503(self, view: LoopView | None = None) -> Observed:
        """The live observation (the last one plus what the executor did since)."""
        observed = (view or self.controller.view()).observed()
        if observed is None:
            raise ApiError(
                503,
                "no observation yet: the loop has not completed its first cycle",
                headers={"Retry-After": "1"},
            )
        return observed

    def decide_now(self, view: LoopView, serve: str) -> UpDecision:
        """``decide_up`` on the live observation of ``view`` (503 before the first)."""
        self.observed_or_503(view)
        return decide_up_on_live(self.controller, serve, self.settings.retry_after_s)

    def full_detail(self, request: Request) -> bool:
        """Whether this read may see free text: it carries the right token.

        No ``Authorization`` header (or no token configured): names, states and
        figures only. A wrong bearer token is refused (403), not answered with less.
        """
        header = request.headers.get("authorization")
        if header is None or self.settings.token is None:
            return False
        problem = auth_problem(self.settings, header, f"{request.method} {request.url.path}")
        if problem is None:
            return True
        if problem.status == 401:  # not a bearer credential: as if none were sent
            return False
        raise problem

    def manifest_errors(self, view: LoopView, full: bool) -> list[str]:
        """The manifest set's errors, located only without the token."""
        if full:
            return list(view.manifest_errors)
        return public_manifest_errors(list(view.manifest_errors), list(view.manifest_issues))

    def meta(self, view: LoopView, full: bool) -> dict[str, Any]:
        """The fields every read answer starts with."""
        return {
            **live_meta(view),
            "cycles": view.cycles,
            "manifest_digest": view.manifest_digest,
            "manifest_errors": self.manifest_errors(view, full),
            **detail(full),
        }


async def api_context(request: Request) -> ApiContext:
    """The app's context (a dependency; ``async`` so that it runs on the loop's thread)."""
    context: ApiContext = request.app.state.api
    return context


Ctx = Annotated[ApiContext, Depends(api_context)]


async def full_detail(request: Request, ctx: Ctx) -> bool:
    """Whether this read may see free text (a dependency: see :meth:`ApiContext.full_detail`)."""
    return ctx.full_detail(request)


Full = Annotated[bool, Depends(full_detail)]
