"""How often each serve is used, and what the planner does with it (docs/eviction.md,
"Reload costs by use").

Written from the rules: where the loop counts each serve's uses (``Policy.uses``) a
victim costs its reload times its reuse rate; victim sets are compared by that cost
before their number; a victim whose sleep the host RAM cannot take displaces the
sleepers worth less asleep per MiB; a requester whose room would cost more than it has
waited waits for room that frees by itself (never past that cost); requests go by
response ratio. Without uses every rule is the one before. Each plan is replayed
through the ledger (never over budget, GPU roles nor host RAM). Pure: statemachine only.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.core import spec

from statemachine.domain import types as sm
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import Action, Plan, Policy, RestoreCost
from statemachine.planning.planner import plan_transitions
from statemachine.planning.reuse import (
    MAX_USES,
    expected_restore_s,
    known_uses,
    reuse_rate,
    sleep_worth,
)
from statemachine.planning.simulate import ledger_prefixes

NOW = 100_000.0
EVI, OND, RES = sm.Residency.EVICTABLE, sm.Residency.ON_DEMAND, sm.Residency.RESIDENT
ROLES = {"a": sm.GpuRole("a", 32_000, 2_000)}  # budget 30000
HOST = sm.HostBudget(64_000, 4_000)  # budget 60000
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
ASLEEP = sm.SleepObs(sm.SleepState.ASLEEP, level=1)


def sv(
    name: str, mib: int, residency: sm.Residency, *, host: int | None = None, **kw: object
) -> sm.ServeSpec:
    sleep = None if host is None else sm.Sleep(1, 1000, "vllm", host)
    return spec(name, mib, residency, roles=kw.pop("gpu_roles", ("a",)), sleep=sleep, **kw)  # type: ignore[arg-type]


def often(times: int, last: float = NOW) -> tuple[float, ...]:
    """``times`` uses, a minute apart, the last at ``last``."""
    return tuple(last - 60.0 * i for i in reversed(range(times)))


def run(
    serves: list[sm.ServeSpec],
    running: list[str],
    requests: dict[str, float],
    policy: Policy,
    *,
    now: float = NOW,
    roles: dict[str, sm.GpuRole] = ROLES,
    **observed: object,
) -> Plan:
    desired = sm.DesiredState(
        roles,
        {s.name: s for s in serves},
        tuple(sm.OnDemandRequest(n, at) for n, at in requests.items()),
        host=HOST,
    )
    obs = sm.Observed(True, {f"c-{n}": UP for n in running}, **observed)  # type: ignore[arg-type]
    result = plan_transitions(desired, obs, policy, now)
    for _step, out in ledger_prefixes(result):
        assert isinstance(out, Ledger), out
        assert not out.overcommitted() and not out.host_overcommitted()
    return result


def lines(result: Plan) -> list[str]:
    return [f"{s.action} {s.serve}" for s in result.steps]


# ── the figures ────────────────────────────────────────────────────────────────────


def test_reuse_rate_counts_each_use_by_its_age() -> None:
    assert reuse_rate([], NOW) == 0.0
    assert reuse_rate([NOW], NOW) == 1.0
    assert reuse_rate([NOW - 3600.0], NOW) == pytest.approx(math.exp(-1))
    assert reuse_rate([NOW, NOW - 3600.0], NOW) == pytest.approx(1 + math.exp(-1))
    assert reuse_rate([NOW + 30.0], NOW) == 1.0  # a use stamped ahead counts as now


def test_what_sleep_saves_and_what_a_reload_is_expected_to_cost() -> None:
    assert sleep_worth(2.0, 60.0, 2.0) == 116.0
    assert sleep_worth(2.0, 1.0, 2.0) == 0.0  # a wake slower than the start saves nothing
    assert sleep_worth(2.0, None, 2.0) is None and sleep_worth(2.0, 60.0, None) is None
    assert expected_restore_s(0.0, 60.0) == 0.0
    assert expected_restore_s(1.0, 60.0) == pytest.approx(60.0 * (1 - math.exp(-1)))
    assert expected_restore_s(500.0, 60.0) == pytest.approx(60.0)


@given(
    st.lists(st.floats(0, NOW), max_size=80),
    st.lists(st.floats(0, NOW), max_size=80),
)
def test_known_uses_merge_what_was_seen_and_requested_the_last_kept(
    seen: list[float], asked: list[float]
) -> None:
    out = known_uses(["a", "b"], {"a": seen, "gone": [1.0]}, [("a", t) for t in asked])
    assert set(out) == {"a", "b"} and out["b"] == ()
    every = sorted(set(seen) | set(asked))
    assert out["a"] == tuple(every[-MAX_USES:])


def test_the_last_64_uses_are_kept() -> None:
    """docs/eviction.md: the last 64 of each serve."""
    kept = known_uses(["a"], {"a": [float(t) for t in range(70)]}, [])["a"]
    assert kept == tuple(float(t) for t in range(6, 70))


def test_policy_uses_survive_the_journal_and_malformed_ones_are_refused() -> None:
    policy = Policy(uses={"a": (1.0, 2.5), "b": ()})
    assert Policy.from_json(policy.to_json()) == policy
    assert "uses" not in Policy().to_json()
    with pytest.raises(ValueError, match="policy: uses: expected serves with lists of times"):
        Policy.from_json({"uses": {"a": [1.0, -2.0]}})
    with pytest.raises(ValueError, match="policy: uses"):
        Policy.from_json({"uses": {"a": 3}})


def test_a_victim_costs_its_reload_times_its_rate_where_uses_are_counted() -> None:
    cost = {"a": RestoreCost(60.0, 2.0)}
    counted = Policy(reload=cost, uses={"a": (NOW, NOW)})
    assert counted.victim_cost("a", None, NOW, wake=False) == 120.0
    assert counted.victim_cost("a", None, NOW, wake=True) == 4.0
    assert Policy(reload=cost, uses={"a": ()}).victim_cost("a", None, NOW, wake=False) == 0.0
    # not counted: recency, as before (used just now: the whole cold start)
    assert Policy(reload=cost).victim_cost("a", NOW, NOW, wake=False) == 60.0
    assert counted.expected_restore_s("a", NOW, wake=False) == pytest.approx(
        expected_restore_s(2.0, 60.0)
    )
    assert Policy(reload=cost).expected_restore_s("a", NOW, wake=False) is None


# ── which sleepers keep the host RAM ───────────────────────────────────────────────

COSTS = {n: RestoreCost(60.0, 2.0) for n in ("old", "coder", "llm")}
STT = sv("stt", 10_000, RES, desired=sm.DesiredRun.RUNNING)
OLD = sv("old", 3000, EVI, host=50_000)  # asleep: 1000 MiB residual, 50000 of host RAM
CODER = sv("coder", 13_000, EVI, host=20_000)  # its sleep needs 20000; 10000 are free
LLM = sv("llm", 8000, OND)


def host_room(uses: dict[str, tuple[float, ...]] | None) -> Plan:
    policy = Policy(reload=COSTS, uses=uses) if uses is not None else Policy(reload=COSTS)
    return run(
        [STT, OLD, CODER, LLM],
        ["stt", "old", "coder"],
        {"llm": NOW - 1},
        policy,
        sleep={"old": ASLEEP},
    )


def test_a_sleeper_worth_less_asleep_gives_its_host_ram_to_a_victim_worth_more() -> None:
    result = host_room({"old": (NOW - 7200.0,), "coder": often(10), "llm": ()})
    assert lines(result)[:4] == [
        "stop old",
        "release old",
        "sleep coder",
        "release_to_residual coder",
    ]
    reason = result.steps[0].reason
    assert reason.startswith("stop old, asleep, so coder can sleep in its host RAM")
    assert "per MiB of host RAM" in reason
    assert result.ledger_after.host_holdings == {"coder": 20_000}


def test_a_sleeper_worth_more_keeps_its_host_ram_and_the_victim_is_stopped() -> None:
    result = host_room({"old": often(30), "coder": (NOW - 7200.0,), "llm": ()})
    assert lines(result)[:2] == ["stop coder", "release coder"]
    assert "not put to sleep" in result.steps[0].reason
    assert result.ledger_after.host_holdings == {"old": 50_000}


@pytest.mark.parametrize(
    "uses",
    [None, {"coder": often(10)}, {"old": (), "llm": ()}],
    ids=["not counted", "the sleeper's unknown", "the victim's unknown"],
)
def test_no_sleeper_is_displaced_on_the_strength_of_an_unknown(
    uses: dict[str, tuple[float, ...]] | None,
) -> None:
    result = host_room(uses)
    assert lines(result)[:2] == ["stop coder", "release coder"]
    assert result.ledger_after.host_holdings == {"old": 50_000}


# ── victim sets by cost ────────────────────────────────────────────────────────────

BIG = sv("big", 12_000, EVI)
SMALL_A = sv("sa", 9000, EVI, host=2000)
SMALL_B = sv("sb", 9000, EVI, host=2000)
REQ = sv("req", 10_000, OND)
CHEAP_WAKES = {
    "big": RestoreCost(98.0, None),
    "sa": RestoreCost(20.0, 1.0),
    "sb": RestoreCost(20.0, 1.0),
}


IDLE = {n: sm.InFlightObs(0, sm.InFlightSource.METRICS) for n in ("big", "sa", "sb")}


def by_cost(policy: Policy) -> Plan:
    return run(
        [BIG, SMALL_A, SMALL_B, REQ], ["big", "sa", "sb"], {"req": NOW - 1}, policy, in_flight=IDLE
    )


def test_two_cheap_wakes_are_taken_over_one_dear_cold_start_where_uses_are_counted() -> None:
    uses = {"big": often(5), "sa": often(5), "sb": often(5), "req": ()}
    result = by_cost(Policy(reload=CHEAP_WAKES, uses=uses))
    assert sorted(s.serve for s in result.steps if s.action is Action.SLEEP) == ["sa", "sb"]
    assert not any(s.action is Action.STOP for s in result.steps)


def test_without_uses_fewest_victims_still_comes_first() -> None:
    result = by_cost(Policy(reload=CHEAP_WAKES))
    assert [s.serve for s in result.steps if s.action in (Action.STOP, Action.SLEEP)] == ["big"]


def test_a_victim_never_used_is_the_cheapest() -> None:
    uses = {"big": (), "sa": often(5), "sb": often(5), "req": ()}
    result = by_cost(Policy(reload=CHEAP_WAKES, uses=uses))
    assert [s.serve for s in result.steps if s.action in (Action.STOP, Action.SLEEP)] == ["big"]


def test_where_sleep_alone_cannot_cover_the_popular_victim_sleeps_and_the_rare_one_stops() -> None:
    # 19000 MiB short: both asleep free 18000 (not enough), both stopped 20000; one
    # asleep and one stopped 19000, at a wake of the popular one and a cold start of the
    # rare one: far cheaper than the popular one's cold start
    pop, rare = sv("pop", 10_000, EVI, host=4000), sv("rare", 10_000, EVI, host=4000)
    reloads = {"pop": RestoreCost(60.0, 2.0), "rare": RestoreCost(60.0, 2.0)}
    uses = {"pop": often(20), "rare": often(1, NOW - 3000.0), "req": ()}
    idle = {n: sm.InFlightObs(0, sm.InFlightSource.METRICS) for n in ("pop", "rare")}
    serves = [pop, rare, sv("req", 29_000, OND)]
    result = run(
        serves, ["pop", "rare"], {"req": NOW - 1}, Policy(reload=reloads, uses=uses), in_flight=idle
    )
    assert [s.serve for s in result.steps if s.action is Action.SLEEP] == ["pop"]
    assert [s.serve for s in result.steps if s.action is Action.STOP] == ["rare"]
    assert any(s.action is Action.START and s.serve == "req" for s in result.steps)
    # without uses, fewest victims first: both stopped, as before
    result = run(serves, ["pop", "rare"], {"req": NOW - 1}, Policy(reload=reloads), in_flight=idle)
    assert sorted(s.serve for s in result.steps if s.action is Action.STOP) == ["pop", "rare"]
    assert not any(s.action is Action.SLEEP for s in result.steps)


# ── waiting for room that frees by itself ──────────────────────────────────────────

BUSY = sv("busy", 10_000, OND)
POPULAR = sv("pop", 20_000, EVI)
WAITER = sv("req", 10_000, OND)
RELOADS = {"pop": RestoreCost(60.0, None), "busy": RestoreCost(30.0, None)}
BUSY_NOW = {"busy": sm.InFlightObs(2, sm.InFlightSource.METRICS)}


def coming(now: float, *, busy: sm.Residency = OND, uses: bool = True) -> Plan:
    counted = {"pop": often(20), "busy": often(3), "req": ()} if uses else {}
    return run(
        [BUSY if busy is OND else sv("busy", 10_000, busy), POPULAR, WAITER],
        ["busy", "pop"],
        {"busy": NOW - 50, "req": NOW - 5},
        Policy(reload=RELOADS, uses=counted),
        now=now,
        in_flight=BUSY_NOW,
    )


def test_a_request_waits_for_room_that_frees_by_itself_while_evicting_costs_more() -> None:
    result = coming(NOW)
    assert result.steps == ()
    (blocked,) = [b for b in result.blocked if b.serve == "req"]
    expected = expected_restore_s(reuse_rate(often(20), NOW), 60.0)
    for words in (
        "req waits for room that frees by itself (busy, 10000 MiB on a, busy)",
        "would evict pop",
        f"expected to cost {expected:.1f}s",
        f"pop {expected:.1f}s",
        "more than req has waited (5.0s)",
        f"once it has waited {expected:.1f}s",
    ):
        assert words in blocked.reason, blocked.reason


def test_once_it_has_waited_what_evicting_costs_the_request_evicts() -> None:
    result = coming(NOW + 60.0)  # waited 65 s: more than pop's expected 60 s at most
    assert lines(result)[:2] == ["stop pop", "release pop"]
    assert "start req" in lines(result)


@pytest.mark.parametrize(
    ("busy", "uses"), [(RES, True), (OND, False)], ids=["room that never frees", "not counted"]
)
def test_without_room_that_frees_by_itself_or_without_uses_it_evicts_at_once(
    busy: sm.Residency, uses: bool
) -> None:
    result = coming(NOW, busy=busy, uses=uses)
    assert lines(result)[:2] == ["stop pop", "release pop"]


# ── which request goes first ───────────────────────────────────────────────────────

BIG_LLM = sv("b", 20_000, OND, sizes_from_free=True)
SMALL_LLM = sv("s", 8000, OND, sizes_from_free=True)
STARTS = {"b": RestoreCost(98.0, None), "s": RestoreCost(21.0, None)}


def first_start(b_asked: float, policy: Policy) -> list[str]:
    result = run([BIG_LLM, SMALL_LLM], [], {"b": b_asked, "s": NOW - 5}, policy)
    return [s.serve for s in result.steps if s.action is Action.START]


def test_a_short_start_goes_before_an_older_long_one_by_response_ratio() -> None:
    # (5 + 21) / 21 = 1.24 against (10 + 98) / 98 = 1.10: one vLLM start a GPU at a time
    assert first_start(NOW - 10, Policy(reload=STARTS, uses={"b": (), "s": ()})) == ["s"]
    assert first_start(NOW - 10, Policy(reload=STARTS)) == ["b"]  # not counted: by age


def test_a_long_start_that_has_waited_long_enough_goes_first() -> None:
    # (200 + 98) / 98 = 3.04 against 1.24: nothing waits forever
    assert first_start(NOW - 200, Policy(reload=STARTS, uses={"b": (), "s": ()})) == ["b"]


def test_every_request_waiting_for_a_start_counts_in_its_ratio() -> None:
    """Five requests for ``b``, each 10 s old: 5 x (10 + 98) / 98 = 5.51 against ``s``'s
    one, (5 + 21) / 21 = 1.24: ``b`` first (one request each: ``s`` first, above)."""
    desired = sm.DesiredState(
        ROLES,
        {s.name: s for s in (BIG_LLM, SMALL_LLM)},
        (*(sm.OnDemandRequest("b", NOW - 10) for _ in range(5)), sm.OnDemandRequest("s", NOW - 5)),
        host=HOST,
    )
    policy = Policy(reload=STARTS, uses={"b": (), "s": ()})
    plan = plan_transitions(desired, sm.Observed(True), policy, NOW)
    assert [st.serve for st in plan.steps if st.action is Action.START] == ["b"]
    one = plan_transitions(
        dataclasses.replace(desired, requests=desired.requests[4:]), sm.Observed(True), policy, NOW
    )
    assert [st.serve for st in one.steps if st.action is Action.START] == ["s"]


# ── placement: where no engine sizing itself from free memory loads ────────────────

CARDS = {"g0": sm.GpuRole("g0", 32_000, 0), "g1": sm.GpuRole("g1", 32_000, 0)}


@pytest.mark.parametrize("sizes", [True, False])
def test_a_placed_start_goes_where_no_engine_sizing_from_free_memory_loads(sizes: bool) -> None:
    loading = sv("loading", 8000, OND, gpu_roles=("g0",), sizes_from_free=True)
    new = sv(
        "new", 8000, OND, gpu_roles=("g0", "g1"), placement=("g0", "g1"), sizes_from_free=sizes
    )
    result = run(
        [loading, new],
        ["loading"],
        {"loading": NOW - 20, "new": NOW - 1},
        Policy(),
        roles=CARDS,
        starting={"loading": sm.StartingObs(("g0",), 8000)},
    )
    (start,) = [s for s in result.steps if s.action is Action.START]
    # best fit alone is g0 (the least left free); a vLLM start there would wait
    assert start.gpu_roles == (("g1",) if sizes else ("g0",))
    (placed,) = [p for p in result.placements if p.serve == "new"]
    assert ("no engine that sizes itself from free memory is loading" in placed.reason) is sizes
