"""The journal's ``sleeping`` table: what the controller put to sleep survives a restart."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from controller.store.journal import Journal, SleepRecord


def rec(**kw: object) -> SleepRecord:
    base: dict[str, object] = {
        "container": "c-big",
        "serve": "big",
        "level": 1,
        "gpu_roles": ("a",),
        "residual_mib": 1000,
        "host_ram_mib": 6000,
        "started_at": "2026-12-01T10:00:00.123456789Z",
        "since": 10.0,
    }
    base.update(kw)
    return SleepRecord(**base)  # type: ignore[arg-type]


def test_a_sleeper_is_remembered_seen_and_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with Journal.open(path) as j:
        j.set_sleeping(rec())
        j.saw_sleeping("c-big", "asleep", 11.0)
    with Journal.open(path) as j:  # a new controller on the same state directory
        got = j.sleeping()
        assert got == {"c-big": rec(seen="asleep", seen_at=11.0)}
        j.set_sleeping(rec(level=2, host_ram_mib=0, since=20.0))  # a new sleep replaces it
        assert j.sleeping()["c-big"].level == 2
        assert j.sleeping()["c-big"].seen is None
        j.forget_sleeping("c-big")
        assert j.sleeping() == {}


def test_a_journal_written_before_the_table_opens(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with Journal.open(path) as j:
        j.set_sleeping(rec())
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE sleeping")
    with Journal.open(path, readonly=True) as j:
        assert j.sleeping() == {}
    with Journal.open(path) as j:  # opened for writing, the table is added
        j.set_sleeping(rec(container="c-x", serve="x"))
        assert list(j.sleeping()) == ["c-x"]
