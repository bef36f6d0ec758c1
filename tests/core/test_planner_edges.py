"""The planner at its boundaries (docs/eviction.md): start order, shrink sizes,
``min_runtime_s`` exactly reached, grow-back sizes and the texts of steps and blocks.

Same style as tests/core/test_planner_rules.py (whose helpers these cases use): a small
fleet, an observation, and the plan expected as ``"action serve"`` lines, with the
MiB and reasons the docs promise, written from the rules, not from the code's output.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.plan_cases import EVI, NOW, OND, RES, RUN, STOP, Case, _build, req, serve, up
from support.plan_lines import ELASTIC, lines, plan_of, starts

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.planning.plan_types import (
    Action,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.planning.simulate import apply_plan

# ----- start order --------------------------------------------------------------------------
ORDER: dict[str, Case] = {
    # budget 30000: only one of two 20000 serves fits; the first in the order gets the room
    "resident-before-desired-running-on-demand": Case(
        [serve("aaa-od", 20_000, OND, RUN), serve("zzz-res", 20_000, RES, RUN)],
        {},
        starts("zzz-res"),
        ["aaa-od"],
    ),
    "desired-running-on-demand-before-requested": Case(
        [serve("asked", 20_000, OND), serve("wanted", 20_000, OND, RUN)],
        {},
        starts("wanted"),
        ["asked"],
        requests=[req("asked", at=NOW - 500)],
    ),
    "older-request-first": Case(
        [serve("late", 20_000, OND), serve("early", 20_000, OND)],
        {},
        starts("early"),
        ["late"],
        requests=[req("late", at=NOW - 10), req("early", at=NOW - 20)],
    ),
    "on-demand-before-backfill": Case(
        [serve("aaa-evi", 20_000, EVI, RUN, priority=9), serve("zzz-od", 20_000, OND)],
        {},
        starts("zzz-od"),
        ["aaa-evi"],
        requests=[req("zzz-od")],
    ),
    "residents-by-priority-then-name": Case(
        [
            serve("b-low", 10_000, RES, RUN, priority=1),
            serve("c-high", 10_000, RES, RUN, priority=5),
            serve("a-low", 10_000, RES, RUN, priority=1),
            serve("d-last", 10_000, RES, RUN, priority=0),
        ],
        {},
        starts("c-high", "a-low", "b-low"),
        ["d-last"],
    ),
}


@pytest.mark.parametrize("case", list(ORDER.values()), ids=list(ORDER))
def test_start_order(case: Case) -> None:
    plan = plan_of(case)
    assert lines(plan) == case.expect_steps
    assert sorted(b.serve for b in plan.blocked) == sorted(case.expect_blocked)


# ----- shrink sizes -------------------------------------------------------------------------
def shrink_case(
    floor: int, llm: int = 6000, *, min_runtime_s: float = 0.0, segment: int = 1
) -> Case:
    # budget 30000, committed 28000 (moe 20000 + omni 8000), free 2000; segments of
    # 1 MiB unless given, so the MiB boundaries below are exact

    return Case(
        [
            serve(
                "moe",
                20_000,
                EVI,
                RUN,
                elastic=sm.Elastic(ELASTIC, floor, segment_mib=segment),
                min_runtime_s=min_runtime_s,
            ),
            serve("omni", 8000, EVI, RUN),
            serve("llm", llm, OND),
        ],
        {"moe": up(started=NOW - 100), "omni": up()},
        [],
        requests=[req("llm")],
    )


def test_a_shrink_exactly_covering_the_shortfall_is_planned_instead_of_an_eviction() -> None:
    plan = plan_of(shrink_case(floor=16_000))  # moe can give exactly the 4000 short
    assert lines(plan) == ["shrink moe", *starts("llm")]
    shrink = plan.steps[0]
    assert (shrink.mib, shrink.to_mib) == (4000, 16_000)
    assert shrink.reason == (
        "give back 4000 MiB (elastic, floor 16000, whole 1 MiB segments) so llm fits"
    )
    assert shrink.to_json() == {
        "action": "shrink",
        "serve": "moe",
        "gpu_roles": ["a"],
        "mib": 4000,
        "reason": "give back 4000 MiB (elastic, floor 16000, whole 1 MiB segments) so llm fits",
        "group": "llm",
        "to_mib": 16_000,
    }
    assert plan.ledger_after.committed_mib("a") == 30_000
    assert plan.ledger_after.holdings["moe"].mib == 16_000


def test_a_shrink_one_mib_short_of_the_shortfall_evicts_instead() -> None:
    plan = plan_of(shrink_case(floor=16_001))  # moe can give 3999 of the 4000 short
    assert lines(plan) == ["stop omni", "release omni", *starts("llm")]
    assert plan.steps[0].reason == "evict omni (evictable) to make room for llm"
    assert plan.steps[1].reason == "release 8000 MiB after omni is confirmed stopped"
    assert plan.steps[1].mib == 8000


def test_shrinks_take_from_the_largest_giver_first_and_only_what_is_needed() -> None:
    case = Case(
        [
            serve("small", 9000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 7000, segment_mib=1000)),
            serve("large", 10_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 7000, segment_mib=1000)),
            serve("still", 9000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 9000, segment_mib=1000)),
            serve("llm", 6000, OND),
        ],
        # budget 30000, committed 28000, free 2000, short 4000; small gives 2000, large
        # 3000, still is at its floor
        {"small": up(), "large": up(), "still": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert lines(plan) == ["shrink large", "shrink small", *starts("llm")]
    assert [(s.serve, s.mib, s.to_mib) for s in plan.steps[:2]] == [
        ("large", 3000, 7000),
        ("small", 1000, 8000),
    ]
    assert all(s.mib for s in plan.steps if s.action is Action.SHRINK)


def test_the_largest_giver_is_shrunk_first_whatever_its_name() -> None:
    """Shrinks take from the largest giver first (docs/eviction.md), not by name: the
    giver that covers the shortfall alone gives all of it, and the smaller one, first by
    name, keeps what it holds."""
    case = Case(
        [
            serve("alpha", 9000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 7000, segment_mib=1000)),
            serve("zulu", 12_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 7000, segment_mib=1000)),
            serve("still", 7000, EVI, RUN),
            serve("llm", 6000, OND),
        ],
        # budget 30000, committed 28000, free 2000, short 4000; alpha gives 2000, zulu 5000
        {"alpha": up(), "zulu": up(), "still": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert lines(plan) == ["shrink zulu", *starts("llm")]
    assert (plan.steps[0].mib, plan.steps[0].to_mib) == (4000, 8000)


def test_a_giver_on_two_roles_shrinks_for_the_one_that_is_short() -> None:
    # budgets 30000 each; moe holds 20000 on a and b, omni 8000 on a only: a is free
    # 2000, b 10000; llm needs 6000 on a, so a is short 4000 and b is not short at all
    case = Case(
        [
            serve(
                "moe",
                20_000,
                EVI,
                RUN,
                roles=("a", "b"),
                elastic=sm.Elastic(ELASTIC, 10_000, segment_mib=1000),
            ),
            serve("omni", 8000, RES, RUN),
            serve("llm", 6000, OND),
        ],
        {"moe": up(), "omni": up()},
        [],
        requests=[req("llm")],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
    )
    plan = plan_of(case)
    assert lines(plan) == ["shrink moe", *starts("llm")]
    assert (plan.steps[0].mib, plan.steps[0].to_mib) == (4000, 16_000)
    assert plan.ledger_after.free_mib("a") == 0
    assert plan.ledger_after.free_mib("b") == 14_000


def test_a_serve_already_at_its_floor_gives_no_zero_mib_shrink() -> None:
    case = Case(
        [
            serve("aaa", 9000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 9000)),  # at its floor
            serve("moe", 19_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 10_000, segment_mib=1000)),
            serve("llm", 6000, OND),
        ],
        {"aaa": up(), "moe": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert lines(plan) == ["shrink moe", *starts("llm")]
    assert (plan.steps[0].mib, plan.steps[0].to_mib) == (4000, 15_000)


def test_only_an_on_demand_requester_shrinks_others() -> None:
    case = shrink_case(floor=10_000)
    case.serves[2] = serve("llm", 6000, RES, RUN)
    case.requests = []
    plan = plan_of(case)
    assert lines(plan) == []
    (b,) = plan.blocked
    assert "resident serves do not evict; only on-demand serves do" in b.reason
    assert b.evictable_mib == () and b.shrinkable_mib == ()


# ----- min_runtime_s, exactly -----------------------------------------------------------------
def min_runtime_case(age: float | None, min_runtime_s: float) -> Case:
    return Case(
        [serve("omni", 20_000, EVI, RUN, min_runtime_s=min_runtime_s), serve("llm", 20_000, OND)],
        {"omni": up(started=NOW - age) if age is not None else up()},
        [],
        requests=[req("llm")],
    )


EVICTS = ["stop omni", "release omni", *starts("llm")]


@pytest.mark.parametrize(
    ("age", "min_runtime_s", "expected"),
    [
        pytest.param(600.0, 600.0, EVICTS, id="exactly-min-runtime-may-evict"),
        pytest.param(599.0, 600.0, [], id="one-second-inside-is-protected"),
        pytest.param(0.5, 1.0, [], id="half-a-second-inside-a-one-second-min"),
        pytest.param(0.0, 0.0, EVICTS, id="no-min-runtime-never-protects"),
        # a start stamped after the observation (clocks apart): no min_runtime_s, no guard
        pytest.param(-5.0, 0.0, EVICTS, id="no-min-runtime-never-protects-a-future-start"),
    ],
)
def test_min_runtime_boundary(age: float, min_runtime_s: float, expected: list[str]) -> None:
    plan = plan_of(min_runtime_case(age, min_runtime_s))
    assert lines(plan) == expected
    if not expected:
        (b,) = plan.blocked
        (p,) = b.protected
        assert p.serve == "omni" and p.mib == 20_000
        assert p.why == f"started {age:.0f}s ago, inside its min_runtime_s {min_runtime_s:g}"


def test_unknown_start_time_is_not_protected() -> None:
    case = min_runtime_case(None, 600.0)
    case.running = {"omni": sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy")}
    assert lines(plan_of(case)) == EVICTS


def test_a_fresh_elastic_serve_is_not_shrunk_one_outside_is() -> None:
    inside = plan_of(shrink_case(floor=16_000, min_runtime_s=101))  # started 100 s ago
    assert lines(inside) == ["stop omni", "release omni", *starts("llm")]
    outside = plan_of(shrink_case(floor=16_000, min_runtime_s=100))
    assert lines(outside) == ["shrink moe", *starts("llm")]


# ----- blocked arithmetic --------------------------------------------------------------------
def test_a_blocked_start_states_the_whole_arithmetic() -> None:
    case = Case(
        [
            serve("stt", 12_000, RES, RUN),
            serve("omni", 8000, EVI, RUN, min_runtime_s=600),
            serve("moe", 6000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 5000)),
            serve("llm", 20_000, OND),
        ],
        {"stt": up(), "omni": up(started=NOW - 60), "moe": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert plan.steps == ()
    (b,) = plan.blocked
    assert b.reason == (
        "llm does not fit (eviction cannot cover the shortfall): a: capacity 32000 - reserve "
        "2000 = budget 30000; committed 26000 (moe 6000 + omni 8000 + stt 12000); free 4000; "
        "needs 20000; short 16000; evictable 6000; shrinkable 512"
    )
    data = b.to_json()
    assert data["serve"] == "llm"
    assert data["ledger"]["evictable_mib"] == {"a": 6000}
    assert data["ledger"]["shrinkable_mib"] == {"a": 512}  # one whole 512 MiB segment
    assert data["ledger"]["protected"] == [
        {"serve": "omni", "mib": 8000, "why": "started 60s ago, inside its min_runtime_s 600"},
        {"serve": "stt", "mib": 12_000, "why": "resident: never evicted"},
    ]
    (t,) = data["ledger"]["gpu_roles"]
    assert (t["committed_mib"], t["free_mib"], t["requested_mib"], t["shortfall_mib"]) == (
        26_000,
        4000,
        20_000,
        16_000,
    )


def test_an_empty_role_says_nothing_is_committed() -> None:
    case = Case([serve("big", 31_000, RES, RUN)], {}, [])
    (b,) = plan_of(case).blocked
    assert "committed 0 (nothing); free 30000; needs 31000; short 1000" in b.reason


# ----- grow-back and texts -------------------------------------------------------------------
def test_grow_back_takes_what_the_budget_allows() -> None:
    case = Case(
        [
            serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 10_000)),
            serve("omni", 12_000, EVI, RUN),
        ],
        {"moe": up(), "omni": up()},
        ["grow moe"],
        elastic_mib={"moe": 14_000},
    )
    plan = plan_of(case)
    assert lines(plan) == ["grow moe"]
    (g,) = plan.steps
    # free 30000 - 26000 = 4000 holds 7 whole 512 MiB segments: 3584
    assert (g.mib, g.to_mib) == (3584, 17_584)
    assert g.reason == "take back 3584 MiB (elastic) now that the room is free"
    assert plan.ledger_after.committed_mib("a") == 29_584


def test_grow_back_to_the_full_reservation_and_not_beyond() -> None:
    case = Case(
        [serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 10_000))],
        {"moe": up()},
        ["grow moe"],
        elastic_mib={"moe": 19_999},
    )
    (g,) = plan_of(case).steps
    assert (g.mib, g.to_mib) == (1, 20_000)


def test_step_texts_and_plan_json() -> None:
    case = Case(
        [
            serve("omni", 20_000, EVI, RUN, router_tier="t-omni"),
            serve("llm", 20_000, OND, router_tier="t-llm"),
        ],
        {"omni": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert [(str(s.action), s.mib, s.reason) for s in plan.steps] == [
        (
            "quiesce",
            20_000,
            "evict omni (evictable) to make room for llm: quiesce router tier t-omni",
        ),
        ("drain", 20_000, "evict omni (evictable) to make room for llm: drain router tier t-omni"),
        ("stop", 20_000, "evict omni (evictable) to make room for llm"),
        ("release", 20_000, "release 20000 MiB after omni is confirmed stopped"),
        ("reserve", 20_000, "reserve 20000 MiB on a"),
        ("start", 20_000, "on-demand request for llm"),
        ("await_ready", None, "wait until llm is healthy"),
        ("readmit", None, "readmit router tier t-llm"),
    ]
    data = plan.to_json()
    assert "to_mib" not in data["steps"][0]
    assert data["ledger_before"]["a"]["committed_mib"] == 20_000
    assert data["ledger_after"]["a"]["committed_mib"] == 20_000
    assert data["ledger_after"]["a"]["reservations"] == [{"serve": "llm", "mib": 20_000}]
    assert data["blocked"] == [] and data["notes"] == []
    desired_run = Case([serve("stt", 2000, RES, RUN)], {}, [])
    assert plan_of(desired_run).steps[1].reason == "stt is desired running"


def test_a_forced_stop_for_a_port_names_the_port() -> None:
    case = Case(
        [serve("old", 1000, EVI, port=9000), serve("llm", 1000, OND, port=9000)],
        {"old": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert plan.steps[0].reason == "stop old so llm can start"


def test_docker_unknown_blocks_with_the_reason() -> None:
    case = Case([serve("stt", 2000, RES, RUN)], {}, [], docker_ok=False)
    (b,) = plan_of(case).blocked
    assert b.reason == (
        "stt: docker state is unknown; nothing is started or stopped until it can be read"
    )


def test_request_for_a_desired_stopped_serve_says_so() -> None:
    case = Case([serve("llm", 2000, OND, STOP)], {}, [], requests=[req("llm")])
    (b,) = plan_of(case).blocked
    assert b.reason == 'llm is requested but the manifest says desired = "stopped"'


def test_a_requester_that_may_not_evict_says_its_class() -> None:
    # docs/eviction.md: "only on-demand serves evict, and X is evictable"
    for residency, cls in ((EVI, "evictable"), (None, "unclassified")):
        case = Case(
            [
                serve("old", 1000, EVI, RUN, port=9000),
                serve("new", 1000, residency, RUN, port=9000),
            ],
            {"old": up()},
            [],
        )
        plan = plan_of(case)
        assert plan.steps == ()
        (b,) = plan.blocked
        assert b.reason == (
            "new cannot start: old runs (holds port 9000) and may not be stopped: "
            f"only on-demand serves evict, and new is {cls}"
        )


def test_a_serve_without_a_residency_class_that_does_not_fit_says_so() -> None:
    """Only on-demand serves evict: a desired-running serve without a residency class
    that does not fit is blocked, its reason naming it unclassified."""
    case = Case(
        [serve("big", 20_000, RES, RUN), serve("odd", 20_000, None, RUN)], {"big": up()}, []
    )
    plan = plan_of(case)
    assert plan.steps == ()
    (b,) = plan.blocked
    assert b.reason == (
        "odd does not fit (unclassified serves do not evict; only on-demand serves do): "
        "a: capacity 32000 - reserve 2000 = budget 30000; committed 20000 (big 20000); "
        "free 10000; needs 20000; short 10000; evictable 0; shrinkable 0"
    )


# ----- shrinks across givers and roles --------------------------------------------------------
def test_shrinks_cover_the_shortfall_to_the_last_mib() -> None:
    # short 4000: large can give 3999 (1 MiB segments), small just 1 MiB: it gives it
    case = Case(
        [
            serve("large", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 16_001, segment_mib=1)),
            serve("small", 8000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 7999, segment_mib=1)),
            serve("llm", 6000, OND),
        ],
        {"large": up(), "small": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert lines(plan) == ["shrink large", "shrink small", *starts("llm")]
    assert [(s.mib, s.to_mib) for s in plan.steps[:2]] == [(3999, 16_001), (1, 7999)]
    assert plan.ledger_after.committed_mib("a") == 30_000


def test_a_giver_on_a_role_already_covered_gives_nothing() -> None:
    # llm needs 3000 on a and on b. a: free 0, a1 can give 5000, a2 (on a and c, where
    # nothing is short) 3000; b: free 1000, b1 can give 2500. a1 covers a exactly (3000);
    # a2 is then on no role still short and is not asked for anything; b1 gives b's 2000
    seg1 = {"segment_mib": 1}
    case = Case(
        [
            serve("a1", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 15_000, **seg1)),
            serve(
                "a2", 10_000, EVI, RUN, roles=("a", "c"), elastic=sm.Elastic(ELASTIC, 7000, **seg1)
            ),
            serve(
                "b1", 29_000, EVI, RUN, roles=("b",), elastic=sm.Elastic(ELASTIC, 26_500, **seg1)
            ),
            serve("llm", 3000, OND, roles=("a", "b")),
        ],
        {"a1": up(), "a2": up(), "b1": up()},
        [],
        requests=[req("llm")],
        roles={"a": (32_000, 2000), "b": (32_000, 2000), "c": (32_000, 2000)},
    )
    plan = plan_of(case)
    assert lines(plan) == ["shrink a1", "shrink b1", *starts("llm")]
    assert [(s.serve, s.mib, s.to_mib) for s in plan.steps[:2]] == [
        ("a1", 3000, 17_000),
        ("b1", 2000, 27_000),
    ]


def test_a_shrink_is_asked_in_whole_segments_rounded_up() -> None:
    # short 4000 in 512 MiB segments: 8 segments (4096) cover it, 7 (3584) would not
    plan = plan_of(shrink_case(floor=15_000, segment=512))
    assert lines(plan) == ["shrink moe", *starts("llm")]
    assert (plan.steps[0].mib, plan.steps[0].to_mib) == (4096, 15_904)
    assert plan.steps[0].reason == (
        "give back 4096 MiB (elastic, floor 15000, whole 512 MiB segments) so llm fits"
    )


def test_a_holder_one_mib_short_of_the_segments_needed_is_evicted_instead() -> None:
    # above its floor moe holds 4095 MiB: 7 whole 512 MiB segments (3584) < 4000 short
    plan = plan_of(shrink_case(floor=15_905, segment=512))
    assert lines(plan) == ["stop omni", "release omni", *starts("llm")]
    # 4096 above the floor: 8 segments cover it
    plan = plan_of(shrink_case(floor=15_904, segment=512))
    assert lines(plan) == ["shrink moe", *starts("llm")]
    assert (plan.steps[0].mib, plan.steps[0].to_mib) == (4096, 15_904)


# ----- one choice for the requesters of a pass ------------------------------------------------
def test_victims_are_chosen_once_for_the_requesters_of_a_pass() -> None:
    # free 0; first and second each need 5000. Chosen for both at once, big (10000) covers
    # the 10000 exactly; small (9999) would leave the second 1 MiB short and cost a
    # second eviction
    case = Case(
        [
            serve("big", 10_000, EVI, RUN),
            serve("small", 9999, EVI, RUN),
            serve("tiny", 5000, EVI, RUN),
            serve("stt", 5001, RES, RUN),
            serve("first", 5000, OND),
            serve("second", 5000, OND),
        ],
        {"big": up(), "small": up(), "tiny": up(), "stt": up()},
        [],
        requests=[req("first", at=NOW - 20), req("second", at=NOW - 10)],
    )
    plan = plan_of(case)
    assert lines(plan) == ["stop big", "release big", *starts("first", "second")]


def test_a_requester_held_back_later_in_the_pass_claims_no_room() -> None:
    # free 0; first needs 5000, second (held back by its backoff) 5000 too. second will
    # not start in this pass, so first evicts one serve, not two: the plan after this one
    # would start the second victim again (it converges in one plan)
    case = Case(
        [
            serve("one", 5000, EVI, RUN),
            serve("two", 5000, EVI, RUN),
            serve("stt", 20_000, RES, RUN),
            serve("first", 5000, OND),
            serve("second", 5000, OND),
        ],
        {"one": up(), "two": up(), "stt": up()},
        [],
        requests=[req("first", at=NOW - 20), req("second", at=NOW - 10)],
    )
    desired, observed = _build(case)
    plan = plan_transitions(desired, observed, Policy(hold={"second": "backoff"}), NOW)
    stops = [st.serve for st in plan.steps if st.action is Action.STOP]
    assert len(stops) == 1, lines(plan)
    assert [b.serve for b in plan.blocked] == ["second"]


@pytest.mark.parametrize("echo", [12_000, 6001])
def test_a_requester_claims_room_for_the_later_requesters_it_can_cover_not_for_none(
    echo: int,
) -> None:
    # budget 30000: stt 6000 (resident), charlie 12000 and bravo 6000 (evictable); free
    # 6000. alpha (12000), delta (6000), echo (12000) are asked in that order. Room for
    # all three (30000 more) cannot be made; stopping charlie alone fits alpha and delta,
    # and echo fits in no case. Choosing for alpha alone stopped bravo (the exact fit),
    # then charlie for delta, and the next plan started bravo again. An echo of 6001
    # needs 1 MiB more than stopping both frees (18000): it claims nothing either.
    case = Case(
        [
            serve("stt", 6000, RES, RUN),
            serve("charlie", 12_000, EVI, RUN),
            serve("bravo", 6000, EVI, RUN),
            serve("alpha", 12_000, OND),
            serve("delta", 6000, OND),
            serve("echo", echo, OND),
        ],
        {"stt": up(), "charlie": up(), "bravo": up()},
        [],
        requests=[req("alpha", at=NOW - 30), req("delta", at=NOW - 20), req("echo", at=NOW - 10)],
    )
    desired, observed = _build(case)
    plan = plan_transitions(desired, observed, Policy(), NOW)
    stops = [st.serve for st in plan.steps if st.action is Action.STOP]
    assert stops == ["charlie"], lines(plan)
    assert {st.serve for st in plan.steps if st.action is Action.START} == {"alpha", "delta"}
    assert [b.serve for b in plan.blocked] == ["echo"]


# ----- requests and the order of requesters ---------------------------------------------------
def test_a_request_for_an_unknown_serve_is_ignored_and_the_next_one_counts() -> None:
    case = Case(
        [serve("llm", 2000, OND)],
        {},
        starts("llm"),
        requests=[req("ghost", at=NOW - 30), req("llm", at=NOW - 20)],
    )
    assert lines(plan_of(case)) == case.expect_steps


def test_a_serve_asked_twice_ranks_by_its_oldest_request() -> None:
    # budget 30000: one of the two 20000 serves fits. twice was first asked 30 s ago
    # (again 5 s ago), once 20 s ago: twice is the older request
    case = Case(
        [serve("once", 20_000, OND), serve("twice", 20_000, OND)],
        {},
        starts("twice"),
        ["once"],
        requests=[req("twice", at=NOW - 5), req("once", at=NOW - 20), req("twice", at=NOW - 30)],
    )
    plan = plan_of(case)
    assert lines(plan) == case.expect_steps
    assert [b.serve for b in plan.blocked] == ["once"]


def test_desired_running_on_demand_serves_go_by_descending_priority() -> None:
    case = Case(
        [serve("aaa", 20_000, OND, RUN, priority=1), serve("zzz", 20_000, OND, RUN, priority=5)],
        {},
        starts("zzz"),
        ["aaa"],
    )
    assert lines(plan_of(case)) == case.expect_steps


# ----- conflicts --------------------------------------------------------------------------
def test_an_exclusive_serve_waits_for_the_holder_of_its_port_on_another_role() -> None:
    case = Case(
        [
            serve("web", 1000, RES, RUN, roles=("c",), port=9000, gpu_inference=False),
            serve("tp2", 20_000, OND, RUN, roles=("a", "b"), exclusive=True, port=9000),
        ],
        {"web": up()},
        [],
        roles={"a": (32_000, 2000), "b": (32_000, 2000), "c": (32_000, 2000)},
    )
    (b,) = plan_of(case).blocked
    assert b.reason == (
        "tp2 cannot start: web runs (holds port 9000) and may not be stopped: "
        "resident: never evicted"
    )


def test_conflicts_are_named_in_the_order_of_the_requesters_roles() -> None:
    # new runs on a then b; xb (on b) is declared before xa (on a): xa is named first
    case = Case(
        [
            serve("xb", 1000, RES, RUN, roles=("b",), exclusive=True),
            serve("xa", 1000, RES, RUN, roles=("a",), exclusive=True),
            serve("new", 1000, OND, RUN, roles=("a", "b")),
        ],
        {"xb": up(), "xa": up()},
        [],
        roles={"a": (32_000, 2000), "b": (32_000, 2000)},
    )
    (b,) = plan_of(case).blocked
    assert b.reason == (
        "new cannot start: xa runs (exclusive on a) and may not be stopped: resident: never "
        "evicted; xb runs (exclusive on b) and may not be stopped: resident: never evicted"
    )


def test_a_port_held_by_a_start_in_progress_or_in_this_plan_says_which() -> None:
    # old's start is in progress (the executor's): llm waits for it, and names it once
    case = Case(
        [serve("old", 1000, EVI, RUN, port=9000), serve("llm", 1000, OND, port=9000)],
        {},
        [],
        requests=[req("llm")],
    )
    (b,) = plan_of(case, starting={"old": 1000}).blocked
    assert b.reason == "llm cannot start: old: its start is in progress (holds port 9000)"
    assert [(p.serve, p.why) for p in b.protected] == [("old", "its start is in progress")]
    # res starts first in this plan (a resident), then llm finds the port taken
    case = Case(
        [serve("res", 1000, RES, RUN, port=9000), serve("llm", 1000, OND, port=9000)],
        {},
        starts("res"),
        ["llm"],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert lines(plan) == case.expect_steps
    (b,) = plan.blocked
    assert b.reason == "llm cannot start: res: being started in this plan (holds port 9000)"


def test_engines_sizing_from_free_wait_only_for_each_other() -> None:
    def case() -> Case:
        return Case(
            [
                serve("aaa", 1000, EVI, RUN),  # starting, sizes itself from what it is given
                serve("vllm", 1000, OND, RUN, sizes_from_free=True),
                serve("zzz", 1000, EVI, RUN, sizes_from_free=True),
            ],
            {},
            [],
        )

    # a start in progress that does not size from free does not hold vllm back
    assert lines(plan_of(case(), starting={"aaa": 1000})) == starts("vllm")
    # with one that does (zzz) beside it, vllm waits for zzz
    plan = plan_of(case(), starting={"aaa": 1000, "zzz": 1000})
    assert lines(plan) == []
    (b,) = plan.blocked
    assert b.reason.startswith("vllm waits for the start of zzz on a to end")


def test_a_conflict_is_named_before_a_wait_for_a_loading_peer() -> None:
    """vllm sizes itself from free memory and zzz, of that kind, loads on its GPU; but
    vllm's port is held by a resident that never stops: the conflict is what blocks it
    (a wait would end, the conflict does not), so the conflict is what it says."""
    case = Case(
        [
            serve("primary", 1000, RES, RUN, port=9000),
            serve("vllm", 1000, OND, sizes_from_free=True, port=9000),
            serve("zzz", 1000, EVI, RUN, sizes_from_free=True),
        ],
        {"primary": up()},
        [],
        requests=[req("vllm")],
    )
    plan = plan_of(case, starting={"zzz": 1000})
    assert lines(plan) == []
    (b,) = plan.blocked
    assert b.reason.startswith("vllm cannot start: primary runs (holds port 9000)"), b.reason


def test_a_conflict_of_a_serve_outside_the_ledger_has_no_terms() -> None:
    case = Case(
        [
            serve("primary", 1000, RES, RUN, port=9000),
            serve("far", 500, OND, roles=("nowhere",), port=9000),
        ],
        {"primary": up()},
        [],
        requests=[req("far")],
    )
    (b,) = plan_of(case).blocked
    assert b.reason.startswith("far cannot start: primary runs (holds port 9000)")
    assert b.terms == ()


def test_a_requester_that_fits_exactly_evicts_nothing_for_itself() -> None:
    # free 5000 is exactly first's 5000; second (asked later) then needs big stopped,
    # in its own group
    case = Case(
        [
            serve("big", 10_000, EVI, RUN),
            serve("stt", 15_000, RES, RUN),
            serve("first", 5000, OND),
            serve("second", 5000, OND),
        ],
        {"big": up(), "stt": up()},
        [],
        requests=[req("first", at=NOW - 20), req("second", at=NOW - 10)],
    )
    plan = plan_of(case)
    assert lines(plan) == [*starts("first"), "stop big", "release big", *starts("second")]
    assert [s.group for s in plan.steps] == ["first"] * 3 + ["second"] * 5


def test_a_stopped_serve_on_the_role_does_not_end_the_search_for_victims() -> None:
    case = Case(
        [serve("idle", 20_000, EVI), serve("omni", 20_000, EVI, RUN), serve("llm", 20_000, OND)],
        {"omni": up()},
        [],
        requests=[req("llm")],
    )
    assert lines(plan_of(case)) == EVICTS


@pytest.mark.parametrize(("min_runtime_s", "shrunk"), [(0.0, True), (0.5, False)])
def test_a_serve_started_in_this_plan_is_shrunk_unless_min_runtime_protects_it(
    min_runtime_s: float, shrunk: bool
) -> None:
    # moe (resident, elastic) starts first; llm is then 2000 short and may shrink moe only
    # when moe has no min_runtime_s at all
    case = Case(
        [
            serve(
                "moe",
                20_000,
                RES,
                RUN,
                elastic=sm.Elastic(ELASTIC, 10_000, segment_mib=1),
                min_runtime_s=min_runtime_s,
            ),
            serve("llm", 12_000, OND),
        ],
        {},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    if shrunk:
        assert lines(plan) == [*starts("moe"), "shrink moe", *starts("llm")]
        assert (plan.steps[3].mib, plan.steps[3].to_mib) == (2000, 18_000)
    else:
        assert lines(plan) == starts("moe")
        assert [b.serve for b in plan.blocked] == ["llm"]


def test_one_choice_for_a_pass_adds_nothing_on_a_role_only_this_requester_needs() -> None:
    # first (a and b) and second (a, asked later) need 5000 each; free 0 on both roles.
    # Chosen once: a needs 10000 (va covers it exactly), b only first's 5000: b-snug,
    # not b-big (1 MiB over) and not b-short (1 MiB short)
    case = Case(
        [
            serve("stt-a", 20_000, RES, RUN),
            serve("va", 10_000, EVI, RUN),
            serve("stt-b", 15_000, RES, RUN, roles=("b",)),
            serve("b-short", 4999, EVI, RUN, roles=("b",)),
            serve("b-snug", 5000, EVI, RUN, roles=("b",)),
            serve("b-big", 5001, EVI, RUN, roles=("b",)),
            serve("first", 5000, OND, roles=("a", "b")),
            serve("second", 5000, OND),
        ],
        {n: up() for n in ("stt-a", "va", "stt-b", "b-short", "b-snug", "b-big")},
        [],
        requests=[req("first", at=NOW - 20), req("second", at=NOW - 10)],
        roles={"a": (32_000, 2000), "b": (32_000, 2000)},
    )
    plan = plan_of(case)
    assert sorted(s.serve for s in plan.steps if s.action is Action.STOP) == ["b-snug", "va"]
    assert [s.serve for s in plan.steps if s.action is Action.START] == ["first", "second"]


def test_a_block_states_the_ledger_as_the_serve_found_it_in_its_turn() -> None:
    # docs/eviction.md: placed in order, each against the ledger as the previous ones left
    # it. big (priority 5) is tried first and is 3000 short; small then starts: big's
    # arithmetic is the ledger before small, not after
    case = Case(
        [
            serve("stt", 8000, RES, RUN),
            serve("big", 25_000, RES, RUN, priority=5),
            serve("small", 4000, RES, RUN, priority=1),
        ],
        {"stt": up()},
        starts("small"),
        ["big"],
    )
    plan = plan_of(case)
    assert lines(plan) == case.expect_steps
    (b,) = plan.blocked
    assert "committed 8000 (stt 8000); free 22000; needs 25000; short 3000" in b.reason


def test_a_retry_pass_keeps_one_block_per_serve_still_blocked() -> None:
    # pass 1: r-fits (12000) and r-never (25000) are blocked, llm evicts omni; the retry
    # starts r-fits in the room left, and r-never is blocked once, not once per pass
    case = Case(
        [
            serve("r-fits", 12_000, RES, RUN),
            serve("r-never", 25_000, RES, RUN),
            serve("omni", 20_000, EVI, RUN),
            serve("llm", 12_000, OND),
        ],
        {"omni": up()},
        ["stop omni", "release omni", *starts("llm", "r-fits")],
        ["r-never"],
        requests=[req("llm")],
    )
    plan = plan_of(case)
    assert lines(plan) == case.expect_steps
    assert [b.serve for b in plan.blocked] == ["r-never"]


def test_a_start_in_progress_is_not_grown_even_with_room() -> None:
    # moe holds 14000 of its 20000 (shrunk before this start) and the room is free: it
    # is grown only once its start has ended
    case = Case(
        [serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 10_000))],
        {"moe": up()},
        [],
        elastic_mib={"moe": 14_000},
    )
    assert lines(plan_of(case, starting={"moe": 14_000})) == []
    assert lines(plan_of(case)) == ["grow moe"]


def test_grow_back_comes_before_backfill_and_is_its_own_group() -> None:
    """Shrunk elastic serves grow back before the backfill starts (docs/eviction.md):
    moe takes back its 6000, in a group of its own, and the evictable serve desired
    running that would have fitted in the room before it is blocked."""
    case = Case(
        [
            serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 10_000)),
            serve("fill", 12_000, EVI, RUN),
        ],
        {"moe": up()},
        [],
        elastic_mib={"moe": 14_000},
    )
    plan = plan_of(case)
    assert [(f"{s.action} {s.serve}", s.group, s.mib, s.to_mib) for s in plan.steps] == [
        ("grow moe", "moe", 6000, 20_000)
    ]
    (b,) = plan.blocked
    assert b.serve == "fill"
    assert "committed 20000 (moe 20000); free 10000; needs 12000; short 2000" in b.reason


def test_grow_back_looks_past_serves_that_do_not_run_or_are_full() -> None:
    # idle (declared first) does not run, full holds all of its vram_mib: moe still grows
    case = Case(
        [
            serve("idle", 1000, EVI),
            serve("full", 4000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 1000)),
            serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 10_000)),
        ],
        {"full": up(), "moe": up()},
        [],
        elastic_mib={"moe": 14_000},
    )
    assert lines(plan_of(case)) == ["grow moe"]


def test_grow_back_to_full_when_the_room_is_exactly_what_is_missing() -> None:
    # free 30000 - 24000 = 6000 is exactly moe's missing 6000: back to full, though 6000
    # is not a whole number of 512 MiB segments (11 of them are 5632)
    case = Case(
        [
            serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 10_000)),
            serve("omni", 10_000, EVI, RUN),
        ],
        {"moe": up(), "omni": up()},
        [],
        elastic_mib={"moe": 14_000},
    )
    (g,) = plan_of(case).steps
    assert (g.action, g.mib, g.to_mib) == (Action.GROW, 6000, 20_000)


def test_stops_and_starts_look_past_serves_with_nothing_to_do() -> None:
    # idle does not run and is not wanted, off is desired stopped and does not run: old
    # (desired stopped, running) is still stopped and stt (desired running) still starts
    case = Case(
        [
            serve("idle", 1000, EVI),
            serve("off", 1000, EVI, STOP),
            serve("old", 1000, EVI, STOP),
            serve("stt", 1000, RES, RUN),
        ],
        {"old": up()},
        ["stop old", "release old", *starts("stt")],
    )
    assert lines(plan_of(case)) == case.expect_steps


def test_an_exited_holder_whose_memory_is_not_back_does_not_end_the_search_for_victims() -> None:
    # gone (declared first) exited and NVML still shows its 5000: it is counted and
    # protected, and omni is still found as the victim: free 5000 + 20000 covers llm
    case = Case(
        [serve("gone", 5000, EVI), serve("omni", 20_000, EVI, RUN), serve("llm", 20_000, OND)],
        {"gone": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0), "omni": up()},
        [],
        requests=[req("llm")],
    )
    plan = plan_of(case, unreleased=frozenset({"gone"}))
    assert lines(plan) == EVICTS


def test_an_exited_elastic_serve_whose_memory_is_not_back_is_not_grown() -> None:
    # moe was shrunk to 14000 and then exited; NVML still shows its memory, so the ledger
    # counts it, but nothing is grown for a serve that does not run
    case = Case(
        [serve("moe", 20_000, EVI, elastic=sm.Elastic(ELASTIC, 10_000))],
        {"moe": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)},
        [],
        elastic_mib={"moe": 14_000},
    )
    plan = plan_of(case, unreleased=frozenset({"moe"}))
    assert plan.ledger_before.holdings["moe"].mib == 14_000
    assert lines(plan) == []


def test_an_elastic_serve_without_a_reservation_is_not_grown() -> None:
    """Grow back is to a serve's reservation: an elastic serve that declares none (it
    was dropped from the manifest while its container runs) has nothing to grow back
    to, though its container's start record still counts it in the ledger."""
    from statemachine.domain.types import StartedWith

    case = Case(
        [serve("moe", None, EVI, RUN, elastic=sm.Elastic(ELASTIC, 1000, segment_mib=1000))],
        {"moe": up()},
        [],
        elastic_mib={"moe": 4000},
    )
    desired, observed = _build(case)
    observed = replace(observed, started_with={"c-moe": StartedWith("moe", ("a",), 8000)})
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert plan.ledger_before.holdings["moe"].mib == 8000
    assert plan.steps == ()
    assert plan.blocked == ()


def test_a_backfill_that_does_not_fit_lists_every_holder_of_its_role_as_protected() -> None:
    """A requester that may stop nothing (not on-demand) is blocked with each holder on
    its short role protected, with the reason it may not stop them; one that exited
    with its memory not back says so instead; holders elsewhere are not listed."""
    case = Case(
        [
            serve("res", 12_000, RES, RUN),
            serve("old", 6_000, EVI, RUN),
            serve("gone", 4_000, EVI),  # exited, its memory not confirmed back
            serve("other", 8_000, EVI, RUN, roles=("b",)),
            serve("big", 10_000, EVI, RUN),
        ],
        {
            "res": up(),
            "old": up(),
            "other": up(),
            "gone": sm.ContainerObs(sm.ContainerState.EXITED),
        },
        [],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
    )
    desired, observed = _build(case)
    observed = replace(observed, unreleased=frozenset({"gone"}))
    plan = plan_transitions(desired, observed, Policy(), NOW)
    (b,) = [x for x in plan.blocked if x.serve == "big"]
    veto = "only on-demand serves evict, and big is evictable"
    assert [(p.serve, p.mib, p.why) for p in b.protected] == [
        ("gone", 4_000, "exited, but its memory is not back yet"),
        ("old", 6_000, veto),
        ("res", 12_000, veto),
    ]
    assert b.evictable_mib == () and b.shrinkable_mib == ()


def test_the_blocked_starts_of_an_unchanged_role_join_its_reservations_once() -> None:
    """A blocked start's reason lists its role's reservations; while the role does not
    change the ledger hands out the same list, and the planner joins it once."""
    from statemachine.domain.types import DesiredState, GpuRole, Observed
    from statemachine.ledger.reservations import GpuReservation, Ledger
    from statemachine.planning.planner import _Work

    roles = {"a": GpuRole("a", capacity_mib=1000, reserve_mib=0)}
    ledger = Ledger(roles, [GpuReservation("y", ("a",), 200), GpuReservation("x", ("a",), 100)])
    w = _Work(DesiredState(roles, {}), Observed(docker_ok=True), Policy(), NOW, ledger)
    rows = ledger.reservations_on("a")
    assert rows is ledger.reservations_on("a")
    first = w.joined(rows)
    assert first == "x 100 + y 200"
    assert w.joined(rows) is first
    assert w.joined(()) == "nothing"
    after = ledger.admit(GpuReservation("z", ("a",), 50))
    assert isinstance(after, Ledger)
    assert w.joined(after.reservations_on("a")) == "x 100 + y 200 + z 50"
    assert w.joined(rows) is first  # the earlier list is still the earlier text


def test_a_backfill_retried_after_an_eviction_lists_the_holders_of_then() -> None:
    """A resident blocked in the first pass is tried again after an on-demand requester
    evicted on its role; still blocked, it lists who holds the role after the eviction
    (the requester, not its victim), each with why it may not be stopped, and reads
    as that tuple (equality, hash, JSON)."""
    from statemachine.planning.plan_types import Protected

    case = Case(
        [
            serve("res", 20_000, RES, RUN),
            serve("evi", 12_000, EVI, RUN),
            serve("keep", 8_000, RES, RUN),
            serve("od", 14_000, OND),
        ],
        {"evi": up(), "keep": up()},
        [],
        requests=[req("od")],
    )
    plan = plan_of(case)
    assert "stop evi" in lines(plan) and "start od" in lines(plan)
    (b,) = plan.blocked
    assert b.serve == "res"
    veto = "only on-demand serves evict, and res is resident"
    expected = (Protected("keep", 8_000, veto), Protected("od", 14_000, veto))
    assert b.protected == expected and expected == b.protected
    assert hash(b.protected) == hash(expected)
    assert b.to_json()["ledger"]["protected"] == [p.to_json() for p in expected]
    assert b.reason == (
        "res does not fit (resident serves do not evict; only on-demand serves do): a: "
        "capacity 32000 - reserve 2000 = budget 30000; committed 22000 (keep 8000 + od "
        "14000); free 8000; needs 20000; short 12000; evictable 0; shrinkable 0"
    )
    assert (b.evictable_mib, b.shrinkable_mib, b.sleepable_mib) == ((), (), ())


def test_a_start_that_forces_a_stop_and_still_does_not_fit_gives_the_plans_terms() -> None:
    """The reason gives the arithmetic after the stop the start forces (the port's
    holder); the terms are the plan's ledger, which still counts that holder, as the
    ledger the executor checks against."""
    case = Case(
        [
            serve("res", 20_000, RES, RUN),
            serve("side", 5_000, EVI, RUN, port=9000),
            serve("od", 20_000, OND, port=9000),
        ],
        {"res": up(), "side": up()},
        [],
        requests=[req("od")],
    )
    plan = plan_of(case)
    (b,) = plan.blocked
    assert b.serve == "od" and lines(plan) == []
    assert "committed 20000 (res 20000)" in b.reason  # side's stop counted in the reason
    (t,) = b.terms
    assert (t.committed_mib, t.free_mib, t.reservations) == (
        25_000,
        5_000,
        (("res", 20_000), ("side", 5_000)),
    )


def test_a_shrink_for_a_requester_retries_what_was_blocked_before_it() -> None:
    """The engine gives back whole segments, more than the requester needs: the
    resident blocked earlier in the pass is tried again and starts in the rest."""
    case = Case(
        [
            serve("res", 2_500, RES, RUN),
            serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 8_000, segment_mib=4_000)),
            serve("held", 9_000, RES, RUN),
            serve("od", 2_000, OND),
        ],
        {"moe": up(), "held": up()},
        [],
        requests=[req("od")],
    )
    plan = plan_of(case)
    assert lines(plan) == ["shrink moe", *starts("od", "res")]
    assert [s.mib for s in plan.steps if s.action is Action.SHRINK] == [4_000]
    assert plan.blocked == ()


def test_a_pass_that_frees_nothing_is_not_tried_again() -> None:
    """Starts only take room: the serve blocked before a later start keeps the reason
    of its own turn (the ledger then), not one counting the later start."""
    case = Case(
        [
            serve("big", 20_000, RES, RUN),
            serve("small", 5_000, RES, RUN),
            serve("there", 15_000, RES, RUN),
        ],
        {"there": up()},
        [],
    )
    plan = plan_of(case)
    assert lines(plan) == starts("small")
    (b,) = plan.blocked
    assert b.reason == (
        "big does not fit (resident serves do not evict; only on-demand serves do): a: "
        "capacity 32000 - reserve 2000 = budget 30000; committed 15000 (there 15000); "
        "free 15000; needs 20000; short 5000; evictable 0; shrinkable 0"
    )


def test_a_pass_that_frees_nothing_is_not_tried_again_after_a_stop_before_it() -> None:
    """Whether a pass freed room is its own: a stop made before the starts (a serve
    desired stopped, on another role) does not make the pass that follows, which
    frees nothing, be tried again; the blocked serve keeps the reason of its turn."""
    case = Case(
        [
            serve("big", 20_000, RES, RUN),
            serve("small", 5_000, RES, RUN),
            serve("there", 15_000, RES, RUN),
            serve("old", 1_000, RES, STOP, roles=("b",)),
        ],
        {"there": up(), "old": up()},
        [],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
    )
    plan = plan_of(case)
    assert lines(plan) == ["stop old", "release old", *starts("small")]
    (b,) = plan.blocked
    assert b.reason == (
        "big does not fit (resident serves do not evict; only on-demand serves do): a: "
        "capacity 32000 - reserve 2000 = budget 30000; committed 15000 (there 15000); "
        "free 15000; needs 20000; short 5000; evictable 0; shrinkable 0"
    )


def test_a_requester_claims_room_ahead_when_the_candidates_cover_it_exactly() -> None:
    # budget 30000, all held (fill 10000, v1 10000, v2 10000); od1 (older) needs 6000,
    # od2 14000: both together need 20000, exactly what v1 and v2 hold, so od1 chooses
    # for both and its group stops the two (od2 then fits in what is left)
    case = Case(
        [
            serve("fill", 10_000, RES, RUN),
            serve("v1", 10_000, EVI, RUN),
            serve("v2", 10_000, EVI, RUN),
            serve("od1", 6000, OND),
            serve("od2", 14_000, OND),
        ],
        {"fill": up(), "v1": up(), "v2": up()},
        [],
        requests=[req("od1", at=NOW - 20), req("od2", at=NOW - 10)],
    )
    plan = plan_of(case)
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop v1", "od1"),
        ("release v1", "od1"),
        ("stop v2", "od1"),
        ("release v2", "od1"),
        *((line, "od1") for line in starts("od1")),
        *((line, "od2") for line in starts("od2")),
    ]
    assert plan.blocked == ()


def test_a_requester_whose_memory_is_not_back_claims_no_room_ahead() -> None:
    # budget 30000, all held: fill 10000, v1 10000, v2 5000, and od2's 5000 from a run
    # that exited with its memory not back (the ledger still counts it). od1 needs
    # 10000: v1 alone covers it. od2 cannot start this plan (its memory is not back),
    # so od1 claims no room for it: v2 keeps running (stopping it too would free room
    # no start takes, and the next plan would start v2 again)
    case = Case(
        [
            serve("fill", 10_000, RES, RUN),
            serve("v1", 10_000, EVI, RUN),
            serve("v2", 5000, EVI, RUN),
            serve("od1", 10_000, OND),
            serve("od2", 5000, OND),
        ],
        {"fill": up(), "v1": up(), "v2": up()},
        [],
        requests=[req("od1", at=NOW - 20), req("od2", at=NOW - 10)],
    )
    plan = plan_of(case, unreleased=frozenset({"od2"}))
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop v1", "od1"),
        ("release v1", "od1"),
        *((line, "od1") for line in starts("od1")),
    ]
    assert [b.serve for b in plan.blocked] == ["od2"]
    assert "not back yet" in plan.blocked[0].reason


def _ahead_case(later: sm.ServeSpec) -> Case:
    """Budget 30000, 28000 held (e-small 4000, e-big 10000, res 14000): ``r1`` (older,
    6000) is 4000 short, which e-small covers alone; ``later``, asked for after, would
    make e-big the one victim that covers both if ``r1`` claimed room for it."""
    return Case(
        [
            serve("e-small", 4000, EVI, RUN),
            serve("e-big", 10_000, EVI, RUN),
            serve("res", 14_000, RES, RUN),
            serve("r1", 6000, OND),
            later,
        ],
        {"e-small": up(), "e-big": up(), "res": up()},
        [],
        requests=[req("r1", at=NOW - 2), req(later.name, at=NOW - 1)],
    )


def test_a_requester_claims_no_room_ahead_for_a_later_exclusive_one() -> None:
    """An exclusive requester later in the pass needs its GPU to itself: its start stops
    or waits for what runs there, the earlier requester among them, so room claimed for
    it beside that one would be freed for nothing. ``r1`` chooses for itself alone
    (e-small); ``r2`` is blocked by the resident and by ``r1`` being started."""
    plan = plan_of(_ahead_case(serve("r2", 5000, OND, exclusive=True)))
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop e-small", "r1"),
        ("release e-small", "r1"),
        *((line, "r1") for line in starts("r1")),
    ]
    (b,) = plan.blocked
    assert b.reason == (
        "r2 cannot start: res runs (r2 needs a to itself) and may not be stopped: "
        "resident: never evicted; r1: being started in this plan (r2 needs a to itself)"
    )


def test_a_requester_claims_no_room_ahead_for_a_later_one_outside_the_ledger() -> None:
    """A later requester outside the ledger (one of its roles has no capacity row)
    reserves nothing when it starts: ``r1`` claims no room for it and stops only what it
    needs itself (e-small); ``r2`` then starts outside the ledger."""
    plan = plan_of(_ahead_case(serve("r2", 5000, OND, roles=("a", "x"))))
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop e-small", "r1"),
        ("release e-small", "r1"),
        *((line, "r1") for line in starts("r1")),
        ("start r2", "r2"),
        ("await_ready r2", "r2"),
    ]
    assert plan.blocked == ()


def test_a_requester_that_will_wait_for_a_loading_peer_claims_no_room_ahead() -> None:
    # budget 1000, all held: s02 (sizes itself from free memory) is starting with 300,
    # v1 holds 400, v2 300. od1 (older, 300) needs v2's room; od2 (400, sizes itself
    # from free memory too) waits for s02's load this plan whatever is freed, so od1
    # claims no room for it: v1 keeps running (stopping it too would free room no start
    # of this plan takes, and the next plan would start v1 again)
    case = Case(
        [
            serve("s02", 300, RES, RUN, sizes_from_free=True),
            serve("v1", 400, EVI, RUN),
            serve("v2", 300, EVI, RUN),
            serve("od1", 300, OND),
            serve("od2", 400, OND, sizes_from_free=True),
        ],
        {"s02": up(), "v1": up(), "v2": up()},
        [],
        requests=[req("od1", at=NOW - 20), req("od2", at=NOW - 10)],
        roles={"a": (1000, 0)},
    )
    plan = plan_of(case, starting={"s02": 300})
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop v2", "od1"),
        ("release v2", "od1"),
        *((line, "od1") for line in starts("od1")),
    ]
    assert [b.serve for b in plan.blocked] == ["od2"]
    assert "waits for the start of s02" in plan.blocked[0].reason


def test_a_requester_claims_room_past_a_later_one_that_waits_for_a_loading_peer() -> None:
    # as above, with od3 (400) after od2: od2 waits for s02's load, od3 does not, so
    # od1 claims room for itself and od3 (700, what v1 and v2 hold) and its group stops
    # both; od3 then starts in what is left
    case = Case(
        [
            serve("s02", 300, RES, RUN, sizes_from_free=True),
            serve("v1", 400, EVI, RUN),
            serve("v2", 300, EVI, RUN),
            serve("od1", 300, OND),
            serve("od2", 400, OND, sizes_from_free=True),
            serve("od3", 400, OND),
        ],
        {"s02": up(), "v1": up(), "v2": up()},
        [],
        requests=[req("od1", at=NOW - 30), req("od2", at=NOW - 20), req("od3", at=NOW - 10)],
        roles={"a": (1000, 0)},
    )
    plan = plan_of(case, starting={"s02": 300})
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop v1", "od1"),
        ("release v1", "od1"),
        ("stop v2", "od1"),
        ("release v2", "od1"),
        *((line, "od1") for line in starts("od1")),
        *((line, "od3") for line in starts("od3")),
    ]
    assert [b.serve for b in plan.blocked] == ["od2"]


def test_a_later_requester_that_sizes_from_free_with_no_peer_loading_has_room_claimed() -> None:
    # the first case of this section with od2 sizing itself from free memory: no peer
    # of that kind loads, so od2 starts this plan and od1 claims its room as before
    case = Case(
        [
            serve("fill", 10_000, RES, RUN),
            serve("v1", 10_000, EVI, RUN),
            serve("v2", 10_000, EVI, RUN),
            serve("od1", 6000, OND),
            serve("od2", 14_000, OND, sizes_from_free=True),
        ],
        {"fill": up(), "v1": up(), "v2": up()},
        [],
        requests=[req("od1", at=NOW - 20), req("od2", at=NOW - 10)],
    )
    plan = plan_of(case)
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop v1", "od1"),
        ("release v1", "od1"),
        ("stop v2", "od1"),
        ("release v2", "od1"),
        *((line, "od1") for line in starts("od1")),
        *((line, "od2") for line in starts("od2")),
    ]
    assert plan.blocked == ()


# ----- room a later start's forced stops make -------------------------------------------------
def _later_stop_case() -> Case:
    """``od`` needs 15000 on role a (budget 30000, all held by ``evi`` and the unmanaged
    ``other``); ``web``, later in the order, declares ``other``'s port."""
    return Case(
        [
            serve("od", 15_000, OND, RUN),
            serve("evi", 15_000, EVI, RUN),
            serve("other", 15_000, EVI, None, port=8001, gpu_inference=True),
            serve("web", None, OND, RUN, roles=("b",), port=8001),
        ],
        {"evi": up(), "other": up()},
        [],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
    )


def test_a_requester_waits_for_the_stop_a_later_start_forces_instead_of_evicting() -> None:
    """``od`` needs 15000 on a full role (budget 30000: ``evi`` 15000 and the unmanaged
    ``other`` 15000). ``web``, later in the order, must stop ``other`` by starting (they
    declare one port); that stop alone covers ``od``. ``od`` waits for it instead of
    evicting ``evi``, which keeps running: evicting it too would free the room twice,
    and the next plan would start it again (the plans would not converge)."""
    case = _later_stop_case()
    plan = plan_of(case)
    assert lines(plan) == [
        "stop other",
        "release other",
        "start web",
        "await_ready web",
        *starts("od"),
    ]
    assert plan.blocked == ()
    assert set(plan.ledger_after.holdings) == {"evi", "od"}
    desired, observed = _build(case)
    again = plan_transitions(desired, apply_plan(desired, observed, plan, NOW), Policy(), NOW)
    assert again.empty, lines(again)


def test_a_requester_whose_awaited_stop_does_not_come_evicts_in_the_retry() -> None:
    """As above, but ``web`` is held back by the policy: its stop never comes, so ``od``
    does not wait for it and evicts ``evi`` as it would without ``web``."""
    case = _later_stop_case()
    plan = plan_of(case, Policy(hold={"web": "an operator holds it"}))
    assert lines(plan) == ["stop evi", "release evi", *starts("od")]
    assert [b.serve for b in plan.blocked] == ["web"]


# ----- a sleeper woken where a later start needs its shrink ------------------------------
@pytest.mark.xfail(
    strict=True,
    reason="a sleeper the plan wakes is weighed asleep for the later starts of the same "
    "plan: it cannot be shrunk then, and evictions and shrinks are not mixed, so the start "
    "is blocked; the next plan, the sleeper awake, shrinks it and starts the serve",
)
def test_a_start_that_needs_a_woken_sleepers_shrink_is_not_left_to_the_next_plan() -> None:
    # budget 1000: charlie (resident, elastic 860, floor 361) and bravo (evictable, 500,
    # elastic down to 1, asleep at level 1 on 140, its engine's figure 140), desired
    # running, so woken (to 140). s03 (500) is short 500: charlie gives 499, bravo 1
    # once awake; the plan that wakes bravo blocks s03, and the next one starts it
    case = Case(
        [
            serve(
                "bravo",
                500,
                EVI,
                RUN,
                elastic=sm.Elastic(ELASTIC, 1, segment_mib=1),
                sleep=sm.Sleep(1, 140, SleepProtocol.VLLM),
            ),
            serve("charlie", 860, RES, RUN, elastic=sm.Elastic(ELASTIC, 361, segment_mib=1)),
            serve("s03", 500, OND, RUN),
        ],
        {"bravo": up(), "charlie": up()},
        [],
        roles={"a": (1000, 0)},
        elastic_mib={"bravo": 140},
    )
    desired, observed = _build(case)
    observed = replace(observed, sleep={"bravo": sm.SleepObs(sm.SleepState.ASLEEP, level=1)})
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert [b.serve for b in plan.blocked] == []  # today: s03, left to the next plan
    assert [(s.action, s.to_mib) for s in plan.steps if s.serve == "charlie"] == [
        (Action.SHRINK, 361)
    ]


def test_a_refusal_of_the_plans_ledger_is_raised_never_adopted() -> None:
    """The planner checks before it asks the plan's ledger for a change: a refusal
    coming back is a bug of the planner, raised with the ledger's message, never
    taken for a ledger and planned on."""
    from statemachine.ledger.reservations import Refusal, RefusalKind
    from statemachine.planning.planner import _ok

    refused = Refusal(RefusalKind.OVER_BUDGET, "llm", "a: short 10 MiB")
    with pytest.raises(AssertionError, match="something it refuses: a: short 10 MiB"):
        _ok(refused)
