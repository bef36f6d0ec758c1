"""The request path on the real daemon: live answers during a cycle, ``up`` with ``wait_s``.

``vramctl run`` runs in a subprocess with its API on a free loopback port over real
busybox containers. What a test must hold open (a cycle in the middle of its plan, a
start awaiting health) is held by the containers themselves, released when the test
says, never by a timer:

* a serve that ignores SIGTERM (``trap`` in its shell) keeps ``docker stop`` waiting for
  its whole ``stop_timeout_s``; it writes a mark file when the signal arrives, so the
  test knows the loop is inside that stop, and ``docker kill`` from the test ends it;
* a serve whose health path appears only when the test creates a file in a folder
  bound into the container stays ``starting`` until then.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from docker.errors import NotFound
from support.cli import api_cycled, run_argv, spawn, terminate
from support.manifests import serve_toml as serve_text
from support.serving import free_port
from support.waiting import wait_for

TOKEN = "live-test-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]


def serve_toml(*fields: Any, stop_s: int = 5, health: bool = True) -> str:
    """One serve: ``fields`` are name, container, MiB, residency, port and maybe the extra
    lines; 120 s to start, ``stop_s`` to stop, a health check unless ``health`` is False."""
    timeouts = {"start_timeout_s": 120, "stop_timeout_s": stop_s}
    name, container, mib, residency, port, *extra = fields
    text = serve_text(name, container, mib, residency, port, **timeouts, extra="".join(extra))
    return text if health else text.replace('health = "/health"\n', "")


class Daemon:
    """``vramctl run`` over a manifest the test writes; httpx to its API."""

    def __init__(self, client: docker.DockerClient, image: str, tmp: Path) -> None:
        self.docker = client
        self.image = image
        self.tmp = tmp
        self.prefix = f"vramctl-test-{uuid.uuid4().hex[:8]}-"
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.marks.chmod(0o777)
        self.api_port = free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.manifest = tmp / "serves.toml"
        self.token_file = tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.log = tmp / "run.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=120.0, trust_env=False)
        self.created: list[str] = []

    def name(self, serve: str) -> str:
        return f"{self.prefix}{serve}"

    def create(self, serve: str, command: list[str], *, running: bool) -> None:
        c = self.docker.containers.create(
            self.image,
            command,
            name=self.name(serve),
            init=True,
            network_mode="host",
            labels={"vramctl.test": "1"},
            volumes={str(self.marks): {"bind": "/marks", "mode": "rw"}},
        )
        self.created.append(str(c.name))
        if running:
            c.start()

    def state(self, serve: str) -> str:
        return str(self.docker.containers.get(self.name(serve)).status)

    def kill(self, serve: str) -> None:
        with contextlib.suppress(NotFound, docker.errors.APIError):
            self.docker.containers.get(self.name(serve)).kill()

    def start(self, resync_s: float = 1.0) -> None:
        flags = ("--api", f"127.0.0.1:{self.api_port}", "--token-file", str(self.token_file))
        argv = run_argv(self.manifest, self.tmp / "state", *flags, resync=str(resync_s))
        self.proc = spawn(argv, self.log, cwd=ROOT)
        wait_for("the API's first cycle", self._cycled)

    def _cycled(self) -> bool:
        assert self.proc is not None
        return api_cycled(self.proc, self.http, self.logs)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-8000:]

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(path, json=body, headers={"Authorization": f"Bearer {TOKEN}"})

    def up(self, serve: str, **body: Any) -> httpx.Response:
        return self.post(f"/v1/serves/{serve}/up", body or None)

    def ledger_role(self) -> dict[str, Any]:
        return dict(self.http.get("/v1/ledger").json()["gpu_roles"][0])

    def close(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
        self.http.close()
        for name in self.created:
            with contextlib.suppress(NotFound):
                self.docker.containers.get(name).remove(force=True)


@pytest.fixture
def daemon(docker_client: docker.DockerClient, test_image: str, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(docker_client, test_image, tmp_path)
    try:
        yield d
    finally:
        d.close()


def httpd(port: int) -> list[str]:
    return [
        "sh",
        "-c",
        f"mkdir -p /www && echo ok > /www/health && exec httpd -f -p 127.0.0.1:{port} -h /www",
    ]


def deaf(mark: str) -> list[str]:
    """A container that ignores SIGTERM and says so in ``/marks/<mark>``."""
    return ["sh", "-c", f"trap 'touch /marks/{mark}' TERM; while :; do sleep 1; done"]


def held_health(port: int, gate: str) -> list[str]:
    """httpd whose ``/health`` exists only once the test creates ``/marks/<gate>``."""
    return [
        "sh",
        "-c",
        f"mkdir -p /www && (while [ ! -e /marks/{gate} ]; do sleep 0.2; done; "
        f"echo ok > /www/health) & exec httpd -f -p 127.0.0.1:{port} -h /www",
    ]


# ── defect: stale answers during a cycle ─────────────────────────────────────


@pytest.mark.docker
def test_answers_count_what_the_running_cycle_reserved(daemon: Daemon) -> None:
    """Budget 10000; res 4000 runs, v1 and v2 (evictable, 500 each) run and ignore SIGTERM.

    ``a`` and ``b`` (on-demand, 100) share v1's and v2's ports, so each evicts one.
    ``up a`` starts a cycle that waits in ``docker stop v1``; meanwhile ``up od``
    (on-demand 5000) and ``up b`` are recorded, so the next cycle plans od (reserve,
    start) and then b (stop v2, held again). While that cycle waits in the stop of v2,
    od's 5000 MiB are reserved (and its container started): every answer must count
    them. The old answers came from the snapshot of the cycle before (5000 committed),
    so a 6000 MiB request got 202 "fits".
    """
    d = daemon
    ports = {n: free_port() for n in ("res", "v1", "v2", "od", "huge", "mid")}
    d.manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 0\n'
        + serve_toml("res", d.name("res"), 4000, "resident", ports["res"], 'desired = "running"')
        + serve_toml(
            "v1",
            d.name("v1"),
            500,
            "evictable",
            ports["v1"],
            'desired = "running"\npriority = 1',
            stop_s=300,
            health=False,
        )
        + serve_toml(
            "v2",
            d.name("v2"),
            500,
            "evictable",
            ports["v2"],
            'desired = "running"\npriority = 2',
            stop_s=300,
            health=False,
        )
        + serve_toml("a", d.name("a"), 100, "on-demand", ports["v1"])
        + serve_toml("b", d.name("b"), 100, "on-demand", ports["v2"])
        + serve_toml("od", d.name("od"), 5000, "on-demand", ports["od"])
        + serve_toml("huge", d.name("huge"), 9000, "on-demand", ports["huge"])
        + serve_toml("mid", d.name("mid"), 6000, "on-demand", ports["mid"])
    )
    d.create("res", httpd(ports["res"]), running=True)
    d.create("v1", deaf("v1.term"), running=True)
    d.create("v2", deaf("v2.term"), running=True)
    d.create("a", httpd(ports["v1"]), running=False)
    d.create("b", httpd(ports["v2"]), running=False)
    d.create("od", held_health(ports["od"], "od.ready"), running=False)
    d.create("huge", httpd(ports["huge"]), running=False)
    d.create("mid", httpd(ports["mid"]), running=False)
    d.start()
    wait_for("res + v1 + v2 counted", lambda: d.ledger_role()["committed_mib"] == 5000)

    r = d.up("a")
    assert r.status_code == 202, r.text
    wait_for("the loop inside docker stop v1", (d.marks / "v1.term").exists)
    r = d.up("od")
    assert r.status_code == 202, r.text
    r = d.up("b")
    assert r.status_code == 202, r.text
    d.kill("v1")  # the first cycle goes on: a starts; the next plans od, then b
    wait_for("the loop inside docker stop v2", (d.marks / "v2.term").exists)
    assert d.state("v2") == "running"

    # od is reserved by the cycle that now waits in the stop of v2; b, accepted and not
    # yet reserved (its reserve follows that stop), counts as requested, not yet planned
    role = d.ledger_role()
    assert role["committed_mib"] == 9600, (role, d.logs())  # res + a + od + v2 (stopping)
    names = {r["serve"] for r in role["reservations"]}
    assert {"res", "a", "od", "v2"} <= names and "b" not in names
    # b is promised beside what is held: counted by `up`, not as held
    assert [(p["serve"], p["mib"]) for p in role["pending"]] == [("b", 100)], role
    assert role["promised_mib"] == 9700 and role["overcommitted"] is False, role
    ledger = d.http.get("/v1/ledger").json()
    assert ledger["observed_at"] is not None and ledger["observation_age_s"] >= 0
    assert any(s["serve"] == "v2" and s["action"] == "stop" for s in ledger["in_flight"])

    r = d.up("huge")
    assert r.status_code == 429, r.text
    assert r.json()["observed_at"] is not None
    assert any(s["serve"] == "v2" and s["action"] == "stop" for s in r.json()["in_flight"])
    terms = r.json()["gpu_roles"][0]
    assert terms["committed_mib"] == 9700 and terms["free_mib"] == 300
    assert terms["shortfall_mib"] == 8700
    r = d.up("mid")
    assert r.status_code != 202, r.text  # 6000 MiB cannot be promised: 300 free
    fit = d.http.get("/v1/fit/mid").json()
    assert fit["fits"] is False and fit["gpu_roles"][0]["committed_mib"] == 9700

    rows = {s["serve"]: s for s in d.http.get("/v1/serves").json()["serves"]}
    assert rows["od"]["committed"] is True
    metrics = d.http.get("/metrics").text
    # the metrics count what is held (b's request is not yet reserved)
    assert 'vramctl_role_committed_mib{role="a"} 9600.0' in metrics

    d.kill("v2")
    (d.marks / "od.ready").touch()
    wait_for(
        "od and b running",
        lambda: d.state("od") == "running" and d.state("b") == "running",
    )


# ── up with wait_s ───────────────────────────────────────────────────────────


def exits(code: int) -> list[str]:
    return ["sh", "-c", f"sleep 0.5; exit {code}"]


def wait_manifest(d: Daemon, ports: dict[str, int]) -> None:
    """Budget 10000: res 4000 (resident) and ev 3000 (evictable) run; od (4000) evicts
    ev; bad (1000) exits at once; slow (1000) is healthy only once the test says."""
    d.manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 0\n'
        + serve_toml("res", d.name("res"), 4000, "resident", ports["res"], 'desired = "running"')
        + serve_toml("ev", d.name("ev"), 3000, "evictable", ports["ev"], 'desired = "running"')
        + serve_toml("od", d.name("od"), 4000, "on-demand", ports["od"])
        + serve_toml("bad", d.name("bad"), 1000, "on-demand", ports["bad"])
        + serve_toml("slow", d.name("slow"), 1000, "on-demand", ports["slow"])
    )
    d.create("res", httpd(ports["res"]), running=True)
    d.create("ev", httpd(ports["ev"]), running=True)
    d.create("od", httpd(ports["od"]), running=False)
    d.create("bad", exits(3), running=False)
    d.create("slow", held_health(ports["slow"], "slow.ready"), running=False)


ROOM_ACTIONS = {"quiesce", "drain", "stop", "release", "shrink", "sleep", "release_to_residual"}
MS = 0.0015  # the answer's figures are rounded to the millisecond, each on its own


def assert_timings_are_the_steps(body: dict[str, Any], serve: str, wall_s: float) -> None:
    """An answer's timings against its own steps (docs/operations.md, ``up`` that waits):
    the start is the start step's duration; making room spans every room step; readiness
    lasts at least the wait for health; the phases follow each other inside the total,
    and the total inside the time the client waited for the answer."""
    t, steps = body["timings"], body["steps"]
    took = {(s["serve"], s["action"]): float(s["duration_s"]) for s in steps}
    room = [float(s["duration_s"]) for s in steps if s["action"] in ROOM_ACTIONS]
    assert t["queued_s"] is None, t  # admitted at once: never queued
    assert t["started_s"] == took[(serve, "start")], (t, steps)
    assert room and t["made_room_s"] >= max(room) - MS, (t, steps)
    if len(room) == 1:
        assert abs(t["made_room_s"] - room[0]) <= MS, (t, steps)
    assert t["ready_s"] >= took[(serve, "await_ready")] - MS, (t, steps)
    phases = t["made_room_s"] + t["started_s"] + t["ready_s"]
    assert phases - 3 * MS <= t["total_s"] <= wall_s + MS, (t, wall_s)


@pytest.mark.docker
def test_up_with_wait_answers_when_ready_when_failed_and_at_its_deadline(daemon: Daemon) -> None:
    d = daemon
    ports = {n: free_port() for n in ("res", "ev", "od", "bad", "slow")}
    wait_manifest(d, ports)
    d.start()
    wait_for("res + ev counted", lambda: d.ledger_role()["committed_mib"] == 7000)

    # 200 once healthy: ev was evicted for it (room made), then it started and answered
    asked = time.monotonic()
    r = d.up("od", wait_s=120)
    wall_s = time.monotonic() - asked
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True and body["stage"] == "ready"
    assert_timings_are_the_steps(body, "od", wall_s)
    assert {(s["serve"], s["action"]) for s in body["steps"]} >= {
        ("ev", "stop"),
        ("od", "start"),
        ("od", "await_ready"),
    }
    assert httpx.get(f"http://127.0.0.1:{ports['od']}/health", trust_env=False).status_code == 200
    assert d.state("ev") == "exited"

    # the attempt fails: its container exits while starting -> 502 with the step and why
    r = d.up("bad", wait_s=120)
    assert r.status_code == 502, r.text
    body = r.json()
    assert body["ready"] is False and body["stage"] == "failed"
    assert "bad" in body["error"] and "exited" in body["error"]
    assert any(s["action"] == "await_ready" and s["outcome"] == "failed" for s in body["steps"])

    # N seconds pass first: 202 with where it stands; the next wait ends when healthy
    r = d.up("slow", wait_s=1)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["ready"] is False and body["stage"] and body["timings"]["ready_s"] is None
    wait_for("slow's container running", lambda: d.state("slow") == "running")
    (d.marks / "slow.ready").touch()
    r = d.up("slow", wait_s=120)
    assert r.status_code == 200, r.text
    assert r.json()["ready"] is True


@pytest.mark.docker
def test_a_client_that_goes_away_ends_its_wait_cleanly(daemon: Daemon) -> None:
    d = daemon
    ports = {n: free_port() for n in ("res", "ev", "od", "bad", "slow")}
    wait_manifest(d, ports)
    d.start()
    impatient = httpx.Client(base_url=d.url, timeout=1.0, trust_env=False)
    with impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post(
            "/v1/serves/slow/up",
            json={"wait_s": 300},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    wait_for("the wait to end", lambda: "client waiting for up slow went away" in d.logs())
    assert d.http.get("/healthz").status_code == 200
    (d.marks / "slow.ready").touch()
    wait_for("slow running", lambda: d.state("slow") == "running")


# ── queueing ─────────────────────────────────────────────────────────────────


@pytest.mark.docker
def test_queued_requests_wait_in_order_and_end_on_down(daemon: Daemon) -> None:
    """Budget 10000: res 4000 runs; hog (on-demand 5000) runs for a request.

    q1 (5000) can fit only once hog goes: queued first. q2 (1000) would fit now, but
    q1 waits ahead on the same role: queued behind it (no overtaking); q3 (1000)
    without the queue flag gets 429 saying so. ``down q2`` ends its queued request;
    ``down hog`` frees the room and q1, waiting, gets 200 with its time in the queue.
    """
    d = daemon
    ports = {n: free_port() for n in ("res", "hog", "q1", "q2", "q3", "huge")}
    d.manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 0\n'
        + serve_toml("res", d.name("res"), 4000, "resident", ports["res"], 'desired = "running"')
        + serve_toml("hog", d.name("hog"), 5000, "on-demand", ports["hog"])
        + serve_toml("q1", d.name("q1"), 5000, "on-demand", ports["q1"])
        + serve_toml("q2", d.name("q2"), 1000, "on-demand", ports["q2"])
        + serve_toml("q3", d.name("q3"), 1000, "on-demand", ports["q3"])
        + serve_toml("huge", d.name("huge"), 7000, "on-demand", ports["huge"])
    )
    for name, port in ports.items():
        d.create(name, httpd(port), running=name == "res")
    d.start()
    r = d.up("hog", wait_s=120)
    assert r.status_code == 200, r.text

    # a request that can never fit is not queued
    r = d.up("huge", queue=True)
    assert r.status_code == 429 and "not queued" in r.json()["queue"], r.text

    answer: dict[str, subprocess.CompletedProcess[str]] = {}

    def q1_waits() -> None:  # `vramctl up --queue --wait S`, as a router's script would
        answer["q1"] = subprocess.run(
            [
                sys.executable,
                "-m",
                "controller.interfaces.cli",
                "up",
                "q1",
                "--queue",
                "--wait",
                "240",
                "--json",
                "--api",
                f"127.0.0.1:{d.api_port}",
                "--token-file",
                str(d.token_file),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
            check=False,
        )

    waiter = threading.Thread(target=q1_waits)
    waiter.start()

    def queued() -> list[str]:
        return [e["serve"] for e in d.http.get("/v1/queue").json()["roles"].get("a", [])]

    wait_for("q1 queued", lambda: queued() == ["q1"])
    r = d.up("q2", queue=True)
    assert r.status_code == 202, r.text
    assert r.json()["queued"] is True and r.json()["queue"]["position"] == {"a": 2}
    assert queued() == ["q1", "q2"]
    rows = {s["serve"]: s for s in d.http.get("/v1/serves").json()["serves"]}
    assert rows["q2"]["queued"]["position"] == {"a": 2} and rows["q3"]["queued"] is None
    r = d.up("q3")
    assert r.status_code == 429, r.text
    assert "queued request(s) wait ahead" in r.json()["error"]
    assert r.json()["queued_ahead"] == ["q1", "q2"]

    r = d.post("/v1/serves/q2/down")
    assert r.status_code == 202 and r.json()["ended"] is True, r.text
    assert queued() == ["q1"]
    recent = d.http.get("/v1/queue").json()["recent"]
    assert any(e["serve"] == "q2" and e["outcome"] == "cancelled" for e in recent)
    assert d.state("q2") != "running"

    r = d.post("/v1/serves/hog/down")
    assert r.status_code == 202, r.text
    waiter.join(timeout=280)
    assert not waiter.is_alive()
    done = answer["q1"]
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout)
    assert got["status"] == 200 and got["ready"] is True
    assert got["timings"]["queued_s"] is not None and got["timings"]["started_s"] is not None
    assert d.state("q1") == "running" and d.state("hog") == "exited"
    assert queued() == []


# ── defect: two ups back to back, before the loop plans either ───────────────


@pytest.mark.docker
def test_two_ups_before_any_plan_are_not_promised_the_same_room(daemon: Daemon) -> None:
    """Budget 10000; res 4000 runs, v1 (evictable, 500) runs and ignores SIGTERM.

    ``up x`` (on-demand, 100, v1's port) starts a cycle that waits in ``docker stop
    v1``: the loop plans nothing else meanwhile. ``up a`` (5000) is accepted; ``up b``
    (5000, same role) must not be: a's start is what the next cycle does, and an
    on-demand serve is never another request's victim. The old answer counted only
    what was held (res + v1: 5500 free) and promised b the room a was promised.
    """
    d = daemon
    ports = {n: free_port() for n in ("res", "v1", "a", "b")}
    d.manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 0\n'
        + serve_toml("res", d.name("res"), 4000, "resident", ports["res"], 'desired = "running"')
        + serve_toml(
            "v1",
            d.name("v1"),
            500,
            "evictable",
            ports["v1"],
            'desired = "running"',
            stop_s=300,
            health=False,
        )
        + serve_toml("x", d.name("x"), 100, "on-demand", ports["v1"])
        + serve_toml("a", d.name("a"), 5000, "on-demand", ports["a"])
        + serve_toml("b", d.name("b"), 5000, "on-demand", ports["b"])
    )
    d.create("res", httpd(ports["res"]), running=True)
    d.create("v1", deaf("v1.term"), running=True)
    d.create("x", httpd(ports["v1"]), running=False)
    d.create("a", httpd(ports["a"]), running=False)
    d.create("b", httpd(ports["b"]), running=False)
    d.start()
    wait_for("res + v1 counted", lambda: d.ledger_role()["committed_mib"] == 4500)

    assert d.up("x").status_code == 202
    wait_for("the loop inside docker stop v1", (d.marks / "v1.term").exists)
    r = d.up("a")
    assert r.status_code == 202, r.text
    r = d.up("b")
    assert r.status_code == 429, (r.text, d.logs())
    body = r.json()
    assert "a 5000 MiB (requested, not yet planned)" in body["error"]
    terms = body["gpu_roles"][0]
    assert terms["free_mib"] == 400 and terms["shortfall_mib"] == 4600, terms
    assert {"serve": "a", "mib": 5000, "state": "requested, not yet planned"} in terms[
        "reservations"
    ]
    fit = d.http.get("/v1/fit/b").json()
    assert fit["fits"] is False and fit["gpu_roles"][0]["free_mib"] == 400
    ledger = d.http.get("/v1/ledger").json()
    assert "a" in {p["serve"] for p in ledger["pending"]}
    line = ledger["gpu_roles"][0]
    # held: res + v1 (stopping); promised beside it: x (its reserve follows that stop), a
    assert line["committed_mib"] == 4500 and line["promised_mib"] == 9600, line
    assert {p["serve"] for p in line["pending"]} == {"x", "a"} and not line["overcommitted"]

    d.kill("v1")  # the cycle goes on: x starts; the next one starts a, as promised
    wait_for("x and a running", lambda: d.state("x") == "running" and d.state("a") == "running")
    role = d.ledger_role()
    assert role["committed_mib"] == 9100 and not d.http.get("/v1/ledger").json()["pending"]
    assert d.state("b") == "created"
