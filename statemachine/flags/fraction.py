"""Engine enforcement (docs/design.md §3): the memory-fraction flag that holds an engine to its
reservation, and the check that a command line sets it right.

vLLM's ``--gpu-memory-utilization`` and SGLang's ``--mem-fraction-static`` are fractions
of the device's *total* memory: the engine budgets ``fraction × total`` MiB on each GPU
it uses. The fraction that honours a reservation of ``vram_mib`` is therefore
``vram_mib / device_total_mib``, with the device total from NVML where it is known,
else the role's declared ``vram_mib`` (its capacity row). ADR-0017 §4's
``vram_mib / (capacity - reserve)`` over-allocates and is not used.

Choices, each deliberate:

* **Rounding.** :func:`fraction_for` rounds *down* to :data:`DEFAULT_PLACES` (4)
  decimal places, so the engine's budget never exceeds the reservation: 3200 MiB of a
  97887 MiB device is 0.032691… → ``0.0326`` (3191.1 MiB), not ``0.0327`` (3200.9 MiB).
  The arithmetic is exact (integers and :class:`~fractions.Fraction`), never binary
  floating point.
* **Tolerance.** :func:`check_fraction` accepts a fraction whose budget lies within
  :data:`DEFAULT_TOLERANCE` (0.001 of the device total, about 98 MiB on a 96 GiB card)
  of the reservation, on either side. That accepts a fraction rounded to the nearest
  4 places (the real stack writes 0.0327 for 3200/97887) or 2 places where the
  remainder is small (0.94 for 92000/97887: +13.8 MiB), and rejects a value whose
  budget is off by more than that (0.90 for 88000/97887: +98.3 MiB).
* **Tensor parallel.** An engine applies one fraction on every GPU it uses, and a
  multi-role serve reserves ``vram_mib`` on *each* of its roles, so the fraction is
  ``vram_mib / total`` per GPU. When the roles' totals differ, the smallest per-GPU
  fraction is rendered (no GPU exceeds its reservation) and a found value is checked
  against every role.
* **Engines.** Each engine's flag is its entry's ``memory_flag`` in
  :mod:`statemachine.engines` (vLLM and SGLang have one). Other labels (llama.cpp,
  audio, image, and the real stack's purpose labels ``embedding``/``reranker``) have
  none of their own; the caller may infer the engine from the command that actually
  runs (:func:`engine_of_argv`), which is what ``controller.tools.compose_lint`` does: the
  real stack's embeddings and reranker are labelled by purpose but run ``vllm serve``.

* **Sleep mode.** A serve with ``[serve.sleep]`` is put to sleep instead of stopped,
  which only works when its engine was started with its sleep API on: vLLM needs
  ``--enable-sleep-mode`` *and* ``VLLM_SERVER_DEV_MODE=1`` in its environment (the
  sleep endpoints are development endpoints), SGLang ``--enable-memory-saver``
  (:func:`sleep_needs`, :func:`check_sleep`). Without them every sleep answers 404 and
  falls back to a stop.

Pure: no I/O, no clock; everything is a function of its arguments.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from fractions import Fraction
from typing import Any

from statemachine import engines
from statemachine.domain.types import GpuObs, GpuRole
from statemachine.engines import Engine
from statemachine.engines.sglang import FLAG as SGLANG_FLAG
from statemachine.engines.sglang import SLEEP_FLAG as SGLANG_SLEEP_FLAG
from statemachine.engines.vllm import FLAG as VLLM_FLAG
from statemachine.engines.vllm import SLEEP_ENV as VLLM_SLEEP_ENV
from statemachine.engines.vllm import SLEEP_FLAG as VLLM_SLEEP_FLAG
from statemachine.sizing.needs import MIB

__all__ = [
    "DEFAULT_PLACES",
    "DEFAULT_TOLERANCE",
    "ERROR_KINDS",
    "SGLANG_FLAG",
    "SGLANG_SLEEP_FLAG",
    "SOURCE_DECLARED",
    "SOURCE_NVML",
    "VLLM_FLAG",
    "VLLM_SLEEP_ENV",
    "VLLM_SLEEP_FLAG",
    "DeviceTotal",
    "Finding",
    "FindingKind",
    "RenderResult",
    "Severity",
    "SleepNeeds",
    "check_fraction",
    "check_sleep",
    "engine_flag",
    "engine_flags",
    "engine_of_argv",
    "engine_of_image",
    "exact_fraction",
    "flag_from_variable",
    "flag_values",
    "fraction_for",
    "implied_mib",
    "measured_totals",
    "mib_1dp",
    "normalize_engine",
    "parse_fraction",
    "render_flag",
    "role_totals",
    "sleep_needs",
]

#: Decimal places of a rendered fraction (rounded down).
DEFAULT_PLACES = 4

#: How far (as a fraction of the device total) a found fraction may be from the
#: reservation's exact fraction, either side, before it "disagrees".
DEFAULT_TOLERANCE = Decimal("0.001")

SOURCE_NVML = "NVML total"
SOURCE_DECLARED = "declared capacity"


# ── engines and flags ──────────────────────────────────────────────────────────


def normalize_engine(label: str | None) -> str | None:
    """An engine label in canonical form: ``"vLLM"`` → ``"vllm"``, ``"llama.cpp"`` →
    ``"llamacpp"``; other labels lower-cased; ``None`` or blank → ``None``."""
    return engines.canonical(label)


def engine_flags() -> dict[str, str]:
    """Engine → the flag that caps its memory as a fraction of the device total."""
    return {e.name: e.memory_flag.name for e in engines.engines() if e.memory_flag is not None}


def engine_flag(engine: str | None) -> str | None:
    """The memory-fraction flag of ``engine`` (any spelling), or ``None`` if it has none."""
    found = engines.lookup(engine)
    return None if found is None or found.memory_flag is None else found.memory_flag.name


def _display(engine: str | None) -> str:
    if engine is None:
        return "an unknown engine"
    found = engines.lookup(engine)
    return repr(engine) if found is None else found.display


def _flag_list() -> str:
    """``vLLM --gpu-memory-utilization, SGLang --mem-fraction-static``."""
    return ", ".join(f"{e.display} {flag}" for e, flag in _with_flags())


def _with_flags() -> list[tuple[Engine, str]]:
    return [(e, e.memory_flag.name) for e in engines.engines() if e.memory_flag is not None]


def engine_of_argv(argv: Sequence[str]) -> str | None:
    """The engine a command line runs, from its program words, or ``None``.

    Only the words before the first option are looked at: ``vllm serve …``,
    ``python -m vllm.entrypoints.openai.api_server``, ``python -m sglang.launch_server``,
    ``sglang serve``, ``llama-server`` (each engine's detection words,
    :mod:`statemachine.engines`). A path prefix (``/usr/bin/vllm``) is ignored.
    """
    found = engines.of_argv(argv)
    return None if found is None else found.name


def engine_of_image(image: str | None) -> str | None:
    """A weaker guess from an image reference's repository (``vllm/vllm-openai:tag``)."""
    found = engines.of_image(image)
    return None if found is None else found.name


def _flag_key(word: str) -> str:
    """``--gpu_memory_utilization`` and ``--gpu-memory-utilization`` are one flag to vLLM."""
    return word.replace("_", "-") if word.startswith("--") else word


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Every value ``flag`` is given in ``argv``, in order (the engine takes the last).

    Both ``--flag VALUE`` and ``--flag=VALUE`` count, with ``_`` for ``-`` in the flag's
    name. A flag with nothing after it yields ``""``.
    """
    found: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if _flag_key(name) == flag:
            if eq:
                found.append(value)
            else:
                found.append(argv[i + 1] if i + 1 < len(argv) else "")
                i += 1
        i += 1
    return found


# ── arithmetic ─────────────────────────────────────────────────────────────────


def _check_mib(vram_mib: int, total_mib: int) -> None:
    if vram_mib <= 0:
        raise ValueError(f"a reservation must be positive, got {vram_mib} MiB")
    if total_mib <= 0:
        raise ValueError(f"a device total must be positive, got {total_mib} MiB")
    if vram_mib > total_mib:
        raise ValueError(f"the reservation {vram_mib} MiB exceeds the device total {total_mib} MiB")


def exact_fraction(vram_mib: int, total_mib: int) -> Fraction:
    """``vram_mib / total_mib`` exactly; ValueError unless 0 < vram_mib ≤ total_mib."""
    _check_mib(vram_mib, total_mib)
    return Fraction(vram_mib, total_mib)


def fraction_for(vram_mib: int, total_mib: int, places: int = DEFAULT_PLACES) -> Decimal:
    """The engine fraction for a reservation: ``vram_mib / total_mib`` rounded *down*.

    ``fraction_for(3200, 97887)`` is ``Decimal("0.0326")``. Rounding down keeps the
    engine's budget (fraction × total) at or below the reservation. ValueError unless
    0 < vram_mib ≤ total_mib, or when the result rounds down to 0 at ``places``.
    """
    _check_mib(vram_mib, total_mib)
    if places < 1:
        raise ValueError(f"places must be at least 1, got {places}")
    units = vram_mib * 10**places // total_mib
    if units == 0:
        raise ValueError(
            f"{vram_mib} MiB of {total_mib} MiB is 0 at {places} decimal places; "
            "the engine cannot be held to so small a reservation"
        )
    return Decimal(units).scaleb(-places)


def implied_mib(fraction: Decimal | Fraction, total_mib: int) -> Fraction:
    """The MiB an engine budgets with ``fraction`` of a ``total_mib`` device (exact)."""
    return Fraction(fraction) * total_mib


def parse_fraction(text: str) -> Decimal | None:
    """A flag's value as a decimal in (0, 1], or ``None`` when it is not one."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        return None
    if not value.is_finite() or not 0 < value <= 1:
        return None
    return value


def _tenths(value: Fraction) -> Fraction:
    """``value`` rounded half away from zero to one decimal place, exactly."""
    tenths = (abs(value) * 20 + 1) // 2
    return Fraction(tenths if value >= 0 else -tenths, 10)


def mib_1dp(value: Fraction) -> float:
    """A MiB figure rounded (half away from zero) to one decimal place, for JSON."""
    return float(_tenths(value))


def _mib(value: Fraction) -> str:
    """A MiB figure to one decimal place (``3191.1``); whole numbers without one."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(_tenths(value)):.1f}"


def _ratio(value: Fraction) -> str:
    """An exact ratio to 6 places, with … when it was cut."""
    text = f"{float(value):.6f}"
    return text if Fraction(Decimal(text)) == value else text + "…"


# ── device totals ──────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class DeviceTotal:
    """A role's device total and where the figure came from (NVML, declared, given)."""

    role: str
    total_mib: int
    source: str = SOURCE_DECLARED

    def describe(self) -> str:
        """``97887 MiB (declared capacity of role dark-compute-b)``."""
        return f"{self.total_mib} MiB ({self.source} of role {self.role})"

    def to_json(self) -> dict[str, Any]:
        """``{"role", "total_mib", "source"}``."""
        return {"role": self.role, "total_mib": self.total_mib, "source": self.source}


def measured_totals(roles: Mapping[str, GpuRole], gpus: Sequence[GpuObs] | None) -> dict[str, int]:
    """Role id → NVML total, for roles whose ``uuid`` matches a GPU with a known total."""
    by_uuid = {g.uuid: g.total_mib for g in gpus or () if g.total_mib is not None}
    return {
        rid: by_uuid[role.uuid]
        for rid, role in roles.items()
        if role.uuid is not None and role.uuid in by_uuid
    }


def role_totals(
    roles: Mapping[str, GpuRole],
    measured: Mapping[str, int] | None = None,
    *,
    measured_source: str = SOURCE_NVML,
) -> dict[str, DeviceTotal]:
    """Every role's device total: ``measured`` (NVML) where given, else its capacity.

    A role id in ``measured`` without a capacity row is included too.
    """
    measured = measured or {}
    out = {
        rid: (
            DeviceTotal(rid, measured[rid], measured_source)
            if rid in measured
            else DeviceTotal(rid, role.capacity_mib, SOURCE_DECLARED)
        )
        for rid, role in roles.items()
    }
    for rid, total in measured.items():
        out.setdefault(rid, DeviceTotal(rid, total, measured_source))
    return out


# ── findings ───────────────────────────────────────────────────────────────────


class Severity(StrEnum):
    """An error fails a lint; a note explains and does not."""

    ERROR = "error"
    NOTE = "note"


class FindingKind(StrEnum):
    """What a lint finding is about."""

    MISSING_FLAG = "missing-flag"
    DISAGREES = "disagrees"
    BAD_VALUE = "bad-value"
    EXCEEDS_DEVICE = "reservation-exceeds-device"
    NO_RESERVATION = "no-reservation"
    NO_ENGINE_FLAG = "no-engine-flag"
    NO_DEVICE_TOTAL = "no-device-total"
    NOT_IN_COMPOSE = "not-in-compose"
    NO_SERVE = "no-serve"
    ENGINE_MISMATCH = "engine-mismatch"
    REPEATED_FLAG = "repeated-flag"
    FROM_VARIABLE = "value-from-variable"
    SLEEP_MODE_OFF = "sleep-mode-off"
    SLEEP_PROTOCOL_MISMATCH = "sleep-protocol-mismatch"
    SLEEP_ENV_UNREAD = "sleep-env-unread"
    MISSING_LIMIT = "missing-limit"
    LIMIT_TOO_LARGE = "limit-too-large"
    #: a limit the engine sizes from the device's free memory at its start
    SIZED_FROM_FREE = "sized-from-free"
    DOES_NOT_FIT = "does-not-fit"
    LIMIT_UNKNOWN = "limit-unknown"
    ELASTIC_OFF = "elastic-off"
    ELASTIC_SEGMENT_UNREAD = "elastic-segment-unread"
    CACHE_TYPE = "cache-type-disagrees"
    #: a placed serve's candidates give its reservation different fractions: one command
    #: line cannot hold it on each card
    PER_CARD = "fraction-per-card"
    #: the engine unloads its model by itself when idle (a note: its reservation is kept)
    SELF_SLEEP = "self-sleep"


#: The kinds that are errors; every other kind is a note.
ERROR_KINDS: frozenset[FindingKind] = frozenset(
    {
        FindingKind.MISSING_FLAG,
        FindingKind.DISAGREES,
        FindingKind.BAD_VALUE,
        FindingKind.EXCEEDS_DEVICE,
        FindingKind.SLEEP_MODE_OFF,
        FindingKind.SLEEP_PROTOCOL_MISMATCH,
        FindingKind.MISSING_LIMIT,
        FindingKind.LIMIT_TOO_LARGE,
        FindingKind.SIZED_FROM_FREE,
        FindingKind.DOES_NOT_FIT,
        FindingKind.ELASTIC_OFF,
        FindingKind.CACHE_TYPE,
    }
)


# ── render ─────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class RenderResult:
    """The engine flag that enforces one serve's reservation, and its arithmetic.

    ``fraction`` is ``None`` when there is no flag to render; ``problem`` then says why
    (no reservation, no flag for this engine, no device total, reservation larger than
    the device). ``explanation`` is the arithmetic in words either way.
    """

    serve: str
    engine: str | None
    flag: str | None
    vram_mib: int | None
    totals: tuple[DeviceTotal, ...]
    fraction: Decimal | None
    explanation: str
    problem: str | None = None
    problem_kind: FindingKind | None = None
    places: int = DEFAULT_PLACES
    #: the engine's fraction is of the memory free when it starts (SGLang): the value is
    #: the variable each start sets, ``fraction`` what it is on an empty card
    of_free: bool = False

    @property
    def value(self) -> str | None:
        """The flag's value as written (``"0.0326"``, or the start's variable for an
        engine whose fraction is of the memory free at its start), or ``None``."""
        if self.fraction is None:
            return None
        return f"${{{OF_FREE_VARIABLE}}}" if self.of_free else str(self.fraction)

    @property
    def argv(self) -> tuple[str, ...]:
        """``("--gpu-memory-utilization", "0.0326")``, or ``()`` with nothing to render."""
        if self.flag is None or self.value is None:
            return ()
        return (self.flag, self.value)

    @property
    def text(self) -> str | None:
        """``"--gpu-memory-utilization 0.0326"``, or ``None``."""
        return " ".join(self.argv) or None

    @property
    def exact(self) -> Fraction | None:
        """The exact ``vram_mib / total`` the rendered value rounds down (smallest role)."""
        if self.vram_mib is None or not self.totals or self.fraction is None:
            return None
        return min(Fraction(self.vram_mib, t.total_mib) for t in self.totals)

    def budget(self, fraction: Decimal | None = None) -> tuple[int, str] | None:
        """The bytes ``fraction`` (the rendered one where not given) gives the engine on
        the smallest of its devices, rounded down, and the arithmetic; ``None`` with no
        fraction or no total."""
        value = self.fraction if fraction is None else fraction
        if value is None or not self.totals or self.of_free:
            return None
        total = min(self.totals, key=lambda t: t.total_mib)
        size = math.floor(Fraction(value) * total.total_mib * MIB)
        return size, f"{self.flag} {value} × {total.total_mib} MiB × {MIB}"

    def engine_mib(self) -> dict[str, Fraction]:
        """Role → the MiB the engine budgets there with the rendered fraction."""
        if self.fraction is None:
            return {}
        return {t.role: implied_mib(self.fraction, t.total_mib) for t in self.totals}

    def to_json(self) -> dict[str, Any]:
        """Machine-readable form (fractions as strings, MiB as numbers)."""
        exact = self.exact
        return {
            "serve": self.serve,
            "engine": self.engine,
            "flag": self.flag,
            "value": self.value,
            "argv": list(self.argv),
            "vram_mib": self.vram_mib,
            "device_totals": [t.to_json() for t in self.totals],
            "exact_fraction": None if exact is None else float(exact),
            "engine_mib": {r: mib_1dp(m) for r, m in self.engine_mib().items()},
            "rounding": f"down to {self.places} places",
            "explanation": self.explanation,
            "problem": self.problem,
        }


def _totals_phrase(totals: Sequence[DeviceTotal]) -> str:
    if len(totals) == 1:
        return totals[0].describe()
    if len({(t.total_mib, t.source) for t in totals}) == 1:
        roles = ", ".join(t.role for t in totals)
        return f"{totals[0].total_mib} MiB ({totals[0].source} of roles {roles})"
    return "; ".join(t.describe() for t in totals)


def render_flag(
    serve: str,
    engine: str | None,
    vram_mib: int | None,
    roles: Sequence[str],
    totals: Mapping[str, DeviceTotal],
    *,
    places: int = DEFAULT_PLACES,
) -> RenderResult:
    """The flag and value that hold ``serve``'s engine to its reservation.

    ``engine`` is the engine that runs (any spelling); ``roles`` are the serve's gpu
    roles and ``totals`` the device totals by role (:func:`role_totals`). A multi-role
    (tensor-parallel) serve reserves ``vram_mib`` on each role and its engine applies
    one fraction on every GPU: the smallest per-GPU fraction is rendered.
    """
    key = normalize_engine(engine)
    flag = engine_flag(key)
    known = tuple(totals[r] for r in roles if r in totals)
    why = _unrenderable(key, flag, vram_mib, roles, totals, known)
    fraction: Decimal | None = None
    explanation = ""
    if why is None:
        assert vram_mib is not None
        try:
            fraction, explanation = _rendered(vram_mib, known, places)
        except ValueError as exc:
            why = (FindingKind.NO_DEVICE_TOTAL, str(exc))
    kind, problem = why if why is not None else (None, None)
    found = engines.lookup(key)
    of_free = found is not None and found.memory_flag is not None and found.memory_flag.of_free
    if of_free and problem is None:
        explanation = _of_free_text(flag, explanation)
    return RenderResult(
        serve=serve,
        engine=key,
        flag=flag,
        vram_mib=vram_mib,
        totals=known,
        fraction=fraction,
        explanation=explanation if problem is None else problem,
        problem=problem,
        problem_kind=kind,
        places=places,
        of_free=of_free,
    )


#: the variable each start sets to ``vram_mib ÷`` the MiB free (statemachine/ledger/gpu_vars.py)
OF_FREE_VARIABLE = "VRAMCTL_FRACTION_OF_FREE"


def _of_free_text(flag: str | None, empty_card: str) -> str:
    """The explanation of an engine whose fraction is of the memory free at its start."""
    return (
        f"{flag} is a fraction of the memory free when the engine starts, not of the "
        f"card: ${{{OF_FREE_VARIABLE}}}, which vramctl sets at each start to vram_mib ÷ "
        f"the MiB free then ({{fraction_of_free}} in up); on an empty card: {empty_card}"
    )


def _names_of_free(raw: str, flag: str) -> bool:
    """True when the raw command gives ``flag`` (``-`` or ``_`` between its words) the
    start's variable (``$VAR`` or ``${VAR}``)."""
    name = "[-_]".join(re.escape(part) for part in flag.split("-"))
    pattern = name + r"(?:=|\s+)[\"']?\$\{?" + OF_FREE_VARIABLE + r"\b"
    return re.search(pattern, raw) is not None


def _unrenderable(
    key: str | None,
    flag: str | None,
    vram_mib: int | None,
    roles: Sequence[str],
    totals: Mapping[str, DeviceTotal],
    known: tuple[DeviceTotal, ...],
) -> tuple[FindingKind, str] | None:
    """Why no flag can be rendered (the finding's kind and its words); None when one can."""
    if flag is None:
        what = (
            "no engine is declared (engine = …) or found in its command"
            if key is None
            else f"engine {key!r} has no memory-fraction flag vramctl knows"
        )
        return (
            FindingKind.NO_ENGINE_FLAG,
            f"{what} ({_flag_list()}); the reservation is kept by the ledger only",
        )
    if vram_mib is None:
        return (
            FindingKind.NO_RESERVATION,
            "no reservation (vram_mib): there is nothing for the flag to enforce",
        )
    if not roles:
        return (
            FindingKind.NO_DEVICE_TOTAL,
            f"no gpu_role/gpu_roles: the device total that {flag} is a fraction of is unknown",
        )
    missing = [r for r in roles if r not in totals]
    if missing:
        return (
            FindingKind.NO_DEVICE_TOTAL,
            "no device total for role "
            + ", ".join(missing)
            + " (no [[gpu_roles]] capacity row, no NVML figure)",
        )
    over = [t for t in known if vram_mib > t.total_mib]
    if over:
        return (
            FindingKind.EXCEEDS_DEVICE,
            f"the reservation {vram_mib} MiB exceeds the device total "
            + "; ".join(t.describe() for t in over),
        )
    return None


def _rendered(vram_mib: int, known: tuple[DeviceTotal, ...], places: int) -> tuple[Decimal, str]:
    """The fraction for ``vram_mib`` on the smallest per-GPU share of ``known``, and its
    arithmetic in words (``ValueError`` from :func:`fraction_for` when it has none)."""
    per_role = {t.role: Fraction(vram_mib, t.total_mib) for t in known}
    smallest = min(known, key=lambda t: per_role[t.role])
    fraction = fraction_for(vram_mib, smallest.total_mib, places)
    exact = per_role[smallest.role]
    budget = implied_mib(fraction, smallest.total_mib)
    if len(known) == 1:
        head = f"{vram_mib} MiB / {_totals_phrase(known)}"
    else:
        head = (
            f"{vram_mib} MiB on each of {len(known)} GPUs (tensor parallel; the fraction "
            f"applies per GPU) / {_totals_phrase(known)}"
        )
        if len({t.total_mib for t in known}) > 1:
            head += f"; smallest per-GPU fraction on role {smallest.role}"
    if Fraction(fraction) == exact:
        tail = f"= {fraction} exactly ({_mib(budget)} MiB)"
    else:
        tail = (
            f"= {_ratio(exact)} → {fraction}, rounded down to {places} places so the "
            f"engine's {_mib(budget)} MiB stays within the {vram_mib} MiB reservation"
        )
    return fraction, f"{head} {tail}"


# ── checks ─────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Finding:
    """One lint finding about a serve and/or a compose service, with its numbers."""

    kind: FindingKind
    message: str
    serve: str | None = None
    service: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def severity(self) -> Severity:
        """:attr:`Severity.ERROR` for :data:`ERROR_KINDS`, else a note."""
        return Severity.ERROR if self.kind in ERROR_KINDS else Severity.NOTE

    @property
    def is_error(self) -> bool:
        """True when this finding fails the lint."""
        return self.severity is Severity.ERROR

    def to_json(self) -> dict[str, Any]:
        """``{"severity", "kind", "serve", "service", "message", **facts}``."""
        return {
            "severity": self.severity.value,
            "kind": self.kind.value,
            "serve": self.serve,
            "service": self.service,
            "message": self.message,
            **self.facts,
        }


def _tolerance(value: Decimal | float | str) -> Fraction:
    tol = Fraction(Decimal(str(value)))
    if tol < 0:
        raise ValueError(f"a tolerance must not be negative, got {value}")
    return tol


def check_fraction(
    render: RenderResult,
    found: str | None,
    *,
    tolerance: Decimal | float | str = DEFAULT_TOLERANCE,
    service: str | None = None,
    raw: str | None = None,
) -> Finding | None:
    """Check the value ``found`` for ``render.flag`` against the reservation.

    ``found`` is the flag's value as written (the last one), ``None`` when the command
    does not set the flag. Returns ``None`` when the value is within ``tolerance`` (a
    fraction of the device total) of ``vram_mib / total`` on every role, else a
    finding: an error when the flag is missing, unreadable or disagrees, or the
    reservation exceeds the device; a note when there is nothing to check (no flag for
    the engine, no reservation, no device total).
    """
    tol = _tolerance(tolerance)
    base = {"flag": render.flag, "found": found, "expected": render.value}
    finding = _Findings(render.serve, service, base)
    unchecked = _nothing_to_check(render, found, finding)
    if unchecked is not None:
        return unchecked
    flag, vram = render.flag, render.vram_mib
    assert flag is not None and vram is not None  # else there was nothing to check
    smallest = min(render.totals, key=lambda t: Fraction(vram, t.total_mib))
    if render.of_free and raw is not None and _names_of_free(raw, flag):
        return None
    value = _read_value(render, found, finding, smallest)
    if isinstance(value, Finding):
        return value
    return _disagreement(render, found, value, tol, finding)


@dataclass(frozen=True, slots=True)
class _Findings:
    """Makes the findings of one :func:`check_fraction`: each about its serve and
    service, with the flag's facts (``base``) and its own."""

    serve: str
    service: str | None
    base: Mapping[str, Any]

    def __call__(self, kind: FindingKind, message: str, **facts: Any) -> Finding:
        return Finding(kind, message, self.serve, self.service, {**self.base, **facts})


def _nothing_to_check(
    render: RenderResult, found: str | None, finding: _Findings
) -> Finding | None:
    """The finding where there is nothing to check the flag against (no flag for the
    engine, no reservation, no fraction: no device total); None where there is."""
    flag = render.flag
    if flag is None:
        return finding(FindingKind.NO_ENGINE_FLAG, str(render.problem))
    if render.vram_mib is None:
        if found is None:
            return finding(FindingKind.NO_RESERVATION, str(render.problem))
        return finding(
            FindingKind.NO_RESERVATION,
            f"sets {flag} {found} but declares no reservation (vram_mib): the ledger does "
            "not count the memory this engine takes",
        )
    if render.fraction is None:
        kind = render.problem_kind or FindingKind.NO_DEVICE_TOTAL
        return finding(kind, f"cannot check {flag}: {render.problem}")
    return None


def _read_value(
    render: RenderResult, found: str | None, finding: _Findings, smallest: DeviceTotal
) -> Decimal | Finding:
    """The flag's value as a fraction, or the finding why it cannot be checked: written
    as a fraction of free memory, missing (``smallest``: the total the engine's own
    default would size it by), or not a fraction in (0, 1]."""
    flag, vram = render.flag, render.vram_mib
    engine = _display(render.engine)
    if render.of_free and found is not None:
        return finding(
            FindingKind.SIZED_FROM_FREE,
            f"{flag} {found} is a fraction of the memory free when {engine} starts, not of "
            f"the card: where others hold memory it gives the engine {found} × what they "
            f"left, not its {vram} MiB reservation; write {render.text} ({render.explanation})",
            vram_mib=vram,
        )
    if found is None:
        known = engines.lookup(render.engine)
        own = None if known is None or known.memory_flag is None else known.memory_flag.default
        default = "" if own is None or known is None else f" ({known.display}'s default is {own})"
        return finding(
            FindingKind.MISSING_FLAG,
            f"runs {engine} without {flag}: the engine sizes itself by its own default "
            f"fraction of the device{default}, not by the {vram} MiB reservation; add "
            f"{render.text} ({render.explanation})",
            vram_mib=vram,
            total_mib=smallest.total_mib,
        )
    value = parse_fraction(found)
    if value is None:
        return finding(
            FindingKind.BAD_VALUE,
            f"{flag} {found!r} is not a fraction in (0, 1]; the reservation needs "
            f"{render.text} ({render.explanation})",
            vram_mib=vram,
        )
    return value


def _disagreement(
    render: RenderResult, found: str | None, value: Decimal, tol: Fraction, finding: _Findings
) -> Finding | None:
    """The finding where ``value`` (``found`` as written) gives the engine more or less
    than its reservation beyond ``tol`` on some role (the worst one), else None."""
    flag, vram = render.flag, render.vram_mib
    assert vram is not None  # checked by the caller
    worst: tuple[Fraction, DeviceTotal] | None = None
    for total in render.totals:
        delta = implied_mib(value, total.total_mib) - vram
        allowed = tol * total.total_mib
        if abs(delta) > allowed and (worst is None or abs(delta) > abs(worst[0])):
            worst = (delta, total)
    if worst is None:
        return None
    delta, total = worst
    budget = implied_mib(value, total.total_mib)
    allowed = tol * total.total_mib
    exact = Fraction(vram, total.total_mib)
    direction = "more" if delta > 0 else "less"
    # a reservation that keeps the flag must cover its whole budget: round up either way
    remedy = f"write {render.text}, or reserve vram_mib = {math.ceil(budget)} to keep the flag"
    return finding(
        FindingKind.DISAGREES,
        f"{flag} {found} gives the engine {_mib(budget)} MiB of {total.describe()}, "
        f"{_mib(abs(delta))} MiB {direction} than its {vram} MiB reservation "
        f"({vram}/{total.total_mib} = {_ratio(exact)}); that is beyond the tolerance of "
        f"±{_mib(allowed)} MiB ({_fraction_text(tol)} of the device): {remedy}",
        vram_mib=vram,
        total_mib=total.total_mib,
        role=total.role,
        found_mib=mib_1dp(budget),
        delta_mib=mib_1dp(delta),
        tolerance=float(tol),
        tolerance_mib=mib_1dp(allowed),
    )


def _fraction_text(value: Fraction) -> str:
    """A tolerance as a short decimal (``0.001``)."""
    text = f"{float(value):.6f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def flag_from_variable(text: str) -> bool:
    """True when a raw (uninterpolated) command sets a fraction flag from ``$VAR``."""
    flags = "|".join(re.escape(f) for f in engine_flags().values())
    pattern = r"(?:" + flags + r")(?:=|\s+)[\"']?\$(?!\$)"
    return bool(flags) and bool(re.search(pattern, text.replace("_", "-")))


# ── sleep mode ─────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class SleepNeeds:
    """What an engine's command line and environment need for its sleep API."""

    protocol: str
    flags: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """``"--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"``."""
        parts = [" ".join(self.flags)] + [f"{k}={v}" for k, v in sorted(self.env.items())]
        return " and ".join(p for p in parts if p)

    def to_json(self) -> dict[str, Any]:
        """``{"protocol", "flags", "env"}``."""
        return {"protocol": self.protocol, "flags": list(self.flags), "env": dict(self.env)}


def sleep_needs(protocol: str | None) -> SleepNeeds | None:
    """What a serve whose ``[serve.sleep]`` speaks ``protocol`` needs (None: unknown)."""
    found = engines.lookup(protocol)
    if found is None or found.sleep is None:
        return None
    return SleepNeeds(found.name, found.sleep.flags, dict(found.sleep.env))


def _flag_given(argv: Sequence[str], flag: str) -> bool:
    """True when ``flag`` is on the command line, alone or as ``flag=true``."""
    want = _flag_key(flag)
    for word in argv:
        key, _, value = word.partition("=")
        if _flag_key(key) == want and value.strip().lower() not in {"false", "0", "no"}:
            return True
    return False


def check_sleep(
    serve: str,
    protocol: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    engine: str | None = None,
    service: str | None = None,
) -> list[Finding]:
    """The errors of a sleep-capable serve whose command (``argv``, ``env``) cannot sleep.

    ``engine`` is the engine the command runs, when known: one that is not the
    ``protocol`` the serve declares is an error too (its sleep API is another's).
    """
    needs = sleep_needs(protocol)
    if needs is None:
        return []
    out: list[Finding] = []
    facts: dict[str, Any] = {"protocol": needs.protocol, "needs": needs.to_json()}
    runs = normalize_engine(engine)
    if runs in engine_flags() and runs != needs.protocol:
        out.append(
            Finding(
                FindingKind.SLEEP_PROTOCOL_MISMATCH,
                f"[serve.sleep] speaks the {_display(needs.protocol)} sleep API but the "
                f"command runs {_display(runs)}: set protocol = {runs!r}",
                serve,
                service,
                {**facts, "engine": runs},
            )
        )
        return out
    missing = [f for f in needs.flags if not _flag_given(argv, f)]
    missing += [f"{k}={v}" for k, v in sorted(needs.env.items()) if env.get(k) != v]
    if missing:
        out.append(
            Finding(
                FindingKind.SLEEP_MODE_OFF,
                f"declares [serve.sleep] but runs {_display(needs.protocol)} without "
                f"{' and '.join(missing)}: its sleep API answers 404 and every sleep "
                f"falls back to a stop; add {needs.text}",
                serve,
                service,
                {**facts, "missing": missing},
            )
        )
    return out
