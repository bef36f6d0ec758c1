"""Requests accepted but not yet planned: the reservations an answer must count.

The API records an on-demand request and asks for a cycle; until that cycle has
planned it (and the executor has made its reserve), neither the observation nor the
executor's live record shows the memory it will take. An answer given in that window
(``up``, ``GET /v1/fit``, ``GET /v1/ledger``) that counted only what is held would
promise the same room twice. :func:`pending_starts` says which recorded requests the
next cycle will start, by asking the planner for the whole desired state (the manifest
and every recorded request, and for ``up`` and fit the request asked about, as that
cycle would see it) on the live observation: a request the planner would
start counts at what its reserve takes, on its roles; one it would not start (blocked,
expired, its serve already holding memory or starting) does not.
:func:`with_pending` lays them over an observation as starts in progress, which is how
the ledger, the fit and the planner then count them: held from now on, on every role
they reserve, never a victim of another request (a start in progress is not evicted).
That is what a refusal counts (everything that may be held). What is *held* is told
apart: each pending start carries the room its plan is still making (``making_room``:
the victims' releases, releases to a residual and shrinks, whose MiB count in full
until they are confirmed), so ``GET /v1/ledger`` shows a pending request beside the
room being made for it instead of on top of what it will replace
(:func:`role_pending`).

Pure: functions of their arguments (``now`` included); no I/O, no clock, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from statemachine.domain.types import DesiredState, Observed, OnDemandRequest, StartingObs
from statemachine.planning.idleness import in_force
from statemachine.planning.plan_types import Action, Policy
from statemachine.planning.planner import plan_transitions

#: how an answer labels a reservation counted for such a request
PENDING_STATE = "requested, not yet planned"


#: the steps that give room back, for a request's plan (their ``mib`` is what they free)
ROOM_ACTIONS = frozenset({Action.RELEASE, Action.RELEASE_TO_RESIDUAL, Action.SHRINK})


@dataclass(frozen=True, slots=True)
class Room:
    """Room a pending request's plan is making: a victim's step and the MiB it frees."""

    serve: str
    action: str
    gpu_roles: tuple[str, ...]
    mib: int

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"serve": self.serve, "action": self.action, "mib": self.mib}


@dataclass(frozen=True, slots=True)
class PendingStart:
    """A recorded request the next cycle starts: the roles and MiB its reserve takes,
    and the room its plan makes for it first (``making_room``)."""

    serve: str
    gpu_roles: tuple[str, ...]
    mib: int
    making_room: tuple[Room, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON form (``state``: :data:`PENDING_STATE`)."""
        return {
            "serve": self.serve,
            "gpu_roles": list(self.gpu_roles),
            "mib": self.mib,
            "state": PENDING_STATE,
            "making_room": [r.to_json() for r in self.making_room],
        }


def pending_starts(
    desired: DesiredState,
    observed: Observed,
    *,
    policy: Policy | None,
    now: float,
    requester: str | None = None,
) -> tuple[PendingStart, ...]:
    """The recorded, unexpired requests whose serve the next cycle starts (or wakes).

    ``desired`` holds the requests (the loop's desired state). A request counts when
    its serve neither holds memory awake nor is starting in ``observed`` (those are
    counted already) and the planner, given the whole desired state, reserves for it
    (``reserve``, or ``reserve_wake`` for a sleeper: then at its full reservation).
    ``requester``: the serve being asked about (``up``, fit). Its own request is never
    counted (it is the question, not a holder), and the plan is made as if it were
    requested now, since that is the cycle a 202 promises: the planner's own order
    decides who goes first (requests by age; an on-demand requester ahead of an
    evictable serve's request, which it may then leave waiting). Docker unreadable:
    nothing (the answers refuse).
    """
    if not observed.docker_ok:
        return ()
    waiting: set[str] = set()
    for req in desired.requests:
        spec = desired.serves.get(req.serve)
        if spec is None or req.serve == requester or req.serve in observed.starting:
            continue
        if not in_force(req, spec, observed, now):
            continue
        holds = observed.container(spec.container).holds
        if holds and not observed.sleep_of(spec.name).asleep:
            continue
        waiting.add(req.serve)
    if not waiting:
        return ()
    asked = (
        (OnDemandRequest(requester, now),)
        if requester is not None and requester in desired.serves
        else ()
    )
    others = tuple(r for r in desired.requests if r.serve != requester)
    whole = replace(desired, requests=others + asked)
    plan = plan_transitions(whole, observed, policy, now)
    out: list[PendingStart] = []
    for step in plan.steps:
        if step.serve not in waiting or step.group != step.serve:
            continue
        room = tuple(
            Room(st.serve, str(st.action), st.gpu_roles, st.mib)
            for st in plan.steps
            if st.group == step.serve and st.serve != step.serve and st.action in ROOM_ACTIONS
            if st.mib
        )
        if step.action is Action.RESERVE:
            out.append(PendingStart(step.serve, step.gpu_roles, step.mib or 0, room))
        elif step.action is Action.RESERVE_WAKE:
            full = desired.serves[step.serve].vram_mib or step.to_mib or 0
            out.append(PendingStart(step.serve, step.gpu_roles, full, room))
    return tuple(out)


def role_pending(
    pending: tuple[PendingStart, ...], role: str
) -> tuple[tuple[PendingStart, ...], int, int]:
    """The pending starts on ``role``, the MiB they take there, and the MiB the room
    being made for them frees there (their victims' steps on that role)."""
    here = tuple(p for p in pending if role in p.gpu_roles)
    taken = sum(p.mib for p in here)
    freed = sum(r.mib for p in here for r in p.making_room if role in r.gpu_roles)
    return here, taken, freed


def with_pending(observed: Observed, pending: tuple[PendingStart, ...]) -> Observed:
    """``observed`` with each pending start counted as a start in progress."""
    if not pending:
        return observed
    starting = dict(observed.starting)
    for p in pending:
        starting.setdefault(p.serve, StartingObs(p.gpu_roles, p.mib))
    return replace(observed, starting=starting)


def asked_as_of(
    seen: tuple[OnDemandRequest, ...], now: tuple[OnDemandRequest, ...]
) -> tuple[OnDemandRequest, ...]:
    """The requests a cycle plans: the requests recorded ``now``, less those for a
    serve that had none when the cycle's observation began (``seen``). Such a request
    is left to the next cycle (which the request asks for), which observes the host
    after it: planned on an observation older than the request, it would be weighed
    against a host the answer given to it never saw (a start that has since ended read
    as still in progress, so another victim chosen). A request renewed or released
    since counts as it stands now: nothing is stopped that was just asked for again,
    nothing started that was just withdrawn."""
    before = {r.serve for r in seen}
    return tuple(r for r in now if r.released or r.serve in before)
