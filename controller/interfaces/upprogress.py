"""``vramctl up --wait``: where the request stands while the answer is held, from the events.

The API holds an ``up`` with ``wait_s`` until the serve is ready, failed, or the time
passed (:mod:`controller.interfaces.upwait`); meanwhile the command follows the loop's
event stream (``GET /v1/events``, docs/operations.md "Event stream") and tells the
operator the stage the request is in:

``queued at position N on ROLE`` (``request.queued``) → ``admitted; waiting for the
loop to plan it`` (``request.admitted``) → the step of the request's group in progress
(``plan.begun`` lists the group's steps, each ``step`` event ends one): ``making room:
draining / stopping / putting X to sleep …``, ``starting S`` / ``waking S``, ``waiting
for S to be healthy``, ``readmitting S to the router``.

:class:`UpProgress` is the pure part: fed the stream's events, it keeps the stage and
says what changed. :func:`follow_up` draws it while the request waits: on a terminal a
live line (rich progress: spinner, stage, seconds since the command began), each step
that ended printed above it; piped, one plain line per stage (``  12.3s  stage``) and per
step that did not end well. The answer itself (with the timings of each phase) is the
caller's to print, once.

This module reads the event stream only; it must not change anything or decide how
the request is answered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rich.console import Console

T = TypeVar("T")

#: a step of the request's group in progress -> what the operator reads
DOING: dict[str, str] = {
    "quiesce": "making room: quiescing {serve}'s router tier",
    "drain": "making room: draining {serve}",
    "stop": "making room: stopping {serve}",
    "release": "making room: releasing {serve}'s reservation",
    "sleep": "making room: putting {serve} to sleep",
    "release_to_residual": "making room: {serve} down to its residual",
    "shrink": "making room: shrinking {serve}",
    "grow": "growing {serve}",
    "reserve": "reserving {serve}'s memory",
    "reserve_wake": "reserving {serve}'s memory to wake it",
    "wake": "waking {serve}",
    "reload": "reloading {serve}'s weights",
    "start": "starting {serve}",
    "await_ready": "waiting for {serve} to be healthy",
    "readmit": "readmitting {serve} to the router",
}
#: how long the stream may take to open before the request is sent without it
OPEN_WAIT_S = 3.0


def _where(position: Any) -> str:
    if isinstance(position, dict) and position:
        return ", ".join(f"{p} on {role}" for role, p in position.items())
    return "unknown"


@dataclass
class UpProgress:
    """The stage of ``serve``'s request, from the events fed to it (pure)."""

    serve: str
    stage: str = "requested; waiting for the loop's answer"
    #: the steps of the request's group in the last plan that has any, not yet ended
    pending: list[tuple[str, str]] = field(default_factory=list)

    def feed(self, item: dict[str, Any]) -> list[str]:
        """Take one event; the lines it gives to print (a step that ended)."""
        kind = str(item.get("kind"))
        data: dict[str, Any] = item.get("data") or {}
        if kind == "plan.begun":
            mine = [
                (str(s.get("action")), str(s.get("serve")))
                for s in data.get("steps") or []
                if s.get("group") == self.serve
            ]
            if mine:
                self.pending = mine
                self._doing()
            return []
        if kind == "step" and data.get("group") == self.serve:
            return self._ended(data)
        if data.get("serve") != self.serve:
            return []
        if kind == "request.queued":
            self.stage = f"queued at position {_where(data.get('position'))}"
        elif kind == "request.admitted" and not self.pending:
            self.stage = "admitted; waiting for the loop to plan it"
        elif kind == "request.ended" and data.get("outcome"):
            self.stage = f"left the queue: {data['outcome']}"
        return []

    def _doing(self) -> None:
        if self.pending:
            action, serve = self.pending[0]
            self.stage = DOING.get(action, action + " {serve}").format(serve=serve)

    def _ended(self, data: dict[str, Any]) -> list[str]:
        action, serve = str(data.get("action")), str(data.get("serve"))
        outcome = data.get("outcome")
        if (action, serve) in self.pending:
            self.pending.remove((action, serve))
        self._doing()
        took = data.get("duration_s")
        line = f"{action} {serve}: {outcome}" + (
            f" in {took:.1f}s" if isinstance(took, int | float) else ""
        )
        if data.get("detail"):
            line += f": {data['detail']}"
        return [line]


class _Plain:
    """Piped: one line per stage and per step that did not end ok."""

    def __init__(self, console: Console, t0: float) -> None:
        self.console, self.t0, self.said = console, t0, ""

    def show(self, progress: UpProgress, ended: list[str]) -> None:
        at = time.monotonic() - self.t0
        for line in ended:
            if ": ok" not in line:
                self.console.print(f"{at:6.1f}s  {line}", markup=False, highlight=False)
        if progress.stage != self.said:
            self.said = progress.stage
            self.console.print(f"{at:6.1f}s  {progress.stage}", markup=False, highlight=False)

    def close(self) -> None:
        return None


class _Live:
    """On a terminal: a live line (spinner, stage, seconds); ended steps printed above."""

    def __init__(self, console: Console, t0: float) -> None:
        from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
        from rich.text import Text

        self.t0 = t0

        class Elapsed(ProgressColumn):
            """Seconds since the command began, as of each redraw."""

            def render(self, task: Task) -> Text:
                return Text(f"{time.monotonic() - t0:.0f}s", style="dim")

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            Elapsed(),
            console=console,
            transient=True,
            refresh_per_second=4,
        )
        self.task = self.bar.add_task("")
        self.bar.start()

    def show(self, progress: UpProgress, ended: list[str]) -> None:
        at = f"{time.monotonic() - self.t0:.0f}s"
        for line in ended:
            self.bar.console.print(f"  {at:>5}  {line}", markup=False, highlight=False)
        self.bar.update(self.task, description=progress.stage)

    def close(self) -> None:
        self.bar.stop()


def follow_up(
    serve: str,
    url: str,
    token: str | None,
    request: Callable[[], T],
    console: Console,
    started: float | None = None,
) -> T:
    """Send ``request()`` (the held ``up``) while showing its stage; its answer back.

    ``started``: when the command began (``time.monotonic()``), what the seconds shown
    count from; default now.
    """
    from controller.interfaces.client import follow_events

    t0 = time.monotonic() if started is None else started
    progress = UpProgress(serve)
    views: list[_Plain | _Live] = []  # none until the stream is open
    lock = threading.Lock()
    opened, done = threading.Event(), threading.Event()

    def on_item(item: dict[str, Any]) -> bool:
        with lock:
            if done.is_set():
                return False
            ended = progress.feed(item)
            for view in views:
                view.show(progress, ended)
        return True

    def on_open() -> None:
        with lock:
            if not views and not done.is_set():
                views.append(_Live(console, t0) if console.is_terminal else _Plain(console, t0))
                views[0].show(progress, [])
        opened.set()

    def follow() -> None:
        try:
            follow_events(url, on_item, token=token, on_open=on_open, retry_s=1.0)
        except Exception:  # no stream (refused, unreachable): the answer alone says it
            opened.set()

    threading.Thread(target=follow, name="up-progress", daemon=True).start()
    opened.wait(OPEN_WAIT_S)  # subscribed before the request: no event of it is missed
    try:
        return request()
    finally:
        with lock:
            done.set()
            for view in views:
                view.close()
