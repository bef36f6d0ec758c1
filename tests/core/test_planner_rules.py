"""Table tests for the planner, one per rule of docs/design.md §3 / the planner's docstring.

Each case builds a small fleet on one or two roles, an observation and maybe
requests, and states the plan it expects as ``"action serve"`` lines and which serves
are blocked. The cases are written from the rules, not from the code's output.
"""

from __future__ import annotations

import pytest
from support.plan_cases import EVI, NOW, OND, RES, RUN, STOP, Case, _build, req, serve, up

from statemachine.domain import types as sm
from statemachine.planning.plan_types import (
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.planning.simulate import ledger_prefixes

CASES: dict[str, Case] = {
    "converged-nothing-to-do": Case(
        [serve("stt", 2000, RES, RUN), serve("emb", 4000, EVI, RUN)],
        {"stt": up(), "emb": up()},
        [],
    ),
    "resident-fits-starts": Case(
        [serve("stt", 2000, RES, RUN)],
        {},
        ["reserve stt", "start stt", "await_ready stt"],
    ),
    "resident-too-big-is-blocked-not-forced": Case(
        [serve("big", 29_000, RES, RUN), serve("emb", 4000, EVI, RUN)],
        {"emb": up()},
        [],
        ["big"],
        blocked_mentions=["short 3000", "budget 30000", "do not evict"],
    ),
    "on-demand-evicts-evictable-drain-first": Case(
        [
            serve("stt", 2000, RES, RUN),
            serve("omni", 20_000, EVI, RUN, router_tier="omni-local"),
            serve("llm", 20_000, OND),
        ],
        {"stt": up(), "omni": up()},
        [
            "quiesce omni",
            "drain omni",
            "stop omni",
            "release omni",
            "reserve llm",
            "start llm",
            "await_ready llm",
        ],
        requests=[req("llm")],
    ),
    "readmit-after-healthy-start": Case(
        [serve("llm", 20_000, OND, router_tier="fast")],
        {},
        ["reserve llm", "start llm", "await_ready llm", "readmit llm"],
        requests=[req("llm")],
    ),
    "evictable-never-evicts": Case(
        [serve("omni", 20_000, EVI), serve("ocr", 20_000, EVI, RUN)],
        {"omni": up()},
        [],
        ["ocr"],
        blocked_mentions=["do not evict"],
    ),
    "resident-never-a-victim": Case(
        [serve("stt", 20_000, RES, RUN), serve("llm", 20_000, OND)],
        {"stt": up()},
        [],
        ["llm"],
        requests=[req("llm")],
        blocked_mentions=["stt", "resident: never evicted", "evictable 0"],
    ),
    "min-runtime-protects-fresh-serve": Case(
        [serve("omni", 20_000, EVI, RUN, min_runtime_s=600), serve("llm", 20_000, OND)],
        {"omni": up(started=NOW - 60)},
        [],
        ["llm"],
        requests=[req("llm")],
        blocked_mentions=["min_runtime_s"],
    ),
    "min-runtime-expired-may-evict": Case(
        [serve("omni", 20_000, EVI, RUN, min_runtime_s=600), serve("llm", 20_000, OND)],
        {"omni": up(started=NOW - 6000)},
        ["stop omni", "release omni", "reserve llm", "start llm", "await_ready llm"],
        requests=[req("llm")],
    ),
    "fewest-victims-then-least-overshoot": Case(
        [
            serve("e1", 5000, EVI),
            serve("e2", 5000, EVI),
            serve("e3", 10_000, EVI),
            serve("e4", 9000, EVI),
            serve("llm", 9000, OND),
        ],
        # budget 30000, committed 29000, free 1000, short 8000: one victim suffices;
        # e4 (9000) overshoots by 1000, e3 (10000) by 2000
        {"e1": up(), "e2": up(), "e3": up(), "e4": up()},
        ["stop e4", "release e4", "reserve llm", "start llm", "await_ready llm"],
        requests=[req("llm")],
    ),
    "lower-priority-victim-first": Case(
        [
            serve("keep", 10_000, EVI, priority=5),
            serve("lose", 10_000, EVI, priority=1),
            serve("llm", 15_000, OND),
        ],
        {"keep": up(), "lose": up()},
        ["stop lose", "release lose", "reserve llm", "start llm", "await_ready llm"],
        requests=[req("llm")],
    ),
    "least-recently-started-victim-first": Case(
        [serve("new", 10_000, EVI), serve("old", 10_000, EVI), serve("llm", 15_000, OND)],
        {"new": up(started=NOW - 100), "old": up(started=NOW - 9000)},
        ["stop old", "release old", "reserve llm", "start llm", "await_ready llm"],
        requests=[req("llm")],
    ),
    "desired-stopped-drains-then-stops": Case(
        [serve("omni", 20_000, EVI, STOP, router_tier="omni-local")],
        {"omni": up()},
        ["quiesce omni", "drain omni", "stop omni", "release omni"],
    ),
    "desired-stopped-without-router-tier-just-stops": Case(
        [serve("ocr", 8000, RES, STOP)],
        {"ocr": up()},
        ["stop ocr", "release ocr"],
    ),
    "ttl-expired-stops-on-demand": Case(
        [serve("llm", 20_000, OND)],
        {"llm": up()},
        ["stop llm", "release llm"],
        requests=[req("llm", ttl=60, at=NOW - 120)],
    ),
    "ttl-running-keeps-on-demand": Case(
        [serve("llm", 20_000, OND)],
        {"llm": up()},
        [],
        requests=[req("llm", ttl=600, at=NOW - 120)],
    ),
    "unmanaged-serves-left-alone": Case(
        [serve("omni", 20_000, EVI), serve("ocr", 4000, RES)],
        {"omni": up()},
        [],
    ),
    "backfill-by-priority-when-room-returns": Case(
        [
            serve("low", 12_000, EVI, RUN, priority=1),
            serve("high", 12_000, EVI, RUN, priority=9),
            serve("mid", 12_000, EVI, RUN, priority=5),
        ],
        {},
        [
            "reserve high",
            "start high",
            "await_ready high",
            "reserve mid",
            "start mid",
            "await_ready mid",
        ],
        ["low"],
    ),
    "exclusive-evicts-evictables-blocked-by-residents": Case(
        [
            serve("tp2", 25_000, OND, roles=("a", "b"), exclusive=True),
            serve("omni", 10_000, EVI, RUN, roles=("b",)),
            serve("primary", 20_000, RES, roles=("a",)),
        ],
        {"omni": up(), "primary": up()},
        [],
        ["tp2"],
        requests=[req("tp2")],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
        blocked_mentions=["primary", "resident: never evicted"],
    ),
    "exclusive-stops-all-gpu-inference-spares-sidecar": Case(
        [
            serve("tp2", 25_000, OND, roles=("a", "b"), exclusive=True),
            serve("omni", 1000, EVI, RUN, roles=("b",)),
            serve("side", 500, EVI, roles=("a",)),
            serve("proxy", None, None, roles=("a",), gpu_inference=False),
        ],
        {"omni": up(), "side": up(), "proxy": up()},
        [
            "stop omni",
            "release omni",
            "stop side",
            "release side",
            "reserve tp2",
            "start tp2",
            "await_ready tp2",
        ],
        requests=[req("tp2")],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
    ),
    "nothing-gpu-bound-starts-beside-exclusive": Case(
        [
            serve("tp2", 25_000, OND, roles=("a", "b"), exclusive=True),
            serve("emb", 1000, RES, RUN, roles=("a",)),
            serve("proxy", None, None, RUN, roles=("a",), gpu_inference=False),
        ],
        {"tp2": up()},
        ["start proxy", "await_ready proxy"],
        ["emb"],
        requests=[req("tp2")],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
        blocked_mentions=["exclusive"],
    ),
    "port-held-by-resident-blocks": Case(
        [
            serve("primary", 10_000, RES, port=30002),
            serve("rollback", 10_000, RES, RUN, port=30002),
        ],
        {"primary": up()},
        [],
        ["rollback"],
        blocked_mentions=["port 30002"],
    ),
    "port-held-by-evictable-evicted-by-on-demand": Case(
        [serve("old", 1000, EVI, port=9000), serve("llm", 1000, OND, port=9000)],
        {"old": up()},
        ["stop old", "release old", "reserve llm", "start llm", "await_ready llm"],
        requests=[req("llm")],
    ),
    "elastic-shrink-preferred-when-it-covers": Case(
        [
            serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic("http://127.0.0.1:1", 12_000)),
            serve("omni", 8000, EVI, RUN),
            serve("llm", 6000, OND),
        ],
        # budget 30000, committed 28000, free 2000, short 4000; moe can give 8000
        {"moe": up(), "omni": up()},
        ["shrink moe", "reserve llm", "start llm", "await_ready llm"],
        requests=[req("llm")],
    ),
    "elastic-grows-back-when-room-returns": Case(
        [serve("moe", 20_000, EVI, RUN, elastic=sm.Elastic("http://127.0.0.1:1", 12_000))],
        {"moe": up()},
        ["grow moe"],
        elastic_mib={"moe": 14_000},
    ),
    "docker-unknown-fails-closed": Case(
        [serve("stt", 2000, RES, RUN), serve("omni", 2000, EVI, STOP)],
        {"omni": up()},
        [],
        ["stt", "omni"],
        docker_ok=False,
        blocked_mentions=["unknown"],
    ),
    "requested-but-desired-stopped-is-blocked": Case(
        [serve("llm", 2000, OND, STOP)],
        {},
        [],
        ["llm"],
        requests=[req("llm")],
    ),
    "serve-without-reservation-starts-outside-ledger": Case(
        [serve("proxy", None, None, RUN, gpu_inference=False)],
        {},
        ["start proxy", "await_ready proxy"],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_planner_rule(case: Case) -> None:
    desired, observed = _build(case)
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert [f"{s.action} {s.serve}" for s in plan.steps] == case.expect_steps
    assert sorted(b.serve for b in plan.blocked) == sorted(case.expect_blocked)
    text = " ".join(
        b.reason + " " + " ".join(p.why + " " + p.serve for p in b.protected) for b in plan.blocked
    )
    for word in case.blocked_mentions:
        assert word in text, f"{word!r} not in blocked reasons: {text}"
    # every prefix of the plan stays within budget
    for step, ledger in ledger_prefixes(plan):
        assert not isinstance(ledger, Exception)
        assert not hasattr(ledger, "kind"), f"{step}: {ledger}"


def test_blocked_carries_every_term() -> None:
    desired, observed = _build(CASES["resident-never-a-victim"])
    plan = plan_transitions(desired, observed, Policy(), NOW)
    (blocked,) = plan.blocked
    data = blocked.to_json()["ledger"]
    (terms,) = data["gpu_roles"]
    assert terms == {
        "gpu_role": "a",
        "capacity_mib": 32_000,
        "reserve_mib": 2_000,
        "budget_mib": 30_000,
        "committed_mib": 20_000,
        "free_mib": 10_000,
        "requested_mib": 20_000,
        "shortfall_mib": 10_000,
        "reservations": [{"serve": "stt", "mib": 20_000}],
    }
    assert data["evictable_mib"] == {"a": 0}
    assert data["protected"] == [{"serve": "stt", "mib": 20_000, "why": "resident: never evicted"}]


def test_shrink_step_carries_amounts() -> None:
    desired, observed = _build(CASES["elastic-shrink-preferred-when-it-covers"])
    plan = plan_transitions(desired, observed, Policy(), NOW)
    shrink = plan.steps[0].to_json()
    # 4000 short: the engine gives back whole 512 MiB segments, so 8 of them (4096)
    assert shrink["mib"] == 4096 and shrink["to_mib"] == 15_904
    assert plan.ledger_after.committed_mib("a") == 29_904


def _elastic_case(segment_mib: int, floor_mib: int, moe_mib: int = 20_000) -> Case:
    return Case(
        [
            serve(
                "moe",
                moe_mib,
                EVI,
                RUN,
                elastic=sm.Elastic("http://127.0.0.1:1", floor_mib, segment_mib=segment_mib),
            ),
            serve("omni", 8000, EVI, RUN),
            serve("llm", 6000, OND),
        ],
        {"moe": up(), "omni": up()},
        [],
        requests=[req("llm")],
    )


def test_a_shrink_is_whole_segments_that_cover_the_need() -> None:
    # budget 30000, committed 28000: llm is 4000 short; 1000 MiB segments: 4 of them
    desired, observed = _build(_elastic_case(1000, 12_000))
    (shrink,) = [s for s in plan_transitions(desired, observed, Policy(), NOW).steps][:1]
    assert (str(shrink.action), shrink.mib, shrink.to_mib) == ("shrink", 4000, 16_000)
    desired, observed = _build(_elastic_case(3000, 12_000))
    (shrink,) = [s for s in plan_transitions(desired, observed, Policy(), NOW).steps][:1]
    assert (str(shrink.action), shrink.mib, shrink.to_mib) == ("shrink", 6000, 14_000)


def test_only_whole_segments_above_the_floor_are_shrinkable() -> None:
    # moe may give 8000 above its floor, but in 3000 MiB segments only 6000; with a
    # 7000 MiB segment only one (7000 >= 4000); with a 9000 MiB segment none: eviction
    desired, observed = _build(_elastic_case(7000, 12_000))
    first = plan_transitions(desired, observed, Policy(), NOW).steps[0]
    assert (str(first.action), first.mib) == ("shrink", 7000)
    desired, observed = _build(_elastic_case(9000, 12_000))
    first = plan_transitions(desired, observed, Policy(), NOW).steps[0]
    assert f"{first.action} {first.serve}" == "stop omni"


def test_a_partial_grow_takes_whole_segments() -> None:
    moe = serve(
        "moe", 20_000, EVI, RUN, elastic=sm.Elastic("http://127.0.0.1:1", 12_000, segment_mib=512)
    )
    other = serve("omni", 13_000, EVI, RUN)
    # budget 30000: moe at 14000 + omni 13000 leave 3000 free: 5 segments (2560)
    desired, observed = _build(
        Case([moe, other], {"moe": up(), "omni": up()}, [], elastic_mib={"moe": 14_000})
    )
    (grow,) = plan_transitions(desired, observed, Policy(), NOW).steps
    assert (str(grow.action), grow.mib, grow.to_mib) == ("grow", 2560, 16_560)


def test_overcommitted_observation_is_reported() -> None:
    desired, observed = _build(
        Case([serve("x", 20_000, EVI), serve("y", 20_000, EVI)], {"x": up(), "y": up()}, [])
    )
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert plan.empty
    assert any("over budget" in n for n in plan.notes)


def test_no_shrink_falls_back_to_eviction() -> None:
    desired, observed = _build(CASES["elastic-shrink-preferred-when-it-covers"])
    plan = plan_transitions(desired, observed, Policy(no_shrink=frozenset({"moe"})), NOW)
    # without shrinking moe, the least-overshoot single victim is omni (8000 >= 4000 short)
    assert [f"{s.action} {s.serve}" for s in plan.steps] == [
        "stop omni",
        "release omni",
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]


def test_hold_blocks_a_start_with_its_reason() -> None:
    desired, observed = _build(CASES["resident-fits-starts"])
    plan = plan_transitions(desired, observed, Policy(hold={"stt": "backing off"}), NOW)
    assert plan.empty
    assert [(b.serve, b.reason) for b in plan.blocked] == [
        ("stt", "stt is held back: backing off; its room (2000 MiB on a) is kept for it")
    ]
    assert "stt" not in plan.ledger_after.holdings  # kept while planning, held by nothing


def test_a_resident_held_back_outside_the_ledger_keeps_no_room() -> None:
    """A held-back resident keeps its room where the ledger counts it (docs/eviction.md);
    one outside the ledger (no reservation, or a role without a capacity row) has no
    room to keep: it is blocked with its reason alone and nothing is reserved for it."""
    case = Case(
        [serve("proxy", None, RES, RUN), serve("side", 2000, RES, RUN, roles=("x",))], {}, []
    )
    desired, observed = _build(case)
    hold = {"proxy": "backing off", "side": "backing off"}
    plan = plan_transitions(desired, observed, Policy(hold=hold), NOW)
    assert plan.steps == ()
    assert [(b.serve, b.reason) for b in plan.blocked] == [
        ("proxy", "proxy is held back: backing off"),
        ("side", "side is held back: backing off"),
    ]
    assert plan.ledger_after.holdings == {}


def test_every_victim_is_drained_before_any_stops() -> None:
    serves = [
        serve("a1", 10_000, EVI, router_tier="t1"),
        serve("a2", 10_000, EVI, router_tier="t2"),
        serve("llm", 25_000, OND),
    ]
    desired, observed = _build(Case(serves, {"a1": up(), "a2": up()}, []))
    desired = sm.DesiredState(desired.roles, desired.serves, (req("llm"),))
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert [f"{s.action} {s.serve}" for s in plan.steps][:8] == [
        "quiesce a1",
        "drain a1",
        "quiesce a2",
        "drain a2",
        "stop a1",
        "release a1",
        "stop a2",
        "release a2",
    ]
    assert {s.group for s in plan.steps} == {"llm"}


def test_a_tier_left_quiesced_is_readmitted_while_its_serve_runs() -> None:
    serves = [
        serve("omni", 8000, EVI, RUN, router_tier="omni-local"),
        serve("gone", 8000, EVI, router_tier="gone-local"),
    ]
    desired, observed = _build(Case(serves, {"omni": up()}, []))
    observed = sm.Observed(True, observed.containers, quiesced=frozenset({"omni", "gone"}))
    plan = plan_transitions(desired, observed, Policy(), NOW)
    # gone does not run: nothing to readmit; omni runs with its tier left quiesced
    assert [f"{s.action} {s.serve}" for s in plan.steps] == ["readmit omni"]
    assert "left quiesced" in plan.steps[0].reason


def test_only_a_router_tier_left_quiesced_is_readmitted_as_its_own_group() -> None:
    """A running serve whose tier was left quiesced is readmitted, in a group of its own
    (not the start planned before it); one that declares no router tier (the tier was
    dropped from the manifest) has nothing to readmit."""
    serves = [
        serve("omni", 8000, EVI, RUN, router_tier="omni-local"),
        serve("plain", 8000, EVI, RUN),
        serve("new", 4000, RES, RUN),
    ]
    desired, observed = _build(Case(serves, {"omni": up(), "plain": up()}, []))
    observed = sm.Observed(True, observed.containers, quiesced=frozenset({"omni", "plain"}))
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("reserve new", "new"),
        ("start new", "new"),
        ("await_ready new", "new"),
        ("readmit omni", "omni"),
    ]


def test_memory_not_back_after_a_stop_still_counts() -> None:
    serves = [serve("omni", 20_000, EVI, RUN), serve("llm", 20_000, OND)]
    desired, _ = _build(Case(serves, {}, []))
    exited = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)
    observed = sm.Observed(True, {"c-omni": exited}, unreleased=frozenset({"omni"}))
    plan = plan_transitions(
        sm.DesiredState(desired.roles, desired.serves, (req("llm"),)), observed, Policy(), NOW
    )
    # omni's 20000 MiB are still counted: llm (20000) does not fit in 10000 free, and omni,
    # which does not run, is no victim; omni itself waits until its memory is back
    assert plan.steps == ()
    by = {b.serve: b for b in plan.blocked}
    assert [(p.serve, p.why) for p in by["llm"].protected] == [
        ("omni", "exited, but its memory is not back yet")
    ]
    assert "memory of its last run is not back" in by["omni"].reason
    assert plan.ledger_after.committed_mib("a") == 20_000


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (sm.OnDemandRequest("fast", NOW - 1, 0.0, released=True), "was released (down)"),
        (req("fast", ttl=5.0, at=NOW - 10), "expired (TTL)"),
    ],
    ids=["released", "ttl"],
)
def test_the_stop_says_whether_the_request_was_released_or_ran_out(
    request_: sm.OnDemandRequest, why: str
) -> None:
    case = Case([serve("fast", 8000, OND)], {"fast": up()}, [], requests=[request_])
    desired, observed = _build(case)
    plan = plan_transitions(desired, observed, Policy(), NOW)
    [stop] = [s for s in plan.steps if s.action == "stop"]
    assert stop.reason == f"the on-demand request for fast {why}", stop.reason
