"""The read-only view of the control loop that the interfaces (HTTP API, metrics) read.

The loop (:class:`controller.service.loop.Controller`) keeps mutable state: the last
cycle, the manifest set in force, the backoff of each serve. The interfaces never read
those fields: they ask :meth:`LoopPort.view` for a :class:`LoopView`, a frozen copy of
what the loop knows at that moment (as of its last cycle, plus what it has learned
since: a reloaded manifest, a start that ended), and they change the loop's state only
through :meth:`LoopPort.request_up` / :meth:`LoopPort.request_down`. On-demand requests
are read live from the journal (:meth:`LoopPort.requests`), so a request the API just
recorded shows at once; the recorded cycles through :meth:`LoopPort.history`, read only.

Live answers: ``snapshot`` is the newest observation (taken at the start of the cycle
that runs now, or of the last one), and ``live`` what the executor has done and holds
since (:mod:`controller.service.live`): :meth:`LoopView.observed` lays one over the
other, so an answer given while a plan runs counts what that plan has reserved or
started. Interfaces answer from :meth:`LoopView.observed`, never from the snapshot
alone, and say when it was taken (``observed_at``) and which steps are in flight.

Nothing here decides or mutates anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.manifest import LocatedError
from controller.service.executor import ExecutionReport
from controller.service.live import Overlay, StepEnded, overlay_observed
from controller.snapshot import SnapshotModel
from controller.store.journal import CycleRecord, StepRecord
from statemachine.answers.situation import Situation
from statemachine.domain.types import DesiredState, Observed, OnDemandRequest
from statemachine.lifecycle.serve_record import ServeRecord
from statemachine.planning.plan_types import Plan
from statemachine.planning.restore_cost import RestoreEstimate


@dataclass(frozen=True, slots=True)
class BackoffView:
    """One serve's failure backoff: how many failures, the last, when it may be tried."""

    failures: int
    until: float
    last_failure: str


@dataclass(frozen=True, slots=True)
class LoopView:
    """What the loop knows at one moment; read-only."""

    #: the last cycle: when it observed (epoch s), how long it took, what it saw and did;
    #: ``snapshot`` is ``None`` before the first cycle
    at: float
    duration_s: float
    snapshot: SnapshotModel | None
    plan: Plan | None
    report: ExecutionReport | None
    executed: bool
    #: cycles run since the loop started
    cycles: int
    #: the manifest set in force (its desired state without requests, and its digest)
    desired: DesiredState
    manifest_digest: str
    #: the problems of the last edit that did not load (the set above stays in force)
    manifest_errors: tuple[str, ...]
    manifest_issues: tuple[LocatedError, ...]
    #: serve -> its backoff; elastic serves whose shrink failed
    backoff: Mapping[str, BackoffView]
    no_shrink: frozenset[str]
    dry_run: bool
    #: whether ``run`` was given a router (``--router-url``): without one no router
    #: tier can be drained, and the API refuses what would need it
    router: bool
    #: serve -> declared vs measured (``statemachine.sizing.footprint.Footprint.to_json()``)
    footprints: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: serve -> its ``[serve.model]`` estimate beside the reservation and the footprint
    #: (``controller.service.model_estimates.serve_models``)
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: when ``snapshot`` was observed (epoch s; ``None`` before the first observation)
    observed_at: float | None = None
    #: what the executor did and holds since that observation, and its steps in flight
    live: Overlay = field(default_factory=Overlay)
    #: serve -> its record (``statemachine.lifecycle.serve_record``): its lifecycle state as last
    #: moved
    records: Mapping[str, ServeRecord] = field(default_factory=dict)

    def observed(self) -> Observed | None:
        """The observation with what the executor did since laid over it (live).

        ``None`` before the first observation. This, not ``snapshot`` alone, is what
        an answer counts: it never counts less than may be held.
        """
        if self.snapshot is None:
            return None
        containers = {s.name: s.container for s in self.desired.serves.values()}
        return overlay_observed(self.snapshot.to_observed(), self.live, containers)


class JournalHistory(Protocol):
    """The journal's recorded cycles, read only (what the operator's page shows)."""

    def cycle_ids(self) -> list[int]:
        """The ids of every recorded cycle, oldest first."""
        ...

    def cycles(self, since_id: int | None = None, cycle: int | None = None) -> list[CycleRecord]:
        """Recorded cycles, oldest first."""
        ...

    def steps(self, cycle_id: int) -> list[StepRecord]:
        """One cycle's step outcomes."""
        ...


class LoopPort(Protocol):
    """What an interface may ask of the loop."""

    def history(self) -> JournalHistory:
        """The journal's recorded cycles (read only)."""
        ...

    def view(self) -> LoopView:
        """The loop's state now, as a frozen copy."""
        ...

    def requests(self) -> tuple[OnDemandRequest, ...]:
        """The on-demand requests in force (from the journal)."""
        ...

    def desired(self) -> DesiredState:
        """The desired state: the manifest set in force plus the requests."""
        ...

    def restore_estimates(self) -> dict[str, RestoreEstimate]:
        """Each serve's reload cost and its basis (the serves with no figure absent)."""
        ...

    def situation(self) -> Situation:
        """The live situation every answer is given from (the loop's desired state and
        whole policy, the newest observation with what the executor did since, now)."""
        ...

    def request_up(self, serve: str, ttl_s: float | None) -> None:
        """Record an on-demand request and ask for a cycle."""
        ...

    def request_down(self, serve: str) -> bool:
        """End a serve's on-demand request; True when there was one."""
        ...

    def steps_since(self, since: float, group: str) -> list[StepEnded]:
        """The steps of plan group ``group`` that ended at or after ``since`` (epoch s)."""
        ...

    async def wait_change(self, timeout_s: float) -> bool:
        """Wait until the loop's state changes or ``timeout_s`` passes; True if it did."""
        ...
