"""What the ``vramctl`` command line loads and prints before it does any work.

How fast it answers is measured by ``benchmarks/bench_cli.py``, never asserted here; the
tests hold what makes it fast and what the operator reads:

* an answering command (``--help``, ``validate``, ``fit``/``plan``/``status`` on a
  snapshot) imports no server, Docker or HTTP library;
* ``--help`` (of the app and of a command) imports no manifest model, no pydantic and
  no rich: the help is click's plain text, reflowed to the terminal;
* help paragraphs are reflowed, not cut where the docstring's lines end;
* a command that talks to a running loop (``up``, ``up --wait``, ``down``, ``events``)
  loads its HTTP client only: no server (FastAPI, uvicorn), no Docker, no loop.

Each runs the real module in a subprocess, as the console script does.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
OBSERVED = ROOT / "manifests" / "examples" / "single-card.observed.json"
SERVER_DOCKER_HTTP = {
    "fastapi",
    "uvicorn",
    "starlette",
    "docker",
    "httpx",
    "pynvml",
    "prometheus_client",
}
#: run the CLI in-process, then print every module it executed (a lazy one not counted)
PROBE = """
import runpy, sys
sys.argv = ['vramctl', *sys.argv[1:]]
try:
    runpy.run_module('controller.interfaces.cli', run_name='__main__')
except SystemExit:
    pass
# type(), not an attribute: any attribute of a lazy module would load it
loaded = [n for n, m in list(sys.modules.items()) if type(m).__name__ != '_LazyModule']
sys.stderr.write('\\nLOADED ' + ' '.join(sorted(loaded)) + '\\n')
"""


def _loaded(*args: str) -> set[str]:
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = next((x for x in reversed(proc.stderr.splitlines()) if x.startswith("LOADED ")), None)
    assert line is not None, proc.stderr
    return set(line.split()[1:])


def _tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["validate", "-m", str(EXAMPLE)],
        ["fit", "fast", "-m", str(EXAMPLE), "--observed", str(OBSERVED)],
        ["plan", "-m", str(EXAMPLE), "--observed", str(OBSERVED)],
        ["status", "-m", str(EXAMPLE), "--observed", str(OBSERVED)],
    ],
    ids=["help", "validate", "fit", "plan", "status"],
)
def test_answering_commands_import_no_server_docker_or_http_library(args: list[str]) -> None:
    assert not _tops(_loaded(*args)) & SERVER_DOCKER_HTTP


@pytest.mark.parametrize(
    "args",
    [
        ["up", "fast"],
        ["up", "fast", "--wait", "1"],
        ["down", "fast"],
        ["events", "--count", "1"],
    ],
    ids=["up", "up-wait", "down", "events"],
)
def test_commands_that_talk_to_the_loop_load_its_client_only(args: list[str]) -> None:
    from support.serving import free_port

    # nothing listens there: each says so and exits, having loaded what it would use
    loaded = _loaded(*args, "--api", f"127.0.0.1:{free_port()}")
    server = SERVER_DOCKER_HTTP - {"httpx"}
    assert not _tops(loaded) & server, sorted(m for m in loaded if m.split(".")[0] in server)
    assert not {m for m in loaded if m.startswith("controller.service")}
    assert "controller.interfaces.client" in loaded


def _heavy(loaded: set[str], tops: set[str]) -> list[str]:
    return sorted(
        m
        for m in loaded
        if m.split(".")[0] in tops
        or m.startswith(("controller.manifest", "controller.interfaces.render"))
    )


def test_help_imports_no_manifest_model_pydantic_or_rich() -> None:
    heavy = _heavy(_loaded("--help"), {"pydantic", "rich", "statemachine"})
    assert not heavy, f"--help loaded {heavy[:12]}"


@pytest.mark.parametrize("command", ["up", "validate", "status"])
def test_a_commands_help_imports_no_manifest_model_or_rich(command: str) -> None:
    # (typer itself coerces a command's parameters with pydantic before --help acts)
    heavy = _heavy(_loaded(command, "--help"), {"rich", "statemachine"})
    assert not heavy, f"{command} --help loaded {heavy[:12]}"


def _help(*args: str, columns: int) -> str:
    env = dict(os.environ, COLUMNS=str(columns), NO_COLOR="1", TERM="dumb")
    proc = subprocess.run(
        [sys.executable, "-m", "controller.interfaces.cli", *args, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout


@pytest.mark.parametrize("command", ["up", "run", "apply", "status"])
def test_help_paragraphs_are_reflowed_not_cut_at_the_docstrings_line_ends(command: str) -> None:
    text = "\n".join(line.rstrip() for line in _help(command, columns=80).splitlines())
    assert max(len(line) for line in text.splitlines()) <= 80, text
    # the description: the paragraphs between the usage line and the first section
    head = text.split("\n\n", 1)[1].split("Arguments:")[0].split("Options:")[0]
    for paragraph in head.strip("\n").split("\n\n"):
        lines = paragraph.splitlines()
        # every line but a paragraph's last is filled: the next word would not have fit
        # (the formatter keeps a margin of 2 of the 80 columns)
        for line, after in itertools.pairwise(lines):
            next_word = after.split()[0]
            assert len(line) + 1 + len(next_word) > 78, f"cut short: {line!r}\n{text}"


def test_up_help_keeps_the_whole_sentence_on_filled_lines() -> None:
    text = _help("up", columns=80)
    flat = re.sub(r"\s+", " ", text)
    assert "2 with --wait when S passed before it was ready (it goes on;" in flat
    assert not any(line.strip() == "was" for line in text.splitlines()), text
