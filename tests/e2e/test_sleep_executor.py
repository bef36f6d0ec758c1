"""The executor's sleep and wake steps on the real Docker daemon with the test engine.

A serve is a busybox container (httpd answering its health path on loopback) whose
engine is the test engine (tests/fake_engine.py) on a port of its own, declared as the
serve's ``[serve.sleep] url``; its memory is one process on the scripted NVML device,
attributed to the container. When the container stops the engine's process is gone
with it. The plans are written by hand (the steps the planner emits around a sleep and
a wake) so each failure path can be driven; after every execution the executor's
ledger is checked against the ledger the host now shows.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound
from fake_engine import FakeEngine
from support.fakes_nvml import FakeDevice, FakeNvml
from support.serving import free_port, httpd

from controller.adapters.docker.read import ContainerObserver, manifest_containers
from controller.adapters.sleep import SleepClient
from controller.manifest import ManifestSet, load_manifest_set
from controller.service.executor import ExecutionReport, Executor, ExecutorConfig
from controller.service.observe import observe_host
from controller.service.wiring import make_executor, read_gpus
from controller.snapshot import SleepStateModel
from statemachine.domain.types import GpuObs, Observed
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import Action, Plan, Step

pytestmark = pytest.mark.docker

MIB = 2**20
UUID = "GPU-sleep-0"


@dataclass
class Rig:
    client: docker.DockerClient
    image: str
    tmp: Path
    prefix: str
    engine: FakeEngine
    nvml: FakeNvml
    port: int
    created: list[str] = field(default_factory=list)
    started_at: str | None = None

    @property
    def container(self) -> str:
        return f"{self.prefix}big"

    def start_container(self) -> None:
        c = self.client.containers.create(
            self.image,
            httpd(self.port),
            name=self.container,
            init=True,
            network_mode="host",
            labels={"vramctl.test": "1"},
        )
        self.created.append(c.name)
        c.start()

    def state(self) -> str:
        return str(self.client.containers.get(self.container).status)

    def manifest(self, *, level: int = 1, host: str = "") -> ManifestSet:
        body = f"""
{host}
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0
uuid = "{UUID}"

[[serve]]
name = "big"
container = "{self.container}"
gpu_role = "a"
vram_mib = 8000
residency = "evictable"
desired = "running"
port = {self.port}
health = "/health"
engine = "{self.engine.protocol}"
start_timeout_s = 20
stop_timeout_s = 5

[serve.sleep]
level = {level}
residual_mib = 1000
{"host_ram_mib = 6000" if level == 1 else ""}
url = "{self.engine.url}"
protocol = "{self.engine.protocol}"
"""
        path = self.tmp / "serves.toml"
        path.write_text(body)
        return load_manifest_set([path])

    def drive(self) -> dict[int, str]:
        """The engine's process lives in the container: gone when it stops."""
        try:
            c = self.client.containers.get(self.container)
        except NotFound:
            self.engine.exited()
            return {}
        if c.status != "running":
            self.engine.exited()
            return {}
        return {self.engine.pid: str(c.id)}

    def observe(
        self, mset: ManifestSet, sleep: dict[str, SleepStateModel] | None = None
    ) -> Observed:
        pids = self.drive()
        snap = observe_host(
            manifest_containers(mset.serves),
            observer=ContainerObserver(self.client),
            nvml=self.nvml,
            pid_to_container=pids.get,
        )
        snap.sleep = dict(sleep or {})
        return snap.to_observed()

    def gpus(self) -> tuple[GpuObs, ...] | None:
        self.drive()
        return read_gpus(self.nvml)

    def executor(self, mset: ManifestSet, *, memory_wait_s: float = 5.0) -> Executor:
        ex = make_executor(
            mset,
            router_url=None,
            router_token_file=None,
            gpus=self.gpus,
            config=ExecutorConfig(poll_s=0.05, memory_wait_s=memory_wait_s),
        )
        ex.sleep = SleepClient(timeout_s=10, attempts=2, max_wait_s=1, initial_wait_s=0.05)
        return ex


@pytest.fixture
def rig(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    test_image: str,
    tmp_path: Path,
) -> Iterator[Rig]:
    """The rig with a vLLM engine, or the protocol passed (``indirect=True``)."""
    protocol = getattr(request, "param", "vllm")
    dev = FakeDevice(uuid=UUID, total=10_000 * MIB, used=300 * MIB)
    engine = FakeEngine(protocol, device=dev, weights_mib=5000, kv_mib=1500, residual_mib=900)
    with engine:
        r = Rig(
            docker_client,
            test_image,
            tmp_path,
            f"vramctl-test-{uuid.uuid4().hex[:8]}-",
            engine,
            FakeNvml([dev]),
            free_port(),
        )
        r.start_container()
        yield r
    for name in r.created:
        with contextlib.suppress(NotFound):
            docker_client.containers.get(name).remove(force=True)


def plan(observed_ledger: Ledger, *steps: Step) -> Plan:
    return Plan(tuple(steps), (), observed_ledger, observed_ledger)


def sleep_steps(level: int = 1) -> tuple[Step, Step]:
    host = 6000 if level == 1 else 0
    return (
        Step(Action.SLEEP, "big", ("a",), None, "make room", group="req"),
        Step(
            Action.RELEASE_TO_RESIDUAL,
            "big",
            ("a",),
            7000,
            "make room",
            to_mib=1000,
            group="req",
            host_mib=host,
        ),
    )


def wake_steps(level: int = 1) -> list[Step]:
    host = 6000 if level == 1 else 0
    steps = [
        Step(
            Action.RESERVE_WAKE,
            "big",
            ("a",),
            7000,
            "wanted",
            to_mib=8000,
            group="big",
            host_mib=host,
        ),
        Step(Action.WAKE, "big", ("a",), None, "wanted", group="big"),
    ]
    if level == 2:
        steps.append(Step(Action.RELOAD, "big", ("a",), None, "wanted", group="big"))
    steps.append(Step(Action.AWAIT_READY, "big", ("a",), None, "wanted", group="big"))
    return steps


def run(
    rig: Rig,
    mset: ManifestSet,
    steps: list[Step] | tuple[Step, ...],
    observed: Observed,
    **kw: float,
) -> ExecutionReport:
    from statemachine.ledger.reservations import ledger_from_observed

    ex = rig.executor(mset, **kw)
    return ex.execute(plan(ledger_from_observed(mset.desired(), observed), *steps), observed)


def outcomes(report: ExecutionReport) -> list[str]:
    return [f"{r.step.action} {r.outcome}" for r in report.results]


def asleep_model(level: int = 1) -> dict[str, SleepStateModel]:
    return {
        "big": SleepStateModel(
            state="asleep", level=level, residual_mib=1000, host_ram_mib=6000 if level == 1 else 0
        )
    }


def test_a_confirmed_sleep_keeps_the_container_and_counts_the_residual(rig: Rig) -> None:
    mset = rig.manifest(host="[host]\nram_mib = 65536\nreserve_mib = 8192\n")
    observed = rig.observe(mset)
    assert observed.container(rig.container).gpu_used_mib == 7400  # 5000 + 1500 + 900
    assert rig.engine.free_lag_s > 0  # the engine answers before its memory is freed
    report = run(rig, mset, sleep_steps(), observed)
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    assert "NVML shows" in report.results[1].detail
    assert rig.state() == "running"
    assert rig.engine.is_sleeping and rig.engine.used_mib == 900
    assert report.ledger.holdings["big"].mib == 1000
    assert report.ledger.host_holdings == {"big": 6000}
    assert report.lifecycles == {"big": "asleep"}
    rec = report.sleeps["big"]
    assert rec is not None and rec.level == 1 and rec.residual_mib == 1000
    assert rec.started_at is not None and rec.container == rig.container
    # what the host shows now, with the sleep observed, is what the executor counts
    from statemachine.ledger.reservations import ledger_from_observed

    again = ledger_from_observed(mset.desired(), rig.observe(mset, asleep_model()))
    assert again.holdings["big"].mib == 1000 and again.host_holdings == {"big": 6000}


def test_a_sleep_nvml_does_not_confirm_is_a_stop_instead(rig: Rig) -> None:
    mset = rig.manifest()
    observed = rig.observe(mset)
    rig.engine.free_lag_s = 60  # says it sleeps, but the memory does not come down
    report = run(rig, mset, sleep_steps(), observed, memory_wait_s=0.6)
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    detail = report.results[1].detail
    assert "not confirmed within 0.6s" in detail and "stopped instead" in detail
    assert rig.state() == "exited"
    assert "big" not in report.ledger.holdings  # released in full once the stop is confirmed
    assert report.sleeps == {"big": None}
    assert report.lifecycles == {"big": "stopped"}


def test_an_engine_without_the_sleep_flag_is_reported_and_stopped(rig: Rig) -> None:
    rig.engine.enabled = False  # vLLM without VLLM_SERVER_DEV_MODE: 404
    mset = rig.manifest()
    report = run(rig, mset, sleep_steps(), rig.observe(mset))
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    assert "404" in report.results[0].detail and "stopped instead" in report.results[0].detail
    assert "big" in report.sleep_unsupported
    assert rig.state() == "exited" and "big" not in report.ledger.holdings


def test_a_wake_admits_the_full_reservation_then_wakes_and_awaits_health(rig: Rig) -> None:
    mset = rig.manifest()
    run(rig, mset, sleep_steps(), rig.observe(mset))
    observed = rig.observe(mset, asleep_model())
    report = run(rig, mset, wake_steps(), observed)
    assert outcomes(report) == ["reserve_wake ok", "wake ok", "await_ready ok"], report.to_json()
    assert not rig.engine.is_sleeping and rig.engine.used_mib == rig.engine.full_mib
    assert report.ledger.holdings["big"].mib == 8000 and report.ledger.host_holdings == {}
    assert report.sleeps == {"big": None} and report.lifecycles == {"big": "running"}
    posts = [r.path + "?" + r.raw_query for r in rig.engine.calls if r.path == "/wake_up"]
    assert posts == ["/wake_up?tags=weights", "/wake_up?tags=kv_cache"]


def test_a_level2_wake_reloads_the_weights(rig: Rig) -> None:
    mset = rig.manifest(level=2)
    r1 = run(rig, mset, sleep_steps(level=2), rig.observe(mset))
    assert outcomes(r1) == ["sleep ok", "release_to_residual ok"], r1.to_json()
    assert r1.ledger.host_holdings == {} and not rig.engine.weights_valid
    report = run(rig, mset, wake_steps(level=2), rig.observe(mset, asleep_model(level=2)))
    assert outcomes(report) == [
        "reserve_wake ok",
        "wake ok",
        "reload ok",
        "await_ready ok",
    ], report.to_json()
    assert rig.engine.weights_valid and not rig.engine.prefix_cache_stale


def test_a_failed_wake_stops_the_container_for_a_cold_start(rig: Rig) -> None:
    mset = rig.manifest()
    run(rig, mset, sleep_steps(), rig.observe(mset))
    rig.engine.force("/wake_up", (500, "Internal Server Error"))
    report = run(rig, mset, wake_steps(), rig.observe(mset, asleep_model()))
    assert outcomes(report) == ["reserve_wake ok", "wake failed", "await_ready skipped"]
    assert "stopped: a cold start follows" in report.results[1].detail
    assert rig.state() == "exited"
    assert "big" not in report.ledger.holdings
    assert report.lifecycles == {"big": "failed"}


def test_a_sleep_and_a_wake_are_moves_for_footprints_never_samples(rig: Rig) -> None:
    # the memory a sleep gives back and a wake takes again is not the serve's footprint;
    # but it moves on the GPU, so a start measured across it proves nothing either
    from controller.service.footprints import FootprintRecorder, Reading
    from statemachine.domain.types import ServeSpec

    mset = rig.manifest()
    recorder = FootprintRecorder(
        lambda: Reading.of(Observed(True, {}, gpus=rig.gpus())), settle_s=0
    )
    other = ServeSpec("other", "c-other", ("a",), 500)
    for steps, observed in (
        (sleep_steps(), lambda: rig.observe(mset)),
        (wake_steps(), lambda: rig.observe(mset, asleep_model())),
    ):
        recorder.before_start(other, mset.desired().roles)  # a start beside the plan
        ex = rig.executor(mset)
        ex.footprints = recorder
        seen = observed()
        report = ex.execute(plan(ledger_of(mset, seen), *steps), seen)
        assert all(r.outcome == "ok" for r in report.results), report.to_json()
        recorder.after_start(other)
    assert [s.serve for s in recorder.samples()] == ["other", "other"]
    assert all(s.others == ("big",) and not s.attributable for s in recorder.samples())


def ledger_of(mset: ManifestSet, observed: Observed) -> Ledger:
    from statemachine.ledger.reservations import ledger_from_observed

    return ledger_from_observed(mset.desired(), observed)


def test_a_confirmed_sleep_is_told_at_once_not_only_when_the_plan_ends(rig: Rig) -> None:
    """A controller that dies after a sleep is confirmed but before its plan ends must
    still find the sleeper in its journal: the record is handed over (``on_sleep``, the
    loop's journal) when the sleep is confirmed, before the step's own result."""
    from statemachine.ledger.reservations import ledger_from_observed

    mset = rig.manifest(host="[host]\nram_mib = 65536\nreserve_mib = 8192\n")
    observed = rig.observe(mset)
    ex = rig.executor(mset)
    told: list[tuple[str, int | None]] = []
    seen_at_step: dict[str, list[tuple[str, int | None]]] = {}
    ex.on_sleep = lambda container, rec: told.append(
        (container, None if rec is None else rec.residual_mib)
    )
    ex.on_step = lambda r: seen_at_step.setdefault(str(r.step.action), list(told))
    report = ex.execute(
        plan(ledger_from_observed(mset.desired(), observed), *sleep_steps()), observed
    )
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    assert seen_at_step["release_to_residual"] == [(rig.container, 1000)]


# ── SGLang: it cannot say whether it sleeps; the device can ──────────────────────

SGLANG = pytest.mark.parametrize("rig", ["sglang"], indirect=True)
TAGS = {"tags": ["kv_cache", "weights"]}


def engine_calls(rig: Rig) -> list[str]:
    return [f"{r.method} {r.path}" for r in rig.engine.calls if r.path != "/health"]


@SGLANG
def test_an_sglang_sleep_is_confirmed_by_the_device_not_by_asking(rig: Rig) -> None:
    mset = rig.manifest(host="[host]\nram_mib = 65536\nreserve_mib = 8192\n")
    observed = rig.observe(mset)
    report = run(rig, mset, sleep_steps(), observed)
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    assert report.results[0].detail == f"POST /release_memory_occupation to {rig.engine.url}"
    # 7400 used less the 1000 residual declared: 6400 expected; 6500 came back
    how = report.results[1].detail
    assert "the engine answered (SGLang cannot say whether it sleeps)" in how
    assert "NVML shows 6500 MiB back (expected 6400)" in how
    assert engine_calls(rig) == ["POST /release_memory_occupation"]  # nothing else to ask
    assert [r.json for r in rig.engine.calls if r.method == "POST"] == [TAGS]
    assert rig.state() == "running" and rig.engine.used_mib == 900
    assert report.ledger.holdings["big"].mib == 1000
    assert report.ledger.host_holdings == {"big": 6000}
    assert report.lifecycles == {"big": "asleep"}
    rec = report.sleeps["big"]
    assert rec is not None and rec.residual_mib == 1000 and rec.container == rig.container


@SGLANG
def test_an_sglang_engine_without_the_memory_saver_is_stopped_instead(rig: Rig) -> None:
    rig.engine.enabled = False  # no --enable-memory-saver: 200, and nothing is freed
    mset = rig.manifest()
    report = run(rig, mset, sleep_steps(), rig.observe(mset), memory_wait_s=0.6)
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    detail = report.results[1].detail
    assert "big's sleep is not confirmed within 0.6s" in detail
    assert "NVML shows 0 MiB back of the 6400 expected" in detail
    assert "stopped instead" in detail
    assert rig.state() == "exited" and "big" not in report.ledger.holdings
    assert report.sleeps == {"big": None} and report.lifecycles == {"big": "stopped"}


@SGLANG
def test_an_sglang_release_refused_while_requests_run_is_a_stop_instead(rig: Rig) -> None:
    rig.engine.set_in_flight(2)
    mset = rig.manifest()
    report = run(rig, mset, sleep_steps(), rig.observe(mset))
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    detail = report.results[0].detail
    assert "the engine did not sleep" in detail and "answered 400" in detail
    assert "only when server is idle" in detail and "stopped instead" in detail
    assert rig.state() == "exited" and "big" not in report.ledger.holdings


@SGLANG
def test_an_sglang_sleep_nvml_cannot_measure_is_taken_on_the_answer(rig: Rig) -> None:
    # no device to read and nothing attributed: the answer is all there is, and the
    # step says the memory was not measured (docs/protocols.md "Sleep and wake")
    mset = rig.manifest()
    seen = rig.observe(mset)
    unmeasured = {n: replace(c, gpu_used_mib=None) for n, c in seen.containers.items()}
    observed = replace(seen, containers=unmeasured, gpus=None)
    ex = rig.executor(mset)
    ex.gpus = lambda: None
    report = ex.execute(plan(ledger_of(mset, observed), *sleep_steps()), observed)
    assert outcomes(report) == ["sleep ok", "release_to_residual ok"], report.to_json()
    assert report.results[1].detail.startswith(
        "asleep (the engine answered (SGLang cannot say whether it sleeps); "
        "NVML cannot attribute memory to the container: not measured)"
    )
    assert report.ledger.holdings["big"].mib == 1000


@SGLANG
def test_an_sglang_wake_resumes_and_awaits_health_without_asking(rig: Rig) -> None:
    mset = rig.manifest()
    slept = run(rig, mset, sleep_steps(), rig.observe(mset))
    assert outcomes(slept) == ["sleep ok", "release_to_residual ok"], slept.to_json()
    report = run(rig, mset, wake_steps(), rig.observe(mset, asleep_model()))
    assert outcomes(report) == ["reserve_wake ok", "wake ok", "await_ready ok"], report.to_json()
    assert report.results[1].detail == "POST /resume_memory_occupation"
    assert engine_calls(rig) == [
        "POST /release_memory_occupation",
        "POST /resume_memory_occupation",
    ]
    assert [r.json for r in rig.engine.calls if r.method == "POST"] == [TAGS, TAGS]
    assert not rig.engine.is_sleeping and rig.engine.used_mib == rig.engine.full_mib
    assert report.ledger.holdings["big"].mib == 8000 and report.ledger.host_holdings == {}
    assert report.sleeps == {"big": None} and report.lifecycles == {"big": "running"}
