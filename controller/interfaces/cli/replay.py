"""``vramctl replay``: re-plan recorded cycles with this manifest set and show where
the plans differ (:mod:`controller.tools.replay`). Executes nothing.

Must not import the manifest model, rich, the core, the server, Docker or HTTP
libraries at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from controller.interfaces.cli.common import _fail, _load
from controller.interfaces.cli.options import CycleOpt, JsonOpt, ManifestOpt, SourceArg
from controller.interfaces.cli.plain import _lazy, _print_json
from controller.interfaces.cli.typer_app import _command

if TYPE_CHECKING:
    from controller.interfaces import render
else:
    render = _lazy("controller.interfaces.render")


@_command("Re-plan recorded cycles; show where the plans differ.", "replay")
def replay_cmd(
    source: SourceArg,
    manifest: ManifestOpt = [],  # noqa: B006
    cycle: CycleOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-plan recorded cycles with this manifest; show where the plans differ. Executes nothing.

    Exit 0 when every cycle plans the same, 2 when some differ, 1 on errors.
    """
    from controller.tools.replay import ReplayError, render_replay, replay

    mset = _load(manifest)
    try:
        report = replay(source, mset, cycle=cycle)
    except ReplayError as exc:
        _fail(str(exc))
    if json_out:
        _print_json(report.to_json())
    else:
        render_replay(report, render.out)
    if report.errors:
        raise typer.Exit(1)
    raise typer.Exit(2 if report.differs else 0)
