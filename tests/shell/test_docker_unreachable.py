"""Docker that cannot be reached: one line that says where vramctl looked and what to do.

The real CLI in a subprocess, pointed (``DOCKER_HOST``) at a socket path where nothing
listens: ``status``, ``fit`` and ``plan`` print their answer (``unknown`` where unknown),
one error line naming the socket and the remedy, no exception text, and exit 3 (they
could not observe: docs/operations.md). ``run`` says it once, and again only when what
it meets changes (here: a file appears at the socket's path, so the connection is
refused instead of finding nothing). No daemon is needed: nothing listens anywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.serving import free_port
from support.waiting import WAIT_S

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
#: the words of a raw exception that must never reach the operator
RAW = ("DockerException", "FileNotFoundError", "Connection aborted", "Traceback", "Errno")


def vramctl(*args: str, docker_host: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="200", DOCKER_HOST=docker_host),
        check=False,
    )


def docker_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "docker" in line.lower()]


@pytest.mark.parametrize(
    "command",
    [
        ("status",),
        ("status", "--json"),
        ("fit", "fast"),
        ("fit", "fast", "--json"),
        ("plan",),
        ("plan", "--detailed-exitcode"),
    ],
)
def test_a_missing_socket_is_one_line_naming_it_and_the_answer_exits_3(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    sock = tmp_path / "docker.sock"
    r = vramctl(*command, "-m", str(EXAMPLE), docker_host=f"unix://{sock}")
    assert r.returncode == 3, r.stdout + r.stderr
    said = docker_lines(r.stderr)
    assert len(said) == 1, r.stderr
    line = said[0]
    assert line.startswith("error: docker unreachable at ")
    assert f"unix://{sock}" in line and "(DOCKER_HOST)" in line
    assert "no such socket" in line and "start the Docker daemon" in line
    for raw in RAW:
        assert raw not in r.stderr + r.stdout, raw
    if "--json" in command:
        json.loads(r.stdout)  # the answer is still printed, for tools too
    elif command[0] == "status":
        assert "committed unknown" in r.stdout


def test_a_refused_connection_and_a_denied_socket_say_so(tmp_path: Path) -> None:
    sock = tmp_path / "docker.sock"
    sock.write_text("not a socket")  # connecting to a plain file is refused
    r = vramctl("status", "-m", str(EXAMPLE), docker_host=f"unix://{sock}")
    assert r.returncode == 3
    [line] = docker_lines(r.stderr)
    assert "connection refused" in line and f"unix://{sock}" in line
    r = vramctl("fit", "fast", "-m", str(EXAMPLE), docker_host="tcp://127.0.0.1:1")
    assert r.returncode == 3
    [line] = docker_lines(r.stderr)
    assert "tcp://127.0.0.1:1 (DOCKER_HOST)" in line and "connection refused" in line


def test_where_it_looks_without_docker_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controller.adapters.docker.reach import docker_endpoint, unreachable_message

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no context chosen: the default
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    where = docker_endpoint({})
    assert where == "unix:///var/run/docker.sock (the default: DOCKER_HOST is not set)"
    assert docker_endpoint({"DOCKER_HOST": "tcp://h:2375"}) == "tcp://h:2375 (DOCKER_HOST)"
    # an error with no errno below it still names where, on one line
    line = unreachable_message(RuntimeError("odd\nanswer"), where)
    assert "\n" not in line and line.startswith(f"docker unreachable at {where}: ")


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        data: dict[str, Any] = json.loads(r.read())
    return data


def test_run_says_it_once_and_again_only_when_it_changes(tmp_path: Path) -> None:
    sock = tmp_path / "docker.sock"
    port = free_port()
    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controller.cli",
                "run",
                "-m",
                str(EXAMPLE),
                "--state-dir",
                str(tmp_path / "state"),
                "--resync",
                "0.5",
                "--api",
                f"127.0.0.1:{port}",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, NO_COLOR="1", DOCKER_HOST=f"unix://{sock}"),
        )

    def cycles_past(n: int) -> int:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                done = int(healthz(port)["cycles"])
            except OSError:
                done = 0
            if done >= n:
                return done
            time.sleep(0.1)
        raise AssertionError(f"fewer than {n} cycles in {WAIT_S:g}s:\n{log.read_text()}")

    try:
        seen = cycles_past(6)
        sock.write_text("not a socket")  # from now on the connection is refused
        cycles_past(seen + 6)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(WAIT_S)
    said = docker_lines(log.read_text())
    assert len(said) == 2, "\n".join(said)
    assert "no such socket" in said[0] and "connection refused" in said[1]
    assert all(f"unix://{sock} (DOCKER_HOST)" in line for line in said)
    for raw in RAW:
        assert raw not in log.read_text(), raw
