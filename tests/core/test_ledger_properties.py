"""Property tests of the reservation ledger against a naive reference model.

The invariants: no operation the ledger grants leaves committed > budget on any role;
the ledger grants exactly what a naive model (sum the reservations, compare with the
budget) grants; a refusal's shortfall is exactly requested - free; multi-role
reservations are all-or-nothing; an unknown ledger admits nothing.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from statemachine.domain.types import GpuRole
from statemachine.ledger.reservations import GpuReservation, Ledger, Refusal, RefusalKind

ROLE_IDS = ("a", "b", "c")


class NaiveModel:
    """The reference: a dict of holder -> (roles, mib), totals recomputed every time."""

    def __init__(self, roles: dict[str, GpuRole]) -> None:
        self.roles = roles
        self.held: dict[str, tuple[tuple[str, ...], int]] = {}

    def committed(self, role: str) -> int:
        return sum(m for rs, m in self.held.values() if role in rs)

    def fits(self, roles: tuple[str, ...], extra: int) -> bool:
        return all(self.committed(r) + extra <= self.roles[r].budget_mib for r in roles)


class LedgerMachine(RuleBasedStateMachine):
    """Random admit / release / resize sequences, checked step by step against the model."""

    holders = Bundle("holders")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger({})
        self.model = NaiveModel({})
        self.counter = 0
        # earlier ledgers and what they held then (operations must not change them)
        self.kept: list[tuple[Ledger, dict[str, tuple[tuple[str, ...], int]]]] = []

    @initialize(
        caps=st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 5000)), min_size=3, max_size=3)
    )
    def setup(self, caps: list[tuple[int, int]]) -> None:
        roles = {
            rid: GpuRole(rid, capacity_mib=cap, reserve_mib=min(res, cap))
            for rid, (cap, res) in zip(ROLE_IDS, caps, strict=True)
        }
        self.ledger = Ledger(roles)
        self.model = NaiveModel(roles)

    @rule(
        target=holders,
        roles=st.sampled_from([("a",), ("b",), ("c",), ("a", "b"), ("b", "c"), ("a", "c")]),
        mib=st.integers(1, 3000),
    )
    def admit(self, roles: tuple[str, ...], mib: int) -> str:
        self.counter += 1
        holder = f"s{self.counter}"
        before = {r: self.ledger.committed_mib(r) for r in ROLE_IDS}
        out = self.ledger.admit(GpuReservation(holder, roles, mib))
        expected = self.model.fits(roles, mib)
        if isinstance(out, Refusal):
            assert not expected, f"ledger refused what the model grants: {out.message}"
            assert out.kind is RefusalKind.OVER_BUDGET
            self._check_refusal(out, roles, mib)
            # all or nothing: the old ledger is untouched
            assert {r: self.ledger.committed_mib(r) for r in ROLE_IDS} == before
            event("admit: refused, over budget")
        else:
            assert expected, f"ledger granted {holder} {mib} on {roles}, model refuses"
            self.ledger = out
            self.model.held[holder] = (roles, mib)
            full = any(self.ledger.free_mib(r) == 0 for r in roles)
            event("admit: granted, a role filled exactly" if full else "admit: granted")
        return holder

    @rule(holder=holders)
    def release(self, holder: str) -> None:
        out = self.ledger.release(holder)
        if holder in self.model.held:
            assert not isinstance(out, Refusal)
            self.ledger = out
            del self.model.held[holder]
            event("release: held")
        else:
            assert isinstance(out, Refusal) and out.kind is RefusalKind.NOT_HELD
            event("release: not held")

    @rule(holder=holders, mib=st.integers(1, 3000))
    def resize(self, holder: str, mib: int) -> None:
        out = self.ledger.resize(holder, mib)
        if holder not in self.model.held:
            assert isinstance(out, Refusal) and out.kind is RefusalKind.NOT_HELD
            return
        roles, old = self.model.held[holder]
        expected = mib <= old or self.model.fits(roles, mib - old)
        if isinstance(out, Refusal):
            assert not expected, f"ledger refused a resize the model grants: {out.message}"
            self._check_refusal(out, roles, mib - old)
            event("resize: refused, over budget")
        else:
            assert expected, f"ledger granted resize of {holder} to {mib}, model refuses"
            self.ledger = out
            self.model.held[holder] = (roles, mib)
            event("resize: grown" if mib > old else "resize: shrunk or kept")

    @precondition(lambda self: bool(self.ledger.roles))
    @rule(role=st.sampled_from(ROLE_IDS), data=st.data())
    def lists_each_reservation_on_a_role(self, role: str, data: st.DataObject) -> None:
        # a ledger carries its per-role lists to the ledgers derived from it: whichever
        # roles were asked before, each lists exactly the reservations there, by holder,
        # and so does a ledger kept from before the latest operations
        expected = tuple(sorted((h, m) for h, (rs, m) in self.model.held.items() if role in rs))
        assert self.ledger.reservations_on(role) == expected
        assert self.ledger.view(role).reservations == expected
        assert self.ledger.reservations_on(role) == expected  # asked again: the same
        for kept, held in self.kept:
            assert kept.reservations_on(role) == tuple(
                sorted((h, m) for h, (rs, m) in held.items() if role in rs)
            )
        if data.draw(st.booleans(), label="keep this ledger"):
            self.kept = [*self.kept[-2:], (self.ledger, dict(self.model.held))]

    @precondition(lambda self: bool(self.ledger.roles))
    @rule(roles=st.sampled_from([("a",), ("a", "b")]), mib=st.integers(1, 3000))
    def unknown_ledger_admits_nothing(self, roles: tuple[str, ...], mib: int) -> None:
        unknown = Ledger(self.ledger.roles, unknown=True)
        out = unknown.admit(GpuReservation("probe", roles, mib))
        assert isinstance(out, Refusal) and out.kind is RefusalKind.UNKNOWN_STATE
        assert all(t.committed_mib is None and t.free_mib is None for t in out.terms)

    def _check_refusal(self, out: Refusal, roles: tuple[str, ...], requested: int) -> None:
        assert [t.gpu_role for t in out.terms] == list(roles)
        for t in out.terms:
            role = self.model.roles[t.gpu_role]
            assert t.capacity_mib == role.capacity_mib
            assert t.reserve_mib == role.reserve_mib
            assert t.budget_mib == role.capacity_mib - role.reserve_mib
            assert t.committed_mib == self.model.committed(t.gpu_role)
            assert t.free_mib == t.budget_mib - t.committed_mib
            assert t.requested_mib == requested
            assert t.shortfall_mib == max(0, requested - t.free_mib)
            assert sum(m for _, m in t.reservations) == t.committed_mib
        assert any(t.shortfall_mib for t in out.terms)

    @invariant()
    def never_overcommitted(self) -> None:
        for rid, role in self.ledger.roles.items():
            assert self.ledger.committed_mib(rid) <= role.budget_mib, (
                f"{rid}: committed {self.ledger.committed_mib(rid)} > budget {role.budget_mib}"
            )
        assert self.ledger.overcommitted() == ()

    @invariant()
    def agrees_with_model(self) -> None:
        for rid in self.ledger.roles:
            assert self.ledger.committed_mib(rid) == self.model.committed(rid)
        assert set(self.ledger.holdings) == set(self.model.held)


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
