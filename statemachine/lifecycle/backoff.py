"""Failure backoff, as arithmetic: how long a serve that failed waits before a retry.

A serve the loop keeps running that fails (a start that does not become healthy, a
container found dead, an elastic shrink that did not answer) is held for
``base_s * 2 ** (failures - 1)`` seconds, at most ``cap_s``. The one exception, as
Docker's restart policy and the kubelet do it: a container found dead after a healthy
run (no failure counted since the last crash loop ended) is started again at once,
and the failures after it are held ``base_s``, ``2 * base_s``, … (the restart at once
is not counted in the doubling). A healthy start lifts the current hold but keeps the
count; a serve that stays up longer than the cap ends the crash loop (its count is
forgotten). The planner reports a held serve as blocked with the words
:func:`hold_reason` gives; the loop wakes itself when a hold ends (:func:`next_end`).

Pure: no clock (``now`` is an argument), no I/O, no logging. The loop
(``controller/service/loop.py``) keeps one :class:`Backoff` per serve and calls these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The backoff of `vramctl run` (seconds), fixed in this version (docs/operations.md).
DEFAULT_BASE_S = 5.0
DEFAULT_CAP_S = 300.0


@dataclass
class Backoff:
    """Failures of one serve and when it may be tried again."""

    failures: int = 0
    until: float = 0.0
    last_failure: str = ""
    seen_exit: float | None = None  # started_at of the last dead container counted
    #: failures of this crash loop that held nothing (1: it began with a death after a
    #: healthy run, restarted at once)
    waived: int = 0


def delay_s(failures: int, *, base_s: float, cap_s: float, waived: int = 0) -> float:
    """The hold after the ``failures``-th failure in a row: none for the ``waived``
    first, then ``base_s`` doubling, capped."""
    if failures <= waived:
        return 0.0
    return float(min(cap_s, base_s * 2 ** (failures - 1 - waived)))


def record_failure(
    b: Backoff,
    why: str,
    now: float,
    *,
    base_s: float,
    cap_s: float,
    after_healthy_run: bool = False,
) -> float:
    """Count one more failure of ``b`` at ``now``; returns the hold it starts (seconds).

    ``after_healthy_run``: the failure is a container found dead that had been running
    (not a start that failed); the first such of a crash loop holds nothing.
    """
    if after_healthy_run and b.failures == 0:
        b.waived = 1
    b.failures += 1
    b.last_failure = why
    delay = delay_s(b.failures, base_s=base_s, cap_s=cap_s, waived=b.waived)
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


def next_end(backoff: Mapping[str, Backoff], now: float) -> float | None:
    """When the first hold still running after ``now`` ends (``None``: none runs): the
    loop asks for a cycle then, so a held serve is tried when it was promised."""
    return min((b.until for b in backoff.values() if b.until > now), default=None)
