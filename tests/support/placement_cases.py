"""Placement's cases over two cards, ``a`` (budget 10000 MiB) and ``b`` (6000): serves
placed on either or pinned to one, the desired state, a plan and what it placed where.

Shared by the placement tests; nothing here asserts.
"""

from __future__ import annotations

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Plan, Policy
from statemachine.planning.planner import plan_transitions
from support.core import spec as core_spec

NOW = 1_000_000.0
ROLES = {"a": sm.GpuRole("a", 10000), "b": sm.GpuRole("b", 6000)}
RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 3600)


def placed(name: str, mib: int, *, on: tuple[str, ...] = ("a", "b"), **kw: object) -> sm.ServeSpec:
    return pinned(name, mib, *on, placement=on, **kw)


def pinned(name: str, mib: int, *roles: str, **kw: object) -> sm.ServeSpec:
    """An evictable serve, running, on ``roles`` (one in the tests: pinned there)."""
    residency = kw.pop("residency", sm.Residency.EVICTABLE)
    desired = kw.pop("desired", sm.DesiredRun.RUNNING)
    return core_spec(name, mib, residency, roles=roles, desired=desired, **kw)  # type: ignore[arg-type]


def host(*serves: sm.ServeSpec, requests: tuple[sm.OnDemandRequest, ...] = ()) -> sm.DesiredState:
    return sm.DesiredState(ROLES, {s.name: s for s in serves}, requests)


def plan(desired: sm.DesiredState, observed: sm.Observed) -> Plan:
    return plan_transitions(desired, observed, Policy(), NOW)


def running(*names: str, on: dict[str, str] | None = None) -> sm.Observed:
    """The serves' containers running; ``on``: serve -> the role it was started on."""
    with_ = {f"c-{n}": sm.StartedWith(n, (r,), 0) for n, r in (on or {}).items()}
    return sm.Observed(True, {f"c-{n}": RUNNING for n in names}, started_with=with_)


def roles_of(p: Plan, serve: str) -> tuple[str, ...]:
    return p.ledger_after.holdings[serve].gpu_roles
