"""The planner's invariants hold where the loop counts uses (docs/eviction.md, "Reload
costs by use").

Every scenario of the shared generator, with each serve's uses and reload costs drawn
(some known, some unknown, some never used), through the same properties as
``tests/core/test_planner_properties.py``: no prefix of a plan overcommits a GPU role or the
host RAM; stops and starts follow the rules (a resident, an on-demand serve or a serve
inside its ``min_runtime_s`` is never a victim, whatever its uses; a sleeper stopped to
give its host RAM is an evictable serve, stopped in the group of the victim that sleeps
there); plan, apply, plan again is empty. And the rules' own promises: a sleeper is
stopped for host RAM only for a victim worth more asleep per MiB, and a request that
waits for room that frees by itself has waited less than its victims' expected reload.
Pure: statemachine only.
"""

from __future__ import annotations

import re
from dataclasses import replace

import test_planner_properties as props
from hypothesis import event, given
from hypothesis import strategies as st
from support.convergence import assert_converges, timeless
from support.replay import assert_never_overcommits
from support.strategies import Scenario, assert_reaches, every_scenario

from statemachine.domain import types as sm
from statemachine.planning.plan_types import Action, Policy, RestoreCost

SETTINGS, plan_of = props.SETTINGS, props.plan_of


@st.composite
def counted(draw: st.DrawFn, sc: Scenario, unknowns: bool = True) -> Scenario:
    """``sc`` with every serve's uses counted (0-6, in the last two hours) and, for most,
    a cold start and a wake (with ``unknowns``, either may be unknown)."""
    uses: dict[str, tuple[float, ...]] = {}
    reload = dict(sc.policy.reload)
    maybe = st.none() if unknowns else st.nothing()
    for name in sc.desired.serves:
        ages = draw(st.lists(st.floats(0, 7200), max_size=6))
        uses[name] = tuple(sorted(sc.now - a for a in ages))
        if draw(st.integers(0 if unknowns else 1, 3)):
            cold = draw(maybe | st.floats(1, 120))
            wake = draw(maybe | st.floats(0.1, 10))
            reload[name] = RestoreCost(cold, wake)
    return replace(sc, policy=replace(sc.policy, uses=uses, reload=reload))


def with_uses(sleepers: bool = True) -> st.SearchStrategy[Scenario]:
    return every_scenario(sleepers=sleepers).flatmap(counted)


@SETTINGS
@given(with_uses())
def test_no_prefix_overcommits_where_uses_are_counted(sc: Scenario) -> None:
    assert_never_overcommits(plan_of(sc))


@SETTINGS
@given(with_uses())
def test_stops_and_starts_follow_the_rules_where_uses_are_counted(sc: Scenario) -> None:
    props.test_stops_and_starts_follow_the_rules.hypothesis.inner_test(sc)  # type: ignore[attr-defined]


@SETTINGS
@given(with_uses(sleepers=False).map(timeless))
def test_plan_apply_plan_again_is_empty_where_uses_are_counted(sc: Scenario) -> None:
    assert_converges(sc, plan_of(sc))


WORTH = re.compile(r"saves (\S+) s of waiting an hour per MiB of host RAM, (\S+) (\S+)$")
WAITED = re.compile(r"expected to cost (\S+)s of reloads later .* has waited \((\S+)s\)")


HOST_RAM_STOP = "can sleep in its host RAM"
WAITS_FOR_ROOM = "waits for room that frees by itself"


def promise_cases(sc: Scenario) -> set[str]:
    """The promises a plan of ``sc`` puts to the test (by name)."""
    plan = plan_of(sc)
    out = set()
    if any(st.action is Action.STOP and HOST_RAM_STOP in st.reason for st in plan.steps):
        out.add("a sleeper stopped for host RAM")
    if any(WAITS_FOR_ROOM in b.reason for b in plan.blocked):
        out.add("a request waits for room that frees by itself")
    return out


@SETTINGS
@given(with_uses())
def test_the_rules_of_use_keep_their_own_promises(sc: Scenario) -> None:
    plan = plan_of(sc)
    for case in promise_cases(sc):
        event(case)
    for step in plan.steps:
        if step.action is not Action.STOP or HOST_RAM_STOP not in step.reason:
            continue
        found = WORTH.search(step.reason)
        assert found is not None, f"the reason no longer says the worths: {step.reason}"
        # a sleeper stopped for host RAM: evictable, worth less than the victim that sleeps
        theirs, mine = float(found.group(1)), float(found.group(3))
        assert theirs < mine or f"{theirs:.3g}" == f"{mine:.3g}", step.reason
        assert sc.desired.serves[step.serve].residency is sm.Residency.EVICTABLE, step.reason
        assert any(t.action is Action.SLEEP and t.serve == found.group(2) for t in plan.steps), (
            step.reason
        )
    for b in plan.blocked:
        if WAITS_FOR_ROOM not in b.reason:
            continue
        found = WAITED.search(b.reason)
        assert found is not None, f"the reason no longer says the cost and the wait: {b.reason}"
        # it waits only while it has waited less than the cost
        assert float(found.group(2)) < float(found.group(1)) + 0.05, b.reason


@st.composite
def crowded_sleepers(draw: st.DrawFn) -> Scenario:
    """One card and a host RAM budget both nearly full: sleepers asleep, evictable serves
    awake that can sleep, a resident, an on-demand serve busy with a request, and an
    on-demand requester; uses and costs drawn (the cases the rules of use are for)."""
    now = 100_000.0
    n_asleep = draw(st.integers(0, 4))
    n_awake = draw(st.integers(1, 4))
    serves: dict[str, sm.ServeSpec] = {}
    containers: dict[str, sm.ContainerObs] = {}
    sleep: dict[str, sm.SleepObs] = {}
    in_flight: dict[str, sm.InFlightObs] = {}
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
    for i in range(n_asleep + n_awake):
        name = f"s{i}"
        host = draw(st.integers(1000, 30_000))
        serves[name] = sm.ServeSpec(
            name=name,
            container=f"c-{name}",
            gpu_roles=("a",),
            vram_mib=draw(st.integers(2000, 12_000)),
            residency=sm.Residency.EVICTABLE,
            sleep=sm.Sleep(1, 500, "vllm", host),
        )
        containers[f"c-{name}"] = up
        in_flight[name] = sm.InFlightObs(0, sm.InFlightSource.METRICS)
        if i < n_asleep:
            sleep[name] = sm.SleepObs(sm.SleepState.ASLEEP, level=1)
    serves["res"] = sm.ServeSpec(
        name="res", container="c-res", gpu_roles=("a",), vram_mib=4000,
        residency=sm.Residency.RESIDENT, desired=sm.DesiredRun.RUNNING,
    )  # fmt: skip
    containers["c-res"] = up
    serves["busy"] = sm.ServeSpec(
        name="busy", container="c-busy", gpu_roles=("a",), vram_mib=draw(st.integers(2000, 12_000)),
        residency=sm.Residency.ON_DEMAND,
    )  # fmt: skip
    containers["c-busy"] = up
    in_flight["busy"] = sm.InFlightObs(draw(st.integers(0, 3)), sm.InFlightSource.METRICS)
    serves["req"] = sm.ServeSpec(
        name="req", container="c-req", gpu_roles=("a",), vram_mib=draw(st.integers(2000, 20_000)),
        residency=sm.Residency.ON_DEMAND,
    )  # fmt: skip
    requests = (
        sm.OnDemandRequest("busy", now - 600),
        sm.OnDemandRequest("req", now - draw(st.floats(0, 300))),
    )
    # both budgets just above what is held: the requester is short, a sleep needs RAM
    held = sum(500 if n in sleep else (s.vram_mib or 0) for n, s in serves.items() if n != "req")
    taken = sum(s.sleep.host_mib for n, s in serves.items() if n in sleep and s.sleep)
    desired = sm.DesiredState(
        {"a": sm.GpuRole("a", held + draw(st.integers(0, 6000)), 0)},
        serves,
        requests,
        host=sm.HostBudget(taken + draw(st.integers(0, 20_000)), 0),
    )
    observed = sm.Observed(True, containers, sleep=sleep, in_flight=in_flight)
    sc = Scenario(desired, observed, now, Policy())
    return draw(counted(sc, unknowns=draw(st.integers(0, 3)) == 0))


@SETTINGS
@given(crowded_sleepers())
def test_the_rules_of_use_keep_their_promises_on_a_crowded_card(sc: Scenario) -> None:
    assert_never_overcommits(plan_of(sc))
    test_the_rules_of_use_keep_their_own_promises.hypothesis.inner_test(sc)  # type: ignore[attr-defined]
    props.test_stops_and_starts_follow_the_rules.hypothesis.inner_test(sc)  # type: ignore[attr-defined]


#: each promise's least share of 300 derandomized draws of crowded_sleepers() (3 to 14 %
#: measured: the draws shift with the modules loaded; at least three draws each)
PROMISE_FLOORS = {
    "a sleeper stopped for host RAM": 0.01,
    "a request waits for room that frees by itself": 0.01,
}


def test_the_crowded_card_puts_each_promise_to_the_test() -> None:
    """The promises above are not kept vacuously: the crowded card reaches each."""
    assert_reaches(crowded_sleepers(), promise_cases, PROMISE_FLOORS, examples=300)
