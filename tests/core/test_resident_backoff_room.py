"""A resident in a failure backoff keeps its room (docs/eviction.md).

A resident killed twice is held back for a while (its backoff). An evictable that wants
the same card must not take its room meanwhile: a resident may stop nothing, so it would
stay blocked for as long as the evictable ran.
"""

from __future__ import annotations

from dataclasses import replace

from support.placement_cases import NOW, host, pinned

from statemachine.answers.fit import fit_serve, fit_serve_by_planner
from statemachine.domain.types import DesiredRun, Observed, OnDemandRequest, Residency
from statemachine.planning.plan_types import Action, Policy
from statemachine.planning.planner import plan_transitions

X = pinned("x", 6000, "a", residency=Residency.RESIDENT)
E = pinned("e", 6000, "a")  # evictable, desired running
HELD = Policy(hold={"x": "backing off after 2 failures, until 12:00:10"})


def test_an_evictable_does_not_take_the_room_of_a_resident_held_back() -> None:
    p = plan_transitions(host(X, E), Observed(True), HELD, NOW)
    assert not [s for s in p.steps if s.action is Action.START]
    why = {b.serve: b.reason for b in p.blocked}
    assert "its room (6000 MiB on a) is kept for it" in why["x"]
    assert "x" in why["e"], why
    assert "x" not in p.ledger_after.holdings  # kept while planning, held by nothing


def test_once_its_backoff_ends_the_resident_starts_in_its_room() -> None:
    p = plan_transitions(host(X, E), Observed(True), Policy(), NOW)
    assert [s.serve for s in p.steps if s.action is Action.START] == ["x"]


def test_room_that_is_not_free_is_not_kept() -> None:
    big = pinned("big", 9000, "a", residency=Residency.RESIDENT)
    p = plan_transitions(host(big, X, E), Observed(True), HELD, NOW)
    assert [s.serve for s in p.steps if s.action is Action.START] == ["big"]
    assert "kept" not in {b.serve: b.reason for b in p.blocked}["x"]


def test_a_serve_refused_for_the_kept_room_names_the_resident_as_kept() -> None:
    y = pinned("y", 6000, "a", residency=Residency.ON_DEMAND, desired=DesiredRun.RUNNING)
    p = plan_transitions(host(X, y), Observed(True), HELD, NOW)
    (refused,) = [b for b in p.blocked if b.serve == "y"]
    assert [(r.serve, r.why) for r in refused.protected] == [
        ("x", "resident, held back: its room is kept for it")
    ]


def test_fit_and_up_refuse_a_request_the_loop_blocks_for_the_kept_room() -> None:
    # the request's answer is asked in isolation (every other serve unmanaged), but the
    # kept room is the loop's: an answer that admitted the request would promise room
    # the loop's next plan refuses it
    r = pinned("r", 6000, "a", residency=Residency.ON_DEMAND)
    desired = host(X, r)
    loop = plan_transitions(
        replace(desired, requests=(OnDemandRequest("r", NOW),)), Observed(True), HELD, NOW
    )
    assert not [s for s in loop.steps if s.action is Action.START]
    for ask in (fit_serve, fit_serve_by_planner):  # the shortcut and the planner agree
        answer = ask(desired, Observed(True), "r", policy=HELD, now=NOW)
        assert not answer.fits, answer
        assert answer.blockers == ("x",), answer
    # without the hold there is no kept room: the request fits
    assert fit_serve(desired, Observed(True), "r", policy=Policy(), now=NOW).fits


def test_a_request_beside_a_kept_room_that_leaves_it_free_still_fits() -> None:
    small = pinned("small", 4000, "a", residency=Residency.ON_DEMAND)
    for ask in (fit_serve, fit_serve_by_planner):
        answer = ask(host(X, small), Observed(True), "small", policy=HELD, now=NOW)
        assert answer.fits, answer
