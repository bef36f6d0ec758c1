"""The planner's working ledger: changed in place, and always the Ledger it stands for.

A WorkingLedger driven by commit / drop / adopt must read exactly as the immutable
ledger the same admit / release / resize / sleep / wake give (committed, free, every
reservation list, holdings and their order, host RAM), must never overcommit, and
must never change what a reader took from it earlier. ``Ledger.short_of`` is the
shortfall the planner asks for before a start.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from statemachine.domain.types import GpuRole, HostBudget
from statemachine.ledger.reservations import GpuReservation, Ledger, Refusal, WorkingLedger

ROLES = {r: GpuRole(r, capacity_mib=1000, reserve_mib=100) for r in ("a", "b", "c")}


def _same(work: WorkingLedger, ref: Ledger) -> None:
    for led in (work, work.frozen()):
        assert list(led.holdings.items()) == list(ref.holdings.items())
        assert dict(led.host_holdings) == dict(ref.host_holdings)
        for r in ROLES:
            assert led.committed_mib(r) == ref.committed_mib(r)
            assert led.free_mib(r) == ref.free_mib(r)
            assert led.reservations_on(r) == ref.reservations_on(r)
            assert led.view(r) == ref.view(r)
        assert led.host_view() == ref.host_view()
        for roles in (("a",), ("b", "c"), ("c", "a", "b")):
            for mib in (1, 100, 450, 900, 901):
                assert led.short_of(roles, mib) == ref.short_of(roles, mib)
    assert isinstance(work.frozen(), Ledger) and not isinstance(work.frozen(), WorkingLedger)


def _other(op: str, led: Ledger, holder: str, mib: int) -> Ledger | Refusal:
    if op == "resize":
        return led.resize(holder, mib)
    if op == "sleep":
        return led.sleep(holder, mib // 2 + 1, mib // 3)
    return led.wake(holder, mib)


_ops = st.lists(
    st.tuples(
        st.sampled_from(("admit", "release", "resize", "sleep", "wake", "terms")),
        st.integers(0, 5),
        st.sampled_from((("a",), ("b",), ("a", "b"), ("c", "a"))),
        st.integers(1, 700),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, host=st.booleans())
def test_reads_as_the_immutable_ledger_the_same_operations_give(
    ops: list[tuple[str, int, tuple[str, ...], int]], host: bool
) -> None:
    budget = HostBudget(ram_mib=900, reserve_mib=100) if host else None
    ref = Ledger(ROLES, host=budget)
    work = WorkingLedger(ref)
    assert work.frozen() is ref  # nothing changed yet: the ledger it was made from
    taken: list[tuple[Ledger, list[tuple[str, GpuReservation]]]] = []
    for op, i, roles, mib in ops:
        holder = f"s{i}"
        event(f"op: {op}")
        if op == "terms":  # build the per-role lists, so later changes must carry them
            work.terms(holder, roles, mib)
            ref.terms(holder, roles, mib)
            continue
        if op == "admit":
            res = GpuReservation(holder, roles, mib)
            out = ref.admit(res)
            if isinstance(out, Refusal):
                with pytest.raises(ValueError, match=holder):
                    work.commit(res)
                continue
            work.commit(res)
        elif op == "release":
            out = ref.release(holder)
            if isinstance(out, Refusal):
                with pytest.raises(KeyError):
                    work.drop(holder)
                continue
            work.drop(holder)
        else:
            out, mine = (_other(op, led, holder, mib) for led in (ref, work))
            assert (out if isinstance(out, Refusal) else None) == (
                mine if isinstance(mine, Refusal) else None
            )
            if isinstance(mine, Refusal):
                with pytest.raises(ValueError, match="adopts no refusal"):
                    work.adopt(mine)
                continue
            work.adopt(mine)
        assert not isinstance(out, Refusal)
        ref = out
        _same(work, ref)
        assert all(ref.committed_mib(r) <= ROLES[r].budget_mib for r in ROLES)
        taken.append((work.frozen(), list(work.holdings.items())))
        assert work.frozen() is work.frozen()  # kept until the next change
    for frozen, items in taken:  # what was read earlier stays as it was
        assert list(frozen.holdings.items()) == items


def test_commit_takes_exactly_the_free_room_and_no_more() -> None:
    work = WorkingLedger(Ledger(ROLES))
    work.commit(GpuReservation("x", ("a", "b"), 900))  # budget 900: fits exactly
    assert work.free_mib("a") == work.free_mib("b") == 0 and work.free_mib("c") == 900
    with pytest.raises(ValueError, match="y: 1 MiB does not fit on a"):
        work.commit(GpuReservation("y", ("c", "a"), 1))
    assert work.free_mib("c") == 900  # all or nothing: c untouched
    assert "y" not in work.holdings
    with pytest.raises(ValueError, match="x: not admitted"):
        work.commit(GpuReservation("x", ("c",), 1))  # already held
    unknown = WorkingLedger(Ledger(ROLES, unknown=True))
    with pytest.raises(ValueError, match="z: not admitted"):
        unknown.commit(GpuReservation("z", ("a",), 1))


@pytest.mark.parametrize(
    ("roles", "mib", "why"),
    [
        (("a", "a"), 600, "distinct gpu roles"),  # would count 1200 of a budget of 900
        ((), 100, "distinct gpu roles"),
        (("a",), 0, "positive number"),
        (("a",), -300, "positive number"),
        (("a",), True, "positive number"),  # an int to Python, not MiB
        (("a",), 1.5, "positive number"),  # MiB are whole
    ],
)
def test_commit_refuses_what_admit_refuses_before_its_arithmetic(
    roles: tuple[str, ...], mib: int, why: str
) -> None:
    work = WorkingLedger(Ledger(ROLES))
    assert isinstance(Ledger(ROLES).admit(GpuReservation("x", roles, mib)), Refusal)
    with pytest.raises(ValueError, match=why):
        work.commit(GpuReservation("x", roles, mib))
    assert "x" not in work.holdings and work.free_mib("a") == 900


def test_drop_gives_back_the_reservation_and_the_host_ram_of_a_sleeper() -> None:
    base = Ledger(
        ROLES,
        [GpuReservation("x", ("a",), 500), GpuReservation("y", ("a", "b"), 200)],
        host=HostBudget(ram_mib=900, reserve_mib=100),
        host_holdings={"x": 300, "w": 50},
    )
    work = WorkingLedger(base)
    before = work.holdings
    work.drop("x")
    assert work.committed_mib("a") == 200 and dict(work.host_holdings) == {"w": 50}
    assert list(before) == ["x", "y"] and list(work.holdings) == ["y"]
    assert dict(base.host_holdings) == {"x": 300, "w": 50}  # the base is never changed
    assert base.committed_mib("a") == 700
    work.drop("y")
    assert work.committed_mib("b") == 0 and dict(work.host_holdings) == {"w": 50}
    with pytest.raises(KeyError):
        work.drop("y")


def test_short_of_lists_each_role_where_the_request_does_not_fit() -> None:
    led = Ledger(ROLES, [GpuReservation("x", ("a",), 600), GpuReservation("y", ("b",), 900)])
    assert led.short_of(("a", "b", "c"), 300) == {"b": 300}
    assert led.short_of(("a", "b", "c"), 301) == {"a": 1, "b": 301}
    assert led.short_of(("c",), 900) == {}
    assert led.short_of(("c",), 901) == {"c": 1}
    assert led.short_of((), 5) == {}
