"""Where the controller put a serve, as its ``up`` command is told (docs/manifest.md, `up`).

Each start that runs a serve's ``up`` gives it, for the GPU roles reserved for it:

| variable | placeholder | value |
|---|---|---|
| ``VRAMCTL_GPU_ROLE`` | ``{gpu_role}`` | the role's id |
| ``VRAMCTL_GPU_UUID`` | ``{gpu_uuid}`` | the ``uuid`` its ``[[gpu_roles]]`` row declares |
| ``VRAMCTL_GPU_INDEX`` | ``{gpu_index}`` | the NVML index of the device with that uuid |

A serve on several roles gets each value joined by ``,`` in the order of its roles. A
value is known only when it is known for every role; an unknown one is left out of the
environment (never an empty string, never 0) and a placeholder of it refuses the start,
saying why it is unknown. The controller's values win over the serve's own ``up_env``:
an operator cannot say another card than the one the serve was reserved on.

And what an engine that sizes itself from the memory free at its start needs
(docs/limits.md, "Limits relative to free memory"), given with ``free``, each role's
free MiB as the engine will see it (:func:`start_free_mib`), and the serve's
``vram_mib``:

* ``VRAMCTL_FREE_MIB`` (``{free_mib}``): the MiB free on the role's card at the start;
* ``VRAMCTL_FRACTION_OF_FREE`` (``{fraction_of_free}``): ``vram_mib ÷ free``, rounded
  down to 4 places, the least of the roles (SGLang's ``--mem-fraction-static``);
* ``VRAMCTL_FIT_TARGET_MIB`` (``{fit_target_mib}``): ``free − vram_mib``, the MiB to
  leave free (llama.cpp's ``--fit-target``).

:data:`GPU_VARIABLES` is the table; :func:`gpu_placement` computes it for one start.
Pure: no I/O, nothing of ``controller``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType

from statemachine.domain.types import GpuObs, GpuRole
from statemachine.ledger.reservations import Ledger


@dataclass(frozen=True, slots=True)
class Unknown:
    """Why one role's value is unknown."""

    why: str


@dataclass(frozen=True, slots=True)
class StartFacts:
    """What one start's values are found from: the manifest's rows (``declared``), what
    NVML showed (``seen``, by uuid; ``None``: unavailable), each role's free MiB as the
    engine will see it (``free``) and the serve's ``vram_mib``."""

    declared: Mapping[str, GpuRole]
    seen: Mapping[str, GpuObs] | None
    free: Mapping[str, int | Unknown]
    vram_mib: int | None


#: How one role's value is found: the value, or why it is unknown.
_RoleValue = Callable[[str, StartFacts], str | Unknown]


def _role_id(role: str, facts: StartFacts) -> str:
    return role


def _uuid(role: str, facts: StartFacts) -> str | Unknown:
    row = facts.declared.get(role)
    if row is None:
        return Unknown(f"gpu role {role} has no [[gpu_roles]] row")
    if not row.uuid:
        return Unknown(
            f'gpu role {role} declares no uuid (add uuid = "GPU-…" to its [[gpu_roles]] '
            "row: nvidia-smi -L lists them)"
        )
    return row.uuid


def _index(role: str, facts: StartFacts) -> str | Unknown:
    uuid = _uuid(role, facts)
    if isinstance(uuid, Unknown):
        return uuid
    seen = facts.seen
    if seen is None:
        return Unknown("NVML was not available at the last observation")
    dev = seen.get(uuid)
    if dev is None:
        return Unknown(f"NVML did not see gpu role {role}'s device {uuid} at the last observation")
    if dev.index is None:
        return Unknown(f"NVML gave no index for gpu role {role}'s device {uuid}")
    return str(dev.index)


def _free(role: str, facts: StartFacts) -> int | Unknown:
    return facts.free.get(role, Unknown(f"the free memory of gpu role {role} is unknown"))


def _free_mib(role: str, facts: StartFacts) -> str | Unknown:
    free = _free(role, facts)
    return free if isinstance(free, Unknown) else str(free)


def _room(role: str, facts: StartFacts) -> tuple[int, int] | Unknown:
    """The role's free MiB and the reservation, when the reservation fits in it."""
    free = _free(role, facts)
    if isinstance(free, Unknown):
        return free
    if facts.vram_mib is None:
        return Unknown("the serve has no vram_mib")
    if free < facts.vram_mib:  # vram_mib is at least 1: a positive free MiB divides it
        return Unknown(f"gpu role {role} has {free} MiB free, less than vram_mib {facts.vram_mib}")
    return free, facts.vram_mib


def _fraction_of_free(role: str, facts: StartFacts) -> str | Unknown:
    room = _room(role, facts)
    if isinstance(room, Unknown):
        return room
    free, mib = room
    return f"{Decimal(mib * 10**4 // free) / 10**4:.4f}"


def _fit_target(role: str, facts: StartFacts) -> str | Unknown:
    room = _room(role, facts)
    return room if isinstance(room, Unknown) else str(room[0] - room[1])


def _joined(values: Sequence[str]) -> str:
    return ",".join(values)


@dataclass(frozen=True, slots=True)
class GpuVariable:
    """One row of the table: the environment variable, its placeholder in ``up``, what
    it holds, how one role's value is found, and how the roles' values make one."""

    env: str
    placeholder: str
    means: str
    of_role: _RoleValue
    combine: Callable[[Sequence[str]], str] = _joined


#: The variables (and ``up`` placeholders) that say where a serve was put.
GPU_VARIABLES: tuple[GpuVariable, ...] = (
    GpuVariable("VRAMCTL_GPU_ROLE", "{gpu_role}", "the gpu role's id", _role_id),
    GpuVariable("VRAMCTL_GPU_UUID", "{gpu_uuid}", "the uuid its [[gpu_roles]] row declares", _uuid),
    GpuVariable(
        "VRAMCTL_GPU_INDEX",
        "{gpu_index}",
        "the NVML index of the device with that uuid (as last observed)",
        _index,
    ),
    GpuVariable(
        "VRAMCTL_FREE_MIB",
        "{free_mib}",
        "the MiB free on the role's card when the serve starts",
        _free_mib,
    ),
    GpuVariable(
        "VRAMCTL_FRACTION_OF_FREE",
        "{fraction_of_free}",
        "vram_mib ÷ the MiB free at the start, rounded down to 4 places (the least of the "
        "roles): SGLang's --mem-fraction-static",
        _fraction_of_free,
        lambda fractions: min(fractions, key=Decimal),
    ),
    GpuVariable(
        "VRAMCTL_FIT_TARGET_MIB",
        "{fit_target_mib}",
        "the MiB free at the start less vram_mib: llama.cpp's --fit-target",
        _fit_target,
    ),
)
#: The environment variables that are the controller's to set (an ``up_env`` of the same
#: name never reaches ``up``).
GPU_ENV_NAMES: frozenset[str] = frozenset(v.env for v in GPU_VARIABLES)


class UnknownPlaceholderError(ValueError):
    """An ``up`` word names a placeholder whose value is unknown for this start."""

    def __init__(self, placeholder: str, why: str) -> None:
        super().__init__(f"`up` names {placeholder}, which is unknown for this start: {why}")
        self.placeholder = placeholder
        self.why = why


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """The table's values for one start: ``values`` (variable -> value, the known ones)
    and ``unknown`` (variable -> why it is unknown)."""

    values: Mapping[str, str]
    unknown: Mapping[str, str]

    def environment(self, up_env: Mapping[str, str] | None) -> dict[str, str]:
        """The serve's ``up_env`` without any variable of the table, plus the known
        values: the controller's win, and an unknown one is absent, whatever ``up_env``
        says."""
        env = {k: v for k, v in (up_env or {}).items() if k not in GPU_ENV_NAMES}
        env.update(self.values)
        return env

    def substitute(self, argv: Sequence[str]) -> tuple[str, ...]:
        """``argv`` with each placeholder replaced in every word; raises
        :class:`UnknownPlaceholderError` for the first one whose value is unknown."""
        out: list[str] = []
        for given in argv:
            word = given
            for var in GPU_VARIABLES:
                if var.placeholder not in word:
                    continue
                value = self.values.get(var.env)
                if value is None:
                    raise UnknownPlaceholderError(var.placeholder, self.unknown[var.env])
                word = word.replace(var.placeholder, value)
            out.append(word)
        return tuple(out)


def start_free_mib(
    capacity_mib: int, others_mib: int, measured_free_mib: int | None
) -> tuple[int, str]:
    """The MiB an engine will find free on a card when it starts, and how: the larger
    of what NVML measured free and the capacity less what the others hold in the ledger
    (starts on a card are serialised, and the others keep within their reservations, so
    the engine finds no more than that): a fraction of it, or a target below it, never
    gives the engine more than its reservation."""
    by_ledger = capacity_mib - others_mib
    how = f"capacity {capacity_mib} − {others_mib} MiB the others hold = {by_ledger}"
    if measured_free_mib is None or measured_free_mib <= by_ledger:
        return by_ledger, how + (
            "" if measured_free_mib is None else f" (NVML measured {measured_free_mib} free)"
        )
    return measured_free_mib, f"NVML measured {measured_free_mib} free (more than {how})"


def free_at_start(
    roles: Sequence[str],
    holder: str,
    ledger: Ledger,
    declared: Mapping[str, GpuRole],
    gpus: Sequence[GpuObs] | None,
) -> dict[str, int | Unknown]:
    """Each role's free MiB as ``holder``'s engine will find it at its start
    (:func:`start_free_mib`): the ledger's others (``holder``'s own reservation left out)
    and what NVML last measured free on the role's device."""
    seen = {} if gpus is None else {g.uuid: g for g in gpus}
    own = ledger.holdings.get(holder)
    out: dict[str, int | Unknown] = {}
    for role in roles:
        row = declared.get(role)
        if row is None:
            out[role] = Unknown(f"gpu role {role} has no [[gpu_roles]] row")
            continue
        mine = own.mib if own is not None and role in own.gpu_roles else 0
        dev = seen.get(row.uuid) if row.uuid else None
        measured = None if dev is None else dev.free_mib
        out[role] = start_free_mib(row.capacity_mib, ledger.committed_mib(role) - mine, measured)[0]
    return out


def gpu_placement(
    roles: Sequence[str],
    declared: Mapping[str, GpuRole],
    gpus: Sequence[GpuObs] | None,
    *,
    free: Mapping[str, int | Unknown] | None = None,
    vram_mib: int | None = None,
) -> GpuPlacement:
    """The table's values for a start on ``roles`` (the roles reserved for it, in order).

    ``declared``: the manifest's ``[[gpu_roles]]`` rows by id; ``gpus``: what NVML showed
    at the last observation (``None``: NVML unavailable); ``free``: each role's free MiB
    at the start (:func:`start_free_mib`), ``vram_mib`` the serve's. A serve on no role
    has none.
    """
    seen = None if gpus is None else {g.uuid: g for g in gpus}
    facts = StartFacts(declared, seen, free or {}, vram_mib)
    values: dict[str, str] = {}
    unknown: dict[str, str] = {}
    for var in GPU_VARIABLES:
        if not roles:
            unknown[var.env] = "the serve has no gpu role"
            continue
        found = [var.of_role(r, facts) for r in roles]
        missing = [f.why for f in found if isinstance(f, Unknown)]
        if missing:
            unknown[var.env] = "; ".join(missing)
        else:
            values[var.env] = var.combine([f for f in found if isinstance(f, str)])
    return GpuPlacement(MappingProxyType(values), MappingProxyType(unknown))


__all__ = [
    "GPU_ENV_NAMES",
    "GPU_VARIABLES",
    "GpuPlacement",
    "GpuVariable",
    "StartFacts",
    "Unknown",
    "UnknownPlaceholderError",
    "free_at_start",
    "gpu_placement",
    "start_free_mib",
]
