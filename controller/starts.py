"""Starts in progress: which serves the controller is starting now, and their ``up`` commands.

A start (reserve, ``docker start`` or the serve's ``up`` command, the wait for health,
the readmit of its router tier) can last minutes: a vLLM load takes 30-100 s. The
executor therefore carries each start out on a thread of its own, beside the loop, and
records it here from its reserve until it has ended (healthy, or failed and confirmed
down). Each observation the loop makes hands :meth:`StartTracker.snapshot` to the
planner as ``Observed.starting``: a start in progress holds its reservation whatever
its container shows, and nothing is planned for it until it ends.

An ``up`` command runs in its own session, so it would survive a SIGKILL of the
controller. It is recorded in the journal before the controller waits for it
(:meth:`StartTracker.up_spawned`); a controller that starts on the same state
directory finds the record (:func:`supervise_orphans`) and, while that process still
runs, counts the serve as starting (its room is not handed out) until it exits, or
ends its process group at its deadline.

This module must not decide what to start (the planner does) and must not talk to
docker: it keeps records and watches processes the controller itself started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loguru import logger

from controller.journal import Journal, UpRecord

#: how long an orphaned ``up`` gets to exit after SIGTERM before its group is killed
ORPHAN_KILL_GRACE_S = 10.0


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22).

    With the pid it names one process for good: a pid reused later has another
    start time. ``None`` when the process does not exist or /proc cannot say.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", errors="replace")
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or ')'
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return int(rest[19])  # field 22 overall: 3 + 19
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """True while the process that was recorded (pid and start time) still exists.

    A zombie (exited, not yet reaped) counts as gone: it holds nothing.
    """
    now = proc_start_ticks(pid)
    if now is None:
        return False
    if start_ticks is not None and now != start_ticks:
        return False  # the pid was reused
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().decode("ascii", errors="replace")
        if state[state.rfind(")") + 2 :].startswith("Z"):
            return False
    except OSError:
        return False
    return True


@dataclass
class StartTracker:
    """Thread-safe record of the starts in progress (serve -> MiB reserved).

    ``journal`` (optional) keeps the ``up`` commands that run, so a restarted
    controller can supervise what a killed one left running.
    """

    journal: Journal | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _mib: dict[str, int] = field(default_factory=dict)
    _roles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _threads: dict[str, threading.Thread] = field(default_factory=dict)
    on_end: list[Callable[[str], None]] = field(default_factory=list)

    def begin(self, serve: str, roles: tuple[str, ...], mib: int) -> None:
        """A start of ``serve`` is in progress from now (its reservation is held)."""
        with self._lock:
            self._mib[serve] = mib
            self._roles[serve] = roles

    def end(self, serve: str) -> None:
        """The start has ended (healthy, or failed and its container confirmed down)."""
        with self._lock:
            self._mib.pop(serve, None)
            self._roles.pop(serve, None)
            self._threads.pop(serve, None)
        if self.journal is not None:
            self.journal.end_up(serve)
        for hook in list(self.on_end):
            hook(serve)

    def active(self, serve: str) -> bool:
        """True while a start of ``serve`` is in progress."""
        with self._lock:
            return serve in self._mib

    def snapshot(self) -> dict[str, int]:
        """Serve -> MiB reserved, for every start in progress (a copy)."""
        with self._lock:
            return dict(self._mib)

    def attach(self, serve: str, thread: threading.Thread) -> None:
        """The thread that carries the start out (joined at shutdown)."""
        with self._lock:
            self._threads[serve] = thread

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the threads that carry starts out (at shutdown)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                threads = [t for t in self._threads.values() if t.is_alive()]
            if not threads:
                return
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            threads[0].join(left)
            if deadline is not None and time.monotonic() >= deadline:
                return

    def up_spawned(
        self, serve: str, pid: int, *, roles: tuple[str, ...], mib: int, timeout_s: float
    ) -> None:
        """Record a running ``up`` command in the journal (before anyone waits for it)."""
        if self.journal is None:
            return
        now = time.time()
        self.journal.add_up(
            UpRecord(
                serve=serve,
                pid=pid,
                proc_start=proc_start_ticks(pid),
                roles=roles,
                mib=mib,
                deadline=now + timeout_s,
                began_at=now,
            )
        )

    def up_exited(self, serve: str) -> None:
        """The ``up`` command has exited: nothing of it can outlive the controller now."""
        if self.journal is not None:
            self.journal.end_up(serve)


def supervise_orphans(
    tracker: StartTracker,
    journal: Journal,
    *,
    stop: threading.Event,
    poll_s: float = 0.25,
    on_end: Callable[[str], None] | None = None,
) -> list[str]:
    """Take over the ``up`` commands a killed controller left running.

    Each recorded command whose process still runs makes its serve a start in
    progress (its reservation is held) until the process exits; past its deadline its
    process group gets SIGTERM, then SIGKILL. Records of processes that are gone are
    dropped. Returns the serves taken over; the watching happens on daemon threads.
    """
    taken: list[str] = []
    for rec in journal.ups():
        if not process_alive(rec.pid, rec.proc_start):
            journal.end_up(rec.serve)
            continue
        logger.warning(
            "{}: its `up` (pid {}) still runs, left by a controller that was killed; "
            "its {} MiB stay reserved until it exits",
            rec.serve,
            rec.pid,
            rec.mib,
        )
        tracker.begin(rec.serve, rec.roles, rec.mib)
        thread = threading.Thread(
            target=_watch_orphan,
            args=(tracker, rec, stop, poll_s, on_end),
            daemon=True,
            name=f"orphan-up-{rec.serve}",
        )
        tracker.attach(rec.serve, thread)
        thread.start()
        taken.append(rec.serve)
    return taken


def _watch_orphan(
    tracker: StartTracker,
    rec: UpRecord,
    stop: threading.Event,
    poll_s: float,
    on_end: Callable[[str], None] | None,
) -> None:
    signalled: float | None = None
    while process_alive(rec.pid, rec.proc_start):
        now = time.time()
        if signalled is None and now >= rec.deadline:
            logger.warning("{}: its orphaned `up` ran past its deadline; ending it", rec.serve)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pid, signal.SIGTERM)
            signalled = now
        elif signalled is not None and now >= signalled + ORPHAN_KILL_GRACE_S:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pid, signal.SIGKILL)
        if stop.wait(poll_s):
            return  # the controller stops: the record stays for the next one
    logger.info("{}: its orphaned `up` has exited", rec.serve)
    tracker.end(rec.serve)
    if on_end is not None:
        on_end(rec.serve)
