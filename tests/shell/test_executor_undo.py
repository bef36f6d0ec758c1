"""The undo of a failed group: everything it can is undone, and every fault is told.

The lifecycle machine is the authority also while a failed group is undone: a
transition it forbids there is a bug. The undo goes on with every other serve of the
group (each tier readmitted, each reservation settled, the ledger true), and then the
fault is reported loudly: in the failed step's detail, in the report
(``undo_faults``, its JSON, ``ok`` false) and in the log at ERROR
(docs/protocols.md#the-undo-of-a-failed-group).

The container runtime is the small in-memory stand-in of tests/shell/test_executor_ledger.py
(here with a ``docker stop`` that fails); the router is the loopback test router of
tests/fake_http.py, talked to by the real adapter.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_http import FakeRouter
from loguru import logger
from support.fake_docker import FakeContainers as Containers

from controller.adapters.docker.actions import ActionError
from controller.adapters.elastic import ElasticClient
from controller.adapters.router import RouterClient
from controller.interfaces import render
from controller.service.executor import Executor, ExecutorConfig, Outcome
from statemachine.domain import types as sm
from statemachine.ledger.reservations import GpuReservation, Ledger
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)

TOKEN = "router-secret"
ROLE = sm.GpuRole("g0", 20_000, 0, uuid="GPU-0")
CONFIG = ExecutorConfig(poll_s=0.01, memory_wait_s=0.2, readmit_wait_s=0.5, readmit_poll_s=0.05)


class StopFails(Containers):
    """``docker stop`` of the containers named in ``failing`` fails; they keep running."""

    def __init__(self, running: set[str], failing: set[str]) -> None:
        super().__init__(running)
        self.failing = failing
        self.stops: list[str] = []

    def stop(self, name: str, timeout_s: float) -> None:
        self.stops.append(name)
        if name in self.failing:
            raise ActionError(f"stop {name}: 500 daemon error", transient=False, status=500)
        super().stop(name, timeout_s)


@pytest.fixture
def errors() -> Iterator[list[str]]:
    """The controller's log lines at ERROR while the test runs."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip()), level="ERROR", format="{message}")
    yield lines
    logger.remove(sink)


#: the router's tiers: those of the serves below
TIERS = ("omni-local", "ocr-local")


def _serve(name: str, mib: int, residency: sm.Residency, tier: str | None) -> sm.ServeSpec:
    return sm.ServeSpec(
        name, name, ("g0",), mib, residency, sm.DesiredRun.RUNNING, router_tier=tier
    )


def _executor(desired: sm.DesiredState, docker: Containers, router: FakeRouter) -> Executor:
    return Executor(
        desired,
        docker=docker,  # type: ignore[arg-type]
        router=RouterClient(router.url, TOKEN, attempts=1, max_wait_s=1.0),
        elastic=ElasticClient(attempts=1, initial_wait_s=0.01, max_wait_s=0.1),
        gpus=lambda: None,
        config=CONFIG,
    )


def test_a_failed_victim_stop_is_undone_without_a_fault_and_its_machine_stays_failed(
    errors: list[str],
) -> None:
    """A victim's stop fails after its tier was quiesced and drained: its machine is
    ``failed`` (``stop_failed``), which is the step's failure, not a fault of the undo.
    The undo readmits both victims' tiers and gives the requester's reservation back;
    omni's machine stays failed (observation moves it on), ocr's is back in service."""
    omni = _serve("omni", 6000, sm.Residency.EVICTABLE, "omni-local")
    ocr = _serve("ocr", 4000, sm.Residency.EVICTABLE, "ocr-local")
    llm = _serve("llm", 8000, sm.Residency.ON_DEMAND, None)
    desired = sm.DesiredState({"g0": ROLE}, {"omni": omni, "ocr": ocr, "llm": llm})
    observed = sm.Observed(
        True,
        {
            "omni": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0),
            "ocr": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0),
            "llm": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0),
        },
    )
    ledger = Ledger(
        {"g0": ROLE},
        [GpuReservation("omni", ("g0",), 6000), GpuReservation("ocr", ("g0",), 4000)],
    )
    g = "llm"
    steps = (
        Step(Action.RESERVE, "llm", ("g0",), 8000, "requested", group=g),
        Step(Action.QUIESCE, "omni", ("g0",), 6000, "victim", group=g),
        Step(Action.QUIESCE, "ocr", ("g0",), 4000, "victim", group=g),
        Step(Action.DRAIN, "omni", ("g0",), 6000, "victim", group=g),
        Step(Action.DRAIN, "ocr", ("g0",), 4000, "victim", group=g),
        Step(Action.STOP, "omni", ("g0",), 6000, "victim", group=g),
        Step(Action.STOP, "ocr", ("g0",), 4000, "victim", group=g),
    )
    docker = StopFails({"omni", "ocr"}, failing={"omni"})
    with FakeRouter(token=TOKEN, tiers=TIERS) as router:
        ex = _executor(desired, docker, router)
        report = ex.execute(Plan(steps, (), ledger, ledger), observed, skip_preflight=True)
        assert router.tier("omni-local")["state"] == "admitting"
        assert router.tier("ocr-local")["state"] == "admitting"

    outcomes = [(r.step.action, r.step.serve, r.outcome) for r in report.results]
    assert outcomes == [
        (Action.RESERVE, "llm", Outcome.OK),
        (Action.QUIESCE, "omni", Outcome.OK),
        (Action.QUIESCE, "ocr", Outcome.OK),
        (Action.DRAIN, "omni", Outcome.OK),
        (Action.DRAIN, "ocr", Outcome.OK),
        (Action.STOP, "omni", Outcome.FAILED),
        (Action.STOP, "ocr", Outcome.SKIPPED),
    ]
    assert docker.stops == ["omni"]  # nothing else was stopped by the undo
    stop = report.results[5]
    assert "docker stop omni" in stop.detail, stop.detail
    assert "undo" not in stop.detail, stop.detail
    assert report.undo_faults == []
    assert report.to_json()["undo_faults"] == []
    assert not report.ok  # the failed stop
    assert report.lifecycles == {"llm": "failed", "omni": "failed", "ocr": "running"}
    # the ledger is true: omni still runs (its stop failed), ocr runs, llm was given back
    assert report.ledger.holdings["omni"].mib == 6000
    assert report.ledger.holdings["ocr"].mib == 4000
    assert not report.ledger.holds("llm")
    assert report.left_quiesced == {}  # the router readmitted both
    assert not any("undo" in e for e in errors), errors


def test_an_illegal_transition_settling_a_failed_start_is_reported(errors: list[str]) -> None:
    """A health wait that fails for a serve the machine holds ``stopped`` (the plan has
    no start for it): settling the failed start asks for ``fail``, which is not a
    transition from ``stopped``. Nothing is stopped, nothing released or reserved, and
    the fault is reported."""
    llm = _serve("llm", 8000, sm.Residency.ON_DEMAND, None)
    desired = sm.DesiredState({"g0": ROLE}, {"llm": llm})
    observed = sm.Observed(True, {"llm": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=3)})
    ledger = Ledger({"g0": ROLE}, [])
    wait = Step(Action.AWAIT_READY, "llm", ("g0",), 8000, "a plan that disagrees", group="llm")
    docker = StopFails(set(), failing=set())
    docker.state["llm"] = "exited"
    with FakeRouter(token=TOKEN, tiers=TIERS) as router:
        ex = _executor(desired, docker, router)
        report = ex.execute(Plan((wait,), (), ledger, ledger), observed, skip_preflight=True)

    (result,) = report.results
    assert result.outcome is Outcome.FAILED
    assert "exited (0) while starting" in result.detail, result.detail
    assert 'serve "llm": cannot "fail" while "stopped"' in result.detail, result.detail
    (fault,) = report.undo_faults
    assert (fault.serve, fault.group, fault.trigger, fault.after) == (
        "llm",
        "llm",
        "fail",
        "await_ready llm",
    )
    assert not report.ok and report.to_json()["undo_faults"] == [fault.to_json()]
    assert docker.stops == []
    assert report.ledger.holdings == {}
    assert report.lifecycles == {"llm": "stopped"}
    assert any("undo" in e and "llm" in e for e in errors), errors

    # what `vramctl apply` prints after the steps
    with render.out.capture() as printed:
        render.apply_summary(report, [])
    summary = " ".join(printed.get().split())
    assert summary.startswith("incomplete:"), summary
    assert "undo fault: llm (undoing group llm after await_ready llm): lifecycle:" in summary


def test_a_tier_left_quiesced_at_the_end_of_the_plan_is_readmitted_its_failed_machine_kept(
    errors: list[str],
) -> None:
    """A group whose steps all succeeded but left its tier quiesced is undone when the
    plan ends. Another group's stop of that serve failed meanwhile, so its machine is
    ``failed``: the tier is readmitted, the machine stays failed (observation moves it
    on), and that is no fault of the undo."""
    omni = _serve("omni", 6000, sm.Residency.EVICTABLE, "omni-local")
    desired = sm.DesiredState({"g0": ROLE}, {"omni": omni})
    observed = sm.Observed(
        True, {"omni": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0)}
    )
    ledger = Ledger({"g0": ROLE}, [GpuReservation("omni", ("g0",), 6000)])
    steps = (
        Step(Action.QUIESCE, "omni", ("g0",), 6000, "victim", group="a"),
        Step(Action.DRAIN, "omni", ("g0",), 6000, "victim", group="a"),
        Step(Action.STOP, "omni", ("g0",), 6000, "stopped", group="b"),
    )
    docker = StopFails({"omni"}, failing={"omni"})
    with FakeRouter(token=TOKEN, tiers=TIERS) as router:
        ex = _executor(desired, docker, router)
        report = ex.execute(Plan(steps, (), ledger, ledger), observed, skip_preflight=True)
        assert router.tier("omni-local")["state"] == "admitting"  # readmitted by the undo

    assert [r.outcome for r in report.results] == [Outcome.OK, Outcome.OK, Outcome.FAILED]
    assert "undo" not in report.results[2].detail  # group b had nothing to undo
    assert report.undo_faults == []
    assert not report.ok  # the failed stop
    assert report.lifecycles == {"omni": "failed"}
    assert report.ledger.holdings["omni"].mib == 6000  # its stop failed: still counted
    assert not any("undo" in e for e in errors), errors


class InspectFails(Containers):
    """Docker answers no ``inspect``: what the undo stops or holds cannot be confirmed."""

    def inspect(self, name: str) -> None:  # type: ignore[override]
        raise ActionError(f"inspect {name}: 500 daemon error", transient=False, status=500)


@pytest.mark.parametrize("state", ["waking", "starting", "failed"])
def test_a_failed_start_that_docker_cannot_confirm_down_settles_its_machine(
    state: str, errors: list[str]
) -> None:
    """A health wait failed (after a wake, a start, or with the machine already failed)
    and Docker cannot be asked whether the container is down: the reservation is kept,
    and the machine is settled as in the path where Docker answers (``fail`` from
    waking, ``start_failed`` from starting, nothing when failed), with no undo fault."""
    from controller.service.executor import _Run
    from statemachine.lifecycle.machine import ServeLifecycle

    llm = _serve("llm", 8000, sm.Residency.ON_DEMAND, None)
    desired = sm.DesiredState({"g0": ROLE}, {"llm": llm})
    observed = sm.Observed(
        True, {"llm": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0)}
    )
    ledger = Ledger({"g0": ROLE}, [GpuReservation("llm", ("g0",), 8000)])
    with FakeRouter(token=TOKEN, tiers=TIERS) as router:
        ex = _executor(desired, InspectFails({"llm"}), router)
        machine = ServeLifecycle("llm", state)
        run = _Run(ex, ledger, {"llm": machine}, observed)
        wait = Step(Action.AWAIT_READY, "llm", ("g0",), None, "wait", group="llm")
        faults = run.undo_group("llm", "await_ready llm", wait)
    assert faults == [] and run.undo_faults == []
    assert machine.state == "failed"
    assert run.ledger.holdings["llm"].mib == 8000  # not confirmed down: kept
    assert not any("lifecycle" in e for e in errors), errors
