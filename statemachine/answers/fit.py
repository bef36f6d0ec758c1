"""The fit answer: can a serve run now, and at what cost (docs/design.md §5 fit JSON).

``fit_serve`` asks the planner what an on-demand request for the serve would do,
without doing it (where the answer is plain, :mod:`statemachine.answers.planner_shortcut` gives the
planner's answer from the observed ledger and the planner's own predicates without
building the plan), and reduces that to the fit contract:
whether it fits, every term of each role's arithmetic, and what would be drained,
shrunk or evicted, or what blocks it.

Pure: no I/O, no clock (``now`` is an argument), no docker.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from statemachine.answers.planner_shortcut import decide
from statemachine.domain.slotinit import direct_init
from statemachine.domain.types import DesiredState, Observed, OnDemandRequest, ServeSpec
from statemachine.ledger.reservations import RoleTerms, ledger_from_observed
from statemachine.planning import placement
from statemachine.planning.plan_types import (
    Action,
    Placement,
    Plan,
    Policy,
    Protected,
)
from statemachine.planning.planner import (
    keeps_its_room,
    plan_transitions,
)

DEFAULT_POLICY = Policy()


@direct_init
@dataclass(frozen=True, slots=True)
class FitResult:
    """The fit answer for one serve."""

    serve: str
    fits: bool
    reason: str
    terms: tuple[RoleTerms, ...] = ()
    drain: tuple[str, ...] = ()
    evict: tuple[str, ...] = ()
    shrink: tuple[dict[str, Any], ...] = ()
    blockers: tuple[str, ...] = ()
    protected: tuple[Protected, ...] = ()
    #: victims put to sleep instead of stopped
    sleep: tuple[str, ...] = ()
    #: the serve itself sleeps and is woken rather than started
    wake: bool = False
    #: False when it cannot be answered (docker unread): ``fits`` is then False, so
    #: nothing is admitted, and the JSON says ``null``, not "does not fit"
    known: bool = True
    #: a placed serve: the card it would go to and why (each candidate's terms)
    placement: Placement | None = None

    def to_json(self) -> dict[str, Any]:
        """docs/design.md §5 fit JSON, plus ``reason`` and each role's committed reservations
        (and ``sleep`` / ``wake`` where a victim sleeps or the serve itself is woken);
        ``fits`` is ``null`` when it cannot be answered."""
        out: dict[str, Any] = {
            "serve": self.serve,
            "fits": self.fits if self.known else None,
            "reason": self.reason,
            "gpu_roles": [t.to_json() for t in self.terms],
            "drain": list(self.drain),
            "evict": list(self.evict),
            "shrink": list(self.shrink),
            "blockers": list(self.blockers),
            "protected": [p.to_json() for p in self.protected],
        }
        if self.sleep or self.wake:  # only where sleep takes part
            out["sleep"] = list(self.sleep)
            out["wake"] = self.wake
        if self.placement is not None:  # only for a placed serve
            out["placement"] = self.placement.to_json()
        return out


def request_plan(
    desired: DesiredState,
    observed: Observed,
    serve_name: str,
    *,
    policy: Policy | None = None,
    now: float,
) -> Plan:
    """The plan for an on-demand request of ``serve_name`` alone.

    Every other serve is treated as unmanaged, so the plan holds exactly what this
    start would cost (and, if it cannot happen, its blocked entry), except a resident
    in backoff whose room the loop keeps for it (:func:`keeps_its_room`): the request
    may not take that room in the loop's plan, so not in its answer either. ``now`` is
    the time of the observation; it has no default, since a wrong one misjudges every
    ``min_runtime_s`` and TTL.
    """
    held = policy or DEFAULT_POLICY
    isolated = DesiredState(
        roles=desired.roles,
        serves={
            n: s
            if n != serve_name and keeps_its_room(s, observed, held)
            else replace(s, desired=None)
            for n, s in desired.serves.items()
        },
        requests=(OnDemandRequest(serve_name, now),),
        host=desired.host,
    )
    return plan_transitions(isolated, observed, policy, now)


def placed_by_the_loop(
    desired: DesiredState,
    observed: Observed,
    serve_name: str,
    *,
    policy: Policy | None = None,
    now: float,
) -> tuple[Placement, ...]:
    """The placements of the plan the loop makes once ``serve_name`` is requested now:
    the whole desired state with its requests (the serves placed before it, in declared
    order, and the starts the loop weighs beside it: docs/placement.md), not the
    request alone, so the card answered is the card the loop puts it on."""
    others = tuple(r for r in desired.requests if r.serve != serve_name)
    asked = replace(desired, requests=(*others, OnDemandRequest(serve_name, now)))
    return plan_transitions(asked, observed, policy, now).placements


def fit_serve(
    desired: DesiredState,
    observed: Observed,
    serve_name: str,
    *,
    policy: Policy | None = None,
    now: float,
    by_planner: bool = False,
    placed_on: Observed | None = None,
) -> FitResult:
    """:func:`fit_on_card`'s answer, for a placed serve on the card its request would be
    placed on (``statemachine.planning.placement``), with that decision and every candidate's
    terms; a pinned serve's as it is. ``placed_on``: the observation the loop places
    it on (default ``observed``; the answers give the host as observed, where
    ``observed`` also counts the requests not yet planned as starting: the loop places
    serves in declared order, before it starts those declared after)."""
    serve = desired.serves[serve_name]
    if not serve.placement or serve.placed or not observed.docker_ok:
        return fit_on_card(
            desired, observed, serve_name, policy=policy, now=now, by_planner=by_planner
        )
    where = observed if placed_on is None else placed_on
    chosen = placed_by_the_loop(desired, where, serve_name, policy=policy, now=now)
    decision = next((p for p in chosen if p.serve == serve_name), None)
    placed = placement.apply(desired, chosen)
    answer = fit_on_card(
        placed, observed, serve_name, policy=policy, now=now, by_planner=by_planner
    )
    return replace(answer, placement=decision)


def fit_on_card(
    desired: DesiredState,
    observed: Observed,
    serve_name: str,
    *,
    policy: Policy | None = None,
    now: float,
    by_planner: bool = False,
) -> FitResult:
    """Could ``serve_name`` run now, and what would the planner stop or shrink for it?

    The question is asked in isolation: the planner sees only an on-demand request for
    this serve (every other serve treated as unmanaged), so the answer lists exactly
    what *this* start would cost. Only an on-demand serve may evict; for any other
    the answer is the plain admission arithmetic.

    Where :func:`statemachine.answers.planner_shortcut.decide` can tell the planner's answer without
    running it (a start that fits, or fits after stopping evictable victims) the plan
    is not built; the answer is the plan's in every case. ``by_planner``: always read
    off the plan (:data:`fit_serve_by_planner`, the reference the shortcut is held to).
    """
    serve = desired.serves[serve_name]
    ledger = ledger_from_observed(desired, observed)
    in_ledger = serve.vram_mib is not None and desired.in_ledger(serve)
    occupies = observed.container(serve.container).holds
    asleep = occupies and observed.sleep_of(serve.name).asleep
    mib = serve.vram_mib or 0
    if asleep and ledger.holds(serve.name):  # a wake takes only what it does not hold
        mib = max(0, mib - ledger.holdings[serve.name].mib)
    terms = ledger.terms(serve.name, serve.gpu_roles, mib) if in_ledger else ()
    if ledger.unknown:
        return FitResult(
            serve.name,
            False,
            "docker state is unknown: committed MiB cannot be known, nothing is admitted",
            terms,
            known=False,
        )
    if occupies and not asleep:
        held = ledger.holdings[serve.name].mib if ledger.holds(serve.name) else None
        what = f" and holds {held} MiB" if held is not None else ""
        return FitResult(
            serve.name,
            True,
            f"{serve.name} is already running{what}",
            ledger.terms(serve.name, serve.gpu_roles, 0) if in_ledger else (),
        )
    direct = (
        None
        if by_planner
        else decide(
            desired,
            observed,
            serve,
            ledger,
            policy or DEFAULT_POLICY,
            now,
            () if asleep else terms,  # a wake's terms are for what it does not hold
        )
    )
    if direct is not None:  # the planner's answer, reached without the planner
        return _fits(serve, terms, in_ledger, direct.evict, direct.drain)
    plan = request_plan(desired, observed, serve.name, policy=policy, now=now)
    return _from_plan(plan, serve, terms, in_ledger, wake=asleep)


#: :func:`fit_serve`'s answer, always read off the planner's plan for the request
fit_serve_by_planner = partial(fit_serve, by_planner=True)


def _from_plan(
    plan: Plan, serve: ServeSpec, terms: tuple[RoleTerms, ...], in_ledger: bool, *, wake: bool
) -> FitResult:
    """The answer read off the plan for the request of ``serve`` alone (``wake``: it
    sleeps and is woken): blocked, with what protects the victims it needed, or it
    fits after what the plan stops, drains, shrinks and puts to sleep."""
    blocked = [b for b in plan.blocked if b.serve == serve.name]
    if blocked:
        b = blocked[0]
        return FitResult(
            serve.name,
            False,
            b.reason,
            b.terms or terms,
            blockers=tuple(p.serve for p in b.protected),
            protected=tuple(b.protected),
        )
    shrinks = tuple(
        {"serve": s.serve, "give_mib": s.mib, "to_mib": s.to_mib}
        for s in plan.steps
        if s.action is Action.SHRINK
    )
    return _fits(
        serve,
        terms,
        in_ledger,
        tuple(s.serve for s in plan.steps if s.action is Action.STOP),
        tuple(s.serve for s in plan.steps if s.action is Action.DRAIN),
        shrinks,
        tuple(s.serve for s in plan.steps if s.action is Action.SLEEP),
        wake=wake,
    )


def _fits(
    serve: ServeSpec,
    terms: tuple[RoleTerms, ...],
    in_ledger: bool,
    evict: tuple[str, ...],
    drain: tuple[str, ...],
    shrinks: tuple[dict[str, Any], ...] = (),
    sleeps: tuple[str, ...] = (),
    *,
    wake: bool = False,
) -> FitResult:
    """The answer for a start the plan carries out: what it stops, drains, puts to
    sleep and shrinks first, and why it fits."""
    if not in_ledger:
        why = "declares no vram_mib" if serve.vram_mib is None else "has no role with capacity"
        reason = f"{serve.name} {why}: the ledger does not govern it"
    elif evict or shrinks or sleeps:
        steps = [f"stopping {name}" for name in evict]
        steps += [f"putting {name} to sleep" for name in sleeps]
        steps += [f"shrinking {s['serve']} by {s['give_mib']} MiB" for s in shrinks]
        reason = f"{serve.name} fits after {', '.join(steps)}"
    else:
        reason = _fits_reason(serve.name, terms)
    if wake:
        reason = f"{serve.name} sleeps and is woken, not started; {reason}"
    return FitResult(
        serve.name,
        True,
        reason,
        terms,
        drain=drain,
        evict=evict,
        shrink=shrinks,
        sleep=sleeps,
        wake=wake,
    )


def _fits_reason(name: str, terms: tuple[RoleTerms, ...]) -> str:
    """Why a serve fits with nothing stopped: each role's request against its free MiB."""
    return f"{name} fits: " + "; ".join(
        f"{t.requested_mib} MiB requested, {t.free_mib} MiB free on {t.gpu_role}" for t in terms
    )
