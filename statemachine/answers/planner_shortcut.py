"""The decision for one isolated on-demand request, without running the planner.

``fit`` asks what the planner would do for an on-demand request of one serve while
every other serve is unmanaged (:func:`statemachine.answers.fit.request_plan`). In the common
case that plan is a single start: no stop planned before it, no conflict, the room
either free or made by stopping committed evictable victims. :func:`decide` reaches
that answer directly: the ledger's free MiB, the shortfall on each role, the
eviction candidates the planner would see (:func:`statemachine.planning.planner.plan_transitions`
rule 3) and the victim rules (:func:`statemachine.planning.victims.choose_victims`). It answers
only where it is sure to give exactly the planner's answer, and ``None`` wherever the
planner would apply a rule this shortcut does not (the caller then runs the planner):

- the requester is not on-demand (only on-demand serves evict; a backfill start is
  planned after the grow-back of shrunk elastic serves), is placed but not yet on one
  card (``fit`` places it first, as the loop would), is held back by the policy,
  its request has already ended, its start is in progress, it sleeps (a wake), or it
  exited with its memory not back yet;
- a running serve conflicts with it (exclusivity, a port), or it sizes itself from free
  memory while a peer of that kind loads on one of its roles;
- a resident in backoff on one of its roles may keep its room (the planner keeps it
  when it is free as the plan reaches it);
- where the policy knows the serves' uses, an on-demand holder on a short role is busy
  or starting (the planner may wait for the room it frees rather than evict);
- a holder on a short role could give memory back (elastic shrink) or be put to sleep
  instead of stopped;
- nothing covers the shortfall (the planner writes the blocked entry, every term).

It reads the one observed-side ledger
(:func:`statemachine.ledger.reservations.ledger_from_observed`) and asks the planner's own
predicates (:func:`statemachine.planning.planner.requester_veto`,
:func:`~statemachine.planning.planner.victim_residency_veto`,
:func:`~statemachine.planning.planner.may_give_back`,
:func:`~statemachine.planning.planner.sleep_frees_memory`): it restates no rule of its own, and
where a rule it does not read could apply it defers. The victim search reads the
candidates as plain rows (:func:`statemachine.planning.victims.victim_names`). It walks only the
serves that can matter: for conflicts the desired state's ``wary`` serves (every serve
for an exclusive requester), for candidates those declared on a short role
(``DesiredState.on_role``), both listed once per desired state.

tests/core/test_fit_isolated.py checks, over random hosts, that every answer equals the
planner's plan for the isolated request.

Pure: no I/O, no clock (``now`` is an argument), no logging, no docker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from statemachine.domain.slotinit import direct_init
from statemachine.domain.types import (
    ABSENT,
    COMMITTED_STATES,
    ContainerObs,
    DesiredState,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
    foreign_project,
)
from statemachine.ledger.reservations import Ledger, RoleTerms
from statemachine.planning.admission import conflict, inside_min_runtime
from statemachine.planning.idleness import in_force
from statemachine.planning.plan_types import Policy, declared_restore
from statemachine.planning.planner import (
    give_back_mib,
    keeps_its_room,
    may_give_back,
    requester_veto,
    sleep_frees_memory,
    victim_residency_veto,
)
from statemachine.planning.victims import Row, victim_names


@direct_init
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
    terms: Iterable[RoleTerms],
) -> Decision | None:
    """The planner's answer for an isolated on-demand request of ``serve``, or None
    where only the planner can say (see the module docstring).

    ``ledger`` is ``ledger_from_observed(desired, observed)`` (known: docker was read);
    ``serve`` does not run (its container holds no memory, or it sleeps). ``terms``:
    the ledger's terms for its whole ``vram_mib`` on its roles (``ledger.terms``;
    none where the ledger does not govern it), which the caller has built for its own
    answer: the shortfall on each role is read off them.
    """
    assert not ledger.unknown, "an unknown ledger has no figures to read"
    if _own_rule_applies(serve, ledger, policy, observed, now):
        return None
    if _kept_out(serve, desired, observed) or _room_kept(serve, desired, observed, policy):
        return None
    short = {t.gpu_role: t.shortfall_mib for t in terms if t.shortfall_mib}
    if not short:
        return NO_ROOM_NEEDED
    on_short = _running_on(short, desired, observed)
    if policy.uses and _room_may_come(on_short, observed):
        return None
    rows = _candidates(on_short, short, ledger, policy, observed, now)
    if rows is None:
        return None
    evict = victim_names(rows, short, exact_limit=policy.exact_search_limit)
    if evict is None:
        return None
    drain = tuple(
        [v for v in evict if desired.serves[v].router_tier and not observed.sleep_of(v).asleep]
    )
    return Decision(evict, drain)


def whole_terms(desired: DesiredState, ledger: Ledger, serve: ServeSpec) -> tuple[RoleTerms, ...]:
    """The ledger's terms for ``serve``'s whole ``vram_mib`` on its roles, as
    :func:`decide` reads them; none where the ledger does not govern it."""
    mib = serve.vram_mib
    if mib is None or not desired.in_ledger(serve):
        return ()
    return ledger.terms(serve.name, serve.gpu_roles, mib)


def _kept_out(serve: ServeSpec, desired: DesiredState, observed: Observed) -> bool:
    """True when a serve that runs (or starts) keeps ``serve`` from starting other than by
    memory: a conflict (exclusivity, a port), or an engine sizing itself from free memory
    that loads on one of its roles while ``serve`` is of that kind too.

    Only an exclusive requester can conflict with any serve; otherwise only the serves
    the desired state lists as wary can (exclusive, with a port, sizing from free)."""
    starting, containers = observed.starting, observed.containers
    exclusive, port, roles = serve.exclusive, serve.port, serve.gpu_roles
    for other in desired.serves.values() if exclusive else desired.wary:
        other_name = other.name
        obs = containers.get(other.container, ABSENT)
        starts = other_name in starting
        if (obs.state not in COMMITTED_STATES and not starts) or other_name == serve.name:
            continue  # it occupies nothing and does not start
        # conflict() finds nothing unless one of the two is exclusive or they share a
        # port: the call is spared where neither holds
        if (exclusive or other.exclusive or (port is not None and other.port == port)) and conflict(
            serve, other
        ) is not None:
            return True
        if serve.sizes_from_free and _loads(other, starts or obs.health == "starting", roles):
            return True
    return False


def _running_on(
    short: Mapping[str, int], desired: DesiredState, observed: Observed
) -> list[tuple[ServeSpec, ContainerObs]]:
    """The serves declared on a short role (each once, by name) that run or start, with
    their containers' observation (the planner's holders on the short roles).

    The requester is not among them: :func:`decide` asks only for one that neither
    starts nor holds a reservation (a container that runs without one needs no room)."""
    starting, containers, on_role = observed.starting, observed.containers, desired.on_role
    found: dict[str, tuple[ServeSpec, ContainerObs]] = {}
    for role in short:
        for other in on_role.get(role, ()):
            obs = containers.get(other.container, ABSENT)
            if obs.state in COMMITTED_STATES or other.name in starting:
                found[other.name] = (other, obs)
    return list(found.values())


def _room_may_come(on_short: list[tuple[ServeSpec, ContainerObs]], observed: Observed) -> bool:
    """True when an on-demand holder on a short role is busy or starting: its room frees
    by itself, and where uses are known the planner may wait for it rather than evict
    (``statemachine.planning.planner``, "Waiting for room that frees by itself")."""
    return any(
        other.residency is Residency.ON_DEMAND
        and (
            other.name in observed.starting
            or (observed.requests_in_flight(other.name).count or 0) > 0
        )
        for other, _ in on_short
    )


def _loads(other: ServeSpec, starts: bool, roles: tuple[str, ...]) -> bool:
    """True when ``other`` is an engine that sizes itself from free memory and starts
    (``starts``: in progress, or its healthcheck still says so) on one of ``roles``."""
    return other.sizes_from_free and starts and any(r in other.gpu_roles for r in roles)


def _room_kept(serve: ServeSpec, desired: DesiredState, observed: Observed, policy: Policy) -> bool:
    """True when a resident in backoff on one of ``serve``'s roles may keep its room
    (:func:`statemachine.planning.planner.keeps_its_room`): whether it does depends on the room
    free when the planner reaches it, which the planner tells."""
    if not policy.hold:
        return False
    roles = set(serve.gpu_roles)
    return any(
        keeps_its_room(s, observed, policy) and roles.intersection(s.gpu_roles)
        for n, s in desired.serves.items()
        if n != serve.name and n in policy.hold
    )


def _own_rule_applies(
    serve: ServeSpec, ledger: Ledger, policy: Policy, observed: Observed, now: float
) -> bool:
    """True when the planner applies a rule of the requester's own to it: it may evict
    nothing (:func:`statemachine.planning.planner.requester_veto`), is placed but not yet on a
    card (placement chooses one: :mod:`statemachine.planning.placement`), is held back,
    starting, asleep, still counted, its container is another Compose project's, or its
    request has ended."""
    name = serve.name
    return (
        requester_veto(serve) is not None
        or (bool(serve.placement) and not serve.placed)
        or name in policy.hold
        or name in observed.starting
        or observed.sleep_of(name).asleep
        or ledger.holds(name)
        or (serve.compose_project is not None and observed.foreign(serve) is not None)
        # a request without a TTL of its own ends only by the serve's idle_ttl_s
        or not in_force(OnDemandRequest(name, now), serve, observed, now)
    )


def _candidates(
    on_short: list[tuple[ServeSpec, ContainerObs]],
    short: dict[str, int],
    ledger: Ledger,
    policy: Policy,
    observed: Observed,
    now: float,
) -> list[Row] | None:
    """The eviction candidates among the running serves on the short roles (each once,
    as declared), as the victim search's rows; None when one of the holders could be
    shrunk or put to sleep instead (the planner weighs those).

    Each rule is the planner's own predicate, read at the start of its plan
    (:func:`statemachine.planning.planner.may_give_back`,
    :func:`~statemachine.planning.planner.victim_residency_veto`,
    :func:`~statemachine.planning.planner.sleep_frees_memory`). The planner lists them role by
    role; the order does not matter: the victim search weighs a set of rows by its own
    order of preference (names last) and names its victims in the order of their names."""
    held = ledger.holding_getter()
    starting = observed.starting
    in_flight = observed.requests_in_flight
    rows: list[Row] = []
    for o, obs in on_short:
        n = o.name
        res = held(n)
        if res is None or not any(r in short for r in res.gpu_roles):
            continue  # holds nothing, or holds it on another card (a placed serve's)
        mib = res.mib
        if o.compose_project is not None and foreign_project(o, obs) is not None:
            continue  # another project's container: protected, never stopped nor shrunk
        if o.elastic is not None and _may_give_back(o, mib, policy, observed, now):
            return None
        if (
            victim_residency_veto(o) is not None
            or n in starting
            or inside_min_runtime(o, observed, now) is not None
        ):
            continue  # protected: it only matters when nothing covers (the planner says)
        if o.sleep is not None and sleep_frees_memory(o, mib, policy, observed):
            return None
        busy = in_flight(n).count
        cost = policy.victim_cost(n, obs.started_at, now, wake=False, declared=declared_restore(o))
        rows.append(Row(n, res.gpu_roles, mib, o.priority, obs.started_at, busy, cost))
    return rows


def _may_give_back(o: ServeSpec, held: int, policy: Policy, observed: Observed, now: float) -> bool:
    """True when elastic ``o`` (holding ``held``, awake) could give whole segments back
    for an on-demand requester (the planner's shrink rule at the start of its plan)."""
    assert o.elastic is not None
    return (
        may_give_back(o, held, policy, observed, now)
        and not observed.sleep_of(o.name).asleep
        and give_back_mib(held, o.elastic) > 0
    )
