"""The lifecycle machine is the authority: a step that asks for an illegal transition fails.

A plan (or an executor path) that disagrees with the machine is a bug. The executor
must not pass over it with a warning: the step fails, the failure names the
transition, it is logged as an error, and nothing is done to the container.
"""

from __future__ import annotations

from loguru import logger
from support.fake_docker import FakeContainers, quick_elastic, quick_executor

from controller.service.executor import Outcome
from controller.snapshot import ContainerModel
from statemachine.answers.status_report import lifecycle_from_observation
from statemachine.domain import types as sm
from statemachine.ledger.reservations import Ledger
from statemachine.lifecycle.machine import ACTION_TRIGGERS, TRIGGERS, Trigger, trigger_for
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)


class Containers(FakeContainers):
    """In-memory container runtime that records every stop it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.stops: list[str] = []

    def exists(self, name: str) -> bool:
        return True

    def stop(self, name: str, timeout_s: float) -> None:
        self.stops.append(name)

    def start(self, name: str) -> None:
        raise AssertionError("nothing is started here")

    def inspect(self, name: str) -> ContainerModel | None:
        return ContainerModel(state=sm.ContainerState.EXITED, exit_code=0)


ROLE = sm.GpuRole("g0", 20_000, 0, uuid="GPU-0")


def test_a_stop_of_a_serve_the_machine_holds_stopped_fails_the_step() -> None:
    ocr = sm.ServeSpec("ocr", "ocr", ("g0",), 4000, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING)
    desired = sm.DesiredState({"g0": ROLE}, {"ocr": ocr})
    # the container is exited: the executor's machine for ocr starts in `stopped`,
    # from which `stop` is not a transition
    observed = sm.Observed(True, {"ocr": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)})
    docker = Containers()
    ex = quick_executor(desired, docker, elastic=quick_elastic())
    ledger = Ledger({"g0": ROLE}, [])
    stop = Step(Action.STOP, "ocr", ("g0",), 4000, "a plan that disagrees", group="ocr")
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR", format="{message}")
    try:
        report = ex.execute(Plan((stop,), (), ledger, ledger), observed, skip_preflight=True)
    finally:
        logger.remove(sink)
    assert [r.outcome for r in report.results] == [Outcome.FAILED]
    detail = report.results[0].detail
    assert "lifecycle" in detail and "stop" in detail and "stopped" in detail, detail
    assert docker.stops == []  # nothing was done to the container
    assert any("lifecycle" in e for e in errors), errors


def test_every_action_maps_to_one_trigger_of_the_machine() -> None:
    assert set(ACTION_TRIGGERS) == set(Action)
    assert set(TRIGGERS) == {str(t) for t in Trigger}
    assert trigger_for(Action.RELEASE) is Trigger.STOPPED
    assert trigger_for(Action.AWAIT_READY) is Trigger.READY


def test_status_lifecycle_is_one_of_the_machines_states() -> None:
    from statemachine.lifecycle.machine import LifecycleState

    for obs in (
        sm.ContainerObs(sm.ContainerState.RUNNING),
        sm.ContainerObs(sm.ContainerState.RUNNING, health="starting"),
        sm.ContainerObs(sm.ContainerState.RESTARTING),
        sm.ContainerObs(sm.ContainerState.EXITED, exit_code=137, oom_killed=True),
        sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0),
        sm.ContainerObs(sm.ContainerState.ABSENT),
    ):
        assert isinstance(lifecycle_from_observation(obs), LifecycleState)


def test_a_step_kind_the_executor_does_not_implement_fails_loudly() -> None:
    """The core may plan step kinds (sleep, wake) before an executor carries them out:
    each is refused by name, never passed over as done."""
    from controller.service.executor import IMPLEMENTED_ACTIONS

    ocr = sm.ServeSpec("ocr", "ocr", ("g0",), 4000, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING)
    desired = sm.DesiredState({"g0": ROLE}, {"ocr": ocr})
    observed = sm.Observed(True, {"ocr": sm.ContainerObs(sm.ContainerState.RUNNING)})
    ledger = Ledger({"g0": ROLE}, [])
    for action in sorted(set(Action) - IMPLEMENTED_ACTIONS):
        step = Step(action, "ocr", ("g0",), 4000, "a step kind not carried out", group="ocr")
        plan = Plan((step,), (), ledger, ledger)
        for skip in (False, True):
            docker = Containers()
            ex = quick_executor(desired, docker, elastic=quick_elastic())
            report = ex.execute(plan, observed, skip_preflight=skip)
            assert [r.outcome for r in report.results] != [Outcome.OK], (action, skip)
            text = " ".join(r.detail for r in report.results) + " ".join(
                str(p) for p in getattr(report, "preflight", ())
            )
            assert "not implement" in text, (action, skip, report)
            assert docker.stops == []
