"""Which requests an answer counts as pending, and the room counted beside each
(statemachine/answers/pending.py): rules the mutation run pins.

- Only a request in force counts: one that has expired is not "requested, not yet
  planned", even where the manifest has the next cycle start its serve anyway.
- A sleeper's request counts at its full (declared) reservation, even when its engine
  was shrunk before it slept and wakes at the shrunk figure: the plan takes it back to
  full, and an answer never counts less than may be held.
- Each pending start lists the room made for it (its own group's victims), never the
  room made for another request.

Pure: the mutation run's pool.
"""

from __future__ import annotations

from statemachine.answers.pending import PendingStart, Room, pending_starts
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.planning.plan_types import (
    Action,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

NOW = 10_000.0
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 100)


def pending(d: sm.DesiredState, obs: sm.Observed) -> tuple[PendingStart, ...]:
    return pending_starts(d, obs, policy=Policy(), now=NOW)


def test_an_expired_request_is_not_pending_even_where_the_manifest_starts_its_serve() -> None:
    x = sm.ServeSpec("x", "c-x", ("a",), 6000, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING)
    expired = sm.OnDemandRequest("x", NOW - 10, 5.0)
    d = sm.DesiredState({"a": sm.GpuRole("a", 40_000, 0)}, {"x": x}, (expired,))
    plan = plan_transitions(d, sm.Observed(True, {}), Policy(), NOW)
    assert [st.action for st in plan.steps][:2] == [Action.RESERVE, Action.START]
    assert pending(d, sm.Observed(True, {})) == ()
    # in force, the same request counts
    live = sm.DesiredState(d.roles, d.serves, (sm.OnDemandRequest("x", NOW - 10, 600.0),))
    assert [p.serve for p in pending(live, sm.Observed(True, {}))] == ["x"]


def test_a_sleeper_shrunk_before_it_slept_counts_at_its_declared_reservation() -> None:
    """s declares 8000 (elastic), was shrunk to 5000, then slept: its wake reserves the
    5000 its engine holds awake, then grows it back to 8000; its request counts 8000."""
    s = sm.ServeSpec(
        "s",
        "c-s",
        ("a",),
        8000,
        sm.Residency.ON_DEMAND,
        sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM, 20_000),
        elastic=sm.Elastic("http://127.0.0.1:1", 4000),
    )
    d = sm.DesiredState(
        {"a": sm.GpuRole("a", 40_000, 0)},
        {"s": s},
        (sm.OnDemandRequest("s", NOW - 10),),
        host=sm.HostBudget(64_000, 4_000),
    )
    obs = sm.Observed(
        True,
        {"c-s": UP},
        sleep={"s": sm.SleepObs(sm.SleepState.ASLEEP, level=1)},
        elastic_mib={"s": 5000},
    )
    wake = plan_transitions(d, obs, Policy(), NOW).steps[0]
    assert (wake.action, wake.to_mib) == (Action.RESERVE_WAKE, 5000)
    assert [(p.serve, p.mib) for p in pending(d, obs)] == [("s", 8000)]


def test_each_pending_start_lists_only_the_room_made_for_it() -> None:
    """x and y, each requested on a full card, each evict that card's evictable: x's
    pending start lists v1's release, y's lists v2's; neither lists the other's."""
    roles = {"a": sm.GpuRole("a", 10_000, 0), "b": sm.GpuRole("b", 10_000, 0)}
    serves = (
        sm.ServeSpec("v1", "c-v1", ("a",), 8000, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING),
        sm.ServeSpec("v2", "c-v2", ("b",), 8000, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING),
        sm.ServeSpec("x", "c-x", ("a",), 6000, sm.Residency.ON_DEMAND),
        sm.ServeSpec("y", "c-y", ("b",), 6000, sm.Residency.ON_DEMAND),
    )
    d = sm.DesiredState(
        roles,
        {s.name: s for s in serves},
        (sm.OnDemandRequest("x", NOW - 10), sm.OnDemandRequest("y", NOW - 5)),
    )
    obs = sm.Observed(True, {"c-v1": UP, "c-v2": UP})
    assert pending(d, obs) == (
        PendingStart("x", ("a",), 6000, (Room("v1", "release", ("a",), 8000),)),
        PendingStart("y", ("b",), 6000, (Room("v2", "release", ("b",), 8000),)),
    )
