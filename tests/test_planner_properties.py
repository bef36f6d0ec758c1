"""Property tests of ``plan_transitions`` over random small fleets (tests/strategies.py).

Properties (DESIGN §3, §5):

1. every prefix of a plan keeps committed <= budget on every role (a role observed
   over budget is never increased), and the replay ends at ``plan.ledger_after``;
2. only what the rules allow is stopped: desired stopped, an expired request, or an
   evictable victim of an on-demand requester (never a resident, never inside its
   ``min_runtime_s``); only wanted serves are started;
3. determinism: the same input gives the same plan JSON;
4. per-serve order: quiesce < drain < stop < release; reserve < start < await_ready <
   readmit;
5. convergence: plan, apply, plan again -> no steps, and the ledger after the plan is
   the ledger the applied observation yields;
6. docker unknown -> no steps at all;
7. unknown is never zero: with docker ok every blocked term is an int; with docker
   unknown every committed figure is None;
8. exclusivity holds after the plan (pre-existing violations aside);
9. a serve the plan starts shares its port with no running serve.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, note, settings
from strategies import Scenario, scenarios

from statemachine.ledger import Ledger, Refusal, ledger_from_observed
from statemachine.planner import Action, Plan, plan_transitions
from statemachine.simulate import apply_plan, ledger_prefixes
from statemachine.types import (
    DesiredRun,
    DesiredState,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
)

SETTINGS = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FAST = settings(SETTINGS, max_examples=150)


# ----- helpers ---------------------------------------------------------------------------
def plan_of(sc: Scenario) -> Plan:
    plan = plan_transitions(sc.desired, sc.observed, sc.policy, sc.now)
    note(json.dumps(plan.to_json()["steps"], indent=1))
    note(json.dumps(plan.to_json()["blocked"], indent=1))
    return plan


def holding(desired: DesiredState, observed: Observed) -> set[str]:
    """Serves whose container holds its reservation (running / paused / restarting)."""
    return {s.name for s in desired.serves.values() if observed.container(s.container).holds}


def requests_by_state(
    requests: tuple[OnDemandRequest, ...], serves: set[str], now: float
) -> tuple[set[str], set[str]]:
    """(serves with an active request, serves whose only requests expired)."""
    active = {r.serve for r in requests if r.serve in serves and not r.expired(now)}
    expired = {r.serve for r in requests if r.serve in serves and r.expired(now)} - active
    return active, expired


def by_serve(plan: Plan) -> dict[str, dict[Action, list[int]]]:
    """serve -> action -> indexes of its steps."""
    out: dict[str, dict[Action, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, step in enumerate(plan.steps):
        out[step.serve][step.action].append(i)
    return out


def names_with(plan: Plan, action: Action) -> list[str]:
    return [s.serve for s in plan.steps if s.action is action]


def committed(ledger: Ledger) -> dict[str, int]:
    return {r: ledger.committed_mib(r) for r in ledger.roles}


def fresh(s: ServeSpec, observed: Observed, now: float) -> bool:
    """Inside its min_runtime_s (anti-thrash)."""
    started = observed.container(s.container).started_at
    return s.min_runtime_s > 0 and started is not None and now - started < s.min_runtime_s


def shares_role(a: ServeSpec, b: ServeSpec) -> bool:
    return bool(set(a.gpu_roles) & set(b.gpu_roles))


# ----- 1. ledger prefixes ------------------------------------------------------------------
@SETTINGS
@given(scenarios(docker_ok=True))
def test_every_prefix_keeps_committed_within_budget(sc: Scenario) -> None:
    plan = plan_of(sc)
    before = committed(plan.ledger_before)
    ledger = plan.ledger_before
    for i, (step, result) in enumerate(ledger_prefixes(plan)):
        assert not isinstance(result, Refusal), f"step {i} {step.to_json()}: {result.message}"
        for role, spec in result.roles.items():
            limit = max(spec.budget_mib, before[role])
            assert result.committed_mib(role) <= limit, (
                f"step {i} {step.action} {step.serve}: {role} committed "
                f"{result.committed_mib(role)} > max(budget {spec.budget_mib}, "
                f"before {before[role]})"
            )
        ledger = result
    assert committed(ledger) == committed(plan.ledger_after)
    assert dict(ledger.holdings) == dict(plan.ledger_after.holdings)


# ----- 2. who is stopped, who is started --------------------------------------------------
@SETTINGS
@given(scenarios(docker_ok=True))
def test_stops_and_starts_follow_the_rules(sc: Scenario) -> None:
    d, obs = sc.desired, sc.observed
    plan = plan_of(sc)
    runs = holding(d, obs)
    active, expired = requests_by_state(d.requests, set(d.serves), sc.now)
    steps = list(plan.steps)
    starts = names_with(plan, Action.START)
    stops = names_with(plan, Action.STOP)
    assert len(set(starts)) == len(starts), "a serve started twice"
    assert len(set(stops)) == len(stops), "a serve stopped twice"
    assert not set(starts) & set(stops), "a serve both started and stopped"

    for name in starts:
        s = d.serves[name]
        assert name not in runs, f"{name} already runs"
        assert s.desired is not DesiredRun.STOPPED, f"{name} is desired stopped"
        assert s.desired is DesiredRun.RUNNING or name in active, (
            f"{name} started without being desired running or requested"
        )

    for i, step in enumerate(steps):
        if step.action is not Action.STOP:
            continue
        s = d.serves[step.serve]
        assert s.name in runs, f"{s.name} is stopped but does not run"
        if s.desired is DesiredRun.STOPPED:
            continue
        if s.name in expired and s.desired is not DesiredRun.RUNNING:
            continue
        # anything else is an eviction (for room, a port or exclusivity)
        assert s.residency is Residency.EVICTABLE, (
            f"{s.name} ({s.residency}) stopped though not desired stopped nor expired"
        )
        assert not fresh(s, obs, sc.now), f"{s.name} evicted inside its min_runtime_s"
        requester = next((t for t in steps[i + 1 :] if t.action is Action.START), None)
        assert requester is not None, f"{s.name} evicted, but nothing starts after it"
        r = d.serves[requester.serve]
        assert r.residency is Residency.ON_DEMAND, (
            f"{s.name} evicted for {r.name}, which is {r.residency}, not on-demand"
        )


# ----- 3. determinism -----------------------------------------------------------------------
def rebuilt(d: DesiredState, obs: Observed) -> tuple[DesiredState, Observed]:
    """Fresh copies of the inputs (new objects, same dict order)."""
    d2 = DesiredState(
        roles={k: v for k, v in d.roles.items()},
        serves={k: replace(v) for k, v in d.serves.items()},
        requests=tuple(OnDemandRequest(r.serve, r.requested_at, r.ttl_s) for r in d.requests),
    )
    o2 = Observed(
        docker_ok=obs.docker_ok,
        containers=dict(obs.containers.items()),
        gpus=obs.gpus,
        elastic_mib=dict(obs.elastic_mib.items()),
    )
    return d2, o2


@SETTINGS
@given(scenarios())
def test_same_input_same_plan(sc: Scenario) -> None:
    first = json.dumps(plan_of(sc).to_json(), sort_keys=True)
    again = json.dumps(plan_of(sc).to_json(), sort_keys=True)
    assert first == again
    d2, o2 = rebuilt(sc.desired, sc.observed)
    copy = json.dumps(plan_transitions(d2, o2, sc.policy, sc.now).to_json(), sort_keys=True)
    assert first == copy


# ----- 4. per-serve order -------------------------------------------------------------------
ORDER = (
    (Action.QUIESCE, Action.DRAIN),
    (Action.DRAIN, Action.STOP),
    (Action.QUIESCE, Action.STOP),
    (Action.STOP, Action.RELEASE),
    (Action.RESERVE, Action.START),
    (Action.START, Action.AWAIT_READY),
    (Action.AWAIT_READY, Action.READMIT),
)


@SETTINGS
@given(scenarios(docker_ok=True))
def test_per_serve_step_order(sc: Scenario) -> None:
    d = sc.desired
    plan = plan_of(sc)
    before = plan.ledger_before
    for name, acts in by_serve(plan).items():
        s = d.serves[name]
        for a in Action:
            assert len(acts.get(a, [])) <= 1, f"{name}: {a} twice"
        at = {a: idx[0] for a, idx in acts.items()}
        for a, b in ORDER:
            if a in at and b in at:
                assert at[a] < at[b], f"{name}: {b} at step {at[b]} before {a} at {at[a]}"
        tiered = bool(s.router_tier)
        stopping = Action.STOP in at
        starting = Action.START in at
        # what a stop and a start consist of
        assert (Action.QUIESCE in at) == (Action.DRAIN in at) == (stopping and tiered)
        assert (Action.RELEASE in at) == (stopping and before.holds(name)), (
            f"{name}: release iff it is stopped and held a reservation"
        )
        assert (Action.RESERVE in at) == (starting and s.vram_mib is not None and d.in_ledger(s)), (
            f"{name}: reserve iff it is started and in the ledger"
        )
        assert (Action.AWAIT_READY in at) == starting
        assert (Action.READMIT in at) == (starting and tiered)


# ----- 5. convergence -------------------------------------------------------------------------
@SETTINGS
@given(scenarios(docker_ok=True))
def test_plan_apply_plan_again_is_empty(sc: Scenario) -> None:
    d = sc.desired
    plan = plan_of(sc)
    obs2 = apply_plan(d, sc.observed, plan, sc.now)
    after = ledger_from_observed(d, obs2)
    assert committed(after) == committed(plan.ledger_after)
    assert dict(after.holdings) == dict(plan.ledger_after.holdings)
    plan2 = plan_transitions(d, obs2, sc.policy, sc.now)
    assert plan2.steps == (), "second plan not empty:\n" + "\n".join(
        json.dumps(s.to_json()) for s in plan2.steps
    )


# ----- 6. docker unknown --------------------------------------------------------------------
@FAST
@given(scenarios(docker_ok=False))
def test_docker_unknown_plans_nothing(sc: Scenario) -> None:
    plan = plan_of(sc)
    assert plan.steps == ()
    assert plan.ledger_before.unknown and plan.ledger_after.unknown
    active, expired = requests_by_state(sc.desired.requests, set(sc.desired.serves), sc.now)
    wants = {s.name for s in sc.desired.serves.values() if s.managed} | active | expired
    assert {b.serve for b in plan.blocked} == wants


# ----- 7. unknown never zero --------------------------------------------------------------
@SETTINGS
@given(scenarios())
def test_blocked_terms_are_ints_when_known_and_none_when_unknown(sc: Scenario) -> None:
    plan = plan_of(sc)
    doc = json.loads(json.dumps(plan.to_json()))
    for row in list(doc["ledger_before"].values()) + list(doc["ledger_after"].values()):
        for key in ("committed_mib", "free_mib"):
            if sc.observed.docker_ok:
                assert isinstance(row[key], int)
            else:
                assert row[key] is None, f"unknown {key} printed as {row[key]!r}"
    for b in plan.blocked:
        for t in b.terms:
            assert t.requested_mib > 0
            if sc.observed.docker_ok:
                for v in (t.committed_mib, t.free_mib, t.shortfall_mib):
                    assert isinstance(v, int) and not isinstance(v, bool), (
                        f"{b.serve}: term {t} not an int while docker is ok"
                    )
                assert t.free_mib == t.budget_mib - t.committed_mib
                assert sum(m for _, m in t.reservations) == t.committed_mib
            else:
                assert t.committed_mib is None and t.free_mib is None


# ----- 8. exclusivity ------------------------------------------------------------------------
@SETTINGS
@given(scenarios(docker_ok=True))
def test_exclusive_serves_run_alone_after_the_plan(sc: Scenario) -> None:
    d = sc.desired
    plan = plan_of(sc)
    before = holding(d, sc.observed)
    after = holding(d, apply_plan(d, sc.observed, plan, sc.now))
    for x in (d.serves[n] for n in sorted(after)):
        if not x.exclusive:
            continue
        for y in (d.serves[n] for n in sorted(after)):
            if y.name == x.name or not y.gpu_inference or not shares_role(x, y):
                continue
            assert x.name in before and y.name in before, (
                f"exclusive {x.name} on {x.gpu_roles} runs beside {y.name} on {y.gpu_roles} "
                f"after the plan (before: {sorted(before)})"
            )


# ----- 9. ports ---------------------------------------------------------------------------------
@SETTINGS
@given(scenarios(docker_ok=True))
def test_started_serves_do_not_share_a_port(sc: Scenario) -> None:
    d = sc.desired
    plan = plan_of(sc)
    after = holding(d, apply_plan(d, sc.observed, plan, sc.now))
    for name in names_with(plan, Action.START):
        s = d.serves[name]
        if s.port is None:
            continue
        others = sorted(n for n in after if n != name and d.serves[n].port == s.port)
        assert not others, f"{name} started on port {s.port} beside {others}"


# ----- a fixed shape ----------------------------------------------------------------------------
def test_empty_fleet_plans_nothing() -> None:
    plan = plan_transitions(DesiredState(roles={}, serves={}), Observed(docker_ok=True))
    assert plan.steps == () and plan.blocked == ()
