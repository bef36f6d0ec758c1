"""The control loop's state as one value: what the loop and its reconciler hold.

:class:`LoopState` is everything a cycle reads and keeps — the manifest set in force
and its problems, the journal, the serves' records, the starts, the readers of the
host, the event bus, the newest observation — and the answers read from it: the
desired state, the policy and the situation, and the frozen :class:`LoopView` the
interfaces read (``controller.service.loop_port``). :class:`controller.service.loop.Controller`
is this state with the loop around it; :class:`controller.service.reconciler.Reconciler`
runs each cycle over it.

This module must not run a cycle, ask for one, decide what to do (the planner does)
nor touch docker; it opens nothing (the journal is opened by the loop's start).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from controller.adapters.docker.read import ContainerObserver, make_client, open_events
from controller.adapters.health import HealthProber
from controller.adapters.nvml import NvmlApi
from controller.adapters.self_sleep import SelfSleepReader
from controller.manifest import LocatedError, ManifestSet
from controller.service import overlays
from controller.service.changes import ChangeWaiters
from controller.service.docker_events import DockerEvents
from controller.service.events import DriftWatch, EventBus, LedgerWatch, ObservationWatch
from controller.service.failures import FailureBook
from controller.service.footprints import DEFAULT_SETTLE_S, FootprintRecorder
from controller.service.host_reader import HostNotices, HostReader
from controller.service.inflight import InFlightTracker
from controller.service.live import LiveLedger
from controller.service.loop_port import JournalHistory, LoopView
from controller.service.manifest_reread import RouterNotice
from controller.service.records import FieldMap, MarkSet, RecordStore
from controller.service.restore_times import RestoreBook
from controller.service.start_outcomes import StartOutcomes
from controller.service.starts import StartTracker
from controller.service.view_sources import CycleSummary, ViewSources, loop_view
from controller.service.watch import QUIET_MS
from controller.snapshot import SnapshotModel
from controller.store.journal import Journal, default_state_dir
from statemachine.answers.situation import Situation
from statemachine.domain.types import DesiredState, Observed, OnDemandRequest
from statemachine.lifecycle import backoff
from statemachine.lifecycle.backoff import Backoff
from statemachine.planning.plan_types import (
    Policy,
)
from statemachine.planning.restore_cost import RestoreEstimate


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything ``vramctl run`` was given."""

    manifests: tuple[Path, ...]
    state_dir: Path | None = None
    dry_run: bool = False
    resync_s: float = 5.0
    debounce_ms: int = 300
    #: a manifest edit is read once its files were quiet this long (see service.watch)
    settle_ms: int = QUIET_MS
    router_url: str | None = None
    router_token_file: Path | None = None
    backoff_base_s: float = backoff.DEFAULT_BASE_S
    backoff_cap_s: float = backoff.DEFAULT_CAP_S
    #: seconds after a start is healthy before its footprint's steady reading
    settle_s: float = DEFAULT_SETTLE_S


@dataclass
class LoopState:
    """What the loop holds: its parts and what it learned, read and kept by each cycle."""

    options: RunOptions
    mset: ManifestSet
    state_dir: Path = field(init=False)
    journal: Journal = field(init=False)
    manifest_error: list[str] = field(default_factory=list)
    #: the same problems, located (the API shows readers without the token only where)
    manifest_issues: list[LocatedError] = field(default_factory=list)
    last: CycleSummary = field(default_factory=CycleSummary)
    cycles: int = 0
    #: the NVML binding the loop reads (``None``: ``pynvml``; tests script one)
    nvml: NvmlApi | None = None

    def __post_init__(self) -> None:
        #: one record per serve: its lifecycle state (kept in the journal once ``run``
        #: opens it) and the marks below, which are views of the records
        self.serve_records = RecordStore(journal_of=lambda: getattr(self, "journal", None))
        self.state_dir = self.options.state_dir or default_state_dir(list(self.options.manifests))
        self.stop_event = threading.Event()
        #: the manifest files changed since they were last read (the next cycle reads them)
        self.manifest_dirty = False
        #: the asyncio loop the controller runs on (``None`` until it runs)
        self.aio: asyncio.AbstractEventLoop | None = None
        #: the starts in progress, carried out beside the loop (see controller.service.starts)
        self.starts = StartTracker()
        #: requests in flight per serve, and since when each has been idle
        self.in_flight = InFlightTracker()
        #: the cold starts and wakes this loop (and earlier ones, in the journal) timed
        self.restore_times = RestoreBook(lambda: getattr(self, "journal", None))
        self.prober = HealthProber()  # each observation's health probes (status, page)
        #: asks engines that sleep by themselves whether they sleep (status, page)
        self.self_sleep = SelfSleepReader()
        #: asks the health probes and the self-sleep states beside the rest of an observation
        self.readers = ThreadPoolExecutor(2, thread_name_prefix="observe")
        self.host = HostReader(ContainerObserver)  # the loop's readers of the host
        self.notices, self.router_notice = HostNotices(), RouterNotice()
        self.start_outcomes = StartOutcomes()  # the handed-off starts' outcomes, by cycle
        #: what the loop does, as numbered events (GET /v1/events); ids start past any
        #: an earlier controller issued (its start time in ms), see controller.service.events
        self.events = EventBus(first_id=int(time.time() * 1000))
        self.ledger_watch = LedgerWatch(self.events)
        self.watch = ObservationWatch(self.ledger_watch, DriftWatch(self.events))
        #: measures the starts and stops this loop carries out (set up by ``run``)
        self.footprints: FootprintRecorder | None = None
        #: what the executor did and holds since each observation (read by the view)
        self.live = LiveLedger()
        self.changes = ChangeWaiters(lambda: self.aio)  # who waits for the state to change
        self.live.listen(self.changes.changed_threadsafe)
        #: the newest observation: (snapshot, when, its live-ledger mark)
        self.seen: tuple[SnapshotModel, float, int] | None = None
        self.overlays = overlays.JournalOverlays()  # the journal's records on each observation
        #: Docker's event stream, filtered to the containers the loop observes
        self.docker_events = DockerEvents(
            make_client, open_events, self.host.touch, self.stop_event
        )

    # --------------------------------------------------- the records' marks
    @property
    def backoff(self) -> FieldMap[Backoff]:
        """Serve -> its failure backoff (the records' ``backoff``)."""
        return self.serve_records.backoff

    @property
    def no_shrink(self) -> MarkSet:
        """Elastic serves whose shrink failed: evicted instead, until they stop."""
        return self.serve_records.no_shrink

    @property
    def no_sleep(self) -> MarkSet:
        """Serves whose engine has no sleep API (404) or whose last sleep did not confirm:
        stopped instead of put to sleep until they start again or the manifest changes."""
        return self.serve_records.no_sleep

    @property
    def failures(self) -> FailureBook:
        """The failure bookkeeping over the records, with this loop's backoff options."""
        o = self.options
        return FailureBook(self.serve_records, o.backoff_base_s, o.backoff_cap_s)

    # ------------------------------------------------------------- the answers
    def requests(self) -> tuple[OnDemandRequest, ...]:
        """The on-demand requests as the planner sees them (none before the journal is
        open: a controller that has not started has recorded none)."""
        journal = getattr(self, "journal", None)
        return () if journal is None else tuple(journal.active_requests())

    def desired(self, requests: tuple[OnDemandRequest, ...] | None = None) -> DesiredState:
        """The desired state: the last good manifest set plus ``requests`` (default: the
        requests recorded now)."""
        asked = self.requests() if requests is None else requests
        return replace(self.mset.desired(), requests=asked)

    def policy(self, now: float) -> Policy:
        """The planner policy: backoff holds, serves whose shrink failed or that cannot
        sleep, what bringing each serve back costs and when each was last used."""
        return self.situation_for(Observed(docker_ok=False), now).policy

    def situation_for(
        self,
        observed: Observed,
        now: float,
        requests: tuple[OnDemandRequest, ...] | None = None,
    ) -> Situation:
        """The loop's situation: the desired state with ``requests`` (default: those
        recorded now), ``observed``, the whole policy as of ``now``
        (:meth:`Situation.of`), the serves' records."""
        desired = self.desired(requests)
        return Situation.of(
            desired,
            observed,
            now,
            measured=self.restore_times.measured(desired.serves),
            busy_at=self.in_flight.last_busy(),
            uses=self.in_flight.uses(),
            no_shrink=self.no_shrink,
            no_sleep=self.no_sleep,
            hold=backoff.holds(self.backoff, now),
            records=self.serve_records.snapshot(),
            router=bool(self.options.router_url),
        )

    def situation(self) -> Situation:
        """The live situation the answers are given from: the newest observation with
        what the executor did since (``LoopView.observed``), as of now."""
        view = self.view()
        now = time.time()
        observed = view.observed() or Observed(docker_ok=False)
        return replace(self.situation_for(observed, now), records=view.records)

    def restore_estimates(self) -> dict[str, RestoreEstimate]:
        """Each serve's reload cost and its basis (measured, declared; the serves with
        neither are absent), over the manifest in force (``status``)."""
        reload = self.situation_for(Observed(docker_ok=False), time.time()).reload
        return dict(reload or {})

    def history(self) -> JournalHistory:
        """The journal's recorded cycles, read only (the operator's page lists them)."""
        return self.journal

    def view(self) -> LoopView:
        """What the loop knows now, as a frozen copy (what the interfaces read)."""
        return loop_view(
            ViewSources(
                self.last,
                self.seen,
                self.cycles,
                self.mset,
                self.manifest_error,
                self.manifest_issues,
                self.backoff,
                self.no_shrink,
                self.options.dry_run,
                bool(self.options.router_url),
                self.footprints,
                self.live,
                self.serve_records,
            )
        )
