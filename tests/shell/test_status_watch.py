"""``status --watch`` on a real terminal: drawn in place, never scrolled, and it follows edits.

The CLI runs on a pseudo-terminal of 50 rows (the stdlib's ``pty``); what it writes is
fed to :class:`Terminal`, a small model of a VT100 screen (cursor moves, erases, the
alternate screen, and a line feed on the last row scrolling a line off the top), so a
test can say what an operator's screen shows and whether anything scrolled away:

- with Docker unreachable (live observation, ``DOCKER_HOST`` where nothing listens)
  its one line is told inside each draw, never printed beside it: nothing accumulates
  and nothing scrolls, however many draws;
- a draw taller than the screen is cropped to it, and its last row says so;
- the serves' model estimates are drawn below the tables, as plain ``status`` prints
  them, and follow an edit of a reservation;
- the manifest is re-read when its file changes: a saved edit shows in the next draws;
  an edit that does not load keeps the last good set on screen with the located error.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

from test_model_estimate_cli import manifest as model_manifest
from test_model_estimate_cli import serve, snapshot
from test_status_bars import EXAMPLE, HEADER, OBSERVED, Pty

ROWS, COLS = 50, 160
DRAWS = 6
_TOKEN = re.compile(
    r"\x1b\[([?0-9;]*)([A-Za-z])|\x1b[()][0-9A-Za-z]|\x1b.|\r|\n|\x08|[^\x1b\r\n\x08]"
)


class Terminal:
    """What a VT100-like screen of ``rows`` x ``cols`` shows after the bytes fed to it."""

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.main = self._blank()
        self.alt: list[list[str]] | None = None
        self.row = self.col = 0
        self.scrolled = 0  # lines that left the top of the screen
        self.alt_entered = 0

    def _blank(self) -> list[list[str]]:
        return [[" "] * self.cols for _ in range(self.rows)]

    @property
    def grid(self) -> list[list[str]]:
        return self.alt if self.alt is not None else self.main

    def lines(self) -> list[str]:
        return ["".join(r).rstrip() for r in self.grid]

    def _line_feed(self) -> None:
        if self.row == self.rows - 1:
            self.grid.pop(0)
            self.grid.append([" "] * self.cols)
            self.scrolled += 1
        else:
            self.row += 1

    def _csi(self, params: str, final: str) -> None:
        nums = [int(p) if p.isdigit() else 0 for p in params.lstrip("?").split(";")]
        n = max(1, nums[0])
        if params in ("?1049", "?47", "?1047") and final in "hl":
            self.alt = self._blank() if final == "h" else None
            self.alt_entered += final == "h"
            self.row = self.col = 0 if final == "h" else self.row
        elif final == "A":
            self.row = max(0, self.row - n)
        elif final == "B":
            self.row = min(self.rows - 1, self.row + n)
        elif final in "Hf":
            self.row = min(self.rows, max(1, nums[0])) - 1
            self.col = (min(self.cols, max(1, nums[1])) - 1) if len(nums) > 1 else 0
        elif final == "K":
            line = self.grid[self.row]
            lo, hi = {0: (self.col, self.cols), 1: (0, self.col + 1)}.get(nums[0], (0, self.cols))
            line[lo:hi] = [" "] * (hi - lo)
        elif final == "J" and nums[0] == 2:
            self.grid[:] = self._blank()

    def feed(self, text: str) -> None:
        for m in _TOKEN.finditer(text):
            tok = m.group(0)
            if m.group(2):
                self._csi(m.group(1), m.group(2))
            elif tok == "\r":
                self.col = 0
            elif tok == "\n":
                self._line_feed()
            elif tok == "\x08":
                self.col = max(0, self.col - 1)
            elif not tok.startswith("\x1b"):
                if self.col >= self.cols:  # the terminal wraps: a new line, maybe a scroll
                    self._line_feed()
                    self.col = 0
                self.grid[self.row][self.col] = tok
                self.col += 1


def watch(*args: str, env: dict[str, str] | None = None) -> Pty:
    return Pty(
        [sys.executable, "-m", "controller.cli", "status", "--watch", "--interval", "0.3", *args],
        columns=COLS,
        rows=ROWS,
        env=env,
    )


def screen_of(term: Pty) -> Terminal:
    screen = Terminal(ROWS, COLS)
    screen.feed(term.raw.decode("utf-8", "replace"))
    return screen


def stop(term: Pty) -> None:
    """Ctrl-C, and its exit: the terminal is read meanwhile (each draw is some 10 KiB;
    a draw it cannot write blocks it, and it would never exit)."""
    term.proc.send_signal(signal.SIGINT)
    assert term.wait_exit("its exit on Ctrl-C") == 0


def test_docker_unreachable_is_told_in_each_draw_and_nothing_scrolls(tmp_path: Path) -> None:
    term = watch("-m", str(EXAMPLE), env={"DOCKER_HOST": f"unix://{tmp_path}/docker.sock"})
    try:
        # enough draws for lines told beside each one to fill a screen of 50 rows
        term.wait_for(f"{3 * DRAWS} draws", lambda: term.text.count(HEADER) >= 3 * DRAWS)
        screen = screen_of(term)
        shown = screen.lines()
        assert screen.scrolled == 0, f"{screen.scrolled} lines scrolled off the screen"
        assert screen.alt is not None, "not drawn on the alternate screen"
        assert shown[0].startswith(HEADER)  # the latest draw, at the top
        said = [line for line in shown if "docker unreachable at" in line]
        assert len(said) == 1, "\n".join(shown)
        assert f"unix://{tmp_path}/docker.sock (DOCKER_HOST)" in said[0]
        assert sum(HEADER in line for line in shown) == 1
        assert any("committed unknown" in line for line in shown)
        stop(term)
        back = screen_of(term)
        assert back.alt is None, "the terminal's own screen did not come back"
    finally:
        term.close()


def many_serves(tmp_path: Path, n: int) -> tuple[Path, Path]:
    text = '[[gpu_roles]]\nid = "a"\nvram_mib = 100000\nreserve_mib = 0\n'
    for i in range(n):
        text += (
            f'\n[[serve]]\nname = "s{i:02d}"\ncontainer = "c{i:02d}"\ngpu_role = "a"\n'
            'vram_mib = 1000\nresidency = "resident"\n'
        )
    manifest = tmp_path / "serves.toml"
    manifest.write_text(text, encoding="utf-8")
    observed = tmp_path / "observed.json"
    observed.write_text(json.dumps({"docker": "ok", "containers": {}, "gpus": None}))
    return manifest, observed


def test_a_draw_taller_than_the_screen_is_cropped_and_says_so(tmp_path: Path) -> None:
    manifest, observed = many_serves(tmp_path, 60)
    term = watch("-m", str(manifest), "--observed", str(observed))
    try:
        term.wait_for(f"{DRAWS} draws", lambda: term.text.count(HEADER) >= DRAWS)
        screen = screen_of(term)
        shown = screen.lines()
        assert screen.scrolled == 0, f"{screen.scrolled} lines scrolled off the screen"
        assert shown[0].startswith(HEADER)
        assert re.match(r"… \d+ more lines below: enlarge the terminal", shown[-1]), shown[-1]
        stop(term)
    finally:
        term.close()


def test_an_edit_of_the_manifest_shows_in_the_next_draws(tmp_path: Path) -> None:
    manifest = tmp_path / "single-card.toml"
    text = EXAMPLE.read_text(encoding="utf-8")
    manifest.write_text(text, encoding="utf-8")
    assert "reserve_mib = 2048" in text
    term = watch("-m", str(manifest), "--observed", str(OBSERVED))

    def latest() -> list[str]:
        return screen_of(term).lines()

    def shows(what: str) -> bool:
        return any(what in line for line in latest())

    try:
        term.wait_for("the first draw", lambda: shows("budget 30559"))
        # the operator saves an edit: a bigger reserve, so a smaller budget
        manifest.write_text(text.replace("reserve_mib = 2048", "reserve_mib = 4096"), "utf-8")
        term.wait_for("a draw of the edited manifest", lambda: shows("budget 28511"))
        # a broken save: the last good set stays on screen, with where and what
        manifest.write_text(text.replace("reserve_mib = 2048", "reserve_mib = ="), "utf-8")
        term.wait_for("the error told", lambda: shows("do not load"))
        assert shows("budget 28511"), "\n".join(latest())
        assert shows(f"{manifest}:"), "\n".join(latest())  # located
        # fixed again: the error goes away
        manifest.write_text(text, encoding="utf-8")
        term.wait_for("the fixed manifest", lambda: shows("budget 30559") and not shows("load"))
        stop(term)
    finally:
        term.close()


def test_the_model_estimates_are_drawn_and_follow_an_edit(tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, serve("llm", 1500, "st"))
    term = watch("-m", str(manifest), "--observed", str(snapshot(tmp_path)))

    def row() -> list[str] | None:
        lines = screen_of(term).lines()
        found = [line for line in lines if line.startswith("│ llm ")]
        return [c.strip() for c in found[-1].split("│")[1:-1]] if found else None

    try:
        term.wait_for("the model table", lambda: row() is not None)
        assert any("Model estimates (MiB, per GPU role)" in x for x in screen_of(term).lines())
        assert row() == ["llm", "1500", "2", "1024", "1026", "unknown", "unknown"]
        text = manifest.read_text(encoding="utf-8")
        manifest.write_text(text.replace("vram_mib = 1500", "vram_mib = 1600"), "utf-8")
        term.wait_for("the edited reservation", lambda: (row() or [""])[1:2] == ["1600"])
        assert row() == ["llm", "1600", "2", "1024", "1026", "unknown", "unknown"]
        stop(term)
    finally:
        term.close()
