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

* ``app``: the typer app, its help (``_Command``), ``_command``, ``_lazy``, ``main``;
* ``options``: every option and argument, an ``Annotated`` alias each;
* ``common``: loading, observing, the situation, ``_fail``, ``_print_json``, exit codes;
* the commands, each a renderer, in the order ``vramctl --help`` lists them:
  ``check`` (``validate``), ``answers`` (``observe``, ``status``, ``calibrate``,
  ``fit``, ``plan``), ``mcp``, ``control`` (``apply``, ``run``), ``requests`` (``up``,
  ``down``, ``events``), ``replay``, ``flags`` (``render``, ``lint``), ``estimate``.

Importing it imports each command module, which registers its commands on ``app``;
``--help`` and a command's usage errors import no manifest model, rich or core module
(each command imports what it uses: tests/test_cli_imports.py).
"""

from __future__ import annotations

# isort: off
# app first: it notes when the command began (STARTED) before typer loads
from controller.interfaces.cli.app import STARTED, app, main

# each module registers its commands as it is imported: in this order, `--help`'s
from controller.interfaces.cli import check  # noqa: F401 (validate)
from controller.interfaces.cli import answers  # noqa: F401 (observe, status, calibrate, fit, plan)
from controller.interfaces.cli import mcp  # noqa: F401 (mcp)
from controller.interfaces.cli import control  # noqa: F401 (apply, run)
from controller.interfaces.cli import requests  # noqa: F401 (up, down, events)
from controller.interfaces.cli import replay  # noqa: F401 (replay)
from controller.interfaces.cli import flags  # noqa: F401 (render, lint)
from controller.interfaces.cli import estimate  # noqa: F401 (estimate)
from controller.interfaces.cli.common import EXIT_BAD_INPUT, EXIT_UNOBSERVED

# isort: on

__all__ = ["EXIT_BAD_INPUT", "EXIT_UNOBSERVED", "STARTED", "app", "main"]
