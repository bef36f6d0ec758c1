"""The order of on-demand starts (docs/eviction.md, "Backfill and priority"), pure.

The documented order of on-demand requesters is: the ``desired = "running"`` ones first
(by descending ``priority``, then name), **then requests oldest first**. Request age
comes before priority: a higher priority does not let a younger request take the room
an older one is waiting for. ``priority`` only breaks ties among requests of the same
age (and orders the ``running`` ones). The cases of ``tests/core/test_planner_edges.py``
give every serve the same priority, so they cannot tell age-first from priority-first;
each case here sets the two against each other.

One role, capacity 32000 MiB, reserve 2000: budget 30000. Two serves of 20000 MiB:
only the first in the order fits; the other is blocked.
"""

from __future__ import annotations

import pytest
from support.core import spec

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Action, Plan, Policy
from statemachine.planning.planner import plan_transitions

NOW = 10_000.0
ROLES = {"a": sm.GpuRole("a", 32_000, 2_000)}


def on_demand(name: str, priority: int, *, running: bool = False) -> sm.ServeSpec:
    """An on-demand serve of 20000 MiB on ``a`` (``running``: desired ``running``)."""
    desired = sm.DesiredRun.RUNNING if running else None
    return spec(name, 20_000, sm.Residency.ON_DEMAND, desired=desired, priority=priority)


def plan(serves: list[sm.ServeSpec], asked: dict[str, float]) -> Plan:
    """The plan on an empty host, each serve of ``asked`` requested ``asked[s]`` s ago."""
    requests = tuple(sm.OnDemandRequest(n, NOW - age) for n, age in asked.items())
    desired = sm.DesiredState(ROLES, {s.name: s for s in serves}, requests)
    return plan_transitions(desired, sm.Observed(True), Policy(), NOW)


def started(p: Plan) -> list[str]:
    return [s.serve for s in p.steps if s.action is Action.START]


def blocked(p: Plan) -> list[str]:
    return [b.serve for b in p.blocked]


@pytest.mark.parametrize("declared_first", ["older", "younger"])
def test_an_older_request_starts_before_a_younger_one_of_higher_priority(
    declared_first: str,
) -> None:
    """Rule: on-demand requests start oldest first, whatever their priority (request age
    before priority). ``old`` (priority 1) was asked 60 s ago, ``young`` (priority 9)
    10 s ago: ``old`` takes the room, ``young`` waits."""
    old, young = on_demand("old", 1), on_demand("young", 9)
    serves = [old, young] if declared_first == "older" else [young, old]
    p = plan(serves, {"young": 10.0, "old": 60.0})
    assert started(p) == ["old"]
    assert blocked(p) == ["young"]


def test_priority_orders_requests_of_the_same_age() -> None:
    """Rule: requests of the same age go by descending priority (then name): ``zzz``
    (priority 9) before ``aaa`` (priority 1), though ``aaa`` comes first by name."""
    p = plan([on_demand("aaa", 1), on_demand("zzz", 9)], {"aaa": 30.0, "zzz": 30.0})
    assert started(p) == ["zzz"]
    assert blocked(p) == ["aaa"]


def test_a_desired_running_on_demand_serve_starts_before_any_request_whatever_its_priority() -> (
    None
):
    """Rule: the ``desired = "running"`` on-demand serves come before every request, even
    one of higher priority asked long ago: ``wanted`` (priority 1, running) before
    ``asked`` (priority 9, asked an hour ago)."""
    p = plan(
        [on_demand("asked", 9), on_demand("wanted", 1, running=True)],
        {"asked": 3600.0},
    )
    assert started(p) == ["wanted"]
    assert blocked(p) == ["asked"]
