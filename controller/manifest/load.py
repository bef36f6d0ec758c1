"""Manifest loading: TOML files → validated pydantic models → the core's DesiredState.

A manifest is one or more TOML files (docs/design.md §4). This module reads them with
:mod:`tomllib`, validates every ``[[gpu_roles]]`` and ``[[serve]]`` table with the
pydantic models below, merges several files into one :class:`ManifestSet` (serves
de-duplicated by container, roles by id), and converts the set into
:class:`statemachine.domain.types.DesiredState` for the pure core.

Errors are *located* and *collected*: every problem of every file is reported at once
as a :class:`LocatedError` (file, serve or role, field, message) inside one
:class:`ManifestError`, never as a traceback. A key that is a near-miss of a known field
(``vram_mb``) is an error with a "did you mean", because a typo would silently drop a
reservation; any other key this version does not know is kept and named in a warning
(an error when ``strict``), except the real stack's informational keys
(:data:`controller.manifest.fields.INFORMATIONAL_SERVE_KEYS`, ...). Set rules refuse
what could never be carried out or would drop everything: an empty file, a set that
declares no serve and no role (unless ``allow_empty = true``), residents desired running
over a role's budget.

How it is laid out: a file is read in steps (:func:`_file_text`, :func:`_toml_data`),
and both arrays of tables go through one reader, :func:`_read_table`, driven by a
:class:`_Table` row each (``_ROLES``, ``_SERVES``: model, name key, checks, the keys
that must be unique in a file, held by :class:`_FirstHolders`). The set is merged
(:func:`_merge_roles`, :func:`_merge_host`, :func:`_merge_serves` with its owner and
mirror rules) and checked against its roles and host (:func:`_check_fits`).

This module only reads the manifest files. It must not touch docker, NVML or the
network, must not run the ``up`` commands (it only splits them into argv, never
through a shell), and must not write anything.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import os
import re
import stat
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from pydantic import (
    BaseModel,
    ValidationError,
)

from controller.manifest.errors import (
    _TOML_POSITION,
    LocatedError,
    ManifestError,
    _did_you_mean,
    _show,
)
from controller.manifest.fields import (
    ALLOW_EMPTY,
    DUAL_GPU_EXCLUSIVE,
    INFORMATIONAL_SERVE_KEYS,
    INFORMATIONAL_TOP_LEVEL_KEYS,
    MAX_KEY_PARTS,
    MAX_MANIFEST_BYTES,
    MAX_NESTING,
    TOP_LEVEL_KEYS,
    compose_project_problem,
    sleep_protocols,
)
from controller.manifest.models import (
    MODEL_NAME,
    MODEL_TABLE,
    ElasticModel,
    GpuRoleModel,
    HostModel,
    ModelModel,
    ServeModel,
    SleepModel,
)
from controller.manifest.runtime import ServeRuntime
from statemachine import engines
from statemachine.domain.types import DesiredRun, DesiredState, Residency

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
    #: keys this version does not know (warnings; errors under ``strict``)
    unknown: list[LocatedError] = dataclasses.field(default_factory=list)
    host: HostModel | None = None
    #: the file says ``allow_empty = true``
    allow_empty: bool = False


def _field_of(loc: tuple[int | str, ...]) -> str | None:
    out = ""
    for part in loc:
        if part in (MODEL_TABLE, MODEL_NAME):
            continue  # which form of ``model`` was read, not a field
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


#: What a key this version does not know reads as: a warning, or under ``strict`` an error.
IGNORED_KEY = "unknown key, ignored (this version does not know it)"
REFUSED_KEY = "unknown key (this version does not know it; refused by --strict)"


def _sort_unknown(
    raw: Mapping[str, object],
    known: Collection[str],
    prefix: str,
    located: Callable[[str, str], LocatedError],
    found: tuple[list[LocatedError], list[LocatedError]],
    *,
    informational: Collection[str] = (),
    what: str = "key",
) -> None:
    """Each key of ``raw`` that is not ``known`` (nor ``informational``): a near miss of
    a known one to ``found[0]`` (an error, "did you mean": a typo such as ``vram_mb``
    would silently drop a reservation), any other to ``found[1]`` (reported as ignored).
    ``located(field, message)`` places it; ``prefix`` is the field's path (``sleep.``)."""
    errors, unknown = found
    for key in raw:
        if key in known or key in informational:
            continue
        hint = _did_you_mean(key, list(known))
        if hint:
            errors.append(located(f"{prefix}{key}", f"unknown {what}{hint}"))
        else:
            unknown.append(located(f"{prefix}{key}", IGNORED_KEY))


def _validate_entry(
    model: type[BaseModel],
    raw: object,
    *,
    display: str,
    table: str,
    index: int,
    name_key: str,
    errors: list[LocatedError],
    unknown: list[LocatedError],
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

    def located(field: str, message: str) -> LocatedError:
        return LocatedError(display, name, field, message, table, index)

    informational = INFORMATIONAL_SERVE_KEYS if model is ServeModel else ()
    found = (errors, unknown)
    _sort_unknown(raw, model.model_fields, "", located, found, informational=informational)
    for sub, sub_model in (("elastic", ElasticModel), ("sleep", SleepModel), ("model", ModelModel)):
        sub_raw = raw.get(sub)
        if isinstance(sub_raw, dict) and model is ServeModel:
            _sort_unknown(sub_raw, sub_model.model_fields, f"{sub}.", located, found)
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
    default = model.reserve_default_mib
    if "reserve_default_mib" not in bad and default is not None and default > model.vram_mib:
        return [
            (
                "reserve_default_mib",
                f"must not exceed vram_mib ({model.vram_mib}), got {default}",
            )
        ]
    return []


def _role_warnings(model: GpuRoleModel, bad: frozenset[str]) -> list[tuple[str, str]]:
    """A reserve lowered (or waived) below its recorded default needs a rationale."""
    default = model.reserve_default_mib
    if {"reserve_mib", "reserve_default_mib", "reserve_rationale"} & bad or default is None:
        return []
    if model.reserve_mib < default and model.reserve_rationale is None:
        return [
            (
                "reserve_mib",
                f"{model.reserve_mib} MiB is below reserve_default_mib ({default}) and no "
                "reserve_rationale records why (the waiver's scope and reason)",
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
    if model.placement is not None:
        errors += _check_placement(model, bad)
    if model.exclusive and model.placement is None:
        errors += _check_exclusive(model, bad)
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
    if not bad & {"up", "up_env", "compose_project"}:
        errors += _check_project(model)
    if "model" not in bad and "engine" not in bad:
        errors += _check_kv_dtype(model)
    if model.sleep is not None and "sleep" not in bad:
        sleep_errors, sleep_warnings = _check_sleep(model, model.sleep, bad)
        errors += sleep_errors
        warnings += sleep_warnings
    if not bad & {"vram_mib", "gpu_role", "gpu_roles", "placement"}:
        if model.vram_mib is not None and not model.roles:
            warnings.append(
                (
                    "vram_mib",
                    "declared without gpu_role/gpu_roles; the serve takes no part in the ledger",
                )
            )
        elif (
            model.vram_mib is None
            and model.roles
            and model.placement is None  # an error: _check_placement
            and model.gpu_inference is not False
        ):
            warnings.append(
                (
                    model.roles_field,
                    "declared without vram_mib; the serve takes no part in the ledger",
                )
            )
    return errors, warnings


def _check_kv_dtype(model: ServeModel) -> list[tuple[str, str]]:
    """``[serve.model]`` ``kv_dtype`` is one its engine can store: the limits rendered for
    it are sized at that type (docs/sizing.md)."""
    found = engines.lookup(model.engine)
    types = found.cache_types if found else None
    if (
        found is None
        or types is None
        or not types.stores
        or not isinstance(model.model, ModelModel)
    ):
        return []
    kv_dtype = model.model.kv_dtype
    if kv_dtype in types.stores:
        return []
    flags = " / ".join(f.name for f in types.flags)
    return [
        (
            "model.kv_dtype",
            f"must be one {found.display} stores ({flags}): {', '.join(types.stores)}; a "
            f"cache sized at {kv_dtype} is one the engine cannot hold, got {kv_dtype!r}",
        )
    ]


def _check_exclusive(model: ServeModel, bad: frozenset[str]) -> list[tuple[str, str]]:
    """``dual-gpu-exclusive`` needs a tensor-parallel pair: two roles, two GPUs."""
    errors: list[tuple[str, str]] = []
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
            ("gpu_roles", f'operating_mode "{DUAL_GPU_EXCLUSIVE}" needs gpu_roles = [two roles]')
        )
    return errors


def _check_placement(model: ServeModel, bad: frozenset[str]) -> list[tuple[str, str]]:
    """A placed serve's rules across its fields: its candidates are its only roles, it
    has a reservation to place, and it runs on one card (never dual-gpu-exclusive)."""
    errors: list[tuple[str, str]] = []
    pinned = [f for f in ("gpu_role", "gpu_roles") if getattr(model, f) is not None]
    if pinned:
        errors.append(
            ("placement", f"cannot be combined with {' or '.join(pinned)}; declare one of them")
        )
    if "vram_mib" not in bad and model.vram_mib is None:
        errors.append(
            (
                "placement",
                "needs vram_mib: the controller places the serve on a candidate its "
                "reservation fits",
            )
        )
    if model.exclusive:
        errors.append(
            (
                "operating_mode",
                f'"{DUAL_GPU_EXCLUSIVE}" cannot be combined with placement: it needs '
                "gpu_roles = [two roles], and a placed serve runs on one card",
            )
        )
    return errors


def _check_project(model: ServeModel) -> list[tuple[str, str]]:
    """The project ``up`` names must be one Compose takes, and the declared one's."""
    theirs = model.up_compose_project()
    if theirs is None:
        return []
    field = "up_env" if theirs == (model.up_env or {}).get("COMPOSE_PROJECT_NAME") else "up"
    problem = compose_project_problem(theirs)
    if problem is not None:
        return [(field, f"names the Compose project {_show(theirs)}, which {problem}")]
    if model.compose_project is not None and model.compose_project != theirs:
        return [
            (
                "compose_project",
                f"is {_show(model.compose_project)} but {field} runs the stack as Compose "
                f"project {_show(theirs)}: the container it makes would be foreign, never "
                "managed; declare the same project in both",
            )
        ]
    return []


def _check_sleep(
    model: ServeModel, sleep: SleepModel, bad: frozenset[str]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``[serve.sleep]`` against the serve: (errors, warnings) as (field, message)."""
    errors: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    if "vram_mib" not in bad:
        if model.vram_mib is None:
            errors.append(("sleep", "needs the serve's vram_mib (what it holds awake)"))
        elif sleep.residual_mib >= model.vram_mib:
            errors.append(
                (
                    "sleep.residual_mib",
                    f"must be less than vram_mib ({model.vram_mib}): a sleep that frees "
                    f"nothing is no way to make room, got {sleep.residual_mib}",
                )
            )
    if sleep.level == 1 and sleep.host_ram_mib is None:
        errors.append(
            (
                "sleep.host_ram_mib",
                "is required at level 1 (the weights move to host RAM; the host ledger "
                "counts them), but it is missing",
            )
        )
    elif sleep.level == 2 and sleep.host_ram_mib:
        warnings.append(
            (
                "sleep.host_ram_mib",
                f"ignored at level 2 (its weights are dropped, not kept in host RAM), got "
                f"{sleep.host_ram_mib}",
            )
        )
    if "port" not in bad and sleep.resolved_url(model.port) is None:
        errors.append(
            (
                "sleep.url",
                "is required when the serve has no port (default http://127.0.0.1:{port})",
            )
        )
    if "engine" not in bad and sleep.resolved_protocol(model.engine) is None:
        got = "no engine" if model.engine is None else f"engine {_show(model.engine)}"
        errors.append(
            (
                "sleep.protocol",
                f"is required: it cannot be told from {got} (set "
                + " or ".join(f'"{name}"' for name in sleep_protocols())
                + ")",
            )
        )
    return errors, warnings


def _read_host(
    data: Mapping[str, Any],
    display: str,
    errors: list[LocatedError],
    unknown: list[LocatedError],
) -> HostModel | None:
    """The file's ``[host]`` table, validated (None when absent or invalid: errors say why)."""
    raw = data.get("host")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errors.append(
            LocatedError(display, None, "host", f"must be a table ([host]), got {_show(raw)}", None)
        )
        return None

    def located(field: str, message: str) -> LocatedError:
        return LocatedError(display, None, field, message, None)

    _sort_unknown(raw, HostModel.model_fields, "host.", located, (errors, unknown))
    try:
        host = HostModel.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            where = _field_of(("host", *tuple(err["loc"])))
            errors.append(LocatedError(display, None, where, _pydantic_message(err), None))
        return None
    if host.reserve_mib > host.ram_mib:
        errors.append(
            LocatedError(
                display,
                None,
                "host.reserve_mib",
                f"must not exceed ram_mib ({host.ram_mib}), got {host.reserve_mib}",
                None,
            )
        )
        return None
    return host


def _read_allow_empty(data: Mapping[str, Any], display: str, errors: list[LocatedError]) -> bool:
    """The file's ``allow_empty`` (false when absent or invalid: the errors say why)."""
    value = data.get(ALLOW_EMPTY, False)
    if isinstance(value, bool):
        return value
    errors.append(
        LocatedError(
            display,
            None,
            ALLOW_EMPTY,
            f"must be a boolean (true or false), got {_show(value)}",
            None,
        )
    )
    return False


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


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` is refused (``None`` for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "not a plain file")
    return f"cannot read the manifest: not a regular file ({kind})"


def _read_bounded(path: Path) -> tuple[bytes, str | None]:
    """The file's bytes, or why not: never blocks, never reads more than the cap.

    ``stat`` comes first, so a FIFO or a device is refused without being opened; the
    open is non-blocking and checked again (the path may be swapped in between), and
    the read stops one byte past :data:`MAX_MANIFEST_BYTES`.
    """
    cap = f"larger than {MAX_MANIFEST_BYTES >> 10} KiB, the most a manifest may be"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return b"", "cannot read the manifest: no such file"
    except OSError as exc:
        return b"", f"cannot read the manifest: {exc.strerror or exc}"
    why = _not_regular(info.st_mode)
    if why is not None:
        return b"", why
    if info.st_size > MAX_MANIFEST_BYTES:
        return b"", f"cannot read the manifest: {cap} ({info.st_size} bytes)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return b"", f"cannot read the manifest: {exc.strerror or exc}"
    try:
        why = _not_regular(os.fstat(fd).st_mode)
        if why is not None:
            return b"", why
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_MANIFEST_BYTES:
            chunk = os.read(fd, MAX_MANIFEST_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return b"", f"cannot read the manifest: {exc.strerror or exc}"
    finally:
        os.close(fd)
    if size > MAX_MANIFEST_BYTES:
        return b"", f"cannot read the manifest: {cap}"
    return b"".join(chunks), None


#: One token for :func:`_long_dotted_key`: a bare key, a quoted key (to its closing
#: quote or the end of the line, so nothing is scanned twice), blanks, or one character.
_KEY_TOKEN = re.compile(r"""[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*+"?|'[^'\n]*+'?|[ \t]+|.""", re.DOTALL)


def _long_dotted_key(text: str) -> int | None:
    """The line of a dotted key with more than :data:`MAX_KEY_PARTS` parts, if any.

    A linear scan that over-approximates TOML's dotted keys (anything like
    ``a . "b" . c``, also inside strings and comments, where such chains do not occur
    in practice): tomllib's memory grows with the square of a key's parts, and a
    100 000-part key in 200 KB took 24 GB.
    """
    parts = 0
    after_dot = False
    for m in _KEY_TOKEN.finditer(text):
        token = m.group()
        first = token[0]
        if first in " \t":
            continue
        if first == ".":
            if parts and not after_dot:
                after_dot = True
            else:
                parts, after_dot = 0, False
            continue
        if first.isalnum() or first in "_-\"'":
            parts = parts + 1 if after_dot else 1
            after_dot = False
            if parts > MAX_KEY_PARTS:
                return text.count("\n", 0, m.start()) + 1
            continue
        parts, after_dot = 0, False
    return None


def _nesting(data: object) -> int:
    """How deep arrays and tables nest in parsed TOML (iterative: no recursion)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def _file_text(result: _FileResult, file_error: _FileErrorSink) -> str | None:
    """The file's text, bounded and decoded; ``None`` (and a located error) when unusable."""
    content, problem = _read_bounded(result.path)
    if problem is not None:
        file_error(problem)
        return None
    result.data = content
    try:
        text = result.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = result.data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (result.data.rfind(b"\n", 0, exc.start) + 1) + 1
        file_error(f"not UTF-8 text ({exc.reason} at byte {exc.start})", line, column)
        return None
    if not text.strip():
        file_error(
            f"the file is empty ({'only whitespace' if text else '0 bytes'}): nothing is taken "
            "from it (an editor crash or a truncated copy leaves such a file)"
        )
        return None
    long_key = _long_dotted_key(text)
    if long_key is not None:
        file_error(
            f"a dotted key of more than {MAX_KEY_PARTS} parts (the parser's cost grows with "
            "the square of them)",
            long_key,
        )
        return None
    return text


def _toml_data(text: str, file_error: _FileErrorSink) -> dict[str, Any] | None:
    """The parsed TOML; ``None`` (and a located error) on a syntax error or deep nesting."""
    too_deep = f"nested too deep (more than {MAX_NESTING} levels of arrays or tables)"
    try:
        data = tomllib.loads(text)
    except RecursionError:
        file_error(too_deep)
        return None
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
        return None
    if _nesting(data) > MAX_NESTING:
        file_error(too_deep)
        return None
    return data


class _FileErrorSink(Protocol):
    def __call__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        """Record an error of the whole file, at a line and column where known."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Unique:
    """One key an entry must not share with an earlier one: its field, and the words."""

    field: str
    key: Callable[[_Entry[Any]], object]
    message: Callable[[_Entry[Any], _Entry[Any]], str]  # (entry, the first holder)


class _FirstHolders:
    """The first entry holding each key of some :class:`_Unique` rules."""

    def __init__(self, table: str, rules: Sequence[_Unique]) -> None:
        self.table = table
        self.rules = tuple(rules)
        self.firsts: list[dict[object, _Entry[Any]]] = [{} for _ in self.rules]

    def clash(self, entry: _Entry[Any]) -> LocatedError | None:
        """The error of the first rule ``entry`` breaks; ``None`` when it breaks none."""
        for rule, firsts in zip(self.rules, self.firsts, strict=True):
            first = firsts.get(rule.key(entry))
            if first is not None:
                return entry.error(self.table, rule.field, rule.message(entry, first))
        return None

    def keep(self, entry: _Entry[Any]) -> None:
        """Make ``entry`` the first holder of its keys."""
        for rule, firsts in zip(self.rules, self.firsts, strict=True):
            firsts[rule.key(entry)] = entry

    def admit(self, entry: _Entry[Any], errors: list[LocatedError]) -> bool:
        """Keep ``entry`` when it breaks no rule; else record the error. Whether it was kept."""
        clash = self.clash(entry)
        if clash is not None:
            errors.append(clash)
            return False
        self.keep(entry)
        return True


_Findings = list[tuple[str, str]]


@dataclasses.dataclass(frozen=True, slots=True)
class _Table(Generic[_M]):
    """How one file's array of tables is read: its model, name key, checks and keys."""

    name: str
    model: type[_M]
    name_key: str
    check: Callable[[_M, frozenset[str]], tuple[_Findings, _Findings]]  # (errors, warnings)
    unique: tuple[_Unique, ...]


_ROLES = _Table(
    "gpu_roles",
    GpuRoleModel,
    "id",
    lambda model, bad: (_check_role(model, bad), _role_warnings(model, bad)),
    (
        _Unique(
            "id",
            lambda e: e.name,
            lambda e, first: (
                f"duplicate role id; first declared as gpu_roles #{first.index} in this file"
            ),
        ),
    ),
)
_SERVES = _Table(
    "serve",
    ServeModel,
    "name",
    _check_serve,
    (
        _Unique(
            "name",
            lambda e: e.name,
            lambda e, first: (
                f"duplicate serve name; first declared as serve #{first.index} in this file"
            ),
        ),
        _Unique(
            "container",
            lambda e: e.model.container,
            lambda e, first: (
                f"{_show(e.model.container)} is already declared by serve "
                f"{_show(first.name)} (#{first.index}) in this file"
            ),
        ),
    ),
)


def _read_table(
    result: _FileResult, data: Mapping[str, Any], table: _Table[_M]
) -> list[_Entry[_M]]:
    """The valid, unique entries of one array of tables; every problem located."""
    display, errors = result.display, result.errors
    holders = _FirstHolders(table.name, table.unique)
    entries: list[_Entry[_M]] = []
    for index, raw in enumerate(_table_list(data, table.name, display, errors), start=1):
        name, model, bad = _validate_entry(
            table.model,
            raw,
            display=display,
            table=table.name,
            index=index,
            name_key=table.name_key,
            errors=errors,
            unknown=result.unknown,
        )
        if not isinstance(model, table.model):
            continue
        checked, warned = table.check(model, bad)
        for sink, found in ((errors, checked), (result.warnings, warned)):
            sink.extend(LocatedError(display, name, f, m, table.name, index) for f, m in found)
        if bad or name is None:
            continue
        entry = _Entry(display, result.path, index, name, model)
        if holders.admit(entry, errors):
            entries.append(entry)
    return entries


def _read_file(path: Path) -> _FileResult:
    """One file: its bytes, its host, roles and serves, and every problem located."""
    display = str(path)
    result = _FileResult(path=path, display=display)
    errors = result.errors

    def file_error(message: str, line: int | None = None, column: int | None = None) -> None:
        errors.append(LocatedError(display, None, None, message, None, None, line, column))

    text = _file_text(result, file_error)
    data = None if text is None else _toml_data(text, file_error)
    if data is None:
        return result

    def located(field: str, message: str) -> LocatedError:
        return LocatedError(display, None, field, message, None)

    found = (errors, result.unknown)
    informational = INFORMATIONAL_TOP_LEVEL_KEYS
    _sort_unknown(
        data, TOP_LEVEL_KEYS, "", located, found, informational=informational, what="table"
    )
    result.allow_empty = _read_allow_empty(data, display, errors)
    result.host = _read_host(data, display, errors, result.unknown)
    result.roles = _read_table(result, data, _ROLES)
    result.serves = _read_table(result, data, _SERVES)
    return result


# ── the set ────────────────────────────────────────────────────────────────────


@dataclasses.dataclass(frozen=True)
class ManifestSet:
    """One or more manifest files merged: roles by id, serves by name (declaration order).

    A serve declared in several files (same container) appears once: the entry with
    ``up`` (the owner) wins over read-only mirrors. ``warnings`` are things that load
    but deserve a look (a serve on a role without a capacity row takes no part in the
    ledger). ``digest`` changes whenever any file's bytes change; ``texts`` holds each
    file's content as it was loaded (what the digest covers), so the journal records the
    manifest in force, never what the disk holds after a later, invalid edit.
    """

    files: tuple[Path, ...]
    roles: dict[str, GpuRoleModel]
    serves: dict[str, ServeModel]
    warnings: list[str]
    digest: str
    _sources: dict[str, tuple[Path, ...]] = dataclasses.field(repr=False)
    _role_sources: dict[str, tuple[Path, ...]] = dataclasses.field(repr=False)
    texts: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    #: the ``[host]`` budget (None: no file declares one)
    host: HostModel | None = None

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
        argv = self.runtime()[name].up_argv
        return None if argv is None else list(argv)

    def runtime(self) -> Mapping[str, ServeRuntime]:
        """Each serve's :class:`ServeRuntime` (built once; they are immutable)."""
        return self._runtime

    @functools.cached_property
    def _runtime(self) -> Mapping[str, ServeRuntime]:
        return MappingProxyType(
            {
                name: serve.to_runtime(self.source(name).resolve().parent)
                for name, serve in self.serves.items()
            }
        )

    def desired(self) -> DesiredState:
        """The pure core's :class:`DesiredState` for this set (built once; it is immutable)."""
        return self._desired

    @functools.cached_property
    def _desired(self) -> DesiredState:
        return DesiredState(
            roles={rid: role.to_role() for rid, role in self.roles.items()},
            serves={name: serve.to_spec() for name, serve in self.serves.items()},
            host=None if self.host is None else self.host.to_host(),
        )


def _reservation(model: ServeModel) -> dict[str, object]:
    """The fields a mirror must agree on with its owner."""
    return {
        "name": model.name,
        "gpu_role(s)": list(model.roles),
        "placement": model.placement,
        "vram_mib": model.vram_mib,
        "residency": None if model.residency is None else model.residency.value,
        "operating_mode": DUAL_GPU_EXCLUSIVE if model.exclusive else None,
        "sleep": None
        if model.sleep is None
        else {
            "level": model.sleep.level,
            "residual_mib": model.sleep.residual_mib,
            "host_ram_mib": model.sleep.host_ram_mib,
        },
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


def _merge_host(files: Sequence[_FileResult], errors: list[LocatedError]) -> HostModel | None:
    """One ``[host]`` for the set: files that declare it must agree."""
    first: _FileResult | None = None
    for result in files:
        if result.host is None:
            continue
        if first is None or first.host is None:
            first = result
            continue
        for field in ("ram_mib", "reserve_mib"):
            here, there = getattr(result.host, field), getattr(first.host, field)
            if here != there:
                errors.append(
                    LocatedError(
                        result.display,
                        None,
                        f"host.{field}",
                        f"conflicting host budget: {here} here, {there} in {first.display}",
                        None,
                    )
                )
    return None if first is None else first.host


def _merge_serves(
    files: Sequence[_FileResult], errors: list[LocatedError], warnings: list[LocatedError]
) -> tuple[list[_Entry[ServeModel]], dict[str, tuple[Path, ...]]]:
    """One entry per container (its owner, mirrors agreeing), names and ports unique."""
    groups: dict[str, list[_Entry[ServeModel]]] = {}
    for result in files:
        for entry in result.serves:
            groups.setdefault(entry.model.container, []).append(entry)

    chosen: list[_Entry[ServeModel]] = []
    sources: dict[str, tuple[Path, ...]] = {}
    for container, group in groups.items():
        winner = _owner(container, group, errors, warnings)
        if winner is not None:
            chosen.append(winner)
            others = tuple(e.path for e in group if e is not winner)
            sources[winner.name] = (winner.path, *others)

    names = _FirstHolders("serve", (_SET_NAME,))
    unique = [entry for entry in chosen if names.admit(entry, errors)]
    ports = _FirstHolders("serve", (_SET_PORT,))
    for entry in unique:
        if entry.model.desired is DesiredRun.RUNNING and entry.model.port is not None:
            ports.admit(entry, errors)
    return unique, sources


#: A serve name used for two containers across the set.
_SET_NAME = _Unique(
    "name",
    lambda e: e.name,
    lambda e, first: (
        f"serve name already used by {first.label} for container "
        f"{_show(first.model.container)}; this one is container {_show(e.model.container)}"
    ),
)
#: A port shared by two serves desired running.
_SET_PORT = _Unique(
    "port",
    lambda e: e.model.port,
    lambda e, first: (
        f"port {e.model.port} is also used by {first.label}, and both are "
        'desired "running"; serves that share a port cannot run at once'
    ),
)


def _owner(
    container: str,
    group: Sequence[_Entry[ServeModel]],
    errors: list[LocatedError],
    warnings: list[LocatedError],
) -> _Entry[ServeModel] | None:
    """The entry that decides for ``container``: its one owner (with ``up``), else the
    first; ``None`` when a second owner or a disagreeing mirror makes the group wrong."""
    owners = [e for e in group if e.model.up is not None]
    winner = owners[0] if owners else group[0]
    ok = len(owners) < 2
    for other in owners[1:]:
        errors.append(
            other.error(
                "serve",
                "up",
                f"container {_show(container)} is already owned (has up) by "
                f"{winner.label}; only one entry may own a container, the others must be "
                f"read-only mirrors without up",
            )
        )
    for other in group:
        if other is not winner and other.model.up is None:
            ok = _mirror_agrees(container, winner, other, errors, warnings) and ok
    return winner if ok else None


def _mirror_agrees(
    container: str,
    winner: _Entry[ServeModel],
    other: _Entry[ServeModel],
    errors: list[LocatedError],
    warnings: list[LocatedError],
) -> bool:
    """Whether a mirror declares its owner's reservation (each difference an error);
    a ``desired`` of its own is a warning (the owner decides)."""
    want = _reservation(winner.model)
    ok = True
    for field, value in _reservation(other.model).items():
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
                f"ignored on a mirror; {winner.label} decides ({_show(winner.model.desired)})",
            )
        )
    return ok


def _residents_over_budget(
    files: Sequence[_FileResult],
    entries: Sequence[_Entry[ServeModel]],
    roles: Mapping[str, GpuRoleModel],
) -> list[LocatedError]:
    """Residents desired running whose reservations on one role exceed its budget.

    Residents evict nothing and are never evicted, so such a set can never all run: an
    error on the role, naming every term of the sum (a single serve over the budget is
    the serve's own error). A serve placed among several candidates is left out: it
    holds one of them, which one the controller chooses.
    """
    on_role: dict[str, list[tuple[str, int]]] = {}
    for entry in entries:
        model = entry.model
        resident = model.residency is Residency.RESIDENT and model.desired is DesiredRun.RUNNING
        if not resident or model.vram_mib is None or not model.roles:
            continue
        if model.cards < len(model.roles):  # placed: on one candidate, never on all
            continue
        if all(r in roles for r in model.roles):  # else it takes no part in the ledger
            for r in model.roles:
                on_role.setdefault(r, []).append((entry.name, model.vram_mib))
    firsts: dict[str, _Entry[GpuRoleModel]] = {}
    for result in files:
        for role_entry in result.roles:
            firsts.setdefault(role_entry.name, role_entry)
    errors: list[LocatedError] = []
    for rid, terms in on_role.items():
        role, total = roles[rid], sum(mib for _, mib in terms)
        if len(terms) < 2 or total <= role.budget_mib:
            continue
        summed = " + ".join(f"{_show(name)} {mib}" for name, mib in terms)
        message = (
            f'the residents desired "running" on it can never all run: {summed} = {total} MiB, '
            f"more than its budget {role.vram_mib} - {role.reserve_mib} = {role.budget_mib} "
            "MiB (residents evict nothing and are never evicted: make one evictable or "
            'on-demand, desired "stopped", or smaller)'
        )
        errors.append(firsts[rid].error("gpu_roles", None, message))
    return errors


def _declares_nothing(files: Sequence[_FileResult]) -> LocatedError:
    """The refusal of a set without any serve or role (and without ``allow_empty``)."""
    return LocatedError(
        ", ".join(r.display for r in files),
        None,
        None,
        "declares no [[serve]] and no [[gpu_roles]]: the controller would look after "
        "nothing (an editor crash or a truncated copy leaves such a file); refused. Add "
        f"`{ALLOW_EMPTY} = true` to a file of the set if that is meant",
        None,
    )


def _read_all(
    paths: Sequence[str | Path],
    *,
    strict: bool,
    errors: list[LocatedError],
    warnings: list[LocatedError],
) -> list[_FileResult]:
    """Every file of the set read once (a path given twice is a warning), its problems
    added to ``errors`` and ``warnings`` (unknown keys to either, by ``strict``)."""
    results: list[_FileResult] = []
    seen: dict[Path, str] = {}
    for raw_path in paths:
        path = Path(raw_path)
        try:
            key = path.resolve()
        except (OSError, RuntimeError):  # a symlink loop: reading it says so, located
            key = Path(os.path.abspath(path))
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
        if strict:
            errors.extend(dataclasses.replace(e, message=REFUSED_KEY) for e in result.unknown)
        else:  # first: an unknown key often explains a warning (a newer role key: no role)
            warnings.extend(result.unknown)
        warnings.extend(result.warnings)
    return results


def _role_typos(
    entry: _Entry[ServeModel], missing: Sequence[str], roles: Mapping[str, GpuRoleModel]
) -> list[LocatedError]:
    """A missing role close to a declared one: an error each (a typo would drop the
    reservation from the ledger without a word). Every missing placement candidate is
    an error, with the near miss where there is one: the controller could place the
    serve on no card of that name."""
    placed = entry.model.placement is not None
    why = " (each placement candidate must be a declared role)" if placed else ""
    out: list[LocatedError] = []
    for r in missing:
        close = difflib.get_close_matches(r, list(roles), n=1, cutoff=0.6)
        if close or placed:
            hint = f'; did you mean "{close[0]}"?' if close else ""
            out.append(
                entry.error(
                    "serve",
                    entry.model.roles_field,
                    f"no [[gpu_roles]] row {_show(r)} in this manifest set{why}{hint}",
                )
            )
    return out


def _never_fits(
    entry: _Entry[ServeModel], roles: Mapping[str, GpuRoleModel], host: HostModel | None
) -> list[LocatedError]:
    """A reservation larger than a role's budget, or a level-1 sleep's host RAM larger
    than the host's: it could never be carried out."""
    model = entry.model
    out: list[LocatedError] = []
    if model.vram_mib is not None:
        for r in model.roles:
            role = roles.get(r)
            if role is None or model.vram_mib <= role.budget_mib:
                continue
            if model.placement is not None:
                message = (
                    f"role {_show(r)} has a budget of {role.budget_mib} MiB (capacity "
                    f"{role.vram_mib} - reserve {role.reserve_mib}), less than vram_mib "
                    f"{model.vram_mib}: it can never hold this serve"
                )
                out.append(entry.error("serve", "placement", message))
                continue
            out.append(
                entry.error(
                    "serve",
                    "vram_mib",
                    f"{model.vram_mib} MiB can never fit role {_show(r)}: its budget is "
                    f"{role.vram_mib} - {role.reserve_mib} = {role.budget_mib} MiB",
                )
            )
    sleep = model.sleep
    if host is not None and sleep is not None and sleep.level == 1:
        needs = sleep.host_ram_mib or 0
        if needs > host.ram_mib - host.reserve_mib:
            out.append(
                entry.error(
                    "serve",
                    "sleep.host_ram_mib",
                    f"{needs} MiB can never fit the host: its budget is {host.ram_mib} - "
                    f"{host.reserve_mib} = {host.ram_mib - host.reserve_mib} MiB",
                )
            )
    return out


def _check_fits(
    entries: Sequence[_Entry[ServeModel]],
    roles: Mapping[str, GpuRoleModel],
    host: HostModel | None,
    errors: list[LocatedError],
    warnings: list[LocatedError],
) -> None:
    """Each serve against the set's roles and host: typos of role names, reservations
    that never fit, and serves that take no part in the ledger (a warning)."""
    for entry in entries:
        model = entry.model
        missing = [r for r in model.roles if r not in roles]
        typos = _role_typos(entry, missing, roles)
        if typos:
            errors.extend(typos)
            continue
        errors.extend(_never_fits(entry, roles, host))
        if missing and model.vram_mib is not None:
            names = ", ".join(_show(r) for r in missing)
            warnings.append(
                entry.error(
                    "serve",
                    model.roles_field,
                    f"no [[gpu_roles]] capacity row for {names} in this manifest set; "
                    f"the serve takes no part in the ledger",
                )
            )


def _digest(results: Sequence[_FileResult]) -> str:
    """The set's digest: each file's length and bytes, in order."""
    digest = hashlib.sha256()
    for result in results:
        digest.update(len(result.data).to_bytes(8, "big"))
        digest.update(result.data)
    return digest.hexdigest()


def load_manifest_set(paths: Sequence[str | Path], *, strict: bool = False) -> ManifestSet:
    """Load and merge manifest files into one :class:`ManifestSet`.

    Raises :class:`ManifestError` with every located problem of every file. Keys this
    version does not know are warnings, or errors when ``strict``.
    """
    errors: list[LocatedError] = []
    warnings: list[LocatedError] = []
    if not paths:
        raise ManifestError([LocatedError("(no manifest)", None, None, "no manifest file given")])
    results = _read_all(paths, strict=strict, errors=errors, warnings=warnings)

    roles, role_sources = _merge_roles(results, errors)
    host = _merge_host(results, errors)
    entries, sources = _merge_serves(results, errors, warnings)
    _check_fits(entries, roles, host, errors, warnings)

    errors.extend(_residents_over_budget(results, entries, roles))
    if not (errors or roles or entries or any(r.allow_empty for r in results)):
        errors.append(_declares_nothing(results))
    warning_lines = [str(w) for w in warnings]
    if errors:
        raise ManifestError(errors, warning_lines)
    return ManifestSet(
        files=tuple(r.path for r in results),
        roles=roles,
        serves={e.name: e.model for e in entries},
        warnings=warning_lines,
        digest=_digest(results),
        _sources=sources,
        _role_sources=role_sources,
        texts={str(r.path): r.data.decode("utf-8") for r in results},
        host=host,
    )


def load_manifest(path: str | Path, *, strict: bool = False) -> ManifestSet:
    """Load one manifest file: a set of one."""
    return load_manifest_set([path], strict=strict)
