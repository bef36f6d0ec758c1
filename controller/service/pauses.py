"""Pauses between the polls of a wait: short at first, longer as the wait goes on.

What the executor waits for (a health path that answers, an engine that says it sleeps
or is awake, memory that comes back on the device) often happens within milliseconds
of the call that caused it, and sometimes only after minutes. A fixed grain makes the
first kind wait a whole grain; :func:`pauses` starts at ``first_s`` and grows by
``factor`` up to ``cap_s``, so what happens at once is seen at once and a long wait
polls at most once per ``cap_s``.

This module only computes pauses; it must not sleep or read anything.
"""

from __future__ import annotations

from collections.abc import Iterator

#: the first pause: a loopback HTTP call or an NVML read costs about a millisecond
FIRST_S = 0.002
#: each pause is this much longer than the one before, up to the cap
FACTOR = 1.5


def pauses(cap_s: float, *, first_s: float = FIRST_S, factor: float = FACTOR) -> Iterator[float]:
    """``first_s``, then each pause ``factor`` times the one before, never over ``cap_s``
    (endless). ``cap_s`` below ``first_s`` gives ``cap_s`` throughout."""
    pause = min(first_s, cap_s)
    while True:
        yield pause
        pause = min(pause * factor, cap_s)
