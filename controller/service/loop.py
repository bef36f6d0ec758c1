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

This module must not decide what to do (the planner does) nor touch docker except
through the adapters and the executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from loguru import logger

from controller.adapters.docker.read import (
    ContainerObserver,
    EventStreamRefusedError,
    event_filters,
    make_client,
    manifest_containers,
    open_events,
)
from controller.adapters.health import HealthProber
from controller.adapters.nvml import NvmlApi, observe_gpus
from controller.adapters.sleep import SleepClient
from controller.manifest import LocatedError, ManifestError, ManifestSet, load_manifest_set
from controller.service.cycle import CycleJournal, CycleResult, PlanInputs, run_cycle
from controller.service.events import (
    DriftWatch,
    EventBus,
    LedgerWatch,
    ObservationWatch,
)
from controller.service.executor import ExecutionReport, Executor, Outcome, StepResult
from controller.service.footprints import DEFAULT_SETTLE_S, FootprintRecorder, Reading
from controller.service.inflight import InFlightTracker, observe_in_flight
from controller.service.live import LiveLedger, StepEnded
from controller.service.observe import observe_host, observe_probes
from controller.service.records import FieldMap, MarkSet, RecordStore
from controller.service.sleeping import observe_sleep
from controller.service.starts import StartTracker, supervise_orphans
from controller.service.view import BackoffView, JournalHistory, LoopView
from controller.service.watch import QUIET_MS, watch_files
from controller.service.wiring import containers_now, make_executor, read_gpus
from controller.snapshot import (
    SleepStateModel,
    SnapshotModel,
    StartedWithModel,
    StartingModel,
    epoch_seconds,
)
from controller.store.journal import (
    AlreadyRunning,
    Journal,
    SleepRecord,
    StateLock,
    default_state_dir,
    journal_path,
)
from statemachine import backoff
from statemachine.admission import no_router_warning, router_tiers
from statemachine.backoff import Backoff
from statemachine.idleness import request_end
from statemachine.ledger import Ledger
from statemachine.planner import Action, Plan, Policy, plan_transitions
from statemachine.status import lifecycle_from_observation
from statemachine.types import (
    DesiredRun,
    DesiredState,
    Observed,
    OnDemandRequest,
    StartedWith,
)

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
class CycleSummary:
    """What the last cycle saw and did (the interfaces read it through ``view()``)."""

    at: float = 0.0
    reasons: tuple[str, ...] = ()
    plan: Plan | None = None
    report: ExecutionReport | None = None
    snapshot: SnapshotModel | None = None
    duration_s: float = 0.0
    executed: bool = False


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
        self._observer: ContainerObserver | None = None
        self._executor: Executor | None = None
        self._stale_executor: Executor | None = None  # the last manifest's: its connections
        self._stopping = False
        self._last_dry_plan = ""  # a dry run journals and logs a plan once, not every cycle
        self._no_longer_declared: set[str] = set()  # running containers said to be so
        self._nvml_said: str | None = None  # the NVML error last logged
        self._router_said: dict[str, str] = {}  # the tiers last said to need a router
        self._docker_said: str | None = None  # the Docker error last logged
        self._hold_timer: asyncio.TimerHandle | None = None  # wakes the loop at a hold's end
        #: the starts in progress, carried out beside the loop (see controller.service.starts)
        self.starts = StartTracker()
        #: requests in flight per serve, and since when each has been idle
        self.in_flight = InFlightTracker()
        self.prober = HealthProber()  # each observation's health probes (status, page)
        self._fresh_observer: ContainerObserver | None = None  # the executor's own reader
        # cycle -> its outcome while starts it handed off may still end (None: executing)
        self._outcomes: dict[int, dict[str, Any] | None] = {}
        self._early: dict[int, list[StepResult]] = {}  # results that ended while executing
        self._aio: asyncio.AbstractEventLoop | None = None
        #: what the loop does, as numbered events (GET /v1/events); ids start past any
        #: an earlier controller issued (its start time in ms), see controller.service.events
        self.events = EventBus(first_id=int(time.time() * 1000))
        self._ledger_watch = LedgerWatch(self.events)
        self._watch = ObservationWatch(self._ledger_watch, DriftWatch(self.events))
        #: measures the starts and stops this loop carries out (set up by ``run``)
        self.footprints: FootprintRecorder | None = None
        self._fp_observer: ContainerObserver | None = None
        self._fp_lock = threading.Lock()
        #: what the executor did and holds since each observation (read by the view)
        self.live = LiveLedger()
        self.live.listen(self._changed_threadsafe)
        self._mark = 0  # the live ledger's mark of the observation being taken
        #: the newest observation: (snapshot, when, its live-ledger mark)
        self._seen: tuple[SnapshotModel, float, int] | None = None
        self._change_waiters: set[asyncio.Future[None]] = set()
        # the engines' sleep state is asked every cycle: one quick try, no retries
        self._sleep_probe = SleepClient(probe_timeout_s=1.0, attempts=1, max_wait_s=0)
        self._sleep_said: set[str] = set()  # sleep notes logged (said once, not every cycle)
        #: the containers the loop observes: Docker's event stream is filtered to them
        self._event_names: frozenset[str] = frozenset()
        self._events_lock = threading.Lock()
        #: the event stream open now and the filters it was opened with
        self._events_stream: Any = None
        self._events_client: Any = None
        self._events_filters: dict[str, Any] | None = None
        self._events_refresh = False  # the stream was closed for a new filter
        #: a filtered stream was refused (a proxy's bound): every container's events
        self._events_unfiltered = False
        #: the ids (short) of the observed containers at the last observation
        self._followed_ids: tuple[str, ...] = ()

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
        self._changed()

    def request_down(self, serve: str) -> bool:
        """End a serve's on-demand request; True when there was one."""
        active = {r.serve for r in self.journal.active_requests()}
        if serve not in active:
            return False
        # an ended request is kept as expired until its serve is down: the planner stops it
        self.journal.add_request(serve, time.time() - 1.0, 0.0)
        self.trigger(f"request down {serve}")
        self._changed()
        return True

    # ------------------------------------------------------------- change waits
    def _changed(self) -> None:
        """Wake whoever waits for the loop's state to change (on the loop's thread)."""
        waiters, self._change_waiters = self._change_waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _changed_threadsafe(self) -> None:
        loop = self._aio
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._changed)

    def steps_since(self, since: float, group: str) -> list[StepEnded]:
        """The steps of plan group ``group`` that ended at or after ``since`` (epoch s)."""
        return self.live.ended(since, group)

    async def wait_change(self, timeout_s: float) -> bool:
        """Wait until the loop's state changes (a step, a cycle, a request) or the timeout.

        True when something changed. Never blocks the event loop.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._change_waiters.add(fut)
        try:
            # asyncio.wait, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that meets the future's result, and a task cancelled at shutdown ran on
            done, _ = await asyncio.wait({fut}, timeout=max(0.0, timeout_s))
            return bool(done)
        finally:
            self._change_waiters.discard(fut)
            fut.cancel()

    def requests(self) -> tuple[OnDemandRequest, ...]:
        """The on-demand requests as the planner sees them."""
        return tuple(r for r in self.journal.active_requests())

    def desired(self) -> DesiredState:
        """The desired state: the last good manifest set plus the requests."""
        return replace(self.mset.desired(), requests=self.requests())

    def policy(self, now: float) -> Policy:
        """The planner policy: backoff holds and serves whose shrink failed."""
        return Policy(
            no_shrink=frozenset(self.no_shrink),
            hold=backoff.holds(self.backoff, now),
            no_sleep=frozenset(self.no_sleep),
        )

    def history(self) -> JournalHistory:
        """The journal's recorded cycles, read only (the operator's page lists them)."""
        return self.journal

    def view(self) -> LoopView:
        """What the loop knows now, as a frozen copy (what the interfaces read)."""
        last = self.last
        snapshot, observed_at, mark = last.snapshot, last.at, -1
        if self._seen is not None and (last.snapshot is None or self._seen[1] >= last.at):
            snapshot, observed_at, mark = self._seen
        return LoopView(
            at=last.at,
            duration_s=last.duration_s,
            snapshot=snapshot,
            plan=last.plan,
            report=last.report,
            executed=last.executed,
            cycles=self.cycles,
            desired=self.mset.desired(),
            manifest_digest=self.mset.digest,
            manifest_errors=tuple(self.manifest_error),
            manifest_issues=tuple(self.manifest_issues),
            backoff=MappingProxyType(
                {
                    name: BackoffView(b.failures, b.until, b.last_failure)
                    for name, b in self.backoff.items()
                }
            ),
            no_shrink=frozenset(self.no_shrink),
            dry_run=self.options.dry_run,
            router=bool(self.options.router_url),
            footprints=MappingProxyType(self._footprint_summary()),
            observed_at=observed_at if snapshot is not None else None,
            live=self.live.overlay(mark),
            records=self.serve_records.snapshot(),
        )

    def _footprint_summary(self) -> dict[str, dict[str, Any]]:
        """Declared vs measured per serve, from the journal's samples."""
        if self.footprints is None:
            return {}
        return {n: f.to_json() for n, f in self.footprints.summary(self.mset.desired()).items()}

    # ----------------------------------------------------------------------- run
    async def run(self) -> int:
        """Run until SIGTERM / SIGINT; returns the process exit code."""
        try:
            self._lock.acquire()
        except AlreadyRunning as exc:
            logger.error("{}", exc)
            return 1
        try:
            # a dry run keeps its own journal: its requests and cycles never reach a real run
            path = journal_path(self.state_dir)
            if self.options.dry_run:
                path = path.with_name("journal.dry-run.sqlite3")
            self.journal = Journal.open(path)
        except Exception as exc:
            logger.error("cannot open the journal in {}: {}", self.state_dir, exc)
            self._lock.release()
            return 1
        loop = asyncio.get_running_loop()
        self._aio = loop
        self.starts.journal = None if self.options.dry_run else self.journal
        self.serve_records.attach(self.journal)  # each serve's lifecycle, as last left
        if not self.options.dry_run:
            self.footprints = FootprintRecorder(
                self._footprint_reading, journal=self.journal, settle_s=self.options.settle_s
            )
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        logger.info(
            "vramctl run: {} serves, state in {}{}",
            len(self.mset.serves),
            self.state_dir,
            " (dry run: nothing is executed)" if self.options.dry_run else "",
        )
        self._say_router()
        tasks = [
            asyncio.create_task(self._watch_manifests(), name="watch-manifests"),
            asyncio.create_task(self._resync(), name="resync"),
        ] + [asyncio.create_task(service(self)) for service in self.services]
        self._event_names = frozenset(self._observed_names())
        events = threading.Thread(target=self._docker_events, args=(loop,), daemon=True)
        events.start()
        self._recover_tiers()
        if not self.options.dry_run:
            self._remember_declared()

            def orphan_ended(serve: str) -> None:
                loop.call_soon_threadsafe(self.trigger, f"orphaned up of {serve} ended")

            supervise_orphans(self.starts, self.journal, stop=self.stop_event, on_end=orphan_ended)
        self.trigger("start")
        try:
            await self._main()
        finally:
            # starts in progress see the stop and end (a start awaiting health is left
            # running); an `up` still running past this stays recorded in the journal,
            # and the next controller supervises it
            await asyncio.to_thread(self.starts.join, 10.0)
            await asyncio.sleep(0)  # their outcomes, handed to this loop, are journalled
            self.events.close()  # the event streams end before the API shuts down
            if self._hold_timer is not None:
                self._hold_timer.cancel()
            self._close_docker_events()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self._observer is not None:
                self._observer.close()
            if self.footprints is not None:
                self.footprints.close()  # starts still settling: recorded with what is known
            if self._fp_observer is not None:
                self._fp_observer.close()
            if self._fresh_observer is not None:
                self._fresh_observer.close()
            self.in_flight.close()
            self.prober.close()
            self.journal.close()
            self._lock.release()
        logger.info("vramctl run: stopped")
        return 0

    def stop(self) -> None:
        """Stop after the current step (signal handler)."""
        if not self._stopping:
            logger.info("stopping after the current step")
        self._stopping = True
        self.stop_event.set()
        self._wake.set()

    async def _main(self) -> None:
        warm = False
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                break
            reasons, self._reasons = tuple(self._reasons), []
            try:
                await self.reconcile(reasons)
            except Exception:  # a bug must not kill the loop; the next trigger retries
                logger.exception("reconcile failed")
            snap = self.last.snapshot
            if not warm and not self._stopping and snap is not None and snap.docker == "ok":
                warm = True  # once docker answers (unreachable, nothing would be made)
                await asyncio.to_thread(self._warm_up)

    def _warm_up(self) -> None:
        """After the first cycle: make what the first plan needs before it is needed.

        The executor's docker client negotiates the API version, and a container reader
        inspects every container on the host the first time it lists them: tens of ms
        each, which the first manifest edit (or the first request) would otherwise pay
        between its observation and its first docker call. Here they are paid once, at
        start, between two cycles (in a worker thread, never beside an execution). A
        failure is only logged: the same things are made again when they are needed.
        """
        try:
            self._executor_for()
            self._observe_now()
            if self.footprints is not None:
                self._footprint_reading()
        except Exception as exc:
            logger.debug("warm-up: {}", exc)

    # ------------------------------------------------------------------ sources
    async def _watch_manifests(self) -> None:
        """Watch the manifests' folders for as long as the loop runs.

        Nothing may end the watch for good: if it ever fails, the reason is logged, the
        manifest is re-read (an edit may have been missed) and the watch starts again.
        """
        while True:
            try:
                await self._watch_manifests_once()
                return  # the watch ended without an error (its stop event): we are stopping
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.error("manifest watcher failed ({!r}); restarting it in 1 s", exc)
            await asyncio.sleep(1.0)
            self._manifest_dirty = True
            self.trigger("manifest watcher restarted")

    async def _watch_manifests_once(self) -> None:
        files = {_path_key(p) for p in self.options.manifests}
        # reported once the files settle (see controller.service.watch): an editor's two
        # writes, or its write and rename, are one change and one reload
        async for _change in watch_files(
            files, debounce_ms=self.options.debounce_ms, quiet_ms=self.options.settle_ms
        ):
            self._manifest_dirty = True
            self.trigger("manifest changed")

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.options.resync_s)
            self.trigger("resync")

    def _docker_events(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: Docker's event stream -> triggers; reconnects while the loop runs.

        The stream is filtered to the containers the loop observes (``event_filters``:
        by name, so one created or started later is in it too); an observation whose
        containers give another filter closes it (:meth:`_follow`) and it is opened
        again at once with the new one. Each time it is opened a cycle is asked for:
        whatever happened while no stream was open is observed then.
        """
        wanted = {"start", "die", "oom", "stop", "destroy", "pause", "unpause", "rename"}
        while not self.stop_event.is_set():
            client = stream = None
            filters: dict[str, Any] = {}
            try:
                client = make_client()
                with self._events_lock:
                    names, self._events_refresh = self._event_names, False
                filters = self._filters_for(client, names)
                stream = open_events(client, filters)
                with self._events_lock:
                    self._events_stream, self._events_client = stream, client
                    self._events_filters = filters
                    stale = self._filters_for(client, self._event_names) != filters
                if stale:  # the names changed while it was opened
                    continue
                loop.call_soon_threadsafe(self.trigger, "docker events followed")
                for event in stream:
                    if self.stop_event.is_set():
                        break
                    status = str(event.get("status") or event.get("Action") or "")
                    if (status in wanted or status.startswith("health_status")) and self._followed(
                        event
                    ):
                        self._touch(event)  # before the cycle it asks for reads the list
                        name = str((event.get("Actor") or {}).get("Attributes", {}).get("name", ""))
                        loop.call_soon_threadsafe(self.trigger, f"docker {status} {name}")
                # ended by itself (docker-py ends a stream quietly on a read error, or
                # when the daemon answers its request with an error): paced as a failure,
                # or each reopening would ask for a cycle at once
                with self._events_lock:
                    refreshed, self._events_refresh = self._events_refresh, False
                if not refreshed and not self.stop_event.is_set():
                    logger.debug("docker events: the stream ended; reconnecting")
                    self.stop_event.wait(2.0)
            except Exception as exc:
                if self.stop_event.is_set():
                    break
                if (
                    isinstance(exc, EventStreamRefusedError)
                    and exc.client_error
                    and "container" in filters
                ):
                    logger.warning(
                        "docker events: the stream filtered to {} containers is refused "
                        "({}); following every container's events instead",
                        len(filters["container"]),
                        exc,
                    )
                    with self._events_lock:
                        self._events_unfiltered = True
                    continue
                with self._events_lock:  # taken: only the first try after it is at once
                    refreshed, self._events_refresh = self._events_refresh, False
                if not refreshed:  # closed for a new filter: opened again at once
                    logger.debug("docker events: {}; reconnecting", exc)
                    self.stop_event.wait(2.0)
            finally:
                with self._events_lock:
                    self._events_stream = self._events_client = self._events_filters = None
                for closing in (stream, client):
                    if closing is not None:
                        with contextlib.suppress(Exception):
                            closing.close()

    def _follow(self, names: tuple[str, ...]) -> None:
        """The containers the loop observes now: the event stream follows them.

        Called with each observation's names (in its worker thread); when they give the
        open stream another filter, the stream is closed, and the events thread opens it
        again with the new one (and asks for a cycle: nothing between is missed).
        """
        wanted = frozenset(names)
        with self._events_lock:
            if wanted == self._event_names:
                return
            self._event_names = wanted
            stream, client, filters = (
                self._events_stream,
                self._events_client,
                self._events_filters,
            )
            if stream is None or client is None or self._filters_for(client, wanted) == filters:
                return  # not open (it is opened with these names), or the same filter
            self._events_refresh = True
        with contextlib.suppress(Exception):
            stream.close()

    def _followed(self, event: Mapping[str, Any]) -> bool:
        """True when ``event`` is of a container the loop follows: Docker matches the
        filter by prefix (``web`` also has ``web-old``'s events), so the event's name,
        or its id, is checked here (every event while no names are known)."""
        with self._events_lock:
            names = self._event_names
        if not names:
            return True
        actor = event.get("Actor") or {}
        attributes = actor.get("Attributes") or {}
        cid = str(actor.get("ID") or event.get("id") or "")
        return str(attributes.get("name", "")) in names or cid[:12] in names

    def _touch(self, event: Mapping[str, Any]) -> None:
        """The container of ``event`` is inspected again by every reader's next list:
        Docker sends ``die`` before its list shows the container exited, so without this
        the cycle the event asks for would still see it running (and the death would
        wait for a later trigger)."""
        cid = str((event.get("Actor") or {}).get("ID") or event.get("id") or "")
        for observer in (self._observer, self._fresh_observer, self._fp_observer):
            if observer is not None:
                observer.cache.touch(cid)

    def _filters_for(self, client: Any, names: Collection[str]) -> dict[str, Any]:
        """The event stream's filters for ``names`` (every container's events once a
        filtered stream was refused). Called with ``_events_lock`` held or from the
        events thread, which alone sets ``_events_unfiltered``."""
        return event_filters(client, () if self._events_unfiltered else names)

    def _close_docker_events(self) -> None:
        with self._events_lock:
            stream = self._events_stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    # ---------------------------------------------------------------- reconcile
    def _reload_manifest(self) -> None:
        self._manifest_dirty = False
        try:
            mset = load_manifest_set(list(self.options.manifests))
        except ManifestError as exc:
            self.manifest_error = [str(e) for e in exc.errors]
            self.manifest_issues = list(exc.errors)
            for line in self.manifest_error:
                logger.error("manifest: {} (the last good manifest stays in force)", line)
            return
        except Exception as exc:  # a loader bug must not take the manifest in force away
            logger.exception("manifest: cannot be loaded")
            self.manifest_error = [f"cannot be loaded: {type(exc).__name__}: {exc}"]
            logger.error(
                "manifest: {} (the last good manifest stays in force)", self.manifest_error[0]
            )
            return
        if self.manifest_error:
            logger.info("manifest: valid again")
        self.manifest_error = []
        self.manifest_issues = []
        if mset.digest != self.mset.digest:
            logger.info("manifest: reloaded ({} serves)", len(mset.serves))
            for warning in mset.warnings:  # as `validate` and `run`'s start print them
                logger.warning("manifest: {}", warning)
            self.mset = mset
            self.no_sleep.clear()  # an edit may have fixed the engine's sleep flag
            self._stale_executor = self._executor or self._stale_executor
            self._executor = None  # built again for this manifest, on the same connections
            self._remember_declared()
            self._say_router()

    def _say_router(self) -> None:
        """Without a router: which serves declare a tier (at start, again when that changes)."""
        tiers = {} if self.options.router_url else router_tiers(self.mset.desired())
        if tiers and tiers != self._router_said:
            logger.warning("{}", no_router_warning(tiers))
        self._router_said = tiers

    def _remember_declared(self) -> None:
        """Journal what the manifest in force declares for each container (see
        :meth:`Journal.set_declared`): a container that later runs undeclared counts."""
        desired = self.mset.desired()
        records = {
            s.container: StartedWith(s.name, s.gpu_roles, s.vram_mib)
            for s in desired.serves.values()
            if s.vram_mib is not None and desired.in_ledger(s)
        }
        try:
            self.journal.set_declared(records, time.time())
        except Exception as exc:  # a locked journal: the next reload tries again
            logger.error("journal: cannot record the declared reservations: {}", exc)

    def _observe(self) -> SnapshotModel:
        if self._observer is None:
            self._observer = ContainerObserver()
        # the live ledger's events up to here are in what this observation sees
        self._mark = self.live.mark()
        # read before the containers: a start that ends in between has its container
        # running by then, so it is counted either way
        starting = self.starts.snapshot()
        records = self.journal.started()
        known = self.journal.declared()
        names = self._observed_names(records, known)
        self._follow(names + self._followed_ids)
        snap = observe_host(names, observer=self._observer, nvml=self.nvml)
        # and by id: Docker's rename event carries the new name only, so a declared
        # container renamed away (and whatever it does after) is in the stream by its id
        self._followed_ids = tuple(sorted({m.id[:12] for m in snap.containers.values() if m.id}))
        self._follow(names + self._followed_ids)
        snap.starting = {
            name: StartingModel(gpu_roles=list(st.gpu_roles), mib=st.mib)
            for name, st in starting.items()
        }
        snap.started_with = self._started_in_force(snap, records, known)
        snap.elastic = self._elastic_in_force(snap)
        snap.sleep = self._sleep_in_force(snap)
        snap.quiesced = sorted(self._quiesced)
        snap.unreleased = self._still_unreleased(snap)
        snap.in_flight = observe_in_flight(
            snap,
            self.mset,
            self.in_flight,
            router_url=self.options.router_url,
            router_token_file=self.options.router_token_file,
        )
        snap.probes = observe_probes(snap, self.mset, self.prober)
        return snap

    def _observed_names(
        self,
        records: dict[str, StartedWith] | None = None,
        known: dict[str, StartedWith] | None = None,
    ) -> tuple[str, ...]:
        """The containers an observation reads: the manifest's, and those the journal
        records as started (still holding their reservation) or as declared before."""
        records = self.journal.started() if records is None else records
        known = self.journal.declared() if known is None else known
        return tuple(
            dict.fromkeys(manifest_containers(self.mset.serves) + tuple(records) + tuple(known))
        )

    def _started_in_force(
        self,
        snap: SnapshotModel,
        records: dict[str, StartedWith],
        known: dict[str, StartedWith] | None = None,
    ) -> dict[str, StartedWithModel]:
        """The start reservations of the containers that still run (journal records).

        A container keeps the reservation it was started with until it stops, whatever
        the manifest says now (an edit, a file caught mid-write): the record is dropped
        only once docker shows the container stopped or gone. A declared container
        found running without a record (started before this controller, or by hand)
        is recorded with its declared reservation; a container no manifest in force
        declares, found running without a record, with the last reservation a manifest
        declared for it (``known``: started by hand while a file caught mid-write was in
        force, or after its serve was removed). With docker unreadable nothing is
        dropped or recorded.
        """
        holding = ("running", "paused", "restarting")
        serves = self.mset.desired()
        declared = {s.container: s for s in serves.serves.values()}
        if snap.docker == "ok":
            for container, rec in list(records.items()):
                c = snap.containers.get(container)
                if c is None or c.state not in holding:
                    self.journal.forget_started(container)
                    del records[container]
                    if container in self._no_longer_declared:
                        logger.info(
                            "{} (no longer declared) stopped; its {} MiB are released",
                            container,
                            rec.mib,
                        )
            for container, spec in declared.items():
                c = snap.containers.get(container)
                if (
                    container not in records
                    and c is not None
                    and c.state in holding
                    and spec.vram_mib is not None
                    and serves.in_ledger(spec)
                ):
                    rec = StartedWith(spec.name, spec.gpu_roles, spec.vram_mib)
                    self.journal.set_started(
                        container, rec.serve, rec.gpu_roles, rec.mib, time.time()
                    )
                    records[container] = rec
            for container, rec in (known or {}).items():
                c = snap.containers.get(container)
                if (
                    container not in declared
                    and container not in records
                    and c is not None
                    and c.state in holding
                ):
                    self.journal.set_started(
                        container, rec.serve, rec.gpu_roles, rec.mib, time.time()
                    )
                    records[container] = rec
        gone = {c: r for c, r in records.items() if c not in declared}
        for container, rec in gone.items():
            if container not in self._no_longer_declared:
                logger.warning(
                    "{} is no longer declared (started as serve {}); it keeps its start "
                    "reservation of {} MiB on {} until it stops",
                    container,
                    rec.serve,
                    rec.mib,
                    ", ".join(rec.gpu_roles),
                )
        self._no_longer_declared = set(gone)
        return {
            c: StartedWithModel(serve=r.serve, gpu_roles=list(r.gpu_roles), mib=r.mib)
            for c, r in records.items()
        }

    def _record_starts(self, report: ExecutionReport, desired: DesiredState, now: float) -> None:
        """Record the reservation of each container this plan started (see above)."""
        for r in report.results:
            if r.step.action is not Action.START or r.outcome is not Outcome.OK:
                continue
            spec = desired.serves.get(r.step.serve)
            if spec is None or not r.step.mib or not r.step.gpu_roles:
                continue  # outside the ledger; or no longer declared: its start counts it
            # the roles and MiB the start was planned with, whatever the manifest says now
            self.journal.set_started(spec.container, spec.name, r.step.gpu_roles, r.step.mib, now)

    def _sleep_in_force(self, snap: SnapshotModel) -> dict[str, SleepStateModel]:
        """The sleep state of every serve that can sleep, and the journal kept true to it.

        A sleeper whose container stopped, or started again since its sleep (awake and
        full), or whose engine says it is awake, is forgotten; what each recorded
        sleeper was seen as is journalled every cycle.
        """
        records = self.journal.sleeping()
        models, now = observe_sleep(self.mset.desired(), snap, records, self._sleep_probe)
        at = time.time()
        for container in now.forget:
            self.journal.forget_sleeping(container)
        for container, seen in now.seen.items():
            self.journal.saw_sleeping(container, seen, at)
        for note in now.notes:
            if note not in self._sleep_said:
                logger.info("sleep: {}", note)
        self._sleep_said = set(now.notes)
        return models

    def _elastic_in_force(self, snap: SnapshotModel) -> dict[str, int]:
        """The journal's elastic reserves, minus those of engines that restarted since.

        An engine forgets its reserve when its server restarts (a crash, a restart
        policy, a manual ``docker restart``): a container that is down, or that started
        after the reserve was asked for, holds its full reservation again.
        """
        set_at = self.journal.elastic_set_at()
        out: dict[str, int] = {}
        serves = self.mset.serves
        for name, mib in self.journal.elastic().items():
            spec = serves.get(name)
            c = snap.containers.get(spec.container) if spec is not None else None
            started = _epoch_or_none(c.started_at) if c is not None else None
            if (
                c is None
                or c.state != "running"
                or (started is not None and started > set_at.get(name, 0.0))
            ):
                if snap.docker == "ok":
                    self.journal.set_elastic(name, None, time.time())
                    logger.info(
                        "{}: the engine restarted or stopped; its elastic reserve is void", name
                    )
                continue
            out[name] = mib
        return out

    def _executor_for(self) -> Executor:
        if self._executor is None:
            self._executor = make_executor(
                self.mset,
                router_url=self.options.router_url,
                router_token_file=self.options.router_token_file,
                stop_event=self.stop_event,
                observe_now=self._observe_now,
                starts=self.starts,
                gpus=lambda: read_gpus(self.nvml),
                footprints=self.footprints,
                reuse=self._stale_executor,
            )
            self._stale_executor = None
            self._executor.events, self._executor.ledger_watch = self.events, self._ledger_watch
            self._executor.live = self.live
            self._executor.records = self.serve_records
            self._executor.on_sleep = self._journal_sleep
        return self._executor

    def _journal_sleep(self, container: str, rec: SleepRecord | None) -> None:
        """A sleep confirmed (or ended) mid-plan is journalled at once: a controller that
        dies before the plan ends still finds the sleeper, counts it and wakes it."""
        try:
            if rec is not None:
                self.journal.set_sleeping(rec)
            else:
                self.journal.forget_sleeping(container)
        except Exception as exc:  # the plan's end records it again
            logger.warning("journal: the sleep record of {} not written now: {}", container, exc)

    def _footprint_reading(self) -> Reading:
        """Devices and containers now, for a footprint (from a start's thread too).

        The devices are read first: without them (NVML unavailable) no container's
        memory can be attributed either, and the reading is unknown as a whole without
        asking docker (the executor takes it right before its docker start or stop).
        """
        with self._fp_lock:
            gpu = observe_gpus(self.nvml)
            if gpu.gpus is None:
                return Reading(None)
            if self._fp_observer is None:
                self._fp_observer = ContainerObserver()
            names = manifest_containers(self.mset.serves)
            snap = observe_host(names, observer=self._fp_observer, nvml=self.nvml, gpu=gpu)
        return Reading.of(snap.to_observed())

    def _observe_now(self) -> Observed:
        """The containers as they are now (the executor admits each reserve against it)."""
        if self._fresh_observer is None:
            self._fresh_observer = ContainerObserver()
        return containers_now(self.mset, self._fresh_observer)

    def _start_ended(
        self, cycle_id: int, results: list[StepResult], release: Callable[[], None]
    ) -> None:
        """A start carried out beside the loop has ended (on the loop's thread).

        Its results are learned (backoff) before ``release`` ends it in the tracker, so
        the serve is never planned again before its failure is known.
        """
        try:
            if cycle_id in self._outcomes and self._outcomes[cycle_id] is None:
                # the plan is still executing: its outcome takes these when it is recorded
                self._early.setdefault(cycle_id, []).extend(results)
            else:
                self._merge_start(cycle_id, results)
            report = ExecutionReport(results, Ledger({}), {})
            self._learn(report, time.time())
            self._record_starts(report, self.mset.desired(), time.time())
            self._track_tiers([r.to_json() for r in results])
            self._wake_when_a_hold_ends()
        finally:
            release()
        serves = ", ".join(sorted({r.step.serve for r in results}))
        self._changed()
        if not self._stopping:
            self.trigger(f"start of {serves} ended")

    def _merge_start(self, cycle_id: int, results: list[StepResult]) -> None:
        """Add a start's results to its cycle's journalled outcome."""
        outcome = self._outcomes.get(cycle_id)
        if outcome is None:
            return
        _add_start_results(outcome, results)
        try:
            self.journal.record_outcome(cycle_id, outcome)
        except Exception as exc:  # a pruned cycle, a closed journal: say so, go on
            logger.warning("journal: cannot record the end of a start: {}", exc)

    async def reconcile(self, reasons: tuple[str, ...] = ()) -> CycleSummary:
        """One cycle: reload, observe, plan, execute (or log), journal."""
        t0 = time.monotonic()
        if self._manifest_dirty:  # parsed in a thread: the API answers meanwhile
            await asyncio.to_thread(self._reload_manifest)
        result = await run_cycle(_LoopCycle(self), execute=not self.options.dry_run)
        plan, report = result.plan, result.report
        summary = CycleSummary(result.inputs.now, reasons, plan, None, result.snapshot)
        if self.options.dry_run and result.cycle_id is not None:
            for step in plan.steps:
                logger.info("dry run: would {} {}: {}", step.action, step.serve, step.reason)
            try:
                problems = await asyncio.to_thread(self._executor_for().preflight, plan)
            except Exception as exc:  # docker unreachable: the cycle already said so
                problems = [f"preflight could not run: {exc}"]
            for problem in problems:
                logger.warning("dry run: a real run would refuse this plan: {}", problem)
        if report is not None:
            self._after_execution(result, report)
            summary.report = report
            summary.executed = True
        for b in plan.blocked:
            logger.debug("blocked: {}", b.reason)
        summary.duration_s = time.monotonic() - t0
        self.last = summary
        self.cycles += 1
        self._wake_when_a_hold_ends()
        for hook in self.on_cycle:
            hook(self)
        self._changed()
        return summary

    def _before_plan(self, snap: SnapshotModel, observed: Observed) -> PlanInputs:
        """What the loop learns from an observation before it plans (on the loop's thread)."""
        now = time.time()
        # the answers read this observation from now on, with what the plan does after it
        self._seen = (snap, now, self._mark)
        self.live.forget_before(self._mark)
        self._changed()
        docker_said = None if observed.docker_ok else snap.docker_error or "unreadable"
        if docker_said != self._docker_said:  # said once when it changes, not every cycle
            if docker_said is not None:
                logger.warning("{}; acting on nothing until it can be read", docker_said)
            else:
                logger.info("docker: readable again")
            self._docker_said = docker_said
        if snap.nvml_error != self._nvml_said:  # said once when it changes, not every cycle
            if snap.nvml_error:
                logger.warning("nvml: {}; device figures and drift are unknown", snap.nvml_error)
            else:
                logger.info("nvml: devices readable")
            self._nvml_said = snap.nvml_error
        self._note_deaths(observed, now)
        self._end_finished_requests(observed, now)
        desired = self.desired()
        self.serve_records.observe(desired, observed)
        self._watch.feed(desired, observed)
        if self.footprints is not None:
            self.footprints.observe(observed, self.mset.desired(), now)
        return PlanInputs(desired, self.policy(now), now)

    def _cycle_journal(self, plan: Plan) -> CycleJournal | None:
        """The journal this plan is recorded in; a dry run records a plan once."""
        if self.options.dry_run:
            plan_key = json.dumps([st.to_json() for st in plan.steps], sort_keys=True)
            if plan_key == self._last_dry_plan:
                return None
            self._last_dry_plan = plan_key
        return CycleJournal(
            self.journal, self.mset.digest, _read_files(self.mset), self.options.dry_run
        )

    def _execute(
        self, plan: Plan, desired: DesiredState, observed: Observed, cycle_id: int | None
    ) -> ExecutionReport:
        """Carry ``plan`` out; starts go to the tracker (in a worker thread)."""
        assert cycle_id is not None
        executor = self._executor_for()
        executor.desired = desired
        executor.on_start_done = self._start_done_callback(cycle_id)
        executor.cycle = cycle_id
        self._outcomes[cycle_id] = None  # executing: a start's early end waits
        self.events.publish("plan.begun", cycle=cycle_id, steps=[s.to_json() for s in plan.steps])
        return executor.execute(plan, observed)

    def _complete_outcome(self, cycle_id: int | None, outcome: dict[str, Any]) -> None:
        """Add the starts that ended while the plan executed (on the loop's thread)."""
        assert cycle_id is not None
        _add_start_results(outcome, self._early.pop(cycle_id, []))
        self._outcomes[cycle_id] = outcome
        self.events.publish(
            "plan.ended",
            private=("preflight",),
            cycle=cycle_id,
            ok=bool(outcome.get("ok")),
            stopped_early=bool(outcome.get("stopped_early")),
            steps=len(outcome.get("steps", [])),
            pending=list(outcome.get("pending", [])),
            preflight=list(outcome.get("preflight", [])),
        )
        for old_id in sorted(self._outcomes)[:-32]:  # bounded: old cycles' starts end
            del self._outcomes[old_id]

    def _after_execution(self, result: CycleResult, report: ExecutionReport) -> None:
        """What the loop learns from an execution: backoff, tiers, releases, its stops."""
        now, desired, observed = result.inputs.now, result.inputs.desired, result.observed
        self._record_starts(report, desired, now)
        self._learn(report, now)
        self._track_tiers([r.to_json() for r in report.results])
        for r in report.results:
            if r.step.action is Action.RELEASE and r.outcome is Outcome.FAILED:
                self._unreleased.add(r.step.serve)
        self._hold_after_preflight(result.plan, report, now)
        for r in report.results:
            if r.step.action is Action.STOP and r.outcome is Outcome.OK:
                spec = desired.serves[r.step.serve]
                self._stopped_by_us[spec.name] = observed.container(spec.container).started_at
        # confirm a clean execution at once; after a failure, wait for the next
        # trigger (resync, docker event): re-planning at once spins on a fault
        if report.ok and not self._stopping:
            self.trigger("after execution")

    def _start_done_callback(
        self, cycle_id: int
    ) -> Callable[[list[StepResult], Callable[[], None]], None]:
        loop = self._aio

        def done(results: list[StepResult], release: Callable[[], None]) -> None:
            # on the start's thread: hand the results to the loop's thread
            try:
                if loop is None or loop.is_closed():
                    raise RuntimeError("the loop has ended")
                loop.call_soon_threadsafe(self._start_ended, cycle_id, results, release)
            except RuntimeError:
                release()

        return done

    def _note_deaths(self, observed: Any, now: float) -> None:
        """A serve the loop keeps running (desired or requested) found dead is a failure.

        Failures count up (the backoff doubles) until the serve has stayed up for the
        backoff cap; a start that becomes healthy only lifts the current hold, so a
        serve that crashes after every healthy start backs off ever longer.
        """
        requested = {r.serve for r in self.journal.active_requests()}
        for s in self.mset.desired().serves.values():
            if not observed.docker_ok:
                return
            if s.desired is not DesiredRun.RUNNING and s.name not in requested:
                continue
            if s.name in observed.starting:
                continue  # its start is in progress: that start reports its own failure
            obs = observed.container(s.container)
            state = lifecycle_from_observation(obs)
            if state == "running" and obs.health != "unhealthy" and obs.started_at is not None:
                self._ran_healthy[s.name] = obs.started_at  # its death is after a healthy run
            b0 = self.backoff.get(s.name)
            if (
                state == "running"
                and b0 is not None
                and backoff.crash_loop_over(obs.started_at, now, cap_s=self.options.backoff_cap_s)
            ):
                del self.backoff[s.name]  # it has stayed up: the crash loop is over
            if state != "failed":
                continue
            if obs.started_at is not None and self._stopped_by_us.get(s.name) == obs.started_at:
                continue  # exited non-zero because we stopped it (an eviction), not a crash
            b = self.backoff.setdefault(s.name, Backoff())
            if b.seen_exit == obs.started_at and b.failures:
                continue
            b.seen_exit = obs.started_at
            why = "OOM-killed" if obs.oom_killed else f"exited {obs.exit_code}"
            ran = obs.started_at is not None and self._ran_healthy.get(s.name) == obs.started_at
            self._fail(s.name, f"container {why}", now, after_healthy_run=ran)

    def _fail(self, serve: str, why: str, now: float, *, after_healthy_run: bool = False) -> None:
        b = self.backoff.setdefault(serve, Backoff())
        delay = backoff.record_failure(
            b,
            why,
            now,
            base_s=self.options.backoff_base_s,
            cap_s=self.options.backoff_cap_s,
            after_healthy_run=after_healthy_run,
        )
        if delay > 0:
            logger.warning("{}: {}; failure {}, next try in {:.0f}s", serve, why, b.failures, delay)
        else:
            logger.warning(
                "{}: {}; failure {}, after a healthy run: tried again at once",
                serve,
                why,
                b.failures,
            )

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

    def _learn(self, report: ExecutionReport, now: float) -> None:
        # what the executor counts elastic serves at, as of the engine's answer (not the
        # cycle's start: the same plan may have started the container since)
        for name, figure in report.elastic.items():
            self.journal.set_elastic(name, figure.mib, figure.at)
        for name, why in report.stopped_instead.items():
            if name not in self.no_sleep:
                logger.warning(
                    "{}: stopped instead of put to sleep ({}); stopped, not put to "
                    "sleep, until it starts again or the manifest changes",
                    name,
                    why,
                )
            self.no_sleep.add(name)
        for name, rec in report.sleeps.items():  # put to sleep, or no longer asleep
            if rec is not None:
                self.journal.set_sleeping(rec)
            elif (spec := self.mset.serves.get(name)) is not None:
                self.journal.forget_sleeping(spec.container)
        for r in report.results:
            name = r.step.serve
            if r.step.action in (Action.START, Action.AWAIT_READY):
                if r.outcome is Outcome.FAILED:
                    b0 = self.backoff.get(name)
                    died = r.died_started_at
                    if died is not None and b0 is not None and b0.seen_exit == died:
                        continue  # this death was counted already, when it was observed
                    # the backoff counts from the failure, not from the cycle's start
                    self._fail(name, r.detail, r.ended_at or now)
                    if died is not None:
                        self.backoff[name].seen_exit = died
                elif r.outcome is Outcome.OK and r.step.action is Action.START:
                    self.no_sleep.discard(name)  # a fresh engine: its sleep is tried again
                elif r.outcome is Outcome.OK and r.step.action is Action.AWAIT_READY:
                    b = self.backoff.get(name)
                    if b is not None:
                        b.until = 0.0  # healthy: no hold, but the count stays until it lasts
            elif r.step.action in (Action.SHRINK, Action.GROW):
                if r.outcome is Outcome.FAILED and r.step.action is Action.SHRINK:
                    self.no_shrink.add(name)  # it cannot give what was asked: evict instead
                elif r.outcome is Outcome.ABORTED and r.step.action is Action.SHRINK:
                    # busy (409) or no answer: not a refusal; the requester waits, then
                    # the same shrink is asked again
                    self._fail(
                        r.step.group,
                        f"{name} did not give VRAM back yet: {r.detail}",
                        r.ended_at or now,
                    )
            elif r.step.action in (Action.WAKE, Action.RELOAD) and r.outcome is Outcome.FAILED:
                self._fail(name, r.detail, r.ended_at or now)  # stopped: a cold start, later
            elif r.step.action is Action.STOP and r.outcome is Outcome.OK:
                self.journal.set_elastic(name, None, now)  # the engine forgets its reserve
                if (spec := self.mset.serves.get(name)) is not None:
                    self.journal.forget_sleeping(spec.container)  # a sleeper stopped
                self.no_shrink.discard(name)

    def _hold_after_preflight(self, plan: Plan, report: ExecutionReport, now: float) -> None:
        """The preflight refused these starts: back off each, the others ran."""
        if not report.preflight:
            return
        groups = set(report.refused_groups)
        refused = sorted(
            {s.serve for s in plan.steps if s.action is Action.START and s.group in groups}
        )
        for name in refused:
            own = [p for p in report.preflight if p.startswith(f"{name}:")]
            self._fail(name, "preflight: " + "; ".join(own or report.preflight), time.time())

    def _still_unreleased(self, snap: SnapshotModel) -> list[str]:
        """Serves whose memory did not come back after their stop, and still has not.

        The ledger keeps counting them (fail closed) until NVML attributes no memory to
        the exited container any more, or the container runs again (then it holds its
        reservation as usual). Without NVML nothing can be confirmed: they stay counted.
        """
        for name in sorted(self._unreleased):
            spec = self.mset.serves.get(name)
            c = snap.containers.get(spec.container) if spec is not None else None
            running = c is not None and c.state in ("running", "paused", "restarting")
            back = snap.gpus is not None and not (c is not None and (c.gpu_used_mib or 0) > 0)
            if spec is None or running or back:
                self._unreleased.discard(name)
                if spec is not None and not running:
                    logger.info("{}: NVML shows its memory back; the reservation is released", name)
        return sorted(self._unreleased)

    def _track_tiers(self, steps: list[dict[str, Any]]) -> None:
        """Remember the tiers a plan may have left quiesced; forget the readmitted ones.

        A serve quiesced and not stopped (its group failed: the undo's readmit may have
        failed too), or whose readmit did not succeed, is readmitted by the next plan
        while it runs (a redundant readmit is harmless: the router answers false).
        """
        before = set(self._quiesced)
        # a serve put to sleep keeps its tier quiesced until it is woken, like a stopped one
        stopped = {
            s["serve"]
            for s in steps
            if s["action"] in ("stop", "sleep", "release_to_residual") and s["outcome"] == "ok"
        }
        for s in steps:
            name = s["serve"]
            if s["action"] == "quiesce" and s["outcome"] == "ok" and name not in stopped:
                self._quiesced.add(name)
            elif s["action"] == "readmit":
                if s["outcome"] == "ok":
                    self._quiesced.discard(name)
                else:
                    self._quiesced.add(name)
        self._journal_tiers(before)

    def _journal_tiers(self, before: set[str]) -> None:
        """Keep the journal's record of the tiers left quiesced as ``_quiesced`` is now."""
        try:
            self.journal.set_quiesced(sorted(self._quiesced - before), time.time())
            self.journal.forget_quiesced(sorted(before - self._quiesced))
        except Exception as exc:  # a locked journal: the next change writes it again
            logger.error("journal: cannot record the tiers left quiesced: {}", exc)

    def _recover_tiers(self) -> None:
        """On start: the tiers the journal says were left quiesced; and the last
        journalled cycle may have ended mid-plan (SIGKILL, a crash).

        A dry run skips both: it quiesced and executed nothing, and its journal's plans
        (never carried out, so without an outcome) are no cycle that ended mid-plan.
        """
        if self.options.dry_run:
            return
        self._quiesced |= set(self.journal.quiesced())
        if self._quiesced:
            logger.info(
                "tiers of {} were left quiesced: readmitted while their serves run",
                ", ".join(sorted(self._quiesced)),
            )
        before = set(self.journal.quiesced())
        try:
            self._recover_from_cycles()
        finally:
            self._journal_tiers(before)

    def _recover_from_cycles(self) -> None:
        ids = self.journal.cycle_ids()
        if not ids:
            return
        # starts handed off by recent cycles that never reported their end: their
        # readmit may not have happened
        for cid in ids[-32:-1]:
            (rec,) = self.journal.cycles(cycle=cid)
            if rec.outcome is not None:
                self._readmit_pending(rec.plan, rec.outcome)
        (last,) = self.journal.cycles(cycle=ids[-1])
        if last.outcome is not None:
            self._track_tiers(list(last.outcome.get("steps", [])))
            self._readmit_pending(last.plan, last.outcome)
            if self._quiesced:
                logger.info(
                    "starts were in progress when the last controller ended: tiers of {} "
                    "are readmitted while they run",
                    ", ".join(sorted(self._quiesced)),
                )
            return
        for s in last.plan.get("steps", []):
            if s.get("action") in ("quiesce", "readmit"):
                self._quiesced.add(str(s.get("serve")))
        if self._quiesced:
            logger.info(
                "the last cycle ended mid-plan: tiers of {} are readmitted while they run",
                ", ".join(sorted(self._quiesced)),
            )

    def _readmit_pending(self, plan: dict[str, Any], outcome: dict[str, Any]) -> None:
        pending = set(outcome.get("pending") or [])
        for s in plan.get("steps", []):
            if s.get("action") == "readmit" and s.get("serve") in pending:
                self._quiesced.add(str(s.get("serve")))

    def _end_finished_requests(self, observed: Any, now: float) -> None:
        """Expired requests end once their serve is down; requests for gone serves end."""
        serves = self.mset.desired().serves
        for req in self.journal.active_requests():
            spec = serves.get(req.serve)
            if spec is None:
                self.journal.end_request(req.serve, now)
                self.events.publish("request.closed", serve=req.serve, reason="serve gone")
                continue
            if req.serve in observed.starting:
                continue  # its start is in progress: it ends once the serve is down
            ends = request_end(req, self.mset.desired().serves.get(req.serve), observed)
            if ends.expired(now) and not observed.container(spec.container).holds:
                self.journal.end_request(req.serve, now)
                self.events.publish("request.closed", serve=req.serve, reason="ended, serve down")


@dataclass(frozen=True, slots=True)
class _LoopCycle:
    """The loop's parts of :func:`controller.service.cycle.run_cycle`."""

    controller: Controller

    def observe(self) -> SnapshotModel:
        return self.controller._observe()

    def inputs(self, snap: SnapshotModel, observed: Observed) -> PlanInputs:
        return self.controller._before_plan(snap, observed)

    def plan(self, inputs: PlanInputs, observed: Observed) -> Plan:
        return plan_transitions(inputs.desired, observed, inputs.policy, inputs.now)

    def journal(self, plan: Plan) -> CycleJournal | None:
        return self.controller._cycle_journal(plan)

    def execute(
        self, plan: Plan, inputs: PlanInputs, observed: Observed, cycle_id: int | None
    ) -> ExecutionReport:
        return self.controller._execute(plan, inputs.desired, observed, cycle_id)

    def outcome(self, cycle_id: int | None, outcome: dict[str, Any]) -> None:
        self.controller._complete_outcome(cycle_id, outcome)


def _add_start_results(outcome: dict[str, Any], results: list[StepResult]) -> None:
    """A start's results join its cycle's outcome; it is no longer pending."""
    if not results:
        return
    outcome["steps"] = [*outcome.get("steps", []), *(r.to_json() for r in results)]
    ok = all(r.outcome is Outcome.OK for r in results)
    outcome["ok"] = bool(outcome.get("ok", True)) and ok
    ended = {r.step.serve for r in results}
    outcome["pending"] = [p for p in outcome.get("pending", []) if p not in ended]


def _epoch_or_none(value: str | float | None) -> float | None:
    try:
        return epoch_seconds(value)
    except ValueError:
        return None


def _path_key(path: Path) -> Path:
    """``path`` resolved, or only made absolute where it cannot be (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


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
