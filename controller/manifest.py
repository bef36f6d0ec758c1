"""Manifest loading: TOML files → validated pydantic models → the core's DesiredState.

A manifest is one or more TOML files (DESIGN §4). This module reads them with
:mod:`tomllib`, validates every ``[[gpu_roles]]`` and ``[[serve]]`` table with the
pydantic models below, merges several files into one :class:`ManifestSet` (serves
de-duplicated by container, roles by id), and converts the set into
:class:`statemachine.types.DesiredState` for the pure core.

Errors are *located* and *collected*: every problem of every file is reported at once
as a :class:`LocatedError` (file, serve or role, field, message) inside one
:class:`ManifestError`, never as a traceback. Unknown keys are kept (the real stack's
manifests carry many), except a key that is a near-miss of a known field (``vram_mb``),
which is an error with a "did you mean", because a typo would silently drop a
reservation.

This module only reads the manifest files. It must not touch docker, NVML or the
network, must not run the ``up`` commands (it only splits them into argv, never
through a shell), and must not write anything.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from statemachine.types import DesiredRun, DesiredState, Elastic, GpuRole, Residency, ServeSpec

__all__ = [
    "DUAL_GPU_EXCLUSIVE",
    "ElasticModel",
    "GpuRoleModel",
    "LocatedError",
    "ManifestError",
    "ManifestFile",
    "ManifestSet",
    "ServeModel",
    "load_manifest",
    "load_manifest_set",
    "normalize_residency",
]

#: The ``operating_mode`` that makes a two-role serve exclusive on both roles.
DUAL_GPU_EXCLUSIVE = "dual-gpu-exclusive"

#: Cutoff for difflib's "did you mean" on unknown keys and values.
NEAR_MISS_CUTOFF = 0.8

#: Top-level keys this module reads; other top-level tables are kept and ignored.
TOP_LEVEL_KEYS = ("gpu_roles", "serve")

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


# ── located errors ─────────────────────────────────────────────────────────────


def _show(value: object, limit: int = 120) -> str:
    """A value as the manifest author would write it (JSON ≈ TOML for scalars), short."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True, slots=True)
class LocatedError:
    """One problem in a manifest, located by file, table entry and field.

    ``serve`` is the entry's name (a serve's ``name``, or a role's ``id`` when
    ``table`` is ``"gpu_roles"``), ``None`` when the entry has no usable name; ``index``
    is the entry's 1-based position in its table. ``line``/``column`` are set for TOML
    syntax errors. ``str()`` gives one line such as
    ``serves.toml: serve "omni" (#3): vram_mib: must be a positive integer of MiB, got true``.
    """

    file: str
    serve: str | None
    field: str | None
    message: str
    table: str | None = "serve"
    index: int | None = None
    line: int | None = None
    column: int | None = None

    @property
    def where(self) -> str | None:
        """The entry label (``serve "omni" (#3)``, ``serve #3``), or ``None``."""
        if self.table is None or (self.serve is None and self.index is None):
            return None
        if self.serve is None:
            return f"{self.table} #{self.index}"
        if self.index is None:
            return f"{self.table} {_show(self.serve)}"
        return f"{self.table} {_show(self.serve)} (#{self.index})"

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            position = f"line {self.line}"
            if self.column is not None:
                position += f", column {self.column}"
            parts.append(position)
        where = self.where
        if where is not None:
            parts.append(where)
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)


class ManifestError(Exception):
    """Every problem found in a manifest set; ``str()`` is one line per problem."""

    def __init__(self, errors: Sequence[LocatedError], warnings: Sequence[str] = ()) -> None:
        """Hold ``errors`` (at least one) and any ``warnings`` found on the way."""
        self.errors: list[LocatedError] = list(errors)
        self.warnings: list[str] = list(warnings)
        super().__init__("\n".join(str(e) for e in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


# ── field validators (messages are what the operator reads) ───────────────────


def _bad(message: str, value: object) -> PydanticCustomError:
    """A pydantic error whose message is ours, with the offending value appended."""
    return PydanticCustomError("vramctl", "{detail}", {"detail": f"{message}, got {_show(value)}"})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_mib(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _bad("must be a positive integer of MiB", value)
    return value


#: The engine switches elasticity off below this segment size (its document says so).
MIN_SEGMENT_MIB = 64


def _segment_mib(value: object) -> object:
    if not isinstance(value, int) or isinstance(value, bool) or value < MIN_SEGMENT_MIB:
        raise _bad(
            f"must be a whole number of MiB, at least {MIN_SEGMENT_MIB} (the engine's minimum)",
            value,
        )
    return value


def _nonnegative_mib(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad("must be a non-negative integer of MiB", value)
    return value


def _port(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise _bad("must be an integer TCP port 1-65535", value)
    return value


def _positive_int(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _bad("must be a positive integer", value)
    return value


def _integer(value: object) -> object:
    if not _is_int(value):
        raise _bad("must be an integer", value)
    return value


def _seconds(value: object) -> object:
    if value is None:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise _bad("must be a non-negative number of seconds", value)
    return float(value)


def _timeout(value: object) -> object:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _bad("must be a positive number of seconds", value)
    return float(value)


def _drain_timeout(value: object) -> object:
    seconds = _timeout(value)
    assert isinstance(seconds, float)
    if seconds > 3600:
        raise _bad("must be at most 3600 seconds (the router's drain limit)", value)
    return seconds


def _boolean(value: object) -> object:
    if not isinstance(value, bool):
        raise _bad("must be true or false", value)
    return value


def _text(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _bad("must be a non-empty string", value)
    return value


def _health(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/"):
        raise _bad('must be an HTTP path starting with "/"', value)
    return value


def _url(value: object) -> object:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise _bad("must be an http:// or https:// URL", value)
    return value


def _up(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad("must be a command line string", value)
    try:
        argv = shlex.split(value)
    except ValueError as exc:
        raise _bad(f"cannot be split into arguments ({exc})", value) from None
    if not argv:
        raise _bad("must not be empty", value)
    return value


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _up_env(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad('must be a table of environment variables (NAME = "value")', value)
    for name, text in value.items():
        if not _ENV_NAME.fullmatch(name):
            raise _bad(f"{_show(name)} is not a valid environment variable name", name)
        if not isinstance(text, str):
            raise _bad(f"{name}: the value must be a string", text)
        if "\0" in text:
            raise _bad(f"{name}: the value must not hold a NUL character", text)
    return value


def _string_list(value: object) -> object:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _bad("must be a list of non-empty strings", value)
    return value


def _two_roles(value: object) -> object:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, str) and v for v in value)
        or value[0] == value[1]
    ):
        raise _bad("must list exactly two distinct gpu role ids", value)
    return value


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=NEAR_MISS_CUTOFF)
    return f'; did you mean "{close[0]}"?' if close else ""


def normalize_residency(value: str) -> Residency:
    """``"ON_DEMAND"``, ``"On-Demand"`` → :attr:`Residency.ON_DEMAND`; raises ValueError."""
    return Residency(value.strip().lower().replace("_", "-"))


def _residency(value: object) -> object:
    if value is None or isinstance(value, Residency):
        return value
    choices = [r.value for r in Residency]
    if not isinstance(value, str):
        raise _bad(f"must be one of {', '.join(choices)}", value)
    try:
        return normalize_residency(value)
    except ValueError:
        hint = _did_you_mean(value.strip().lower().replace("_", "-"), choices)
        raise _bad(
            f"unknown residency (expected one of {', '.join(choices)}{hint})", value
        ) from None


def _desired(value: object) -> object:
    if value is None or isinstance(value, DesiredRun):
        return value
    if isinstance(value, str) and value in {d.value for d in DesiredRun}:
        return DesiredRun(value)
    raise _bad('must be "running" or "stopped"', value)


def _operating_mode(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _bad("must be a non-empty string", value)
    mode = value.strip().lower().replace("_", "-")
    if mode != DUAL_GPU_EXCLUSIVE and difflib.get_close_matches(
        mode, [DUAL_GPU_EXCLUSIVE], n=1, cutoff=NEAR_MISS_CUTOFF
    ):
        raise _bad(f'unknown operating mode; did you mean "{DUAL_GPU_EXCLUSIVE}"?', value)
    return mode


def _case_insensitive_pattern(words: Sequence[str]) -> str:
    """An ECMA-262 regex accepting ``words`` in any case with ``_`` for ``-``."""

    def char(c: str) -> str:
        if c in "-_":
            return "[-_]"
        if c.isalpha():
            return f"[{c.lower()}{c.upper()}]"
        return re.escape(c)

    return "^(?:" + "|".join("".join(char(c) for c in w) for w in words) + ")$"


# Constrained types: the validator gives our message, WithJsonSchema the editor's view.
PositiveMiB = Annotated[
    int, BeforeValidator(_positive_mib), WithJsonSchema({"type": "integer", "minimum": 1})
]
SegmentMiB = Annotated[
    int,
    BeforeValidator(_segment_mib),
    WithJsonSchema({"type": "integer", "minimum": MIN_SEGMENT_MIB}),
]
OptPositiveMiB = Annotated[
    int | None, BeforeValidator(_positive_mib), WithJsonSchema({"type": "integer", "minimum": 1})
]
NonNegativeMiB = Annotated[
    int, BeforeValidator(_nonnegative_mib), WithJsonSchema({"type": "integer", "minimum": 0})
]
OptPort = Annotated[
    int | None,
    BeforeValidator(_port),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 65535}),
]
OptPositiveInt = Annotated[
    int | None, BeforeValidator(_positive_int), WithJsonSchema({"type": "integer", "minimum": 1})
]
Integer = Annotated[int, BeforeValidator(_integer), WithJsonSchema({"type": "integer"})]
Seconds = Annotated[
    float, BeforeValidator(_seconds), WithJsonSchema({"type": "number", "minimum": 0})
]
OptSeconds = Annotated[
    float | None, BeforeValidator(_seconds), WithJsonSchema({"type": "number", "minimum": 0})
]
Timeout = Annotated[
    float, BeforeValidator(_timeout), WithJsonSchema({"type": "number", "exclusiveMinimum": 0})
]
DrainTimeout = Annotated[
    float,
    BeforeValidator(_drain_timeout),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 3600}),
]
Boolean = Annotated[bool, BeforeValidator(_boolean), WithJsonSchema({"type": "boolean"})]
Text = Annotated[str, BeforeValidator(_text), WithJsonSchema({"type": "string", "minLength": 1})]
OptText = Annotated[
    str | None, BeforeValidator(_text), WithJsonSchema({"type": "string", "minLength": 1})
]
OptHealth = Annotated[
    str | None, BeforeValidator(_health), WithJsonSchema({"type": "string", "pattern": "^/"})
]
Url = Annotated[
    str, BeforeValidator(_url), WithJsonSchema({"type": "string", "pattern": "^https?://"})
]
OptUp = Annotated[
    str | None, BeforeValidator(_up), WithJsonSchema({"type": "string", "minLength": 1})
]
OptUpEnv = Annotated[
    dict[str, str] | None,
    BeforeValidator(_up_env),
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
            "additionalProperties": {"type": "string"},
        }
    ),
]
StringList = Annotated[
    list[str],
    BeforeValidator(_string_list),
    WithJsonSchema({"type": "array", "items": {"type": "string", "minLength": 1}}),
]
OptTwoRoles = Annotated[
    list[str] | None,
    BeforeValidator(_two_roles),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 2,
            "maxItems": 2,
            "uniqueItems": True,
        }
    ),
]
OptResidency = Annotated[
    Residency | None,
    BeforeValidator(_residency),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": _case_insensitive_pattern([r.value for r in Residency]),
            "examples": [r.value for r in Residency],
        }
    ),
]
OptDesired = Annotated[
    DesiredRun | None,
    BeforeValidator(_desired),
    WithJsonSchema({"type": "string", "enum": [d.value for d in DesiredRun]}),
]
OptOperatingMode = Annotated[
    str | None,
    BeforeValidator(_operating_mode),
    WithJsonSchema({"type": "string", "minLength": 1, "examples": [DUAL_GPU_EXCLUSIVE]}),
]


# ── models ─────────────────────────────────────────────────────────────────────


class GpuRoleModel(BaseModel):
    """A [[gpu_roles]] row: one GPU with a capacity and a never-reservable reserve."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: Text = Field(description="The role's id, named by serves' gpu_role / gpu_roles.")
    vram_mib: PositiveMiB = Field(description="The GPU's capacity in MiB.")
    reserve_mib: NonNegativeMiB = Field(
        default=0, description="MiB never reservable (driver/OS overhead); at most vram_mib."
    )
    uuid: OptText = Field(default=None, description="NVML device UUID this role runs on.")

    @property
    def budget_mib(self) -> int:
        """What may be reserved: ``vram_mib - reserve_mib``."""
        return self.vram_mib - self.reserve_mib

    def to_role(self) -> GpuRole:
        """The core's :class:`GpuRole`."""
        return GpuRole(
            id=self.id, capacity_mib=self.vram_mib, reserve_mib=self.reserve_mib, uuid=self.uuid
        )


class ElasticModel(BaseModel):
    """An elastic serve's VRAM endpoint: it can shrink down to floor_mib."""

    model_config = ConfigDict(extra="allow", frozen=True)

    url: Url = Field(description="Base URL of the engine; POST {url}/v1/vram resizes it.")
    floor_mib: PositiveMiB = Field(description="The least the serve can hold; at most vram_mib.")
    token_env: OptText = Field(
        default=None, description="Environment variable holding the endpoint's bearer token."
    )
    segment_mib: SegmentMiB = Field(
        default=512,
        description="The engine's expert-cache segment (its vram_segment_mib): memory is "
        "given back and taken again in whole segments.",
    )

    def to_elastic(self) -> Elastic:
        """The core's :class:`Elastic`."""
        return Elastic(
            url=self.url,
            floor_mib=self.floor_mib,
            token_env=self.token_env,
            segment_mib=self.segment_mib,
        )


class ServeModel(BaseModel):
    """A [[serve]] table: one model container and its VRAM reservation.

    Each field is validated on its own here; rules across fields (gpu_role with
    gpu_roles, dual-gpu-exclusive, elastic floor) and across serves (names, ports,
    mirrors) are checked by the loader, which locates them.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: Text = Field(description="The serve's name (what `vramctl up NAME` takes).")
    container: Text = Field(description="The Docker container name; serves de-duplicate by it.")
    runtime: OptText = None
    stack: OptText = None
    port: OptPort = Field(
        default=None, description="Host port; serves sharing one cannot both run."
    )
    model: OptText = None
    served_name: OptText = None
    engine: OptText = None
    health: OptHealth = Field(default=None, description="HTTP health path on 127.0.0.1:{port}.")
    gpu_role: OptText = Field(default=None, description="The one gpu role this serve uses.")
    gpu_roles: OptTwoRoles = Field(
        default=None, description="Two gpu roles (tensor parallel); not with gpu_role."
    )
    vram_mib: OptPositiveMiB = Field(
        default=None, description="MiB reserved on each of the serve's gpu roles."
    )
    residency: OptResidency = Field(
        default=None,
        description="resident | evictable | on-demand (case-insensitive, _ for -).",
    )
    operating_mode: OptOperatingMode = Field(
        default=None,
        description='"dual-gpu-exclusive": excludes every other GPU serve from both roles.',
    )
    tensor_parallel_size: OptPositiveInt = None
    router_tier: OptText = Field(default=None, description="Router tier drained before a stop.")
    groups: StringList = Field(default_factory=list)
    up: OptUp = Field(
        default=None,
        description="Start command, shlex-split ({dir} = the manifest's folder), never a shell.",
    )
    up_env: OptUpEnv = Field(
        default=None,
        description="Extra environment variables for `up` (it gets only PATH, HOME, locale, "
        "Docker's and Compose's own variables otherwise).",
    )
    gpu_inference: Boolean = Field(
        default=True, description="false: not excluded by dual-gpu-exclusive serves."
    )
    desired: OptDesired = Field(
        default=None, description="running | stopped; absent = unmanaged (never started/stopped)."
    )
    priority: Integer = Field(default=0, description="Lower is evicted first among equals.")
    min_runtime_s: Seconds = Field(default=0.0, description="Not evicted within this of starting.")
    start_timeout_s: Timeout = 600.0
    stop_timeout_s: Timeout = 30.0
    drain_timeout_s: DrainTimeout = 120.0
    idle_ttl_s: OptSeconds = None
    elastic: ElasticModel | None = None

    @property
    def roles(self) -> tuple[str, ...]:
        """The gpu roles the serve names (from gpu_role or gpu_roles), maybe empty."""
        if self.gpu_roles is not None:
            return tuple(self.gpu_roles)
        if self.gpu_role is not None:
            return (self.gpu_role,)
        return ()

    @property
    def exclusive(self) -> bool:
        """True for ``operating_mode = "dual-gpu-exclusive"``."""
        return self.operating_mode == DUAL_GPU_EXCLUSIVE

    def up_argv(self, manifest_dir: str | Path) -> list[str] | None:
        """The ``up`` command as argv, ``{dir}`` → ``manifest_dir`` made absolute.

        The command is shlex-split first and ``{dir}`` substituted in each word after,
        so a folder with spaces stays one argument. Never meant for a shell.
        """
        if self.up is None:
            return None
        folder = str(Path(manifest_dir).resolve())
        return [word.replace("{dir}", folder) for word in shlex.split(self.up)]

    def to_spec(self) -> ServeSpec:
        """The core's :class:`ServeSpec`."""
        return ServeSpec(
            name=self.name,
            container=self.container,
            gpu_roles=self.roles,
            vram_mib=self.vram_mib,
            residency=self.residency,
            desired=self.desired,
            port=self.port,
            exclusive=self.exclusive,
            gpu_inference=self.gpu_inference,
            priority=self.priority,
            min_runtime_s=self.min_runtime_s,
            router_tier=self.router_tier,
            elastic=None if self.elastic is None else self.elastic.to_elastic(),
            groups=tuple(self.groups),
            idle_ttl_s=self.idle_ttl_s,
            sizes_from_free=(self.engine or "").strip().lower() in SIZES_FROM_FREE_ENGINES,
        )


#: engines that size their memory pool from the device's free memory when they load:
#: their starts are serialised per GPU (two at once would each count the other's room)
SIZES_FROM_FREE_ENGINES: frozenset[str] = frozenset({"vllm", "sglang"})


class ManifestFile(BaseModel):
    """A vramctl manifest file: [[gpu_roles]] capacity rows and [[serve]] tables.

    Other top-level tables (the real stack's [[promotion]], ...) are allowed and ignored.
    """

    model_config = ConfigDict(extra="allow", title="vramctl manifest")

    gpu_roles: list[GpuRoleModel] = Field(default_factory=list)
    serve: list[ServeModel] = Field(default_factory=list)


# ── one file ───────────────────────────────────────────────────────────────────


_M = TypeVar("_M", GpuRoleModel, ServeModel)


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry(Generic[_M]):
    """One valid table entry of one file, with where it came from."""

    display: str
    path: Path
    index: int
    name: str
    model: _M

    def error(self, table: str, field: str | None, message: str) -> LocatedError:
        return LocatedError(self.display, self.name, field, message, table, self.index)

    @property
    def label(self) -> str:
        table = "gpu_roles" if isinstance(self.model, GpuRoleModel) else "serve"
        return f"{self.display} {table} {_show(self.name)} (#{self.index})"


@dataclasses.dataclass(slots=True)
class _FileResult:
    path: Path
    display: str
    data: bytes = b""
    roles: list[_Entry[GpuRoleModel]] = dataclasses.field(default_factory=list)
    serves: list[_Entry[ServeModel]] = dataclasses.field(default_factory=list)
    errors: list[LocatedError] = dataclasses.field(default_factory=list)
    warnings: list[LocatedError] = dataclasses.field(default_factory=list)


def _field_of(loc: tuple[int | str, ...]) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or None


def _pydantic_message(err: Mapping[str, Any]) -> str:
    kind = err.get("type")
    if kind == "vramctl":
        return str(err["msg"])
    if kind == "missing":
        return "is required but missing"
    msg = str(err.get("msg", "is invalid"))
    if msg.startswith("Input should be "):
        msg = "must be " + msg[len("Input should be ") :]
    return f"{msg}, got {_show(err.get('input'))}"


def _validate_entry(
    model: type[BaseModel],
    raw: object,
    *,
    display: str,
    table: str,
    index: int,
    name_key: str,
    errors: list[LocatedError],
) -> tuple[str | None, BaseModel | None, frozenset[str]]:
    """Validate one table entry; returns (its name, the model or None, bad fields).

    When some fields are invalid the others are validated again without them (required
    text fields get a placeholder), so cross-field rules still run on what is valid.
    """
    if not isinstance(raw, dict):
        errors.append(
            LocatedError(display, None, None, f"must be a table, got {_show(raw)}", table, index)
        )
        return None, None, frozenset()
    name_raw = raw.get(name_key)
    name = name_raw if isinstance(name_raw, str) and name_raw else None

    known = list(model.model_fields)
    for key in raw:
        if key not in model.model_fields:
            hint = _did_you_mean(key, known)
            if hint:
                errors.append(LocatedError(display, name, key, f"unknown key{hint}", table, index))
    if isinstance(raw.get("elastic"), dict) and model is ServeModel:
        for key in raw["elastic"]:
            if key not in ElasticModel.model_fields:
                hint = _did_you_mean(key, list(ElasticModel.model_fields))
                if hint:
                    errors.append(
                        LocatedError(
                            display, name, f"elastic.{key}", f"unknown key{hint}", table, index
                        )
                    )
    try:
        return name, model.model_validate(raw), frozenset()
    except ValidationError as exc:
        bad: set[str] = set()
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            if loc:
                bad.add(str(loc[0]))
            errors.append(
                LocatedError(display, name, _field_of(loc), _pydantic_message(err), table, index)
            )
    partial = {k: v for k, v in raw.items() if k not in bad}
    for required, info in model.model_fields.items():
        if info.is_required() and required not in partial:
            partial[required] = "?" if required != "vram_mib" else 1
    try:
        return name, model.model_validate(partial), frozenset(bad)
    except ValidationError:  # pragma: no cover - the partial entry should validate
        return name, None, frozenset(bad)


def _check_role(model: GpuRoleModel, bad: frozenset[str]) -> list[tuple[str, str]]:
    if {"vram_mib", "reserve_mib"} & bad:
        return []
    if model.reserve_mib > model.vram_mib:
        return [
            (
                "reserve_mib",
                f"must not exceed vram_mib ({model.vram_mib}), got {model.reserve_mib}",
            )
        ]
    return []


def _check_serve(
    model: ServeModel, bad: frozenset[str]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Rules across one serve's fields: (errors, warnings) as (field, message)."""
    errors: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    if model.gpu_role is not None and model.gpu_roles is not None:
        errors.append(("gpu_roles", "cannot be combined with gpu_role; declare one of them"))
    if model.exclusive:
        tp = model.tensor_parallel_size
        if "tensor_parallel_size" not in bad and tp != 2:
            got = "but it is missing" if tp is None else f"got {tp}"
            errors.append(
                (
                    "tensor_parallel_size",
                    f'operating_mode "{DUAL_GPU_EXCLUSIVE}" needs tensor_parallel_size = 2, ' + got,
                )
            )
        if "gpu_roles" not in bad and model.gpu_roles is None:
            errors.append(
                (
                    "gpu_roles",
                    f'operating_mode "{DUAL_GPU_EXCLUSIVE}" needs gpu_roles = [two roles]',
                )
            )
    if model.elastic is not None and "vram_mib" not in bad:
        if model.vram_mib is None:
            errors.append(("elastic", "needs the serve's vram_mib (the most it can grow to)"))
        elif model.elastic.floor_mib > model.vram_mib:
            errors.append(
                (
                    "elastic.floor_mib",
                    f"must not exceed vram_mib ({model.vram_mib}), got {model.elastic.floor_mib}",
                )
            )
    if not bad & {"vram_mib", "gpu_role", "gpu_roles"}:
        if model.vram_mib is not None and not model.roles:
            warnings.append(
                (
                    "vram_mib",
                    "declared without gpu_role/gpu_roles; the serve takes no part in the ledger",
                )
            )
        elif model.vram_mib is None and model.roles and model.gpu_inference is not False:
            field = "gpu_roles" if model.gpu_roles is not None else "gpu_role"
            warnings.append(
                (field, "declared without vram_mib; the serve takes no part in the ledger")
            )
    return errors, warnings


def _table_list(
    data: Mapping[str, Any], key: str, display: str, errors: list[LocatedError]
) -> list[object]:
    value = data.get(key, [])
    if isinstance(value, list):
        return value
    errors.append(
        LocatedError(
            display, None, key, f"must be an array of tables ([[{key}]]), got {_show(value)}", None
        )
    )
    return []


def _read_file(path: Path) -> _FileResult:
    display = str(path)
    result = _FileResult(path=path, display=display)
    errors = result.errors

    def file_error(message: str, line: int | None = None, column: int | None = None) -> None:
        errors.append(LocatedError(display, None, None, message, None, None, line, column))

    try:
        result.data = path.read_bytes()
    except FileNotFoundError:
        file_error("cannot read the manifest: no such file")
        return result
    except OSError as exc:
        file_error(f"cannot read the manifest: {exc.strerror or exc}")
        return result
    try:
        text = result.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        file_error(f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        return result
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOML_POSITION.search(message)
        if match:
            file_error(
                f"TOML syntax error: {message[: match.start()]}",
                int(match.group(1)),
                int(match.group(2)),
            )
        else:
            file_error(f"TOML syntax error: {message}")
        return result

    for key in data:
        if key not in TOP_LEVEL_KEYS:
            hint = _did_you_mean(key, TOP_LEVEL_KEYS)
            if hint:
                errors.append(LocatedError(display, None, key, f"unknown table{hint}", None))

    role_ids: dict[str, _Entry[GpuRoleModel]] = {}
    for index, raw in enumerate(_table_list(data, "gpu_roles", display, errors), start=1):
        name, model, bad = _validate_entry(
            GpuRoleModel,
            raw,
            display=display,
            table="gpu_roles",
            index=index,
            name_key="id",
            errors=errors,
        )
        if not isinstance(model, GpuRoleModel):
            continue
        for field, message in _check_role(model, bad):
            errors.append(LocatedError(display, name, field, message, "gpu_roles", index))
        if bad or name is None:
            continue
        role_entry = _Entry(display, path, index, name, model)
        first_role = role_ids.get(name)
        if first_role is not None:
            errors.append(
                role_entry.error(
                    "gpu_roles",
                    "id",
                    f"duplicate role id; first declared as gpu_roles #{first_role.index} "
                    "in this file",
                )
            )
            continue
        role_ids[name] = role_entry
        result.roles.append(role_entry)

    names: dict[str, _Entry[ServeModel]] = {}
    containers: dict[str, _Entry[ServeModel]] = {}
    for index, raw in enumerate(_table_list(data, "serve", display, errors), start=1):
        name, model, bad = _validate_entry(
            ServeModel,
            raw,
            display=display,
            table="serve",
            index=index,
            name_key="name",
            errors=errors,
        )
        if not isinstance(model, ServeModel):
            continue
        cross_errors, cross_warnings = _check_serve(model, bad)
        for field, message in cross_errors:
            errors.append(LocatedError(display, name, field, message, "serve", index))
        for field, message in cross_warnings:
            result.warnings.append(LocatedError(display, name, field, message, "serve", index))
        if bad or name is None:
            continue
        entry = _Entry(display, path, index, name, model)
        first = names.get(name)
        if first is not None:
            errors.append(
                entry.error(
                    "serve",
                    "name",
                    f"duplicate serve name; first declared as serve #{first.index} in this file",
                )
            )
            continue
        first = containers.get(model.container)
        if first is not None:
            errors.append(
                entry.error(
                    "serve",
                    "container",
                    f"{_show(model.container)} is already declared by serve "
                    f"{_show(first.name)} (#{first.index}) in this file",
                )
            )
            continue
        names[name] = entry
        containers[model.container] = entry
        result.serves.append(entry)
    return result


# ── the set ────────────────────────────────────────────────────────────────────


@dataclasses.dataclass(frozen=True)
class ManifestSet:
    """One or more manifest files merged: roles by id, serves by name (declaration order).

    A serve declared in several files (same container) appears once: the entry with
    ``up`` (the owner) wins over read-only mirrors. ``warnings`` are things that load
    but deserve a look (a serve on a role without a capacity row takes no part in the
    ledger). ``digest`` changes whenever any file's bytes change.
    """

    files: tuple[Path, ...]
    roles: dict[str, GpuRoleModel]
    serves: dict[str, ServeModel]
    warnings: list[str]
    digest: str
    _sources: dict[str, tuple[Path, ...]] = dataclasses.field(repr=False)
    _role_sources: dict[str, tuple[Path, ...]] = dataclasses.field(repr=False)

    def source(self, name: str) -> Path:
        """The file that defines serve ``name`` (its owner's, else its first mirror's)."""
        return self._sources[name][0]

    def sources(self, name: str) -> tuple[Path, ...]:
        """Every file that declares serve ``name``, the defining one first."""
        return self._sources[name]

    def role_sources(self, role_id: str) -> tuple[Path, ...]:
        """Every file that declares gpu role ``role_id``, in load order."""
        return self._role_sources[role_id]

    def up_argv(self, name: str) -> list[str] | None:
        """Serve ``name``'s ``up`` argv with ``{dir}`` = its defining file's folder."""
        return self.serves[name].up_argv(self.source(name).resolve().parent)

    def desired(self) -> DesiredState:
        """The pure core's :class:`DesiredState` for this set (built once; it is immutable)."""
        return self._desired

    @functools.cached_property
    def _desired(self) -> DesiredState:
        return DesiredState(
            roles={rid: role.to_role() for rid, role in self.roles.items()},
            serves={name: serve.to_spec() for name, serve in self.serves.items()},
        )


def _reservation(model: ServeModel) -> dict[str, object]:
    """The fields a mirror must agree on with its owner."""
    return {
        "name": model.name,
        "gpu_role(s)": list(model.roles),
        "vram_mib": model.vram_mib,
        "residency": None if model.residency is None else model.residency.value,
        "operating_mode": DUAL_GPU_EXCLUSIVE if model.exclusive else None,
    }


def _merge_roles(
    files: Sequence[_FileResult], errors: list[LocatedError]
) -> tuple[dict[str, GpuRoleModel], dict[str, tuple[Path, ...]]]:
    merged: dict[str, GpuRoleModel] = {}
    firsts: dict[str, _Entry[GpuRoleModel]] = {}
    sources: dict[str, tuple[Path, ...]] = {}
    for result in files:
        for entry in result.roles:
            role = entry.model
            first = firsts.get(entry.name)
            if first is None:
                firsts[entry.name] = entry
                merged[entry.name] = role
                sources[entry.name] = (entry.path,)
                continue
            sources[entry.name] += (entry.path,)
            have = merged[entry.name]
            conflict = False
            for field in ("vram_mib", "reserve_mib"):
                here, there = getattr(role, field), getattr(have, field)
                if here != there:
                    conflict = True
                    errors.append(
                        entry.error(
                            "gpu_roles",
                            field,
                            f"conflicting capacity: {here} here, {there} in {first.label}",
                        )
                    )
            if role.uuid is not None and have.uuid is not None and role.uuid != have.uuid:
                conflict = True
                errors.append(
                    entry.error(
                        "gpu_roles",
                        "uuid",
                        f"conflicting device: {_show(role.uuid)} here, {_show(have.uuid)} "
                        f"in {first.label}",
                    )
                )
            if not conflict and have.uuid is None and role.uuid is not None:
                merged[entry.name] = have.model_copy(update={"uuid": role.uuid})
    return merged, sources


def _merge_serves(
    files: Sequence[_FileResult], errors: list[LocatedError], warnings: list[LocatedError]
) -> tuple[list[_Entry[ServeModel]], dict[str, tuple[Path, ...]]]:
    groups: dict[str, list[_Entry[ServeModel]]] = {}
    for result in files:
        for entry in result.serves:
            groups.setdefault(entry.model.container, []).append(entry)

    chosen: list[_Entry[ServeModel]] = []
    sources: dict[str, tuple[Path, ...]] = {}
    for container, group in groups.items():
        owners = [e for e in group if e.model.up is not None]
        winner = owners[0] if owners else group[0]
        ok = True
        for other in owners[1:]:
            ok = False
            errors.append(
                other.error(
                    "serve",
                    "up",
                    f"container {_show(container)} is already owned (has up) by "
                    f"{winner.label}; only one entry may own a container, the others must be "
                    f"read-only mirrors without up",
                )
            )
        want = _reservation(winner.model)
        for other in group:
            if other is winner or other.model.up is not None:
                continue
            have = _reservation(other.model)
            for field, value in have.items():
                if value != want[field]:
                    ok = False
                    errors.append(
                        other.error(
                            "serve",
                            field,
                            f"mirror of container {_show(container)} disagrees with "
                            f"{winner.label}: {_show(value)} here, {_show(want[field])} there",
                        )
                    )
            if other.model.desired is not None and other.model.desired != winner.model.desired:
                warnings.append(
                    other.error(
                        "serve",
                        "desired",
                        f"ignored on a mirror; {winner.label} decides "
                        f"({_show(winner.model.desired)})",
                    )
                )
        if ok:
            chosen.append(winner)
            others = tuple(e.path for e in group if e is not winner)
            sources[winner.name] = (winner.path, *others)

    by_name: dict[str, _Entry[ServeModel]] = {}
    unique: list[_Entry[ServeModel]] = []
    for entry in chosen:
        first = by_name.get(entry.name)
        if first is not None:
            errors.append(
                entry.error(
                    "serve",
                    "name",
                    f"serve name already used by {first.label} for container "
                    f"{_show(first.model.container)}; this one is container "
                    f"{_show(entry.model.container)}",
                )
            )
            continue
        by_name[entry.name] = entry
        unique.append(entry)

    ports: dict[int, _Entry[ServeModel]] = {}
    for entry in unique:
        model = entry.model
        if model.desired is not DesiredRun.RUNNING or model.port is None:
            continue
        first = ports.get(model.port)
        if first is not None:
            errors.append(
                entry.error(
                    "serve",
                    "port",
                    f"port {model.port} is also used by {first.label}, and both are "
                    f'desired "running"; serves that share a port cannot run at once',
                )
            )
            continue
        ports[model.port] = entry
    return unique, sources


def load_manifest_set(paths: Sequence[str | Path]) -> ManifestSet:
    """Load and merge manifest files into one :class:`ManifestSet`.

    Raises :class:`ManifestError` with every located problem of every file.
    """
    errors: list[LocatedError] = []
    warnings: list[LocatedError] = []
    results: list[_FileResult] = []
    seen: dict[Path, str] = {}
    if not paths:
        raise ManifestError([LocatedError("(no manifest)", None, None, "no manifest file given")])
    for raw_path in paths:
        path = Path(raw_path)
        key = path.resolve()
        if key in seen:
            warnings.append(
                LocatedError(
                    str(path), None, None, f"given twice (as {seen[key]}); loaded once", None
                )
            )
            continue
        seen[key] = str(path)
        result = _read_file(path)
        results.append(result)
        errors.extend(result.errors)
        warnings.extend(result.warnings)

    roles, role_sources = _merge_roles(results, errors)
    entries, sources = _merge_serves(results, errors, warnings)

    for entry in entries:
        model = entry.model
        missing = [r for r in model.roles if r not in roles]
        field = "gpu_roles" if model.gpu_roles is not None else "gpu_role"
        near = {r: difflib.get_close_matches(r, list(roles), n=1, cutoff=0.6) for r in missing}
        if any(near.values()):
            # a typo would drop the reservation from the ledger without a word: an error
            for r, close in near.items():
                if close:
                    errors.append(
                        entry.error(
                            "serve",
                            field,
                            f"no [[gpu_roles]] row {_show(r)} in this manifest set; "
                            f'did you mean "{close[0]}"?',
                        )
                    )
            continue
        if model.vram_mib is not None:
            for r in model.roles:
                role = roles.get(r)
                if role is not None and model.vram_mib > role.budget_mib:
                    errors.append(
                        entry.error(
                            "serve",
                            "vram_mib",
                            f"{model.vram_mib} MiB can never fit role {_show(r)}: its budget is "
                            f"{role.vram_mib} - {role.reserve_mib} = {role.budget_mib} MiB",
                        )
                    )
        if missing and model.vram_mib is not None:
            field = "gpu_roles" if model.gpu_roles is not None else "gpu_role"
            names = ", ".join(_show(r) for r in missing)
            warnings.append(
                entry.error(
                    "serve",
                    field,
                    f"no [[gpu_roles]] capacity row for {names} in this manifest set; "
                    f"the serve takes no part in the ledger",
                )
            )

    warning_lines = [str(w) for w in warnings]
    if errors:
        raise ManifestError(errors, warning_lines)

    digest = hashlib.sha256()
    for result in results:
        digest.update(len(result.data).to_bytes(8, "big"))
        digest.update(result.data)
    return ManifestSet(
        files=tuple(r.path for r in results),
        roles=roles,
        serves={e.name: e.model for e in entries},
        warnings=warning_lines,
        digest=digest.hexdigest(),
        _sources=sources,
        _role_sources=role_sources,
    )


def load_manifest(path: str | Path) -> ManifestSet:
    """Load one manifest file: a set of one."""
    return load_manifest_set([path])
