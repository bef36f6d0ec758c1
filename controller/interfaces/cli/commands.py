"""The typer app with every command registered on it: importing this module imports
each command module, which registers its commands on ``app``, in the order ``vramctl
--help`` lists them.

Holds no command and decides nothing. Must not import the manifest model, rich or the
core at import time (each command imports what it uses: tests/shell/test_cli_imports.py), nor
the server, Docker or HTTP libraries.
"""

from __future__ import annotations

# isort: off
# app first: it notes when the command began (STARTED) before typer loads
from controller.interfaces.cli.typer_app import STARTED, app

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

__all__ = ["EXIT_BAD_INPUT", "EXIT_UNOBSERVED", "STARTED", "app"]
