"""``fit_serve``'s shortcut (statemachine/isolated.py) answers exactly as the planner.

Over random hosts (tests/strategies.py, then sleepers, starts in progress, in-flight
counts, engines that size themselves from free memory, idle TTLs, memory not back,
records of what containers were started with, a host RAM budget): for every serve of
the host, ``fit_serve`` (the shortcut where it decides) equals ``fit_serve_by_planner``
(always the planner's plan for the isolated request), field by field and in its JSON;
and where :func:`statemachine.isolated.decide` answers, its victims and drains are the
plan's stops and drains, in order, with nothing shrunk, slept or blocked. The
``find`` tests show the strategy reaches the shortcut (with victims, with drains, with
idle and busy victims) and each case it leaves to the planner.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, find, given, note, settings
from hypothesis import strategies as st
from strategies import NOW, Scenario, hosts

import statemachine.fit as fit_module
from statemachine.fit import fit_serve, fit_serve_by_planner, request_plan
from statemachine.isolated import Reading, decide, plain_reading
from statemachine.ledger import Ledger, ledger_from_observed
from statemachine.plan import Action, Policy
from statemachine.types import (
    ContainerObs,
    ContainerState,
    DesiredState,
    GpuRole,
    Observed,
    Residency,
    ServeSpec,
    SleepObs,
    SleepState,
    StartedWith,
    StartingObs,
)

EXAMPLES = int(os.environ.get("VRAMCTL_PROPERTY_EXAMPLES", "300"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _direct_decisions(sc: Scenario) -> dict[str, object]:
    ledger = ledger_from_observed(sc.desired, sc.observed)
    return {
        name: decide(sc.desired, sc.observed, s, ledger, sc.policy, sc.now)
        for name, s in sc.desired.serves.items()
        if not sc.observed.container(s.container).holds or sc.observed.sleep_of(name).asleep
    }


@SETTINGS
@given(hosts())
def test_fit_serve_answers_as_the_planner_for_every_serve(sc: Scenario) -> None:
    note(repr(sc))
    for name in sc.desired.serves:
        got = fit_serve(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        ref = fit_serve_by_planner(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        assert got == ref, name
        assert got.to_json() == ref.to_json(), name


@SETTINGS
@given(hosts())
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
            "blocked": not f.fits and spec.residency is Residency.ON_DEMAND,
            "wake": f.wake,
            "conflict": "cannot start" in f.reason,
            "min_runtime": any("min_runtime_s" in p.why for p in f.protected),
            "starting": name in sc.observed.starting,
            "resident": spec.residency is Residency.RESIDENT and bool(holders),
        }[case]

    _reaches(hit)


def test_the_common_case_does_not_run_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    roles = {"g": GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
    serves = {
        "evi": ServeSpec("evi", "c-evi", ("g",), 6_000, Residency.EVICTABLE, router_tier="t"),
        "want": ServeSpec("want", "c-want", ("g",), 6_000, Residency.ON_DEMAND),
    }
    desired = DesiredState(roles, serves)
    observed = Observed(True, {"c-evi": ContainerObs(ContainerState.RUNNING, started_at=NOW - 900)})
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
    roles = {"g": GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
    serves = {
        "a": ServeSpec("a", "c-a", ("g",), 3_000, Residency.EVICTABLE),
        "b": ServeSpec("b", "c-b", ("g",), 3_000, Residency.EVICTABLE),
        "want": ServeSpec("want", "c-want", ("g",), 7_000, Residency.ON_DEMAND),
    }
    running = ContainerObs(ContainerState.RUNNING, started_at=NOW - 900)
    observed = Observed(True, {"c-a": running, "c-b": running})
    desired = DesiredState(roles, serves)
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


# ----- the plain reading: what the ledger counts, without building it ----------------------
@st.composite
def recorded_hosts(draw: st.DrawFn) -> Scenario:
    """A host of :func:`hosts` whose start records are mostly what the controller writes
    (the serve's declared reservation, or less of it: an edit that grew the serve), so
    the plain reading answers with records too."""
    sc = draw(hosts())
    d, obs = sc.desired, sc.observed
    records = dict(obs.started_with)
    for s in d.serves.values():
        if not obs.container(s.container).holds or s.vram_mib is None or not s.gpu_roles:
            continue
        if draw(st.integers(0, 2)) > 0:
            mib = draw(st.sampled_from([s.vram_mib, max(1, s.vram_mib // 2), s.vram_mib + 1]))
            on = draw(st.sampled_from([s.gpu_roles, s.gpu_roles[:1], ("elsewhere",)]))
            records[s.container] = StartedWith(s.name, on, mib)
    return replace(sc, observed=replace(obs, started_with=records))


def _same_counts(reading: Reading, ledger: Ledger, sc: Scenario) -> None:
    assert not ledger.unknown and not reading.unknown
    assert reading.held == {h: (r.gpu_roles, r.mib) for h, r in ledger.holdings.items()}
    assert reading.holdings == dict(ledger.holdings.items())
    assert reading.free == {r: ledger.free_mib(r) for r in ledger.roles}
    for role in ledger.roles:
        for mib in (0, 1, 40_000):
            assert reading.terms("x", (role,), mib) == ledger.terms("x", (role,), mib), role
    assert reading.terms("x", tuple(ledger.roles), 7) == ledger.terms("x", tuple(ledger.roles), 7)
    for name in sc.desired.serves:
        assert reading.holds(name) == ledger.holds(name)


@SETTINGS
@given(hosts() | recorded_hosts())
def test_a_plain_reading_counts_what_the_ledger_counts(sc: Scenario) -> None:
    note(repr(sc))
    reading = plain_reading(sc.desired, sc.observed)
    ledger = ledger_from_observed(sc.desired, sc.observed)
    if ledger.unknown:
        assert reading is None
    if reading is None:
        return
    _same_counts(reading, ledger, sc)
    _same_counts(Reading.of(ledger), ledger, sc)
    holding = [
        (s, sc.observed.container(s.container))
        for s in sc.desired.serves.values()
        if sc.observed.container(s.container).holds
    ]
    assert list(reading.running or ()) == holding


@pytest.mark.parametrize("case", ["record", "shrunk", "unreleased", "ledger"])
def test_the_hosts_reach_a_plain_reading(case: str) -> None:
    def hit(sc: Scenario, name: str) -> bool:
        reading = plain_reading(sc.desired, sc.observed)
        if reading is None:
            return False
        s = sc.desired.serves[name]
        return {
            "record": s.container in sc.observed.started_with,
            "shrunk": name in sc.observed.elastic_mib and reading.holds(name),
            "unreleased": name in sc.observed.unreleased and reading.holds(name),
            "ledger": _left(sc, name),  # and a case left to the planner with it
        }[case]

    def any_serve(sc: Scenario) -> bool:
        return any(hit(sc, name) for name in sc.desired.serves)

    quick = settings(max_examples=5_000, database=None, deadline=None, phases=[Phase.generate])
    find(recorded_hosts(), any_serve, settings=quick)


ROLES = {"g": GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
EVI_SERVE = ServeSpec("evi", "c-evi", ("g",), 4_000, Residency.EVICTABLE)
RUNNING = ContainerObs(ContainerState.RUNNING, started_at=NOW - 900)


def _plain(observed: Observed, serves: dict[str, ServeSpec] | None = None) -> Reading | None:
    desired = DesiredState(ROLES, serves or {"evi": EVI_SERVE})
    reading = plain_reading(desired, observed)
    if reading is not None:  # where it answers, the ledger's figures
        _same_counts(
            reading,
            ledger_from_observed(desired, observed),
            Scenario(desired, observed, NOW, Policy()),
        )
    return reading


def test_a_plain_reading_counts_a_start_record_within_the_declared_reservation() -> None:
    for mib in (4_000, 3_000):
        observed = Observed(
            True, {"c-evi": RUNNING}, started_with={"c-evi": StartedWith("evi", ("g",), mib)}
        )
        reading = _plain(observed)
        assert reading is not None and reading.held == {"evi": (("g",), 4_000)}
        assert reading.free == {"g": 6_000}


@pytest.mark.parametrize(
    "observed",
    [
        pytest.param(Observed(False), id="docker-unreadable"),
        pytest.param(
            Observed(True, {"c-evi": RUNNING}, starting={"want": StartingObs(("g",), 1)}),
            id="a-start-in-progress",
        ),
        pytest.param(
            Observed(True, {"c-evi": RUNNING}, sleep={"evi": SleepObs(SleepState.ASLEEP, 1)}),
            id="a-sleeper",
        ),
        pytest.param(
            Observed(True, {"c-evi": RUNNING}, sleep={"evi": SleepObs(SleepState.UNKNOWN)}),
            id="a-sleep-state-unknown",
        ),
        pytest.param(
            Observed(
                True, {"c-evi": RUNNING}, started_with={"c-evi": StartedWith("evi", ("g",), 5_000)}
            ),
            id="started-with-more",
        ),
        pytest.param(
            Observed(
                True, {"c-evi": RUNNING}, started_with={"c-evi": StartedWith("evi", ("h",), 4_000)}
            ),
            id="started-on-another-role",
        ),
        pytest.param(
            Observed(
                True,
                {"c-evi": RUNNING, "c-old": RUNNING},
                started_with={"c-old": StartedWith("old", ("g",), 2_000)},
            ),
            id="a-container-no-longer-declared",
        ),
        pytest.param(
            Observed(
                True,
                {"c-evi": ContainerObs(ContainerState.EXITED)},
                started_with={"c-evi": StartedWith("evi", ("g",), 4_000)},
            ),
            id="a-record-of-a-stopped-container",
        ),
    ],
)
def test_a_plain_reading_leaves_every_other_rule_to_the_ledger(observed: Observed) -> None:
    assert _plain(observed) is None


def test_a_plain_reading_leaves_a_record_of_a_serve_outside_the_ledger_to_the_ledger() -> None:
    proxy = ServeSpec("proxy", "c-proxy", (), None, None, gpu_inference=False)
    observed = Observed(
        True, {"c-proxy": RUNNING}, started_with={"c-proxy": StartedWith("proxy", ("g",), 1_000)}
    )
    assert _plain(observed, {"proxy": proxy}) is None
    assert ledger_from_observed(DesiredState(ROLES, {"proxy": proxy}), observed).holds("proxy")


def test_a_plain_reading_leaves_a_container_two_serves_declare_to_the_ledger() -> None:
    """Two serves on one container (the manifest refuses it; a desired state built
    otherwise need not): the record one of them matches would hide what the other's
    counts, so the ledger's rules decide."""
    one = ServeSpec("one", "c-shared", ("g",), 3_000, Residency.EVICTABLE)
    other = ServeSpec("other", "c-shared", ("g",), None, Residency.EVICTABLE)
    observed = Observed(
        True, {"c-shared": RUNNING}, started_with={"c-shared": StartedWith("one", ("g",), 1_000)}
    )
    assert _plain(observed, {"one": one, "other": other}) is None


def test_a_plain_reading_counts_what_a_shrunk_or_unreleased_serve_holds() -> None:
    gone = ServeSpec("gone", "c-gone", ("g",), 2_000, Residency.EVICTABLE)
    observed = Observed(
        True, {"c-evi": RUNNING}, elastic_mib={"evi": 1_500}, unreleased=frozenset({"gone"})
    )
    reading = _plain(observed, {"evi": EVI_SERVE, "gone": gone})
    assert reading is not None
    assert reading.held == {"evi": (("g",), 1_500), "gone": (("g",), 2_000)}
    assert reading.running == [(EVI_SERVE, RUNNING)]


def test_the_common_case_builds_no_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    serves = {
        "evi": replace(EVI_SERVE, vram_mib=6_000, router_tier="t"),
        "want": ServeSpec("want", "c-want", ("g",), 6_000, Residency.ON_DEMAND),
    }
    desired = DesiredState(ROLES, serves)
    # the controller's own record of the start: what the serve declares
    observed = Observed(
        True, {"c-evi": RUNNING}, started_with={"c-evi": StartedWith("evi", ("g",), 6_000)}
    )
    ref = fit_serve_by_planner(desired, observed, "want", now=NOW)

    def no_ledger(*_args: object, **_kw: object) -> None:
        raise AssertionError("the ledger was built")

    monkeypatch.setattr(fit_module, "ledger_from_observed", no_ledger)
    assert fit_serve(desired, observed, "want", now=NOW) == ref
    assert ref.evict == ("evi",)
    with pytest.raises(AssertionError, match="the ledger was built"):
        fit_serve(
            desired, replace(observed, starting={"x": StartingObs(("g",), 1)}), "want", now=NOW
        )


def test_more_candidates_than_the_exact_bound_go_to_the_greedy() -> None:
    serves = {
        f"e{i}": ServeSpec(f"e{i}", f"c-e{i}", ("g",), 1_000, Residency.EVICTABLE) for i in range(4)
    }
    serves["e0"] = replace(serves["e0"], vram_mib=700)
    serves["want"] = ServeSpec("want", "c-want", ("g",), 8_800, Residency.ON_DEMAND)
    desired = DesiredState({"g": GpuRole("g", capacity_mib=11_000, reserve_mib=0)}, serves)
    observed = Observed(True, {f"c-e{i}": RUNNING for i in range(4)})
    for limit in (0, 3, 4):
        policy = Policy(exact_search_limit=limit)
        got = fit_serve(desired, observed, "want", policy=policy, now=NOW)
        assert got == fit_serve_by_planner(desired, observed, "want", policy=policy, now=NOW)
        assert got.fits and len(got.evict) == 2
