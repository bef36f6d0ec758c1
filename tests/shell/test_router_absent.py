"""Without a router, nothing is accepted that needs one (docs/operations.md#without-a-router).

A serve with ``router_tier`` is drained before it is stopped (or put to sleep), and a
drain needs the router. With no ``--router-url`` / ``VRAMCTL_ROUTER_URL``, the
preflight refuses every such plan: a request whose doing (evicting a serve with a
tier) or undoing (stopping the requester when its request ends) drains a tier can
never be carried out, so ``up`` refuses it at once (409, with the fix) instead of
accepting it and leaving every cycle to refuse it; ``down`` refuses to end a request
whose serve cannot be stopped; ``run`` says once at start which serves need a router,
and ``validate`` warns.

No Docker for the API part: a controller whose observations the test scripts (as
``tests/shell/test_pending_requests.py`` does). ``run`` and ``validate`` run in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import run_cli
from support.service import controller_on, observe, running_for
from support.waiting import WAIT_S, wait_for
from test_api import TOKEN, Asgi, auth

from controller.manifest import load_manifest_set
from controller.service.loop import Controller
from controller.service.queue_pump import active_requests

ROOT = Path(__file__).resolve().parents[2]

#: budget 10000: res 3000 + ocr 4000 (evictable, with a tier) run; fast (on-demand,
#: with a tier) fits beside them; plain (no tier) needs ocr evicted; tiny fits as is
MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0

[[serve]]
name = "res"
container = "c-res"
gpu_role = "a"
vram_mib = 3000
residency = "resident"
desired = "running"

[[serve]]
name = "ocr"
container = "c-ocr"
gpu_role = "a"
vram_mib = 4000
residency = "evictable"
desired = "running"
router_tier = "ocr-local"

[[serve]]
name = "fast"
container = "c-fast"
gpu_role = "a"
vram_mib = 2000
residency = "on-demand"
router_tier = "fast-local"

[[serve]]
name = "plain"
container = "c-plain"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"

[[serve]]
name = "tiny"
container = "c-tiny"
gpu_role = "a"
vram_mib = 1000
residency = "on-demand"
"""


def controller_for(tmp_path: Path, router_url: str | None) -> Controller:
    return controller_on(tmp_path, MANIFEST, router_url=router_url)


def running() -> dict[str, Any]:
    return running_for(1000)


@pytest.fixture
def routerless(tmp_path: Path) -> Iterator[tuple[Controller, Asgi]]:
    c = controller_for(tmp_path, None)
    api = Asgi(c, TOKEN)
    yield c, api
    api.close()
    c.journal.close()


def test_an_up_that_needs_a_drain_is_refused_at_once_without_a_router(
    routerless: tuple[Controller, Asgi],
) -> None:
    c, api = routerless
    observe(c, {"res": running(), "ocr": running()})
    # plain fits only by evicting ocr, whose tier must be drained first
    r = api.post("/v1/serves/plain/up", headers=auth())
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert "ocr-local" in error and "no router is configured" in error, error
    assert "VRAMCTL_ROUTER_URL" in error and "--router-url" in error, error
    assert r.json()["needs_router"] == [
        {"serve": "ocr", "router_tier": "ocr-local", "when": "stopped to make room for plain"}
    ]
    # fast fits as is, but its request's end stops it: its own tier is drained first
    r = api.post("/v1/serves/fast/up", headers=auth())
    assert r.status_code == 409, r.text
    assert "fast-local" in r.json()["error"] and "VRAMCTL_ROUTER_URL" in r.json()["error"]
    # a queued request is refused the same way, not queued
    r = api.post("/v1/serves/plain/up", json={"queue": True}, headers=auth())
    assert r.status_code == 409 and not r.json().get("queued"), r.text
    assert api.get("/v1/queue").json()["roles"] == {}
    assert c.journal.active_requests() == []
    # what needs no router is still accepted
    r = api.post("/v1/serves/tiny/up", headers=auth())
    assert r.status_code == 202, r.text


def test_with_a_router_the_same_requests_are_accepted(tmp_path: Path) -> None:
    c = controller_for(tmp_path, "http://127.0.0.1:9")
    api = Asgi(c, TOKEN)
    try:
        observe(c, {"res": running(), "ocr": running()})
        assert api.post("/v1/serves/plain/up", headers=auth()).status_code == 202
        assert api.post("/v1/serves/plain/down", headers=auth()).status_code == 202
        assert api.post("/v1/serves/fast/up", headers=auth()).status_code == 202
    finally:
        api.close()
        c.journal.close()


def test_down_of_a_serve_that_cannot_be_stopped_is_refused_and_the_request_stays(
    routerless: tuple[Controller, Asgi],
) -> None:
    """A request recorded earlier (under a run that had a router) whose serve runs:
    ending it would stop fast, which needs its tier drained."""
    c, api = routerless
    c.request_up("fast", None)
    observe(c, {"res": running(), "ocr": running(), "fast": running()})
    r = api.post("/v1/serves/fast/down", headers=auth())
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert "fast-local" in error and "VRAMCTL_ROUTER_URL" in error, error
    assert [q.serve for q in c.journal.active_requests()] == ["fast"]
    # not running: nothing to stop, so the request ends
    observe(c, {"res": running(), "ocr": running()})
    assert api.post("/v1/serves/fast/down", headers=auth()).status_code == 202
    assert active_requests(c, time.time()) == {}


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VRAMCTL_ROUTER")}
    return run_cli(*args, env={**base, "COLUMNS": "200", "NO_COLOR": "1", **env}, cwd=ROOT)


def test_validate_warns_about_serves_that_need_a_router(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    r = cli("validate", "-m", str(path))
    assert r.returncode == 0, r.stderr
    assert "no router is configured" in r.stderr, r.stderr
    assert "fast (fast-local)" in r.stderr and "ocr (ocr-local)" in r.stderr, r.stderr
    assert "VRAMCTL_ROUTER_URL" in r.stderr
    r = cli("validate", "-m", str(path), VRAMCTL_ROUTER_URL="http://127.0.0.1:8000")
    assert r.returncode == 0 and "router" not in r.stderr, r.stderr


@pytest.mark.docker
def test_run_says_once_at_start_which_serves_need_a_router(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    log = tmp_path / "run.log"
    args = ["run", "-m", str(path), "--dry-run", "--no-api", "--resync", "0.5"]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controller.interfaces.cli", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("VRAMCTL_ROUTER")},
                "VRAMCTL_STATE_DIR": str(tmp_path / "state"),
            },
        )
        try:
            wait_for("the first plan", lambda: "dry run: would" in log.read_text())
            time.sleep(2.0)  # several resyncs (0.5 s) after the first cycle
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=WAIT_S)
    out = log.read_text()
    lines = [line for line in out.splitlines() if "no router is configured" in line]
    assert len(lines) == 1, out
    assert "fast (fast-local)" in lines[0] and "ocr (ocr-local)" in lines[0], lines


def test_what_the_end_of_a_request_drains(tmp_path: Path) -> None:
    """Pure: the requester's own end needs no drain when the manifest keeps it running,
    when it has no tier, or (for ``down``) when it does not run."""
    from dataclasses import replace

    from statemachine.domain.types import DesiredRun, Observed
    from statemachine.planning.admission import down_needs_router, end_needs_router

    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    fast = load_manifest_set([path]).desired().serves["fast"]
    nothing = Observed(docker_ok=True)
    assert end_needs_router(fast, nothing, requested=False) is not None
    kept = replace(fast, desired=DesiredRun.RUNNING)
    assert end_needs_router(kept, nothing, requested=False) is None
    assert end_needs_router(replace(fast, router_tier=None), nothing, requested=False) is None
    assert down_needs_router(fast, nothing) is None  # not running: nothing to stop
    assert down_needs_router(fast, Observed(docker_ok=False)) is not None  # may run
