"""``decide_up``: the answer to an on-demand ``up`` (``statemachine.answers.up_decision``).

The same contract the HTTP tests state through the API (tests/shell/test_api.py,
tests/shell/test_pending_requests.py, tests/shell/test_router_absent.py,
tests/shell/test_up_wait_api.py),
stated on the pure decision: the status the operator and the router read (202 started,
409 never, 429 later with ``Retry-After``, 503 fail closed), the message the API sends
as ``error``, every term of the arithmetic in the body (requested, free, shortfall,
evictable, shrinkable, the requests counted as held) and the serves named. Pure: built
from hand-made fleets (tests/core/test_planner_rules.py), no controller.
"""

from __future__ import annotations

from typing import Any

from support.plan_cases import EVI, NOW, OND, RES, RUN, Case, _build, req, serve, up

from statemachine.answers.pending import PENDING_STATE, PendingStart
from statemachine.answers.up_decision import UpDecision, decide_up, mark_pending
from statemachine.planning.plan_types import (
    Policy,
)

RETRY_S = 2.5  # the resync period the API passes as the default Retry-After


def decide(case: Case, name: str, *, router: bool = True, retry_s: float = RETRY_S) -> UpDecision:
    desired, observed = _build(case)
    return decide_up(
        desired, observed, name, policy=Policy(), now=NOW, default_retry_s=retry_s, router=router
    )


def role(body: dict[str, Any]) -> dict[str, Any]:
    """The only role's terms, without its reservations."""
    [row] = body["gpu_roles"]
    return {k: v for k, v in row.items() if k != "reservations"}


def terms(budget: int, committed: int, requested: int, *, cap: int = 32_000) -> dict[str, Any]:
    free = budget - committed
    return {
        "gpu_role": "a",
        "capacity_mib": cap,
        "reserve_mib": cap - budget,
        "budget_mib": budget,
        "committed_mib": committed,
        "free_mib": free,
        "requested_mib": requested,
        "shortfall_mib": max(0, requested - free),
    }


# -- 202: admitted, with the steps the next cycle takes -------------------------------


def test_a_serve_that_fits_as_is_is_admitted_with_its_own_steps() -> None:
    case = Case([serve("stt", 8000, RES, RUN), serve("llm", 22_000, OND)], {"stt": up()}, [])
    got = decide(case, "llm")
    assert (got.status, got.retry_after_s) == (202, None)
    assert got.message == "llm fits: 22000 MiB requested, 22000 MiB free on a"
    assert set(got.body) == {"fit", "steps"}
    fit = got.body["fit"]
    assert fit["fits"] is True and fit["reason"] == got.message and fit["pending"] == []
    assert role(fit) == terms(30_000, 8000, 22_000)
    assert fit["gpu_roles"][0]["reservations"] == [{"serve": "stt", "mib": 8000}]
    assert [(s["action"], s["serve"], s["mib"]) for s in got.body["steps"]] == [
        ("reserve", "llm", 22_000),
        ("start", "llm", 22_000),
        ("await_ready", "llm", None),
    ]


def _tiered() -> Case:
    return Case(
        [
            serve("stt", 8000, RES, RUN),
            serve("omni", 20_000, EVI, RUN, router_tier="omni-local"),
            serve("llm", 20_000, OND),
        ],
        {"stt": up(), "omni": up()},
        [],
    )


def test_an_admission_that_evicts_lists_the_drain_and_the_stop_before_the_start() -> None:
    got = decide(_tiered(), "llm")
    assert got.status == 202 and got.message == "llm fits after stopping omni"
    fit = got.body["fit"]
    assert (fit["evict"], fit["drain"]) == (["omni"], ["omni"])
    assert role(fit) == terms(30_000, 28_000, 20_000)
    assert [(s["action"], s["serve"]) for s in got.body["steps"]] == [
        ("quiesce", "omni"),
        ("drain", "omni"),
        ("stop", "omni"),
        ("release", "omni"),
        ("reserve", "llm"),
        ("start", "llm"),
        ("await_ready", "llm"),
    ]
    assert {s["group"] for s in got.body["steps"]} == {"llm"}


# -- 409 without a router: a drain no cycle could carry out ---------------------------


def test_without_a_router_an_admission_that_drains_a_tier_is_409_with_the_fix() -> None:
    got = decide(_tiered(), "llm", router=False)
    assert (got.status, got.retry_after_s) == (409, None)
    assert got.message == (
        "up llm cannot be carried out without a router: omni is stopped to make room for "
        "llm, and its router tier omni-local is drained first; no router is configured: "
        "start `vramctl run` with --router-url URL (or VRAMCTL_ROUTER_URL)"
    )
    assert set(got.body) == {"fit", "needs_router"}
    assert got.body["needs_router"] == [
        {"serve": "omni", "router_tier": "omni-local", "when": "stopped to make room for llm"}
    ]
    assert got.body["fit"]["fits"] is True and got.body["fit"]["evict"] == ["omni"]


def test_without_a_router_a_serve_whose_own_tier_is_drained_at_its_end_is_409() -> None:
    case = Case([serve("fast", 1000, OND, router_tier="fast-local")], {}, [])
    got = decide(case, "fast", router=False)
    assert got.status == 409 and "fast-local" in got.message
    assert "VRAMCTL_ROUTER_URL" in got.message
    assert [n["serve"] for n in got.body["needs_router"]] == ["fast"]
    assert decide(case, "fast").status == 202


def test_without_a_router_an_admission_that_drains_nothing_is_202() -> None:
    case = Case([serve("stt", 8000, RES, RUN), serve("llm", 22_000, OND)], {"stt": up()}, [])
    got = decide(case, "llm", router=False)
    assert got.status == 202 and set(got.body) == {"fit", "steps"}


# -- 503: docker unreadable, nothing admitted -----------------------------------------


def test_docker_unreadable_fails_closed_with_503_and_unknown_figures() -> None:
    case = Case([serve("llm", 20_000, OND)], {}, [], docker_ok=False)
    got = decide(case, "llm", retry_s=0.2)
    assert (got.status, got.retry_after_s) == (503, 1)  # never a Retry-After of 0
    assert got.message == (
        "docker could not be read in the last cycle, so nothing is admitted: docker state "
        "is unknown: committed MiB cannot be known, nothing is admitted"
    )
    assert set(got.body) == {"fit"}
    fit = got.body["fit"]
    assert fit["fits"] is None
    [row] = fit["gpu_roles"]
    assert row["committed_mib"] is None and row["free_mib"] is None  # unknown, never 0
    assert row["requested_mib"] == 20_000
    assert decide(case, "llm", retry_s=2.5).retry_after_s == 3  # rounded up


def test_docker_unreadable_is_503_even_without_a_router_for_a_tiered_serve() -> None:
    case = Case([serve("fast", 1000, OND, router_tier="t")], {}, [], docker_ok=False)
    assert decide(case, "fast", router=False).status == 503


# -- 429: later, with every term and the soonest a protected serve frees up -----------


def test_a_resident_in_the_way_is_429_with_every_term_and_the_default_retry() -> None:
    case = Case([serve("stt", 20_000, RES, RUN), serve("llm", 20_000, OND)], {"stt": up()}, [])
    got = decide(case, "llm")
    assert (got.status, got.retry_after_s) == (429, 3)
    assert got.message == (
        "llm does not fit (eviction cannot cover the shortfall): a: capacity 32000 - "
        "reserve 2000 = budget 30000; committed 20000 (stt 20000); free 10000; needs "
        "20000; short 10000; evictable 0; shrinkable 0"
    )
    body = got.body
    assert body["fits"] is False and body["reason"] == got.message
    assert role(body) == terms(30_000, 20_000, 20_000)
    assert body["evictable_mib"] == {"a": 0} and body["shrinkable_mib"] == {"a": 0}
    assert body["blockers"] == ["stt"]
    assert body["protected"] == [{"serve": "stt", "mib": 20_000, "why": "resident: never evicted"}]
    assert body["pending"] == [] and "fit" not in body and "steps" not in body


def test_a_serve_inside_its_min_runtime_gives_its_remaining_time_rounded_up() -> None:
    case = Case(
        [serve("omni", 20_000, EVI, RUN, min_runtime_s=600), serve("llm", 20_000, OND)],
        {"omni": up(started=NOW - 60.5)},
        [],
    )
    got = decide(case, "llm")
    assert (got.status, got.retry_after_s) == (429, 540)  # 539.5 s left
    assert got.body["protected"][0]["serve"] == "omni"
    assert "min_runtime_s 600" in got.body["protected"][0]["why"]


def test_a_min_runtime_about_to_end_still_retries_after_at_least_one_second() -> None:
    case = Case(
        [serve("omni", 20_000, EVI, RUN, min_runtime_s=600), serve("llm", 20_000, OND)],
        {"omni": up(started=NOW - 599.7)},
        [],
    )
    assert decide(case, "llm").retry_after_s == 1


def test_the_soonest_protected_serve_to_free_up_sets_the_retry() -> None:
    case = Case(
        [
            serve("e1", 15_000, EVI, RUN, min_runtime_s=600),
            serve("e2", 15_000, EVI, RUN, min_runtime_s=600),
            serve("llm", 20_000, OND),
        ],
        {"e1": up(started=NOW - 100), "e2": up(started=NOW - 400)},
        [],
    )
    got = decide(case, "llm")
    assert (got.status, got.retry_after_s) == (429, 200)
    assert {p["serve"] for p in got.body["protected"]} == {"e1", "e2"}


# -- 409: a serve the controller never stops implicitly -------------------------------


def test_a_port_held_by_a_resident_is_409_naming_it() -> None:
    case = Case(
        [serve("stt", 1000, RES, RUN, port=9001), serve("alt", 1000, OND, port=9001)],
        {"stt": up()},
        [],
    )
    got = decide(case, "alt")
    assert (got.status, got.retry_after_s) == (409, None)
    assert got.message == (
        "alt cannot start while stt (resident: never evicted) runs, and the controller "
        "never stops that implicitly: alt cannot start: stt runs (holds port 9001) and may "
        "not be stopped: resident: never evicted"
    )
    assert got.body["blockers"] == ["stt"] and got.body["fits"] is False
    assert got.body["evictable_mib"] == {} and got.body["shrinkable_mib"] == {}
    assert role(got.body) == terms(30_000, 1000, 1000)


def test_a_port_held_by_a_serve_that_frees_up_is_429_not_409() -> None:
    case = Case(
        [
            serve("omni", 1000, EVI, RUN, port=9001, min_runtime_s=600),
            serve("alt", 1000, OND, port=9001),
        ],
        {"omni": up(started=NOW - 100)},
        [],
    )
    got = decide(case, "alt")
    assert (got.status, got.retry_after_s) == (429, 500)
    assert got.body["blockers"] == ["omni"]


def test_a_conflict_for_good_beside_a_wait_is_still_409() -> None:
    case = Case(
        [
            serve("stt", 1000, RES, RUN, port=9001),
            serve("omni", 30_000, EVI, RUN, min_runtime_s=600),
            serve("alt", 1000, OND, port=9001),
        ],
        {"stt": up(), "omni": up(started=NOW - 100)},
        [],
    )
    got = decide(case, "alt")
    assert got.status == 409 and got.retry_after_s is None
    assert got.message.startswith("alt cannot start while stt (resident: never evicted) runs")


# -- requests accepted, not yet planned: counted as held, named, marked ---------------


def _pending_case(*requests: str, extra: tuple[Any, ...] = ()) -> Case:
    return Case(
        [
            serve("res", 4000, RES, RUN),
            serve("a1", 5000, OND),
            serve("a2", 500, OND),
            serve("b1", 5000, OND),
            serve("small", 500, OND),
            *extra,
        ],
        {"res": up()},
        [],
        requests=[req(r, ttl=90) for r in requests],
        roles={"a": (10_000, 0)},
    )


def test_a_request_not_yet_planned_is_counted_as_held_and_named_in_the_refusal() -> None:
    got = decide(_pending_case("a1"), "b1")
    assert (got.status, got.retry_after_s) == (429, 89)  # a1's request ends in 89 s
    assert got.message.endswith(
        f"short 4000; evictable 0; shrinkable 0; counted as held: a1 5000 MiB ({PENDING_STATE})"
    )
    body = got.body
    assert role(body) == terms(10_000, 9000, 5000, cap=10_000)
    assert body["gpu_roles"][0]["reservations"] == [
        {"serve": "a1", "mib": 5000, "state": PENDING_STATE},
        {"serve": "res", "mib": 4000},
    ]
    assert [p["serve"] for p in body["pending"]] == ["a1"]
    assert body["pending"][0]["state"] == PENDING_STATE
    assert body["blockers"] == ["a1", "res"]


def test_every_pending_request_is_named_in_the_count() -> None:
    got = decide(_pending_case("a1", "a2"), "b1")
    assert got.status == 429
    assert got.message.endswith(f"counted as held: a1 5000 MiB, a2 500 MiB ({PENDING_STATE})")
    assert [p["serve"] for p in got.body["pending"]] == ["a1", "a2"]


def test_what_still_fits_beside_a_pending_request_is_admitted_and_sees_it() -> None:
    got = decide(_pending_case("a1"), "small")
    assert got.status == 202
    assert got.message == "small fits: 500 MiB requested, 1000 MiB free on a"
    assert [p["serve"] for p in got.body["fit"]["pending"]] == ["a1"]
    assert got.body["fit"]["gpu_roles"][0]["reservations"][0]["state"] == PENDING_STATE


def test_a_serve_own_request_is_not_counted_against_it() -> None:
    got = decide(_pending_case("a1"), "a1")
    assert got.status == 202 and got.body["fit"]["pending"] == []
    assert role(got.body["fit"]) == terms(10_000, 4000, 5000, cap=10_000)


def test_a_pending_request_not_part_of_the_refusal_is_not_named() -> None:
    big = serve("big", 7000, OND)
    got = decide(_pending_case("a2", extra=(big,)), "big")
    # short 1500 of which a2's 500 is part: named
    assert got.status == 429 and "counted as held: a2 500 MiB" in got.message
    # a refusal for a port held by a resident, with a2 pending and no shortfall: not named
    alt = serve("alt", 100, OND, port=9001)
    case = _pending_case("a2", extra=(alt,))
    case.serves[0] = serve("res", 4000, RES, RUN, port=9001)
    got = decide(case, "alt")
    assert got.status == 409 and "counted as held" not in got.message
    assert [p["serve"] for p in got.body["pending"]] == ["a2"]


def test_a_pending_request_in_the_shortfall_is_named_even_in_a_refusal_for_a_conflict() -> None:
    """A refusal names the requests counted as held whenever one is part of the
    shortfall, also when what blocks first is a conflict with a serve that stays."""
    alt = serve("alt", 7000, OND, port=9001)
    case = _pending_case("a2", extra=(alt,))
    case.serves[0] = serve("res", 4000, RES, RUN, port=9001)
    got = decide(case, "alt")
    # 10000 - res 4000 - a2's pending 500 = 5500 free of 7000: a2 is part of the 1500 short
    assert got.body["gpu_roles"][0]["shortfall_mib"] == 1500
    assert got.status == 409 and got.body["blockers"] == ["res"]
    assert got.message.endswith(f"; counted as held: a2 500 MiB ({PENDING_STATE})")


def test_a_pending_request_on_another_role_is_not_named() -> None:
    case = Case(
        [
            serve("stt", 20_000, RES, RUN),
            serve("llm", 20_000, OND),
            serve("far", 1000, OND, roles=("b",)),
        ],
        {"stt": up()},
        [],
        requests=[req("far", ttl=90)],
        roles={"a": (32_000, 2000), "b": (8000, 0)},
    )
    got = decide(case, "llm")
    assert got.status == 429 and "counted as held" not in got.message
    assert got.message.endswith("evictable 0; shrinkable 0")
    assert [p["serve"] for p in got.body["pending"]] == ["far"]


def test_a_port_held_by_a_pending_request_is_a_wait_naming_it() -> None:
    case = Case(
        [serve("p1", 100, OND, port=18001), serve("p2", 100, OND, port=18001)],
        {},
        [],
        requests=[req("p1", ttl=60)],
    )
    got = decide(case, "p2")
    assert (got.status, got.retry_after_s) == (429, 59)
    assert got.message == (
        "p2 cannot start: p1: its start is in progress (holds port 18001); "
        f"counted as held: p1 100 MiB ({PENDING_STATE})"
    )
    assert got.body["blockers"] == ["p1"]
    assert got.body["gpu_roles"][0]["shortfall_mib"] == 0


# -- mark_pending: the fit or ledger JSON with the pending starts said so -------------


def test_mark_pending_marks_only_the_pending_reservations() -> None:
    data: dict[str, Any] = {
        "x": 1,
        "gpu_roles": [
            {"gpu_role": "a", "reservations": [{"serve": "p", "mib": 1}, {"mib": 2}]},
            {"gpu_role": "b", "committed_mib": None},
        ],
    }
    pending = (PendingStart("p", ("a",), 1),)
    got = mark_pending(data, pending)
    assert got == {
        "x": 1,
        "gpu_roles": [
            {
                "gpu_role": "a",
                "reservations": [{"serve": "p", "mib": 1, "state": PENDING_STATE}, {"mib": 2}],
            },
            {"gpu_role": "b", "committed_mib": None},
        ],
        "pending": [pending[0].to_json()],
    }
    assert data["gpu_roles"][0]["reservations"][0] == {"serve": "p", "mib": 1}  # not changed


def test_mark_pending_on_json_without_roles_adds_the_pending_list() -> None:
    assert mark_pending({}, ()) == {"gpu_roles": [], "pending": []}


def test_a_router_is_assumed_unless_said_otherwise() -> None:
    desired, observed = _build(_tiered())
    got = decide_up(desired, observed, "llm", policy=Policy(), now=NOW, default_retry_s=RETRY_S)
    assert got.status == 202 and "needs_router" not in got.body


def test_a_retry_after_is_never_zero_even_with_a_zero_default() -> None:
    unread = Case([serve("llm", 20_000, OND)], {}, [], docker_ok=False)
    assert decide(unread, "llm", retry_s=0.0).retry_after_s == 1
    held = Case([serve("stt", 20_000, RES, RUN), serve("llm", 20_000, OND)], {"stt": up()}, [])
    assert decide(held, "llm", retry_s=0.0).retry_after_s == 1
