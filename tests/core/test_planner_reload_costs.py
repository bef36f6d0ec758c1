"""The planner weighs victims by what they cost to bring back (docs/eviction.md).

Among victim sets of as many victims and as many possibly busy, the one cheapest to
bring back: a victim's cold start when it is stopped, its wake when it sleeps
(``Policy.reload``), weighted by how recently it was used (``Policy.last_used``); a
victim of unknown cost is spared before any of known cost. Costs never change how
many victims a plan stops, never make a resident or a busy-protected serve a victim,
and without costs the plan is the one before. Pure: imports statemachine only.
"""

from __future__ import annotations

import dataclasses

from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.core import spec

from statemachine.domain import types as sm
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import Action, Plan, Policy, RestoreCost
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import ledger_prefixes
from statemachine.planning.victims import RECENCY_HALF_S, recency_weight

NOW = 100_000.0
ROLES = {"a": sm.GpuRole("a", 32_000, 2_000)}  # budget 30000
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)


def sv(name: str, mib: int, residency: sm.Residency, *, sleeps: bool = False) -> sm.ServeSpec:
    desired = sm.DesiredRun.RUNNING if residency is sm.Residency.RESIDENT else None
    sleep = sm.Sleep(1, 1_000, "vllm", 2_000) if sleeps else None
    return spec(name, mib, residency, desired=desired, sleep=sleep)


def plan(serves: list[sm.ServeSpec], running: list[str], policy: Policy, **obs: object) -> Plan:
    desired = sm.DesiredState(
        ROLES,
        {s.name: s for s in serves},
        (sm.OnDemandRequest("req", NOW - 1),),
        host=sm.HostBudget(64_000, 0),
    )
    observed = sm.Observed(True, {f"c-{n}": UP for n in running}, **obs)  # type: ignore[arg-type]
    result = plan_transitions(desired, observed, policy, NOW)
    for _step, out in ledger_prefixes(result):
        assert isinstance(out, Ledger) and not out.overcommitted(), out
    return result


def victims(result: Plan) -> list[str]:
    return sorted(s.serve for s in result.steps if s.action in (Action.STOP, Action.SLEEP))


REQ = sv("req", 10_000, sm.Residency.ON_DEMAND)
# 30000 budget: big 12000 + cheap 9000 + dear 9000 = 30000 committed; req needs 10000
BIG = sv("big", 12_000, sm.Residency.EVICTABLE)
CHEAP = sv("cheap", 9_000, sm.Residency.EVICTABLE)
DEAR = sv("dear", 9_000, sm.Residency.EVICTABLE)
SERVES = [REQ, BIG, CHEAP, DEAR]
HELD = ["big", "cheap", "dear"]


def costs(**cold: float | None) -> Policy:
    return Policy(reload={n: RestoreCost(c, None) for n, c in cold.items()})


def test_without_costs_the_least_overshoot_wins() -> None:
    # one victim covers 10000: big (12000) frees the least beyond the need
    assert victims(plan(SERVES, HELD, Policy())) == ["big"]


def test_the_victim_cheapest_to_bring_back_wins_among_as_many_victims() -> None:
    # big takes 98 s to come back, cheap and dear each cannot cover alone: big's
    # single-victim cover still beats two victims, whatever they cost
    assert victims(plan(SERVES, HELD, costs(big=98.0, cheap=1.0, dear=1.0))) == ["big"]
    # two that cover alone: the cheaper one is stopped, not the smaller overshoot
    two = [
        REQ,
        sv("small", 11_000, sm.Residency.EVICTABLE),
        sv("large", 19_000, sm.Residency.EVICTABLE),
    ]
    held = ["small", "large"]
    assert victims(plan(two, held, Policy())) == ["small"]
    assert victims(plan(two, held, costs(small=98.0, large=21.0))) == ["large"]
    assert victims(plan(two, held, costs(small=21.0, large=98.0))) == ["small"]


def test_a_victim_of_unknown_cost_is_spared_before_one_of_known_cost() -> None:
    two = [
        REQ,
        sv("small", 11_000, sm.Residency.EVICTABLE),
        sv("large", 19_000, sm.Residency.EVICTABLE),
    ]
    # large's cost is known (even a long one), small's unknown: large is taken
    assert victims(plan(two, ["small", "large"], costs(large=98.0))) == ["large"]


def test_recency_weighs_the_cost_a_long_idle_model_is_cheap_to_lose() -> None:
    two = [
        REQ,
        sv("small", 11_000, sm.Residency.EVICTABLE),
        sv("large", 19_000, sm.Residency.EVICTABLE),
    ]
    held = ["small", "large"]
    # both take 47 s; small was used just now, large an hour ago: large goes
    used = {"small": NOW - 1.0, "large": NOW - 3_600.0}
    pol = Policy(reload={"small": RestoreCost(47.0), "large": RestoreCost(47.0)}, last_used=used)
    assert victims(plan(two, held, pol)) == ["large"]
    # small's 21 s is still cheaper than large's 98 s an hour old? 21 x 1 > 98 x 300/3900
    pol = Policy(reload={"small": RestoreCost(21.0), "large": RestoreCost(98.0)}, last_used=used)
    assert victims(plan(two, held, pol)) == ["large"]


def test_a_sleeper_is_weighed_by_its_wake_a_stop_by_its_cold_start() -> None:
    # both can sleep (freeing 10000 and 18000); small wakes in 5.4 s, large in 0.1 s
    two = [
        REQ,
        sv("small", 11_000, sm.Residency.EVICTABLE, sleeps=True),
        sv("large", 19_000, sm.Residency.EVICTABLE, sleeps=True),
    ]
    pol = Policy(reload={"small": RestoreCost(21.0, 5.4), "large": RestoreCost(98.0, 0.1)})
    result = plan(two, ["small", "large"], pol)
    assert [(s.action, s.serve) for s in result.steps if s.action is Action.SLEEP] == [
        (Action.SLEEP, "large")
    ]


def test_a_weight_is_one_just_used_half_after_the_half_time_and_falls() -> None:
    assert RECENCY_HALF_S == 300.0  # five minutes, as documented
    assert recency_weight(300.0) == 0.5 and recency_weight(600.0) == 1 / 3
    assert recency_weight(1.0) == 300 / 301  # a second idle already counts
    assert recency_weight(None) == 1.0
    assert recency_weight(0.0) == 1.0
    assert recency_weight(-5.0) == 1.0  # used "after" now (clocks apart): just used
    assert recency_weight(-0.5) == 1.0
    assert recency_weight(RECENCY_HALF_S) == 0.5
    assert recency_weight(2 * RECENCY_HALF_S) == 1 / 3
    assert Policy().victim_cost("x", None, NOW, wake=False) is None
    pol = Policy(reload={"x": RestoreCost(40.0, 2.0)}, last_used={"x": NOW - RECENCY_HALF_S})
    assert pol.victim_cost("x", None, NOW, wake=False) == 20.0
    assert pol.victim_cost("x", None, NOW, wake=True) == 1.0
    # no last use: its start stands in; neither: weight 1
    assert Policy(reload={"x": RestoreCost(40.0)}).victim_cost("x", NOW, NOW, wake=False) == 40.0
    assert Policy(reload={"x": RestoreCost(40.0)}).victim_cost("x", None, NOW, wake=False) == 40.0


cost = st.none() | st.sampled_from([0.1, 0.8, 2.9, 5.4, 21.0, 46.0, 47.0, 98.0])
sizes = st.sampled_from([3_000, 5_000, 8_000, 9_000, 11_000, 14_000])
holder = st.tuples(sizes, cost, st.sampled_from(["evictable", "resident"]))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(sizes, cost, st.sampled_from(["evictable", "evictable", "resident"])),
        min_size=3,
        max_size=6,
    ),
    # a need the free room mostly lacks: the holders fill the card to within one or two
    # of them, so most draws choose victims, and many among several covers
    st.integers(6_000, 20_000),
    st.lists(st.none() | st.integers(0, 2), min_size=5, max_size=5),
)
def test_costs_never_change_how_many_victims_nor_who_may_be_one(
    holders: list[tuple[int, float | None, str]], need: int, busy: list[int | None]
) -> None:
    serves = [sv("req", need, sm.Residency.ON_DEMAND)]
    reload: dict[str, RestoreCost] = {}
    committed = 0
    for i, (mib, c, kind) in enumerate(holders):
        if committed + mib > 30_000:
            break
        committed += mib
        name = f"h{i}"
        serves.append(sv(name, mib, sm.Residency(kind)))
        reload[name] = RestoreCost(c)
    held = [s.name for s in serves[1:]]
    in_flight = {
        n: sm.InFlightObs(b, sm.InFlightSource.METRICS) for n, b in zip(held, busy, strict=False)
    }
    before = plan(serves, held, Policy(), in_flight=in_flight)
    after = plan(serves, held, Policy(reload=reload), in_flight=in_flight)
    event(f"victims: {min(len(victims(after)), 2)}{'+' if len(victims(after)) > 2 else ''}")
    event("costs change who" if victims(after) != victims(before) else "costs change nothing")
    if not any(s.action is Action.START for s in after.steps):
        event("the requester is blocked")
    residents = {s.name for s in serves if s.residency is sm.Residency.RESIDENT}
    assert not residents & set(victims(after))  # residents are never victims
    assert len(victims(after)) == len(victims(before))  # fewest victims still comes first

    def possibly_busy(names: list[str]) -> int:
        # a holder past the drawn counts has no source: its count is unknown (None)
        return sum(1 for n in names if in_flight.get(n, sm.NO_SOURCE).count != 0)

    assert possibly_busy(victims(after)) == possibly_busy(victims(before))
    # the requester starts in both or in neither: costs choose among covers, never refuse
    started = [s.serve for s in after.steps if s.action is Action.START]
    assert started == [s.serve for s in before.steps if s.action is Action.START]


def test_the_manifests_figures_decide_where_nothing_was_measured() -> None:
    # vramctl plan / fit / the API's decisions have no measurements: the declared
    # cold_start_s weighs the same way the loop's measured medians do
    def declared(name: str, mib: int, cold: float) -> sm.ServeSpec:
        return dataclasses.replace(sv(name, mib, sm.Residency.EVICTABLE), cold_start_s=cold)

    two = [REQ, declared("small", 11_000, 98.0), declared("large", 19_000, 21.0)]
    assert victims(plan(two, ["small", "large"], Policy())) == ["large"]
    # a measured figure (the policy's) wins over the declared one
    measured = Policy(reload={"large": RestoreCost(120.0)})
    assert victims(plan(two, ["small", "large"], measured)) == ["small"]


def test_a_declared_wake_weighs_a_sleeper_and_a_policy_figure_of_one_kind_only_fills_it() -> None:
    declared = RestoreCost(40.0, 3.0)
    # the policy knows only the cold start: the wake comes from the manifest
    pol = Policy(reload={"x": RestoreCost(60.0, None)})
    assert pol.victim_cost("x", None, NOW, wake=True, declared=declared) == 3.0
    assert pol.victim_cost("x", None, NOW, wake=False, declared=declared) == 60.0
    assert Policy().victim_cost("x", None, NOW, wake=False, declared=declared) == 40.0
    assert Policy().victim_cost("x", None, NOW, wake=True, declared=None) is None
