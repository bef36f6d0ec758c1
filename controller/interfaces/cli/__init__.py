"""The ``vramctl`` command line (typer): the CLI contract (docs/operations.md).

Each command loads the manifest set, reads or takes the observation, calls the pure
core, and renders the answer (rich for people, ``--json`` for tools). Exit codes are
part of the contract, and each command's help names its own: ``validate`` 0/1, ``fit``
0 fits / 1 does not / 2 a question it cannot ask (an unknown serve, a manifest or
saved observation that does not load), ``plan --detailed-exitcode`` 0 nothing to do /
2 changes / 1 error, ``estimate`` 0 / 2 bad input (a usage error's code); ``status``, ``fit``,
``plan`` and ``observe`` exit :data:`EXIT_UNOBSERVED` (3) when Docker could not be read
(their answer is printed, ``unknown`` where unknown, with one line saying where Docker
was looked for). A state directory that is there but that this user may not read or
lock is :data:`EXIT_BAD_INPUT` (2; ``plan`` 1, its 2 means changes), said in one paragraph
with how to fix it; ``mcp`` still serves and its tools say it in their notes.

The package must not decide anything itself: the arithmetic lives in ``statemachine``;
it only wires inputs to the core and prints what the core answers. Errors are printed
as located one-line messages, never tracebacks. Its modules:

* the commands, each a renderer, in the order ``vramctl --help`` lists them:
  ``check`` (``validate``), ``answers`` (``observe``, ``status``, ``calibrate``,
  ``fit``, ``plan``), ``mcp``, ``control`` (``apply``, ``run``), ``requests`` (``up``,
  ``down``, ``events``), ``replay``, ``flags`` (``render``, ``lint``), ``estimate``;
* ``commands``: the app with every command registered (what ``app`` here is);
* ``typer_app``: the typer app, its help (``_Command``), ``_command``, the options before a
  command (``--version``);
* ``options``: every option and argument, an ``Annotated`` alias each;
* ``common``: loading, observing, the situation, ``_fail``, exit codes;
* ``plain``: what needs no typer: ``_lazy``, ``_print_json``, ``load_set``,
  ``ExitCodeError``;
* ``validating``: ``validate``'s answer, without typer; ``quick``: ``validate`` run
  without typer where its command line is plain (:func:`main` tries it first).

Importing it imports nothing else: ``app``, ``STARTED`` and the exit codes load the
typer app with every command (``commands``) on first use. ``--help`` and a command's
usage errors import no manifest model, rich or core module (each command imports what
it uses: tests/shell/test_cli_imports.py).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["EXIT_BAD_INPUT", "EXIT_UNOBSERVED", "STARTED", "app", "main"]


def main() -> None:
    """Console-script entry point: ``validate``'s quick path where the command line is
    plain (``quick``), else the typer app."""
    from controller.interfaces.cli.quick import quick

    code = quick(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from controller.interfaces.cli.commands import app

    app()


def __getattr__(name: str) -> Any:
    """``app``, ``STARTED``, ``EXIT_BAD_INPUT``, ``EXIT_UNOBSERVED``: from ``commands``."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from controller.interfaces.cli import commands

    return getattr(commands, name)
