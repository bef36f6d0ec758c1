"""``fit_serve``'s shortcut (statemachine/answers/planner_shortcut.py) answers exactly as the
planner.

Over random hosts (tests/support/strategies.py, then sleepers, starts in progress, in-flight
counts, engines that size themselves from free memory, idle TTLs, memory not back,
records of what containers were started with, a host RAM budget): for every serve of
the host, ``fit_serve`` (the shortcut where it decides) equals ``fit_serve_by_planner``
(always the planner's plan for the isolated request), field by field and in its JSON;
and where :func:`statemachine.answers.planner_shortcut.decide` answers, its victims and drains are
the plan's stops and drains, in order, with nothing shrunk, slept or blocked. The
``find`` tests show the strategy reaches the shortcut (with victims, with drains, with
idle and busy victims) and each case it leaves to the planner.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, event, find, given, note, settings
from hypothesis import strategies as st
from support.strategies import NOW, Scenario, assert_reaches, crowded_hosts, hosts, report_cases

import statemachine.answers.fit as fit_module
from statemachine.answers.fit import FitResult, fit_serve, fit_serve_by_planner, request_plan
from statemachine.answers.planner_shortcut import Decision, decide, whole_terms
from statemachine.domain import types as sm
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import Action, Policy, RestoreCost

EXAMPLES = int(os.environ.get("VRAMCTL_PROPERTY_EXAMPLES", "300"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _direct_decisions(sc: Scenario) -> dict[str, object]:
    ledger = ledger_from_observed(sc.desired, sc.observed)
    return {
        name: decide(
            sc.desired,
            sc.observed,
            s,
            ledger,
            sc.policy,
            sc.now,
            whole_terms(sc.desired, ledger, s),
        )
        for name, s in sc.desired.serves.items()
        if not sc.observed.container(s.container).holds or sc.observed.sleep_of(name).asleep
    }


#: the hosts the fit properties draw: enriched hosts, and crowded ones (without them,
#: fewer than 3 % of the draws had a serve that fits by evicting, 1 % by shrinking)
FIT_HOSTS = hosts() | crowded_hosts()


@SETTINGS
@given(FIT_HOSTS)
def test_fit_serve_answers_as_the_planner_for_every_serve(sc: Scenario) -> None:
    note(repr(sc))
    report_cases(sc)
    for name in sc.desired.serves:
        got = fit_serve(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        ref = fit_serve_by_planner(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        for case in answer_cases(got):
            event(case)
        assert got == ref, name
        assert got.to_json() == ref.to_json(), name


@pytest.mark.parametrize("how", ["busy", "starting"])
def test_a_request_that_may_wait_for_room_freeing_by_itself_is_left_to_the_planner(
    how: str,
) -> None:
    """``busy`` (on-demand, a request in flight, or its start in progress) holds the
    room ``want`` lacks and frees it by itself; evicting ``evi`` (used lately, a 60 s
    cold start) is expected to cost more than ``want`` has waited (nothing yet), so the
    planner waits rather than evict
    (docs/eviction.md, "Waiting for room that frees by itself"): the shortcut, which
    would evict ``evi``, leaves the answer to the planner."""
    roles = {"g": sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
    serves = {
        "evi": sm.ServeSpec("evi", "c-evi", ("g",), 4_000, sm.Residency.EVICTABLE),
        "busy": sm.ServeSpec("busy", "c-busy", ("g",), 4_000, sm.Residency.ON_DEMAND),
        "want": sm.ServeSpec("want", "c-want", ("g",), 4_000, sm.Residency.ON_DEMAND),
    }
    desired = sm.DesiredState(roles, serves, (sm.OnDemandRequest("busy", NOW - 30),))
    up = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 900)
    observed = sm.Observed(
        True,
        {"c-evi": up, "c-busy": up},
        in_flight={"busy": sm.InFlightObs(1 if how == "busy" else 0, sm.InFlightSource.METRICS)},
        starting={"busy": sm.StartingObs(("g",), 4_000)} if how == "starting" else {},
    )
    policy = Policy(
        reload={n: RestoreCost(60.0, None) for n in serves},
        uses={"evi": (NOW - 300,), "busy": (NOW - 30,), "want": ()},
    )
    got = fit_serve(desired, observed, "want", policy=policy, now=NOW)
    assert got == fit_serve_by_planner(desired, observed, "want", policy=policy, now=NOW)
    assert not got.fits and not got.evict
    assert f"waits for room that frees by itself (busy, 4000 MiB on g, {how})" in got.reason
    want = serves["want"]

    def direct(seen: sm.Observed, known: Policy) -> object:
        ledger = ledger_from_observed(desired, seen)
        return decide(desired, seen, want, ledger, known, NOW, whole_terms(desired, ledger, want))

    # without the uses the planner evicts, and the shortcut answers so itself
    plain = fit_serve(desired, observed, "want", policy=Policy(), now=NOW)
    assert plain.fits and plain.evict == ("evi",)
    assert direct(observed, Policy()) == Decision(("evi",))
    # with the uses, and ``busy`` idle or its count unknown, no room comes by itself
    # (a busy evictable holder does not free its room by itself either): it answers
    for counts in ({"busy": 0}, {"busy": None}, {"busy": 0, "evi": 1}):
        seen = replace(
            observed,
            in_flight={n: sm.InFlightObs(c, sm.InFlightSource.METRICS) for n, c in counts.items()},
            starting={},
        )
        assert direct(seen, policy) == Decision(("evi",)), counts
        got = fit_serve(desired, seen, "want", policy=policy, now=NOW)
        assert got == fit_serve_by_planner(desired, seen, "want", policy=policy, now=NOW)


def answer_cases(got: FitResult) -> set[str]:
    """What a fit answer says, by name (the cases the fit properties report)."""
    checks = {
        "fit: fits as it is": got.fits and not (got.evict or got.shrink or got.sleep),
        "fit: fits by evicting": got.fits and bool(got.evict),
        "fit: fits by shrinking": got.fits and bool(got.shrink),
        "fit: fits by sleeping a victim": got.fits and bool(got.sleep),
        "fit: wakes": got.wake,
        "fit: does not fit": not got.fits,
    }
    return {name for name, hit in checks.items() if hit}


#: each answer's least share of 200 derandomized draws of FIT_HOSTS (about a
#: quarter of now: the draws shift with the modules loaded)
ANSWER_FLOORS = {
    "fit: fits as it is": 0.225,
    "fit: fits by evicting": 0.05,
    "fit: fits by shrinking": 0.035,
    "fit: fits by sleeping a victim": 0.075,
    "fit: wakes": 0.05,
    "fit: does not fit": 0.04,
}


def test_the_fit_properties_reach_every_answer() -> None:
    """The share of draws with at least one serve answered each way: none vacuous."""

    def cases(sc: Scenario) -> set[str]:
        out: set[str] = set()
        for name in sc.desired.serves:
            got = fit_serve(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
            out |= answer_cases(got)
        return out

    assert_reaches(FIT_HOSTS, cases, ANSWER_FLOORS, examples=200)


@SETTINGS
@given(FIT_HOSTS)
def test_a_direct_decision_is_the_plan_for_the_isolated_request(sc: Scenario) -> None:
    note(repr(sc))
    for name, direct in _direct_decisions(sc).items():
        if direct is None:
            continue
        plan = request_plan(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        assert not [b for b in plan.blocked if b.serve == name], name
        actions = {s.action for s in plan.steps}
        assert not actions & {Action.SHRINK, Action.SLEEP, Action.WAKE}, name
        assert direct.evict == tuple(s.serve for s in plan.steps if s.action is Action.STOP)
        assert direct.drain == tuple(s.serve for s in plan.steps if s.action is Action.DRAIN)


def _reaches(condition: Callable[[Scenario, str], bool]) -> None:
    """Some host drawn by :func:`hosts` has a serve meeting ``condition``."""

    def any_serve(sc: Scenario) -> bool:
        return any(condition(sc, name) for name in sc.desired.serves)

    # generation only: the first host found is enough (shrinking it would take minutes)
    quick = settings(max_examples=5_000, database=None, deadline=None, phases=[Phase.generate])
    find(hosts(), any_serve, settings=quick)


def _fit(sc: Scenario, name: str) -> fit_module.FitResult:
    return fit_serve_by_planner(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)


def _decided(sc: Scenario, name: str) -> bool:
    return name in (d := _direct_decisions(sc)) and d[name] is not None


def _left(sc: Scenario, name: str) -> bool:
    return name in (d := _direct_decisions(sc)) and d[name] is None


@pytest.mark.parametrize("case", ["fits", "evicts", "drains", "idle victim", "busy victim"])
def test_the_hosts_reach_the_shortcut(case: str) -> None:
    def hit(sc: Scenario, name: str) -> bool:
        if not _decided(sc, name):
            return False
        f = _fit(sc, name)
        counts = [sc.observed.requests_in_flight(v).count for v in f.evict]
        return {
            "fits": f.fits and not f.evict,
            "evicts": bool(f.evict),
            "drains": bool(f.drain),
            "idle victim": 0 in counts,
            "busy victim": any(c != 0 for c in counts),
        }[case]

    _reaches(hit)


@pytest.mark.parametrize(
    "case",
    ["shrink", "sleep", "blocked", "wake", "conflict", "min_runtime", "starting", "resident"],
)
def test_the_hosts_reach_each_case_left_to_the_planner(case: str) -> None:
    def hit(sc: Scenario, name: str) -> bool:
        if not _left(sc, name):
            return False
        f = _fit(sc, name)
        spec = sc.desired.serves[name]
        holders = [
            o
            for o in sc.desired.serves.values()
            if o.name != name and sc.observed.container(o.container).holds
        ]
        return {
            "shrink": bool(f.shrink),
            "sleep": bool(f.sleep),
            "blocked": not f.fits and spec.residency is sm.Residency.ON_DEMAND,
            "wake": f.wake,
            "conflict": "cannot start" in f.reason,
            "min_runtime": any("min_runtime_s" in p.why for p in f.protected),
            "starting": name in sc.observed.starting,
            "resident": spec.residency is sm.Residency.RESIDENT and bool(holders),
        }[case]

    _reaches(hit)


def test_the_common_case_does_not_run_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    roles = {"g": sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
    serves = {
        "evi": sm.ServeSpec("evi", "c-evi", ("g",), 6_000, sm.Residency.EVICTABLE, router_tier="t"),
        "want": sm.ServeSpec("want", "c-want", ("g",), 6_000, sm.Residency.ON_DEMAND),
    }
    desired = sm.DesiredState(roles, serves)
    observed = sm.Observed(
        True, {"c-evi": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 900)}
    )
    ref = fit_serve_by_planner(desired, observed, "want", now=NOW)

    def no_planner(*_args: object, **_kw: object) -> None:
        raise AssertionError("the planner ran")

    monkeypatch.setattr(fit_module, "plan_transitions", no_planner)
    got = fit_serve(desired, observed, "want", now=NOW)
    assert got == ref
    assert got.evict == ("evi",) and got.drain == ("evi",)
    assert got.reason == "want fits after stopping evi"
    with pytest.raises(AssertionError, match="the planner ran"):
        fit_serve_by_planner(desired, observed, "want", now=NOW)


def test_a_default_policy_and_an_explicit_one_answer_alike() -> None:
    roles = {"g": sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
    serves = {
        "a": sm.ServeSpec("a", "c-a", ("g",), 3_000, sm.Residency.EVICTABLE),
        "b": sm.ServeSpec("b", "c-b", ("g",), 3_000, sm.Residency.EVICTABLE),
        "want": sm.ServeSpec("want", "c-want", ("g",), 7_000, sm.Residency.ON_DEMAND),
    }
    running = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 900)
    observed = sm.Observed(True, {"c-a": running, "c-b": running})
    desired = sm.DesiredState(roles, serves)
    default = fit_serve(desired, observed, "want", now=NOW)
    assert default.evict == ("a",)
    # with an exact search of 0 candidates the greedy chooses: the same victim here
    assert fit_serve(desired, observed, "want", policy=Policy(exact_search_limit=0), now=NOW) == (
        fit_serve_by_planner(
            desired, observed, "want", policy=Policy(exact_search_limit=0), now=NOW
        )
    )
    held = Policy(hold={"want": "backoff"})
    assert not fit_serve(desired, observed, "want", policy=held, now=NOW).fits


# ----- hosts with start records ----------------------------------------------------------
@st.composite
def recorded_hosts(draw: st.DrawFn) -> Scenario:
    """A host of :func:`hosts` whose start records are mostly what the controller writes
    (the serve's declared reservation, or less of it: an edit that grew the serve)."""
    sc = draw(hosts())
    d, obs = sc.desired, sc.observed
    records = dict(obs.started_with)
    for s in d.serves.values():
        if not obs.container(s.container).holds or s.vram_mib is None or not s.gpu_roles:
            continue
        if draw(st.integers(0, 2)) > 0:
            mib = draw(st.sampled_from([s.vram_mib, max(1, s.vram_mib // 2), s.vram_mib + 1]))
            on = draw(st.sampled_from([s.gpu_roles, s.gpu_roles[:1], ("elsewhere",)]))
            records[s.container] = sm.StartedWith(s.name, on, mib)
    return replace(sc, observed=replace(obs, started_with=records))


@SETTINGS
@given(recorded_hosts())
def test_fit_serve_answers_as_the_planner_with_start_records(sc: Scenario) -> None:
    note(repr(sc))
    for name in sc.desired.serves:
        got = fit_serve(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        ref = fit_serve_by_planner(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        assert got == ref, name


ROLES = {"g": sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
EVI_SERVE = sm.ServeSpec("evi", "c-evi", ("g",), 4_000, sm.Residency.EVICTABLE)
RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 900)


def test_more_candidates_than_the_exact_bound_go_to_the_greedy() -> None:
    serves = {
        f"e{i}": sm.ServeSpec(f"e{i}", f"c-e{i}", ("g",), 1_000, sm.Residency.EVICTABLE)
        for i in range(4)
    }
    serves["e0"] = replace(serves["e0"], vram_mib=700)
    serves["want"] = sm.ServeSpec("want", "c-want", ("g",), 8_800, sm.Residency.ON_DEMAND)
    desired = sm.DesiredState({"g": sm.GpuRole("g", capacity_mib=11_000, reserve_mib=0)}, serves)
    observed = sm.Observed(True, {f"c-e{i}": RUNNING for i in range(4)})
    for limit in (0, 3, 4):
        policy = Policy(exact_search_limit=limit)
        got = fit_serve(desired, observed, "want", policy=policy, now=NOW)
        assert got == fit_serve_by_planner(desired, observed, "want", policy=policy, now=NOW)
        assert got.fits and len(got.evict) == 2


def test_a_placed_requester_not_yet_on_a_card_is_left_to_the_planner() -> None:
    """The shortcut decides for one card's terms: a placed requester not yet placed has
    the terms of every candidate card, so it defers (fit places it first, as the loop
    would, and asks again of the card chosen), never naming victims on every card."""
    # g0 and g1 (1000 each) are full: alpha on g0, bravo on g1, both evictable. charlie
    # (1 MiB, placed on g0 or g1) is requested: the plan stops alpha alone
    roles = {r: sm.GpuRole(r, 1000) for r in ("g0", "g1")}
    serves = {
        "alpha": sm.ServeSpec("alpha", "c-alpha", ("g0",), 1000, sm.Residency.EVICTABLE),
        "bravo": sm.ServeSpec("bravo", "c-bravo", ("g1",), 1000, sm.Residency.EVICTABLE),
        "charlie": sm.ServeSpec(
            "charlie",
            "c-charlie",
            ("g0", "g1"),
            1,
            sm.Residency.ON_DEMAND,
            placement=("g0", "g1"),
        ),
    }
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 3600)
    desired = sm.DesiredState(roles, serves, (sm.OnDemandRequest("charlie", NOW - 1),))
    observed = sm.Observed(True, {"c-alpha": up, "c-bravo": up})
    sc = Scenario(desired, observed, NOW, Policy())
    plan = request_plan(desired, observed, "charlie", policy=sc.policy, now=NOW)
    stops = tuple(s.serve for s in plan.steps if s.action is Action.STOP)
    assert stops == ("alpha",)
    assert _direct_decisions(sc)["charlie"] is None
    answer = fit_serve(desired, observed, "charlie", policy=sc.policy, now=NOW)
    assert answer.fits and answer.evict == stops
