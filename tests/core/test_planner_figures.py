"""The planner's figures and skips at their edges (docs/eviction.md, docs/design.md §5):
what a wake's reservation step says, what a grow back takes below a larger start
record, which serves a grow back looks past, a serve outside the ledger among serves
inside it, every serve able to sleep, and the room a requester claims for later ones.

Written from the rules, each with the figures an operator reads in the plan; each plan
is replayed through the ledger (never over budget).
"""

from __future__ import annotations

from support.plan_cases import EVI, NOW, OND, RES, RUN, Case, req, serve, up
from support.plan_lines import ELASTIC, lines, plan_of, starts
from test_planner_sleep import STT, asleep, plan, sleep, sv

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Action
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import ledger_prefixes


def test_a_wake_back_to_exactly_its_residual_reserves_nothing_more_and_says_so() -> None:
    """An elastic serve shrunk to 1000 before it slept at a residual of 1000: awake it
    holds what it holds asleep; the wake reserves 0 MiB more, from its residual 1000
    back to 1000 (not "less than its residual": it is not below it)."""
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=500, segment_mib=512)
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(residual=1000), elastic=el)
    _d, _o, result = plan(
        [STT, coder], ["stt", "coder"], sleeping={"coder": asleep()}, elastic_mib={"coder": 1000}
    )
    wake = result.steps[0]
    assert (wake.action, wake.mib, wake.to_mib) == (Action.RESERVE_WAKE, 0, 1000)
    assert wake.reason == (
        "reserve 0 MiB more on a to wake coder (from its residual 1000 back to 1000)"
        "; give back 20000 MiB of host RAM"
    )


def test_a_wake_below_its_residual_says_by_how_much() -> None:
    """Shrunk to 800 before it slept at a residual of 1000: the wake says the engine
    holds 800 awake, 200 MiB less than its residual 1000."""
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=500, segment_mib=512)
    coder = sv("coder", 16_000, EVI, RUN, sleep=sleep(residual=1000), elastic=el)
    _d, _o, result = plan(
        [STT, coder], ["stt", "coder"], sleeping={"coder": asleep()}, elastic_mib={"coder": 800}
    )
    wake = result.steps[0]
    assert (wake.action, wake.mib, wake.to_mib) == (Action.RESERVE_WAKE, 0, 800)
    assert wake.reason == (
        "reserve 0 MiB more on a to wake coder: the 800 MiB its engine holds awake "
        "(elastic, shrunk before it slept), 200 MiB less than its residual 1000"
        "; give back 20000 MiB of host RAM"
    )


def test_a_sleeper_outside_the_ledger_is_woken_without_a_reservation() -> None:
    """A sleeping serve on a GPU role without a capacity row is outside the ledger: its
    wake reserves nothing (no MiB) and says so, then wakes and reloads it."""
    coder = serve("coder", 16_000, EVI, RUN, roles=("x",), sleep=sleep(residual=1000, level=2))
    desired = sm.DesiredState({"a": sm.GpuRole("a", 32_000, 2_000)}, {"coder": coder})
    observed = sm.Observed(True, {"c-coder": up()}, sleep={"coder": asleep(level=2)})
    result = plan_transitions(desired, observed, None, NOW)
    assert lines(result) == [
        "reserve_wake coder",
        "wake coder",
        "reload coder",
        "await_ready coder",
    ]
    wake = result.steps[0]
    assert (wake.mib, wake.to_mib) == (None, None)
    assert wake.reason == "wake coder (outside the ledger)"
    assert "coder" not in result.ledger_after.holdings


def test_a_grow_below_a_larger_start_record_stays_under_the_declared_figure() -> None:
    """Declared 10000, its container started with 12000 (which the ledger counts it
    at unshrunk), shrunk to 6000; 5000 free is less than the 6000 back to full, so
    the grow takes whole 1 MiB segments up to one below the declared 10000 (a grow to
    10000 or more is one back to full): 3999 MiB, to 9999."""
    moe = serve("moe", 10_000, EVI, RUN, elastic=sm.Elastic(ELASTIC, 1000, segment_mib=1))
    omni = serve("omni", 19_000, EVI, RUN)
    desired = sm.DesiredState(
        {"a": sm.GpuRole("a", 32_000, 2_000)}, {s.name: s for s in (moe, omni)}
    )
    observed = sm.Observed(
        True,
        {"c-moe": up(), "c-omni": up()},
        elastic_mib={"moe": 6000},
        started_with={"c-moe": sm.StartedWith("moe", ("a",), 12_000)},
    )
    result = plan_transitions(desired, observed, None, NOW)
    for step, ledger in ledger_prefixes(result):
        assert not hasattr(ledger, "kind"), f"{step}: {ledger}"
    (g,) = result.steps
    assert (g.action, g.mib, g.to_mib) == (Action.GROW, 3999, 9999)
    assert g.reason == "take back 3999 MiB (elastic) now that the room is free"
    assert result.ledger_after.committed_mib("a") == 28_999


def test_grow_back_looks_past_an_elastic_serve_that_sleeps_or_runs_outside_the_ledger() -> None:
    """Declared first: an elastic serve asleep, not wanted (nothing to grow) and one running on a
    role without a capacity row (nothing counted to grow); the third, shrunk to 14000
    of 20000 with the room free, is grown back to full."""
    el = sm.Elastic(ELASTIC, 1000)
    sleeper = serve("a-sleeper", 8000, EVI, None, elastic=el, sleep=sleep(residual=1000))
    outside = serve("b-outside", 8000, EVI, RUN, roles=("x",), elastic=el)
    moe = serve("c-moe", 20_000, EVI, RUN, elastic=el)
    desired = sm.DesiredState(
        {"a": sm.GpuRole("a", 32_000, 2_000)}, {s.name: s for s in (sleeper, outside, moe)}
    )
    running = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
    observed = sm.Observed(
        True,
        {f"c-{s.name}": running for s in (sleeper, outside, moe)},
        elastic_mib={"c-moe": 14_000},
        sleep={"a-sleeper": asleep()},
    )
    result = plan_transitions(desired, observed, None, NOW)
    assert lines(result) == ["grow c-moe"]
    (g,) = result.steps
    assert (g.mib, g.to_mib) == (6000, 20_000)


def test_a_victim_sleeps_when_every_serve_of_the_fleet_can_sleep() -> None:
    """Every serve declares ``[serve.sleep]``, the requester too: the victim is put to
    sleep (20000 held, residual 1000: it frees 19000, the 10000 short covered) rather
    than stopped."""
    v = sv("v", 20_000, EVI, RUN, sleep=sleep(residual=1000))
    q = sv("q", 20_000, OND, sleep=sleep(residual=1000))
    _d, _o, result = plan([v, q], ["v"], ("q",))
    assert lines(result) == ["sleep v", "release_to_residual v", *starts("q")]
    release = result.steps[1]
    assert (release.mib, release.to_mib, release.host_mib) == (19_000, 1000, 20_000)


def test_a_serve_outside_the_ledger_tried_first_leaves_its_role_in_the_ledger() -> None:
    """``web`` declares no vram_mib (outside the ledger) on role a and starts first (the
    higher priority); ``llm``, 10000 on the same role, still reserves its 10000."""
    case = Case(
        [serve("web", None, RES, RUN, priority=5), serve("llm", 10_000, RES, RUN, priority=1)],
        {},
        [],
    )
    plan_ = plan_of(case)
    assert lines(plan_) == ["start web", "await_ready web", *starts("llm")]
    assert plan_.steps[2].mib == 10_000
    assert plan_.ledger_after.holdings["llm"].mib == 10_000


def test_a_requester_claims_no_room_for_a_later_one_a_mib_beyond_its_candidates() -> None:
    """``od`` is 5000 short on role a; the candidates hold 15000 (``v1`` 5000, ``v2``
    10000). ``l1``, asked for next, needs 10001: 5000 + 10001 is one MiB beyond them, so
    no room is claimed for it; ``l2``, asked for last, needs 10000: 5000 + 10000 is
    exactly what they hold, so ``od`` evicts both at once and ``l2`` starts in the room
    left, while ``l1`` is blocked: nothing it may evict is left."""
    case = Case(
        [
            serve("od", 20_000, OND),
            serve("l1", 10_001, OND),
            serve("l2", 10_000, OND),
            serve("v1", 5_000, EVI, RUN),
            serve("v2", 10_000, EVI, RUN),
        ],
        {"v1": up(), "v2": up()},
        [],
        requests=[req("od", at=NOW - 30), req("l1", at=NOW - 20), req("l2", at=NOW - 10)],
    )
    plan_ = plan_of(case)
    assert [(f"{s.action} {s.serve}", s.group) for s in plan_.steps] == [
        ("stop v1", "od"),
        ("release v1", "od"),
        ("stop v2", "od"),
        ("release v2", "od"),
        *((line, "od") for line in starts("od")),
        *((line, "l2") for line in starts("l2")),
    ]
    (l1,) = plan_.blocked
    assert l1.serve == "l1"
    assert "committed 30000 (l2 10000 + od 20000); free 0; needs 10001; short 10001" in l1.reason
