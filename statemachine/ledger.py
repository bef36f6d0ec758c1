"""The reservation ledger: per GPU role, capacity, reserve, budget and committed MiB.

The ledger is the capacity layer under every transition (ADR-0017). Its operations
(:meth:`Ledger.admit`, :meth:`Ledger.release`, :meth:`Ledger.resize`) return either a
new ledger or a :class:`Refusal` that carries every term of the arithmetic, and they
never produce a ledger in which ``committed > budget`` on a role they touched.

A ledger built from an observation (:func:`ledger_from_observed`) may already be over
budget: a container started outside the controller is reality, and it is reported
(:meth:`Ledger.overcommitted`), not hidden. When docker could not be read the ledger
is *unknown*: committed figures are ``None`` and nothing is admitted (fail closed).

This module is pure: no I/O, no clock, no logging, no docker.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from statemachine.types import DesiredState, GpuRole, Observed


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
class RoleTerms:
    """Every term of one role's arithmetic for one request.

    ``committed_mib`` and ``free_mib`` are ``None`` when docker could not be read.
    ``shortfall_mib`` is ``requested_mib - free_mib`` when positive, else 0 (``None``
    when free is unknown).
    """

    gpu_role: str
    capacity_mib: int
    reserve_mib: int
    budget_mib: int
    committed_mib: int | None
    free_mib: int | None
    requested_mib: int
    shortfall_mib: int | None
    reservations: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON form (docs/design.md §5 fit rows, plus each committed reservation)."""
        return {
            "gpu_role": self.gpu_role,
            "capacity_mib": self.capacity_mib,
            "reserve_mib": self.reserve_mib,
            "budget_mib": self.budget_mib,
            "committed_mib": self.committed_mib,
            "free_mib": self.free_mib,
            "requested_mib": self.requested_mib,
            "shortfall_mib": self.shortfall_mib,
            "reservations": [{"serve": h, "mib": m} for h, m in self.reservations],
        }


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused ledger operation with the whole arithmetic."""

    kind: RefusalKind
    holder: str
    message: str
    terms: tuple[RoleTerms, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "kind": str(self.kind),
            "serve": self.holder,
            "message": self.message,
            "gpu_roles": [t.to_json() for t in self.terms],
        }


@dataclass(frozen=True, slots=True)
class RoleView:
    """One role's line of the ledger; ``None`` is unknown, never zero."""

    gpu_role: str
    capacity_mib: int
    reserve_mib: int
    budget_mib: int
    committed_mib: int | None
    free_mib: int | None
    reservations: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON form (docs/design.md §5 ``ledger_after`` rows plus the reservations)."""
        return {
            "capacity_mib": self.capacity_mib,
            "reserve_mib": self.reserve_mib,
            "budget_mib": self.budget_mib,
            "committed_mib": self.committed_mib,
            "free_mib": self.free_mib,
            "reservations": [{"serve": h, "mib": m} for h, m in self.reservations],
        }


class Ledger:
    """An immutable reservation ledger. Operations return a new ledger or a Refusal."""

    __slots__ = ("_committed", "_holdings", "_on_role", "_roles", "_unknown")

    def __init__(
        self,
        roles: Mapping[str, GpuRole],
        holdings: Iterable[GpuReservation] = (),
        *,
        unknown: bool = False,
    ) -> None:
        self._roles: dict[str, GpuRole] = dict(roles)
        self._unknown = unknown
        self._holdings: dict[str, GpuReservation] = {}
        self._committed: dict[str, int] = dict.fromkeys(self._roles, 0)
        for res in holdings:
            if res.holder in self._holdings:
                raise ValueError(f"reservation holder {res.holder!r} appears twice")
            for role in res.gpu_roles:
                if role not in self._roles:
                    raise ValueError(f"reservation of {res.holder!r} names unknown role {role!r}")
                self._committed[role] += res.mib
            self._holdings[res.holder] = res
        # role -> reservations_on(role), built when first asked and carried to the
        # ledgers derived from this one (only the roles an operation touches change)
        self._on_role: dict[str, tuple[tuple[str, int], ...]] = {}

    @classmethod
    def _raw(
        cls,
        roles: dict[str, GpuRole],
        holdings: dict[str, GpuReservation],
        committed: dict[str, int],
        unknown: bool,
        on_role: dict[str, tuple[tuple[str, int], ...]],
    ) -> Ledger:
        obj = cls.__new__(cls)
        obj._roles = roles
        obj._holdings = holdings
        obj._committed = committed
        obj._unknown = unknown
        obj._on_role = on_role
        return obj

    def _on_role_after(
        self, old: GpuReservation | None, new: GpuReservation | None
    ) -> dict[str, tuple[tuple[str, int], ...]]:
        """The per-role reservation lists once ``old`` is replaced by ``new`` (either may
        be None): the lists already built, with the changed entry taken out or put in at
        its sorted place. O(reservations on the touched roles), no scan of every holding."""
        on_role = dict(self._on_role)
        for res, insert in ((old, False), (new, True)):
            if res is None:
                continue
            for role in res.gpu_roles:
                rows = on_role.get(role)
                if rows is None:
                    continue
                entry = (res.holder, res.mib)
                at = bisect_left(rows, entry)
                if insert:
                    on_role[role] = (*rows[:at], entry, *rows[at:])
                else:
                    on_role[role] = rows[:at] + rows[at + 1 :]
        return on_role

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

    def holds(self, holder: str) -> bool:
        """True when ``holder`` has a committed reservation."""
        return holder in self._holdings

    def committed_mib(self, role: str) -> int:
        """Committed MiB on ``role`` as far as known (check :attr:`unknown` before printing)."""
        return self._committed[role]

    def free_mib(self, role: str) -> int:
        """Budget minus committed on ``role`` (negative when observed over budget)."""
        return self._roles[role].budget_mib - self._committed[role]

    def reservations_on(self, role: str) -> tuple[tuple[str, int], ...]:
        """Each committed reservation on ``role``, as (holder, MiB), sorted by holder."""
        rows = self._on_role.get(role)
        if rows is None:
            held = self._holdings.items()
            rows = tuple(sorted((h, r.mib) for h, r in held if role in r.gpu_roles))
            self._on_role[role] = rows
        return rows

    def view(self, role: str) -> RoleView:
        """One role's line of the ledger."""
        r = self._roles[role]
        return RoleView(
            gpu_role=role,
            capacity_mib=r.capacity_mib,
            reserve_mib=r.reserve_mib,
            budget_mib=r.budget_mib,
            committed_mib=None if self._unknown else self._committed[role],
            free_mib=None if self._unknown else self.free_mib(role),
            reservations=() if self._unknown else self.reservations_on(role),
        )

    def overcommitted(self) -> tuple[str, ...]:
        """Roles whose committed MiB exceeds the budget (only possible from observation)."""
        return tuple(r for r in self._roles if self._committed[r] > self._roles[r].budget_mib)

    def terms(
        self, holder: str, gpu_roles: Iterable[str], requested_mib: int
    ) -> tuple[RoleTerms, ...]:
        """Every term of the arithmetic for ``requested_mib`` more on each of ``gpu_roles``."""
        out: list[RoleTerms] = []
        for role in gpu_roles:
            r = self._roles[role]
            if self._unknown:
                committed: int | None = None
                free: int | None = None
                short: int | None = None
            else:
                committed = self._committed[role]
                free = r.budget_mib - committed
                short = max(0, requested_mib - free)
            out.append(
                RoleTerms(
                    gpu_role=role,
                    capacity_mib=r.capacity_mib,
                    reserve_mib=r.reserve_mib,
                    budget_mib=r.budget_mib,
                    committed_mib=committed,
                    free_mib=free,
                    requested_mib=requested_mib,
                    shortfall_mib=short,
                    reservations=() if self._unknown else self.reservations_on(role),
                )
            )
        return tuple(out)

    # ----- operations ----------------------------------------------------------------
    def admit(self, res: GpuReservation) -> Ledger | Refusal:
        """Commit ``res`` on all of its roles at once, or refuse with the arithmetic."""
        precheck = self._precheck(res.holder, res.gpu_roles, res.mib)
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
        holdings = dict(self._holdings)
        holdings[res.holder] = res
        on_role = self._on_role_after(None, res)
        return Ledger._raw(self._roles, holdings, committed, self._unknown, on_role)

    def release(self, holder: str) -> Ledger | Refusal:
        """Give back ``holder``'s reservation on all of its roles."""
        res = self._holdings.get(holder)
        if res is None:
            return Refusal(RefusalKind.NOT_HELD, holder, f"{holder} holds no reservation")
        committed = dict(self._committed)
        for role in res.gpu_roles:
            committed[role] -= res.mib
        holdings = dict(self._holdings)
        del holdings[holder]
        on_role = self._on_role_after(res, None)
        return Ledger._raw(self._roles, holdings, committed, self._unknown, on_role)

    def resize(self, holder: str, mib: int) -> Ledger | Refusal:
        """Change ``holder``'s reservation to ``mib`` on all of its roles.

        Shrinking always succeeds; growing is admitted like a new reservation of the
        difference, and refused with the arithmetic when it does not fit.
        """
        res = self._holdings.get(holder)
        if res is None:
            return Refusal(RefusalKind.NOT_HELD, holder, f"{holder} holds no reservation")
        precheck = self._precheck(holder, res.gpu_roles, mib)
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
        holdings = dict(self._holdings)
        holdings[holder] = resized = GpuReservation(holder, res.gpu_roles, mib)
        on_role = self._on_role_after(res, resized)
        return Ledger._raw(self._roles, holdings, committed, self._unknown, on_role)

    # ----- helpers -------------------------------------------------------------------
    def _precheck(self, holder: str, gpu_roles: tuple[str, ...], mib: int) -> Refusal | None:
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
        missing = [r for r in gpu_roles if r not in self._roles]
        if missing:
            return Refusal(
                RefusalKind.UNKNOWN_ROLE,
                holder,
                f"{holder}: no capacity row for gpu role(s) {', '.join(missing)}",
            )
        if self._unknown:
            return Refusal(
                RefusalKind.UNKNOWN_STATE,
                holder,
                f"{holder}: docker state is unknown, so committed MiB is unknown; "
                "nothing is admitted until it can be read (fail closed)",
                self.terms(holder, gpu_roles, mib),
            )
        return None

    def _over_budget(
        self, holder: str, gpu_roles: tuple[str, ...], mib: int, *, verb: str
    ) -> Refusal | None:
        if all(mib <= self._roles[r].budget_mib - self._committed[r] for r in gpu_roles):
            return None  # fits: no need for the terms (reservations_on is O(holdings))
        terms = self.terms(holder, gpu_roles, mib)
        short = [t for t in terms if t.shortfall_mib]
        parts = [
            f"{t.gpu_role}: {verb} {t.requested_mib} MiB > free {t.free_mib} MiB "
            f"(capacity {t.capacity_mib} - reserve {t.reserve_mib} = budget {t.budget_mib}; "
            f"committed {t.committed_mib}"
            + (" = " + " + ".join(f"{h} {m}" for h, m in t.reservations) if t.reservations else "")
            + f"); short by {t.shortfall_mib} MiB"
            for t in short
        ]
        return Refusal(RefusalKind.OVER_BUDGET, holder, f"{holder}: " + "; ".join(parts), terms)


def ledger_from_observed(desired: DesiredState, observed: Observed) -> Ledger:
    """The ledger the host holds now: every container that holds memory, at its reservation.

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
        return Ledger(desired.roles, unknown=True)
    holdings = []
    for name, start in observed.starting.items():
        serve = desired.serves.get(name)
        # the roles it was started on and those it declares now; the larger MiB
        started_on = start.gpu_roles
        mib: int = start.mib
        if serve is not None and serve.vram_mib is not None and desired.in_ledger(serve):
            started_on = started_on + serve.gpu_roles
            mib = max(mib, serve.vram_mib)
        counted = _known(desired, started_on)
        if counted and mib > 0:
            holdings.append(GpuReservation(name, counted, mib))
    for serve in desired.serves.values():
        if serve.name in observed.starting:
            continue  # counted above
        holds = observed.container(serve.container).holds
        record = observed.started_with.get(serve.container) if holds else None
        declared = serve.vram_mib is not None and desired.in_ledger(serve)
        if declared and (holds or serve.name in observed.unreleased):
            assert serve.vram_mib is not None
            shrunk = observed.elastic_mib.get(serve.name)
            held = (
                max(serve.vram_mib, record.mib if record is not None else 0)
                if shrunk is None
                else shrunk
            )
            roles = _known(desired, serve.gpu_roles + (record.gpu_roles if record else ()))
            holdings.append(GpuReservation(serve.name, roles, held))
        elif record is not None:
            roles = _known(desired, record.gpu_roles)
            if roles:
                holdings.append(GpuReservation(serve.name, roles, record.mib))
    holdings.extend(
        res
        for _container, res in no_longer_declared(desired, observed)
        if res.holder not in observed.starting
    )
    return Ledger(desired.roles, holdings)


def no_longer_declared(
    desired: DesiredState, observed: Observed
) -> list[tuple[str, GpuReservation]]:
    """Running containers no serve declares now, at the reservation they were started with.

    Each as (container, reservation).
    The holder is the serve name they were started under (``"NAME (CONTAINER)"`` when a
    declared serve has that name now). Only roles with a capacity row are counted; a
    container that has no record is not here (it is an undeclared container).
    """
    if not observed.docker_ok:
        return []
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
