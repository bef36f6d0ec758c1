"""The plan's types: the step actions, a step, a blocked serve, the policy, the plan.

What :func:`statemachine.planning.planner.plan_transitions` answers and what the executor,
the journal and the JSON contracts (docs/design.md §5 plan JSON) read. Kept apart from
the planner so readers of a plan need not import the planning rules.

Pure: frozen data and their JSON forms; no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from statemachine.domain.slotinit import direct_init
from statemachine.domain.types import ServeSpec
from statemachine.ledger.reservations import Ledger, RoleTerms
from statemachine.planning.reuse import expected_restore_s, reuse_rate, sleep_worth
from statemachine.planning.victims import DEFAULT_EXACT_LIMIT, Candidate, recency_weight


class Action(StrEnum):
    """The step actions of docs/design.md §5, in the order a room-making plan uses them."""

    QUIESCE = "quiesce"
    DRAIN = "drain"
    STOP = "stop"
    RELEASE = "release"
    #: ask the engine to sleep (its router tier drained first, as before a stop)
    SLEEP = "sleep"
    #: once the sleep is confirmed, the reservation comes down to ``residual_mib``
    #: (``to_mib``) and, at level 1, ``host_mib`` is taken on the host budget
    RELEASE_TO_RESIDUAL = "release_to_residual"
    SHRINK = "shrink"
    GROW = "grow"
    RESERVE = "reserve"
    #: admit a sleeper's full reservation again (``to_mib``) and give back its host RAM
    #: (``host_mib``) before it is woken
    RESERVE_WAKE = "reserve_wake"
    #: ask a sleeping engine to wake (then await_ready, readmit)
    WAKE = "wake"
    #: level 2 only: reload the weights a level-2 sleep dropped (after wake)
    RELOAD = "reload"
    START = "start"
    AWAIT_READY = "await_ready"
    READMIT = "readmit"


@direct_init
@dataclass(frozen=True, slots=True)
class Step:
    """One step. ``mib`` is what the step moves in the ledger (``None``: nothing).

    For shrink and grow, ``mib`` is the MiB given back or taken and ``to_mib`` the
    reservation afterwards; likewise for release_to_residual (down to the residual) and
    reserve_wake (back to full), whose ``host_mib`` is the host RAM taken or given back.
    ``group`` names the serve whose intent the step serves (a requester for its victims'
    and shrinks' steps): when a step fails, the executor skips the rest of its group,
    and the ledger guards the other groups.
    """

    action: Action
    serve: str
    gpu_roles: tuple[str, ...]
    mib: int | None
    reason: str
    to_mib: int | None = None
    group: str = ""
    host_mib: int | None = None

    def to_json(self) -> dict[str, Any]:
        """docs/design.md §5 step JSON (plus ``to_mib`` for shrink / grow, and ``group``)."""
        out: dict[str, Any] = {
            "action": str(self.action),
            "serve": self.serve,
            "gpu_roles": list(self.gpu_roles),
            "mib": self.mib,
            "reason": self.reason,
            "group": self.group,
        }
        if self.to_mib is not None:
            out["to_mib"] = self.to_mib
        if self.host_mib is not None:
            out["host_mib"] = self.host_mib
        return out

    @classmethod
    def from_json(cls, data: object) -> Step:
        """The step of :meth:`to_json` (a saved plan's); raises ``ValueError`` naming the
        malformed field, and refuses a resize without the figure it resizes to (the
        ledger would count it as moving nothing, the executor could not carry it out)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"step: expected an object, got {type(data).__name__}")
        serve = _text(data, "serve", None)
        raw = data.get("action")
        action = _ACTIONS.get(raw) if isinstance(raw, str) else None
        if action is None:
            raise ValueError(f"step {serve}: action: {raw!r} is not one of {', '.join(_ACTIONS)}")
        roles = data.get("gpu_roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ValueError(f"step {action} {serve}: gpu_roles: expected names, got {roles!r}")
        step = cls(
            action,
            serve,
            tuple(roles),
            _mib(data, "mib", f"{action} {serve}"),
            _text(data, "reason", ""),
            _mib(data, "to_mib", f"{action} {serve}"),
            _text(data, "group", serve),
            _mib(data, "host_mib", f"{action} {serve}"),
        )
        if action in _RESIZES and step.to_mib is None:
            raise ValueError(f"step {action} {serve}: to_mib: required for a {action}")
        return step


_ACTIONS = {a.value: a for a in Action}
#: the steps that move a reservation to ``to_mib``: without it they cannot be carried out
_RESIZES = frozenset({Action.SHRINK, Action.GROW, Action.RELEASE_TO_RESIDUAL})


def _text(data: Mapping[str, Any], key: str, default: str | None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"step: {key}: expected text, got {value!r}")
    return value


def _mib(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"step {where}: {key}: expected MiB (0 or more) or null, got {value!r}")
    return value


@direct_init
@dataclass(frozen=True, slots=True)
class Protected:
    """A serve that holds memory (or a port) the blocked serve needs and may not be stopped."""

    serve: str
    mib: int | None
    why: str

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"serve": self.serve, "mib": self.mib, "why": self.why}


@direct_init
@dataclass(frozen=True, slots=True)
class Blocked:
    """Work that cannot happen now, with every term of the arithmetic."""

    serve: str
    reason: str
    terms: tuple[RoleTerms, ...] = ()
    evictable_mib: tuple[tuple[str, int], ...] = ()
    shrinkable_mib: tuple[tuple[str, int], ...] = ()
    #: a tuple, or a :class:`statemachine.planning.deferred.Deferred` that stands for one (built
    #: when first read: a blocked backfill lists every holder of its short roles)
    protected: Sequence[Protected] = ()
    #: per role, what putting the evictable serves that can sleep to sleep would free
    sleepable_mib: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """docs/design.md §5 blocked JSON (plus ``sleepable_mib`` where sleep frees some)."""
        ledger: dict[str, Any] = {
            "gpu_roles": [t.to_json() for t in self.terms],
            "evictable_mib": dict(self.evictable_mib),
            "shrinkable_mib": dict(self.shrinkable_mib),
            "protected": [p.to_json() for p in self.protected],
        }
        if any(mib for _, mib in self.sleepable_mib):  # only where a sleep could free some
            ledger["sleepable_mib"] = dict(self.sleepable_mib)
        return {"serve": self.serve, "reason": self.reason, "ledger": ledger}


@dataclass(frozen=True, slots=True)
class Policy:
    """Planner knobs, and what the controller knows that the observation does not.

    ``no_shrink``: elastic serves whose last shrink did not free what was asked; the
    planner falls back to what it would do without shrinking them (eviction).
    ``hold``: serves not to start now (serve -> why, e.g. a failure backoff); they are
    reported as blocked with that reason.
    ``no_sleep``: serves not to put to sleep (their engine answered the sleep API with
    404, or their last sleep did not confirm); the planner stops them instead.
    """

    exact_search_limit: int = DEFAULT_EXACT_LIMIT
    no_shrink: frozenset[str] = frozenset()
    hold: Mapping[str, str] = field(default_factory=dict)
    no_sleep: frozenset[str] = frozenset()
    #: what bringing each serve back costs (measured, else declared; absent: unknown)
    reload: Mapping[str, RestoreCost] = field(default_factory=dict)
    #: when each serve was last used (epoch s: last seen busy, or last requested)
    last_used: Mapping[str, float] = field(default_factory=dict)
    #: each serve's recent uses (epoch s, oldest first: requested, or seen going busy);
    #: a serve absent is one whose uses are not known (statemachine/planning/reuse.py)
    uses: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def victim_cost(
        self,
        name: str,
        started: float | None,
        now: float,
        *,
        wake: bool,
        declared: RestoreCost | None = None,
    ) -> float | None:
        """What evicting ``name`` costs later (docs/eviction.md): the seconds it takes to
        come back (its wake when it would sleep, else its cold start: :attr:`reload`, else
        the manifest's figure ``declared``), weighted by how long ago it was last used
        (:attr:`last_used`, else its start ``started``;
        :func:`~statemachine.planning.victims.recency_weight`). ``None``: unknown."""
        seconds = None
        for cost in (self.reload.get(name), declared):
            if cost is not None and seconds is None:
                seconds = cost.wake_s if wake else cost.cold_s
        if seconds is None:
            return None
        uses = self.uses.get(name)
        if uses is not None:  # how often it is asked for, not only how lately
            # none counted yet (a loop just begun): its start is its one use
            return seconds * reuse_rate(uses or ((started,) if started is not None else ()), now)
        used = self.last_used.get(name, started)
        return seconds * recency_weight(None if used is None else now - used)

    def expected_restore_s(
        self, name: str, now: float, *, wake: bool, declared: RestoreCost | None = None
    ) -> float | None:
        """What evicting ``name`` is expected to cost later, in seconds
        (:func:`~statemachine.planning.reuse.expected_restore_s`: its wake when it would sleep,
        else its cold start, times the chance it is asked for again within the hour);
        ``None``: unknown (its uses or that cost)."""
        uses = self.uses.get(name)
        seconds = None
        for cost in (self.reload.get(name), declared):
            if cost is not None and seconds is None:
                seconds = cost.wake_s if wake else cost.cold_s
        if uses is None or seconds is None:
            return None
        return expected_restore_s(reuse_rate(uses, now), seconds)

    def sleep_worth(
        self, name: str, now: float, declared: RestoreCost | None = None
    ) -> float | None:
        """What keeping ``name`` asleep rather than stopped is worth
        (:func:`~statemachine.planning.reuse.sleep_worth`: its reuse rate from :attr:`uses` times
        the seconds its wake saves, per hour); ``None``: unknown."""
        uses = self.uses.get(name)
        if uses is None:
            return None
        cost = self.restore_cost_of(name, declared)
        return sleep_worth(reuse_rate(uses, now), cost.cold_s, cost.wake_s)

    def restore_cost_of(self, name: str, declared: RestoreCost | None = None) -> RestoreCost:
        """What bringing ``name`` back costs, each figure as measured (:attr:`reload`),
        else as the manifest declares it (``declared``), else unknown (None)."""
        cold = wake = None
        for cost in (self.reload.get(name), declared):
            if cost is not None:
                cold = cost.cold_s if cold is None else cold
                wake = cost.wake_s if wake is None else wake
        return RestoreCost(cold, wake)

    def to_json(self) -> dict[str, Any]:
        """The JSON form the journal records with each cycle (replay plans with it);
        ``no_sleep``, ``reload``, ``last_used`` and ``uses`` only when there are some
        (older records have none)."""
        out: dict[str, Any] = {
            "exact_search_limit": self.exact_search_limit,
            "no_shrink": sorted(self.no_shrink),
            "hold": {name: self.hold[name] for name in sorted(self.hold)},
        }
        if self.no_sleep:
            out["no_sleep"] = sorted(self.no_sleep)
        if self.reload:
            out["reload"] = {n: self.reload[n].to_json() for n in sorted(self.reload)}
        if self.last_used:
            out["last_used"] = {n: self.last_used[n] for n in sorted(self.last_used)}
        if self.uses:
            out["uses"] = {n: list(self.uses[n]) for n in sorted(self.uses)}
        return out

    @classmethod
    def from_json(cls, data: object) -> Policy:
        """The policy of :meth:`to_json`; raises ``ValueError`` saying what is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"policy: expected an object, got {type(data).__name__}")
        limit = data.get("exact_search_limit", DEFAULT_EXACT_LIMIT)
        no_shrink = data.get("no_shrink", [])
        hold = data.get("hold", {})
        no_sleep = data.get("no_sleep", [])
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"policy: exact_search_limit: expected a count, got {limit!r}")
        if not isinstance(no_shrink, list) or not all(isinstance(n, str) for n in no_shrink):
            raise ValueError(f"policy: no_shrink: expected a list of names, got {no_shrink!r}")
        if not isinstance(hold, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in hold.items()
        ):
            raise ValueError(f"policy: hold: expected names with reasons, got {hold!r}")
        if not isinstance(no_sleep, list) or not all(isinstance(n, str) for n in no_sleep):
            raise ValueError(f"policy: no_sleep: expected a list of names, got {no_sleep!r}")
        reload = data.get("reload", {})
        last_used = data.get("last_used", {})
        if not isinstance(reload, Mapping):
            raise ValueError(f"policy: reload: expected serves with costs, got {reload!r}")
        if not isinstance(last_used, Mapping) or not all(
            isinstance(k, str) and _seconds(v) for k, v in last_used.items()
        ):
            raise ValueError(f"policy: last_used: expected serves with times, got {last_used!r}")
        uses = data.get("uses", {})
        if not isinstance(uses, Mapping) or not all(
            isinstance(k, str) and isinstance(v, list) and all(_seconds(t) for t in v)
            for k, v in uses.items()
        ):
            raise ValueError(f"policy: uses: expected serves with lists of times, got {uses!r}")
        return cls(
            exact_search_limit=limit,
            no_shrink=frozenset(no_shrink),
            hold=dict(hold),
            no_sleep=frozenset(no_sleep),
            reload={str(k): RestoreCost.from_json(v, str(k)) for k, v in reload.items()},
            last_used={k: float(v) for k, v in last_used.items()},
            uses={k: tuple(float(t) for t in v) for k, v in uses.items()},
        )


def _seconds(value: object) -> bool:
    """True for a number of seconds that is not negative (a bool is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def declared_restore(spec: ServeSpec) -> RestoreCost | None:
    """What ``spec``'s manifest declares it costs to bring back (``cold_start_s``,
    ``[serve.sleep] wake_s``); ``None`` when it declares neither."""
    wake = spec.sleep.wake_s if spec.sleep is not None else None
    if spec.cold_start_s is None and wake is None:
        return None
    return RestoreCost(spec.cold_start_s, wake)


@dataclass(frozen=True, slots=True)
class RestoreCost:
    """What bringing a serve back costs, in seconds: a cold start (its start until it is
    healthy) and a wake (its wake calls until it is healthy); ``None``: unknown (neither
    measured nor declared). The planner weighs victims with it (docs/eviction.md)."""

    cold_s: float | None = None
    wake_s: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {"cold_s": self.cold_s, "wake_s": self.wake_s}

    @classmethod
    def from_json(cls, data: object, serve: str) -> RestoreCost:
        """The cost of :meth:`to_json`; raises ``ValueError`` naming ``serve``."""
        if not isinstance(data, Mapping):
            raise ValueError(f"policy: reload: {serve}: expected an object, got {data!r}")
        got: dict[str, float | None] = {}
        for key in ("cold_s", "wake_s"):
            value = data.get(key)
            if value is not None and not _seconds(value):
                raise ValueError(f"policy: reload: {serve}: {key}: expected seconds, got {value!r}")
            got[key] = None if value is None else float(value)
        return cls(got["cold_s"], got["wake_s"])


# ── placement (statemachine/planning/placement.py decides; the plan carries it) ───────────


class How(StrEnum):
    """How a placed serve's role was chosen."""

    HELD = "held"
    UNKNOWN = "unknown"
    FITS = "fits"
    VICTIMS = "victims"
    IDLE = "idle"
    #: it holds memory on a card it is not to run on (no longer a candidate, or moved
    #: to let a pinned serve start there): stopped, and started on ``role`` (None: placed
    #: again once it holds nothing)
    MOVED = "moved"


@dataclass(frozen=True, slots=True)
class CandidateTerms:
    """One candidate's arithmetic: its budget, what is committed on it (with the serves
    placed before in this plan), the free MiB, and what placing the serve would cost."""

    role: str
    budget_mib: int
    committed_mib: int
    free_mib: int
    requested_mib: int
    #: the plan with the serve there: the serves it stops / puts to sleep / shrinks
    victims: tuple[str, ...] = ()
    stops: int = 0
    freed_mib: int = 0
    starts: bool | None = None
    #: why that plan does not start the serve there, with its terms (None: it starts,
    #: or it was not weighed); the plan's blocked reason of a serve that starts on no
    #: candidate gives each one's. Not in the JSON (the blocked reason carries it)
    blocked: str | None = field(default=None, compare=False)

    @property
    def fits(self) -> bool:
        """True when the reservation fits without making room."""
        return self.requested_mib <= self.free_mib

    def to_json(self) -> dict[str, Any]:
        """Every term, by name."""
        return {
            "role": self.role,
            "budget_mib": self.budget_mib,
            "committed_mib": self.committed_mib,
            "free_mib": self.free_mib,
            "requested_mib": self.requested_mib,
            "fits": self.fits,
            "victims": list(self.victims),
            "stops": self.stops,
            "freed_mib": self.freed_mib,
            "starts": self.starts,
        }

    def text(self) -> str:
        """``a: free 3000 of 8000, needs 2000, fits`` (with its victims where weighed)."""
        out = f"{self.role}: free {self.free_mib} of {self.budget_mib}, needs {self.requested_mib}"
        if self.fits:
            return f"{out}, fits (leaves {self.free_mib - self.requested_mib})"
        if self.starts is None:
            return f"{out}, short by {self.requested_mib - self.free_mib}"
        if not self.starts:
            return f"{out}: cannot start there even by making room"
        who = ", ".join(self.victims) or "nothing"
        return f"{out}: makes room from {who} ({self.stops} stopped, {self.freed_mib} MiB freed)"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one placed serve runs (``role`` ``None``: unknown, counted on every
    candidate), how that was decided, and each candidate's terms."""

    serve: str
    role: str | None
    how: How
    reason: str
    candidates: tuple[CandidateTerms, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """``{"serve", "role", "how", "reason", "candidates"}``."""
        return {
            "serve": self.serve,
            "role": self.role,
            "how": str(self.how),
            "reason": self.reason,
            "candidates": [c.to_json() for c in self.candidates],
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer."""

    steps: tuple[Step, ...]
    blocked: tuple[Blocked, ...]
    ledger_before: Ledger
    ledger_after: Ledger
    notes: tuple[str, ...] = ()
    #: where each placed serve runs and why (``statemachine.planning.placement``); empty
    #: for a manifest without ``placement``
    placements: tuple[Placement, ...] = ()
    #: requester -> the serves its start stops or puts to sleep, as the planner weighed
    #: them (:class:`~statemachine.planning.victims.Candidate`: a victim put to sleep at the MiB
    #: its sleep frees and the cost of its wake), the stops it forces by a port or
    #: exclusivity among them; none for a start that stops nothing (its room was free,
    #: or made by shrinking). Placement compares its candidate cards by them. Not in the
    #: plan's JSON, nor in its equality
    room: Mapping[str, tuple[Candidate, ...]] = field(default_factory=dict, compare=False)

    @property
    def empty(self) -> bool:
        """True when there is nothing to do."""
        return not self.steps

    def to_json(self) -> dict[str, Any]:
        """docs/design.md §5 plan JSON (plus ``ledger_before`` and ``notes``, and the host
        RAM ledger before and after when the manifest has a ``[host]`` budget)."""
        out: dict[str, Any] = {
            "steps": [s.to_json() for s in self.steps],
            "blocked": [b.to_json() for b in self.blocked],
            "ledger_before": {
                r: self.ledger_before.view(r).to_json() for r in self.ledger_before.roles
            },
            "ledger_after": {
                r: self.ledger_after.view(r).to_json() for r in self.ledger_after.roles
            },
            "notes": list(self.notes),
        }
        for key, ledger in (
            ("host_ledger_before", self.ledger_before),
            ("host_ledger_after", self.ledger_after),
        ):
            host = ledger.host_view()
            if host is not None:  # only with a [host] budget
                out[key] = host.to_json()
        if self.placements:  # only with placed serves
            out["placements"] = [p.to_json() for p in self.placements]
        return out
