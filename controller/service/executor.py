"""The executor: carries out a plan's steps in order. The only code that mutates.

``Executor.execute`` walks a :class:`statemachine.planning.plan_types.Plan` step by step: each step
goes through the table of step handlers (:mod:`controller.service.steps.dispatch`:
containers, router, elastic and sleep steps, each a function of the run's explicit
context, :class:`~controller.service.steps.context.RunContext`), the serves' lifecycle
machines move with the outcomes (:mod:`controller.service.steps.lifecycle`), and the
run's own reservation ledger stays true to what the containers hold.

When a step fails, the rest of its *group* (the steps serving the same intent, e.g.
one requester and its victims) is skipped and what the group left half-done is undone
(:mod:`controller.service.steps.undo`); other groups go on, and the ledger refuses any
reserve whose room did not materialise. Transient faults are retried by the adapters
(tenacity, bounded); what reaches here is final for this plan.

``preflight`` (:mod:`controller.service.preflight`) checks, before any mutation, what
can be known up front; the groups it refuses are skipped, the rest runs. With a
:class:`~controller.service.starts.StartTracker`, each start (start, await_ready,
readmit) runs on a thread of its own beside the plan (``_StartJob``).

This module keeps the executor's public names (the step results, the report, the
config) importable from here. It must not decide *what* to do (that is the planner's)
and must not read docker or NVML except through the adapters handed to it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from loguru import logger

from controller.adapters.docker.actions import DockerActions
from controller.adapters.elastic import ElasticClient
from controller.adapters.router import RouterClient
from controller.adapters.sleep import SleepClient
from controller.manifest.runtime import ServeRuntime
from controller.service.events import EventBus, LedgerWatch
from controller.service.footprints import NO_FOOTPRINTS, Footprints
from controller.service.live import LiveLedger
from controller.service.preflight import PreflightProblem, preflight_problems, refuse_dependents
from controller.service.records import RecordStore
from controller.service.starts import StartTracker
from controller.service.steps import dispatch, undo
from controller.service.steps.context import ExecutorConfig, GpuReader, RunContext
from controller.service.steps.dispatch import IMPLEMENTED_ACTIONS
from controller.service.steps.lifecycle import machines_for
from controller.service.steps.results import (
    ElasticFigure,
    ExecutionReport,
    Outcome,
    StepError,
    StepResult,
    UndoFault,
)
from controller.service.steps.undo import undo_text
from controller.store.journal import SleepRecord
from statemachine.domain.types import DesiredState, GpuObs, Observed
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)

__all__ = [
    "IMPLEMENTED_ACTIONS",
    "ElasticFigure",
    "ExecutionReport",
    "Executor",
    "ExecutorConfig",
    "GpuReader",
    "Outcome",
    "PreflightProblem",
    "StepError",
    "StepResult",
    "UndoFault",
]


def _no_gpus() -> tuple[GpuObs, ...] | None:
    return None


class Executor:
    """Runs plans against the host through the mutating adapters."""

    def __init__(
        self,
        desired: DesiredState,
        *,
        docker: DockerActions,
        runtime: Mapping[str, ServeRuntime] | None = None,
        router: RouterClient | None = None,
        elastic: ElasticClient | None = None,
        sleep: SleepClient | None = None,
        gpus: GpuReader = _no_gpus,
        config: ExecutorConfig | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        stop_event: threading.Event | None = None,
        observe_now: Callable[[], Observed] | None = None,
        starts: StartTracker | None = None,
        on_start_done: Callable[[list[StepResult], Callable[[], None]], None] | None = None,
        footprints: Footprints | None = None,
    ) -> None:
        self.desired = desired
        self.docker = docker
        #: serve -> how its steps are carried out (timeouts, health path, ``up``); a serve
        #: missing here gets the manifest's defaults
        self._runtime: Mapping[str, ServeRuntime] = runtime or {}
        self.router = router
        self.elastic = elastic or ElasticClient()
        #: the engines' sleep API (made when a plan first needs it)
        self.sleep = sleep
        self.gpus = gpus
        self.config = config or ExecutorConfig()
        self.on_step = on_step
        #: told at once when a serve is confirmed asleep (its record) or no longer asleep
        #: (None), container name first: the loop journals it before the plan ends
        self.on_sleep: Callable[[str, SleepRecord | None], None] | None = None
        self.stop_event = stop_event or threading.Event()
        #: a fresh reading of the containers, to admit each reserve against the host as
        #: it is now (``None``: against the plan's observation, kept true by the steps)
        self.observe_now = observe_now
        #: with a tracker, each start (start, await_ready, readmit) runs on a thread of
        #: its own beside the plan and the loop; ``on_start_done`` gets its results
        self.starts = starts
        self.on_start_done = on_start_done
        #: measures each start and stop (device readings around them; docs/limits.md)
        self.footprints: Footprints = footprints or NO_FOOTPRINTS
        # serve -> (action, to_mib, reserve_mib) of a resize that got no answer: the same
        # step asks for the same reserve again (idempotent), not a new card-wide figure
        self.unanswered: dict[str, tuple[str, int, int | None]] = {}
        #: where transitions, step outcomes and ledger changes are published (the loop
        #: hands its own bus and watch; the cycle id of the plan executing now)
        self.events = EventBus()
        self.ledger_watch = LedgerWatch(self.events)
        self.cycle: int | None = None
        #: where each step's beginning and end are told (what the answers count live)
        self.live: LiveLedger | None = None
        #: the serves' records: the machines come from them and go back to them
        self.records: RecordStore | None = None

    def runtime(self, name: str) -> ServeRuntime:
        """How serve ``name``'s steps are carried out (the manifest's defaults if unknown)."""
        rt = self._runtime.get(name)
        return ServeRuntime.default(name) if rt is None else rt

    # ------------------------------------------------------------------ preflight
    def preflight(self, plan: Plan, observed: Observed | None = None) -> list[str]:
        """What is knowable now and would make the plan fail half-way; empty when fine."""
        return [p.text for p in self.preflight_problems(plan, observed)]

    def preflight_problems(
        self, plan: Plan, observed: Observed | None = None
    ) -> list[PreflightProblem]:
        """Each problem the preflight finds, with the plan groups it refuses
        (:func:`controller.service.preflight.preflight_problems`; ``observed``: the
        plan's, for what its starts will tell `up`)."""
        return preflight_problems(plan, self, observed)

    # ------------------------------------------------------------------- execute
    def execute(
        self, plan: Plan, observed: Observed, *, skip_preflight: bool = False
    ) -> ExecutionReport:
        """Carry out ``plan`` (made from ``observed``); never raises for host faults.

        With a :class:`~controller.service.starts.StartTracker` each start (its start,
        await_ready and readmit steps) is handed to a thread of its own once its
        reserve is admitted, and this returns without waiting for it: the start's
        results reach ``on_start_done``. Without one, everything runs here, in order.
        """
        ledger = ledger_from_observed(self.desired, observed)
        machines = machines_for(self.records or RecordStore(), self.desired, plan, observed)
        report = ExecutionReport([], ledger, {})
        refused: dict[str, list[str]] = {}  # group -> the preflight problems that refuse it
        if not skip_preflight:
            refused = self._refusals(plan, report, observed)
            if report.preflight and all(st.group in refused for st in plan.steps):
                report.lifecycles = {n: str(m.state) for n, m in machines.items()}
                return report
        run = _Run(self, ledger, machines, observed)
        jobs: dict[str, _StartJob] = {}
        steps = list(plan.steps)
        i = 0
        while i < len(steps):
            step = steps[i]
            i += 1
            if self.stop_event.is_set() and not report.stopped_early:
                report.stopped_early = True
                run.compensate_all("the controller is stopping")
            why = _skip_reason(step, report, refused, run, jobs)
            if why is not None:
                self._emit(
                    report, StepResult(step, Outcome.SKIPPED, why, 0.0, ended_at=time.time())
                )
                continue
            if self.starts is not None and step.action is Action.START:
                chain = [step]
                while (
                    i < len(steps)
                    and steps[i].serve == step.serve
                    and steps[i].action in (Action.AWAIT_READY, Action.READMIT)
                ):
                    chain.append(steps[i])
                    i += 1
                jobs[step.serve] = self._detach(run, chain)
                continue
            self._emit(report, self._attempt(run, step))
            self.ledger_watch.feed(run.ledger, "plan")
        run.compensate_all("the plan ended")
        self.ledger_watch.feed(run.ledger, "plan")
        report.ledger = run.ledger
        report.elastic = dict(run.elastic)
        report.left_quiesced = dict(run.left_quiesced)
        report.sleeps = dict(run.sleeps)
        report.sleep_unsupported = dict(run.sleep_unsupported)
        report.stopped_instead = dict(run.stopped_instead)
        report.undo_faults = list(run.undo_faults)
        report.lifecycles = {n: str(m.state) for n, m in machines.items()}
        if self.records is not None:  # a start beside the plan settles its own machine
            self.records.settle({n: s for n, s in report.lifecycles.items() if n not in jobs})
        return report

    def _refusals(
        self, plan: Plan, report: ExecutionReport, observed: Observed
    ) -> dict[str, list[str]]:
        """The preflight: group -> the problems that refuse it (recorded in ``report``)."""
        refused: dict[str, list[str]] = {}
        problems = self.preflight_problems(plan, observed)
        report.preflight = [p.text for p in problems]
        for problem in problems:
            logger.error("preflight: {}", problem.text)
            for g in problem.groups:
                refused.setdefault(g, []).append(problem.text)
        refuse_dependents(plan, self.desired, refused)
        report.refused_groups = sorted(refused)
        return refused

    def _attempt(
        self,
        run: _Run,
        step: Step,
        before_told: Callable[[StepResult], None] | None = None,
    ) -> StepResult:
        """One step, told to the live ledger as it begins and ends (``before_told`` gets
        its result before its end is told)."""
        live = self.live
        token = live.step_begun(step) if live is not None else 0
        result = self._attempt_step(run, step)
        if before_told is not None:
            before_told(result)
        if live is not None:
            figure = run.elastic.get(step.serve) if step.action in _RESIZES else None
            mib = figure.mib if figure is not None else -1
            live.step_ended(token, step, str(result.outcome), result.detail, mib)
        return result

    def _attempt_step(self, run: _Run, step: Step) -> StepResult:
        """One step: its result, with the failed group compensated."""
        t0 = time.monotonic()
        try:
            detail = run.do(step)
            return StepResult(step, Outcome.OK, detail, time.monotonic() - t0, ended_at=time.time())
        except Exception as exc:
            if not isinstance(exc, StepError):
                logger.exception("{} {}: unexpected error", step.serve, step.action)
                exc = StepError(f"unexpected error: {type(exc).__name__}: {exc}")
            outcome = Outcome.ABORTED if exc.aborted else Outcome.FAILED
            if exc.interrupted:
                outcome = Outcome.INTERRUPTED
            result = StepResult(
                step,
                outcome,
                str(exc),
                time.monotonic() - t0,
                exc.logs,
                ended_at=time.time(),
                died_started_at=exc.died_started_at,
            )
            run.failed_groups.add(step.group)
            if step.action in (Action.START, Action.AWAIT_READY) and not exc.interrupted:
                self.footprints.start_failed(run.serve(step.serve))
            elif step.action in (Action.STOP, Action.RELEASE):
                self.footprints.stop_failed(run.serve(step.serve))
            if not exc.interrupted:
                faults = run.compensate(step)
                if faults:  # the step keeps its own outcome; the faults join its detail
                    result = replace(result, detail=f"{result.detail}; {undo_text(faults)}")
            return result

    def _detach(self, run: _Run, chain: list[Step]) -> _StartJob:
        """Hand a start (start, await_ready, readmit) to a thread of its own."""
        assert self.starts is not None
        first = chain[0]
        s = self.desired.serves[first.serve]
        token = run.tokens.pop(s.name, None)
        if token is None:  # a serve outside the ledger has no reserve step
            token = self.starts.begin(s.name, s.gpu_roles, first.mib or 0)
        run.reserved.pop(s.name, None)  # settled by the start's own run if it fails
        sub = _Run(self, run.ledger, {s.name: run.machines[s.name]}, run.observed)
        sub.detached = True
        sub.parent = run
        sub.reserved[s.name] = first.group
        job = _StartJob(self, sub, chain, token)
        thread = threading.Thread(target=job.run, name=f"start-{s.name}", daemon=True)
        self.starts.attach(s.name, thread)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: the start never began
            self.starts.end(s.name, token)
            raise StepError(f"cannot start a thread for {s.name}'s start: {exc}") from None
        return job

    def _emit(self, report: ExecutionReport, result: StepResult) -> None:
        report.results.append(result)
        self._emit_result(result, self.cycle)

    def _emit_result(self, result: StepResult, cycle: int | None) -> None:
        """Log one step's result, publish it (``cycle``: its plan's) and hand it to ``on_step``."""
        step = result.step
        self.events.publish(
            "step",
            private=("detail",),
            cycle=cycle,
            action=str(step.action),
            serve=step.serve,
            group=step.group,
            outcome=str(result.outcome),
            detail=result.detail,
            duration_s=round(result.duration_s, 3),
        )
        level = "INFO" if result.outcome is Outcome.OK else "WARNING"
        if result.outcome is Outcome.FAILED:
            level = "ERROR"
        logger.bind(
            serve=result.step.serve,
            action=str(result.step.action),
            outcome=str(result.outcome),
            duration_s=round(result.duration_s, 3),
        ).log(
            level,
            "{serve} {action}: {outcome} in {duration:.2f}s: {detail}",
            serve=result.step.serve,
            action=result.step.action,
            outcome=result.outcome,
            duration=result.duration_s,
            detail=result.detail,
        )
        if self.on_step is not None:
            self.on_step(result)


class _Run(RunContext):
    """One execution's context, with the step table and the undo at hand."""

    def do(self, step: Step) -> str:
        """Carry out ``step`` (:func:`controller.service.steps.dispatch.do`)."""
        return dispatch.do(self, step)

    def compensate(self, failed: Step) -> list[UndoFault]:
        """Undo what the failed step's group left half-done; the faults it met."""
        return undo.compensate(self, failed)

    def compensate_all(self, why: str) -> None:
        """Undo every group still half-done (the plan ended, or the controller stops)."""
        undo.compensate_all(self, why)

    def undo_group(self, group: str, after: str, failed: Step | None) -> list[UndoFault]:
        """Undo ``group`` (:func:`controller.service.steps.undo.undo_group`)."""
        return undo.undo_group(self, group, after, failed)


class _StartJob:
    """One start carried out beside the plan: its steps in order, then the tracker.

    The start stays in the tracker until whoever gets its results (the loop, through
    ``on_start_done``) has learned from them and calls the release it is handed: a
    failure is known (backoff) before the serve can be planned again.
    """

    def __init__(self, ex: Executor, run: _Run, chain: list[Step], token: int) -> None:
        self.ex = ex
        self.run_ = run
        self.chain = chain
        self.token = token
        self.results: list[StepResult] = []
        self.on_done = ex.on_start_done  # as when the start began (the loop sets it per cycle)
        self.cycle = ex.cycle
        self.done = threading.Event()
        self.ok = False

    def release(self) -> None:
        """End the start in the tracker (this start only, never a newer one)."""
        assert self.ex.starts is not None
        self.ex.starts.end(self.chain[0].serve, self.token)

    def _healthy(self, result: StepResult) -> None:
        """An await_ready that ended healthy: the start leaves the tracker's starts in
        progress *before* the live ledger is told the serve runs. An observation takes
        the live ledger's mark, then reads the tracker: it sees the start either in
        progress with the ready after its mark (laid over it), or ended; never in
        progress with the ready already behind its mark, which would count a serve
        that runs as starting (never a victim) until the next observation."""
        if result.step.action is Action.AWAIT_READY and result.outcome is Outcome.OK:
            assert self.ex.starts is not None
            self.ex.starts.succeeded(result.step.serve, self.token)

    def run(self) -> None:
        serve = self.chain[0].serve
        failed = False
        try:
            for step in self.chain:
                if failed:
                    result = StepResult(
                        step,
                        Outcome.SKIPPED,
                        f"an earlier step of group {step.group} failed",
                        0.0,
                        ended_at=time.time(),
                    )
                else:
                    result = self.ex._attempt(self.run_, step, self._healthy)
                    failed = result.outcome is not Outcome.OK
                self.results.append(result)
                self.ex._emit_result(result, self.cycle)
            self.ok = not failed
            if self.ok:  # running, as the live ledger says: no longer a start in progress
                assert self.ex.starts is not None
                self.ex.starts.succeeded(serve, self.token)
            if self.ex.records is not None:
                self.ex.records.settle({serve: str(self.run_.machines[serve].state)})
        except Exception:  # a bug must not leave the start counted for good
            logger.exception("{}: the start's thread failed", serve)
        finally:
            self.done.set()
            handed = False
            if self.on_done is not None:
                try:
                    self.on_done(list(self.results), self.release)
                    handed = True
                except Exception:
                    logger.exception("{}: handing the start's outcome on failed", serve)
            if not handed:
                self.release()


_RESIZES = (Action.SHRINK, Action.GROW)


def _skip_reason(
    step: Step,
    report: ExecutionReport,
    refused: Mapping[str, list[str]],
    run: _Run,
    jobs: Mapping[str, _StartJob],
) -> str | None:
    """Why ``step`` is skipped (its group marked failed where a start stands in its way);
    ``None``: it runs."""
    if report.stopped_early:
        return "the controller is stopping"
    if step.group in refused:
        return "refused by the preflight: " + "; ".join(refused[step.group])
    if step.group in run.failed_groups:
        return f"an earlier step of group {step.group} failed"
    job = jobs.get(step.serve)
    if job is not None and not job.done.is_set():
        # never wait here: the loop would be held by that start after all
        run.failed_groups.add(step.group)
        return (
            f"waits for the start of {step.serve}, still in progress: "
            "planned again once it has ended"
        )
    if job is not None and not job.ok:
        run.failed_groups.add(step.group)
        return f"the start of {step.serve} did not succeed"
    return None
