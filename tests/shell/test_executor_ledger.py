"""The executor's ledger on its failure paths: it never counts less than the GPU holds.

These check the executor's own bookkeeping (what it asks the elastic engine, when it
releases), so the container runtime is a small in-memory stand-in here; the real
daemon is driven in tests/e2e/test_executor_e2e.py. The elastic engine is the loopback
HTTP server of tests/fake_http.py, talked to by the real adapter.
"""

from __future__ import annotations

from typing import Any

from fake_http import FakeElastic
from support.fake_docker import FakeContainers as Containers
from support.fake_docker import quick_elastic, quick_executor

from controller.service.executor import Executor, Outcome
from statemachine.domain import types as sm
from statemachine.ledger.reservations import GpuReservation, Ledger
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)

ROLE = sm.GpuRole("g0", 20_000, 0, uuid="GPU-0")


def executor(desired: sm.DesiredState, docker: Containers, gpus: Any, url: str) -> Executor:
    return quick_executor(desired, docker, gpus, elastic=quick_elastic())


def running(**extra: Any) -> sm.ContainerObs:
    return sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0, **extra)


def elastic_moe(url: str) -> sm.ServeSpec:
    """``moe``, resident and running on ``g0``: 10000 MiB, elastic down to 2000 at ``url``."""
    return sm.ServeSpec(
        "moe",
        "moe",
        ("g0",),
        10_000,
        sm.Residency.RESIDENT,
        sm.DesiredRun.RUNNING,
        elastic=sm.Elastic(url, 2000),
    )


def test_a_grow_the_ledger_refuses_never_reaches_the_engine() -> None:
    with FakeElastic() as engine:
        moe = elastic_moe(engine.url)
        big = sm.ServeSpec(
            "big", "big", ("g0",), 15_000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING
        )
        desired = sm.DesiredState({"g0": ROLE}, {"moe": moe, "big": big})
        observed = sm.Observed(
            True, {"moe": running(), "big": running()}, elastic_mib={"moe": 2000}
        )
        ledger = Ledger(
            {"g0": ROLE},
            [GpuReservation("moe", ("g0",), 2000), GpuReservation("big", ("g0",), 15_000)],
        )
        grow = Step(Action.GROW, "moe", ("g0",), 8000, "grow", to_mib=10_000, group="moe")
        ex = executor(desired, Containers({"moe", "big"}), lambda: None, engine.url)
        report = ex.execute(Plan((grow,), (), ledger, ledger), observed, skip_preflight=True)
        assert [r.outcome for r in report.results] == [Outcome.FAILED]
        assert "ledger refuses" in report.results[0].detail
        assert engine.reserves() == []  # the engine was never told to grow
        assert report.ledger.holdings["moe"].mib == 2000


def test_a_failed_shrink_of_a_shrunk_serve_does_not_grow_it_back() -> None:
    with FakeElastic([FakeElastic.busy()]) as engine:
        moe = elastic_moe(engine.url)
        desired = sm.DesiredState({"g0": ROLE}, {"moe": moe})
        observed = sm.Observed(True, {"moe": running()}, elastic_mib={"moe": 6000})
        ledger = Ledger({"g0": ROLE}, [GpuReservation("moe", ("g0",), 6000)])
        shrink = Step(Action.SHRINK, "moe", ("g0",), 2000, "shrink", to_mib=4000, group="r")
        ex = executor(desired, Containers({"moe"}), lambda: None, engine.url)
        report = ex.execute(Plan((shrink,), (), ledger, ledger), observed, skip_preflight=True)
        assert [r.outcome for r in report.results] == [Outcome.ABORTED]  # busy: later
        # it asked once (capacity 20000 - committed 6000 + 2000 given back = 16000 free);
        # no "back to the start-up default" (null) that would take the full 10000 again
        assert engine.reserves() == [16_000]
        assert report.ledger.holdings["moe"].mib == 6000


def _stop_plan(ledger: Ledger, mib: int) -> Plan:
    steps = (
        Step(Action.STOP, "v", ("g0",), mib, "stop", group="v"),
        Step(Action.RELEASE, "v", ("g0",), mib, "release", group="v"),
    )
    return Plan(steps, (), ledger, ledger)


def test_release_waits_for_what_the_container_used_not_what_it_reserved() -> None:
    v = sm.ServeSpec("v", "v", ("g0",), 12_000, sm.Residency.EVICTABLE, sm.DesiredRun.STOPPED)
    desired = sm.DesiredState({"g0": ROLE}, {"v": v})
    docker = Containers({"v"})

    def gpus() -> tuple[sm.GpuObs, ...]:  # v used 5000 of its 12000 MiB; 1000 is the driver's
        used = 6000 if docker.state["v"] == "running" else 1000
        return (sm.GpuObs("GPU-0", 0, total_mib=20_000, used_mib=used, free_mib=20_000 - used),)

    observed = sm.Observed(True, {"v": running(gpu_used_mib=5000)})
    ledger = Ledger({"g0": ROLE}, [GpuReservation("v", ("g0",), 12_000)])
    report = executor(desired, docker, gpus, "").execute(
        _stop_plan(ledger, 12_000), observed, skip_preflight=True
    )
    assert [r.outcome for r in report.results] == [Outcome.OK, Outcome.OK]
    assert "NVML shows its 5000 MiB back" in report.results[1].detail
    assert not report.ledger.holds("v")


def test_release_is_not_confirmed_while_the_memory_stays_in_use() -> None:
    v = sm.ServeSpec("v", "v", ("g0",), 12_000, sm.Residency.EVICTABLE, sm.DesiredRun.STOPPED)
    desired = sm.DesiredState({"g0": ROLE}, {"v": v})
    docker = Containers({"v"})

    def gpus() -> tuple[sm.GpuObs, ...]:  # a zombie process keeps the memory after the exit
        return (sm.GpuObs("GPU-0", 0, total_mib=20_000, used_mib=6000, free_mib=14_000),)

    observed = sm.Observed(True, {"v": running(gpu_used_mib=5000)})
    ledger = Ledger({"g0": ROLE}, [GpuReservation("v", ("g0",), 12_000)])
    report = executor(desired, docker, gpus, "").execute(
        _stop_plan(ledger, 12_000), observed, skip_preflight=True
    )
    assert [r.outcome for r in report.results] == [Outcome.OK, Outcome.FAILED]
    assert "did not come back" in report.results[1].detail
    assert report.ledger.holds("v")  # not released on the strength of an exit alone
