"""One cycle: observe → plan → execute → journal, the sequence ``apply`` and ``run`` share.

:func:`run_cycle` is the only place that says in which order a cycle's parts happen.
What each part does differs between its callers and is supplied as a
:class:`CycleSteps`:

- ``vramctl apply`` observes the host as it is with the state directory's journal read
  over it (the situation ``status`` and ``plan`` answer from), plans (or takes a saved
  plan still current), executes every step in order (no start tracker) and keeps no
  journal;
- ``vramctl run`` (:class:`controller.service.loop.Controller`) observes with what the
  journal knows (start reservations, elastic reserves), counts deaths and ends requests
  before it plans with the backoff holds, journals the inputs, the policy and the plan,
  hands starts to the tracker and adds what they reported to the journalled outcome.

The blocking parts (observing, executing) run in a worker thread; the others run on
the caller's event loop, so the loop's own state is only ever touched from its thread
(a start that ends while its plan executes is handed to that thread too).

This module must not decide anything (the planner does) nor touch docker itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.service.executor import ExecutionReport
from controller.snapshot import SnapshotModel, snapshot_to_json
from controller.store.journal import Journal
from statemachine.answers.situation import Situation
from statemachine.domain.types import Observed
from statemachine.planning.plan_types import Action, Plan


class CycleSteps(Protocol):
    """What one caller's cycle does at each point of :func:`run_cycle`."""

    def observe(self) -> SnapshotModel:
        """The host now (called in a worker thread)."""
        ...

    def inputs(self, snap: SnapshotModel, observed: Observed) -> Situation:
        """The decision's inputs for this observation (what the loop learns from it
        first): one :class:`~statemachine.answers.situation.Situation`."""
        ...

    def plan(self, inputs: Situation) -> Plan:
        """The plan (``inputs.plan``, or a saved plan still current)."""
        ...

    def journal(self, plan: Plan) -> CycleJournal | None:
        """Where this plan is recorded; ``None``: it is not (and a dry run logs nothing)."""
        ...

    def execute(self, plan: Plan, inputs: Situation, cycle_id: int | None) -> ExecutionReport:
        """Carry the plan out (called in a worker thread)."""
        ...

    def outcome(self, cycle_id: int | None, outcome: dict[str, Any]) -> None:
        """Complete the outcome before it is journalled (starts that ended meanwhile)."""
        ...


@dataclass(frozen=True, slots=True)
class CycleJournal:
    """The journal a cycle is recorded in, with what each record carries."""

    journal: Journal
    manifest_digest: str
    manifest_files: dict[str, str]
    dry_run: bool

    def record(self, snap: SnapshotModel, inputs: Situation, plan: Plan) -> int:
        """Record the inputs (snapshot, requests, policy) and the plan; the cycle's id."""
        return self.journal.record_cycle(
            at=inputs.now,
            manifest_digest=self.manifest_digest,
            manifest_files=self.manifest_files,
            observed=snapshot_to_json(snap),
            plan=plan.to_json(),
            requests=[r.to_json() for r in inputs.desired.requests],
            dry_run=self.dry_run,
            policy=inputs.policy.to_json(),
        )


@dataclass(slots=True)
class CycleResult:
    """What one cycle saw, planned and did."""

    snapshot: SnapshotModel
    observed: Observed
    inputs: Situation
    plan: Plan
    #: the journal's id of the cycle (``None``: not recorded)
    cycle_id: int | None = None
    #: the executor's report (``None``: nothing was executed)
    report: ExecutionReport | None = None
    #: the outcome as journalled (the report's JSON and what completed it)
    outcome: dict[str, Any] | None = None
    #: seconds each part took, in order: ``observe``, ``plan`` (with what the loop
    #: learns first), ``journal``, ``execute`` (the parts that ran)
    phases: dict[str, float] = field(default_factory=dict)


async def run_cycle(steps: CycleSteps, *, execute: bool = True) -> CycleResult:
    """One cycle: observe, plan, then (when the plan has steps) journal and execute.

    ``execute`` false (a dry run): the plan is journalled, nothing is carried out.
    """
    clock = _Phases()
    snap = await asyncio.to_thread(steps.observe)
    observed = snap.to_observed()
    clock.lap("observe")
    inputs = steps.inputs(snap, observed)
    plan = steps.plan(inputs)
    result = CycleResult(snap, observed, inputs, plan, phases=clock.laps)
    clock.lap("plan")
    if not plan.steps:
        return result
    journal = steps.journal(plan)
    if journal is not None:
        result.cycle_id = journal.record(snap, inputs, plan)
    clock.lap("journal")
    if not execute:
        return result
    report = await asyncio.to_thread(steps.execute, plan, inputs, result.cycle_id)
    clock.lap("execute")
    result.report = report
    outcome = report.to_json()
    # the starts handed off and not yet ended: a controller killed before they end
    # readmits their tiers
    done = {r.step.serve for r in report.results if r.step.action is Action.START}
    outcome["pending"] = sorted({st.serve for st in plan.steps if st.action is Action.START} - done)
    steps.outcome(result.cycle_id, outcome)
    result.outcome = outcome
    if journal is not None and result.cycle_id is not None:
        journal.journal.record_outcome(result.cycle_id, outcome)
    return result


@dataclass(slots=True)
class _Phases:
    """Seconds between laps, by the name of the part that ended (a monotonic clock)."""

    laps: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.monotonic)

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = now - self._last
        self._last = now
