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
  (:func:`statemachine.admission.could_fit_later`) waits in :class:`RequestQueue`, a
  FIFO per GPU role, instead of getting 429. The head of a role's queue is admitted
  (recorded as an on-demand request) as soon as it fits; every later request on that
  role, queued or not, waits behind it (strict FIFO per role: a small request cannot
  overtake a large one and starve it); requests whose roles share no queue do not
  compete and are not held back. A queued request ends when it is admitted, on
  ``down``, at its own deadline (``queue_s``), or when it can never fit any more (429 /
  409 as an ``up`` without the queue). At most :data:`MAX_QUEUED_PER_ROLE` requests
  wait on one role; over that, 429 says so. The queue lives in the controller's
  memory: a restart empties it (nothing was recorded for a queued request).
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

This module keeps records and computes answers; it changes the loop only through
the port's ``request_up`` (an admission).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.service.live import StepEnded
from controller.service.view import LoopView
from statemachine.types import ServeSpec

#: the longest an ``up`` may hold its answer (seconds)
MAX_WAIT_S = 600.0
#: requests that may wait in one GPU role's queue
MAX_QUEUED_PER_ROLE = 8
#: how long a queued request waits for room unless it says (``queue_s``)
DEFAULT_QUEUE_S = 600.0
#: the longest a queued request may wait for room
MAX_QUEUE_S = 3600.0
#: an admitted request keeps its place until the live ledger counts it, this long at most
SETTLE_S = 120.0
#: queued requests that ended, kept for ``GET /v1/queue``
RECENT_KEPT = 32

_ROOM_ACTIONS = frozenset(
    {"quiesce", "drain", "stop", "release", "shrink", "sleep", "release_to_residual"}
)
_FAILED = frozenset({"failed", "aborted", "interrupted"})


class Gone(Protocol):
    """A waiting client's disconnect, once it happened (an ``asyncio.Event``)."""

    def is_set(self) -> bool:
        """True once the client went away."""
        ...


@dataclass
class QueueEntry:
    """One request waiting for room."""

    id: int
    serve: str
    gpu_roles: tuple[str, ...]
    ttl_s: float | None
    enqueued_at: float
    deadline: float
    #: set when it leaves the queue: when, how, and (ended) the answer it got
    left_at: float | None = None
    outcome: str | None = None  # "admitted", "cancelled", "deadline", "impossible", "withdrawn"
    status: int | None = None
    answer: dict[str, Any] = field(default_factory=dict)
    #: the clients holding their answer on it (each one's disconnect)
    waiters: list[Gone] = field(default_factory=list)
    #: it waits whoever is there: a client was told it is queued, or asked for that
    kept: bool = False

    def abandoned(self) -> bool:
        """Nobody waits for it: every client that held its answer on it went away, and
        none was told it stays queued."""
        return not self.kept and bool(self.waiters) and all(w.is_set() for w in self.waiters)

    def to_json(self, positions: Mapping[str, int] | None = None) -> dict[str, Any]:
        """JSON form; ``positions``: role -> 1-based place in that role's queue."""
        now = time.time()
        return {
            "id": self.id,
            "serve": self.serve,
            "gpu_roles": list(self.gpu_roles),
            "position": dict(positions or {}),
            "ttl_s": self.ttl_s,
            "enqueued_at": self.enqueued_at,
            "waited_s": round((self.left_at or now) - self.enqueued_at, 3),
            "deadline": self.deadline,
            "left_at": self.left_at,
            "outcome": self.outcome,
            "status": self.status,
            "message": self.answer.get("error") or self.answer.get("message"),
        }


class RequestQueue:
    """The FIFO per GPU role of requests that wait for room (see the module doc).

    Touched only from the event loop's thread (the API's handlers and its pump).
    """

    def __init__(self, max_per_role: int = MAX_QUEUED_PER_ROLE) -> None:
        self.max_per_role = max_per_role
        self._waiting: list[QueueEntry] = []  # in arrival order
        #: admitted, but the live ledger does not count them yet: they still hold
        #: their place (what follows on their roles would be promised the same room)
        self._settling: list[QueueEntry] = []
        self._recent: list[QueueEntry] = []
        self._ids = itertools.count(1)

    def waiting(self) -> list[QueueEntry]:
        """The entries still waiting, oldest first."""
        return list(self._waiting)

    def recent(self) -> list[QueueEntry]:
        """The entries that left the queue lately, newest last."""
        return list(self._recent)

    def get(self, serve: str) -> QueueEntry | None:
        """The waiting entry of ``serve``, if any."""
        return next((e for e in self._waiting if e.serve == serve), None)

    def ahead_on(self, roles: Iterable[str], before: QueueEntry | None = None) -> list[QueueEntry]:
        """The waiting entries on any of ``roles`` (ahead of ``before`` when given)."""
        wanted = set(roles)
        out = [e for e in self._settling if wanted & set(e.gpu_roles)]
        for e in self._waiting:
            if e is before:
                break
            if wanted & set(e.gpu_roles):
                out.append(e)
        return out

    def full_on(self, roles: Iterable[str]) -> list[str]:
        """The roles among ``roles`` whose queue holds the most it may."""
        return [
            r
            for r in roles
            if sum(1 for e in self._waiting if r in e.gpu_roles) >= self.max_per_role
        ]

    def positions(self, entry: QueueEntry) -> dict[str, int]:
        """Role -> ``entry``'s 1-based place in that role's queue."""
        return {r: 1 + len(self.ahead_on([r], before=entry)) for r in entry.gpu_roles}

    def add(
        self, spec: ServeSpec, ttl_s: float | None, wait_for_s: float, now: float
    ) -> QueueEntry:
        """Queue a request of ``spec`` (the caller checked :meth:`full_on` first)."""
        entry = QueueEntry(
            next(self._ids), spec.name, tuple(spec.gpu_roles), ttl_s, now, now + wait_for_s
        )
        self._waiting.append(entry)
        return entry

    def abandoned(self) -> list[QueueEntry]:
        """The waiting entries nobody waits for any more (see :meth:`QueueEntry.abandoned`)."""
        return [e for e in self._waiting if e.abandoned()]

    def eligible(self) -> list[QueueEntry]:
        """The entries at the head of every queue they are in (may be admitted now)."""
        return [e for e in self._waiting if not self.ahead_on(e.gpu_roles, before=e)]

    def leave(
        self,
        entry: QueueEntry,
        outcome: str,
        now: float,
        status: int | None = None,
        answer: dict[str, Any] | None = None,
    ) -> None:
        """``entry`` leaves the queue (admitted, cancelled, past its deadline, impossible,
        withdrawn)."""
        if entry in self._waiting:
            self._waiting.remove(entry)
        entry.left_at, entry.outcome, entry.status = now, outcome, status
        entry.answer = dict(answer or {})
        if outcome == "admitted":
            self._settling.append(entry)
        self._recent.append(entry)
        del self._recent[:-RECENT_KEPT]

    def settling(self) -> list[QueueEntry]:
        """Admitted entries the live ledger does not count yet (they keep their place)."""
        return list(self._settling)

    def settled(self, entry: QueueEntry) -> None:
        """``entry``'s serve is counted now (or its request ended): its place frees."""
        if entry in self._settling:
            self._settling.remove(entry)

    def to_json(self) -> dict[str, Any]:
        """``GET /v1/queue``: per role, the waiting entries in order; the recent ends."""
        roles: dict[str, list[dict[str, Any]]] = {}
        for e in self._waiting:
            pos = self.positions(e)
            for r in e.gpu_roles:
                roles.setdefault(r, []).append(e.to_json(pos))
        return {
            "max_per_role": self.max_per_role,
            "roles": roles,
            "recent": [e.to_json() for e in self._recent],
        }


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


def blocked_now(view: LoopView, serve: str, since: float) -> bool:
    """True when a plan made after ``since`` blocks ``serve`` (the caller re-decides)."""
    return (
        view.plan is not None
        and view.at >= since
        and any(b.serve == serve for b in view.plan.blocked)
    )
