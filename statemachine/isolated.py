"""The decision for one isolated on-demand request, without running the planner.

``fit`` asks what the planner would do for an on-demand request of one serve while
every other serve is unmanaged (:func:`statemachine.fit.request_plan`). In the common
case that plan is a single start: no stop planned before it, no conflict, the room
either free or made by stopping committed evictable victims. :func:`decide` reaches
that answer directly: the ledger's free MiB, the shortfall on each role, the
eviction candidates the planner would see (:func:`statemachine.planner.plan_transitions`
rule 3) and the victim rules (:func:`statemachine.victims.choose_victims`). It answers
only where it is sure to give exactly the planner's answer, and ``None`` wherever the
planner would apply a rule this shortcut does not (the caller then runs the planner):

- the requester is not on-demand (only on-demand serves evict; a backfill start is
  planned after the grow-back of shrunk elastic serves), is held back by the policy,
  its request has already ended, its start is in progress, it sleeps (a wake), or it
  exited with its memory not back yet;
- a running serve conflicts with it (exclusivity, a port), or it sizes itself from free
  memory while a peer of that kind loads on one of its roles;
- a holder on a short role could give memory back (elastic shrink) or be put to sleep
  instead of stopped;
- nothing covers the shortfall (the planner writes the blocked entry, every term).

tests/test_fit_isolated.py checks, over random hosts, that every answer equals the
planner's plan for the isolated request.

Pure: no I/O, no clock (``now`` is an argument), no logging, no docker.
"""

from __future__ import annotations

from dataclasses import dataclass

from statemachine.admission import conflict, inside_min_runtime
from statemachine.idleness import request_end
from statemachine.ledger import Ledger
from statemachine.plan import Policy
from statemachine.types import (
    DesiredState,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
    SleepState,
)
from statemachine.victims import Candidate, choose_victims


@dataclass(frozen=True, slots=True)
class Decision:
    """What the planner would do for the isolated request: whom it stops (in the
    plan's order) and whose router tier it drains first."""

    evict: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()


NO_ROOM_NEEDED = Decision()


def decide(
    desired: DesiredState,
    observed: Observed,
    serve: ServeSpec,
    ledger: Ledger,
    policy: Policy,
    now: float,
) -> Decision | None:
    """The planner's answer for an isolated on-demand request of ``serve``, or None
    where only the planner can say (see the module docstring).

    ``ledger`` is ``ledger_from_observed(desired, observed)`` (known: docker was read);
    ``serve`` does not run (its container holds no memory, or it sleeps).
    """
    name = serve.name
    if (
        serve.residency is not Residency.ON_DEMAND
        or name in policy.hold
        or name in observed.starting
        or observed.sleep_of(name).asleep
        or ledger.holds(name)
        or request_end(OnDemandRequest(name, now), serve, observed).expired(now)
    ):
        return None
    serves = desired.serves
    starting = observed.starting
    container = observed.container
    running: list[ServeSpec] = []
    for other in serves.values():
        if other.name == name:
            continue
        if container(other.container).holds or other.name in starting:
            if conflict(serve, other) is not None:
                return None
            running.append(other)
    if serve.sizes_from_free and _peer_loads(serve, running, observed):
        return None
    if serve.vram_mib is None or not desired.in_ledger(serve):
        return NO_ROOM_NEEDED
    mib = serve.vram_mib
    short: dict[str, int] = {}
    for r in serve.gpu_roles:
        free = ledger.free_mib(r)
        if mib > free:
            short[r] = mib - free
    if not short:
        return NO_ROOM_NEEDED
    cands = _candidates(serve, running, short, ledger, policy, observed, now)
    if cands is None:
        return None
    chosen = choose_victims(cands, short, exact_limit=policy.exact_search_limit)
    if chosen is None:
        return None
    evict = tuple(c.name for c in chosen)
    drain = tuple(
        c.name
        for c in chosen
        if serves[c.name].router_tier and not observed.sleep_of(c.name).asleep
    )
    return Decision(evict, drain)


def _peer_loads(serve: ServeSpec, running: list[ServeSpec], observed: Observed) -> bool:
    """True when an engine that sizes itself from free memory starts or loads on one of
    ``serve``'s roles (the planner then makes ``serve`` wait)."""
    for peer in running:
        if not peer.sizes_from_free or not any(r in peer.gpu_roles for r in serve.gpu_roles):
            continue
        if (
            peer.name in observed.starting
            or observed.container(peer.container).health == "starting"
        ):
            return True
    return False


def _candidates(
    serve: ServeSpec,
    running: list[ServeSpec],
    short: dict[str, int],
    ledger: Ledger,
    policy: Policy,
    observed: Observed,
    now: float,
) -> list[Candidate] | None:
    """The eviction candidates on the short roles, in the planner's order (the short
    roles in the requester's order, each role's serves as declared); None when one of
    the holders could be shrunk or put to sleep instead (the planner weighs those)."""
    holdings = ledger.holdings
    by_name = {o.name: o for o in running}
    order: dict[str, None] = {}
    for r in short:
        for o in running:
            if r in o.gpu_roles:
                order[o.name] = None
    cands: list[Candidate] = []
    for n in order:
        res = holdings.get(n)
        if res is None:
            continue
        o = by_name[n]
        if o.elastic is not None and _may_give_back(o, res.mib, policy, observed, now):
            return None
        if (
            o.residency is not Residency.EVICTABLE
            or n in observed.starting
            or inside_min_runtime(o, observed, now) is not None
        ):
            continue  # protected: it only matters when nothing covers (the planner says)
        if _could_sleep(o, res.mib, policy, observed):
            return None
        c = observed.container(o.container)
        busy = observed.requests_in_flight(n).count
        cands.append(Candidate(n, res.gpu_roles, res.mib, o.priority, c.started_at, busy))
    return cands


def _may_give_back(o: ServeSpec, held: int, policy: Policy, observed: Observed, now: float) -> bool:
    """True when elastic ``o`` (holding ``held``) could give whole segments back for an
    on-demand requester (the planner's shrink rule)."""
    assert o.elastic is not None
    return (
        o.name not in policy.no_shrink
        and held > o.elastic.floor_mib
        and inside_min_runtime(o, observed, now) is None
        and o.name not in observed.starting
        and not observed.sleep_of(o.name).asleep
        and (held - o.elastic.floor_mib) // max(1, o.elastic.segment_mib) > 0
    )


def _could_sleep(o: ServeSpec, held: int, policy: Policy, observed: Observed) -> bool:
    """True when putting running, awake ``o`` to sleep would free memory (the planner
    then weighs sleep against the stop)."""
    return (
        o.sleep is not None
        and o.name not in policy.no_sleep
        and observed.sleep_of(o.name).state is SleepState.AWAKE
        and held > o.sleep.residual_mib
    )
