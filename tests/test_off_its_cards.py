"""A serve that runs on a card it is no longer to run on (docs/placement.md, moves).

An edit re-pins a running serve (``gpu_role``), or drops the card a placed serve runs
on from its ``placement``. The ledger counts it on the card it runs on (its start
record, confirmed by what its container's environment says its ``up`` was told), not
on both; the plan stops it there, and the next starts it where it is now declared.
Without that confirmation the ledger counts it on both (never less than the truth).
"""

from __future__ import annotations

from dataclasses import replace

from test_placement import NOW, ROLES, RUNNING, host, pinned, placed, plan

from statemachine.ledger import ledger_from_observed
from statemachine.plan import Action, How
from statemachine.simulate import apply_plan
from statemachine.types import (
    DesiredState,
    GpuRole,
    Observed,
    Residency,
    ServeSpec,
    StartedWith,
)


def on(serve: ServeSpec, *roles: str, told: bool = True) -> Observed:
    """``serve`` running, started on ``roles`` (its record); ``told``: its container's
    environment names them."""
    obs = replace(RUNNING, gpu_role=",".join(roles) if told else None)
    record = StartedWith(serve.name, roles, serve.vram_mib or 0)
    return Observed(True, {serve.container: obs}, started_with={serve.container: record})


def committed(desired: DesiredState, observed: Observed) -> dict[str, int | None]:
    ledger = ledger_from_observed(desired, observed)
    return {r: ledger.view(r).committed_mib for r in desired.roles}


def converge(desired: DesiredState, observed: Observed) -> list[list[tuple[str, str]]]:
    """The steps of each plan until one is empty (at most four)."""
    out: list[list[tuple[str, str]]] = []
    for _ in range(4):
        p = plan(desired, observed)
        if p.empty:
            return out
        out.append([(s.action.value, ",".join(s.gpu_roles)) for s in p.steps])
        observed = apply_plan(desired, observed, p, NOW)
    raise AssertionError(f"no empty plan after four: {out}")


def test_a_re_pinned_running_serve_is_counted_where_it_runs_then_moved() -> None:
    x = pinned("x", 4000, "b")
    desired = host(x)
    observed = on(x, "a")
    assert committed(desired, observed) == {"a": 4000, "b": 0}
    p = plan(desired, observed)
    stop = next(s for s in p.steps if s.action is Action.STOP)
    assert "x runs on a; it is to run on b" in stop.reason
    steps = converge(desired, observed)
    assert steps[0][-2:] == [("stop", "a"), ("release", "a")]
    assert ("start", "b") in steps[1]
    assert len(steps) == 2


def test_without_its_containers_word_a_re_pinned_serve_is_counted_on_both() -> None:
    x = pinned("x", 4000, "b")
    assert committed(host(x), on(x, "a", told=False)) == {"a": 4000, "b": 4000}


def test_a_placed_serve_whose_card_left_its_list_is_counted_there_and_placed_again() -> None:
    p_ = placed("p", 4000, on=("b", "c"))
    desired = DesiredState({**ROLES, "c": GpuRole("c", 6000)}, {"p": p_})
    observed = on(p_, "a")
    assert committed(desired, observed) == {"a": 4000, "b": 0, "c": 0}
    first = plan(desired, observed)
    (decision,) = first.placements
    assert (decision.role, decision.how) == (None, How.MOVED)
    assert [s.action for s in first.steps if s.serve == "p"][-2:] == [Action.STOP, Action.RELEASE]
    steps = converge(desired, observed)
    assert ("start", "b") in steps[1] and len(steps) == 2


def test_a_serve_running_where_it_is_declared_is_left_alone() -> None:
    x = pinned("x", 4000, "a")
    assert plan(host(x), on(x, "a")).empty
    assert plan(host(x), on(x, "a", told=False)).empty


def test_a_placed_serve_moves_off_the_card_a_blocked_pinned_resident_needs() -> None:
    """p (4000) runs on a (10000); x, resident and pinned to a, needs 8000 and may stop
    nothing. b (6000) has room for p: p is moved there, x starts on a, then p on b."""
    x = pinned("x", 8000, "a", residency=Residency.RESIDENT)
    p_ = placed("p", 4000)
    desired = host(x, p_)
    observed = on(p_, "a")
    first = plan(desired, observed)
    (decision,) = first.placements
    assert (decision.serve, decision.role, decision.how) == ("p", "b", How.MOVED)
    assert "p moves from a to b so that x (pinned to a) can start" in decision.reason
    steps = converge(desired, observed)
    assert steps[0][:2] == [("stop", "a"), ("release", "a")]
    assert ("start", "a") in steps[0]  # x, in the room p leaves
    assert ("start", "b") in steps[1] and len(steps) == 2


def test_a_resident_or_young_placed_serve_is_not_moved() -> None:
    x = pinned("x", 8000, "a", residency=Residency.RESIDENT)
    for p_ in (
        placed("p", 4000, residency=Residency.RESIDENT),
        placed("p", 4000, min_runtime_s=7200.0),
    ):
        first = plan(host(x, p_), on(p_, "a"))
        assert [(d.role, d.how) for d in first.placements] == [("a", How.HELD)]
        assert [b.serve for b in first.blocked] == ["x"]


def test_no_move_where_the_other_card_has_no_room() -> None:
    x = pinned("x", 8000, "a", residency=Residency.RESIDENT)
    p_ = placed("p", 7000)  # b holds 6000
    first = plan(host(x, p_), on(p_, "a"))
    assert [(d.role, d.how) for d in first.placements] == [("a", How.HELD)]
    assert [b.serve for b in first.blocked] == ["x"]
