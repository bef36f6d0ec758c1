"""The manifest models: ``[[gpu_roles]]``, ``[[serve]]`` (and its ``elastic``), a file.

Pydantic models built from :mod:`controller.manifest.fields`; each converts to the
pure core's types (``to_role``, ``to_spec``) and to the runtime record the executor
reads. No I/O.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from controller.manifest.fields import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    DUAL_GPU_EXCLUSIVE,
    Boolean,
    ContainerName,
    DrainTimeout,
    Integer,
    NonNegativeMiB,
    OptDesired,
    OptHealth,
    OptOperatingMode,
    OptPort,
    OptPositiveInt,
    OptPositiveMiB,
    OptResidency,
    OptText,
    OptTtl,
    OptTwoRoles,
    OptUp,
    OptUpEnv,
    OptUrl,
    PositiveMiB,
    Seconds,
    SegmentMiB,
    ServeName,
    StartTimeout,
    StopTimeout,
    StringList,
    Text,
    Url,
)
from controller.manifest.runtime import ServeRuntime
from statemachine.types import Elastic, GpuRole, ServeSpec


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

    name: ServeName = Field(description="The serve's name (what `vramctl up NAME` takes).")
    container: ContainerName = Field(
        description="The Docker container name; serves de-duplicate by it."
    )
    runtime: OptText = None
    stack: OptText = None
    port: OptPort = Field(
        default=None, description="Host port; serves sharing one cannot both run."
    )
    model: OptText = None
    served_name: OptText = None
    engine: OptText = None
    health: OptHealth = Field(default=None, description="HTTP health path on 127.0.0.1:{port}.")
    metrics_url: OptUrl = Field(
        default=None,
        description="The engine's Prometheus metrics, read for its requests in flight "
        "(default: http://127.0.0.1:{port}/metrics for a vllm, sglang or llama.cpp engine).",
    )
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
    start_timeout_s: StartTimeout = DEFAULT_START_TIMEOUT_S
    stop_timeout_s: StopTimeout = DEFAULT_STOP_TIMEOUT_S
    drain_timeout_s: DrainTimeout = DEFAULT_DRAIN_TIMEOUT_S
    idle_ttl_s: OptTtl = None
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
        )

    def metrics_source(self) -> str | None:
        """Where the engine's metrics are read: ``metrics_url``, else the default URL of
        a known engine (vLLM, SGLang, llama.cpp server) on its port, else ``None``."""
        if self.metrics_url is not None:
            return self.metrics_url
        if self.port is not None and (self.engine or "").strip().lower() in METRICS_ENGINES:
            return f"http://127.0.0.1:{self.port}/metrics"
        return None

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


#: engine labels whose metrics page is known (/metrics on the serve's port)
METRICS_ENGINES: frozenset[str] = frozenset(
    {"vllm", "sglang", "llamacpp", "llama.cpp", "llama-cpp", "llama_cpp", "llama-server"}
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
