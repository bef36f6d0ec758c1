"""The status report: per-role ledger with NVML figures and drift, per-serve state.

``host_status`` combines the desired state and one observation into the report that
``vramctl status`` prints; each serve's lifecycle is its record
(``statemachine/lifecycle/serve_record.py``) moved by the observation, with no mapping of its
own. Every figure is either declared (capacity, reserve, reservation), derived from
declared figures and observed container states (committed, free), or measured (NVML
used / total); what cannot be known is ``None`` (printed as unknown), never 0. Drift
is reported here and never acted on.

Pure: no I/O, no clock, no docker, no NVML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statemachine.domain.types import (
    ContainerObs,
    DesiredRun,
    DesiredState,
    GpuObs,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
)
from statemachine.ledger.reservations import (
    HostView,
    Ledger,
    RoleView,
    ledger_from_observed,
    no_longer_declared,
)
from statemachine.lifecycle.machine import LifecycleState
from statemachine.lifecycle.serve_record import ServeRecord, observe, reading
from statemachine.planning.idleness import request_end
from statemachine.planning.restore_cost import (
    UNKNOWN,
    RestoreEstimate,
    declared_costs,
    restore_estimates,
)


@dataclass(frozen=True, slots=True)
class RoleStatus:
    """One role: the ledger line, the device it is linked to, and drift."""

    ledger: RoleView
    uuid: str | None
    device_found: bool
    nvml_total_mib: int | None
    nvml_used_mib: int | None
    drift_used_mib: int | None  # NVML used - committed: memory drawn outside the ledger
    drift_total_mib: int | None  # device total - declared capacity
    overcommitted: bool

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        out = {"gpu_role": self.ledger.gpu_role, **self.ledger.to_json()}
        out.update(_fields(self, _ROLE_KEYS))
        return out


#: a role's JSON after its ledger line, in order
_ROLE_KEYS = (
    "uuid",
    "device_found",
    "nvml_total_mib",
    "nvml_used_mib",
    "drift_used_mib",
    "drift_total_mib",
    "overcommitted",
)


def _fields(obj: object, keys: tuple[str, ...]) -> dict[str, Any]:
    """``obj``'s attributes ``keys``, by name, in that order."""
    return {k: getattr(obj, k) for k in keys}


@dataclass(frozen=True, slots=True)
class ServeStatus:
    """One serve: what docker shows and what the ledger holds for it."""

    serve: str
    container: str
    gpu_roles: tuple[str, ...]
    residency: str | None
    desired: str | None
    state: str  # container state, or "unknown"
    health: str | None
    lifecycle: str  # derived lifecycle state, or "unknown"
    reservation_mib: int | None
    in_ledger: bool
    committed: bool | None
    nvml_used_mib: int | None = None  # attributed through cgroups; None = unknown
    #: NVML used - what the ledger holds for it (its declared reservation, the figure
    #: it was shrunk to or started with, its residual asleep), or - its declared
    #: reservation where the ledger holds nothing for it
    drift_mib: int | None = None
    #: what the ledger holds for it now (None: nothing, or docker unreadable)
    held_mib: int | None = None
    #: for a serve that can sleep (or is seen asleep): "awake" / "asleep" / "unknown",
    #: the level it sleeps at, and what it holds asleep (residual per role, host RAM)
    sleep: str | None = None
    sleep_level: int | None = None
    residual_mib: int | None = None
    host_ram_mib: int | None = None
    #: an engine that sleeps by itself (llama.cpp's --sleep-idle-seconds), as it says:
    #: "asleep" / "awake"; None where not asked or unknown. Its reservation is held whole
    self_sleep: str | None = None
    #: requests in flight (None = unknown), where they are read (None: no source)
    in_flight: int | None = None
    in_flight_source: str | None = None
    #: since when every reading has been 0 (the loop's observations; None = not known)
    idle_since: float | None = None
    #: what its request's end counts from (statemachine.planning.idleness.IdleBasis), for a serve
    #: with an active request or an idle_ttl_s; None otherwise
    ttl_basis: str | None = None
    #: when its active request ends (None: no request, no TTL, or not while busy)
    request_ends_at: float | None = None
    #: the other Compose project whose container bears its container name (foreign:
    #: never acted on, counted while it holds memory); None: not foreign
    foreign_project: str | None = None
    #: "manifest" when ``desired`` is the manifest's, "request" when an on-demand
    #: request makes it desired running; None for an unmanaged serve with no request
    desired_by: str | None = None
    #: an evictable serve desired running that is down and cannot start now: the
    #: requested serves holding memory on its roles (it comes back when they end)
    evicted_for: tuple[str, ...] = ()
    #: a placed serve's candidate roles (``gpu_roles`` is then the card it holds on,
    #: or every candidate while it holds nothing or its card is unknown)
    placement: tuple[str, ...] = ()
    #: what bringing it back costs (a cold start, a wake) and where the figures come
    #: from (statemachine/planning/restore_cost.py); unknown figures are None, never 0
    reload: RestoreEstimate = UNKNOWN

    def to_json(self) -> dict[str, Any]:
        """JSON form (``sleep`` only for a serve that can sleep or is seen asleep)."""
        out = _fields(self, _SERVE_KEYS)
        out["gpu_roles"] = list(self.gpu_roles)
        out["evicted_for"] = list(self.evicted_for)
        out["reload"] = self.reload.to_json()
        if self.placement:  # only for a placed serve
            out["placement"] = list(self.placement)
        if self.self_sleep is not None:  # only for an engine that said
            out["self_sleep"] = self.self_sleep
        if self.sleep is not None:
            out["sleep"] = {
                "state": self.sleep,
                "level": self.sleep_level,
                "residual_mib": self.residual_mib,
                "host_ram_mib": self.host_ram_mib,
            }
        return out


#: a serve's JSON, in order (``sleep`` follows for a serve that can sleep)
_SERVE_KEYS = (
    "serve",
    "container",
    "gpu_roles",
    "residency",
    "desired",
    "state",
    "health",
    "lifecycle",
    "reservation_mib",
    "in_ledger",
    "committed",
    "nvml_used_mib",
    "drift_mib",
    "held_mib",
    "in_flight",
    "in_flight_source",
    "idle_since",
    "ttl_basis",
    "request_ends_at",
    "foreign_project",
    "desired_by",
    "evicted_for",
)


@dataclass(frozen=True, slots=True)
class HostStatus:
    """The whole report."""

    docker_ok: bool
    nvml_ok: bool
    roles: tuple[RoleStatus, ...]
    serves: tuple[ServeStatus, ...]
    undeclared_gpu: tuple[str, ...] = ()
    #: running containers the manifest no longer declares, still holding the reservation
    #: they were started with: (holder, container, gpu roles, MiB)
    no_longer_declared: tuple[tuple[str, str, tuple[str, ...], int], ...] = ()
    #: the host RAM ledger (only with a ``[host]`` budget)
    host: HostView | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form (``host`` only with a ``[host]`` budget)."""
        out: dict[str, Any] = {
            "docker": "ok" if self.docker_ok else "error",
            "nvml": "ok" if self.nvml_ok else "unavailable",
            "gpu_roles": [r.to_json() for r in self.roles],
            "serves": [s.to_json() for s in self.serves],
            "undeclared_gpu_containers": list(self.undeclared_gpu),
            "no_longer_declared": [
                {"serve": h, "container": c, "gpu_roles": list(roles), "reservation_mib": mib}
                for h, c, roles, mib in self.no_longer_declared
            ],
        }
        if self.host is not None:
            out["host"] = {**self.host.to_json(), "overcommitted": self._host_over()}
        return out

    def _host_over(self) -> bool | None:
        host = self.host
        if host is None or host.committed_mib is None:
            return None
        return host.committed_mib > host.budget_mib


def _role_status(rid: str, ledger: Ledger, observed: Observed, over: set[str]) -> RoleStatus:
    """Role ``rid``'s line of the report: its ledger line beside its device's NVML
    figures (``over``: the roles observed over budget)."""
    role = ledger.roles[rid]
    view = ledger.view(rid)
    dev = _device(observed.gpus, role.uuid)
    used = dev.used_mib if dev else None
    total = dev.total_mib if dev else None
    return RoleStatus(
        ledger=view,
        uuid=role.uuid,
        device_found=dev is not None,
        nvml_total_mib=total,
        nvml_used_mib=used,
        drift_used_mib=(
            used - view.committed_mib
            if used is not None and view.committed_mib is not None
            else None
        ),
        drift_total_mib=total - role.capacity_mib if total is not None else None,
        overcommitted=rid in over,
    )


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What each serve's line of one report (:func:`host_status`) is read from besides
    the observation: the ledger it counts, the controller's records, each serve's
    reload cost and the on-demand requests, by serve."""

    ledger: Ledger
    records: Mapping[str, ServeRecord]
    reload: Mapping[str, RestoreEstimate]
    requests: Mapping[str, OnDemandRequest]


def _serve_status(
    s: ServeSpec, desired: DesiredState, observed: Observed, inputs: _Inputs
) -> ServeStatus:
    """Serve ``s``'s line of the report: what is asked of it, what it holds and uses,
    its sleep, its requests in flight and its reload cost."""
    ledger, records, reload = inputs.ledger, inputs.records, inputs.reload
    obs = observed.container(s.container)
    flight = observed.requests_in_flight(s.name)
    req = inputs.requests.get(s.name)
    ends = None
    if req is not None or s.idle_ttl_s is not None:
        ends = request_end(req or OnDemandRequest(s.name, 0.0), s, observed)
    in_ledger = desired.in_ledger(s)
    used = obs.gpu_used_mib if observed.docker_ok and obs.holds else None
    sleep_obs = observed.sleep_of(s.name)
    asleep = observed.docker_ok and obs.holds and sleep_obs.asleep
    held = ledger.holdings[s.name].mib if observed.docker_ok and ledger.holds(s.name) else None
    shows_sleep = s.sleep is not None or s.name in observed.sleep
    return ServeStatus(
        serve=s.name,
        container=s.container,
        gpu_roles=_where(s, ledger, observed) if observed.docker_ok else s.gpu_roles,
        placement=s.placement,
        residency=str(s.residency) if s.residency else None,
        desired=str(s.desired)
        if s.desired
        else (str(DesiredRun.RUNNING) if req is not None else None),
        desired_by="manifest" if s.desired else ("request" if req else None),
        evicted_for=_evicted_for(s, desired, ledger) if observed.docker_ok else (),
        state=str(obs.state) if observed.docker_ok else "unknown",
        # Docker's healthcheck where it has one, else the controller's probe
        health=(obs.health or observed.probes.get(s.name)) if observed.docker_ok else None,
        lifecycle=_lifecycle(records.get(s.name) or ServeRecord(s.name), obs, observed),
        reservation_mib=s.vram_mib,
        in_ledger=in_ledger,
        committed=(ledger.holds(s.name) if observed.docker_ok else None) if in_ledger else False,
        nvml_used_mib=used,
        drift_mib=_drift(used, held, s.vram_mib),
        held_mib=held,
        sleep=(str(sleep_obs.state) if observed.docker_ok else "unknown") if shows_sleep else None,
        sleep_level=sleep_obs.level if asleep else None,
        residual_mib=held if asleep else None,
        host_ram_mib=ledger.host_holdings.get(s.name) if asleep else None,
        self_sleep=_self_sleep(observed, s.name, obs.holds),
        in_flight=flight.count,
        in_flight_source=None if flight.source is None else str(flight.source),
        idle_since=flight.idle_since if flight.count == 0 else None,
        ttl_basis=None if ends is None else str(ends.basis),
        request_ends_at=ends.expires_at if ends is not None and req is not None else None,
        foreign_project=observed.foreign(s) if observed.docker_ok else None,
        reload=reload.get(s.name, UNKNOWN),
    )


def lifecycle_from_observation(obs: ContainerObs) -> LifecycleState:
    """The lifecycle state an observation implies, for a serve the controller is not driving
    (:func:`statemachine.lifecycle.serve_record.reading`, the one place it is derived)."""
    return reading(obs)


def _device(gpus: tuple[GpuObs, ...] | None, uuid: str | None) -> GpuObs | None:
    if gpus is None or uuid is None:
        return None
    for g in gpus:
        if g.uuid == uuid:
            return g
    return None


def _where(s: ServeSpec, ledger: Ledger, observed: Observed) -> tuple[str, ...]:
    """The roles a serve is on (docs/placement.md): a pinned serve's declared roles; a
    placed serve's card where it holds memory, else the card its start record names,
    else the one its container's environment names (what its last ``up`` was told),
    each only where it is among the candidates, else every candidate (``s`` may come
    with the card a plan chose for it: that is where it would go, not where it is)."""
    if not s.placement:
        return s.gpu_roles
    if ledger.holds(s.name):
        return ledger.holdings[s.name].gpu_roles
    record = observed.started_with.get(s.container)
    for roles in (record.gpu_roles if record else (), observed.container(s.container).told_roles):
        if roles and set(roles) <= set(s.placement):
            return roles
    return s.placement


def _evicted_for(s: ServeSpec, desired: DesiredState, ledger: Ledger) -> tuple[str, ...]:
    """The requested serves an evictable ``s`` (desired running, holding nothing) makes
    room for: those holding memory on a role of ``s`` (a placed serve's: every
    candidate) where ``s`` does not fit now."""
    if (
        s.residency != Residency.EVICTABLE
        or s.desired != DesiredRun.RUNNING
        or s.vram_mib is None
        or not desired.in_ledger(s)  # a role without a capacity row: no room to lack
        or ledger.holds(s.name)
    ):
        return ()
    short = {
        r
        for r in s.placement or s.gpu_roles
        if (free := ledger.view(r).free_mib) is not None and free < s.vram_mib
    }
    return tuple(
        sorted(
            r.serve
            for r in desired.requests
            if ledger.holds(r.serve) and short & set(ledger.holdings[r.serve].gpu_roles)
        )
    )


def _self_sleep(observed: Observed, serve: str, holds: bool) -> str | None:
    """What an engine that sleeps by itself said ("asleep" / "awake"), while its
    container holds memory; None where it was not asked or did not answer."""
    said = observed.self_asleep.get(serve) if observed.docker_ok and holds else None
    return None if said is None else ("asleep" if said else "awake")


def _drift(used: int | None, held: int | None, declared: int | None) -> int | None:
    """NVML used over what the ledger holds for the serve, else over its declaration."""
    against = held if held is not None else declared
    return None if used is None or against is None else used - against


def _lifecycle(record: ServeRecord, obs: ContainerObs, observed: Observed) -> str:
    """The serve's record moved by this observation (``unknown`` when Docker could not
    be read)."""
    if not observed.docker_ok:
        return "unknown"
    asleep = observed.sleep_of(record.serve).asleep  # counts only while it holds
    seen = reading(obs, asleep=asleep, starting=record.serve in observed.starting)
    return str(observe(record, seen).lifecycle)


def host_status(
    desired: DesiredState,
    observed: Observed,
    records: Mapping[str, ServeRecord] | None = None,
    reload: Mapping[str, RestoreEstimate] | None = None,
) -> HostStatus:
    """Build the status report from the desired state and one observation.

    Each serve's lifecycle is its record (``records``: the controller's; a serve
    without one starts from a fresh record) moved by this observation. ``reload``: each
    serve's reload cost (:func:`statemachine.planning.restore_cost.restore_estimates`), a serve
    absent from it unknown; ``None``: the figures the manifest declares."""
    records = records or {}
    if reload is None:
        reload = restore_estimates(declared_costs(desired), {})
    ledger = ledger_from_observed(desired, observed)
    over = set(ledger.overcommitted())
    roles = [_role_status(rid, ledger, observed, over) for rid in desired.roles]
    inputs = _Inputs(ledger, records, reload, {r.serve: r for r in desired.requests})
    serves = [_serve_status(s, desired, observed, inputs) for s in desired.serves.values()]
    return HostStatus(
        docker_ok=observed.docker_ok,
        nvml_ok=observed.gpus is not None,
        roles=tuple(roles),
        serves=tuple(serves),
        undeclared_gpu=observed.undeclared_gpu,
        no_longer_declared=tuple(
            (res.holder, container, res.gpu_roles, res.mib)
            for container, res in no_longer_declared(desired, observed)
        ),
        host=ledger.host_view(),
    )
