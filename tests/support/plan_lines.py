"""A planner case's plan, each prefix of it replayed within the budget, and the plan as
``"action serve"`` lines (with the three lines of a start).

Shared by the planner's boundary, deferral and figure tests; what a plan must be stays
in them.
"""

from __future__ import annotations

from dataclasses import replace

from statemachine.domain import types as sm
from statemachine.planning.plan_types import (
    Plan,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.planning.simulate import ledger_prefixes
from support.plan_cases import NOW, Case, _build

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
