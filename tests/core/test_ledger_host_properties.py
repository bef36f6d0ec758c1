"""The ledger against the host: never below what the containers really hold.

The overcommit property (tests/core/test_planner_properties.py, 1) checks the ledger a plan
leaves against the budget, but that ledger is built from the observation, so a ledger
that miscounts what the host holds passes it. Here a simulated host, built from the
scenario independently of :mod:`statemachine.ledger.reservations`, says what each container really
holds on which card and how much host RAM (docs/design.md §3, the ledger):

- a running (paused, restarting) container of a serve with a reservation: on the card
  its environment names (what its ``up`` was told), else the roles of the reservation
  it was started with, else every role it declares (a placed serve whose card is not
  known runs on one of its candidates: the ledger must cover each); as much as it was
  started with (its record, else its reservation), or what it was shrunk to; asleep,
  the residual it was put to sleep with (else the one it declares; the engine did not
  answer: as if awake) and, at level 1, its host RAM;
- a container that exited but whose memory is not back (``unreleased``): what it held;
- a start in progress: what was reserved for it, where;
- a running container no serve declares any more, with a start record: that record.

Then the plan's steps are applied to the host in order, as the executor carries them
out: a stop leaves the memory held until its release confirms it back, a start takes
its reservation on the card it starts on, a shrink or a grow takes the engine to its
new size, a sleep leaves the residual and takes host RAM, a wake takes the full
reservation back and gives the host RAM up. Before the plan and after every step, the
ledger (:func:`statemachine.planning.simulate.ledger_prefixes`, ending at ``plan.ledger_after``)
counts on every card at least what the host holds there, and host RAM likewise.

Import-free of the planner's internals; ``VRAMCTL_PROPERTY_EXAMPLES`` sets the depth as
for the other properties.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, note, settings, target
from support.strategies import NOW, Scenario, case_share, crowded_hosts, every_scenario, hosts

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import Ledger, Refusal
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Policy,
    Step,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.planning.simulate import ledger_prefixes

EXAMPLES = int(os.environ.get("VRAMCTL_PROPERTY_EXAMPLES", "400"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Held:
    """What one engine really holds: MiB on each of ``cards``, and host RAM."""

    cards: tuple[str, ...]
    mib: int
    host_mib: int = 0
    #: what it takes awake (woken: an elastic serve shrunk before its sleep wakes shrunk)
    full: int = 0
    #: why it holds (for the report): running, asleep, unreleased, starting, ...
    why: str = "running"


@dataclass
class SimHost:
    """A host's engines, by holder (the ledger's holder names), and what each holds."""

    desired: sm.DesiredState
    engines: dict[str, Held] = field(default_factory=dict)
    #: the engine's weights go to host RAM at the sleep call itself and leave it at the
    #: wake; False: counted from the ``release_to_residual`` after the sleep to the
    #: ``reserve_wake`` before the wake, where the ledger takes and gives them back (the
    #: known gap, test_host_ram_is_counted_from_the_sleep_itself below)
    host_ram_at_sleep: bool = False

    def on(self, card: str) -> int:
        return sum(h.mib for h in self.engines.values() if card in h.cards)

    def host_ram(self) -> int:
        return sum(h.host_mib for h in self.engines.values())

    def counted(self, roles: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(r for r in dict.fromkeys(roles) if r in self.desired.roles)

    # ----- what the host holds before the plan --------------------------------------
    @classmethod
    def of(cls, desired: sm.DesiredState, observed: sm.Observed) -> SimHost:
        host = cls(desired)
        for name, start in observed.starting.items():
            host.engines[name] = Held(host.counted(start.gpu_roles), start.mib, why="starting")
        declared = {s.container for s in desired.serves.values()}
        for s in desired.serves.values():
            if s.name in observed.starting:
                continue
            held = host.running(s, observed)
            if held is None and s.name in observed.unreleased and s.vram_mib is not None:
                held = Held(host.counted(s.gpu_roles), s.vram_mib, why="unreleased")
            if held is not None:
                host.engines[s.name] = held
        for container, record in sorted(observed.started_with.items()):
            if container in declared or not observed.container(container).holds:
                continue
            if record.serve in host.engines:  # the ledger names it by its container then
                holder = f"{record.serve} ({container})"
            else:
                holder = record.serve
            host.engines[holder] = Held(host.counted(record.gpu_roles), record.mib, why="gone")
        return host

    def running(self, s: sm.ServeSpec, observed: sm.Observed) -> Held | None:
        """What the container of ``s`` holds while it occupies memory (None: nothing)."""
        obs = observed.container(s.container)
        if not obs.holds:
            return None
        record = observed.started_with.get(s.container)
        if record is None and s.vram_mib is None:
            return None  # no reservation and no record: nothing the ledger can count
        if obs.told_roles:
            cards = obs.told_roles
        elif record is not None:
            cards = record.gpu_roles
        else:
            cards = s.gpu_roles  # a placed serve's card unknown: any candidate
        mib = record.mib if record is not None else s.vram_mib
        assert mib is not None
        mib = observed.elastic_mib.get(s.name, mib)
        slept = observed.sleep.get(s.name)
        held = self.awake(s, observed, cards, mib, slept)
        held.full = mib
        return held

    def awake(self, s, observed, cards, mib, slept):  # type: ignore[no-untyped-def]
        if slept is None or slept.state is sm.SleepState.AWAKE:
            return Held(self.counted(cards), mib)
        level = slept.level if slept.level is not None else (s.sleep.level if s.sleep else 1)
        host_ram = slept.host_ram_mib
        if host_ram is None:
            host_ram = s.sleep.host_ram_mib if s.sleep is not None else 0
        host_ram = host_ram if level == 1 else 0
        if slept.state is sm.SleepState.UNKNOWN:  # it did not answer: as if awake
            return Held(self.counted(cards), mib, host_ram if slept.level else 0, "unknown")
        residual = slept.residual_mib
        if residual is None:
            residual = s.sleep.residual_mib if s.sleep is not None else mib
        return Held(self.counted(cards), residual, host_ram, "asleep")

    # ----- a step carried out ---------------------------------------------------------
    def apply(self, step: Step) -> None:
        s = self.desired.serves[step.serve]
        act, name = step.action, step.serve
        held = self.engines.get(name)
        if act is Action.RELEASE:  # the stop's memory confirmed back
            self.engines.pop(name, None)
        elif act is Action.START and s.vram_mib is not None:
            cards = self.counted(step.gpu_roles or s.gpu_roles)
            mib = step.mib or s.vram_mib
            self.engines[name] = Held(cards, mib, full=mib, why="started")
        elif act in (Action.SHRINK, Action.GROW) and held is not None:
            assert step.to_mib is not None
            held.mib = step.to_mib
        elif act is Action.SLEEP and held is not None and s.sleep is not None:
            held.mib = min(held.mib, s.sleep.residual_mib)
            held.why = "asleep"
            if self.host_ram_at_sleep:
                held.host_mib = s.sleep.host_mib
        elif act is Action.RELEASE_TO_RESIDUAL and held is not None and s.sleep is not None:
            held.host_mib = s.sleep.host_mib
        elif act is Action.RESERVE_WAKE and held is not None and not self.host_ram_at_sleep:
            held.host_mib = 0  # where the ledger gives it back (the known gap)
        elif act is Action.WAKE and held is not None and s.vram_mib is not None:
            held.mib = held.full or s.vram_mib
            held.host_mib = 0
            held.why = "woken"

    def short(self, ledger: Ledger) -> list[str]:
        """Where ``ledger`` counts less than the host holds (empty: nowhere)."""
        out = [
            f"{r}: ledger {ledger.committed_mib(r)} < host {self.on(r)} "
            f"({self.holders(r)}; ledger {dict(ledger.reservations_on(r))})"
            for r in ledger.roles
            if ledger.committed_mib(r) < self.on(r)
        ]
        if ledger.host_committed_mib() < self.host_ram():
            out.append(
                f"host RAM: ledger {ledger.host_committed_mib()} < host {self.host_ram()} "
                f"({ {h: e.host_mib for h, e in self.engines.items() if e.host_mib} }; "
                f"ledger {dict(ledger.host_holdings)})"
            )
        return out

    def holders(self, card: str) -> dict[str, str]:
        return {h: f"{e.mib} {e.why}" for h, e in self.engines.items() if card in e.cards}


def assert_ledger_covers_the_host(sc: Scenario, plan: Plan, *, strict: bool = False) -> int:
    """The property (module docstring) on ``plan``; the number of points checked.
    ``strict``: host RAM held from the sleep call on (``SimHost.host_ram_at_sleep``)."""
    host = SimHost.of(sc.desired, sc.observed)
    host.host_ram_at_sleep = strict
    short = host.short(plan.ledger_before)
    assert not short, "before the plan: " + "; ".join(short)
    ledger = plan.ledger_before
    for i, (step, result) in enumerate(ledger_prefixes(plan)):
        assert not isinstance(result, Refusal), f"step {i}: {result.message}"
        host.apply(step)
        ledger = result
        short = host.short(ledger)
        assert not short, f"after step {i} {step.action} {step.serve}: " + "; ".join(short)
    assert dict(ledger.holdings) == dict(plan.ledger_after.holdings)
    assert not host.short(plan.ledger_after)
    return len(plan.steps) + 1


def _plan(sc: Scenario) -> Plan:
    note(repr(sc))
    plan = plan_transitions(sc.desired, sc.observed, sc.policy, sc.now)
    note("\n".join(f"{s.action} {s.serve} {s.gpu_roles} {s.mib} {s.to_mib}" for s in plan.steps))
    return plan


def cases(sc: Scenario) -> set[str]:
    """The cases this property is about that ``sc`` reaches (module docstring)."""
    d, obs = sc.desired, sc.observed
    plan = plan_transitions(d, obs, sc.policy, sc.now)
    acts = {s.action for s in plan.steps}
    out = {f"plan {a}" for a in acts & {Action.SLEEP, Action.WAKE, Action.SHRINK, Action.STOP}}
    if Action.START in acts:
        out.add("plan start")
    for s in d.serves.values():
        held = obs.container(s.container).holds
        if s.name in obs.unreleased and not held and s.vram_mib is not None:
            out.add("unreleased")
        if s.placement and held:
            out.add("placed serve running")
        if held and obs.sleep_of(s.name).asleep:
            out.add("asleep")
        if held and s.name in obs.elastic_mib:
            out.add("shrunk")
    if obs.starting:
        out.add("starting")
    if any(c in obs.started_with for c in (s.container for s in d.serves.values())):
        out.add("start record")
    return out


@SETTINGS
@given(every_scenario())
def test_the_ledger_never_counts_less_than_the_host_holds(sc: Scenario) -> None:
    plan = _plan(sc)
    for case in sorted(cases(sc)):
        event(case)
    target(float(len(plan.steps)), label="steps checked against the host")
    assert_ledger_covers_the_host(sc, plan)


#: the least share of examples (of :func:`every_scenario`, derandomized) in which each
#: case the property is about occurs; observed at the time of writing in brackets (the
#: draws shift with what the test process loaded: "plan sleep" reads 4.7 % under the
#: test command since the engines' KV layouts came in, 19 % in a process of its own)
FLOORS = {
    "unreleased": 0.06,  # (14%)
    "asleep": 0.04,  # (10%)
    "shrunk": 0.04,  # (9%)
    "starting": 0.10,  # (23%)
    "start record": 0.02,  # (5%)
    "plan sleep": 0.03,  # (10%, then 4.7%)
    "plan wake": 0.04,  # (8%)
    "plan shrink": 0.02,  # (5%)
    "plan stop": 0.20,  # (44%)
    "plan start": 0.25,  # (53%)
}


def test_the_property_reaches_its_cases() -> None:
    """Each case occurs in at least its floor's share of 300 derandomized examples."""
    low = {}
    for case, floor in FLOORS.items():
        share = case_share(every_scenario(), lambda sc, c=case: c in cases(sc), examples=300)
        if share < floor:
            low[case] = f"{share:.1%} < {floor:.0%}"
    assert not low, low


def test_placed_serves_that_run_are_drawn() -> None:
    """A placed serve that runs (its card known or not) in a tenth or so of placed hosts
    (the floor lower still: the derandomized draws shift with the modules loaded)."""
    share = case_share(
        hosts(placed=True), lambda sc: "placed serve running" in cases(sc), examples=100
    )
    assert share >= 0.04, f"{share:.0%} of placed hosts run a placed serve"


def test_a_crowded_host_is_covered_too() -> None:
    """The sleep, wake and shrink cases, from the strategy made for them."""
    share = case_share(crowded_hosts(), lambda sc: "plan sleep" in cases(sc), examples=100)
    assert share >= 0.3, f"{share:.0%} of crowded hosts put a serve to sleep"


@pytest.mark.xfail(
    strict=True,
    reason="a level-1 sleeper's host RAM is taken by the ledger at release_to_residual, "
    "after the sleep call that fills it: between the two the ledger counts less host RAM "
    "than the host holds",
)
def test_host_ram_is_counted_from_the_sleep_itself() -> None:
    roles = {"g0": sm.GpuRole("g0", 1000)}
    sleeper = sm.ServeSpec(
        "alpha", "c-alpha", ("g0",), 1000, sm.Residency.EVICTABLE,
        sleep=sm.Sleep(1, 250, next(iter(SleepProtocol)), 1),
    )  # fmt: skip
    wants = sm.ServeSpec("bravo", "c-bravo", ("g0",), 1, sm.Residency.ON_DEMAND)
    desired = sm.DesiredState(
        roles, {"alpha": sleeper, "bravo": wants}, (sm.OnDemandRequest("bravo", NOW - 1),),
        host=sm.HostBudget(1000),
    )  # fmt: skip
    up = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 3600)
    sc = Scenario(desired, sm.Observed(True, {"c-alpha": up}), NOW, Policy())
    plan = plan_transitions(sc.desired, sc.observed, sc.policy, sc.now)
    assert [s.action for s in plan.steps][:2] == [Action.SLEEP, Action.RELEASE_TO_RESIDUAL]
    assert_ledger_covers_the_host(sc, plan, strict=True)
