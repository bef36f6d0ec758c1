"""Failure backoff, as arithmetic: how long a serve that failed waits before a retry.

A serve the loop keeps running that fails (a start that does not become healthy, a
container found dead, an elastic shrink that did not answer) is held for
``base_s * 2 ** (failures - 1)`` seconds, at most ``cap_s``. A healthy start lifts the
current hold but keeps the count; a serve that stays up longer than the cap ends the
crash loop (its count is forgotten). The planner reports a held serve as blocked with
the words :func:`hold_reason` gives.

Pure: no clock (``now`` is an argument), no I/O, no logging. The loop
(``controller/service/loop.py``) keeps one :class:`Backoff` per serve and calls these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The defaults of ``vramctl run --backoff-base / --backoff-cap`` (seconds).
DEFAULT_BASE_S = 5.0
DEFAULT_CAP_S = 300.0


@dataclass
class Backoff:
    """Failures of one serve and when it may be tried again."""

    failures: int = 0
    until: float = 0.0
    last_failure: str = ""
    seen_exit: float | None = None  # started_at of the last dead container counted


def delay_s(failures: int, *, base_s: float, cap_s: float) -> float:
    """The hold after the ``failures``-th failure in a row: doubling, capped."""
    return float(min(cap_s, base_s * 2 ** (failures - 1)))


def record_failure(b: Backoff, why: str, now: float, *, base_s: float, cap_s: float) -> float:
    """Count one more failure of ``b`` at ``now``; returns the hold it starts (seconds)."""
    b.failures += 1
    b.last_failure = why
    delay = delay_s(b.failures, base_s=base_s, cap_s=cap_s)
    b.until = now + delay
    return delay


def crash_loop_over(started_at: float | None, now: float, *, cap_s: float) -> bool:
    """True when a running container has stayed up longer than the cap since its start."""
    return started_at is not None and now - started_at > cap_s


def hold_reason(b: Backoff, now: float) -> str:
    """Why a held serve is not started now, in the words the plan's ``blocked`` shows."""
    return (
        f"backing off after {b.failures} failure(s) ({b.last_failure}); "
        f"next try in {b.until - now:.0f}s"
    )


def holds(backoff: Mapping[str, Backoff], now: float) -> dict[str, str]:
    """The planner's ``Policy.hold``: every serve still inside its hold, with why."""
    return {name: hold_reason(b, now) for name, b in backoff.items() if b.until > now}
