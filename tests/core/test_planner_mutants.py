"""Planner cases that tell apart mutants once listed as equivalent
(tests/mutation/equivalent.toml, docs/mutation.md).

Each case is written from the rules of docs/eviction.md (sleep instead of stop; a
sleep frees ``held - residual_mib``) and pins the behaviour one mutant of
``statemachine/planning/planner.py`` changes. The plan is replayed through the ledger
(never over budget) and applied and planned again (it converges).
"""

from __future__ import annotations

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import Action, Plan
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import apply_plan, ledger_prefixes

NOW = 10_000.0
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
AWAKE = sm.SleepObs(sm.SleepState.AWAKE)


def lines(result: Plan) -> list[str]:
    return [f"{s.action} {s.serve}" for s in result.steps]


def test_an_elastic_sleeper_shrunk_to_its_residual_is_stopped_not_slept() -> None:
    """``held > residual_mib`` in ``sleepable``: a sleep of a serve that holds exactly
    its residual frees nothing, so it is no sleep victim; when its MiB is needed it is
    stopped (its 300 MiB freed), while the other victim, whose sleep frees 500 MiB,
    sleeps. Counting it as sleepable (``>=``) turns the sleeps into two stops."""
    roles = {"g0": sm.GpuRole("g0", 1000)}
    a = sm.ServeSpec(
        "a",
        "c-a",
        ("g0",),
        600,
        sm.Residency.EVICTABLE,
        sm.DesiredRun.RUNNING,
        sleep=sm.Sleep(2, 100, SleepProtocol.VLLM),
    )
    b = sm.ServeSpec(
        "b",
        "c-b",
        ("g0",),
        1000,
        sm.Residency.EVICTABLE,
        sm.DesiredRun.RUNNING,
        elastic=sm.Elastic("http://127.0.0.1:1", floor_mib=300, segment_mib=100),
        sleep=sm.Sleep(2, 300, SleepProtocol.VLLM),
    )
    q = sm.ServeSpec("q", "c-q", ("g0",), 900, sm.Residency.ON_DEMAND)
    desired = sm.DesiredState(
        roles, {s.name: s for s in (a, b, q)}, (sm.OnDemandRequest("q", NOW - 1),)
    )
    observed = sm.Observed(
        True,
        {"c-a": UP, "c-b": UP},
        elastic_mib={"b": 300},
        sleep={"a": AWAKE, "b": AWAKE},
    )
    result = plan_transitions(desired, observed, None, NOW)
    for _step, out in ledger_prefixes(result):
        assert isinstance(out, Ledger), out
        assert not out.overcommitted()
    kinds = {(s.action, s.serve) for s in result.steps}
    assert (Action.SLEEP, "a") in kinds
    assert (Action.STOP, "b") in kinds
    assert (Action.STOP, "a") not in kinds and (Action.SLEEP, "b") not in kinds
    mib = {(s.action, s.serve): s.mib for s in result.steps}
    assert mib[(Action.RELEASE_TO_RESIDUAL, "a")] == 500  # 600 held, 100 residual
    assert mib[(Action.RELEASE, "b")] == 300  # all it holds, shrunk to its residual
    assert lines(result)[-3:] == ["reserve q", "start q", "await_ready q"]
    after = apply_plan(desired, observed, result, NOW + 1)
    again = plan_transitions(desired, after, None, NOW + 1)
    assert again.empty, lines(again)
