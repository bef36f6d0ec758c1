"""A state directory that exists but that the user running a command cannot read or lock
(docs/operations.md, "Replay and the journal"): the default one after `run` ran as
another user (the quickstart as root, the unit as its service user), or a
``--state-dir`` of another user's.

The commands that read it (``status``, ``calibrate``, ``fit``, ``plan``) or lock it
(``apply``, ``run``) refuse in one paragraph naming the directory, what could not be
done and how to fix it, exit 2 (``plan`` 1: its 2 means changes), never a traceback;
``vramctl mcp`` starts and answers, its tools saying in their notes that the journal
could not be read and why (as for any journal that cannot be read).

The directory is made unreadable the way the kernel refuses it, not by a fake: as an
ordinary user, mode 0000 on a directory of its own; as root (CI runs the tests as
root, and root reads every file), the directory is given to ``nobody`` with mode 0700
and the command is run as root without the two capabilities that let root read what
is not its own (``setpriv`` drops ``CAP_DAC_OVERRIDE`` and ``CAP_DAC_READ_SEARCH``):
exactly the operator's case of a directory owned by another user. Each command is the
real console script, run in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from support.mcp_stdio import tool_text, with_session

from controller.store.journal import Journal, journal_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
VRAMCTL = Path(sys.executable).with_name("vramctl")
NOBODY = 65534
#: root without the capabilities that read and search what is not its own
AS_ANOTHER_USER = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


@dataclass(frozen=True)
class Denied:
    """A manifest whose default state directory ``state`` this test's commands cannot
    read; ``prefix`` runs a command so (empty for an ordinary user)."""

    manifest: Path
    observed: Path
    state: Path
    prefix: list[str]


@pytest.fixture
def denied(tmp_path: Path) -> Iterator[Denied]:
    manifest = tmp_path / "single-card.toml"
    observed = tmp_path / "single-card.observed.json"
    shutil.copy(EXAMPLES / "single-card.toml", manifest)
    shutil.copy(EXAMPLES / "single-card.observed.json", observed)
    state = tmp_path / ".vramctl-state"
    Journal.open(journal_path(state)).close()  # what `run` leaves there
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.fail("setpriv (util-linux) is needed to run a command as root without DAC")
        for path in (state, *state.iterdir()):
            os.chown(path, NOBODY, NOBODY)
        prefix = AS_ANOTHER_USER
    else:
        state.chmod(0)
        prefix = []
    yield Denied(manifest, observed, state, prefix)
    state.chmod(0o700)  # pytest removes tmp_path later


def vramctl(denied: Denied, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMCTL_")}
    env.update(COLUMNS="200", NO_COLOR="1", TERM="dumb", DOCKER_HOST="unix:///nonexistent")
    env.pop("XDG_STATE_HOME", None)
    return subprocess.run(
        [*denied.prefix, str(VRAMCTL), *args],
        cwd=denied.manifest.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_paragraph(r: subprocess.CompletedProcess[str], denied: Denied, doing: str) -> None:
    said = r.stderr
    assert "Traceback" not in said, said
    assert str(denied.state) in said, said
    assert doing in said, said
    assert "--state-dir" in said and "chown" in said, said
    assert "\n\n" not in said.strip(), said


@pytest.mark.parametrize(
    "command",
    [
        ["status", "--observed", "single-card.observed.json"],
        ["status", "--observed", "single-card.observed.json", "--json"],
        ["calibrate"],
        ["fit", "fast", "--observed", "single-card.observed.json", "--state-dir", ".vramctl-state"],
    ],
    ids=["status", "status-json", "calibrate", "fit"],
)
def test_a_command_that_reads_it_says_what_and_how_to_fix_exit_2(
    denied: Denied, command: list[str]
) -> None:
    r = vramctl(denied, *command, "-m", str(denied.manifest))
    _one_paragraph(r, denied, "cannot read")
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""


def test_plan_says_so_and_exits_1_its_error(denied: Denied) -> None:
    args = ["--observed", "single-card.observed.json", "--state-dir", str(denied.state)]
    r = vramctl(denied, "plan", "-m", str(denied.manifest), *args, "--detailed-exitcode")
    _one_paragraph(r, denied, "cannot read")
    assert r.returncode == 1, r.stderr


@pytest.mark.parametrize("command", [["apply"], ["run", "--dry-run", "--no-api"]])
def test_a_command_that_locks_it_says_what_and_how_to_fix_exit_2(
    denied: Denied, command: list[str]
) -> None:
    r = vramctl(denied, *command, "-m", str(denied.manifest))
    _one_paragraph(r, denied, "cannot lock")
    assert r.returncode == 2, r.stderr


def test_replay_of_its_journal_says_it_cannot_be_read_exit_1(denied: Denied) -> None:
    journal = journal_path(denied.state)
    r = vramctl(denied, "replay", str(journal), "-m", str(denied.manifest))
    assert r.returncode == 1, r.stderr  # replay's error (its 2 means the plans differ)
    assert f"{journal}: cannot read: Permission denied" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_mcp_starts_and_its_tools_say_the_journal_could_not_be_read(denied: Denied) -> None:
    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("reservation_status", {}),
            await s.call_tool("can_fit", {"serve": "fast"}),
        ]

    args = ["-m", str(denied.manifest), "--observed", str(denied.observed)]
    launcher = [*denied.prefix, str(VRAMCTL)]
    status, fit = with_session(go, [*args, "--state-dir", str(denied.state)], launcher)
    for result in (status, fit):
        assert not result.is_error, tool_text(result)
        notes = result.structured_content["notes"]
        said = [n for n in notes if "the journal could not be read" in n]
        assert said and str(denied.state) in said[0] and "--state-dir" in said[0], notes
    assert fit.structured_content["fits"] is True
    assert json.loads(tool_text(fit))["evict"] == ["ocr"]
