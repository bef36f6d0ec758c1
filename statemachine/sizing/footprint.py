"""Measured footprints: what a serve really took, from device totals around its moves.

Per-process GPU memory cannot be read everywhere (WSL2 reports ``[N/A]`` for every
PID), so the ledger is declarative (docs/limits.md). What remains measurable is the
change of a device's *used* total around a serve's start (before the start, after its
health check, after a settle time) and its stop (before the stop, after the release is
confirmed). This module holds the arithmetic of that evidence, and nothing else:

- :class:`Movement` / :func:`others_in_window`: which other serves started or stopped on
  the same GPU roles while a window was open; a device delta is attributable to the
  serve only when nothing else moved there;
- :func:`start_sample` / :func:`stop_sample`: one :class:`Sample` per GPU role of the
  serve, with the method that measured it (``process``: the driver's per-process figure
  for its container; ``delta``: the device total's change; ``unknown``: neither
  could say — no NVML, no linked device, a figure missing; never 0);
- :func:`with_peak`: the largest use seen while the serve ran, folded into its start
  sample;
- :func:`summarise`: declared vs measured per serve, and whether the measured figure
  exceeds the reservation (:class:`Footprint`);
- :func:`propose`: the ``vram_mib`` the samples support (peak plus a margin, rounded up
  to a granule), or "not enough evidence" (:class:`Proposal`).

It is pure: no I/O, no clock (times are arguments), no logging. Readings are taken and
samples journalled by ``controller.service.footprints``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "DEFAULT_GRANULE_MIB",
    "DEFAULT_MARGIN_PCT",
    "DEFAULT_MIN_SAMPLES",
    "Footprint",
    "Method",
    "Movement",
    "Proposal",
    "Sample",
    "others_in_window",
    "propose",
    "start_sample",
    "stop_sample",
    "summarise",
    "with_peak",
]

#: ``calibrate``'s defaults: the peak plus 10 %, rounded up to 256 MiB, from at least
#: 3 attributable samples (docs/operations.md).
DEFAULT_MARGIN_PCT = 10.0
DEFAULT_GRANULE_MIB = 256
DEFAULT_MIN_SAMPLES = 3


class Method(StrEnum):
    """How a sample's figures were measured."""

    PROCESS = "process"  # the driver's per-process figure, summed for the container
    DELTA = "delta"  # the device's used total, before vs after
    UNKNOWN = "unknown"  # neither could say


@dataclass(frozen=True, slots=True)
class Movement:
    """A serve's start or stop as a window in time on its GPU roles.

    ``ended`` is ``None`` while the window is open (the start or stop in progress).
    """

    serve: str
    kind: str  # "start" | "stop" | "seen" (a change the loop saw, not carried out here)
    roles: frozenset[str]
    began: float
    ended: float | None = None

    def overlaps(self, began: float, ended: float | None, roles: Iterable[str]) -> bool:
        """True when this window shares a role with, and overlaps, ``[began, ended]``."""
        if not self.roles & set(roles):
            return False
        mine_end = math.inf if self.ended is None else self.ended
        theirs_end = math.inf if ended is None else ended
        return self.began <= theirs_end and began <= mine_end


def others_in_window(
    serve: str,
    role: str,
    began: float,
    ended: float | None,
    movements: Iterable[Movement],
) -> tuple[str, ...]:
    """The other serves that moved on ``role`` during ``[began, ended]``, sorted."""
    return tuple(
        sorted(
            {m.serve for m in movements if m.serve != serve and m.overlaps(began, ended, (role,))}
        )
    )


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured footprint of one serve on one GPU role.

    A ``start`` sample carries ``delta_mib`` (after health − before), ``steady_mib``
    (after the settle time − before) and ``peak_mib`` (the most seen while it ran −
    before); a ``stop`` sample carries ``delta_mib`` (before − after the release: what
    came back). With the ``process`` method they are the container's own figures. A
    figure is ``None`` when unknown. ``attributable`` is False when ``others`` (serves
    that started or stopped on the role in the same window) may account for part of
    the change; the figures are then kept as evidence but prove nothing.
    """

    serve: str
    kind: str  # "start" | "stop"
    role: str
    at: float
    declared_mib: int | None
    method: Method
    attributable: bool
    before_mib: int | None = None
    after_mib: int | None = None
    settled_mib: int | None = None
    delta_mib: int | None = None
    steady_mib: int | None = None
    peak_mib: int | None = None
    others: tuple[str, ...] = ()
    note: str = ""

    @property
    def figure_mib(self) -> int | None:
        """The most this sample shows the serve holding (``None``: it cannot say)."""
        known = [v for v in (self.delta_mib, self.steady_mib, self.peak_mib) if v is not None]
        return max(known) if known else None

    @property
    def evidence(self) -> bool:
        """True when the sample's figure can be attributed to its serve."""
        return self.attributable and self.figure_mib is not None

    def to_json(self) -> dict[str, Any]:
        """JSON form (what the journal stores and the interfaces show)."""
        return {
            "serve": self.serve,
            "kind": self.kind,
            "role": self.role,
            "at": self.at,
            "declared_mib": self.declared_mib,
            "method": str(self.method),
            "attributable": self.attributable,
            "before_mib": self.before_mib,
            "after_mib": self.after_mib,
            "settled_mib": self.settled_mib,
            "delta_mib": self.delta_mib,
            "steady_mib": self.steady_mib,
            "peak_mib": self.peak_mib,
            "figure_mib": self.figure_mib,
            "others": list(self.others),
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sample:
        """Read :meth:`to_json`'s form back (the journal's rows)."""

        def opt(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else int(value)

        return cls(
            serve=str(data["serve"]),
            kind=str(data["kind"]),
            role=str(data["role"]),
            at=float(data["at"]),
            declared_mib=opt("declared_mib"),
            method=Method(str(data.get("method", "unknown"))),
            attributable=bool(data.get("attributable", False)),
            before_mib=opt("before_mib"),
            after_mib=opt("after_mib"),
            settled_mib=opt("settled_mib"),
            delta_mib=opt("delta_mib"),
            steady_mib=opt("steady_mib"),
            peak_mib=opt("peak_mib"),
            others=tuple(str(o) for o in data.get("others", ())),
            note=str(data.get("note", "")),
        )


def _sub(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _others_note(others: Sequence[str]) -> str:
    return (
        f"{', '.join(others)} moved on the same GPU in the same window: "
        "the device's change is not attributable"
    )


def start_sample(
    serve: str,
    role: str,
    *,
    at: float,
    declared_mib: int | None,
    before_mib: int | None,
    after_mib: int | None,
    settled_mib: int | None,
    others: Sequence[str] = (),
    process_after_mib: int | None = None,
    process_settled_mib: int | None = None,
) -> Sample:
    """The sample of one start on one role, from the device readings around it.

    The container's per-process figures (``process_*``) are used where the driver gives
    them (attributable whatever else moved); else the device delta, attributable only
    without ``others``; else unknown.
    """
    common: dict[str, Any] = {
        "serve": serve,
        "kind": "start",
        "role": role,
        "at": at,
        "declared_mib": declared_mib,
        "before_mib": before_mib,
        "after_mib": after_mib,
        "settled_mib": settled_mib,
        "others": tuple(others),
    }
    delta, steady = _sub(after_mib, before_mib), _sub(settled_mib, before_mib)
    return _sampled(
        common,
        others,
        process=(
            (process_after_mib, process_settled_mib)
            if process_after_mib is not None or process_settled_mib is not None
            else None
        ),
        process_note="the driver's per-process figure for its container",
        device=(None if delta is None and steady is None else (delta, steady)),
        device_note="device used, before vs after; nothing else moved on the GPU",
    )


def stop_sample(
    serve: str,
    role: str,
    *,
    at: float,
    declared_mib: int | None,
    before_mib: int | None,
    after_mib: int | None,
    others: Sequence[str] = (),
    process_before_mib: int | None = None,
) -> Sample:
    """The sample of one stop on one role: what came back once the release was confirmed."""
    common: dict[str, Any] = {
        "serve": serve,
        "kind": "stop",
        "role": role,
        "at": at,
        "declared_mib": declared_mib,
        "before_mib": before_mib,
        "after_mib": after_mib,
        "others": tuple(others),
    }
    delta = _sub(before_mib, after_mib)
    return _sampled(
        common,
        others,
        process=None if process_before_mib is None else (process_before_mib, None),
        process_note="the driver's per-process figure for its container before the stop",
        device=None if delta is None else (delta, None),
        device_note="device used before the stop vs after the release; nothing else moved "
        "on the GPU",
    )


def _sampled(
    common: dict[str, Any],
    others: Sequence[str],
    *,
    process: tuple[int | None, int | None] | None,
    process_note: str,
    device: tuple[int | None, int | None] | None,
    device_note: str,
) -> Sample:
    """A start's or a stop's sample by the best method it has: the container's own
    figures (``process``: attributable whatever else moved), else the device's change
    (``device``: attributable only when nothing else moved), else unknown. Each
    figure pair is (``delta_mib``, ``steady_mib``)."""
    if process is not None:
        delta, steady = process
        return Sample(
            **common,
            method=Method.PROCESS,
            attributable=True,
            delta_mib=delta,
            steady_mib=steady,
            note=process_note,
        )
    if device is None:
        return Sample(
            **common,
            method=Method.UNKNOWN,
            attributable=False,
            note="no device reading before and after (NVML unavailable, or the role has "
            "no device linked by uuid)",
        )
    delta, steady = device
    return Sample(
        **common,
        method=Method.DELTA,
        attributable=not others,
        delta_mib=delta,
        steady_mib=steady,
        note=_others_note(others) if others else device_note,
    )


def with_peak(sample: Sample, used_mib: int | None, *, process_mib: int | None = None) -> Sample:
    """``sample`` with the peak raised to what a reading while it ran shows (if more).

    With the ``process`` method the container's own figure counts; with ``delta`` the
    device's used total minus the reading before the start (the caller passes a reading
    only while nothing else has moved on the role since the start began). Unknown
    readings change nothing.
    """
    if sample.kind != "start":
        return sample
    if sample.method is Method.PROCESS:
        seen = process_mib
    elif sample.method is Method.DELTA and sample.attributable:
        seen = _sub(used_mib, sample.before_mib)
    else:
        seen = None
    if seen is None or (sample.peak_mib is not None and seen <= sample.peak_mib):
        return sample
    return replace(sample, peak_mib=seen)


@dataclass(frozen=True, slots=True)
class Footprint:
    """Declared vs measured for one serve, from its samples.

    ``measured_mib`` is the largest attributable figure over all its samples and roles
    (``None``: no sample can say); ``method`` how the figure that set it was measured;
    ``samples`` how many samples there are, ``evidence`` how many of them are
    attributable; ``exceeds`` is True when ``measured_mib`` is above ``declared_mib``.
    """

    serve: str
    declared_mib: int | None
    measured_mib: int | None
    method: Method
    samples: int
    evidence: int
    exceeds: bool
    last: Sample | None = None
    over_pct: float | None = None
    by_role: dict[str, int | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``null`` for what is unknown)."""
        return {
            "serve": self.serve,
            "declared_mib": self.declared_mib,
            "measured_mib": self.measured_mib,
            "method": str(self.method),
            "samples": self.samples,
            "attributable_samples": self.evidence,
            "exceeds_reservation": self.exceeds,
            "over_pct": self.over_pct,
            "by_role": dict(self.by_role),
            "last": None if self.last is None else self.last.to_json(),
        }


def summarise(serve: str, declared_mib: int | None, samples: Sequence[Sample]) -> Footprint:
    """Declared vs measured for ``serve`` (its ``samples`` in any order)."""
    mine = sorted((s for s in samples if s.serve == serve), key=lambda s: s.at)
    best: Sample | None = None
    by_role: dict[str, int | None] = {}
    for s in mine:
        by_role.setdefault(s.role, None)
        if not s.evidence:
            continue
        fig = s.figure_mib
        assert fig is not None
        have = by_role[s.role]
        by_role[s.role] = fig if have is None else max(have, fig)
        if best is None or fig > (best.figure_mib or 0):
            best = s
    measured = None if best is None else best.figure_mib
    exceeds = declared_mib is not None and measured is not None and measured > declared_mib
    over = None
    if exceeds and declared_mib and measured is not None:
        over = round(100.0 * (measured - declared_mib) / declared_mib, 1)
    return Footprint(
        serve=serve,
        declared_mib=declared_mib,
        measured_mib=measured,
        method=Method.UNKNOWN if best is None else best.method,
        samples=len(mine),
        evidence=sum(1 for s in mine if s.evidence),
        exceeds=exceeds,
        last=mine[-1] if mine else None,
        over_pct=over,
        by_role=by_role,
    )


@dataclass(frozen=True, slots=True)
class Proposal:
    """What ``vram_mib`` the evidence supports for one serve, with its arithmetic.

    ``proposed_mib`` is ``None`` when there is not enough evidence (fewer than
    ``min_samples`` attributable samples); ``why`` then says so.
    """

    serve: str
    declared_mib: int | None
    samples: int
    evidence: int
    min_samples: int
    margin_pct: float
    granule_mib: int
    peak_mib: int | None
    proposed_mib: int | None
    arithmetic: str
    why: str

    @property
    def enough(self) -> bool:
        """True when the samples support a proposal."""
        return self.proposed_mib is not None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "serve": self.serve,
            "declared_mib": self.declared_mib,
            "samples": self.samples,
            "attributable_samples": self.evidence,
            "min_samples": self.min_samples,
            "margin_pct": self.margin_pct,
            "granule_mib": self.granule_mib,
            "peak_mib": self.peak_mib,
            "proposed_mib": self.proposed_mib,
            "enough_evidence": self.enough,
            "arithmetic": self.arithmetic,
            "reason": self.why,
        }


def propose(
    serve: str,
    declared_mib: int | None,
    samples: Sequence[Sample],
    *,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    granule_mib: int = DEFAULT_GRANULE_MIB,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> Proposal:
    """The ``vram_mib`` for ``serve``: ceil(peak × (1 + margin) / granule) × granule.

    The peak is the largest attributable figure of its samples (start deltas, steady
    figures, peaks while it ran, what came back at its stops). Fewer than
    ``min_samples`` attributable samples: no proposal ("not enough evidence").
    """
    if margin_pct < 0 or granule_mib < 1 or min_samples < 1:
        raise ValueError("margin_pct >= 0, granule_mib >= 1 and min_samples >= 1 are required")
    mine = [s for s in samples if s.serve == serve]
    good = [s for s in mine if s.evidence]
    common: dict[str, Any] = {
        "serve": serve,
        "declared_mib": declared_mib,
        "samples": len(mine),
        "evidence": len(good),
        "min_samples": min_samples,
        "margin_pct": margin_pct,
        "granule_mib": granule_mib,
    }
    if len(good) < min_samples:
        peak = max((s.figure_mib or 0 for s in good), default=None)
        return Proposal(
            **common,
            peak_mib=peak,
            proposed_mib=None,
            arithmetic="",
            why=(
                f"not enough evidence: {len(good)} attributable sample(s) of {len(mine)}, "
                f"at least {min_samples} needed"
            ),
        )
    peak = max(s.figure_mib or 0 for s in good)
    with_margin = peak * (1.0 + margin_pct / 100.0)
    # a float product like 1000 * 1.1 = 1100.0000000000002 must not round up a granule
    units = math.ceil(round(with_margin / granule_mib, 9))
    proposed = max(granule_mib, units * granule_mib)
    arithmetic = (
        f"peak {peak} MiB (largest of {len(good)} attributable samples) "
        f"+ {margin_pct:g} % = {with_margin:.1f} MiB, "
        f"rounded up to a multiple of {granule_mib} MiB = {proposed} MiB"
    )
    if declared_mib is None:
        why = "no vram_mib declared"
    elif proposed == declared_mib:
        why = "the declared vram_mib is what the evidence supports"
    elif proposed > declared_mib:
        why = f"{proposed - declared_mib} MiB more than declared"
    else:
        why = f"{declared_mib - proposed} MiB less than declared"
    return Proposal(**common, peak_mib=peak, proposed_mib=proposed, arithmetic=arithmetic, why=why)
