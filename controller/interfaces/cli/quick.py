"""``vramctl validate`` without typer: the console script's quick path for the command
lines whose meaning is plain, so that checking a manifest costs the manifest model and
its answer, not typer building every command and coercing each option through pydantic
(benchmarks/bench_cli.py).

:func:`quick` reads only ``validate`` followed by ``-m FILE`` / ``--manifest FILE`` /
``--manifest=FILE`` (repeated), ``--json``, ``--strict`` and one ``--router-url URL`` /
``--router-url=URL`` (else ``VRAMCTL_ROUTER_URL``), each value a word that does not begin
with ``-``, and runs ``validating``'s answer as the typer command would. Anything else
(``--help``, a usage error, an option typer would read from ``VRAMCTL_MANIFEST``, shell
completion, an existing file this user may not read) answers ``None``: the typer app
then runs the command, so its help, errors and exit codes are typer's own.

Must not decide anything nor import typer, click, the manifest model, rich or the core
at import time; an unrecognised command line imports nothing at all.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO, cast

#: the options that take a value: option -> the argument it fills
_VALUED = {"-m": "manifest", "--manifest": "manifest", "--router-url": "router_url"}
#: the flags: option -> the argument it sets
_FLAGS = {"--json": "json_out", "--strict": "strict"}


@dataclass
class _Args:
    """``validate``'s arguments as its typer command receives them."""

    manifest: list[str] = field(default_factory=list)
    router_url: list[str] = field(default_factory=list)
    json_out: bool = False
    strict: bool = False


def _environment_is_plain() -> bool:
    """No variable gives an option typer would read (``VRAMCTL_MANIFEST``, split on
    ``:``) and no shell completion is asked for (``_VRAMCTL_COMPLETE`` and the like)."""
    return "VRAMCTL_MANIFEST" not in os.environ and not any(
        key.endswith("_COMPLETE") for key in os.environ
    )


def _take(word: str, rest: list[str], args: _Args) -> bool:
    """Read one option (its value from ``rest`` where not ``--opt=value``) into ``args``;
    False when it is not one whose meaning is plain."""
    name, eq, value = word.partition("=")
    if name in _FLAGS and not eq:
        setattr(args, _FLAGS[name], True)
        return True
    if name not in _VALUED or (eq and not name.startswith("--")):
        return False
    if not eq:
        if not rest:
            return False
        value = rest.pop(0)
    if not value or value.startswith("-"):
        return False
    getattr(args, _VALUED[name]).append(value)
    return True


def _readable(paths: Sequence[str]) -> bool:
    """No path is there and unreadable (typer's usage error for it, exit 2)."""
    for path in paths:
        try:
            os.stat(path)
        except OSError:
            continue
        if not os.access(path, os.R_OK):
            return False
    return True


def parse(argv: Sequence[str]) -> _Args | None:
    """``validate``'s arguments, or ``None`` where the command line is not plain."""
    if not argv or argv[0] != "validate" or not _environment_is_plain():
        return None
    args, rest = _Args(), list(argv[1:])
    while rest:
        if not _take(rest.pop(0), rest, args):
            return None
    if len(args.router_url) > 1 or not _readable(args.manifest):
        return None
    return args


def quick(argv: Sequence[str]) -> int | None:
    """Run ``validate`` and give its exit code; ``None`` (nothing run, nothing imported)
    where ``argv`` is not a plain ``validate`` command line."""
    args = parse(argv)
    if args is None:
        return None
    router_url = args.router_url[0] if args.router_url else os.environ.get("VRAMCTL_ROUTER_URL")
    try:
        from pathlib import Path

        from controller.interfaces.cli.validating import validate_code

        return validate_code(
            [Path(p) for p in args.manifest],
            json_out=args.json_out,
            router_url=router_url or None,
            strict=args.strict,
        )
    except KeyboardInterrupt:
        return 130  # as typer's main answers Ctrl-C
    except OSError as exc:  # a closed pipe: exit 1, nothing more said (as click's main)
        if exc.errno != errno.EPIPE:
            raise
        from typer._click.utils import PacifyFlushWrapper

        sys.stdout = cast(TextIO, PacifyFlushWrapper(sys.stdout))
        sys.stderr = cast(TextIO, PacifyFlushWrapper(sys.stderr))
        return 1
