"""Placement by the one victim order (statemachine/planning/placement.py, docs/placement.md), pure.

Where no candidate card has room, the plan with the serve on each card is made and the
cards compared by: the serve starts there; then the victim order
(``statemachine.planning.victims.preference_key``: fewest victims, fewest possibly busy,
cheapest to bring back, least freed beyond the need, priorities, starts, names) over
the serves that plan stops or puts to sleep for it, as the planner weighed them
(``Plan.room``); then the declared order. Two cards of 10000 MiB, ``a`` declared
first: a tie on everything the order weighs goes to ``a``.
"""

from __future__ import annotations

import pytest
from support.core import spec

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Action, How, Plan, Policy, RestoreCost
from statemachine.planning.planner import plan_transitions
from statemachine.planning.victims import Candidate, recency_weight

NOW = 1_000_000.0
ROLES = {"a": sm.GpuRole("a", 10000), "b": sm.GpuRole("b", 10000)}
RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 3600)


def pinned(name: str, mib: int, role: str, **kw: object) -> sm.ServeSpec:
    """An evictable serve on ``role`` (``desired`` unset: it runs, nothing asks more)."""
    residency = kw.pop("residency", sm.Residency.EVICTABLE)
    return spec(name, mib, residency, roles=(role,), **kw)  # type: ignore[arg-type]


def requested(mib: int) -> sm.ServeSpec:
    """``p``, on-demand, placed on ``a`` or ``b``."""
    return sm.ServeSpec(
        "p",
        "c-p",
        gpu_roles=("a", "b"),
        vram_mib=mib,
        residency=sm.Residency.ON_DEMAND,
        placement=("a", "b"),
    )


def fleet(*serves: sm.ServeSpec) -> sm.DesiredState:
    return sm.DesiredState(ROLES, {s.name: s for s in serves}, (sm.OnDemandRequest("p", NOW),))


def counts(**in_flight: int | None) -> dict[str, sm.InFlightObs]:
    return {n: sm.InFlightObs(c, sm.InFlightSource.METRICS) for n, c in in_flight.items()}


def observed(*names: str, in_flight: dict[str, sm.InFlightObs] | None = None) -> sm.Observed:
    return sm.Observed(True, {f"c-{n}": RUNNING for n in names}, in_flight=in_flight or {})


def plan(desired: sm.DesiredState, seen: sm.Observed, policy: Policy | None = None) -> Plan:
    return plan_transitions(desired, seen, policy, NOW)


def placed_on(p: Plan) -> tuple[str | None, How]:
    (decision,) = p.placements
    return decision.role, decision.how


def stopped(p: Plan) -> set[str]:
    return {s.serve for s in p.steps if s.action is Action.STOP}


# ── the terms the old placement order did not weigh ────────────────────────────────


def test_a_busy_victim_on_one_card_is_not_stopped_when_an_idle_one_on_the_other_would_do() -> None:
    # each card: one victim of 4000 (6000 free): p (8000) is short 2000 on either, and
    # either victim covers it with the same 2000 to spare; a1 has requests in flight
    desired = fleet(pinned("a1", 4000, "a"), pinned("b1", 4000, "b"), requested(8000))
    p = plan(desired, observed("a1", "b1", in_flight=counts(a1=2, b1=0)))
    assert placed_on(p) == ("b", How.VICTIMS)
    assert stopped(p) == {"b1"}


def test_an_unknown_count_of_requests_is_possibly_busy_never_idle() -> None:
    desired = fleet(pinned("a1", 4000, "a"), pinned("b1", 4000, "b"), requested(8000))
    p = plan(desired, observed("a1", "b1", in_flight=counts(a1=None, b1=0)))
    assert placed_on(p) == ("b", How.VICTIMS)


def test_an_idle_victim_is_taken_even_where_it_frees_more_than_needed() -> None:
    # a1 (busy) frees exactly the 2000 p lacks on a; b1 (idle) frees 3000 more than
    # that on b: possibly busy comes before overshoot in the order
    desired = fleet(pinned("a1", 4000, "a"), pinned("b1", 7000, "b"), requested(8000))
    p = plan(desired, observed("a1", "b1", in_flight=counts(a1=1, b1=0)))
    assert placed_on(p) == ("b", How.VICTIMS)
    assert stopped(p) == {"b1"}


def test_fewest_victims_still_comes_first() -> None:
    # a: one busy victim covers the 2000 short; b (a resident of 2000 there too, 2500
    # free): both idle ones are needed for the 5500 short
    desired = fleet(
        pinned("a1", 4000, "a"),
        pinned("rb", 2000, "b", residency=sm.Residency.RESIDENT),
        pinned("b1", 3000, "b"),
        pinned("b2", 2500, "b"),
        requested(8000),
    )
    seen = observed("a1", "rb", "b1", "b2", in_flight=counts(a1=3, b1=0, b2=0))
    p = plan(desired, seen)
    assert placed_on(p) == ("a", How.VICTIMS)
    assert stopped(p) == {"a1"}


@pytest.mark.parametrize("how", ["declared", "measured"])
def test_a_600s_cold_start_is_not_chosen_over_a_5s_one(how: str) -> None:
    # each card: one victim that covers with the same MiB to spare; a1 takes 600 s to
    # come back, b1 5 s (declared cold_start_s, or measured: Policy.reload)
    if how == "declared":
        serves = [pinned("a1", 4000, "a", cold_start_s=600.0), pinned("b1", 4000, "b")]
        serves[1] = pinned("b1", 4000, "b", cold_start_s=5.0)
        policy = Policy()
    else:
        serves = [pinned("a1", 4000, "a"), pinned("b1", 4000, "b")]
        policy = Policy(reload={"a1": RestoreCost(600.0, None), "b1": RestoreCost(5.0, None)})
    p = plan(fleet(*serves, requested(8000)), observed("a1", "b1"), policy)
    assert placed_on(p) == ("b", How.VICTIMS)
    assert stopped(p) == {"b1"}


def test_the_cheaper_victim_to_bring_back_is_taken_even_where_it_frees_more() -> None:
    # a1 frees exactly what p lacks but takes 600 s to come back; b1 frees 3000 more
    # and comes back in 5 s: the cost comes before overshoot
    desired = fleet(
        pinned("a1", 4000, "a", cold_start_s=600.0),
        pinned("b1", 7000, "b", cold_start_s=5.0),
        requested(8000),
    )
    assert placed_on(plan(desired, observed("a1", "b1"))) == ("b", How.VICTIMS)


def test_a_victim_of_unknown_cost_is_spared_before_one_of_a_known_cost() -> None:
    desired = fleet(
        pinned("a1", 4000, "a"),  # unknown: it may be the dearest of all
        pinned("b1", 4000, "b", cold_start_s=98.0),
        requested(8000),
    )
    assert placed_on(plan(desired, observed("a1", "b1"))) == ("b", How.VICTIMS)


def test_priorities_then_starts_then_names_decide_between_alike_victims() -> None:
    # alike in count, busy, cost and overshoot: the less important victim goes
    desired = fleet(
        pinned("a1", 4000, "a", priority=0), pinned("b1", 4000, "b", priority=5), requested(8000)
    )
    assert placed_on(plan(desired, observed("a1", "b1"))) == ("a", How.VICTIMS)
    desired = fleet(
        pinned("a1", 4000, "a", priority=5), pinned("b1", 4000, "b", priority=0), requested(8000)
    )
    assert placed_on(plan(desired, observed("a1", "b1"))) == ("b", How.VICTIMS)
    # alike in priority: the one started earlier (the most recent start as old as can be)
    later = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 600)
    seen = sm.Observed(True, {"c-a1": later, "c-b1": RUNNING})
    desired = fleet(pinned("a1", 4000, "a"), pinned("b1", 4000, "b"), requested(8000))
    assert placed_on(plan(desired, seen)) == ("b", How.VICTIMS)


def test_sets_alike_but_for_their_names_go_by_the_names_not_the_declared_order() -> None:
    # b's victim sorts first by name; everything else alike
    desired = fleet(pinned("z1", 4000, "a"), pinned("b1", 4000, "b"), requested(8000))
    assert placed_on(plan(desired, observed("z1", "b1"))) == ("b", How.VICTIMS)


# ── sleepers, forced stops, shrinks ───────────────────────────────────────────────


def sleeper(name: str, mib: int, role: str, **kw: object) -> sm.ServeSpec:
    sleep = sm.Sleep(level=2, residual_mib=1000, protocol="vllm", **kw)  # type: ignore[arg-type]
    return pinned(name, mib, role, sleep=sleep)


def test_a_victim_put_to_sleep_is_weighed_at_what_its_sleep_frees_and_by_its_wake() -> None:
    # p (8000) lacks 2000 on either card. a1 can sleep: asleep it frees 3000 of its
    # 4000, 1000 more than needed; b1 (beside a resident) stopped frees exactly 2000.
    # a1's wake takes 2 s where b1's cold start takes 60 s: a, a1 put to sleep
    resident = pinned("rb", 2000, "b", residency=sm.Residency.RESIDENT)
    desired = fleet(
        sleeper("a1", 4000, "a", wake_s=2.0),
        resident,
        pinned("b1", 2000, "b", cold_start_s=60.0),
        requested(8000),
    )
    p = plan(desired, observed("a1", "rb", "b1"))
    assert placed_on(p) == ("a", How.VICTIMS)
    assert {s.serve for s in p.steps if s.action is Action.SLEEP} == {"a1"} and not stopped(p)
    # without costs the overshoot decides, as the planner's own choice on one card
    # would: b1's stop frees exactly what is short
    desired = fleet(sleeper("a1", 4000, "a"), resident, pinned("b1", 2000, "b"), requested(8000))
    p = plan(desired, observed("a1", "rb", "b1"))
    assert placed_on(p) == ("b", How.VICTIMS) and stopped(p) == {"b1"}


def test_a_stop_forced_by_exclusivity_counts_as_a_victim() -> None:
    # a: x, exclusive on a, must stop for p to start there (p then fits: nothing more
    # is evicted; the plan's victim search chooses none) and frees 2000 more than p
    # lacks; b: b1, beside a resident, frees exactly the 2000 p lacks there
    desired = fleet(
        pinned("x", 6000, "a", exclusive=True),
        pinned("rb", 2000, "b", residency=sm.Residency.RESIDENT),
        pinned("b1", 2000, "b"),
        requested(8000),
    )
    p = plan(desired, observed("x", "rb", "b1"))
    (decision,) = p.placements
    weighed = {c.role: c for c in decision.candidates}
    assert weighed["a"].victims == ("x",) and weighed["b"].victims == ("b1",)
    assert (decision.role, decision.how) == ("b", How.VICTIMS)
    assert stopped(p) == {"b1"}


def test_a_card_whose_plan_stops_nothing_is_taken_over_one_that_stops_a_serve() -> None:
    # a: e, elastic, can give back the 2000 p lacks; b: b1 must stop
    elastic = sm.Elastic("http://127.0.0.1:1", floor_mib=1000, segment_mib=500)
    desired = fleet(
        pinned("e", 4000, "a", elastic=elastic), pinned("b1", 4000, "b"), requested(8000)
    )
    p = plan(desired, observed("e", "b1"))
    assert placed_on(p) == ("a", How.VICTIMS)
    assert {s.action for s in p.steps if s.serve == "e"} == {Action.SHRINK} and not stopped(p)


def test_cards_whose_plans_stop_nothing_go_by_the_declared_order() -> None:
    # both cards make room by shrinking alone, a in whole segments of 500 (2200 short:
    # 2500 given back), b of 1000 (3200 short: 4000): nothing is stopped or put to
    # sleep either way, so nothing the victim order weighs tells them apart (neither
    # what they lack nor what they give back beyond it)
    desired = fleet(
        pinned("ea", 4000, "a", elastic=sm.Elastic("http://a", floor_mib=1000, segment_mib=500)),
        pinned("eb", 5000, "b", elastic=sm.Elastic("http://b", floor_mib=1000, segment_mib=1000)),
        requested(8200),
    )
    p = plan(desired, observed("ea", "eb"))
    assert placed_on(p) == ("a", How.VICTIMS)
    assert [(c.role, c.freed_mib) for c in p.placements[0].candidates] == [
        ("a", 2500),
        ("b", 4000),
    ]
    # the other way round (a lacks more and gives back more beyond it): a still
    swapped = fleet(
        pinned("ea", 5000, "a", elastic=sm.Elastic("http://a", floor_mib=1000, segment_mib=1000)),
        pinned("eb", 4000, "b", elastic=sm.Elastic("http://b", floor_mib=1000, segment_mib=500)),
        requested(8200),
    )
    assert placed_on(plan(swapped, observed("ea", "eb"))) == ("a", How.VICTIMS)


def test_where_it_starts_nowhere_the_least_short_card_then_the_declared_order() -> None:
    residents = {"residency": sm.Residency.RESIDENT}
    desired = fleet(pinned("ra", 5000, "a", **residents), pinned("rb", 4000, "b", **residents))
    desired = sm.DesiredState(ROLES, {**desired.serves, "p": requested(8000)}, desired.requests)
    p = plan(desired, observed("ra", "rb"))
    assert placed_on(p) == ("b", How.VICTIMS)  # short 2000 on b, 3000 on a
    assert [c.starts for c in p.placements[0].candidates] == [False, False]
    even = sm.DesiredState(
        ROLES,
        {**desired.serves, "rb": pinned("rb", 5000, "b", **residents)},
        desired.requests,
    )
    assert placed_on(plan(even, observed("ra", "rb"))) == ("a", How.VICTIMS)


# ── what the planner tells placement: Plan.room ───────────────────────────────────


def test_the_plan_says_which_victims_it_chose_for_each_requester_as_it_weighed_them() -> None:
    one_card = {"a": sm.GpuRole("a", 10000)}
    serves = [
        sleeper("s", 4000, "a", wake_s=2.0),
        pinned("v", 3000, "a", cold_start_s=40.0, priority=2),
        sm.ServeSpec("p", "c-p", gpu_roles=("a",), vram_mib=9000, residency=sm.Residency.ON_DEMAND),
    ]
    desired = sm.DesiredState(
        one_card, {s.name: s for s in serves}, (sm.OnDemandRequest("p", NOW),)
    )
    p = plan(desired, observed("s", "v", in_flight=counts(s=0, v=1)))
    # 3000 free, 6000 short: s asleep frees 3000 and v stopped 3000
    assert {s.serve: s.action for s in p.steps if s.serve in ("s", "v")} == {
        "s": Action.RELEASE_TO_RESIDUAL,
        "v": Action.RELEASE,
    }
    assert p.room == {
        "p": (
            # the sleeper at what its sleep frees, with the cost of its wake (weighed
            # by its start an hour ago: 300 / (300 + 3600), recency_weight)
            Candidate("s", ("a",), 3000, 0, NOW - 3600, 0, 2.0 * recency_weight(3600)),
            Candidate("v", ("a",), 3000, 2, NOW - 3600, 1, 40.0 * recency_weight(3600)),
        )
    }
    assert "room" not in p.to_json()


def test_a_start_that_stops_nothing_has_no_room_entry() -> None:
    elastic = sm.Elastic("http://127.0.0.1:1", floor_mib=1000, segment_mib=500)
    one_card = {"a": sm.GpuRole("a", 10000)}
    serves = [
        pinned("e", 4000, "a", elastic=elastic),
        sm.ServeSpec("p", "c-p", gpu_roles=("a",), vram_mib=8000, residency=sm.Residency.ON_DEMAND),
    ]
    desired = sm.DesiredState(
        one_card, {s.name: s for s in serves}, (sm.OnDemandRequest("p", NOW),)
    )
    p = plan(desired, observed("e"))
    assert [s.action for s in p.steps][:1] == [Action.SHRINK]
    assert p.room == {}


def test_the_room_is_no_part_of_the_plans_equality() -> None:
    desired = fleet(pinned("a1", 4000, "a"), pinned("b1", 4000, "b"), requested(8000))
    p = plan(desired, observed("a1", "b1"))
    assert p.room and p == Plan(
        p.steps, p.blocked, p.ledger_before, p.ledger_after, p.notes, p.placements
    )


def test_the_stops_a_start_forces_are_in_its_room_as_the_victim_search_weighs_a_victim() -> None:
    # p needs a to itself of x (exclusive) and the port of q (outside the ledger): both
    # are stopped for it, with no victim search (x's 6000 back, p fits); each recorded
    # at what it holds and by its cold start (x's wake does not count: it is stopped)
    one_card = {"a": sm.GpuRole("a", 10000)}
    x = sm.ServeSpec(
        "x",
        "c-x",
        gpu_roles=("a",),
        vram_mib=6000,
        residency=sm.Residency.EVICTABLE,
        exclusive=True,
        cold_start_s=30.0,
        sleep=sm.Sleep(level=2, residual_mib=1000, protocol="vllm", wake_s=2.0),
    )
    q = sm.ServeSpec("q", "c-q", gpu_roles=("a",), residency=sm.Residency.EVICTABLE, port=8000)
    p = sm.ServeSpec(
        "p", "c-p", gpu_roles=("a",), vram_mib=8000, residency=sm.Residency.ON_DEMAND, port=8000
    )
    desired = sm.DesiredState(
        one_card, {s.name: s for s in (x, q, p)}, (sm.OnDemandRequest("p", NOW),)
    )
    result = plan(desired, observed("x", "q"))
    assert stopped(result) == {"q", "x"}
    assert result.room == {
        "p": (
            Candidate("q", ("a",), 0, 0, NOW - 3600, None, None),
            Candidate("x", ("a",), 6000, 0, NOW - 3600, None, 30.0 * recency_weight(3600)),
        )
    }
