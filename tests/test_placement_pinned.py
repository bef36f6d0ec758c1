"""Rules of placement the other placement tests left unpinned (statemachine/placement.py,
docs/placement.md), pure.

Two cards, ``a`` (budget 10000 MiB) and ``b`` (budget 6000), as in
``tests/test_placement.py``.
"""

from __future__ import annotations

import pytest

from statemachine.plan import Action, How, Plan, Policy
from statemachine.planner import plan_transitions
from statemachine.types import (
    ContainerObs,
    ContainerState,
    DesiredRun,
    DesiredState,
    GpuRole,
    Observed,
    Residency,
    ServeSpec,
    StartedWith,
)

NOW = 1_000_000.0
ROLES = {"a": GpuRole("a", 10000), "b": GpuRole("b", 6000)}
EXITED = ContainerObs(ContainerState.EXITED, exit_code=0)


def placed(name: str, mib: int, desired: DesiredRun) -> ServeSpec:
    """An evictable serve placed on ``a`` or ``b``."""
    return ServeSpec(
        name,
        f"c-{name}",
        gpu_roles=("a", "b"),
        vram_mib=mib,
        residency=Residency.EVICTABLE,
        desired=desired,
        placement=("a", "b"),
    )


def plan(desired: DesiredState, observed: Observed) -> Plan:
    return plan_transitions(desired, observed, Policy(), NOW)


def reserved_on(p: Plan, serve: str) -> list[tuple[str, ...]]:
    return [s.gpu_roles for s in p.steps if s.action is Action.RESERVE and s.serve == serve]


# ── 1. a serve whose memory is not back still holds its card ─────────────────────────


def _unreleased_x(record: bool) -> tuple[DesiredState, Observed]:
    """``x`` (5000, placed) was stopped on ``b`` and its memory is not back yet
    (``observed.unreleased``): 1000 of ``b``'s 6000 are free. ``y`` (6000, placed)
    wants to run. ``record``: whether the journal's start record says ``x`` was on
    ``b`` (else where is unknown). ``x`` is declared first: placed first."""
    desired = DesiredState(
        ROLES,
        {
            "x": placed("x", 5000, DesiredRun.STOPPED),
            "y": placed("y", 6000, DesiredRun.RUNNING),
        },
    )
    started_with = {"c-x": StartedWith("x", ("b",), 5000)} if record else {}
    observed = Observed(
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
