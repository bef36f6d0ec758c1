"""The HTTP API of ``vramctl run``, the ``up`` / ``down`` commands and the metrics.

Two layers:

* against the ASGI app (no Docker): a controller that has not cycled yet (503), and
  decisions on scripted observations (409 vs 429, Retry-After, the no-token 503);
* against the real server: ``vramctl run`` in a subprocess with the API on a free
  loopback port, real busybox serve containers (httpd health path), httpx from the
  test. Every status code of the API is seen there, and on-demand requests are
  followed until the containers converge: eviction and back, TTL expiry, a
  controller restart that keeps the request and its TTL, and ``/metrics`` equal to
  the ledger. NVML is unavailable here, so its series must be absent, not 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from docker.errors import NotFound
from prometheus_client.parser import text_string_to_metric_families
from support.cli import api_cycled, run_argv, spawn
from support.manifests import serve_toml
from support.service import controller_on
from support.serving import free_port, httpd
from support.waiting import WAIT_S, wait_for

from controller.interfaces.api import ApiSettings, create_app
from controller.interfaces.client import parse_address
from controller.interfaces.metrics import Metrics
from controller.manifest import load_manifest_set
from controller.service.loop import Controller, CycleSummary, RunOptions
from controller.snapshot import parse_snapshot
from controller.store.journal import Journal, journal_path

TOKEN = "api-test-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]


def manifest_text(prefix: str, ports: dict[str, int]) -> str:
    """Role a: capacity 10000, reserve 1000, budget 9000.

    res (resident, running, 3000) + omni (evictable, running, 4000) = 7000 committed;
    llm (on-demand 5000) fits by evicting omni; big (on-demand 7000) cannot fit even
    with omni evicted (429); alt (on-demand) wants res's port (409); off is desired
    stopped (409).
    """

    def serve(name: str, mib: int, residency: str, port: int, extra: str = "") -> str:
        return serve_toml(name, f"{prefix}{name}", mib, residency, port, extra=extra)

    return (
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 1000\n'
        + serve("res", 3000, "resident", ports["res"], 'desired = "running"')
        + serve("omni", 4000, "evictable", ports["omni"], 'desired = "running"')
        + serve("llm", 5000, "on-demand", ports["llm"])
        + serve("big", 7000, "on-demand", ports["big"])
        + serve("alt", 1000, "on-demand", ports["res"])
        + serve("off", 1000, "on-demand", ports["off"], 'desired = "stopped"')
    )


# ── the ASGI app, no Docker ──────────────────────────────────────────────────


@pytest.fixture
def idle(tmp_path: Path) -> Iterator[Controller]:
    """A controller that has not cycled: its journal is open, nothing observed."""
    ports = {n: 20000 + i for i, n in enumerate(("res", "omni", "llm", "big", "off"))}
    with controller_of(tmp_path, manifest_text("c-", ports)) as controller:
        yield controller


@contextlib.contextmanager
def controller_of(tmp_path: Path, manifest: str) -> Iterator[Controller]:
    """A controller of the manifest ``manifest`` (TOML) that has not cycled: its journal
    open, nothing observed (``observe`` pretends a cycle)."""
    controller = controller_on(tmp_path, manifest)
    try:
        yield controller
    finally:
        controller.journal.close()


class Asgi:
    """httpx straight into the ASGI app, on one event loop (no server, no thread)."""

    def __init__(
        self, controller: Controller, token: str | None, origins: tuple[str, ...] = ()
    ) -> None:
        settings = ApiSettings(token=token, allow_origins=origins, retry_after_s=5.0)
        app = create_app(controller, settings)
        self.runner = asyncio.Runner()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://vramctl"
        )

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.runner.run(self.client.get(path, **kw))

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.runner.run(self.client.post(path, **kw))

    def http(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.runner.run(self.client.request(method, path, **kw))

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.close()


@pytest.fixture
def client() -> Iterator[Callable[..., Asgi]]:
    made: list[Asgi] = []

    def make(
        controller: Controller, *, token: str | None = TOKEN, origins: tuple[str, ...] = ()
    ) -> Asgi:
        made.append(Asgi(controller, token, origins))
        return made[-1]

    yield make
    for c in made:
        c.close()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def observe(controller: Controller, containers: dict[str, Any], docker: str = "ok") -> None:
    """Pretend a cycle observed ``containers`` (serve name -> container fields)."""
    snap = parse_snapshot(
        {
            "docker": docker,
            "containers": {f"c-{k}": v for k, v in containers.items()},
            "gpus": None,
        }
    )
    controller.last = CycleSummary(at=time.time(), snapshot=snap)
    controller.cycles += 1


def test_before_the_first_cycle_fit_and_up_answer_503(
    idle: Controller, client: Callable[..., Asgi]
) -> None:
    c = client(idle)
    r = c.get("/v1/fit/llm")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "no observation yet" in r.json()["error"]
    r = c.post("/v1/serves/llm/up", headers=auth())
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert idle.journal.active_requests() == []
    # reads still answer, with unknown (null) figures, never 0
    ledger = c.get("/v1/ledger").json()
    role = ledger["gpu_roles"][0]
    assert role["budget_mib"] == 9000 and role["committed_mib"] is None
    assert role["free_mib"] is None and ledger["docker"] == "unknown"
    assert c.get("/healthz").json()["status"] == "starting"
    serves = {s["serve"]: s for s in c.get("/v1/serves").json()["serves"]}
    assert serves["llm"]["lifecycle"] == "unknown" and serves["llm"]["request"] is None


def test_decisions_on_an_observation(idle: Controller, client: Callable[..., Asgi]) -> None:
    c = client(idle)
    now = time.time()
    observe(idle, {"res": {"state": "running"}, "omni": {"state": "running", "started_at": now}})
    # 202: llm fits after evicting omni; the request is journaled with its TTL
    r = c.post("/v1/serves/llm/up", json={"ttl_s": 90}, headers=auth())
    assert r.status_code == 202, r.text
    body = r.json()
    assert [(s["action"], s["serve"]) for s in body["steps"]] == [
        ("stop", "omni"),
        ("release", "omni"),
        ("reserve", "llm"),
        ("start", "llm"),
        ("await_ready", "llm"),
    ]
    assert body["fit"]["evict"] == ["omni"] and body["request"]["ttl_s"] == 90
    [req] = idle.journal.active_requests()
    assert (req.serve, req.ttl_s) == ("llm", 90)
    # 429: big cannot fit even with omni evicted; the body names every term, llm's
    # request (accepted, not yet planned) among them: its room frees when its TTL ends
    r = c.post("/v1/serves/big/up", headers=auth())
    assert r.status_code == 429 and r.headers["retry-after"] == "90"
    assert "llm 5000 MiB (requested, not yet planned)" in r.json()["error"]
    # 409: a resident the loop runs already; a port held by a resident; desired stopped
    for serve, words in (
        ("res", "resident and desired running"),
        ("alt", "res (resident: never evicted)"),
        ("off", 'desired = "stopped"'),
    ):
        r = c.post(f"/v1/serves/{serve}/up", headers=auth())
        assert r.status_code == 409, (serve, r.text)
        assert words in r.json()["error"]
    # down: 202 once, then 409 (no active request)
    assert c.post("/v1/serves/llm/down", headers=auth()).status_code == 202
    r = c.post("/v1/serves/llm/down", headers=auth())
    assert r.status_code == 409 and "no active on-demand request" in r.json()["error"]
    # docker unreadable in the last cycle: nothing is admitted (fail closed)
    observe(idle, {}, docker="error")
    r = c.post("/v1/serves/llm/up", headers=auth())
    assert r.status_code == 503 and "docker" in r.json()["error"]


@pytest.mark.parametrize(
    "raw", ["NaN", "Infinity", "-Infinity", "1e309", "-1e309", "1e300", "0", "true", "[1]"]
)
def test_a_ttl_that_is_not_a_finite_number_in_range_is_a_clean_422(
    idle: Controller, client: Callable[..., Asgi], raw: str
) -> None:
    """Python's JSON reader takes NaN / Infinity / 1e309 (inf): the answer is still JSON."""
    observe(idle, {"res": {"state": "running"}})
    r = client(idle).post(
        "/v1/serves/llm/up",
        content=f'{{"ttl_s": {raw}}}',
        headers={**auth(), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    body = r.json()  # strict JSON: no NaN / Infinity tokens in the answer
    json.loads(r.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert body["error"].startswith("invalid request: ttl_s: "), body
    assert body["problems"] and all(p.startswith("ttl_s: ") for p in body["problems"])
    assert idle.journal.active_requests() == []


def test_a_protected_serve_inside_min_runtime_gives_429_with_its_remaining_time(
    tmp_path: Path, client: Callable[..., Asgi]
) -> None:
    path = tmp_path / "m.toml"
    path.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\nreserve_mib = 0\n'
        '[[serve]]\nname = "fresh"\ncontainer = "c-fresh"\ngpu_role = "a"\nvram_mib = 800\n'
        'residency = "evictable"\nport = 9001\nmin_runtime_s = 600\n'
        '[[serve]]\nname = "od"\ncontainer = "c-od"\ngpu_role = "a"\nvram_mib = 500\n'
        'residency = "on-demand"\nport = 9002\n'
    )
    mset = load_manifest_set([path])
    controller = Controller(RunOptions(manifests=(path,), state_dir=tmp_path / "s"), mset)
    controller.journal = Journal.open(journal_path(controller.state_dir))
    try:
        observe(controller, {"fresh": {"state": "running", "started_at": time.time() - 100}})
        r = client(controller).post("/v1/serves/od/up", headers=auth())
        assert r.status_code == 429, r.text
        assert 495 <= int(r.headers["retry-after"]) <= 501
        assert r.json()["protected"][0]["serve"] == "fresh"
    finally:
        controller.journal.close()


def test_exclusive_serve_blocked_by_a_resident_is_409(
    tmp_path: Path, client: Callable[..., Asgi]
) -> None:
    path = tmp_path / "m.toml"
    path.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 0\n'
        '[[gpu_roles]]\nid = "b"\nvram_mib = 10000\nreserve_mib = 0\n'
        '[[serve]]\nname = "emb"\ncontainer = "c-emb"\ngpu_role = "a"\nvram_mib = 1000\n'
        'residency = "resident"\nport = 9001\n'
        '[[serve]]\nname = "tp2"\ncontainer = "c-tp2"\ngpu_roles = ["a", "b"]\n'
        'vram_mib = 5000\nresidency = "on-demand"\nport = 9002\n'
        'operating_mode = "dual-gpu-exclusive"\ntensor_parallel_size = 2\n'
    )
    mset = load_manifest_set([path])
    controller = Controller(RunOptions(manifests=(path,), state_dir=tmp_path / "s"), mset)
    controller.journal = Journal.open(journal_path(controller.state_dir))
    try:
        observe(controller, {"emb": {"state": "running"}})
        r = client(controller).post("/v1/serves/tp2/up", headers=auth())
        assert r.status_code == 409, r.text
        body = r.json()
        assert "emb" in body["error"] and body["blockers"] == ["emb"]
        assert controller.journal.active_requests() == []
    finally:
        controller.journal.close()


def test_without_a_configured_token_changes_are_refused_with_how_to_fix(
    idle: Controller, client: Callable[..., Asgi]
) -> None:
    observe(idle, {"res": {"state": "running"}})
    c = client(idle, token=None)
    for headers in ({}, auth()):
        r = c.post("/v1/serves/llm/up", headers=headers)
        assert r.status_code == 503
        assert "--token-file" in r.json()["error"] and "VRAMCTL_TOKEN" in r.json()["error"]
    assert idle.journal.active_requests() == []
    assert c.get("/v1/fit/llm").status_code == 200  # reads need no token


def test_only_listed_origins_are_served(idle: Controller, client: Callable[..., Asgi]) -> None:
    observe(idle, {"res": {"state": "running"}})
    c = client(idle, origins=("http://dash.local",))
    r = c.post("/v1/serves/llm/up", headers={**auth(), "Origin": "http://dash.local"})
    assert r.status_code == 202 and r.headers["access-control-allow-origin"] == "http://dash.local"
    for origin in ("http://dash.local:8080", "null", "http://evil.example"):
        r = c.post("/v1/serves/llm/down", headers={**auth(), "Origin": origin})
        assert r.status_code == 403, origin
    preflight = {"Origin": "http://dash.local", "Access-Control-Request-Method": "POST"}
    assert c.http("OPTIONS", "/v1/serves/llm/up", headers=preflight).status_code == 200


def test_metrics_series_are_absent_when_unknown_never_zero(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 1000\nuuid = "GPU-0"\n'
        '[[serve]]\nname = "emb"\ncontainer = "c-emb"\ngpu_role = "a"\nvram_mib = 3000\n'
        'residency = "resident"\nport = 9001\n'
    )
    controller = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "s"), load_manifest_set([path])
    )
    metrics = Metrics()
    gpu = {"uuid": "GPU-0", "index": 0, "total_mib": 10240, "used_mib": 3500, "free_mib": 6740}

    def cycle(docker: str, gpus: list[dict[str, Any]] | None) -> dict[Any, float]:
        snap = parse_snapshot(
            {"docker": docker, "containers": {"c-emb": {"state": "running"}}, "gpus": gpus}
        )
        controller.last = CycleSummary(at=time.time(), snapshot=snap)
        metrics.on_cycle(controller)
        return prom(metrics.render().decode())

    a, emb = (("role", "a"),), (("serve", "emb"),)
    m = cycle("ok", [gpu])
    assert m[("vramctl_role_committed_mib", a)] == 3000
    assert m[("vramctl_role_nvml_used_mib", a)] == 3500
    assert m[("vramctl_role_drift_mib", a)] == 500
    assert m[("vramctl_serve_committed_mib", emb)] == 3000
    m = cycle("error", None)  # docker unreadable, NVML gone: absent, not 0
    for name in ("committed", "free", "nvml_used", "drift"):
        assert (f"vramctl_role_{name}_mib", a) not in m, name
    assert ("vramctl_serve_committed_mib", emb) not in m
    assert m[("vramctl_role_budget_mib", a)] == 9000
    assert m[("vramctl_serve_state", (("serve", "emb"), ("state", "unknown")))] == 1
    assert m[("vramctl_observation_errors_total", (("source", "docker"),))] == 1
    assert m[("vramctl_observation_errors_total", (("source", "nvml"),))] == 1
    assert m[("vramctl_cycles_total", ())] == 2


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:8477") == ("127.0.0.1", 8477)
    assert parse_address("[::1]:9000") == ("::1", 9000)
    assert parse_address("http://localhost:1/") == ("localhost", 1)
    for bad in ("8477", "host:port", "::1:80", "h:70000"):
        with pytest.raises(Exception, match="--api"):
            parse_address(bad)


# ── the real server ──────────────────────────────────────────────────────────


def vramctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.interfaces.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS="200", NO_COLOR="1", **(env or {})),
        cwd=ROOT,
        timeout=60,
        check=False,
    )


class Live:
    """``vramctl run`` in a subprocess over real containers; httpx to its API."""

    def __init__(self, client: docker.DockerClient, image: str, tmp: Path) -> None:
        self.docker = client
        self.image = image
        self.tmp = tmp
        self.prefix = f"vramctl-test-{uuid.uuid4().hex[:8]}-"
        self.ports = {n: free_port() for n in ("res", "omni", "llm", "big", "off")}
        self.api_port = free_port()
        self.address = f"127.0.0.1:{self.api_port}"
        self.url = f"http://{self.address}"
        self.manifest = tmp / "serves.toml"
        self.manifest.write_text(manifest_text(self.prefix, self.ports))
        self.token_file = tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.log = tmp / "run.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=30.0, trust_env=False)
        self.created: list[str] = []

    def create(self, serve: str, *, running: bool, port: str | None = None) -> None:
        c = self.docker.containers.create(
            self.image,
            httpd(self.ports[port or serve]),
            name=f"{self.prefix}{serve}",
            init=True,
            network_mode="host",
            labels={"vramctl.test": "1"},
        )
        self.created.append(str(c.name))
        if running:
            c.start()

    def container(self, serve: str) -> Any:
        return self.docker.containers.get(f"{self.prefix}{serve}")

    def state(self, serve: str) -> str:
        return str(self.container(serve).status)

    def started_at(self, serve: str) -> str:
        self.container(serve).reload()
        return str(self.container(serve).attrs["State"]["StartedAt"])

    def start(self) -> None:
        flags = ("--api", self.address, "--token-file", str(self.token_file))
        argv = run_argv(self.manifest, self.tmp / "state", *flags)
        self.proc = spawn(argv, self.log, cwd=ROOT)
        wait_for("the API's first cycle", self._cycled)

    def _cycled(self) -> bool:
        assert self.proc is not None
        return api_cycled(self.proc, self.http, self.logs)

    def cycled(self, n: int) -> None:
        """Wait until ``n`` whole cycles ran after this call (``/healthz``'s count; the one
        under way may have begun before it, so it does not count)."""
        under_way = int(self.http.get("/healthz").json()["cycles"]) + 1
        wait_for(
            f"{n} more cycles",
            lambda: self._cycled() and self.http.get("/healthz").json()["cycles"] >= under_way + n,
        )

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"vramctl run ignored SIGTERM:\n{self.logs()}") from None
        finally:
            self.proc = None

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop_reasons(self, serve: str) -> list[str]:
        """Why each plan the loop journaled stopped ``serve``, oldest first."""
        with Journal.open(journal_path(self.tmp / "state"), readonly=True) as journal:
            return [
                str(step["reason"])
                for cycle in journal.cycles()
                for step in cycle.plan.get("steps", [])
                if step["action"] == "stop" and step["serve"] == serve
            ]

    def post(self, path: str, body: Any = None, **headers: str) -> httpx.Response:
        h = {"Authorization": f"Bearer {TOKEN}", **headers}
        return self.http.post(path, json=body, headers=h)

    def committed(self) -> int | None:
        value = self.http.get("/v1/ledger").json()["gpu_roles"][0]["committed_mib"]
        return None if value is None else int(value)

    def serves(self) -> dict[str, dict[str, Any]]:
        return {s["serve"]: s for s in self.http.get("/v1/serves").json()["serves"]}

    def converged(self, **states: str) -> None:
        """Wait until each serve's container is ``running`` or ``down`` (created / exited)."""

        def ok(serve: str, want: str) -> bool:
            got = self.state(serve)
            return got in ("created", "exited") if want == "down" else got == want

        wait_for(
            f"containers {states}",
            lambda: all(ok(s, w) for s, w in states.items()),
            seen=lambda: {s: self.state(s) for s in states},
        )

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.http.close()
        for name in self.created:
            with contextlib.suppress(NotFound):
                self.docker.containers.get(name).remove(force=True)


@pytest.fixture(scope="module")
def live(
    docker_client: docker.DockerClient, test_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    lv = Live(docker_client, test_image, tmp_path_factory.mktemp("api"))
    try:
        lv.create("res", running=True)
        lv.create("omni", running=True)
        lv.create("llm", running=False)
        lv.create("big", running=False)
        lv.create("alt", running=False, port="res")
        lv.create("off", running=False)
        lv.start()
        yield lv
    finally:
        lv.close()


@pytest.fixture
def calm(live: Live) -> Live:
    """Each test starts from res + omni running, llm down, no request."""
    live.converged(res="running", omni="running", llm="down")
    wait_for("no request", lambda: live.serves()["llm"]["request"] is None)
    # a start in progress (the restored omni awaiting health) is not evicted: wait it out
    wait_for(
        "no start in progress",
        lambda: all(s["lifecycle"] != "starting" for s in live.serves().values()),
        seen=lambda: {n: s["lifecycle"] for n, s in live.serves().items()},
    )
    wait_for("the loop to see it", lambda: live.committed() == 7000, seen=live.committed)
    return live


@pytest.mark.docker
def test_every_refusal_against_the_running_server(calm: Live) -> None:
    lv = calm
    # 401 without a token, 403 with a wrong one, 403 for a foreign Origin
    r = lv.http.post("/v1/serves/llm/up")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = lv.http.post("/v1/serves/llm/up", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403 and "wrong" in r.json()["error"]
    r = lv.post("/v1/serves/llm/up", Origin="http://evil.example")
    assert r.status_code == 403 and "origin" in r.json()["error"]
    r = lv.http.get("/v1/ledger", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    # 403 for a Host that is not the loopback address it listens on (DNS rebinding)
    r = lv.http.get("/v1/ledger", headers={"Host": "evil.example:8477"})
    assert r.status_code == 403 and "host" in r.json()["error"]
    # 422: bodies are validated, with a readable message
    r = lv.post("/v1/serves/llm/up", {"ttl_s": -5})
    assert r.status_code == 422 and "ttl_s: Input should be greater than 0" in r.json()["error"]
    r = lv.post("/v1/serves/llm/up", {"ttl_s": "60"})
    assert r.status_code == 422 and "ttl_s" in r.json()["error"]
    r = lv.post("/v1/serves/llm/up", {"ttl": 60})
    assert r.status_code == 422 and "ttl: Extra inputs are not permitted" in r.json()["error"]
    # 404: no such serve (and nothing named by a request is run)
    for method, path in (
        ("POST", "/v1/serves/lmm/up"),
        ("POST", "/v1/serves/nope/down"),
        ("GET", "/v1/fit/nope"),
    ):
        r = lv.http.request(method, path, headers=auth())
        assert r.status_code == 404, (path, r.text)
    assert 'did you mean "llm"' in lv.post("/v1/serves/lmm/up").json()["error"]
    # 409: resident already run by the loop; port held by a resident; desired stopped
    assert lv.post("/v1/serves/res/up").status_code == 409
    r = lv.post("/v1/serves/alt/up")
    assert r.status_code == 409 and r.json()["blockers"] == ["res"]
    assert lv.post("/v1/serves/off/up").status_code == 409
    r = lv.post("/v1/serves/llm/down")
    assert r.status_code == 409 and "no active on-demand request" in r.json()["error"]
    # 429: big does not fit even with omni evicted; every term, decided before any stop
    r = lv.post("/v1/serves/big/up", {"ttl_s": 60})
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1"  # the resync period
    body = r.json()
    [role] = body["gpu_roles"]
    assert {k: role[k] for k in role if k != "reservations"} == {
        "gpu_role": "a",
        "capacity_mib": 10000,
        "reserve_mib": 1000,
        "budget_mib": 9000,
        "committed_mib": 7000,
        "free_mib": 2000,
        "requested_mib": 7000,
        "shortfall_mib": 5000,
    }
    assert role["reservations"] == [{"serve": "omni", "mib": 4000}, {"serve": "res", "mib": 3000}]
    assert body["evictable_mib"] == {"a": 4000}
    assert [(p["serve"], p["mib"]) for p in body["protected"]] == [("res", 3000)]
    assert body["fits"] is False and "short 5000" in body["error"]
    assert lv.state("omni") == "running" and lv.state("big") == "created"
    assert lv.serves()["big"]["request"] is None
    # GET /v1/fit is the same answer, without side effects
    fit = lv.http.get("/v1/fit/big").json()
    assert fit["fits"] is False and fit["gpu_roles"] == body["gpu_roles"]
    assert lv.http.get("/v1/fit/llm").json()["evict"] == ["omni"]


@pytest.mark.docker
def test_up_evicts_and_down_brings_the_neighbour_back(calm: Live) -> None:
    lv = calm
    r = lv.post("/v1/serves/llm/up", {"ttl_s": 120})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["fit"]["evict"] == ["omni"]
    assert ("stop", "omni") in [(s["action"], s["serve"]) for s in body["steps"]]
    assert body["request"]["ttl_s"] == 120
    lv.converged(llm="running", omni="down", res="running")
    req = lv.serves()["llm"]["request"]
    assert req["ttl_s"] == 120 and 100 < req["expires_in_s"] <= 120
    r = lv.post("/v1/serves/llm/down")
    assert r.status_code == 202 and r.json()["ended"] is True
    lv.converged(llm="down", omni="running")
    wait_for("the request ended", lambda: lv.serves()["llm"]["request"] is None)


@pytest.mark.docker
def test_ttl_expiry_stops_the_serve_and_restores_evicted(calm: Live) -> None:
    lv = calm
    # the TTL runs from the request: under load the start may take most of a short
    # one, and the running window would pass between two polls
    r = lv.post("/v1/serves/llm/up", {"ttl_s": 8})
    assert r.status_code == 202, r.text
    lv.converged(llm="running", omni="down")
    lv.converged(llm="down", omni="running")
    wait_for("the request ended", lambda: lv.serves()["llm"]["request"] is None)


@pytest.mark.docker
def test_cli_up_and_down_talk_to_the_running_loop(calm: Live) -> None:
    lv = calm
    common = ["--api", lv.address, "--token-file", str(lv.token_file)]
    r = vramctl("up", "big", *common)
    assert r.returncode == 1
    assert "429" in r.stderr and "short 5000" in r.stderr and "evictable" in r.stderr
    assert r.stderr.count("capacity") == 1, r.stderr  # the arithmetic once, not twice
    r = vramctl("up", "llm", "--ttl", "300", "--json", *common)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["request"]["ttl_s"] == 300
    lv.converged(llm="running", omni="down")
    # status reads the loop's requests from its journal: who runs on one, who made room
    r = vramctl("status", "-m", str(lv.manifest), "--state-dir", str(lv.tmp / "state"))
    assert r.returncode == 0, r.stderr
    cells = [line.replace("│", " ").split() for line in r.stdout.splitlines()]
    rows: dict[str, str] = {}
    for c in cells:  # the serves table's row: the first that names the serve
        if c and c[0] in ("llm", "omni"):
            rows.setdefault(c[0], " ".join(c))
    assert "running (request)" in rows["llm"] and "unmanaged" not in rows["llm"], r.stdout
    assert "running (evicted for llm)" in rows["omni"], r.stdout
    # the address and token from the environment as well
    env = {"VRAMCTL_API": lv.address, "VRAMCTL_TOKEN": TOKEN}
    r = vramctl("down", "llm", env=env)
    assert r.returncode == 0 and "accepted" in r.stdout, r.stderr
    lv.converged(llm="down", omni="running")
    # the journal says why llm was stopped: its request was released, not its TTL run out
    why = lv.stop_reasons("llm")[-1]
    assert "released" in why and "expired" not in why and "TTL" not in why, why
    r = vramctl("down", "llm", env=env)
    assert r.returncode == 1 and "409" in r.stderr


@pytest.mark.docker
def test_a_restart_keeps_the_request_and_its_ttl(calm: Live) -> None:
    lv = calm
    assert lv.post("/v1/serves/llm/up", {"ttl_s": 600}).status_code == 202
    lv.converged(llm="running", omni="down")
    before = lv.serves()["llm"]["request"]
    started = lv.started_at("llm")
    assert lv.stop() == 0  # SIGTERM: the loop stops, the API with it
    with pytest.raises(httpx.ConnectError):
        lv.http.get("/healthz")
    assert lv.state("llm") == "running"  # stopping the controller stops no serve
    lv.start()
    after = lv.serves()["llm"]["request"]
    assert after["requested_at"] == before["requested_at"] and after["ttl_s"] == 600
    lv.cycled(2)  # two more cycles: nothing started twice, omni not backfilled
    assert lv.started_at("llm") == started and lv.state("omni") == "exited"
    assert lv.post("/v1/serves/llm/down").status_code == 202
    lv.converged(llm="down", omni="running")


def prom(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.docker
def test_metrics_equal_the_ledger_after_a_real_cycle(calm: Live) -> None:
    lv = calm
    for _ in range(20):  # both read from the same cycle
        ledger = lv.http.get("/v1/ledger").json()
        text = lv.http.get("/metrics").text
        again = lv.http.get("/v1/ledger").json()
        if ledger["observed_at"] == again["observed_at"]:
            break
    m = prom(text)
    assert m[("vramctl_last_cycle_timestamp_seconds", ())] == pytest.approx(ledger["observed_at"])
    [role] = ledger["gpu_roles"]
    a = (("role", "a"),)
    for key in ("capacity_mib", "reserve_mib", "budget_mib", "committed_mib", "free_mib"):
        assert m[(f"vramctl_role_{key}", a)] == role[key], key
    assert role["committed_mib"] == 7000 and role["free_mib"] == 2000
    held = {r["serve"]: r["mib"] for r in role["reservations"]}
    for serve, row in lv.serves().items():
        s = (("serve", serve),)
        assert m[("vramctl_serve_reservation_mib", s)] == row["reservation_mib"]
        assert m[("vramctl_serve_committed_mib", s)] == held.get(serve, 0)
        assert m[("vramctl_serve_state", (("serve", serve), ("state", row["lifecycle"])))] == 1
    # NVML is unavailable here: its series are absent, not 0
    assert role["nvml_used_mib"] is None
    assert not [k for k in m if k[0] in ("vramctl_role_nvml_used_mib", "vramctl_role_drift_mib")]
    assert m[("vramctl_observation_up", (("source", "nvml"),))] == 0
    assert m[("vramctl_observation_up", (("source", "docker"),))] == 1
    assert m[("vramctl_cycles_total", ())] >= 1
    assert m[("vramctl_reconcile_duration_seconds_count", ())] >= 1


# ── the CLI and the server's start-up, no Docker needed ──────────────────────


def test_up_and_down_refuse_when_no_loop_runs() -> None:
    port = free_port()
    for args in (("up", "llm", "--ttl", "5"), ("down", "llm")):
        r = vramctl(*args, "--api", f"127.0.0.1:{port}", env={"VRAMCTL_TOKEN": TOKEN})
        assert r.returncode == 1
        assert f"no vramctl run answers at http://127.0.0.1:{port}" in r.stderr
        assert "never act on their own" in r.stderr and "Traceback" not in r.stderr


def test_run_exits_clearly_when_the_api_port_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    ports = {n: 20000 + i for i, n in enumerate(("res", "omni", "llm", "big", "off"))}
    path.write_text(manifest_text("c-", ports))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = vramctl(
            "run", "-m", str(path), "--state-dir", str(tmp_path / "s"), "--api", f"127.0.0.1:{port}"
        )
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "in use" in r.stderr
    assert not (tmp_path / "s").exists()  # nothing started: no lock, no journal


@pytest.mark.parametrize(
    ("host", "bind", "ok"),
    [
        ("127.0.0.1:8477", "127.0.0.1", True),
        ("localhost:8477", "127.0.0.1", True),
        ("[::1]:8477", "::1", True),
        ("evil.example:8477", "127.0.0.1", False),
        ("evil.example", "127.0.0.1", False),
        (None, "127.0.0.1", True),
        ("router.lan:8477", "10.0.0.5", True),
    ],
    ids=["loopback", "localhost", "ipv6", "rebinding", "rebinding-no-port", "no-host", "lan"],
)
def test_host_header_guard_against_dns_rebinding(host: str | None, bind: str, ok: bool) -> None:
    from controller.interfaces.api import host_allowed

    assert host_allowed(host, bind) is ok


def test_manifest_errors_without_a_location_are_withheld_whole() -> None:
    """A manifest error the loop could not locate is never shown as text without the token."""
    from controller.interfaces.api import public_manifest_errors
    from controller.manifest import LocatedError

    lines = ['serves.toml: serve "a" (#1): up: must be a string, got "s3cr3t"']
    [shown] = public_manifest_errors(lines, [])
    assert "s3cr3t" not in shown and "invalid" in shown
    located = [LocatedError("serves.toml", "a", "up", 'must be a string, got "s3cr3t"', index=1)]
    assert public_manifest_errors(lines, located) == [
        'serves.toml: serve "a" (#1): up: invalid (the reason is shown with the API token, '
        "and in the log)"
    ]


def test_a_world_readable_token_file_is_warned_about(tmp_path: Path) -> None:
    from loguru import logger

    from controller.interfaces.client import load_token

    said: list[str] = []
    sink = logger.add(lambda m: said.append(str(m)), level="WARNING", format="{message}")
    try:
        private = tmp_path / "private"
        private.write_text(TOKEN)
        private.chmod(0o600)
        assert load_token(private) == TOKEN and said == []
        shared = tmp_path / "shared"
        shared.write_text(TOKEN)
        shared.chmod(0o644)
        assert load_token(shared) == TOKEN  # still used: the warning says how to fix it
    finally:
        logger.remove(sink)
    [line] = said
    assert str(shared) in line and "0644" in line and "chmod 600" in line
    assert TOKEN not in line
