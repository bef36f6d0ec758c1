"""The observed-snapshot JSON contract (docs/design.md §5): read, validate, convert, write.

``vramctl observe`` prints this format and ``--observed FILE`` reads it. The JSON is
validated by pydantic (extra keys allowed) and converted into the pure core's
:class:`statemachine.domain.types.Observed`. Times are ISO 8601 strings (as docker reports
them) or seconds since the epoch; the core sees epoch seconds.

This module must not observe anything itself: it only parses and renders snapshots.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from statemachine.domain.types import (
    ContainerObs,
    ContainerState,
    GpuObs,
    InFlightObs,
    InFlightSource,
    Observed,
    SleepObs,
    SleepState,
    StartedWith,
    StartingObs,
)


class SnapshotError(Exception):
    """A snapshot file that cannot be read or does not match the contract."""


def epoch_seconds(value: str | float | int | None) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    if not text or text.startswith("0001-01-01"):
        return None  # docker's zero time: never started
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    # docker gives nanoseconds; datetime takes at most microseconds
    if "." in text:
        head, _, rest = text.partition(".")
        frac = "".join(ch for ch in rest if ch.isdigit())
        tz = rest[len(frac) :]
        text = f"{head}.{frac[:6]}{tz}"
    return datetime.fromisoformat(text).timestamp()


#: a serve's health path's answer at one observation (2xx: healthy)
Probe = Literal["healthy", "unhealthy"]


class ContainerModel(BaseModel):
    """One container in the snapshot."""

    model_config = ConfigDict(extra="allow")

    state: ContainerState
    health: str | None = None
    started_at: str | float | None = None
    #: when the container last stopped (docker's FinishedAt); None: never, or unknown
    finished_at: str | float | None = None
    exit_code: int | None = None
    oom_killed: bool | None = None
    id: str | None = None
    gpu_used_mib: int | None = Field(default=None, ge=0)
    #: its ``com.docker.compose.project`` label (None: none); a serve that declares
    #: another project does not own it (docs/design.md §3, foreign containers)
    compose_project: str | None = None
    #: the card its environment says its ``up`` was told (``VRAMCTL_GPU_ROLE``; None:
    #: it says none): the evidence of a placed serve's card where no record is kept
    gpu_role: str | None = None

    @field_validator("started_at", "finished_at")
    @classmethod
    def _check_time(cls, v: str | float | None) -> str | float | None:
        try:
            epoch_seconds(v)
        except ValueError as exc:
            raise ValueError(f"not an ISO 8601 time or epoch seconds: {v!r}") from exc
        return v


class GpuModel(BaseModel):
    """One device in the snapshot; a missing figure is unknown."""

    model_config = ConfigDict(extra="allow")

    uuid: str
    index: int | None = None
    name: str | None = None
    total_mib: int | None = Field(default=None, ge=0)
    used_mib: int | None = Field(default=None, ge=0)
    free_mib: int | None = Field(default=None, ge=0)

    def to_obs(self) -> GpuObs:
        """The device as the core sees it."""
        return GpuObs(
            uuid=self.uuid,
            index=self.index,
            name=self.name,
            total_mib=self.total_mib,
            used_mib=self.used_mib,
            free_mib=self.free_mib,
        )


class UndeclaredModel(BaseModel):
    """A container that requests GPUs but that no manifest declares."""

    model_config = ConfigDict(extra="allow")

    name: str


class StartingModel(BaseModel):
    """A start in progress: the roles and MiB the controller reserved for it."""

    gpu_roles: list[str]
    mib: int


class StartedWithModel(BaseModel):
    """The reservation a container was started with (the controller's record)."""

    model_config = ConfigDict(extra="allow")

    serve: str
    gpu_roles: list[str]
    mib: int = Field(gt=0)


class SleepStateModel(BaseModel):
    """The sleep state of one serve's engine, and what it was put to sleep with."""

    model_config = ConfigDict(extra="allow")

    state: SleepState
    level: Literal[1, 2] | None = None
    residual_mib: int | None = Field(default=None, gt=0)
    host_ram_mib: int | None = Field(default=None, ge=0)


class InFlightModel(BaseModel):
    """A serve's requests in flight as read (``count`` null: unknown, never 0).

    ``source``: ``metrics`` or ``router``, null when the serve has none; ``idle_since``:
    since when every reading has been 0 (epoch seconds); ``busy_at``: the last reading
    above 0; ``woke_at``: the first reading awake after one asleep; ``error``: why the
    count is unknown.
    """

    model_config = ConfigDict(extra="allow")

    count: int | None = Field(default=None, ge=0)
    source: InFlightSource | None = None
    idle_since: float | None = None
    busy_at: float | None = None
    woke_at: float | None = None
    error: str | None = None


class SnapshotModel(BaseModel):
    """The whole observed snapshot.

    ``elastic`` holds what the controller knows of elastic serves it has shrunk
    (serve -> MiB held now); ``started_with`` the reservation each container it
    started (or found running under the manifest) was started with (container ->
    serve, gpu_roles, mib), counted while it runs; ``undeclared_gpu_containers``,
    ``docker_error`` and ``nvml_error`` are reported by ``observe``.
    """

    model_config = ConfigDict(extra="allow")

    docker: Literal["ok", "error"]
    containers: dict[str, ContainerModel] = Field(default_factory=dict)
    gpus: list[GpuModel] | None = None
    taken_at: str | float | None = None
    elastic: dict[str, int] = Field(default_factory=dict)
    undeclared_gpu_containers: list[UndeclaredModel] = Field(default_factory=list)
    docker_error: str | None = None
    nvml_error: str | None = None
    quiesced: list[str] = Field(default_factory=list)
    unreleased: list[str] = Field(default_factory=list)
    #: serves whose start the controller has in progress -> the roles and MiB reserved
    starting: dict[str, StartingModel] = Field(default_factory=dict)
    started_with: dict[str, StartedWithModel] = Field(default_factory=dict)
    #: serve -> its engine's sleep state (a serve missing here is awake)
    sleep: dict[str, SleepStateModel] = Field(default_factory=dict)
    #: serve -> its requests in flight (serves not listed: no reading)
    in_flight: dict[str, InFlightModel] = Field(default_factory=dict)
    #: serve -> its health path's answer at this observation (serves not listed: not
    #: probed: not running, no port or health path, or a Docker healthcheck says)
    probes: dict[str, Probe] = Field(default_factory=dict)
    #: serve -> whether its engine, one that sleeps by itself (llama.cpp's
    #: --sleep-idle-seconds), said it sleeps now (serves not listed: not asked, or no
    #: answer); the ledger keeps its whole reservation either way
    self_asleep: dict[str, bool] = Field(default_factory=dict)

    def to_observed(self) -> Observed:
        """The pure core's view of this snapshot."""
        return Observed(
            docker_ok=self.docker == "ok",
            containers={
                name: ContainerObs(
                    state=c.state,
                    health=c.health,
                    started_at=epoch_seconds(c.started_at),
                    finished_at=epoch_seconds(c.finished_at),
                    exit_code=c.exit_code,
                    oom_killed=c.oom_killed,
                    gpu_used_mib=c.gpu_used_mib,
                    compose_project=c.compose_project,
                    gpu_role=c.gpu_role,
                )
                for name, c in self.containers.items()
            },
            gpus=None if self.gpus is None else tuple(g.to_obs() for g in self.gpus),
            elastic_mib=dict(self.elastic),
            undeclared_gpu=tuple(u.name for u in self.undeclared_gpu_containers),
            quiesced=frozenset(self.quiesced),
            unreleased=frozenset(self.unreleased),
            starting={
                name: StartingObs(tuple(st.gpu_roles), st.mib) for name, st in self.starting.items()
            },
            started_with={
                name: StartedWith(r.serve, tuple(r.gpu_roles), r.mib)
                for name, r in self.started_with.items()
            },
            sleep={
                name: SleepObs(z.state, z.level, z.residual_mib, z.host_ram_mib)
                for name, z in self.sleep.items()
            },
            in_flight={
                name: InFlightObs(f.count, f.source, f.idle_since, f.busy_at, f.woke_at)
                for name, f in self.in_flight.items()
            },
            probes=dict(self.probes),
            self_asleep=dict(self.self_asleep),
        )

    def taken_at_epoch(self) -> float | None:
        """When the snapshot was taken, in epoch seconds, if it says."""
        return epoch_seconds(self.taken_at)


def parse_snapshot(data: Any, *, source: str = "<snapshot>") -> SnapshotModel:
    """Validate already-decoded JSON; errors name the source and the field path."""
    try:
        return SnapshotModel.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"{source}: {loc}: {err['msg']}")
        raise SnapshotError("\n".join(lines)) from None


def load_snapshot(path: str | Path) -> SnapshotModel:
    """Read and validate a snapshot file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SnapshotError(f"{p}: cannot read observed snapshot: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotError(
            f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    return parse_snapshot(data, source=str(p))


def snapshot_to_json(snapshot: SnapshotModel) -> dict[str, Any]:
    """The JSON form, as ``observe`` prints it."""
    return snapshot.model_dump(mode="json", exclude_none=False)


def snapshot_changes(old: SnapshotModel, new: SnapshotModel, containers: list[str]) -> list[str]:
    """What differs between two snapshots for the named containers, in words.

    Compared: docker readable or not, each container's state and start time, and the
    elastic reservations. Health and GPU figures move on their own and are not compared.
    """
    changes: list[str] = []
    if old.docker != new.docker:
        changes.append(f"docker was {old.docker}, is {new.docker}")
    for name in containers:
        a = old.containers.get(name)
        b = new.containers.get(name)
        sa = a.state if a else ContainerState.ABSENT
        sb = b.state if b else ContainerState.ABSENT
        if sa != sb:
            changes.append(f"{name}: was {sa}, is {sb}")
        elif (
            a is not None
            and b is not None
            and epoch_seconds(a.started_at) != epoch_seconds(b.started_at)
        ):
            changes.append(f"{name}: restarted (started {a.started_at} -> {b.started_at})")
    if old.elastic != new.elastic:
        changes.append(f"elastic reservations were {old.elastic}, are {new.elastic}")
    was = {n: str(z.state) for n, z in old.sleep.items()}
    now = {n: str(z.state) for n, z in new.sleep.items()}
    if was != now:
        changes.append(f"sleep states were {was}, are {now}")
    return changes
