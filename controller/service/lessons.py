"""What the control loop learns from each observation, execution and start's end.

:class:`Lessons` keeps the serves' records up to date over the loop's state
(:class:`controller.service.loop_state.LoopState`): deaths counted and failures held back
(``controller.service.failures``), tiers left quiesced (``tiers``), releases NVML has
not shown yet, the stops this process made, the requests that ended, and the starts
carried out beside the loop once they end. It asks the loop for a cycle only through a
:class:`LoopHandle` (its triggers and wake-ups).

This module must not plan, run a cycle nor touch docker; it never reads the loop's
private parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from controller.service import overlays, tiers
from controller.service.cycle import CycleResult
from controller.service.executor import ExecutionReport, Outcome, StepResult
from controller.service.footprints import Reading
from controller.service.loop_state import LoopState
from controller.snapshot import SnapshotModel
from statemachine.domain.types import Observed
from statemachine.ledger.reservations import Ledger
from statemachine.lifecycle import backoff
from statemachine.planning.idleness import in_force
from statemachine.planning.plan_types import (
    Action,
)


class LoopHandle(Protocol):
    """What a cycle may ask of the loop that runs it: another cycle, now or later."""

    @property
    def stopping(self) -> bool:
        """The loop is stopping: ask for nothing more."""
        ...

    def trigger(self, reason: str) -> None:
        """Ask for a cycle (coalesced with any other pending request)."""
        ...

    def wake_at(self, when: float | None, reason: str) -> None:
        """Ask for a cycle at epoch ``when`` (``None``: none), replacing the last such."""
        ...


@dataclass(frozen=True, slots=True)
class Lessons:
    """What the loop learns, kept on the serves' records and the journal."""

    state: LoopState
    loop: LoopHandle

    def note_deaths(self, observed: Observed, now: float) -> None:
        """Count the deaths of the serves the loop keeps running (their backoff)."""
        s = self.state
        requested = {r.serve for r in s.journal.active_requests()}
        s.failures.note_deaths(s.mset.desired().serves.values(), requested, observed, now)

    def learn(self, report: ExecutionReport, now: float) -> None:
        """The failures of an execution held back, its successes clear their backoff."""
        self.state.failures.learn(report, now, self.state.journal, self.state.mset.serves)

    def still_unreleased(self, snap: SnapshotModel) -> list[str]:
        """The serves stopped whose memory NVML has not shown back yet."""
        return self.state.failures.still_unreleased(snap, self.state.mset.serves)

    def track_tiers(self, steps: list[dict[str, Any]]) -> None:
        """The tiers these steps left quiesced or readmitted (journalled)."""
        s = self.state
        tiers.track_tiers(s.serve_records.quiesced, lambda: s.journal, steps)

    def recover_tiers(self) -> None:
        """At start: the tiers an earlier controller may have left quiesced."""
        s = self.state
        tiers.recover_tiers(s.serve_records.quiesced, lambda: s.journal, dry_run=s.options.dry_run)

    def elastic_in_force(self, snap: SnapshotModel) -> dict[str, int]:
        """The elastic reserves the journal records, for this observation (read only)."""
        return overlays.elastic_in_force(self.state.journal, self.state.mset, snap)[0]

    def take_in(self, learned: overlays.Learned) -> None:
        """What an observation found, journalled (on the loop's thread): the start
        records that ended or were found, the sleepers forgotten or seen, void reserves."""
        learned.write(self.state.journal, self.state.serve_records)

    def footprint_reading(self) -> Reading:
        """Devices and containers now, for a footprint (from a start's thread too)."""
        return self.state.host.footprint_reading(self.state.mset, self.state.nvml)

    def wake_when_a_hold_ends(self) -> None:
        """Ask for a cycle when the first backoff hold ends (on the loop's thread).

        A held serve is tried when its hold ends, as the log, ``/v1/serves`` and the page
        promise, not at whatever resync comes after it. Armed again after every cycle and
        every start's end (the places a hold is set or lifted); one wake-up at a time.
        """
        self.loop.wake_at(backoff.next_end(self.state.backoff, time.time()), "a backoff hold ended")

    def after_execution(self, result: CycleResult, report: ExecutionReport) -> None:
        """What the loop learns from an execution: backoff, tiers, releases, its stops."""
        s = self.state
        now, observed = result.inputs.now, result.observed
        desired = result.inputs.placed
        overlays.record_starts(s.serve_records, report, desired, now)
        s.restore_times.record(report.results)  # the wakes (and starts run in the plan) it timed
        self.learn(report, now)
        self.track_tiers([r.to_json() for r in report.results])
        for r in report.results:
            if r.step.action is Action.RELEASE and r.outcome is Outcome.FAILED:
                s.serve_records.unreleased.add(r.step.serve)
        s.failures.after_preflight(result.plan, report, time.time())
        for r in report.results:
            if r.step.action is Action.STOP and r.outcome is Outcome.OK:
                spec = desired.serves[r.step.serve]
                started_at = observed.container(spec.container).started_at
                s.serve_records.stopped_by_us[spec.name] = started_at
        # confirm a clean execution at once; after a failure, wait for the next
        # trigger (resync, docker event): re-planning at once spins on a fault
        if report.ok and not self.loop.stopping:
            self.loop.trigger("after execution")

    def start_ended(
        self, cycle_id: int, results: list[StepResult], release: Callable[[], None]
    ) -> None:
        """A start carried out beside the loop has ended (on the loop's thread).

        Its results are learned (backoff) before ``release`` ends it in the tracker, so
        the serve is never planned again before its failure is known.
        """
        s = self.state
        s.start_outcomes.ended(
            cycle_id, results, lambda: s.journal, learn=self._learn_start, release=release
        )
        serves = ", ".join(sorted({r.step.serve for r in results}))
        s.changes.changed()
        if not self.loop.stopping:
            self.loop.trigger(f"start of {serves} ended")

    def _learn_start(self, results: list[StepResult]) -> None:
        s = self.state
        report = ExecutionReport(results, Ledger({}), {})
        self.learn(report, time.time())
        s.restore_times.record(results)  # how long the cold start took, when it ended healthy
        overlays.record_starts(s.serve_records, report, s.mset.desired(), time.time())
        self.track_tiers([r.to_json() for r in results])
        self.wake_when_a_hold_ends()

    def start_done_callback(
        self, cycle_id: int
    ) -> Callable[[list[StepResult], Callable[[], None]], None]:
        """What a start handed off in cycle ``cycle_id`` calls when it ends (its thread)."""
        loop = self.state.aio

        def done(results: list[StepResult], release: Callable[[], None]) -> None:
            # on the start's thread: hand the results to the loop's thread
            try:
                if loop is None or loop.is_closed():
                    raise RuntimeError("the loop has ended")
                loop.call_soon_threadsafe(self.start_ended, cycle_id, results, release)
            except RuntimeError:
                release()

        return done

    def end_finished_requests(self, observed: Observed, now: float) -> None:
        """Expired requests end once their serve is down; requests for gone serves end."""
        s = self.state
        serves = s.mset.desired().serves
        for req in s.journal.active_requests():
            spec = serves.get(req.serve)
            if spec is None:
                s.journal.end_request(req.serve, now)
                s.events.publish("request.closed", serve=req.serve, reason="serve gone")
                continue
            if req.serve in observed.starting:
                continue  # its start is in progress: it ends once the serve is down
            ended = not in_force(req, spec, observed, now)
            if ended and not observed.container(spec.container).holds:
                s.journal.end_request(req.serve, now)
                s.events.publish("request.closed", serve=req.serve, reason="ended, serve down")
