"""Convergence, checked on a planner input: plan, apply, plan again is empty.

:func:`assert_converges` plans, applies the plan with the simulator
(:func:`statemachine.planning.simulate.apply_plan`: every step succeeded), checks that the ledger
the applied observation yields is the plan's ledger after (GPU roles and host RAM), and
plans again: that plan must be empty.

One wait is the design's, not churn: engines that size themselves from free memory at
load (vLLM, SGLang) start one at a time per GPU role (docs/design.md, ordering), so a
serve blocked with ``waits for the start of`` a peer starts only once that peer is up,
in a later plan. The next plan may therefore carry out the starts (or wakes) of the
serves that waited in the one before, each with the room made for it in its own group,
and nothing else; the plans after it are held to the same rule until one is empty. An
elastic serve the plan before shrank may grow back there too: a start's stops can free
more than it takes, and the plan that makes that room gives the rest back to what it
shrank (the grow-back, in the same plan when nothing waits); a waited start makes its
room a plan later, so its grow-back comes a plan later.

A serve a plan stops while it runs on a start record larger than what it declares now
(an edit lowered or removed its reservation; the ledger counts the record until it
stops) starts again by itself in the next plan, at its declaration: the edit carried
out, not churn.

One known disagreement is let through, and pinned as a strict xfail
(``tests/core/test_planner_edges.py``): an elastic sleeper the plan wakes is weighed asleep for
the plan's later starts (at its residual, not at what it wakes to, and never shrunk),
so a start that needs its shrink, or the room its wake gives back, waits for the next
plan (the steps there of the serves the plan blocked, and the woken serve's grow, are
not counted as churn).

A placed serve (docs/placement.md) that a plan stops (evicted to make room, or moved off
the card a pinned serve needs) holds nothing afterwards: the next plan places it again,
on a card with room, and starts it there by itself (its own group, no room made for it);
that is the rule's second plan, not churn (tests/core/test_placement.py holds the same). So
is a placed serve the plan blocked on the card chosen for it because a serve started
ahead of it (placement weighs by the requests' age, the plan starts residents first: a
known disagreement, docs/placement.md) took the room: the next plan places it again
and starts it by itself.

Time does not pass between the plans (the simulator applies at the plan's ``now``), so
the inputs are taken :func:`timeless`: an ``idle_ttl_s`` of 0 ends a request the instant
its serve starts with nothing known in flight (docs/eviction.md, measured idleness), and
the next plan would stop that serve by the passage of no time at all; that is the
operator's setting, not the planner's churn, and the other properties keep drawing it.

Import as ``from support.convergence import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import json
from dataclasses import replace

from statemachine.domain.types import DesiredState, Observed
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import Action, Plan
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import apply_plan
from support.strategies import Scenario

#: the reason of a start held back for a loading peer (docs/operations.md, blocked texts)
WAITS_FOR_PEER = "waits for the start of"


def timeless(sc: Scenario) -> Scenario:
    """``sc`` with every ``idle_ttl_s`` of 0 made 60 (module docstring)."""
    serves = {
        n: replace(s, idle_ttl_s=60.0) if s.idle_ttl_s == 0 else s
        for n, s in sc.desired.serves.items()
    }
    return replace(sc, desired=replace(sc.desired, serves=serves))


def waited_for_a_peer(plan: Plan) -> set[str]:
    """The serves ``plan`` held back while a free-memory-sizing peer loads on their GPU."""
    return {b.serve for b in plan.blocked if WAITS_FOR_PEER in b.reason}


def stopped_placed(desired: DesiredState, plan: Plan) -> set[str]:
    """The placed serves ``plan`` stopped: the next plan places them again (module
    docstring)."""
    return {
        st.serve
        for st in plan.steps
        if st.action is Action.STOP and desired.serves[st.serve].placement
    }


def stopped_above_declaration(desired: DesiredState, observed: Observed, plan: Plan) -> set[str]:
    """The serves ``plan`` stops that ran on a start record larger than what they declare
    now: the next plan starts them at their declaration (module docstring)."""
    out = set()
    for st in plan.steps:
        s = desired.serves[st.serve]
        record = observed.started_with.get(s.container)
        if st.action is Action.STOP and record is not None and record.mib > (s.vram_mib or 0):
            out.add(st.serve)
    return out


def assert_converges(sc: Scenario, plan: Plan) -> None:
    """``plan`` (of ``sc``) applied, the next plan is empty but for the serialised starts
    (module docstring); the ledger of every applied observation is the plan's."""
    d, obs = sc.desired, sc.observed
    for round_ in range(len(d.serves) + 2):
        edited = stopped_above_declaration(d, obs, plan)
        obs = apply_plan(d, obs, plan, sc.now)
        ledger = ledger_from_observed(d, obs)
        where = f"after plan {round_ + 1}"
        assert dict(ledger.holdings) == dict(plan.ledger_after.holdings), where
        assert dict(ledger.host_holdings) == dict(plan.ledger_after.host_holdings), where
        again = plan_transitions(d, obs, sc.policy, sc.now)
        if again.empty:
            return
        waited = waited_for_a_peer(plan)
        placed_again = stopped_placed(d, plan) | {
            b.serve for b in plan.blocked if d.serves[b.serve].placement
        }
        shrunk = {st.serve for st in plan.steps if st.action is Action.SHRINK}
        grows_back = bool(waited & {st.group for st in again.steps})
        woken = {
            st.serve
            for st in plan.steps
            if st.action is Action.WAKE and d.serves[st.serve].elastic is not None
        }
        known = {b.serve for b in plan.blocked} | woken if woken else set()
        churn = [
            st
            for st in again.steps
            if st.group not in waited
            and st.group not in known
            and not (st.group in placed_again | edited and st.serve == st.group)
            and not (grows_back and st.action is Action.GROW and st.serve in shrunk)
        ]
        assert not churn, f"plan {round_ + 2} not empty:\n" + "\n".join(
            json.dumps(st.to_json()) for st in churn
        )
        plan = again
    raise AssertionError("no fixed point: plan, apply, plan again never came to an empty plan")
