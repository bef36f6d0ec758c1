"""Waiting in tests: for an event that can be observed, never for a figure of seconds.

A test that drives a subprocess, a container or the loop waits with :func:`wait_for` for
what it can see: a journal record, a log line, an answer of the API, a container's
state. The deadline is a last resort, not a measure of how long the thing takes: it is
minutes (:data:`WAIT_S`), so that a loaded machine (CI runs several workers on two
cores, beside Docker) never misses it, and a wait that does fail says what it waited
for and, given ``seen``, what it saw last.

Import as ``from support.waiting import ...`` (pytest puts ``tests/`` on ``sys.path``). Nothing
here starts, stops or changes anything; it only polls the check it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

#: the deadline of a wait for an event (seconds): generous, a last resort
WAIT_S = 180.0
#: how often a check is asked again
POLL_S = 0.05

T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float = WAIT_S,
    *,
    seen: Callable[[], object] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy, and return that.

    Past ``timeout`` seconds, fail naming ``what`` and, when ``seen`` is given, what it
    returns then (the state the test was looking at).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            last = f"; last seen: {seen()}" if seen is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{last}")
        time.sleep(POLL_S)
