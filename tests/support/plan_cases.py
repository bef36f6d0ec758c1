"""The planner's table cases (``Case``) and the builders they are written with: a
serve, a running container, a request, and the desired state and observation a case
stands for.

Shared by the planner's and admission's rule tables; nothing here plans or asserts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from statemachine.domain import types as sm
from support.core import spec

NOW = 10_000.0
RUN, STOP = sm.DesiredRun.RUNNING, sm.DesiredRun.STOPPED
RES, EVI, OND = sm.Residency.RESIDENT, sm.Residency.EVICTABLE, sm.Residency.ON_DEMAND


def serve(
    name: str,
    mib: int | None,
    residency: sm.Residency | None,
    desired: sm.DesiredRun | None = None,
    *,
    roles: tuple[str, ...] = ("a",),
    **kw: object,
) -> sm.ServeSpec:
    return spec(name, mib, residency, roles=roles, desired=desired, **kw)


def up(started: float = 0.0) -> sm.ContainerObs:
    return sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=started)


@dataclass
class Case:
    serves: list[sm.ServeSpec]
    running: dict[str, sm.ContainerObs]
    expect_steps: list[str]
    expect_blocked: list[str] = field(default_factory=list)
    requests: list[sm.OnDemandRequest] = field(default_factory=list)
    roles: dict[str, tuple[int, int]] = field(default_factory=lambda: {"a": (32_000, 2_000)})
    docker_ok: bool = True
    elastic_mib: dict[str, int] = field(default_factory=dict)
    blocked_mentions: list[str] = field(default_factory=list)


def req(name: str, ttl: float | None = None, at: float = NOW - 1) -> sm.OnDemandRequest:
    return sm.OnDemandRequest(name, at, ttl)


def _build(case: Case) -> tuple[sm.DesiredState, sm.Observed]:
    roles = {r: sm.GpuRole(r, cap, res) for r, (cap, res) in case.roles.items()}
    desired = sm.DesiredState(roles, {s.name: s for s in case.serves}, tuple(case.requests))
    observed = sm.Observed(
        case.docker_ok,
        {f"c-{n}": obs for n, obs in case.running.items()},
        elastic_mib=case.elastic_mib,
    )
    return desired, observed
