"""The manifest layer: TOML files in, a validated ``ManifestSet`` out, with located errors.

``errors`` (where and what), ``fields`` (one validated type per kind of value),
``models`` (``[[gpu_roles]]``, ``[[serve]]``, ``elastic``), ``load`` (read files within
bounds, merge a set), ``runtime`` (the executor's per-serve record), ``schema`` (the
JSON Schema generated from the models).

Its job: turn what an operator wrote into the pure core's ``DesiredState`` and the
per-serve runtime records the executor reads, or say exactly where it is wrong. It must
not talk to Docker, NVML, the network or the journal, and must not decide anything the
planner decides. This package re-exports its public names.
"""

from controller.manifest.errors import LocatedError, ManifestError
from controller.manifest.fields import DUAL_GPU_EXCLUSIVE, normalize_residency
from controller.manifest.load import ManifestSet, load_manifest, load_manifest_set
from controller.manifest.models import (
    ElasticModel,
    GpuRoleModel,
    HostModel,
    ManifestFile,
    ServeModel,
    SleepModel,
)
from controller.manifest.runtime import ServeRuntime

__all__ = [
    "DUAL_GPU_EXCLUSIVE",
    "ElasticModel",
    "GpuRoleModel",
    "HostModel",
    "LocatedError",
    "ManifestError",
    "ManifestFile",
    "ManifestSet",
    "ServeModel",
    "ServeRuntime",
    "SleepModel",
    "load_manifest",
    "load_manifest_set",
    "normalize_residency",
]
