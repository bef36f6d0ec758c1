"""What the executor's steps end in: each step's outcome and result, the plan's report.

:class:`StepError` is what a step handler raises when its step cannot be carried out;
:class:`StepResult` is one step's outcome as the executor records it, and
:class:`ExecutionReport` what one plan's execution did and the ledger it left (the
JSON forms here are the ``apply`` and journal contracts).

This module holds data only: it must not carry out, decide or read anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controller.store.journal import SleepRecord
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import (
    Step,
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
