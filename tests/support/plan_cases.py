"""The planner's table cases (``Case``) and the builders they are written with: a
serve, a running container, a request, the desired state and observation a case stands
for, and its plan (each prefix of which stays within the budget) as ``"action serve"``
lines.

Shared by the planner's and admission's rule tables; what a plan must be stays in them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from statemachine import types as sm
from statemachine.planner import Plan, Policy, plan_transitions
from statemachine.simulate import ledger_prefixes
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


ELASTIC = "http://127.0.0.1:1"


def plan_of(
    case: Case,
    policy: Policy | None = None,
    starting: dict[str, int] | None = None,
    unreleased: frozenset[str] = frozenset(),
) -> Plan:
    desired, observed = _build(case)
    if starting:
        # a start in progress on the roles its serve declares, at the MiB given
        observed = replace(
            observed,
            starting={
                n: sm.StartingObs(desired.serves[n].gpu_roles, mib) for n, mib in starting.items()
            },
        )
    if unreleased:
        observed = replace(observed, unreleased=unreleased)
    plan = plan_transitions(desired, observed, policy or Policy(), NOW)
    for step, ledger in ledger_prefixes(plan):
        assert not hasattr(ledger, "kind"), f"{step}: {ledger}"
    return plan


def lines(plan: Plan) -> list[str]:
    return [f"{s.action} {s.serve}" for s in plan.steps]


START = ["reserve {0}", "start {0}", "await_ready {0}"]


def starts(*names: str) -> list[str]:
    return [line.format(n) for n in names for line in START]
