"""What the mutating adapters share about faults: the error type and the retry pacing.

``AdapterError`` says whether trying later may help (``transient``); ``RetryKnobs``
keeps an adapter's bounds and builds its bounded ``Retrying``; ``backoff_wait``
paces tenacity's retries (exponential with jitter, never past a time budget);
``attempts_of`` reads how many calls a ``Retrying`` made. Only the adapters retry:
what reaches the executor is final for the plan.

This module must not talk to anything; it holds no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NotRequired, TypedDict, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    stop_after_attempt,
    stop_after_delay,
)
from tenacity.retry import retry_base


class Fault(TypedDict):
    """An :class:`AdapterError`'s keywords, for an error type that adds one of its own."""

    transient: bool
    status: NotRequired[int | None]
    attempts: NotRequired[int]


class AdapterError(Exception):
    """A call that failed; ``transient`` says whether trying later may help.

    ``status`` is the peer's HTTP status where it answered one; ``attempts`` is how
    many calls were made.
    """

    def __init__(
        self, message: str, *, transient: bool, status: int | None = None, attempts: int = 1
    ) -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient
        self.status = status
        self.attempts = attempts

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, transient={self.transient}, "
            f"status={self.status}, attempts={self.attempts})"
        )


E = TypeVar("E", bound=AdapterError)


def exhausted(error: type[E], retrying: Retrying, template: str, **parts: object) -> E:
    """The error of a call retried until its bounds ran out, for a fault worth trying
    again later (transient): ``template`` is formatted with ``n``, the attempts made,
    and ``parts`` (their text is not formatted again)."""
    tries = attempts_of(retrying)
    return error(template.format(n=tries, **parts), transient=True, attempts=tries)


class RetryKnobs:
    """The bounds every retrying adapter takes: attempts, a time budget, the first wait."""

    attempts: int
    max_wait_s: float
    initial_wait_s: float

    def set_retry_knobs(self, *, attempts: int, max_wait_s: float, initial_wait_s: float) -> None:
        """Check and keep the bounds (ValueError when they make no sense)."""
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {attempts}")
        if max_wait_s < 0 or initial_wait_s < 0:
            raise ValueError("max_wait_s and initial_wait_s must not be negative")
        self.attempts = attempts
        self.max_wait_s = float(max_wait_s)
        self.initial_wait_s = float(initial_wait_s)

    def bounded(self, retry: retry_base) -> Retrying:
        """A ``Retrying`` that retries what ``retry`` accepts, within these bounds.

        It stops after ``attempts`` calls or ``max_wait_s`` seconds, whichever comes
        first, sleeps :func:`backoff_wait` between calls, and re-raises the last fault.
        """
        return Retrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_wait_s),
            wait=backoff_wait(self.initial_wait_s, self.max_wait_s),
            retry=retry,
            reraise=True,
        )


def backoff_wait(initial_s: float, budget_s: float) -> Callable[[RetryCallState], float]:
    """Exponential backoff with jitter, never sleeping past ``budget_s`` since the start."""

    def wait(state: RetryCallState) -> float:
        delay = initial_s * 2.0 ** (state.attempt_number - 1) + random.uniform(0, initial_s)
        elapsed = float(state.seconds_since_start or 0.0)
        return max(0.0, min(delay, budget_s - elapsed))

    return wait


def attempts_of(retrying: Retrying) -> int:
    """How many calls a ``Retrying`` made (1 before it ran)."""
    number = retrying.statistics.get("attempt_number", 1)
    return number if isinstance(number, int) else 1
