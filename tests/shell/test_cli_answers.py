"""What the answering commands print, read as an operator reads it (issue 26, item 10).

* ``fit`` says whether the serve fits once: the core's reason names the serve and the
  verdict itself ("fast fits after stopping ocr"), not "fast: fits: fast fits …";
* ``status``'s health column: Docker's healthcheck where the container has one, else
  the controller's own GET of the serve's health path (a real httpd in a container);
* ``status`` on the live host prints no log line of another format amid its answer: a
  serve whose requests in flight cannot be read is one ``warning:`` line saying why
  (real container on the real daemon, a metrics URL where nothing listens).

Each runs the real module in a subprocess, as the console script does.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from docker.models.containers import Container
from support.cli import cli_env, run_cli
from support.serving import free_port, httpd
from support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
OBSERVED = ROOT / "manifests" / "examples" / "single-card.observed.json"


def vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env(), cwd=ROOT)


def test_fit_says_whether_it_fits_once() -> None:
    r = vramctl("fit", "fast", "-m", str(EXAMPLE), "--observed", str(OBSERVED))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first == "fast fits after stopping ocr", r.stdout


def test_fit_of_a_serve_that_does_not_fit_says_so_once(tmp_path: Path) -> None:
    # the reranker cannot be evicted for: fast does not fit once ocr is resident too
    manifest = tmp_path / "serves.toml"
    manifest.write_text(
        EXAMPLE.read_text(encoding="utf-8").replace(
            'residency = "evictable"', 'residency = "resident"'
        ),
        encoding="utf-8",
    )
    r = vramctl("fit", "fast", "-m", str(manifest), "--observed", str(OBSERVED))
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("fast does not fit ("), r.stdout
    assert first.count("fit") == 1, r.stdout


@pytest.mark.docker
def test_live_status_prints_no_log_line_and_says_why_in_flight_is_unknown(
    tmp_path: Path, busybox_container: Callable[..., Container]
) -> None:
    container = busybox_container()
    port = free_port()  # nothing listens there
    manifest = tmp_path / "serves.toml"
    manifest.write_text(
        f"""
[[gpu_roles]]
id = "g"
vram_mib = 10000
reserve_mib = 0

[[serve]]
name = "llm"
container = "{container.name}"
port = {port}
gpu_role = "g"
vram_mib = 1000
residency = "resident"
desired = "running"
metrics_url = "http://127.0.0.1:{port}/metrics"
""",
        encoding="utf-8",
    )
    r = vramctl("status", "-m", str(manifest))
    assert r.returncode == 0, r.stderr
    assert " | INFO | " not in r.stdout + r.stderr, r.stderr
    assert "warning: llm: requests in flight unknown: " in r.stderr, r.stderr
    assert all(line.startswith(("warning: ", "  ")) for line in r.stderr.splitlines()), r.stderr


@pytest.mark.docker
def test_live_status_shows_the_health_probes_answer(
    tmp_path: Path, busybox_container: Callable[..., Container]
) -> None:
    up_port, down_port = free_port(), free_port()
    answering = busybox_container(command=httpd(up_port))
    silent = busybox_container()  # runs, but nothing listens on its port
    plain = busybox_container()  # no health path declared
    serves = [
        ("web", answering.name, f'port = {up_port}\nhealth = "/health"'),
        ("mute", silent.name, f'port = {down_port}\nhealth = "/health"'),
        ("plain", plain.name, ""),
    ]
    manifest = tmp_path / "serves.toml"
    manifest.write_text(
        '[[gpu_roles]]\nid = "g"\nvram_mib = 10000\nreserve_mib = 0\n'
        + "".join(
            f'\n[[serve]]\nname = "{n}"\ncontainer = "{c}"\n{extra}\ngpu_role = "g"\n'
            'vram_mib = 1000\nresidency = "resident"\ndesired = "running"\n'
            for n, c, extra in serves
        ),
        encoding="utf-8",
    )

    def health() -> dict[str, str | None]:
        r = vramctl("status", "-m", str(manifest), "--json")
        assert r.returncode == 0, r.stderr
        return {s["serve"]: s["health"] for s in json.loads(r.stdout)["serves"]}

    def web_healthy() -> dict[str, str | None] | None:
        got = health()
        return got if got["web"] == "healthy" else None

    got = wait_for("web healthy (httpd takes a moment to listen)", web_healthy, seen=health)
    assert got == {"web": "healthy", "mute": "unhealthy", "plain": None}
    table = vramctl("status", "-m", str(manifest))
    rows = [line.replace("│", " ").split() for line in table.stdout.splitlines()]
    web = next(r for r in rows if r and r[0] == "web")
    assert "healthy" in web, table.stdout
