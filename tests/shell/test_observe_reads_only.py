"""Observing the host writes nothing: what an observation finds, the loop journals after.

A real :class:`~controller.service.loop.Controller` observes a scripted host through a
journal that refuses every write: a start record whose container stopped, a declared
container running without a record, an elastic reserve whose engine is down, a sleeper
whose container stopped and one whose engine cannot be asked. The observation reads
them all and writes none; taking the observation in (the loop's next step) journals
each. No Docker: the host reader is scripted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.service import controller_on
from test_one_answer import ScriptedHost, ScriptedInFlight
from test_request_after_observation import MANIFEST  # serves r and s on card g

from controller.snapshot import parse_snapshot
from controller.store.journal import Journal, SleepRecord

#: the journal's writers: every public method that changes it
WRITERS = [
    "record_cycle",
    "record_outcome",
    "prune",
    "add_footprint",
    "update_footprint",
    "add_restore",
    "add_request",
    "end_request",
    "set_elastic",
    "add_up",
    "end_up",
    "set_started",
    "forget_started",
    "set_declared",
    "set_quiesced",
    "forget_quiesced",
    "set_lifecycles",
    "set_sleeping",
    "saw_sleeping",
    "forget_sleeping",
]


class ReadOnlyJournal:
    """A journal that answers every read and refuses every write."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __getattr__(self, name: str) -> Any:
        if name in WRITERS:
            raise AssertionError(f"the observation wrote the journal: {name}")
        return getattr(self._journal, name)


def _sleeper(container: str, serve: str) -> SleepRecord:
    return SleepRecord(container, serve, 1, ("g",), 500, 0, None, 10.0)


def test_every_journal_writer_is_listed() -> None:
    public = {n for n in dir(Journal) if not n.startswith("_")}
    assert set(WRITERS) <= public


def test_an_observation_writes_nothing_and_the_loop_journals_what_it_found(
    tmp_path: Path,
) -> None:
    c = controller_on(tmp_path, MANIFEST)
    journal = c.journal
    journal.set_started("c-gone", "gone", ("g",), 2000, 1000.0)  # its container stopped
    journal.set_elastic("s", 500, 1000.0)  # s's engine is down: its reserve is void
    journal.set_sleeping(_sleeper("c-s", "s"))  # stopped: no longer asleep
    journal.set_sleeping(_sleeper("c-r", "r"))  # r cannot be asked: seen unknown
    running = {"state": "running", "started_at": 2000.0}
    snap = parse_snapshot({"docker": "ok", "containers": {"c-r": running}, "gpus": None})
    c.host = ScriptedHost(snap)  # type: ignore[assignment]
    c.in_flight = ScriptedInFlight({})  # type: ignore[assignment]
    try:
        c.journal = ReadOnlyJournal(journal)  # type: ignore[assignment]
        seen = c.reconciler.observe()
        assert set(seen.started_with) == {"c-r"}  # found running; c-gone's ended
        assert seen.elastic == {}
        assert journal.started().keys() == {"c-gone"}  # nothing written yet
        assert journal.elastic() == {"s": 500}
        assert journal.sleeping().keys() == {"c-r", "c-s"}
        c.journal = journal
        c.reconciler.inputs(seen, seen.to_observed())  # the loop takes it in
        assert journal.started().keys() == {"c-r"}
        assert journal.elastic() == {}
        assert journal.sleeping().keys() == {"c-r"}
        assert journal.sleeping()["c-r"].seen == "unknown"
    finally:
        journal.close()
