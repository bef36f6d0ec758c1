"""What bringing each serve back costs: measured, else declared, else unknown.

The controller measures each cold start it carries out (its ``start`` step's start until
its ``await_ready`` ends OK) and each wake (its ``wake`` step's start until its
``await_ready`` ends OK), and the journal keeps the recent ones per serve. A serve's
cost of either kind is the median of its last :data:`RECENT` measurements of that kind;
without any, the figure its manifest declares (``cold_start_s``, ``[serve.sleep]
wake_s``); without that, unknown (``None``, never 0). The planner weighs victims with
the result (:class:`statemachine.planning.plan_types.RestoreCost`, ``Policy.reload``), and with when
each serve was last used (:func:`last_used`, ``Policy.last_used``).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from statemachine.domain.types import DesiredState, OnDemandRequest
from statemachine.planning.plan_types import RestoreCost, declared_restore

#: how many of a serve's most recent measurements of one kind its cost is the median of
RECENT = 5

#: the kinds of measurement: a cold start, a wake
COLD, WAKE = "cold", "wake"


class Basis(StrEnum):
    """Where a serve's reload figures come from (``vramctl status``'s ``reload.basis``)."""

    #: at least one of its figures is measured
    MEASURED = "measured"
    #: its figures are the manifest's (none is measured)
    DECLARED = "declared"
    #: it has no figure at all
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Measured:
    """A serve's recorded measurements in seconds, oldest first."""

    cold_s: tuple[float, ...] = ()
    wake_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class RestoreEstimate:
    """A serve's reload cost and where it comes from."""

    cost: RestoreCost
    basis: Basis

    def to_json(self) -> dict[str, float | str | None]:
        """``{"cold_s": x|null, "wake_s": y|null, "basis": ...}`` (unknown is null)."""
        return {"cold_s": self.cost.cold_s, "wake_s": self.cost.wake_s, "basis": str(self.basis)}


#: the estimate of a serve with no figure
UNKNOWN = RestoreEstimate(RestoreCost(), Basis.UNKNOWN)


def measured_from(recorded: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, Measured]:
    """Serve -> kind (``cold`` / ``wake``) -> seconds, oldest first (as the journal
    returns them), as :class:`Measured` per serve; other kinds are left out."""
    return {
        serve: Measured(tuple(kinds.get(COLD, ())), tuple(kinds.get(WAKE, ())))
        for serve, kinds in recorded.items()
    }


def recent_median(samples: Sequence[float], recent: int = RECENT) -> float | None:
    """The median of the last ``recent`` of ``samples`` (oldest first); ``None`` without any."""
    if recent < 1:
        raise ValueError(f"recent must be at least 1, got {recent}")
    tail = list(samples)[-recent:]
    return float(statistics.median(tail)) if tail else None


def declared_costs(desired: DesiredState) -> dict[str, RestoreCost]:
    """What each serve's manifest declares (``cold_start_s``, ``[serve.sleep] wake_s``);
    serves that declare neither are absent."""
    out: dict[str, RestoreCost] = {}
    for name, spec in desired.serves.items():
        cost = declared_restore(spec)
        if cost is not None:
            out[name] = cost
    return out


def restore_estimate(
    declared: RestoreCost | None, measured: Measured | None, recent: int = RECENT
) -> RestoreEstimate:
    """One serve's cost: per kind, the median of its recent measurements, else the
    declared figure, else ``None``; ``basis`` says which."""
    declared = declared or RestoreCost()
    measured = measured or Measured()
    cold = recent_median(measured.cold_s, recent)
    wake = recent_median(measured.wake_s, recent)
    if cold is not None or wake is not None:
        basis = Basis.MEASURED
    elif declared.cold_s is not None or declared.wake_s is not None:
        basis = Basis.DECLARED
    else:
        return UNKNOWN
    return RestoreEstimate(
        RestoreCost(
            cold if cold is not None else declared.cold_s,
            wake if wake is not None else declared.wake_s,
        ),
        basis,
    )


def restore_estimates(
    declared: Mapping[str, RestoreCost],
    measured: Mapping[str, Measured],
    recent: int = RECENT,
) -> dict[str, RestoreEstimate]:
    """:func:`restore_estimate` of every serve named in ``declared`` or ``measured``."""
    names = sorted(set(declared) | set(measured))
    return {n: restore_estimate(declared.get(n), measured.get(n), recent) for n in names}


def restore_costs(
    declared: Mapping[str, RestoreCost],
    measured: Mapping[str, Measured],
    recent: int = RECENT,
) -> dict[str, RestoreCost]:
    """``Policy.reload``: one cost per serve that has any figure (measured or declared);
    a serve with none is absent (unknown)."""
    return {
        n: e.cost
        for n, e in restore_estimates(declared, measured, recent).items()
        if e.basis is not Basis.UNKNOWN
    }


def last_used(
    busy_at: Mapping[str, float], requests: Iterable[OnDemandRequest]
) -> dict[str, float]:
    """``Policy.last_used``: per serve, the later of when it was last seen busy
    (``busy_at``) and its latest on-demand request's ``requested_at``; serves with
    neither are absent."""
    out = dict(busy_at)
    for r in requests:
        if r.serve not in out or r.requested_at > out[r.serve]:
            out[r.serve] = r.requested_at
    return out
