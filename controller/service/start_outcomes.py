"""The outcomes of the starts a plan handed off, added to their cycle's journalled outcome.

A start is carried out beside the loop (:mod:`controller.service.starts`) and may end
while its plan still executes, or cycles later. :class:`StartOutcomes` keeps each recent
cycle's outcome (``None`` while its plan executes): a start that ends meanwhile waits
(``early``) and joins the outcome when it is recorded; one that ends after is added to
the journalled outcome at once. A start's results are learned (``learn``: backoff,
reservations, tiers) before it is released from the tracker, so its serve is never
planned again before its failure is known.

Everything here runs on the loop's thread. This module must not plan, execute or
decide anything about a serve: it only records what starts reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loguru import logger

from controller.service.executor import Outcome, StepResult
from controller.store.journal import Journal

#: the recent cycles whose outcomes are kept (older cycles' starts end unrecorded)
_KEPT = 32


class StartOutcomes:
    """Each recent cycle's outcome, and the start results that ended while it executed."""

    def __init__(self) -> None:
        #: cycle -> its outcome while starts it handed off may still end (None: executing)
        self.outcomes: dict[int, dict[str, Any] | None] = {}
        #: cycle -> the results that ended while its plan executed
        self.early: dict[int, list[StepResult]] = {}

    def executing(self, cycle_id: int) -> None:
        """The plan of ``cycle_id`` executes: a start's early end waits for its outcome."""
        self.outcomes[cycle_id] = None

    def ended(
        self,
        cycle_id: int,
        results: list[StepResult],
        journal: Callable[[], Journal],
        *,
        learn: Callable[[list[StepResult]], None],
        release: Callable[[], None],
    ) -> None:
        """A start carried out beside the loop has ended: its results are recorded and
        learned before ``release`` ends it in the tracker."""
        try:
            if cycle_id in self.outcomes and self.outcomes[cycle_id] is None:
                # the plan is still executing: its outcome takes these when it is recorded
                self.early.setdefault(cycle_id, []).extend(results)
            else:
                self._merge(cycle_id, results, journal)
            learn(results)
        finally:
            release()

    def _merge(
        self, cycle_id: int, results: list[StepResult], journal: Callable[[], Journal]
    ) -> None:
        """Add a start's results to its cycle's journalled outcome."""
        outcome = self.outcomes.get(cycle_id)
        if outcome is None:
            return
        add_start_results(outcome, results)
        try:
            journal().record_outcome(cycle_id, outcome)
        except Exception as exc:  # a pruned cycle, a closed journal: say so, go on
            logger.warning("journal: cannot record the end of a start: {}", exc)

    def complete(self, cycle_id: int, outcome: dict[str, Any]) -> None:
        """Add the starts that ended while the plan executed; keep the outcome."""
        add_start_results(outcome, self.early.pop(cycle_id, []))
        self.outcomes[cycle_id] = outcome
        for old_id in sorted(self.outcomes)[:-_KEPT]:  # bounded: old cycles' starts end
            del self.outcomes[old_id]


def add_start_results(outcome: dict[str, Any], results: list[StepResult]) -> None:
    """A start's results join its cycle's outcome; it is no longer pending."""
    if not results:
        return
    outcome["steps"] = [*outcome.get("steps", []), *(r.to_json() for r in results)]
    ok = all(r.outcome is Outcome.OK for r in results)
    outcome["ok"] = bool(outcome.get("ok", True)) and ok
    ended = {r.step.serve for r in results}
    outcome["pending"] = [p for p in outcome.get("pending", []) if p not in ended]
