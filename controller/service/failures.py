"""The loop's failure bookkeeping, kept on the serve records.

What a cycle's observation and execution say about failures, written into each serve's
record (:mod:`controller.service.records`): a serve the loop keeps running found dead
(:meth:`FailureBook.note_deaths`), a failed start, wake or reload, a shrink refused or
not yet answered, a start the preflight refused (:meth:`FailureBook.learn`,
:meth:`FailureBook.after_preflight`), each counted by the backoff arithmetic of
``statemachine/lifecycle/backoff.py``; the marks a step's outcome sets or clears (no sleep, no
shrink); the stops whose memory NVML has not shown back yet
(:meth:`FailureBook.still_unreleased`). :meth:`FailureBook.learn` also journals what
the executor established (elastic figures, sleeps, what a stop ends).

This module must not decide what to do (the planner reads the holds through the
``Policy``), nor touch docker or NVML, nor keep any state of its own: everything it
knows is in the records and the journal.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from loguru import logger

from controller.service.records import RecordStore
from controller.service.steps.results import ExecutionReport, Outcome, StepResult
from controller.snapshot import SnapshotModel
from controller.store.journal import Journal
from statemachine.answers.status_report import lifecycle_from_observation
from statemachine.domain.types import ContainerObs, DesiredRun, Observed, ServeSpec
from statemachine.lifecycle import backoff
from statemachine.lifecycle.backoff import Backoff
from statemachine.planning.plan_types import Action, Plan


class Declared(Protocol):
    """A serve as the manifest declares it: what these records need of it (its container)."""

    @property
    def container(self) -> str: ...


@dataclass(frozen=True, slots=True)
class FailureBook:
    """The failure bookkeeping over ``records``, with the backoff's base and cap (seconds)."""

    records: RecordStore
    base_s: float
    cap_s: float

    def fail(self, serve: str, why: str, now: float, *, after_healthy_run: bool = False) -> None:
        """Count one failure of ``serve`` (or of a group) at ``now``, and say when it is tried."""
        b = self.records.backoff.setdefault(serve, Backoff())
        delay = backoff.record_failure(
            b, why, now, base_s=self.base_s, cap_s=self.cap_s, after_healthy_run=after_healthy_run
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

    def note_deaths(
        self,
        serves: Iterable[ServeSpec],
        requested: Collection[str],
        observed: Observed,
        now: float,
    ) -> None:
        """A serve the loop keeps running (desired or requested) found dead is a failure.

        Failures count up (the backoff doubles) until the serve has stayed up for the
        backoff cap; a start that becomes healthy only lifts the current hold, so a
        serve that crashes after every healthy start backs off ever longer.
        """
        if not observed.docker_ok:
            return
        for s in serves:
            if s.desired is not DesiredRun.RUNNING and s.name not in requested:
                continue
            if s.name in observed.starting:
                continue  # its start is in progress: that start reports its own failure
            self._seen(s.name, observed.container(s.container), now)

    def _seen(self, name: str, obs: ContainerObs, now: float) -> None:
        """One kept serve's container as observed: a healthy run, a crash loop over, a death."""
        state = lifecycle_from_observation(obs)
        if state == "running" and obs.health != "unhealthy" and obs.started_at is not None:
            self.records.ran_healthy[name] = obs.started_at  # its death is after a healthy run
        if (
            state == "running"
            and name in self.records.backoff
            and backoff.crash_loop_over(obs.started_at, now, cap_s=self.cap_s)
        ):
            del self.records.backoff[name]  # it has stayed up: the crash loop is over
        if state != "failed":
            return
        if obs.started_at is not None and self.records.stopped_by_us.get(name) == obs.started_at:
            return  # exited non-zero because we stopped it (an eviction), not a crash
        b = self.records.backoff.setdefault(name, Backoff())
        if b.seen_exit == obs.started_at and b.failures:
            return
        b.seen_exit = obs.started_at
        why = "OOM-killed" if obs.oom_killed else f"exited {obs.exit_code}"
        ran = obs.started_at is not None and self.records.ran_healthy.get(name) == obs.started_at
        self.fail(name, f"container {why}", now, after_healthy_run=ran)

    def after_preflight(self, plan: Plan, report: ExecutionReport, now: float) -> None:
        """The preflight refused these starts: back off each, the others ran."""
        if not report.preflight:
            return
        groups = set(report.refused_groups)
        refused = sorted(
            {s.serve for s in plan.steps if s.action is Action.START and s.group in groups}
        )
        for name in refused:
            own = [p for p in report.preflight if p.startswith(f"{name}:")]
            self.fail(name, "preflight: " + "; ".join(own or report.preflight), now)

    def still_unreleased(self, snap: SnapshotModel, serves: Mapping[str, Declared]) -> list[str]:
        """Serves whose memory did not come back after their stop, and still has not.

        The ledger keeps counting them (fail closed) until NVML attributes no memory to
        the exited container any more, or the container runs again (then it holds its
        reservation as usual). Without NVML nothing can be confirmed: they stay counted.
        """
        unreleased = self.records.unreleased
        for name in sorted(unreleased):
            spec = serves.get(name)
            c = snap.containers.get(spec.container) if spec is not None else None
            running = c is not None and c.state in ("running", "paused", "restarting")
            back = snap.gpus is not None and not (c is not None and (c.gpu_used_mib or 0) > 0)
            if spec is None or running or back:
                unreleased.discard(name)
                if spec is not None and not running:
                    logger.info("{}: NVML shows its memory back; the reservation is released", name)
        return sorted(unreleased)

    def learn(
        self, report: ExecutionReport, now: float, journal: Journal, serves: Mapping[str, Declared]
    ) -> None:
        """What a plan's execution established: journalled figures, marks, failures."""
        # what the executor counts elastic serves at, as of the engine's answer (not the
        # cycle's start: the same plan may have started the container since)
        for name, figure in report.elastic.items():
            journal.set_elastic(name, figure.mib, figure.at)
        for name, why in report.stopped_instead.items():
            self._stopped_instead(name, why)
        for name, rec in report.sleeps.items():  # put to sleep, or no longer asleep
            if rec is not None:
                journal.set_sleeping(rec)
            elif (spec := serves.get(name)) is not None:
                journal.forget_sleeping(spec.container)
        for r in report.results:
            handler = _ON_RESULT.get((r.step.action, r.outcome))
            if handler is not None:
                handler(self, _Learnt(r, r.ended_at or now, now, journal, serves))

    def _stopped_instead(self, name: str, why: str) -> None:
        if name not in self.records.no_sleep:
            logger.warning(
                "{}: stopped instead of put to sleep ({}); stopped, not put to "
                "sleep, until it starts again or the manifest changes",
                name,
                why,
            )
        self.records.no_sleep.add(name)

    # ------------------------------------------------ what each step's outcome means
    def _start_failed(self, x: _Learnt) -> None:
        name, died = x.result.step.serve, x.result.died_started_at
        b0 = self.records.backoff.get(name)
        if died is not None and b0 is not None and b0.seen_exit == died:
            return  # this death was counted already, when it was observed
        self.fail(name, x.result.detail, x.ended)  # from the failure, not the cycle's start
        if died is not None:
            self.records.backoff[name].seen_exit = died

    def _started(self, x: _Learnt) -> None:
        self.records.no_sleep.discard(x.result.step.serve)  # a fresh engine: sleep tried again

    def _ready(self, x: _Learnt) -> None:
        b = self.records.backoff.get(x.result.step.serve)
        if b is not None:
            b.until = 0.0  # healthy: no hold, but the count stays until it lasts

    def _shrink_refused(self, x: _Learnt) -> None:
        self.records.no_shrink.add(x.result.step.serve)  # it cannot give what was asked

    def _shrink_unanswered(self, x: _Learnt) -> None:
        # busy (409) or no answer: not a refusal; the requester waits, then the same
        # shrink is asked again
        r = x.result
        self.fail(r.step.group, f"{r.step.serve} did not give VRAM back yet: {r.detail}", x.ended)

    def _failed(self, x: _Learnt) -> None:
        self.fail(x.result.step.serve, x.result.detail, x.ended)  # stopped: a cold start, later

    def _stopped(self, x: _Learnt) -> None:
        name = x.result.step.serve
        x.journal.set_elastic(name, None, x.now)  # the engine forgets its reserve
        if (spec := x.serves.get(name)) is not None:
            x.journal.forget_sleeping(spec.container)  # a sleeper stopped
        self.records.no_shrink.discard(name)


@dataclass(frozen=True, slots=True)
class _Learnt:
    """One step's result, with what its meaning is written with."""

    result: StepResult
    ended: float  # when it ended (the cycle's time where the step has none)
    now: float
    journal: Journal
    serves: Mapping[str, Declared]


_ON_RESULT: dict[tuple[Action, Outcome], Callable[[FailureBook, _Learnt], Any]] = {
    (Action.START, Outcome.FAILED): FailureBook._start_failed,
    (Action.AWAIT_READY, Outcome.FAILED): FailureBook._start_failed,
    (Action.START, Outcome.OK): FailureBook._started,
    (Action.AWAIT_READY, Outcome.OK): FailureBook._ready,
    (Action.SHRINK, Outcome.FAILED): FailureBook._shrink_refused,
    (Action.SHRINK, Outcome.ABORTED): FailureBook._shrink_unanswered,
    (Action.WAKE, Outcome.FAILED): FailureBook._failed,
    (Action.RELOAD, Outcome.FAILED): FailureBook._failed,
    (Action.STOP, Outcome.OK): FailureBook._stopped,
}
