"""A start is admitted against the host right before its Docker call, not only at its reserve.

Against the real daemon: a declared container started by hand after the start's
reserve was admitted (here: deterministically, right after the list call that admitted
it) and before the start's own ``docker start`` is seen by that start's admission: the
start is aborted (nothing is started into the room the other now holds; no backoff, as
after a reserve refused the same way), its reservation is given back, and the role is
never overcommitted. The serve's own container, started by hand after its reserve,
is taken as started (no second ``docker start``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import docker
import pytest
from support.serving import free_port
from test_executor_e2e import ROLE, Host, host, serve_toml

from controller.adapters.docker.read import ContainerObserver
from controller.manifest.load import ManifestSet
from controller.service.executor import Outcome
from controller.service.steps.results import ExecutionReport
from controller.service.wiring import containers_now, make_executor
from statemachine.domain.types import Observed, OnDemandRequest
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import (
    Plan,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

__all__ = ["host"]  # the fixture, shared with test_executor_e2e

pytestmark = pytest.mark.docker  # the real daemon: skipped with the others when it is unavailable


class _StartedRightAfterTheList:
    """The executor's fresh reading of the containers, except that right after the
    first one (the reserve's admission) ``other`` is started for real: someone starting
    it by hand after the list call that admitted the reserve, before the start."""

    def __init__(self, read: Callable[[], Observed], other: Callable[[], None]) -> None:
        self._read, self._other, self.reads = read, other, 0

    def __call__(self) -> Observed:
        seen = self._read()
        self.reads += 1
        if self.reads == 1:
            self._other()
        return seen


def _execute_with_a_start_by_hand(
    host: Host,
    docker_client: docker.DockerClient,
    mset: ManifestSet,
    plan: Plan,
    by_hand: str,
) -> tuple[ExecutionReport, _StartedRightAfterTheList]:
    """Execute ``plan`` (llm requested) with ``by_hand``'s container started for real
    right after the reserve's reading of the containers."""
    desired = replace(mset.desired(), requests=(OnDemandRequest("llm", time.time(), None),))
    observer = ContainerObserver(docker_client)
    reads = _StartedRightAfterTheList(
        lambda: containers_now(mset, observer),
        lambda: docker_client.containers.get(host.name(by_hand)).start(),
    )
    executor = make_executor(
        mset, router_url=None, router_token_file=None, gpus=host.gpus_for(mset), observe_now=reads
    )
    executor.desired = desired
    try:
        return executor.execute(plan, host.observe(mset)), reads
    finally:
        observer.close()


def test_a_container_started_by_hand_right_before_the_docker_call_is_seen_by_it(
    host: Host, docker_client: docker.DockerClient
) -> None:
    p_llm, p_side = free_port(), free_port()
    mset = host.manifest(
        ROLE
        + serve_toml("llm", mib=6000, residency="on-demand", port=p_llm)
        # unmanaged: counted in the ledger when it runs, never started by the controller
        + serve_toml("side", mib=6000, residency="resident", port=p_side)
    )
    host.container("llm", port=p_llm, running=False)
    host.container("side", port=p_side, running=False)
    desired = replace(mset.desired(), requests=(OnDemandRequest("llm", time.time(), None),))
    observed = host.observe(mset)
    plan = plan_transitions(desired, observed, Policy(), time.time())
    assert [f"{s.action} {s.serve}" for s in plan.steps][:2] == ["reserve llm", "start llm"]

    report, reads = _execute_with_a_start_by_hand(host, docker_client, mset, plan, "side")

    start = next(r for r in report.results if r.step.action == "start")
    assert start.outcome is Outcome.ABORTED, (start.outcome, start.detail)
    assert "side started outside the controller" in start.detail, start.detail
    assert host.state("llm") != "running" and host.state("side") == "running"
    after = ledger_from_observed(desired, host.observe(mset))
    assert not after.overcommitted(), after.holdings
    assert not report.ledger.holds("llm")
    assert reads.reads == 2  # the reserve's, and the start's right before its call


def test_the_serves_own_container_started_by_hand_after_its_reserve_is_not_started_again(
    host: Host, docker_client: docker.DockerClient
) -> None:
    """llm's own container is started by hand right after its reserve's admission: its
    start sees it running and makes no ``docker start`` (which Docker answers 304, and
    which the controller would take for its own start of a running container). It runs
    as the plan wanted, in the room its reserve holds: the start is ok and says so, the
    reservation is kept, and nothing is stopped."""
    p_llm = free_port()
    mset = host.manifest(ROLE + serve_toml("llm", mib=6000, residency="on-demand", port=p_llm))
    host.container("llm", port=p_llm, running=False)
    desired = replace(mset.desired(), requests=(OnDemandRequest("llm", time.time(), None),))
    observed = host.observe(mset)
    plan = plan_transitions(desired, observed, Policy(), time.time())
    assert [f"{s.action} {s.serve}" for s in plan.steps][:2] == ["reserve llm", "start llm"]

    report, reads = _execute_with_a_start_by_hand(host, docker_client, mset, plan, "llm")

    start = next(r for r in report.results if r.step.action == "start")
    assert start.outcome is Outcome.OK, (start.outcome, start.detail)
    assert "runs already (started outside the controller" in start.detail, start.detail
    assert host.state("llm") == "running"
    assert report.ledger.holds("llm")
    after = ledger_from_observed(desired, host.observe(mset))
    assert after.holds("llm") and not after.overcommitted()
    assert reads.reads == 2
