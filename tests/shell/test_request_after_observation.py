"""A request recorded after a cycle's observation began waits for the next cycle.

The loop's answer to ``up`` is given from the host as it stands when the request
arrives; the cycle already observing may have read the host before that (a start that
ended meanwhile read as still in progress, so never a victim). Were that cycle to plan
the request, it could stop another victim than the one the answer named: seen on the
real daemon under load (``tests/e2e/test_one_answer_docker.py``, the measured-costs
victim). ``statemachine.answers.pending.asked_as_of`` is the rule (tested pure in
``tests/core/test_asked_as_of.py``); here a real :class:`~controller.service.loop.Controller`
(dry run) whose host reader records the request while it observes, as the API does
when a request lands mid-cycle.
No Docker: the host reader is scripted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from test_one_answer import ScriptedHost, ScriptedInFlight

from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.snapshot import SnapshotModel, parse_snapshot
from controller.store.journal import Journal, journal_path
from statemachine.planning.plan_types import Plan

MANIFEST = """
[[gpu_roles]]
id = "g"
vram_mib = 10000

[[serve]]
name = "r"
container = "c-r"
gpu_role = "g"
vram_mib = 5000
residency = "on-demand"

[[serve]]
name = "s"
container = "c-s"
gpu_role = "g"
vram_mib = 1000
residency = "on-demand"
"""


class _RequestWhileObserving(ScriptedHost):
    """The host reader; on its first observation the API records ``up r`` meanwhile."""

    def __init__(self, snap: SnapshotModel, journal: Journal) -> None:
        super().__init__(snap)
        self.journal = journal
        self.asked = False

    def observe(self, names: tuple[str, ...], nvml: Any) -> SnapshotModel:
        snap = super().observe(names, nvml)
        if not self.asked:
            self.asked = True
            self.journal.add_request("r", time.time(), 300.0)
        return snap


def _starts(plan: Plan) -> list[str]:
    return [s.serve for s in plan.steps if s.action == "start"]


def test_the_loop_plans_a_request_on_an_observation_taken_after_it(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state", dry_run=True),
        load_manifest_set([path]),
    )
    c.journal = Journal.open(journal_path(c.state_dir))
    snap = parse_snapshot({"docker": "ok", "containers": {}, "gpus": None})
    c.host = _RequestWhileObserving(snap, c.journal)  # type: ignore[assignment]
    c.in_flight = ScriptedInFlight({})  # type: ignore[assignment]
    runner = asyncio.Runner()
    try:
        first = runner.run(c.reconcile(("test",))).plan
        second = runner.run(c.reconcile(("request up r",))).plan
    finally:
        runner.close()
        c.journal.close()
    assert first is not None and second is not None
    # recorded while the first cycle observed: not planned by it, planned by the next
    assert _starts(first) == []
    assert _starts(second) == ["r"]
