"""Terms of the placement rule that no other test pinned (statemachine/planning/placement.py,
docs/placement.md), pure: each test states one term, and fails where it is dropped.

Two cards, ``a`` (budget 10000 MiB) and ``b`` (budget 6000), as in
``tests/core/test_placement.py``; the moves (docs/placement.md, moves) start from the case of
``tests/core/test_off_its_cards.py``: ``x`` (8000, resident, pinned to ``a``) is blocked by
``p`` (4000, placed on ``a`` or ``b``), which runs on ``a`` and fits on ``b``.
"""

from __future__ import annotations

from dataclasses import replace

from support.placement_cases import NOW, ROLES, RUNNING, host, pinned, placed, plan
from test_off_its_cards import moves, on

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Action, How

X = pinned("x", 8000, "a", residency=sm.Residency.RESIDENT)
P = placed("p", 4000)


# ── the rule, 1: a serve that holds memory stays; moved only on its container's word ──


def test_a_container_naming_one_of_its_candidates_without_a_record_is_not_moved() -> None:
    """A placed serve runs, its container's environment names ``a`` (a candidate), and
    the journal has no start record: where it was started is not the controller's
    choice, so it is counted on every candidate (``unknown``), and nothing is stopped:
    a serve is moved for an edit only where its container names a card that is no
    longer among its candidates."""
    observed = sm.Observed(True, {P.container: replace(RUNNING, gpu_role="a")})
    first = plan(host(P), observed)
    assert [(d.role, d.how) for d in first.placements] == [(None, How.UNKNOWN)]
    assert first.empty


def test_a_serve_whose_start_is_in_progress_is_not_moved_for_an_edit() -> None:
    """``p``'s start on ``a`` is in progress (``observed.starting``) and its container
    already names ``a``; the manifest now lets it run on ``b`` or ``c``. A start in
    progress is never stopped for an edit (the planner plans nothing for it until it
    ends): counted where it is, not ``moved``."""
    p_ = placed("p", 4000, on=("b", "c"))
    desired = sm.DesiredState({**ROLES, "c": sm.GpuRole("c", 6000)}, {"p": p_})
    observed = replace(on(p_, "a"), starting={"p": sm.StartingObs(("a",), 4000)})
    first = plan(desired, observed)
    assert [d.how for d in first.placements] == [How.UNKNOWN]
    assert not [s for s in first.steps if s.serve == "p" and s.action is Action.STOP]


# ── moves: which placed serve may move ───────────────────────────────────────────────


def _moved_base() -> list[tuple[str, str | None]]:
    return moves(host(X, P), on(P, "a"))


def test_the_move_case_moves_p_to_b() -> None:
    """The case every test below changes by one term: ``p`` moves to ``b``."""
    assert _moved_base() == [("p", "b")]


def test_an_unmanaged_placed_serve_is_not_moved() -> None:
    """An unmanaged serve (no ``desired``) is never started or stopped on its own: not
    moved for a blocked pinned serve either (the planner would not stop it, so the
    plan with the move would not start ``x``)."""
    p_ = placed("p", 4000, desired=None)
    assert moves(host(X, p_), on(p_, "a")) == []


def test_a_placed_serve_whose_start_is_in_progress_is_not_moved() -> None:
    p_observed = replace(on(P, "a"), starting={"p": sm.StartingObs(("a",), 4000)})
    assert moves(host(X, P), p_observed) == []


def test_an_asleep_placed_serve_that_is_not_to_run_is_not_moved() -> None:
    """Asleep and not to run (no ``desired``, nothing asks for it), ``p`` holds its
    residual on ``a`` and is not moved (docs: not asleep), though ``x`` is blocked."""
    p_ = placed(
        "p", 4000, desired=None, sleep=sm.Sleep(level=2, residual_mib=3000, protocol="vllm")
    )
    asleep = replace(on(p_, "a"), sleep={"p": sm.SleepObs(sm.SleepState.ASLEEP, 2, 3000)})
    assert moves(host(X, p_), asleep) == []
    assert [b.serve for b in plan(host(X, p_), asleep).blocked] == ["x"]


def test_an_asleep_placed_serve_to_be_woken_moves_instead() -> None:
    """Asleep on ``a`` and desired running, ``p`` would be woken there, its wake taking
    its whole reservation on the card ``x`` needs; the next plan would then move it
    (a wake, then a stop: churn). It moves now: stopped asleep on ``a`` (its residual
    released), ``x`` started there, ``p`` started cold on ``b`` by the next plan."""
    p_ = placed("p", 4000, sleep=sm.Sleep(level=2, residual_mib=3000, protocol="vllm"))
    asleep = replace(on(p_, "a"), sleep={"p": sm.SleepObs(sm.SleepState.ASLEEP, 2, 3000)})
    assert moves(host(X, p_), asleep) == [("p", "b")]
    steps = [(s.action, s.serve) for s in plan(host(X, p_), asleep).steps]
    assert (Action.STOP, "p") in steps and (Action.START, "x") in steps
    assert not [a for a, n in steps if n == "p" and a in (Action.WAKE, Action.RESERVE_WAKE)]


def test_a_placed_serve_whose_container_names_no_card_is_not_moved() -> None:
    """Its start record says ``a``, its container's environment says nothing: only a
    container that names its card is moved."""
    observed = on(P, "a", told=False)
    assert moves(host(X, P), observed) == []


# ── moves: for which pinned serve a move is made ──────────────────────────────────────


def test_a_move_is_made_for_memory_alone_not_for_a_port() -> None:
    """``x`` (6000, resident, pinned to ``a``) fits on ``a`` beside ``p`` to the MiB
    (10000 - 4000 - 6000 = 0 left), but ``p`` holds ``x``'s port and a resident may stop
    nothing: ``x`` is blocked. Moving ``p`` to ``b`` would free the port, yet a move is
    made only where the pinned serve is short of memory on its card: nothing moves."""
    x = pinned("x", 6000, "a", residency=sm.Residency.RESIDENT, port=9000)
    p_ = placed("p", 4000, port=9000)
    result = plan(host(x, p_), on(p_, "a"))
    assert [(d.role, d.how) for d in result.placements] == [("a", How.HELD)]
    assert [b.serve for b in result.blocked] == ["x"]


# ── where every candidate's reason is given ─────────────────────────────────────────


def test_a_held_serve_keeps_the_planners_reason_for_its_blocked_wake() -> None:
    """Only a serve placed by the victims rule that starts on no candidate has its
    blocked reason rewritten with every candidate's: ``p`` (on-demand, asleep on ``a``
    with 1000 MiB) is held there, and its wake is blocked by ``x`` (8000, resident,
    running on ``a``): its reason is the planner's, about ``a`` alone."""
    p_ = placed(
        "p",
        4000,
        residency=sm.Residency.ON_DEMAND,
        desired=None,
        sleep=sm.Sleep(level=2, residual_mib=1000, protocol="vllm"),
    )
    x = pinned("x", 8000, "a", residency=sm.Residency.RESIDENT)
    asleep = replace(on(p_, "a"), sleep={"p": sm.SleepObs(sm.SleepState.ASLEEP, 2, 1000)})
    observed = replace(
        asleep,
        containers={**asleep.containers, "c-x": RUNNING},
        started_with={**asleep.started_with, "c-x": sm.StartedWith("x", ("a",), 8000)},
    )
    result = plan(host(x, p_, requests=(sm.OnDemandRequest("p", NOW),)), observed)
    assert [(d.role, d.how) for d in result.placements] == [("a", How.HELD)]
    (blocked,) = result.blocked
    assert blocked.serve == "p"
    assert "candidates" not in blocked.reason


def test_a_placed_serve_without_a_reservation_is_left_unplaced() -> None:
    """A placed serve without ``vram_mib`` is outside the ledger: nowhere to weigh it.
    No decision is made for it, and it keeps every candidate."""
    bare = replace(placed("bare", 4000), vram_mib=None)
    result = plan(host(bare), sm.Observed(True))
    assert result.placements == ()


# ── moves: where the moved serve goes ────────────────────────────────────────────────


def test_the_moved_serve_goes_only_to_a_card_where_it_fits() -> None:
    """``p`` (4000) may go to ``b`` (3000 free: it does not fit) or ``c`` (6000): it
    goes to ``c``. The card left with the least free is chosen among those where it
    fits, never one where it does not."""
    p_ = placed("p", 4000, on=("a", "b", "c"))
    u = pinned("u", 3000, "b", residency=sm.Residency.RESIDENT)
    desired = sm.DesiredState(
        {**ROLES, "c": sm.GpuRole("c", 6000)}, {s.name: s for s in (X, p_, u)}
    )
    observed = on(p_, "a")
    observed = replace(
        observed,
        containers={**observed.containers, "c-u": RUNNING},
        started_with={**observed.started_with, "c-u": sm.StartedWith("u", ("b",), 3000)},
    )
    assert moves(desired, observed) == [("p", "c")]


def test_a_serve_counted_on_every_candidate_is_not_moved() -> None:
    """``p`` runs where the controller cannot tell (no start record; its container
    names ``a``): counted on both cards (``unknown``), it is not a serve placed on
    ``a``, and no move is made of it for ``x``; ``x`` stays blocked."""
    roles = {"a": sm.GpuRole("a", 10000), "b": sm.GpuRole("b", 10000)}
    desired = sm.DesiredState(roles, {s.name: s for s in (X, P)})
    observed = sm.Observed(True, {P.container: replace(RUNNING, gpu_role="a")})
    result = plan(desired, observed)
    assert [(d.role, d.how) for d in result.placements] == [(None, How.UNKNOWN)]
    assert [b.serve for b in result.blocked] == ["x"]


# ── moves: for whom ──────────────────────────────────────────────────────────────────


def test_a_move_is_made_for_a_pinned_serve_alone_even_where_a_placed_one_would_start() -> None:
    """``q`` (3000, resident, placed on ``a`` or ``b``) fits on neither: ``a`` holds
    ``p`` and ``z`` (4000 each), ``b`` holds ``y`` (5000), and this plan's pinned starts
    count there too (``w`` wants 11000 of ``a``, ``v`` 10000 of ``b``: neither can ever
    start). ``q`` waits on ``a``, the first of the equally short. Moving ``p`` from ``a``
    to ``c`` would let ``q`` start, but a placed serve's card is its own choice: a move
    is made for a pinned serve alone, and nothing moves."""
    q = placed("q", 3000, residency=sm.Residency.RESIDENT)
    p_ = placed("p", 4000, on=("a", "c"))
    z = pinned("z", 4000, "a", residency=sm.Residency.RESIDENT)
    y = pinned("y", 5000, "b", residency=sm.Residency.RESIDENT)
    w = pinned("w", 11000, "a", residency=sm.Residency.RESIDENT)
    v = pinned("v", 10000, "b", residency=sm.Residency.RESIDENT)
    desired = sm.DesiredState(
        {**ROLES, "c": sm.GpuRole("c", 6000)}, {s.name: s for s in (q, p_, z, y, w, v)}
    )
    running = ((p_, "a"), (z, "a"), (y, "b"))
    observed = sm.Observed(
        True,
        {s.container: replace(RUNNING, gpu_role=r) for s, r in running},
        started_with={
            s.container: sm.StartedWith(s.name, (r,), s.vram_mib or 0) for s, r in running
        },
    )
    result = plan(desired, observed)
    assert [(d.serve, d.role, d.how) for d in result.placements] == [
        ("q", "a", How.VICTIMS),
        ("p", "a", How.HELD),
    ]
    assert sorted(b.serve for b in result.blocked) == ["q", "v", "w"]


def _two_pinned(w2_mib: int) -> list[tuple[str, str | None]]:
    """``p`` (4000) runs on ``a``; ``w1`` (5000) and ``w2`` (resident, pinned to ``a``)
    want to run: ``w1`` starts in the 6000 left, ``w2`` is blocked."""
    w1 = pinned("w1", 5000, "a", residency=sm.Residency.RESIDENT)
    w2 = pinned("w2", w2_mib, "a", residency=sm.Residency.RESIDENT)
    return moves(host(w1, w2, P), on(P, "a"))


def test_no_move_for_a_pinned_serve_the_plan_starts_anyway() -> None:
    """``w1`` starts without the move; ``w2`` (6000) would not start even with it
    (5000 + 6000 > 10000): nothing moves, ``p`` is not stopped for nothing."""
    assert _two_pinned(6000) == []


def test_a_pinned_serve_that_starts_anyway_does_not_hide_one_a_move_lets_start() -> None:
    """``w1`` starts without the move; ``w2`` (5000) starts with it: ``p`` moves."""
    assert _two_pinned(5000) == [("p", "b")]
