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

Where the observation is plain (no start in progress, no holder asleep, every start
record within what its serve declares: the common case), :func:`plain_reading` reads
what :func:`statemachine.ledger.ledger_from_observed` counts in one walk of the serves,
with the serves that hold memory, so that neither the ledger nor a second walk is
built; anywhere else the caller builds the ledger. The victim search reads the
candidates as plain rows (:func:`statemachine.victims.victim_names`).

tests/test_fit_isolated.py checks, over random hosts, that every answer equals the
planner's plan for the isolated request, and that a plain reading counts what the
ledger counts.

Pure: no I/O, no clock (``now`` is an argument), no logging, no docker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from statemachine.admission import conflict, inside_min_runtime
from statemachine.idleness import request_end
from statemachine.ledger import GpuReservation, Ledger, RoleTerms
from statemachine.plan import Policy
from statemachine.types import (
    COMMITTED_STATES,
    ContainerObs,
    DesiredState,
    GpuRole,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
    SleepState,
    StartedWith,
    foreign_project,
)
from statemachine.victims import Row, victim_names

#: each serve whose container holds memory, as declared, with what docker says of it
Running = Sequence[tuple[ServeSpec, ContainerObs]]


@dataclass(frozen=True, slots=True)
class Decision:
    """What the planner would do for the isolated request: whom it stops (in the
    plan's order) and whose router tier it drains first."""

    evict: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()


NO_ROOM_NEEDED = Decision()


class Reading:
    """The observed ledger as the shortcut reads it: each holder's roles and MiB, each
    role's free MiB, and (read by :func:`plain_reading`) the serves that hold memory.

    It answers the questions :func:`statemachine.fit.fit_serve` asks a
    :class:`~statemachine.ledger.Ledger` (``unknown``, ``holds``, ``holdings``,
    ``free_mib``, ``terms``) with the same figures; it admits nothing.
    """

    __slots__ = ("free", "held", "roles", "running")

    def __init__(
        self,
        roles: Mapping[str, GpuRole],
        free: Mapping[str, int],
        held: Mapping[str, tuple[tuple[str, ...], int]],
        running: Running | None = None,
    ) -> None:
        self.roles = roles
        #: role -> budget minus committed (negative when observed over budget)
        self.free = free
        #: holder -> (the roles it holds on, the MiB it holds on each)
        self.held = held
        #: the serves whose containers hold memory, as declared (None: not read)
        self.running = running

    @classmethod
    def of(cls, ledger: Ledger) -> Reading:
        """The reading of a known ledger (docker was read)."""
        assert not ledger.unknown, "an unknown ledger has no figures to read"
        return cls(
            ledger.roles,
            {r: ledger.free_mib(r) for r in ledger.roles},
            {h: (res.gpu_roles, res.mib) for h, res in ledger.holdings.items()},
        )

    @property
    def unknown(self) -> bool:
        """Never: a reading is made only where docker was read."""
        return False

    @property
    def holdings(self) -> Mapping[str, GpuReservation]:
        """The committed reservations, by holder (as the ledger's)."""
        return {h: GpuReservation(h, on, mib) for h, (on, mib) in self.held.items()}

    def holds(self, holder: str) -> bool:
        """True when ``holder`` has a committed reservation."""
        return holder in self.held

    def free_mib(self, role: str) -> int:
        """Budget minus committed on ``role``."""
        return self.free[role]

    def terms(
        self, holder: str, gpu_roles: Iterable[str], requested_mib: int
    ) -> tuple[RoleTerms, ...]:
        """Every term of the arithmetic for ``requested_mib`` more on each of
        ``gpu_roles`` (:meth:`statemachine.ledger.Ledger.terms`' rows)."""
        out: list[RoleTerms] = []
        for role in gpu_roles:
            r = self.roles[role]
            free = self.free[role]
            on_role = sorted((h, mib) for h, (on, mib) in self.held.items() if role in on)
            out.append(
                RoleTerms(
                    gpu_role=role,
                    capacity_mib=r.capacity_mib,
                    reserve_mib=r.reserve_mib,
                    budget_mib=r.budget_mib,
                    committed_mib=r.budget_mib - free,
                    free_mib=free,
                    requested_mib=requested_mib,
                    shortfall_mib=max(0, requested_mib - free),
                    reservations=tuple(on_role),
                )
            )
        return tuple(out)


def plain_reading(desired: DesiredState, observed: Observed) -> Reading | None:
    """What :func:`statemachine.ledger.ledger_from_observed` counts, read in one walk of
    the serves where the observation is plain; None where it is not (the caller then
    builds the ledger).

    Plain: docker was read, no start is in progress, no serve that holds memory sleeps
    (or has an unknown sleep state), every record of what a container was started with
    is that of a serve in the ledger whose container holds memory and within what the
    serve declares now (no more MiB, none of its roles elsewhere), no serve lists a role
    twice, and no two serves declare one container. There every serve
    in the ledger whose container holds memory (or whose memory is not back yet) counts
    its declared ``vram_mib`` (an elastic serve shrunk by the controller what it holds
    now) on its roles, and nothing else counts: the
    ledger's rules for starts, sleepers, records and containers no longer declared
    count nothing more. tests/test_fit_isolated.py checks it against the ledger.
    """
    serves = desired.serves
    if (
        not observed.docker_ok
        or observed.starting
        # two serves declare one container (the manifest refuses it)
        or len({s.container for s in serves.values()}) != len(serves)
    ):
        return None
    roles = desired.roles
    containers = observed.containers
    records = observed.started_with
    sleep = observed.sleep
    shrunk = observed.elastic_mib
    unreleased = observed.unreleased
    committed = dict.fromkeys(roles, 0)
    held: dict[str, tuple[tuple[str, ...], int]] = {}
    running: list[tuple[ServeSpec, ContainerObs]] = []
    recorded: set[str] = set()  # the containers whose record is matched
    for s in desired.serves.values():
        name = s.name
        obs = containers.get(s.container)
        if obs is not None and obs.state in COMMITTED_STATES:
            running.append((s, obs))
            if sleep and (sl := sleep.get(name)) is not None and sl.state is not SleepState.AWAKE:
                return None  # asleep, or not known to be awake: the ledger's sleep rules
            record = records.get(s.container) if records else None
        elif name in unreleased:
            record = None
        else:
            continue  # holds nothing
        mib = s.vram_mib
        on = s.gpu_roles
        distinct = set(on)
        if mib is None or not on or not distinct <= roles.keys():
            continue  # not in the ledger (a record of its container is left unmatched)
        if (
            (record is not None and _beyond(record, mib, on))
            or name in held
            or len(distinct) < len(on)
        ):
            # it counts its start (the larger figure, on every role of either), or it
            # would be counted twice or on a role twice (the manifest refuses both)
            return None
        if record is not None:
            recorded.add(s.container)
        if shrunk:
            mib = shrunk.get(name, mib)
        held[name] = (on, mib)
        for r in on:
            committed[r] += mib
    if len(recorded) != len(records):
        return None  # a record of a container no serve in the ledger holds: it counts
    free = {r: role.budget_mib - committed[r] for r, role in roles.items()}
    return Reading(roles, free, held, running)


def _beyond(record: StartedWith, mib: int, on: tuple[str, ...]) -> bool:
    """True when a container's start record holds more than its serve declares now
    (more MiB, or a role the serve is not on)."""
    return record.mib > mib or any(r not in on for r in record.gpu_roles)


def decide(
    desired: DesiredState,
    observed: Observed,
    serve: ServeSpec,
    ledger: Ledger | Reading,
    policy: Policy,
    now: float,
) -> Decision | None:
    """The planner's answer for an isolated on-demand request of ``serve``, or None
    where only the planner can say (see the module docstring).

    ``ledger`` is ``ledger_from_observed(desired, observed)`` (known: docker was read)
    or its :func:`plain_reading`; ``serve`` does not run (its container holds no
    memory, or it sleeps).
    """
    read = ledger if isinstance(ledger, Reading) else Reading.of(ledger)
    name = serve.name
    if _own_rule_applies(serve, read, policy, observed, now):
        return None
    short = _shortfall(serve, desired, read)
    starting = observed.starting
    exclusive, port, roles = serve.exclusive, serve.port, serve.gpu_roles
    sizes_from_free = serve.sizes_from_free
    on_short: list[tuple[ServeSpec, ContainerObs]] = []  # running, on a short role, as declared
    short_roles = short.keys()
    loading = False  # an engine sizing itself from free memory starts on one of its roles
    for other, obs in _running(desired, observed, read):
        if other.name == name:
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
    rows = _candidates(on_short, short, read, policy, observed, now)
    if rows is None:
        return None
    evict = victim_names(rows, short, exact_limit=policy.exact_search_limit)
    if evict is None:
        return None
    drain = tuple(
        v for v in evict if desired.serves[v].router_tier and not observed.sleep_of(v).asleep
    )
    return Decision(evict, drain)


def _running(desired: DesiredState, observed: Observed, read: Reading) -> Running:
    """The serves that hold memory or whose start is in progress, as declared."""
    if read.running is not None:  # a plain reading: no start is in progress
        return read.running
    container, starting = observed.container, observed.starting
    return [
        (s, obs)
        for s in desired.serves.values()
        if (obs := container(s.container)).holds or s.name in starting
    ]


def _shortfall(serve: ServeSpec, desired: DesiredState, read: Reading) -> dict[str, int]:
    """The MiB ``serve``'s start lacks on each of its roles where free is short (none
    when the ledger does not govern it)."""
    mib = serve.vram_mib
    if mib is None or not desired.in_ledger(serve):
        return {}
    return {r: mib - free for r in serve.gpu_roles if mib > (free := read.free_mib(r))}


def _loads(other: ServeSpec, starts: bool, roles: tuple[str, ...]) -> bool:
    """True when ``other`` is an engine that sizes itself from free memory and starts
    (``starts``: in progress, or its healthcheck still says so) on one of ``roles``."""
    return other.sizes_from_free and starts and any(r in other.gpu_roles for r in roles)


def _own_rule_applies(
    serve: ServeSpec, read: Reading, policy: Policy, observed: Observed, now: float
) -> bool:
    """True when the planner applies a rule of the requester's own to it: it is not
    on-demand, held back, starting, asleep, still counted, its container is another
    Compose project's, or its request has ended."""
    name = serve.name
    return (
        serve.residency is not Residency.ON_DEMAND
        or name in policy.hold
        or name in observed.starting
        or observed.sleep_of(name).asleep
        or read.holds(name)
        or (serve.compose_project is not None and observed.foreign(serve) is not None)
        # a request without a TTL of its own ends only by the serve's idle_ttl_s
        or (
            serve.idle_ttl_s is not None
            and request_end(OnDemandRequest(name, now), serve, observed).expired(now)
        )
    )


def _candidates(
    on_short: list[tuple[ServeSpec, ContainerObs]],
    short: dict[str, int],
    read: Reading,
    policy: Policy,
    observed: Observed,
    now: float,
) -> list[Row] | None:
    """The eviction candidates among the running serves on the short roles (each once,
    as declared), as the victim search's rows; None when one of the holders could be
    shrunk or put to sleep instead (the planner weighs those).

    The planner lists them role by role; the order does not matter: the victim search
    weighs a set of rows by its own order of preference (names last) and names its
    victims in the order of their names."""
    held = read.held
    starting = observed.starting
    rows: list[Row] = []
    for o, obs in on_short:
        n = o.name
        h = held.get(n)
        if h is None:
            continue
        on, mib = h
        if o.compose_project is not None and foreign_project(o, obs) is not None:
            continue  # another project's container: protected, never stopped nor shrunk
        if o.elastic is not None and _may_give_back(o, mib, policy, observed, now):
            return None
        if (
            o.residency is not Residency.EVICTABLE
            or n in starting
            or inside_min_runtime(o, observed, now) is not None
        ):
            continue  # protected: it only matters when nothing covers (the planner says)
        if o.sleep is not None and _could_sleep(o, mib, policy, observed):
            return None
        rows.append((n, on, mib, o.priority, obs.started_at, observed.requests_in_flight(n).count))
    return rows


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
