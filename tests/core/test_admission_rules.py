"""The admission rules an on-demand request meets (``statemachine.planning.admission``).

Each test states an answer an operator relies on: who may be requested and the exact
words of a refusal (the API's 404/409), when a protected serve frees up (the API's
``Retry-After``), what goes away by itself, why a queued request can never fit (every
term of its arithmetic named) and which router tiers a request drains. Pure: built
from hand-made fleets, no controller.
"""

from __future__ import annotations

import pytest
from support.plan_cases import EVI, NOW, OND, RES, RUN, STOP, Case, _build, req, serve, up

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.planning.admission import (
    RouterNeed,
    can_request,
    could_fit_later,
    down_needs_router,
    end_needs_router,
    frees_up_in,
    goes_away,
    router_needs,
    start_router_needs,
)
from statemachine.planning.plan_types import Action, Step

# -- can_request: who may be requested --------------------------------------------------


def _fleet(*serves: sm.ServeSpec) -> sm.DesiredState:
    return sm.DesiredState({"a": sm.GpuRole("a", 32_000, 2_000)}, {s.name: s for s in serves})


def test_an_unknown_serve_cannot_be_requested() -> None:
    assert can_request(_fleet(serve("q", 1000, OND)), "nope") == "no serve named 'nope'"


def test_a_serve_desired_stopped_cannot_be_requested() -> None:
    for residency in (RES, EVI, OND):
        desired = _fleet(serve("q", 1000, residency, STOP))
        assert can_request(desired, "q") == 'q is desired = "stopped" in the manifest'


def test_a_resident_desired_running_is_refused_with_the_exact_reason() -> None:
    desired = _fleet(serve("stt", 1000, RES, RUN))
    assert can_request(desired, "stt") == (
        "stt is resident and desired running: the loop runs it already"
    )


@pytest.mark.parametrize(
    "spec",
    [
        serve("q", 1000, OND),  # on demand, no desired: the usual requestable serve
        serve("q", 1000, OND, RUN),  # on demand kept running: a request is harmless
        serve("q", 1000, EVI, RUN),  # evictable running: may be (re)requested
        serve("q", 1000, RES),  # resident the loop does not run: a request runs it
        serve("q", 1000, None, RUN),  # no residency class
    ],
    ids=["on-demand", "on-demand-running", "evictable-running", "resident-unmanaged", "none"],
)
def test_every_other_serve_may_be_requested(spec: sm.ServeSpec) -> None:
    assert can_request(_fleet(spec), "q") is None


# -- frees_up_in: the Retry-After of a protected serve ----------------------------------


def _frees(
    spec: sm.ServeSpec,
    requester: sm.ServeSpec,
    running: dict[str, sm.ContainerObs],
    requests: dict[str, sm.OnDemandRequest] | None = None,
    default: float = 30.0,
) -> float | None:
    observed = sm.Observed(True, {f"c-{n}": obs for n, obs in running.items()})
    return frees_up_in(spec, requester, observed, requests or {}, NOW, default)


def test_an_evictable_inside_its_min_runtime_frees_when_it_ends() -> None:
    emb = serve("emb", 1000, EVI, RUN, min_runtime_s=600)
    # started 10 s ago, protected for 600: free in 590 s
    assert _frees(emb, serve("q", 1000, OND), {"emb": up(started=NOW - 10)}) == 590.0


def test_an_evictable_frees_only_for_an_on_demand_requester() -> None:
    emb = serve("emb", 1000, EVI, RUN, min_runtime_s=600)
    assert _frees(emb, serve("r", 1000, RES, RUN), {"emb": up(started=NOW - 10)}) is None


def test_an_evictable_past_its_min_runtime_is_not_protected() -> None:
    emb = serve("emb", 1000, EVI, RUN, min_runtime_s=600)
    assert _frees(emb, serve("q", 1000, OND), {"emb": up(started=NOW - 900)}) is None


def test_a_request_frees_its_serve_when_its_ttl_ends() -> None:
    hog = serve("hog", 1000, OND)
    running = {"hog": up(started=NOW - 1)}
    assert _frees(hog, serve("q", 1000, OND), running, {"hog": req("hog", ttl=60)}) == 59.0


def test_an_expired_request_frees_now_never_in_the_past() -> None:
    hog = serve("hog", 1000, OND)
    running = {"hog": up(started=NOW - 100)}
    expired = {"hog": req("hog", ttl=10, at=NOW - 100)}
    assert _frees(hog, serve("q", 1000, OND), running, expired) == 0.0


def test_a_request_without_an_end_frees_after_the_default() -> None:
    hog = serve("hog", 1000, OND)
    running = {"hog": up(started=NOW - 1)}
    forever = {"hog": req("hog")}  # no TTL, no idle TTL: no end known
    assert _frees(hog, serve("q", 1000, OND), running, forever, default=42.0) == 42.0


def test_an_on_demand_serve_without_a_request_never_frees() -> None:
    hog = serve("hog", 1000, OND)
    assert _frees(hog, serve("q", 1000, OND), {"hog": up(started=NOW - 1)}) is None


def test_an_on_demand_serve_the_manifest_keeps_running_never_frees() -> None:
    hog = serve("hog", 1000, OND, RUN)
    running = {"hog": up(started=NOW - 1)}
    assert _frees(hog, serve("q", 1000, OND), running, {"hog": req("hog", ttl=60)}) is None


def test_a_request_frees_its_serve_when_it_ends_whatever_its_min_runtime() -> None:
    """An evictable serve running for a request frees when the request ends, even inside
    its ``min_runtime_s``: that protects it from eviction, not from its own request's
    end (the loop stops it then); without a request it frees when the min_runtime ends."""
    hog = serve("hog", 1000, EVI, min_runtime_s=600)
    running = {"hog": up(started=NOW - 10)}  # 590 s of its min_runtime_s left
    assert _frees(hog, serve("q", 1000, OND), running, {"hog": req("hog", ttl=60)}) == 59.0
    assert _frees(hog, serve("q", 1000, OND), running, {"hog": req("hog", ttl=900)}) == 590.0
    assert _frees(hog, serve("q", 1000, OND), running, {}) == 590.0
    # an on-demand serve's min_runtime_s protects nothing: it frees when its request ends
    od = serve("od", 1000, OND, min_runtime_s=600)
    assert (
        _frees(od, serve("q", 1000, OND), {"od": up(started=NOW - 10)}, {"od": req("od", ttl=900)})
        == 899.0
    )


def test_a_requested_unmanaged_resident_frees_when_its_request_ends() -> None:
    """A serve of any residency the manifest does not keep running, running for a
    request, frees when the request ends: the loop stops it then."""
    r = serve("r", 1000, RES)
    running = {"r": up(started=NOW - 1)}
    assert _frees(r, serve("q", 1000, OND), running, {"r": req("r", ttl=60)}) == 59.0


# -- goes_away ---------------------------------------------------------------------------


def test_a_holder_no_manifest_declares_never_goes_away() -> None:
    assert goes_away(None, serve("q", 1000, OND), {}) is False


def test_the_requester_never_goes_away_for_itself() -> None:
    for q in (serve("q", 1000, OND), serve("q", 1000, EVI, RUN)):
        assert goes_away(q, serve("q", 1000, OND), {"q": req("q")}) is False


def test_an_on_demand_serve_the_manifest_keeps_running_never_goes_away() -> None:
    """A recorded request of a serve desired running does not make it go away: when the
    request ends the manifest still keeps it running."""
    hog = serve("hog", 1000, OND, RUN)
    assert goes_away(hog, serve("q", 1000, OND), {"hog": req("hog", ttl=60)}) is False
    assert goes_away(serve("hog", 1000, OND), serve("q", 1000, OND), {"hog": req("hog")})


def test_a_requested_unmanaged_resident_goes_away_when_its_request_ends() -> None:
    """A serve of any residency the manifest does not keep running, running for a
    request, goes away when the request ends (the loop stops it): a request that fits
    once it has gone could fit later."""
    r = serve("r", 20_000, RES)
    assert goes_away(r, serve("q", 20_000, OND), {"r": req("r", ttl=60)}) is True
    case = Case([r, serve("q", 20_000, OND)], {"r": up()}, [], requests=[req("r", ttl=60)])
    assert later(case, "q") is None


def test_a_requested_evictable_goes_away_for_a_requester_that_cannot_evict() -> None:
    """An evictable serve running for a request goes away when the request ends, also
    for a resident requester (which evicts nothing): the request is queued, not refused;
    without the request it stays."""
    e, q = serve("e", 20_000, EVI), serve("q", 20_000, RES)
    assert goes_away(e, q, {"e": req("e", ttl=60)}) is True
    assert goes_away(e, q, {}) is False
    case = Case([e, q], {"e": up()}, [], requests=[req("e", ttl=60)])
    assert later(case, "q") is None
    assert later(Case([e, q], {"e": up()}, []), "q") is not None


# -- could_fit_later ---------------------------------------------------------------------


def later(case: Case, name: str) -> str | None:
    desired, observed = _build(case)
    return could_fit_later(desired, observed, name, {r.serve: r for r in case.requests})


def test_nothing_can_be_said_while_docker_is_unreadable() -> None:
    case = Case([serve("q", 40_000, OND)], {}, [], docker_ok=False)
    assert later(case, "q") is None
    # not even of a conflict with a start the controller has in progress
    stt, q = serve("stt", 1000, RES, RUN, port=9000), serve("q", 1000, OND, port=9000)
    desired = _fleet(stt, q)
    observed = sm.Observed(False, starting={"stt": sm.StartingObs(("a",), 1000)})
    assert could_fit_later(desired, observed, "q", {}) is None


def test_every_running_conflict_is_checked_whatever_the_manifest_order() -> None:
    # the requester comes first in the manifest: the serves after it are still checked
    case = Case(
        [serve("q", 1000, OND, port=9000), serve("stt", 1000, RES, RUN, port=9000)],
        {"stt": up()},
        [],
    )
    assert later(case, "q") == (
        "q cannot run while stt runs (holds port 9000), and stt never goes away by itself"
    )


def test_a_conflict_names_the_requesters_own_rule_first() -> None:
    case = Case(
        [serve("stt", 1000, RES, RUN), serve("q", 1000, OND, exclusive=True)],
        {"stt": up()},
        [],
    )
    assert later(case, "q") == (
        "q cannot run while stt runs (q needs a to itself), and stt never goes away by itself"
    )


def test_a_start_in_progress_that_conflicts_and_stays_is_named() -> None:
    """A serve whose start the controller has in progress runs for this rule, before its
    container holds anything: a resident starting on the requester's port never goes."""
    stt, q = serve("stt", 1000, RES, RUN, port=9000), serve("q", 1000, OND, port=9000)
    observed = sm.Observed(True, starting={"stt": sm.StartingObs(("a",), 1000)})
    assert could_fit_later(_fleet(stt, q), observed, "q", {}) == (
        "q cannot run while stt runs (holds port 9000), and stt never goes away by itself"
    )


def test_a_sleeper_never_conflicts_with_itself() -> None:
    """A sleeping serve asked about its own wake is not in its own way (it holds its own
    port): only what its wake adds to its residual is asked for."""
    wall = sm.ServeSpec("wall", "c-wall", ("a",), 5000, RES, RUN)
    small = sm.ServeSpec(
        "small",
        "c-small",
        ("a",),
        5000,
        OND,
        port=8000,
        sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM),
    )
    desired = sm.DesiredState({"a": sm.GpuRole("a", 10_000, 0)}, {"wall": wall, "small": small})
    running = sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", NOW - 600)
    observed = sm.Observed(
        True,
        {"c-wall": running, "c-small": running},
        sleep={"small": sm.SleepObs(sm.SleepState.ASLEEP, 1, 1000, 0)},
    )
    # 10000 - wall 5000 - its residual 1000 = 4000 free: its wake's 4000 fits
    assert could_fit_later(desired, observed, "small", {}) is None


def test_a_holder_no_manifest_declares_stays_and_gives_nothing_back() -> None:
    """A holder the manifest does not declare (a start in progress of a serve no longer
    declared) never goes away and gives nothing back: its MiB stay counted."""
    observed = sm.Observed(True, starting={"ghost": sm.StartingObs(("a",), 20_000)})
    assert could_fit_later(_fleet(serve("q", 20_000, OND)), observed, "q", {}) == (
        "q can never fit on a while the manifest stays as it is: budget 30000, free 10000, "
        "what goes away by itself (nothing) 0, what elastic serves could give back 0; "
        "needs 20000"
    )


def test_an_elastic_serve_that_goes_away_is_counted_once_and_named() -> None:
    """An elastic serve that goes away by itself frees all it holds, counted once: not
    again as what it could give back. The refusal names what goes away."""
    emb = serve("emb", 20_000, EVI, RUN, elastic=sm.Elastic("http://emb", floor_mib=2000))
    case = Case(
        [serve("wall", 5000, RES, RUN), emb, serve("q", 28_000, OND)],
        {"wall": up(), "emb": up()},
        [],
    )
    # 5000 free + emb's 20000 = 25000 < 28000 (not + the 18000 above its floor)
    assert later(case, "q") == (
        "q can never fit on a while the manifest stays as it is: budget 30000, free 5000, "
        "what goes away by itself (emb) 20000, what elastic serves could give back 0; "
        "needs 28000"
    )


def test_a_serve_on_a_role_without_a_capacity_row_is_not_counted() -> None:
    case = Case([serve("q", 99_000, OND, roles=("gone",))], {}, [])
    assert later(case, "q") is None


def test_a_serve_that_holds_its_reservation_already_needs_nothing_more() -> None:
    # the role is over its budget (30000) by what was observed: q's own 20000 is in it
    case = Case(
        [serve("stt", 20_000, RES, RUN), serve("q", 20_000, OND)],
        {"stt": up(), "q": up()},
        [],
    )
    assert later(case, "q") is None


def _sleeper_fleet(vram_mib: int) -> tuple[sm.DesiredState, sm.Observed]:
    wall = sm.ServeSpec("wall", "c-wall", ("a",), 9000, RES, RUN)
    small = sm.ServeSpec(
        "small", "c-small", ("a",), vram_mib, OND, sleep=sm.Sleep(1, 1000, SleepProtocol.VLLM)
    )
    desired = sm.DesiredState({"a": sm.GpuRole("a", 10_000, 0)}, {"wall": wall, "small": small})
    running = sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", NOW - 600)
    observed = sm.Observed(
        True,
        {"c-wall": running, "c-small": running},
        sleep={"small": sm.SleepObs(sm.SleepState.ASLEEP, 1, 1000, 0)},
    )
    return desired, observed


def test_a_sleepers_wake_one_mib_short_never_fits() -> None:
    desired, observed = _sleeper_fleet(1001)  # asleep at 1000 of 1001; nothing free
    assert could_fit_later(desired, observed, "small", {}) == (
        "small can never fit on a while the manifest stays as it is: budget 10000, "
        "free 0, what goes away by itself (nothing) 0, what elastic serves could give "
        "back 0; needs 1"
    )


def test_every_role_of_a_serve_is_checked() -> None:
    case = Case(
        [serve("wall", 20_000, RES, RUN, roles=("b",)), serve("q", 20_000, OND, roles=("a", "b"))],
        {"wall": up()},
        [],
        roles={"a": (32_000, 2_000), "b": (32_000, 2_000)},
    )
    why = later(case, "q")
    assert why is not None and why.startswith("q can never fit on b "), why


def _elastic_fleet(shrunk_to: int, needs: int) -> Case:
    moe = serve("moe", 20_000, RES, RUN, elastic=sm.Elastic("http://moe", floor_mib=8000))
    return Case(
        [moe, serve("wall", 10_000, RES, RUN), serve("q", needs, OND)],
        {"moe": up(), "wall": up()},
        [],
        elastic_mib={"moe": shrunk_to},
    )


def _never(free: int, give: int, needs: int) -> str:
    return (
        f"q can never fit on a while the manifest stays as it is: budget 30000, free {free}, "
        f"what goes away by itself (nothing) 0, what elastic serves could give back {give}; "
        f"needs {needs}"
    )


def test_an_elastic_serve_could_give_back_down_to_its_floor() -> None:
    # budget 30000: moe shrunk to 12000 (floor 8000) and wall 10000 leave 8000 free;
    # moe could give 4000 more
    assert later(_elastic_fleet(12_000, 12_000), "q") is None
    assert later(_elastic_fleet(12_000, 13_000), "q") == _never(8000, 4000, 13_000)


def test_an_elastic_serve_at_its_floor_gives_back_nothing() -> None:
    assert later(_elastic_fleet(8000, 13_000), "q") == _never(12_000, 0, 13_000)


def test_an_elastic_serve_below_its_floor_gives_back_nothing_not_a_debt() -> None:
    assert later(_elastic_fleet(7000, 14_000), "q") == _never(13_000, 0, 14_000)


# -- router needs ------------------------------------------------------------------------


def _obs(running: dict[str, sm.ContainerObs], **kw: object) -> sm.Observed:
    return sm.Observed(True, {f"c-{n}": o for n, o in running.items()}, **kw)  # type: ignore[arg-type]


TIERED = serve("llm", 1000, OND, router_tier="llm-local")


def test_the_end_of_a_request_drains_the_tier_of_what_it_stops() -> None:
    need = RouterNeed("llm", "llm-local", "stopped when its request ends")
    assert end_needs_router(TIERED, _obs({}), requested=False) == need
    assert end_needs_router(TIERED, _obs({"llm": up()}), requested=True) == need
    # docker unread: it may run, so its end may stop it
    assert end_needs_router(TIERED, sm.Observed(False), requested=False) == need


def test_the_end_of_a_request_drains_nothing_the_manifest_keeps_or_that_runs_without_one() -> None:
    kept = serve("llm", 1000, OND, RUN, router_tier="llm-local")
    assert end_needs_router(kept, _obs({}), requested=True) is None
    # runs without a recorded request: no request's end stops it
    assert end_needs_router(TIERED, _obs({"llm": up()}), requested=False) is None


def test_the_end_of_a_sleeping_serves_request_drains_nothing() -> None:
    """Asleep, its tier is quiesced already: its request's end drains nothing."""
    asleep = _obs({"llm": up()}, sleep={"llm": sm.SleepObs(sm.SleepState.ASLEEP, 1, 1000, 0)})
    assert end_needs_router(TIERED, asleep, requested=True) is None


def test_docker_unread_a_listed_container_is_not_trusted_to_run_without_a_request() -> None:
    """Docker unread, a container the snapshot still lists as running may not be the
    one running: the end of a request may stop the serve, so its tier is a need."""
    need = RouterNeed("llm", "llm-local", "stopped when its request ends")
    unread = sm.Observed(False, {"c-llm": up()})
    assert end_needs_router(TIERED, unread, requested=False) == need


def _steps(*pairs: tuple[Action, str]) -> list[Step]:
    return [Step(action, name, ("a",), None, "") for action, name in pairs]


def test_a_request_drains_its_victims_tiers_stopped_or_put_to_sleep() -> None:
    desired = sm.DesiredState(
        {"a": sm.GpuRole("a", 32_000, 2_000)},
        {
            s.name: s
            for s in (
                serve("omni", 1000, EVI, RUN, router_tier="omni-local"),
                serve("emb", 1000, EVI, RUN, router_tier="emb-local"),
                serve("q", 1000, OND, RUN),
            )
        },
    )
    steps = _steps(
        (Action.QUIESCE, "omni"),
        (Action.DRAIN, "omni"),
        (Action.STOP, "omni"),
        (Action.DRAIN, "emb"),
        (Action.SLEEP, "emb"),
    )
    assert router_needs(desired, _obs({}), "q", steps) == (
        RouterNeed("omni", "omni-local", "stopped to make room for q"),
        RouterNeed("emb", "emb-local", "put to sleep to make room for q"),
    )


def test_a_drained_name_the_manifest_no_longer_declares_needs_no_tier() -> None:
    desired = _fleet(serve("q", 1000, OND, RUN))
    assert start_router_needs(desired, _obs({}), "q", ["ghost"], set()) == ()


def test_the_end_is_a_need_only_for_the_serve_whose_request_is_recorded() -> None:
    other = serve("other", 1000, OND)
    roles = {"a": sm.GpuRole("a", 32_000, 2_000)}
    serves = {"llm": TIERED, "other": other}
    running = _obs({"llm": up()})
    end = RouterNeed("llm", "llm-local", "stopped when its request ends")
    mine = sm.DesiredState(roles, serves, (req("llm"),))
    assert start_router_needs(mine, running, "llm", [], set()) == (end,)
    theirs = sm.DesiredState(roles, serves, (req("other"),))
    assert start_router_needs(theirs, running, "llm", [], set()) == ()


def test_down_drains_only_what_runs_starts_or_may_run() -> None:
    need = RouterNeed("llm", "llm-local", "stopped when its request ends")
    assert down_needs_router(TIERED, _obs({})) is None
    assert down_needs_router(TIERED, _obs({"llm": up()})) == need
    assert (
        down_needs_router(TIERED, _obs({}, starting={"llm": sm.StartingObs(("a",), 1000)})) == need
    )
    assert down_needs_router(TIERED, sm.Observed(False)) == need


def _two_cards(*serves: sm.ServeSpec) -> sm.DesiredState:
    return sm.DesiredState(
        {r: sm.GpuRole(r, 10_000) for r in ("g0", "g1")}, {s.name: s for s in serves}
    )


def test_a_serve_re_pinned_off_the_card_it_runs_on_conflicts_where_it_is_declared() -> None:
    """An edit re-pinned the exclusive resident x from g0 to g1: it still runs (and is
    counted) on g0, and the loop moves it (stopped there, started on g1). A request on
    g0 can therefore fit later: x is judged where it is declared, not where it holds."""
    x = sm.ServeSpec("x", "c-x", ("g1",), 5000, RES, desired=RUN, exclusive=True)
    q = sm.ServeSpec("q", "c-q", ("g0",), 1000, OND)
    observed = sm.Observed(
        True,
        {"c-x": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0, gpu_role="g0")},
        started_with={"c-x": sm.StartedWith("x", ("g0",), 5000)},
    )
    assert could_fit_later(_two_cards(x, q), observed, "q", {}) is None


def test_a_placed_serve_with_one_candidate_is_judged_as_a_pinned_one() -> None:
    """Placed on its one candidate (g0, which a resident fills), a serve that can never
    fit gets the pinned serve's reason, without a list of candidates."""
    r = sm.ServeSpec("r", "c-r", ("g0",), 10_000, RES, desired=RUN)
    p = sm.ServeSpec("p", "c-p", ("g0",), 1000, OND, placement=("g0",))
    observed = sm.Observed(
        True, {"c-r": sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0)}
    )
    never = could_fit_later(_two_cards(r, p), observed, "p", {})
    assert never is not None and never.startswith("p can never fit on g0 while"), never
    assert "candidates" not in never
