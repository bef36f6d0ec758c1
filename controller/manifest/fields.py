"""The manifest's field types: validators and bounds, one per kind of value.

Each ``Annotated`` type validates one field and says in its message what was
expected; the bounds (MiB, seconds, names) are the constants here. No I/O.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from controller.manifest.errors import (
    NEAR_MISS_CUTOFF,
    _did_you_mean,
    _show,
)
from statemachine.domain.types import DesiredRun, Residency
from statemachine.engines import sleeping_engines
from statemachine.sizing.needs import KV_DTYPES

#: The ``operating_mode`` that makes a two-role serve exclusive on both roles.
DUAL_GPU_EXCLUSIVE = "dual-gpu-exclusive"


#: The top-level key that lets a set declare no serve and no role (docs/manifest.md).
ALLOW_EMPTY = "allow_empty"
#: Top-level keys the loader reads; any other is reported as ignored (an error under
#: ``--strict``), the informational ones below excepted.
TOP_LEVEL_KEYS = ("gpu_roles", "serve", "host", ALLOW_EMPTY)

#: Keys the real stack's manifests carry for its own tools (docs/manifest.md): known to
#: this version, kept and not used, so they are not reported as unknown.
INFORMATIONAL_TOP_LEVEL_KEYS = ("promotion",)
INFORMATIONAL_SERVE_KEYS = ("router_config", "rollback_router_config")

#: ``[serve.sleep]`` levels: 1 keeps the weights in host RAM, 2 drops them.
SLEEP_LEVELS = (1, 2)


def sleep_protocols() -> tuple[str, ...]:
    """The engine sleep APIs (docs/protocols.md), and the ``engine`` values that name
    them: the registry's engines with a sleep API (:mod:`statemachine.engines`)."""
    return tuple(e.name for e in sleeping_engines())


#: Docker's rule for container names (its ``RestrictedNamePattern``, without the
#: optional leading slash): anything else is refused by ``docker create``, or, with a
#: newline or ``../``, would be misread in logs and paths.
CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", re.ASCII)
#: Serve names appear in URLs (``/v1/serves/NAME``), command lines and log lines.
MAX_SERVE_NAME = 128
SERVE_NAME = re.compile(rf"[a-zA-Z0-9][a-zA-Z0-9_.-]{{0,{MAX_SERVE_NAME - 1}}}", re.ASCII)
#: A Docker Compose project name, as Compose v2 accepts it (``-p``, ``name:``).
COMPOSE_PROJECT = re.compile(r"[a-z0-9][a-z0-9_-]*", re.ASCII)

#: Bounds on the timeouts, so that each is a wait the runtime can carry out (Docker's
#: stop timeout is an integer of seconds; the loop adds them to the clock).
MAX_STOP_TIMEOUT_S = 3600.0
MAX_START_TIMEOUT_S = 86400.0
MAX_DRAIN_TIMEOUT_S = 3600.0

#: A serve's timeouts when its table does not set them (the manifest models and the
#: runtime record both take them from here)
DEFAULT_START_TIMEOUT_S = 600.0
DEFAULT_STOP_TIMEOUT_S = 30.0
DEFAULT_DRAIN_TIMEOUT_S = 120.0
MAX_IDLE_TTL_S = 31 * 86400.0
#: Bound on ``min_runtime_s``: a serve that must never be evicted is a resident
MAX_MIN_RUNTIME_S = MAX_IDLE_TTL_S
#: Bound on a declared cold start or wake (``cold_start_s``, ``[serve.sleep] wake_s``):
#: what the controller waits for a start at most
MAX_RELOAD_S = MAX_START_TIMEOUT_S

#: What one manifest file may cost: its size (20 times the largest real fleet's file;
#: the worst file of that size parses in a few seconds and a few hundred MiB), the
#: parts of one dotted key (tomllib's memory grows with the square of them) and how
#: deep its arrays and tables nest.
MAX_MANIFEST_BYTES = 512 << 10
MAX_KEY_PARTS = 16
MAX_NESTING = 32


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


def _at_most(limit: float, why: str) -> Any:
    """A positive-seconds validator that also refuses more than ``limit`` (``why``)."""

    def check(value: object) -> object:
        seconds = _timeout(value)
        assert isinstance(seconds, float)
        if seconds > limit:
            raise _bad(f"must be at most {limit:.0f} seconds ({why})", value)
        return seconds

    return check


def _restore_seconds(value: object) -> object:
    """A declared cold start or wake: positive seconds, at most a day (None: undeclared)."""
    if value is None:
        return None
    return _at_most(MAX_RELOAD_S, "a day")(value)


def _ttl(value: object) -> object:
    seconds = _seconds(value)
    if isinstance(seconds, float) and seconds > MAX_IDLE_TTL_S:
        raise _bad(f"must be at most {MAX_IDLE_TTL_S:.0f} seconds (31 days)", value)
    return seconds


def _min_runtime(value: object) -> object:
    seconds = _seconds(value)
    if isinstance(seconds, float) and seconds > MAX_MIN_RUNTIME_S:
        raise _bad(
            f"must be at most {MAX_MIN_RUNTIME_S:.0f} seconds (31 days); a serve never to "
            'be evicted is declared residency = "resident"',
            value,
        )
    return seconds


def _boolean(value: object) -> object:
    if not isinstance(value, bool):
        raise _bad("must be true or false", value)
    return value


def _sleep_level(value: object) -> object:
    if not _is_int(value) or value not in SLEEP_LEVELS:
        raise _bad("must be 1 (weights kept in host RAM) or 2 (weights dropped)", value)
    return value


def _sleep_protocol(value: object) -> object:
    if value is None:
        return None
    known = sleep_protocols()
    if not isinstance(value, str) or value.strip().lower() not in known:
        word = value.strip().lower() if isinstance(value, str) else ""
        hint = _did_you_mean(word, known) if word else ""
        raise _bad(f"must be one of {', '.join(known)}{hint}", value)
    return value.strip().lower()


def _kv_dtype(value: object) -> object:
    if value is None:
        return None
    known = tuple(KV_DTYPES)
    if not isinstance(value, str) or value.strip().lower() not in known:
        word = value.strip().lower() if isinstance(value, str) else ""
        hint = _did_you_mean(word, known) if word else ""
        raise _bad(f"must be one of {', '.join(known)}{hint}", value)
    return value.strip().lower()


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
    if "\x00" in value:
        raise _bad("must not contain a NUL byte (no program can take it as an argument)", value)
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


def _container_name(value: object) -> object:
    _text(value)
    assert isinstance(value, str)
    if not CONTAINER_NAME.fullmatch(value):
        raise _bad(
            "must be a Docker container name: [a-zA-Z0-9][a-zA-Z0-9_.-] and more of the "
            "second, at least 2 characters (no space, slash or newline)",
            value,
        )
    return value


def compose_project_problem(value: str) -> str | None:
    """Why ``value`` is not a Compose project name (None: it is one)."""
    if COMPOSE_PROJECT.fullmatch(value):
        return None
    return (
        "must be a Docker Compose project name: lowercase letters, digits, _ and -, "
        "starting with a letter or digit"
    )


def _compose_project(value: object) -> object:
    if value is None:
        return None
    _text(value)
    assert isinstance(value, str)
    problem = compose_project_problem(value)
    if problem is not None:
        raise _bad(problem, value)
    return value


def _serve_name(value: object) -> object:
    _text(value)
    assert isinstance(value, str)
    if not SERVE_NAME.fullmatch(value):
        raise _bad(
            "must be a serve name: a letter or digit, then letters, digits, _ . or -, "
            f"at most {MAX_SERVE_NAME} characters",
            value,
        )
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


def _candidate_roles(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _bad("must list one or more gpu role ids (non-empty strings)", value)
    twice = next((v for i, v in enumerate(value) if v in value[:i]), None)
    if twice is not None:
        raise _bad(f"must list each gpu role once ({_show(twice)} is there twice)", value)
    return value


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
OptNonNegativeMiB = Annotated[
    int | None,
    BeforeValidator(_nonnegative_mib),
    WithJsonSchema({"type": "integer", "minimum": 0}),
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
MinRuntime = Annotated[
    float,
    BeforeValidator(_min_runtime),
    WithJsonSchema({"type": "number", "minimum": 0, "maximum": MAX_MIN_RUNTIME_S}),
]
OptSeconds = Annotated[
    float | None, BeforeValidator(_seconds), WithJsonSchema({"type": "number", "minimum": 0})
]
StartTimeout = Annotated[
    float,
    BeforeValidator(_at_most(MAX_START_TIMEOUT_S, "a day")),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_START_TIMEOUT_S}),
]
StopTimeout = Annotated[
    float,
    BeforeValidator(_at_most(MAX_STOP_TIMEOUT_S, "an hour")),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_STOP_TIMEOUT_S}),
]
DrainTimeout = Annotated[
    float,
    BeforeValidator(_at_most(MAX_DRAIN_TIMEOUT_S, "the router's drain limit")),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DRAIN_TIMEOUT_S}),
]
OptTtl = Annotated[
    float | None,
    BeforeValidator(_ttl),
    WithJsonSchema({"type": "number", "minimum": 0, "maximum": MAX_IDLE_TTL_S}),
]
OptRestoreSeconds = Annotated[
    float | None,
    BeforeValidator(_restore_seconds),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_RELOAD_S}),
]
ContainerName = Annotated[
    str,
    BeforeValidator(_container_name),
    WithJsonSchema({"type": "string", "pattern": "^" + CONTAINER_NAME.pattern + "$"}),
]
OptComposeProject = Annotated[
    str | None,
    BeforeValidator(_compose_project),
    WithJsonSchema({"type": "string", "pattern": "^" + COMPOSE_PROJECT.pattern + "$"}),
]
ServeName = Annotated[
    str,
    BeforeValidator(_serve_name),
    WithJsonSchema({"type": "string", "pattern": "^" + SERVE_NAME.pattern + "$"}),
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
OptUrl = Annotated[
    str | None,
    BeforeValidator(lambda v: None if v is None else _url(v)),
    WithJsonSchema({"type": "string", "pattern": "^https?://"}),
]
SleepLevel = Annotated[
    int, BeforeValidator(_sleep_level), WithJsonSchema({"type": "integer", "enum": [1, 2]})
]
KvDtypeName = Annotated[
    str, BeforeValidator(_kv_dtype), WithJsonSchema({"type": "string", "enum": list(KV_DTYPES)})
]
OptSleepProtocol = Annotated[
    str | None,
    BeforeValidator(_sleep_protocol),
    WithJsonSchema({"type": "string", "enum": list(sleep_protocols())}),
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
OptCandidateRoles = Annotated[
    list[str] | None,
    BeforeValidator(_candidate_roles),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
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
