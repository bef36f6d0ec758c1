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
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

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


#: the variables that make rich take a stream for a terminal (``Console.is_terminal``)
_TERMINAL_VARIABLES = ("TTY_COMPATIBLE", "FORCE_COLOR")


def as_is(stream: TextIO, line: str) -> bool:
    """Whether rich prints ``line`` to ``stream`` as it is: ``stream`` is not a terminal
    and no variable says it is one (so no style is written), and ``line`` is printable
    ASCII (rich strips some control characters, expands tabs, and may not encode what
    the stream cannot) that does not end in whitespace (rich trims what passes the
    width)."""
    if any(name in os.environ for name in _TERMINAL_VARIABLES):
        return False
    try:
        if stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    return line.isascii() and line.isprintable() and line == line.rstrip()


def print_line(stream: TextIO, line: str, by_rich: Callable[[], None]) -> None:
    """``line`` on ``stream`` as it is where rich would print it so (:func:`as_is`), else
    ``by_rich()``; flushed, as rich flushes each line."""
    if as_is(stream, line):
        stream.write(line + "\n")
        stream.flush()
    else:
        by_rich()


def warn(message: str) -> None:
    """``render.warn``: one warning line on stderr."""
    print_line(sys.stderr, f"warning: {message}", lambda: render.warn(message))


def error(message: str) -> None:
    """``render.error``: one located error line on stderr."""
    print_line(sys.stderr, f"error: {message}", lambda: render.error(message))


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def load_set(
    manifests: list[Path], *, strict: bool = False, json_out: bool = False, code: int = 1
) -> ManifestSet:
    """The manifest set; :class:`ExitCodeError` ``code`` (1; ``fit``: 2, its 1 is "does not fit")
    with its located errors on stderr (``json_out``: and ``validate``'s JSON answer on
    stdout) when it does not load."""
    if not manifests:
        error("no manifest given: pass -m/--manifest FILE (repeat for a set)")
        raise ExitCodeError(code)
    from controller.manifest import ManifestError, load_manifest_set

    try:
        mset = load_manifest_set(manifests, strict=strict)
    except ManifestError as exc:
        for err in exc.errors:
            error(str(err))
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
        warn(warning)
    return mset
