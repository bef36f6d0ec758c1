"""The simulator the properties trust (statemachine/planning/simulate.py): what a plan that
succeeded leaves of the observation.

It changes only what the plan's steps change; everything else of the observation
(requests in flight and their idleness, health probes, NVML's figures, starts in
progress, memory not back) is carried over as observed, or the next plan would be
made against a host that lost facts no step touched. A wake is a step that changes a
serve's idleness: the shell reads it afresh from the wake.
"""

from __future__ import annotations

from dataclasses import replace

from statemachine.answers.status_report import lifecycle_from_observation
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import GpuReservation, Ledger, Refusal, RefusalKind
from statemachine.lifecycle.machine import LifecycleState
from statemachine.planning.plan_types import Action, Plan, Step
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import apply_plan, ledger_prefixes

NOW = 1_000_000.0


def test_what_no_step_touches_is_carried_over() -> None:
    """A resident answering its on-demand request (two requests in flight, so it is not
    idle for its ``idle_ttl_s``) plans nothing; the applied observation is the observed
    one, requests in flight and probes included: dropped, the next plan would read the
    serve idle and stop it."""
    s = sm.ServeSpec(
        "alpha", "ctr-alpha", ("g0",), 500, sm.Residency.RESIDENT, None, idle_ttl_s=0.0
    )
    desired = sm.DesiredState(
        {"g0": sm.GpuRole("g0", 1000)}, {"alpha": s}, (sm.OnDemandRequest("alpha", NOW),)
    )
    observed = sm.Observed(
        True,
        {"ctr-alpha": sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)},
        gpus=(sm.GpuObs("GPU-0", 0, "gpu", 1000, 300, 700),),
        undeclared_gpu=("stray",),
        in_flight={"alpha": sm.InFlightObs(2, sm.InFlightSource.METRICS)},
        probes={"alpha": "healthy"},
    )
    plan = plan_transitions(desired, observed, None, NOW)
    assert plan.empty
    after = apply_plan(desired, observed, plan, NOW)
    assert after == observed
    assert plan_transitions(desired, after, None, NOW).empty


def test_a_stop_and_a_start_change_their_containers_only() -> None:
    desired = sm.DesiredState(
        {"g0": sm.GpuRole("g0", 1000)},
        {
            "old": sm.ServeSpec("old", "ctr-old", ("g0",), 500, None, sm.DesiredRun.STOPPED),
            "new": sm.ServeSpec("new", "ctr-new", ("g0",), 500, None, sm.DesiredRun.RUNNING),
        },
    )
    observed = sm.Observed(
        True,
        {"ctr-old": sm.ContainerObs(sm.ContainerState.RUNNING)},
        in_flight={"old": sm.InFlightObs(0, sm.InFlightSource.METRICS)},
    )
    plan = plan_transitions(desired, observed, None, NOW)
    after = apply_plan(desired, observed, plan, NOW)
    assert after.container("ctr-old").state is sm.ContainerState.EXITED
    assert after.container("ctr-new").state is sm.ContainerState.RUNNING
    assert after.in_flight == observed.in_flight
    assert plan_transitions(desired, after, None, NOW).empty


def test_a_stopped_container_says_when_it_finished() -> None:
    """A resident whose request ended by measured idleness (idle 700 s, ``idle_ttl_s``
    600) is stopped; the stop applied, docker shows when it finished, so the request
    stays ended (docs/eviction.md, measured idleness) and the next plan has nothing to
    do. Without the time, the request read as one whose serve never ran: started again."""
    s = sm.ServeSpec(
        "alpha", "ctr-alpha", ("g0",), 500, sm.Residency.RESIDENT, None, idle_ttl_s=600.0
    )
    desired = sm.DesiredState(
        {"g0": sm.GpuRole("g0", 1000)}, {"alpha": s}, (sm.OnDemandRequest("alpha", NOW - 800),)
    )
    observed = sm.Observed(
        True,
        {"ctr-alpha": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 790)},
        in_flight={"alpha": sm.InFlightObs(0, sm.InFlightSource.METRICS, idle_since=NOW - 700)},
    )
    plan = plan_transitions(desired, observed, None, NOW)
    assert [f"{st.action} {st.serve}" for st in plan.steps] == ["stop alpha", "release alpha"]
    after = apply_plan(desired, observed, plan, NOW)
    assert after.container("ctr-alpha").finished_at == NOW
    # a requested stop ends cleanly: the serve reads stopped, not failed
    assert after.container("ctr-alpha").exit_code == 0
    assert lifecycle_from_observation(after.container("ctr-alpha")) is LifecycleState.STOPPED
    assert plan_transitions(desired, after, None, NOW).empty


def _moe(elastic_mib: int, other_mib: int) -> tuple[sm.DesiredState, sm.Observed]:
    """moe (20000 declared, elastic) shrunk to ``elastic_mib`` beside other (``other_mib``)."""
    moe = sm.ServeSpec(
        "moe",
        "ctr-moe",
        ("g0",),
        20_000,
        sm.Residency.EVICTABLE,
        sm.DesiredRun.RUNNING,
        elastic=sm.Elastic("http://127.0.0.1:1", 10_000),
    )
    other = sm.ServeSpec("other", "ctr-other", ("g0",), other_mib, None, sm.DesiredRun.RUNNING)
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
    desired = sm.DesiredState({"g0": sm.GpuRole("g0", 30_000)}, {"moe": moe, "other": other})
    return desired, sm.Observed(
        True, {"ctr-moe": up, "ctr-other": up}, elastic_mib={"moe": elastic_mib}
    )


def test_a_grow_back_to_the_declared_reservation_leaves_no_shrunk_figure() -> None:
    """``elastic_mib`` holds the serves that hold less than they declare: grown back to
    its whole ``vram_mib`` the serve is out of it; grown part of the way it holds the
    reservation the grow reached."""
    desired, observed = _moe(14_000, 10_000)  # room for the missing 6000 exactly
    plan = plan_transitions(desired, observed, None, NOW)
    assert [(s.action, s.mib, s.to_mib) for s in plan.steps] == [(Action.GROW, 6000, 20_000)]
    after = apply_plan(desired, observed, plan, NOW)
    assert "moe" not in after.elastic_mib
    assert plan_transitions(desired, after, None, NOW).empty
    desired, observed = _moe(14_000, 12_000)  # 4000 free: seven 512 MiB segments
    plan = plan_transitions(desired, observed, None, NOW)
    assert [(s.action, s.to_mib) for s in plan.steps] == [(Action.GROW, 17_584)]
    assert apply_plan(desired, observed, plan, NOW).elastic_mib == {"moe": 17_584}


def test_a_sleeper_outside_the_ledger_wakes_without_touching_the_ledger() -> None:
    """A serve without ``vram_mib`` holds no reservation: its reserve_wake moves nothing
    (no MiB, no ``to_mib``), so the plan replays through the ledger without a refusal
    and the ledger after it is the one before; applied, the serve is awake."""
    free = sm.ServeSpec(
        "free",
        "ctr-free",
        (),
        None,
        sm.Residency.ON_DEMAND,
        sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM, 0),
    )
    desired = sm.DesiredState(
        {"g0": sm.GpuRole("g0", 1000)}, {"free": free}, (sm.OnDemandRequest("free", NOW - 1),)
    )
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
    observed = sm.Observed(
        True, {"ctr-free": up}, sleep={"free": sm.SleepObs(sm.SleepState.ASLEEP, 1)}
    )
    plan = plan_transitions(desired, observed, None, NOW)
    wake = plan.steps[0]
    assert (wake.action, wake.mib, wake.to_mib) == (Action.RESERVE_WAKE, None, None)
    replayed = list(ledger_prefixes(plan))
    assert [step for step, _ in replayed] == list(plan.steps)
    for _, ledger in replayed:
        assert ledger is plan.ledger_before
    after = apply_plan(desired, observed, plan, NOW)
    assert "free" not in after.sleep


def test_a_replay_stops_at_the_first_refused_step_with_its_arithmetic() -> None:
    """``ledger_prefixes`` replays a plan step by step (what ``tests/support/replay.py`` checks
    every plan with): a step the ledger refuses is yielded with every term of the refusal,
    and nothing after it is replayed (it would run on a ledger that does not exist)."""
    roles = {"g0": sm.GpuRole("g0", 10_000, 1_000)}
    before = Ledger(roles, (GpuReservation("old", ("g0",), 6_000),))
    steps = (
        Step(Action.RESERVE, "a", ("g0",), 2_000, "start a"),
        Step(Action.RESERVE, "b", ("g0",), 2_000, "start b"),
        Step(Action.RELEASE, "old", ("g0",), 6_000, "stop old"),
        Step(Action.RESERVE, "c", ("g0",), 1_000, "start c"),
    )
    plan = Plan(steps, (), before, before)
    replayed = list(ledger_prefixes(plan))
    assert [step.serve for step, _ in replayed] == ["a", "b"]
    (_, admitted), (_, refused) = replayed
    assert isinstance(admitted, Ledger) and admitted.committed_mib("g0") == 8_000
    assert isinstance(refused, Refusal) and refused.kind is RefusalKind.OVER_BUDGET
    (terms,) = refused.terms
    assert (terms.budget_mib, terms.committed_mib, terms.free_mib) == (9_000, 8_000, 1_000)
    assert (terms.requested_mib, terms.shortfall_mib) == (2_000, 1_000)


def test_a_wake_starts_the_woken_serves_idleness_afresh() -> None:
    """An on-demand sleeper requested ``idle_ttl_s`` ago, idle since long before, is
    woken for the request; applied, its idleness counts from the wake (as the shell's
    tracker reads it: ``woke_at``, ``idle_since`` at its first reading awake), so the
    next plan leaves it running: carried over, the request would end the instant the
    serve woke and the next plan would stop it."""
    s = sm.ServeSpec(
        "od",
        "ctr-od",
        ("g0",),
        500,
        sm.Residency.ON_DEMAND,
        idle_ttl_s=60.0,
        sleep=sm.Sleep(2, 1, SleepProtocol.VLLM, 0),
    )
    desired = sm.DesiredState(
        {"g0": sm.GpuRole("g0", 1000)}, {"od": s}, (sm.OnDemandRequest("od", NOW - 60),)
    )
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
    idle = sm.InFlightObs(0, sm.InFlightSource.METRICS, idle_since=NOW - 700, busy_at=NOW - 800)
    observed = sm.Observed(
        True,
        {"ctr-od": up},
        sleep={"od": sm.SleepObs(sm.SleepState.ASLEEP, 2)},
        in_flight={"od": idle},
    )
    plan = plan_transitions(desired, observed, None, NOW)
    assert Action.WAKE in [st.action for st in plan.steps]
    after = apply_plan(desired, observed, plan, NOW)
    assert after.in_flight["od"] == sm.InFlightObs(0, sm.InFlightSource.METRICS, NOW, None, NOW)
    assert plan_transitions(desired, after, None, NOW).empty
    unknown = replace(observed, in_flight={"od": sm.InFlightObs(None, sm.InFlightSource.METRICS)})
    woken = apply_plan(desired, unknown, plan, NOW).in_flight["od"]
    assert woken == sm.InFlightObs(None, sm.InFlightSource.METRICS, None, None, NOW)
