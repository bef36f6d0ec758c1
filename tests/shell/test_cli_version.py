"""``vramctl --version``: the installed version, as pyproject.toml declares it.

It runs the real module in a subprocess, as the console script does; a checkout that is
not installed answers with its pyproject.toml's version (``_version``'s fallback).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> str:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def test_version_prints_the_version_pyproject_declares_and_exits_0() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "controller.interfaces.cli", "--version"],
        cwd=ROOT,
        env=dict(os.environ, NO_COLOR="1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"vramctl {_declared()}\n"
    assert proc.stderr == ""


def test_version_not_installed_is_read_from_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.interfaces.cli import options

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert options._version() == _declared()
