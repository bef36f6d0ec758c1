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
    ContainerObs,
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
    if _own_rule_applies(serve, ledger, policy, observed, now):
        return None
    short = _shortfall(serve, desired, ledger)
    starting = observed.starting
    container = observed.container
    exclusive, port, roles = serve.exclusive, serve.port, serve.gpu_roles
    sizes_from_free = serve.sizes_from_free
    on_short: list[tuple[ServeSpec, ContainerObs]] = []  # running, on a short role, as declared
    short_roles = short.keys()
    loading = False  # an engine sizing itself from free memory starts on one of its roles
    for other in desired.serves.values():
        if other.name == name:
            continue
        obs = container(other.container)
        if not (obs.holds or other.name in starting):
            continue
        # conflict() finds nothing unless one of the two is exclusive or they share a
        # port: the call is spared where neither holds
        if (exclusive or other.exclusive or (port is not None and other.port == port)) and conflict(
            serve, other
        ) is not None:
            return None
        if sizes_from_free and not loading:
            loading = _loads(other, other.name in starting or obs.health == "starting", roles)
        if short and not short_roles.isdisjoint(other.gpu_roles):
            on_short.append((other, obs))
    if loading:
        return None
    if not short:
        return NO_ROOM_NEEDED
    cands = _candidates(on_short, short, ledger, policy, observed, now)
    if cands is None:
        return None
    chosen = choose_victims(cands, short, exact_limit=policy.exact_search_limit)
    if chosen is None:
        return None
    evict = tuple(c.name for c in chosen)
    drain = tuple(
        c.name
        for c in chosen
        if desired.serves[c.name].router_tier and not observed.sleep_of(c.name).asleep
    )
    return Decision(evict, drain)


def _shortfall(serve: ServeSpec, desired: DesiredState, ledger: Ledger) -> dict[str, int]:
    """The MiB ``serve``'s start lacks on each of its roles where free is short (none
    when the ledger does not govern it)."""
    mib = serve.vram_mib
    if mib is None or not desired.in_ledger(serve):
        return {}
    return {r: mib - free for r in serve.gpu_roles if mib > (free := ledger.free_mib(r))}


def _loads(other: ServeSpec, starts: bool, roles: tuple[str, ...]) -> bool:
    """True when ``other`` is an engine that sizes itself from free memory and starts
    (``starts``: in progress, or its healthcheck still says so) on one of ``roles``."""
    return other.sizes_from_free and starts and any(r in other.gpu_roles for r in roles)


def _own_rule_applies(
    serve: ServeSpec, ledger: Ledger, policy: Policy, observed: Observed, now: float
) -> bool:
    """True when the planner applies a rule of the requester's own to it: it is not
    on-demand, held back, starting, asleep, still counted, or its request has ended."""
    name = serve.name
    return (
        serve.residency is not Residency.ON_DEMAND
        or name in policy.hold
        or name in observed.starting
        or observed.sleep_of(name).asleep
        or ledger.holds(name)
        # a request without a TTL of its own ends only by the serve's idle_ttl_s
        or (
            serve.idle_ttl_s is not None
            and request_end(OnDemandRequest(name, now), serve, observed).expired(now)
        )
    )


def _candidates(
    on_short: list[tuple[ServeSpec, ContainerObs]],
    short: dict[str, int],
    ledger: Ledger,
    policy: Policy,
    observed: Observed,
    now: float,
) -> list[Candidate] | None:
    """The eviction candidates among the running serves on the short roles, in the
    planner's order (the short roles in the requester's order, each role's serves as
    declared); None when one of the holders could be shrunk or put to sleep instead
    (the planner weighs those)."""
    if len(short) > 1:  # role by role, each serve once
        on_short = list(
            {o.name: (o, obs) for r in short for o, obs in on_short if r in o.gpu_roles}.values()
        )
    holdings = ledger.holdings
    cands: list[Candidate] = []
    for o, obs in on_short:
        n = o.name
        res = holdings.get(n)
        if res is None:
            continue
        if o.elastic is not None and _may_give_back(o, res.mib, policy, observed, now):
            return None
        if (
            o.residency is not Residency.EVICTABLE
            or n in observed.starting
            or (o.min_runtime_s > 0 and inside_min_runtime(o, observed, now) is not None)
        ):
            continue  # protected: it only matters when nothing covers (the planner says)
        if o.sleep is not None and _could_sleep(o, res.mib, policy, observed):
            return None
        busy = observed.requests_in_flight(n).count
        cands.append(Candidate(n, res.gpu_roles, res.mib, o.priority, obs.started_at, busy))
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
