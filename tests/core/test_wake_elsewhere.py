"""A sleeper whose wake waits moves (statemachine/planning/placement.py, docs/placement.md), pure.

``p`` (10000 MiB, placed on ``a`` or ``b``, sleeps to 1000 MiB) is asleep on ``a``;
``busy`` fills the rest of ``a`` with a request in flight, so ``p``'s wake waits for it.
Once ``p``'s request has waited what a cold start costs beyond its wake (cold 40 s, wake
4 s: 36 s), and on ``b`` the plan as if ``p`` held nothing starts it, the plan stops
``p`` on ``a`` (its residual and host RAM given back); the next plan places it again and
starts it on ``b``. Short of that wait, or where ``b`` cannot take it, or where a cost
is unknown, it waits for its wake.
"""

from __future__ import annotations

import dataclasses

import pytest

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Action, How, Plan, Policy, RestoreCost
from statemachine.planning.planner import plan_transitions

NOW = 1_000_000.0
ROLES = {"a": sm.GpuRole("a", 10000), "b": sm.GpuRole("b", 10000)}
COSTS = {"p": RestoreCost(40.0, 4.0)}


def running(role: str) -> sm.ContainerObs:
    return sm.ContainerObs(
        sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 3600, gpu_role=role
    )


P = sm.ServeSpec(
    "p",
    "c-p",
    gpu_roles=("a", "b"),
    vram_mib=10000,
    residency=sm.Residency.ON_DEMAND,
    placement=("a", "b"),
    sleep=sm.Sleep(1, 1000, "vllm", 2000),
)


def pinned(name: str, mib: int, role: str) -> sm.ServeSpec:
    return sm.ServeSpec(name, f"c-{name}", gpu_roles=(role,), vram_mib=mib)


def host(waited: float, on_b: int = 0) -> tuple[sm.DesiredState, sm.Observed]:
    """``p`` asleep on ``a``, requested ``waited`` s ago; ``busy`` (9000 MiB, one request
    in flight) beside it; ``other`` (``on_b`` MiB, busy too) on ``b`` when ``on_b``."""
    serves = [P, pinned("busy", 9000, "a")] + ([pinned("other", on_b, "b")] if on_b else [])
    desired = sm.DesiredState(
        ROLES,
        {s.name: s for s in serves},
        (sm.OnDemandRequest("p", NOW - waited),),
        sm.HostBudget(100_000),
    )
    names = [s.name for s in serves]
    seen = sm.Observed(
        True,
        {f"c-{n}": running("a" if n != "other" else "b") for n in names},
        started_with={"c-p": sm.StartedWith("p", ("a",), 10000)},
        sleep={"p": sm.SleepObs(sm.SleepState.ASLEEP, 1, 1000, 2000)},
        in_flight={n: sm.InFlightObs(1, sm.InFlightSource.METRICS) for n in names if n != "p"}
        | {"p": sm.InFlightObs(0, sm.InFlightSource.METRICS)},
    )
    return desired, seen


def plan(
    desired: sm.DesiredState, seen: sm.Observed, costs: dict[str, RestoreCost] = COSTS
) -> Plan:
    return plan_transitions(desired, seen, Policy(reload=costs), NOW)


def stops_p(p: Plan) -> bool:
    return any(st.serve == "p" and st.action is Action.STOP for st in p.steps)


def test_a_sleeper_that_waited_a_cold_starts_worth_is_stopped_to_start_elsewhere() -> None:
    p = plan(*host(waited=36.0))
    assert stops_p(p), [st.to_json() for st in p.steps]
    (decision,) = p.placements
    assert (decision.role, decision.how) == ("b", How.MOVED)
    assert "waited 36s" in decision.reason and "(36.0s)" in decision.reason
    assert not any(st.serve == "busy" for st in p.steps)  # the busy one is left alone


def test_the_next_plan_starts_it_on_the_other_card() -> None:
    desired, seen = host(waited=40.0)
    assert stops_p(plan(desired, seen))
    gone = dataclasses.replace(
        seen,
        containers={c: o for c, o in seen.containers.items() if c != "c-p"},
        started_with={},
        sleep={},
    )
    nxt = plan(desired, gone)
    starts = [st for st in nxt.steps if st.serve == "p" and st.action is Action.START]
    assert [st.gpu_roles for st in starts] == [("b",)]


@pytest.mark.parametrize("waited", [0.0, 20.0, 35.9])
def test_a_sleeper_waits_for_its_wake_until_it_has_waited_that_long(waited: float) -> None:
    p = plan(*host(waited=waited))
    assert not stops_p(p)
    (decision,) = p.placements
    assert decision.how is How.HELD


def test_a_sleeper_stays_where_no_other_card_would_start_it() -> None:
    p = plan(*host(waited=100.0, on_b=5000))  # b: 5000 MiB held by a busy serve
    assert not stops_p(p)


def test_a_sleeper_whose_costs_are_unknown_waits() -> None:
    p = plan(*host(waited=1000.0), costs={})
    assert not stops_p(p)


def test_a_request_lets_only_a_placed_serve_be_stopped_off_its_cards() -> None:
    """The request that lets the plan stop an unmanaged placed sleeper (above) does not
    stop an unmanaged pinned serve re-pinned by an edit: that one runs on as before."""
    q = sm.ServeSpec("q", "c-q", gpu_roles=("b",), vram_mib=1000, residency=sm.Residency.ON_DEMAND)
    desired = sm.DesiredState(ROLES, {"q": q}, (sm.OnDemandRequest("q", NOW - 100),))
    seen = sm.Observed(
        True, {"c-q": running("a")}, started_with={"c-q": sm.StartedWith("q", ("a",), 1000)}
    )
    assert not any(st.serve == "q" for st in plan(desired, seen).steps)


def test_a_resident_sleeper_is_never_moved() -> None:
    """A resident is placed once and stays: however long its request waits."""
    desired, seen = host(waited=1000.0)
    resident = dataclasses.replace(P, residency=sm.Residency.RESIDENT)
    desired = dataclasses.replace(desired, serves={**desired.serves, "p": resident})
    assert not stops_p(plan(desired, seen))


def test_an_awake_serve_is_not_moved_for_a_wake() -> None:
    """The move is a sleeper's: ``p`` awake on ``a`` (requested, costs known, a long
    wait) runs on, though ``b`` could start it."""
    desired, seen = host(waited=1000.0)
    awake = dataclasses.replace(seen, sleep={})
    assert not stops_p(plan(desired, awake))
