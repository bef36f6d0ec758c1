"""Waits for the control loop's state to change, and the wake-up of those who wait.

An interface that answers once something happened (``up --wait``, a long poll) waits
in :meth:`ChangeWaiters.wait`; the loop calls :meth:`ChangeWaiters.changed` on its own
thread after each step, cycle or request, and :meth:`ChangeWaiters.changed_threadsafe`
from any other thread (the executor's live ledger). The loop's asyncio loop is read
through ``loop_of`` each time: it exists only while the loop runs.

This module must not read or change anything of the loop but its waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class ChangeWaiters:
    """The futures of whoever waits for the loop's state to change."""

    def __init__(self, loop_of: Callable[[], asyncio.AbstractEventLoop | None]) -> None:
        self._loop_of = loop_of
        self._waiters: set[asyncio.Future[None]] = set()

    def changed(self) -> None:
        """Wake whoever waits for the loop's state to change (on the loop's thread)."""
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def changed_threadsafe(self) -> None:
        """The same, from any thread (nothing to wake while the loop does not run)."""
        loop = self._loop_of()
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self.changed)

    async def wait(self, timeout_s: float) -> bool:
        """Wait until the state changes or the timeout; True when something changed.

        Never blocks the event loop.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            # asyncio.wait, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that meets the future's result, and a task cancelled at shutdown ran on
            done, _ = await asyncio.wait({fut}, timeout=max(0.0, timeout_s))
            return bool(done)
        finally:
            self._waiters.discard(fut)
            fut.cancel()
