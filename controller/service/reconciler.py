"""The reconciler: one cycle of ``vramctl run`` over the loop's state, and its executor.

:class:`Reconciler` supplies the loop's parts of
:func:`controller.service.cycle.run_cycle` — observe the host with what the journal
and the loop know laid over it, learn from the observation, plan, journal, hand the
plan to the executor, complete the outcome — over one value, the loop's state
(:class:`controller.service.loop_state.LoopState`). It re-reads the manifest set when
its files changed, keeps the executor of the manifest in force (built again after a
reload, on the last one's connections), and passes what each execution taught to
:class:`controller.service.lessons.Lessons`. An ``up`` goes from the journal's request
through :meth:`Reconciler.execute` to the executor, never back through the loop.

This module must not decide what to do (the planner does), touch docker except
through the executor and the host readers, nor know how cycles are triggered (it asks
the loop only through :class:`controller.service.lessons.LoopHandle`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from controller.service import overlays
from controller.service.cycle import CycleJournal, run_cycle
from controller.service.executor import ExecutionReport, Executor
from controller.service.inflight import observe_in_flight
from controller.service.lessons import Lessons, LoopHandle
from controller.service.loop_state import LoopState
from controller.service.manifest_reread import read_manifests
from controller.service.observe import observe_probes, observe_self_sleep
from controller.service.overlay_rules import StartedRecords
from controller.service.view_sources import CycleSummary
from controller.service.wiring import make_executor, read_gpus
from controller.snapshot import SnapshotModel, StartedWithModel, StartingModel
from statemachine.answers.pending import asked_as_of
from statemachine.answers.situation import Situation
from statemachine.domain.types import Observed, OnDemandRequest
from statemachine.planning.plan_types import (
    Plan,
)


@dataclass(slots=True)
class Reconciler:
    """One cycle at a time over the loop's state (:func:`run_cycle`'s steps)."""

    state: LoopState
    loop: LoopHandle
    lessons: Lessons = field(init=False)
    #: the executor of the manifest in force, once built (``None``: built at next use)
    current_executor: Executor | None = None
    _stale_executor: Executor | None = None  # the last manifest's: its connections
    _last_dry_plan: str = ""  # a dry run journals and logs a plan once, not every cycle
    _mark: int = 0  # the live ledger's mark of the observation being taken
    #: the requests recorded when the observation being taken began (asked_as_of)
    _asked_then: tuple[OnDemandRequest, ...] = ()
    #: what the observation being taken found for the journal (written once taken in)
    _learned: overlays.Learned = field(default_factory=overlays.Learned)

    def __post_init__(self) -> None:
        self.lessons = Lessons(self.state, self.loop)

    async def reconcile(self, reasons: tuple[str, ...]) -> CycleSummary:
        """One cycle: reload, observe, plan, execute (or log), journal."""
        s = self.state
        t0 = time.monotonic()
        if s.manifest_dirty:  # parsed in a thread: the API answers meanwhile
            await asyncio.to_thread(self.reread_manifest)
        result = await run_cycle(self, execute=not s.options.dry_run)
        plan, report = result.plan, result.report
        summary = CycleSummary(result.inputs.now, reasons, plan, None, result.snapshot)
        if s.options.dry_run and result.cycle_id is not None:
            await self._say_dry_run(plan)
        if report is not None:
            self.lessons.after_execution(result, report)
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
        s.last = summary
        s.cycles += 1
        self.lessons.wake_when_a_hold_ends()
        return summary

    async def _say_dry_run(self, plan: Plan) -> None:
        """A dry run's plan: each step it would take, and what a real run would refuse."""
        for step in plan.steps:
            logger.info("dry run: would {} {}: {}", step.action, step.serve, step.reason)
        try:
            problems = await asyncio.to_thread(self.executor().preflight, plan)
        except Exception as exc:  # docker unreachable: the cycle already said so
            problems = [f"preflight could not run: {exc}"]
        for problem in problems:
            logger.warning("dry run: a real run would refuse this plan: {}", problem)

    def observe(self) -> SnapshotModel:
        """The host, with what the journal and the loop know laid over it (worker thread)."""
        s = self.state
        # the live ledger's events up to here are in what this observation sees
        self._mark = s.live.mark()
        self._asked_then = s.requests()  # a request made after this waits for the next cycle
        # read before the containers: a start that ends in between has its container
        # running by then, so it is counted either way
        starting = s.starts.snapshot()
        ran = s.starts.ran()
        records = s.serve_records.started()  # the serves' placements
        known = s.journal.declared()
        names = overlays.observed_names(s.journal, s.mset, records, known)
        s.docker_events.follow_observed(names)
        snap = s.host.observe(names, s.nvml)
        # and by id: Docker's rename event carries the new name only, so a declared
        # container renamed away (and whatever it does after) is in the stream by its id
        ids = tuple(sorted({m.id[:12] for m in snap.containers.values() if m.id}))
        s.docker_events.follow_observed(names, ids)
        # a start that ended (``ran``) is recorded by its own end, on the roles it
        # reserved: the start records leave it alone as they leave one in progress
        snap.starting = {
            name: StartingModel(gpu_roles=list(st.gpu_roles), mib=st.mib)
            for name, st in {**starting, **ran}.items()
        }
        desired = s.mset.desired()
        snap.started_with, started = s.overlays.started_in_force(desired, snap, records, known)
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
        self._learned = self._observe_beside(snap, started)
        return snap

    def _observe_beside(self, snap: SnapshotModel, started: StartedRecords) -> overlays.Learned:
        """What the observation lays over the containers: probes, sleep, reserves, counts;
        and what the journal should learn from it (written by :meth:`inputs`)."""
        s = self.state
        # the health probes need only the containers: asked beside the engines' sleep
        # states and in-flight counts (each a loopback call per serve) rather than after
        probes = s.readers.submit(observe_probes, snap, s.mset, s.prober)
        self_asleep = s.readers.submit(observe_self_sleep, snap, s.mset, s.self_sleep)
        at = time.time()
        snap.elastic, void = overlays.elastic_in_force(s.journal, s.mset, snap)
        snap.sleep, sleepers = s.overlays.sleep_in_force(
            s.journal.sleeping(), s.mset.desired(), snap
        )
        snap.quiesced = sorted(s.serve_records.quiesced)
        snap.unreleased = self.lessons.still_unreleased(snap)
        opts = s.options
        snap.in_flight = observe_in_flight(
            snap,
            s.mset,
            s.in_flight,
            router_url=opts.router_url,
            router_token_file=opts.router_token_file,
        )
        snap.probes = probes.result()
        snap.self_asleep = self_asleep.result()
        return overlays.Learned(started, sleepers, void, at)

    def inputs(self, snap: SnapshotModel, observed: Observed) -> Situation:
        """What the loop learns from an observation before it plans (on the loop's
        thread), and the situation it plans from."""
        s = self.state
        now = time.time()
        # the answers read this observation from now on, with what the plan does after it
        self.lessons.take_in(self._learned)  # what the observation found, journalled
        self._learned = overlays.Learned()
        s.seen = (snap, now, self._mark)
        s.live.forget_before(self._mark)
        s.changes.changed()
        s.notices.say(snap, observed)  # said once when it changes, not every cycle
        self.lessons.note_deaths(observed, now)
        self.lessons.end_finished_requests(observed, now)
        asked = asked_as_of(self._asked_then, s.requests())
        desired = s.desired(asked)
        s.serve_records.observe(desired, observed)
        s.watch.feed(desired, observed)
        if s.footprints is not None:
            s.footprints.observe(observed, s.mset.desired(), now)
        return s.situation_for(observed, now, asked)

    def plan(self, inputs: Situation) -> Plan:
        """The plan the situation gives."""
        return inputs.plan

    def journal(self, plan: Plan) -> CycleJournal | None:
        """The journal this plan is recorded in; a dry run records a plan once."""
        s = self.state
        if s.options.dry_run:
            plan_key = json.dumps([st.to_json() for st in plan.steps], sort_keys=True)
            if plan_key == self._last_dry_plan:
                return None
            self._last_dry_plan = plan_key
        # the manifest files in force, as loaded (never re-read: the journal records the
        # content its digest was computed over)
        files = dict(s.mset.texts)
        return CycleJournal(s.journal, s.mset.digest, files, s.options.dry_run)

    def execute(self, plan: Plan, inputs: Situation, cycle_id: int | None) -> ExecutionReport:
        """Carry ``plan`` out; starts go to the tracker (in a worker thread)."""
        assert cycle_id is not None
        s = self.state
        executor = self.executor()
        executor.desired = inputs.placed
        executor.on_start_done = self.lessons.start_done_callback(cycle_id)
        executor.cycle = cycle_id
        s.start_outcomes.executing(cycle_id)  # executing: a start's early end waits
        s.events.publish("plan.begun", cycle=cycle_id, steps=[st.to_json() for st in plan.steps])
        return executor.execute(plan, inputs.observed)

    def outcome(self, cycle_id: int | None, outcome: dict[str, Any]) -> None:
        """Add the starts that ended while the plan executed (on the loop's thread)."""
        assert cycle_id is not None
        s = self.state
        s.start_outcomes.complete(cycle_id, outcome)
        s.events.publish(
            "plan.ended",
            private=("preflight",),
            cycle=cycle_id,
            ok=bool(outcome.get("ok")),
            stopped_early=bool(outcome.get("stopped_early")),
            steps=len(outcome.get("steps", [])),
            pending=list(outcome.get("pending", [])),
            preflight=list(outcome.get("preflight", [])),
        )

    def reread_manifest(self) -> None:
        """Re-read the manifest set: a valid edit comes into force (its executor is built
        again, its declarations journalled); an invalid one is reported, the last good
        set stays in force."""
        s = self.state
        s.manifest_dirty = False
        read = read_manifests(s.options.manifests)
        if read.mset is None:
            s.manifest_error = read.errors
            if read.issues is not None:
                s.manifest_issues = read.issues
            return
        if s.manifest_error:
            logger.info("manifest: valid again")
        s.manifest_error, s.manifest_issues = [], []
        mset = read.mset
        if mset.digest != s.mset.digest:
            logger.info("manifest: reloaded ({} serves)", len(mset.serves))
            for warning in mset.warnings:  # as `validate` and `run`'s start print them
                logger.warning("manifest: {}", warning)
            s.mset = mset
            s.no_sleep.clear()  # an edit may have fixed the engine's sleep flag
            self._stale_executor = self.current_executor or self._stale_executor
            self.current_executor = None  # built again for this manifest, same connections
            overlays.remember_declared(lambda: s.journal, s.mset.desired())
            s.router_notice.say(s.mset, s.options.router_url)

    def executor(self) -> Executor:
        """The executor of the manifest in force (built on first use after a reload, on
        the last one's connections)."""
        if self.current_executor is None:
            self.current_executor = self._build_executor()
            self._stale_executor = None
        return self.current_executor

    def _build_executor(self) -> Executor:
        s = self.state
        executor = make_executor(
            s.mset,
            router_url=s.options.router_url,
            router_token_file=s.options.router_token_file,
            stop_event=s.stop_event,
            observe_now=lambda: s.host.observe_now(s.mset),
            starts=s.starts,
            gpus=lambda: read_gpus(s.nvml),
            footprints=s.footprints,
            reuse=self._stale_executor,
        )
        executor.events, executor.ledger_watch = s.events, s.ledger_watch
        executor.live = s.live
        executor.records = s.serve_records
        executor.on_sleep = lambda name, rec: overlays.journal_sleep(lambda: s.journal, name, rec)
        return executor
