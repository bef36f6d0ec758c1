"""Domain types of the pure core: what the manifest wants and what the host shows.

These are plain frozen dataclasses, built by the shell (``controller.manifest`` turns
TOML into :class:`DesiredState`; ``controller.snapshot`` turns observation JSON into
:class:`Observed`) and consumed by the ledger, the planner and the lifecycle machine.

This module must not do I/O, read the clock, log, or import anything from
``controller`` or any adapter library. Every value here is data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Residency(StrEnum):
    """ADR-0017 residency classes."""

    RESIDENT = "resident"
    EVICTABLE = "evictable"
    ON_DEMAND = "on-demand"


class DesiredRun(StrEnum):
    """What the manifest asks of a serve; ``None`` on a serve means unmanaged."""

    RUNNING = "running"
    STOPPED = "stopped"


class ContainerState(StrEnum):
    """Docker's container states as the observed snapshot names them."""

    RUNNING = "running"
    PAUSED = "paused"
    RESTARTING = "restarting"
    EXITED = "exited"
    CREATED = "created"
    DEAD = "dead"
    ABSENT = "absent"


#: Container states in which a container holds its reservation (docs/design.md §3).
COMMITTED_STATES: frozenset[ContainerState] = frozenset(
    {ContainerState.RUNNING, ContainerState.PAUSED, ContainerState.RESTARTING}
)


@dataclass(frozen=True, slots=True)
class GpuRole:
    """One ``[[gpu_roles]]`` row: a GPU with a capacity and a never-reservable reserve."""

    id: str
    capacity_mib: int
    reserve_mib: int = 0
    uuid: str | None = None

    @property
    def budget_mib(self) -> int:
        """What may be reserved on this role: capacity minus reserve."""
        return self.capacity_mib - self.reserve_mib


@dataclass(frozen=True, slots=True)
class Elastic:
    """An elastic serve can give VRAM back down to ``floor_mib`` (docs/design.md §6).

    Its engine gives memory back and takes it again in whole ``segment_mib`` segments
    of its expert cache, so shrinks and grows are planned in whole segments.
    """

    url: str
    floor_mib: int
    token_env: str | None = None
    segment_mib: int = 512


@dataclass(frozen=True, slots=True)
class Sleep:
    """A serve that can be put to sleep instead of stopped (docs/design.md §3, sleep).

    Asleep, its engine still holds ``residual_mib`` on each of its GPU roles (CUDA
    context, buffers) and, at ``level`` 1, ``host_ram_mib`` of host memory (its weights).
    At level 2 the weights are dropped and reloaded on wake. ``url`` is the engine's base
    URL (the manifest fills in ``http://127.0.0.1:{port}``).
    """

    level: int
    residual_mib: int
    protocol: str  # an engine's name (statemachine.engines) whose entry has a sleep API
    host_ram_mib: int = 0
    url: str | None = None
    #: ``wake_s``: the declared seconds from its wake calls until it is healthy (None:
    #: not declared); a measured wake replaces it (statemachine/planning/restore_cost.py)
    wake_s: float | None = None

    @property
    def host_mib(self) -> int:
        """Host RAM the sleeper holds: ``host_ram_mib`` at level 1, nothing at level 2."""
        return self.host_ram_mib if self.level == 1 else 0


@dataclass(frozen=True, slots=True)
class HostBudget:
    """The top-level ``[host]`` table: host RAM as a ledger budget, like a GPU role's."""

    ram_mib: int
    reserve_mib: int = 0

    @property
    def budget_mib(self) -> int:
        """What sleepers may hold: RAM minus reserve."""
        return self.ram_mib - self.reserve_mib


@dataclass(frozen=True, slots=True)
class ServeSpec:
    """One serve as the manifest declares it, reduced to what the core needs.

    ``gpu_roles`` is empty for a serve without a role; ``vram_mib`` is ``None`` for a
    serve without a reservation. A serve joins the ledger only when it has both and
    every role it names has a capacity row (:attr:`DesiredState.ledger_roles`).
    """

    name: str
    container: str
    gpu_roles: tuple[str, ...] = ()
    vram_mib: int | None = None
    residency: Residency | None = None
    desired: DesiredRun | None = None
    port: int | None = None
    exclusive: bool = False
    gpu_inference: bool = True
    priority: int = 0
    min_runtime_s: float = 0.0
    router_tier: str | None = None
    elastic: Elastic | None = None
    groups: tuple[str, ...] = ()
    idle_ttl_s: float | None = None
    #: the engine sizes itself from the device's free memory at load (vLLM, SGLang):
    #: two such starts on one GPU would each take the other's room, so they are serialised
    sizes_from_free: bool = False
    #: ``[serve.sleep]``: it can be put to sleep instead of stopped (None: it cannot)
    sleep: Sleep | None = None
    #: the Compose project its container belongs to (``compose_project``, or the
    #: ``-p`` of its ``up``); None: any container bearing its name is its own
    compose_project: str | None = None
    #: ``placement``: the candidate roles the controller chooses one of (docs/placement.md);
    #: empty for a pinned serve. Until a role is chosen ``gpu_roles`` is every candidate
    #: (the ledger then counts what it holds on each: never less than the truth);
    #: ``statemachine.planning.placement`` narrows it to the chosen one
    placement: tuple[str, ...] = ()
    #: ``cold_start_s``: the declared seconds from its start until it is healthy (None:
    #: not declared); a measured cold start replaces it (statemachine/planning/restore_cost.py)
    cold_start_s: float | None = None

    @property
    def managed(self) -> bool:
        """A serve without ``desired`` is unmanaged: never started or stopped on its own."""
        return self.desired is not None

    @property
    def placed(self) -> bool:
        """True once a placed serve's role is chosen (``gpu_roles`` is one candidate)."""
        return len(self.gpu_roles) == 1 and self.gpu_roles[0] in self.placement


@dataclass(frozen=True, slots=True)
class OnDemandRequest:
    """A request (API or CLI) to run a serve, optionally for ``ttl_s`` seconds."""

    serve: str
    requested_at: float
    ttl_s: float | None = None
    #: ended by ``down`` (the API's, ``vramctl down``, the ``release`` tool), not by its
    #: TTL: kept, ended at once (``ttl_s`` 0), until its serve is down, and the plan
    #: that stops the serve says so
    released: bool = False

    def expired(self, now: float) -> bool:
        """True once the request's own ``ttl_s`` has run out (never without one): the
        raw TTL only, not whether the request is in force (a request without a TTL of
        its own ends by its serve's ``idle_ttl_s``): that is
        :func:`statemachine.planning.idleness.in_force`, the one rule every decision asks. Kept
        for ``benchmarks/bench_placement.py``, whose requests all carry a ``ttl_s``."""
        return self.ttl_s is not None and now >= self.requested_at + self.ttl_s

    def to_json(self) -> dict[str, Any]:
        """The form the journal's cycle records store and replay reads back."""
        data: dict[str, Any] = {
            "serve": self.serve,
            "requested_at": self.requested_at,
            "ttl_s": self.ttl_s,
        }
        if self.released:  # else the form of the cycles recorded before it was kept
            data["released"] = True
        return data


@dataclass(frozen=True, slots=True)
class DesiredState:
    """The whole desired state: roles and serves (ordered as declared), and requests.

    ``requests`` are the on-demand requests handed in by the caller (the loop keeps
    them in the journal); the manifest itself never has any.
    """

    roles: Mapping[str, GpuRole]
    serves: Mapping[str, ServeSpec]
    requests: tuple[OnDemandRequest, ...] = ()
    #: the ``[host]`` budget (None: host RAM is not a budget, sleepers hold it unchecked)
    host: HostBudget | None = None
    #: the serves that can keep another from starting other than by memory: exclusive,
    #: with a port, or sizing themselves from free memory (as declared, listed once here)
    wary: tuple[ServeSpec, ...] = field(init=False, repr=False, compare=False)
    #: role -> the serves declared on it, in order (a role no serve names is absent)
    on_role: Mapping[str, tuple[ServeSpec, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        serves = self.serves.values()
        wary = tuple(s for s in serves if s.exclusive or s.port is not None or s.sizes_from_free)
        on_role: dict[str, list[ServeSpec]] = {}
        for s in serves:
            for role in s.gpu_roles:
                on_role.setdefault(role, []).append(s)
        object.__setattr__(self, "wary", wary)
        object.__setattr__(self, "on_role", {r: tuple(ss) for r, ss in on_role.items()})

    def in_ledger(self, serve: ServeSpec) -> bool:
        """True when the serve has a reservation on roles that all have a capacity row."""
        return (
            serve.vram_mib is not None
            and bool(serve.gpu_roles)
            and all(map(self.roles.__contains__, serve.gpu_roles))
        )


@dataclass(frozen=True, slots=True)
class ContainerObs:
    """What docker says of one container."""

    state: ContainerState
    health: str | None = None
    started_at: float | None = None  # seconds since the epoch, as observed
    exit_code: int | None = None
    oom_killed: bool | None = None
    gpu_used_mib: int | None = None  # NVML, attributed through cgroups; None = unknown
    finished_at: float | None = None  # when it last stopped, as observed; None = never/unknown
    #: its ``com.docker.compose.project`` label; None: it has none
    compose_project: str | None = None
    #: the card(s) its environment's ``VRAMCTL_GPU_ROLE`` names (what its ``up`` was
    #: told, roles joined by commas); None: it names none
    gpu_role: str | None = None

    @property
    def told_roles(self) -> tuple[str, ...]:
        """The roles its environment names (``()``: none)."""
        return tuple(self.gpu_role.split(",")) if self.gpu_role else ()

    @property
    def holds(self) -> bool:
        """True while the container occupies GPU memory (running, paused, restarting):
        its serve's reservation is counted (the ledger's word for that is
        :meth:`statemachine.ledger.reservations.Ledger.holds`)."""
        return self.state in COMMITTED_STATES


def foreign_project(serve: ServeSpec, obs: ContainerObs) -> str | None:
    """The Compose project of another stack whose container bears ``serve``'s name.

    A serve that declares its project (``ServeSpec.compose_project``) owns only the
    container labelled with that project: one labelled with another project is
    *foreign*, and this returns that project. It is never started, stopped, drained,
    resized, put to sleep or removed; while it runs it holds memory like any other
    (docs/design.md §3, foreign containers). ``None``: the container is the serve's
    own, absent, unlabelled (made by hand), or the serve declares no project.
    """
    theirs = obs.compose_project
    if serve.compose_project is None or theirs is None or theirs == serve.compose_project:
        return None
    return theirs if obs.state is not ContainerState.ABSENT else None


ABSENT = ContainerObs(state=ContainerState.ABSENT)


@dataclass(frozen=True, slots=True)
class GpuObs:
    """What NVML says of one device; ``None`` figures are unknown, never zero."""

    uuid: str
    index: int | None = None
    name: str | None = None
    total_mib: int | None = None
    used_mib: int | None = None
    free_mib: int | None = None


@dataclass(frozen=True, slots=True)
class StartingObs:
    """A start in progress: the roles and MiB reserved for it when it began."""

    gpu_roles: tuple[str, ...]
    mib: int


class SleepState(StrEnum):
    """What the engine's sleep API says of a serve that can sleep."""

    AWAKE = "awake"
    ASLEEP = "asleep"
    UNKNOWN = "unknown"  # it did not answer: counted as awake and full, never slept


@dataclass(frozen=True, slots=True)
class SleepObs:
    """The observed sleep state of one serve.

    ``level`` is the level it was put to sleep at (asleep only). ``residual_mib`` and
    ``host_ram_mib`` are what the controller put it to sleep with (its own record, kept
    across restarts): the ledger counts the larger of those and what the manifest
    declares now. ``None``: no record.
    """

    state: SleepState
    level: int | None = None
    residual_mib: int | None = None
    host_ram_mib: int | None = None

    @property
    def asleep(self) -> bool:
        """True when the engine says it is asleep."""
        return self.state is SleepState.ASLEEP


AWAKE = SleepObs(state=SleepState.AWAKE)


@dataclass(frozen=True, slots=True)
class StartedWith:
    """The reservation a container was started with (the controller's own record).

    A container keeps it until it stops, whatever the manifest says now: an edit (or a
    file caught mid-write) cannot give the memory of a running engine away.
    """

    serve: str
    gpu_roles: tuple[str, ...]
    mib: int


class InFlightSource(StrEnum):
    """Where a serve's count of requests in flight is read (docs/eviction.md)."""

    METRICS = "metrics"  # the engine's own Prometheus metrics
    ROUTER = "router"  # the router tier's ``active_requests``


@dataclass(frozen=True, slots=True)
class InFlightObs:
    """What is known of the requests a serve has in flight.

    ``count`` ``None`` is unknown (never 0). ``source`` ``None``: the serve has no
    source at all (no metrics URL, no router tier), so its idleness cannot be measured.
    ``idle_since``: since when the count has read 0 at every reading (set only while
    ``count`` is 0); ``busy_at``: the last time a count above 0 was read; ``woke_at``:
    when its engine was first read awake after it was read asleep (its run since a wake
    starts there, as a cold start's starts at the container's start). All three are
    observation times kept by the shell; the core never reads a clock.
    """

    count: int | None
    source: InFlightSource | None = None
    idle_since: float | None = None
    busy_at: float | None = None
    woke_at: float | None = None


#: a serve of which nothing is known: no source, no count
NO_SOURCE = InFlightObs(count=None)


@dataclass(frozen=True, slots=True)
class Observed:
    """One observed snapshot of the host.

    ``docker_ok`` False means docker could not be read: every container's state is
    unknown and the core fails closed. ``gpus`` ``None`` means NVML is unavailable.
    ``elastic_mib`` is what the controller knows of elastic serves it has shrunk:
    serve name -> the reservation it holds now (below its declared ``vram_mib``).
    """

    docker_ok: bool
    containers: Mapping[str, ContainerObs] = field(default_factory=dict)
    gpus: tuple[GpuObs, ...] | None = None
    elastic_mib: Mapping[str, int] = field(default_factory=dict)
    undeclared_gpu: tuple[str, ...] = ()  # GPU containers that no manifest declares
    #: serves whose router tier the controller left quiesced (a start interrupted before
    #: its readmit, a readmit that failed): the planner readmits them while they run
    quiesced: frozenset[str] = frozenset()
    #: serves whose container exited but whose memory NVML has not shown back: the
    #: ledger keeps counting their reservation until it does (fail closed)
    unreleased: frozenset[str] = frozenset()
    #: serves whose start the controller has in progress (reserved, `up` running, or
    #: awaiting health), serve -> the roles and MiB reserved for it: they hold that
    #: reservation whatever their container shows (and whatever the manifest now says),
    #: and the planner plans nothing for them until it ends
    starting: Mapping[str, StartingObs] = field(default_factory=dict)
    #: container name -> the reservation it was started with; counted while the
    #: container holds memory, beside (or instead of) what the manifest declares now
    started_with: Mapping[str, StartedWith] = field(default_factory=dict)
    #: serve name -> its engine's sleep state; a serve missing here is awake. Only a
    #: running container can be asleep (a container that restarted is awake and full)
    sleep: Mapping[str, SleepObs] = field(default_factory=dict)

    def sleep_of(self, serve: str) -> SleepObs:
        """The serve's sleep state; a serve missing from the snapshot is awake."""
        return self.sleep.get(serve, AWAKE)

    #: serve -> its requests in flight; a serve missing here has no source (unknown)
    in_flight: Mapping[str, InFlightObs] = field(default_factory=dict)
    #: serve -> "healthy" / "unhealthy": the controller's GET of its declared health
    #: path at this observation (running serves with a port and a health path, whose
    #: container has no Docker healthcheck); a serve missing here was not probed
    probes: Mapping[str, str] = field(default_factory=dict)
    #: serve -> whether its engine, one that sleeps by itself (llama.cpp), says it sleeps
    #: now; missing: not asked or unknown. Shown only: the ledger keeps its whole
    #: reservation, since any request may wake it (statemachine/flags/self_sleep.py)
    self_asleep: Mapping[str, bool] = field(default_factory=dict)

    def container(self, name: str) -> ContainerObs:
        """The container's observation; a container missing from the snapshot is absent."""
        return self.containers.get(name, ABSENT)

    def foreign(self, serve: ServeSpec) -> str | None:
        """The other Compose project whose container bears ``serve``'s container name
        (:func:`foreign_project`); ``None`` when the container is not foreign."""
        return foreign_project(serve, self.container(serve.container))

    def requests_in_flight(self, serve: str) -> InFlightObs:
        """The serve's in-flight observation; a serve without one has no source."""
        return self.in_flight.get(serve, NO_SOURCE)
