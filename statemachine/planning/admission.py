"""Admission: who may be requested, what cannot run together, when protected memory frees.

The rules an on-demand request meets before and after the planner:

- :func:`can_request`: a serve may be requested unless it is unknown, desired
  ``stopped``, or resident and desired running (the loop runs it already). The API
  answers 404 / 409 with these words.
- :func:`conflict`: why two serves cannot run at the same time (exclusive mode on a
  shared role, a shared port). The planner stops what conflicts with a start; the API
  tells a permanent conflict (409) from a wait (429) with the same rule.
- :func:`inside_min_runtime` / :func:`frees_up_in`: how long until a protected serve
  may go away by itself (an evictable victim leaving its ``min_runtime_s``, an
  on-demand request running out), which is the API's ``Retry-After``.
- :func:`goes_away` / :func:`could_fit_later`: whether a request that does not fit now
  could fit once every serve that goes away by itself has (an evictable serve, for an
  on-demand requester, once its ``min_runtime_s`` or its start is over; an on-demand
  serve running for a request, once that request ends): the API queues such a
  request instead of refusing it, and ends the wait when this turns false.
- :func:`router_needs` / :func:`end_needs_router`: the router tiers a request's doing
  (its victims) and undoing (its own stop when it ends) drain; without a router the
  API refuses such a request (and a ``down`` that would stop such a serve) at once,
  with :func:`no_router_reason`, instead of accepting what the preflight will refuse
  every cycle (docs/operations.md#without-a-router); ``fit`` says the same of the start
  it answers (:func:`start_router_needs`). What ``run`` and ``validate`` say once about the
  serves with a tier when no router is set: ``statemachine.planning.router_tiers``.

Pure: functions of their arguments (``now`` included); no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from statemachine.domain.types import (
    DesiredRun,
    DesiredState,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
)
from statemachine.ledger.reservations import Ledger, ledger_from_observed
from statemachine.planning.idleness import request_end
from statemachine.planning.plan_types import Action, Step


def can_request(desired: DesiredState, serve: str) -> str | None:
    """None when ``serve`` may be requested on demand; else why not (the API's 404/409)."""
    spec = desired.serves.get(serve)
    if spec is None:
        return f"no serve named {serve!r}"
    if spec.desired is DesiredRun.STOPPED:
        return f'{serve} is desired = "stopped" in the manifest'
    if spec.residency is Residency.RESIDENT and spec.desired is DesiredRun.RUNNING:
        return f"{serve} is resident and desired running: the loop runs it already"
    return None


def _shares_role(a: ServeSpec, b: ServeSpec) -> bool:
    return any(r in b.gpu_roles for r in a.gpu_roles)


def conflict(s: ServeSpec, other: ServeSpec) -> str | None:
    """Why ``s`` cannot run while ``other`` runs (exclusivity, a shared port); else None.

    Memory is the ledger's business; this is the rest of what a start needs stopped.
    """
    if other.exclusive and s.gpu_inference and _shares_role(s, other):
        return f"exclusive on {', '.join(other.gpu_roles)}"
    if s.exclusive and other.gpu_inference and _shares_role(s, other):
        return f"{s.name} needs {', '.join(s.gpu_roles)} to itself"
    if s.port is not None and other.port == s.port:
        return f"holds port {s.port}"
    return None


def inside_min_runtime(s: ServeSpec, observed: Observed, now: float) -> float | None:
    """Seconds since ``s`` started while still inside its ``min_runtime_s``, else None."""
    if s.min_runtime_s <= 0:
        return None
    started = observed.container(s.container).started_at
    if started is None:
        return None
    age = now - started
    return age if age < s.min_runtime_s else None


def frees_up_in(
    spec: ServeSpec,
    requester: ServeSpec,
    observed: Observed,
    requests: Mapping[str, OnDemandRequest],
    now: float,
    default: float,
) -> float | None:
    """Seconds until protected ``spec`` may go away by itself; None when it never does.

    An evictable serve protected only by its ``min_runtime_s`` frees when that ends (for
    an on-demand requester, the only kind that evicts); a serve the manifest does not
    keep running, running for a request, frees when the request's TTL ends (``default``
    when it has none): the loop stops it then, whatever its residency and its
    ``min_runtime_s`` (the planner's stops). Where both apply, the sooner.
    """
    age = inside_min_runtime(spec, observed, now)
    ends = [_request_left(spec, observed, requests, now, default)]
    if (
        spec.residency is Residency.EVICTABLE
        and requester.residency is Residency.ON_DEMAND
        and age is not None
    ):
        ends.append(spec.min_runtime_s - age)
    known = [end for end in ends if end is not None]
    return min(known) if known else None


def _request_left(
    spec: ServeSpec,
    observed: Observed,
    requests: Mapping[str, OnDemandRequest],
    now: float,
    default: float,
) -> float | None:
    """Seconds until the request ``spec`` runs for ends (``default`` without a TTL);
    None when the manifest keeps it running or no request holds it."""
    req = requests.get(spec.name)
    if spec.desired is DesiredRun.RUNNING or req is None:
        return None
    end = request_end(req, spec, observed)
    return default if end.expires_at is None else max(0.0, end.expires_at - now)


def goes_away(
    other: ServeSpec | None, requester: ServeSpec, requests: Mapping[str, object]
) -> bool:
    """True when ``other`` will stop holding memory without the manifest changing.

    An evictable serve goes away for an on-demand requester (evicted now, or once its
    ``min_runtime_s`` or its start in progress is over); a serve the manifest does not
    keep running that runs for a request (``requests`` holds it, expired or not) goes
    away when the request ends (its TTL, or ``down``: the loop then stops it, whatever
    its residency). Serves the manifest keeps running, those running without a request
    and holders no manifest declares never do.
    """
    if other is None or other.name == requester.name:
        return False
    if other.residency is Residency.EVICTABLE and requester.residency is Residency.ON_DEMAND:
        return True
    return other.desired is not DesiredRun.RUNNING and other.name in requests


def could_fit_later(
    desired: DesiredState,
    observed: Observed,
    serve: str,
    requests: Mapping[str, object],
) -> str | None:
    """None when ``serve`` could run once what goes away by itself has; else why never.

    The question a queued request asks: on each of its roles, the free MiB plus what
    the serves that go away (:func:`goes_away`) hold plus what the elastic serves that
    stay could give back (down to their floor) must cover its reservation (less what it
    holds already: a sleeper's residual), and every
    serve it conflicts with (exclusivity, a port) that runs must go away. A placed serve
    (``placement``) runs on one of its candidates: it could run once it could on any
    one of them (docs/placement.md), unless it holds memory already, where it stays
    (on the card it holds, else on every candidate); the answer why never names each
    candidate's reason. A placed serve that runs conflicts on the card the ledger holds
    it on (every candidate where that is not known), not on its other candidates.
    ``requests``
    are the recorded on-demand requests (serve -> request; an expired one still counts:
    its serve is being stopped). Docker unreadable: nothing can
    be said (None; the caller answers 503 first). An optimistic answer is safe here:
    a queued request also ends at its own deadline.
    """
    spec = desired.serves[serve]
    ledger = ledger_from_observed(desired, observed)
    if ledger.unknown:
        return None
    have = ledger.holdings.get(spec.name)
    if not spec.placement or spec.placed:
        return _never_on(desired, observed, ledger, spec, requests)
    if have is not None:  # it stays where it holds
        return _never_on(
            desired, observed, ledger, replace(spec, gpu_roles=have.gpu_roles), requests
        )
    reasons = []
    for role in spec.placement:
        why = _never_on(desired, observed, ledger, replace(spec, gpu_roles=(role,)), requests)
        if why is None:
            return None
        reasons.append(f"On {role}: {why}.")
    return (
        f"{serve} can run on none of its candidates ({', '.join(spec.placement)}) once what "
        f"goes away by itself has gone. {' '.join(reasons)}"
    )


def _never_on(
    desired: DesiredState,
    observed: Observed,
    ledger: Ledger,
    spec: ServeSpec,
    requests: Mapping[str, object],
) -> str | None:
    """:func:`could_fit_later`'s answer for ``spec`` on its ``gpu_roles`` as they are."""
    serve = spec.name
    for other in desired.serves.values():
        if other.name == serve:
            continue
        runs = observed.container(other.container).holds or other.name in observed.starting
        held = ledger.holdings.get(other.name)
        if other.placement and held is not None:  # a placed serve is where it holds
            other = replace(other, gpu_roles=held.gpu_roles)  # noqa: PLW2901
        why = conflict(spec, other) or conflict(other, spec)
        if runs and why is not None and not goes_away(other, spec, requests):
            return (
                f"{serve} cannot run while {other.name} runs ({why}), and {other.name} "
                "never goes away by itself"
            )
    if spec.vram_mib is None or not desired.in_ledger(spec):
        return None
    # a sleeper already holds its residual: its wake asks only for the rest
    have = ledger.holdings.get(spec.name)
    needed = spec.vram_mib - (have.mib if have is not None else 0)
    if needed <= 0:
        return None
    for t in ledger.terms(spec.name, spec.gpu_roles, needed):
        if not t.shortfall_mib or t.free_mib is None:
            continue
        leaving = [
            (holder, mib)
            for holder, mib in t.reservations
            if goes_away(desired.serves.get(holder), spec, requests)
        ]
        gone = sum(mib for _, mib in leaving)
        give = 0
        for holder, mib in t.reservations:
            giver = desired.serves.get(holder)
            if giver is None or giver.elastic is None or any(h == holder for h, _ in leaving):
                continue
            give += max(0, mib - giver.elastic.floor_mib)
        if t.free_mib + gone + give < t.requested_mib:
            names = ", ".join(h for h, _ in leaving) or "nothing"
            return (
                f"{serve} can never fit on {t.gpu_role} while the manifest stays as it is: "
                f"budget {t.budget_mib}, free {t.free_mib}, what goes away by itself "
                f"({names}) {gone}, what elastic serves could give back {give}; "
                f"needs {t.requested_mib}"
            )
    return None


# ── without a router ─────────────────────────────────────────────────────────

#: The fix every refusal for want of a router names (one home for its words).
NO_ROUTER_FIX = (
    "no router is configured: start `vramctl run` with --router-url URL (or VRAMCTL_ROUTER_URL)"
)


@dataclass(frozen=True, slots=True)
class RouterNeed:
    """A serve whose router tier a request drains, and when (its stop, its sleep)."""

    serve: str
    router_tier: str
    when: str

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"serve": self.serve, "router_tier": self.router_tier, "when": self.when}


def end_needs_router(spec: ServeSpec, observed: Observed, requested: bool) -> RouterNeed | None:
    """The drain the end of ``spec``'s request needs; None when it needs none.

    The end stops ``spec`` (or puts it to sleep), draining its tier first, unless the
    manifest keeps it running, it has no tier, or it is asleep (its tier is quiesced
    already). ``requested``: a request of it is recorded; a serve that runs without one
    is not stopped by a request (``up`` records none for it).
    """
    tier = spec.router_tier
    if not tier or spec.desired is DesiredRun.RUNNING or observed.sleep_of(spec.name).asleep:
        return None
    if observed.docker_ok and observed.container(spec.container).holds and not requested:
        return None
    return RouterNeed(spec.name, tier, "stopped when its request ends")


def router_needs(
    desired: DesiredState, observed: Observed, serve: str, steps: Sequence[Step]
) -> tuple[RouterNeed, ...]:
    """The router tiers a request of ``serve`` drains: its plan's and its end's.

    ``steps``: the request's own steps (its plan group; empty when it does not fit
    now). Each ``drain`` of a victim is one need (stopped, or put to sleep, to make
    room); the request's end is another (:func:`end_needs_router`).
    """
    drained = [st.serve for st in steps if st.action is Action.DRAIN]
    sleeps = {st.serve for st in steps if st.action is Action.SLEEP}
    return start_router_needs(desired, observed, serve, drained, sleeps)


def start_router_needs(
    desired: DesiredState,
    observed: Observed,
    serve: str,
    drained: Sequence[str],
    sleeps: Collection[str],
) -> tuple[RouterNeed, ...]:
    """:func:`router_needs` from the names a start drains (``drained``; those in
    ``sleeps`` are put to sleep, the rest stopped), as ``fit`` answers them."""
    out: list[RouterNeed] = []
    for name in drained:
        tier = desired.serves[name].router_tier if name in desired.serves else None
        if tier:
            how = "put to sleep" if name in sleeps else "stopped"
            out.append(RouterNeed(name, tier, f"{how} to make room for {serve}"))
    requested = any(r.serve == serve for r in desired.requests)
    end = end_needs_router(desired.serves[serve], observed, requested)
    if end is not None:
        out.append(end)
    return tuple(out)


def down_needs_router(spec: ServeSpec, observed: Observed) -> RouterNeed | None:
    """The drain ending ``spec``'s recorded request needs now: when it runs or starts
    (or may: docker unread), the end stops it (:func:`end_needs_router`)."""
    runs = (
        not observed.docker_ok
        or observed.container(spec.container).holds
        or spec.name in observed.starting
    )
    return end_needs_router(spec, observed, requested=True) if runs else None


def no_router_reason(what: str, needs: Sequence[RouterNeed]) -> str:
    """Why ``what`` (``"up S"``, ``"down S"``) is refused without a router, with the fix."""
    drains = "; ".join(
        f"{n.serve} is {n.when}, and its router tier {n.router_tier} is drained first"
        for n in needs
    )
    return f"{what} cannot be carried out without a router: {drains}; {NO_ROUTER_FIX}"
