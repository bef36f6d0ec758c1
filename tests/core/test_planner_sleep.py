"""The planner with engines that can sleep (docs/eviction.md, sleep instead of stop).

Written from the rules: to make room a victim is put to sleep rather than stopped when
what its sleep frees (``vram_mib - residual_mib``) covers the need under the same victim
rules; a requester that sleeps is woken, not started; an evictable desired-running serve
that was put to sleep comes back by waking; a sleeper whose residual is in the way is
stopped; router tiers are quiesced and drained before a sleep and readmitted after a
wake; a sleep the host RAM budget cannot take is a stop; residents are never slept.
Each plan is replayed through the ledger (never over budget, GPU roles nor host RAM)
and, where it says so, applied and planned again (it converges).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.core import spec
from support.replay import assert_never_overcommits

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import Ledger, ledger_from_observed
from statemachine.planning.plan_types import Action, Plan
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import apply_plan, ledger_prefixes

NOW = 10_000.0
RUN, STOP = sm.DesiredRun.RUNNING, sm.DesiredRun.STOPPED
RES, EVI, OND = sm.Residency.RESIDENT, sm.Residency.EVICTABLE, sm.Residency.ON_DEMAND
ROLES = {"a": sm.GpuRole("a", 32_000, 2_000)}  # budget 30000
HOST = sm.HostBudget(64_000, 4_000)  # budget 60000
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)


def sleep(residual: int = 1000, level: int = 1, host: int = 20_000) -> sm.Sleep:
    return sm.Sleep(level, residual, SleepProtocol.VLLM, host if level == 1 else 0)


def sv(
    name: str,
    mib: int,
    residency: sm.Residency | None,
    desired: sm.DesiredRun | None = None,
    **kw: object,
) -> sm.ServeSpec:
    return spec(name, mib, residency, desired=desired, **kw)


def asleep(level: int = 1) -> sm.SleepObs:
    return sm.SleepObs(sm.SleepState.ASLEEP, level=level)


def plan(
    serves: list[sm.ServeSpec],
    running: list[str],
    requests: tuple[str, ...] = (),
    *,
    sleeping: dict[str, sm.SleepObs] | None = None,
    host: sm.HostBudget | None = HOST,
    **observed: object,
) -> tuple[sm.DesiredState, sm.Observed, Plan]:
    desired = sm.DesiredState(
        ROLES,
        {s.name: s for s in serves},
        tuple(sm.OnDemandRequest(r, NOW - 1) for r in requests),
        host=host,
    )
    obs = sm.Observed(
        True,
        {f"c-{n}": UP for n in running},
        sleep=sleeping or {},
        **observed,  # type: ignore[arg-type]
    )
    result = plan_transitions(desired, obs, None, NOW)
    check_ledger(result)
    return desired, obs, result


def check_ledger(result: Plan) -> None:
    """Every prefix of the plan is admitted by the ledger and never over budget."""
    last: Ledger = result.ledger_before
    for _step, out in ledger_prefixes(result):
        assert isinstance(out, Ledger), out
        assert not out.overcommitted() and not out.host_overcommitted()
        last = out
    assert last.holdings == result.ledger_after.holdings
    assert last.host_holdings == result.ledger_after.host_holdings


def lines(result: Plan) -> list[str]:
    return [f"{s.action} {s.serve}" for s in result.steps]


def converges(desired: sm.DesiredState, obs: sm.Observed, result: Plan) -> None:
    after = apply_plan(desired, obs, result, NOW + 1)
    again = plan_transitions(desired, after, None, NOW + 1)
    assert again.empty, lines(again)
    ledger = ledger_from_observed(desired, after)
    assert ledger.holdings == result.ledger_after.holdings
    assert ledger.host_holdings == result.ledger_after.host_holdings


STT = sv("stt", 10_000, RES, RUN)


def test_a_victim_whose_sleep_covers_the_need_is_put_to_sleep_not_stopped() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 8000, OND)
    desired, obs, result = plan([STT, coder, llm], ["stt", "coder"], ("llm",))
    assert lines(result) == [
        "sleep coder",
        "release_to_residual coder",
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]
    down = result.steps[1]
    assert (down.mib, down.to_mib, down.host_mib) == (15_000, 1000, 20_000)
    assert down.reason == (
        "release 15000 MiB down to the residual 1000 MiB and take 20000 MiB of host RAM "
        "once coder is confirmed asleep"
    )
    assert {s.group for s in result.steps} == {"llm"}
    assert result.ledger_after.holdings["coder"].mib == 1000
    assert result.ledger_after.host_holdings == {"coder": 20_000}
    host_json = result.to_json()["host_ledger_after"]
    assert host_json["committed_mib"] == 20_000 and host_json["free_mib"] == 40_000
    converges(desired, obs, result)


def test_a_victim_whose_sleep_does_not_cover_the_need_is_stopped() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 20_000, OND)  # short 16000: sleep frees 15000, a stop 16000
    desired, obs, result = plan([STT, coder, llm], ["stt", "coder"], ("llm",))
    assert lines(result) == [
        "stop coder",
        "release coder",
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]
    assert result.ledger_after.host_holdings == {}
    converges(desired, obs, result)


def test_a_sleep_the_host_budget_cannot_take_is_a_stop_with_the_host_terms() -> None:
    old = sv("old", 3000, EVI, None, sleep=sleep(residual=500, host=50_000))
    coder = sv("coder", 13_000, EVI, RUN, sleep=sleep())  # host 20000 > 60000 - 50000
    llm = sv("llm", 8000, OND)
    desired, obs, result = plan(
        [STT, old, coder, llm], ["stt", "old", "coder"], ("llm",), sleeping={"old": asleep()}
    )
    assert lines(result) == [
        "stop coder",
        "release coder",
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]
    reason = result.steps[0].reason
    for words in ("not put to sleep", "20000 MiB of host RAM", "free 10000", "old 50000"):
        assert words in reason, reason
    assert result.ledger_after.host_holdings == {"old": 50_000}
    converges(desired, obs, result)


def test_without_a_host_budget_host_ram_never_turns_a_sleep_into_a_stop() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(host=10**6))
    llm = sv("llm", 8000, OND)
    _d, _o, result = plan([STT, coder, llm], ["stt", "coder"], ("llm",), host=None)
    assert lines(result)[:2] == ["sleep coder", "release_to_residual coder"]
    assert "host_ledger_after" not in result.to_json()


def test_a_level_1_sleep_that_declares_no_host_ram_takes_none() -> None:
    """A sleep built without ``host_ram_mib`` (the manifest always fills it at level 1)
    takes no host RAM: it is slept, not stopped, and the host ledger stays empty."""
    coder = sv("coder", 16_000, EVI, RUN, sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM))
    llm = sv("llm", 8000, OND)
    desired, obs, result = plan([STT, coder, llm], ["stt", "coder"], ("llm",))
    assert lines(result)[:2] == ["sleep coder", "release_to_residual coder"]
    down = result.steps[1]
    assert (down.mib, down.to_mib, down.host_mib) == (15_000, 1000, None)
    assert result.ledger_after.host_holdings == {}
    converges(desired, obs, result)


def test_sleep_is_preferred_at_an_equal_number_of_victims() -> None:
    # short 8000: stopping ocr (8500) overshoots less than stopping coder (10000), but
    # coder's sleep frees exactly 8000
    coder = sv("coder", 10_000, EVI, RUN, sleep=sleep(residual=2000))
    ocr = sv("ocr", 8500, EVI, RUN)
    llm = sv("llm", 19_500, OND)
    desired, obs, result = plan([coder, ocr, llm], ["coder", "ocr"], ("llm",))
    assert lines(result)[:2] == ["sleep coder", "release_to_residual coder"]
    assert "stop ocr" not in lines(result)
    converges(desired, obs, result)


def test_fewest_victims_comes_before_sleeping() -> None:
    # short 9000: coder's sleep frees only 8000, so sleeping needs a second victim;
    # one stop of coder covers it
    coder = sv("coder", 10_000, EVI, RUN, sleep=sleep(residual=2000))
    ocr = sv("ocr", 5000, EVI, RUN)
    emb = sv("emb", 5000, EVI, RUN)
    llm = sv("llm", 19_000, OND)
    _d, _o, result = plan([coder, ocr, emb, llm], ["coder", "ocr", "emb"], ("llm",))
    assert lines(result) == [
        "stop coder",
        "release coder",
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]


def test_a_stopped_victim_that_could_sleep_sleeps_when_the_cover_holds() -> None:
    # two victims needed either way; the stop set is {big, coder}; coder's residual
    # is not needed, so coder sleeps
    big = sv("big", 14_000, EVI, RUN)
    coder = sv("coder", 12_000, EVI, RUN, sleep=sleep(residual=1000))
    llm = sv("llm", 27_000, OND)
    _d, _o, result = plan([big, coder, llm], ["big", "coder"], ("llm",))
    assert set(lines(result)) >= {"stop big", "sleep coder", "release_to_residual coder"}


def test_router_tiers_are_drained_before_a_sleep_and_stay_quiesced_while_asleep() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(), router_tier="coder-local")
    llm = sv("llm", 8000, OND)
    desired, obs, result = plan([STT, coder, llm], ["stt", "coder"], ("llm",))
    assert lines(result)[:4] == [
        "quiesce coder",
        "drain coder",
        "sleep coder",
        "release_to_residual coder",
    ]
    after = apply_plan(desired, obs, result, NOW + 1)
    assert "coder" in after.quiesced
    again = plan_transitions(desired, after, None, NOW + 1)
    assert "readmit coder" not in lines(again)  # never readmitted while it sleeps
    assert again.empty


def test_a_requester_that_sleeps_is_woken_not_started() -> None:
    llm = sv("llm", 8000, OND, sleep=sleep(residual=1000, level=2))
    desired, obs, result = plan([STT, llm], ["stt", "llm"], ("llm",), sleeping={"llm": asleep(2)})
    assert lines(result) == ["reserve_wake llm", "wake llm", "reload llm", "await_ready llm"]
    wake = result.steps[0]
    assert (wake.mib, wake.to_mib, wake.host_mib) == (7000, 8000, None)
    assert result.ledger_after.holdings["llm"].mib == 8000
    converges(desired, obs, result)


def test_a_level_1_wake_gives_the_host_ram_back_and_reloads_nothing() -> None:
    llm = sv("llm", 8000, OND, sleep=sleep(), router_tier="llm-local")
    desired, obs, result = plan(
        [STT, llm],
        ["stt", "llm"],
        ("llm",),
        sleeping={"llm": asleep(1)},
        quiesced=frozenset({"llm"}),
    )
    assert lines(result) == ["reserve_wake llm", "wake llm", "await_ready llm", "readmit llm"]
    assert result.steps[0].host_mib == 20_000
    assert result.ledger_after.host_holdings == {}
    converges(desired, obs, result)


def test_a_requester_that_sleeps_makes_room_for_its_wake() -> None:
    llm = sv("llm", 8000, OND, sleep=sleep(residual=1000, level=2))
    coder = sv("coder", 21_000, EVI, RUN)  # 10000 + 21000 + 1000 asleep: free 0... short 7000
    stt = sv("stt", 8000, RES, RUN)
    desired, obs, result = plan(
        [stt, coder, llm], ["stt", "coder", "llm"], ("llm",), sleeping={"llm": asleep(2)}
    )
    assert lines(result) == [
        "stop coder",
        "release coder",
        "reserve_wake llm",
        "wake llm",
        "reload llm",
        "await_ready llm",
    ]
    converges(desired, obs, result)


def test_an_evictable_serve_put_to_sleep_comes_back_by_waking() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(), router_tier="coder-local")
    desired, obs, result = plan(
        [STT, coder], ["stt", "coder"], sleeping={"coder": asleep()}, quiesced=frozenset({"coder"})
    )
    assert lines(result) == [
        "reserve_wake coder",
        "wake coder",
        "await_ready coder",
        "readmit coder",
    ]
    converges(desired, obs, result)


def test_a_sleeper_without_room_to_wake_waits_with_every_term() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 16_000, OND)
    _d, _o, result = plan(
        [STT, coder, llm], ["stt", "coder", "llm"], ("llm",), sleeping={"coder": asleep()}
    )
    assert result.empty
    (blocked,) = result.blocked
    assert blocked.serve == "coder"
    assert "sleeps and cannot wake" in blocked.reason
    (terms,) = blocked.terms
    assert terms.requested_mib == 15_000 and terms.free_mib == 3000
    assert ("coder", 1000) in terms.reservations  # the residual is a term
    assert "coder 1000" in blocked.reason


def test_the_wake_of_an_on_demand_requester_does_not_stop_the_sleeper_it_put_to_sleep() -> None:
    # the next cycle after test 1: llm runs, coder sleeps: nothing to do
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 8000, OND)
    _d, _o, result = plan(
        [STT, coder, llm], ["stt", "coder", "llm"], ("llm",), sleeping={"coder": asleep()}
    )
    assert result.empty and [b.serve for b in result.blocked] == ["coder"]


def test_when_the_request_ends_the_sleeper_is_woken() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 8000, OND)
    desired = sm.DesiredState(
        ROLES,
        {s.name: s for s in (STT, coder, llm)},
        (sm.OnDemandRequest("llm", NOW - 100, ttl_s=10),),
        host=HOST,
    )
    obs = sm.Observed(
        True, {f"c-{n}": UP for n in ("stt", "coder", "llm")}, sleep={"coder": asleep()}
    )
    result = plan_transitions(desired, obs, None, NOW)
    check_ledger(result)
    assert lines(result) == [
        "stop llm",
        "release llm",
        "reserve_wake coder",
        "wake coder",
        "await_ready coder",
    ]
    converges(desired, obs, result)


def test_a_sleeper_whose_residual_is_in_the_way_is_stopped() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(residual=1000), router_tier="t")
    llm = sv("llm", 19_500, OND)  # free 30000 - 11000 = 19000: short 500
    desired, obs, result = plan(
        [STT, coder, llm], ["stt", "coder"], ("llm",), sleeping={"coder": asleep()}
    )
    # no quiesce, no drain: its tier was drained before it slept
    assert lines(result) == [
        "stop coder",
        "release coder",
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]
    assert result.ledger_after.host_holdings == {}
    converges(desired, obs, result)


def test_a_sleeper_desired_stopped_is_stopped_without_a_drain() -> None:
    coder = sv("coder", 16_000, EVI, STOP, sleep=sleep(), router_tier="t")
    desired, obs, result = plan([coder], ["coder"], sleeping={"coder": asleep()})
    assert lines(result) == ["stop coder", "release coder"]
    assert result.steps[0].mib == 1000
    converges(desired, obs, result)


def test_residents_and_on_demand_serves_are_never_slept() -> None:
    stt = sv("stt", 20_000, RES, RUN, sleep=sleep())
    other = sv("other", 6000, OND, sleep=sleep())
    llm = sv("llm", 8000, OND)
    _d, _o, result = plan([stt, other, llm], ["stt", "other"], ("llm", "other"))
    assert not any(s.action is Action.SLEEP for s in result.steps)
    assert [b.serve for b in result.blocked] == ["llm"]
    assert {p.serve for p in result.blocked[0].protected} == {"stt", "other"}


def test_an_unknown_sleep_state_is_never_slept_on_but_may_be_stopped() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 8000, OND)
    _d, _o, result = plan(
        [STT, coder, llm],
        ["stt", "coder"],
        ("llm",),
        sleeping={"coder": sm.SleepObs(sm.SleepState.UNKNOWN)},
    )
    assert lines(result)[:2] == ["stop coder", "release coder"]
    assert result.steps[0].mib == 16_000  # counted awake and full


def test_an_elastic_sleeper_is_neither_grown_nor_shrunk() -> None:
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=2000)
    coder = sv("coder", 16_000, EVI, None, sleep=sleep(), elastic=el)
    llm = sv("llm", 19_500, OND)  # short 500: the sleeper's residual is stopped
    _d, _o, result = plan(
        [STT, coder, llm], ["stt", "coder"], ("llm",), sleeping={"coder": asleep()}
    )
    assert not any(s.action in (Action.GROW, Action.SHRINK) for s in result.steps)
    assert lines(result)[:2] == ["stop coder", "release coder"]
    # no request: the sleeper is left as it is (not desired running, nothing to grow)
    _d, _o, idle = plan([STT, coder], ["stt", "coder"], sleeping={"coder": asleep()})
    assert idle.empty


def test_docker_unknown_plans_no_sleep_and_no_wake() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    desired = sm.DesiredState(ROLES, {"coder": coder}, host=HOST)
    result = plan_transitions(desired, sm.Observed(False, sleep={"coder": asleep()}), None, NOW)
    assert result.empty and [b.serve for b in result.blocked] == ["coder"]


@pytest.mark.parametrize("level", [1, 2])
def test_two_requesters_sleep_two_victims_and_host_ram_is_taken_in_turn(level: int) -> None:
    a = sv("a1", 9000, EVI, RUN, sleep=sleep(residual=1000, level=level, host=35_000))
    b = sv("b1", 9000, EVI, RUN, sleep=sleep(residual=1000, level=level, host=35_000))
    r1 = sv("r1", 9000, OND)  # 10000 + 9000 + 9000 committed: free 2000
    r2 = sv("r2", 9000, OND)
    desired, obs, result = plan([STT, a, b, r1, r2], ["stt", "a1", "b1"], ("r1", "r2"))
    acts = lines(result)
    assert "start r1" in acts and "start r2" in acts
    if level == 1:  # 35000 + 35000 > 60000: the second is a stop
        assert ("sleep a1" in acts) != ("sleep b1" in acts)
        assert ("stop a1" in acts) != ("stop b1" in acts)
    else:
        assert "sleep a1" in acts and "sleep b1" in acts
    converges(desired, obs, result)


def test_fit_says_who_sleeps_and_keeps_the_host_budget() -> None:
    from statemachine.answers.fit import fit_serve

    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 8000, OND)
    desired = sm.DesiredState(ROLES, {s.name: s for s in (STT, coder, llm)}, host=HOST)
    obs = sm.Observed(True, {"c-stt": UP, "c-coder": UP})
    fit = fit_serve(desired, obs, "llm", now=NOW)
    assert fit.fits and fit.sleep == ("coder",) and fit.evict == ()
    assert "putting coder to sleep" in fit.reason
    assert fit.to_json()["sleep"] == ["coder"]
    # with no room on the host for coder's weights, the same question is a stop
    tight = sm.DesiredState(ROLES, desired.serves, host=sm.HostBudget(10_000, 0))
    fit = fit_serve(tight, obs, "llm", now=NOW)
    assert fit.fits and fit.evict == ("coder",) and fit.sleep == ()


def test_fit_of_a_sleeper_is_its_wake() -> None:
    from statemachine.answers.fit import fit_serve

    llm = sv("llm", 8000, OND, sleep=sleep())
    desired = sm.DesiredState(ROLES, {s.name: s for s in (STT, llm)}, host=HOST)
    obs = sm.Observed(True, {"c-stt": UP, "c-llm": UP}, sleep={"llm": asleep()})
    fit = fit_serve(desired, obs, "llm", now=NOW)
    assert fit.fits and fit.wake
    assert fit.reason.startswith("llm sleeps and is woken, not started")
    (terms,) = fit.terms
    assert terms.requested_mib == 7000 and ("llm", 1000) in terms.reservations


def test_status_shows_the_sleeper_its_residual_and_the_host_line() -> None:
    from statemachine.answers.status_report import host_status

    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    desired = sm.DesiredState(ROLES, {s.name: s for s in (STT, coder)}, host=HOST)
    used = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", gpu_used_mib=1200)
    obs = sm.Observed(True, {"c-stt": UP, "c-coder": used}, sleep={"coder": asleep()})
    report = host_status(desired, obs).to_json()
    rows = {r["serve"]: r for r in report["serves"]}
    assert rows["coder"]["lifecycle"] == "asleep"
    assert rows["coder"]["sleep"] == {
        "state": "asleep",
        "level": 1,
        "residual_mib": 1000,
        "host_ram_mib": 20_000,
    }
    assert rows["coder"]["drift_mib"] == 200  # against the residual it holds asleep
    assert "sleep" not in rows["stt"]
    assert report["host"]["committed_mib"] == 20_000 and report["host"]["overcommitted"] is False
    assert report["gpu_roles"][0]["committed_mib"] == 11_000
    awake = host_status(desired, sm.Observed(True, {"c-stt": UP, "c-coder": UP})).to_json()
    row = {r["serve"]: r for r in awake["serves"]}["coder"]
    assert row["sleep"]["state"] == "awake" and row["lifecycle"] == "running"
    unknown = host_status(desired, sm.Observed(False)).to_json()
    assert {r["serve"]: r for r in unknown["serves"]}["coder"]["sleep"]["state"] == "unknown"
    assert unknown["host"]["committed_mib"] is None
    assert unknown["host"]["overcommitted"] is None


def test_a_serve_the_policy_says_cannot_sleep_is_stopped_instead() -> None:
    from statemachine.planning.plan_types import Policy

    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 8000, OND)
    desired = sm.DesiredState(
        ROLES, {s.name: s for s in (STT, coder, llm)}, (sm.OnDemandRequest("llm", NOW - 1),), HOST
    )
    obs = sm.Observed(True, {"c-stt": UP, "c-coder": UP})
    policy = Policy(no_sleep=frozenset({"coder"}))
    result = plan_transitions(desired, obs, policy, NOW)
    assert lines(result)[:2] == ["stop coder", "release coder"]
    assert Policy.from_json(policy.to_json()) == policy
    assert "no_sleep" not in Policy().to_json()  # older journal records stay as they were
    with pytest.raises(ValueError, match="no_sleep"):
        Policy.from_json({"no_sleep": "coder"})


def test_when_every_candidate_can_sleep_the_one_whose_sleep_covers_sleeps() -> None:
    # short 8000: stopping ocr (8500) overshoots least, but its sleep frees only 500;
    # coder's sleep frees exactly 8000, so coder sleeps and ocr keeps running
    coder = sv("coder", 10_000, EVI, RUN, sleep=sleep(residual=2000))
    ocr = sv("ocr", 8500, EVI, RUN, sleep=sleep(residual=8000))
    llm = sv("llm", 19_500, OND)
    desired, obs, result = plan([coder, ocr, llm], ["coder", "ocr"], ("llm",))
    assert lines(result)[:2] == ["sleep coder", "release_to_residual coder"]
    assert not any(s.serve == "ocr" for s in result.steps)
    converges(desired, obs, result)


def test_a_conflict_with_a_start_in_progress_does_not_hide_the_other_conflicts() -> None:
    from statemachine.domain.types import StartingObs

    a = sv("a", 1000, EVI, None, port=9000)
    b = sv("b", 1000, RES, RUN, port=9000)
    q = sv("q", 1000, OND, port=9000)
    _d, _o, result = plan([a, b, q], ["a", "b"], ("q",), starting={"a": StartingObs(("a",), 1000)})
    (blocked,) = [x for x in result.blocked if x.serve == "q"]
    assert "a: its start is in progress" in blocked.reason
    assert "b runs (holds port 9000) and may not be stopped" in blocked.reason
    assert {p.serve for p in blocked.protected} == {"a", "b"}


def test_an_elastic_serve_shrunk_before_it_slept_wakes_at_what_it_held() -> None:
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=2000)
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(residual=1000), elastic=el)
    desired, obs, result = plan(
        [STT, coder], ["stt", "coder"], sleeping={"coder": asleep()}, elastic_mib={"coder": 9000}
    )
    assert lines(result)[0] == "reserve_wake coder"
    assert (result.steps[0].mib, result.steps[0].to_mib) == (8000, 9000)
    # awake again, it grows back toward its declared reservation as any shrunk serve,
    # in the same plan though it was woken in backfill, after the grows before it
    assert lines(result)[-1] == "grow coder"
    assert (result.steps[-1].mib, result.steps[-1].to_mib, result.steps[-1].group) == (
        7000,
        16_000,
        "coder",
    )
    converges(desired, obs, result)


def test_a_start_needs_its_declared_reservation_whatever_an_old_record_says() -> None:

    ocr = sv("ocr", 8000, EVI, RUN)
    record = {"c-ocr": sm.StartedWith("ocr", ("a",), 25_000)}  # its last run, exited
    _d, _o, result = plan([STT, ocr], ["stt"], started_with=record)
    assert lines(result) == ["reserve ocr", "start ocr", "await_ready ocr"]


def test_what_a_sleeper_that_is_not_known_awake_could_free_is_not_offered() -> None:
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    llm = sv("llm", 25_000, OND)  # short 21000; stopping coder frees 16000: no fit
    _d, _o, result = plan(
        [STT, coder, llm],
        ["stt", "coder"],
        ("llm",),
        sleeping={"coder": sm.SleepObs(sm.SleepState.UNKNOWN)},
    )
    (blocked,) = result.blocked
    assert "by sleep" not in blocked.reason
    assert "sleepable_mib" not in blocked.to_json()["ledger"]
    # known awake, it could free 15000 by sleeping: that is a term of the refusal
    _d, _o, awake = plan([STT, coder, llm], ["stt", "coder"], ("llm",))
    (blocked,) = awake.blocked
    assert "evictable 16000 (by sleep 15000)" in blocked.reason
    assert blocked.to_json()["ledger"]["sleepable_mib"] == {"a": 15_000}


def test_a_sleeper_wakes_by_the_level_it_slept_at_not_the_one_declared_now() -> None:
    llm = sv("llm", 8000, OND, sleep=sleep(level=1))
    _d, _o, result = plan([STT, llm], ["stt", "llm"], ("llm",), sleeping={"llm": asleep(2)})
    assert "reload llm" in lines(result)
    unsaid = sm.SleepObs(sm.SleepState.ASLEEP)  # no level observed: the declared one
    _d, _o, result = plan([STT, llm], ["stt", "llm"], ("llm",), sleeping={"llm": unsaid})
    assert "reload llm" not in lines(result) and "wake llm" in lines(result)


def test_a_sleeper_of_unknown_level_is_reloaded_and_wakes_to_what_it_was_started_with() -> None:

    # the manifest no longer declares sleep and the engine did not say its level
    llm = sv("llm", 8000, OND)
    _d, _o, result = plan(
        [STT, llm], ["stt", "llm"], ("llm",), sleeping={"llm": sm.SleepObs(sm.SleepState.ASLEEP)}
    )
    assert lines(result) == ["reserve_wake llm", "wake llm", "reload llm", "await_ready llm"]
    # started with more than it declares now: it wakes to that
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    record = {"c-coder": sm.StartedWith("coder", ("a",), 18_000)}
    desired, obs, result = plan(
        [STT, coder], ["stt", "coder"], sleeping={"coder": asleep()}, started_with=record
    )
    assert (result.steps[0].mib, result.steps[0].to_mib) == (17_000, 18_000)
    converges(desired, obs, result)


def test_fit_of_sleepers_outside_or_without_their_sleep_config() -> None:
    from statemachine.answers.fit import fit_serve

    # outside the ledger (no vram_mib): fits, and nothing to take
    free = sm.ServeSpec("free", "c-free", (), None, OND, sleep=None)
    desired = sm.DesiredState(ROLES, {s.name: s for s in (STT, free)}, host=HOST)
    obs = sm.Observed(True, {"c-stt": UP, "c-free": UP}, sleep={"free": asleep()})
    fit = fit_serve(desired, obs, "free", now=NOW)
    assert fit.fits and fit.wake and fit.terms == ()
    # asleep but no longer declared to sleep: counted full, so a wake takes nothing more,
    # even when it was started with more than it declares now
    llm = sv("llm", 8000, OND)
    record = {"c-llm": sm.StartedWith("llm", ("a",), 9000)}
    desired = sm.DesiredState(ROLES, {s.name: s for s in (STT, llm)}, host=HOST)
    for started_with in ({}, record):
        obs = sm.Observed(
            True,
            {"c-stt": UP, "c-llm": UP},
            sleep={"llm": asleep()},
            started_with=started_with,
        )
        fit = fit_serve(desired, obs, "llm", now=NOW)
        (terms,) = fit.terms
        assert fit.fits and terms.requested_mib == 0, started_with


def test_fit_says_wake_only_for_a_sleeper() -> None:
    from statemachine.answers.fit import fit_serve

    llm = sv("llm", 40_000, OND)  # can never fit the 30000 budget: blocked
    desired = sm.DesiredState(ROLES, {s.name: s for s in (STT, llm)}, host=HOST)
    fit = fit_serve(desired, sm.Observed(True, {"c-stt": UP}), "llm", now=NOW)
    assert not fit.fits and not fit.wake and "wake" not in fit.to_json()
    running = fit_serve(desired, sm.Observed(True, {"c-stt": UP, "c-llm": UP}), "llm", now=NOW)
    assert running.fits and not running.wake
    unknown = fit_serve(desired, sm.Observed(False), "llm", now=NOW)
    assert not unknown.fits and not unknown.wake


def test_wake_texts_carry_their_figures() -> None:
    llm = sv("llm", 8000, OND, sleep=sleep(residual=1000, level=2))
    _d, _o, result = plan([STT, llm], ["stt", "llm"], ("llm",), sleeping={"llm": asleep(2)})
    assert "reserve 7000 MiB more on a to wake llm (from its residual 1000 back to 8000)" in (
        result.steps[0].reason
    )
    # a sleeper without a residency class that cannot wake says what it is
    odd = sv("odd", 16_000, None, RUN, sleep=sleep())
    big = sv("big", 16_000, RES, RUN)
    _d, _o, result = plan([STT, odd, big], ["stt", "odd", "big"], sleeping={"odd": asleep()})
    (blocked,) = result.blocked
    assert "it sleeps and cannot wake: unclassified serves do not evict" in blocked.reason


def test_a_sleep_for_a_requester_retries_what_was_blocked_before_it() -> None:
    """The victim's sleep frees more than the requester takes: the resident blocked
    earlier in the pass is tried again and starts after the requester."""
    _, _, result = plan(
        [
            sv("res", 12_000, RES, RUN),
            sv("big", 20_000, EVI, RUN, sleep=sleep(residual=2_000, level=2)),
            sv("od", 14_000, OND),
        ],
        ["big"],
        ("od",),
    )
    actions = [f"{s.action} {s.serve}" for s in result.steps]
    assert "sleep big" in actions and "stop big" not in actions
    assert actions[-3:] == ["reserve res", "start res", "await_ready res"]
    assert actions.index("start od") < actions.index("start res")
    assert result.blocked == ()


def test_an_elastic_sleeper_shrunk_below_its_residual_wakes_into_what_its_engine_holds() -> None:
    """Shrunk to 800 before it slept at a residual of 1000: awake, its engine holds 800
    again, and the ledger counts the engine's figure; the wake reserves that 800 (it
    takes nothing more, and gives the 200 of residual back) so the plan's ledger is the
    host's once the wake is applied. The 200 left free is less than a segment: no grow."""
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=500, segment_mib=512)
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(residual=1000), elastic=el)
    full = sv("full", 19_000, RES, RUN)
    desired, obs, result = plan(
        [STT, full, coder],
        ["stt", "full", "coder"],
        sleeping={"coder": asleep()},
        elastic_mib={"coder": 800},
    )
    assert lines(result)[:2] == ["reserve_wake coder", "wake coder"]
    wake = result.steps[0]
    assert (wake.mib, wake.to_mib) == (0, 800)
    assert "800 MiB its engine holds awake" in wake.reason and "residual 1000" in wake.reason
    assert result.ledger_after.holdings["coder"].mib == 800
    converges(desired, obs, result)


@pytest.mark.parametrize("residency", [EVI, OND])
def test_a_wake_that_takes_nothing_more_neither_evicts_nor_waits_on_a_role_over_budget(
    residency: sm.Residency,
) -> None:
    """A role over budget by a start outside the controller: a wake that takes no more
    than the residual it holds adds nothing to it, so it neither waits for room (an
    evictable sleeper) nor evicts to make any (an on-demand requester)."""
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=500, segment_mib=512)
    coder = sv("coder", 16_000, residency, RUN, sleep=sleep(residual=1000), elastic=el)
    victim = sv("victim", 5_000, EVI, RUN)
    outside = sv("outside", 15_000, None)  # started by hand: 31000 of a 30000 budget
    desired = sm.DesiredState(
        ROLES,
        {s.name: s for s in (STT, victim, outside, coder)},
        (sm.OnDemandRequest("coder", NOW - 1),) if residency is OND else (),
        host=HOST,
    )
    up = {f"c-{n}": UP for n in ("stt", "victim", "outside", "coder")}
    obs = sm.Observed(True, up, elastic_mib={"coder": 1000}, sleep={"coder": asleep()})
    result = plan_transitions(desired, obs, None, NOW)
    assert result.ledger_before.overcommitted() == ("a",)
    assert_never_overcommits(result)
    assert lines(result) == ["reserve_wake coder", "wake coder", "await_ready coder"]
    assert result.blocked == ()
    assert result.ledger_after.holdings["coder"].mib == 1000


def test_a_serve_woken_earlier_in_the_plan_may_be_shrunk_its_container_is_not_fresh() -> None:
    """``min_runtime_s`` counts from the container's start, which a wake does not change:
    a resident woken in this plan, its container up for long, may give memory back to an
    on-demand requester after its wake, as a serve started earlier in the plan may
    (docs/eviction.md); protected as if it had just started, the requester waited a
    cycle for the shrink the next plan then made."""
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=2000, segment_mib=512)
    bravo = sv(
        "bravo", 16_000, RES, RUN, sleep=sleep(residual=1000), elastic=el, min_runtime_s=300.0
    )
    alpha = sv("alpha", 8000, OND)
    desired, obs, result = plan(
        [STT, bravo, alpha], ["stt", "bravo"], ("alpha",), sleeping={"bravo": asleep()}
    )
    assert lines(result) == [
        "reserve_wake bravo",
        "wake bravo",
        "await_ready bravo",
        "shrink bravo",
        "reserve alpha",
        "start alpha",
        "await_ready alpha",
    ]
    assert result.steps[3].to_mib == 16_000 - 8 * 512
    converges(desired, obs, result)


def test_one_stop_that_covers_two_requesters_beats_a_sleep_set_for_the_first_alone() -> None:
    """bravo (5000) and then fox (10000) want room on a full role. Stopping s01 (15000)
    covers both; its sleep (frees 9960) and alpha (5000) cannot. The victims are chosen
    for both requesters at once, stopped or slept alike: s01 is stopped once and alpha
    keeps running. Chosen for bravo alone, the sleep-or-stop choice took alpha, then fox
    stopped s01 anyway, and the next plan started alpha again (room freed twice)."""
    s01 = sv("s01", 15_000, EVI, RUN, sleep=sleep(residual=5040))
    alpha = sv("alpha", 5000, EVI, RUN)
    bravo = sv("bravo", 5000, OND, RUN)
    fox = sv("fox", 10_000, OND, RUN)
    desired, obs, result = plan([STT, s01, alpha, bravo, fox], ["stt", "s01", "alpha"])
    assert lines(result) == [
        "stop s01",
        "release s01",
        "reserve bravo",
        "start bravo",
        "await_ready bravo",
        "reserve fox",
        "start fox",
        "await_ready fox",
    ]
    converges(desired, obs, result)


def test_a_sleeper_woken_on_a_port_another_serve_declares_is_no_conflict_of_its_own() -> None:
    """A sleeper holds its residual, so it counts as running: the serves its wake
    conflicts with are the others on its port, never itself (docs/eviction.md)."""
    coder = sv("coder", 16_000, OND, sleep=sleep(), port=8000)
    other = sv("other", 1000, OND, port=8000)  # declared on the same port, not running
    desired, obs, result = plan(
        [STT, coder, other], ["stt", "coder"], ("coder",), sleeping={"coder": asleep()}
    )
    assert lines(result) == ["reserve_wake coder", "wake coder", "await_ready coder"]
    assert result.blocked == ()
    converges(desired, obs, result)


def test_an_exclusive_sleeper_alone_on_its_gpu_wakes_without_conflicting_with_itself() -> None:
    """An exclusive serve needs its GPU to itself: asleep, it is on that GPU already, and
    its wake stops nothing and is not blocked by its own residual."""
    coder = sv("coder", 16_000, OND, sleep=sleep(), exclusive=True)
    desired, obs, result = plan([coder], ["coder"], ("coder",), sleeping={"coder": asleep()})
    assert lines(result) == ["reserve_wake coder", "wake coder", "await_ready coder"]
    assert result.blocked == ()
    converges(desired, obs, result)


def test_an_on_demand_sleeper_without_room_to_wake_is_not_its_own_blocker() -> None:
    """A requested sleeper holds its residual on the role it is short on; the holders
    its blocked wake lists as protected are the others (a resident, never evicted),
    never the sleeper itself (docs/eviction.md)."""
    coder = sv("coder", 16_000, OND, sleep=sleep())
    stt = sv("stt", 20_000, RES, RUN)
    _d, _o, result = plan([stt, coder], ["stt", "coder"], ("coder",), sleeping={"coder": asleep()})
    assert result.steps == ()
    (blocked,) = result.blocked
    assert blocked.serve == "coder"
    assert "committed 21000 (coder 1000 + stt 20000); free 9000; needs 15000; short 6000" in (
        blocked.reason
    )
    assert [(p.serve, p.mib, p.why) for p in blocked.protected] == [
        ("stt", 20_000, "resident: never evicted")
    ]


def test_a_sleeper_that_may_not_evict_is_not_its_own_blocker() -> None:
    """An evictable sleeper desired running may stop nothing to wake: every holder on
    its short role is protected with why, but not the sleeper, whose residual is the
    room its wake keeps (docs/eviction.md)."""
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    stt = sv("stt", 20_000, RES, RUN)
    _d, _o, result = plan([stt, coder], ["stt", "coder"], sleeping={"coder": asleep()})
    assert result.steps == ()
    (blocked,) = result.blocked
    assert blocked.serve == "coder"
    assert "it sleeps and cannot wake" in blocked.reason
    assert [(p.serve, p.mib, p.why) for p in blocked.protected] == [
        ("stt", 20_000, "only on-demand serves evict, and coder is evictable")
    ]


def test_a_sizing_sleeper_whose_health_still_says_starting_does_not_wait_for_itself() -> None:
    """Engines that size themselves from free memory start one at a time per GPU: a
    serve waits for another such engine still loading there, never for its own
    container. A requested vLLM sleeper whose healthcheck still says "starting" is
    woken, not blocked waiting for itself."""
    coder = sv("coder", 16_000, OND, sleep=sleep(), sizes_from_free=True)
    loading = sm.ContainerObs(sm.ContainerState.RUNNING, health="starting", started_at=0.0)
    desired = sm.DesiredState(
        ROLES, {s.name: s for s in (STT, coder)}, (sm.OnDemandRequest("coder", NOW - 1),), host=HOST
    )
    obs = sm.Observed(True, {"c-stt": UP, "c-coder": loading}, sleep={"coder": asleep()})
    result = plan_transitions(desired, obs, None, NOW)
    check_ledger(result)
    assert lines(result) == ["reserve_wake coder", "wake coder", "await_ready coder"]
    assert result.blocked == ()


def test_a_sleeper_that_cannot_wake_says_its_class() -> None:
    """Only on-demand serves evict: an evictable sleeper desired running without room
    to wake is blocked, its reason saying it sleeps and naming its class."""
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep())
    big = sv("big", 16_000, RES, RUN)
    _d, _o, result = plan([STT, coder, big], ["stt", "coder", "big"], sleeping={"coder": asleep()})
    (blocked,) = result.blocked
    assert blocked.reason.startswith(
        "coder does not fit (it sleeps and cannot wake: evictable serves do not evict; "
        "only on-demand serves do): "
    )


def test_a_sleeper_outside_the_ledger_wakes_outside_it() -> None:
    """A sleeper that declares a role without a capacity row is outside the ledger: its
    wake reserves nothing, even while its container's start record still counts it on
    a card the ledger knows (the record keeps counting until the container stops)."""
    coder = replace(sv("coder", 16_000, EVI, RUN, sleep=sleep()), gpu_roles=("x",))
    desired = sm.DesiredState(ROLES, {s.name: s for s in (STT, coder)}, (), host=HOST)
    obs = sm.Observed(
        True,
        {"c-stt": UP, "c-coder": UP},
        sleep={"coder": asleep()},
        started_with={"c-coder": sm.StartedWith("coder", ("a",), 16_000)},
    )
    result = plan_transitions(desired, obs, None, NOW)
    assert lines(result) == ["reserve_wake coder", "wake coder", "await_ready coder"]
    wake = result.steps[0]
    assert (wake.mib, wake.to_mib) == (None, None)
    assert wake.reason == "wake coder (outside the ledger); give back 20000 MiB of host RAM"
    assert result.ledger_after.holdings["coder"].mib == 16_000
    assert result.blocked == ()
