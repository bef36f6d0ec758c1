"""Measured reloads: timed off the steps' results, journalled, read back.

A cold start is its ``start`` step's start until its ``await_ready`` ends OK; a wake,
its ``wake`` step's start until its ``await_ready`` ends OK
(controller/service/restore_times.py). The journal's ``reloads`` table keeps the newest
``DEFAULT_KEEP_RELOADS`` per serve and kind; a journal written before the table opens,
and gets it. When a serve was last seen busy outlives its stop (``last_busy``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path

import pytest

from controller.adapters.engine_metrics import InFlightReading, InFlightSources
from controller.service.inflight import InFlightTracker
from controller.service.restore_times import RestoreBook, RestoreSample, measure_restores
from controller.service.steps.results import Outcome, StepResult
from controller.store.journal import DEFAULT_KEEP_RELOADS, Journal, JournalError, journal_path
from statemachine.domain.types import InFlightSource
from statemachine.planning.plan_types import Action, Step
from statemachine.planning.restore_cost import Measured


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    return journal_path(tmp_path / "state")


def result(action: Action, serve: str, began: float, took: float, ok: bool = True) -> StepResult:
    step = Step(action, serve, ("a",), None, "")
    outcome = Outcome.OK if ok else Outcome.FAILED
    return StepResult(step, outcome, "", took, ended_at=began + took)


# ── the journal ─────────────────────────────────────────────────────────────────


def test_reloads_round_trip_and_survive_reopen(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        assert j.restore_times() == {}
        j.add_restore("llm", "cold", 41.5, 1_000.0)
        j.add_restore("llm", "wake", 2.5, 1_100.0)
        j.add_restore("llm", "cold", 39.0, 1_200.0)
        j.add_restore("asr", "cold", 8, 1_300.0)
    with Journal.open(jpath, readonly=True) as j:
        assert j.restore_times() == {
            "llm": {"cold": [41.5, 39.0], "wake": [2.5]},
            "asr": {"cold": [8.0]},
        }


def test_only_the_newest_are_kept_per_serve_and_kind(jpath: Path) -> None:
    assert DEFAULT_KEEP_RELOADS == 20
    with Journal.open(jpath) as j:
        for i in range(25):
            j.add_restore("llm", "cold", float(i), float(i))
        j.add_restore("llm", "wake", 1.0, 99.0)
        j.add_restore("emb", "cold", 5.0, 99.0)
        for i in range(4):
            j.add_restore("llm", "wake", 10.0 + i, 100.0 + i, keep=3)
        got = j.restore_times()
    assert got["llm"]["cold"] == [float(i) for i in range(5, 25)]  # the oldest five went
    assert got["llm"]["wake"] == [11.0, 12.0, 13.0]
    assert got["emb"] == {"cold": [5.0]}  # another serve's are not touched


def test_a_kind_it_does_not_know_is_refused(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        with pytest.raises(JournalError, match="cold, wake"):
            j.add_restore("llm", "warm", 1.0, 1.0)
        with pytest.raises(JournalError, match="keep"):
            j.add_restore("llm", "cold", 1.0, 1.0, keep=0)
        assert j.restore_times() == {}


def test_a_journal_written_before_the_table_opens_and_gets_it(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        j.add_request("od", 10.0, None)
    conn = sqlite3.connect(jpath)
    conn.execute("DROP TABLE reloads")  # as an earlier vramctl left it
    conn.commit()
    conn.close()
    with Journal.open(jpath, readonly=True) as j:
        assert j.restore_times() == {}  # read only: nothing is added, none is read
    with Journal.open(jpath) as j:
        j.add_restore("od", "cold", 12.0, 20.0)
        assert j.restore_times() == {"od": {"cold": [12.0]}}
        assert [r.serve for r in j.active_requests()] == ["od"]  # its records kept


# ── timing off the steps' results ───────────────────────────────────────────────


def test_a_cold_start_counts_from_its_start_until_healthy() -> None:
    results = [
        result(Action.RESERVE, "llm", 999.0, 0.001),
        result(Action.START, "llm", 1_000.0, 3.0),
        result(Action.AWAIT_READY, "llm", 1_003.0, 40.0),
        result(Action.READMIT, "llm", 1_043.0, 0.1),
    ]
    assert measure_restores(results) == [RestoreSample("llm", "cold", 43.0, 1_043.0)]


def test_a_wake_counts_from_its_wake_until_healthy_through_a_reload() -> None:
    results = [
        result(Action.RESERVE_WAKE, "coder", 999.0, 0.001),
        result(Action.WAKE, "coder", 1_000.0, 0.5),
        result(Action.RELOAD, "coder", 1_000.5, 1.5),
        result(Action.AWAIT_READY, "coder", 1_002.0, 0.75),
        # another serve's steps interleave (a victim stopped beside it)
        result(Action.STOP, "chat", 1_000.2, 2.0),
    ]
    assert measure_restores(results) == [RestoreSample("coder", "wake", 2.75, 1_002.75)]


def test_a_start_or_wake_that_fails_is_no_measurement() -> None:
    failed_wait = [
        result(Action.START, "llm", 1_000.0, 3.0),
        result(Action.AWAIT_READY, "llm", 1_003.0, 600.0, ok=False),
    ]
    failed_wake = [
        result(Action.WAKE, "coder", 1_000.0, 0.5, ok=False),
        result(Action.AWAIT_READY, "coder", 1_000.5, 1.0),
    ]
    alone = [result(Action.AWAIT_READY, "llm", 1_000.0, 1.0)]  # no start before it
    no_wait = [result(Action.START, "llm", 1_000.0, 3.0)]  # a serve without health
    for results in (failed_wait, failed_wake, alone, no_wait):
        assert measure_restores(results) == []


def test_the_book_journals_each_measurement_and_loads_earlier_ones(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        j.add_restore("llm", "cold", 50.0, 10.0)  # an earlier controller's
        book = RestoreBook(lambda: j, keep=3)
        book.record(
            [
                result(Action.START, "llm", 1_000.0, 2.0),
                result(Action.AWAIT_READY, "llm", 1_002.0, 38.0),
                result(Action.WAKE, "coder", 1_000.0, 0.5),
                result(Action.AWAIT_READY, "coder", 1_000.5, 2.0),
            ]
        )
        assert book.measured() == {
            "llm": Measured(cold_s=(50.0, 40.0)),
            "coder": Measured(wake_s=(2.5,)),
        }
        assert book.measured({"coder": None}) == {"coder": Measured(wake_s=(2.5,))}
        for took in (30.0, 31.0):
            book.record(
                [
                    result(Action.START, "llm", 2_000.0, 1.0),
                    result(Action.AWAIT_READY, "llm", 2_001.0, took - 1.0),
                ]
            )
        assert book.measured()["llm"].cold_s == (40.0, 30.0, 31.0)  # the newest three
    with Journal.open(jpath, readonly=True) as j:
        assert j.restore_times()["llm"]["cold"] == [40.0, 30.0, 31.0]  # kept there alike
        assert j.restore_times()["coder"] == {"wake": [2.5]}


# ── when each serve was last seen busy ──────────────────────────────────────────


def test_the_last_busy_reading_outlives_a_stop() -> None:
    counts = {"od": 2}

    def reader(wanted: Mapping[str, InFlightSources]) -> dict[str, InFlightReading]:
        return {n: InFlightReading(counts[n], InFlightSource.METRICS) for n in wanted}

    clock = [100.0]
    tracker = InFlightTracker(clock=lambda: clock[0], reader=reader)
    src = {"od": InFlightSources("http://127.0.0.1:1/metrics", "vllm")}
    assert tracker.last_busy() == {}
    tracker.read(src, running={"od"})
    counts["od"], clock[0] = 0, 160.0
    tracker.read(src, running={"od"})  # idle now: last busy stays at 100
    clock[0] = 200.0
    assert tracker.read(src, running=set())["od"].count is None  # stopped: not read
    assert tracker.last_busy() == {"od": 100.0}  # stopped: when it was last used is kept
