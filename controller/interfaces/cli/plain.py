"""What the commands share that needs no typer: :func:`_lazy` (a module loaded on its
first use), :class:`ExitCodeError` (an exit code, raised where typer is not loaded),
:func:`_print_json` (the JSON answer) and :func:`load_set` (the manifest set, or its
located errors and a :class:`ExitCodeError`).

``validate``'s quick path (:mod:`controller.interfaces.cli.quick`) runs on these alone.
Must not import typer, click, the manifest model, pydantic, rich or the core at import
time, nor the server, Docker or HTTP libraries.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controller.interfaces import render
    from controller.manifest import ManifestSet


def _lazy(name: str) -> ModuleType:
    """Module ``name``, loaded on its first attribute access (importlib's LazyLoader).

    ``--help`` and a command's usage errors then import no manifest model, rich or
    core module at all; each command imports what it uses (docs/operations.md,
    "Install": how fast the command line answers; benchmarks/bench_cli.py).
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if not TYPE_CHECKING:
    render = _lazy("controller.interfaces.render")


class ExitCodeError(Exception):
    """The command ends with exit ``code``, what it had to say already printed (typer's
    ``Exit`` where typer runs the command)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def load_set(
    manifests: list[Path], *, strict: bool = False, json_out: bool = False, code: int = 1
) -> ManifestSet:
    """The manifest set; :class:`ExitCodeError` ``code`` (1; ``fit``: 2, its 1 is "does not fit")
    with its located errors on stderr (``json_out``: and ``validate``'s JSON answer on
    stdout) when it does not load."""
    if not manifests:
        render.error("no manifest given: pass -m/--manifest FILE (repeat for a set)")
        raise ExitCodeError(code)
    from controller.manifest import ManifestError, load_manifest_set

    try:
        mset = load_manifest_set(manifests, strict=strict)
    except ManifestError as exc:
        for err in exc.errors:
            render.error(str(err))
        if json_out:
            _print_json(
                {
                    "valid": False,
                    "files": [str(f) for f in manifests],
                    "errors": [err.to_json() for err in exc.errors],
                    "warnings": exc.warnings,
                }
            )
        raise ExitCodeError(code) from None
    for warning in mset.warnings:
        render.warn(warning)
    return mset
