"""What the control loop's frozen view is made of, and the view made from it (see
service.loop_port).

:class:`CycleSummary` is what the last cycle saw and did; :func:`loop_view` makes the
:class:`controller.service.loop_port.LoopView` the interfaces read from it, the newest
observation (which may be newer than the last cycle's), the manifest in force, the
backoff, the footprints and the models' estimates (read again only when
their files change). Every input is given explicitly; the view is a copy.

This module must not change the loop's state, decide or touch the host.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from controller.manifest import LocatedError, ManifestSet
from controller.service.executor import ExecutionReport
from controller.service.footprints import FootprintRecorder
from controller.service.live import LiveLedger
from controller.service.loop_port import BackoffView, LoopView
from controller.service.model_estimates import serve_models
from controller.service.records import RecordStore
from controller.snapshot import SnapshotModel
from statemachine.lifecycle.backoff import Backoff
from statemachine.planning.plan_types import Plan


@dataclass
class CycleSummary:
    """What the last cycle saw and did (the interfaces read it through ``view()``)."""

    at: float = 0.0
    reasons: tuple[str, ...] = ()
    plan: Plan | None = None
    report: ExecutionReport | None = None
    snapshot: SnapshotModel | None = None
    duration_s: float = 0.0
    executed: bool = False


@dataclass(frozen=True, slots=True)
class ViewSources:
    """What the view is made of, as the loop holds it at one moment."""

    last: CycleSummary
    #: the newest observation: (snapshot, when, its live-ledger mark)
    seen: tuple[SnapshotModel, float, int] | None
    cycles: int
    mset: ManifestSet
    manifest_errors: list[str]
    manifest_issues: list[LocatedError]
    backoff: Mapping[str, Backoff]
    no_shrink: Collection[str]
    dry_run: bool
    router: bool
    footprints: FootprintRecorder | None
    live: LiveLedger
    records: RecordStore


def loop_view(src: ViewSources) -> LoopView:
    """What the loop knows now, as a frozen copy (what the interfaces read)."""
    last = src.last
    snapshot, observed_at, mark = last.snapshot, last.at, -1
    if src.seen is not None and (last.snapshot is None or src.seen[1] >= last.at):
        snapshot, observed_at, mark = src.seen
    footprints = footprint_summary(src.footprints, src.mset)
    measured = {n: f["measured_mib"] for n, f in footprints.items()}
    return LoopView(
        at=last.at,
        duration_s=last.duration_s,
        snapshot=snapshot,
        plan=last.plan,
        report=last.report,
        executed=last.executed,
        cycles=src.cycles,
        desired=src.mset.desired(),
        manifest_digest=src.mset.digest,
        manifest_errors=tuple(src.manifest_errors),
        manifest_issues=tuple(src.manifest_issues),
        backoff=MappingProxyType(
            {
                name: BackoffView(b.failures, b.until, b.last_failure)
                for name, b in src.backoff.items()
            }
        ),
        no_shrink=frozenset(src.no_shrink),
        dry_run=src.dry_run,
        router=src.router,
        footprints=MappingProxyType(footprints),
        models=MappingProxyType(serve_models(src.mset, measured)),
        observed_at=observed_at if snapshot is not None else None,
        live=src.live.overlay(mark),
        records=src.records.snapshot(),
    )


def footprint_summary(
    footprints: FootprintRecorder | None, mset: ManifestSet
) -> dict[str, dict[str, Any]]:
    """Declared vs measured per serve, from the journal's samples."""
    if footprints is None:
        return {}
    return {n: f.to_json() for n, f in footprints.summary(mset.desired()).items()}
