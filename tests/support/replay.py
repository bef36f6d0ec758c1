"""The overcommit invariant of docs/design.md (the ledger), checked on a plan's steps.

"committed ≤ budget on every role after every operation the controller performs; only
something outside the controller can overcommit", and the same for host RAM held by
sleepers. :func:`assert_never_overcommits` replays a plan's steps on a naive model of
the reservations (a dict of holder -> roles and MiB, totals summed afresh at every
step), independent of the ledger under test, and checks after each step, for every
GPU role and the host budget:

- a role within its budget before the plan stays within it after every step;
- a step never raises a role above its budget: on a role observed over budget (by
  starts outside the controller) the controller's own reservations never add to what
  is there, even after a release made room below the old level;

and that the naive model and the ledger's own replay (``ledger_prefixes``) hold the
same reservations at every step, ending at ``plan.ledger_after``.

Import as ``from support.replay import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from statemachine.ledger.reservations import Ledger, Refusal
from statemachine.planning.plan_types import Action, Plan, Step
from statemachine.planning.simulate import ledger_prefixes


@dataclass
class NaiveReservations:
    """holder -> (roles, MiB) and holder -> host MiB, changed as each step says."""

    held: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, ledger: Ledger) -> NaiveReservations:
        return cls(
            {h: (r.gpu_roles, r.mib) for h, r in ledger.holdings.items()},
            dict(ledger.host_holdings),
        )

    def committed(self, role: str) -> int:
        return sum(mib for roles, mib in self.held.values() if role in roles)

    def host_committed(self) -> int:
        return sum(self.host.values())

    def resize(self, holder: str, mib: int) -> None:
        roles, _ = self.held[holder]
        self.held[holder] = (roles, mib)

    def apply(self, step: Step) -> None:
        """What ``step`` does to the reservations once it succeeded."""
        act, name = step.action, step.serve
        if act is Action.RESERVE and step.mib is not None:
            assert name not in self.held, f"{name} reserved twice"
            self.held[name] = (step.gpu_roles, step.mib)
        elif act is Action.RELEASE:
            del self.held[name]
            self.host.pop(name, None)
        elif act in (Action.SHRINK, Action.GROW) and step.to_mib is not None:
            self.resize(name, step.to_mib)
        elif act is Action.RELEASE_TO_RESIDUAL and step.to_mib is not None:
            self.resize(name, step.to_mib)
            if step.host_mib:
                self.host[name] = step.host_mib
        elif act is Action.RESERVE_WAKE and step.to_mib is not None:
            self.resize(name, step.to_mib)
            self.host.pop(name, None)


def first_overcommit(budget: int, committed: list[int]) -> str | None:
    """Where the series ``committed`` (before the plan, then after each step) breaks the
    invariant against ``budget``; None when it holds."""
    for i in range(1, len(committed)):
        prev, now = committed[i - 1], committed[i]
        if committed[0] <= budget < now:
            return f"step {i - 1}: committed {now} > budget {budget} (within it before the plan)"
        if now > budget and now > prev:
            return (
                f"step {i - 1}: committed {prev} -> {now}, above the budget {budget}: the "
                "controller's own step added to an overcommitted budget"
            )
    return None


def assert_never_overcommits(plan: Plan) -> Ledger:
    """Check the invariant (module docstring) on every prefix of ``plan``; the replayed
    ledger after the last step."""
    naive = NaiveReservations.of(plan.ledger_before)
    roles = plan.ledger_before.roles
    series = {r: [naive.committed(r)] for r in roles}
    host_series = [naive.host_committed()]
    ledger = plan.ledger_before
    for i, (step, result) in enumerate(ledger_prefixes(plan)):
        where = f"step {i} {step.action} {step.serve}"
        assert not isinstance(result, Refusal), f"{where}: {result.message}"
        naive.apply(step)
        for r in roles:
            series[r].append(naive.committed(r))
        host_series.append(naive.host_committed())
        assert {h: (x.gpu_roles, x.mib) for h, x in result.holdings.items()} == naive.held, where
        assert dict(result.host_holdings) == naive.host, where
        ledger = result
    steps = [f"{s.action} {s.serve}" for s in plan.steps]
    for r, spec in roles.items():
        broken = first_overcommit(spec.budget_mib, series[r])
        assert broken is None, f"{r}: {broken} ({steps})"
    host = plan.ledger_before.host
    if host is not None:
        broken = first_overcommit(host.budget_mib, host_series)
        assert broken is None, f"host RAM: {broken} ({steps})"
    assert dict(ledger.holdings) == dict(plan.ledger_after.holdings)
    assert dict(ledger.host_holdings) == dict(plan.ledger_after.host_holdings)
    return ledger
