"""End to end: plans carried out on the real Docker daemon.

Serves are busybox containers serving a health path with httpd on loopback; the
router and the elastic endpoint are small HTTP servers on loopback that record what
they were asked (tests/fake_http.py); NVML is the scripted fake driven through the
real adapter, its device usage following which serve containers really run.
After every execution the executor's ledger must equal what the host really holds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import NotFound
from fake_http import Card, ElasticEngine, FakeRouter
from support.cli import cli_env, run_cli
from support.fakes_nvml import FakeDevice, FakeNvml, FakeProc
from support.manifests import serve_toml as serve_text
from support.serving import free_port, httpd

from controller.adapters.docker.read import ContainerObserver, manifest_containers
from controller.adapters.router import QUIESCE_REASON
from controller.manifest import ManifestSet, load_manifest_set
from controller.service.executor import ExecutionReport, ExecutorConfig
from controller.service.observe import observe_host
from controller.service.wiring import make_executor, read_gpus
from statemachine.domain.types import GpuObs, Observed, OnDemandRequest
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import (
    Plan,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

pytestmark = pytest.mark.docker

MIB = 2**20
TOKEN = "router-secret"


@dataclass
class Host:
    """One test's host: its containers, manifest, fake router and NVML."""

    client: docker.DockerClient
    image: str
    tmp: Path
    prefix: str
    router: FakeRouter
    nvml: FakeNvml
    created: list[str]
    pids: dict[int, str] = field(default_factory=dict)
    elastic: dict[str, int] = field(default_factory=dict)  # what the loop would journal

    def name(self, serve: str) -> str:
        return f"{self.prefix}{serve}"

    def container(
        self,
        serve: str,
        *,
        port: int,
        running: bool,
        command: list[str] | None = None,
        **options: Any,
    ) -> None:
        c = self.client.containers.create(
            self.image,
            command or httpd(port),
            name=self.name(serve),
            init=True,
            network_mode="host",
            labels={"vramctl.test": "1"},
            **options,
        )
        self.created.append(c.name)
        if running:
            c.start()

    def state(self, serve: str) -> str:
        return str(self.client.containers.get(self.name(serve)).status)

    def manifest(self, body: str) -> ManifestSet:
        path = self.tmp / "serves.toml"
        path.write_text(body.replace("@", self.prefix))
        return load_manifest_set([path])

    def observe(self, mset: ManifestSet) -> Observed:
        self.drive_nvml(mset)
        observer = ContainerObserver(self.client)
        snap = observe_host(
            manifest_containers(mset.serves),
            observer=observer,
            nvml=self.nvml,
            pid_to_container=self.pids.get,
        )
        return replace(snap.to_observed(), elastic_mib=dict(self.elastic))

    def drive_nvml(self, mset: ManifestSet) -> None:
        """The scripted driver: each running serve container has one process on the
        device using 60% of its reservation (serves need not use all they reserve)."""
        used = 300  # the driver's own context
        procs = []
        self.pids.clear()
        for i, s in enumerate(mset.desired().serves.values()):
            try:
                c = self.client.containers.get(s.container)
            except NotFound:
                continue
            if c.status != "running" or not s.vram_mib:
                continue
            pid = 40_000 + i
            self.pids[pid] = c.id
            procs.append(FakeProc(pid=pid, usedGpuMemory=s.vram_mib * 6 // 10 * MIB))
            used += s.vram_mib * 6 // 10
        self.nvml.devices[0].used = used * MIB
        self.nvml.devices[0].compute = procs

    def gpus_for(self, mset: ManifestSet) -> Callable[[], tuple[GpuObs, ...] | None]:
        """NVML through the real adapter; device usage follows the running containers."""

        def read() -> tuple[GpuObs, ...] | None:
            self.drive_nvml(mset)
            return read_gpus(self.nvml)

        return read

    def execute(
        self,
        mset: ManifestSet,
        *,
        requests: tuple[OnDemandRequest, ...] = (),
        policy: Policy | None = None,
        config: ExecutorConfig | None = None,
        quiesced: frozenset[str] = frozenset(),
    ) -> tuple[Plan, ExecutionReport, Observed]:
        """Plan and execute one cycle; ``quiesced``: the tiers the loop remembers as left
        quiesced (it hands them to the planner with the observation)."""
        desired = replace(mset.desired(), requests=requests)
        observed = replace(self.observe(mset), quiesced=quiesced)
        plan = plan_transitions(desired, observed, policy or Policy(), time.time())
        executor = make_executor(
            mset,
            router_url=self.router.url,
            router_token_file=None,
            gpus=self.gpus_for(mset),
            config=config or ExecutorConfig(poll_s=0.1, memory_wait_s=5.0),
        )
        executor.desired = desired
        report = executor.execute(plan, observed)
        for serve, figure in report.elastic.items():  # as the loop journals them
            if figure.mib is None:
                self.elastic.pop(serve, None)
            else:
                self.elastic[serve] = figure.mib
        after = self.observe(mset)
        host = ledger_from_observed(desired, after)
        for role in desired.roles:
            assert report.ledger.committed_mib(role) == host.committed_mib(role), (
                f"{role}: executor ledger {report.ledger.holdings} != host {host.holdings}"
            )
        return plan, report, after


@pytest.fixture
def host(
    docker_client: docker.DockerClient,
    test_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Host]:
    monkeypatch.setenv("VRAMCTL_ROUTER_TOKEN", TOKEN)
    nvml = FakeNvml([FakeDevice(uuid="GPU-e2e-0", total=10_000 * MIB)])
    prefix = f"vramctl-test-{uuid.uuid4().hex[:8]}-"
    with FakeRouter(token=TOKEN, tiers=["fast-local", "omni-local"]) as router:
        h = Host(docker_client, test_image, tmp_path, prefix, router, nvml, [])
        yield h
    for name in h.created:
        with contextlib.suppress(NotFound):
            docker_client.containers.get(name).remove(force=True)


ROLE = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0
uuid = "GPU-e2e-0"
"""


def serve_toml(name: str, *, mib: int, residency: str, port: int, extra: str = "") -> str:
    more = f"drain_timeout_s = 7\n{extra}"
    return serve_text(name, f"@{name}", mib, residency, port, start_timeout_s=60, extra=more)


def actions(report: ExecutionReport) -> list[str]:
    return [f"{r.step.action} {r.step.serve} {r.outcome}" for r in report.results]


def test_on_demand_start_evicts_in_order(host: Host) -> None:
    p_omni, p_llm = free_port(), free_port()
    mset = host.manifest(
        ROLE
        + serve_toml(
            "omni",
            mib=6000,
            residency="evictable",
            port=p_omni,
            extra='desired = "running"\nrouter_tier = "omni-local"',
        )
        + serve_toml(
            "llm", mib=6000, residency="on-demand", port=p_llm, extra='router_tier = "fast-local"'
        )
    )
    host.container("omni", port=p_omni, running=True)
    host.container("llm", port=p_llm, running=False)
    # llm was stopped by an earlier eviction: its tier is still quiesced by vramctl
    host.router.quiesce_as("fast-local", QUIESCE_REASON)

    _, report, _ = host.execute(mset, requests=(OnDemandRequest("llm", time.time()),))

    assert actions(report) == [
        "quiesce omni ok",
        "drain omni ok",
        "stop omni ok",
        "release omni ok",
        "reserve llm ok",
        "start llm ok",
        "await_ready llm ok",
        "readmit llm ok",
    ]
    # the router saw exactly quiesce, drain (with the serve's drain timeout), readmit
    assert host.router.actions() == [
        ("quiesce", "omni-local"),
        ("drain", "omni-local"),
        ("readmit", "fast-local"),
    ]
    drain = host.router.transitions[1].json
    assert drain["timeout"] == 7 and drain["confirm"] is True and drain["dry_run"] is False
    assert all(t.bearer == TOKEN for t in host.router.transitions)
    by = {r.step.action: r for r in report.results if r.step.serve == "llm"}
    assert f"127.0.0.1:{p_llm}/health: 2xx" in by["await_ready"].detail
    release = next(r for r in report.results if str(r.step.action) == "release")
    assert "NVML shows its 3600 MiB back" in release.detail  # 60% of 6000 was in use
    assert host.state("omni") == "exited"  # stopped, kept
    assert host.state("llm") == "running"
    assert report.lifecycles == {"omni": "stopped", "llm": "running"}
    assert host.router.tier("fast-local")["state"] == "admitting"
    assert host.router.tier("omni-local")["reason"] == QUIESCE_REASON  # stopped: left so


def test_drain_timeout_stops_nothing_and_readmits(host: Host) -> None:
    p_omni, p_llm = free_port(), free_port()
    mset = host.manifest(
        ROLE
        + serve_toml(
            "omni", mib=6000, residency="evictable", port=p_omni, extra='router_tier = "omni-local"'
        )
        + serve_toml("llm", mib=6000, residency="on-demand", port=p_llm)
    )
    host.container("omni", port=p_omni, running=True)
    host.container("llm", port=p_llm, running=False)
    host.router.script_drain("omni-local", timed_out=True)

    _, report, _ = host.execute(mset, requests=(OnDemandRequest("llm", time.time()),))

    assert actions(report) == [
        "quiesce omni ok",
        "drain omni aborted",
        "stop omni skipped",
        "release omni skipped",
        "reserve llm skipped",
        "start llm skipped",
        "await_ready llm skipped",
    ]
    assert host.router.actions() == [
        ("quiesce", "omni-local"),
        ("drain", "omni-local"),
        ("readmit", "omni-local"),
    ]
    assert host.state("omni") == "running"
    assert host.state("llm") == "created"
    assert report.lifecycles["omni"] == "running"


def test_start_that_exits_at_once_fails_fast_with_logs(host: Host) -> None:
    port = free_port()
    mset = host.manifest(
        ROLE
        + serve_toml("ocr", mib=3000, residency="resident", port=port, extra='desired = "running"')
    )
    host.container(
        "ocr",
        port=port,
        running=False,
        command=["sh", "-c", "echo 'CUDA out of memory: boom' >&2; exit 3"],
    )

    t0 = time.monotonic()
    _, report, _ = host.execute(mset)
    elapsed = time.monotonic() - t0

    assert actions(report) == ["reserve ocr ok", "start ocr ok", "await_ready ocr failed"]
    failed = report.results[-1]
    assert "exited (3)" in failed.detail
    assert failed.logs is not None and "CUDA out of memory: boom" in failed.logs
    assert elapsed < 30, f"waited {elapsed:.0f}s: the start should fail at once, not time out"
    assert host.state("ocr") == "exited"  # kept for the operator
    assert not report.ledger.holds("ocr")
    assert report.lifecycles["ocr"] == "failed"


def test_docker_error_mid_plan_keeps_the_ledger_true(host: Host) -> None:
    p_omni, p_llm = free_port(), free_port()
    mset = host.manifest(
        ROLE
        + serve_toml("omni", mib=6000, residency="evictable", port=p_omni)
        + serve_toml("llm", mib=6000, residency="on-demand", port=p_llm)
    )
    host.container("omni", port=p_omni, running=True)
    # the daemon refuses to start this one: its device does not exist on the host
    host.container("llm", port=p_llm, running=False, devices=["/dev/no-such-gpu:/dev/nvidia0"])

    _, report, _ = host.execute(mset, requests=(OnDemandRequest("llm", time.time()),))

    assert actions(report) == [
        "stop omni ok",
        "release omni ok",
        "reserve llm ok",
        "start llm failed",
        "await_ready llm skipped",
    ]
    assert "no-such-gpu" in report.results[3].detail
    assert not report.ledger.holds("llm") and not report.ledger.holds("omni")
    assert report.ledger.committed_mib("a") == 0
    assert report.lifecycles["llm"] == "failed"


def test_elastic_shrink_half_succeeds(host: Host) -> None:
    p_moe, p_llm = free_port(), free_port()
    # moe's engine: 3392 MiB of weights and K/V plus a 4608 MiB expert cache (9 segments)
    # that it cannot shrink below 3072 MiB; its card is as full as NVML says
    card = Card(10_000, other_used_mib=300)
    with ElasticEngine(card, fixed_mib=3392, cache_full_mib=4608, floor_cache_mib=3072) as engine:
        mset = host.manifest(
            ROLE
            + serve_toml(
                "moe",
                mib=8000,
                residency="evictable",
                port=p_moe,
                extra=f'elastic = {{ url = "{engine.url}", floor_mib = 2000 }}',
            )
            + serve_toml("llm", mib=4000, residency="on-demand", port=p_llm)
        )
        host.container("moe", port=p_moe, running=True)
        host.container("llm", port=p_llm, running=False)
        # budget 10000, committed 8000: llm is 2000 short, 4 segments (2048) of moe's.
        # NVML: 10000 total, 300 + 60% of 8000 = 5100 used -> 4900 free; the shrink
        # gives back 2048, so it asks the engine to leave 6948 free.
        request = (OnDemandRequest("llm", time.time()),)
        plan, report, _ = host.execute(mset, requests=request)

        assert f"{plan.steps[0].action} {plan.steps[0].serve}" == "shrink moe"
        assert actions(report)[:2] == ["shrink moe failed", "reserve llm skipped"]
        assert "gives back 1536 MiB, the plan needs 2048" in report.results[0].detail
        # it asked for the room once, and did not grow it back (undo) afterwards
        assert engine.reserves() == [6948]
        # what its cache gave back (3 segments) is credited, no more
        assert report.ledger.holdings["moe"].mib == 8000 - 1536 >= engine.used_mib
        assert host.state("llm") == "created"

        # next cycle: without shrinking moe, the planner falls back to evicting it
        _, report2, _ = host.execute(
            mset, requests=request, policy=Policy(no_shrink=frozenset({"moe"}))
        )
        assert actions(report2) == [
            "stop moe ok",
            "release moe ok",
            "reserve llm ok",
            "start llm ok",
            "await_ready llm ok",
        ]


def _vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env(), timeout=180)


def test_apply_converges_and_refuses_a_stale_plan(host: Host) -> None:
    p1, p2 = free_port(), free_port()
    host.manifest(
        ROLE
        + serve_toml("emb", mib=2000, residency="resident", port=p1, extra='desired = "running"')
        + serve_toml("old", mib=2000, residency="evictable", port=p2, extra='desired = "stopped"')
    )
    manifest = str(host.tmp / "serves.toml")
    host.container("emb", port=p1, running=False)
    host.container("old", port=p2, running=True)

    saved = host.tmp / "plan.json"
    r = _vramctl("plan", "-m", manifest, "--out", str(saved), "--detailed-exitcode")
    assert r.returncode == 2, r.stdout + r.stderr
    steps = [(s["action"], s["serve"]) for s in json.loads(saved.read_text())["steps"]]
    assert steps == [
        ("stop", "old"),
        ("release", "old"),
        ("reserve", "emb"),
        ("start", "emb"),
        ("await_ready", "emb"),
    ]

    # the host changes under the saved plan: it is refused, nothing is done
    host.client.containers.get(host.name("old")).stop(timeout=1)
    r = _vramctl("apply", "-m", manifest, str(saved))
    assert r.returncode == 1
    assert "stale" in r.stderr and host.name("old") in r.stderr
    assert host.state("emb") == "created"

    # a fresh plan applies, and the host converges
    r = _vramctl("plan", "-m", manifest, "--out", str(saved))
    assert r.returncode == 0, r.stderr
    r = _vramctl("apply", "-m", manifest, str(saved))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "done" in r.stdout
    assert host.state("emb") == "running"
    r = _vramctl("plan", "-m", manifest, "--detailed-exitcode")
    assert r.returncode == 0, r.stdout + r.stderr
