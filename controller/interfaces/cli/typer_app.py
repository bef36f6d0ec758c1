"""The ``vramctl`` typer app and what every command is registered with: the app,
:class:`_Command` (click's plain help, arguments named by their metavar), the
:func:`_command` decorator, the options before a command (:func:`_options`:
``--version``) and :func:`main`, which runs the typer app.

It holds no command. Must not import the manifest model, pydantic, rich or the core at
import time (``--help`` loads none of them: tests/shell/test_cli_imports.py), nor the server,
Docker or HTTP libraries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: when the command began (before its libraries load): what ``up --wait`` counts from
STARTED = time.monotonic()

import typer  # noqa: E402 (after STARTED: its load counts as the command's time)
import typer.core  # noqa: E402
from typer import _click as click  # noqa: E402 (the click typer carries: its own copy)

from controller.interfaces.cli.options import VersionOpt  # noqa: E402

app = typer.Typer(
    name="vramctl",
    help="Make GPU memory an explicit, declared budget on a model-serving host.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: paragraphs reflowed to the terminal's width (rich's kept each
    # docstring line break, cutting sentences), and no rich/markdown import for --help
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


@app.callback()
def _options(version: VersionOpt = False) -> None:
    """The options before a command: ``--version`` (its callback prints it and exits)."""


class _Command(typer.core.TyperCommand):
    """click's plain help, each argument named by its metavar (``SERVE``, ``[PLAN]``) in
    the usage line and the Arguments section, not typer's ``{serve}`` and ``<str>``."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        """``[OPTIONS]``, then each argument as the operator types it."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or (param.name or "").upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The Arguments section (by metavar) and the Options section."""
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                sections["Arguments"].append((param.metavar or record[0], record[1]))
            else:
                sections["Options"].append(record)
        for title, rows in sections.items():
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _command(summary: str, name: str | None = None) -> Callable[[Callable[..., None]], Any]:
    """``@app.command`` with ``summary``, the whole sentence ``vramctl --help`` lists (click
    would cut the docstring's first sentence to the width), and :class:`_Command`'s help."""
    return app.command(name, cls=_Command, short_help=summary)


def main() -> None:
    """Console-script entry point."""
    app()
