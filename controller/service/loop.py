"""The control loop behind ``vramctl run``: one reconcile at a time, level-triggered.

Triggers — a manifest edit (the manifests' folders are watched, so editors that save
by rename are seen; an edit is read once its writes settle), an event of an observed
container from Docker's event stream (filtered to those containers by name and id,
refreshed when they change), the end of a failure backoff's hold, the periodic resync,
an on-demand request — only *ask* for a cycle; requests arriving during a cycle
coalesce into one more. A cycle re-reads everything: the manifest set (an edit that
does not validate is reported with its located errors and the last good desired state
stays in force), the host (docker + NVML), the on-demand requests and elastic
reserves from the journal; then it plans, executes (or, with ``--dry-run``, only
logs), and journals the cycle.

Failure handling: a serve whose start fails, or whose container keeps dying, is held
back with an exponential backoff (capped) that the planner reports as blocked; the
first death after a healthy run is tried again at once (``statemachine/backoff.py``),
and the loop wakes itself when a hold ends. With docker unreadable the planner fails
closed, so nothing is started or stopped.

Restart safety: a single-instance lock on the state directory; on start, the view is
rebuilt from the host, never from memory, so nothing is started twice and no
reservation is counted twice. Each serve's record (``controller/service/records.py``:
its lifecycle state, kept in the journal, and the loop's marks of it) is loaded and
moved on by every observation; the executor takes its machines from it. SIGTERM /
SIGINT stop the loop after the current step.

:class:`Controller` holds the loop's state, its public face (triggers, requests, the
view) and the failure bookkeeping; its parts live beside it: :class:`_LoopCycle` (one
cycle's steps, for :func:`controller.service.cycle.run_cycle`) and :class:`_LoopLife`
(the loop's start, main loop and shutdown) here, and in modules of their own the Docker
event source (``docker_events``), the manifest watch and re-read (``manifest_reload``),
the host readers (``host_reader``), the journal's overlays on each observation
(``overlays``), the detached starts' outcomes (``start_outcomes``), the tiers left
quiesced (``tiers``), the change waits (``changes``) and the view (``loop_view``).

This module must not decide what to do (the planner does) nor touch docker except
through the adapters and the executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import threading
import time
from collections.abc import Callable, Collection, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loguru import logger

from controller.adapters import health
from controller.adapters.docker.read import (
    ContainerObserver,
    make_client,
    open_events,
)
from controller.adapters.health import HealthProber
from controller.adapters.nvml import NvmlApi
from controller.adapters.self_sleep import SelfSleepReader
from controller.adapters.sleep import SleepClient
from controller.manifest import LocatedError, ManifestSet
from controller.service import overlays, tiers
from controller.service.changes import ChangeWaiters
from controller.service.cycle import CycleJournal, CycleResult, run_cycle
from controller.service.docker_events import DockerEvents
from controller.service.events import (
    DriftWatch,
    EventBus,
    LedgerWatch,
    ObservationWatch,
)
from controller.service.executor import ExecutionReport, Executor, Outcome, StepResult
from controller.service.failures import FailureBook
from controller.service.footprints import DEFAULT_SETTLE_S, FootprintRecorder, Reading
from controller.service.host_reader import HostNotices, HostReader
from controller.service.inflight import InFlightTracker, observe_in_flight
from controller.service.live import LiveLedger, StepEnded
from controller.service.loop_view import CycleSummary, ViewSources, loop_view
from controller.service.manifest_reload import RouterNotice, read_manifests, watch_manifests
from controller.service.observe import observe_probes, observe_self_sleep
from controller.service.records import FieldMap, MarkSet, RecordStore
from controller.service.reloads import ReloadBook
from controller.service.start_outcomes import StartOutcomes
from controller.service.starts import StartTracker, supervise_orphans
from controller.service.view import JournalHistory, LoopView
from controller.service.watch import QUIET_MS
from controller.service.wiring import make_executor, read_gpus
from controller.snapshot import SnapshotModel, StartedWithModel, StartingModel
from controller.store.journal import (
    AlreadyRunning,
    Journal,
    StateDirError,
    StateLock,
    default_state_dir,
    journal_path,
)
from statemachine import backoff
from statemachine.backoff import Backoff
from statemachine.idleness import in_force
from statemachine.ledger import Ledger
from statemachine.pending import asked_as_of
from statemachine.planner import Action, Plan, Policy
from statemachine.reload import (
    ReloadEstimate,
)
from statemachine.situation import Situation
from statemachine.types import (
    DesiredState,
    Observed,
    OnDemandRequest,
)

__all__ = ["Backoff", "Controller", "CycleSummary", "RunOptions"]

#: the loop's wake-up comes this long after a backoff hold's end (seconds): the cycle it
#: asks for reads the clock again, and must find the hold over
_HOLD_MARGIN_S = 0.01


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
class Controller:
    """The loop's state. Create, then ``await run()``."""

    options: RunOptions
    mset: ManifestSet
    state_dir: Path = field(init=False)
    journal: Journal = field(init=False)
    manifest_error: list[str] = field(default_factory=list)
    #: the same problems, located (the API shows readers without the token only where)
    manifest_issues: list[LocatedError] = field(default_factory=list)
    last: CycleSummary = field(default_factory=CycleSummary)
    cycles: int = 0
    on_cycle: list[Callable[[Controller], None]] = field(default_factory=list)
    #: coroutines run beside the loop for its lifetime (the HTTP API), cancelled at stop
    services: list[Callable[[Controller], Coroutine[Any, Any, None]]] = field(default_factory=list)
    #: the NVML binding the loop reads (``None``: ``pynvml``; tests script one)
    nvml: NvmlApi | None = None

    def __post_init__(self) -> None:
        #: one record per serve: its lifecycle state (kept in the journal once ``run``
        #: opens it) and the marks below, which are views of the records
        self.serve_records = RecordStore()
        self.state_dir = self.options.state_dir or default_state_dir(list(self.options.manifests))
        self.stop_event = threading.Event()
        self._wake = asyncio.Event()
        self._reasons: list[str] = []
        self._manifest_dirty = False
        self._lock = StateLock(self.state_dir)
        self._executor: Executor | None = None
        self._stale_executor: Executor | None = None  # the last manifest's: its connections
        self._stopping = False
        self._last_dry_plan = ""  # a dry run journals and logs a plan once, not every cycle
        self._hold_timer: asyncio.TimerHandle | None = None  # wakes the loop at a hold's end
        #: the starts in progress, carried out beside the loop (see controller.service.starts)
        self.starts = StartTracker()
        #: requests in flight per serve, and since when each has been idle
        self.in_flight = InFlightTracker()
        #: the cold starts and wakes this loop (and earlier ones, in the journal) timed
        self.reloads = ReloadBook(lambda: getattr(self, "journal", None))
        self.prober = HealthProber()  # each observation's health probes (status, page)
        #: asks engines that sleep by themselves whether they sleep (status, page)
        self.self_sleep = SelfSleepReader()
        #: asks the health probes and the self-sleep states beside the rest of an observation
        self.readers = ThreadPoolExecutor(2, thread_name_prefix="observe")
        self.host = HostReader(ContainerObserver)  # the loop's readers of the host
        self._notices, self._router_notice = HostNotices(), RouterNotice()
        self.start_outcomes = StartOutcomes()  # the handed-off starts' outcomes, by cycle
        self._aio: asyncio.AbstractEventLoop | None = None
        #: what the loop does, as numbered events (GET /v1/events); ids start past any
        #: an earlier controller issued (its start time in ms), see controller.service.events
        self.events = EventBus(first_id=int(time.time() * 1000))
        self._ledger_watch = LedgerWatch(self.events)
        self._watch = ObservationWatch(self._ledger_watch, DriftWatch(self.events))
        #: measures the starts and stops this loop carries out (set up by ``run``)
        self.footprints: FootprintRecorder | None = None
        #: what the executor did and holds since each observation (read by the view)
        self.live = LiveLedger()
        self.changes = ChangeWaiters(lambda: self._aio)  # who waits for the state to change
        self.live.listen(self.changes.changed_threadsafe)
        self._mark = 0  # the live ledger's mark of the observation being taken
        #: the requests recorded when the observation being taken began (asked_as_of)
        self._asked_then: tuple[OnDemandRequest, ...] = ()
        #: the newest observation: (snapshot, when, its live-ledger mark)
        self._seen: tuple[SnapshotModel, float, int] | None = None
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
    def _quiesced(self) -> MarkSet:
        """Serves whose tier this controller may have left quiesced."""
        return self.serve_records.quiesced

    @_quiesced.setter
    def _quiesced(self, value: Collection[str]) -> None:  # ``|=`` lands here
        _assign(self.serve_records.quiesced, value)

    @property
    def _unreleased(self) -> MarkSet:
        """Serves stopped whose memory NVML has not shown back yet."""
        return self.serve_records.unreleased

    @property
    def _stopped_by_us(self) -> FieldMap[float | None]:
        """Serve -> ``started_at`` of the container this process stopped (not a crash)."""
        return self.serve_records.stopped_by_us

    @property
    def _ran_healthy(self) -> FieldMap[float]:
        """Serve -> ``started_at`` of its container last seen running healthy."""
        return self.serve_records.ran_healthy

    # ------------------------------------------------------------------ triggers
    def trigger(self, reason: str) -> None:
        """Ask for a cycle (coalesced with any other pending request)."""
        self._reasons.append(reason)
        self._wake.set()

    def request_up(self, serve: str, ttl_s: float | None) -> None:
        """Record an on-demand request (durable) and ask for a cycle."""
        # without a TTL of its own the request takes the serve's idle_ttl_s, measured as
        # idleness where the serve has a source of in-flight counts (statemachine.idleness)
        self.journal.add_request(serve, time.time(), ttl_s)
        self.trigger(f"request up {serve}")
        self.changes.changed()

    def request_down(self, serve: str) -> bool:
        """End a serve's on-demand request; True when there was one."""
        if serve not in {r.serve for r in self.journal.active_requests()}:
            return False
        # an ended request is kept as expired until its serve is down: the planner stops it
        self.journal.add_request(serve, time.time() - 1.0, 0.0, released=True)
        self.trigger(f"request down {serve}")
        self.changes.changed()
        return True

    def steps_since(self, since: float, group: str) -> list[StepEnded]:
        """The steps of plan group ``group`` that ended at or after ``since`` (epoch s)."""
        return self.live.ended(since, group)

    async def wait_change(self, timeout_s: float) -> bool:
        """Wait until the loop's state changes (a step, a cycle, a request) or the timeout:
        True when something changed. Never blocks the event loop."""
        return await self.changes.wait(timeout_s)

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
            measured=self.reloads.measured(desired.serves),
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

    def reload_estimates(self) -> dict[str, ReloadEstimate]:
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
                self._seen,
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

    # ----------------------------------------------------------------------- run
    async def run(self) -> int:
        """Run until SIGTERM / SIGINT; returns the process exit code."""
        return await _LoopLife(self).run()

    def stop(self) -> None:
        """Stop after the current step (signal handler)."""
        if not self._stopping:
            logger.info("stopping after the current step")
        self._stopping = True
        self.stop_event.set()
        self._wake.set()

    async def reconcile(self, reasons: tuple[str, ...] = ()) -> CycleSummary:
        """One cycle: reload, observe, plan, execute (or log), journal."""
        return await _LoopCycle(self).reconcile(reasons)

    async def _watch_manifests(self) -> None:
        """Watch the manifests' folders while the loop runs (see service.manifest_reload)."""
        o = self.options
        await watch_manifests(o.manifests, o.debounce_ms, o.settle_ms, self._manifest_changed)

    def _manifest_changed(self, reason: str) -> None:
        self._manifest_dirty = True
        self.trigger(reason)

    def _reload_manifest(self) -> None:
        _LoopCycle(self).reload_manifest()

    def _docker_events(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: Docker's event stream -> triggers (see controller.service.docker_events)."""
        self.docker_events.run(lambda reason: loop.call_soon_threadsafe(self.trigger, reason))

    def _follow(self, names: tuple[str, ...]) -> None:
        self.docker_events.follow(names)

    def _close_docker_events(self) -> None:
        self.docker_events.close()

    @property
    def _event_names(self) -> frozenset[str]:
        return self.docker_events.names

    @_event_names.setter
    def _event_names(self, names: frozenset[str]) -> None:
        self.docker_events.names = names

    @property
    def _events_stream(self) -> Any:
        return self.docker_events.stream

    @property
    def _events_filters(self) -> dict[str, Any] | None:
        return self.docker_events.filters

    def _elastic_in_force(self, snap: SnapshotModel) -> dict[str, int]:
        return overlays.elastic_in_force(self.journal, self.mset, snap)

    def _footprint_reading(self) -> Reading:
        """Devices and containers now, for a footprint (from a start's thread too)."""
        return self.host.footprint_reading(self.mset, self.nvml)

    def _executor_for(self) -> Executor:
        return _LoopCycle(self).executor()

    @property
    def _fresh_observer(self) -> ContainerObserver | None:
        return self.host.fresh

    def _start_ended(
        self, cycle_id: int, results: list[StepResult], release: Callable[[], None]
    ) -> None:
        _LoopCycle(self).start_ended(cycle_id, results, release)

    @property
    def _outcomes(self) -> dict[int, dict[str, Any] | None]:
        return self.start_outcomes.outcomes

    @property
    def _early(self) -> dict[int, list[StepResult]]:
        return self.start_outcomes.early

    def _track_tiers(self, steps: list[dict[str, Any]]) -> None:
        tiers.track_tiers(self._quiesced, lambda: self.journal, steps)

    def _recover_tiers(self) -> None:
        tiers.recover_tiers(self._quiesced, lambda: self.journal, dry_run=self.options.dry_run)

    # ------------------------------------ failures (controller.service.failures)
    @property
    def failures(self) -> FailureBook:
        """The failure bookkeeping over the records, with this loop's backoff options."""
        o = self.options
        return FailureBook(self.serve_records, o.backoff_base_s, o.backoff_cap_s)

    def _note_deaths(self, observed: Any, now: float) -> None:
        requested = {r.serve for r in self.journal.active_requests()}
        self.failures.note_deaths(self.mset.desired().serves.values(), requested, observed, now)

    def _fail(self, serve: str, why: str, now: float, *, after_healthy_run: bool = False) -> None:
        self.failures.fail(serve, why, now, after_healthy_run=after_healthy_run)

    def _learn(self, report: ExecutionReport, now: float) -> None:
        self.failures.learn(report, now, self.journal, self.mset.serves)

    def _hold_after_preflight(self, plan: Plan, report: ExecutionReport, now: float) -> None:
        self.failures.after_preflight(plan, report, time.time())

    def _still_unreleased(self, snap: SnapshotModel) -> list[str]:
        return self.failures.still_unreleased(snap, self.mset.serves)

    def _wake_when_a_hold_ends(self) -> None:
        """Ask for a cycle when the first backoff hold ends (on the loop's thread).

        A held serve is tried when its hold ends, as the log, ``/v1/serves`` and the page
        promise, not at whatever resync comes after it. Armed again after every cycle and
        every start's end (the places a hold is set or lifted); one timer at a time.
        """
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        loop, now = self._aio, time.time()
        end = backoff.next_end(self.backoff, now)
        if loop is None or loop.is_closed() or end is None or self._stopping:
            return
        # a hair past the end: the cycle's own clock must find the hold over
        self._hold_timer = loop.call_later(
            end - now + _HOLD_MARGIN_S, self.trigger, "a backoff hold ended"
        )

    def _end_finished_requests(self, observed: Any, now: float) -> None:
        _LoopCycle(self).end_finished_requests(observed, now)


@dataclass(frozen=True, slots=True)
class _LoopCycle:
    """The loop's parts of :func:`controller.service.cycle.run_cycle`, and what the loop
    learns from each cycle (it reads and keeps the controller's state throughout)."""

    controller: Controller

    async def reconcile(self, reasons: tuple[str, ...]) -> CycleSummary:
        """One cycle: reload, observe, plan, execute (or log), journal."""
        c = self.controller
        t0 = time.monotonic()
        if c._manifest_dirty:  # parsed in a thread: the API answers meanwhile
            await asyncio.to_thread(c._reload_manifest)
        result = await run_cycle(self, execute=not c.options.dry_run)
        plan, report = result.plan, result.report
        summary = CycleSummary(result.inputs.now, reasons, plan, None, result.snapshot)
        if c.options.dry_run and result.cycle_id is not None:
            await self._say_dry_run(plan)
        if report is not None:
            self._after_execution(result, report)
            summary.report = report
            summary.executed = True
        for b in plan.blocked:
            logger.debug("blocked: {}", b.reason)
        summary.duration_s = time.monotonic() - t0
        if plan.steps:
            laps = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in result.phases.items())
            # a dry run journals a plan once: its repeats have no cycle of their own
            which = "the same plan again" if result.cycle_id is None else f"cycle {result.cycle_id}"
            logger.debug("{} ({}): {}", which, "; ".join(reasons), laps)
        c.last = summary
        c.cycles += 1
        c._wake_when_a_hold_ends()
        for hook in c.on_cycle:
            hook(c)
        c.changes.changed()
        return summary

    async def _say_dry_run(self, plan: Plan) -> None:
        """A dry run's plan: each step it would take, and what a real run would refuse."""
        for step in plan.steps:
            logger.info("dry run: would {} {}: {}", step.action, step.serve, step.reason)
        try:
            problems = await asyncio.to_thread(self.controller._executor_for().preflight, plan)
        except Exception as exc:  # docker unreachable: the cycle already said so
            problems = [f"preflight could not run: {exc}"]
        for problem in problems:
            logger.warning("dry run: a real run would refuse this plan: {}", problem)

    def observe(self) -> SnapshotModel:
        """The host, with what the journal and the loop know laid over it (worker thread)."""
        c = self.controller
        # the live ledger's events up to here are in what this observation sees
        c._mark = c.live.mark()
        c._asked_then = c.requests()  # a request made after this waits for the next cycle
        # read before the containers: a start that ends in between has its container
        # running by then, so it is counted either way
        starting = c.starts.snapshot()
        ran = c.starts.ran()
        records = c.journal.started()
        known = c.journal.declared()
        names = overlays.observed_names(c.journal, c.mset, records, known)
        c.docker_events.follow_observed(names)
        snap = c.host.observe(names, c.nvml)
        # and by id: Docker's rename event carries the new name only, so a declared
        # container renamed away (and whatever it does after) is in the stream by its id
        ids = tuple(sorted({m.id[:12] for m in snap.containers.values() if m.id}))
        c.docker_events.follow_observed(names, ids)
        # a start that ended (``ran``) is recorded by its own end, on the roles it
        # reserved: the start records leave it alone as they leave one in progress
        snap.starting = {
            name: StartingModel(gpu_roles=list(st.gpu_roles), mib=st.mib)
            for name, st in {**starting, **ran}.items()
        }
        desired = c.mset.desired()
        snap.started_with = c.overlays.started_in_force(c.journal, desired, snap, records, known)
        for name in ran:
            del snap.starting[name]
        # a start that ended healthy, its end not yet taken in: it runs with the roles
        # and MiB it was started with, as the live answers already count it
        for name, st in ran.items():
            spec = desired.serves.get(name)
            held = spec is not None and snap.containers.get(spec.container) is not None
            if spec is not None and held and snap.containers[spec.container].state == "running":
                snap.started_with[spec.container] = StartedWithModel(
                    serve=name, gpu_roles=list(st.gpu_roles), mib=st.mib
                )
        # the health probes need only the containers: asked beside the engines' sleep
        # states and in-flight counts (each a loopback call per serve) rather than after
        probes = c.readers.submit(observe_probes, snap, c.mset, c.prober)
        self_asleep = c.readers.submit(observe_self_sleep, snap, c.mset, c.self_sleep)
        snap.elastic = c._elastic_in_force(snap)
        snap.sleep = c.overlays.sleep_in_force(c.journal, desired, snap)
        snap.quiesced = sorted(c._quiesced)
        snap.unreleased = c._still_unreleased(snap)
        opts = c.options
        snap.in_flight = observe_in_flight(
            snap,
            c.mset,
            c.in_flight,
            router_url=opts.router_url,
            router_token_file=opts.router_token_file,
        )
        snap.probes = probes.result()
        snap.self_asleep = self_asleep.result()
        return snap

    def inputs(self, snap: SnapshotModel, observed: Observed) -> Situation:
        """What the loop learns from an observation before it plans (on the loop's
        thread), and the situation it plans from."""
        c = self.controller
        now = time.time()
        # the answers read this observation from now on, with what the plan does after it
        c._seen = (snap, now, c._mark)
        c.live.forget_before(c._mark)
        c.changes.changed()
        c._notices.say(snap, observed)  # said once when it changes, not every cycle
        c._note_deaths(observed, now)
        c._end_finished_requests(observed, now)
        asked = asked_as_of(c._asked_then, c.requests())
        desired = c.desired(asked)
        c.serve_records.observe(desired, observed)
        c._watch.feed(desired, observed)
        if c.footprints is not None:
            c.footprints.observe(observed, c.mset.desired(), now)
        return c.situation_for(observed, now, asked)

    def plan(self, inputs: Situation) -> Plan:
        return inputs.plan

    def journal(self, plan: Plan) -> CycleJournal | None:
        """The journal this plan is recorded in; a dry run records a plan once."""
        c = self.controller
        if c.options.dry_run:
            plan_key = json.dumps([st.to_json() for st in plan.steps], sort_keys=True)
            if plan_key == c._last_dry_plan:
                return None
            c._last_dry_plan = plan_key
        return CycleJournal(c.journal, c.mset.digest, _read_files(c.mset), c.options.dry_run)

    def execute(self, plan: Plan, inputs: Situation, cycle_id: int | None) -> ExecutionReport:
        """Carry ``plan`` out; starts go to the tracker (in a worker thread)."""
        assert cycle_id is not None
        c = self.controller
        executor = c._executor_for()
        executor.desired = inputs.placed
        executor.on_start_done = self._start_done_callback(cycle_id)
        executor.cycle = cycle_id
        c.start_outcomes.executing(cycle_id)  # executing: a start's early end waits
        c.events.publish("plan.begun", cycle=cycle_id, steps=[s.to_json() for s in plan.steps])
        return executor.execute(plan, inputs.observed)

    def outcome(self, cycle_id: int | None, outcome: dict[str, Any]) -> None:
        """Add the starts that ended while the plan executed (on the loop's thread)."""
        assert cycle_id is not None
        c = self.controller
        c.start_outcomes.complete(cycle_id, outcome)
        c.events.publish(
            "plan.ended",
            private=("preflight",),
            cycle=cycle_id,
            ok=bool(outcome.get("ok")),
            stopped_early=bool(outcome.get("stopped_early")),
            steps=len(outcome.get("steps", [])),
            pending=list(outcome.get("pending", [])),
            preflight=list(outcome.get("preflight", [])),
        )

    def _after_execution(self, result: CycleResult, report: ExecutionReport) -> None:
        """What the loop learns from an execution: backoff, tiers, releases, its stops."""
        c = self.controller
        now, observed = result.inputs.now, result.observed
        desired = result.inputs.placed
        overlays.record_starts(c.journal, report, desired, now)
        c.reloads.record(report.results)  # the wakes (and starts run in the plan) it timed
        c._learn(report, now)
        c._track_tiers([r.to_json() for r in report.results])
        for r in report.results:
            if r.step.action is Action.RELEASE and r.outcome is Outcome.FAILED:
                c._unreleased.add(r.step.serve)
        c._hold_after_preflight(result.plan, report, now)
        for r in report.results:
            if r.step.action is Action.STOP and r.outcome is Outcome.OK:
                spec = desired.serves[r.step.serve]
                c._stopped_by_us[spec.name] = observed.container(spec.container).started_at
        # confirm a clean execution at once; after a failure, wait for the next
        # trigger (resync, docker event): re-planning at once spins on a fault
        if report.ok and not c._stopping:
            c.trigger("after execution")

    def reload_manifest(self) -> None:
        """Re-read the manifest set: a valid edit comes into force (its executor is built
        again, its declarations journalled); an invalid one is reported, the last good
        set stays in force."""
        c = self.controller
        c._manifest_dirty = False
        read = read_manifests(c.options.manifests)
        if read.mset is None:
            c.manifest_error = read.errors
            if read.issues is not None:
                c.manifest_issues = read.issues
            return
        if c.manifest_error:
            logger.info("manifest: valid again")
        c.manifest_error, c.manifest_issues = [], []
        mset = read.mset
        if mset.digest != c.mset.digest:
            logger.info("manifest: reloaded ({} serves)", len(mset.serves))
            for warning in mset.warnings:  # as `validate` and `run`'s start print them
                logger.warning("manifest: {}", warning)
            c.mset = mset
            c.no_sleep.clear()  # an edit may have fixed the engine's sleep flag
            c._stale_executor = c._executor or c._stale_executor
            c._executor = None  # built again for this manifest, on the same connections
            overlays.remember_declared(lambda: c.journal, c.mset.desired())
            c._router_notice.say(c.mset, c.options.router_url)

    def executor(self) -> Executor:
        """The executor of the manifest in force (built on first use after a reload, on
        the last one's connections)."""
        c = self.controller
        if c._executor is None:
            c._executor = make_executor(
                c.mset,
                router_url=c.options.router_url,
                router_token_file=c.options.router_token_file,
                stop_event=c.stop_event,
                observe_now=lambda: c.host.observe_now(c.mset),
                starts=c.starts,
                gpus=lambda: read_gpus(c.nvml),
                footprints=c.footprints,
                reuse=c._stale_executor,
            )
            c._stale_executor = None
            c._executor.events, c._executor.ledger_watch = c.events, c._ledger_watch
            c._executor.live = c.live
            c._executor.records = c.serve_records
            c._executor.on_sleep = lambda name, rec: overlays.journal_sleep(
                lambda: c.journal, name, rec
            )
        return c._executor

    def start_ended(
        self, cycle_id: int, results: list[StepResult], release: Callable[[], None]
    ) -> None:
        """A start carried out beside the loop has ended (on the loop's thread).

        Its results are learned (backoff) before ``release`` ends it in the tracker, so
        the serve is never planned again before its failure is known.
        """
        c = self.controller
        c.start_outcomes.ended(
            cycle_id, results, lambda: c.journal, learn=self._learn_start, release=release
        )
        serves = ", ".join(sorted({r.step.serve for r in results}))
        c.changes.changed()
        if not c._stopping:
            c.trigger(f"start of {serves} ended")

    def _learn_start(self, results: list[StepResult]) -> None:
        c = self.controller
        report = ExecutionReport(results, Ledger({}), {})
        c._learn(report, time.time())
        c.reloads.record(results)  # how long the cold start took, when it ended healthy
        overlays.record_starts(c.journal, report, c.mset.desired(), time.time())
        c._track_tiers([r.to_json() for r in results])
        c._wake_when_a_hold_ends()

    def end_finished_requests(self, observed: Observed, now: float) -> None:
        """Expired requests end once their serve is down; requests for gone serves end."""
        c = self.controller
        serves = c.mset.desired().serves
        for req in c.journal.active_requests():
            spec = serves.get(req.serve)
            if spec is None:
                c.journal.end_request(req.serve, now)
                c.events.publish("request.closed", serve=req.serve, reason="serve gone")
                continue
            if req.serve in observed.starting:
                continue  # its start is in progress: it ends once the serve is down
            ended = not in_force(req, spec, observed, now)
            if ended and not observed.container(spec.container).holds:
                c.journal.end_request(req.serve, now)
                c.events.publish("request.closed", serve=req.serve, reason="ended, serve down")

    def _start_done_callback(
        self, cycle_id: int
    ) -> Callable[[list[StepResult], Callable[[], None]], None]:
        c = self.controller
        loop = c._aio

        def done(results: list[StepResult], release: Callable[[], None]) -> None:
            # on the start's thread: hand the results to the loop's thread
            try:
                if loop is None or loop.is_closed():
                    raise RuntimeError("the loop has ended")
                loop.call_soon_threadsafe(c._start_ended, cycle_id, results, release)
            except RuntimeError:
                release()

        return done


@dataclass(frozen=True, slots=True)
class _LoopLife:
    """The loop's life: its start (lock, journal, sources, recovery), its main loop and
    its shutdown (it sets up and closes the controller's parts throughout)."""

    controller: Controller

    async def run(self) -> int:
        """Run until SIGTERM / SIGINT; returns the process exit code."""
        failed = self._open()
        if failed is not None:
            return failed
        loop = asyncio.get_running_loop()
        tasks = self._start(loop)
        try:
            await self._main()
        finally:
            await self._shutdown(tasks)
        logger.info("vramctl run: stopped")
        return 0

    def _open(self) -> int | None:
        """Take the state directory's lock and open the journal; the exit code when either
        fails (2: this user may not lock the state directory)."""
        c = self.controller
        try:
            c._lock.acquire()
        except AlreadyRunning as exc:
            logger.error("{}", exc)
            return 1
        except StateDirError as exc:
            logger.error("{}", exc)
            return 2
        try:
            # a dry run keeps its own journal: its requests and cycles never reach a real run
            path = journal_path(c.state_dir)
            if c.options.dry_run:
                path = path.with_name("journal.dry-run.sqlite3")
            c.journal = Journal.open(path)
        except Exception as exc:
            logger.error("cannot open the journal in {}: {}", c.state_dir, exc)
            c._lock.release()
            return 1
        return None

    def _start(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[None]]:
        """Set the loop's parts up, start its sources; the tasks run beside it."""
        c, dry_run = self.controller, self.controller.options.dry_run
        c._aio = loop
        c.starts.journal = None if dry_run else c.journal
        c.serve_records.attach(c.journal)  # each serve's lifecycle, as last left
        if not dry_run:
            c.footprints = FootprintRecorder(
                c._footprint_reading, journal=c.journal, settle_s=c.options.settle_s
            )
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, c.stop)
        logger.info(
            "vramctl run: {} serves, state in {}{}",
            len(c.mset.serves),
            c.state_dir,
            " (dry run: nothing is executed)" if dry_run else "",
        )
        c._router_notice.say(c.mset, c.options.router_url)
        tasks = [
            asyncio.create_task(c._watch_manifests(), name="watch-manifests"),
            asyncio.create_task(self._resync(), name="resync"),
        ] + [asyncio.create_task(service(c)) for service in c.services]
        c._event_names = frozenset(
            overlays.observed_names(c.journal, c.mset, c.journal.started(), c.journal.declared())
        )
        threading.Thread(target=c._docker_events, args=(loop,), daemon=True).start()
        c._recover_tiers()
        if not dry_run:
            overlays.remember_declared(lambda: c.journal, c.mset.desired())

            def orphan_ended(serve: str) -> None:
                loop.call_soon_threadsafe(c.trigger, f"orphaned up of {serve} ended")

            supervise_orphans(c.starts, c.journal, stop=c.stop_event, on_end=orphan_ended)
        c.trigger("start")
        return tasks

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.controller.options.resync_s)
            self.controller.trigger("resync")

    async def _main(self) -> None:
        c = self.controller
        warm = False
        while not c._stopping:
            await c._wake.wait()
            c._wake.clear()
            if c._stopping:
                break
            reasons, c._reasons = tuple(c._reasons), []
            try:
                await c.reconcile(reasons)
            except Exception:  # a bug must not kill the loop; the next trigger retries
                logger.exception("reconcile failed")
            snap = c.last.snapshot
            if not warm and not c._stopping and snap is not None and snap.docker == "ok":
                warm = True  # once docker answers (unreachable, nothing would be made)
                await asyncio.to_thread(self._warm_up)

    def _warm_up(self) -> None:
        """After the first cycle: make what the first plan needs before it is needed.

        The executor's docker client negotiates the API version, a container reader
        inspects every container on the host the first time it lists them, and the
        engines' sleep client and the health probe each load a TLS context: tens of ms
        each, which the first manifest edit (or the first request) would otherwise pay
        between its observation and its first docker call. Here they are paid once, at
        start, between two cycles (in a worker thread, never beside an execution). A
        failure is only logged: the same things are made again when they are needed.

        Then what start-up made (modules, schemas, the manifest) is frozen out of the
        garbage collector: a full collection walked all of it, about 90 ms here, and
        ran in whatever came next, the first request's plan or a swap's observation.
        """
        c = self.controller
        try:
            executor = c._executor_for()
            if executor.sleep is None and any(s.sleep for s in c.mset.desired().serves.values()):
                executor.sleep = SleepClient()  # an HTTP client: its TLS context, ~20 ms
            health.warm()
            c.host.observe_now(c.mset)
            if c.footprints is not None:
                c._footprint_reading()
        except Exception as exc:
            logger.debug("warm-up: {}", exc)
        gc.collect()
        gc.freeze()

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop the sources, let the starts see the stop, close every part."""
        c = self.controller
        # starts in progress see the stop and end (a start awaiting health is left
        # running); an `up` still running past this stays recorded in the journal,
        # and the next controller supervises it
        await asyncio.to_thread(c.starts.join, 10.0)
        await asyncio.sleep(0)  # their outcomes, handed to this loop, are journalled
        c.events.close()  # the event streams end before the API shuts down
        if c._hold_timer is not None:
            c._hold_timer.cancel()
        c.docker_events.close()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # footprints of starts still settling are recorded with what is known
        c.host.close(footprints=c.footprints.close if c.footprints is not None else None)
        c.in_flight.close()
        c.prober.close()
        c.readers.shutdown(wait=False)
        c.self_sleep.close()
        c.journal.close()
        c._lock.release()


def _read_files(mset: ManifestSet) -> dict[str, str]:
    """The manifest files in force, as they were loaded (path -> content).

    Taken from the set itself, never re-read from disk: the file may have changed since
    (an invalid edit, bytes that are not UTF-8, a file removed), and the journal must
    record the content its digest was computed over.
    """
    return dict(mset.texts)


def _assign(marks: MarkSet, value: Collection[str]) -> None:
    """Make ``marks`` hold exactly ``value`` (nothing to do when it is ``marks`` itself)."""
    if value is marks:
        return
    wanted = set(value)
    for name in set(marks) - wanted:
        marks.discard(name)
    for name in wanted:
        marks.add(name)
