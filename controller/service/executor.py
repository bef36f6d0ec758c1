"""The executor: carries out a plan's steps in order. The only code that mutates.

``Executor.execute`` walks a :class:`statemachine.planner.Plan` step by step, calls the
mutating adapters (docker start/stop, the serve's ``up`` argv, the router's transition
endpoint, the elastic VRAM endpoint, the health path), drives each serve's lifecycle
machine with the outcomes, and keeps its own reservation ledger true to what the
containers hold:

- a reservation is admitted (``reserve``) before its start, against a fresh reading
  of the containers, which the start reads again right before its Docker call (a
  container started outside the controller meanwhile aborts it), and released again
  when the start fails and the container holds nothing;
- a release is applied only after the stop is confirmed (the container exited and,
  where NVML sees the role's device, the memory came back within a bound);
- a shrink counts only as far as the engine's own expert cache shows it gave back
  (free VRAM on the card proves nothing about one engine); a grow counts before the
  call, and a grow, a resize that failed inside the engine (then reloaded) or one
  that got no answer counts the serve at its full reservation;
- a drain that times out or is refused stops nothing: every tier quiesced for the
  same group is readmitted;
- a readmit counts only when the router answers ``readmitted: true``: a refusal is
  retried with backoff for ``readmit_wait_s`` and then fails the step (the tier stays
  quiesced; the loop readmits it on later cycles while the serve runs);
- a tier quiesced by someone else (a reason that is not the controller's own) is
  never quiesced again (that would overwrite the reason) nor readmitted.

When a step fails, the rest of its *group* (the steps serving the same intent, e.g.
one requester and its victims) is skipped; other groups go on, and the ledger refuses
any reserve whose room did not materialise. Transient faults are retried by the
adapters (tenacity, bounded); what reaches here is final for this plan.

``preflight`` checks, before any mutation, what can be known up front: no container
the plan touches has passed to another Compose project (docs/design.md §3, foreign
containers), containers or ``up`` executables exist, the router is configured,
reachable, has its transition API enabled and knows every planned tier by name when a
router step is planned, elastic serves have an endpoint, and ports are free.

This module must not decide *what* to do (that is the planner's) and must not read
docker or NVML except through the adapters handed to it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from loguru import logger

from controller.adapters.docker.actions import ActionError, DockerActions
from controller.adapters.elastic import ElasticAnswer, ElasticClient, ElasticError, elastic_ok
from controller.adapters.health import http_ready
from controller.adapters.router import RouterClient, RouterError, TierState
from controller.adapters.sleep import SleepClient
from controller.manifest.runtime import ServeRuntime
from controller.service.events import EventBus, LedgerWatch
from controller.service.footprints import NO_FOOTPRINTS, Footprints
from controller.service.live import LiveLedger
from controller.service.sleep_steps import SLEEP_ACTIONS, SleepSteps
from controller.service.starts import StartTracker
from controller.store.journal import SleepRecord
from statemachine.ledger import GpuReservation, Ledger, Refusal, ledger_from_observed
from statemachine.lifecycle import (
    IllegalTransition,
    LifecycleState,
    ServeLifecycle,
    Trigger,
    trigger_for,
)
from statemachine.planner import Action, Plan, Step, conflict
from statemachine.types import (
    COMMITTED_STATES,
    ContainerState,
    DesiredState,
    GpuObs,
    Observed,
    ServeSpec,
)

#: The step actions this executor carries out; a plan with any other is refused by the
#: preflight (its group only) and, should one reach :meth:`do`, fails loudly there.
IMPLEMENTED_ACTIONS: frozenset[Action] = frozenset(
    {
        Action.QUIESCE,
        Action.DRAIN,
        Action.STOP,
        Action.RELEASE,
        Action.SHRINK,
        Action.GROW,
        Action.RESERVE,
        Action.START,
        Action.AWAIT_READY,
        Action.READMIT,
    }
    | SLEEP_ACTIONS
)


class Outcome(StrEnum):
    """What happened to one step."""

    OK = "ok"
    FAILED = "failed"
    ABORTED = "aborted"  # a drain timed out or was refused: nothing stopped, tier readmitted
    SKIPPED = "skipped"  # an earlier step of its group failed, or the executor was stopped
    INTERRUPTED = "interrupted"  # the controller stopped while awaiting a start: left running


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step's outcome, for progress output, logs and the journal."""

    step: Step
    outcome: Outcome
    detail: str
    duration_s: float
    logs: str | None = None
    #: when the step ended (epoch seconds): a failure's backoff counts from here
    ended_at: float = 0.0
    #: the container's ``started_at`` (epoch seconds) when a failed start saw it die:
    #: the loop counts that death once, not again when it observes the exited container
    died_started_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            **self.step.to_json(),
            "outcome": str(self.outcome),
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
            "logs": self.logs,
        }


@dataclass(frozen=True, slots=True)
class ElasticFigure:
    """What an elastic serve is counted at after a resize step, for the journal.

    ``mib`` is ``None`` for its full reservation (nothing to remember); ``at`` is when
    the engine's answer that establishes it arrived (epoch seconds), so a container
    that started before it still has the reserve in force.
    """

    mib: int | None
    at: float


@dataclass(frozen=True, slots=True)
class UndoFault:
    """A fault met while a failed group was undone: a bug, reported loudly.

    Chiefly a transition the lifecycle machine refused (``trigger`` names it); an
    unexpected error of the undo itself has ``trigger`` ``None``. The undo of the
    group's other serves went on regardless (docs/protocols.md#the-undo-of-a-failed-group).
    """

    serve: str
    group: str
    trigger: str | None
    #: the failed step the undo followed ("stop omni"), or why the run undid the group
    #: ("the plan ended", "the controller is stopping")
    after: str
    fault: str

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "serve": self.serve,
            "group": self.group,
            "trigger": self.trigger,
            "after": self.after,
            "fault": self.fault,
        }


@dataclass
class ExecutionReport:
    """What a plan's execution did, and the ledger it left."""

    results: list[StepResult]
    ledger: Ledger
    lifecycles: dict[str, str]
    stopped_early: bool = False
    preflight: list[str] = field(default_factory=list)
    #: the plan groups the preflight refused (their steps were skipped; the rest ran)
    refused_groups: list[str] = field(default_factory=list)
    #: elastic serves whose count this plan established: serve -> what to remember
    elastic: dict[str, ElasticFigure] = field(default_factory=dict)
    #: serves whose tier this plan quiesced and could not readmit when it undid its
    #: group: serve -> why (the loop readmits them on later cycles while they run)
    left_quiesced: dict[str, str] = field(default_factory=dict)
    #: serves whose sleep this plan changed: the record of one now asleep, None for one
    #: no longer asleep (woken, or stopped instead)
    sleeps: dict[str, SleepRecord | None] = field(default_factory=dict)
    #: serves whose engine answered the sleep API with 404 (not started with the flag)
    sleep_unsupported: dict[str, str] = field(default_factory=dict)
    #: serves stopped instead of put to sleep (-> why): not to be put to sleep again soon
    stopped_instead: dict[str, str] = field(default_factory=dict)
    #: what the undo of failed groups met that it could not do (a transition the
    #: lifecycle machine refused): each is also in its failed step's detail and the log
    undo_faults: list[UndoFault] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every step succeeded and every undo went as the machine allows."""
        return (
            not self.preflight
            and not self.undo_faults
            and all(r.outcome is Outcome.OK for r in self.results)
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "ok": self.ok,
            "preflight": list(self.preflight),
            "stopped_early": self.stopped_early,
            "steps": [r.to_json() for r in self.results],
            "lifecycles": dict(self.lifecycles),
            "ledger": {r: self.ledger.view(r).to_json() for r in self.ledger.roles},
            "left_quiesced": dict(self.left_quiesced),
            "undo_faults": [f.to_json() for f in self.undo_faults],
        }


@dataclass(frozen=True, slots=True)
class _Reserved:
    """The engine's answer to a resize: when, whether it ran, what it holds now."""

    ans: ElasticAnswer
    at: float
    ran: bool
    why: str
    #: what the engine holds after it (``None``: the answer does not say)
    holds: int | None
    #: the reserves asked, "N[, then M]"
    asked: str
    #: "elastic shrink of S": what the step's detail starts with
    action: str

    @property
    def what(self) -> str:
        """ "elastic shrink of S (reserve_mib N[, then M])", for the step's detail."""
        return f"{self.action} (reserve_mib {self.asked})"


class GpuReader(Protocol):
    """Reads the devices now (``None`` when NVML is unavailable)."""

    def __call__(self) -> tuple[GpuObs, ...] | None: ...


class StepError(Exception):
    """A step could not be carried out; ``logs`` carries what the operator needs."""

    def __init__(
        self,
        message: str,
        *,
        logs: str | None = None,
        aborted: bool = False,
        interrupted: bool = False,
        died_started_at: float | None = None,
    ) -> None:
        super().__init__(message)
        self.logs = logs
        self.aborted = aborted
        self.interrupted = interrupted
        self.died_started_at = died_started_at


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """Executor knobs (bounds and poll intervals)."""

    poll_s: float = 0.25
    memory_wait_s: float = 30.0
    memory_tolerance_mib: int = 256
    log_tail: int = 40
    #: how long a refused readmit is retried (the model may need seconds after its
    #: health path answers before the router verifies its identity)
    readmit_wait_s: float = 30.0
    #: the first pause between readmit tries; it doubles up to ``readmit_poll_max_s``
    readmit_poll_s: float = 1.0
    readmit_poll_max_s: float = 8.0


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

    def runtime(self, name: str) -> ServeRuntime:
        """How serve ``name``'s steps are carried out (the manifest's defaults if unknown)."""
        rt = self._runtime.get(name)
        return ServeRuntime.default(name) if rt is None else rt

    # ------------------------------------------------------------------ preflight
    def preflight(self, plan: Plan) -> list[str]:
        """What is knowable now and would make the plan fail half-way; empty when fine."""
        return [p.text for p in self.preflight_problems(plan)]

    def preflight_problems(self, plan: Plan) -> list[PreflightProblem]:
        """Each problem the preflight finds, with the plan groups it refuses.

        A problem of one serve (its container or ``up`` missing, its port taken, an
        elastic step without an endpoint) refuses only the groups of that serve's
        steps; a router that is missing or unreachable refuses the groups that need it.
        """
        problems: list[PreflightProblem] = []
        actions = {s.action for s in plan.steps}
        router_groups = frozenset(
            s.group
            for s in plan.steps
            if s.action in (Action.QUIESCE, Action.DRAIN, Action.READMIT)
        )
        if actions & {Action.QUIESCE, Action.DRAIN}:
            tiers = sorted({s.serve for s in plan.steps if s.action is Action.DRAIN})
            if self.router is None:
                problems.append(
                    PreflightProblem(
                        None,
                        router_groups,
                        "the plan drains router tiers (" + ", ".join(tiers) + ") before "
                        "stopping them, but no router is configured: set --router-url / "
                        "VRAMCTL_ROUTER_URL",
                    )
                )
        if self.router is not None and router_groups:
            problems.extend(self._preflight_router(plan, self.router, router_groups))
        problems.extend(self._preflight_foreign(plan))
        stopped_ports: set[int] = set()
        for step in plan.steps:
            serve = self.desired.serves[step.serve]
            if step.action not in IMPLEMENTED_ACTIONS:
                problems.append(
                    PreflightProblem(
                        serve.name,
                        frozenset({step.group}),
                        f"{serve.name}: {step.action} planned, but this executor does not "
                        "implement it",
                    )
                )
            if step.action is Action.STOP and serve.port is not None:
                stopped_ports.add(serve.port)
            if step.action is Action.START:
                groups = frozenset({step.group})
                problems.extend(
                    PreflightProblem(serve.name, groups, text)
                    for text in self._preflight_start(serve, stopped_ports)
                )
            if step.action in (Action.SHRINK, Action.GROW) and serve.elastic is None:
                problems.append(
                    PreflightProblem(
                        serve.name,
                        frozenset({step.group}),
                        f"{serve.name}: {step.action} planned but it has no elastic url",
                    )
                )
        return problems

    def _preflight_router(
        self, plan: Plan, router: RouterClient, router_groups: frozenset[str]
    ) -> list[PreflightProblem]:
        """The router answers, accepts the token, has its transition API enabled, and
        knows each planned tier by name (an unknown one refuses its serve's groups)."""
        err = router.check()
        if err is not None:
            return [PreflightProblem(None, router_groups, f"router {router.base_url}: {err}")]
        groups: dict[str, set[str]] = {}
        for step in plan.steps:
            if step.action in (Action.QUIESCE, Action.DRAIN, Action.READMIT):
                groups.setdefault(step.serve, set()).add(step.group)
        problems: list[PreflightProblem] = []
        for name, gs in groups.items():
            tier = self.desired.serves[name].router_tier
            if not tier:
                continue
            err = router.check(tier_id=tier)
            if err is not None:
                problems.append(
                    PreflightProblem(name, frozenset(gs), f"{name}: router_tier {tier!r}: {err}")
                )
        return problems

    def _preflight_foreign(self, plan: Plan) -> list[PreflightProblem]:
        """A serve that declares its Compose project whose container now bears another
        project's label (it appeared since the observation): its groups are refused, so
        nothing of another stack is started, stopped or drained (docs/design.md §3)."""
        groups: dict[str, set[str]] = {}
        for step in plan.steps:
            if self.desired.serves[step.serve].compose_project is not None:
                groups.setdefault(step.serve, set()).add(step.group)
        problems: list[PreflightProblem] = []
        for name, gs in groups.items():
            serve = self.desired.serves[name]
            try:
                now = self.docker.inspect(serve.container)
            except ActionError as exc:
                text = f"{name}: cannot ask docker whose container {serve.container} is: {exc}"
                problems.append(PreflightProblem(name, frozenset(gs), text))
                continue
            project = None if now is None else now.compose_project
            if project is not None and project != serve.compose_project:
                text = (
                    f"{name}: container {serve.container} belongs to compose project "
                    f"{project}, not {serve.compose_project}: it is left alone (never started, "
                    "stopped or removed)"
                )
                problems.append(PreflightProblem(name, frozenset(gs), text))
        return problems

    def _preflight_start(self, serve: ServeSpec, stopped_ports: set[int]) -> list[str]:
        problems: list[str] = []
        try:
            exists = self.docker.exists(serve.container)
        except ActionError as exc:
            return [f"{serve.name}: cannot ask docker whether {serve.container} exists: {exc}"]
        if not exists:
            rt = self.runtime(serve.name)
            argv = rt.up_argv
            if not argv:
                problems.append(
                    f"{serve.name}: container {serve.container} does not exist and the serve "
                    "has no `up` command to create it"
                )
            elif not self.docker.executable_exists(argv[0], cwd=rt.manifest_dir):
                problems.append(f"{serve.name}: `up` executable {argv[0]!r} not found")
        if (
            serve.port is not None
            and serve.port not in stopped_ports
            and self.docker.port_in_use(serve.port)
        ):
            problems.append(
                f"{serve.name}: port {serve.port} is already in use on 127.0.0.1 "
                "and nothing in the plan frees it"
            )
        return problems

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
        machines = self._machines(plan, observed)
        report = ExecutionReport([], ledger, {})
        refused: dict[str, list[str]] = {}  # group -> the preflight problems that refuse it
        if not skip_preflight:
            refused = self._refusals(plan, report)
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
        return report

    def _machines(self, plan: Plan, observed: Observed) -> dict[str, ServeLifecycle]:
        """One lifecycle machine per serve of the plan, in the state its container shows."""
        machines: dict[str, ServeLifecycle] = {}
        for step in plan.steps:
            if step.serve not in machines:
                serve = self.desired.serves[step.serve]
                holds = observed.container(serve.container).holds
                state = LifecycleState.RUNNING if holds else LifecycleState.STOPPED
                if holds and observed.sleep_of(serve.name).asleep:
                    state = LifecycleState.ASLEEP
                machines[step.serve] = ServeLifecycle(step.serve, state)
        return machines

    def _refusals(self, plan: Plan, report: ExecutionReport) -> dict[str, list[str]]:
        """The preflight: group -> the problems that refuse it (recorded in ``report``)."""
        refused: dict[str, list[str]] = {}
        problems = self.preflight_problems(plan)
        report.preflight = [p.text for p in problems]
        for problem in problems:
            logger.error("preflight: {}", problem.text)
            for g in problem.groups:
                refused.setdefault(g, []).append(problem.text)
        _refuse_dependents(plan, self.desired, refused)
        report.refused_groups = sorted(refused)
        return refused

    def _attempt(self, run: _Run, step: Step) -> StepResult:
        """One step, told to the live ledger as it begins and ends."""
        live = self.live
        token = live.step_begun(step) if live is not None else 0
        result = self._attempt_step(run, step)
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
                    result = replace(result, detail=f"{result.detail}; {_undo_text(faults)}")
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


@dataclass(frozen=True, slots=True)
class PreflightProblem:
    """One preflight finding: the serve it concerns (``None``: the plan) and the groups
    of the plan it refuses."""

    serve: str | None
    groups: frozenset[str]
    text: str


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
                    result = self.ex._attempt(self.run_, step)
                    failed = result.outcome is not Outcome.OK
                self.results.append(result)
                self.ex._emit_result(result, self.cycle)
            self.ok = not failed
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


class _Run(SleepSteps):
    """The state of one execution: the live ledger, the machines, what to undo."""

    def __init__(
        self,
        ex: Executor,
        ledger: Ledger,
        machines: dict[str, ServeLifecycle],
        observed: Observed,
    ) -> None:
        self.ex = ex
        self.cycle = ex.cycle  # the plan's, for the events this run publishes
        #: the desired state this run was planned for (a start carried out beside the
        #: loop keeps it even when the manifest changes meanwhile)
        self.desired = ex.desired
        self.observed = observed
        self.ledger = ledger
        self.machines = machines
        self.failed_groups: set[str] = set()
        self.quiesced: dict[str, list[str]] = {}  # group -> serves quiesced, not yet stopped
        #: group -> serves whose tier someone else had quiesced (never readmitted here)
        self.others_quiesced: dict[str, list[str]] = {}
        self.reserved: dict[str, str] = {}  # serve -> group, reserved but not yet started
        self.tokens: dict[str, int] = {}  # serve -> its tracker entry, from its reserve
        self.detached = False  # a start's own run: the tracker entry is its job's to end
        #: a start's own run: the plan's run it was handed off from (its ledger goes on
        #: counting what the plan reserves after the hand-off)
        self.parent: _Run | None = None
        self.used_before_stop: dict[str, dict[str, int]] = {}  # serve -> role -> NVML used
        self.attributed: dict[str, int | None] = {}  # serve -> NVML MiB of its container
        self.elastic: dict[str, ElasticFigure] = {}  # serve -> its count after a resize
        self.left_quiesced: dict[str, str] = {}  # serve -> why its undo left it quiesced
        #: what the undo of failed groups met (an illegal transition): reported, not ok
        self.undo_faults: list[UndoFault] = []
        #: serves whose footprint window is a move only (a sleep, a wake, a sleeper's stop)
        self.moves_only: set[str] = set()
        self.init_sleep_steps()

    # -- helpers ---------------------------------------------------------------------
    def serve(self, name: str) -> ServeSpec:
        return self.desired.serves[name]

    def fire(self, serve: str, trigger: Trigger) -> None:
        """Move ``serve``'s lifecycle machine; an illegal transition fails the step.

        The machine is the authority: a plan (or an executor path) that asks for a
        transition the machine forbids is a bug, so it is logged as an error and raised
        as :class:`StepError` (the step fails, its group is undone), never passed over.
        The undo moves the machines with :meth:`move` instead, and reports each
        :class:`IllegalTransition` it meets once it has undone the rest.
        """
        try:
            self.move(serve, trigger)
        except IllegalTransition as exc:
            logger.error("lifecycle: {}", exc)
            raise StepError(f"lifecycle: {exc}") from None

    def move(self, serve: str, trigger: Trigger) -> None:
        """Move ``serve``'s lifecycle machine and publish the transition.

        Raises :class:`IllegalTransition` (the machine unchanged, nothing published)
        when the machine forbids it; the caller decides how that fails loudly.
        """
        machine = self.machines[serve]
        before = str(machine.state)
        machine.fire(trigger)
        self.ex.events.publish(
            "lifecycle",
            serve=serve,
            cycle=self.cycle,
            trigger=str(trigger),
            **{"from": before, "to": str(machine.state)},
        )

    def router(self) -> RouterClient:
        if self.ex.router is None:
            raise StepError("no router is configured (--router-url / VRAMCTL_ROUTER_URL)")
        return self.ex.router

    def role_used(self, roles: tuple[str, ...]) -> dict[str, int]:
        gpus = self.ex.gpus()
        if gpus is None:
            return {}
        by_uuid = {g.uuid: g for g in gpus}
        out: dict[str, int] = {}
        for r in roles:
            uuid = self.desired.roles[r].uuid if r in self.desired.roles else None
            dev = by_uuid.get(uuid) if uuid else None
            if dev is not None and dev.used_mib is not None:
                out[r] = dev.used_mib
        return out

    def logs(self, container: str) -> str:
        return self.ex.docker.logs(container, tail=self.ex.config.log_tail)

    # -- the actions -----------------------------------------------------------------
    def do(self, step: Step) -> str:
        s = self.serve(step.serve)
        handler = {
            Action.QUIESCE: self.quiesce,
            Action.DRAIN: self.drain,
            Action.STOP: self.stop,
            Action.RELEASE: self.release,
            Action.SHRINK: self.resize,
            Action.GROW: self.resize,
            Action.RESERVE: self.reserve,
            Action.START: self.start,
            Action.AWAIT_READY: self.await_ready,
            Action.READMIT: self.readmit,
            **self.sleep_handlers(),
        }.get(step.action)
        if handler is None:  # a step kind the core plans and this executor cannot carry out
            raise StepError(f"{step.action} steps are not implemented by this executor")
        measure = self.ex.footprints
        # a sleep, a wake and a sleeper's stop move memory on the serve's roles, but only
        # its residual's worth or the rest: no evidence of its footprint. Their windows
        # are opened (other serves' windows they overlap are not attributable) and
        # abandoned instead of recorded.
        moves_only = step.action in (Action.SLEEP, Action.WAKE) or (
            step.action is Action.STOP and self.machines[s.name].state == LifecycleState.ASLEEP
        )
        if moves_only:
            self.moves_only.add(s.name)
        if step.action in (Action.START, Action.WAKE):
            measure.before_start(s, self.desired.roles)
        elif step.action in (Action.STOP, Action.SLEEP):
            measure.before_stop(s, self.desired.roles)
        detail = handler(step, s)
        if step.action is Action.AWAIT_READY:
            if s.name in self.moves_only:
                self.moves_only.discard(s.name)
                measure.start_failed(s)  # a wake: the window stays as a move, no sample
            else:
                measure.after_start(s)
        elif step.action in (Action.RELEASE, Action.RELEASE_TO_RESIDUAL) or (
            step.action is Action.STOP and not self.ledger.holds(s.name)
        ):
            if s.name in self.moves_only or step.action is Action.RELEASE_TO_RESIDUAL:
                self.moves_only.discard(s.name)
                measure.stop_failed(s)  # a sleep or a sleeper's stop: a move, no sample
            else:
                measure.after_stop(s)  # released (or nothing to release): the stop is confirmed
        return detail

    def tier_state(self, tier: str, before: str) -> TierState:
        """The tier's state now; unreadable, the step fails (nothing done on a guess)."""
        try:
            return self.router().tier_state(tier)
        except RouterError as exc:
            raise StepError(
                f"cannot read the state of tier {tier} before {before}: {exc}"
            ) from None

    def quiesce(self, step: Step, s: ServeSpec) -> str:
        assert s.router_tier is not None
        state = self.tier_state(s.router_tier, "quiescing it (nothing stopped)")
        if state.quiesced_by_other:
            # quiescing again would overwrite its reason, and our readmit would then
            # lift someone else's quiesce: leave it, and never readmit it
            self.fire(s.name, Trigger.QUIESCE)
            self.others_quiesced.setdefault(step.group, []).append(s.name)
            logger.warning(
                "{}: tier {} is already quiesced by someone else (reason {!r}): left as it "
                "is, and never readmitted by vramctl",
                s.name,
                s.router_tier,
                state.reason,
            )
            return (
                f"tier {s.router_tier} already quiesced by someone else (reason "
                f"{state.reason!r}): not quiesced again, never readmitted by vramctl"
            )
        try:
            ans = self.router().transition("quiesce", s.router_tier)
        except RouterError as exc:
            raise StepError(f"router refused quiesce of {s.router_tier}: {exc}") from None
        if not ans.applied:
            raise StepError(f"router did not apply quiesce of {s.router_tier}: {ans.raw}")
        self.quiesced.setdefault(step.group, []).append(s.name)
        self.fire(s.name, Trigger.QUIESCE)
        return f"tier {s.router_tier} quiesced"

    def drain(self, step: Step, s: ServeSpec) -> str:
        assert s.router_tier is not None
        timeout = self.ex.runtime(s.name).drain_timeout_s
        try:
            ans = self.router().transition("drain", s.router_tier, drain_timeout_s=timeout)
        except RouterError as exc:
            raise StepError(f"drain of {s.router_tier} refused: {exc}", aborted=True) from None
        if not ans.applied or ans.timed_out or ans.drained is False:
            why = "timed out" if ans.timed_out else "was not applied"
            raise StepError(
                f"drain of {s.router_tier} {why} after up to {timeout:g}s: nothing stopped",
                aborted=True,
            )
        self.fire(s.name, Trigger.DRAIN)
        return f"tier {s.router_tier} drained"

    def stop(self, step: Step, s: ServeSpec) -> str:
        self.used_before_stop[s.name] = self.role_used(s.gpu_roles)
        self.attributed[s.name] = self.observed.container(s.container).gpu_used_mib
        timeout = self.ex.runtime(s.name).stop_timeout_s
        self.fire(s.name, Trigger.STOP)
        try:
            self.ex.docker.stop(s.container, timeout)
            state = self.ex.docker.inspect(s.container)
        except ActionError as exc:
            self.fire(s.name, Trigger.STOP_FAILED)
            raise StepError(f"docker stop {s.container}: {exc}") from None
        if state is not None and state.state in COMMITTED_STATES:
            self.fire(s.name, Trigger.STOP_FAILED)
            raise StepError(f"{s.container} is still {state.state} after docker stop")
        for members in (*self.quiesced.values(), *self.others_quiesced.values()):
            if s.name in members:
                members.remove(s.name)
        if not self.ledger.holds(s.name):
            self.fire(s.name, Trigger.STOPPED)
        code = state.exit_code if state is not None else None
        return f"{s.container} exited" + (f" ({code})" if code is not None else "")

    def release(self, step: Step, s: ServeSpec) -> str:
        """Confirm the stop freed the memory, then release the reservation.

        A serve need not use all it reserved, so the drop to wait for is what NVML
        attributed to its container before the stop (``gpu_used_mib``); where that is
        unknown (no per-process figures, e.g. WSL2) the exited container is the only
        confirmation there is, and the step says so.
        """
        before = self.used_before_stop.get(s.name, {})
        attributed = self.attributed.get(s.name)
        mib = step.mib or 0
        waited = "; NVML cannot attribute memory to the container: confirmed by its exit"
        if before and attributed is not None:
            # the attributed figure is the container's total over all its devices: what
            # must come back is that total, summed over the roles' devices
            tol = self.ex.config.memory_tolerance_mib
            deadline = time.monotonic() + self.ex.config.memory_wait_s
            while True:
                now = self.role_used(s.gpu_roles)
                back = sum(before[r] - now[r] for r in before if r in now)
                if back >= attributed - tol:
                    waited = f"; NVML shows its {attributed} MiB back"
                    break
                if time.monotonic() >= deadline:
                    detail = ", ".join(
                        f"{r} used {before[r]} -> {now.get(r, '?')} MiB" for r in before
                    )
                    raise StepError(
                        f"{s.container} exited but the {attributed} MiB it used did not come "
                        f"back within {self.ex.config.memory_wait_s:g}s ({detail}); "
                        "the release is not confirmed"
                    )
                time.sleep(self.ex.config.poll_s)
        result = self.ledger.release(s.name)
        if isinstance(result, Refusal):
            return f"nothing to release: {result.message}"
        self.ledger = result
        self.fire(s.name, Trigger.STOPPED)
        return f"released {mib} MiB on {', '.join(s.gpu_roles)}{waited}"

    def reserve(self, step: Step, s: ServeSpec) -> str:
        assert step.mib is not None
        self.admit_against_host_now(s)
        result = self.ledger.admit(GpuReservation(s.name, s.gpu_roles, step.mib))
        if isinstance(result, Refusal):
            raise StepError(f"the ledger refuses: {result.message}")
        self.ledger = result
        self.reserved[s.name] = step.group
        if self.ex.starts is not None:
            self.tokens[s.name] = self.ex.starts.begin(s.name, s.gpu_roles, step.mib)
        self.fire(s.name, Trigger.RESERVE)
        return f"reserved {step.mib} MiB on {', '.join(s.gpu_roles)}"

    def admit_against_host_now(self, s: ServeSpec, *, aborted: bool = False) -> None:
        """Read the containers again before a reserve, and again right before the start's
        Docker call: the plan's observation, and the reserve's, may be old.

        A serve of the manifest whose container holds memory now, though neither the
        plan's ledger nor a start in progress counts it, was started outside the
        controller while the plan ran: it joins this run's ledger (so nothing later in
        the plan is admitted into its room) and the step fails (``aborted``: the start's
        check, no failure of the serve's own), to be planned again from the host as it
        is. Docker unreadable now: nothing is admitted.
        """
        if self.ex.observe_now is None:
            return
        fresh = self.ex.observe_now()
        if not fresh.docker_ok:
            raise StepError(
                "docker cannot be read now: nothing is admitted until it can", aborted=aborted
            )
        from statemachine.ledger import held_uncounted  # travels with this method

        in_progress = self.ex.starts.snapshot() if self.ex.starts is not None else {}
        parent = self.parent.ledger if self.parent is not None else None

        def counted(name: str) -> bool:  # by this run's ledger, its parent's, or a start
            return (
                self.ledger.holds(name)
                or (parent is not None and parent.holds(name))
                or name in in_progress
            )

        outside = held_uncounted(self.desired, fresh, counted)
        if outside:
            self.ledger = Ledger(
                self.desired.roles,
                [*self.ledger.holdings.values(), *outside],
                host=self.ledger.host,
                host_holdings=self.ledger.host_holdings,
            )
            names = ", ".join(r.holder for r in outside)
            raise StepError(
                f"{names} started outside the controller while this plan ran "
                f"({' + '.join(f'{r.holder} {r.mib}' for r in outside)} MiB now held): "
                f"{s.name} is not admitted; the next cycle plans from the host as it is",
                aborted=aborted,
            )

    def start(self, step: Step, s: ServeSpec) -> str:
        if self.machines[s.name].state == "stopped":
            self.fire(s.name, Trigger.RESERVE)  # a serve outside the ledger has no reserve step
        self.fire(s.name, Trigger.START)
        try:
            exists = self.ex.docker.exists(s.container)
            if step.mib:  # in the ledger: admitted again, as close to the call as can be
                self.admit_against_host_now(s, aborted=True)
            if exists:
                self.ex.docker.start(s.container)
                how = f"docker start {s.container}"
            else:
                rt = self.ex.runtime(s.name)
                argv = rt.up_argv
                if not argv:
                    raise StepError(f"{s.container} does not exist and {s.name} has no `up`")
                timeout = rt.start_timeout_s
                tracker = self.ex.starts
                mib = step.mib or 0

                def spawned(pid: int) -> None:
                    if tracker is not None:
                        tracker.up_spawned(
                            s.name, pid, roles=s.gpu_roles, mib=mib, timeout_s=timeout
                        )

                try:
                    res = self.ex.docker.run_up(
                        argv,
                        cwd=rt.manifest_dir,
                        timeout_s=timeout,
                        env=rt.up_env,
                        on_spawn=spawned,
                    )
                finally:
                    if tracker is not None:
                        tracker.up_exited(s.name)
                if res.returncode != 0:
                    how = (
                        f"timed out after {timeout:g}s"
                        if res.returncode is None
                        else f"exited {res.returncode}"
                    )
                    raise StepError(
                        f"`up` {how}: {_reason(res.output)} (`up`: {' '.join(argv)})",
                        logs=res.output,
                    )
                if not self.ex.docker.exists(s.container):
                    raise StepError(
                        f"`up` succeeded but container {s.container} does not exist",
                        logs=res.output,
                    )
                how = f"ran `up` ({argv[0]} …)"
        except ActionError as exc:
            raise StepError(f"start {s.container}: {exc}", logs=self.logs(s.container)) from None
        self.reserved.pop(s.name, None)
        return how

    def await_ready(self, step: Step, s: ServeSpec) -> str:
        rt = self.ex.runtime(s.name)
        timeout, health = rt.start_timeout_s, rt.health
        deadline = time.monotonic() + timeout
        while True:
            try:
                state = self.ex.docker.inspect(s.container)
            except ActionError as exc:
                raise StepError(f"cannot inspect {s.container}: {exc}") from None
            if state is None:
                raise StepError(f"{s.container} disappeared while starting")
            if state.oom_killed or state.state in (ContainerState.EXITED, ContainerState.DEAD):
                why = "was OOM-killed" if state.oom_killed else f"exited ({state.exit_code})"
                raise StepError(
                    f"{s.container} {why} while starting",
                    logs=self.logs(s.container),
                    died_started_at=_epoch_or_none(state.started_at),
                )
            if state.state is ContainerState.RUNNING:
                if state.health is not None:
                    if state.health == "healthy":
                        self.fire(s.name, Trigger.READY)
                        return "docker healthcheck: healthy"
                elif s.port is not None and health:
                    url = f"http://127.0.0.1:{s.port}{health}"
                    if http_ready(url):
                        self.fire(s.name, Trigger.READY)
                        return f"GET {url}: 2xx"
                else:
                    self.fire(s.name, Trigger.READY)
                    return "running (no health path or healthcheck declared)"
            if time.monotonic() >= deadline:
                raise StepError(
                    f"{s.name} not healthy after start_timeout_s {timeout:g}s",
                    logs=self.logs(s.container),
                )
            if self.ex.stop_event.is_set():
                # leave the start running: the container holds its reservation, and
                # the next controller finds it starting instead of starting it again
                raise StepError(
                    "the controller is stopping: left starting, not awaited", interrupted=True
                )
            time.sleep(self.ex.config.poll_s)

    def readmit(self, step: Step, s: ServeSpec) -> str:
        assert s.router_tier is not None
        if self.ex.router is None:  # nothing was quiesced without a router: nothing to undo
            return f"no router is configured: tier {s.router_tier} not readmitted"
        return self.readmit_tier(s)

    def readmit_tier(self, s: ServeSpec) -> str:
        """Readmit ``s``'s tier; counts only on ``readmitted: true`` (``StepError`` else).

        An admitting tier needs nothing. A tier quiesced by someone else is left as it
        is (said in the detail and the log). A refusal is asked again with backoff for
        ``readmit_wait_s`` (not ``identity_not_configured``: no wait changes the
        router's configuration); then the step fails and the tier stays quiesced.
        """
        tier = s.router_tier
        assert tier is not None
        state = self.tier_state(tier, "readmitting it (left as it is)")
        if state.admitting:
            return f"tier {tier} already admitting"
        if state.quiesced_by_other:
            logger.warning(
                "{}: tier {} is quiesced by someone else (reason {!r}): not readmitted by "
                "vramctl; whoever quiesced it readmits it",
                s.name,
                tier,
                state.reason,
            )
            return (
                f"tier {tier} is quiesced by someone else (reason {state.reason!r}): "
                "not readmitted by vramctl"
            )
        if not state.quiesced:
            raise StepError(
                f"tier {tier} is in a state vramctl does not know ({state.state!r}): not readmitted"
            )
        cfg = self.ex.config
        begin = time.monotonic()
        pause = cfg.readmit_poll_s
        refusals: list[str] = []
        while True:
            try:
                ans = self.router().transition("readmit", tier)
            except RouterError as exc:
                raise StepError(f"readmit of {tier} refused: {exc}; tier left quiesced") from None
            if ans.readmitted is True or (
                ans.readmitted is None and ans.applied and self._admitting_now(tier)
            ):
                tries = f" (after {len(refusals)} refusals: {refusals[-1]})" if refusals else ""
                return f"tier {tier} readmitted{tries}"
            reason = ans.reason or (
                "the answer does not say readmitted: true"
                if ans.readmitted is None
                else "no reason given"
            )
            refusals.append(reason)
            elapsed = time.monotonic() - begin
            if (
                reason == "identity_not_configured"
                or elapsed + pause > cfg.readmit_wait_s
                or self.ex.stop_event.wait(pause)
            ):
                break
            pause = min(pause * 2, cfg.readmit_poll_max_s)
        raise StepError(
            f"router refused to readmit tier {tier} {len(refusals)} time(s) in "
            f"{time.monotonic() - begin:.0f}s (last reason: {refusals[-1]}): the tier stays "
            f"quiesced (its clients get 503); readmitted by later cycles while {s.name} runs"
        )

    def _admitting_now(self, tier: str) -> bool:
        try:
            return self.router().tier_state(tier).admitting
        except RouterError:
            return False

    def resize(self, step: Step, s: ServeSpec) -> str:
        """Resize an elastic serve; the ledger never counts less than the engine holds.

        A grow is admitted by the ledger first (refused there, the engine is not asked)
        and counted before the call. A shrink is counted only once the engine's own
        cache proves it (``expert_cache_full_mib - expert_cache_mib`` covers what the
        plan takes off its reservation); free VRAM on the card proves nothing, as it
        counts room other serves have reserved and not used yet. When the first answer
        shows the engine holding more than the plan counts (the card looked freer than
        the ledger), it is asked once more for the missing MiB above the free VRAM it
        reported. Then:

        - proven: counted at the plan's figure;
        - gave back less (its floor): counted at what it still holds, step failed;
        - 409 busy, or no answer within the client's wait: nothing proven, counted as
          before (a grow: at full, it may have run), step aborted; the same reserve is
          asked again on a later step;
        - 503 or a failure inside the resize: the cache table cannot be trusted; the
          model is unloaded and loaded again (or the container restarted) and the
          serve counted at its full reservation, step failed;
        - refused (400) or ``not loaded``: nothing ran; a ``not loaded`` engine sizes
          its cache afresh when it loads, so it is counted at full.

        What the ledger ends at is reported (``report.elastic``) with the time of the
        answer that established it, for the journal.
        """
        if s.elastic is None or step.to_mib is None or s.vram_mib is None:
            raise StepError(f"{s.name} is not elastic")
        held = self.ledger.holdings.get(s.name)
        if held is None:
            raise StepError(f"{s.name} holds no reservation to resize")
        before, to, full = held.mib, step.to_mib, s.vram_mib
        grow = step.action is Action.GROW
        if grow:
            resized = self.ledger.resize(s.name, to)
            if isinstance(resized, Refusal):
                raise StepError(f"the ledger refuses: {resized.message}")
            self.ledger = resized  # counted before the call: the engine may grow in part
        ans = self._ask_reserve(step, s, before=before, full=full)
        return self._settle_resize(step, s, ans, before=before, full=full)

    def _ask_reserve(self, step: Step, s: ServeSpec, *, before: int, full: int) -> _Reserved:
        """Ask the engine for the reserve that gets ``s`` to ``step.to_mib`` (twice at most).

        No answer raises (a grow counted at full first); a transient one is remembered,
        so the same reserve is asked again by the same step later.
        """
        assert s.elastic is not None and step.to_mib is not None
        to, grow = step.to_mib, step.action is Action.GROW
        el, token = s.elastic, _env_token(s.elastic.token_env)
        pending = self.ex.unanswered.get(s.name)
        if pending is not None and pending[:2] == (str(step.action), to):
            target = pending[2]
        else:
            target = self.reserve_target(step, s)
        what = f"elastic {step.action} of {s.name}"
        asked: list[int | None] = []
        while True:
            asked.append(target)
            try:
                ans = self.ex.elastic.set_reserve(el.url, target, token=token)
            except ElasticError as exc:
                if exc.transient:
                    self.ex.unanswered[s.name] = (str(step.action), to, target)
                if grow:
                    self.count(s, full, time.time())
                    raise StepError(
                        f"{what} (reserve_mib {target}): {exc}; it may have grown: "
                        f"counted at its full {full} MiB until an answer proves less"
                    ) from None
                raise StepError(
                    f"{what} (reserve_mib {target}): {exc}; nothing proven: counted at "
                    f"{before} MiB, the same reserve is asked again later",
                    aborted=exc.transient,
                ) from None
            at = time.time()
            self.ex.unanswered.pop(s.name, None)
            ran, why = elastic_ok(ans, target)
            gave = ans.given_back_mib
            holds = None if gave is None else max(0, full - gave)
            if (
                holds is None
                or holds <= to
                or len(asked) > 1
                or ans.vram_free_mib is None
                or not ran
            ):
                break
            # the card looked freer than the ledger: ask for what is missing on top
            retry = max(self._role_reserve(s), ans.vram_free_mib + (holds - to))
            if target is not None and retry <= target:
                break  # it stopped at its floor: asking again changes nothing
            target = retry
        asked_text = ", then ".join(str(a) for a in asked)
        return _Reserved(ans, at, ran, why, holds, asked_text, what)

    def _settle_resize(
        self, step: Step, s: ServeSpec, r: _Reserved, *, before: int, full: int
    ) -> str:
        """Count ``s`` at what the engine's answer proves, and say how the step ended."""
        assert step.to_mib is not None
        to, grow, ans, why, holds = step.to_mib, step.action is Action.GROW, r.ans, r.why, r.holds
        if ans.busy:
            raise StepError(
                f"{r.what}: {why}; nothing ran, asked again on a later cycle",
                aborted=True,
            )
        if ans.needs_reload:
            self.count(s, full, r.at)
            reload = self.reload_engine(s)
            raise StepError(
                f"{r.what}: {why}; its cache table cannot be "
                f"trusted: {reload}; counted at its full {full} MiB until an answer "
                "proves less"
            )
        if not r.ran:
            if ans.status == "not loaded":
                self.count(s, full, r.at)
                why += f"; counted at its full {full} MiB (it sizes its cache when it loads)"
            raise StepError(f"{r.what}: {why}")
        if holds is None:
            if grow:
                self.count(s, full, r.at)
            raise StepError(
                f"{r.what}: {why}: the answer does not say what "
                f"the engine holds; counted at {full if grow else before} MiB"
            )
        # never less than it holds; rounded to the plan's figure when it holds no more
        self.count(s, max(to, holds), r.at)
        if holds > to:
            raise StepError(
                f"{r.what}: {why}: its cache gives back "
                f"{full - holds} MiB, the plan needs {full - to}: counted at the "
                f"{holds} MiB it still holds"
            )
        self.fire(s.name, trigger_for(step.action))
        return f"{s.name} now holds {to} MiB (reserve_mib {r.asked}; {why})"

    def count(self, s: ServeSpec, mib: int, at: float) -> None:
        """Count ``s`` at ``mib`` from now on (over the budget if it must be), and say so."""
        resized = self.ledger.resize(s.name, mib)
        if isinstance(resized, Refusal):  # it holds it whether or not it fits: count it
            holdings = [
                r if r.holder != s.name else GpuReservation(r.holder, r.gpu_roles, mib)
                for r in self.ledger.holdings.values()
            ]
            resized = Ledger(
                self.ledger.roles,
                holdings,
                host=self.ledger.host,
                host_holdings=self.ledger.host_holdings,
            )
            logger.error(
                "{}: counted at {} MiB, what its engine may hold, though that is over the "
                "budget of {}",
                s.name,
                mib,
                ", ".join(s.gpu_roles),
            )
        self.ledger = resized
        full = s.vram_mib
        self.elastic[s.name] = ElasticFigure(None if full is None or mib >= full else mib, at)

    def reload_engine(self, s: ServeSpec) -> str:
        """Unload and load the model (a fresh engine); restart the container if that fails."""
        assert s.elastic is not None
        el, token = s.elastic, _env_token(s.elastic.token_env)
        try:
            unload = self.ex.elastic.unload(el.url, token=token)
            if unload.http_status // 100 != 2:
                problem = f"POST /v1/unload answered {unload.http_status}: {unload.error}"
            else:
                load = self.ex.elastic.load(el.url, token=token)
                if load.http_status // 100 == 2:
                    return "reloaded (POST /v1/unload, then /v1/load: a fresh engine)"
                problem = f"POST /v1/load answered {load.http_status}: {load.error}"
        except ElasticError as exc:
            problem = str(exc)
        stop_s = self.ex.runtime(s.name).stop_timeout_s
        try:
            self.ex.docker.stop(s.container, stop_s)
            self.ex.docker.start(s.container)
        except ActionError as exc:
            return f"{problem}; restarting {s.container} failed too: {exc}"
        return f"{problem}; container {s.container} restarted instead"

    def _role_reserve(self, s: ServeSpec) -> int:
        """The role's reserve: never ask the engine to leave less free on the card."""
        role = self.desired.roles.get(s.gpu_roles[0]) if s.gpu_roles else None
        return role.reserve_mib if role is not None else 0

    def reserve_target(self, step: Step, s: ServeSpec) -> int | None:
        """The ``reserve_mib`` to ask of the engine: the free MiB the card must show after.

        With NVML: the device's free MiB now plus what the shrink gives back (minus what a
        grow takes). Without: the role's capacity minus what the ledger commits after the
        resize (the role's reserve is not counted as free). Never below the role's reserve
        (a partial grow must not ask the engine to leave nothing free on the card). A grow
        back to the full reservation asks for ``null`` (the engine's start-up default).
        Either way the engine's cache figures, not this, prove what it gave back.
        """
        if (
            step.action is Action.GROW
            and s.vram_mib is not None
            and (step.to_mib or 0) >= s.vram_mib
        ):
            return None
        delta = step.mib or 0
        signed = delta if step.action is Action.SHRINK else -delta
        least = self._role_reserve(s)
        gpus = self.ex.gpus()
        if gpus is not None:
            by_uuid = {g.uuid: g for g in gpus}
            role = self.desired.roles.get(s.gpu_roles[0]) if s.gpu_roles else None
            dev = by_uuid.get(role.uuid) if role is not None and role.uuid else None
            if dev is not None and dev.free_mib is not None:
                return max(least, dev.free_mib + signed)
        role = self.desired.roles[s.gpu_roles[0]]
        committed = self.ledger.committed_mib(role.id)
        if step.action is Action.GROW:  # the grow is already counted in the ledger
            committed -= delta
        return max(least, role.capacity_mib - committed + signed)

    # -- undo -------------------------------------------------------------------------
    def compensate(self, failed: Step) -> list[UndoFault]:
        """Undo what the failed step's group left half-done; the faults it met."""
        return self.undo_group(failed.group, f"{failed.action} {failed.serve}", failed)

    def compensate_all(self, why: str) -> None:
        """Undo every group still half-done (the plan ended, or the controller stops)."""
        groups = [*self.quiesced, *self.others_quiesced, *set(self.reserved.values())]
        for group in dict.fromkeys(groups):
            self.undo_group(group, why, None)

    def undo_group(self, group: str, after: str, failed: Step | None) -> list[UndoFault]:
        """Undo ``group``: readmit what it quiesced, settle what it reserved or started.

        Every serve's undo is attempted whatever another one met. A transition the
        lifecycle machine refuses here is a bug: it is not passed over but collected,
        logged at ERROR, kept in :attr:`undo_faults` (the report's ``undo_faults``, which
        makes it not ok) and returned, for the failed step's detail.
        """
        faults: list[UndoFault] = []
        for name in self.quiesced.pop(group, []):
            self._undo_one(faults, group, after, name, self._readmit_undone, name)
        for name in self.others_quiesced.pop(group, []):
            logger.warning(
                "{}: nothing was stopped; tier {} stays quiesced by whoever quiesced it",
                name,
                self.serve(name).router_tier,
            )
            self._undo_one(faults, group, after, name, self._back_in_service, name)
        for name, g in list(self.reserved.items()):
            if g != group:
                continue
            del self.reserved[name]
            self._undo_one(faults, group, after, name, self._settle_failed_start, name)
            token = self.tokens.pop(name, None)
            if self.ex.starts is not None and not self.detached and token is not None:
                self.ex.starts.end(name, token)
        if failed is not None and failed.action is Action.AWAIT_READY:
            serve = failed.serve
            self._undo_one(faults, group, after, serve, self._settle_failed_start, serve)
        # a failed shrink or grow has nothing to undo: resize() left the ledger counting
        # what the engine's answer proves it holds (or its full reservation), and asking
        # the engine to grow back would take memory the ledger may have given away
        self.undo_faults.extend(faults)
        return faults

    def _undo_one(
        self,
        faults: list[UndoFault],
        group: str,
        after: str,
        serve: str,
        undo: Callable[..., object],
        *args: Any,
    ) -> None:
        """Run one serve's undo; a fault it meets is collected and logged, not raised, so
        the undo of the group's other serves goes on."""
        try:
            undo(*args)
            return
        except IllegalTransition as exc:  # the machine refused: a bug of the undo's path
            fault = UndoFault(serve, group, exc.trigger, after, f"lifecycle: {exc}")
            logger.error("the undo of group {} (after {}): {}", group, after, fault.fault)
        except Exception as exc:  # a bug too; it must not leave the others undone
            logger.exception(
                "the undo of group {} (after {}): {}: unexpected error", group, after, serve
            )
            fault = UndoFault(
                serve, group, None, after, f"unexpected error: {type(exc).__name__}: {exc}"
            )
        faults.append(fault)

    def _readmit_undone(self, name: str) -> None:
        """Readmit the tier of ``name``, which its group quiesced and did not stop."""
        s = self.serve(name)
        try:
            detail = self.readmit_tier(s) if s.router_tier is not None else "no router tier"
        except StepError as exc:
            # a legal refusal, not a fault of the undo: the router refused (or could not
            # be asked) to readmit. The tier stays quiesced, named in the report's
            # left_quiesced, and the loop readmits it on later cycles while it runs
            self.left_quiesced[name] = str(exc)
            logger.error(
                "{}: nothing was stopped, but tier {} is left quiesced: {}",
                name,
                s.router_tier,
                exc,
            )
        else:
            logger.info("{}: {} (nothing was stopped)", name, detail)
        self._back_in_service(name)

    def _back_in_service(self, name: str) -> None:
        """The machine of ``name``, quiesced by the group being undone, back in service.

        A serve whose stop failed is ``failed`` (``stop_failed``): that is not a fault of
        the undo, and ``failed`` has no ``readmit``. Its machine stays failed; observation
        moves it on (``recover`` while its container runs, ``reset`` once it is down).
        Any other state is asked for ``readmit``, and the machine refuses what it forbids.
        """
        if self.machines[name].state == LifecycleState.FAILED:
            logger.info("{}: its stop failed; its machine stays failed until observed", name)
            return
        self.move(name, Trigger.READMIT)

    def _settle_failed_start(self, name: str) -> None:
        """After a failed start: stop what still runs, and hold exactly what it holds.

        Called by the undo only; a transition the machine refuses raises
        :class:`IllegalTransition` (after the ledger was made true), for the undo to report.
        """
        s = self.serve(name)
        try:
            state = self.ex.docker.inspect(s.container)
            if state is not None and state.state in (
                ContainerState.RUNNING,
                ContainerState.RESTARTING,
            ):
                stop_s = self.ex.runtime(name).stop_timeout_s
                self.ex.docker.stop(s.container, stop_s)
                state = self.ex.docker.inspect(s.container)
        except ActionError as exc:
            logger.error(
                "{}: cannot confirm the failed start is down ({}); keeping its reservation",
                name,
                exc,
            )
            self._settle_machine(name)
            return
        holds = state is not None and state.state in COMMITTED_STATES
        if not holds and self.ledger.holds(name):
            result = self.ledger.release(name)
            if not isinstance(result, Refusal):
                self.ledger = result
        self._settle_machine(name)

    def _settle_machine(self, name: str) -> None:
        """The machine of a failed start (or wake): ``start_failed`` from reserved or
        starting, ``fail`` from any other state, nothing when it is failed already."""
        machine = self.machines[name]
        if machine.state != LifecycleState.FAILED:
            self.move(
                name,
                Trigger.START_FAILED
                if machine.state in (LifecycleState.RESERVED, LifecycleState.STARTING)
                else Trigger.FAIL,
            )


_RESIZES = (Action.SHRINK, Action.GROW)


def _refuse_dependents(plan: Plan, desired: DesiredState, refused: dict[str, list[str]]) -> None:
    """A refused group's stops do not happen: refuse the starts that needed them.

    Memory is guarded by the ledger at each reserve; exclusivity and ports are not, so
    a start that conflicts with a serve whose stop was refused (in another group) is
    refused too, and so on until nothing more changes.
    """
    while True:
        kept = {st.serve for st in plan.steps if st.action is Action.STOP and st.group in refused}
        added = False
        for st in plan.steps:
            if st.action is not Action.START or st.group in refused:
                continue
            s = desired.serves[st.serve]
            for name in sorted(kept):
                other = desired.serves[name]
                why = conflict(s, other) or conflict(other, s)
                if why is not None:
                    refused[st.group] = [
                        f"{s.name} needs {name} stopped ({why}), and that stop was refused"
                    ]
                    added = True
                    break
        if not added:
            return


def _undo_text(faults: list[UndoFault]) -> str:
    """What a failed step's detail adds about its undo: "the undo of group G met N
    fault(s): …"."""
    n = len(faults)
    return f"the undo of group {faults[0].group} met {n} fault{'s' if n > 1 else ''}: " + (
        "; ".join(f"{f.serve}: {f.fault}" for f in faults)
    )


def _reason(output: str) -> str:
    """The line of an ``up`` command's output that says why it failed (Docker's error)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if not lines:
        return "no output"
    marked = [ln for ln in lines if "error" in ln.lower() or "unable" in ln.lower()]
    return (marked or lines)[-1][:300]


def _epoch_or_none(value: str | float | None) -> float | None:
    from controller.snapshot import epoch_seconds

    try:
        return epoch_seconds(value)
    except ValueError:
        return None


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


def _env_token(var: str | None) -> str | None:
    import os

    if not var:
        return None
    value = os.environ.get(var)
    return value.strip() if value else None
