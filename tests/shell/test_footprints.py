"""Measured footprints: device deltas around the executor's starts and stops.

The devices are the scripted NVML of tests/support/fakes_nvml.py read through the real adapter
(``observe_gpus``), with per-process figures unavailable, as on WSL2 (the driver lists
no process memory): the device's used total is the only evidence. The container runtime
is an in-memory stand-in whose start and stop move that total, so the executor's real
start / await_ready / stop / release paths take the readings. Calibration is checked
through the ``vramctl calibrate`` command on a real journal file.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cli import cli_env, run_cli
from support.fake_docker import FakeContainers, quick_executor
from support.fakes_nvml import FakeDevice, FakeNvml, nvml_error
from test_api import Asgi, client, idle, observe  # noqa: F401

from controller.adapters.nvml import MIB
from controller.interfaces.metrics import Metrics
from controller.manifest import load_manifest_set
from controller.service.executor import Outcome
from controller.service.footprints import FootprintRecorder, Reading, samples_of, summaries
from controller.service.loop import Controller
from controller.service.wiring import read_gpus
from controller.store.journal import Journal, journal_path
from statemachine.domain import types as sm
from statemachine.planning.plan_types import (
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.sizing.footprint import Method, Sample, propose, summarise

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-footprint-0"
ROLE = sm.GpuRole("g0", 24_000, 0, uuid=UUID)
BASE_MIB = 900  # the driver's own use of the card


class Card:
    """One scripted device whose used total the containers move."""

    def __init__(self) -> None:
        self.device = FakeDevice(UUID, total=24_000 * MIB, used=BASE_MIB * MIB)
        self.nvml = FakeNvml([self.device])

    def take(self, mib: int) -> None:
        self.device.used += mib * MIB

    def reading(self) -> Reading:
        # per-process figures unavailable: the containers' figures are unknown
        return Reading.of(sm.Observed(True, {}, gpus=read_gpus(self.nvml)))


class Containers(FakeContainers):
    """In-memory container runtime; a start takes ``takes[name]`` MiB on the card."""

    def __init__(self, card: Card, takes: dict[str, int], running: set[str] = frozenset()) -> None:
        super().__init__(exited=takes)
        self.state |= {c: "running" for c in running if c in takes}
        self.card = card
        self.takes = takes

    def start(self, name: str) -> None:
        super().start(name)
        self.card.take(self.takes[name])

    def stop(self, name: str, timeout_s: float) -> None:
        if self.state[name] == "running":
            self.card.take(-self.takes[name])
        super().stop(name, timeout_s)


def serve(name: str, mib: int, desired: sm.DesiredRun = sm.DesiredRun.RUNNING) -> sm.ServeSpec:
    return sm.ServeSpec(name, f"c-{name}", ("g0",), mib, desired=desired)


def desired_of(*serves: sm.ServeSpec) -> sm.DesiredState:
    return sm.DesiredState({"g0": ROLE}, {s.name: s for s in serves})


def observed(docker: Containers) -> sm.Observed:
    return sm.Observed(
        True,
        {
            c: sm.ContainerObs(sm.ContainerState(st), started_at=1.0)
            for c, st in docker.state.items()
            if st == "running"
        },
        gpus=read_gpus(docker.card.nvml),
    )


def execute(desired: sm.DesiredState, docker: Containers, recorder: FootprintRecorder) -> None:
    obs = observed(docker)
    plan = plan_transitions(desired, obs, Policy(), 1000.0)
    ex = quick_executor(desired, docker, lambda: read_gpus(docker.card.nvml), footprints=recorder)
    report = ex.execute(plan, obs, skip_preflight=True)
    assert all(r.outcome is Outcome.OK for r in report.results), report.to_json()


def starts_of(samples: list[Sample]) -> dict[str, Sample]:
    return {s.serve: s for s in samples if s.kind == "start"}


# ── deltas and their attribution ─────────────────────────────────────────────


def test_a_start_alone_on_its_gpu_is_measured_by_the_device_delta() -> None:
    card = Card()
    docker = Containers(card, {"c-llm": 4300})
    recorder = FootprintRecorder(card.reading, settle_s=0)
    execute(desired_of(serve("llm", 4000)), docker, recorder)
    (sample,) = recorder.samples()
    assert (sample.kind, sample.role, sample.method) == ("start", "g0", Method.DELTA)
    assert sample.attributable and sample.others == ()
    assert (sample.before_mib, sample.after_mib) == (BASE_MIB, BASE_MIB + 4300)
    assert (sample.delta_mib, sample.steady_mib) == (4300, 4300)


def test_starts_one_after_the_other_are_each_attributable() -> None:
    card = Card()
    docker = Containers(card, {"c-a": 3000, "c-b": 2000})
    recorder = FootprintRecorder(card.reading, settle_s=0)  # each window ends at health
    execute(desired_of(serve("a", 3000), serve("b", 2000)), docker, recorder)
    starts = starts_of(recorder.samples())
    assert (starts["a"].delta_mib, starts["a"].attributable) == (3000, True)
    assert (starts["b"].before_mib, starts["b"].delta_mib) == (BASE_MIB + 3000, 2000)
    assert starts["b"].attributable


def test_two_starts_in_one_window_are_named_and_not_attributable() -> None:
    card = Card()
    docker = Containers(card, {"c-a": 3000, "c-b": 2000})
    # a is still settling when b starts: a's steady reading would count b's memory
    recorder = FootprintRecorder(card.reading, settle_s=3600)
    desired = desired_of(serve("a", 3000), serve("b", 2000))
    execute(desired, docker, recorder)
    assert recorder.samples() == []  # both still settling
    recorder.close()  # the controller stops: recorded now, the settle reading unknown
    starts = starts_of(recorder.samples())
    assert starts["a"].others == ("b",) and starts["b"].others == ("a",)
    assert not starts["a"].attributable and not starts["b"].attributable
    assert starts["a"].settled_mib is None
    assert "b moved on the same GPU" in starts["a"].note
    # the figures are kept as evidence, but prove nothing: no measured footprint
    summary = summaries(desired, recorder.samples())
    assert summary["a"].measured_mib is None and summary["a"].samples == 1
    assert summary["a"].evidence == 0 and not summary["a"].exceeds


def test_per_process_figures_attribute_a_start_whatever_else_moved() -> None:
    card = Card()
    docker = Containers(card, {"c-a": 3000, "c-b": 2000})
    figures: dict[str, int | None] = {}

    def reading() -> Reading:  # a driver that reports per-process memory (not WSL2)
        for c, mib in docker.takes.items():
            figures[c] = mib - 100 if docker.state[c] == "running" else 0
        return Reading(card.reading().devices, dict(figures))

    recorder = FootprintRecorder(reading, settle_s=3600)
    execute(desired_of(serve("a", 3000), serve("b", 2000)), docker, recorder)
    recorder.close()
    starts = starts_of(recorder.samples())
    assert starts["a"].others == ("b",)  # named, yet its own figure proves what it took
    assert (starts["a"].method, starts["a"].attributable) == (Method.PROCESS, True)
    assert (starts["a"].delta_mib, starts["b"].delta_mib) == (2900, 1900)


def test_a_stop_alone_is_measured_by_what_came_back() -> None:
    card = Card()
    card.take(5000)  # llm runs already
    docker = Containers(card, {"c-llm": 5000}, running={"c-llm"})
    recorder = FootprintRecorder(card.reading, settle_s=0)
    execute(desired_of(serve("llm", 4000, sm.DesiredRun.STOPPED)), docker, recorder)
    (sample,) = recorder.samples()
    assert (sample.kind, sample.method, sample.attributable) == ("stop", Method.DELTA, True)
    assert (sample.before_mib, sample.after_mib, sample.delta_mib) == (
        BASE_MIB + 5000,
        BASE_MIB,
        5000,
    )


def test_without_nvml_every_figure_is_unknown_never_zero() -> None:
    card = Card()
    card.nvml.init_error = nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    docker = Containers(card, {"c-llm": 4300})
    recorder = FootprintRecorder(card.reading, settle_s=0)
    execute(desired_of(serve("llm", 4000)), docker, recorder)
    (sample,) = recorder.samples()
    assert sample.method is Method.UNKNOWN and not sample.attributable
    assert (sample.before_mib, sample.delta_mib, sample.steady_mib, sample.figure_mib) == (
        None,
        None,
        None,
        None,
    )
    summary = summarise("llm", 4000, recorder.samples())
    assert summary.measured_mib is None and summary.to_json()["measured_mib"] is None
    assert not summary.exceeds


def test_a_serve_taking_30_percent_more_than_it_declares_is_flagged() -> None:
    card = Card()
    docker = Containers(card, {"c-liar": 5200, "c-honest": 2900})
    recorder = FootprintRecorder(card.reading, settle_s=0)
    desired = desired_of(serve("liar", 4000), serve("honest", 3000))
    execute(desired, docker, recorder)
    summary = summaries(desired, recorder.samples())
    assert summary["liar"].measured_mib == 5200 and summary["liar"].exceeds
    assert summary["liar"].over_pct == 30.0
    assert summary["liar"].to_json()["exceeds_reservation"] is True
    assert summary["honest"].measured_mib == 2900 and not summary["honest"].exceeds


def test_the_peak_while_it_runs_is_raised_from_the_loops_observations() -> None:
    card = Card()
    docker = Containers(card, {"c-llm": 3000})
    recorder = FootprintRecorder(card.reading, settle_s=0)
    desired = desired_of(serve("llm", 4000))
    execute(desired, docker, recorder)
    recorder.observe(observed(docker), desired, time.time())
    card.take(1500)  # a representative workload grows its caches
    recorder.observe(observed(docker), desired, time.time())
    card.take(-1000)
    recorder.observe(observed(docker), desired, time.time())
    (sample,) = recorder.samples()
    assert (sample.delta_mib, sample.peak_mib, sample.figure_mib) == (3000, 4500, 4500)
    assert summarise("llm", 4000, recorder.samples()).exceeds


def test_a_change_the_loop_sees_outside_any_window_stops_the_peak() -> None:
    card = Card()
    docker = Containers(card, {"c-llm": 3000, "c-other": 2000})
    recorder = FootprintRecorder(card.reading, settle_s=0)
    llm, other = serve("llm", 4000), serve("other", 2000, sm.DesiredRun.STOPPED)
    desired = desired_of(llm, other)
    execute(desired, docker, recorder)
    recorder.observe(observed(docker), desired, time.time())
    docker.start("c-other")  # started by hand: the card's total moves for it
    recorder.observe(observed(docker), desired, time.time())
    (sample,) = recorder.samples()
    assert sample.peak_mib == 3000  # not 5000: the other serve's memory is not llm's


# ── calibration ──────────────────────────────────────────────────────────────

MANIFEST = """
[[gpu_roles]]
id = "g0"
vram_mib = 24000
uuid = "GPU-footprint-0"

[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "g0"
vram_mib = 4000   # the reservation
desired = "running"

[[serve]]
name = "embed"
container = "c-embed"
gpu_role = "g0"
vram_mib = 2000
desired = "running"
"""


def record(
    journal: Journal, serve: str, kind: str, delta: int, *, attributable: bool = True
) -> None:
    sample = Sample(
        serve,
        kind,
        "g0",
        at=float(len(journal.footprints()) + 1),
        declared_mib=4000,
        method=Method.DELTA,
        attributable=attributable,
        delta_mib=delta,
        others=() if attributable else ("x",),
    )
    journal.add_footprint(serve, kind, "g0", sample.at, sample.to_json())


def vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env(PYTHONPATH=str(REPO)), cwd=REPO)


def test_calibrate_proposes_the_peak_plus_margin_from_recorded_samples(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    state = tmp_path / "state"
    with Journal.open(journal_path(state)) as journal:
        record(journal, "llm", "start", 4100)
        record(journal, "llm", "stop", 4200)
        record(journal, "llm", "start", 4050)
        record(journal, "llm", "start", 9000, attributable=False)  # proves nothing
        record(journal, "embed", "start", 1800)
        record(journal, "embed", "start", 1900)
    r = vramctl("calibrate", "-m", str(path), "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    by = {p["serve"]: p for p in json.loads(r.stdout)["serves"]}
    # 4200 * 1.10 = 4620 -> ceil(4620 / 256) = 19 granules = 4864 MiB
    assert by["llm"]["peak_mib"] == 4200 and by["llm"]["proposed_mib"] == 4864
    assert (by["llm"]["samples"], by["llm"]["attributable_samples"]) == (4, 3)
    assert "4620.0" in by["llm"]["arithmetic"]
    assert by["embed"]["proposed_mib"] is None and not by["embed"]["enough_evidence"]
    assert "not enough evidence" in by["embed"]["reason"]
    assert "at least 3" in by["embed"]["reason"]

    human = vramctl("calibrate", "-m", str(path), "--state-dir", str(state), "--patch")
    assert human.returncode == 0, human.stderr
    assert "proposed vram_mib = 4864" in human.stdout
    assert "llm: declared 4000 MiB;" in human.stdout  # as every figure prints: no "4 000"
    assert "not enough evidence" in human.stdout
    assert "-vram_mib = 4000   # the reservation" in human.stdout
    assert "+vram_mib = 4864   # the reservation" in human.stdout
    assert path.read_text() == MANIFEST  # never edits the manifest


def test_propose_refuses_with_too_few_samples_and_rounds_exactly() -> None:
    few = [Sample("s", "start", "g0", 1.0, 1000, Method.DELTA, True, delta_mib=1000)] * 2
    assert propose("s", 1000, few).proposed_mib is None
    enough = [*few, Sample("s", "stop", "g0", 2.0, 1000, Method.DELTA, True, delta_mib=1000)]
    # 1000 * 1.1 = 1100.0000000000002 in floats: still 5 granules of 256 = 1280
    assert propose("s", 1000, enough).proposed_mib == 1280
    assert propose("s", 1000, enough, margin_pct=0, granule_mib=1000).proposed_mib == 1000


# ── durability ───────────────────────────────────────────────────────────────


def test_samples_survive_a_restart_of_the_controller(tmp_path: Path) -> None:
    card = Card()
    docker = Containers(card, {"c-llm": 5200})
    desired = desired_of(serve("llm", 4000))
    state = tmp_path / "state"
    with Journal.open(journal_path(state)) as journal:
        recorder = FootprintRecorder(card.reading, journal=journal, settle_s=0)
        execute(desired, docker, recorder)
        recorder.observe(observed(docker), desired, time.time())
        card.take(300)
        recorder.observe(observed(docker), desired, time.time())  # the peak is journalled too
    with Journal.open(journal_path(state)) as journal:  # a new controller, the same file
        again = FootprintRecorder(card.reading, journal=journal, settle_s=0)
        (sample,) = again.samples()
        assert (sample.delta_mib, sample.peak_mib) == (5200, 5500)
        summary = again.summary(desired)["llm"]
        assert summary.measured_mib == 5500 and summary.exceeds and summary.samples == 1
        assert samples_of(journal, "llm") == [sample]


def test_the_journal_keeps_a_bounded_history_per_serve(tmp_path: Path) -> None:
    with Journal.open(journal_path(tmp_path)) as journal:
        for i in range(10):
            journal.add_footprint("a", "start", "g0", float(i), {"i": i}, keep=4)
        journal.add_footprint("b", "start", "g0", 99.0, {"i": 99}, keep=4)
        assert [d["i"] for _, d in journal.footprints("a")] == [6, 7, 8, 9]
        assert [d["i"] for _, d in journal.footprints("b")] == [99]


def test_the_manifest_fixtures_still_load() -> None:
    fixtures = sorted((REPO / "tests" / "fixtures").rglob("*.toml"))
    assert fixtures
    loaded = load_manifest_set([p for p in fixtures if "anvil" in str(p)] or fixtures[:1])
    assert loaded.serves


@pytest.mark.parametrize(
    ("extra", "warned"),
    [
        ("reserve_mib = 0\nreserve_default_mib = 2048\n", True),
        (
            'reserve_mib = 0\nreserve_default_mib = 2048\nreserve_rationale = "dedicated to '
            'models: no display attached (2026-07-13)"\n',
            False,
        ),
        ("reserve_mib = 2048\nreserve_default_mib = 2048\n", False),
    ],
)
def test_a_reserve_below_its_default_needs_a_rationale(
    tmp_path: Path, extra: str, warned: bool
) -> None:
    path = tmp_path / "roles.toml"
    path.write_text(f'[[gpu_roles]]\nid = "card"\nvram_mib = 32000\n{extra}')
    mset = load_manifest_set([path])
    warnings = [w for w in mset.warnings if "reserve_default_mib" in w]
    assert bool(warnings) is warned
    if warned:
        (w,) = warnings
        assert w.startswith(f'{path}: gpu_roles "card" (#1): reserve_mib:'), w
        assert "no reserve_rationale" in w
    r = vramctl("status", "-m", str(path), "--json", "--observed", str(snapshot(tmp_path)))
    assert r.returncode == 0, r.stderr
    reserve = json.loads(r.stdout)["reserves"]["card"]
    assert reserve["reserve_default_mib"] == 2048
    assert reserve["waived"] is (extra.startswith("reserve_mib = 0"))
    human = vramctl("status", "-m", str(path), "--observed", str(snapshot(tmp_path)))
    assert human.returncode == 0, human.stderr
    assert "Reserves (MiB)" in human.stdout
    assert ("none recorded" in human.stdout) is warned
    assert ("at its default" in human.stdout) is extra.startswith("reserve_mib = 2048")


def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "observed.json"
    path.write_text(json.dumps({"docker": "ok", "containers": {}, "gpus": None}))
    return path


# ── the API and the metrics ──────────────────────────────────────────────────


def test_the_api_and_the_metrics_show_declared_vs_measured(
    idle: Controller,  # noqa: F811 - the fixture of tests/shell/test_api.py
    client: Callable[..., Asgi],  # noqa: F811
) -> None:
    # the loop's recorder on its journal: llm (5000 declared) measured at 6500
    idle.footprints = FootprintRecorder(lambda: Reading(None), journal=idle.journal, settle_s=0)
    sample = Sample("llm", "start", "a", 1.0, 5000, Method.DELTA, True, delta_mib=6500)
    idle.journal.add_footprint("llm", "start", "a", 1.0, sample.to_json())
    observe(idle, {"llm": {"state": "running"}})
    rows = {r["serve"]: r for r in client(idle).get("/v1/serves").json()["serves"]}
    llm = rows["llm"]["footprint"]
    assert (llm["declared_mib"], llm["measured_mib"], llm["method"]) == (5000, 6500, "delta")
    assert llm["samples"] == 1 and llm["exceeds_reservation"] is True and llm["over_pct"] == 30.0
    omni = rows["omni"]["footprint"]
    assert omni["measured_mib"] is None and omni["samples"] == 0  # unknown, never 0

    metrics = Metrics()
    metrics.update_footprints(idle)
    series = {
        (f.name, s.labels["serve"]): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if f.name.startswith("vramctl_serve_")
    }
    assert series[("vramctl_serve_measured_mib", "llm")] == 6500
    assert series[("vramctl_serve_footprint_over_reservation", "llm")] == 1
    assert series[("vramctl_serve_footprint_samples", "omni")] == 0
    assert ("vramctl_serve_measured_mib", "omni") not in series  # absent, never 0
    assert ("vramctl_serve_footprint_over_reservation", "omni") not in series


def test_a_window_nothing_ends_does_not_poison_later_deltas() -> None:
    card = Card()
    recorder = FootprintRecorder(card.reading, settle_s=0)
    a, b = serve("a", 1000), serve("b", 2000)
    desired = desired_of(a, b)
    recorder.before_start(a, desired.roles)  # interrupted: never awaited, never failed
    recorder.observe(sm.Observed(True, {}), desired, time.time())  # a is not starting any more
    recorder.before_start(b, desired.roles)
    card.take(2000)
    recorder.after_start(b)
    (sample,) = recorder.samples()
    # a's window was closed by the observation: b, alone since, is attributable
    assert (sample.serve, sample.attributable, sample.others) == ("b", True, ())
    assert sample.delta_mib == 2000


def test_a_journal_written_before_the_footprints_table_still_opens(tmp_path: Path) -> None:
    import sqlite3

    path = journal_path(tmp_path)
    Journal.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE footprints")
    with Journal.open(path, readonly=True) as journal:
        assert journal.footprints() == []  # read only: nothing is added, nothing fails
    with Journal.open(path) as journal:  # a controller writes to it: the table is added
        journal.add_footprint("a", "start", "g0", 1.0, {"i": 1})
        assert [d for _, d in journal.footprints()] == [{"i": 1}]


def test_a_serve_stopped_before_it_settled_keeps_its_start_without_a_steady_figure() -> None:
    card = Card()
    docker = Containers(card, {"c-llm": 3000})
    recorder = FootprintRecorder(card.reading, settle_s=3600)
    llm = serve("llm", 4000)
    execute(desired_of(llm), docker, recorder)
    execute(desired_of(serve("llm", 4000, sm.DesiredRun.STOPPED)), docker, recorder)
    by = {s.kind: s for s in recorder.samples()}
    assert (by["start"].delta_mib, by["start"].settled_mib, by["start"].steady_mib) == (
        3000,
        None,
        None,
    )
    assert by["stop"].delta_mib == 3000 and by["stop"].attributable


def test_the_stop_of_a_sleeper_is_not_measured_as_its_footprint() -> None:
    # asleep, it holds only its residual: what comes back at its stop is that residual,
    # which says nothing of what the serve takes awake (calibrate would propose less)
    from statemachine.domain.types import (
        Sleep,
        SleepObs,
        SleepState,
    )
    from statemachine.engines import (
        SleepProtocol,
    )

    card = Card()
    card.take(1000)  # its residual on the device
    docker = Containers(card, {"c-big": 1000}, running={"c-big"})
    big = sm.ServeSpec(
        "big",
        "c-big",
        ("g0",),
        8000,
        desired=sm.DesiredRun.STOPPED,
        sleep=Sleep(1, 1000, SleepProtocol.VLLM, 6000, url="http://127.0.0.1:1"),
    )
    desired = desired_of(big)
    obs = observed(docker)
    obs = sm.Observed(
        obs.docker_ok,
        obs.containers,
        gpus=obs.gpus,
        sleep={"big": SleepObs(SleepState.ASLEEP, 1, 1000, 6000)},
    )
    plan = plan_transitions(desired, obs, Policy(), 1000.0)
    assert [str(s.action) for s in plan.steps] == ["stop", "release"], plan.steps
    recorder = FootprintRecorder(card.reading, settle_s=0)
    ex = quick_executor(desired, docker, lambda: read_gpus(docker.card.nvml), footprints=recorder)
    report = ex.execute(plan, obs, skip_preflight=True)
    assert all(r.outcome is Outcome.OK for r in report.results), report.to_json()
    assert [s for s in recorder.samples() if s.evidence] == []
    assert summarise("big", 8000, recorder.samples()).measured_mib is None
