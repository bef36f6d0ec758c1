"""The rules by which the journal's records are laid over an observation (pure).

The loop applies them and keeps the journal true to them
(:mod:`controller.service.overlays`); a reader of the journal (the command line, the
stdio MCP server: :mod:`controller.service.situation`) applies the same rules without
writing anything. Nothing here touches the journal, Docker or an engine: this module
imports no adapter, so the answering commands load none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.manifest import ManifestSet
from controller.snapshot import SnapshotModel, StartedWithModel, epoch_seconds
from statemachine.domain.types import DesiredState, ServeSpec, StartedWith

#: the container states that hold a reservation
HOLDING = ("running", "paused", "restarting")


@dataclass(frozen=True, slots=True)
class StartedRecords:
    """What an observation does to the journal's start records (:func:`started_records`)."""

    #: containers whose record ends: docker shows them stopped or gone
    dropped: tuple[str, ...] = ()
    #: containers found holding memory without a record, with the reservation they hold
    added: dict[str, StartedWith] = field(default_factory=dict)

    def applied(self, records: Mapping[str, StartedWith]) -> dict[str, StartedWith]:
        """``records`` as they stand after this observation."""
        kept = {c: r for c, r in records.items() if c not in self.dropped}
        return {**kept, **self.added}


def started_records(
    desired: DesiredState,
    snap: SnapshotModel,
    records: Mapping[str, StartedWith],
    known: Mapping[str, StartedWith] | None = None,
) -> StartedRecords:
    """The rule of the start records, the same for the loop (which journals it) and for
    a reader of the journal (the CLI, which does not). Nothing touched here.

    A container keeps the reservation it was started with until it stops, whatever
    the manifest says now (an edit, a file caught mid-write): its record ends only once
    docker shows the container stopped or gone. A declared container found running
    without a record (started before this controller, or by hand) holds its declared
    reservation, unless its start is in progress (its own end records it, on the roles
    it reserved), on the card(s) its container's environment names (``VRAMCTL_GPU_ROLE``,
    what its ``up`` was told) when each is a declared role, else on its declared roles
    (a placed serve's: every candidate) and any card it names. A container no manifest
    in force declares, found running without a record, holds the last reservation a
    manifest declared for it (``known``). With docker unreadable nothing ends and nothing is found.
    """
    if snap.docker != "ok":
        return StartedRecords()
    dropped = tuple(
        container
        for container in records
        if (c := snap.containers.get(container)) is None or c.state not in HOLDING
    )
    declared = {s.container: s for s in desired.serves.values()}
    candidates = {
        container: StartedWith(spec.name, _told_roles(spec, snap, desired), spec.vram_mib)
        for container, spec in declared.items()
        if spec.vram_mib is not None and desired.in_ledger(spec) and spec.name not in snap.starting
    }
    candidates.update(
        {c: _told_known(r, snap, c) for c, r in (known or {}).items() if c not in declared}
    )
    added = {
        container: rec
        for container, rec in candidates.items()
        if container not in records
        and (c := snap.containers.get(container)) is not None
        and c.state in HOLDING
    }
    return StartedRecords(dropped, added)


def _told_roles(spec: ServeSpec, snap: SnapshotModel, desired: DesiredState) -> tuple[str, ...]:
    """The roles a declared container found running holds: the card(s) its environment
    says it was made for, where each is a role the manifest declares (a re-pinned serve's
    old card, or one that left a placed serve's ``placement``, included: the container
    runs where it was made); else its declared roles, and beside them any card it names
    that no row declares (never less than the truth)."""
    told = _told(snap, spec.container)
    if told and all(r in desired.roles for r in told):
        return told
    return tuple(dict.fromkeys(told + spec.gpu_roles))


def _told(snap: SnapshotModel, container: str) -> tuple[str, ...]:
    """The card(s) the container's environment names (``VRAMCTL_GPU_ROLE``); ``()``: none."""
    c = snap.containers.get(container)
    return tuple(c.gpu_role.split(",")) if c is not None and c.gpu_role else ()


def _told_known(rec: StartedWith, snap: SnapshotModel, container: str) -> StartedWith:
    """The last declared reservation of a container no manifest declares now, on the
    card(s) its environment names where those are among the roles declared (a placed
    serve's were every candidate), else on those and the ones it names."""
    told = _told(snap, container)
    if told and not set(told) - set(rec.gpu_roles):
        return StartedWith(rec.serve, told, rec.mib)
    return StartedWith(rec.serve, tuple(dict.fromkeys(rec.gpu_roles + told)), rec.mib)


def started_models(records: Mapping[str, StartedWith]) -> dict[str, StartedWithModel]:
    """The records as the snapshot carries them."""
    return {
        c: StartedWithModel(serve=r.serve, gpu_roles=list(r.gpu_roles), mib=r.mib)
        for c, r in records.items()
    }


def elastic_kept(
    reserves: Mapping[str, int],
    set_at: Mapping[str, float],
    mset: ManifestSet,
    snap: SnapshotModel,
) -> tuple[dict[str, int], tuple[str, ...]]:
    """The elastic reserves still in force, and the serves whose reserve is void.

    An engine forgets its reserve when its server restarts (a crash, a restart
    policy, a manual ``docker restart``): a container that is down, or that started
    after the reserve was asked for, holds its full reservation again. Nothing touched.
    """
    out: dict[str, int] = {}
    void: list[str] = []
    for name, mib in reserves.items():
        spec = mset.serves.get(name)
        c = snap.containers.get(spec.container) if spec is not None else None
        started = _epoch_or_none(c.started_at) if c is not None else None
        if (
            c is None
            or c.state != "running"
            or (started is not None and started > set_at.get(name, 0.0))
        ):
            void.append(name)
        else:
            out[name] = mib
    return out, tuple(void)


def _epoch_or_none(value: str | float | None) -> float | None:
    try:
        return epoch_seconds(value)
    except ValueError:
        return None
