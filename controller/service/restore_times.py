"""What bringing each serve back has cost: the cold starts and wakes the controller timed.

A cold start is timed from its ``start`` step's start until its ``await_ready`` step
ends OK; a wake from its ``wake`` step's start until its ``await_ready`` ends OK (a
level-2 wake's ``reload`` in between). A start or wake whose steps do not all end OK is
not a measurement. :func:`measure_restores` reads them off the steps' results
(``duration_s`` and ``ended_at``); :class:`RestoreBook` journals each (the ``reloads``
table, the newest few per serve and kind) and keeps them at hand, so each cycle's
policy gets them without reading the journal. What they make the cost of a serve is
the pure core's (:mod:`statemachine.planning.restore_cost`).

This module must not decide anything: it measures and records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from loguru import logger

from controller.service.steps.results import Outcome, StepResult
from controller.store.journal import DEFAULT_KEEP_RELOADS, Journal
from statemachine.planning.plan_types import Action
from statemachine.planning.restore_cost import COLD, WAKE, Measured, measured_from

#: the step that begins each kind of measurement
_BEGINS = {Action.START: COLD, Action.WAKE: WAKE}


@dataclass(frozen=True, slots=True)
class RestoreSample:
    """One measured cold start or wake: ``seconds`` until healthy, which was at ``at``."""

    serve: str
    kind: str
    seconds: float
    at: float


def measure_restores(results: Sequence[StepResult]) -> list[RestoreSample]:
    """The cold starts and wakes ``results`` (in the order they ended) carried out:
    from a ``start`` / ``wake`` step's beginning (its end less its duration) until the
    same serve's ``await_ready`` ended OK, each step on the way OK."""
    began: dict[str, tuple[str, float]] = {}  # serve -> (kind, when its first step began)
    out: list[RestoreSample] = []
    for r in results:
        serve, action = r.step.serve, r.step.action
        if r.outcome is not Outcome.OK or r.ended_at <= 0:
            began.pop(serve, None)
            continue
        kind = _BEGINS.get(action)
        if kind is not None:
            began[serve] = (kind, r.ended_at - max(0.0, r.duration_s))
        elif action is Action.AWAIT_READY and serve in began:
            kind, t0 = began.pop(serve)
            out.append(RestoreSample(serve, kind, max(0.0, r.ended_at - t0), r.ended_at))
    return out


class RestoreBook:
    """The measured reloads: journalled as they are taken, kept in memory for the policy.

    ``journal`` is asked for the journal at each use (the loop opens it after this is
    made); the first read loads what earlier controllers recorded. Thread-safe.
    """

    def __init__(
        self, journal: Callable[[], Journal | None], keep: int = DEFAULT_KEEP_RELOADS
    ) -> None:
        self._journal = journal
        self._keep = keep
        self._lock = threading.Lock()
        self._loaded = False
        self._seen: dict[str, dict[str, list[float]]] = {}

    def record(self, results: Sequence[StepResult]) -> list[RestoreSample]:
        """Measure ``results`` and record each measurement (journal, then memory)."""
        samples = measure_restores(results)
        if not samples:
            return samples
        journal = self._journal()
        with self._lock:
            self._load(journal)
            for s in samples:
                logger.info("{}: {} took {:.1f}s until healthy", s.serve, _WHAT[s.kind], s.seconds)
                if journal is not None:
                    try:
                        journal.add_restore(s.serve, s.kind, s.seconds, s.at, keep=self._keep)
                    except Exception as exc:  # a closed or locked journal must not stop the loop
                        logger.error("journal: cannot record {}'s {}: {}", s.serve, s.kind, exc)
                kept = self._seen.setdefault(s.serve, {}).setdefault(s.kind, [])
                kept.append(s.seconds)
                del kept[: -self._keep]
        return samples

    def measured(self, serves: Mapping[str, object] | None = None) -> dict[str, Measured]:
        """Serve -> its recorded measurements, oldest first (of ``serves`` only, when given)."""
        journal = self._journal()
        with self._lock:
            self._load(journal)
            return measured_from(
                {n: k for n, k in self._seen.items() if serves is None or n in serves}
            )

    def _load(self, journal: Journal | None) -> None:
        """What the journal holds, read once (under the lock)."""
        if self._loaded or journal is None:
            return
        self._loaded = True
        try:
            recorded = journal.restore_times()
        except Exception as exc:
            logger.error("journal: cannot read the measured reloads: {}", exc)
            return
        for serve, kinds in recorded.items():
            mine = self._seen.setdefault(serve, {})
            for kind, seconds in kinds.items():
                mine[kind] = [*seconds, *mine.get(kind, [])][-self._keep :]


_WHAT = {COLD: "a cold start", WAKE: "a wake"}
