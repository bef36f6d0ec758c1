"""A situation from a snapshot and the state directory's journal (docs/design.md).

The running loop builds its :class:`~statemachine.answers.situation.Situation` from what it
holds (``Controller.situation``). Everything that answers without the loop — ``vramctl
status``, ``fit``, ``plan``, ``apply``, ``replay`` and the stdio MCP server — builds it
here, from one observation and the journal the loop keeps (read only): the requests,
the card each container was started on, the sleepers, the elastic reserves, the
quiesced tiers, the measured reload costs and the last policy the loop planned with
(its no-shrink and no-sleep serves, when each serve was last used). The journal's
records are laid over the observation by the same rules the loop applies
(``controller/service/overlays.py``), without writing anything.

Where the journal cannot be read, the situation says so in ``notes`` and what was
assumed instead (no request, no record: a placed serve running is counted on the card
its container's environment names, else on every candidate). Backoff holds live in
the loop's memory only: they are not here.

This module reads; it must not write the journal, plan or act on a container.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from controller.manifest import ManifestSet
from controller.service.overlay_rules import elastic_kept, started_models, started_records
from controller.snapshot import SnapshotModel
from controller.store.journal import (
    Journal,
    JournalError,
    SleepRecord,
    StateDirError,
    journal_to_read,
)
from statemachine.answers.situation import Situation
from statemachine.domain.types import OnDemandRequest, StartedWith
from statemachine.planning.restore_cost import measured_from

__all__ = ["JournalRecords", "read_journal", "snapshot_situation", "taken_at"]


@dataclass(frozen=True, slots=True)
class JournalRecords:
    """What the loop's journal holds that an answer needs (read once)."""

    requests: tuple[OnDemandRequest, ...] = ()
    started: Mapping[str, StartedWith] = field(default_factory=dict)
    declared: Mapping[str, StartedWith] = field(default_factory=dict)
    sleeping: Mapping[str, SleepRecord] = field(default_factory=dict)
    elastic: Mapping[str, int] = field(default_factory=dict)
    elastic_set_at: Mapping[str, float] = field(default_factory=dict)
    quiesced: tuple[str, ...] = ()
    restore_times: Mapping[str, Mapping[str, list[float]]] = field(default_factory=dict)
    #: the policy of the newest recorded cycle (``Policy.to_json()``), if any
    policy: Mapping[str, Any] | None = None


def read_journal(state_dir: Path) -> tuple[JournalRecords | None, str | None]:
    """The journal's records in ``state_dir`` (read only), or ``None`` and why not
    (``None`` and no reason: there is no journal, no controller ran there)."""
    try:
        path = journal_to_read(state_dir)
    except StateDirError as exc:
        return None, str(exc)
    if path is None:
        return None, None
    try:
        with Journal.open(path, readonly=True) as j:
            ids = j.cycle_ids()
            last = j.cycles(cycle=ids[-1]) if ids else []
            return JournalRecords(
                requests=tuple(j.active_requests()),
                started=j.started(),
                declared=j.declared(),
                sleeping=j.sleeping(),
                elastic=j.elastic(),
                elastic_set_at=j.elastic_set_at(),
                quiesced=tuple(j.quiesced()),
                restore_times=j.restore_times(),
                policy=last[-1].policy if last else None,
            ), None
    except JournalError as exc:  # it names the file
        return None, str(exc)
    except OSError as exc:
        return None, f"{path}: {exc}"


def taken_at(snap: SnapshotModel) -> float:
    """When ``snap`` was observed (epoch s); now when it does not say."""
    taken = snap.taken_at_epoch()
    return taken if taken is not None else time.time()


def snapshot_situation(
    mset: ManifestSet,
    snap: SnapshotModel,
    records: JournalRecords | None,
    *,
    unread: str | None = None,
    router: bool = True,
) -> Situation:
    """The situation of ``snap`` with the journal's ``records`` laid over it (``None``:
    none could be read; ``unread`` says why, for the notes). ``router``: whether the
    controller that would carry it out has a router."""
    desired = mset.desired()
    notes: list[str] = []
    if records is None:
        records = JournalRecords()
        if unread is not None:
            notes.append(_unread_note(unread))
    snap = _overlaid(mset, snap, records)
    requests = tuple(r for r in records.requests if r.serve in desired.serves)
    desired = replace(desired, requests=requests)
    measured = {
        n: m for n, m in measured_from(records.restore_times).items() if n in desired.serves
    }
    recorded = records.policy or {}
    serves = set(desired.serves)
    return Situation.of(
        desired,
        snap.to_observed(),
        taken_at(snap),
        measured=measured,
        busy_at=_floats(recorded.get("last_used")),
        uses=_uses(recorded.get("uses")),
        no_shrink=serves & set(recorded.get("no_shrink", ())),
        no_sleep=serves & set(recorded.get("no_sleep", ())),
        router=router,
        notes=notes,
    )


def _overlaid(mset: ManifestSet, snap: SnapshotModel, records: JournalRecords) -> SnapshotModel:
    """``snap`` with the journal's records in force laid over it, as the loop lays them
    (a field the snapshot already carries, a saved loop's observation, is kept). The
    sleepers are laid over as the host is observed (their engines are asked then:
    ``controller.service.sleeping.observe_sleep``)."""
    desired = mset.desired()
    update: dict[str, Any] = {}
    if not snap.started_with:
        found = started_records(desired, snap, records.started, records.declared)
        update["started_with"] = started_models(found.applied(records.started))
    if not snap.elastic and records.elastic:
        update["elastic"], _void = elastic_kept(records.elastic, records.elastic_set_at, mset, snap)
    if not snap.quiesced and records.quiesced:
        update["quiesced"] = sorted(records.quiesced)
    return snap.model_copy(update=update) if update else snap


def _floats(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}


def _uses(value: Any) -> dict[str, list[float]]:
    """The uses the loop's last cycle counted (none recorded: an older loop, or none
    ran; the one-shot answer then counts none, as a loop just begun does)."""
    if not isinstance(value, Mapping):
        return {}
    return {
        str(k): [float(t) for t in v if isinstance(t, int | float)]
        for k, v in value.items()
        if isinstance(v, list)
    }


def _unread_note(why: str) -> str:
    return (
        f"the journal could not be read ({why}): the requests, the card each placed serve "
        "was started on, sleepers and elastic reserves are unknown here; assumed none (a "
        "placed serve found running is counted on the card its container's environment "
        "names, else on every candidate)"
    )
