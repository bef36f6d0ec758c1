"""The simulator's rules the mutation run pins (statemachine/planning/simulate.py).

``apply_plan``: a stopped serve's engine is gone, and with it what the engine held of
itself: a shrunk figure (``elastic_mib``) and a sleep. Carried over, the serve's next
start would be read as the shrunk or sleeping engine it replaced: counted below the
reservation it starts with, or woken although it just started awake.

``apply_step``: a step moves memory in the ledger by its action (reserve, release,
shrink, grow, release_to_residual, reserve_wake) and only with the figure that action
reads (``mib`` for a reserve, ``to_mib`` for the others); any other step, or one
without its figure, returns the ledger unchanged (``ledger_prefixes``, which
``tests/support/replay.py`` checks every plan with, replays hand-made plans too).

Pure: the mutation run's pool.
"""

from __future__ import annotations

from dataclasses import replace

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import GpuReservation, Ledger, ledger_from_observed
from statemachine.planning.plan_types import Action, Plan, Step
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import apply_plan, apply_step

NOW = 1_000_000.0
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
ROLES = {"g0": sm.GpuRole("g0", 30_000)}


def _stop_then_start(
    spec: sm.ServeSpec, observed: sm.Observed
) -> tuple[sm.DesiredState, sm.Observed]:
    """``spec`` stopped (desired stopped), then started again (desired running), each
    plan applied; the desired state it runs under and the observation after both."""
    down = sm.DesiredState(ROLES, {spec.name: replace(spec, desired=sm.DesiredRun.STOPPED)})
    stopped = apply_plan(down, observed, plan_transitions(down, observed, None, NOW), NOW)
    assert stopped.container(spec.container).state is sm.ContainerState.EXITED
    up = sm.DesiredState(ROLES, {spec.name: replace(spec, desired=sm.DesiredRun.RUNNING)})
    start = plan_transitions(up, stopped, None, NOW + 10)
    assert [st.action for st in start.steps][:2] == [Action.RESERVE, Action.START]
    return up, apply_plan(up, stopped, start, NOW + 10)


def test_a_stopped_elastic_serve_forgets_its_shrunk_figure_so_its_restart_counts_in_full() -> None:
    """moe (20000 declared, elastic) runs shrunk to 14000 and is stopped: its engine
    forgets the shrink. Started again, it holds its whole 20000 and is counted so."""
    moe = sm.ServeSpec(
        "moe",
        "ctr-moe",
        ("g0",),
        20_000,
        sm.Residency.EVICTABLE,
        elastic=sm.Elastic("http://127.0.0.1:1", 10_000),
    )
    shrunk = sm.Observed(True, {"ctr-moe": UP}, elastic_mib={"moe": 14_000})
    up, after = _stop_then_start(moe, shrunk)
    assert "moe" not in after.elastic_mib
    assert ledger_from_observed(up, after).holdings["moe"].mib == 20_000


def test_a_stopped_sleeper_is_not_asleep_so_its_restart_counts_in_full_and_is_not_woken() -> None:
    """s (8000 declared, residual 1000) is asleep and stopped: a stopped engine sleeps
    no more. Started again, it is awake at its whole 8000 and the next plan has nothing
    to do (read asleep, it would be counted at its residual and woken)."""
    s = sm.ServeSpec(
        "s",
        "ctr-s",
        ("g0",),
        8000,
        sm.Residency.ON_DEMAND,
        sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM, 0),
    )
    asleep = sm.Observed(True, {"ctr-s": UP}, sleep={"s": sm.SleepObs(sm.SleepState.ASLEEP, 1)})
    up, after = _stop_then_start(s, asleep)
    assert "s" not in after.sleep
    assert ledger_from_observed(up, after).holdings["s"].mib == 8000
    assert plan_transitions(up, after, None, NOW + 20).empty


#: the actions that move memory in the ledger, and the figure each reads
_MOVES = {
    Action.RESERVE: "mib",
    Action.RELEASE: None,
    Action.SHRINK: "to_mib",
    Action.GROW: "to_mib",
    Action.RELEASE_TO_RESIDUAL: "to_mib",
    Action.RESERVE_WAKE: "to_mib",
}


def test_a_step_moves_memory_only_by_its_action_and_with_its_figure() -> None:
    ledger = Ledger(ROLES, (GpuReservation("a", ("g0",), 6_000),))
    for action in Action:
        if action in _MOVES:
            continue
        # figures on a step whose action moves nothing: still nothing
        step = Step(action, "a", ("g0",), 2_000, "why", to_mib=1_000, host_mib=500)
        assert apply_step(ledger, step) is ledger, action
    for action, figure in _MOVES.items():
        if figure is None:
            continue
        # the action that moves memory, without the figure it would move it by
        step = Step(action, "a", ("g0",), None, "why")
        assert apply_step(ledger, step) is ledger, action
    # and with it, it moves: the ledger is another one
    for step in (
        Step(Action.RESERVE, "b", ("g0",), 1_000, "why"),
        Step(Action.RELEASE, "a", ("g0",), 6_000, "why"),
        Step(Action.SHRINK, "a", ("g0",), 2_000, "why", to_mib=4_000),
    ):
        moved = apply_step(ledger, step)
        assert isinstance(moved, Ledger) and moved is not ledger, step.action


def test_a_grow_below_a_larger_start_record_keeps_the_engines_figure() -> None:
    """moe declares 8000 now but was started with 12000 (an edit lowered it): unshrunk,
    the ledger counts 12000. Grown back to 10000, above its declaration and below its
    record, its engine's figure (10000) is what it holds and stays; grown to 12000, the
    figure says nothing more and is dropped."""
    spec = sm.ServeSpec(
        "moe",
        "c-moe",
        ("g0",),
        8000,
        sm.Residency.EVICTABLE,
        sm.DesiredRun.RUNNING,
        elastic=sm.Elastic("http://127.0.0.1:1", 1000),
    )
    desired = sm.DesiredState(ROLES, {"moe": spec})
    observed = sm.Observed(
        True,
        {"c-moe": UP},
        elastic_mib={"moe": 6000},
        started_with={"c-moe": sm.StartedWith("moe", ("g0",), 12_000)},
    )
    ledger = ledger_from_observed(desired, observed)
    for to, figure in ((10_000, {"moe": 10_000}), (12_000, {})):
        grow = Step(Action.GROW, "moe", ("g0",), to - 6000, "why", to_mib=to)
        plan = Plan((grow,), (), ledger, ledger)
        after = apply_plan(desired, observed, plan, NOW)
        assert dict(after.elastic_mib) == figure, to
        assert ledger_from_observed(desired, after).view("g0").committed_mib == to


def test_a_stopped_containers_start_record_ends_with_it() -> None:
    """The shell ends a start record once docker shows its container stopped: the
    simulated stop does too, so nothing after it (where a stopped placed serve is shown,
    a start outside the ledger) reads the reservation of a run that is over."""
    llm = sm.ServeSpec("llm", "ctr-llm", ("g0",), 20_000, sm.Residency.EVICTABLE)
    ran = sm.Observed(
        True, {"ctr-llm": UP}, started_with={"ctr-llm": sm.StartedWith("llm", ("g0",), 25_000)}
    )
    down = sm.DesiredState(ROLES, {"llm": replace(llm, desired=sm.DesiredRun.STOPPED)})
    stopped = apply_plan(down, ran, plan_transitions(down, ran, None, NOW), NOW)
    assert stopped.container("ctr-llm").state is sm.ContainerState.EXITED
    assert "ctr-llm" not in stopped.started_with
