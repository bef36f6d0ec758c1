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

from controller.store.journal import Journal, UpRecord
from statemachine.domain.types import StartingObs

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
    """Thread-safe record of the starts in progress (serve -> roles and MiB reserved).

    Each :meth:`begin` returns a token and :meth:`end` with that token ends that start
    only: an old start's late end never erases a newer start of the same serve.
    ``journal`` (optional) keeps the ``up`` commands that run, so a restarted
    controller can supervise what a killed one left running; writing it is best
    effort (a failure is logged, never raised into a start).
    """

    journal: Journal | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _starts: dict[str, tuple[int, StartingObs]] = field(default_factory=dict)
    _threads: dict[str, threading.Thread] = field(default_factory=dict)
    #: the tokens of starts that ended healthy, whose end the loop has not taken in yet
    _ran: set[int] = field(default_factory=set)
    _next: int = 0

    def begin(self, serve: str, roles: tuple[str, ...], mib: int) -> int:
        """A start of ``serve`` is in progress from now (its reservation is held)."""
        with self._lock:
            self._next += 1
            self._starts[serve] = (self._next, StartingObs(tuple(roles), mib))
            return self._next

    def token(self, serve: str) -> int | None:
        """The token of the start of ``serve`` in progress, if any."""
        with self._lock:
            entry = self._starts.get(serve)
            return entry[0] if entry else None

    def end(self, serve: str, token: int | None) -> None:
        """That start has ended (healthy, or failed and its container confirmed down)."""
        with self._lock:
            entry = self._starts.get(serve)
            if entry is None or (token is not None and entry[0] != token):
                return
            del self._starts[serve]
            self._ran.discard(entry[0])
            self._threads.pop(serve, None)
        self._journal("forget the up of", serve, lambda j: j.end_up(serve))

    def succeeded(self, serve: str, token: int) -> None:
        """That start ended healthy (its thread says so once its await_ready has, before
        the live ledger is told, and again as it ends): it runs with the reservation it
        was started with, and no longer counts as in progress, though the loop takes
        its end in (records it, then :meth:`end`) a moment later."""
        with self._lock:
            entry = self._starts.get(serve)
            if entry is not None and entry[0] == token:
                self._ran.add(token)

    def active(self, serve: str) -> bool:
        """True while a start of ``serve`` is in progress."""
        with self._lock:
            return serve in self._starts

    def snapshot(self) -> dict[str, StartingObs]:
        """Serve -> roles and MiB reserved, for every start in progress (a copy)."""
        with self._lock:
            return {name: obs for name, (t, obs) in self._starts.items() if t not in self._ran}

    def ran(self) -> dict[str, StartingObs]:
        """Serve -> roles and MiB it was started with, for every start that ended
        healthy and whose end the loop has not taken in yet (a copy)."""
        with self._lock:
            return {name: obs for name, (t, obs) in self._starts.items() if t in self._ran}

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
        now = time.time()
        rec = UpRecord(
            serve=serve,
            pid=pid,
            proc_start=proc_start_ticks(pid),
            roles=roles,
            mib=mib,
            deadline=now + timeout_s,
            began_at=now,
        )
        self._journal("record the up of", serve, lambda j: j.add_up(rec))

    def up_exited(self, serve: str) -> None:
        """The ``up`` command has exited: nothing of it can outlive the controller now."""
        self._journal("forget the up of", serve, lambda j: j.end_up(serve))

    def _journal(self, what: str, serve: str, write: Callable[[Journal], None]) -> None:
        if self.journal is None:
            return
        try:
            write(self.journal)
        except Exception as exc:  # a locked or closed journal must not break a start
            logger.error("journal: cannot {} {}: {}", what, serve, exc)


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
        if not _orphan_alive(rec):
            journal.end_up(rec.serve)
            continue
        logger.warning(
            "{}: its `up` (pid {}) still runs, left by a controller that was killed; "
            "its {} MiB stay reserved until it exits",
            rec.serve,
            rec.pid,
            rec.mib,
        )
        token = tracker.begin(rec.serve, rec.roles, rec.mib)
        thread = threading.Thread(
            target=_watch_orphan,
            args=(tracker, rec, token, stop, poll_s, on_end),
            daemon=True,
            name=f"orphan-up-{rec.serve}",
        )
        tracker.attach(rec.serve, thread)
        thread.start()
        taken.append(rec.serve)
    return taken


def group_alive(pgid: int) -> bool:
    """True while any process of the process group ``pgid`` runs (zombies aside)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read().decode("ascii", errors="replace")
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2 :].split()
        if len(rest) > 2 and rest[0] != "Z" and rest[2] == str(pgid):
            return True
    return False


def _orphan_alive(rec: UpRecord) -> bool:
    """The recorded ``up`` (or what it started in its group) still runs."""
    if rec.proc_start is not None and process_alive(rec.pid, rec.proc_start):
        return True
    # the leader may have exited while its group works on; a group id is the leader's
    # pid, so without the leader's start time a reused pid cannot be told apart: only a
    # record with one is followed by its group
    return rec.proc_start is not None and group_alive(rec.pid)


def _watch_orphan(
    tracker: StartTracker,
    rec: UpRecord,
    token: int,
    stop: threading.Event,
    poll_s: float,
    on_end: Callable[[str], None] | None,
) -> None:
    signalled: float | None = None
    while _orphan_alive(rec):
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
    tracker.end(rec.serve, token)
    if on_end is not None:
        on_end(rec.serve)
