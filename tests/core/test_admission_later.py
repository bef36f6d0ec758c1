"""``could_fit_later``: whether a request that does not fit now could, once what goes
away by itself has gone (the rule a queued ``up`` waits on; docs/operations.md, API).

Examples state each answer the docs promise; the properties check it is never wrong
in the direction that matters: a request that would fit once every serve that goes
away by itself has gone is never called impossible (it would be refused a place in
the queue, or dropped from it, while its room is coming). Its fleets place some serves
(``placement``): a placed serve runs on one of its candidates, so it could fit later once
it could on any one of them (docs/placement.md).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.plan_cases import EVI, OND, RES, RUN, Case, _build, req, serve, up
from support.strategies import NOW, fleets

from statemachine.answers.fit import fit_serve
from statemachine.domain import types as sm
from statemachine.planning.admission import could_fit_later, goes_away


def later(case: Case, name: str) -> str | None:
    desired, observed = _build(case)
    return could_fit_later(desired, observed, name, {r.serve: r for r in case.requests})


def test_room_held_by_another_request_comes_back() -> None:
    case = Case(
        [serve("hog", 20_000, OND), serve("q", 20_000, OND)],
        {"hog": up()},
        [],
        requests=[req("hog")],
    )
    assert later(case, "q") is None


def test_room_held_by_a_resident_never_comes_back() -> None:
    case = Case([serve("stt", 20_000, RES, RUN), serve("q", 20_000, OND)], {"stt": up()}, [])
    why = later(case, "q")
    assert why is not None and "can never fit on a" in why and "free 10000" in why


def test_an_on_demand_serve_running_without_a_request_stays() -> None:
    case = Case([serve("hog", 20_000, OND), serve("q", 20_000, OND)], {"hog": up()}, [])
    # hog's 20000 does not go away: only the 10000 free is counted, every term named
    assert later(case, "q") == (
        "q can never fit on a while the manifest stays as it is: budget 30000, free 10000, "
        "what goes away by itself (nothing) 0, what elastic serves could give back 0; "
        "needs 20000"
    )


def test_an_evictable_inside_its_min_runtime_goes_away_for_an_on_demand_requester() -> None:
    case = Case(
        [serve("emb", 20_000, EVI, RUN, min_runtime_s=600), serve("q", 20_000, OND)],
        {"emb": up(started=NOW - 10)},
        [],
    )
    assert later(case, "q") is None


def test_more_than_the_budget_never_fits() -> None:
    case = Case([serve("q", 40_000, OND)], {}, [])
    why = later(case, "q")
    assert why is not None and "budget 30000" in why


def test_a_port_held_by_a_resident_never_frees_one_held_by_a_request_does() -> None:
    stays = Case(
        [serve("stt", 1000, RES, RUN, port=9000), serve("q", 1000, OND, port=9000)],
        {"stt": up()},
        [],
    )
    why = later(stays, "q")
    assert why is not None and "holds port 9000" in why and "never goes away" in why
    frees = Case(
        [serve("hog", 1000, OND, port=9000), serve("q", 1000, OND, port=9000)],
        {"hog": up()},
        [],
        requests=[req("hog", ttl=60)],
    )
    assert later(frees, "q") is None


def _without_leavers(desired: sm.DesiredState, observed: sm.Observed, name: str) -> sm.Observed:
    """``observed`` once every serve that goes away for ``name`` has gone."""
    spec = desired.serves[name]
    requests = {r.serve: r for r in desired.requests}
    containers = dict(observed.containers)
    for other in desired.serves.values():
        if goes_away(other, spec, requests) and other.container in containers:
            containers[other.container] = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)
    return replace(observed, containers=containers)


@settings(max_examples=300, deadline=None)
@given(fleets(docker_ok=True, contended=True, placed=True), st.data())
def test_what_fits_once_the_leavers_are_gone_is_never_called_impossible(
    fleet: tuple[sm.DesiredState, sm.Observed], data: st.DataObject
) -> None:
    desired, observed = fleet
    idle = [
        s.name
        for s in desired.serves.values()
        if s.residency is sm.Residency.ON_DEMAND and not observed.container(s.container).holds
    ]
    if not idle:
        event("no idle on-demand serve to ask about")
        return
    name = data.draw(st.sampled_from(idle))
    requests = {r.serve: r for r in desired.requests}
    verdict = could_fit_later(desired, observed, name, requests)
    now_fits = fit_serve(desired, observed, name, now=NOW).fits
    after = _without_leavers(desired, observed, name)
    then_fits = fit_serve(desired, after, name, now=NOW).fits
    event(f"fits now: {now_fits}; once the leavers are gone: {then_fits}")
    event("called impossible" if verdict is not None else "not called impossible")
    if now_fits or then_fits:
        assert verdict is None, (name, verdict)


def test_a_sleeper_needs_only_what_its_wake_adds_to_its_residual() -> None:
    # its residual is already counted: asking for its whole reservation on top of it
    # called a wake that fits once the request's hog goes away impossible
    from statemachine.domain.types import (
        GpuRole,
        OnDemandRequest,
        Sleep,
        SleepObs,
        SleepState,
    )
    from statemachine.engines import (
        SleepProtocol,
    )

    od = sm.Residency.ON_DEMAND
    wall = sm.ServeSpec("wall", "c-wall", ("a",), 5000, sm.Residency.RESIDENT)
    hog = sm.ServeSpec("hog", "c-hog", ("a",), 3000, od)
    small = sm.ServeSpec(
        "small", "c-small", ("a",), 5000, od, sleep=Sleep(1, 1000, SleepProtocol.VLLM, 0)
    )
    desired = sm.DesiredState(
        {"a": GpuRole("a", 10_000, 0)},
        {s.name: s for s in (wall, hog, small)},
        (OnDemandRequest("hog", NOW - 5),),
    )
    running = sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", NOW - 600)
    observed = sm.Observed(
        True,
        {"c-wall": running, "c-hog": running, "c-small": running},
        sleep={"small": SleepObs(SleepState.ASLEEP, 1, 1000, 0)},
    )
    assert not fit_serve(desired, observed, "small", now=NOW).fits  # 1000 free, 4000 needed
    assert could_fit_later(desired, observed, "small", {"hog": object()}) is None
    # with the hog a resident, it never fits: 1000 free, nothing goes away
    stays = replace(hog, residency=sm.Residency.RESIDENT)
    never = replace(desired, serves={**desired.serves, "hog": stays})
    why = could_fit_later(never, observed, "small", {})
    assert why is not None and "needs 4000" in why, why


# -- a placed serve (docs/placement.md): it runs on one of its candidates ----------------

AB = {"a": (32_000, 2_000), "b": (32_000, 2_000)}


def _placed(
    name: str,
    mib: int,
    residency: sm.Residency | None,
    desired: sm.DesiredRun | None = None,
    *,
    cands: tuple[str, ...] = ("a", "b"),
    **kw: object,
) -> sm.ServeSpec:
    """A serve placed on ``cands`` (every candidate until it holds on one)."""
    return serve(name, mib, residency, desired, roles=cands, placement=cands, **kw)


def test_a_placed_serve_that_fits_on_one_candidate_is_not_called_impossible() -> None:
    # a resident walls a; b is empty: it fits now on b, and so later
    case = Case(
        [serve("wall", 20_000, RES, RUN, roles=("a",)), _placed("q", 20_000, OND)],
        {"wall": up()},
        [],
        roles=AB,
    )
    d, o = _build(case)
    assert fit_serve(d, o, "q", now=NOW).fits
    assert later(case, "q") is None


def test_a_placed_serve_waits_for_the_candidate_whose_holder_goes_away() -> None:
    # a resident walls a for good; on b a requested hog goes away when its request ends
    hog = serve("hog", 20_000, OND, roles=("b",))
    case = Case(
        [serve("wall", 20_000, RES, RUN, roles=("a",)), hog, _placed("q", 20_000, OND)],
        {"wall": up(), "hog": up()},
        [],
        requests=[req("hog")],
        roles=AB,
    )
    assert later(case, "q") is None
    # with the hog a resident nothing goes away on either card: every candidate named
    stays = Case(
        [
            serve("wall", 20_000, RES, RUN, roles=("a",)),
            replace(hog, residency=RES),
            case.serves[2],
        ],
        {"wall": up(), "hog": up()},
        [],
        roles=AB,
    )
    assert later(stays, "q") == (
        "q can run on none of its candidates (a, b) once what goes away by itself has gone. "
        "On a: q can never fit on a while the manifest stays as it is: budget 30000, "
        "free 10000, what goes away by itself (nothing) 0, what elastic serves could give "
        "back 0; needs 20000. "
        "On b: q can never fit on b while the manifest stays as it is: budget 30000, "
        "free 10000, what goes away by itself (nothing) 0, what elastic serves could give "
        "back 0; needs 20000."
    )


def test_a_placed_sleeper_is_woken_where_it_sleeps() -> None:
    # asleep on a at 1000 of 5000, a resident takes the rest of a; b is empty, but the
    # sleeper stays where it holds (docs/placement.md, the rule, 1): its wake never fits
    from statemachine.domain.types import (
        Sleep,
        SleepObs,
        SleepState,
        StartedWith,
    )
    from statemachine.engines import (
        SleepProtocol,
    )

    small = _placed("small", 5000, OND, sleep=Sleep(1, 1000, SleepProtocol.VLLM, 0))
    wall = serve("wall", 28_000, RES, RUN, roles=("a",))
    d, o = _build(Case([wall, small], {"wall": up(), "small": up()}, [], roles=AB))
    o = replace(
        o,
        sleep={"small": SleepObs(SleepState.ASLEEP, 1, 1000, 0)},
        started_with={"c-small": StartedWith("small", ("a",), 5000)},
    )
    why = could_fit_later(d, o, "small", {})
    assert why is not None and why.startswith("small can never fit on a") and "needs 4000" in why


def test_a_placed_serve_running_on_a_known_card_conflicts_there_only() -> None:
    # q needs a and b to itself; the placed resident runs on c (its record and its
    # environment say so), not on b: it is in nobody's way
    from statemachine.domain.types import StartedWith

    roles = {**AB, "c": (32_000, 2_000)}
    stt = _placed("stt", 10_000, RES, RUN, cands=("b", "c"))
    q = serve("q", 20_000, OND, roles=("a", "b"), exclusive=True)
    on_c = sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", 0.0, gpu_role="c")
    d, o = _build(Case([stt, q], {"stt": on_c}, [], roles=roles))
    known = replace(o, started_with={"c-stt": StartedWith("stt", ("c",), 10_000)})
    assert fit_serve(d, known, "q", now=NOW).fits
    assert could_fit_later(d, known, "q", {}) is None
    # its card unknown (no start record), it is counted on every candidate: b included
    assert could_fit_later(d, o, "q", {}) == (
        "q cannot run while stt runs (q needs a, b to itself), and stt never goes away by itself"
    )
