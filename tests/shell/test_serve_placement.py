"""A serve's record carries its placement: the card(s) its container holds memory on.

The placement is filled when a start placed the serve (the executor's result, on the
roles it was planned with) or its container is found running, kept in the journal's
start records (their storage: no table of its own, so an older state directory opens),
read back by a new store on the same journal (a restart), and ended once the container
stops. The loop's observation reads the start records through the same store.
"""

from __future__ import annotations

from pathlib import Path

from controller.service.executor import ExecutionReport, Outcome, StepResult
from controller.service.overlay_rules import StartedRecords
from controller.service.overlays import Learned, record_starts
from controller.service.records import RecordStore
from controller.store.journal import Journal
from statemachine.domain import types as sm
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import Action, Step

ROLES = {r: sm.GpuRole(r, 20_000, 0) for r in ("g0", "g1")}
OMNI = sm.ServeSpec(
    "omni", "omni-ctr", ("g0", "g1"), 4000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING
)
DESIRED = sm.DesiredState(ROLES, {"omni": OMNI})


def _started(roles: tuple[str, ...], outcome: Outcome = Outcome.OK) -> ExecutionReport:
    step = Step(Action.START, "omni", roles, 4000, "a start", group="omni")
    return ExecutionReport([StepResult(step, outcome, "", 0.1, ended_at=1000.0)], Ledger({}), {})


def test_a_start_fills_the_placement_and_a_restart_reads_it_back(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with Journal.open(path) as j:
        store = RecordStore(j)
        assert store.snapshot().get("omni") is None
        record_starts(store, _started(("g1",)), DESIRED, 1000.0)
        assert store.snapshot()["omni"].placement == ("g1",)
        assert store.started() == {"omni-ctr": sm.StartedWith("omni", ("g1",), 4000)}
    with Journal.open(path) as j:  # a new controller on the same state directory
        store = RecordStore(j)
        assert store.snapshot()["omni"].placement == ("g1",)
        Learned(StartedRecords(dropped=("omni-ctr",))).write(j, store)  # it stopped
        assert "omni" not in store.snapshot()
        assert j.started() == {}


def test_a_failed_start_places_nothing_and_a_found_container_is_placed(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "journal.sqlite3") as j:
        store = RecordStore(j)
        record_starts(store, _started(("g0",), Outcome.FAILED), DESIRED, 1000.0)
        assert store.started() == {}
        found = StartedRecords(added={"omni-ctr": sm.StartedWith("omni", ("g0", "g1"), 4000)})
        Learned(found, at=1001.0).write(j, store)
        assert store.snapshot()["omni"].placement == ("g0", "g1")  # counted on every card


def test_the_placement_keeps_the_lifecycle_and_marks(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "journal.sqlite3") as j:
        j.set_lifecycles({"omni": "running"}, 1.0)
        store = RecordStore(j)
        store.no_sleep.add("omni")
        record_starts(store, _started(("g0",)), DESIRED, 1000.0)
        rec = store.snapshot()["omni"]
        assert (rec.lifecycle, rec.no_sleep, rec.placement) == ("running", True, ("g0",))
        assert store.get("omni").no_sleep  # the marks are read as before


def test_without_a_journal_nothing_is_placed() -> None:
    store = RecordStore()
    record_starts(store, _started(("g0",)), DESIRED, 1000.0)
    assert store.started() == {} and store.snapshot() == {}
