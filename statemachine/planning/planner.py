"""The planner: ``plan_transitions(desired, observed, policy, now) -> Plan``.

A pure function from "what the manifest (and the on-demand requests) want" and "what
the host shows" to an ordered list of steps (docs/design.md §5 plan JSON) plus what is
blocked, with every term of the arithmetic. It never plans a prefix that overcommits
a GPU role: every reserve and grow goes through the plan's ledger (a
:class:`statemachine.ledger.reservations.WorkingLedger`, changed in place by this call alone, which
refuses what does not fit), after the releases and shrinks that make room for it.

The rules, in the order the planner applies them:

1. **Fail closed.** Docker unreadable: no steps; every serve that wants a change is
   blocked with the reason.
2. **Stops.** A serve that holds memory and is ``desired = "stopped"``, or whose
   on-demand request ended (its TTL ran out, or it had no request in flight for its
   ``idle_ttl_s``: :mod:`statemachine.planning.idleness`) and is not ``desired = "running"``, is
   stopped: quiesce + drain (when it has a router tier), stop, release.
3. **Starts**, residents first, then on-demand requesters (manifest ``running`` first,
   then requests by age), then the rest (evictable backfill) by descending priority.
   A start is blocked while an exclusive serve runs on one of its roles, while another
   serve runs on its port, or, for an exclusive serve, while any other GPU-inference
   serve runs on its roles. Only on-demand requesters may stop others: committed
   ``evictable`` serves outside their ``min_runtime_s`` are victims (for room, for the
   port, for exclusivity); residents, other on-demand serves and serves without a
   residency are never stopped and are reported as the blockers; among victim sets
   the one with the fewest serves that may have requests in flight is preferred
   (:mod:`statemachine.planning.victims`). When room is short,
   elastic shrink is planned if shrink alone covers it, else eviction
   (:mod:`statemachine.planning.victims`); an engine gives memory back in whole segments
   (``Elastic.segment_mib``), so a shrink is whole segments that cover the need.
   A start is: reserve, start, await_ready, readmit.
4. **Grow back** shrunk elastic serves as far as the budget allows (to full, or by
   whole segments), before backfill, and again after it for what backfill woke (an
   elastic serve shrunk before it slept wakes at what it was shrunk to).

Sleep instead of stop (``ServeSpec.sleep``, docs/eviction.md): a victim that can sleep
is put to sleep (drain, sleep, release_to_residual) rather than stopped when what its
sleep frees covers the need under the same victim rules, and stopped when the host RAM
budget cannot take its sleep. A serve that sleeps (``observed.sleep``) and is wanted is
woken (reserve_wake, wake, reload at level 2, await_ready, readmit) rather than started,
making room like a start; one whose residual is in the way is a victim at its residual
and is stopped without a drain. A sleeper is never shrunk, grown or readmitted.

A serve whose container name is borne by another Compose project's container
(``Observed.foreign``: a second copy of a stack on the same daemon) is never started,
stopped, drained, resized, put to sleep or a victim; while that container runs it
holds the serve's reservation like any other (docs/design.md §3, foreign containers).

A serve whose start is in progress (``observed.starting``: the executor carries starts
out beside the loop) holds its reservation, is neither started nor stopped nor a victim
nor resized until that start ends, and is a start "in progress" for the next rule:
engines that size themselves from free memory at load (``sizes_from_free``: vLLM,
SGLang) start one at a time per GPU role; other serves start side by side.

Pure: no I/O, no clock (``now`` is an argument), no logging, no docker.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import fsum
from operator import attrgetter

from statemachine.domain.types import (
    ABSENT,
    DesiredRun,
    DesiredState,
    Elastic,
    Observed,
    Residency,
    ServeSpec,
    SleepState,
)
from statemachine.ledger.reservations import (
    GpuReservation,
    Ledger,
    Refusal,
    RoleTerms,
    WorkingLedger,
    ledger_from_observed,
    unshrunk_mib,
)
from statemachine.planning.admission import conflict, inside_min_runtime
from statemachine.planning.deferred import Deferred
from statemachine.planning.idleness import IdleBasis, in_force, request_end
from statemachine.planning.placement import blocked_on_every_candidate, resolve
from statemachine.planning.plan_types import (
    Action,
    Blocked,
    Plan,
    Policy,
    Protected,
    RestoreCost,
    Step,
    declared_restore,
)
from statemachine.planning.victims import (
    Candidate,
    cheapest_cover,
    cheapest_mixed_cover,
    choose_victims,
    cost_key,
    restore_key,
)

__all__ = [
    "conflict",
    "plan_transitions",
]


_by_serve = attrgetter("serve")
_by_name = attrgetter("name")
_by_priority = attrgetter("priority")

#: the residencies that start before the rest (the backfill)
_FIRST = (Residency.RESIDENT, Residency.ON_DEMAND)

#: why a holder that exited, its memory not confirmed back, may not be stopped
_EXITED = "exited, but its memory is not back yet"
#: why a held-back resident, whose room the plan keeps, is in the way
_KEPT = "resident, held back: its room is kept for it"


def _ok(result: Ledger | Refusal) -> Ledger:
    if isinstance(result, Refusal):  # the planner checks before it asks: a bug if reached
        raise AssertionError(f"planner asked the ledger for something it refuses: {result.message}")
    return result


@dataclass
class _Work:
    """The planner's scratch state for one call (never escapes the call)."""

    desired: DesiredState
    observed: Observed
    policy: Policy
    now: float
    #: the plan's ledger after the steps so far (changed in place; the Plan carries
    #: :meth:`WorkingLedger.frozen`)
    ledger: WorkingLedger
    running: set[str] = field(default_factory=set)  # holds memory, after the steps so far
    stopping: set[str] = field(default_factory=set)
    #: residents held back (a failure backoff) whose room this plan keeps for them
    kept: list[str] = field(default_factory=list)
    starting: set[str] = field(default_factory=set)  # started or woken in this plan
    woken: set[str] = field(default_factory=set)  # woken in this plan (container not new)
    steps: list[Step] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)
    by_role: dict[str, list[str]] = field(default_factory=dict)  # declaration order
    by_port: dict[int, list[str]] = field(default_factory=dict)
    shared: set[int] = field(default_factory=set)  # ports more than one serve declares
    sleepers: bool = False  # some serve declares [serve.sleep]: a victim may sleep
    excl_by_role: dict[str, list[str]] = field(default_factory=dict)  # exclusive serves only
    order: dict[str, int] = field(default_factory=dict)  # declaration index
    ledgered: dict[tuple[str, ...], bool] = field(default_factory=dict)  # by roles
    group: str = ""  # the serve whose intent the steps being emitted serve
    #: the serves of this pass that claim room (:func:`_claims_room`), their places in
    #: the pass, and the place of the serve being tried: those after it are still to try
    claims: list[ServeSpec] = field(default_factory=list)
    claim_at: list[int] = field(default_factory=list)
    at: int = field(default_factory=int)  # set before each try
    #: serves whose engine sleeps (observed, or put to sleep earlier in this plan) ->
    #: the level it sleeps at; their containers run, so they are in ``running`` too
    asleep: dict[str, int] = field(default_factory=dict)
    #: holders of the observed ledger whose container does not run (exited, memory not
    #: back): they never run in this plan, and every other holder runs (a start admits
    #: and runs, a stop releases and stops), so this tells a holder's state at any point
    exited: frozenset[str] = frozenset()
    #: a stop, a sleep or a shrink was planned since the pass began (room, a port or a
    #: role was freed: the serves blocked in it are tried again)
    freed: bool = field(default_factory=bool)  # set at each pass's beginning
    #: the serves of the pass being tried, whether a short serve may wait in it for the
    #: stops a later serve's start forces (the first pass of :func:`_start_all` only),
    #: whether one did, and the later serves' forced stops ((place, stops), built once
    #: per pass when first asked)
    pass_serves: list[ServeSpec] = field(default_factory=list)
    may_defer: bool = field(default_factory=bool)
    deferred: bool = field(default_factory=bool)
    stops_later: list[tuple[int, list[ServeSpec]]] | None = None
    #: serves whose container is another Compose project's -> that project: never acted on
    foreign: dict[str, str] = field(default_factory=dict)
    #: the reservations of a role (a ledger's tuple, by identity) joined for a reason
    joins: dict[int, tuple[tuple[tuple[str, int], ...], str]] = field(default_factory=dict)
    #: requester -> the serves its start stops or puts to sleep, as weighed (Plan.room)
    room: dict[str, tuple[Candidate, ...]] = field(default_factory=dict)

    def joined(self, rows: tuple[tuple[str, int], ...]) -> str:
        """``"a 100 + b 200"`` (``"nothing"`` when empty) for one role's reservations.

        Remembered by the tuple's identity (the tuple is kept, so its identity is not
        reused: an entry found is of this very tuple): a ledger hands out the same tuple
        while the role does not change, so the blocked starts on a full role share one
        string instead of joining every holder.
        """
        seen = self.joins.get(id(rows))
        if seen is not None:
            return seen[1]
        text = " + ".join(f"{holder} {m}" for holder, m in rows) or "nothing"
        self.joins[id(rows)] = (rows, text)
        return text

    def index(self) -> None:
        order, by_role, by_port = self.order, self.by_role, self.by_port
        for i, s in enumerate(self.desired.serves.values()):
            name = s.name
            order[name] = i
            for r in s.gpu_roles:
                on_role = by_role.get(r)
                if on_role is None:
                    by_role[r] = [name]
                else:
                    on_role.append(name)
            if s.sleep is not None:
                self.sleepers = True
            if s.exclusive:
                for r in s.gpu_roles:
                    self.excl_by_role.setdefault(r, []).append(name)
            port = s.port
            if port is not None:
                on_port = by_port.get(port)
                if on_port is None:
                    by_port[port] = [name]
                else:
                    self.shared.add(port)
                    on_port.append(name)

    def conflict_neighbours(self, s: ServeSpec) -> list[str]:
        """What a non-exclusive ``s`` can conflict with (exclusive serves on its roles,
        serves on its port), in the order :meth:`neighbours` gives them."""
        excl = self.excl_by_role
        found = {n for r in s.gpu_roles for n in excl.get(r, ())} if excl else set()
        if s.port is not None:
            found.update(self.by_port.get(s.port, ()))
        found.discard(s.name)
        if not found:
            return []
        roles = s.gpu_roles

        def key(n: str) -> tuple[int, int]:
            theirs = self.desired.serves[n].gpu_roles
            first = next((j for j, r in enumerate(roles) if r in theirs), len(roles))
            return (first, self.order[n])

        return sorted(found, key=key)

    def neighbours(self, s: ServeSpec) -> list[str]:
        """Serves sharing a role or the port with ``s``, in declaration order, once each."""
        seen: dict[str, None] = {}
        for r in s.gpu_roles:
            seen.update(dict.fromkeys(self.by_role.get(r, ())))
        if s.port is not None:
            seen.update(dict.fromkeys(self.by_port.get(s.port, ())))
        seen.pop(s.name, None)
        return list(seen)

    def in_ledger(self, s: ServeSpec) -> bool:
        """``s`` has a reservation, on roles that all have a capacity row (asked once
        per role tuple and plan: whether the roles have a row is all that varies)."""
        if s.vram_mib is None:
            return False
        known = self.ledgered.get(s.gpu_roles)
        if known is None:
            known = self.ledgered[s.gpu_roles] = self.desired.in_ledger(s)
        return known

    def serve(self, name: str) -> ServeSpec:
        return self.desired.serves[name]

    def held_mib(self, name: str) -> int | None:
        res = self.ledger.holdings.get(name)
        return res.mib if res else None

    def fresh(self, s: ServeSpec) -> float | None:
        """Seconds since start when still inside ``min_runtime_s``, else None."""
        return inside_min_runtime(s, self.observed, self.now)

    def add(
        self,
        action: Action,
        s: ServeSpec,
        mib: int | None,
        reason: str,
        *,
        to_mib: int | None = None,
        host_mib: int | None = None,
    ) -> None:
        self.steps.append(
            Step(action, s.name, s.gpu_roles, mib, reason, to_mib, self.group, host_mib)
        )

    def add_held(self, action: Action, s: ServeSpec, mib: int | None, reason: str) -> None:
        """A step of ``s`` where it holds memory (the roles its reservation is counted on:
        a serve that runs off its declared cards is drained and stopped where it runs)."""
        held = self.ledger.holdings.get(s.name)
        self.add(
            action,
            s if held is None else dataclasses.replace(s, gpu_roles=held.gpu_roles),
            mib,
            reason,
        )

    def drain(self, s: ServeSpec, reason: str) -> None:
        """Quiesce and drain ``s``'s router tier (nothing when it has none, or when it
        sleeps: its tier was quiesced and drained before it was put to sleep)."""
        if s.router_tier and s.name not in self.asleep:
            mib = self.held_mib(s.name)
            self.add_held(Action.QUIESCE, s, mib, f"{reason}: quiesce router tier {s.router_tier}")
            self.add_held(Action.DRAIN, s, mib, f"{reason}: drain router tier {s.router_tier}")

    def halt(self, s: ServeSpec, reason: str) -> None:
        """Stop ``s`` and release its reservation once the stop is confirmed."""
        mib = self.held_mib(s.name)
        self.add_held(Action.STOP, s, mib, reason)
        self.freed = True
        if mib is not None:
            self.add_held(
                Action.RELEASE, s, mib, f"release {mib} MiB after {s.name} is confirmed stopped"
            )
            self.ledger.drop(s.name)
        self.running.discard(s.name)
        self.asleep.pop(s.name, None)
        self.stopping.add(s.name)

    def sleepable(self, s: ServeSpec) -> bool:
        """True when putting ``s`` to sleep would free memory: it can sleep, runs awake
        (known awake: an unknown sleep state is never slept on), and holds more than its
        residual."""
        held = self.held_mib(s.name)
        return (
            held is not None
            and s.name not in self.foreign
            and s.name in self.running
            and s.name not in self.asleep
            and s.name not in self.stopping
            and sleep_frees_memory(s, held, self.policy, self.observed)
        )

    def put_to_sleep(self, s: ServeSpec, reason: str) -> None:
        """Sleep ``s`` (drained before), down to its residual; a stop instead when the
        host budget cannot take its level-1 host RAM."""
        assert s.sleep is not None
        sleep = s.sleep
        held = self.held_mib(s.name)
        assert held is not None
        slept = self.ledger.sleep(s.name, sleep.residual_mib, sleep.host_mib)
        if isinstance(slept, Refusal) and self.make_host_room(s):
            slept = self.ledger.sleep(s.name, sleep.residual_mib, sleep.host_mib)
        if isinstance(slept, Refusal):
            self.halt(s, f"{reason}: stopped, not put to sleep: {slept.message}")
            return
        self.ledger.adopt(slept)
        self.add(Action.SLEEP, s, held, f"{reason}: put to sleep (level {sleep.level})")
        self.freed = True
        host = f" and take {sleep.host_mib} MiB of host RAM" if sleep.host_mib else ""
        self.add(
            Action.RELEASE_TO_RESIDUAL,
            s,
            held - sleep.residual_mib,
            f"release {held - sleep.residual_mib} MiB down to the residual "
            f"{sleep.residual_mib} MiB{host} once {s.name} is confirmed asleep",
            to_mib=sleep.residual_mib,
            host_mib=sleep.host_mib or None,
        )
        self.asleep[s.name] = sleep.level

    def make_host_room(self, s: ServeSpec) -> bool:
        """Stop the sleepers worth less asleep than ``s`` per MiB of host RAM
        (:meth:`Policy.sleep_worth`), the least first, until the host RAM they give back
        lets ``s`` sleep; False (nothing stopped) when the host is not short, ``s``'s
        worth is unknown or they cannot give enough (docs/eviction.md, "Which sleepers
        keep the host RAM")."""
        assert s.sleep is not None
        terms = self.ledger.host_terms(s.sleep.host_mib)
        if terms is None or not terms.shortfall_mib:
            return False
        mine = self.policy.sleep_worth(s.name, self.now, declared_restore(s))
        if mine is None:
            return False
        mine /= max(1, s.sleep.host_mib)
        slept_now = {st.serve for st in self.steps if st.action is Action.SLEEP}
        ranked: list[tuple[float, str, int]] = []
        for n, mib in terms.reservations:
            o = self.desired.serves.get(n)
            if o is None or n not in self.asleep or n in slept_now:
                continue
            worth = self.policy.sleep_worth(n, self.now, declared_restore(o))
            if worth is not None and worth / max(1, mib) < mine and _victim_veto(self, o) is None:
                ranked.append((worth / max(1, mib), n, mib))
        ranked.sort()
        need, chosen = terms.shortfall_mib, []
        for worth, n, mib in ranked:
            if need <= 0:
                break
            chosen.append((worth, n))
            need -= mib
        if need > 0:
            return False
        for worth, n in chosen:
            self.halt(
                self.serve(n),
                f"stop {n}, asleep, so {s.name} can sleep in its host RAM: asleep, {n} saves "
                f"{worth:.3g} s of waiting an hour per MiB of host RAM, {s.name} {mine:.3g}",
            )
        return True

    def stop(self, s: ServeSpec, reason: str) -> None:
        """Drain then stop one serve, as its own group."""
        self.group = s.name
        self.drain(s, reason)
        self.halt(s, reason)


def _stops(w: _Work, expired: Mapping[str, str], active: Mapping[str, float]) -> None:
    """2. The stops: a serve desired stopped, whose request ended, or that runs on a card
    it is not to run on (a serve whose start is in progress is stopped once that start
    has ended)."""
    for s in w.desired.serves.values():
        if s.name not in w.running or s.name in w.observed.starting or s.name in w.foreign:
            continue
        if s.desired is DesiredRun.STOPPED:
            w.stop(s, f"{s.name} is desired stopped")
        elif s.name in expired and s.desired is not DesiredRun.RUNNING:
            w.stop(s, expired[s.name])
        elif (off := _off_its_cards(s, w.observed, s.name in active)) is not None:
            w.stop(s, off)


def _off_its_cards(s: ServeSpec, observed: Observed, asked: bool) -> str | None:
    """Why ``s``, running, managed or placed and ``asked`` for (a request of its own in
    force: a placed sleeper whose wake waits is moved so, docs/placement.md), is to be
    stopped because it runs on a card it is not to run on (its container's
    environment, what its ``up`` was told, names a role it no longer declares: an edit
    re-pinned it, dropped its card from ``placement``, or placement moves it); None when
    it runs where it is declared or where is not known (a container that names no card
    is never stopped on that account). Stopped, it is started where it is declared by
    the next plan (docs/placement.md)."""
    told = observed.container(s.container).told_roles
    if not (s.managed or (asked and s.placement)) or not told or not set(told) - set(s.gpu_roles):
        return None
    return (
        f"{s.name} runs on {', '.join(told)}; it is to run on "
        f"{', '.join(s.gpu_roles)}: stopped there, to be started where it is to run"
    )


def _requests(
    desired: DesiredState, observed: Observed, now: float
) -> tuple[dict[str, float], dict[str, str]]:
    """Active requests (serve -> requested_at, oldest kept) and the serves whose request
    ended (serve -> why).

    Whether a request is in force is :func:`statemachine.planning.idleness.in_force`: a request
    without its own TTL ends by the serve's ``idle_ttl_s`` (measured idleness where it
    has a source of in-flight counts).
    """
    active: dict[str, float] = {}
    expired: dict[str, str] = {}
    for req in desired.requests:
        spec = desired.serves.get(req.serve)
        if spec is None:
            continue
        if in_force(req, spec, observed, now):
            active[req.serve] = min(active.get(req.serve, req.requested_at), req.requested_at)
            continue
        end = request_end(req, spec, observed)
        if req.released:
            expired[req.serve] = f"the on-demand request for {req.serve} was released (down)"
        elif end.basis is IdleBasis.MEASURED:
            expired[req.serve] = (
                f"{req.serve} has had no request in flight for {end.ttl_s:g}s (idle_ttl_s)"
            )
        else:
            expired[req.serve] = f"the on-demand request for {req.serve} expired (TTL)"
    return active, {n: why for n, why in expired.items() if n not in active}


def _start_order(w: _Work, wants: list[ServeSpec], active: dict[str, float]) -> list[ServeSpec]:
    """Residents, then on-demand serves (manifest ``running`` first, then requests by
    age), then the rest; each by descending priority, then name."""

    def rank(s: ServeSpec) -> tuple[float, int, str]:
        when = -1.0 if s.desired is DesiredRun.RUNNING else active.get(s.name, 0.0)
        return (when, -s.priority, s.name)

    def by_priority(serves: list[ServeSpec]) -> list[ServeSpec]:
        # names are unique: by name, then (stable, also reversed) by descending priority
        serves.sort(key=_by_name)
        serves.sort(key=_by_priority, reverse=True)
        return serves

    residents = [s for s in wants if s.residency is Residency.RESIDENT]
    on_demand = sorted((s for s in wants if s.residency is Residency.ON_DEMAND), key=rank)
    rest = [s for s in wants if s.residency not in _FIRST]
    return by_priority(residents) + _by_response_ratio(w, on_demand, active) + by_priority(rest)


def _by_response_ratio(
    w: _Work, on_demand: list[ServeSpec], active: dict[str, float]
) -> list[ServeSpec]:
    """The requests (``on_demand``, by age) by response ratio where each serve's uses and
    its cost to come up are known: ``(waited + seconds) / seconds`` summed over the
    serve's requests (each waits for the same start), the highest first
    (a wake before a cold start, a short start before a long one, and each the sooner
    the longer it has waited: none waits forever; docs/eviction.md, "Which request
    goes first"); manifest ``running`` serves first, as by age."""
    if not w.policy.uses:
        return on_demand
    seconds: dict[str, float] = {}
    for s in on_demand:
        if s.desired is DesiredRun.RUNNING:
            continue
        cost = w.policy.reload.get(s.name) or declared_restore(s)
        took = None if cost is None else (cost.wake_s if s.name in w.asleep else cost.cold_s)
        if took is None or s.name not in w.policy.uses:
            return on_demand
        seconds[s.name] = max(took, 0.1)

    asked: dict[str, list[float]] = {}
    for r in w.desired.requests:
        if r.serve in seconds and not r.released:
            asked.setdefault(r.serve, []).append(r.requested_at)

    def ratio(s: ServeSpec) -> float:
        took = seconds.get(s.name)
        if took is None:  # desired running: first
            return float("inf")
        waits = asked.get(s.name) or [active.get(s.name, w.now)]
        return fsum((max(0.0, w.now - at) + took) / took for at in waits)

    return sorted(on_demand, key=ratio, reverse=True)  # stable: by age on a tie


def requester_veto(requester: ServeSpec) -> str | None:
    """Why ``requester`` may stop nothing at all (it is not on-demand); None when it may."""
    if requester.residency is not Residency.ON_DEMAND:
        cls = requester.residency or "unclassified"
        return f"only on-demand serves evict, and {requester.name} is {cls}"
    return None


def victim_residency_veto(victim: ServeSpec) -> str | None:
    """Why ``victim``'s residency class keeps it from ever being stopped for another
    serve; None when it is ``evictable``."""
    return _RESIDENCY_VETO.get(victim.residency)


#: why each residency class other than ``evictable`` is never a victim
_RESIDENCY_VETO: dict[Residency | None, str] = {
    Residency.RESIDENT: "resident: never evicted",
    Residency.ON_DEMAND: "on-demand: not a victim",
    None: "no residency class: never stopped implicitly",
}


def may_give_back(
    o: ServeSpec, held_mib: int, policy: Policy, observed: Observed, now: float
) -> bool:
    """The shrink rule as observed: elastic ``o``, holding ``held_mib`` (its ledger
    reservation), may give memory back (the policy allows it, it holds more than its
    floor, it is outside its ``min_runtime_s``, its start is not in progress)."""
    return (
        o.elastic is not None
        and o.name not in policy.no_shrink
        and held_mib > o.elastic.floor_mib
        and inside_min_runtime(o, observed, now) is None
        and o.name not in observed.starting
    )


def sleep_frees_memory(o: ServeSpec, held_mib: int, policy: Policy, observed: Observed) -> bool:
    """The sleep rule as observed: putting ``o`` (holding ``held_mib``) to sleep would
    free memory (it can sleep, the policy allows it, its start is not in progress, it is
    known awake: an unknown sleep state is never slept on, and it holds more than its
    residual)."""
    return (
        o.sleep is not None
        and o.name not in policy.no_sleep
        and o.name not in observed.starting
        and observed.sleep_of(o.name).state is SleepState.AWAKE
        and held_mib > o.sleep.residual_mib
    )


def _may_evict(w: _Work, requester: ServeSpec, victim: ServeSpec) -> str | None:
    """None when ``requester`` may stop ``victim``; else why not."""
    veto = requester_veto(requester)
    if veto is not None:
        return veto
    return _victim_veto(w, victim)


def _foreign_veto(s: ServeSpec, project: str) -> str:
    """Why a serve whose container is another Compose project's is never acted on."""
    return (
        f"container {s.container} belongs to compose project {project}, not "
        f"{s.compose_project}: it is left alone (never started, stopped or removed)"
    )


def _victim_veto(w: _Work, victim: ServeSpec) -> str | None:
    """None when a requester that may evict (no :func:`requester_veto`) may stop
    ``victim``; else why not."""
    project = w.foreign.get(victim.name)
    if project is not None:
        return _foreign_veto(victim, project)
    veto = victim_residency_veto(victim)
    if veto is not None:
        return veto
    if victim.name in w.observed.starting:
        return "its start is in progress"
    if victim.name in w.starting:
        return "being started in this plan"
    age = w.fresh(victim)
    if age is not None:
        return f"started {age:.0f}s ago, inside its min_runtime_s {victim.min_runtime_s:g}"
    return None


@dataclass(slots=True)
class _Conflicts:
    """What must stop before a serve starts, and what may not (with why)."""

    forced: list[ServeSpec] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    protected: list[Protected] = field(default_factory=list)


@dataclass(slots=True)
class _Room:
    """How a start gets its room: shrinks (serve, from, to) and evictions."""

    shrinks: list[tuple[ServeSpec, int, int]] = field(default_factory=list)
    victims: list[ServeSpec] = field(default_factory=list)
    sleeps: list[ServeSpec] = field(default_factory=list)  # victims put to sleep instead
    #: the victims (stopped and put to sleep) as :func:`_choose` weighed them
    weighed: tuple[Candidate, ...] = ()


@dataclass(slots=True)
class _Holders:
    """The holders on a start's short roles: who may be evicted or shrunk, and how much."""

    cands: list[Candidate] = field(default_factory=list)
    elastic: list[tuple[ServeSpec, int]] = field(default_factory=list)
    shrinkable: dict[str, int] = field(default_factory=dict)
    evictable: dict[str, int] = field(default_factory=dict)
    sleepable: dict[str, int] = field(default_factory=dict)  # what sleeping victims frees


#: the room of a start that needs none (nothing shrunk, nothing evicted); never mutated
_NO_ROOM = _Room()

#: the conflicts of a start that has none; never mutated (:func:`_room` copies its
#: ``protected`` before it adds the holders)
_NO_CONFLICTS = _Conflicts()


def _try_start(w: _Work, s: ServeSpec) -> None:
    """Start ``s`` if it may and fits: its conflicts, then its room, then the steps."""
    held = w.policy.hold.get(s.name)
    if held is not None:
        kept = _keep_room(w, s)
        w.blocked.append(Blocked(s.name, f"{s.name} is held back: {held}{kept}"))
        return
    c = _conflicts(w, s)
    in_ledger = w.in_ledger(s)
    if s.sizes_from_free and not c.reasons and _waits_for_a_loading_peer(w, s):
        return
    if c.reasons:
        terms = w.ledger.terms(s.name, s.gpu_roles, s.vram_mib) if in_ledger and s.vram_mib else ()
        w.blocked.append(
            Blocked(
                s.name,
                f"{s.name} cannot start: " + "; ".join(c.reasons),
                terms,
                protected=tuple(c.protected),
            )
        )
        return
    room = _room(w, s, c, in_ledger)
    if room is not None:
        _commit_start(w, s, c.forced, room, in_ledger)


def keeps_its_room(s: ServeSpec, observed: Observed, policy: Policy) -> bool:
    """Whether a plan keeps room for ``s`` while the policy holds it back
    (:func:`_keep_room`): a resident the manifest wants running, in backoff, whose
    container holds nothing. An answer for another serve asked in isolation
    (``statemachine.answers.fit.request_plan``) leaves such a serve to the planner as it is."""
    return (
        s.residency is Residency.RESIDENT
        and s.desired is DesiredRun.RUNNING
        and s.name in policy.hold
        and not observed.container(s.container).holds
    )


def _keep_room(w: _Work, s: ServeSpec) -> str:
    """Keep a held-back resident's room for it while this plan is made (docs/eviction.md,
    a resident in backoff): it is counted where it would run, so nothing started or grown
    after it takes that room, and it starts there when its backoff ends (a resident may
    stop nothing). Where the room is not free now, nothing is kept. What is said of it."""
    if s.residency is not Residency.RESIDENT or not w.in_ledger(s):
        return ""
    assert s.vram_mib is not None
    if s.name not in w.ledger.holdings:
        if w.ledger.short_of(s.gpu_roles, s.vram_mib):
            return ""
        w.ledger.commit(GpuReservation(s.name, s.gpu_roles, s.vram_mib))
        w.kept.append(s.name)
    return f"; its room ({s.vram_mib} MiB on {', '.join(s.gpu_roles)}) is kept for it"


def _conflicts(w: _Work, s: ServeSpec) -> _Conflicts:
    """The running serves that cannot run beside ``s``: to stop, or why they may not be."""
    if not s.exclusive and not w.excl_by_role and (s.port is None or s.port not in w.shared):
        return _NO_CONFLICTS  # no exclusive serve anywhere, and its port is its own
    c = _Conflicts()
    forced_names: set[str] = set()
    neighbours = w.neighbours(s) if s.exclusive else w.conflict_neighbours(s)
    for name in neighbours:
        if name not in w.running:
            continue
        other = w.serve(name)
        why = conflict(s, other)
        if why is None:
            continue
        if other.name in w.starting:
            how = (
                "its start is in progress"
                if other.name in w.observed.starting
                else "being started in this plan"
            )
            c.reasons.append(f"{other.name}: {how} ({why})")
            c.protected.append(Protected(other.name, other.vram_mib, how))
            continue
        veto = _may_evict(w, s, other)
        if veto is None:
            if other.name not in forced_names:
                c.forced.append(other)
                forced_names.add(other.name)
        else:
            c.reasons.append(f"{other.name} runs ({why}) and may not be stopped: {veto}")
            c.protected.append(Protected(other.name, w.held_mib(other.name), veto))
    c.forced.sort(key=lambda o: o.name)
    return c


def _waits_for_a_loading_peer(w: _Work, s: ServeSpec) -> bool:
    """True (and ``s`` blocked) while a free-memory-sizing engine loads on one of its GPUs."""
    found = _loading_peer(w, s)
    if found is None:
        return False
    peer, shared = found
    w.blocked.append(
        Blocked(
            s.name,
            f"{s.name} waits for the start of {peer.name} on "
            f"{', '.join(shared)} to end: engines that size themselves from "
            "free memory at load (vLLM, SGLang) start one at a time per GPU",
        )
    )
    return True


def _loading_peer(w: _Work, s: ServeSpec) -> tuple[ServeSpec, list[str]] | None:
    """The free-memory-sizing engine loading on one of ``s``'s GPUs, and the GPUs they
    share; None when there is none."""
    # a start in progress, or a container of such an engine still loading (its
    # healthcheck says "starting": a start the controller did not carry out itself)
    loading = {
        o.name
        for o in w.desired.serves.values()
        if o.sizes_from_free
        and o.name in w.running
        and o.name not in w.stopping
        and w.observed.container(o.container).health == "starting"
    }
    for other_name in sorted(w.starting | loading):
        peer = w.desired.serves.get(other_name)
        if peer is None or peer.name == s.name or not peer.sizes_from_free:
            continue
        shared = [r for r in s.gpu_roles if r in peer.gpu_roles]
        if shared:
            return peer, shared
    return None


def _room(w: _Work, s: ServeSpec, c: _Conflicts, in_ledger: bool) -> _Room | None:
    """Room for ``s``: what the forced stops free, then shrink or eviction for the rest.

    ``None`` (and ``s`` blocked) when there is none.
    """
    ledger: Ledger = w.ledger
    for o in c.forced:
        if ledger.holds(o.name):
            ledger = _ok(ledger.release(o.name))
    waking = s.name in w.asleep
    if w.ledger.holds(s.name) and not waking:  # exited, its memory not back: still counted
        # starting it again now could need its memory twice: wait until it is back
        w.blocked.append(
            Blocked(
                s.name,
                f"{s.name} exited, but the memory of its last run is not back yet "
                "(NVML still attributes it); it starts once it is",
                w.ledger.terms(s.name, s.gpu_roles, 0),
            )
        )
        return None
    if not in_ledger or s.vram_mib is None:
        return _NO_ROOM
    # the MiB more it takes on each of its roles: all of it for a start
    mib = _wake_needs_mib(w, s) if waking else s.vram_mib
    if mib <= 0:
        # a wake into no more than the residual it holds adds nothing to any role, even
        # one observed over budget: it needs no room (none to wait for, none to make)
        return _NO_ROOM
    short = ledger.short_of(s.gpu_roles, mib)
    if not short:
        return _NO_ROOM
    veto = requester_veto(s)
    if veto is not None:
        # it may neither evict nor shrink (what _may_evict and _may_shrink say of each
        # holder): blocked, every holder on its short roles protected, the list built
        # only when read (O(1) here, not O(holders) for each blocked backfill)
        zero = dict.fromkeys(short, 0)
        protected = _every_holder_protected(w, s, ledger, tuple(short), c.protected, veto)
        # it forces no stop either (that too is an eviction): its ledger is the plan's
        terms = ledger.terms(s.name, s.gpu_roles, mib)
        _block_no_fit(
            w, s, terms, terms, _Holders(shrinkable=zero, evictable=zero, sleepable=zero), protected
        )
        return None
    if w.may_defer and _waits_for_later_stops(w, short):
        w.deferred = True
        # dropped by the retry that always follows a pass in which a serve waited
        w.blocked.append(Blocked(s.name, f"{s.name} waits for the stops a later start forces"))
        return None
    kept = list(c.protected)  # the conflicts' and then the holders' (c's is shared)
    h = _holders(w, s, ledger, short, kept)
    if h.elastic and all(h.shrinkable[r] >= need for r, need in short.items()):
        return _Room(shrinks=_shrinks(h.elastic, short))
    picked = _choose(w, h.cands, short)
    if picked is None:
        protected_now = tuple(sorted(kept, key=_by_serve))
        terms = ledger.terms(s.name, s.gpu_roles, mib)
        plan_terms = terms if ledger is w.ledger else w.ledger.terms(s.name, s.gpu_roles, mib)
        _block_no_fit(w, s, terms, plan_terms, h, protected_now)
        return None
    chosen, sleeps = picked
    if _waits_for_coming_room(w, s, short, chosen, sleeps):
        return None
    return _Room(
        victims=[w.serve(cand.name) for cand in chosen if cand.name not in sleeps],
        sleeps=[w.serve(cand.name) for cand in chosen if cand.name in sleeps],
        weighed=chosen,
    )


def _waits_for_coming_room(
    w: _Work,
    s: ServeSpec,
    short: Mapping[str, int],
    chosen: Sequence[Candidate],
    sleeps: frozenset[str],
) -> bool:
    """True (and ``s`` blocked) while ``s`` has waited less than its victims are expected
    to cost later and the room it lacks frees by itself: on-demand serves whose request
    is in flight or whose start is in progress hold it, and stop when their requests end
    (docs/eviction.md, "Waiting for room that frees by itself"). Only where every
    victim's uses and costs are known and ``s`` has a request."""
    if not w.policy.uses:
        return False
    asked = [r.requested_at for r in w.desired.requests if r.serve == s.name]
    if not asked:
        return False
    costs = [
        w.policy.expected_restore_s(
            c.name, w.now, wake=c.name in sleeps, declared=declared_restore(w.serve(c.name))
        )
        for c in chosen
    ]
    if any(cost is None for cost in costs):
        return False
    cost = fsum(c for c in costs if c is not None)
    waited = w.now - min(asked)
    if waited >= cost:
        return False
    coming = _coming_room(w, s, short)
    if coming is None:
        return False
    victims = " + ".join(
        f"{c.name} {cs:.1f}s" for c, cs in zip(chosen, costs, strict=True) if cs is not None
    )
    w.blocked.append(
        Blocked(
            s.name,
            f"{s.name} waits for room that frees by itself ({coming}): making it now would "
            f"evict {', '.join(c.name for c in chosen)}, expected to cost {cost:.1f}s of "
            f"reloads later ({victims}: each one's reload times the chance it is asked for "
            f"within the hour), more than {s.name} has waited ({waited:.1f}s); it evicts "
            f"them once it has waited {cost:.1f}s",
        )
    )
    return True


def _coming_room(w: _Work, s: ServeSpec, short: Mapping[str, int]) -> str | None:
    """The on-demand holders on ``s``'s short roles whose room frees by itself (a request
    in flight, or a start in progress, and not desired running), named with what they
    hold, when together they cover the whole shortfall; None otherwise."""
    frees = dict.fromkeys(short, 0)
    named = []
    for r in short:
        for n in w.by_role.get(r, ()):
            o = w.desired.serves[n]
            res = w.ledger.holdings.get(n)
            if (
                n == s.name
                or res is None
                or o.residency is not Residency.ON_DEMAND
                or o.desired is DesiredRun.RUNNING
                or n in w.stopping
            ):
                continue
            busy = w.observed.requests_in_flight(n).count or 0
            if busy > 0 or n in w.observed.starting or n in w.starting:
                frees[r] += res.mib
                named.append(f"{n}, {res.mib} MiB on {r}, " + ("busy" if busy else "starting"))
    if any(frees[r] < need for r, need in short.items()):
        return None
    return "; ".join(dict.fromkeys(named))


def _waits_for_later_stops(w: _Work, short: dict[str, int]) -> bool:
    """True when the stops that later serves of this pass force by starting (a conflict
    of port or exclusivity with a running holder) free the whole of ``short`` (role ->
    MiB) on their own, less what the later serves of this pass reserve there when they
    start or wake (they take room before the retry, the forcing serve among them), so
    the serve being tried needs neither eviction nor shrink once they are made."""
    later = w.stops_later
    if later is None:
        later = w.stops_later = _forced_stops_later(w)
    if not later:
        return False
    freed = _taken_later(w, short)
    seen: set[str] = set()
    for i, forced in later:
        if i <= w.at:
            continue
        for o in forced:
            if o.name in seen or o.name not in w.running or o.name in w.stopping:
                continue
            seen.add(o.name)
            res = w.ledger.holdings.get(o.name)
            if res is not None:
                for r in res.gpu_roles:
                    if r in short:
                        freed[r] = freed.get(r, 0) + res.mib
    return all(freed.get(r, 0) >= need for r, need in short.items())


def _taken_later(w: _Work, short: Mapping[str, int]) -> dict[str, int]:
    """Less the MiB (negative) the serves after the one being tried in this pass reserve
    on the ``short`` roles when they start or wake, by role (only roles they take on): a
    serve tried earlier in the order is not to wait for room those later ones take first
    (docs/eviction.md, the start order)."""
    taken: dict[str, int] = {}
    for o in w.pass_serves[w.at + 1 :]:
        if o.name not in w.policy.hold and o.vram_mib is not None and w.in_ledger(o):
            mib = _wake_needs_mib(w, o) if o.name in w.asleep else o.vram_mib
            for r in o.gpu_roles:
                if r in short:
                    taken[r] = taken.get(r, 0) - mib
    return taken


def _forced_stops_later(w: _Work) -> list[tuple[int, list[ServeSpec]]]:
    """(place, the running serves its start stops) of each serve after the one being
    tried in this pass whose start forces stops and meets no conflict that blocks it."""
    later: list[tuple[int, list[ServeSpec]]] = []
    if w.excl_by_role or w.shared:  # else no serve forces a stop by starting
        for i, o in enumerate(w.pass_serves):
            if i > w.at and o.name not in w.policy.hold:
                c = _conflicts(w, o)
                if c.forced and not c.reasons:
                    later.append((i, c.forced))
    return later


def _full_mib(w: _Work, s: ServeSpec) -> int:
    """What ``s`` holds awake, as the ledger counts an awake serve
    (:func:`statemachine.ledger.reservations.ledger_from_observed`): its reservation, or the larger
    one it was started with; an elastic serve shrunk before it slept holds what it was
    shrunk to, even below the residual it holds asleep (its engine maps that again)."""
    shrunk = w.observed.elastic_mib.get(s.name)
    return _whole_mib(w, s) if shrunk is None else shrunk


def _whole_mib(w: _Work, s: ServeSpec) -> int:
    """What running ``s`` counts at unshrunk: its reservation, or the larger one its
    container was started with (the ledger: a running container keeps it)."""
    assert s.vram_mib is not None
    return unshrunk_mib(s.vram_mib, w.observed.started_with.get(s.container))


def _wake_needs_mib(w: _Work, s: ServeSpec) -> int:
    """The MiB more sleeping ``s`` takes on each of its roles to wake: its full
    reservation less the residual it already holds (negative: it gives some back)."""
    return _full_mib(w, s) - w.ledger.holdings[s.name].mib  # its residual, held asleep


def _needs(w: _Work, cands: Sequence[Candidate], short: dict[str, int]) -> list[dict[str, int]]:
    """What the victims are chosen for, in turn: this requester's shortfall together with
    the room on-demand requesters later in this pass claim on these roles
    (:func:`_room_ahead`: one bigger victim rather than two), then its own alone."""
    ahead = _room_ahead(w, short, cands)
    if not ahead:
        return [short]
    return [{r: need + ahead.get(r, 0) for r, need in short.items()}, short]


def _sleep_frees(w: _Work, c: Candidate) -> int | None:
    """What putting candidate ``c`` to sleep frees per role (None: it cannot sleep)."""
    o = w.serve(c.name)
    if o.sleep is None or not w.sleepable(o):
        return None
    return c.mib - o.sleep.residual_mib


def _choose(
    w: _Work, cands: list[Candidate], short: dict[str, int]
) -> tuple[tuple[Candidate, ...], frozenset[str]] | None:
    """The victims as they were weighed (one put to sleep counted at what its sleep
    frees, with its wake's cost), and which of them sleep instead of stopping
    (docs/eviction.md).

    For each need in turn (:func:`_needs`: with the later requesters' room, then alone)
    the victim rules (:func:`choose_victims`) are applied twice: to the candidates
    stopped, and to the candidates as sleep would leave them (each one that can sleep
    counted at what its sleep frees, ``vram_mib - residual_mib``, the others at their
    reservation). The second set is taken, its sleepers put to sleep, when it exists
    and has no more victims than the first (fewest victims comes first); otherwise the
    first, all stopped. (A stop set in which one victim could sleep and still cover
    is a cover of the second kind of the same size, so the second set is taken then.)
    Both kinds are weighed for the same need: a set for this requester alone is never
    taken over one that covers the later requesters too (that frees room twice).
    """
    as_sleep: list[Candidate] = cands  # as they are, when no serve can sleep at all
    if w.sleepers:
        as_sleep = []
        for c in cands:
            frees = _sleep_frees(w, c)
            if frees is None:
                as_sleep.append(c)
                continue
            o = w.serve(c.name)
            cost = w.policy.victim_cost(
                c.name, c.started_at, w.now, wake=True, declared=declared_restore(o)
            )
            as_sleep.append(dataclasses.replace(c, mib=frees, cost_s=cost))
    limit = w.policy.exact_search_limit
    needs = _needs(w, cands, short)
    for i, need in enumerate(needs):
        stops = choose_victims(cands, need, exact_limit=limit)
        # only when a candidate frees less by sleeping than by stopping
        slept = choose_victims(as_sleep, need, exact_limit=limit) if as_sleep != cands else None
        if w.policy.uses:  # how often each is used is known: the cost comes first
            best = _by_cost(w, cands, as_sleep, need, stops, slept)
            if best is not None and i + 1 < len(needs):  # the later requesters' room too
                return _no_dearer_than_alone(w, cands, as_sleep, needs[-1], best)
            if best is not None:
                return best
        if slept is not None and (stops is None or len(slept) <= len(stops)):
            return slept, _sleeping(w, slept)
        if stops is not None:
            return stops, frozenset()
    return None


def _no_dearer_than_alone(
    w: _Work,
    cands: list[Candidate],
    as_sleep: list[Candidate],
    alone: Mapping[str, int],
    claimed: tuple[tuple[Candidate, ...], frozenset[str]],
) -> tuple[tuple[Candidate, ...], frozenset[str]]:
    """``claimed`` (victims that make room for the later requesters too) where it costs
    no more to bring back than the cheapest set for this requester's shortfall
    ``alone``; else that set (docs/eviction.md, "Room for the requesters behind"): room
    claimed ahead is worth one bigger victim, not a dearer one, such as sleepers stopped
    whose wakes would have been cheap. Only where every cost is known."""
    limit = w.policy.exact_search_limit
    stops = choose_victims(cands, alone, exact_limit=limit)
    slept = choose_victims(as_sleep, alone, exact_limit=limit) if as_sleep != cands else None
    own = _by_cost(w, cands, as_sleep, alone, stops, slept)
    if own is None:
        return claimed
    dear, cheap = (restore_key([c.cost_s for c in v]) for v in (claimed[0], own[0]))
    return own if not dear[0] and not cheap[0] and cheap < dear else claimed


def _by_cost(
    w: _Work,
    cands: list[Candidate],
    as_sleep: list[Candidate],
    need: Mapping[str, int],
    stops: tuple[Candidate, ...] | None,
    slept: tuple[Candidate, ...] | None,
) -> tuple[tuple[Candidate, ...], frozenset[str]] | None:
    """Where each serve's uses are known: of the sets the victim rules chose (stopped,
    and as sleep leaves them), the cheapest covers by cost (:func:`cheapest_cover`, of
    each) and the cheapest where each victim sleeps or stops
    (:func:`cheapest_mixed_cover`), the one cheapest to bring back (:func:`cost_key`,
    the earlier of equals), and which of its victims sleep."""
    options: list[tuple[tuple[Candidate, ...], frozenset[str]]] = []
    for found in (stops, cheapest_cover(cands, need)):
        if found is not None:
            options.append((found, frozenset()))
    if as_sleep is not cands:
        for found in (slept, cheapest_cover(as_sleep, need)):
            if found is not None:
                options.append((found, _sleeping(w, found)))
        if (mixed := cheapest_mixed_cover(cands, as_sleep, need)) is not None:
            options.append(mixed)
    if not options:
        return None
    return min(options, key=lambda o: cost_key(o[0], need))


def _sleeping(w: _Work, victims: Sequence[Candidate]) -> frozenset[str]:
    """Which of ``victims``, weighed as sleep leaves them, sleep: those that can."""
    return frozenset(c.name for c in victims if _sleep_frees(w, c) is not None)


def _holders(
    w: _Work, s: ServeSpec, ledger: Ledger, short: Mapping[str, int], protected: list[Protected]
) -> _Holders:
    """Who holds memory on the short roles: eviction candidates, elastic givers, the rest
    protected (appended to ``protected``, with why)."""
    h = _Holders(
        shrinkable=dict.fromkeys(short, 0),
        evictable=dict.fromkeys(short, 0),
        sleepable=dict.fromkeys(short, 0),
    )
    # only holders on a short role matter: walk those roles' serves, not the ledger
    on_short = dict.fromkeys(n for r in short for n in w.by_role.get(r, ()))
    holdings, serves, running = ledger.holdings, w.desired.serves, w.running
    container, in_flight = w.observed.container, w.observed.requests_in_flight
    cands, evictable, sleepable = h.cands, h.evictable, h.sleepable
    # asked once, not per holder: the requester's own veto holds for every victim
    may_evict = requester_veto(s) is None
    for name in on_short:
        res = holdings.get(name)
        if res is None or name == s.name:
            continue
        o = serves[name]
        if name not in running:  # exited, its memory not confirmed back; or kept for it
            protected.append(Protected(name, res.mib, _KEPT if name in w.kept else _EXITED))
            continue
        veto = _victim_veto(w, o) if may_evict else requester_veto(s)
        if o.elastic is not None and _may_shrink(w, s, o, res.mib):
            assert o.elastic is not None
            give = give_back_mib(res.mib, o.elastic)
            if give > 0:
                h.elastic.append((o, res.mib))
                for r in res.gpu_roles:
                    if r in h.shrinkable:
                        h.shrinkable[r] += give
        if veto is None:
            started = container(o.container).started_at
            busy = in_flight(name).count
            cost = w.policy.victim_cost(
                name, started, w.now, wake=False, declared=declared_restore(o)
            )
            cands.append(Candidate(name, res.gpu_roles, res.mib, o.priority, started, busy, cost))
            frees = res.mib - o.sleep.residual_mib if o.sleep and w.sleepable(o) else 0
            for r in res.gpu_roles:
                if r in evictable:
                    evictable[r] += res.mib
                    sleepable[r] += frees
        else:
            protected.append(Protected(name, res.mib, veto))
    return h


def _every_holder_protected(
    w: _Work,
    s: ServeSpec,
    ledger: Ledger,
    short: tuple[str, ...],
    protected: list[Protected],
    veto: str,
) -> Deferred[Protected]:
    """``protected`` and every holder on the ``short`` roles of ``ledger`` (but ``s``),
    each with ``veto`` (or :data:`_EXITED`), by serve: what :func:`_holders` lists for a
    requester that may stop nothing, built when first read."""
    conflicts = tuple(protected)
    by_role, exited, holdings = w.by_role, w.exited, ledger.holdings

    def build() -> tuple[Protected, ...]:
        rows = list(conflicts)
        for name in dict.fromkeys(n for r in short for n in by_role.get(r, ())):
            res = holdings.get(name)
            if res is not None and name != s.name:
                rows.append(Protected(name, res.mib, _EXITED if name in exited else veto))
        return tuple(sorted(rows, key=_by_serve))

    return Deferred(build)


def _may_shrink(w: _Work, requester: ServeSpec, o: ServeSpec, held_mib: int) -> bool:
    """True when ``o`` (holding ``held_mib``) may give memory back for ``requester``
    (:func:`may_give_back`, and what this plan has done so far)."""
    return (
        requester.residency is Residency.ON_DEMAND
        and o.name not in w.foreign
        and may_give_back(o, held_mib, w.policy, w.observed, w.now)
        # a serve started earlier in this plan may be shrunk after its
        # await_ready, unless its min_runtime_s protects it (a wake leaves the container
        # as it was: its min_runtime_s counts from the container's start)
        and not (o.name in w.starting and o.name not in w.woken and o.min_runtime_s > 0)
        and o.name not in w.asleep  # a sleeper's cache is not mapped: nothing to give
    )


def _shrinks(
    elastic: list[tuple[ServeSpec, int]], short: Mapping[str, int]
) -> list[tuple[ServeSpec, int, int]]:
    """Shrink alone covers it: take from the largest givers first, only what is needed."""
    shrinks: list[tuple[ServeSpec, int, int]] = []
    remaining = dict(short)
    for o, cur in sorted(
        elastic,
        key=lambda e: (
            -(give_back_mib(e[1], e[0].elastic) if e[0].elastic else 0),
            e[0].name,
        ),
    ):
        if all(v <= 0 for v in remaining.values()):
            break
        assert o.elastic is not None
        need = max(remaining.get(r, 0) for r in o.gpu_roles)
        if need <= 0:
            continue
        # the engine gives back whole segments: ask for the segments that
        # cover the need (a segment short would leave the requester short)
        seg = o.elastic.segment_mib
        give = min(give_back_mib(cur, o.elastic), -(-need // seg) * seg)
        shrinks.append((o, cur, cur - give))
        for r in o.gpu_roles:
            if r in remaining:
                remaining[r] -= give
    return shrinks


def _block_no_fit(
    w: _Work,
    s: ServeSpec,
    terms: tuple[RoleTerms, ...],
    plan_terms: tuple[RoleTerms, ...],
    h: _Holders,
    protected: Sequence[Protected],
) -> None:
    """``s`` does not fit: blocked with every term, and what eviction and shrink offer
    (``protected``: who may not be stopped, by serve). ``terms`` are those of the ledger
    after the stops ``s`` forces (the reason's), ``plan_terms`` the plan's ledger's."""
    assert s.vram_mib is not None
    if s.residency is Residency.ON_DEMAND:
        why = "eviction cannot cover the shortfall"
    elif s.name in w.asleep:
        cls = s.residency or "unclassified"
        why = f"it sleeps and cannot wake: {cls} serves do not evict; only on-demand serves do"
    else:
        cls = s.residency or "unclassified"
        why = f"{cls} serves do not evict; only on-demand serves do"
    detail = "; ".join(
        f"{t.gpu_role}: capacity {t.capacity_mib} - reserve {t.reserve_mib} = "
        f"budget {t.budget_mib}; committed {t.committed_mib} ("
        + w.joined(t.reservations)
        + f"); free {t.free_mib}; needs {t.requested_mib}; "
        f"short {t.shortfall_mib}; evictable {h.evictable.get(t.gpu_role, 0)}"
        + (f" (by sleep {h.sleepable[t.gpu_role]})" if h.sleepable.get(t.gpu_role) else "")
        + f"; shrinkable {h.shrinkable.get(t.gpu_role, 0)}"
        for t in terms
        if t.shortfall_mib
    )
    on_demand = s.residency is Residency.ON_DEMAND
    w.blocked.append(
        Blocked(
            s.name,
            f"{s.name} does not fit ({why}): {detail}",
            plan_terms,
            evictable_mib=tuple(sorted(h.evictable.items())) if on_demand else (),
            shrinkable_mib=tuple(sorted(h.shrinkable.items())) if on_demand else (),
            protected=protected,
            sleepable_mib=tuple(sorted(h.sleepable.items())) if on_demand else (),
        )
    )


def _commit_start(
    w: _Work, s: ServeSpec, forced: list[ServeSpec], room: _Room, in_ledger: bool
) -> None:
    """The start's steps, as one group: shrinks, drain every serve to be stopped, stop
    them, then reserve, start, wait until ready (and readmit its tier)."""
    w.group = s.name
    for o, cur, to in room.shrinks:
        w.ledger.adopt(_ok(w.ledger.resize(o.name, to)))
        assert o.elastic is not None  # only elastic serves are shrunk
        floor, seg = o.elastic.floor_mib, o.elastic.segment_mib
        w.add(
            Action.SHRINK,
            o,
            cur - to,
            f"give back {cur - to} MiB (elastic, floor {floor}, whole {seg} MiB segments) "
            f"so {s.name} fits",
            to_mib=to,
        )
        w.freed = True
    if forced or room.victims or room.sleeps:
        w.room[s.name] = tuple(_forced_candidate(w, o) for o in forced) + room.weighed
        _make_room(w, s, forced, room)
    if s.name in w.asleep:
        _wake(w, s, in_ledger)
        return
    # the steps built here, not through _Work.add: a cold plan has hundreds of starts
    name, roles, mib, append = s.name, s.gpu_roles, s.vram_mib, w.steps.append
    if in_ledger and mib is not None:
        w.ledger.commit(GpuReservation(name, roles, mib))
        why = f"reserve {mib} MiB on {', '.join(roles)}"
        append(Step(Action.RESERVE, name, roles, mib, why, None, name, None))
    why = _start_reason(w, s)
    append(Step(Action.START, name, roles, mib if in_ledger else None, why, None, name, None))
    why = f"wait until {name} is healthy"
    append(Step(Action.AWAIT_READY, name, roles, None, why, None, name, None))
    if s.router_tier:
        why = f"readmit router tier {s.router_tier}"
        append(Step(Action.READMIT, name, roles, None, why, None, name, None))
    w.running.add(name)
    w.starting.add(name)


def _forced_candidate(w: _Work, o: ServeSpec) -> Candidate:
    """``o``, a serve a start stops for a port or exclusivity, as :func:`_holders` weighs
    a victim: what it holds (where), its priority, start, requests in flight and cost to
    bring back (for :attr:`Plan.room`)."""
    res = w.ledger.holdings.get(o.name)
    started = w.observed.container(o.container).started_at
    cost = w.policy.victim_cost(o.name, started, w.now, wake=False, declared=declared_restore(o))
    busy = w.observed.requests_in_flight(o.name).count
    if res is None:  # outside the ledger: it frees nothing counted
        return Candidate(o.name, o.gpu_roles, 0, o.priority, started, busy, cost)
    return Candidate(o.name, res.gpu_roles, res.mib, o.priority, started, busy, cost)


def _make_room(w: _Work, s: ServeSpec, forced: list[ServeSpec], room: _Room) -> None:
    """Drain every serve to be stopped or put to sleep for ``s``, then stop them, then
    put the others to sleep."""
    stopping = [(o, f"stop {o.name} so {s.name} can start") for o in forced] + [
        (o, f"evict {o.name} ({o.residency}) to make room for {s.name}") for o in room.victims
    ]
    sleeping = [
        (o, f"evict {o.name} ({o.residency}) to make room for {s.name}") for o in room.sleeps
    ]
    for o, reason in stopping + sleeping:
        w.drain(o, reason)
    for o, reason in stopping:
        w.halt(o, reason)
    for o, reason in sleeping:
        w.put_to_sleep(o, reason)


def _wake(w: _Work, s: ServeSpec, in_ledger: bool) -> None:
    """The wake's steps: admit the full reservation again (and give the host RAM back),
    wake, reload after a level-2 sleep, wait until ready, readmit its tier."""
    level = w.asleep.pop(s.name)
    host = w.ledger.host_holdings.get(s.name)
    give = f"; give back {host} MiB of host RAM" if host else ""
    held = w.held_mib(s.name)
    if in_ledger and s.vram_mib is not None and held is not None:
        full = _full_mib(w, s)
        w.ledger.adopt(_ok(w.ledger.wake(s.name, full)))
        roles = ", ".join(s.gpu_roles)
        why = (
            f"reserve {full - held} MiB more on {roles} to wake {s.name} "
            f"(from its residual {held} back to {full}){give}"
            if full >= held
            else f"reserve 0 MiB more on {roles} to wake {s.name}: the {full} MiB its engine "
            f"holds awake (elastic, shrunk before it slept), {held - full} MiB less than "
            f"its residual {held}{give}"
        )
        w.add(Action.RESERVE_WAKE, s, max(0, full - held), why, to_mib=full, host_mib=host)
    else:
        w.add(Action.RESERVE_WAKE, s, None, f"wake {s.name} (outside the ledger){give}")
    w.add(Action.WAKE, s, None, _start_reason(w, s) + f": wake it (asleep at level {level})")
    if level == 2:
        w.add(Action.RELOAD, s, None, f"reload the weights the level-2 sleep of {s.name} dropped")
    w.add(Action.AWAIT_READY, s, None, f"wait until {s.name} is healthy")
    if s.router_tier:
        w.add(Action.READMIT, s, None, f"readmit router tier {s.router_tier}")
    w.starting.add(s.name)
    w.woken.add(s.name)


def _claims_room(w: _Work, later: ServeSpec) -> bool:
    """True when ``later``, an on-demand requester, reserves room when its turn comes (one
    held back, e.g. by its backoff, or exited with its memory not back, which the ledger
    still counts, starts in no pass of this plan: it claims none)."""
    return (
        later.residency is Residency.ON_DEMAND
        and later.name not in w.policy.hold
        and later.name not in w.observed.unreleased
        and not later.exclusive
        and later.vram_mib is not None
        and w.in_ledger(later)
    )


def _room_ahead(w: _Work, short: Mapping[str, int], cands: Sequence[Candidate]) -> dict[str, int]:
    """MiB that on-demand requesters later in this pass will reserve on the short roles.

    Taken in their order, each only while the room for it, this requester's shortfall
    and those taken before it can still be made from ``cands``: one that cannot is left
    out (claiming room for it would make the whole claim fail, and choosing for this
    requester alone may stop a serve the next requester's victim would have made
    needless), and so is one that will wait for a free-memory-sizing peer's load on its
    GPU (it starts in a later plan: room claimed for it now would be freed twice)."""
    coverable: dict[str, int] = dict.fromkeys(short, 0)
    for c in cands:
        for r in c.gpu_roles:
            if r in coverable:
                coverable[r] += c.mib
    ahead: dict[str, int] = {}
    for later in w.claims[bisect_right(w.claim_at, w.at) :]:
        if later.sizes_from_free and _loading_peer(w, later) is not None:
            continue  # it waits for a peer's load (a start later in the pass never ends one)
        mib = later.vram_mib
        assert mib is not None
        roles = [r for r in later.gpu_roles if r in short]
        if roles and all(short[r] + ahead.get(r, 0) + mib <= coverable[r] for r in roles):
            for r in roles:
                ahead[r] = ahead.get(r, 0) + mib
    return ahead


def _start_all(w: _Work, serves: list[ServeSpec]) -> None:
    """Try each start in order; retry the blocked ones while the others made progress.

    One pass is not enough: a requester later in the order may evict or shrink what
    blocked an earlier serve (a resident waiting for room an on-demand eviction makes).
    A retry follows only a pass that stopped or shrank something (starts only take
    room), and each retry pass starts at least one more serve, so this ends; only the
    last pass's blocked entries are kept.

    In the first pass a short serve whose shortfall the stops forced by a later serve's
    start would cover (a port or exclusivity conflict with a holder on its roles), less
    what the later serves of the pass reserve there, waits for them instead of evicting
    or shrinking (:func:`_waits_for_later_stops`): the
    retry that follows finds that room, and the holders it would have evicted keep
    running (evicting them would free room twice, and the next plan would start them
    again). In a retry no serve waits: one whose room did not come evicts as before.
    """
    pending = serves
    first = True
    while pending:
        mark = len(w.blocked)
        w.freed = False
        w.pass_serves, w.may_defer, w.deferred, w.stops_later = pending, first, False, None
        first = False
        still: list[ServeSpec] = []
        # the requesters of this pass that claim room, and their places in it
        w.claim_at = [i for i, s in enumerate(pending) if _claims_room(w, s)]
        w.claims = [pending[i] for i in w.claim_at]
        for i, s in enumerate(pending):
            before = len(w.blocked)
            w.at = i
            _try_start(w, s)
            if len(w.blocked) > before:
                still.append(s)
        # only a stop, a sleep or a shrink frees room, a port or a role; starts only take.
        # A serve that waited for a later serve's forced stops is tried again (once more:
        # no serve waits in a retry, so a retry then starts at least one more serve)
        if not still or (not w.deferred and (len(still) == len(pending) or not w.freed)):
            return
        names = {s.name for s in still}
        w.blocked = w.blocked[:mark] + [b for b in w.blocked[mark:] if b.serve not in names]
        pending = still


def _readmit_left_quiesced(w: _Work) -> None:
    """Readmit the tier of a running serve the controller left quiesced."""
    for s in w.desired.serves.values():
        if (
            s.name in w.observed.quiesced
            and s.router_tier
            and s.name in w.running
            and s.name not in w.stopping
            and s.name not in w.starting
            and s.name not in w.asleep  # its tier stays quiesced until it is woken
            and s.name not in w.foreign
        ):
            w.group = s.name
            w.add(
                Action.READMIT,
                s,
                None,
                f"readmit router tier {s.router_tier}, left quiesced (a start interrupted "
                "before its readmit, or a readmit that failed)",
            )


def _start_reason(w: _Work, s: ServeSpec) -> str:
    if s.desired is DesiredRun.RUNNING:
        return f"{s.name} is desired running"
    return f"on-demand request for {s.name}"


def _whole(mib: int, elastic: Elastic) -> int:
    """``mib`` rounded down to whole segments of ``elastic``'s engine (0 when negative)."""
    seg = max(1, elastic.segment_mib)
    return max(0, mib) // seg * seg


def give_back_mib(held: int, elastic: Elastic) -> int:
    """What an elastic serve holding ``held`` MiB can give back: whole segments, floor kept."""
    return _whole(held - elastic.floor_mib, elastic)


def _grow(w: _Work) -> None:
    for s in w.desired.serves.values():
        if s.elastic is None:
            continue  # only an elastic serve gives memory back, and takes it back
        name = s.name
        if name not in w.running or name in w.observed.starting or name in w.asleep:
            continue
        if name in w.foreign:
            continue
        res = w.ledger.holdings.get(name)
        if s.elastic is None or s.vram_mib is None or res is None:
            continue
        held, full = res.mib, _whole_mib(w, s)
        if held >= full:
            continue
        # on every role it holds (those of its start record too)
        room = min(w.ledger.free_mib(r) for r in res.gpu_roles)
        # back to full, or by the whole segments the room holds (the engine maps whole
        # ones), below its declared figure: a grow to that or more is one back to full (the
        # engine's start-up default, which a larger start record counts at)
        if held + room >= full:
            to = full
        else:
            to = held + _whole(min(room, s.vram_mib - 1 - held), s.elastic)
        if to > held:
            w.ledger.adopt(_ok(w.ledger.resize(name, to)))
            w.group = name  # a grow is skipped when this serve's own start failed
            w.add(
                Action.GROW,
                s,
                to - held,
                f"take back {to - held} MiB (elastic) now that the room is free",
                to_mib=to,
            )


def _blocked_unknown(desired: DesiredState, names: Iterable[str]) -> list[Blocked]:
    return [
        Blocked(
            n, f"{n}: docker state is unknown; nothing is started or stopped until it can be read"
        )
        for n in names
    ]


def plan_transitions(
    desired: DesiredState,
    observed: Observed,
    policy: Policy | None,
    now: float,
) -> Plan:
    """Plan the ordered steps that move ``observed`` toward ``desired``. Pure.

    ``now`` is the time of the observation (epoch seconds), used for TTLs and
    ``min_runtime_s`` only. It has no default: a plan against the wrong time would
    misjudge every TTL and ``min_runtime_s``. ``policy`` None is ``Policy()``.
    """
    policy = policy or Policy()

    def pinned(d: DesiredState) -> Plan:
        return _plan(d, observed, policy, now)

    def fresh(d: DesiredState, name: str) -> Plan:
        return _plan(d, _holding_nothing(observed, d.serves[name]), policy, now)

    def reload(s: ServeSpec) -> RestoreCost:
        return policy.restore_cost_of(s.name, declared_restore(s))

    placed = resolve(desired, observed, now, pinned, fresh, reload)
    plan = _plan(placed.desired, observed, policy, now)
    if not placed.placements:
        return plan
    plan = blocked_on_every_candidate(plan, placed.placements)
    return dataclasses.replace(plan, placements=placed.placements)


def _holding_nothing(observed: Observed, s: ServeSpec) -> Observed:
    """``observed`` as if ``s``'s container were gone: it holds nothing, anywhere."""
    return dataclasses.replace(
        observed,
        containers={c: o for c, o in observed.containers.items() if c != s.container},
        started_with={c: o for c, o in observed.started_with.items() if c != s.container},
        sleep={n: o for n, o in observed.sleep.items() if n != s.name},
        in_flight={n: o for n, o in observed.in_flight.items() if n != s.name},
        unreleased=observed.unreleased - {s.name},
    )


def _plan(desired: DesiredState, observed: Observed, policy: Policy, now: float) -> Plan:
    """:func:`plan_transitions` once every placed serve has its role."""
    ledger = ledger_from_observed(desired, observed)
    active, expired = _requests(desired, observed, now)
    notes = [
        f"{r} is over budget as observed (started outside the ledger)"
        for r in ledger.overcommitted()
    ]
    if not observed.docker_ok:
        names = [
            s.name
            for s in desired.serves.values()
            if s.managed or s.name in active or s.name in expired
        ]
        return Plan((), tuple(_blocked_unknown(desired, names)), ledger, ledger, tuple(notes))

    w = _Work(desired, observed, policy, now, WorkingLedger(ledger))
    w.index()
    containers = observed.containers
    w.running = {
        s.name
        for s in desired.serves.values()
        if containers.get(s.container, ABSENT).holds or s.name in observed.starting
    }
    w.starting = {n for n in observed.starting if n in desired.serves}
    w.foreign = {
        s.name: project
        for s in desired.serves.values()
        if s.compose_project is not None and (project := observed.foreign(s)) is not None
    }
    w.exited = frozenset(n for n in ledger.holdings if n not in w.running)
    # the level it slept at; not said and not declared: 2, so the wake reloads (a
    # reload after a level-1 sleep costs time; none after a level-2 sleep serves garbage)
    w.asleep = {
        s.name: observed.sleep_of(s.name).level or (s.sleep.level if s.sleep else 2)
        for s in (desired.serves.values() if observed.sleep else ())  # none said: none
        if observed.sleep_of(s.name).asleep
        and observed.container(s.container).holds
        and s.name not in observed.starting
        and s.name not in w.foreign
    }

    _stops(w, expired, active)

    # 3. starts, 4. grow back before backfill
    wants: list[ServeSpec] = []
    for s in desired.serves.values():
        if (s.name in w.running and s.name not in w.asleep) or s.name in w.stopping:
            continue  # an asleep serve that is wanted is woken
        project = w.foreign.get(s.name)
        if project is not None:
            if s.desired is DesiredRun.RUNNING or s.name in active:
                w.blocked.append(
                    Blocked(s.name, f"{s.name} cannot start: {_foreign_veto(s, project)}")
                )
            continue
        if s.desired is DesiredRun.STOPPED:
            if s.name in active:
                w.blocked.append(
                    Blocked(
                        s.name, f'{s.name} is requested but the manifest says desired = "stopped"'
                    )
                )
            continue
        if s.desired is DesiredRun.RUNNING or s.name in active:
            wants.append(s)
    ordered = _start_order(w, wants, active)
    first = [s for s in ordered if s.residency in _FIRST]
    rest = [s for s in ordered if s.residency not in _FIRST]
    _start_all(w, first)
    _grow(w)
    _start_all(w, rest)
    _grow(w)  # what backfill woke (shrunk before it slept), into the room left
    _readmit_left_quiesced(w)
    for name in w.kept:  # kept while the plan was made: held by nothing that runs
        w.ledger.drop(name)
    return Plan(
        tuple(w.steps), tuple(w.blocked), ledger, w.ledger.frozen(), tuple(notes), room=w.room
    )
