"""Two requests are never promised the same room: ``up`` after ``up``, as a property.

tests/shell/test_pending_requests.py shows it on examples; here a generated host (its
recorded requests taken away) is asked a sequence of ``up`` s, with repeats (the request
queue asks again each time it looks at a queued request, and a client may ask again),
through the pure answer :func:`statemachine.answers.up_decision.decide_up` (what the API's
``up`` route and the queue call, by way of ``Situation.up``). Each 202 is recorded as
the API records it (``journal.add_request``: the serve's request replaced by one made
now), unless the serve already runs awake without a request (the API's "already
running", which records nothing), so the next answer sees it pending
(:mod:`statemachine.answers.pending`).

The promise is modelled from the ledger of what is held (:func:`ledger_from_observed`)
and the 202s' own steps, independently of :mod:`statemachine.answers.pending`:

- each admitted request that still stands (the next cycle starts it) takes the
  reservation its 202's reserve (or ``reserve_wake``) step names, on that step's roles
  (a serve that held something there already, a sleeper at its residual: the larger);
- each victim of a standing request's 202 (its ``release``, ``release_to_residual`` and
  ``shrink`` steps) comes down to the lowest level any of those answers planned for it,
  counted once, however many requests count on it.

Which admitted requests still stand is the planner's own answer: the next cycle's plan
for the whole desired state (:func:`plan_transitions`, every recorded request) starts
them. Each request it starts was admitted, at the size its 202 said and where it said
(a placed serve may be started on another of its candidates, the plan weighing every
request's card together: its promise is then that start and the room the plan makes
for it); an admitted request may be left out only when it has ended
(:func:`statemachine.planning.idleness.in_force`) or a request admitted after it comes ahead of
it in the start order (docs/eviction.md, "Backfill and priority": residents, then
on-demand requests oldest first, then the rest by priority; an on-demand request is
answered as if made now, so it may go ahead of an evictable serve's request admitted
before it, which then waits for room). Three more reasons are tolerated, known
disagreements each kept as a strict xfail below: a serve the manifest wants running,
down and not held back, which the next cycle starts ahead of every request (``up`` does
not weigh it); a standing placed request the plan has moved onto the request's card
since the previous answer (placed serves are placed by their requests' age, which is
not the whole start order, so a younger request can still take an older one's room that
way); and a request
admitted after it, which the plan starts and which conflicts with it (exclusivity, a
port: the older request waits for the stops the younger one forces, then cannot run
beside it).

After every answer, on every card, the promise is within the budget, or (a card over
budget as observed: containers started outside the controller) no more than it was
before the answer; and what the answers count as pending
(:func:`statemachine.answers.pending.pending_starts`) is exactly the standing requests, at their
reservations, on their cards.

The queue's own refusals (a 202 held back while other requests wait ahead on the role)
only admit fewer requests, so they are not modelled. Imports only ``statemachine``
(the mutation tool's pure pool); ``VRAMCTL_PROPERTY_EXAMPLES`` sets the depth.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from support.strategies import (
    NOW,
    SERVE_NAMES,
    Scenario,
    case_shares,
    crowded_hosts,
    every_scenario,
    gpu_roles,
)

from statemachine.answers.pending import pending_starts
from statemachine.answers.up_decision import decide_up
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.admission import can_request, conflict
from statemachine.planning.idleness import in_force
from statemachine.planning.plan_types import (
    Action,
    Policy,
    Step,
)
from statemachine.planning.planner import (
    plan_transitions,
)

EXAMPLES = int(os.environ.get("VRAMCTL_PROPERTY_EXAMPLES", "150"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: the steps that give a victim's room back (their ``mib`` is what they free)
ROOM = frozenset({Action.RELEASE, Action.RELEASE_TO_RESIDUAL, Action.SHRINK})
#: the steps that take a requester's room
TAKE = frozenset({Action.RESERVE, Action.RESERVE_WAKE})
#: the steps that bring a serve up (one outside the ledger reserves nothing)
BRING = TAKE | {Action.START, Action.WAKE}
RETRY_S = 5.0


@dataclass(frozen=True)
class Asks:
    """A host with no requests recorded, and the ``up`` s asked of it in turn: the serve
    and the seconds since the previous ask (0: the same instant)."""

    sc: Scenario
    asks: tuple[tuple[str, float], ...]


@st.composite
def shared_cards(draw: st.DrawFn) -> Scenario:
    """Requests that fit one at a time and not all together: one or two cards, a
    resident running on each (never a victim), zero to two evictable serves running
    beside it (some can sleep, some are elastic), and two to four on-demand serves
    and an evictable one that hold nothing, each sized between a third of what is
    free and what evicting every evictable would leave (so each fits alone, mostly
    by making room, and two together often do not); now and then two share a port,
    and one is placed on both cards."""
    roles = draw(gpu_roles(max_roles=2))
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 3600)
    serves: dict[str, sm.ServeSpec] = {}
    containers: dict[str, sm.ContainerObs] = {}
    names = iter(SERVE_NAMES)
    free: dict[str, int] = {}
    room: dict[str, int] = {}
    for rid, role in roles.items():
        left = role.budget_mib
        name = next(names)
        mib = draw(st.integers(0, left // 2))
        if mib:
            spec = sm.ServeSpec(name, f"ctr-{name}", (rid,), mib, sm.Residency.RESIDENT)
            serves[name] = replace(spec, desired=sm.DesiredRun.RUNNING)
            containers[spec.container] = up
            left -= mib
        room[rid] = left
        for _ in range(draw(st.integers(0, 2))):
            if left < 2:
                break
            name = next(names)
            mib = draw(st.integers(1, left))
            spec = sm.ServeSpec(name, f"ctr-{name}", (rid,), mib, sm.Residency.EVICTABLE)
            kind = draw(st.sampled_from(["plain", "sleep", "elastic"]))
            if kind == "sleep" and mib > 1:
                spec = replace(spec, sleep=sm.Sleep(2, max(1, mib // 8), next(iter(SleepProtocol))))
            elif kind == "elastic" and mib > 1:
                url = f"http://127.0.0.1:9000/{name}"
                spec = replace(spec, elastic=sm.Elastic(url, mib // 2, segment_mib=1))
            serves[name] = spec
            containers[spec.container] = up
            left -= mib
        free[rid] = left
    for k in range(draw(st.integers(2, 5))):
        name = next(names)
        rid = draw(st.sampled_from(sorted(roles)))
        placed = len(roles) == 2 and draw(st.integers(0, 3)) == 0
        on = tuple(sorted(roles)) if placed else (rid,)
        most = max(1, min(room[r] for r in on))
        least = max(1, min(most, max(free[r] for r in on) // 3))
        residency = sm.Residency.EVICTABLE if k == 4 else sm.Residency.ON_DEMAND
        spec = sm.ServeSpec(
            name,
            f"ctr-{name}",
            on,
            draw(st.integers(least, most)),
            residency,
            port=draw(st.sampled_from([None, None, None, 8000])),
            priority=draw(st.integers(0, 1)),
            placement=on if placed else (),
        )
        serves[name] = spec
    desired = sm.DesiredState(roles, serves, ())
    return Scenario(desired, sm.Observed(docker_ok=True, containers=containers), NOW, Policy())


@st.composite
def asks(draw: st.DrawFn) -> Asks:
    """A generated host (:func:`every_scenario`, crowded hosts and :func:`shared_cards`
    weighted up), its requests taken away, and one to six ``up`` s of requestable serves
    (on-demand ones more often; the same serve again, now and then)."""
    kind = draw(st.sampled_from(["any", "crowded", "shared", "shared"]))
    source = {"any": every_scenario(), "crowded": crowded_hosts(), "shared": shared_cards()}
    sc = draw(source[kind])
    desired = replace(sc.desired, requests=())
    names = sorted(n for n in desired.serves if can_request(desired, n) is None)
    if not names:
        return Asks(replace(sc, desired=desired), ())
    od = [n for n in names if desired.serves[n].residency is sm.Residency.ON_DEMAND]
    pick = st.sampled_from(names)
    if od:
        pick = st.one_of(st.sampled_from(od), st.sampled_from(od), st.sampled_from(names))
    picks: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        again = picks and draw(st.integers(0, 3)) == 0
        picks.append(draw(st.sampled_from(picks)) if again else draw(pick))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 1.0]), min_size=len(picks)))
    return Asks(replace(sc, desired=desired), tuple(zip(picks, gaps, strict=False)))


@dataclass(frozen=True)
class Promise:
    """What a 202 promised: its answer's index and time, the serve's reserve step and
    the room its steps make: (victim, role) -> the MiB the victim holds there after them
    (0 released; its residual, or what it is shrunk to)."""

    index: int
    at: float
    take: Step
    room: dict[tuple[str, str], int]


def promise_of(serve: str, index: int, at: float, steps: Iterable[Step]) -> Promise | None:
    """The promise of a 202 for ``serve`` with ``steps`` (None: it reserves nothing, as
    a serve whose start is in progress already)."""
    steps = tuple(steps)
    take = next((s for s in steps if s.serve == serve and s.action in TAKE), None)
    if take is None:
        return None
    room: dict[tuple[str, str], int] = {}
    for s in steps:
        if s.serve != serve and s.action in ROOM:
            after = 0 if s.action is Action.RELEASE else s.to_mib
            assert after is not None, f"{s.action} {s.serve} says nothing of what it leaves"
            for role in s.gpu_roles:
                room[(s.serve, role)] = min(room.get((s.serve, role), after), after)
    return Promise(index, at, take, room)


def take_mib(take: Step) -> int:
    """What a serve holds once its reserve is made: its MiB; woken, what the wake takes
    it back to (an elastic serve shrunk before its sleep wakes shrunk)."""
    if take.action is Action.RESERVE_WAKE:
        return take.to_mib or 0
    return take.mib or 0


def counted_mib(desired: sm.DesiredState, take: Step) -> int:
    """What the answers count for a pending reserve: its MiB; a sleeper being woken at
    its full reservation (docs/operations.md, "What counts")."""
    if take.action is Action.RESERVE_WAKE:
        return desired.serves[take.serve].vram_mib or take.to_mib or 0
    return take.mib or 0


def start_rank(s: sm.ServeSpec, requested_at: float) -> tuple[int, float, int, str]:
    """Where ``s``, requested at ``requested_at``, comes in the start order
    (docs/eviction.md, "Backfill and priority"): residents by priority; on-demand
    serves, manifest ``running`` first, then requests by age, then by priority; the
    rest by priority; names last."""
    if s.residency is sm.Residency.RESIDENT:
        return (0, 0.0, -s.priority, s.name)
    if s.residency is sm.Residency.ON_DEMAND:
        when = -1.0 if s.desired is sm.DesiredRun.RUNNING else requested_at
        return (1, when, -s.priority, s.name)
    return (2, 0.0, -s.priority, s.name)


def promised(
    desired: sm.DesiredState, held: dict[str, dict[str, int]], standing: dict[str, Promise]
) -> dict[str, int]:
    """The MiB promised on each card: what is held, each victim of a standing request at
    the lowest level any of their answers planned (once), and each standing request at
    its reservation on its roles."""
    lowest: dict[tuple[str, str], int] = {}
    for p in standing.values():
        for key, mib in p.room.items():
            lowest[key] = min(lowest.get(key, mib), mib)
    level = {
        holder: {r: min(mib, lowest.get((holder, r), mib)) for r, mib in on.items()}
        for holder, on in held.items()
    }
    for serve, p in standing.items():
        mine = level.setdefault(serve, {})
        for role in p.take.gpu_roles:
            if role in desired.roles:
                mine[role] = max(mine.get(role, 0), take_mib(p.take))
    return {r: sum(on.get(r, 0) for on in level.values()) for r in desired.roles}


@dataclass
class Trace:
    """What a walk saw, for the report and the case counts."""

    statuses: list[int] = field(default_factory=list)
    cases: set[str] = field(default_factory=set)
    #: the desired state the answers left (the requests recorded), and when
    desired: sm.DesiredState | None = None
    now: float = 0.0


def walk(a: Asks) -> Trace:
    """Ask each ``up`` in turn and check the promise after each answer (module doc)."""
    sc, trace = a.sc, Trace(desired=a.sc.desired)
    desired, observed, policy = sc.desired, sc.observed, sc.policy
    ledger = ledger_from_observed(desired, observed)
    held = {h: dict.fromkeys(res.gpu_roles, res.mib) for h, res in ledger.holdings.items()}
    before = {r: ledger.committed_mib(r) for r in desired.roles}
    if any(mib > desired.roles[r].budget_mib for r, mib in before.items()):
        trace.cases.add("a card over budget as observed")
    promises: dict[str, Promise] = {}
    admitted: dict[str, int] = {}  # serve -> the answer that recorded its request
    standing: dict[str, Promise] = {}
    excused: set[str] = set()  # left out for a placed request moved (until asked again)
    now = sc.now
    for index, (serve, gap) in enumerate(a.asks):
        now += gap
        trace.now = now
        d = decide_up(desired, observed, serve, policy=policy, now=now, default_retry_s=RETRY_S)
        trace.statuses.append(d.status)
        note(f"{index}: up {serve} at +{now - sc.now:g}s: {d.status} {d.message}")
        recorded = {r.serve for r in desired.requests}
        spec = desired.serves[serve]
        c = observed.container(spec.container)
        if d.status != 202:
            if recorded and d.status in (409, 429):
                alone = replace(desired, requests=())
                if decide_up(alone, observed, serve, policy=policy, now=now,
                             default_retry_s=RETRY_S).status == 202:  # fmt: skip
                    trace.cases.add("refused for a pending request")
        elif c.holds and serve not in recorded and not observed.sleep_of(serve).asleep:
            pass  # "already running": nothing recorded
        else:
            others = tuple(r for r in desired.requests if r.serve != serve)
            desired = replace(desired, requests=(*others, sm.OnDemandRequest(serve, now)))
            trace.desired = desired
            admitted[serve] = index
            excused.discard(serve)
            steps = [Step.from_json(s) for s in d.body["steps"]]
            p = promise_of(serve, index, now, steps)
            if p is None:
                promises.pop(serve, None)
            else:
                promises[serve] = p
        standing = check_standing(
            desired, observed, policy, now, promises, admitted, (standing, excused), trace
        )
        after = promised(desired, held, standing)
        note(f"   promised {after} (before {before}); standing {sorted(standing)}")
        for role, mib in after.items():
            budget = desired.roles[role].budget_mib
            assert mib <= max(budget, before[role]), (
                f"{role}: {mib} MiB promised over its budget {budget} "
                f"(before this answer: {before[role]})"
            )
        before = after
        check_pending(desired, observed, policy, now, standing)
        count_cases(standing, trace)
    return trace


def check_standing(
    desired: sm.DesiredState,
    observed: sm.Observed,
    policy: Policy,
    now: float,
    promises: dict[str, Promise],
    admitted: dict[str, int],
    seen: tuple[dict[str, Promise], set[str]],
    trace: Trace,
) -> dict[str, Promise]:
    """The admitted requests the next cycle starts (its plan for the whole desired
    state, :func:`plan_transitions`), each with what it was promised; checks that each
    request that plan starts was promised that reservation, and that every other
    admitted request may be left out (module doc). ``seen``: the standing requests after
    the previous answer, and those left out since for a placed request moved onto their
    card (added to here)."""
    before, excused = seen
    plan = plan_transitions(desired, observed, policy, now)
    starts = {s.serve: s for s in plan.steps if s.action in TAKE and s.group == s.serve}
    started = {s.serve for s in plan.steps if s.action in BRING and s.group == s.serve}
    requested = {r.serve: r for r in desired.requests}
    standing: dict[str, Promise] = {}
    for serve, step in starts.items():
        if serve not in requested or not in_force(
            requested[serve], desired.serves[serve], observed, now
        ):
            continue  # the manifest's start (a request that is over starts nothing)
        assert serve in promises, f"the next cycle starts {serve}, which no answer promised"
        promise = promises[serve]
        take = promise.take
        assert take_mib(step) == take_mib(take), (
            f"{serve}: promised {take_mib(take)} MiB on {take.gpu_roles}, "
            f"the next cycle reserves {take_mib(step)} MiB on {step.gpu_roles}"
        )
        if step.gpu_roles != take.gpu_roles:
            # a placed serve: the next cycle weighs every request's card together, and
            # may start it on another candidate, with the room the plan makes there
            placement = desired.serves[serve].placement
            assert placement and set(step.gpu_roles) <= set(placement), (
                f"{serve}: promised on {take.gpu_roles}, the next cycle reserves on "
                f"{step.gpu_roles}, which is not one of its candidates {placement}"
            )
            trace.cases.add("a placed request started on another card")
            group = [s for s in plan.steps if s.group == serve]
            elsewhere = promise_of(serve, promise.index, promise.at, group)
            assert elsewhere is not None
            promise = elsewhere
        standing[serve] = promise
    if any(p.take.gpu_roles != promises[q].take.gpu_roles for q, p in standing.items()):
        # a request moved: the room the plan makes for the others is made around it
        # (a victim shrunk for each in turn), so their victims' levels are the plan's too
        for q, p in standing.items():
            planned = promise_of(q, p.index, p.at, [s for s in plan.steps if s.group == q])
            room = dict(p.room)
            for key, mib in (planned.room if planned else {}).items():
                room[key] = min(room.get(key, mib), mib)
            standing[q] = replace(p, room=room)
    for serve, p in promises.items():
        if serve in standing:
            continue
        spec = desired.serves[serve]
        if not in_force(requested[serve], spec, observed, now):
            trace.cases.add("an admitted request ended")
            continue
        mine = start_rank(spec, requested[serve].requested_at)
        ahead = [
            q
            for q, at in admitted.items()
            if at > p.index and start_rank(desired.serves[q], requested[q].requested_at) < mine
        ]
        if ahead:
            trace.cases.add("an admitted request left waiting for a later one ahead of it")
            continue
        # a known disagreement (test_an_older_request_is_not_left_out_for_a_younger_
        # exclusive_one): the older waits for the stops the younger one forces, and then
        # cannot run beside it
        rival = [
            q
            for q, at in admitted.items()
            if at > p.index and q in started and conflict(spec, desired.serves[q]) is not None
        ]
        if rival:
            trace.cases.add("an admitted request left waiting for a later conflicting one")
            continue
        # a known disagreement: placed serves are placed by their requests' age, not in
        # the whole start order, so a later request may still move a placed one that
        # stands onto this request's card
        mine_on = set(p.take.gpu_roles)
        moved = [
            q
            for q, s in standing.items()
            if q in before
            and s.take.gpu_roles != before[q].take.gpu_roles
            and mine_on & set(s.take.gpu_roles)
        ]
        if moved or serve in excused:
            excused.add(serve)
            trace.cases.add("an admitted request left waiting for a placed one moved")
            continue
        # a known disagreement (test_a_request_is_not_admitted_into_the_room_a_manifest_
        # start_takes): `up` does not weigh the manifest's serves the next cycle starts first
        manifest = [
            m
            for m in started
            if desired.serves[m].desired is sm.DesiredRun.RUNNING
            and start_rank(desired.serves[m], 0.0) < mine
        ]
        assert manifest, (
            f"{serve} was admitted ({p.take.action} {take_mib(p.take)} MiB on "
            f"{p.take.gpu_roles}) and the next cycle does not start it, but no request "
            f"admitted after it comes ahead of it in the start order"
        )
        trace.cases.add("an admitted request left waiting for a manifest start")
    return standing


def check_pending(
    desired: sm.DesiredState,
    observed: sm.Observed,
    policy: Policy,
    now: float,
    standing: dict[str, Promise],
) -> None:
    """What the answers count as pending (:func:`pending_starts`) is the standing
    requests, at their reservations, where the next cycle starts them."""
    pending = {
        p.serve: (p.gpu_roles, p.mib)
        for p in pending_starts(desired, observed, policy=policy, now=now)
    }
    expected = {
        serve: (p.take.gpu_roles, counted_mib(desired, p.take)) for serve, p in standing.items()
    }
    assert pending == expected, f"counted as pending {pending}, the next cycle starts {expected}"


def count_cases(standing: dict[str, Promise], trace: Trace) -> None:
    """The cases the property is about, as the standing requests reach them."""
    on_role: dict[str, int] = {}
    victims: dict[str, int] = {}
    for p in standing.values():
        for role in p.take.gpu_roles:
            on_role[role] = on_role.get(role, 0) + 1
        for v in {v for v, _ in p.room}:
            victims[v] = victims.get(v, 0) + 1
    if any(n >= 2 for n in on_role.values()):
        trace.cases.add("two requests promised on one role")
    if any(n >= 2 for n in victims.values()):
        trace.cases.add("a victim shared by two requests")
    if any(p.room for p in standing.values()):
        trace.cases.add("a request promised room made by victims")


def cases(a: Asks) -> set[str]:
    """The cases a walk reaches (for :func:`case_shares`)."""
    trace = walk(a)
    out = set(trace.cases)
    if trace.statuses.count(202) >= 2:
        out.add("two 202s")
    return out


@SETTINGS
@given(asks())
def test_two_requests_are_never_promised_the_same_room(a: Asks) -> None:
    for case in sorted(cases(a)):
        event(case)


#: the least share of examples (of :func:`asks`, derandomized) in which each case the
#: property is about occurs; observed at the time of writing in brackets, this file run
#: alone / with tests/shell/test_pending_requests.py collected first (the draws then differ:
#: the floors hold for both)
FLOORS = {
    "two 202s": 0.35,  # (71% / 83%)
    "two requests promised on one role": 0.05,  # (23% / 11%)
    "refused for a pending request": 0.03,  # (10% / 6%)
    "a request promised room made by victims": 0.15,  # (53% / 29%)
    "a victim shared by two requests": 0.01,  # (13% / 1.3%)
    "an admitted request left waiting for a later one ahead of it": 0.01,  # (2% / 1.3%)
    "a card over budget as observed": 0.01,  # (9% / 2.7%)
}


def test_the_property_reaches_its_cases() -> None:
    """Each case occurs in at least its floor's share of 150 derandomized examples."""
    shares = case_shares(asks(), cases, examples=150)
    low = {
        case: f"{shares.get(case, 0.0):.1%} < {floor:.0%}"
        for case, floor in FLOORS.items()
        if shares.get(case, 0.0) < floor
    }
    assert not low, low


@pytest.mark.xfail(
    strict=True,
    reason="up weighs a request beside what is held and the requests pending, not beside "
    "the manifest's serves that are down and not held back: the next cycle starts a "
    "resident (or an on-demand serve desired running) ahead of every request, so a 202 "
    "can promise the room that start takes, and the request then waits",
)
def test_a_request_is_not_admitted_into_the_room_a_manifest_start_takes() -> None:
    """Budget 10000; a resident (6000) desired running has exited and is not held back;
    ``up a`` (5000, on-demand) is answered 202, and the next cycle starts the resident
    and blocks a."""
    roles = {"g0": sm.GpuRole("g0", 10000)}
    res = sm.ServeSpec("res", "c-res", ("g0",), 6000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING)
    a = sm.ServeSpec("a", "c-a", ("g0",), 5000, sm.Residency.ON_DEMAND)
    desired = sm.DesiredState(roles, {"res": res, "a": a}, ())
    down = sm.ContainerObs(sm.ContainerState.EXITED, started_at=NOW - 100, exit_code=0)
    observed = sm.Observed(docker_ok=True, containers={"c-res": down})
    d = decide_up(desired, observed, "a", policy=Policy(), now=NOW, default_retry_s=RETRY_S)
    asked = replace(desired, requests=(sm.OnDemandRequest("a", NOW),))
    plan = plan_transitions(asked, observed, Policy(), NOW)
    started = [s.serve for s in plan.steps if s.action is Action.RESERVE]
    kept = started == (["res", "a"] if d.status == 202 else ["res"])
    assert kept, (
        f"up a: {d.status} {d.message}; the next cycle reserves for {started}, "
        f"blocks {[b.serve for b in plan.blocked]}"
    )


def test_a_placed_request_is_not_moved_onto_an_older_ones_room() -> None:
    """Cards of 30000 and 40000 MiB, nothing held. ``up a`` (20000, placed on both):
    202 on g0 (best fit). ``up b`` (15000, pinned on g0): 202, the plan moving a to g1.
    ``up c`` (25000, placed on both, declared first): placed in the planner's order
    (docs/placement.md: the oldest request first), a keeps g1 and c finds no room, so
    its ``up`` is not admitted; every admitted request is reserved for by the next
    cycle. (Placed in declared order, c went first and moved a back onto g0, where b,
    older than c, no longer fitted.)"""
    roles = {"g0": sm.GpuRole("g0", 30000), "g1": sm.GpuRole("g1", 40000)}

    def on_demand(name: str, mib: int, *on: str) -> sm.ServeSpec:
        placement = on if len(on) > 1 else ()
        return sm.ServeSpec(name, f"c-{name}", on, mib, sm.Residency.ON_DEMAND, placement=placement)

    serves = {
        "c": on_demand("c", 25000, "g0", "g1"),
        "a": on_demand("a", 20000, "g0", "g1"),
        "b": on_demand("b", 15000, "g0"),
    }
    desired = sm.DesiredState(roles, serves, ())
    observed = sm.Observed(docker_ok=True)
    admitted = []
    for i, serve in enumerate("abc"):
        d = decide_up(desired, observed, serve, policy=Policy(), now=NOW + i, default_retry_s=1)
        if d.status == 202:
            admitted.append(serve)
            asked = sm.OnDemandRequest(serve, NOW + i)
            desired = replace(desired, requests=(*desired.requests, asked))
    plan = plan_transitions(desired, observed, Policy(), NOW + 2)
    started = sorted(s.serve for s in plan.steps if s.action is Action.RESERVE)
    assert started == sorted(admitted), (
        f"admitted {admitted}; the next cycle reserves for {started}, blocks "
        f"{[(b.serve, b.reason) for b in plan.blocked]}"
    )


@pytest.mark.xfail(
    strict=True,
    reason="an older request whose shortfall the stops a younger exclusive request forces "
    "would cover waits for them (docs/eviction.md, backfill and priority), and then "
    "cannot run beside the younger one: up answers the younger 202 and the next cycle "
    "starts it and blocks the older one, admitted before",
)
def test_an_older_request_is_not_left_out_for_a_younger_exclusive_one() -> None:
    """Budget 32000; an evictable (30000) runs. ``up a`` (15000): 202 after stopping it.
    ``up x`` (6000, exclusive on the card): 202 after stopping it too; the next cycle
    starts x and blocks a ("x: being started in this plan (exclusive)")."""
    roles = {"g0": sm.GpuRole("g0", 32000)}
    serves = {
        "ev": sm.ServeSpec("ev", "c-ev", ("g0",), 30000, sm.Residency.EVICTABLE),
        "a": sm.ServeSpec("a", "c-a", ("g0",), 15000, sm.Residency.ON_DEMAND),
        "x": sm.ServeSpec("x", "c-x", ("g0",), 6000, sm.Residency.ON_DEMAND, exclusive=True),
    }
    desired = sm.DesiredState(roles, serves, ())
    up = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 3600)
    observed = sm.Observed(docker_ok=True, containers={"c-ev": up})
    admitted = []
    for i, serve in enumerate("ax"):
        d = decide_up(desired, observed, serve, policy=Policy(), now=NOW + i, default_retry_s=1)
        if d.status == 202:
            admitted.append(serve)
            asked = sm.OnDemandRequest(serve, NOW + i)
            desired = replace(desired, requests=(*desired.requests, asked))
    plan = plan_transitions(desired, observed, Policy(), NOW + 1)
    started = sorted(s.serve for s in plan.steps if s.action is Action.RESERVE)
    assert started == sorted(admitted), (
        f"admitted {admitted}; the next cycle reserves for {started}, blocks "
        f"{[(b.serve, b.reason) for b in plan.blocked]}"
    )
