"""Placement: which of its candidate roles a placed serve runs on (docs/placement.md).

A serve with ``placement`` (:attr:`statemachine.domain.types.ServeSpec.placement`) comes from
the manifest with ``gpu_roles`` = every candidate, which the ledger counts in full (never
less than the truth). :func:`resolve` narrows each one to one role, in four ways:

1. **held** — a serve that holds memory stays where it is: the role its start in
   progress reserved, else the role its running (or asleep, or unreleased) container
   was started on (``observed.started_with``). A resident is placed once and stays.
   Its container started where the controller cannot tell (by hand, before a restart
   lost the record) keeps every candidate: counted on each, moved nowhere
   (``unknown``). One held on a card no longer among its candidates is ``moved``:
   stopped by the plan (the planner's rule of serves off their cards), placed again
   once it holds nothing.
4. **moves** — after 1 to 3, one placed serve per plan that holds memory on the card a
   blocked pinned serve needs moves to another candidate where it fits without making
   room, when the plan with the move starts the pinned serve (:func:`_move`).
2. **fits** — a serve that holds nothing goes to a candidate where its reservation fits
   without making room; among those, *best fit*: the one left with the least free MiB
   (large holes stay for large models), then the declared order. A serve whose engine
   sizes itself from free memory (vLLM, SGLang) goes first where no such engine is
   loading (:func:`loading_roles`, and the starts placed before it in this plan): there
   it starts now, where it would wait for that load to end.
3. **victims** — where no candidate has room, the candidate whose plan frees it at the
   least cost under the planner's own rules: the plan with the serve on each candidate
   is made (``plan_with``), and the candidates compared by: the serve starts there;
   then the victim order (:func:`statemachine.planning.victims.preference_key`) over the serves
   that plan stops or puts to sleep for it, as the planner weighed them
   (:attr:`statemachine.planning.plan_types.Plan.room`), against that candidate's shortfall; then
   the declared order. Candidates where it cannot start go by the least short, then the
   declared order, and the plan's blocked reason gives every candidate's reason with
   its terms (:func:`blocked_on_every_candidate`), not only that of the card it waits
   on. A serve that does not want to run gets the candidate with the most free MiB:
   where it would go, said, nothing done.

Serves are placed in the order the planner serves them (those requested by their oldest
request, then the others, each in declared order), each seeing the reservations of the
pinned serves this plan will start and of those placed before it that want to run. Pure: no I/O, no
clock; the planner is handed in (``plan_with``), so this module never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from statemachine.domain.types import DesiredRun, DesiredState, Observed, Residency, ServeSpec
from statemachine.ledger.reservations import Ledger, ledger_from_observed
from statemachine.planning.admission import inside_min_runtime
from statemachine.planning.idleness import in_force
from statemachine.planning.plan_types import (
    Action,
    Blocked,
    CandidateTerms,
    How,
    Placement,
    Plan,
    RestoreCost,
)
from statemachine.planning.victims import Candidate, PreferenceKey, preference_key

__all__ = ["Placed", "apply", "blocked_on_every_candidate", "resolve", "wants_to_run"]


@dataclass(frozen=True, slots=True)
class Placed:
    """The desired state with every placed serve's role chosen, and the decisions."""

    desired: DesiredState
    placements: tuple[Placement, ...]


PlanWith = Callable[[DesiredState], Plan]
#: the plan of a desired state as if the named serve held nothing (its container gone)
PlanFresh = Callable[[DesiredState, str], Plan]
#: a serve's cost to bring back (measured, else declared); None: unknown
RestoreCostOf = Callable[[ServeSpec], RestoreCost | None]


def wants_to_run(desired: DesiredState, s: ServeSpec, observed: Observed, now: float) -> bool:
    """True when the serve is desired running or has an on-demand request in force
    (:func:`statemachine.planning.idleness.in_force`, the planner's own rule)."""
    if s.desired is DesiredRun.RUNNING:
        return True
    return s.desired is not DesiredRun.STOPPED and any(
        r.serve == s.name and in_force(r, s, observed, now) for r in desired.requests
    )


def _held_on(s: ServeSpec, observed: Observed) -> tuple[str, ...] | None:
    """The roles a placed serve holds memory on (``()``: it holds memory, where is not
    known); ``None`` when it holds none."""
    starting = observed.starting.get(s.name)
    if starting is not None:
        return starting.gpu_roles
    obs = observed.containers.get(s.container)
    if not ((obs is not None and obs.holds) or s.name in observed.unreleased):
        return None
    record = observed.started_with.get(s.container)
    return () if record is None else record.gpu_roles


def _sticky(s: ServeSpec, observed: Observed) -> Placement | None:
    """The placement of a serve that holds memory (it stays), or ``None``."""
    held = _held_on(s, observed)
    if held is None:
        return None
    if len(held) == 1 and not set(held) - set(s.placement):
        (role,) = held
        return Placement(s.name, role, How.HELD, f"{s.name} holds its memory on {role}")
    told = observed.container(s.container).told_roles
    if s.name not in observed.starting and set(told) - set(s.placement):
        return Placement(
            s.name,
            None,
            How.MOVED,
            f"{s.name} holds its memory on {', '.join(told)}, not one of its candidates "
            f"({', '.join(s.placement)}): it is stopped, and placed again once it holds nothing",
        )
    return Placement(
        s.name,
        None,
        How.UNKNOWN,
        f"{s.name} holds memory on a card the controller did not choose: counted on every "
        f"candidate ({', '.join(s.placement)}) until it stops",
    )


def _terms(
    s: ServeSpec, mib: int, ledger: Ledger, taken: Mapping[str, int]
) -> list[CandidateTerms]:
    """Each candidate's budget, committed (with ``taken`` by the serves placed before),
    and free MiB, for ``mib`` more."""
    out = []
    for role in s.placement:
        view = ledger.view(role)
        assert view.committed_mib is not None  # resolve places nothing on an unknown host
        committed = view.committed_mib + taken[role]
        out.append(
            CandidateTerms(role, view.budget_mib, committed, view.budget_mib - committed, mib)
        )
    return out


def _to_start(
    desired: DesiredState, ledger: Ledger, observed: Observed, now: float
) -> dict[str, int]:
    """Role -> the MiB the pinned serves that want to run and hold nothing yet will
    take: this plan starts them where they are pinned, so a placed serve is weighed
    beside them (a serve the plan then cannot start only made the choice cautious). A
    serve whose ``placement`` names one card is placed there already: it counts as
    pinned. The serves still to be placed are stopped in ``desired`` (:func:`resolve`):
    each takes its room as it is placed, not here."""
    taken = dict.fromkeys(desired.roles, 0)
    for s in desired.serves.values():
        if s.name in ledger.holdings or s.vram_mib is None:
            continue
        if desired.in_ledger(s) and wants_to_run(desired, s, observed, now):
            for role in s.gpu_roles:
                taken[role] += s.vram_mib
    return taken


def _best_fit(
    terms: Sequence[CandidateTerms], loading: frozenset[str] = frozenset()
) -> CandidateTerms | None:
    """The fitting candidate left with the least free MiB (declared order on a tie),
    one where no engine sizing itself from free memory loads (``loading``) first."""
    fitting = [t for t in terms if t.fits]
    # every candidate is asked the same MiB: the least free is the least left
    return min(fitting, key=lambda t: (t.role in loading, t.free_mib)) if fitting else None


def loading_roles(desired: DesiredState, observed: Observed) -> frozenset[str]:
    """The roles where an engine that sizes itself from free memory loads now: its start
    in progress, or its container's healthcheck still says ``starting``. A start there
    waits for that load to end (the planner's rule), so a serve of such an engine is
    placed elsewhere where it fits as well."""
    out: set[str] = set()
    for o in desired.serves.values():
        if not o.sizes_from_free:
            continue
        starting = observed.starting.get(o.name)
        if starting is not None:
            out.update(starting.gpu_roles)
        elif observed.container(o.container).health == "starting":
            held = _held_on(o, observed)
            out.update(held or o.gpu_roles)
    return frozenset(out)


#: a candidate's terms, and the serves its plan stops or puts to sleep for the serve
#: placed, as the planner weighed them (:attr:`statemachine.planning.plan_types.Plan.room`)
Weighed = tuple[CandidateTerms, tuple[Candidate, ...]]


def _weigh(s: ServeSpec, t: CandidateTerms, desired: DesiredState, plan_with: PlanWith) -> Weighed:
    """``t`` with what the plan with ``s`` on its role does to make room, and the serves
    it stops or puts to sleep for ``s`` as the planner weighed them."""
    serves = dict(desired.serves)
    serves[s.name] = replace(s, gpu_roles=(t.role,))
    plan = plan_with(replace(desired, serves=serves))
    # a serve that holds nothing has steps only where it starts (reserve, start, ...)
    starts = any(st.serve == s.name for st in plan.steps)
    made_room = [st for st in plan.steps if st.group == s.name and st.serve != s.name]
    victims = tuple(dict.fromkeys(st.serve for st in made_room))
    stops = len({st.serve for st in made_room if st.action is Action.STOP})
    freed = sum(st.mib for st in made_room if st.action in _FREES and st.mib is not None)
    blocked = next((b.reason for b in plan.blocked if b.serve == s.name), None)
    terms = replace(
        t, victims=victims, stops=stops, freed_mib=freed, starts=starts, blocked=blocked
    )
    return terms, plan.room.get(s.name, ())


_FREES = frozenset({Action.RELEASE, Action.RELEASE_TO_RESIDUAL, Action.SHRINK})


def _by_victims(weighed: Sequence[Weighed]) -> CandidateTerms:
    """The candidate that makes room at the least cost (docstring of the module, 3)."""
    order = {t.role: i for i, (t, _) in enumerate(weighed)}
    starting = [(t, room) for t, room in weighed if t.starts]
    if not starting:  # it starts nowhere: the least short
        return min((t for t, _ in weighed), key=lambda t: (_short(t), order[t.role]))

    # a plan that stops and puts to sleep nothing has no set to weigh: alike; of sets
    # as many, one whose room would not cover what the serves placed before it take
    # there starts only by leaving one of those blocked (the earlier request is served
    # first): it goes after the others
    def key(w: Weighed) -> tuple[int, bool, PreferenceKey, int]:
        pk = preference_key(w[1], {w[0].role: _short(w[0])} if w[1] else {})
        return (pk[0], _displaces(w[0]), pk, order[w[0].role])

    return min(starting, key=key)[0]


def _displaces(t: CandidateTerms) -> bool:
    """Whether the room the plan makes on candidate ``t`` falls short of what the serve
    placed needs there beside the serves placed before it: it would start in room one of
    them was placed to take."""
    return t.free_mib + t.freed_mib < t.requested_mib


def _short(t: CandidateTerms) -> int:
    """What the serve placed lacks on candidate ``t`` (positive: it does not fit)."""
    return t.requested_mib - t.free_mib


def _will_start(p: Placement) -> bool:
    """True when the plan starts the serve on the chosen card (it takes its room): a
    placement :func:`_choose` made, whose card is one of its candidates."""
    chosen = next(c for c in p.candidates if c.role == p.role)
    return chosen.fits or bool(chosen.starts)


def _choose(
    s: ServeSpec,
    terms: list[CandidateTerms],
    desired: DesiredState,
    wants: bool,
    plan_with: PlanWith,
    loading: frozenset[str] = frozenset(),
) -> Placement:
    """The placement of a serve that holds nothing (module docstring, 2 and 3); a serve
    that sizes itself from free memory fits first where none such loads (``loading``)."""
    fit = _best_fit(terms, loading if s.sizes_from_free else frozenset())
    if fit is not None:
        why = f"{s.name} fits on {fit.role} without making room, leaving the least free (best fit)"
        if s.sizes_from_free and loading.intersection(t.role for t in terms if t.fits):
            why = (
                f"{s.name} fits on {fit.role} without making room; of the candidates where "
                "it fits, one where no engine that sizes itself from free memory is loading "
                "first, then the least left free (best fit)"
            )
        return Placement(s.name, fit.role, How.FITS, why, tuple(terms))
    if not wants:
        most = max(terms, key=lambda t: t.free_mib)
        why = f"{s.name} fits on no candidate now; it would go to {most.role}, the most free"
        return Placement(s.name, most.role, How.IDLE, why, tuple(terms))
    weighed = [_weigh(s, t, desired, plan_with) for t in terms]
    best = _by_victims(weighed)
    why = (
        f"{s.name} fits on no candidate without making room; {best.role} makes room at the "
        "least cost (by the victim order: fewest victims, fewest possibly busy, cheapest "
        "to bring back, least freed beyond the need)"
    )
    if not best.starts:
        why = (
            f"{s.name} fits on no candidate and starts on none: it waits on {best.role}, "
            f"the least short ({_short(best)} MiB)"
        )
    return Placement(s.name, best.role, How.VICTIMS, why, tuple(t for t, _ in weighed))


def blocked_on_every_candidate(plan: Plan, placements: Sequence[Placement]) -> Plan:
    """``plan`` with the blocked reason of each placed serve that starts on none of its
    candidates giving every candidate's reason and terms, as the plan with the serve
    there gave them, not only those of the card it waits on. Kept as it is where the
    candidates' reasons are one (a hold: the same on every card)."""
    nowhere = {
        p.serve: p
        for p in placements
        if p.how is How.VICTIMS and not any(c.starts for c in p.candidates)
    }
    blocked = tuple(
        _every_reason(b, nowhere[b.serve]) if b.serve in nowhere else b for b in plan.blocked
    )
    return replace(plan, blocked=blocked)


def _every_reason(b: Blocked, p: Placement) -> Blocked:
    reasons = [(c.role, c.blocked) for c in p.candidates]
    if any(why is None for _, why in reasons) or len({why for _, why in reasons}) == 1:
        return b
    roles = ", ".join(role for role, _ in reasons)
    each = " ".join(f"On {role}: {why}." for role, why in reasons)
    head = f"{b.serve} starts on none of its candidates ({roles}); it waits on {p.role}"
    return replace(b, reason=f"{head}, the least short. {each}")


def resolve(
    desired: DesiredState,
    observed: Observed,
    now: float,
    plan_with: PlanWith,
    plan_fresh: PlanFresh | None = None,
    reload: RestoreCostOf | None = None,
) -> Placed:
    """Every placed serve's role (module docstring); ``desired`` as it is without one.
    ``plan_fresh`` and ``reload`` let a sleeper whose wake waits move (5.)."""
    # a placed serve without a reservation is outside the ledger: nowhere to weigh it
    placed = [
        s
        for s in desired.serves.values()
        if s.placement and not s.placed and s.vram_mib is not None
    ]
    if not placed or not observed.docker_ok:  # unknown host: every candidate still counted
        return Placed(desired, ())
    serves = dict(desired.serves)
    decisions: dict[str, Placement] = {}
    for s in placed:  # 1. those that hold memory stay where they are
        sticky = _sticky(s, observed)
        if sticky is not None:
            decisions[s.name] = sticky
            if sticky.role is not None:
                serves[s.name] = replace(s, gpu_roles=(sticky.role,))
    # requested serves by their oldest request, as the planner serves them; then the rest
    asked: dict[str, float] = {}
    for r in desired.requests:
        asked[r.serve] = min(asked.get(r.serve, r.requested_at), r.requested_at)
    rest = sorted(
        (s for s in placed if s.name not in decisions),
        key=lambda s: (s.name not in asked, asked.get(s.name, 0.0)),
    )
    # the others are not counted while they are weighed: stopped until placed
    for s in rest:
        serves[s.name] = replace(s, desired=DesiredRun.STOPPED)
    ledger = ledger_from_observed(replace(desired, serves=serves), observed)
    taken = _to_start(replace(desired, serves=serves), ledger, observed, now)
    loading = loading_roles(desired, observed)
    for s in rest:  # 2. and 3., in that order
        mib = s.vram_mib
        assert mib is not None  # filtered above
        wants = wants_to_run(desired, s, observed, now)
        so_far = replace(desired, serves={**serves, s.name: s})
        choice = _choose(s, _terms(s, mib, ledger, taken), so_far, wants, plan_with, loading)
        decisions[s.name] = choice
        assert choice.role is not None
        serves[s.name] = replace(s, gpu_roles=(choice.role,))
        if wants and _will_start(choice):  # one that cannot start takes no room
            taken[choice.role] += mib
            if s.sizes_from_free:  # it loads there in this plan
                loading |= {choice.role}
    room = _Room(replace(desired, serves=serves), observed, now, ledger, taken)
    moved = _move(room, plan_with)
    if moved is None and plan_fresh is not None and reload is not None:
        moved = _wake_elsewhere(room, plan_with, plan_fresh, reload)
    if moved is not None:
        decisions[moved.serve] = moved
        assert moved.role is not None
        serves[moved.serve] = replace(serves[moved.serve], gpu_roles=(moved.role,))
    order = [s.name for s in placed]
    return Placed(replace(desired, serves=serves), tuple(decisions[n] for n in order))


@dataclass(frozen=True, slots=True)
class _Room:
    """What a move is weighed against: the desired state with every placed serve's
    role chosen, the observation, the ledger and the MiB the plan's starts take."""

    desired: DesiredState
    observed: Observed
    now: float
    ledger: Ledger
    taken: Mapping[str, int]

    def left(self, role: str) -> int:
        """The MiB free on ``role`` once what is committed and what this plan starts
        there are counted."""
        return self.ledger.free_mib(role) - self.taken[role]

    def short(self, role: str) -> bool:
        """True when ``role`` has less than nothing left."""
        return self.left(role) < 0

    def fits(self, role: str, mib: int) -> bool:
        """True when ``mib`` more fits on ``role`` without making room."""
        return self.left(role) >= mib


def _blocked_pinned(room: _Room) -> list[ServeSpec]:
    """The pinned serves that want to run, hold nothing and are short on a role."""
    return [
        s
        for s in room.desired.serves.values()
        if not s.placement
        and s.name not in room.ledger.holdings
        and room.desired.in_ledger(s)
        and wants_to_run(room.desired, s, room.observed, room.now)
        and any(room.short(r) for r in s.gpu_roles)
    ]


def _movable(room: _Room, held_on: str) -> list[tuple[ServeSpec, str]]:
    """Each placed serve held on ``held_on`` that may move (managed, not resident, awake
    or asleep and to be woken, not starting, outside its ``min_runtime_s``, its
    container's environment naming that card), with the other candidate it fits on
    without making room (best fit: the least left free)."""
    out = []
    for p in room.desired.serves.values():
        if p.gpu_roles != (held_on,) or p.vram_mib is None:
            continue
        if (
            not p.managed
            or p.residency is Residency.RESIDENT
            or p.name in room.observed.starting
            or (
                room.observed.sleep_of(p.name).asleep
                and not wants_to_run(room.desired, p, room.observed, room.now)
            )
            or inside_min_runtime(p, room.observed, room.now) is not None
            or room.observed.container(p.container).told_roles != (held_on,)
        ):
            continue
        mib = p.vram_mib
        # a pinned serve (no ``placement``) has no other candidate: it never moves
        fits = [r for r in p.placement if r != held_on and room.fits(r, mib)]
        if fits:
            out.append((p, min(fits, key=room.left)))
    return out


def _move(room: _Room, plan_with: PlanWith) -> Placement | None:
    """The one placed serve moved this plan (docs/placement.md, moves): a pinned serve
    that wants to run is blocked on its card, a placed serve that holds memory there
    may move to another candidate with room for it, and the plan with that move starts
    the pinned serve where the plan without it does not. It is stopped on its card and
    started on the other by the next plan; None when no pinned serve needs that."""
    pairs = [
        (r, p, to)
        for r in _blocked_pinned(room)
        for on in r.gpu_roles
        for p, to in _movable(room, on)
    ]
    base = plan_with(room.desired) if pairs else None
    for r, p, to in pairs:
        assert base is not None
        if _has_steps(base, r.name):
            continue  # it starts anyway
        serves = {**room.desired.serves, p.name: replace(p, gpu_roles=(to,))}
        if _only_the_move(plan_with(replace(room.desired, serves=serves)), r, p, to):
            (held,) = p.gpu_roles
            why = (
                f"{p.name} moves from {held} to {to} so that {r.name} (pinned to "
                f"{', '.join(r.gpu_roles)}) can start: {p.name} is stopped on {held} and "
                f"started on {to}, where it fits without making room"
            )
            return Placement(p.name, to, How.MOVED, why)
    return None


def _waited_out(room: _Room, p: ServeSpec, reload: RestoreCostOf) -> tuple[float, float] | None:
    """(how long ``p`` has waited, what a cold start costs beyond its wake) for a placed
    sleeper that may move (not resident, asleep on one card its container's environment
    names, requested: its request lets the plan stop it) and has waited at least that;
    None otherwise or where a cost is unknown."""
    if not p.placement or p.residency is Residency.RESIDENT:
        return None
    obs = room.observed
    if not obs.sleep_of(p.name).asleep or p.name in obs.starting or len(p.gpu_roles) != 1:
        return None
    cost = reload(p)
    asked = [r.requested_at for r in room.desired.requests if r.serve == p.name]
    if cost is None or cost.cold_s is None or cost.wake_s is None or not asked:
        return None
    if obs.container(p.container).told_roles != p.gpu_roles:
        return None
    if not wants_to_run(room.desired, p, obs, room.now):
        return None
    waited, beyond = room.now - min(asked), cost.cold_s - cost.wake_s
    return (waited, beyond) if waited >= beyond else None


def _wake_elsewhere(
    room: _Room, plan_with: PlanWith, plan_fresh: PlanFresh, reload: RestoreCostOf
) -> Placement | None:
    """The one placed sleeper moved this plan because its wake waits (docs/placement.md,
    a sleeper whose wake waits): requested, it has waited on its card at least what a
    cold start costs beyond its wake (the ski-rental rule: never more than twice the
    better choice), the plan does not wake it, and on another candidate the plan as if
    it held nothing starts it. It is stopped (its residual and host RAM given back) and
    placed again by the next plan; None when no sleeper is in that case."""
    waiting = [(p, w) for p in room.desired.serves.values() if (w := _waited_out(room, p, reload))]
    if not waiting:
        return None
    base = plan_with(room.desired)
    for p, (waited, beyond) in waiting:
        if _has_steps(base, p.name):
            continue  # woken (or stopped) by this plan anyway
        (held,) = p.gpu_roles
        for to in (r for r in p.placement if r != held):
            moved = replace(
                room.desired, serves={**room.desired.serves, p.name: replace(p, gpu_roles=(to,))}
            )
            plan = plan_fresh(moved, p.name)
            if any(st.serve == p.name and st.action is Action.START for st in plan.steps):
                why = (
                    f"{p.name}, asleep on {held}, has waited {waited:.0f}s for its wake there, "
                    f"at least what a cold start costs beyond its wake ({beyond:.1f}s); on {to} "
                    f"it would start now: it is stopped on {held} (its residual and host RAM "
                    "given back) and placed again once it holds nothing"
                )
                return Placement(p.name, to, How.MOVED, why)
    return None


def _only_the_move(plan: Plan, r: ServeSpec, p: ServeSpec, to: str) -> bool:
    """True when the plan with ``p`` moved to ``to`` starts ``r``, stops nothing else for
    it, and leaves ``p``'s room on ``to`` (a grow or a wake in the same plan may take it)."""
    assert p.vram_mib is not None
    others = any(st.group == r.name and st.serve not in (r.name, p.name) for st in plan.steps)
    left = plan.ledger_after.free_mib(to)
    return _has_steps(plan, r.name) and not others and left >= p.vram_mib


def _has_steps(plan: Plan, serve: str) -> bool:
    """True when ``plan`` does something with ``serve`` (one that holds nothing: starts it)."""
    return any(st.serve == serve for st in plan.steps)


def apply(desired: DesiredState, placements: Sequence[Placement]) -> DesiredState:
    """``desired`` with the roles ``placements`` chose (a plan's): what its execution and
    the records of its starts must see."""
    serves = dict(desired.serves)
    for p in placements:
        s = serves.get(p.serve)
        if p.role is not None and s is not None and p.role in s.placement:
            serves[p.serve] = replace(s, gpu_roles=(p.role,))
    return replace(desired, serves=serves) if placements else desired
