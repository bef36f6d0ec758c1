"""An ``up`` goes from its route to the executor (the only code that talks to Docker)
without re-entering the loop's classes.

The loop is in two parts: :class:`controller.service.loop.Controller` (triggers,
wake-ups, resync, lifespan) over the loop's state, and the reconciler
(:class:`controller.service.reconciler.Reconciler`) that runs each cycle. Here a real
controller (its host reader scripted, no Docker) takes ``POST /v1/serves/r/up`` through
the API's route and then one cycle, while every Python call is recorded: the route
enters the loop's module only to record the request and ask for a cycle; the cycle
enters it only through the reconciler's handle on the loop (``trigger``, ``wake_at``,
``stopping``: asking for the next cycle); and the executor is called by the reconciler
in a worker thread with no frame of the loop's module on its stack.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from test_one_answer import ScriptedHost, ScriptedInFlight
from test_request_after_observation import MANIFEST  # on-demand serves r and s

from controller.interfaces.api import ApiSettings, create_app
from controller.manifest import load_manifest_set
from controller.service import loop as loop_module
from controller.service.executor import ExecutionReport
from controller.service.loop import Controller, RunOptions
from controller.snapshot import parse_snapshot
from controller.store.journal import Journal, journal_path
from statemachine.domain.types import Observed
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import Plan

TOKEN = "up-path-test-token-0123456789"
LOOP_FILE = loop_module.__file__


class _RecordingExecutor:
    """The executor's seam: records the plans it is given and the stack it runs on."""

    def __init__(self) -> None:
        self.desired: Any = None
        self.on_start_done: Any = None
        self.cycle: int | None = None
        self.plans: list[Plan] = []
        self.stacks: list[list[traceback.FrameSummary]] = []

    def execute(self, plan: Plan, observed: Observed) -> ExecutionReport:
        self.plans.append(plan)
        self.stacks.append(traceback.extract_stack())
        return ExecutionReport([], Ledger({}), {})

    def preflight(self, plan: Plan, observed: Observed | None = None) -> list[str]:
        return []


@contextmanager
def _loop_calls() -> Iterator[list[str]]:
    """The qualified names of the loop module's functions called meanwhile (any thread)."""
    called: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == LOOP_FILE:
            called.append(frame.f_code.co_qualname)

    hook: Callable[..., Any] = profile
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        yield called
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def test_an_up_goes_from_its_route_to_the_executor_without_reentering_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state"), load_manifest_set([path])
    )
    c.journal = Journal.open(journal_path(c.state_dir))
    c.host = ScriptedHost(parse_snapshot({"docker": "ok", "containers": {}, "gpus": None}))  # type: ignore[assignment]
    c.in_flight = ScriptedInFlight({})  # type: ignore[assignment]
    executor = _RecordingExecutor()
    c.reconciler.current_executor = executor  # type: ignore[assignment]
    app = create_app(c, ApiSettings(token=TOKEN, retry_after_s=5.0))
    runner = asyncio.Runner()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vramctl")
    try:
        runner.run(c.reconcile(("start",)))  # the first observation the route answers from
        assert executor.plans == []
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with _loop_calls() as by_route:
            r = runner.run(client.post("/v1/serves/r/up", headers=headers))
        assert r.status_code == 202, r.text
        with _loop_calls() as by_cycle:
            runner.run(c.reconciler.reconcile(tuple(c.reasons)))
    finally:
        runner.run(client.aclose())
        runner.close()
        c.journal.close()
    # the route records the request and asks for a cycle: nothing else of the loop
    assert set(by_route) <= {"Controller.request_up", "Controller.trigger"}, by_route
    assert "Controller.request_up" in by_route
    # the cycle asks the loop only for the next cycle (the reconciler's LoopHandle)
    assert set(by_cycle) <= {"Controller.trigger", "Controller.wake_at", "Controller.stopping"}
    # and the executor carried the start out, called by the reconciler, off the loop
    [plan] = executor.plans
    assert [(str(s.action), s.serve) for s in plan.steps if str(s.action) == "start"] == [
        ("start", "r")
    ]
    [stack] = executor.stacks
    assert not [f for f in stack if f.filename == LOOP_FILE], stack
    assert [f.name for f in stack][-2:] == ["execute", "execute"]
    assert stack[-2].filename.endswith("controller/service/reconciler.py")
