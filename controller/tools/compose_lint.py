"""``vramctl lint --compose``: do the compose files' engine flags enforce the reservations?

This module reads Docker Compose files (YAML), takes each service's command line
(``entrypoint`` + ``command``, interpolated and split the way compose does), maps the
services to the manifest's serves, and asks :mod:`statemachine.flags.fraction` whether each
serve's memory-fraction flag (vLLM ``--gpu-memory-utilization``, SGLang
``--mem-fraction-static``) holds the engine to its ``vram_mib`` (docs/design.md §3).

Matching a service to a serve: the service's container name (``container_name``, else
compose's default ``{project}-{service}-1``) equal to the serve's ``container``; failing
that, a service without ``container_name`` whose name is a serve's name.

Which engine runs: the command's own words when they name one (``vllm serve``,
``python -m sglang.launch_server``, ``llama-server``), else the image's repository
(``vllm/vllm-openai``), else the serve's ``engine`` label. The command wins over the
label because it is what runs: the real stack labels its embeddings and reranker by
purpose (``engine = "embedding"``/``"reranker"``) but runs them with ``vllm serve``,
and their ``--gpu-memory-utilization`` is exactly what enforces their reservations.
A label naming a different engine than the command (``vllm`` vs ``llama-server``) is
a note.

Findings (:class:`statemachine.engine.Finding`): errors (the lint fails) when a
checked serve's command lacks the flag, sets an unreadable value, or sets a fraction
whose budget is off the reservation by more than the tolerance; notes otherwise: a
serve with a reservation that no service runs (started some other way), a service
that sets a fraction for no serve, a serve with no reservation or an engine without
a flag, a value taken from a ``${VARIABLE}``, a flag given twice (the last wins).

For a serve with ``[serve.model]`` the engine's limit flags are checked too
(:mod:`statemachine.flags.model_limits`: vLLM ``--max-model-len``, SGLang ``--context-length``,
llama.cpp ``--n-gpu-layers`` and ``--ctx-size``), from the model's figures the caller
read (``models``: this module reads no model file); onnx-genai's ``--vram-limit`` needs
only the reservation. A missing or too-large value is an error with every term, as is a
model that cannot load in its reservation; a serve with ``elastic`` whose command is
not elastic, or whose segment is not ``elastic.segment_mib``, is an error too, and so is
a llama.cpp command whose KV cache type (``--cache-type-k``/``-v``, f16 where absent) is
not ``[serve.model]`` ``kv_dtype``, the type its limits were computed at.

Variables (``${VAR:-default}``, ``${VAR}``, ``$VAR``, ``$$``) are resolved from
``environ`` only, empty by default: the file is linted as it runs with nothing set,
so a result does not depend on the shell it was run from. Pass ``os.environ`` to
lint what compose would run here (``.env`` files are not read). The files are merged
by service (``_merge_files``, a later file's keys winning) before each service's command
is read.

Reads files only; never runs docker or compose.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from controller.manifest import ManifestSet, ServeModel
from controller.manifest.models import ModelModel
from statemachine import engines
from statemachine.flags.fraction import (
    DEFAULT_PLACES,
    DEFAULT_TOLERANCE,
    SOURCE_NVML,
    DeviceTotal,
    Finding,
    FindingKind,
    RenderResult,
    SleepNeeds,
    check_fraction,
    check_sleep,
    engine_flags,
    engine_of_argv,
    engine_of_image,
    flag_from_variable,
    flag_values,
    normalize_engine,
    parse_fraction,
    render_flag,
    role_totals,
    sleep_needs,
)
from statemachine.flags.model_limits import (
    CacheTypeRender,
    ElasticRender,
    Limit,
    Model,
    ModelInput,
    check_cache_types,
    check_elastic,
    check_limit,
    fits_to_reservation,
    found_value,
    render_cache_types,
    render_elastic,
    render_limits,
)
from statemachine.flags.self_sleep import check_self_sleep
from statemachine.flags.verdict import load_verdict, model_terms
from statemachine.sizing.model_fit import ReservationCheck

__all__ = [
    "CheckedServe",
    "ComposeError",
    "ComposeService",
    "LintReport",
    "RenderedServe",
    "interpolate",
    "lint_compose",
    "load_compose",
    "render_fraction",
    "render_serve",
    "report_lines",
    "resolve_engine",
    "serve_flag_budget",
]


class ComposeError(Exception):
    """A compose file that cannot be read; ``str()`` is one located line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        """Hold every problem found (at least one)."""
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# ── interpolation ──────────────────────────────────────────────────────────────

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^{}]*(?:\{[^{}]*\}[^{}]*)*)\}|(?P<named>[A-Za-z_]\w*))"
)
_BRACED = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>.*))?\Z", re.DOTALL)


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """Compose variable substitution of ``text`` from ``environ``.

    ``$$`` → ``$``; ``${VAR}``/``$VAR`` → its value or empty; ``${VAR:-d}`` (unset or
    empty) and ``${VAR-d}`` (unset) → ``d``; ``${VAR:+a}``/``${VAR+a}`` → ``a`` when set;
    ``${VAR:?e}``/``${VAR?e}`` → its value, or empty when missing (compose would refuse
    to run). Defaults may hold variables themselves. ValueError on a malformed ``${…}``.
    """

    def substitute(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        named = match.group("named")
        if named is not None:
            return environ.get(named, "")
        body = match.group("braced")
        parts = _BRACED.match(body)
        if parts is None:
            raise ValueError(f"invalid interpolation ${{{body}}}")
        value = environ.get(parts.group("name"))
        op = parts.group("op")
        if op is None:
            return value or ""
        arg = interpolate(parts.group("arg"), environ)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return value if value is not None else arg
        if op == ":+":
            return arg if value else ""
        if op == "+":
            return arg if value is not None else ""
        return value or ""  # :? and ?

    return _VARIABLE.sub(substitute, text)


# ── compose files ──────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class ComposeService:
    """One compose service, reduced to what the lint needs.

    ``argv`` is ``entrypoint`` + ``command`` after interpolation and splitting (just the
    command when the service keeps its image's entrypoint); ``raw`` is the same text
    before interpolation, to see whether a flag's value came from a variable.
    """

    name: str
    file: Path
    project: str | None
    container_name: str | None
    image: str | None
    argv: tuple[str, ...]
    raw: str
    profiles: tuple[str, ...] = ()
    has_entrypoint: bool = False
    #: the service's ``environment`` (interpolated); ``env_file`` is not read
    environment: Mapping[str, str] = field(default_factory=dict)
    has_env_file: bool = False

    @property
    def container(self) -> str | None:
        """The container's name: ``container_name``, else ``{project}-{service}-1``."""
        if self.container_name:
            return self.container_name
        return None if self.project is None else f"{self.project}-{self.name}-1"

    @property
    def label(self) -> str:
        """``service "omni" (docker-compose.yml)``."""
        return f'service "{self.name}" ({self.file.name})'


def _project_default(path: Path) -> str | None:
    """Compose's default project name: the folder's name, lower-cased, [a-z0-9_-]."""
    name = re.sub(r"[^a-z0-9_-]", "", path.resolve().parent.name.lower()).lstrip("_-")
    return name or None


def _words(value: object, where: str, environ: Mapping[str, str]) -> tuple[list[str], str]:
    """A command or entrypoint (string or list) as (argv, raw text)."""
    if value is None:
        return [], ""
    if isinstance(value, str):
        try:
            return shlex.split(interpolate(value, environ)), value
        except ValueError as exc:
            raise ComposeError([f"{where}: cannot split into arguments ({exc})"]) from None
    if isinstance(value, list) and all(
        isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
    ):
        try:
            return [interpolate(str(v), environ) for v in value], " ".join(str(v) for v in value)
        except ValueError as exc:
            raise ComposeError([f"{where}: {exc}"]) from None
    raise ComposeError([f"{where}: must be a string or a list of strings, got {value!r}"])


def _environment(value: object, where: str, environ: Mapping[str, str]) -> dict[str, str]:
    """A service's ``environment`` (a mapping, or a list of ``KEY=VALUE``) as text."""
    if value is None:
        return {}
    out: dict[str, str] = {}
    try:
        if isinstance(value, dict):
            for key, v in value.items():
                if v is not None:
                    out[str(key)] = interpolate(
                        str(v).lower() if isinstance(v, bool) else str(v), environ
                    )
            return out
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            for item in value:
                key, eq, v = item.partition("=")
                if eq:
                    out[key] = interpolate(v, environ)
            return out
    except ValueError as exc:
        raise ComposeError([f"{where}: {exc}"]) from None
    raise ComposeError([f"{where}: must be a mapping or a list of KEY=VALUE, got {value!r}"])


def _text(value: object, where: str, environ: Mapping[str, str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ComposeError([f"{where}: must be a string, got {value!r}"])
    try:
        return interpolate(value, environ)
    except ValueError as exc:
        raise ComposeError([f"{where}: {exc}"]) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ComposeError([f"{path}: cannot read the compose file: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ComposeError([f"{path}: cannot read the compose file: {exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}: line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ComposeError([f"{where}: YAML syntax error: {problem}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ComposeError([f"{path}: a compose file must be a mapping, got {type(data).__name__}"])
    return data


def _merge_files(
    paths: Sequence[str | Path], env: Mapping[str, str]
) -> tuple[dict[str, dict[str, Any]], dict[str, Path], str | None]:
    """The files' services merged by name (a later file's keys win), the file that last
    declared each, and the project name. Raises :class:`ComposeError` with every problem."""
    merged: dict[str, dict[str, Any]] = {}
    files: dict[str, Path] = {}
    project: str | None = None
    problems: list[str] = []
    for raw_path in paths:
        path = Path(raw_path)
        try:
            data = _read_yaml(path)
        except ComposeError as exc:
            problems.extend(exc.problems)
            continue
        name = data.get("name")
        if isinstance(name, str) and name:
            project = interpolate(name, env)
        elif project is None:
            project = _project_default(path)
        services = data.get("services", {})
        if services is None:
            services = {}
        if not isinstance(services, dict):
            problems.append(f"{path}: services: must be a mapping of service name to service")
            continue
        for sname, body in services.items():
            if not isinstance(body, dict):
                problems.append(f"{path}: services.{sname}: must be a mapping")
                continue
            merged.setdefault(str(sname), {}).update(body)
            files[str(sname)] = path
    if problems:
        raise ComposeError(problems)
    return merged, files, project


def load_compose(
    paths: Sequence[str | Path], *, environ: Mapping[str, str] | None = None
) -> dict[str, ComposeService]:
    """Read compose files into services by name, merged like ``docker compose -f a -f b``.

    A later file's keys override an earlier file's for the same service (a new
    ``command`` replaces the old one whole). Raises :class:`ComposeError` with every
    problem found.
    """
    env: Mapping[str, str] = environ or {}
    if not paths:
        raise ComposeError(["no compose file given"])
    merged, files, project = _merge_files(paths, env)
    problems: list[str] = []
    out: dict[str, ComposeService] = {}
    for sname, body in merged.items():
        where = f"{files[sname]}: services.{sname}"
        try:
            entry, entry_raw = _words(body.get("entrypoint"), f"{where}.entrypoint", env)
            command, command_raw = _words(body.get("command"), f"{where}.command", env)
            profiles = body.get("profiles") or []
            out[sname] = ComposeService(
                name=sname,
                file=files[sname],
                project=project,
                container_name=_text(body.get("container_name"), f"{where}.container_name", env),
                image=_text(body.get("image"), f"{where}.image", env),
                argv=(*entry, *command),
                raw=f"{entry_raw} {command_raw}".strip(),
                profiles=tuple(str(p) for p in profiles) if isinstance(profiles, list) else (),
                has_entrypoint="entrypoint" in body,
                environment=_environment(body.get("environment"), f"{where}.environment", env),
                has_env_file=body.get("env_file") is not None,
            )
        except ComposeError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ComposeError(problems)
    return out


# ── engine and render ──────────────────────────────────────────────────────────


def resolve_engine(serve: ServeModel, service: ComposeService | None) -> tuple[str | None, str]:
    """The engine that runs ``serve`` and how it was found: command, image, or label."""
    if service is not None:
        found = engine_of_argv(service.argv)
        if found is not None:
            return found, "command"
        if not service.has_entrypoint:
            found = engine_of_image(service.image)
            if found is not None:
                return found, "image"
    return normalize_engine(serve.engine), "label"


@dataclass(frozen=True, slots=True)
class RenderedServe:
    """:func:`render_serve`'s answer: the flag, how the engine was found, the service."""

    result: RenderResult
    engine_source: str
    service: str | None = None
    #: what the engine needs for its sleep API, for a serve with ``[serve.sleep]``
    sleep: SleepNeeds | None = None
    #: the engine's limit flags (a serve without ``[serve.model]`` has only onnx-genai's)
    limits: tuple[Limit, ...] = ()
    #: what the engine needs for ``elastic``, for a serve that declares it
    elastic: ElasticRender | None = None
    #: the KV cache type flags, for a serve whose ``kv_dtype`` is not its engine's default
    cache_types: CacheTypeRender | None = None
    #: the one verdict on its model (statemachine/flags/verdict.py; ``None``: no model known)
    verdict: ReservationCheck | None = None

    @property
    def cannot_load(self) -> bool:
        """True when the model cannot load in the reservation (the one verdict)."""
        return bool(self.refused) or (self.verdict is not None and self.verdict.error)

    @property
    def argv(self) -> tuple[str, ...]:
        """Every flag rendered: the fraction's, the limits', the cache types', the elastic
        ones."""
        elastic = () if self.elastic is None else self.elastic.argv
        cache = () if self.cache_types is None else self.cache_types.argv
        limits = tuple(w for limit in self.limits for w in limit.argv)
        return (*self.result.argv, *limits, *cache, *elastic)

    @property
    def refused(self) -> tuple[Limit, ...]:
        """The limits that say the model cannot load in its reservation."""
        return tuple(limit for limit in self.limits if limit.refused)

    def to_json(self) -> dict[str, Any]:
        """The render JSON plus ``engine_source``, ``service`` and ``sleep``; ``limits``,
        ``cache_types`` and ``elastic`` where there are some."""
        extra: dict[str, Any] = {}
        if self.limits:
            extra["limits"] = [limit.to_json() for limit in self.limits]
        if self.cache_types is not None:
            extra["cache_types"] = self.cache_types.to_json()
        if self.elastic is not None:
            extra["elastic"] = self.elastic.to_json()
        if self.verdict is not None:
            extra["verdict"] = self.verdict.to_json()
        return {
            **self.result.to_json(),
            "engine_source": self.engine_source,
            "service": self.service,
            "sleep": None if self.sleep is None else self.sleep.to_json(),
            **extra,
        }


def _elastic_for(serve: ServeModel, engine: str | None) -> ElasticRender | None:
    """What an elastic serve's engine needs: its own entry's configuration where it has
    one, else that of the registered engine with an elastic endpoint."""
    if serve.elastic is None:
        return None
    found = engines.lookup(engine)
    config = found.elastic if found is not None else None
    if config is None:
        config = next((e.elastic for e in engines.engines(lambda e: e.elastic is not None)), None)
    return None if config is None else render_elastic(config, serve.elastic.segment_mib)


def _kv_dtype(serve: ServeModel) -> str | None:
    """The KV cache type of the serve's ``[serve.model]`` (``None`` without one)."""
    return serve.model.kv_dtype if isinstance(serve.model, ModelModel) else None


def _cache_types_for(serve: ServeModel, engine: str | None) -> CacheTypeRender | None:
    """The KV cache type flags the serve's engine needs for its ``kv_dtype``."""
    found = engines.lookup(engine)
    return render_cache_types(found.cache_types if found else None, _kv_dtype(serve))


def _check_cache_types(
    serve: ServeModel, service: ComposeService, engine: str | None
) -> list[Finding]:
    """The command's KV cache type against the serve's ``kv_dtype``."""
    found, kv_dtype = engines.lookup(engine), _kv_dtype(serve)
    if found is None or found.cache_types is None or kv_dtype is None:
        return []
    finding = check_cache_types(
        found.cache_types,
        kv_dtype,
        service.argv,
        service.environment,
        serve=serve.name,
        service=service.name,
    )
    return [] if finding is None else [finding]


def _check_self_sleep(
    serve: ServeModel, service: ComposeService, engine: str | None
) -> list[Finding]:
    """The note on an engine that sleeps by itself (statemachine/flags/self_sleep.py)."""
    found = engines.lookup(engine)
    if found is None or found.self_sleep is None:
        return []
    vram = serve.vram_mib if isinstance(serve.vram_mib, int) else None
    finding = check_self_sleep(
        found.self_sleep,
        service.argv,
        service.environment,
        serve=serve.name,
        service=service.name,
        vram_mib=vram,
    )
    return [] if finding is None else [finding]


def render_fraction(
    serve: ServeModel,
    engine: str | None,
    totals: Mapping[str, DeviceTotal],
    *,
    places: int = DEFAULT_PLACES,
) -> RenderResult:
    """The memory-fraction flag for ``serve`` (:func:`render_flag`).

    A placed serve runs on one of its candidates, never on all: each candidate's fraction
    is rendered on its own. When they are the same value the flag is that value, checked
    against every candidate's total; when they differ, no one command line holds the
    reservation on each card, and the answer is a ``fraction-per-card`` problem naming
    each (render with one card's total, ``--device-total``, to get its flag).
    """
    if serve.placement is None:
        return render_flag(serve.name, engine, serve.vram_mib, serve.roles, totals, places=places)
    each = [
        render_flag(serve.name, engine, serve.vram_mib, (r,), totals, places=places)
        for r in serve.placement
    ]
    unrendered = next((r for r in each if r.fraction is None), None)
    if unrendered is not None:
        return unrendered
    known = tuple(t for r in each for t in r.totals)
    if len({r.fraction for r in each}) == 1:
        candidates = ", ".join(serve.placement)
        return replace(
            each[0],
            totals=known,
            explanation=f"{each[0].explanation}; the same on each placement candidate "
            f"({candidates}): the serve runs on one of them",
        )
    values = "; ".join(f"{r.value} on {r.totals[0].describe()}" for r in each)
    problem = (
        f"the fraction differs per card: {serve.vram_mib} MiB is {values}; the serve "
        "runs on whichever placement candidate the controller chooses, so no one command "
        "line holds its reservation on each (render one card's flag with its "
        "--device-total, or give the candidates one capacity)"
    )
    return replace(
        each[0],
        totals=known,
        fraction=None,
        explanation=problem,
        problem=problem,
        problem_kind=FindingKind.PER_CARD,
    )


def _totals_for(
    mset: ManifestSet, measured: Mapping[str, int] | None, measured_source: str
) -> dict[str, DeviceTotal]:
    roles = {rid: role.to_role() for rid, role in mset.roles.items()}
    return role_totals(roles, measured, measured_source=measured_source)


def serve_flag_budget(mset: ManifestSet, name: str) -> tuple[int, str] | None:
    """What serve ``name``'s rendered memory flag gives its engine on one GPU (the
    manifest's engine, the declared device totals), for the verdict on its model."""
    serve = mset.serves[name]
    key = normalize_engine(serve.engine)
    return render_fraction(serve, key, _totals_for(mset, None, SOURCE_NVML)).budget()


def _services_by_container(services: Mapping[str, ComposeService]) -> dict[str, ComposeService]:
    out: dict[str, ComposeService] = {}
    for service in services.values():
        container = service.container
        if container is not None:
            out.setdefault(container, service)
    return out


def _service_for(
    serve: ServeModel,
    services: Mapping[str, ComposeService],
    by_container: Mapping[str, ComposeService],
) -> ComposeService | None:
    found = by_container.get(serve.container)
    if found is not None:
        return found
    same = services.get(serve.name)
    if same is not None and same.container_name is None:
        return same
    return None


def render_serve(
    mset: ManifestSet,
    name: str,
    *,
    measured: Mapping[str, int] | None = None,
    measured_source: str = SOURCE_NVML,
    engine: str | None = None,
    compose_paths: Sequence[str | Path] = (),
    environ: Mapping[str, str] | None = None,
    places: int = DEFAULT_PLACES,
    models: Mapping[str, Model] | None = None,
) -> RenderedServe:
    """The engine flag for serve ``name`` (KeyError when the set has no such serve).

    The engine is ``engine`` when given, else the one its compose service runs (with
    ``compose_paths``), else its label. ``measured`` gives device totals by role id (NVML,
    or a figure from the command line, named by ``measured_source``); other roles use
    their declared capacity. ``models`` are the figures of the serves' ``[serve.model]``
    (or why they are unknown), by serve name.
    """
    serve = mset.serves[name]
    service = None
    if compose_paths:
        services = load_compose(compose_paths, environ=environ)
        service = _service_for(serve, services, _services_by_container(services))
    if engine is not None:
        key, source = normalize_engine(engine), "given"
    else:
        key, source = resolve_engine(serve, service)
    totals = _totals_for(mset, measured, measured_source)
    result = render_fraction(serve, key, totals, places=places)
    if result.problem_kind is FindingKind.NO_ENGINE_FLAG and source == "label" and not service:
        flagged = " or ".join(
            e.display for e in engines.engines(lambda e: e.memory_flag is not None)
        )
        hint = (
            f"; if it runs {flagged} all the same, name the engine, or give its compose "
            "file so the engine is read from the command"
        )
        result = replace(
            result, problem=f"{result.problem}{hint}", explanation=result.explanation + hint
        )
    protocol = serve.sleep.resolved_protocol(serve.engine) if serve.sleep else None
    return RenderedServe(
        result,
        source,
        None if service is None else service.name,
        sleep_needs(protocol),
        _limits(serve, key, (models or {}).get(name), result, result.budget()),
        _elastic_for(serve, key),
        _cache_types_for(serve, key),
        _verdict(serve, key, (models or {}).get(name), result.budget()),
    )


def _verdict(
    serve: ServeModel, engine: str | None, model: Model | None, budget: tuple[int, str] | None
) -> ReservationCheck | None:
    """The one verdict on ``serve``'s model (statemachine/flags/verdict.py), where its files
    were read and it has a reservation on a GPU role."""
    if not isinstance(model, ModelInput) or serve.vram_mib is None or not serve.roles:
        return None
    found = engines.lookup(engine)
    terms = model_terms(model, serve.cards, found)
    return load_verdict(found, serve.vram_mib, terms, model, gpus=serve.cards, flag_budget=budget)


# ── lint ───────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class CheckedServe:
    """One serve matched to one compose service, and what its flag check found."""

    serve: str
    service: str
    file: Path
    engine: str | None
    engine_source: str
    flag: str | None
    found: str | None
    expected: str | None
    explanation: str
    ok: bool
    #: each limit flag checked and the value found (``None``: not set)
    limits: tuple[tuple[Limit, str | None], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (``limits`` where some were checked)."""
        extra: dict[str, Any] = {}
        if self.limits:
            extra["limits"] = [{**limit.to_json(), "found": found} for limit, found in self.limits]
        return {
            "serve": self.serve,
            "service": self.service,
            "file": str(self.file),
            "engine": self.engine,
            "engine_source": self.engine_source,
            "flag": self.flag,
            "found": self.found,
            "expected": self.expected,
            "explanation": self.explanation,
            "ok": self.ok,
            **extra,
        }


@dataclass(frozen=True, slots=True)
class LintReport:
    """Every finding of a lint, and every serve that was checked."""

    compose_files: tuple[Path, ...]
    tolerance: Decimal
    findings: tuple[Finding, ...]
    checked: tuple[CheckedServe, ...]

    @property
    def errors(self) -> tuple[Finding, ...]:
        """The findings that fail the lint."""
        return tuple(f for f in self.findings if f.is_error)

    @property
    def notes(self) -> tuple[Finding, ...]:
        """The findings that only explain."""
        return tuple(f for f in self.findings if not f.is_error)

    @property
    def ok(self) -> bool:
        """True when no finding is an error (the CLI exits 0)."""
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        """``{"ok", "compose_files", "tolerance", "errors", "notes", "findings", "checked"}``."""
        return {
            "ok": self.ok,
            "compose_files": [str(p) for p in self.compose_files],
            "tolerance": str(self.tolerance),
            "errors": len(self.errors),
            "notes": len(self.notes),
            "findings": [f.to_json() for f in self.findings],
            "checked": [c.to_json() for c in self.checked],
        }


def _up_hint(serve: ServeModel) -> str:
    """Where the serve's ``up`` says it is started, for a not-in-compose note."""
    if serve.up is None:
        return "it has no up command"
    try:
        argv = shlex.split(serve.up)
    except ValueError:
        return "its up command cannot be split"
    files = [
        argv[i + 1].rsplit("/", 1)[-1]
        for i, word in enumerate(argv[:-1])
        if word in {"-f", "--file"}
    ]
    if "compose" in argv or any(w.endswith("docker-compose") for w in argv):
        if files:
            return "its up command uses " + ", ".join(files)
        return "its up command runs docker compose without -f"
    program = " ".join(argv[:3])
    return f"its up command does not use docker compose ({program} …)"


def _command_budget(render: RenderResult, found: str | None) -> tuple[int, str] | None:
    """What the memory flag gives the engine: the command's fraction where it is the
    smaller (a value within the tolerance below the rendered one), else the rendered."""
    given = parse_fraction(found) if found is not None else None
    if given is None or render.fraction is None or given >= render.fraction:
        return render.budget()
    return render.budget(given)


def _limits(
    serve: ServeModel,
    engine: str | None,
    model: Model | None,
    render: RenderResult,
    budget: tuple[int, str] | None,
) -> tuple[Limit, ...]:
    """The engine's limit flags for ``serve``: its reservation, model, declared overhead,
    the budget its memory flag gives it and its devices' smallest total."""
    smallest = min((t.total_mib for t in render.totals), default=None)
    return render_limits(
        engines.lookup(engine),
        serve.vram_mib,
        model,
        gpus=serve.cards,
        flag_budget=budget,
        overhead_mib=serve.engine_overhead_mib,
        device_mib=smallest,
    )


def _check_limits(
    serve: ServeModel,
    service: ComposeService,
    engine: str | None,
    model: Model | None,
    render: RenderResult,
    budget: tuple[int, str] | None,
) -> tuple[tuple[tuple[Limit, str | None], ...], list[Finding]]:
    """The engine's limit flags and the elastic configuration against the command."""
    limits = _limits(serve, engine, model, render, budget)
    env = service.environment
    pairs = tuple((limit, found_value(service.argv, limit.flag, env)) for limit in limits)
    findings = [
        found
        for limit, value in pairs
        if (
            found := check_limit(
                limit,
                value,
                serve=serve.name,
                service=service.name,
                fitted=fits_to_reservation(limit.flag, service.argv, service.raw),
            )
        )
    ]
    elastic = _elastic_for(serve, engine)
    if elastic is not None:
        findings += check_elastic(elastic, service.argv, serve=serve.name, service=service.name)
    findings += _check_cache_types(serve, service, engine)
    findings += _check_self_sleep(serve, service, engine)
    return pairs, findings


def _check_pair(
    serve: ServeModel,
    service: ComposeService,
    totals: Mapping[str, DeviceTotal],
    tolerance: Decimal,
    model: Model | None = None,
) -> tuple[CheckedServe, list[Finding]]:
    engine, source = resolve_engine(serve, service)
    label = normalize_engine(serve.engine)
    findings: list[Finding] = []
    # a registered engine's name is a runtime; other labels (embedding, audio, ...) are purposes
    if source != "label" and label in engines.names() and label != engine:
        findings.append(
            Finding(
                FindingKind.ENGINE_MISMATCH,
                f"the manifest says engine {serve.engine!r} but {service.label} runs "
                f"{engine!r} (from its {source}); checked as {engine!r}",
                serve.name,
                service.name,
                {"label": serve.engine, "engine": engine, "engine_source": source},
            )
        )
    render = render_fraction(serve, engine, totals)
    flag = render.flag
    values = flag_values(service.argv, flag) if flag else []
    found = values[-1] if values else None
    if len(values) > 1:
        findings.append(
            Finding(
                FindingKind.REPEATED_FLAG,
                f"{service.label} gives {flag} {len(values)} times ({', '.join(values)}); "
                f"the engine takes the last, {found}",
                serve.name,
                service.name,
                {"flag": flag, "values": values},
            )
        )
    if flag and found is not None and not render.of_free and flag_from_variable(service.raw):
        findings.append(
            Finding(
                FindingKind.FROM_VARIABLE,
                f"{service.label} takes {flag} from a variable; checked its value with "
                f"nothing set in the environment: {found}",
                serve.name,
                service.name,
                {"flag": flag, "found": found},
            )
        )
    budget = _command_budget(render, found)
    limits, limit_findings = _check_limits(serve, service, engine, model, render, budget)
    main = check_fraction(render, found, tolerance=tolerance, service=service.name, raw=service.raw)
    # an engine held by its limit flags is not "kept by the ledger only"
    if main is not None and not (limits and main.kind is FindingKind.NO_ENGINE_FLAG):
        findings.append(main)
    protocol = serve.sleep.resolved_protocol(serve.engine) if serve.sleep else None
    if protocol is not None:
        findings.extend(_check_sleep(serve.name, protocol, service, engine))
    findings.extend(limit_findings)
    checked = CheckedServe(
        serve=serve.name,
        service=service.name,
        file=service.file,
        engine=engine,
        engine_source=source,
        flag=flag,
        found=found,
        expected=render.value,
        explanation=render.explanation,
        ok=not any(f.is_error for f in findings),
        limits=limits,
    )
    return checked, findings


def _check_sleep(
    serve: str, protocol: str, service: ComposeService, engine: str | None
) -> list[Finding]:
    """``[serve.sleep]`` against the service's command and environment.

    A variable the environment lacks may come from an ``env_file`` (which is not read):
    then only the command line is checked, and a note says so.
    """
    needs = sleep_needs(protocol)
    env = dict(service.environment)
    unread: list[str] = []
    if needs is not None and service.has_env_file:
        for key, value in needs.env.items():
            if env.get(key) != value:
                env[key] = value  # assumed set there; said below
                unread.append(f"{key}={value}")
    found = check_sleep(serve, protocol, service.argv, env, engine=engine, service=service.name)
    if unread:
        found.append(
            Finding(
                FindingKind.SLEEP_ENV_UNREAD,
                f"{service.label} does not set {', '.join(unread)} in its environment; "
                "it may come from its env_file, which is not read: the engine's sleep API "
                "needs it",
                serve,
                service.name,
                {"missing": unread},
            )
        )
    return found


def _serves_by_service(
    mset: ManifestSet,
    services: Mapping[str, ComposeService],
    by_container: Mapping[str, ComposeService],
) -> dict[str, ServeModel]:
    """The serve each compose service runs, by service name (the first serve wins)."""
    serve_of: dict[str, ServeModel] = {}
    for candidate in mset.serves.values():
        runs = _service_for(candidate, services, by_container)
        if runs is not None:
            serve_of.setdefault(runs.name, candidate)
    return serve_of


def _no_serve_finding(service: ComposeService) -> Finding | None:
    """A NO_SERVE finding for a service no serve owns that sets engine flags, else None."""
    set_flags = {
        flag: values[-1]
        for flag in engine_flags().values()
        if (values := flag_values(service.argv, flag))
    }
    if not set_flags:
        return None
    shown = ", ".join(f"{flag} {value}" for flag, value in set_flags.items())
    return Finding(
        FindingKind.NO_SERVE,
        f"{service.label} sets {shown} but no manifest serve declares its "
        f"container {service.container!r}: the ledger does not count it",
        None,
        service.name,
        {"container": service.container, "flags": set_flags},
    )


def _not_in_compose_finding(
    serve: ServeModel,
    services: Mapping[str, ComposeService],
    compose_paths: Sequence[str | Path],
) -> Finding:
    """A NOT_IN_COMPOSE finding for a reserving serve whose container no service runs."""
    same = services.get(serve.name)
    hint = _up_hint(serve)
    if same is not None:
        hint = f"{same.label} has its name but runs container {same.container!r}; " + hint
    return Finding(
        FindingKind.NOT_IN_COMPOSE,
        f"reserves {serve.vram_mib} MiB but no service in "
        f"{', '.join(Path(p).name for p in compose_paths)} runs its container "
        f"{serve.container!r}, so its engine flag was not checked; {hint}",
        serve.name,
        None,
        {"container": serve.container, "vram_mib": serve.vram_mib},
    )


def lint_compose(
    mset: ManifestSet,
    compose_paths: Sequence[str | Path],
    *,
    measured: Mapping[str, int] | None = None,
    measured_source: str = SOURCE_NVML,
    tolerance: Decimal | float | str = DEFAULT_TOLERANCE,
    environ: Mapping[str, str] | None = None,
    models: Mapping[str, Model] | None = None,
) -> LintReport:
    """Check every serve the compose files run against its reservation.

    ``measured`` gives device totals by role id (NVML); other roles use their declared
    capacity. ``tolerance`` is a fraction of the device total (default 0.001).
    ``models``: the figures of the serves' ``[serve.model]`` by serve name. Raises
    :class:`ComposeError` when a compose file cannot be read.
    """
    tol = Decimal(str(tolerance))
    if not tol.is_finite() or tol < 0:
        raise ValueError(f"a tolerance must not be negative, got {tolerance}")
    services = load_compose(compose_paths, environ=environ)
    totals = _totals_for(mset, measured, measured_source)

    serve_of = _serves_by_service(mset, services, _services_by_container(services))
    findings: list[Finding] = []
    checked: list[CheckedServe] = []
    matched: set[str] = set()
    for service in services.values():
        owner = serve_of.get(service.name)
        if owner is None:
            stray = _no_serve_finding(service)
            if stray is not None:
                findings.append(stray)
            continue
        matched.add(owner.name)
        pair, pair_findings = _check_pair(
            owner, service, totals, tol, (models or {}).get(owner.name)
        )
        checked.append(pair)
        findings.extend(pair_findings)

    for serve in mset.serves.values():
        if serve.name in matched or serve.vram_mib is None:
            continue
        findings.append(_not_in_compose_finding(serve, services, compose_paths))
    return LintReport(
        compose_files=tuple(Path(p) for p in compose_paths),
        tolerance=tol,
        findings=tuple(findings),
        checked=tuple(checked),
    )


def report_lines(report: LintReport) -> list[str]:
    """The report as plain lines for people: one per checked serve, one per finding."""
    lines = [
        f"{len(report.checked)} serve(s) checked in "
        f"{', '.join(str(p) for p in report.compose_files)}; "
        f"{len(report.errors)} error(s), {len(report.notes)} note(s) "
        f"(tolerance ±{report.tolerance} of the device total)"
    ]
    for check in report.checked:
        status = "ok   " if check.ok else "ERROR"
        head = (
            f"{status} {check.serve} (service {check.service}, "
            f"{check.engine or 'no engine'} from {check.engine_source})"
        )
        if check.flag is None:
            lines.append(f"{head}: no memory-fraction flag to check")
        else:
            found = "not set" if check.found is None else check.found
            want = check.expected or "n/a"
            lines.append(f"{head}: {check.flag} {found}; the reservation renders {want}")
        for limit, value in check.limits:
            shown = "not set" if value is None else value
            want = "unknown" if limit.value is None else str(limit.value)
            lines.append(f"      {limit.flag.name} {shown}; the reservation renders {want}")
    for finding in report.findings:
        who = [f"serve {finding.serve}"] if finding.serve is not None else []
        if finding.service is not None:
            who.append(f"service {finding.service}")
        lines.append(
            f"{finding.severity.value}: {', '.join(who)}: {finding.kind.value}: {finding.message}"
        )
    return lines
