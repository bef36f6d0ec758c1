"""The per-serve runtime record: what the executor needs of a serve beyond its spec.

The pure core plans from :class:`statemachine.domain.types.ServeSpec`; carrying out a plan
also needs a serve's timeouts, its health path, its ``up`` command (split, ``{dir}``
substituted) with the folder it runs in and its extra environment. The manifest loader
builds one :class:`ServeRuntime` per serve, once per manifest set
(:meth:`controller.manifest.ManifestSet.runtime`); a serve without one (an executor
built from a bare ``DesiredState``) gets :meth:`ServeRuntime.default`, whose values are
the manifest's own defaults (:mod:`controller.manifest.fields`), so there is one place
that says what an unset timeout means.

The elastic endpoint and its token variable stay on the spec's ``Elastic``, where the
plan's resize steps already read them. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from controller.manifest.fields import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
)


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A serve's ``[serve.model]``: its files (``path``, absolute) and the cache it is
    estimated with: ``context`` tokens per sequence (``None``: the model's own),
    ``kv_dtype`` and ``parallel`` sequences (docs/sizing.md)."""

    path: Path
    context: int | None = None
    kv_dtype: str = "f16"
    parallel: int = 1


@dataclass(frozen=True, slots=True)
class ServeRuntime:
    """How the executor carries out one serve's steps (immutable)."""

    name: str
    #: bound of an ``up`` command, and of the wait for the serve to become ready
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    #: what ``docker stop`` waits before it kills the container
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    #: what the router is given to drain the serve's tier
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    #: HTTP path probed on ``127.0.0.1:{port}`` when the container has no healthcheck
    health: str | None = None
    #: the ``up`` command as argv, ``{dir}`` already substituted; ``None``: no ``up``
    up_argv: tuple[str, ...] | None = None
    #: the folder ``up`` runs in (its manifest's folder, absolute)
    manifest_dir: Path = Path(".")
    #: extra environment variables of ``up``; ``None``: none declared
    up_env: Mapping[str, str] | None = None
    #: the model's files and cache settings (``[serve.model]``); ``None``: not declared
    model: ModelRef | None = None
    #: the manifest's ``engine`` label (``None``: none declared)
    engine: str | None = None

    def __post_init__(self) -> None:
        if self.up_env is not None and not isinstance(self.up_env, MappingProxyType):
            object.__setattr__(self, "up_env", MappingProxyType(dict(self.up_env)))

    @classmethod
    def default(cls, name: str) -> ServeRuntime:
        """The record of a serve the manifest said nothing more about."""
        return cls(name=name)


__all__ = ["ModelRef", "ServeRuntime"]
