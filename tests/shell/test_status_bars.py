"""``vramctl status`` draws a bar per GPU role above its tables; ``--watch`` redraws in place.

The CLI runs as a subprocess on the example host's saved observation. ``--watch`` runs
on a pseudo-terminal (the stdlib's ``pty``, no terminal multiplexer), where rich Live
redraws the screen in place; the observation file is changed while it runs, and the
redrawn figures must follow. Piped, ``--watch`` prints one whole answer per draw.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path

from support.waiting import WAIT_S, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
OBSERVED = ROOT / "manifests" / "examples" / "single-card.observed.json"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HEADER = "vramctl status --watch:"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, NO_COLOR="1", **(env or {})),
        check=False,
    )


def test_status_draws_a_bar_per_role_above_the_tables() -> None:
    r = cli("status", "-m", str(EXAMPLE), "--observed", str(OBSERVED))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "display-card"
    bar = lines[1]
    assert set(bar) <= {"█", "░", "▒"} and len(bar) == 60
    # cells follow the ledger: 14848 committed, 15711 free, 2048 reserve of 32607
    assert bar.count("█") == round(3200 * 60 / 32607) + round(6144 * 60 / 32607) + round(
        3456 * 60 / 32607
    ) + round(2048 * 60 / 32607)
    assert bar.count("▒") == round(2048 * 60 / 32607)
    assert bar.index("░") > bar.rindex("█") and bar.index("▒") > bar.rindex("░")
    # the legend wraps between items where the terminal is narrow: its lines up to the figures
    at = next(i for i, line in enumerate(lines) if "committed " in line)
    legend = " ".join(lines[2:at])
    for part in (
        "embeddings 3200",
        "ocr 6144",
        "reranker 3456",
        "stt 2048",
        "free 15711",
        "reserve 2048",
    ):
        assert part in legend
    assert "tts" not in legend  # OOM-killed: it holds nothing
    # the figures too wrap, up to the line that says what NVML could not read
    figures = " ".join(
        lines[at : next(i for i in range(at, len(lines)) if "(MiB)" in lines[i]) + 1]
    )
    assert "committed 14848" in figures and "budget 30559" in figures
    # no GPU here: NVML figures are unknown, never 0
    assert "nvml used unknown" in figures and "drift unknown" in figures
    # the bars come first, today's tables after them
    assert r.stdout.index("GPU roles (MiB)") > r.stdout.index(lines[at])
    assert "Serves" in r.stdout


def test_status_bar_with_docker_unreadable_shows_committed_unknown(tmp_path: Path) -> None:
    snap = json.loads(OBSERVED.read_text())
    snap.update(docker="error", containers={}, docker_error="cannot connect")
    observed = tmp_path / "observed.json"
    observed.write_text(json.dumps(snap))
    r = cli("status", "-m", str(EXAMPLE), "--observed", str(observed))
    assert r.returncode == 3, r.stderr  # drawn, and the answer is unknown
    assert "docker could not be read when this was observed: cannot connect" in r.stderr
    bar, legend, figures = r.stdout.splitlines()[1:4]
    assert "█" not in bar and "?" in bar
    assert "committed unknown" in legend and "free unknown" in legend
    assert "embeddings" not in legend
    assert "committed unknown" in figures and "committed 0" not in figures


def test_watch_json_is_refused() -> None:
    r = cli("status", "-m", str(EXAMPLE), "--observed", str(OBSERVED), "--watch", "--json")
    assert r.returncode == 1 and "--watch" in r.stderr


def test_watch_piped_prints_one_answer_per_draw() -> None:
    r = cli(
        "status",
        "-m",
        str(EXAMPLE),
        "--observed",
        str(OBSERVED),
        "--watch",
        "--interval",
        "0.2",
        "--count",
        "3",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(HEADER) == 3
    assert r.stdout.count("GPU roles (MiB)") == 3
    assert "Model estimates" not in r.stdout  # no serve declares [serve.model]
    assert "\x1b[" not in r.stdout  # piped: no cursor movement


def test_watch_piped_draws_the_model_estimates_in_each_answer(tmp_path: Path) -> None:
    from test_model_estimate_cli import manifest, serve, snapshot

    path = manifest(tmp_path, serve("llm", 1500, "st"), serve("gone", 900, "absent"))
    args = ("--observed", str(snapshot(tmp_path)), "--watch", "--interval", "0.2")
    r = cli("status", "-m", str(path), *args, "--count", "2", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    draws = r.stdout.split(HEADER)[1:]
    assert len(draws) == 2
    for draw in draws:
        table = draw.split("Model estimates (MiB, per GPU role)")[1]
        rows = [
            [c.strip() for c in line.split("│")[1:-1]]
            for line in table.splitlines()
            if line.startswith("│")
        ]
        assert rows == [
            ["llm", "1500", "2", "1024", "1026", "unknown", "unknown", ""],
            ["gone", "900", "unknown", "unknown", "unknown", "unknown", "unknown",
             f"{tmp_path / 'absent'}: no such file or folder"],
        ]  # fmt: skip


class Pty:
    """A subprocess on a pseudo-terminal; everything it writes is collected."""

    def __init__(
        self,
        args: list[str],
        columns: int = 160,
        rows: int = 60,
        env: dict[str, str] | None = None,
    ) -> None:
        master, slave = pty.openpty()
        # a rows x columns screen: rich Live crops a draw to the terminal's height
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = dict(
            os.environ,
            COLUMNS=str(columns),
            LINES=str(rows),
            TERM="xterm-256color",
            **(env or {}),
        )
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
        )
        os.close(slave)
        self.master = master
        self.raw = b""

    def read(self) -> None:
        while select.select([self.master], [], [], 0.1)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            self.raw += chunk

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = WAIT_S) -> None:
        """Read what the process writes until ``check()`` holds; fail, with the output,
        once the process has exited without it, or past ``timeout`` (a last resort)."""

        def holds() -> bool:
            self.read()
            if check():
                return True
            if self.proc.poll() is None:
                return False
            self.read()  # what it wrote on its way out
            if check():
                return True
            raise AssertionError(
                f"exited {self.proc.returncode} before {what}; output:\n{self.text[-3000:]}"
            )

        wait_for(what, holds, timeout, seen=lambda: f"output:\n{self.text[-3000:]}")

    def wait_exit(self, what: str = "its exit") -> int:
        """Its exit code, once it has exited; read meanwhile, so that a write of its never
        blocks on a full terminal (a process blocked so would never exit)."""
        self.wait_for(what, lambda: self.proc.poll() is not None)
        return int(self.proc.returncode)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_watch_redraws_in_place_and_follows_the_host(tmp_path: Path) -> None:
    observed = tmp_path / "observed.json"
    snap = json.loads(OBSERVED.read_text())
    observed.write_text(json.dumps(snap))
    term = Pty(
        [
            sys.executable,
            "-m",
            "controller.cli",
            "status",
            "-m",
            str(EXAMPLE),
            "--observed",
            str(observed),
            "--watch",
            "--interval",
            "0.3",
        ]
    )
    try:
        term.wait_for("the first draw", lambda: "committed 14848" in term.text)
        first = term.text.count(HEADER)
        term.wait_for("a redraw", lambda: term.text.count(HEADER) > first)
        # rich Live draws on the alternate screen, each draw from its top-left corner
        assert b"\x1b[?1049h" in term.raw, "not on the alternate screen"
        assert term.raw.count(b"\x1b[H") > first, "not redrawn in place"
        # the OCR model goes away: the next draws show the ledger without it
        snap["containers"]["vllm-ocr"] = {"state": "exited", "exit_code": 0}
        observed.write_text(json.dumps(snap))

        def last_draw() -> str:
            text = term.text
            return text[text.rindex(HEADER) :]

        term.wait_for(
            "a whole draw with the new figures",
            lambda: "committed 8704" in last_draw() and "Serves" in last_draw(),
        )
        assert "ocr 6144" not in last_draw() and "free 21855" in last_draw()
        term.proc.send_signal(signal.SIGINT)
        assert term.wait_exit("its exit on Ctrl-C") == 0
    finally:
        term.close()


def test_watch_on_a_terminal_stops_after_count() -> None:
    term = Pty(
        [
            sys.executable,
            "-m",
            "controller.cli",
            "status",
            "-m",
            str(EXAMPLE),
            "--observed",
            str(OBSERVED),
            "--watch",
            "--interval",
            "0.2",
            "--count",
            "2",
        ]
    )
    try:
        assert term.wait_exit("the end of --count 2") == 0
        assert term.text.count(HEADER) >= 2
        assert "GPU roles (MiB)" in term.text
    finally:
        term.close()
