"""Manifest loading: TOML files → validated pydantic models → the core's DesiredState.

A manifest is one or more TOML files (docs/design.md §4). This module reads them with
:mod:`tomllib`, validates every ``[[gpu_roles]]`` and ``[[serve]]`` table with the
pydantic models below, merges several files into one :class:`ManifestSet` (serves
de-duplicated by container, roles by id), and converts the set into
:class:`statemachine.types.DesiredState` for the pure core.

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
from typing import Any, Generic, TypeVar

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
    ElasticModel,
    GpuRoleModel,
    HostModel,
    ServeModel,
    SleepModel,
)
from controller.manifest.runtime import ServeRuntime
from statemachine.types import DesiredRun, DesiredState, Residency

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
    for sub, sub_model in (("elastic", ElasticModel), ("sleep", SleepModel)):
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
    if not bad & {"up", "up_env", "compose_project"}:
        errors += _check_project(model)
    if model.sleep is not None and "sleep" not in bad:
        sleep_errors, sleep_warnings = _check_sleep(model, model.sleep, bad)
        errors += sleep_errors
        warnings += sleep_warnings
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


def _read_file(path: Path) -> _FileResult:
    display = str(path)
    result = _FileResult(path=path, display=display)
    errors = result.errors

    def file_error(message: str, line: int | None = None, column: int | None = None) -> None:
        errors.append(LocatedError(display, None, None, message, None, None, line, column))

    content, problem = _read_bounded(path)
    if problem is not None:
        file_error(problem)
        return result
    result.data = content
    try:
        text = result.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = result.data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (result.data.rfind(b"\n", 0, exc.start) + 1) + 1
        file_error(f"not UTF-8 text ({exc.reason} at byte {exc.start})", line, column)
        return result
    if not text.strip():
        file_error(
            f"the file is empty ({'only whitespace' if text else '0 bytes'}): nothing is taken "
            "from it (an editor crash or a truncated copy leaves such a file)"
        )
        return result
    long_key = _long_dotted_key(text)
    if long_key is not None:
        file_error(
            f"a dotted key of more than {MAX_KEY_PARTS} parts (the parser's cost grows with "
            "the square of them)",
            long_key,
        )
        return result
    try:
        data = tomllib.loads(text)
    except RecursionError:
        file_error(f"nested too deep (more than {MAX_NESTING} levels of arrays or tables)")
        return result
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

    if _nesting(data) > MAX_NESTING:
        file_error(f"nested too deep (more than {MAX_NESTING} levels of arrays or tables)")
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
            unknown=result.unknown,
        )
        if not isinstance(model, GpuRoleModel):
            continue
        for field, message in _check_role(model, bad):
            errors.append(LocatedError(display, name, field, message, "gpu_roles", index))
        for field, message in _role_warnings(model, bad):
            result.warnings.append(LocatedError(display, name, field, message, "gpu_roles", index))
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
            unknown=result.unknown,
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


def _residents_over_budget(
    files: Sequence[_FileResult],
    entries: Sequence[_Entry[ServeModel]],
    roles: Mapping[str, GpuRoleModel],
) -> list[LocatedError]:
    """Residents desired running whose reservations on one role exceed its budget.

    Residents evict nothing and are never evicted, so such a set can never all run: an
    error on the role, naming every term of the sum (a single serve over the budget is
    the serve's own error).
    """
    on_role: dict[str, list[tuple[str, int]]] = {}
    for entry in entries:
        model = entry.model
        resident = model.residency is Residency.RESIDENT and model.desired is DesiredRun.RUNNING
        if not resident or model.vram_mib is None or not model.roles:
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


def load_manifest_set(paths: Sequence[str | Path], *, strict: bool = False) -> ManifestSet:
    """Load and merge manifest files into one :class:`ManifestSet`.

    Raises :class:`ManifestError` with every located problem of every file. Keys this
    version does not know are warnings, or errors when ``strict``.
    """
    errors: list[LocatedError] = []
    warnings: list[LocatedError] = []
    results: list[_FileResult] = []
    seen: dict[Path, str] = {}
    if not paths:
        raise ManifestError([LocatedError("(no manifest)", None, None, "no manifest file given")])
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
        else:  # first: an unknown key often explains a warning (no role: `placement`)
            warnings.extend(result.unknown)
        warnings.extend(result.warnings)

    roles, role_sources = _merge_roles(results, errors)
    host = _merge_host(results, errors)
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
        sleep = model.sleep
        if host is not None and sleep is not None and sleep.level == 1:
            needs = sleep.host_ram_mib or 0
            if needs > host.ram_mib - host.reserve_mib:
                errors.append(
                    entry.error(
                        "serve",
                        "sleep.host_ram_mib",
                        f"{needs} MiB can never fit the host: its budget is {host.ram_mib} - "
                        f"{host.reserve_mib} = {host.ram_mib - host.reserve_mib} MiB",
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

    errors.extend(_residents_over_budget(results, entries, roles))
    if not (errors or roles or entries or any(r.allow_empty for r in results)):
        errors.append(_declares_nothing(results))
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
        texts={str(r.path): r.data.decode("utf-8") for r in results},
        host=host,
    )


def load_manifest(path: str | Path, *, strict: bool = False) -> ManifestSet:
    """Load one manifest file: a set of one."""
    return load_manifest_set([path], strict=strict)
