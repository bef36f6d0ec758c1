"""What bringing a serve back costs (statemachine/planning/restore_cost.py), and how status shows
it.

Per kind (cold start, wake): the median of the last five measurements, else the
declared figure, else unknown (``None``, never 0); ``basis`` says which. ``last_used``
is the later of when a serve was last seen busy and its latest request. Pure: imports
statemachine only.
"""

from __future__ import annotations

import statistics

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from statemachine.answers.status_report import host_status
from statemachine.domain import types as sm
from statemachine.planning.plan_types import Policy, RestoreCost
from statemachine.planning.restore_cost import (
    RECENT,
    UNKNOWN,
    Basis,
    Measured,
    RestoreEstimate,
    declared_costs,
    last_used,
    measured_from,
    recent_median,
    restore_costs,
    restore_estimate,
    restore_estimates,
)

seconds = st.floats(min_value=0.01, max_value=86_400.0, allow_nan=False, allow_infinity=False)
samples = st.lists(seconds, max_size=25).map(tuple)
maybe = st.none() | seconds


# ── the median of the recent measurements ──────────────────────────────────────


def test_the_median_is_of_the_last_five_only() -> None:
    # the two oldest (1000 s: a cold cache, long ago) no longer count
    assert recent_median([1000.0, 1000.0, 40.0, 42.0, 41.0, 60.0, 39.0]) == 41.0
    assert recent_median([10.0, 20.0]) == 15.0  # an even count: the middle two's mean
    assert recent_median([7.5]) == 7.5
    assert recent_median([]) is None
    assert RECENT == 5


def test_the_window_must_hold_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        recent_median([1.0], recent=0)


@given(samples)
def test_the_median_lies_within_the_recent_measurements(values: tuple[float, ...]) -> None:
    got = recent_median(values)
    event("no sample" if not values else f"more samples than kept: {len(values) > RECENT}")
    if not values:
        assert got is None
        return
    tail = values[-RECENT:]
    assert got is not None and min(tail) <= got <= max(tail)
    assert got == pytest.approx(statistics.median(tail))
    assert got > 0  # measured seconds are never read as 0


# ── measured, else declared, else unknown ──────────────────────────────────────


def test_measured_wins_per_kind_and_the_declared_figure_fills_the_other() -> None:
    got = restore_estimate(RestoreCost(47.0, 2.9), Measured(cold_s=(30.0, 34.0, 32.0)))
    assert got == RestoreEstimate(RestoreCost(32.0, 2.9), Basis.MEASURED)


def test_declared_only() -> None:
    got = restore_estimate(RestoreCost(47.0, None), None)
    assert got == RestoreEstimate(RestoreCost(47.0, None), Basis.DECLARED)


def test_neither_is_unknown_never_zero() -> None:
    assert restore_estimate(None, None) == UNKNOWN
    assert restore_estimate(RestoreCost(), Measured()) == UNKNOWN
    assert UNKNOWN.to_json() == {"cold_s": None, "wake_s": None, "basis": "unknown"}


@given(maybe, maybe, samples, samples)
def test_each_figure_comes_from_its_own_source(
    cold_decl: float | None,
    wake_decl: float | None,
    cold: tuple[float, ...],
    wake: tuple[float, ...],
) -> None:
    got = restore_estimate(RestoreCost(cold_decl, wake_decl), Measured(cold, wake))
    assert got.cost.cold_s == (recent_median(cold) if cold else cold_decl)
    assert got.cost.wake_s == (recent_median(wake) if wake else wake_decl)
    event(f"basis: {got.basis.value}")
    if cold or wake:
        assert got.basis is Basis.MEASURED
    elif cold_decl is not None or wake_decl is not None:
        assert got.basis is Basis.DECLARED
    else:
        assert got == UNKNOWN
    assert got.cost.cold_s != 0 and got.cost.wake_s != 0


@given(
    st.dictionaries(st.sampled_from("abcde"), st.builds(RestoreCost, maybe, maybe)),
    st.dictionaries(st.sampled_from("cdefg"), st.builds(Measured, samples, samples)),
)
def test_the_policy_gets_a_cost_for_exactly_the_serves_with_a_figure(
    declared: dict[str, RestoreCost], measured: dict[str, Measured]
) -> None:
    costs = restore_costs(declared, measured)
    estimates = restore_estimates(declared, measured)
    assert set(estimates) == set(declared) | set(measured)
    assert set(costs) == {n for n, e in estimates.items() if e.basis is not Basis.UNKNOWN}
    for name, cost in costs.items():
        assert cost == estimates[name].cost
        assert cost.cold_s is not None or cost.wake_s is not None
    # and the policy carries them through its journalled form
    policy = Policy(reload=costs)
    assert Policy.from_json(policy.to_json()).reload == costs


def test_the_journals_rows_become_measurements_per_serve() -> None:
    got = measured_from({"a": {"cold": [40.0, 41.0], "wake": [2.0]}, "b": {"wake": [3.0]}})
    assert got == {"a": Measured((40.0, 41.0), (2.0,)), "b": Measured((), (3.0,))}


def test_declared_costs_read_the_spec_and_its_sleep() -> None:
    desired = sm.DesiredState(
        {},
        {
            "llm": sm.ServeSpec("llm", "c-llm", cold_start_s=47.0),
            "coder": sm.ServeSpec(
                "coder", "c-coder", sleep=sm.Sleep(1, 1000, "vllm", 4000, wake_s=2.9)
            ),
            "plain": sm.ServeSpec("plain", "c-plain", sleep=sm.Sleep(2, 1000, "vllm")),
        },
    )
    assert declared_costs(desired) == {
        "llm": RestoreCost(47.0, None),
        "coder": RestoreCost(None, 2.9),
    }


# ── when each serve was last used ──────────────────────────────────────────────


def test_last_used_is_the_later_of_busy_and_the_latest_request() -> None:
    requests = [
        sm.OnDemandRequest("od", 900.0),
        sm.OnDemandRequest("od", 1_200.0, ttl_s=60.0),
        sm.OnDemandRequest("new", 1_500.0),
    ]
    busy = {"od": 1_100.0, "chat": 1_000.0}
    assert last_used(busy, requests) == {"od": 1_200.0, "chat": 1_000.0, "new": 1_500.0}
    assert last_used({"od": 2_000.0}, requests)["od"] == 2_000.0
    assert last_used({}, []) == {}


# ── status shows it ─────────────────────────────────────────────────────────────


def _fleet() -> sm.DesiredState:
    return sm.DesiredState(
        {"g": sm.GpuRole("g", 24_000)},
        {
            n: sm.ServeSpec(n, f"c-{n}", ("g",), 4_000, sm.Residency.EVICTABLE, cold_start_s=cold)
            for n, cold in (("measured", 60.0), ("declared", 47.0), ("unknown", None))
        },
    )


def test_status_shows_each_serves_reload_cost_and_its_basis() -> None:
    desired = _fleet()
    observed = sm.Observed(True, {"c-measured": sm.ContainerObs(sm.ContainerState.RUNNING)})
    estimates = restore_estimates(declared_costs(desired), {"measured": Measured((12.0,))})
    rows = {
        r["serve"]: r["reload"]
        for r in host_status(desired, observed, reload=estimates).to_json()["serves"]
    }
    assert rows == {
        "measured": {"cold_s": 12.0, "wake_s": None, "basis": "measured"},
        "declared": {"cold_s": 47.0, "wake_s": None, "basis": "declared"},
        "unknown": {"cold_s": None, "wake_s": None, "basis": "unknown"},
    }


def test_status_without_measurements_shows_the_declared_figures() -> None:
    rows = {
        r["serve"]: r["reload"]
        for r in host_status(_fleet(), sm.Observed(False)).to_json()["serves"]
    }
    assert rows["measured"] == {"cold_s": 60.0, "wake_s": None, "basis": "declared"}
    assert rows["unknown"]["basis"] == "unknown"


def test_a_window_of_one_is_the_newest_measurement() -> None:
    assert recent_median([30.0, 20.0, 10.0], recent=1) == 10.0
    assert recent_median([30.0, 20.0, 10.0], recent=2) == 15.0
