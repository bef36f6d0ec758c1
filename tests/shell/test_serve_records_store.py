"""The store of the serve records (``controller.service.records``) and its journal table.

The lifecycle states are kept in the journal's ``serve_records`` table, added in place to
a journal written before it (a read-only open of such a journal reads no records); the
store loads them, moves them by observation and by execution, and its marks read and
write as the sets and dicts the loop used before.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.service.records import RecordStore
from controller.store.journal import Journal
from statemachine.domain import types as sm
from statemachine.lifecycle.backoff import Backoff
from statemachine.lifecycle.machine import LifecycleState, Trigger

S = LifecycleState

OMNI = sm.ServeSpec("omni", "omni-ctr", ("g0",), 4000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING)
DESIRED = sm.DesiredState({"g0": sm.GpuRole("g0", 20_000, 0)}, {"omni": OMNI})


def _observed(state: sm.ContainerState, exit_code: int | None = None) -> sm.Observed:
    obs = sm.ContainerObs(state, exit_code=exit_code)
    return sm.Observed(docker_ok=True, containers={"omni-ctr": obs})


def _older_journal(path: Path) -> None:
    """A journal as the previous version wrote it: no ``serve_records`` table."""
    Journal.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE serve_records")


def test_a_journal_without_the_table_gains_it_on_a_writable_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    _older_journal(path)
    with Journal.open(path, readonly=True) as old:
        assert old.lifecycles() == {}  # read-only: read as it is, no records
    with Journal.open(path) as j:
        assert j.lifecycles() == {}
        j.set_lifecycles({"omni": "running"}, 1.0)
        j.set_lifecycles({"omni": "failed", "coder": "stopped"}, 2.0)
        assert j.lifecycles() == {"coder": "stopped", "omni": "failed"}
    with Journal.open(path, readonly=True) as j:
        assert j.lifecycles() == {"coder": "stopped", "omni": "failed"}


def test_the_store_loads_the_journal_and_moves_on_from_there(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "journal.sqlite3") as j:
        j.set_lifecycles({"omni": "running", "gone": "bogus"}, 1.0)
        store = RecordStore(j)
        assert store.get("omni").lifecycle is S.RUNNING
        assert store.get("gone").lifecycle is S.STOPPED  # unknown to this version: start over
        store.observe(DESIRED, _observed(sm.ContainerState.EXITED, exit_code=137))
        assert store.get("omni").lifecycle is S.FAILED
        (move,) = store.observed_moves()
        assert (move.serve, move.before, move.after, move.triggers) == (
            "omni",
            S.RUNNING,
            S.FAILED,
            (Trigger.FAIL,),
        )
        assert j.lifecycles()["omni"] == "failed"
        store.observe(DESIRED, sm.Observed(docker_ok=False))  # nothing known: nothing moves
        assert store.get("omni").lifecycle is S.FAILED


def test_the_plan_starts_from_the_record_moved_to_its_reading() -> None:
    store = RecordStore()
    store.settle({"omni": "failed"})
    down = _observed(sm.ContainerState.EXITED, exit_code=1)
    machines = store.machines(["omni", "omni"], DESIRED, down)
    assert list(machines) == ["omni"] and machines["omni"].state is S.STOPPED  # reset
    assert store.get("omni").lifecycle is S.FAILED  # the record moves with the execution
    up = _observed(sm.ContainerState.RUNNING)
    assert store.machines(["omni"], DESIRED, up)["omni"].state is S.RUNNING  # recover
    store.settle({"omni": "stopping"})
    assert store.get("omni").lifecycle is S.STOPPING


def test_an_observation_older_than_the_end_of_a_start_does_not_move_it_back() -> None:
    from statemachine.domain.types import StartingObs

    store = RecordStore()
    store.settle({"omni": "running"})  # the start ended: ready
    taken_during_it = sm.Observed(
        docker_ok=True,
        containers={"omni-ctr": sm.ContainerObs(sm.ContainerState.RUNNING)},
        starting={"omni": StartingObs(("g0",), 4000)},
    )
    store.observe(DESIRED, taken_during_it)
    assert store.get("omni").lifecycle is S.RUNNING
    store.settle({"omni": "stopped"})  # a record not running is moved by such a reading
    store.observe(DESIRED, taken_during_it)
    assert store.get("omni").lifecycle is S.STARTING


def test_the_marks_read_and_write_as_sets_and_dicts() -> None:
    store = RecordStore()
    quiesced = store.quiesced
    quiesced.add("omni")
    quiesced |= {"coder"}
    assert quiesced == {"omni", "coder"} and "omni" in quiesced and len(quiesced) == 2
    assert quiesced - {"coder"} == {"omni"} and {"omni", "x"} - quiesced == {"x"}
    quiesced.discard("omni")
    quiesced.discard("never")
    assert set(quiesced) == {"coder"}
    quiesced.clear()
    assert not quiesced and store.get("coder").quiesced is False
    backoff = store.backoff
    b = backoff.setdefault("omni", Backoff())
    b.failures = 3  # moved in place, as statemachine.lifecycle.backoff does
    assert backoff["omni"].failures == 3 and store.get("omni").backoff is b
    assert dict(backoff) == {"omni": b}
    del backoff["omni"]
    assert "omni" not in backoff and backoff.get("omni") is None
    with pytest.raises(KeyError):
        del backoff["omni"]
    store.stopped_by_us["omni"] = 0.0
    assert store.stopped_by_us.get("omni") == 0.0 and list(store.stopped_by_us) == ["omni"]
    store.stopped_by_us["omni"] = None
    assert store.stopped_by_us.get("omni") is None and not store.stopped_by_us
    assert store.get("omni").lifecycle is S.STOPPED  # marks never move the lifecycle
