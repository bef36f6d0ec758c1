"""The manifest types' defaults and the request's TTL boundary (statemachine/domain/types.py).

The defaults are the manifest's documented ones (docs/manifest.md): a role without a
reserve lends its whole capacity (and a ``[host]`` without one all its RAM), a serve
without ``priority`` is at 0, one without ``min_runtime_s`` may be stopped at once. A
request's TTL has run out at the instant it ends. Pure: imports statemachine only.
"""

from __future__ import annotations

import pytest

from statemachine.domain.types import GpuRole, HostBudget, OnDemandRequest, Residency, ServeSpec
from statemachine.ledger.reservations import Ledger


def test_a_role_without_reserve_lends_its_whole_capacity() -> None:
    role = GpuRole("g0", 24_000)
    view = Ledger({"g0": role}).view("g0")
    assert (role.reserve_mib, view.reserve_mib, view.budget_mib) == (0, 0, 24_000)


def test_a_host_without_reserve_lends_all_its_ram_to_sleepers() -> None:
    host = HostBudget(64_000)
    assert (host.reserve_mib, host.budget_mib) == (0, 64_000)
    assert Ledger({}, host=host).host_free_mib() == 64_000


def test_a_serve_without_priority_or_min_runtime_takes_the_documented_defaults() -> None:
    s = ServeSpec("emb", "c-emb", ("g0",), 2_000, Residency.EVICTABLE)
    assert (s.priority, s.min_runtime_s) == (0, 0.0)


@pytest.mark.parametrize(
    ("now", "expired"),
    [(1_059.0, False), (1_060.0, True), (1_061.0, True), (999.0, False)],
)
def test_a_request_expires_at_the_instant_its_ttl_ends(now: float, expired: bool) -> None:
    assert OnDemandRequest("q", 1_000.0, ttl_s=60.0).expired(now) is expired


def test_a_request_without_ttl_never_expires() -> None:
    assert not OnDemandRequest("q", 1_000.0).expired(10**9)
