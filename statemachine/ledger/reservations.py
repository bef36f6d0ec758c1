"""The reservation ledger: per GPU role, capacity, reserve, budget and committed MiB.

The ledger is the capacity layer under every transition (ADR-0017). Its operations
(:meth:`Ledger.admit`, :meth:`Ledger.release`, :meth:`Ledger.resize`) return either a
new ledger or a :class:`Refusal` that carries every term of the arithmetic, and they
never produce a ledger in which ``committed > budget`` on a role they touched.

Host RAM is a second kind of budget (the manifest's ``[host]``): a level-1 sleeper
holds its weights there. :meth:`Ledger.sleep` brings a reservation down to its residual
and takes the sleeper's host RAM, :meth:`Ledger.wake` admits the full reservation again
and gives the host RAM back; neither ever leaves host RAM committed above its budget.

A ledger built from an observation (:func:`ledger_from_observed`) may already be over
budget: a container started outside the controller is reality, and it is reported
(:meth:`Ledger.overcommitted`), not hidden. When docker could not be read the ledger
is *unknown*: committed figures are ``None`` and nothing is admitted (fail closed).

"Holds" had four meanings; each has its own word here. A container *occupies* memory
while its state is running, paused or restarting (``ContainerObs.holds``); the ledger
*counts* a holder that has a committed reservation (:meth:`Ledger.holds`; its
*holdings*, :attr:`Ledger.holdings`); a serve counted at less than it *declares*
(``vram_mib``) is shrunk, or asleep and *keeps* its residual on its roles and its host
RAM (:func:`sleeping_reservation`); a serve that occupies memory no ledger counts is
*uncounted* (:func:`held_uncounted`); a lifecycle state *claims* a reservation
(``holds`` of its :data:`statemachine.lifecycle.machine.STATES` entry). Field names of the JSON
are unchanged.

This module is pure: no I/O, no clock, no logging, no docker.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Self

from statemachine.domain.slotinit import direct_init
from statemachine.domain.types import (
    COMMITTED_STATES,
    DesiredState,
    GpuRole,
    HostBudget,
    Observed,
    ServeSpec,
    SleepObs,
    SleepState,
    StartedWith,
)
from statemachine.ledger.pmap import PMap


@direct_init
@dataclass(frozen=True, slots=True)
class GpuReservation:
    """``mib`` reserved by ``holder`` on each of ``gpu_roles`` (the same amount on each)."""

    holder: str
    gpu_roles: tuple[str, ...]
    mib: int


class RefusalKind(StrEnum):
    """Why an operation was refused."""

    OVER_BUDGET = "over_budget"
    UNKNOWN_STATE = "unknown_state"
    UNKNOWN_ROLE = "unknown_role"
    ALREADY_HELD = "already_held"
    NOT_HELD = "not_held"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class _Line:
    """The terms every line of the ledger has, a role's or host RAM's: reserve, budget,
    committed and free MiB (``None`` when docker could not be read: unknown, never
    zero) and each committed reservation as (holder, MiB), sorted by holder.

    A line's JSON is its :attr:`_KEYS` in that order, then its reservations."""

    _KEYS: ClassVar[tuple[str, ...]]
    reserve_mib: int
    budget_mib: int
    committed_mib: int | None
    free_mib: int | None
    reservations: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON form: the class's keys, then ``reservations``."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self._KEYS}
        out["reservations"] = [{"serve": h, "mib": m} for h, m in self.reservations]
        return out


#: the keys of a line's JSON after the line's own (capacity or RAM), in order
_BUDGET_KEYS = ("reserve_mib", "budget_mib", "committed_mib", "free_mib")


@direct_init
@dataclass(frozen=True, slots=True)
class RoleView(_Line):
    """One role's line of the ledger (docs/design.md §5 ``ledger_after`` rows plus the
    reservations; the role is the row's key there, not a field)."""

    _KEYS: ClassVar[tuple[str, ...]] = ("capacity_mib", *_BUDGET_KEYS)
    gpu_role: str
    capacity_mib: int


@direct_init
@dataclass(frozen=True, slots=True)
class HostView(_Line):
    """The host RAM line of the ledger (its JSON like a role's line)."""

    _KEYS: ClassVar[tuple[str, ...]] = ("ram_mib", *_BUDGET_KEYS)
    ram_mib: int


class _Request(_Line):
    """A line's terms for one request of ``requested_mib`` more (:meth:`asking`):
    ``shortfall_mib`` is ``requested_mib - free_mib`` when positive, else 0 (``None``
    when free is unknown). A line class and this one make a terms class: the line's
    fields, then these two (its JSON too)."""

    __slots__ = ()
    requested_mib: int
    shortfall_mib: int | None

    @classmethod
    def asking(cls, line: tuple[Any, ...], requested_mib: int) -> Self:
        """The terms for ``requested_mib`` more on a line of the line class this class
        extends, given as that line's fields in order (:class:`_Line`'s first)."""
        free = line[_FREE_AT]
        short = None if free is None else max(0, requested_mib - free)
        return cls(*(*line, requested_mib, short))

    def short_by(self, asked: str, whole: str) -> str:
        """``asked`` (what was asked, in words) against free, every term: ``whole`` is
        the line's own total (``"capacity 80000"``, ``"ram 262144"``)."""
        held = " + ".join(f"{h} {m}" for h, m in self.reservations)
        return (
            f"{asked} > free {self.free_mib} MiB ({whole} - reserve {self.reserve_mib} = "
            f"budget {self.budget_mib}; committed {self.committed_mib}"
            + (f" = {held}" if held else "")
            + f"); short by {self.shortfall_mib} MiB"
        )


#: where ``free_mib`` stands among a line's fields
_FREE_AT = _Line.__match_args__.index("free_mib")
#: the keys a request adds to a line's JSON
_REQUEST_KEYS = ("requested_mib", "shortfall_mib")


@direct_init
@dataclass(frozen=True, slots=True)
class RoleTerms(RoleView, _Request):
    """Every term of one role's arithmetic for one request (docs/design.md §5 fit rows,
    plus each committed reservation)."""

    _KEYS = ("gpu_role", *RoleView._KEYS, *_REQUEST_KEYS)
    requested_mib: int
    shortfall_mib: int | None


@dataclass(frozen=True, slots=True)
class HostTerms(HostView, _Request):
    """Every term of the host RAM arithmetic for one request (like :class:`RoleTerms`)."""

    _KEYS = (*HostView._KEYS, *_REQUEST_KEYS)
    requested_mib: int
    shortfall_mib: int | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused ledger operation with the whole arithmetic (host RAM's too, for a sleep)."""

    kind: RefusalKind
    holder: str
    message: str
    terms: tuple[RoleTerms, ...] = ()
    host: HostTerms | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``host`` only for a refusal that involves host RAM)."""
        out: dict[str, Any] = {
            "kind": str(self.kind),
            "serve": self.holder,
            "message": self.message,
            "gpu_roles": [t.to_json() for t in self.terms],
        }
        if self.host is not None:
            out["host"] = self.host.to_json()
        return out


class _HostRam:
    """The host RAM line of a :class:`Ledger`, read: what its sleepers hold there
    against the ``[host]`` budget. It changes nothing (:meth:`Ledger.sleep`,
    :meth:`Ledger.wake` and :meth:`Ledger.release` do)."""

    __slots__ = ()
    _unknown: bool
    _host: HostBudget | None
    _host_holdings: dict[str, int]

    @property
    def host(self) -> HostBudget | None:
        """The host RAM budget (None: host RAM is not a budget)."""
        return self._host

    @property
    def host_holdings(self) -> Mapping[str, int]:
        """Host RAM held by sleepers, by holder."""
        return self._host_holdings

    def host_committed_mib(self) -> int:
        """Host RAM committed to sleepers as far as known."""
        return sum(self._host_holdings.values())

    def host_free_mib(self) -> int | None:
        """Host budget minus committed (None without a ``[host]`` budget)."""
        if self._host is None:
            return None
        return self._host.budget_mib - self.host_committed_mib()

    def host_view(self) -> HostView | None:
        """The host RAM line (None without a ``[host]`` budget)."""
        line = self._host_line()
        return None if line is None else HostView(*line)

    def _host_line(self) -> tuple[Any, ...] | None:
        """The fields of :meth:`host_view`, in order (None without a ``[host]`` budget)."""
        h = self._host
        if h is None:
            return None
        if self._unknown:
            return (h.reserve_mib, h.budget_mib, None, None, (), h.ram_mib)
        committed = self.host_committed_mib()
        held = tuple(sorted(self._host_holdings.items()))
        return (h.reserve_mib, h.budget_mib, committed, h.budget_mib - committed, held, h.ram_mib)

    def host_overcommitted(self) -> bool:
        """True when host RAM committed exceeds its budget (only possible from observation)."""
        free = self.host_free_mib()
        return free is not None and free < 0

    def host_terms(self, requested_mib: int) -> HostTerms | None:
        """Every term of the host arithmetic for ``requested_mib`` more (None: no budget)."""
        line = self._host_line()
        return None if line is None else HostTerms.asking(line, requested_mib)


class Ledger(_HostRam):
    """An immutable reservation ledger. Operations return a new ledger or a Refusal.

    ``host`` is the host RAM budget (None: host RAM is not a budget, what sleepers hold
    there is still recorded); ``host_holdings`` holder -> host MiB held by sleepers.
    """

    __slots__ = (
        "_committed",
        "_holdings",
        "_host",
        "_host_holdings",
        "_on_role",
        "_roles",
        "_unknown",
    )

    def __init__(
        self,
        roles: Mapping[str, GpuRole],
        holdings: Iterable[GpuReservation] = (),
        *,
        unknown: bool = False,
        host: HostBudget | None = None,
        host_holdings: Mapping[str, int] | None = None,
    ) -> None:
        self._roles: dict[str, GpuRole] = dict(roles)
        self._unknown = unknown
        self._host = host
        self._host_holdings: dict[str, int] = {}
        for holder, mib in host_holdings.items() if host_holdings else ():
            if isinstance(mib, bool) or not isinstance(mib, int) or mib < 0:
                raise ValueError(f"host reservation of {holder!r} must be MiB >= 0, got {mib!r}")
            if mib:
                self._host_holdings[holder] = mib
        held: dict[str, GpuReservation] = {}
        known = self._roles
        committed = self._committed = dict.fromkeys(known, 0)
        for res in holdings:
            holder, mib = res.holder, res.mib
            if holder in held:
                raise _twice(holder)
            for role in res.gpu_roles:
                if role not in known:
                    raise ValueError(f"reservation of {holder!r} names unknown role {role!r}")
                committed[role] += mib
            held[holder] = res
        # persistent: an operation shares the holdings it does not change (no O(n) copy)
        self._holdings: PMap[str, GpuReservation] = PMap(held)
        # role -> reservations_on(role), built when first asked and carried to the
        # ledgers derived from this one (an operation changes only the roles it touches)
        self._on_role: dict[str, tuple[tuple[str, int], ...]] = {}

    def _with(
        self,
        old: GpuReservation | None,
        new: GpuReservation | None,
        committed: dict[str, int],
        host_holdings: dict[str, int] | None = None,
    ) -> Ledger:
        """A ledger like this one with ``old`` replaced by ``new`` (either may be None),
        ``committed`` its committed MiB, and host holdings kept unless given."""
        obj = Ledger.__new__(Ledger)
        obj._roles = self._roles
        holdings = self._holdings
        on_role = dict(self._on_role)
        if old is not None:
            holdings = holdings.delete(old.holder) if new is None else holdings
            _unlist(on_role, old)
        if new is not None:
            holdings = holdings.set(new.holder, new)
            _enlist(on_role, new)
        obj._holdings = holdings
        obj._on_role = on_role
        obj._committed = committed
        obj._unknown = self._unknown
        obj._host = self._host
        obj._host_holdings = self._host_holdings if host_holdings is None else host_holdings
        return obj

    # ----- reading -------------------------------------------------------------------
    @property
    def unknown(self) -> bool:
        """True when docker could not be read: committed figures are unknown."""
        return self._unknown

    @property
    def roles(self) -> Mapping[str, GpuRole]:
        """The capacity rows, by role id."""
        return self._roles

    @property
    def holdings(self) -> Mapping[str, GpuReservation]:
        """The committed reservations, by holder."""
        return self._holdings

    def holding_getter(self) -> Callable[[str], GpuReservation | None]:
        """A lookup of one holder's reservation (None: it holds none), for a caller that
        reads many (:meth:`statemachine.ledger.pmap.PMap.getter`)."""
        return self._holdings.getter()

    def holds(self, holder: str) -> bool:
        """True when the ledger counts ``holder``: it has a committed reservation
        (whether its container occupies memory is ``ContainerObs.holds``)."""
        return holder in self._holdings

    def committed_mib(self, role: str) -> int:
        """Committed MiB on ``role`` as far as known (check :attr:`unknown` before printing)."""
        return self._committed[role]

    def free_mib(self, role: str) -> int:
        """Budget minus committed on ``role`` (negative when observed over budget)."""
        return self._roles[role].budget_mib - self._committed[role]

    def short_of(self, gpu_roles: Iterable[str], mib: int) -> dict[str, int]:
        """The roles of ``gpu_roles`` where ``mib`` more does not fit, each with the MiB
        it is short by (empty: it fits on every one)."""
        roles, committed = self._roles, self._committed
        out: dict[str, int] = {}
        for role in gpu_roles:
            free = roles[role].budget_mib - committed[role]
            if mib > free:
                out[role] = mib - free
        return out

    def reservations_on(self, role: str) -> tuple[tuple[str, int], ...]:
        """Each committed reservation on ``role``, as (holder, MiB), sorted by holder.

        The same tuple while the role does not change, also from the ledgers that
        operations derive from this one.
        """
        rows = self._on_role.get(role)
        if rows is None:
            self._list_roles(self._roles)
            rows = self._on_role.get(role, ())  # a role without a row holds nothing
        return rows

    def _list_roles(self, roles: Iterable[str]) -> None:
        """Build the reservation list of each of ``roles`` not built yet, in one walk of
        the holdings (a plan asks for every role one at a time, and there may be many:
        it lists them all at once)."""
        on_role = self._on_role
        lists: dict[str, list[tuple[str, int]]] = {
            role: [] for role in roles if role not in on_role
        }
        for res in self._holdings.values():
            entry = (res.holder, res.mib)
            for role in res.gpu_roles:
                rows = lists.get(role)
                if rows is not None:
                    rows.append(entry)
        for role, rows in lists.items():
            rows.sort()  # by holder: each holder is listed once
            on_role[role] = tuple(rows)

    def view(self, role: str) -> RoleView:
        """One role's line of the ledger."""
        return RoleView(*self._line(role))

    def _line(self, role: str) -> tuple[Any, ...]:
        """The fields of :meth:`view`, in order."""
        r = self._roles[role]
        if self._unknown:
            return (r.reserve_mib, r.budget_mib, None, None, (), role, r.capacity_mib)
        committed = self._committed[role]
        free = r.budget_mib - committed
        held = self.reservations_on(role)
        return (r.reserve_mib, r.budget_mib, committed, free, held, role, r.capacity_mib)

    def overcommitted(self) -> tuple[str, ...]:
        """Roles whose committed MiB exceeds the budget (only possible from observation)."""
        return tuple(r for r in self._roles if self._committed[r] > self._roles[r].budget_mib)

    def terms(
        self, holder: str, gpu_roles: Sequence[str], requested_mib: int
    ) -> tuple[RoleTerms, ...]:
        """Every term of the arithmetic for ``requested_mib`` more on each of ``gpu_roles``."""
        return tuple(RoleTerms.asking(self._line(role), requested_mib) for role in gpu_roles)

    # ----- operations ----------------------------------------------------------------
    def admit(self, res: GpuReservation) -> Ledger | Refusal:
        """Commit ``res`` on all of its roles at once, or refuse with the arithmetic."""
        precheck = _precheck(self, res.holder, res.gpu_roles, res.mib)
        if precheck is not None:
            return precheck
        if res.holder in self._holdings:
            return Refusal(
                RefusalKind.ALREADY_HELD,
                res.holder,
                f"{res.holder} already holds a reservation; resize it instead",
            )
        refusal = self._over_budget(res.holder, res.gpu_roles, res.mib, verb="reserve")
        if refusal is not None:
            return refusal
        committed = dict(self._committed)
        for role in res.gpu_roles:
            committed[role] += res.mib
        return self._with(None, res, committed)

    def release(self, holder: str) -> Ledger | Refusal:
        """Give back ``holder``'s reservation on all of its roles."""
        res = self._holdings.get(holder)
        if res is None:
            return Refusal(RefusalKind.NOT_HELD, holder, f"{holder} holds no reservation")
        committed = dict(self._committed)
        for role in res.gpu_roles:
            committed[role] -= res.mib
        host = None
        if holder in self._host_holdings:  # a sleeper stopped: its host RAM comes back too
            host = {h: m for h, m in self._host_holdings.items() if h != holder}
        return self._with(res, None, committed, host)

    def resize(self, holder: str, mib: int) -> Ledger | Refusal:
        """Change ``holder``'s reservation to ``mib`` on all of its roles.

        Shrinking always succeeds; growing is admitted like a new reservation of the
        difference, and refused with the arithmetic when it does not fit.
        """
        res = self._holdings.get(holder)
        if res is None:
            return Refusal(RefusalKind.NOT_HELD, holder, f"{holder} holds no reservation")
        precheck = _precheck(self, holder, res.gpu_roles, mib)
        if precheck is not None:
            return precheck
        delta = mib - res.mib
        if delta > 0:
            refusal = self._over_budget(holder, res.gpu_roles, delta, verb="grow")
            if refusal is not None:
                return refusal
        committed = dict(self._committed)
        for role in res.gpu_roles:
            committed[role] += delta
        return self._with(res, GpuReservation(holder, res.gpu_roles, mib), committed)

    def sleep(self, holder: str, residual_mib: int, host_mib: int) -> Ledger | Refusal:
        """``holder`` sleeps: its reservation comes down to ``residual_mib`` on all of its
        roles and ``host_mib`` of host RAM is taken (level 1; 0 at level 2).

        Refused (with the host terms) when the host budget cannot take ``host_mib``: the
        planner stops the serve instead. A sleep never grows a reservation.
        """
        res = self._holdings.get(holder)
        if res is None:
            return Refusal(RefusalKind.NOT_HELD, holder, f"{holder} holds no reservation")
        refusal = _sleep_refusal(self, res, residual_mib, host_mib)
        if refusal is not None:
            return refusal
        committed = dict(self._committed)
        for role in res.gpu_roles:
            committed[role] -= res.mib - residual_mib
        host = dict(self._host_holdings)
        if host_mib:
            host[holder] = host_mib
        return self._with(res, GpuReservation(holder, res.gpu_roles, residual_mib), committed, host)

    def wake(self, holder: str, mib: int) -> Ledger | Refusal:
        """``holder`` wakes: its full reservation ``mib`` is admitted again (refused with
        the arithmetic when it does not fit), then its host RAM is given back."""
        grown = self.resize(holder, mib)
        if isinstance(grown, Refusal):
            return grown
        host = {h: m for h, m in self._host_holdings.items() if h != holder}
        return grown._with(None, None, grown._committed, host)

    # ----- helpers -------------------------------------------------------------------
    def _over_budget(
        self, holder: str, gpu_roles: tuple[str, ...], mib: int, *, verb: str
    ) -> Refusal | None:
        if all(mib <= self._roles[r].budget_mib - self._committed[r] for r in gpu_roles):
            return None  # fits: no need for the terms (they list every reservation)
        terms = self.terms(holder, gpu_roles, mib)
        short = [t for t in terms if t.shortfall_mib]
        parts = [
            t.short_by(f"{t.gpu_role}: {verb} {t.requested_mib} MiB", f"capacity {t.capacity_mib}")
            for t in short
        ]
        return Refusal(RefusalKind.OVER_BUDGET, holder, f"{holder}: " + "; ".join(parts), terms)


class WorkingLedger(Ledger):
    """A ledger that one planning pass changes in place, and the :class:`Ledger` it
    stands for at any point (:meth:`frozen`).

    The planner makes hundreds of reservations in one plan; deriving a new immutable
    ledger for each copied every role's committed MiB and reservation lists each time.
    A working ledger reads like a :class:`Ledger` (every reading method, and the
    operations, which return new immutable ledgers as ever), and changes itself only by
    :meth:`commit` (a reservation the caller has already checked fits), :meth:`drop`
    and :meth:`adopt` (take the state of a ledger an operation returned).

    It must never escape the pass that owns it: what outlives it is :meth:`frozen`. The
    holdings stay a persistent map that each change replaces (never mutates), so what a
    reader took from :attr:`holdings` earlier stays as it was.
    """

    __slots__ = ("_budget", "_frozen")

    def __init__(self, base: Ledger) -> None:
        self._adopt(base)
        self._frozen: Ledger | None = base
        # each role's budget, read once (an operation never changes the roles)
        self._budget = {role: row.budget_mib for role, row in self._roles.items()}

    def _adopt(self, other: Ledger) -> None:
        _copy_state(self, other)

    def adopt(self, result: Ledger | Refusal) -> None:
        """Become ``result``, a ledger an operation on this one returned (a Refusal is
        raised: the caller checks before it asks)."""
        if isinstance(result, Refusal):
            raise ValueError(f"a working ledger adopts no refusal: {result.message}")
        self._adopt(result)
        self._frozen = None

    def commit(self, res: GpuReservation) -> None:
        """Admit ``res``, which the caller has checked (a valid reservation of a new
        holder on known roles); raises ``ValueError`` when it does not fit (never
        overcommits), or when its holder already holds one."""
        holder, mib, roles = res.holder, res.mib, res.gpu_roles
        if self._unknown or holder in self._holdings:
            raise ValueError(f"{holder}: not admitted (unknown ledger, or already held)")
        # what admit's precheck refuses: cheap, and a repeated role would count twice
        if isinstance(mib, bool) or not isinstance(mib, int) or mib <= 0:
            raise ValueError(f"{holder}: reservation must be a positive number of MiB: {mib!r}")
        if not roles or len(set(roles)) != len(roles):
            raise ValueError(f"{holder}: reservation needs distinct gpu roles, got {list(roles)}")
        committed, budget = self._committed, self._budget
        for role in res.gpu_roles:
            if mib > budget[role] - committed[role]:
                raise ValueError(f"{holder}: {mib} MiB does not fit on {role}")
        for role in res.gpu_roles:
            committed[role] += mib
        self._holdings = self._holdings.set(holder, res)
        _enlist(self._on_role, res)
        self._frozen = None

    def short_of(self, gpu_roles: Iterable[str], mib: int) -> dict[str, int]:
        """As :meth:`Ledger.short_of` (from the budgets read once)."""
        committed, budget = self._committed, self._budget
        out: dict[str, int] = {}
        for role in gpu_roles:
            free = budget[role] - committed[role]
            if mib > free:
                out[role] = mib - free
        return out

    def drop(self, holder: str) -> None:
        """Release ``holder``'s reservation (and its host RAM); ``KeyError`` when it
        holds none."""
        res = self._holdings[holder]
        committed = self._committed
        for role in res.gpu_roles:
            committed[role] -= res.mib
        self._holdings = self._holdings.delete(holder)
        _unlist(self._on_role, res)
        if holder in self._host_holdings:  # a sleeper stopped: its host RAM comes back too
            self._host_holdings = {h: m for h, m in self._host_holdings.items() if h != holder}
        self._frozen = None

    def frozen(self) -> Ledger:
        """The immutable ledger this one stands for now (kept until the next change)."""
        done = self._frozen
        if done is None:
            done = Ledger.__new__(Ledger)
            _copy_state(done, self)
            self._frozen = done
        return done


def _copy_state(into: Ledger, source: Ledger) -> None:
    """Give ``into`` the state of ``source``: the same roles and holdings (immutable),
    its own copies of what a working ledger changes in place."""
    into._roles = source._roles
    into._unknown = source._unknown
    into._host = source._host
    into._holdings = source._holdings
    into._committed = dict(source._committed)
    into._on_role = dict(source._on_role)
    into._host_holdings = dict(source._host_holdings)


def _precheck(ledger: Ledger, holder: str, gpu_roles: tuple[str, ...], mib: int) -> Refusal | None:
    """Why ``ledger`` refuses a reservation of ``mib`` on ``gpu_roles`` before any
    arithmetic (not MiB, roles repeated or without a capacity row, docker unread)."""
    if isinstance(mib, bool) or not isinstance(mib, int) or mib <= 0:
        return Refusal(
            RefusalKind.INVALID,
            holder,
            f"{holder}: reservation must be a positive integer of MiB, got {mib!r}",
        )
    if not gpu_roles or len(set(gpu_roles)) != len(gpu_roles):
        return Refusal(
            RefusalKind.INVALID,
            holder,
            f"{holder}: reservation needs distinct gpu roles, got {list(gpu_roles)}",
        )
    missing = [r for r in gpu_roles if r not in ledger.roles]
    if missing:
        return Refusal(
            RefusalKind.UNKNOWN_ROLE,
            holder,
            f"{holder}: no capacity row for gpu role(s) {', '.join(missing)}",
        )
    if ledger.unknown:
        return Refusal(
            RefusalKind.UNKNOWN_STATE,
            holder,
            f"{holder}: docker state is unknown, so committed MiB is unknown; "
            "nothing is admitted until it can be read (fail closed)",
            ledger.terms(holder, gpu_roles, mib),
        )
    return None


def _sleep_refusal(
    ledger: Ledger, res: GpuReservation, residual_mib: int, host_mib: int
) -> Refusal | None:
    """Why ``ledger`` refuses to put ``res``'s holder to sleep at ``residual_mib`` on its
    roles and ``host_mib`` of host RAM (:meth:`Ledger.sleep`): a reservation it cannot
    hold, a sleep that would grow it, host RAM that is not MiB, a holder that already
    sleeps, or host RAM short (with the host terms)."""
    holder = res.holder
    precheck = _precheck(ledger, holder, res.gpu_roles, residual_mib)
    if precheck is not None:
        return precheck
    if residual_mib > res.mib:
        return Refusal(
            RefusalKind.INVALID,
            holder,
            f"{holder}: a sleep cannot grow a reservation ({res.mib} MiB held, residual "
            f"{residual_mib} MiB)",
        )
    if isinstance(host_mib, bool) or not isinstance(host_mib, int) or host_mib < 0:
        return Refusal(
            RefusalKind.INVALID,
            holder,
            f"{holder}: host RAM must be MiB >= 0, got {host_mib!r}",
        )
    if holder in ledger.host_holdings:
        return Refusal(RefusalKind.ALREADY_HELD, holder, f"{holder} already sleeps")
    terms = ledger.host_terms(host_mib)
    if terms is not None and terms.shortfall_mib:
        return Refusal(
            RefusalKind.OVER_BUDGET,
            holder,
            terms.short_by(
                f"{holder}: sleep needs {host_mib} MiB of host RAM", f"ram {terms.ram_mib}"
            ),
            ledger.terms(holder, res.gpu_roles, 0),
            terms,
        )
    return None


def _unlist(on_role: dict[str, tuple[tuple[str, int], ...]], res: GpuReservation) -> None:
    """Take ``res`` out of the per-role lists already built (the others are built when
    asked): O(reservations on its roles), no scan of every holding."""
    entry = (res.holder, res.mib)
    for role in res.gpu_roles:
        rows = on_role.get(role)
        if rows is not None:
            at = bisect_left(rows, entry)
            on_role[role] = rows[:at] + rows[at + 1 :]


def _enlist(on_role: dict[str, tuple[tuple[str, int], ...]], res: GpuReservation) -> None:
    """Put ``res`` in the per-role lists already built, at its place by holder."""
    entry = (res.holder, res.mib)
    for role in res.gpu_roles:
        rows = on_role.get(role)
        if rows is not None:
            at = bisect_left(rows, entry)
            on_role[role] = (*rows[:at], entry, *rows[at:])


def ledger_from_observed(desired: DesiredState, observed: Observed) -> Ledger:
    """The ledger the host holds now: every container that occupies memory, at its reservation.

    A ledger serve whose container holds memory counts at its declared reservation; a
    shrunk elastic serve at the reservation it holds now; a serve whose memory did not
    come back after its stop (``observed.unreleased``) still counts. A running container
    also keeps the reservation it was started with (``observed.started_with``) until it
    stops: declared smaller or on other roles now, it counts the larger figure on every
    role of either; no longer declared at all, it counts as its own holder
    (:func:`no_longer_declared`). A serve whose start is in progress
    (``observed.starting``) counts on the roles it was started on and those it declares
    now, at the larger of what was reserved for it and what it declares now, whatever
    its container shows (and even when the manifest no longer declares it). Only roles
    with a capacity row can be counted. Built as observed (possibly over budget);
    unknown when docker could not be read.
    """
    if not observed.docker_ok:
        return Ledger(desired.roles, unknown=True, host=desired.host)
    held: dict[str, GpuReservation] = {}
    committed = dict.fromkeys(desired.roles, 0)
    for res in _starts_in_progress(desired, observed) if observed.starting else ():
        _count(held, committed, res)
    host_holdings = _count_serves(desired, observed, held, committed)
    for _container, res in no_longer_declared(desired, observed) if observed.started_with else ():
        if res.holder not in observed.starting:
            _count(held, committed, res)
    return _counted(desired.roles, held, committed, desired.host, host_holdings)


def _count_serves(
    desired: DesiredState,
    observed: Observed,
    held: dict[str, GpuReservation],
    committed: dict[str, int],
) -> dict[str, int]:
    """Count what each declared serve holds (:func:`ledger_from_observed`) into ``held``
    and ``committed``; the host RAM its sleepers hold, by serve."""
    host_holdings: dict[str, int] = {}
    # a fleet's serves share a few role tuples: the roles a serve in the ledger counts
    # on (None: not in the ledger), asked once per tuple (a plan may ask a thousand)
    ledger_roles: dict[tuple[str, ...], tuple[str, ...] | None] = {}
    starting, unreleased = observed.starting, observed.unreleased
    containers, started_with = observed.containers, observed.started_with
    sleeps, shrunk_to = observed.sleep, observed.elastic_mib
    for serve in desired.serves.values():
        name = serve.name
        obs = containers.get(serve.container)
        if obs is not None and obs.state in COMMITTED_STATES:
            record = started_with.get(serve.container) if started_with else None
            slept = sleeps.get(name) if sleeps else None
        elif name in unreleased:
            record = slept = None
        else:
            continue  # its container holds nothing, and its memory is back
        if starting and name in starting:
            continue  # counted as a start in progress
        mib, key = serve.vram_mib, serve.gpu_roles
        on = ledger_roles.get(key, ()) if mib is not None else None
        if on == ():
            on = ledger_roles[key] = _known(desired, key) if desired.in_ledger(serve) else None
        if record is None and slept is None:  # the common case: as declared
            if on is not None and mib is not None:
                mib = shrunk_to.get(name, mib) if shrunk_to else mib
                if name in held:
                    raise _twice(name)
                held[name] = GpuReservation(name, on, mib)
                for role in on:
                    committed[role] += mib
            continue
        told = obs.told_roles if obs is not None else ()
        recorded = _held_as_recorded(
            desired, serve, on is not None, (record, told), slept, shrunk_to
        )
        if recorded is not None:
            _count(held, committed, recorded)
        asleep = None if slept is None else sleeping_reservation(serve, slept)
        if asleep is not None and asleep[1]:
            host_holdings[name] = asleep[1]
    return host_holdings


def _counted(
    roles: Mapping[str, GpuRole],
    held: dict[str, GpuReservation],
    committed: dict[str, int],
    host: HostBudget | None,
    host_holdings: dict[str, int],
) -> Ledger:
    """The ledger that :func:`ledger_from_observed` has just counted itself (with
    :func:`_count`): ``held`` by holder, each on roles with a capacity row,
    ``committed`` their sum on each role, ``host_holdings`` positive MiB; the caller
    hands the dicts over. No second walk and no checks; it reads as ``Ledger(roles,
    held.values(), host=host, host_holdings=host_holdings)``, and admit, release and
    resize check as ever."""
    obj = Ledger.__new__(Ledger)
    obj._roles = dict(roles)
    obj._unknown = False
    obj._host = host
    obj._host_holdings = host_holdings
    obj._committed = committed
    obj._holdings = PMap._own(held)
    obj._on_role = {}
    return obj


def _count(held: dict[str, GpuReservation], committed: dict[str, int], res: GpuReservation) -> None:
    """Count ``res`` (on roles with a capacity row) into ``held`` and ``committed``, as
    :class:`Ledger` counts a holding (a holder named twice is refused)."""
    if res.holder in held:
        raise _twice(res.holder)
    held[res.holder] = res
    for role in res.gpu_roles:
        committed[role] += res.mib


def _twice(holder: str) -> ValueError:
    """The error for a holder named twice in one ledger."""
    return ValueError(f"reservation holder {holder!r} appears twice")


def _held_as_recorded(
    desired: DesiredState,
    serve: ServeSpec,
    declared: bool,
    start: tuple[StartedWith | None, tuple[str, ...]],
    slept: SleepObs | None,
    shrunk_to: Mapping[str, int],
) -> GpuReservation | None:
    """What a running serve with a start record or a sleep state holds (None: nothing
    the ledger counts): declared, the larger of its reservation and its record's on
    the roles :func:`_counted_on` names (what it was shrunk to, or its residual
    asleep); not declared, its record's. ``start``: its record, and the roles its
    container's environment names."""
    name = serve.name
    record, told = start
    if not declared:
        if record is None:
            return None
        roles = _known(desired, record.gpu_roles)
        return GpuReservation(name, roles, record.mib) if roles else None
    assert serve.vram_mib is not None
    shrunk = shrunk_to.get(name)
    held = unshrunk_mib(serve.vram_mib, record) if shrunk is None else shrunk
    asleep = None if slept is None else sleeping_reservation(serve, slept)
    if asleep is not None and asleep[0] is not None:
        held = asleep[0]
    key = _counted_on(desired, serve, record.gpu_roles, told) if record else serve.gpu_roles
    return GpuReservation(name, _known(desired, key), held)


def unshrunk_mib(vram_mib: int, record: StartedWith | None) -> int:
    """What a serve of ``vram_mib`` counts at without an elastic figure: its reservation,
    or the larger one its container was started with (a running container keeps it)."""
    return vram_mib if record is None else max(vram_mib, record.mib)


def _counted_on(
    desired: DesiredState, serve: ServeSpec, held_on: tuple[str, ...], told: tuple[str, ...]
) -> tuple[str, ...]:
    """The roles a running serve started on ``held_on`` (its start record) is counted
    on: those, where it runs, once its container's environment confirms them (``told``:
    what its ``up`` was told names exactly those) or, for a placed serve, they are one
    of its candidates; else beside them the roles it declares now (the record may be of
    an older container: never less than the truth), and any others its container names.
    So a serve re-pinned, or whose card left its ``placement``, while it runs is counted
    on the card it runs on alone, not on both. A record on a role without a capacity row
    now (renamed) confirms nothing: it would be counted nowhere."""
    if told == held_on and all(r in desired.roles for r in held_on):
        return held_on
    return _declared_beside(serve, held_on) + held_on + told


def _declared_beside(serve: ServeSpec, held_on: tuple[str, ...]) -> tuple[str, ...]:
    """The roles ``serve`` declares, counted beside those it holds memory on: a placed
    serve that holds on one of its candidates declares that one (it stays there while
    it holds), so its other candidates are not counted; any other serve, its roles."""
    if serve.placement and held_on and not set(held_on) - set(serve.placement):
        return ()
    return serve.gpu_roles


def _starts_in_progress(desired: DesiredState, observed: Observed) -> list[GpuReservation]:
    """What each start in progress holds: on the roles it was started on and those it
    declares now, at the larger of what was reserved for it and what it declares now."""
    out: list[GpuReservation] = []
    for name, start in observed.starting.items():
        serve = desired.serves.get(name)
        started_on = start.gpu_roles
        mib: int = start.mib
        if serve is not None and serve.vram_mib is not None and desired.in_ledger(serve):
            started_on = started_on + _declared_beside(serve, started_on)
            mib = max(mib, serve.vram_mib)
        counted = _known(desired, started_on)
        if counted and mib > 0:
            out.append(GpuReservation(name, counted, mib))
    return out


def held_uncounted(
    desired: DesiredState, observed: Observed, counted: Callable[[str], bool]
) -> list[GpuReservation]:
    """The serves of the ledger whose container occupies memory in ``observed`` though no
    ledger counts them (``counted(name)`` False): started outside the controller since
    those ledgers were read. Each at its declared reservation, in declaration order;
    none when docker could not be read (the caller refuses then: nothing is admitted).
    """
    if not observed.docker_ok:
        return []
    return [
        GpuReservation(s.name, s.gpu_roles, s.vram_mib)
        for s in desired.serves.values()
        if s.vram_mib is not None
        and desired.in_ledger(s)
        and not counted(s.name)
        and observed.container(s.container).holds
    ]


def sleeping_reservation(serve: ServeSpec, obs: SleepObs) -> tuple[int | None, int] | None:
    """What a sleeping serve keeps: (MiB on each role, MiB of host RAM); None if awake.

    The MiB on each role is ``None`` when it is counted as awake (at its full
    reservation, as any running serve).

    Asleep, it holds the larger of the residual it declares and the one it was put to
    sleep with, and at level 1 the larger of the host RAM it declares and the one it
    was put to sleep with. A serve that declares no ``[serve.sleep]`` now (the manifest
    changed while it slept) is counted at its full reservation on the roles (None here)
    and at the host RAM it was put to sleep with. Unknown (the engine did not answer):
    counted as awake and full, plus the host RAM of a level-1 sleep when the record says
    it was put to sleep (``level`` or ``host_ram_mib`` set).
    """
    if obs.state is SleepState.AWAKE:
        return None
    if not obs.asleep and obs.level is None and obs.host_ram_mib is None:
        return None  # unknown, and no record that the controller put it to sleep
    declared = serve.sleep
    level = obs.level if obs.level is not None else (declared.level if declared else None)
    host = obs.host_ram_mib or 0
    if level == 1 and declared is not None:
        host = max(host, declared.host_ram_mib)
    if level == 2:
        host = 0
    if not obs.asleep or declared is None:
        return (None, host) if host else None
    recorded = obs.residual_mib
    residual = declared.residual_mib if recorded is None else max(declared.residual_mib, recorded)
    return (residual, host)


def no_longer_declared(
    desired: DesiredState, observed: Observed
) -> list[tuple[str, GpuReservation]]:
    """Running containers no serve declares now, at the reservation they were started with.

    Each as (container, reservation).
    The holder is the serve name they were started under (``"NAME (CONTAINER)"`` when a
    declared serve has that name now). Only roles with a capacity row are counted; a
    container that has no record is not here (it is an undeclared container).
    """
    if not observed.docker_ok or not observed.started_with:
        return []  # no record: no container is counted as no longer declared
    declared = {s.container for s in desired.serves.values()}
    taken = set(desired.serves)
    out: list[tuple[str, GpuReservation]] = []
    for container, record in sorted(observed.started_with.items()):
        if container in declared or not observed.container(container).holds:
            continue
        roles = _known(desired, record.gpu_roles)
        if not roles:
            continue
        holder = record.serve if record.serve not in taken else f"{record.serve} ({container})"
        taken.add(holder)
        out.append((container, GpuReservation(holder, roles, record.mib)))
    return out


def _known(desired: DesiredState, roles: Iterable[str]) -> tuple[str, ...]:
    """``roles`` once each, in order, keeping those with a capacity row."""
    return tuple(r for r in dict.fromkeys(roles) if r in desired.roles)
