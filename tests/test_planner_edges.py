"""The planner at its boundaries (docs/eviction.md): start order, shrink sizes,
``min_runtime_s`` exactly reached, grow-back sizes and the texts of steps and blocks.

Same style as tests/test_planner_rules.py (whose helpers these cases use): a small
fleet, an observation, and the plan expected as ``"action serve"`` lines, with the
MiB and reasons the docs promise, written from the rules, not from the code's output.
"""

from __future__ import annotations

import pytest
from test_planner_rules import EVI, NOW, OND, RES, RUN, STOP, Case, _build, req, serve, up

from statemachine.planner import Action, Plan, Policy, plan_transitions
from statemachine.simulate import ledger_prefixes
from statemachine.types import ContainerObs, ContainerState, Elastic

ELASTIC = "http://127.0.0.1:1"


def plan_of(case: Case, policy: Policy | None = None) -> Plan:
    desired, observed = _build(case)
    plan = plan_transitions(desired, observed, policy or Policy(), NOW)
    for step, ledger in ledger_prefixes(plan):
        assert not hasattr(ledger, "kind"), f"{step}: {ledger}"
    return plan


def lines(plan: Plan) -> list[str]:
    return [f"{s.action} {s.serve}" for s in plan.steps]


START = ["reserve {0}", "start {0}", "await_ready {0}"]


def starts(*names: str) -> list[str]:
    return [line.format(n) for n in names for line in START]


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
                elastic=Elastic(ELASTIC, floor, segment_mib=segment),
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
            serve("small", 9000, EVI, RUN, elastic=Elastic(ELASTIC, 7000, segment_mib=1000)),
            serve("large", 10_000, EVI, RUN, elastic=Elastic(ELASTIC, 7000, segment_mib=1000)),
            serve("still", 9000, EVI, RUN, elastic=Elastic(ELASTIC, 9000, segment_mib=1000)),
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


def test_a_serve_already_at_its_floor_gives_no_zero_mib_shrink() -> None:
    case = Case(
        [
            serve("aaa", 9000, EVI, RUN, elastic=Elastic(ELASTIC, 9000)),  # at its floor
            serve("moe", 19_000, EVI, RUN, elastic=Elastic(ELASTIC, 10_000, segment_mib=1000)),
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
    case.running = {"omni": ContainerObs(ContainerState.RUNNING, health="healthy")}
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
            serve("moe", 6000, EVI, RUN, elastic=Elastic(ELASTIC, 5000)),
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
            serve("moe", 20_000, EVI, RUN, elastic=Elastic(ELASTIC, 10_000)),
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
        [serve("moe", 20_000, EVI, RUN, elastic=Elastic(ELASTIC, 10_000))],
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
            [serve("old", 1000, EVI, RUN, port=9000), serve("new", 1000, residency, RUN, port=9000)],
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


# ----- shrinks across givers and roles --------------------------------------------------------
def test_shrinks_cover_the_shortfall_to_the_last_mib() -> None:
    # short 4000: large can give 3999 (1 MiB segments), so small gives the last 1 MiB
    case = Case(
        [
            serve("large", 20_000, EVI, RUN, elastic=Elastic(ELASTIC, 16_001, segment_mib=1)),
            serve("small", 8000, EVI, RUN, elastic=Elastic(ELASTIC, 7000, segment_mib=1)),
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
    # llm needs 3000 on a and on b. a: free 0, a1 can give 5000, a2 3000; b: free 1000,
    # b1 can give 2500. a1 covers a exactly (3000); a2 is on no role still short and is
    # not asked for 0 MiB; b1 still gives b's 2000
    seg1 = {"segment_mib": 1}
    case = Case(
        [
            serve("a1", 20_000, EVI, RUN, elastic=Elastic(ELASTIC, 15_000, **seg1)),
            serve("a2", 10_000, EVI, RUN, elastic=Elastic(ELASTIC, 7000, **seg1)),
            serve("b1", 29_000, EVI, RUN, roles=("b",), elastic=Elastic(ELASTIC, 26_500, **seg1)),
            serve("llm", 3000, OND, roles=("a", "b")),
        ],
        {"a1": up(), "a2": up(), "b1": up()},
        [],
        requests=[req("llm")],
        roles={"a": (32_000, 2000), "b": (32_000, 2000)},
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
