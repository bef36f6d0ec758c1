"""Rules of placement the other placement tests left unpinned (statemachine/planning/placement.py,
docs/placement.md), pure.

Two cards, ``a`` (budget 10000 MiB) and ``b`` (budget 6000), as in
``tests/core/test_placement.py``.
"""

from __future__ import annotations

import pytest
from support.core import spec

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Action, How, Plan, Policy
from statemachine.planning.planner import plan_transitions

NOW = 1_000_000.0
ROLES = {"a": sm.GpuRole("a", 10000), "b": sm.GpuRole("b", 6000)}
EXITED = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)


def placed(name: str, mib: int, desired: sm.DesiredRun) -> sm.ServeSpec:
    """An evictable serve placed on ``a`` or ``b``."""
    ab = ("a", "b")
    return spec(name, mib, sm.Residency.EVICTABLE, roles=ab, desired=desired, placement=ab)


def plan(desired: sm.DesiredState, observed: sm.Observed) -> Plan:
    return plan_transitions(desired, observed, Policy(), NOW)


def reserved_on(p: Plan, serve: str) -> list[tuple[str, ...]]:
    return [s.gpu_roles for s in p.steps if s.action is Action.RESERVE and s.serve == serve]


# ── 1. a serve whose memory is not back still holds its card ─────────────────────────


def _unreleased_x(record: bool) -> tuple[sm.DesiredState, sm.Observed]:
    """``x`` (5000, placed) was stopped on ``b`` and its memory is not back yet
    (``observed.unreleased``): 1000 of ``b``'s 6000 are free. ``y`` (6000, placed)
    wants to run. ``record``: whether the journal's start record says ``x`` was on
    ``b`` (else where is unknown). ``x`` is declared first: placed first."""
    desired = sm.DesiredState(
        ROLES,
        {
            "x": placed("x", 5000, sm.DesiredRun.STOPPED),
            "y": placed("y", 6000, sm.DesiredRun.RUNNING),
        },
    )
    started_with = {"c-x": sm.StartedWith("x", ("b",), 5000)} if record else {}
    observed = sm.Observed(
        True, {"c-x": EXITED}, unreleased=frozenset({"x"}), started_with=started_with
    )
    return desired, observed


def test_a_serve_whose_memory_is_not_back_stays_on_the_card_it_holds() -> None:
    """Rule (docs/placement.md, the rule, 1): a serve whose memory is not back yet holds
    memory: it stays on the card its start record names, and a serve placed after it
    goes where there is room (``a``), not onto the 1000 MiB ``b`` has left."""
    desired, observed = _unreleased_x(record=True)
    p = plan(desired, observed)
    assert [(d.serve, d.role, d.how) for d in p.placements] == [
        ("x", "b", How.HELD),
        ("y", "a", How.FITS),
    ]
    assert reserved_on(p, "y") == [("a",)]
    assert p.ledger_after.holdings["x"].gpu_roles == ("b",)


@pytest.mark.parametrize("record", [True, False], ids=["start-record", "no-record"])
def test_no_serve_is_started_on_a_card_that_still_holds_unreleased_memory(record: bool) -> None:
    """Rule: placement never starts a serve on a card whose free memory, counting the
    memory a stopped serve has not given back, is short of it. ``b`` still holds 5000
    of ``x``'s; ``y`` (6000) must not be reserved there (the overcommit of the card
    that still holds it). Without the start record ``x`` is counted on every candidate
    (``unknown``) and ``y`` starts nowhere this plan."""
    desired, observed = _unreleased_x(record)
    p = plan(desired, observed)
    decisions = {d.serve: (d.role, d.how) for d in p.placements}
    assert decisions["x"] == (("b", How.HELD) if record else (None, How.UNKNOWN))
    assert ("b",) not in reserved_on(p, "y")
    # what the card holds in truth (x's 5000) plus what the plan reserves fits its budget
    reserved_b = sum(
        s.mib or 0 for s in p.steps if s.action is Action.RESERVE and s.gpu_roles == ("b",)
    )
    assert 5000 + reserved_b <= ROLES["b"].budget_mib
    if not record:
        assert [b.serve for b in p.blocked] == ["y"]
        assert reserved_on(p, "y") == []


# ── 2. the victims each card's plan makes, as the choice weighs and shows them ─────────


def test_each_cards_victims_are_weighed_and_shown_with_what_they_free_counted_once() -> None:
    """Rule (docs/placement.md, the rule, 3): where no card has room, each candidate is
    shown with the serves its plan stops for the serve placed and the MiB that frees:
    a victim's stop and the release of its memory free its reservation once. Then the
    victim order chooses: ``a1`` (possibly busy) on ``a`` or ``b1`` (idle) on ``b``,
    each 4000 of a 10000 card, for ``p`` (8000, on-demand): ``b``, though ``a`` is
    declared first."""
    roles = {"a": sm.GpuRole("a", 10000), "b": sm.GpuRole("b", 10000)}

    def pinned(name: str, role: str) -> sm.ServeSpec:
        return sm.ServeSpec(
            name, f"c-{name}", gpu_roles=(role,), vram_mib=4000, residency=sm.Residency.EVICTABLE
        )

    p = sm.ServeSpec(
        "p",
        "c-p",
        gpu_roles=("a", "b"),
        vram_mib=8000,
        residency=sm.Residency.ON_DEMAND,
        placement=("a", "b"),
    )
    desired = sm.DesiredState(
        roles,
        {s.name: s for s in (pinned("a1", "a"), pinned("b1", "b"), p)},
        (sm.OnDemandRequest("p", NOW),),
    )
    running = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 3600)
    in_flight = {
        "a1": sm.InFlightObs(2, sm.InFlightSource.METRICS),
        "b1": sm.InFlightObs(0, sm.InFlightSource.METRICS),
    }
    seen = sm.Observed(True, {"c-a1": running, "c-b1": running}, in_flight=in_flight)
    result = plan(desired, seen)
    (decision,) = result.placements
    assert (decision.role, decision.how) == ("b", How.VICTIMS)
    assert [(c.role, c.victims, c.stops, c.freed_mib, c.starts) for c in decision.candidates] == [
        ("a", ("a1",), 1, 4000, True),
        ("b", ("b1",), 1, 4000, True),
    ]
    assert [s.serve for s in result.steps if s.action is Action.STOP] == ["b1"]


# ── 3. which serves take room before a placed serve is weighed ─────────────────────────


def test_a_serve_whose_placement_names_one_card_takes_its_room_before_others_are_placed() -> None:
    """Rule (docs/placement.md, best fit: the free memory each candidate shows counts
    the pinned serves this same plan starts): a serve whose ``placement`` names one card
    is placed there already, so it counts as pinned. ``solo`` (4000, placement ``b``)
    wants to run: ``b`` shows 2000 free to ``p`` (5000), which goes to ``a``, and both
    start; weighed without ``solo``, ``p`` would take ``b`` (best fit) and ``solo``
    would be blocked."""
    solo = sm.ServeSpec(
        "solo",
        "c-solo",
        gpu_roles=("b",),
        vram_mib=4000,
        residency=sm.Residency.EVICTABLE,
        desired=sm.DesiredRun.RUNNING,
        placement=("b",),
    )
    desired = sm.DesiredState(
        ROLES, {s.name: s for s in (solo, placed("p", 5000, sm.DesiredRun.RUNNING))}
    )
    p = plan(desired, sm.Observed(True))
    assert [(d.serve, d.role, d.how) for d in p.placements] == [("p", "a", How.FITS)]
    (p_terms_b,) = [c for c in p.placements[0].candidates if c.role == "b"]
    assert (p_terms_b.committed_mib, p_terms_b.free_mib) == (4000, 2000)
    assert reserved_on(p, "p") == [("a",)] and reserved_on(p, "solo") == [("b",)]
    assert p.blocked == ()


def test_a_serve_outside_the_ledger_takes_no_room_from_a_placed_serve() -> None:
    """Rule: only serves in the ledger (every role with a capacity row) take room when a
    placed serve is weighed. ``out`` (4000) names ``b`` and ``x``, which has no row:
    it is outside the ledger, and ``p`` (5000) is placed as if it were absent (``b``,
    best fit), the plan made without error."""
    out = sm.ServeSpec(
        "out",
        "c-out",
        gpu_roles=("b", "x"),
        vram_mib=4000,
        residency=sm.Residency.EVICTABLE,
        desired=sm.DesiredRun.RUNNING,
    )
    alone = plan(
        sm.DesiredState(ROLES, {"p": placed("p", 5000, sm.DesiredRun.RUNNING)}), sm.Observed(True)
    )
    desired = sm.DesiredState(
        ROLES, {s.name: s for s in (out, placed("p", 5000, sm.DesiredRun.RUNNING))}
    )
    p = plan(desired, sm.Observed(True))
    assert [(d.serve, d.role, d.how) for d in p.placements] == [("p", "b", How.FITS)]
    assert p.placements == alone.placements
    assert reserved_on(p, "p") == [("b",)]
