"""The queue of ``up`` requests that wait for room: a FIFO per GPU role (records only).

A request that does not fit now only because memory (or a port, an exclusive role) is
held by serves that go away by themselves waits in :class:`RequestQueue` instead of
getting 429 (docs/operations.md, the HTTP API's ``"queue": true``). The head of a role's
queue is admitted as soon as it fits; every later request on that role, queued or not,
waits behind it (strict FIFO per role: a small request cannot overtake a large one and
starve it); requests whose roles share no queue do not compete. At most
:data:`MAX_QUEUED_PER_ROLE` requests wait on one role. The queue lives in the
controller's memory: a restart empties it (nothing was recorded for a queued request).
:mod:`controller.service.queue_pump` decides who leaves it and when.

This module keeps records; it decides nothing and changes nothing outside itself.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.service.loop_port import LoopView
from statemachine.domain.types import ServeSpec

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


def blocked_now(view: LoopView, serve: str, since: float) -> bool:
    """True when a plan made after ``since`` blocks ``serve`` (the caller re-decides)."""
    return (
        view.plan is not None
        and view.at >= since
        and any(b.serve == serve for b in view.plan.blocked)
    )
