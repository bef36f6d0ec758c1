"""The status's journal reading (``controller.service.situation.read_journal``): a file
that is not a vramctl journal is named once in the reason, never twice."""

from __future__ import annotations

from pathlib import Path

from controller.service.situation import read_journal
from controller.store.journal import JOURNAL_NAME


def test_a_file_that_is_not_a_journal_is_named_once(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_NAME
    path.write_bytes(b"not an sqlite file at all, only bytes" * 64)
    records, why = read_journal(tmp_path)
    assert records is None and why is not None
    assert why.count(str(path)) == 1, why
    assert "not a vramctl journal" in why


def test_no_journal_is_no_reason(tmp_path: Path) -> None:
    assert read_journal(tmp_path) == (None, None)
