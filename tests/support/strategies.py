"""Shared hypothesis strategies: small random fleets for the pure core.

A *scenario* is what the planner takes: a :class:`DesiredState` (1-4 gpu roles, 0-12
serves, 0-3 on-demand requests), an :class:`Observed` snapshot, ``now`` and a
:class:`Policy`. The strategies aim at the interesting corners rather than at
realism: reservations are often large fractions of a budget (so fits, shortfalls and
evictions are common), ports come from a set of three (so port conflicts happen),
some serves are elastic, exclusive or not GPU-inference, and the observation may
already be over budget (containers started outside the controller). Exact fits are
drawn on purpose: a whole budget, a budget less or plus one MiB, and the room the
holders drawn before a serve leave (exactly, a MiB less, a MiB more).

:func:`hosts` enriches a scenario with what the planner weighs beyond memory (sleepers
of both protocols, starts in progress, requests in flight, engines that size
themselves from free memory, memory not back, start records, a host RAM budget);
:func:`every_scenario` draws from all of them, and the invariant properties run on it.

The manifest forbids two ``desired = "running"`` serves on one port, so at most one
desired-running serve is drawn per port; requests may still ask for a second serve
on a port (that is the planner's business).

Import as ``from support.strategies import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.internal.cache import LRUCache
from hypothesis.internal.conjecture import providers

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.planning.plan_types import (
    Plan,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

T = TypeVar("T")

NOW = 1_000_000.0
PORTS = (8000, 8001, 8002)
ROLE_IDS = ("g0", "g1", "g2", "g3")
GHOST_ROLE = "ghost"  # a role without a capacity row: its serves stay out of the ledger
SERVE_NAMES = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "fox",
    *(f"s{i:02d}" for i in range(12)),
)
RESIDENCIES = (sm.Residency.RESIDENT, sm.Residency.EVICTABLE, sm.Residency.ON_DEMAND, None)
CONTAINER_STATES = (
    sm.ContainerState.RUNNING,
    sm.ContainerState.RUNNING,
    sm.ContainerState.RUNNING,
    sm.ContainerState.EXITED,
    sm.ContainerState.EXITED,
    sm.ContainerState.ABSENT,
    sm.ContainerState.ABSENT,
    sm.ContainerState.PAUSED,
    sm.ContainerState.RESTARTING,
    sm.ContainerState.CREATED,
    sm.ContainerState.DEAD,
)


@dataclass(frozen=True)
class Scenario:
    """One planner input."""

    desired: sm.DesiredState
    observed: sm.Observed
    now: float
    policy: Policy


@st.composite
def gpu_roles(draw: st.DrawFn, *, max_roles: int = 4) -> dict[str, sm.GpuRole]:
    """1..max_roles roles: capacity 1000-100000, reserve 0..capacity/4, uuid optional."""
    n = draw(st.sampled_from((1, 1, 2, 2, 3, 4)[: 2 * max_roles]))
    roles: dict[str, sm.GpuRole] = {}
    for rid in ROLE_IDS[:n]:
        cap = draw(st.integers(1000, 100_000))
        reserve = draw(st.integers(0, cap // 4))
        uuid = draw(st.none() | st.just(f"GPU-{rid}"))
        roles[rid] = sm.GpuRole(rid, capacity_mib=cap, reserve_mib=reserve, uuid=uuid)
    return roles


@dataclass(frozen=True)
class _Blueprint:
    """One serve and its container, drawn as a unit so that shrinking can drop it whole."""

    name: str
    role_pick: int  # which role (modulo the number of roles)
    two_roles: bool  # exclusive, on two roles (when there are two)
    ghost: bool  # on a role without a capacity row
    #: ("none", 0) | ("fraction", d) | ("over", 0) | ("under", 0) | ("raw", mib) |
    #: ("room", k): the room the holders drawn before it leave, plus k (-1, 0 or 1)
    size: tuple[str, int]
    residency: sm.Residency | None
    desired: sm.DesiredRun | None
    port: int | None
    gpu_inference: bool
    priority: int
    min_runtime_s: float
    tiered: bool
    elastic_floor: int | None  # per-mille of vram_mib, None: not elastic
    segment: int  # the elastic engine's segment (MiB)
    state: sm.ContainerState
    listed: bool  # an absent container: listed explicitly or missing from the snapshot
    started_ago: int | None
    health: str | None
    shrunk: int | None  # per-mille of the segments it can give back, None: not shrunk
    outside: bool  # may hold memory beyond the budget (started outside the controller)


_SIZES = (
    ("fraction", 2),
    ("fraction", 3),
    ("fraction", 4),
    ("fraction", 1),
    ("raw", 1),
    ("fraction", 2),
    ("fraction", 3),
    ("over", 0),
    ("under", 0),
    ("room", 0),
    ("room", 0),
    ("room", -1),
    ("room", 1),
    ("none", 0),
)
_BLUEPRINT_FIELDS: dict[str, st.SearchStrategy[object]] = {
    "name": st.sampled_from(SERVE_NAMES),
    "role_pick": st.integers(0, 3),
    "two_roles": st.integers(0, 7).map(lambda k: k == 0),
    "ghost": st.integers(0, 24).map(lambda k: k == 0),
    "size": st.sampled_from(_SIZES) | st.integers(1, 100_000).map(lambda m: ("raw", m)),
    "residency": st.sampled_from(RESIDENCIES) | st.sampled_from(RESIDENCIES[1:3]),
    "desired": st.sampled_from([sm.DesiredRun.RUNNING, sm.DesiredRun.STOPPED, None]),
    "port": st.none() | st.sampled_from(PORTS),
    "gpu_inference": st.integers(0, 9).map(lambda k: k != 0),
    "priority": st.integers(0, 3),
    "min_runtime_s": st.sampled_from([0.0, 300.0]),
    "tiered": st.booleans(),
    "elastic_floor": st.none() | st.integers(0, 1000),
    "segment": st.sampled_from([1, 64, 512, 3000]),
    "state": st.sampled_from(CONTAINER_STATES),
    "listed": st.booleans(),
    "started_ago": st.none() | st.integers(0, 1000),
    "health": st.sampled_from([None, "healthy", "starting", "unhealthy"]),
    "shrunk": st.none() | st.integers(0, 1000),
    "outside": st.integers(0, 9).map(lambda k: k == 0),
}
_blueprints = st.builds(_Blueprint, **_BLUEPRINT_FIELDS)
#: Contention: serves of a third or a half of a budget; on-demand requesters that want to
#: run (some exclusive) and holders that run (mostly evictable, rarely fresh), so that
#: requesters have to evict, shrink or stop for a port or exclusivity.
_CONTENDED_FIELDS = {
    **_BLUEPRINT_FIELDS,
    "size": st.sampled_from(
        [("fraction", 2), ("fraction", 3), ("fraction", 3), ("fraction", 4), ("room", 0)]
    ),
    "min_runtime_s": st.sampled_from([0.0, 0.0, 300.0]),
}
_contended_blueprints = st.one_of(
    st.builds(_Blueprint, **_CONTENDED_FIELDS),
    st.builds(  # a requester
        _Blueprint,
        **{
            **_CONTENDED_FIELDS,
            "residency": st.just(sm.Residency.ON_DEMAND),
            "desired": st.sampled_from([sm.DesiredRun.RUNNING, None]),
            "state": st.sampled_from([sm.ContainerState.ABSENT, sm.ContainerState.EXITED]),
            "two_roles": st.integers(0, 2).map(lambda k: k == 0),
        },
    ),
    st.builds(  # a holder
        _Blueprint,
        **{
            **_CONTENDED_FIELDS,
            "residency": st.sampled_from(
                [
                    sm.Residency.EVICTABLE,
                    sm.Residency.EVICTABLE,
                    sm.Residency.EVICTABLE,
                    *RESIDENCIES,
                ]
            ),
            "desired": st.sampled_from([sm.DesiredRun.RUNNING, None]),
            "state": st.just(sm.ContainerState.RUNNING),
            "gpu_inference": st.just(True),
        },
    ),
)


def _size(size: tuple[str, int], declared: list[sm.GpuRole], used: dict[str, int]) -> int | None:
    """The serve's ``vram_mib``; ``used``: what the holders drawn before it hold, by role."""
    kind, n = size
    if kind == "none" or not declared:
        return None
    cap = min(r.capacity_mib for r in declared)
    budget = max(1, min(r.budget_mib for r in declared))
    if kind == "fraction":
        return max(1, budget // n)
    if kind == "over":
        return min(cap, budget + 1)
    if kind == "under":
        return max(1, budget - 1)
    if kind == "room":  # an exact fit of what is left (or a MiB less, or a MiB more)
        room = min(r.budget_mib - used.get(r.id, 0) for r in declared)
        return max(1, min(cap, room + n))
    return min(cap, n)


def _between(low: int, high: int, per_mille: int) -> int:
    return low + (high - low) * per_mille // 1000


def _shrunk(elastic: sm.Elastic, full: int, per_mille: int) -> int:
    """Where an elastic engine stands after shrinks: ``full`` less whole segments (it
    gives memory back a segment at a time), never below its floor; ``per_mille`` picks
    how many of the segments it can give."""
    most = max(0, full - elastic.floor_mib) // elastic.segment_mib
    return full - elastic.segment_mib * (most * per_mille // 1000)


def _serve(
    bp: _Blueprint, roles: dict[str, sm.GpuRole], port: int | None, used: dict[str, int]
) -> sm.ServeSpec:
    role_ids = list(roles)
    exclusive = bp.two_roles and len(role_ids) >= 2
    if exclusive:
        first = bp.role_pick % len(role_ids)
        gpu = (role_ids[first], role_ids[(first + 1) % len(role_ids)])
    elif bp.ghost:
        gpu = (GHOST_ROLE,)
    else:
        gpu = (role_ids[bp.role_pick % len(role_ids)],)
    vram = _size(bp.size, [roles[r] for r in gpu if r in roles], used)
    elastic = None
    if vram is not None and bp.elastic_floor is not None:
        floor = max(1, _between(0, vram, bp.elastic_floor))
        elastic = sm.Elastic(
            url=f"http://127.0.0.1:9000/{bp.name}", floor_mib=floor, segment_mib=bp.segment
        )
    return sm.ServeSpec(
        name=bp.name,
        container=f"ctr-{bp.name}",
        gpu_roles=gpu,
        vram_mib=vram,
        residency=bp.residency,
        desired=bp.desired,
        port=port,
        exclusive=exclusive,
        gpu_inference=bp.gpu_inference,
        priority=bp.priority,
        min_runtime_s=bp.min_runtime_s,
        router_tier=f"tier-{bp.name}" if bp.tiered else None,
        elastic=elastic,
    )


def _container(bp: _Blueprint, now: float) -> sm.ContainerObs | None:
    if bp.state is sm.ContainerState.ABSENT:
        return sm.ContainerObs(bp.state) if bp.listed else None
    return sm.ContainerObs(
        bp.state,
        health=bp.health,
        started_at=None if bp.started_ago is None else now - bp.started_ago,
        exit_code=0 if bp.state is sm.ContainerState.EXITED else None,
    )


_requests = st.lists(
    st.tuples(
        st.integers(0, 11),  # which serve (modulo the number of serves)
        st.integers(0, 600),  # requested this many seconds ago
        st.none() | st.integers(1, 600),  # ttl
    ),
    max_size=3,
)


@st.composite
def _placements(draw: st.DrawFn, s: sm.ServeSpec, roles: dict[str, sm.GpuRole]) -> tuple[str, ...]:
    """About one serve in three on a fleet of two cards or more is placed (``placement``):
    its own role and one to three others as candidates; ``()``: pinned."""
    if len(roles) < 2 or s.exclusive or len(s.gpu_roles) != 1 or s.gpu_roles[0] not in roles:
        return ()
    if draw(st.integers(0, 2)) != 0:
        return ()
    # the manifest refuses a candidate whose budget is below the reservation
    fits = s.vram_mib is None or s.vram_mib <= roles[s.gpu_roles[0]].budget_mib
    others = [
        r
        for r in roles
        if r != s.gpu_roles[0] and (s.vram_mib is None or s.vram_mib <= roles[r].budget_mib)
    ]
    if not fits or not others:
        return ()
    more = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
    return (s.gpu_roles[0], *more)


@st.composite
def fleets(
    draw: st.DrawFn,
    *,
    max_serves: int = 12,
    now: float = NOW,
    docker_ok: bool | None = None,
    contended: bool | None = None,
    placed: bool = False,
) -> tuple[sm.DesiredState, sm.Observed]:
    """A random small fleet and what docker shows of it (see the module docstring).

    ``contended`` (drawn when None): one or two roles, serves of a third or half a
    budget, requesters and running holders, so that evictions and forced stops happen.
    """
    if contended is None:
        contended = draw(st.booleans())
    roles = draw(gpu_roles(max_roles=2 if contended else 4))
    n = draw(st.sampled_from(range(max_serves + 1)))  # uniform: integers() favour small n
    bps = draw(
        st.lists(
            _contended_blueprints if contended else _blueprints,
            min_size=n,
            max_size=n,
            unique_by=lambda b: b.name,
        )
    )
    running_ports: set[int] = set()
    serves: dict[str, sm.ServeSpec] = {}
    containers: dict[str, sm.ContainerObs] = {}
    elastic_mib: dict[str, int] = {}
    started_with: dict[str, sm.StartedWith] = {}
    used = dict.fromkeys(roles, 0)
    for bp in bps:
        port = bp.port
        if bp.desired is sm.DesiredRun.RUNNING and port is not None:
            if port in running_ports:
                port = None  # the manifest forbids two desired-running serves on a port
            else:
                running_ports.add(port)
        s = _serve(bp, roles, port, used)
        obs = _container(bp, now)
        on = s.gpu_roles  # where it holds memory if it runs
        cands = draw(_placements(s, roles)) if placed else ()
        if cands:  # a placed serve: every candidate until it holds on one
            s = replace(s, gpu_roles=cands, placement=cands)
            if obs is not None and obs.holds and draw(st.integers(0, 3)) != 0:
                # it runs on its first candidate, as its record and its environment say
                # (else its card is unknown: counted on every candidate)
                obs = replace(obs, gpu_role=on[0])
                if s.vram_mib is not None:
                    started_with[s.container] = sm.StartedWith(s.name, on, s.vram_mib)
            else:
                on = cands
        serves[s.name] = s
        mib = s.vram_mib
        if mib is not None and s.elastic is not None and bp.shrunk is not None:
            mib = _shrunk(s.elastic, mib, bp.shrunk)
        holds = obs is not None and obs.holds
        if holds and mib is not None and all(r in roles for r in on):
            assert obs is not None
            over = any(used[r] + mib > roles[r].budget_mib for r in on)
            if over and not bp.outside:  # mostly, what runs was admitted: it fits
                obs = sm.ContainerObs(
                    sm.ContainerState.EXITED, started_at=obs.started_at, exit_code=0
                )
                started_with.pop(s.container, None)
            else:
                for r in on:
                    used[r] += mib
        if obs is not None:
            containers[s.container] = obs
        if obs is not None and obs.state is sm.ContainerState.RUNNING and mib != s.vram_mib:
            assert mib is not None
            elastic_mib[s.name] = mib
    names = list(serves)
    requests = tuple(
        sm.OnDemandRequest(names[i % len(names)], now - ago, None if ttl is None else float(ttl))
        for i, ago, ttl in (draw(_requests) if names else [])
    )
    ok = draw(st.integers(0, 9)) != 0 if docker_ok is None else docker_ok
    desired = sm.DesiredState(roles=roles, serves=serves, requests=requests)
    return desired, sm.Observed(
        docker_ok=ok, containers=containers, elastic_mib=elastic_mib, started_with=started_with
    )


def desired_states(*, max_serves: int = 12, now: float = NOW) -> st.SearchStrategy[sm.DesiredState]:
    """A random small fleet's desired state (manifest + on-demand requests)."""
    return fleets(max_serves=max_serves, now=now).map(lambda f: f[0])


@st.composite
def observations(
    draw: st.DrawFn, desired: sm.DesiredState, *, now: float = NOW, docker_ok: bool | None = None
) -> sm.Observed:
    """Any observation of ``desired``'s containers (possibly over budget)."""
    ok = draw(st.integers(0, 9)) != 0 if docker_ok is None else docker_ok
    containers: dict[str, sm.ContainerObs] = {}
    elastic: dict[str, int] = {}
    for s in desired.serves.values():
        bp = draw(_blueprints)
        obs = _container(bp, now)
        if obs is not None:
            containers[s.container] = obs
        if (
            bp.state is sm.ContainerState.RUNNING
            and bp.shrunk is not None
            and s.elastic is not None
            and s.vram_mib is not None
        ):
            elastic[s.name] = _shrunk(s.elastic, s.vram_mib, bp.shrunk)
    return sm.Observed(docker_ok=ok, containers=containers, elastic_mib=elastic)


policies = st.one_of(
    st.just(Policy()),
    st.integers(0, 3).map(lambda k: Policy(exact_search_limit=k)),
    st.builds(  # what the controller knows: failed shrinks, serves held back (backoff)
        Policy,
        no_shrink=st.frozensets(st.sampled_from(SERVE_NAMES), max_size=3),
        hold=st.dictionaries(st.sampled_from(SERVE_NAMES), st.just("backoff"), max_size=3),
    ),
)


@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    docker_ok: bool | None = None,
    default_policy: bool = False,
    max_serves: int = 12,
    contended: bool | None = None,
    placed: bool = False,
) -> Scenario:
    """A whole planner input; ``docker_ok`` None draws it (mostly ok); ``placed``: about
    one serve in three on two cards or more is placed (``placement``)."""
    desired, observed = draw(
        fleets(max_serves=max_serves, docker_ok=docker_ok, contended=contended, placed=placed)
    )
    policy = Policy() if default_policy else draw(policies)
    return Scenario(desired=desired, observed=observed, now=NOW, policy=policy)


@st.composite
def hosts(
    draw: st.DrawFn,
    *,
    sleep_share: int = 2,
    contended: bool | None = None,
    placed: bool = False,
) -> Scenario:
    """A :func:`scenarios` scenario (docker readable), enriched with what the planner
    weighs beyond memory: sleepers (vLLM and SGLang, levels 1 and 2, some with the
    controller's record of what they were put to sleep with) under a host RAM budget or
    none, starts in progress, requests in flight and idleness, engines that size
    themselves from free memory, idle TTLs, memory not back after an exit, and records
    of what containers were started with.

    ``sleep_share``: about one serve with a reservation in ``sleep_share`` can sleep
    (0: none).
    """
    sc = draw(scenarios(docker_ok=True, contended=contended, placed=placed))
    d, obs = sc.desired, sc.observed
    host = draw(
        st.none()
        | st.builds(sm.HostBudget, st.integers(1, 200_000), st.just(0))
        | st.builds(sm.HostBudget, st.integers(1, 200_000), st.integers(0, 20_000)).filter(
            lambda h: h.reserve_mib <= h.ram_mib
        )
    )
    serves: dict[str, sm.ServeSpec] = {}
    sleep: dict[str, sm.SleepObs] = {}
    in_flight: dict[str, sm.InFlightObs] = {}
    starting: dict[str, sm.StartingObs] = {}
    started_with = dict(obs.started_with)  # a placed serve's, where it runs
    unreleased: set[str] = set()
    for name, s in d.serves.items():
        holds = obs.container(s.container).holds
        if (
            sleep_share
            and s.vram_mib is not None
            and s.vram_mib > 1
            and draw(st.integers(0, sleep_share - 1)) == 0
        ):
            level = draw(st.sampled_from([1, 2]))
            residual = draw(st.integers(1, s.vram_mib - 1))  # the manifest: 0 < residual < vram
            host_mib = draw(st.integers(0, 80_000)) if level == 1 else 0
            protocol = draw(st.sampled_from(SleepProtocol))
            s = replace(s, sleep=sm.Sleep(level, residual, protocol, host_mib))  # noqa: PLW2901
            state = draw(st.sampled_from([None, *sm.SleepState]))
            if holds and state is not None:
                asleep = state is sm.SleepState.ASLEEP
                record = asleep and draw(st.booleans())  # the residual it was slept with
                sleep[name] = sm.SleepObs(
                    state,
                    level=level if asleep else None,
                    residual_mib=draw(st.integers(0, s.vram_mib)) if record else None,
                    host_ram_mib=host_mib if record else None,
                )
        if draw(st.integers(0, 3)) == 0:
            s = replace(s, sizes_from_free=True)  # noqa: PLW2901
        if draw(st.integers(0, 4)) == 0:
            s = replace(s, idle_ttl_s=draw(st.sampled_from([0.0, 60.0, 600.0])))  # noqa: PLW2901
        count = draw(st.sampled_from([None, None, 0, 0, 2]))
        if count is not None or draw(st.booleans()):
            source = draw(st.sampled_from([None, *sm.InFlightSource]))
            in_flight[name] = sm.InFlightObs(
                count, source, idle_since=NOW - 700 if count == 0 else None
            )
        # what a start in progress reserves, or a start record says, fits on its card:
        # the controller admitted it there
        card = min((d.roles[r].capacity_mib for r in s.gpu_roles if r in d.roles), default=None)
        if s.gpu_roles and draw(st.integers(0, 7)) == 0:
            mib = draw(st.sampled_from([s.vram_mib or 1, 1, 30_000]) | st.integers(1, 30_000))
            starting[name] = sm.StartingObs(s.gpu_roles, mib if card is None else min(mib, card))
        if (
            holds
            and s.gpu_roles
            and s.container not in started_with
            and draw(st.integers(0, 7)) == 0
        ):
            mib = draw(st.sampled_from([s.vram_mib or 1, 1]) | st.integers(1, 30_000))
            mib = mib if card is None else min(mib, card)
            started_with[s.container] = sm.StartedWith(name, s.gpu_roles, mib)
        if not holds and draw(st.integers(0, 9)) == 0:
            unreleased.add(name)
        serves[name] = s
    desired = sm.DesiredState(d.roles, serves, d.requests, host=host)
    observed = replace(
        obs,
        sleep=sleep,
        in_flight=in_flight,
        starting=starting,
        started_with=started_with,
        unreleased=frozenset(unreleased),
    )
    return Scenario(desired=desired, observed=observed, now=sc.now, policy=sc.policy)


@st.composite
def crowded_hosts(draw: st.DrawFn) -> Scenario:
    """Full cards and requests that need room: what makes a plan put serves to sleep,
    shrink them, wake them, and place a serve by what making room costs.

    One or two cards, each filled (to within a few MiB, or to exactly its budget) by one
    to three evictable serves that run, awake, outside their ``min_runtime_s``: most can
    sleep (a residual of a twentieth to a quarter of their reservation, a little host RAM
    at level 1), some are elastic (down to half, in small segments). Then one to three
    on-demand serves that hold nothing are requested (by age), each too big for what is
    free: pinned, or placed on both cards; and now and then a requested on-demand serve
    that sleeps is to be woken. A host RAM budget, or none.
    """
    roles = draw(gpu_roles(max_roles=2))
    serves: dict[str, sm.ServeSpec] = {}
    containers: dict[str, sm.ContainerObs] = {}
    sleep: dict[str, sm.SleepObs] = {}
    requests: list[sm.OnDemandRequest] = []
    names = iter(SERVE_NAMES)
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 3600)
    free: dict[str, int] = {}
    for rid, role in roles.items():
        left = role.budget_mib
        parts = draw(st.integers(1, 3))
        for k in range(parts):
            if left < 2:
                break
            mib = left - draw(st.integers(0, 3)) if k == parts - 1 else draw(st.integers(1, left))
            mib = max(1, mib)
            name = next(names)
            spec = sm.ServeSpec(name, f"ctr-{name}", (rid,), mib, sm.Residency.EVICTABLE)
            if mib > 1 and draw(st.integers(0, 3)) != 0:
                level = draw(st.sampled_from([1, 1, 2]))
                residual = max(1, mib // draw(st.integers(4, 20)))
                host_mib = draw(st.integers(0, 4000)) if level == 1 else 0
                protocol = draw(st.sampled_from(SleepProtocol))
                spec = replace(spec, sleep=sm.Sleep(level, residual, protocol, host_mib))
            elif mib > 1 and draw(st.booleans()):
                floor = max(1, mib // 2)
                spec = replace(
                    spec,
                    elastic=sm.Elastic(f"http://127.0.0.1:9000/{name}", floor, segment_mib=1),
                )
            serves[name] = spec
            containers[spec.container] = up
            left -= mib
        free[rid] = left
    for _ in range(draw(st.integers(1, 3))):
        name = next(names)
        rid = draw(st.sampled_from(sorted(roles)))
        placed = len(roles) == 2 and draw(st.booleans())
        on = tuple(sorted(roles)) if placed else (rid,)
        most = min(roles[r].budget_mib for r in on)
        most = max(1, most)
        least = max(1, min(most, max(free[r] for r in on) + 1))
        spec = sm.ServeSpec(
            name,
            f"ctr-{name}",
            on,
            draw(st.integers(least, most)),
            sm.Residency.ON_DEMAND,
            placement=on if placed else (),
        )
        if not placed and spec.vram_mib and spec.vram_mib > 1 and draw(st.integers(0, 3)) == 0:
            # a sleeper to wake: asleep at its residual (counted there), requested
            residual = max(1, min(free[rid], spec.vram_mib // 4))
            spec = replace(spec, sleep=sm.Sleep(2, residual, draw(st.sampled_from(SleepProtocol))))
            containers[spec.container] = up
            sleep[name] = sm.SleepObs(sm.SleepState.ASLEEP, level=2)
            free[rid] -= residual
        serves[name] = spec
        requests.append(sm.OnDemandRequest(name, NOW - draw(st.integers(1, 300))))
    host = draw(st.none() | st.builds(sm.HostBudget, st.integers(1, 20_000), st.just(0)))
    desired = sm.DesiredState(roles, serves, tuple(requests), host=host)
    observed = sm.Observed(docker_ok=True, containers=containers, sleep=sleep)
    return Scenario(desired=desired, observed=observed, now=NOW, policy=Policy())


def every_scenario(*, sleepers: bool = True) -> st.SearchStrategy[Scenario]:
    """Every strategy of this module (docker readable): plain :func:`scenarios` and
    enriched :func:`hosts` with few and with many sleepers (``sleepers`` False: with
    none); the invariant properties run on this."""
    if not sleepers:
        return st.one_of(scenarios(docker_ok=True), hosts(sleep_share=0))
    return st.one_of(
        scenarios(docker_ok=True),
        hosts(),
        hosts(sleep_share=1),
        hosts(placed=True),
        crowded_hosts(),
    )


def case_shares(
    strategy: st.SearchStrategy[T], cases: Callable[[T], set[str]], *, examples: int
) -> dict[str, float]:
    """Each case's share of ``examples`` draws of ``strategy``: ``cases(value)`` names
    the cases a draw reaches.

    Derandomized (no example database, generation only), and without the constants
    Hypothesis collects from the modules the process has loaded (:func:`_no_local_constants`):
    the same draws in every process, whatever it ran before. A floor set well under the
    measured share (about a quarter of it) fails the day a generator stops reaching the
    case its property is about.
    """
    counts: dict[str, int] = {}
    seen: list[None] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(value: T) -> None:
        seen.append(None)
        for case in cases(value):
            counts[case] = counts.get(case, 0) + 1

    with _no_local_constants():
        draw()
    return {case: n / max(1, len(seen)) for case, n in sorted(counts.items())}


@contextmanager
def _no_local_constants() -> Iterator[None]:
    """Hypothesis now and then draws a literal found in the source of the modules loaded
    so far (``hypothesis.internal.conjecture.providers``), and caches the pools per kind
    of draw on first use: a derandomized run's draws then depend on which tests the
    process ran before. Within this block it draws from its own constants only, as in a
    fresh process that loaded nothing of ours; the cache is put back after."""
    saved = providers.CONSTANTS_CACHE, providers._get_local_constants
    providers.CONSTANTS_CACHE = LRUCache(1024)
    providers._get_local_constants = providers.Constants  # type: ignore[assignment]
    try:
        yield
    finally:
        providers.CONSTANTS_CACHE, providers._get_local_constants = saved


def case_share(
    strategy: st.SearchStrategy[T], case: Callable[[T], bool], *, examples: int
) -> float:
    """The share of ``examples`` draws of ``strategy`` for which ``case`` holds
    (:func:`case_shares`)."""
    shares = case_shares(strategy, lambda v: {"case"} if case(v) else set(), examples=examples)
    return shares.get("case", 0.0)


def scenario_cases(sc: Scenario) -> set[str]:
    """The cases a planner input reaches, by name: what a property over it reports
    (:func:`report_cases`) and what a floor test counts (:func:`case_shares`)."""
    d, obs = sc.desired, sc.observed
    serves = d.serves.values()
    checks = {
        "docker unreadable": not obs.docker_ok,
        "placed serve": any(s.placement for s in serves),
        "sleeper asleep": any(o.asleep for o in obs.sleep.values()),
        "elastic shrunk": bool(obs.elastic_mib),
        "request": bool(d.requests),
        "start in progress": bool(obs.starting),
        "start record": bool(obs.started_with),
        "memory not back": bool(obs.unreleased),
        "host RAM budget": d.host is not None,
        "exclusive serve": any(s.exclusive for s in serves),
    }
    return {name for name, hit in checks.items() if hit}


def plan_cases(plan: Plan) -> set[str]:
    """What a plan does, by name (its steps' kinds, a blocked serve, nothing at all)."""
    done = {f"plan {step.action.value}s" for step in plan.steps}
    if plan.blocked:
        done.add("plan blocks a serve")
    if not plan.steps:
        done.add("plan empty")
    return done


def planned_cases(sc: Scenario) -> set[str]:
    """The cases of ``sc`` and of the plan made of it."""
    plan = plan_transitions(sc.desired, sc.observed, sc.policy, sc.now)
    return scenario_cases(sc) | plan_cases(plan)


def report_cases(sc: Scenario, plan: Plan | None = None) -> None:
    """Report each case ``sc`` (and its ``plan``) reaches as a Hypothesis event: a
    property's statistics (``pytest --hypothesis-show-statistics``) count them."""
    for case in sorted(scenario_cases(sc) | (plan_cases(plan) if plan is not None else set())):
        event(case)


def assert_reaches(
    strategy: st.SearchStrategy[T],
    cases: Callable[[T], set[str]],
    floors: dict[str, float],
    *,
    examples: int,
) -> None:
    """Fail, naming each, when a case reaches less than its floor's share of
    ``examples`` derandomized draws of ``strategy`` (:func:`case_shares`): a property
    whose case its generator stops reaching is vacuous there."""
    shares = case_shares(strategy, cases, examples=examples)
    short = {c: round(shares.get(c, 0.0), 3) for c, f in floors.items() if shares.get(c, 0.0) < f}
    assert not short, f"cases below their floor: {short} (floors {floors}; shares {shares})"
