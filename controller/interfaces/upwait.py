"""``up`` that waits, and the queue of requests that wait for room (the API's side).

Two things an ``up`` may ask for beyond being recorded (docs/operations.md, the API):

- ``wait_s`` (0 < N ≤ :data:`MAX_WAIT_S`): the answer is held until the serve is healthy
  and its router tier readmitted (200 with the timings), the attempt failed (502 with
  the step that failed and why; 429 / 409 with the arithmetic when the loop's plan now
  blocks it), the request ended (409), or N seconds passed (202 with where it stands).
  :func:`standing` says where a recorded request stands, from the steps the executor
  reported (:class:`controller.service.live.StepEnded`) and the loop's last plan.
- ``queue: true``: a request that does not fit now only because memory (or a port,
  an exclusive role) is held by serves that go away by themselves
  (:func:`statemachine.planning.admission.could_fit_later`) waits in the FIFO per GPU role of
  :mod:`controller.service.request_queue` instead of getting 429; the pump
  (:mod:`controller.service.queue_pump`) admits it (recorded as an on-demand request)
  as soon as it fits, or ends it at its deadline (``queue_s``), on ``down``, or when
  it can never fit any more (429 / 409 as an ``up`` without the queue).
- against a dry run (``vramctl run --dry-run``) nothing is executed, so a request never
  becomes ready: a waiting ``up`` is answered (202) as soon as the loop has planned
  it, with the plan's steps of its group (what a real run would do) and that nothing
  is executed (:func:`dry_run_answer`), not held until ``wait_s`` runs out.
- a queued request is kept for the clients that wait for it: one whose every waiting
  client (``wait_s``) went away before it was admitted is withdrawn at once (nothing
  was recorded for it, nobody is evicted for it); it stays when a client was told it
  is queued (an answer without ``wait_s``, or a wait that ran out) or asked for it to
  outlive its client (``outlive_client``). A request already recorded stays recorded
  when its waiting client goes away (``down`` ends it).

This module computes answers; it records and changes nothing. The queue's names
(:class:`RequestQueue`, :class:`QueueEntry`, :func:`blocked_now`) are re-exported here
for older callers; their home is :mod:`controller.service.request_queue`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controller.service.live import StepEnded
from controller.service.loop_port import LoopView
from controller.service.request_queue import QueueEntry, RequestQueue, blocked_now
from statemachine.domain.types import ServeSpec

__all__ = [
    "MAX_WAIT_S",
    "QueueEntry",
    "RequestQueue",
    "Standing",
    "blocked_now",
    "dry_run_answer",
    "standing",
    "timings",
]

#: the longest an ``up`` may hold its answer (seconds)
MAX_WAIT_S = 600.0
_ROOM_ACTIONS = frozenset(
    {"quiesce", "drain", "stop", "release", "shrink", "sleep", "release_to_residual"}
)
_FAILED = frozenset({"failed", "aborted", "interrupted"})


# ── where a recorded request stands ──────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Standing:
    """Where an ``up`` stands: final (200 ready, 502 failed) or still going (``None``)."""

    final: int | None
    stage: str
    message: str
    timings: dict[str, float | None]
    steps: tuple[StepEnded, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The part of the answer that says where it stands."""
        return {
            "stage": self.stage,
            "message": self.message,
            "timings": dict(self.timings),
            "steps": [
                {
                    "serve": r.serve,
                    "action": r.action,
                    "outcome": r.outcome,
                    "duration_s": round(r.ended_at - r.began_at, 3),
                }
                for r in self.steps
            ],
        }


def timings(
    spec: ServeSpec,
    steps: Iterable[StepEnded],
    since: float,
    now: float,
    queued: QueueEntry | None = None,
) -> dict[str, float | None]:
    """Seconds spent in each phase (``None``: not applicable, or not reached yet).

    ``queued_s``: in the queue, until admitted; ``made_room_s``: from the first step
    that made room (quiesce, drain, stop, release, shrink, sleep, release_to_residual)
    to the end of the last;
    ``started_s``: the start itself (``docker start`` or the ``up`` command), or the
    wake of a serve that sleeps;
    ``ready_s``: from the start's end until healthy and readmitted; ``total_s``: from
    the request (or its entry into the queue) until now.
    """
    records = list(steps)
    room = [r for r in records if r.action in _ROOM_ACTIONS]
    start = next(
        (r for r in records if r.serve == spec.name and r.action in ("start", "wake")), None
    )
    ready = [r for r in records if r.serve == spec.name and r.action in ("await_ready", "readmit")]
    q = None
    if queued is not None:
        q = round((queued.left_at or now) - queued.enqueued_at, 3)
    return {
        "queued_s": q,
        "made_room_s": round(max(r.ended_at for r in room) - min(r.began_at for r in room), 3)
        if room
        else None,
        "started_s": round(start.ended_at - start.began_at, 3) if start is not None else None,
        "ready_s": round(max(r.ended_at for r in ready) - start.ended_at, 3)
        if start is not None and ready and all(r.outcome == "ok" for r in ready)
        else None,
        "total_s": round(now - (queued.enqueued_at if queued is not None else since), 3),
    }


def standing(
    view: LoopView,
    spec: ServeSpec,
    steps: list[StepEnded],
    since: float,
    now: float,
    queued: QueueEntry | None = None,
) -> Standing:
    """Where the request of ``spec`` recorded at ``since`` stands now.

    ``steps``: what the executor reported of the request's group since then. Ready:
    its await_ready succeeded and, with a router tier, its readmit too. Failed: a
    step of the group failed or was aborted (a drain refused or timed out), or was
    skipped because the preflight refused it. Otherwise it goes on: the stage is the
    step in flight, or what it waits for.
    """
    times = timings(spec, steps, since, now, queued)
    mine = tuple(steps)
    for r in mine:
        refused = r.outcome == "skipped" and r.detail.startswith("refused by the preflight")
        if r.outcome in _FAILED or refused:
            return Standing(
                502,
                "failed",
                f"{r.action} of {r.serve} {r.outcome}: {r.detail}",
                times,
                mine,
            )
    ready = any(r.serve == spec.name and r.action == "await_ready" for r in mine)
    readmitted = spec.router_tier is None or any(
        r.serve == spec.name and r.action == "readmit" for r in mine
    )
    if ready and readmitted:
        return Standing(200, "ready", f"{spec.name} is healthy and routable", times, mine)
    flying = [f for f in view.live.in_flight if f.group == spec.name]
    if flying:
        f = flying[0]
        stage = f"{f.action} {f.serve}"
        message = f"{f.action} of {f.serve} in progress for {time.time() - f.since:.1f}s"
    elif any(r.serve == spec.name and r.action in ("start", "wake") for r in mine):
        stage, message = "await_ready", f"{spec.name} started; waiting for it to be healthy"
    else:
        stage, message = "recorded", "recorded; waiting for the loop to plan it"
    return Standing(None, stage, message, times, mine)


def dry_run_answer(view: LoopView, spec: ServeSpec) -> dict[str, Any] | None:
    """A dry run's answer to a waiting ``up`` of ``spec`` (recorded before ``view.at``):
    the steps of its group in the loop's plan, and that nothing is executed; ``None``
    when the controller executes (a real run) or has not planned yet."""
    if not view.dry_run or view.plan is None:
        return None
    steps = [s.to_json() for s in view.plan.steps if s.group == spec.name]
    would = ", ".join(f"{s['action']} {s['serve']}" for s in steps) or "nothing"
    return {
        "dry_run": True,
        "ready": False,
        "stage": "dry run",
        "steps": steps,
        "message": f"dry run: nothing is executed, so {spec.name} never becomes ready; "
        f"a real run would: {would}",
        "note": "the request stays recorded in the dry run's journal until `down` or its "
        "TTL; it never reaches a real run",
    }
