"""The manifest models: ``[[gpu_roles]]``, ``[[serve]]`` (its ``elastic``, its
``sleep``), ``[host]``, a file.

Pydantic models built from :mod:`controller.manifest.fields`; each converts to the
pure core's types (``to_role``, ``to_spec``) and to the runtime record the executor
reads. No I/O.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from controller.manifest.fields import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    DUAL_GPU_EXCLUSIVE,
    Boolean,
    ContainerName,
    DrainTimeout,
    Integer,
    KvDtypeName,
    MinRuntime,
    NonNegativeMiB,
    OptCandidateRoles,
    OptComposeProject,
    OptDesired,
    OptHealth,
    OptNonNegativeMiB,
    OptOperatingMode,
    OptPort,
    OptPositiveInt,
    OptPositiveMiB,
    OptResidency,
    OptRestoreSeconds,
    OptSleepProtocol,
    OptText,
    OptTtl,
    OptTwoRoles,
    OptUp,
    OptUpEnv,
    OptUrl,
    PositiveMiB,
    SegmentMiB,
    ServeName,
    SleepLevel,
    StartTimeout,
    StopTimeout,
    StringList,
    Text,
    Url,
    sleep_protocols,
)
from controller.manifest.runtime import ModelRef, ServeRuntime
from statemachine import engines
from statemachine.domain.types import (
    Elastic,
    GpuRole,
    HostBudget,
    ServeSpec,
    Sleep,
)
from statemachine.engines import Engine
from statemachine.sizing.needs import KV_DTYPES


class GpuRoleModel(BaseModel):
    """A [[gpu_roles]] row: one GPU with a capacity and a never-reservable reserve."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: Text = Field(description="The role's id, named by serves' gpu_role / gpu_roles.")
    vram_mib: PositiveMiB = Field(description="The GPU's capacity in MiB.")
    reserve_mib: NonNegativeMiB = Field(
        default=0, description="MiB never reservable (driver/OS overhead); at most vram_mib."
    )
    uuid: OptText = Field(default=None, description="NVML device UUID this role runs on.")
    reserve_default_mib: OptNonNegativeMiB = Field(
        default=None,
        description="The operator's default reserve for this GPU, recorded beside a "
        "reserve_mib lowered or waived from it; at most vram_mib.",
    )
    reserve_rationale: OptText = Field(
        default=None,
        description="Why reserve_mib differs from reserve_default_mib (its scope and reason).",
    )

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


class ModelModel(BaseModel):
    """``[serve.model]``: the model's files, from which ``vramctl estimate`` reads what it
    needs (docs/sizing.md): the weights and, at ``context`` tokens, the KV cache."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: OptText = Field(
        default=None, description='The served model\'s name (informational, as `model = "…"`).'
    )
    path: Text = Field(
        description="The model: a .gguf file, a .safetensors file, a folder of safetensors "
        "shards with its config.json, or a model.safetensors.index.json; relative to the "
        "manifest's folder."
    )
    context: OptPositiveInt = Field(
        default=None,
        description="Tokens of context the KV cache holds per sequence (default: the "
        "model's own context length).",
    )
    kv_dtype: KvDtypeName = Field(
        default="f16", description="How the engine stores its KV cache: " + ", ".join(KV_DTYPES)
    )
    parallel: OptPositiveInt = Field(
        default=1, description="Sequences the engine serves at once, each with its own cache."
    )

    def to_ref(self, manifest_dir: Path) -> ModelRef:
        """The shell's :class:`ModelRef`, its path resolved against ``manifest_dir``."""
        return ModelRef(
            path=(manifest_dir / self.path).resolve(),
            context=self.context,
            kv_dtype=self.kv_dtype,
            parallel=self.parallel or 1,
        )


def _model_kind(value: object) -> str:
    """Which form ``model`` takes: a table (``[serve.model]``) or a name."""
    return MODEL_TABLE if isinstance(value, dict | ModelModel) else MODEL_NAME


#: the tags of ``model``'s two forms (a located error leaves them out of the field's name)
MODEL_TABLE, MODEL_NAME = "model-table", "model-name"
ModelField = Annotated[
    Annotated[ModelModel, Tag(MODEL_TABLE)] | Annotated[OptText, Tag(MODEL_NAME)],
    Discriminator(_model_kind),
]


class SleepModel(BaseModel):
    """``[serve.sleep]``: the serve's engine can sleep instead of stopping (vLLM, SGLang).

    Rules across fields (``residual_mib < vram_mib``, ``host_ram_mib`` at level 1, the
    URL and the protocol when they are not given) are the loader's, which locates them.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    level: SleepLevel = Field(
        description="1: the weights move to host RAM (fast wake); 2: they are dropped "
        "and reloaded on wake."
    )
    residual_mib: PositiveMiB = Field(
        description="VRAM a sleeping engine still holds on each of the serve's gpu roles "
        "(CUDA context, buffers); less than vram_mib."
    )
    host_ram_mib: OptNonNegativeMiB = Field(
        default=None,
        description="Host RAM a level-1 sleeper holds (its weights); required at level 1.",
    )
    url: OptUrl = Field(
        default=None, description="The engine's base URL; default http://127.0.0.1:{port}."
    )
    protocol: OptSleepProtocol = Field(
        default=None,
        description=" | ".join(f'"{name}"' for name in sleep_protocols())
        + "; default from the serve's engine.",
    )
    wake_s: OptRestoreSeconds = Field(
        default=None,
        description="Seconds from its wake calls until it is healthy, declared until the "
        "controller has measured a wake; at most 86400.",
    )

    def resolved_url(self, port: int | None) -> str | None:
        """``url``, else ``http://127.0.0.1:{port}`` (None without either)."""
        if self.url is not None:
            return self.url
        return None if port is None else f"http://127.0.0.1:{port}"

    def resolved_protocol(self, engine: str | None) -> str | None:
        """``protocol``, else the serve's engine when it names one (None: cannot tell)."""
        if self.protocol is not None:
            return self.protocol
        name = (engine or "").strip().lower()
        return name if name in sleep_protocols() else None

    def to_sleep(self, port: int | None, engine: str | None) -> Sleep:
        """The core's :class:`Sleep` (the loader checked the URL and protocol resolve)."""
        protocol = self.resolved_protocol(engine)
        assert protocol is not None, "checked by the loader"
        return Sleep(
            level=self.level,
            residual_mib=self.residual_mib,
            protocol=protocol,
            host_ram_mib=self.host_ram_mib or 0,
            url=self.resolved_url(port),
            wake_s=self.wake_s,
        )


class HostModel(BaseModel):
    """The top-level ``[host]`` table: host RAM as a ledger budget, like a GPU role's."""

    model_config = ConfigDict(extra="allow", frozen=True)

    ram_mib: PositiveMiB = Field(description="The host's RAM in MiB.")
    reserve_mib: NonNegativeMiB = Field(
        default=0, description="MiB of host RAM never given to sleepers; at most ram_mib."
    )

    def to_host(self) -> HostBudget:
        """The core's :class:`HostBudget`."""
        return HostBudget(ram_mib=self.ram_mib, reserve_mib=self.reserve_mib)


def _has_metrics(engine: Engine | None) -> bool:
    """True when ``engine`` is known and its metrics page tells its requests in flight."""
    return engine is not None and bool(engine.inflight_metrics)


def _label(engine: Engine) -> str:
    """How the manifest's docs spell an engine: its first alias, else its name."""
    return engine.aliases[0] if engine.aliases else engine.name


def _spoken(words: list[str]) -> str:
    """``a, b or c``."""
    return " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


class ServeModel(BaseModel):
    """A [[serve]] table: one model container and its VRAM reservation.

    Each field is validated on its own here; rules across fields (gpu_role with
    gpu_roles or placement, dual-gpu-exclusive, elastic floor) and across serves (names, ports,
    mirrors) are checked by the loader, which locates them.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: ServeName = Field(description="The serve's name (what `vramctl up NAME` takes).")
    container: ContainerName = Field(
        description="The Docker container name; serves de-duplicate by it."
    )
    runtime: OptText = None
    stack: OptText = None
    port: OptPort = Field(
        default=None, description="Host port; serves sharing one cannot both run."
    )
    model: ModelField = Field(
        default=None,
        description="The served model: its name (a string, informational), or a "
        "[serve.model] table naming its files, from which vramctl estimates what it needs.",
    )
    served_name: OptText = None
    engine: OptText = None
    health: OptHealth = Field(default=None, description="HTTP health path on 127.0.0.1:{port}.")
    metrics_url: OptUrl = Field(
        default=None,
        description="The engine's Prometheus metrics, read for its requests in flight "
        "(default: http://127.0.0.1:{port}/metrics for a "
        + _spoken([_label(e) for e in engines.engines(_has_metrics)])
        + " engine).",
    )
    gpu_role: OptText = Field(default=None, description="The one gpu role this serve uses.")
    gpu_roles: OptTwoRoles = Field(
        default=None, description="Two gpu roles (tensor parallel); not with gpu_role."
    )
    placement: OptCandidateRoles = Field(
        default=None,
        description="The gpu roles the serve may run on, each able to hold the whole "
        "reservation; the controller chooses one card (docs/placement.md). Not with "
        "gpu_role or gpu_roles.",
    )
    vram_mib: OptPositiveMiB = Field(
        default=None, description="MiB reserved on each of the serve's gpu roles."
    )
    engine_overhead_mib: OptNonNegativeMiB = Field(
        default=None,
        description="MiB the engine uses outside its own memory limit (CUDA context, "
        "activations, runtime): onnx-genai's --vram-limit is vram_mib less it "
        "(docs/limits.md); measure it with `vramctl calibrate`.",
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
        description="Start command, shlex-split ({dir} = the manifest's folder; at each "
        "start {gpu_role}, {gpu_uuid}, {gpu_index} = where the serve was put), never a shell.",
    )
    up_env: OptUpEnv = Field(
        default=None,
        description="Extra environment variables for `up` (it gets only PATH, HOME, locale, "
        "Docker's and Compose's own variables otherwise, and the controller's VRAMCTL_GPU_*, "
        "which win).",
    )
    compose_project: OptComposeProject = Field(
        default=None,
        description="The Compose project that owns the container (default: the -p / "
        "--project-name of `up`); a container of that name labelled with another project "
        "is foreign: never started, stopped or removed.",
    )
    gpu_inference: Boolean = Field(
        default=True, description="false: not excluded by dual-gpu-exclusive serves."
    )
    desired: OptDesired = Field(
        default=None, description="running | stopped; absent = unmanaged (never started/stopped)."
    )
    priority: Integer = Field(default=0, description="Lower is evicted first among equals.")
    min_runtime_s: MinRuntime = Field(
        default=0.0, description="Not evicted within this of starting."
    )
    start_timeout_s: StartTimeout = DEFAULT_START_TIMEOUT_S
    stop_timeout_s: StopTimeout = DEFAULT_STOP_TIMEOUT_S
    drain_timeout_s: DrainTimeout = DEFAULT_DRAIN_TIMEOUT_S
    idle_ttl_s: OptTtl = None
    cold_start_s: OptRestoreSeconds = Field(
        default=None,
        description="Seconds from its start until it is healthy, declared until the "
        "controller has measured a cold start; at most 86400.",
    )
    elastic: ElasticModel | None = None
    sleep: SleepModel | None = Field(
        default=None, description="The engine can sleep instead of stopping ([serve.sleep])."
    )

    @property
    def roles(self) -> tuple[str, ...]:
        """The gpu roles the serve names (from gpu_role, gpu_roles or placement), maybe
        empty. A placed serve's are its candidates: it runs on one of them, never on all
        (:attr:`cards`)."""
        if self.placement is not None:
            return tuple(self.placement)
        if self.gpu_roles is not None:
            return tuple(self.gpu_roles)
        if self.gpu_role is not None:
            return (self.gpu_role,)
        return ()

    @property
    def roles_field(self) -> str:
        """The field that names :attr:`roles` (``placement``, ``gpu_roles``, ``gpu_role``)."""
        if self.placement is not None:
            return "placement"
        return "gpu_roles" if self.gpu_roles is not None else "gpu_role"

    @property
    def cards(self) -> int:
        """How many GPUs the engine runs on: one for a placed serve, else one per role
        (two for tensor parallel; none without a role)."""
        return 1 if self.placement is not None else len(self.roles)

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

    def up_compose_project(self) -> str | None:
        """The Compose project ``up`` runs its stack under: the value of its ``-p`` /
        ``--project-name`` (``docker compose`` or ``docker-compose``), else the
        ``COMPOSE_PROJECT_NAME`` of its ``up_env``; ``None`` when it names none."""
        if self.up is not None:
            project = compose_project_of(shlex.split(self.up))
            if project is not None:
                return project
        return (self.up_env or {}).get("COMPOSE_PROJECT_NAME")

    def owner_project(self) -> str | None:
        """The Compose project that owns the serve's container: ``compose_project``,
        else the one its ``up`` names (:meth:`up_compose_project`)."""
        return self.compose_project or self.up_compose_project()

    def to_runtime(self, manifest_dir: str | Path) -> ServeRuntime:
        """The executor's :class:`ServeRuntime`; ``manifest_dir``: the defining file's folder."""
        argv = self.up_argv(manifest_dir)
        return ServeRuntime(
            name=self.name,
            start_timeout_s=self.start_timeout_s,
            stop_timeout_s=self.stop_timeout_s,
            drain_timeout_s=self.drain_timeout_s,
            health=self.health,
            up_argv=None if argv is None else tuple(argv),
            manifest_dir=Path(manifest_dir).resolve(),
            up_env=self.up_env,
            engine=self.engine,
            model=self.model.to_ref(Path(manifest_dir).resolve())
            if isinstance(self.model, ModelModel)
            else None,
        )

    def metrics_source(self) -> str | None:
        """Where the engine's metrics are read: ``metrics_url``, else the default URL of
        a known engine (vLLM, SGLang, llama.cpp server) on its port, else ``None``."""
        if self.metrics_url is not None:
            return self.metrics_url
        if self.port is not None and _has_metrics(engines.lookup(self.engine)):
            return f"http://127.0.0.1:{self.port}/metrics"
        return None

    def to_spec(self) -> ServeSpec:
        """The core's :class:`ServeSpec`."""
        return ServeSpec(
            name=self.name,
            container=self.container,
            gpu_roles=self.roles,  # a placed serve's: every candidate, until one is chosen
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
            sizes_from_free=_sizes_from_free(self.engine),
            sleep=None if self.sleep is None else self.sleep.to_sleep(self.port, self.engine),
            compose_project=self.owner_project(),
            placement=tuple(self.placement or ()),
            cold_start_s=self.cold_start_s,
        )


def _sizes_from_free(label: str | None) -> bool:
    """True when the serve's engine sizes its memory pool from the device's free memory
    when it loads: its starts are serialised per GPU (two at once would each count the
    other's room)."""
    found = engines.lookup(label)
    return found is not None and found.sizes_from_free


class ManifestFile(BaseModel):
    """A vramctl manifest file: [[gpu_roles]] capacity rows and [[serve]] tables.

    The real stack's [[promotion]] tables are known and ignored; any other top-level key
    loads with a warning that names it (an error under ``validate --strict``).
    """

    model_config = ConfigDict(extra="allow", title="vramctl manifest")

    gpu_roles: list[GpuRoleModel] = Field(default_factory=list)
    serve: list[ServeModel] = Field(default_factory=list)
    host: HostModel | None = None
    allow_empty: bool = Field(
        default=False,
        description="true: the set may declare no serve and no gpu role (else refused).",
    )


# ── one file ───────────────────────────────────────────────────────────────────


#: Docker's global flags that take a value (``docker --context X compose …``)
_DOCKER_VALUED = frozenset(
    {"-c", "--context", "-H", "--host", "--config", "-l", "--log-level"}
    | {"--tlscacert", "--tlscert", "--tlskey"}
)
#: Compose's global flags that take a value (``docker compose -f FILE -p NAME up``)
_COMPOSE_VALUED = frozenset(
    {"-f", "--file", "-p", "--project-name", "--profile", "--env-file"}
    | {"--project-directory", "--ansi", "--progress", "--parallel"}
)


def _global_flags(words: list[str], valued: frozenset[str]) -> tuple[list[str], int]:
    """The global flags (each with its value) before a command's subcommand, and where
    that subcommand is (``len(words)`` when there is none)."""
    flags: list[str] = []
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        flags.append(words[i])
        if words[i] in valued and i + 1 < len(words):
            flags.append(words[i + 1])
            i += 1
        i += 1
    return flags, i


def compose_project_of(argv: list[str]) -> str | None:
    """The project a Compose command line names with ``-p NAME`` / ``-pNAME`` /
    ``-p=NAME`` / ``--project-name NAME`` / ``--project-name=NAME`` among Compose's
    global flags (the last one given, as Compose takes it); ``None`` when it is no
    Compose command or names none.

    A Compose command is ``docker [global flags] compose …`` or ``docker-compose …``.
    A command run through a shell or a script is not looked into: declare
    ``compose_project`` for it.
    """
    if not argv:
        return None
    program, words = Path(argv[0]).name, argv[1:]
    if program == "docker":
        _, at = _global_flags(words, _DOCKER_VALUED)
        if at >= len(words) or words[at] != "compose":
            return None
        words = words[at + 1 :]
    elif program != "docker-compose":
        return None
    flags, _ = _global_flags(words, _COMPOSE_VALUED)
    found: str | None = None
    for i, word in enumerate(flags):
        if word in ("-p", "--project-name") and i + 1 < len(flags):
            found = flags[i + 1]
        elif word.startswith(("--project-name=", "-p=")):
            found = word.partition("=")[2]
        elif word.startswith("-p") and not word.startswith("-p=") and len(word) > 2:
            found = word[2:]
    return found
