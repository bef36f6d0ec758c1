"""The elastic VRAM protocol end to end, against an engine that answers as its document says.

The engine is :class:`fake_http.ElasticEngine` on loopback (whole segments, a floor,
free VRAM measured across the whole card, a resize that waits for a running request
and then answers 409, the failure paths and ``/v1/unload`` + ``/v1/load``), talked to
by the real adapter. Plans come from the real planner; the executor carries them out
with an in-memory container runtime (the daemon is not what is under test here: the
real one is driven in tests/e2e/test_executor_e2e.py), and the loop's bookkeeping
(``Controller.reconciler.lessons``: ``learn``, ``elastic_in_force``) runs on a real journal.

The invariant checked after every execution: the ledger never counts an elastic serve
at less than its engine holds on the card.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fake_http import Card, ElasticEngine
from support.fake_docker import FakeContainers, quick_executor

from controller.adapters.elastic import ElasticClient
from controller.manifest import ManifestSet, load_manifest_set
from controller.service.executor import ExecutionReport, Executor, Outcome
from controller.service.loop import Controller, RunOptions
from controller.snapshot import ContainerModel, SnapshotModel, load_snapshot
from controller.store.journal import Journal, journal_path
from statemachine.answers.fit import request_plan
from statemachine.domain.types import ContainerState, GpuObs, Observed, OnDemandRequest
from statemachine.planning.plan_types import (
    Plan,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
EXAMPLE_OBSERVED = ROOT / "manifests" / "examples" / "single-card.observed.json"


class Containers(FakeContainers):
    """In-memory container runtime: ``created`` containers exist, stop/start flip them."""

    def __init__(self, running: set[str], created: set[str] | None = None) -> None:
        super().__init__(running, created=created or ())
        self.restarted: list[str] = []

    def start(self, name: str) -> None:
        if self.state.get(name) == "exited":
            self.restarted.append(name)
        super().start(name)


def client(timeout_s: float = 5.0) -> ElasticClient:
    """The client as the loop configures it, with a shorter wait for an answer."""
    return ElasticClient(timeout_s=timeout_s, initial_wait_s=0.01)


def executor(
    mset: ManifestSet,
    docker: Containers,
    *,
    elastic: ElasticClient | None = None,
    gpus: Callable[[], tuple[GpuObs, ...] | None] = lambda: None,
) -> Executor:
    return quick_executor(mset.desired(), docker, gpus, elastic=elastic or client())


def actions(report: ExecutionReport) -> list[str]:
    return [f"{r.step.action} {r.step.serve} {r.outcome}" for r in report.results]


def counted(report: ExecutionReport, serve: str) -> int:
    return report.ledger.holdings[serve].mib


def assert_never_less(report: ExecutionReport, serve: str, engine: ElasticEngine) -> None:
    assert counted(report, serve) >= engine.used_mib, (
        f"the ledger counts {serve} at {counted(report, serve)} MiB, "
        f"its engine holds {engine.used_mib} MiB"
    )


# ── the worked example of docs/protocols.md (item 1: whole segments) ───────────


def example_manifest(tmp_path: Path, url: str) -> ManifestSet:
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "min_runtime_s = 120\n",
        f'min_runtime_s = 120\nelastic = {{ url = "{url}", floor_mib = 2048 }}\n',
        1,
    )
    path = tmp_path / "single-card.toml"
    path.write_text(text, encoding="utf-8")
    return load_manifest_set([path])


@pytest.fixture
def example_card() -> Iterator[tuple[Card, ElasticEngine]]:
    # stt 2048 + embeddings 3200 + reranker 3456 use what they reserve; ocr is 1536 MiB
    # of weights, K/V and buffers plus a 4608 MiB expert cache (9 segments, floor 1)
    card = Card(32_607, other_used_mib=2048 + 3200 + 3456)
    with ElasticEngine(card, fixed_mib=1536, cache_full_mib=4608, floor_cache_mib=512) as ocr:
        yield card, ocr


def test_the_worked_example_of_docs_protocols_runs_end_to_end(
    tmp_path: Path, example_card: tuple[Card, ElasticEngine]
) -> None:
    card, ocr = example_card
    mset = example_manifest(tmp_path, ocr.url)
    snap = load_snapshot(EXAMPLE_OBSERVED)
    observed = snap.to_observed()
    now = datetime(2026, 11, 30, 9, tzinfo=UTC).timestamp()  # the observation's taken_at
    desired = replace(mset.desired(), requests=(OnDemandRequest("fast", now),))
    plan = request_plan(desired, observed, "fast", now=now)  # as `vramctl fit fast` asks it
    shrink = plan.steps[0]
    # committed 14848, free 15711: fast (19456) is 3745 short; ocr gives 8 whole segments
    assert (str(shrink.action), shrink.serve, shrink.mib, shrink.to_mib) == (
        "shrink",
        "ocr",
        4096,
        2048,
    )
    running = {"voice-stt", "vllm-embeddings", "vllm-reranker", "vllm-ocr"}
    docker = Containers(running, {"vllm-fast"})
    ex = executor(mset, docker)
    ex.desired = desired
    report = ex.execute(plan, observed, skip_preflight=True)
    assert actions(report) == [
        "shrink ocr ok",
        "reserve fast ok",
        "start fast ok",
        "await_ready fast ok",
        "readmit fast ok",
    ]
    # no NVML: 32607 - 14848 + 4096 = 21855 = fast's 19456 + the role's reserve 2048 + 351
    assert ocr.reserves() == [21_855]
    assert (ocr.cache_mib, ocr.used_mib) == (512, 2048)
    assert counted(report, "ocr") == 2048
    assert_never_less(report, "ocr", ocr)
    assert card.free_mib() == 21_855


# ── a small host for the other items ───────────────────────────────────────────

ROLE = """
[[gpu_roles]]
id = "g0"
vram_mib = 24000
reserve_mib = {reserve}
"""

SERVES = """
[[serve]]
name = "moe"
container = "c-moe"
gpu_role = "g0"
vram_mib = 16384
residency = "evictable"
desired = "running"
elastic = {{ url = "{url}", floor_mib = 4096 }}

[[serve]]
name = "big"
container = "c-big"
gpu_role = "g0"
vram_mib = {big}
residency = "resident"
desired = "running"

[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "g0"
vram_mib = 6000
residency = "on-demand"
"""


@dataclass
class Host:
    tmp: Path
    card: Card
    engine: ElasticEngine
    mset: ManifestSet
    docker: Containers

    def observed(self, elastic_mib: dict[str, int] | None = None) -> Observed:
        containers = {
            name: ContainerModel(state=ContainerState(state), started_at=1000.0)
            for name, state in self.docker.state.items()
        }
        snap = SnapshotModel(docker="ok", containers=containers)
        return replace(snap.to_observed(), elastic_mib=elastic_mib or {})

    def plan(
        self,
        observed: Observed,
        policy: Policy | None = None,
        now: float = 5000.0,
        *,
        request: bool = True,
    ) -> Plan:
        requests = (OnDemandRequest("llm", now - 1),) if request else ()
        desired = replace(self.mset.desired(), requests=requests)
        return plan_transitions(desired, observed, policy or Policy(), now)

    def run(self, plan: Plan, observed: Observed, ex: Executor | None = None) -> ExecutionReport:
        ex = ex or executor(self.mset, self.docker)
        ex.desired = replace(self.mset.desired(), requests=(OnDemandRequest("llm", 4999.0),))
        return ex.execute(plan, observed, skip_preflight=True)

    def controller(self) -> Controller:
        path = self.tmp / "serves.toml"
        c = Controller(RunOptions(manifests=(path,), state_dir=self.tmp / "state"), self.mset)
        c.journal = Journal.open(journal_path(self.tmp / "state"))
        return c


def make_host(
    tmp_path: Path, card: Card, engine: ElasticEngine, *, big: int = 6000, reserve: int = 0
) -> Host:
    path = tmp_path / "serves.toml"
    path.write_text(ROLE.format(reserve=reserve) + SERVES.format(url=engine.url, big=big))
    docker = Containers({"c-moe", "c-big"}, {"c-llm"})
    return Host(tmp_path, card, engine, load_manifest_set([path]), docker)


def moe_engine(card: Card, **options: Any) -> ElasticEngine:
    # 2048 MiB of weights and K/V plus a 14336 MiB expert cache (28 segments, floor 4)
    return ElasticEngine(
        card, fixed_mib=2048, cache_full_mib=14_336, floor_cache_mib=2048, **options
    )


# ── item 2: card-wide free proves nothing about the engine ─────────────────────


def test_free_memory_elsewhere_on_the_card_is_not_proof_of_a_shrink(tmp_path: Path) -> None:
    # big has reserved 6000 MiB but uses none yet: the card shows 7616 MiB free
    card = Card(24_000)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine)
        observed = host.observed()
        plan = host.plan(observed)
        assert [f"{s.action} {s.serve}" for s in plan.steps][:2] == ["shrink moe", "reserve llm"]
        report = host.run(plan, observed)
        assert_never_less(report, "moe", engine)
        # the first answer proves nothing (cache 14336/14336 with free >= reserve_mib);
        # asked again for what the card's own figure says is missing, the engine gives
        # back whole segments and its cache proves it
        first, second = engine.answers
        assert first["expert_cache_mib"] == first["expert_cache_full_mib"] == 14_336
        assert second["expert_cache_mib"] == 14_336 - plan.steps[0].mib
        assert actions(report)[:2] == ["shrink moe ok", "reserve llm ok"]
        assert counted(report, "moe") == engine.used_mib == 16_384 - 4608


def test_a_shrink_stopped_by_the_engines_floor_counts_what_it_still_holds(
    tmp_path: Path,
) -> None:
    # the manifest's floor (4096) is below what this engine reaches (2048 + 12288)
    card = Card(24_000, other_used_mib=6000)
    with ElasticEngine(
        card, fixed_mib=2048, cache_full_mib=14_336, floor_cache_mib=12_288
    ) as engine:
        host = make_host(tmp_path, card, engine)
        observed = host.observed()
        plan = host.plan(observed)
        assert (str(plan.steps[0].action), plan.steps[0].to_mib) == ("shrink", 11_776)
        report = host.run(plan, observed)
        assert actions(report)[:2] == ["shrink moe failed", "reserve llm skipped"]
        assert (engine.cache_mib, engine.used_mib) == (12_288, 14_336)
        assert counted(report, "moe") == 14_336  # what it gave back is credited, no more
        assert None not in engine.reserves()  # not grown back: the ledger counts it as is
        assert_never_less(report, "moe", engine)


# ── item 3: 409 is "busy, later" ───────────────────────────────────────────────


def test_busy_is_retried_on_a_later_cycle_not_marked_or_undone(tmp_path: Path) -> None:
    card = Card(24_000, other_used_mib=6000)
    with moe_engine(card, busy_wait_s=0.2) as engine:
        host = make_host(tmp_path, card, engine)
        c = host.controller()
        engine.set_busy(True)
        observed = host.observed()
        plan = host.plan(observed)
        report = host.run(plan, observed)
        assert len(engine.requests) == 1  # no retry inside the cycle, no undo sent after it
        assert engine.reserves() == [6224]
        assert report.results[0].outcome is not Outcome.OK
        assert "busy" in report.results[0].detail
        assert_never_less(report, "moe", engine)
        failed_at = report.results[0].ended_at  # the backoff counts from the failure
        c.reconciler.lessons.learn(report, 5000.0)
        assert "moe" not in c.no_shrink  # busy is not a refusal
        assert "llm" in c.policy(failed_at + 1).hold  # the requester waits (backoff) ...
        assert "llm" not in c.policy(failed_at + 600).hold  # ... and tries again
        engine.set_busy(False)
        report2 = host.run(host.plan(observed, c.policy(failed_at + 600), 5600.0), observed)
        assert actions(report2)[:2] == ["shrink moe ok", "reserve llm ok"]
        assert engine.reserves() == [6224, 6224]
        assert_never_less(report2, "moe", engine)


def test_no_answer_within_the_clients_wait_is_not_proof_and_is_asked_again(
    tmp_path: Path,
) -> None:
    # the engine holds the resize up to 300 s (the document's figure) behind a request
    card = Card(24_000, other_used_mib=6000)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine)
        c = host.controller()
        engine.set_busy(True)
        observed = host.observed()
        ex = executor(host.mset, host.docker, elastic=client(timeout_s=0.5))
        report = host.run(host.plan(observed), observed, ex)
        assert len(engine.requests) == 1  # asked once; the wait is bounded by the client
        assert report.results[0].outcome is not Outcome.OK
        assert counted(report, "moe") == 16_384  # not proven: counted at what it held
        c.reconciler.lessons.learn(report, 5000.0)
        assert "moe" not in c.no_shrink and c.journal.elastic() == {}
        engine.set_busy(False)  # the queued resize runs now, its client long gone
        deadline = time.monotonic() + 30
        while engine.cache_mib == 14_336 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.cache_mib == 14_336 - 4608
        later = report.results[0].ended_at + 600  # past the backoff, counted from the failure
        report2 = host.run(host.plan(observed, c.policy(later), 5600.0), ex=ex, observed=observed)
        assert engine.reserves() == [6224, 6224]  # the same reserve: idempotent
        assert actions(report2)[:2] == ["shrink moe ok", "reserve llm ok"]
        assert_never_less(report2, "moe", engine)


@pytest.mark.docker
def test_the_loop_waits_a_bounded_time_for_an_engine(tmp_path: Path) -> None:
    from controller.service.wiring import make_executor

    card = Card(24_000)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine)
        ex = make_executor(host.mset, router_url=None, router_token_file=None)
        # the engine may wait 300 s before its 409: the loop must not wait with it
        assert ex.elastic.timeout_s <= 30


# ── item 4: a failure inside a resize reloads the model ────────────────────────


@pytest.mark.parametrize("kind", ["release", "unavailable"])
def test_a_failure_inside_a_shrink_reloads_the_model_and_counts_it_full(
    tmp_path: Path, kind: str
) -> None:
    card = Card(24_000, other_used_mib=6000)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine)
        c = host.controller()
        engine.fail_next(kind)
        observed = host.observed()
        report = host.run(host.plan(observed), observed)
        assert report.results[0].outcome is Outcome.FAILED
        assert engine.posts() == ["/v1/vram", "/v1/unload", "/v1/load"]
        assert engine.reloads == 1 and not engine.broken
        assert "reload" in report.results[0].detail
        assert counted(report, "moe") == 16_384
        assert_never_less(report, "moe", engine)
        c.reconciler.lessons.learn(report, 5000.0)
        assert c.journal.elastic() == {}  # counted at full from the next cycle on too


def test_a_failed_refill_on_grow_reloads_the_model_and_counts_it_full(tmp_path: Path) -> None:
    card = Card(24_000, other_used_mib=6000)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine)
        engine.segments = 19  # shrunk earlier to 11776 MiB (journalled)
        c = host.controller()
        c.journal.set_elastic("moe", 11_776, 2000.0)
        host.docker.state["c-llm"] = "created"
        observed = host.observed({"moe": 11_776})
        plan = host.plan(observed, request=False)
        assert [str(s.action) for s in plan.steps] == ["grow"]
        engine.fail_next("refill")
        report = host.run(plan, observed)
        assert report.results[0].outcome is Outcome.FAILED
        assert engine.posts() == ["/v1/vram", "/v1/unload", "/v1/load"]
        assert counted(report, "moe") == 16_384
        assert_never_less(report, "moe", engine)
        c.reconciler.lessons.learn(report, 5000.0)
        assert c.journal.elastic() == {}


# ── item 5: a failed grow is counted at full ───────────────────────────────────


def test_a_grow_without_an_answer_is_counted_full_from_then_on(tmp_path: Path) -> None:
    card = Card(24_000, other_used_mib=2000)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine)
        engine.segments = 19
        c = host.controller()
        c.journal.set_elastic("moe", 11_776, 2000.0)
        observed = host.observed({"moe": 11_776})
        plan = host.plan(observed, request=False)
        assert [(str(s.action), s.to_mib) for s in plan.steps] == [("grow", 16_384)]
        engine.set_busy(True)
        ex = executor(host.mset, host.docker, elastic=client(timeout_s=0.5))
        report = host.run(plan, observed, ex)
        assert report.results[0].outcome is not Outcome.OK
        engine.set_busy(False)  # the grow runs after its client gave up
        deadline = time.monotonic() + 30
        while engine.cache_mib < 14_336 and time.monotonic() < deadline:
            time.sleep(0.01)
        c.reconciler.lessons.learn(report, 5000.0)
        snap = SnapshotModel(
            docker="ok",
            containers={"c-moe": ContainerModel(state=ContainerState.RUNNING, started_at=1000.0)},
        )
        in_force = c.reconciler.lessons.elastic_in_force(snap)
        assert in_force.get("moe", 16_384) >= engine.used_mib


# ── item 6: never ask for less than the role's reserve ─────────────────────────


def test_a_partial_grow_never_asks_for_less_than_the_roles_reserve(tmp_path: Path) -> None:
    card = Card(24_000, other_used_mib=2000)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine, big=8000, reserve=1024)
        engine.segments = 19
        observed = host.observed({"moe": 11_776})
        plan = host.plan(observed, request=False)
        (grow,) = plan.steps
        assert grow.to_mib is not None and grow.to_mib < 16_384  # a partial grow

        def gpus() -> tuple[GpuObs, ...]:  # NVML shows less free than the grow's delta
            return (GpuObs("GPU-0", 0, total_mib=24_000, used_mib=23_000, free_mib=1000),)

        path = tmp_path / "serves.toml"
        text = path.read_text().replace("reserve_mib = 1024", 'reserve_mib = 1024\nuuid = "GPU-0"')
        path.write_text(text)
        host.mset = load_manifest_set([path])
        report = host.run(plan, observed, executor(host.mset, host.docker, gpus=gpus))
        asked = engine.reserves()[0]
        assert asked is not None and asked >= 1024
        assert_never_less(report, "moe", engine)


# ── item 7: a reserve is timestamped when the engine's answer arrives ──────────


def test_a_reserve_asked_after_a_start_in_the_same_plan_stays_in_force(tmp_path: Path) -> None:
    # big 6224: llm is 4608 MiB (9 whole segments) short
    card = Card(24_000, other_used_mib=6224)
    with moe_engine(card) as engine:
        host = make_host(tmp_path, card, engine, big=6224)
        c = host.controller()
        cycle_start = time.time()
        observed = host.observed()
        plan = host.plan(observed)
        started_at = time.time()  # the same plan started moe's container (after the cycle began)
        time.sleep(0.01)
        report = host.run(plan, observed)
        assert actions(report)[0] == "shrink moe ok"
        c.reconciler.lessons.learn(report, cycle_start)
        snap = SnapshotModel(
            docker="ok",
            containers={
                "c-moe": ContainerModel(state=ContainerState.RUNNING, started_at=started_at)
            },
        )
        assert c.reconciler.lessons.elastic_in_force(snap) == {"moe": 16_384 - 4608}


# ── the engine itself ──────────────────────────────────────────────────────────


def test_the_engine_refuses_a_foreign_origin_and_the_client_sends_none(tmp_path: Path) -> None:
    import httpx

    card = Card(24_000)
    with moe_engine(card, trusted_origins=("http://127.0.0.1:9000",)) as engine:
        foreign = httpx.post(
            engine.url + "/v1/vram",
            json={"reserve_mib": 1000},
            headers={"Origin": "http://evil.example"},
        )
        assert foreign.status_code == 403
        trusted = httpx.post(
            engine.url + "/v1/vram",
            json={"reserve_mib": 1000},
            headers={"Origin": "http://127.0.0.1:9000"},
        )
        assert trusted.status_code == 200
        with client() as c:
            answer = c.set_reserve(engine.url, 1000)
        assert answer.http_status == 200
        assert "origin" not in engine.requests[-1].headers
