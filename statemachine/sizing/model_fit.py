"""A serve's reservation beside its model's estimate and its measured footprint.

The figures compared (docs/sizing.md, "A serve's model"):

- the reservation: the serve's ``vram_mib``, per GPU role;
- the estimate's known terms: weights + KV cache (``statemachine.sizing.needs``), split evenly
  between the serve's GPU roles (tensor parallel), rounded up to whole MiB;
- the measured footprint (``statemachine.sizing.footprint``), per GPU role, where one exists.

:func:`check_reservation` says whether the reservation can hold the known terms (an
error, "cannot load in its reservation", every term given) and whether it exceeds them
by more than :func:`excess_bound_mib` (a hint); :func:`calibrate_verdict` says which
term the measured footprint contradicts. Everything the files cannot give stays unknown:
no figure here is ever a guess of the overheads.

It is pure: plain figures in, frozen answers out; no I/O, nothing from ``controller``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BOUND_FIXED_MIB",
    "BOUND_PCT",
    "Calibration",
    "ModelTerms",
    "ReservationCheck",
    "calibrate_verdict",
    "check_reservation",
    "excess_bound_mib",
    "to_mib",
]

MIB = 1024 * 1024

#: A reservation more than 25 % + 2 GiB above weights + KV is hinted at (docs/sizing.md).
BOUND_PCT = 25
BOUND_FIXED_MIB = 2048

OK = "ok"
CANNOT_LOAD = "cannot_load"
OVERSIZED = "oversized"
UNKNOWN = "unknown"


def to_mib(n_bytes: int, parts: int = 1) -> int:
    """``n_bytes`` split over ``parts`` GPUs, in MiB rounded up (a part never rounds to 0)."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    return math.ceil(n_bytes / (MIB * parts))


def excess_bound_mib(known_mib: int) -> int:
    """The most a reservation may exceed ``known_mib`` (weights + KV) without a hint:
    25 % of it (the overheads that grow with the model) + 2 GiB (those that do not)."""
    return math.ceil(known_mib * BOUND_PCT / 100) + BOUND_FIXED_MIB


@dataclass(frozen=True, slots=True)
class ModelTerms:
    """The estimate's figures for one serve: bytes of the whole model, and the GPU roles
    they are split between. ``kv_bytes`` is ``None`` while the KV cache is unknown
    (``kv_reason`` says why); ``formula`` is the KV formula with its figures."""

    weights_bytes: int
    kv_bytes: int | None
    roles: int = 1
    formula: str | None = None
    kv_reason: str | None = None

    @property
    def weights_mib(self) -> int:
        """The weights on each GPU role, MiB rounded up."""
        return to_mib(self.weights_bytes, self.roles)

    @property
    def kv_mib(self) -> int | None:
        """The KV cache on each GPU role, MiB rounded up (``None``: unknown)."""
        return None if self.kv_bytes is None else to_mib(self.kv_bytes, self.roles)

    @property
    def known_mib(self) -> int | None:
        """Weights + KV on each GPU role: the sum of the two figures as printed, each
        rounded up, so the sum reads true (``None``: the KV is unknown)."""
        kv = self.kv_mib
        return None if kv is None else self.weights_mib + kv

    def kv_text(self) -> str:
        """The KV cache as a sentence: its MiB and formula, or unknown and why."""
        if self.kv_bytes is None:
            return f"KV cache unknown ({self.kv_reason or 'no reason given'})"
        return f"KV cache {self.kv_mib} MiB ({self.formula or 'no formula'})"

    def per_role(self) -> str:
        """`` per GPU role (split between 2)`` where the serve has several roles."""
        return "" if self.roles == 1 else f" per GPU role (the model split between {self.roles})"


@dataclass(frozen=True, slots=True)
class ReservationCheck:
    """A reservation beside the estimate's known terms: ``verdict`` is ``ok``,
    ``cannot_load`` (an error), ``oversized`` (a hint) or ``unknown`` (the KV cache is
    unknown: only the weights are compared); ``message`` says it with every term."""

    vram_mib: int
    terms: ModelTerms
    verdict: str
    message: str
    shortfall_mib: int | None = None
    excess_mib: int | None = None
    bound_mib: int | None = None
    #: what the engine's limits make of the serve (:mod:`statemachine.flags.verdict`): where
    #: its layers run, the context that fits (``None``: nothing to say)
    note: str | None = None

    @property
    def error(self) -> bool:
        """True when the serve cannot load in its reservation."""
        return self.verdict == CANNOT_LOAD

    @property
    def hint(self) -> bool:
        """True when the reservation exceeds the known terms by more than the bound."""
        return self.verdict == OVERSIZED

    def to_json(self) -> dict[str, Any]:
        """The figures, ``null`` where unknown."""
        t = self.terms
        return {
            "vram_mib": self.vram_mib,
            "roles": t.roles,
            "weights_bytes": t.weights_bytes,
            "kv_cache_bytes": t.kv_bytes,
            "weights_mib": t.weights_mib,
            "kv_cache_mib": t.kv_mib,
            "known_mib": t.known_mib,
            "formula": t.formula,
            "kv_cache_reason": t.kv_reason,
            "rest": "unknown",
            "verdict": self.verdict,
            "message": self.message,
            "shortfall_mib": self.shortfall_mib,
            "excess_mib": self.excess_mib,
            "bound_mib": self.bound_mib,
            "note": self.note,
        }


def _short_mib(need_bytes: int, vram_mib: int, roles: int) -> int:
    """MiB per role by which ``need_bytes`` (on every role) exceed ``vram_mib`` on each,
    rounded up; 0 when they fit: compared in bytes, never in figures rounded apart."""
    over = need_bytes - vram_mib * MIB * roles
    return 0 if over <= 0 else math.ceil(over / (MIB * roles))


def _weights_only(vram_mib: int, terms: ModelTerms) -> ReservationCheck:
    """The check while the KV cache is unknown: the weights alone may not fit."""
    weights = terms.weights_mib
    short = _short_mib(terms.weights_bytes, vram_mib, terms.roles)
    if short:
        message = (
            f"cannot load in its reservation: vram_mib {vram_mib} < weights {weights} MiB"
            f"{terms.per_role()}, short by {short} MiB before the {terms.kv_text()}"
        )
        return ReservationCheck(vram_mib, terms, CANNOT_LOAD, message, shortfall_mib=short)
    message = (
        f"vram_mib {vram_mib} ≥ weights {weights} MiB{terms.per_role()}; {terms.kv_text()}: "
        "whether it fits is not known"
    )
    return ReservationCheck(vram_mib, terms, UNKNOWN, message)


def check_reservation(vram_mib: int, terms: ModelTerms) -> ReservationCheck:
    """``vram_mib`` (per GPU role) beside the model's weights + KV (``terms``)."""
    known = terms.known_mib
    if known is None:
        return _weights_only(vram_mib, terms)
    sums = f"weights {terms.weights_mib} MiB + {terms.kv_text()} = {known} MiB{terms.per_role()}"
    assert terms.kv_bytes is not None
    short = _short_mib(terms.weights_bytes + terms.kv_bytes, vram_mib, terms.roles)
    if short:
        message = (
            f"cannot load in its reservation: vram_mib {vram_mib} < {sums}, "
            f"short by {short} MiB before the overheads (unknown)"
        )
        return ReservationCheck(vram_mib, terms, CANNOT_LOAD, message, shortfall_mib=short)
    excess, bound = max(0, vram_mib - known), excess_bound_mib(known)
    if excess > bound:
        message = (
            f"vram_mib {vram_mib} exceeds {sums} by {excess} MiB, more than the "
            f"{BOUND_PCT} % + {BOUND_FIXED_MIB} MiB = {bound} MiB the overheads are allowed: "
            "the reservation may hold room nothing uses (measure it: vramctl calibrate)"
        )
        return ReservationCheck(
            vram_mib, terms, OVERSIZED, message, excess_mib=excess, bound_mib=bound
        )
    message = (
        f"vram_mib {vram_mib} ≥ {sums}: {excess} MiB left for the overheads "
        f"(unknown; at most {bound} MiB before a hint)"
    )
    if known > vram_mib:  # the figures each round up: the bytes fit all the same
        total = terms.weights_bytes + terms.kv_bytes
        message = (
            f"vram_mib {vram_mib} holds weights + KV cache in bytes, {terms.weights_bytes} + "
            f"{terms.kv_bytes} = {total} ≤ {vram_mib * MIB * terms.roles} ({sums}, each "
            "rounded up): nothing is left for the overheads (unknown)"
        )
    return ReservationCheck(vram_mib, terms, OK, message, excess_mib=excess, bound_mib=bound)


@dataclass(frozen=True, slots=True)
class Calibration:
    """Reservation, estimate and measured footprint together: ``verdict`` names the term
    that is off (``consistent`` when none is), ``reason`` says it with the figures."""

    vram_mib: int | None
    weights_mib: int | None
    known_mib: int | None
    measured_mib: int | None
    verdict: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        """The figures, ``null`` where unknown."""
        return {
            "vram_mib": self.vram_mib,
            "weights_mib": self.weights_mib,
            "known_mib": self.known_mib,
            "measured_mib": self.measured_mib,
            "overheads_mib": None
            if self.measured_mib is None or self.known_mib is None
            else self.measured_mib - self.known_mib,
            "verdict": self.verdict,
            "reason": self.reason,
        }


def _measured_verdict(
    vram: int | None, weights: int, known: int | None, measured: int
) -> tuple[str, str]:
    """Which term the measured footprint contradicts (the reservation holds the estimate)."""
    if measured < weights:
        return "engine_offloads", (
            f"measured {measured} MiB < weights {weights} MiB: the engine keeps part of the "
            "weights off the GPU (offload, quantization at load), or loads other files"
        )
    if known is not None and measured < known:
        return "kv_smaller", (
            f"weights {weights} MiB ≤ measured {measured} MiB < weights + KV {known} MiB: "
            "the engine caches fewer tokens than the estimate's context × parallel "
            "(the estimate's context is too large)"
        )
    if vram is not None and measured > vram:
        over = "" if known is None else f" ({measured - known} MiB above weights + KV)"
        return "overheads_larger", (
            f"measured {measured} MiB > vram_mib {vram} MiB{over}: the overheads are larger "
            "than the reservation leaves room for"
        )
    if known is None:
        return "consistent", f"measured {measured} MiB ≥ weights {weights} MiB; KV cache unknown"
    return "consistent", (
        f"weights + KV {known} MiB ≤ measured {measured} MiB"
        + ("" if vram is None else f" ≤ vram_mib {vram} MiB")
        + f": overheads {measured - known} MiB"
    )


def calibrate_verdict(
    vram_mib: int | None, terms: ModelTerms | None, measured_mib: int | None
) -> Calibration:
    """Which of reservation, estimate (``terms``; ``None``: the model unreadable) and
    measured footprint (``None``: none) is off, and why."""
    weights = None if terms is None else terms.weights_mib
    known = None if terms is None else terms.known_mib

    def answer(verdict: str, reason: str) -> Calibration:
        return Calibration(vram_mib, weights, known, measured_mib, verdict, reason)

    if terms is None:
        return answer(UNKNOWN, "no estimate: the model's files cannot be read")
    if vram_mib is not None and check_reservation(vram_mib, terms).error:
        return answer(CANNOT_LOAD, check_reservation(vram_mib, terms).message)
    if measured_mib is None:
        return answer(UNKNOWN, "no measured footprint yet: only the estimate is known")
    assert weights is not None
    return answer(*_measured_verdict(vram_mib, weights, known, measured_mib))
