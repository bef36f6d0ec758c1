"""One situation, one answer, on the real daemon (docs/design.md).

Three questions whose answers came from differently built inputs before:

* ``vramctl status --state-dir`` beside a running ``vramctl run`` counts a placed serve
  on the card it was started on, as ``GET /v1/ledger`` does (it read no start record
  and counted it on every candidate); without the journal, the container's own
  ``VRAMCTL_GPU_ROLE`` is the evidence;
* ``vramctl apply`` of a saved plan (and of its own) reserves a placed serve on the
  planned card (it admitted the reserve on every candidate, refused on the full one);
* ``up``'s 202 names the victim the loop then stops, weighed with the measured reload
  costs (the API decided with a policy that had none).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from docker.errors import NotFound
from support.cli import run_argv, spawn, terminate
from support.serving import free_port
from support.waiting import wait_for
from test_api import vramctl
from test_loop_events import names
from test_placement_docker import _card_of, _serve

from controller.store.journal import Journal, journal_path

__all__ = ["names"]  # the fixture, shared with test_loop_events

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "one-answer-token"
RESIDENT = 'residency = "resident"\ndesired = "running"'
EVICTABLE = 'residency = "evictable"'
RUNNING = 'desired = "running"'
PLACED = 'placement = ["a", "b"]'


def _roles(*roles: tuple[str, int]) -> str:
    return "".join(f'[[gpu_roles]]\nid = "{r}"\nvram_mib = {mib}\n\n' for r, mib in roles)


def _state(client: docker.DockerClient, container: str) -> str:
    try:
        return str(client.containers.get(container).status)
    except NotFound:
        return "absent"


class Loop:
    """``vramctl run`` in a subprocess, its API on a free port."""

    def __init__(self, manifest: Path, state: Path) -> None:
        self.state = state
        self.address = f"127.0.0.1:{free_port()}"
        token = state.parent / "token"
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
        self.log = state.parent / "run.log"
        flags = ("--api", self.address, "--token-file", str(token))
        self.proc = spawn(run_argv(manifest, state, *flags), self.log, cwd=ROOT)
        self.http = httpx.Client(base_url=f"http://{self.address}", timeout=30, trust_env=False)
        wait_for("the loop's first cycle", self._cycled)

    def _cycled(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"vramctl run exited:\n{self.logs()}")
        try:
            return bool(self.http.get("/healthz").json()["cycles"] >= 1)
        except httpx.HTTPError:
            return False

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def ledger(self) -> dict[str, Any]:
        return dict(self.http.get("/v1/ledger").json())

    def lifecycles(self) -> dict[str, str]:
        return {s["serve"]: s["lifecycle"] for s in self.http.get("/v1/serves").json()["serves"]}

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(path, json=body, headers={"Authorization": f"Bearer {TOKEN}"})

    def stop(self) -> None:
        terminate(self.proc)
        self.http.close()


@pytest.fixture
def loops() -> Iterator[list[Loop]]:
    started: list[Loop] = []
    yield started
    for lp in started:
        with contextlib.suppress(Exception):
            lp.stop()


def _committed(roles: list[dict[str, Any]]) -> dict[str, int | None]:
    return {r["gpu_role"]: r["committed_mib"] for r in roles}


def test_status_beside_a_running_loop_counts_a_placed_serve_where_v1_ledger_does(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
    loops: list[Loop],
) -> None:
    ctr = {n: names(n) for n in ("x", "e", "p")}
    text = (
        _roles(("a", 10000), ("b", 12000))
        + _serve("x", ctr["x"], test_image, 2000, 'gpu_role = "b"', RESIDENT)
        + _serve("e", ctr["e"], test_image, 3000, 'gpu_role = "a"', f"{EVICTABLE}\n{RUNNING}")
        + _serve("p", ctr["p"], test_image, 4000, PLACED, f"{EVICTABLE}\n{RUNNING}")
    )
    manifest, state = tmp_path / "serves.toml", tmp_path / "state"
    manifest.write_text(text)
    loop = Loop(manifest, state)
    loops.append(loop)
    wait_for(
        "x, e, p running", lambda: all(_state(docker_client, c) == "running" for c in ctr.values())
    )
    assert _card_of(docker_client, ctr["p"]) == "a"  # best fit: 3000 left on a
    wait_for(
        "the ledger to count p",
        lambda: _committed(loop.ledger()["gpu_roles"]) == {"a": 7000, "b": 2000},
    )

    r = vramctl("status", "-m", str(manifest), "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert _committed(status["gpu_roles"]) == _committed(loop.ledger()["gpu_roles"])
    assert not any(role["overcommitted"] for role in status["gpu_roles"])
    # fit and plan answer from the same situation: nothing to do, p fits where it is
    r = vramctl("plan", "-m", str(manifest), "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == []

    # without the loop's journal: the container says which card its up was told
    r = vramctl("status", "-m", str(manifest), "--state-dir", str(tmp_path / "elsewhere"), "--json")
    assert r.returncode == 0, r.stderr
    assert _committed(json.loads(r.stdout)["gpu_roles"]) == {"a": 7000, "b": 2000}


def test_apply_reserves_a_placed_serve_on_the_planned_card(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    ctr = {n: names(n) for n in ("e", "p")}

    def text(p_desired: str) -> str:
        return (
            _roles(("a", 5000), ("b", 10000))
            + _serve("e", ctr["e"], test_image, 3000, 'gpu_role = "a"', RESIDENT)
            + _serve("p", ctr["p"], test_image, 4000, PLACED, f"{EVICTABLE}\n{p_desired}")
        )

    manifest, state = tmp_path / "serves.toml", tmp_path / "state"
    manifest.write_text(text(""))
    r = vramctl("apply", "-m", str(manifest), "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _state(docker_client, ctr["e"]) == "running"  # a holds 3000 of its 5000

    manifest.write_text(text('desired = "running"'))
    plan_file = tmp_path / "plan.json"
    r = vramctl("plan", "-m", str(manifest), "--state-dir", str(state), "--out", str(plan_file))
    assert r.returncode == 0, r.stderr
    planned = json.loads(plan_file.read_text())
    assert [(p["serve"], p["role"]) for p in planned["placements"]] == [("p", "b")]
    reserve = next(s for s in planned["steps"] if s["action"] == "reserve")
    assert (reserve["serve"], reserve["gpu_roles"]) == ("p", ["b"])
    # the saved plan carried out: reserved on b (its reserve on a would be refused)
    r = vramctl("apply", str(plan_file), "-m", str(manifest), "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ledger_matches_host"] is True
    assert _card_of(docker_client, ctr["p"]) == "b"
    r = vramctl("status", "-m", str(manifest), "--state-dir", str(state), "--json")
    assert _committed(json.loads(r.stdout)["gpu_roles"]) == {"a": 3000, "b": 4000}


def test_up_names_the_victim_the_loop_stops_weighed_by_measured_costs(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
    loops: list[Loop],
) -> None:
    ctr = {n: names(n) for n in ("slow", "quick", "r")}

    def text(quick: str) -> str:
        return (
            _roles(("g", 10000))
            + _serve(
                "slow", ctr["slow"], test_image, 4000, 'gpu_role = "g"', EVICTABLE + "\n" + RUNNING
            )
            + _serve(
                "quick", ctr["quick"], test_image, 4000, 'gpu_role = "g"', f"{EVICTABLE}\n{quick}"
            )
            + _serve("r", ctr["r"], test_image, 5000, 'gpu_role = "g"', 'residency = "on-demand"')
        )

    manifest, state = tmp_path / "serves.toml", tmp_path / "state"
    state.mkdir()
    with Journal.open(journal_path(state)) as journal:  # what earlier runs measured
        for _ in range(5):
            journal.add_restore("slow", "cold", 60.0, time.time())
            journal.add_restore("quick", "cold", 5.0, time.time())
    # slow starts first: without costs the least recently started, slow, is the victim
    manifest.write_text(text(""))
    r = vramctl("apply", "-m", str(manifest), "--state-dir", str(state))
    assert r.returncode == 0, r.stdout + r.stderr
    time.sleep(1.1)
    manifest.write_text(text(RUNNING))
    loop = Loop(manifest, state)
    loops.append(loop)
    wait_for(
        "slow and quick running",
        lambda: all(_state(docker_client, ctr[n]) == "running" for n in ("slow", "quick")),
    )
    wait_for(
        "the loop to count both", lambda: _committed(loop.ledger()["gpu_roles"]) == {"g": 8000}
    )
    # a start in progress is never a victim: wait until quick's has ended
    wait_for(
        "both running, no start in progress",
        lambda: loop.lifecycles() == {"slow": "running", "quick": "running", "r": "stopped"},
    )

    r = loop.post("/v1/serves/r/up", {"ttl_s": 300})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["fit"]["evict"] == ["quick"], body
    assert [s["serve"] for s in body["steps"] if s["action"] == "stop"] == ["quick"]
    wait_for("r running", lambda: _state(docker_client, ctr["r"]) == "running")
    states = {n: _state(docker_client, ctr[n]) for n in ("slow", "quick")}
    stopped = states["quick"] in ("exited", "created")
    assert stopped and states["slow"] == "running", (states, loop.logs())
