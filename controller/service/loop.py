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
first death after a healthy run is tried again at once (``statemachine/lifecycle/backoff.py``),
and the loop wakes itself when a hold ends. With docker unreadable the planner fails
closed, so nothing is started or stopped.

Restart safety: a single-instance lock on the state directory; on start, the view is
rebuilt from the host, never from memory, so nothing is started twice and no
reservation is counted twice. Each serve's record (``controller/service/records.py``:
its lifecycle state, kept in the journal, and the loop's marks of it) is loaded and
moved on by every observation; the executor takes its machines from it. SIGTERM /
SIGINT stop the loop after the current step.

The loop is in two parts. :class:`Controller` is the loop itself, free of the domain:
its triggers and wake-ups, the resync, its start, main loop and shutdown
(:class:`_LoopLife`), and the on-demand requests it records — over the loop's state,
one value (:class:`controller.service.loop_state.LoopState`, which it extends with the
loop around it). Each cycle is the reconciler's
(:class:`controller.service.reconciler.Reconciler`, with what the loop learns in
``lessons``); it asks the loop for cycles only through the triggers and ``wake_at``.

This module must not decide what to do (the planner does), run a cycle's steps itself
(the reconciler does) nor touch docker except through the adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from controller.adapters import health
from controller.adapters.sleep import SleepClient
from controller.service import overlays
from controller.service.footprints import FootprintRecorder
from controller.service.live import StepEnded
from controller.service.loop_state import LoopState, RunOptions
from controller.service.manifest_reread import watch_manifests
from controller.service.reconciler import Reconciler
from controller.service.starts import supervise_orphans
from controller.service.view_sources import CycleSummary
from controller.store.journal import (
    AlreadyRunning,
    Journal,
    StateDirError,
    StateLock,
    journal_path,
)
from statemachine.lifecycle.backoff import Backoff

__all__ = ["Backoff", "Controller", "CycleSummary", "RunOptions"]

#: the loop's wake-up comes this long after a backoff hold's end (seconds): the cycle it
#: asks for reads the clock again, and must find the hold over
_HOLD_MARGIN_S = 0.01


@dataclass
class Controller(LoopState):
    """The loop over its state. Create, then ``await run()``."""

    on_cycle: list[Callable[[Controller], None]] = field(default_factory=list)
    #: coroutines run beside the loop for its lifetime (the HTTP API), cancelled at stop
    services: list[Callable[[Controller], Coroutine[Any, Any, None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        #: the reasons given for the next cycle (coalesced into it)
        self.reasons: list[str] = []
        self._wake = asyncio.Event()
        self._lock = StateLock(self.state_dir)
        self._stopping = False
        self._hold_timer: asyncio.TimerHandle | None = None  # wakes the loop at a hold's end
        #: runs each cycle over this state, asking this loop for the next ones
        self.reconciler = Reconciler(self, self)

    # ------------------------------------------------------------------ triggers
    @property
    def stopping(self) -> bool:
        """The loop is stopping (``stop`` was called): it asks for no more cycles."""
        return self._stopping

    def trigger(self, reason: str) -> None:
        """Ask for a cycle (coalesced with any other pending request)."""
        self.reasons.append(reason)
        self._wake.set()

    def wake_at(self, when: float | None, reason: str) -> None:
        """Ask for a cycle a hair past epoch ``when`` (on the loop's thread; ``None``:
        none), replacing the last such wake-up: one timer at a time."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        loop, now = self.aio, time.time()
        if loop is None or loop.is_closed() or when is None or self._stopping:
            return
        # a hair past the end: the cycle's own clock must find the hold over
        self._hold_timer = loop.call_later(when - now + _HOLD_MARGIN_S, self.trigger, reason)

    def request_up(self, serve: str, ttl_s: float | None) -> None:
        """Record an on-demand request (durable) and ask for a cycle."""
        # without a TTL of its own the request takes the serve's idle_ttl_s, measured as
        # idleness where the serve has a source of in-flight counts (statemachine.planning.idleness)
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
        """One cycle (the reconciler's), then the hooks that follow each cycle."""
        summary = await self.reconciler.reconcile(reasons)
        for hook in self.on_cycle:
            hook(self)
        self.changes.changed()
        return summary

    async def watch_manifests(self) -> None:
        """Watch the manifests' folders while the loop runs (see service.manifest_reread):
        an edit marks the manifest set to be read again and asks for a cycle."""
        o = self.options
        await watch_manifests(o.manifests, o.debounce_ms, o.settle_ms, self._manifest_changed)

    def _manifest_changed(self, reason: str) -> None:
        self.manifest_dirty = True
        self.trigger(reason)

    def read_docker_events(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: Docker's event stream -> triggers (see controller.service.docker_events)."""
        self.docker_events.run(lambda reason: loop.call_soon_threadsafe(self.trigger, reason))


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
        c.aio = loop
        c.starts.journal = None if dry_run else c.journal
        c.serve_records.attach(c.journal)  # each serve's lifecycle, as last left
        if not dry_run:
            c.footprints = FootprintRecorder(
                c.reconciler.lessons.footprint_reading,
                journal=c.journal,
                settle_s=c.options.settle_s,
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
        c.router_notice.say(c.mset, c.options.router_url)
        tasks = [
            asyncio.create_task(c.watch_manifests(), name="watch-manifests"),
            asyncio.create_task(self._resync(), name="resync"),
        ] + [asyncio.create_task(service(c)) for service in c.services]
        c.docker_events.names = frozenset(
            overlays.observed_names(
                c.journal, c.mset, c.serve_records.started(), c.journal.declared()
            )
        )
        threading.Thread(target=c.read_docker_events, args=(loop,), daemon=True).start()
        c.reconciler.lessons.recover_tiers()
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
            reasons = tuple(c.reasons)
            c.reasons.clear()
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
            executor = c.reconciler.executor()
            if executor.sleep is None and any(s.sleep for s in c.mset.desired().serves.values()):
                executor.sleep = SleepClient()  # an HTTP client: its TLS context, ~20 ms
            health.warm()
            c.host.observe_now(c.mset)
            if c.footprints is not None:
                c.reconciler.lessons.footprint_reading()
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
