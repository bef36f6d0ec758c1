"""A serve that runs on a card it is no longer to run on (docs/placement.md, moves).

An edit re-pins a running serve (``gpu_role``), or drops the card a placed serve runs
on from its ``placement``. The ledger counts it on the card it runs on (its start
record, confirmed by what its container's environment says its ``up`` was told), not
on both; the plan stops it there, and the next starts it where it is now declared.
Without that confirmation the ledger counts it on both (never less than the truth).
"""

from __future__ import annotations

from dataclasses import replace

from support.placement_cases import NOW, ROLES, RUNNING, host, pinned, placed, plan

from statemachine.domain import types as sm
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import Action, How
from statemachine.planning.simulate import apply_plan


def on(serve: sm.ServeSpec, *roles: str, told: bool = True) -> sm.Observed:
    """``serve`` running, started on ``roles`` (its record); ``told``: its container's
    environment names them."""
    obs = replace(RUNNING, gpu_role=",".join(roles) if told else None)
    record = sm.StartedWith(serve.name, roles, serve.vram_mib or 0)
    return sm.Observed(True, {serve.container: obs}, started_with={serve.container: record})


def committed(desired: sm.DesiredState, observed: sm.Observed) -> dict[str, int | None]:
    ledger = ledger_from_observed(desired, observed)
    return {r: ledger.view(r).committed_mib for r in desired.roles}


def converge(desired: sm.DesiredState, observed: sm.Observed) -> list[list[tuple[str, str]]]:
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
    desired = sm.DesiredState({**ROLES, "c": sm.GpuRole("c", 6000)}, {"p": p_})
    observed = on(p_, "a")
    assert committed(desired, observed) == {"a": 4000, "b": 0, "c": 0}
    first = plan(desired, observed)
    (decision,) = first.placements
    assert (decision.role, decision.how) == (None, How.MOVED)
    assert [s.action for s in first.steps if s.serve == "p"][-2:] == [Action.STOP, Action.RELEASE]
    steps = converge(desired, observed)
    assert ("start", "b") in steps[1] and len(steps) == 2


def test_without_its_containers_word_a_placed_serve_off_its_list_is_counted_on_all() -> None:
    """``p`` runs on ``a`` (its record), no longer one of its candidates (``b``, ``c``),
    and its container's environment names no card: the record may be of an older
    container, so it is counted where the record says and on every candidate it
    declares (never less than the truth)."""
    p_ = placed("p", 4000, on=("b", "c"))
    desired = sm.DesiredState({**ROLES, "c": sm.GpuRole("c", 6000)}, {"p": p_})
    assert committed(desired, on(p_, "a", told=False)) == {"a": 4000, "b": 4000, "c": 4000}


def test_a_serve_running_where_it_is_declared_is_left_alone() -> None:
    x = pinned("x", 4000, "a")
    assert plan(host(x), on(x, "a")).empty
    assert plan(host(x), on(x, "a", told=False)).empty


def test_an_unmanaged_serve_re_pinned_is_left_running_where_it_runs() -> None:
    """A serve without ``desired`` is never stopped on its own: re-pinned by an edit, it
    keeps running (counted where it runs) until an operator or its request ends it."""
    x = pinned("x", 4000, "b", desired=None)
    assert committed(host(x), on(x, "a")) == {"a": 4000, "b": 0}
    assert plan(host(x), on(x, "a")).empty


def test_a_placed_serve_moves_off_the_card_a_blocked_pinned_resident_needs() -> None:
    """p (4000) runs on a (10000); x, resident and pinned to a, needs 8000 and may stop
    nothing. b (6000) has room for p: p is moved there, x starts on a, then p on b."""
    x = pinned("x", 8000, "a", residency=sm.Residency.RESIDENT)
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
    x = pinned("x", 8000, "a", residency=sm.Residency.RESIDENT)
    for p_ in (
        placed("p", 4000, residency=sm.Residency.RESIDENT),
        placed("p", 4000, min_runtime_s=7200.0),
    ):
        first = plan(host(x, p_), on(p_, "a"))
        assert [(d.role, d.how) for d in first.placements] == [("a", How.HELD)]
        assert [b.serve for b in first.blocked] == ["x"]


def test_no_move_where_the_other_card_has_no_room() -> None:
    x = pinned("x", 8000, "a", residency=sm.Residency.RESIDENT)
    p_ = placed("p", 7000)  # b holds 6000
    first = plan(host(x, p_), on(p_, "a"))
    assert [(d.role, d.how) for d in first.placements] == [("a", How.HELD)]
    assert [b.serve for b in first.blocked] == ["x"]


def _hosts(*serves: sm.ServeSpec, **budgets: int) -> sm.DesiredState:
    roles = {r: sm.GpuRole(r, mib) for r, mib in (budgets or {"a": 10000, "b": 6000}).items()}
    return sm.DesiredState(roles, {s.name: s for s in serves})


def _running_on(**where: tuple[sm.ServeSpec, str]) -> sm.Observed:
    """Each serve's container running, started on the role given (its record)."""
    obs = {s.container: replace(RUNNING, gpu_role=role) for s, role in where.values()}
    records = {
        s.container: sm.StartedWith(s.name, (role,), s.vram_mib or 0) for s, role in where.values()
    }
    return sm.Observed(True, obs, started_with=records)


def moves(desired: sm.DesiredState, observed: sm.Observed) -> list[tuple[str, str | None]]:
    return [(d.serve, d.role) for d in plan(desired, observed).placements if d.how is How.MOVED]


R9 = pinned("r", 9000, "a", residency=sm.Residency.RESIDENT)


def test_no_move_where_it_would_not_let_the_pinned_serve_start() -> None:
    """a (12000) holds the pinned resident q (4000) and p (4000): moving p leaves 8000,
    short of r's 9000. Nothing moves (another serve, u, starts on c meanwhile)."""
    q = pinned("q", 4000, "a", residency=sm.Residency.RESIDENT)
    p_ = placed("p", 4000, on=("a", "b"))
    u = pinned("u", 1000, "c")
    desired = _hosts(q, p_, R9, u, a=12000, b=6000, c=2000)
    assert moves(desired, _running_on(q=(q, "a"), p=(p_, "a"))) == []


def test_a_shortfall_of_one_mib_is_a_shortfall() -> None:
    r = pinned("r", 6001, "a", residency=sm.Residency.RESIDENT)
    p_ = placed("p", 4000)
    assert moves(_hosts(r, p_), _running_on(p=(p_, "a"))) == [("p", "b")]


def test_a_move_to_a_card_it_fills_exactly() -> None:
    r = pinned("r", 5000, "a", residency=sm.Residency.RESIDENT)
    p_ = placed("p", 6000)  # b's 6000, to the MiB
    assert moves(_hosts(r, p_), _running_on(p=(p_, "a"))) == [("p", "b")]


def test_a_placed_requester_moves_nothing() -> None:
    """q (placed, 8000) fits on neither card; moving p off a would let it start there,
    but a move is made for a pinned serve alone: a placed one's card is its choice."""
    q = placed("q", 8000)
    p_ = placed("p", 4000)
    desired = _hosts(p_, q)
    assert moves(desired, _running_on(p=(p_, "a"))) == []


def test_a_serve_that_may_not_move_does_not_hide_one_that_may() -> None:
    """The resident placed p0 on a comes first and stays; p, after it, moves."""
    p0 = placed("p0", 2000, residency=sm.Residency.RESIDENT)
    p_ = placed("p", 4000)
    r = pinned("r", 6000, "a", residency=sm.Residency.RESIDENT)
    desired = _hosts(p0, p_, r)
    assert moves(desired, _running_on(p0=(p0, "a"), p=(p_, "a"))) == [("p", "b")]


def test_the_moved_serve_goes_where_it_leaves_the_least_free() -> None:
    """p may go to b (6000 free) or c (7000 once u starts there): b, the best fit, though
    u's start is in the plan without the move too."""
    p_ = placed("p", 4000, on=("a", "b", "c"))
    u = pinned("u", 1000, "c")
    r = pinned("r", 8000, "a", residency=sm.Residency.RESIDENT)
    desired = _hosts(p_, u, r, a=10000, b=6000, c=8000)
    assert moves(desired, _running_on(p=(p_, "a"))) == [("p", "b")]


def test_a_record_on_a_renamed_role_is_counted_where_declared_too() -> None:
    """x's record and container say a; the manifest renamed that card gpu0. The record
    confirms nothing (a has no row): x is counted on gpu0, never on no card at all."""
    x = pinned("x", 8000, "gpu0", desired=None)  # unmanaged: never stopped on its own
    desired = sm.DesiredState({"gpu0": sm.GpuRole("gpu0", 10000)}, {"x": x})
    assert committed(desired, on(x, "a")) == {"gpu0": 8000}


def test_no_move_into_room_a_grow_of_the_same_plan_takes() -> None:
    """b's room for p would go to e's grow back in the plan with the move: p would stop
    and have no card to start on. Nothing moves."""
    x = pinned("x", 8000, "a", residency=sm.Residency.RESIDENT)
    p_ = placed("p", 4000)
    e = pinned("e", 4000, "b", elastic=sm.Elastic("http://e", floor_mib=1000, segment_mib=500))
    observed = replace(_running_on(p=(p_, "a"), e=(e, "b")), elastic_mib={"e": 2000})
    assert moves(host(x, p_, e), observed) == []


def test_no_move_that_needs_an_eviction_beside_it() -> None:
    """x (on-demand) would start on a with p moved and q evicted: a move is the only
    change it may make, so nothing moves."""
    x = pinned("x", 8000, "a", residency=sm.Residency.ON_DEMAND)
    p_ = placed("p", 4000, residency=sm.Residency.ON_DEMAND)
    q = pinned("q", 3000, "a")
    assert moves(host(x, p_, q), _running_on(p=(p_, "a"), q=(q, "a"))) == []


def test_a_serve_whose_container_names_no_card_is_not_stopped_for_an_edit() -> None:
    """Its record on every old candidate says where it may run, not where it does: the
    edit does not stop it (counted on both until it stops)."""
    p_ = placed("p", 4000, on=("b", "c"))
    desired = sm.DesiredState({**ROLES, "c": sm.GpuRole("c", 6000)}, {"p": p_})
    observed = replace(on(p_, "a", "b", told=False))
    first = plan(desired, observed)
    assert [d.how for d in first.placements] == [How.UNKNOWN]
    assert first.empty
    x = pinned("x", 4000, "b")
    assert plan(host(x), on(x, "a", told=False)).empty


def test_a_request_of_a_serve_no_manifest_declares_is_no_request() -> None:
    """A request recorded for a serve an edit removed is neither in force nor ended: the
    plan has nothing to start and nothing to stop for it (the loop closes it)."""
    x = pinned("x", 4000, "a")
    desired = host(x, requests=(sm.OnDemandRequest("gone", NOW - 1),))
    assert plan(desired, on(x, "a")).empty
