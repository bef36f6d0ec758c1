"""``fit_serve``: can a serve run now, and at what cost (docs/architecture.md, fit JSON;
docs/eviction.md for the rules behind each answer).

The question is asked in isolation: other serves' intents are ignored, only what
this start would cost is listed. Each case states the answer the docs promise:
``fits``, the reason, each role's arithmetic, and what would be drained, evicted,
shrunk or what blocks it.
"""

from __future__ import annotations

from support.plan_cases import EVI, NOW, OND, RES, RUN, Case, _build, req, serve, up

from statemachine.answers.fit import FitResult, fit_serve, request_plan
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.planning.plan_types import (
    Action,
    Policy,
)


def fit(case: Case, name: str, policy: Policy | None = None) -> FitResult:
    desired, observed = _build(case)
    return fit_serve(desired, observed, name, policy=policy, now=NOW)


def test_a_running_serve_fits_and_says_what_it_holds() -> None:
    case = Case(
        [serve("llm", 20_000, OND), serve("stt", 8000, RES, RUN)], {"llm": up(), "stt": up()}, []
    )
    got = fit(case, "llm")
    assert got.fits
    assert got.reason == "llm is already running and holds 20000 MiB"
    (t,) = got.terms
    assert (t.committed_mib, t.free_mib, t.requested_mib, t.shortfall_mib) == (28_000, 2000, 0, 0)
    assert (got.evict, got.drain, got.shrink, got.blockers) == ((), (), (), ())


def test_a_running_serve_outside_the_ledger_fits_without_terms() -> None:
    case = Case([serve("proxy", None, None, RUN, gpu_inference=False)], {"proxy": up()}, [])
    got = fit(case, "proxy")
    assert got.fits and got.reason == "proxy is already running" and got.terms == ()


def test_a_serve_that_fits_as_is_states_requested_and_free() -> None:
    case = Case([serve("stt", 8000, RES, RUN), serve("llm", 22_000, OND)], {"stt": up()}, [])
    got = fit(case, "llm")
    assert got.fits
    assert got.reason == "llm fits: 22000 MiB requested, 22000 MiB free on a"
    assert got.to_json() == {
        "serve": "llm",
        "fits": True,
        "reason": "llm fits: 22000 MiB requested, 22000 MiB free on a",
        "gpu_roles": [
            {
                "gpu_role": "a",
                "capacity_mib": 32_000,
                "reserve_mib": 2000,
                "budget_mib": 30_000,
                "committed_mib": 8000,
                "free_mib": 22_000,
                "requested_mib": 22_000,
                "shortfall_mib": 0,
                "reservations": [{"serve": "stt", "mib": 8000}],
            }
        ],
        "drain": [],
        "evict": [],
        "shrink": [],
        "blockers": [],
        "protected": [],
    }


def test_a_fit_after_eviction_lists_drain_and_evict() -> None:
    case = Case(
        [
            serve("omni", 20_000, EVI, RUN, router_tier="t-omni"),
            serve("llm", 20_000, OND),
        ],
        {"omni": up()},
        [],
    )
    got = fit(case, "llm")
    assert got.fits
    assert got.reason == "llm fits after stopping omni"
    assert (got.drain, got.evict, got.shrink) == (("omni",), ("omni",), ())
    assert got.terms[0].shortfall_mib == 10_000


def test_a_fit_after_shrinking_lists_the_shrink() -> None:
    case = Case(
        [
            serve(
                "moe",
                20_000,
                EVI,
                RUN,
                elastic=sm.Elastic("http://127.0.0.1:1", 16_000, None, 1000),
            ),
            serve("omni", 8000, EVI, RUN),
            serve("llm", 6000, OND),
        ],
        {"moe": up(), "omni": up()},
        [],
    )
    got = fit(case, "llm")
    assert got.fits
    assert got.reason == "llm fits after shrinking moe by 4000 MiB"
    assert got.shrink == ({"serve": "moe", "give_mib": 4000, "to_mib": 16_000},)
    assert got.evict == () and got.drain == ()


def test_a_blocked_fit_keeps_the_arithmetic_and_the_blockers() -> None:
    case = Case([serve("stt", 20_000, RES, RUN), serve("llm", 20_000, OND)], {"stt": up()}, [])
    got = fit(case, "llm")
    assert not got.fits
    assert got.reason == (
        "llm does not fit (eviction cannot cover the shortfall): a: capacity 32000 - reserve "
        "2000 = budget 30000; committed 20000 (stt 20000); free 10000; needs 20000; short "
        "10000; evictable 0; shrinkable 0"
    )
    (t,) = got.terms
    assert (t.committed_mib, t.free_mib, t.requested_mib, t.shortfall_mib) == (
        20_000,
        10_000,
        20_000,
        10_000,
    )
    assert got.blockers == ("stt",)
    assert got.to_json()["protected"] == [
        {"serve": "stt", "mib": 20_000, "why": "resident: never evicted"}
    ]


def test_a_resident_that_does_not_fit_evicts_nothing() -> None:
    case = Case([serve("omni", 20_000, EVI, RUN), serve("big", 20_000, RES)], {"omni": up()}, [])
    got = fit(case, "big")
    assert not got.fits
    assert "resident serves do not evict; only on-demand serves do" in got.reason
    assert got.evict == ()


def test_a_blocked_conflict_names_the_holder_of_the_port() -> None:
    case = Case(
        [serve("primary", 1000, RES, RUN, port=9000), serve("llm", 1000, OND, port=9000)],
        {"primary": up()},
        [],
    )
    got = fit(case, "llm")
    assert not got.fits
    assert got.reason == (
        "llm cannot start: primary runs (holds port 9000) and may not be stopped: "
        "resident: never evicted"
    )
    assert got.blockers == ("primary",)
    assert got.terms[0].requested_mib == 1000  # the plain arithmetic, as the ledger stands


def test_the_question_is_asked_in_isolation() -> None:
    # stt wants to run (desired running) and would take the room first in a real pass;
    # fit answers only what llm's own start costs
    case = Case([serve("stt", 20_000, RES, RUN), serve("llm", 20_000, OND)], {}, [])
    got = fit(case, "llm")
    assert got.fits and got.reason == "llm fits: 20000 MiB requested, 30000 MiB free on a"
    desired, observed = _build(case)
    plan = request_plan(desired, observed, "llm", now=NOW)
    assert [f"{s.action} {s.serve}" for s in plan.steps] == [
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]
    assert all(s.action is not Action.STOP for s in plan.steps)


def test_serves_the_ledger_does_not_govern() -> None:
    case = Case(
        [
            serve("proxy", None, None, gpu_inference=False),
            serve("far", 500, EVI, roles=("nowhere",)),
        ],
        {},
        [],
    )
    proxy = fit(case, "proxy")
    assert (
        proxy.fits and proxy.reason == "proxy declares no vram_mib: the ledger does not govern it"
    )
    assert proxy.terms == ()
    far = fit(case, "far")
    assert far.fits and far.reason == "far has no role with capacity: the ledger does not govern it"
    assert far.terms == ()


def test_unknown_docker_state_never_fits() -> None:
    case = Case([serve("llm", 2000, OND)], {}, [], docker_ok=False)
    got = fit(case, "llm")
    assert not got.fits
    assert got.reason == (
        "docker state is unknown: committed MiB cannot be known, nothing is admitted"
    )
    (t,) = got.terms
    assert t.committed_mib is None and t.free_mib is None and t.requested_mib == 2000


def test_a_held_back_serve_does_not_fit_with_the_hold_reason() -> None:
    case = Case([serve("llm", 2000, OND)], {}, [])
    got = fit(case, "llm", Policy(hold={"llm": "backing off after 3 failed starts"}))
    assert not got.fits
    assert got.reason == "llm is held back: backing off after 3 failed starts"
    assert got.terms[0].requested_mib == 2000  # the plain arithmetic when the block has none


def test_an_exited_serve_whose_memory_is_not_back_does_not_fit_yet() -> None:
    case = Case([serve("llm", 2000, OND)], {}, [])
    desired, _ = _build(case)
    observed = sm.Observed(
        True,
        {"c-llm": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)},
        unreleased=frozenset({"llm"}),
    )
    got = fit_serve(desired, observed, "llm", now=NOW)
    assert not got.fits
    assert "memory of its last run is not back yet" in got.reason
    assert got.terms[0].requested_mib == 0


def test_request_plan_carries_the_request() -> None:
    case = Case([serve("llm", 2000, OND)], {}, [], requests=[req("llm")])
    desired, observed = _build(case)
    plan = request_plan(desired, observed, "llm", now=NOW)
    assert plan.steps[1].reason == "on-demand request for llm"


def test_the_json_of_a_sleepers_wake_says_wake_and_no_victim_slept() -> None:
    """Where sleep takes part the fit JSON says so: a serve that sleeps is woken, not
    started (``wake: true``), with nothing else put to sleep (``sleep: []``); where sleep
    takes no part neither key is there."""
    llm = serve("llm", 8000, OND, sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM, 2000))
    desired, _ = _build(Case([llm], {}, []))
    asleep = sm.Observed(
        True, {"c-llm": up()}, sleep={"llm": sm.SleepObs(sm.SleepState.ASLEEP, level=1)}
    )
    out = fit_serve(desired, asleep, "llm", now=NOW).to_json()
    assert (out["fits"], out["sleep"], out["wake"]) == (True, [], True)
    stopped = fit_serve(desired, sm.Observed(True), "llm", now=NOW).to_json()
    assert stopped["fits"] and "sleep" not in stopped and "wake" not in stopped
    # a container that exited is started, not woken, whatever its last sleep reading said
    exited = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)
    stale = sm.Observed(
        True, {"c-llm": exited}, sleep={"llm": sm.SleepObs(sm.SleepState.ASLEEP, level=1)}
    )
    cold = fit_serve(desired, stale, "llm", now=NOW).to_json()
    assert cold["fits"] and "wake" not in cold


def test_a_placed_serve_with_one_candidate_answers_as_a_pinned_one() -> None:
    """A placement of one card leaves nothing to choose: fit answers as for a serve
    pinned there, without a placement decision; with two candidates it says where and
    why (docs/placement.md)."""
    one = sm.DesiredState(
        {"a": sm.GpuRole("a", 10_000)},
        {"p": sm.ServeSpec("p", "c-p", ("a",), 1000, OND, placement=("a",))},
    )
    got = fit_serve(one, sm.Observed(True), "p", now=NOW)
    assert got.fits and got.placement is None
    assert "placement" not in got.to_json()
    two = sm.DesiredState(
        {r: sm.GpuRole(r, 10_000) for r in ("a", "b")},
        {"p": sm.ServeSpec("p", "c-p", ("a", "b"), 1000, OND, placement=("a", "b"))},
    )
    got = fit_serve(two, sm.Observed(True), "p", now=NOW)
    assert got.fits and got.placement is not None


def test_only_a_wake_is_asked_for_less_than_the_whole_reservation() -> None:
    """A sleeper's wake asks only for what it does not hold; a serve whose start is in
    progress, which holds its reservation too, is asked for at the whole of it."""
    llm = serve("llm", 8000, OND)
    desired, _ = _build(Case([llm], {}, []))
    starting = sm.Observed(True, starting={"llm": sm.StartingObs(("a",), 8000)})
    got = fit_serve(desired, starting, "llm", now=NOW)
    assert [(t.gpu_role, t.requested_mib) for t in got.terms] == [("a", 8000)]
    # asleep, it holds its residual: its wake asks for the rest
    sleepy = serve("llm", 8000, OND, sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM, 2000))
    desired, _ = _build(Case([sleepy], {}, []))
    asleep = sm.Observed(
        True, {"c-llm": up()}, sleep={"llm": sm.SleepObs(sm.SleepState.ASLEEP, level=1)}
    )
    got = fit_serve(desired, asleep, "llm", now=NOW)
    assert [(t.gpu_role, t.requested_mib) for t in got.terms] == [("a", 7000)]
