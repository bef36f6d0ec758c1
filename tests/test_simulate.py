"""The simulator the properties trust (statemachine/simulate.py): what a plan that
succeeded leaves of the observation.

It changes only what the plan's steps change; everything else of the observation
(requests in flight and their idleness, health probes, NVML's figures, starts in
progress, memory not back) is carried over as observed, or the next plan would be
made against a host that lost facts no step touched.
"""

from __future__ import annotations

from statemachine.planner import plan_transitions
from statemachine.simulate import apply_plan
from statemachine.types import (
    ContainerObs,
    ContainerState,
    DesiredRun,
    DesiredState,
    GpuObs,
    GpuRole,
    InFlightObs,
    InFlightSource,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
)

NOW = 1_000_000.0


def test_what_no_step_touches_is_carried_over() -> None:
    """A resident answering its on-demand request (two requests in flight, so it is not
    idle for its ``idle_ttl_s``) plans nothing; the applied observation is the observed
    one, requests in flight and probes included: dropped, the next plan would read the
    serve idle and stop it."""
    s = ServeSpec("alpha", "ctr-alpha", ("g0",), 500, Residency.RESIDENT, None, idle_ttl_s=0.0)
    desired = DesiredState(
        {"g0": GpuRole("g0", 1000)}, {"alpha": s}, (OnDemandRequest("alpha", NOW),)
    )
    observed = Observed(
        True,
        {"ctr-alpha": ContainerObs(ContainerState.RUNNING, health="healthy", started_at=0.0)},
        gpus=(GpuObs("GPU-0", 0, "gpu", 1000, 300, 700),),
        undeclared_gpu=("stray",),
        in_flight={"alpha": InFlightObs(2, InFlightSource.METRICS)},
        probes={"alpha": "healthy"},
    )
    plan = plan_transitions(desired, observed, None, NOW)
    assert plan.empty
    after = apply_plan(desired, observed, plan, NOW)
    assert after == observed
    assert plan_transitions(desired, after, None, NOW).empty


def test_a_stop_and_a_start_change_their_containers_only() -> None:
    desired = DesiredState(
        {"g0": GpuRole("g0", 1000)},
        {
            "old": ServeSpec("old", "ctr-old", ("g0",), 500, None, DesiredRun.STOPPED),
            "new": ServeSpec("new", "ctr-new", ("g0",), 500, None, DesiredRun.RUNNING),
        },
    )
    observed = Observed(
        True,
        {"ctr-old": ContainerObs(ContainerState.RUNNING)},
        in_flight={"old": InFlightObs(0, InFlightSource.METRICS)},
    )
    plan = plan_transitions(desired, observed, None, NOW)
    after = apply_plan(desired, observed, plan, NOW)
    assert after.container("ctr-old").state is ContainerState.EXITED
    assert after.container("ctr-new").state is ContainerState.RUNNING
    assert after.in_flight == observed.in_flight
    assert plan_transitions(desired, after, None, NOW).empty


def test_a_stopped_container_says_when_it_finished() -> None:
    """A resident whose request ended by measured idleness (idle 700 s, ``idle_ttl_s``
    600) is stopped; the stop applied, docker shows when it finished, so the request
    stays ended (docs/eviction.md, measured idleness) and the next plan has nothing to
    do. Without the time, the request read as one whose serve never ran: started again."""
    s = ServeSpec("alpha", "ctr-alpha", ("g0",), 500, Residency.RESIDENT, None, idle_ttl_s=600.0)
    desired = DesiredState(
        {"g0": GpuRole("g0", 1000)}, {"alpha": s}, (OnDemandRequest("alpha", NOW - 800),)
    )
    observed = Observed(
        True,
        {"ctr-alpha": ContainerObs(ContainerState.RUNNING, started_at=NOW - 790)},
        in_flight={"alpha": InFlightObs(0, InFlightSource.METRICS, idle_since=NOW - 700)},
    )
    plan = plan_transitions(desired, observed, None, NOW)
    assert [f"{st.action} {st.serve}" for st in plan.steps] == ["stop alpha", "release alpha"]
    after = apply_plan(desired, observed, plan, NOW)
    assert after.container("ctr-alpha").finished_at == NOW
    assert plan_transitions(desired, after, None, NOW).empty
