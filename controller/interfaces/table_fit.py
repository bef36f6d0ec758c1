"""Column widths for a rich table on a narrow console: no word cut, as few lines as fit.

rich shrinks every column of a table too wide for the console in proportion, and cuts
the words of whichever column falls below its longest word (``displ``/``ay-ca``/``rd``
for ``display-card``). :func:`fit_words` instead gives each column its longest word at
least, then hands the rest of the width out where it saves the most lines (a cell
wrapped between words is one line more for its row): one column at a time, the
smallest widening that makes the table shorter, best saving per column of width
first. A table whose longest words do not fit side by side is left to rich.

This module lays a table out; it must not format or change what a cell says.
"""

from __future__ import annotations

import functools

from rich.table import Table
from rich.text import Text

__all__ = ["fit_words"]


def fit_words(table: Table, width: int) -> Table:
    """``table`` with each column's width set (module docstring) for ``width`` columns;
    as it is when even the longest words do not fit."""
    columns = table.columns
    texts = [[_plain(c.header), *(_plain(cell) for cell in c.cells)] for c in columns]
    least = [max((len(w) for t in col for w in t.split()), default=1) for col in texts]
    most = [max((len(line) for t in col for line in t.splitlines()), default=1) for col in texts]
    room = width - 3 * len(columns) - 1  # a border and two spaces of padding each, one more
    if sum(least) > room:
        return table
    widths = _widen(texts, least, most, room - sum(least))
    for column, w in zip(columns, widths, strict=True):
        column.width = w
    return table


def _widen(texts: list[list[str]], least: list[int], most: list[int], spare: int) -> list[int]:
    """The widths from ``least``, ``spare`` more given where each saves the most lines."""
    widths = least[:]
    lines = [[_lines(t, w) for t in col] for col, w in zip(texts, widths, strict=True)]
    while spare > 0:
        best: tuple[float, int, int, list[int]] | None = None
        for i, col in enumerate(texts):
            others = [
                max((c[r] for j, c in enumerate(lines) if j != i), default=1)
                for r in range(len(col))
            ]
            now = sum(max(a, b) for a, b in zip(lines[i], others, strict=True))
            for k in range(1, min(spare, most[i] - widths[i]) + 1):
                trial = [_lines(t, widths[i] + k) for t in col]
                saved = now - sum(max(a, b) for a, b in zip(trial, others, strict=True))
                if saved > 0:
                    if best is None or saved / k > best[0]:
                        best = (saved / k, i, k, trial)
                    break  # the smallest widening of this column that saves a line
        if best is None:
            break
        _gain, i, k, lines[i] = best
        widths[i] += k
        spare -= k
    return widths


@functools.lru_cache(maxsize=4096)
def _lines(text: str, width: int) -> int:
    """The lines ``text`` takes wrapped between words at ``width``."""
    count = 0
    for line in text.splitlines() or [""]:
        count += 1
        used = 0
        for word in line.split():
            if used and used + 1 + len(word) > width:
                count += 1
                used = len(word)
            else:
                used += (1 if used else 0) + len(word)
    return count


def _plain(cell: object) -> str:
    """What a cell shows, without its style or markup."""
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)
