"""The observed ledger's own construction (``statemachine.ledger.reservations._counted``, fed by
``ledger_from_observed`` as it counts) against the checked constructor, and the PMap
reads with changes pending and folded.

``ledger_from_observed`` counts each holding as it finds it and builds the ledger
without a second walk or the constructor's checks: it must read exactly as
``Ledger(roles, holdings, host=..., host_holdings=...)`` of the same holdings, and a
holder named twice is still refused.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.strategies import Scenario, hosts, report_cases

from statemachine.domain import types as sm
from statemachine.ledger.pmap import PMap
from statemachine.ledger.reservations import Ledger, ledger_from_observed


def _same(got: Ledger, want: Ledger) -> None:
    assert got.unknown == want.unknown
    assert dict(got.roles) == dict(want.roles)
    assert list(got.holdings.items()) == list(want.holdings.items())
    assert dict(got.host_holdings) == dict(want.host_holdings)
    assert got.host == want.host
    for role in want.roles:
        assert got.committed_mib(role) == want.committed_mib(role)
        assert got.reservations_on(role) == want.reservations_on(role)
        assert got.view(role) == want.view(role)
    assert got.overcommitted() == want.overcommitted()
    assert got.host_view() == want.host_view()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts())
def test_the_counted_ledger_reads_as_the_checked_one(sc: Scenario) -> None:
    report_cases(sc)
    got = ledger_from_observed(sc.desired, sc.observed)
    checked = Ledger(
        sc.desired.roles,
        got.holdings.values(),
        host=sc.desired.host,
        host_holdings=got.host_holdings,
    )
    _same(got, checked)
    for role in sc.desired.roles:  # its terms list each role's reservations as the checked one's
        assert got.terms("x", (role,), 1) == checked.terms("x", (role,), 1)


def test_the_counted_ledger_owns_its_figures() -> None:
    """Two ledgers from one observation share nothing an operation changes."""
    role = sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0)
    a = sm.ServeSpec(name="a", container="c-a", gpu_roles=("g",), vram_mib=4_000)
    desired = sm.DesiredState(roles={"g": role}, serves={"a": a})
    observed = sm.Observed(True, {"c-a": sm.ContainerObs(sm.ContainerState.RUNNING)})
    first = ledger_from_observed(desired, observed)
    released = first.release("a")
    assert isinstance(released, Ledger)
    assert first.committed_mib("g") == 4_000 and released.committed_mib("g") == 0
    assert ledger_from_observed(desired, observed).committed_mib("g") == 4_000


@pytest.mark.parametrize("second", ["b", "a"])
def test_a_holder_counted_twice_is_refused(second: str) -> None:
    """Two entries of one serve name (no manifest makes it; a caller could): refused
    as the checked constructor refuses it, whichever the entry's key."""
    role = sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0)
    a = sm.ServeSpec(name="a", container="c-a", gpu_roles=("g",), vram_mib=1_000)
    twin = replace(a, container="c-b")
    serves = {"a": a, second + "2": twin}
    running = sm.ContainerObs(sm.ContainerState.RUNNING)
    observed = sm.Observed(True, {"c-a": running, "c-b": running})
    with pytest.raises(ValueError, match="reservation holder 'a' appears twice"):
        ledger_from_observed(sm.DesiredState(roles={"g": role}, serves=serves), observed)
    with pytest.raises(ValueError, match="reservation holder 'a' appears twice"):
        Ledger(
            {"g": role},
            [
                ledger_from_observed(
                    sm.DesiredState(roles={"g": role}, serves={"a": a}), observed
                ).holdings["a"]
            ]
            * 2,
        )


OPS = st.lists(st.tuples(st.sampled_from("abcdefgh"), st.none() | st.integers(0, 9)), max_size=60)


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 9)), OPS)
def test_pmap_reads_with_changes_pending_and_after_folding(
    base: dict[str, int], ops: list[tuple[str, int | None]]
) -> None:
    """``get`` and ``in`` read the pending changes, and once the map is flattened (by
    iterating it) the one dict: the same answers either way, before and after."""
    m: PMap[str, int] = PMap._own(dict(base))
    d = dict(base)
    for key, value in ops:
        if value is None:
            if key in d:
                event("a present key deleted")
                del d[key]
                m = m.delete(key)
        else:
            event("a key set again" if key in d else "a new key set")
            d[key] = value
            m = m.set(key, value)
    event(f"changes: {'none' if not ops else '1-15' if len(ops) < 16 else '16 or more'}")
    for flattened in (False, True):
        if flattened:
            assert list(m) == list(d)
        for key in "abcdefghz":
            assert (key in m) == (key in d)
            assert m.get(key) == d.get(key)
            assert m.get(key, -1) == d.get(key, -1)
