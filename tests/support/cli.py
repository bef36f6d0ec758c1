"""The CLI runner the tests share: ``vramctl ARGS`` as a subprocess, its output captured.

Each test module keeps its own short runner (its name, its environment, its working
folder and timeout) and reaches the command through :func:`run_cli`. Nothing here
checks an answer: the caller asserts on the returned process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
CLI = (sys.executable, "-m", "controller.interfaces.cli")


def cli_env(columns: int = 200, **extra: str) -> dict[str, str]:
    """This process's environment, wide and without colour, plus ``extra``."""
    return dict(os.environ, COLUMNS=str(columns), NO_COLOR="1", **extra)


def bare_env() -> dict[str, str]:
    """Only a PATH, the repository on PYTHONPATH, wide and without colour."""
    return {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(REPO)}


def run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``vramctl *args`` run to its end (never raising on its exit status)."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def run_argv(manifest: Path, state: Path, *flags: str, resync: str = "1") -> list[str]:
    """``vramctl run -m MANIFEST --state-dir STATE --resync RESYNC FLAGS...`` as an argv."""
    return [*CLI, "run", "-m", str(manifest), "--state-dir", str(state), "--resync", resync, *flags]


def spawn(
    argv: list[str], log: Path, *, env: Mapping[str, str] | None = None, cwd: Path = REPO
) -> subprocess.Popen[bytes]:
    """``argv`` started in the background, its output appended to ``log``.

    Without ``env``: this process's environment without colour."""
    with log.open("ab") as fh:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, NO_COLOR="1") if env is None else dict(env),
        )


def api_cycled(proc: subprocess.Popen[bytes], http: httpx.Client, logs: Callable[[], str]) -> bool:
    """Whether the API of ``vramctl run`` (``proc``) has counted one cycle; it raises
    with the run's log once the process ended."""
    if proc.poll() is not None:
        raise AssertionError(f"vramctl run exited {proc.returncode}:\n{logs()}")
    try:
        return bool(http.get("/healthz").json()["cycles"] >= 1)
    except httpx.HTTPError:
        return False


def terminate(proc: subprocess.Popen[bytes], timeout_s: float = 20) -> int:
    """SIGTERM to ``proc`` and its exit status; killed if it has not ended in ``timeout_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def bare_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``vramctl *args`` from the repository with only :func:`bare_env`'s environment."""
    return run_cli(*args, env=bare_env(), cwd=REPO)
