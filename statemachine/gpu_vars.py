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

:data:`GPU_VARIABLES` is the table; :func:`gpu_placement` computes it for one start.
Pure: no I/O, nothing of ``controller``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from statemachine.types import GpuObs, GpuRole


@dataclass(frozen=True, slots=True)
class Unknown:
    """Why one role's value is unknown."""

    why: str


#: How one role's value is found: the value, or why it is unknown.
_RoleValue = Callable[[str, Mapping[str, GpuRole], Mapping[str, GpuObs] | None], str | Unknown]


def _role_id(role: str, declared: Mapping[str, GpuRole], seen: Mapping[str, GpuObs] | None) -> str:
    return role


def _uuid(
    role: str, declared: Mapping[str, GpuRole], seen: Mapping[str, GpuObs] | None
) -> str | Unknown:
    row = declared.get(role)
    if row is None:
        return Unknown(f"gpu role {role} has no [[gpu_roles]] row")
    if not row.uuid:
        return Unknown(
            f'gpu role {role} declares no uuid (add uuid = "GPU-…" to its [[gpu_roles]] '
            "row: nvidia-smi -L lists them)"
        )
    return row.uuid


def _index(
    role: str, declared: Mapping[str, GpuRole], seen: Mapping[str, GpuObs] | None
) -> str | Unknown:
    uuid = _uuid(role, declared, seen)
    if isinstance(uuid, Unknown):
        return uuid
    if seen is None:
        return Unknown("NVML was not available at the last observation")
    dev = seen.get(uuid)
    if dev is None:
        return Unknown(f"NVML did not see gpu role {role}'s device {uuid} at the last observation")
    if dev.index is None:
        return Unknown(f"NVML gave no index for gpu role {role}'s device {uuid}")
    return str(dev.index)


@dataclass(frozen=True, slots=True)
class GpuVariable:
    """One row of the table: the environment variable, its placeholder in ``up``, what
    it holds, and how one role's value is found."""

    env: str
    placeholder: str
    means: str
    of_role: _RoleValue


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


def gpu_placement(
    roles: Sequence[str],
    declared: Mapping[str, GpuRole],
    gpus: Sequence[GpuObs] | None,
) -> GpuPlacement:
    """The table's values for a start on ``roles`` (the roles reserved for it, in order).

    ``declared``: the manifest's ``[[gpu_roles]]`` rows by id; ``gpus``: what NVML showed
    at the last observation (``None``: NVML unavailable). A serve on no role has none.
    """
    seen = None if gpus is None else {g.uuid: g for g in gpus}
    values: dict[str, str] = {}
    unknown: dict[str, str] = {}
    for var in GPU_VARIABLES:
        if not roles:
            unknown[var.env] = "the serve has no gpu role"
            continue
        found = [var.of_role(r, declared, seen) for r in roles]
        missing = [f.why for f in found if isinstance(f, Unknown)]
        if missing:
            unknown[var.env] = "; ".join(missing)
        else:
            values[var.env] = ",".join(f for f in found if isinstance(f, str))
    return GpuPlacement(MappingProxyType(values), MappingProxyType(unknown))


__all__ = [
    "GPU_ENV_NAMES",
    "GPU_VARIABLES",
    "GpuPlacement",
    "GpuVariable",
    "Unknown",
    "UnknownPlaceholderError",
    "gpu_placement",
]
