"""``vramctl status`` in pictures: a memory bar per GPU role, and ``--watch`` (rich Live).

:func:`role_bars` draws, for each role of a :class:`~statemachine.answers.status_report.HostStatus`,
one bar the width of the card: each reservation the ledger holds (coloured by the
serve's residency class), the free budget, and the reserve; below it the figures of
the report (capacity, reserve, budget, committed, free, NVML used, drift). A figure
the report does not know is printed ``unknown``, never 0: with docker unreadable the
bar shows no reservation at all, only "committed unknown".

:func:`watch` redraws the whole ``status`` answer (bars and tables) every ``interval_s``
on a terminal's alternate screen (rich Live), each draw in place of the last and no
taller than the screen, or prints it again and again when the output is piped.

This module must not compute any figure: the cells of a bar are only the layout of
the report's numbers (rounded to whole cells, at least one for a non-empty holding).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.text import Text

from controller.interfaces import render
from statemachine.answers.status_report import HostStatus, RoleStatus

__all__ = ["Frame", "role_bars", "status_screen", "watch"]

BAR_WIDTH = 60
#: residency class -> two shades, alternated so that neighbours of one class stay apart
RESIDENCY_STYLE = {
    "resident": ("blue", "dodger_blue1"),
    "evictable": ("dark_orange", "orange1"),
    "on-demand": ("magenta", "orchid"),
}
OTHER_STYLE = ("green4", "spring_green3")  # a serve with no residency class
UNDECLARED_STYLE = ("grey50", "grey70")  # a holder the manifest no longer declares
FULL, FREE, RESERVE, UNKNOWN_CELL = "█", "░", "▒", "?"


def _cells(values: list[int], scale: int, width: int) -> list[int]:
    """Whole cells for each value on a bar of ``width`` cells for ``scale`` MiB."""
    cells = [max(1, round(v * width / scale)) if v > 0 else 0 for v in values]
    while sum(cells) > width and max(cells) > 1:  # rounding up the small ones overflowed
        cells[cells.index(max(cells))] -= 1
    return cells


def _style(holder: str, index: int, residency: dict[str, str | None]) -> str:
    if holder not in residency:
        shades = UNDECLARED_STYLE
    else:
        shades = RESIDENCY_STYLE.get(residency[holder] or "", OTHER_STYLE)
    return shades[index % 2]


def _role_bar(role: RoleStatus, residency: dict[str, str | None], width: int) -> Text:
    v = role.ledger
    bar = Text()
    if v.committed_mib is None:
        scale = v.capacity_mib or 1
        [unknown, reserve] = _cells([v.budget_mib, v.reserve_mib], scale, width)
        bar.append(UNKNOWN_CELL * unknown, style="dim")
        bar.append(RESERVE * reserve, style="grey50")
        return bar
    scale = max(v.capacity_mib, v.committed_mib + v.reserve_mib) or 1
    held = [m for _, m in v.reservations]
    free = max(0, v.free_mib or 0)
    cells = _cells([*held, free, v.reserve_mib], scale, width)
    for i, ((holder, _), n) in enumerate(zip(v.reservations, cells, strict=False)):
        bar.append(FULL * n, style=_style(holder, i, residency))
    bar.append(FREE * cells[-2], style="green")
    bar.append(RESERVE * cells[-1], style="grey50")
    return bar


def role_bars(report: HostStatus, width: int = BAR_WIDTH, columns: int | None = None) -> Group:
    """One bar per role, with its legend and figures (``unknown`` where unknown), their
    items wrapped between items at ``columns`` (default: the width of ``render.out``)."""
    residency = {s.serve: s.residency for s in report.serves}
    columns = columns or render.out.width
    lines: list[RenderableType] = []
    for role in report.roles:
        v = role.ledger
        head = Text(v.gpu_role, style="bold")
        if role.overcommitted:
            head.append("  OVERCOMMITTED", style="bold red")
        lines.append(head)
        lines.append(_role_bar(role, residency, width))
        lines += _wrapped(_legend(role, residency), columns)
        nvml = render.mib(role.nvml_used_mib) if role.device_found else render.UNKNOWN
        figures = [
            f"capacity {v.capacity_mib}",
            f"budget {v.budget_mib}",
            f"committed {render.mib(v.committed_mib)}",
            f"nvml used {nvml}",
            f"drift {render.signed(role.drift_used_mib)}",
            "(MiB)",
        ]
        lines += _wrapped([Text(f) for f in figures], columns)
    return Group(*lines)


def _legend(role: RoleStatus, residency: dict[str, str | None]) -> list[Text]:
    """The bar's legend, an item each: every reservation held, the free budget, the reserve."""
    v = role.ledger
    items = []
    if v.committed_mib is None:
        items.append(Text(f"{UNKNOWN_CELL} committed unknown (docker could not be read)"))
    held_now = v.reservations if v.committed_mib is not None else ()
    for i, (holder, held) in enumerate(held_now):
        items.append(Text(FULL, style=_style(holder, i, residency)) + f" {holder} {held}")
    items.append(Text(FREE, style="green") + f" free {render.mib(v.free_mib)}")
    items.append(Text(RESERVE, style="grey50") + f" reserve {v.reserve_mib}")
    return items


def _wrapped(items: list[Text], columns: int, indent: str = "  ") -> list[Text]:
    """``items`` on lines indented by ``indent``, two spaces apart, a new line before an
    item that would pass ``columns`` (an item is never split)."""
    lines = [Text(indent)]
    for item in items:
        line = lines[-1]
        if len(line) > len(indent) and len(line) + 2 + len(item) > columns:
            lines.append(Text(indent))
        elif len(line) > len(indent):
            line.append("  ")
        lines[-1].append_text(item)
    return lines


def status_screen(report: HostStatus) -> Group:
    """The whole ``status`` answer as one renderable: the bars above today's tables.

    The tables are drawn by :func:`controller.interfaces.render.status` onto a console of the same
    width and colours that writes into a buffer (not onto ``render.out``, which rich
    Live is drawing on while ``--watch`` runs).
    """
    screen = render.out
    buffer = io.StringIO()
    render.out = Console(
        file=buffer,
        force_terminal=screen.is_terminal,
        color_system=screen.color_system,  # type: ignore[arg-type]
        width=screen.width,
        highlight=False,
        soft_wrap=True,
        no_color=screen.no_color,
    )
    try:
        render.status(report)
    finally:
        render.out = screen
    return Group(role_bars(report), Text(""), Text.from_ansi(buffer.getvalue()))


#: what one draw of ``--watch`` shows: the report, lines to tell above it, and tables to
#: draw below it (``status``'s model estimates)
Frame = tuple[HostStatus, Sequence[str], Sequence[RenderableType]]


class _Cropped:
    """A draw no taller than the screen: when it is, its last row says how many rows
    are not shown (instead of the bottom of the tables vanishing without a word)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = options.height or console.height
        lines = console.render_lines(self.renderable, options.update(height=None), pad=False)
        if len(lines) > height:
            hidden = len(lines) - height + 1
            lines = lines[: height - 1]
            more = Text(
                f"… {hidden} more lines below: enlarge the terminal, or run "
                "`vramctl status` for the whole answer",
                style="reverse",
            )
            lines.append(console.render_lines(more, options.update(height=1), pad=False)[0])
        for i, line in enumerate(lines):
            yield from line
            if i < len(lines) - 1:
                yield Segment.line()


def watch(
    produce: Callable[[], Frame],
    *,
    interval_s: float,
    count: int = 0,
    console: Console | None = None,
) -> None:
    """Redraw ``status`` every ``interval_s`` until Ctrl-C (or ``count`` draws, when > 0).

    ``produce`` gives each draw's report, the lines to tell above it (a Docker that
    cannot be read, an edit of the manifest that does not load) and the tables to draw
    below it (the model estimates): they are part of the draw, never printed beside it,
    so nothing is left behind on the screen. On a terminal the draws take the alternate
    screen (rich Live), each in place of the last and cropped to the screen's height,
    with a last row that says what is not shown; the terminal's own screen comes back
    on exit. Piped, each draw is printed after the
    last one, with the time it was made.
    """
    from rich.live import Live  # only --watch draws live: the CLI's import stays light

    con = console or render.out
    drawn = 0

    def frame() -> Group:
        report, notes, below = produce()
        stamp = Text(
            f"vramctl status --watch: {time.strftime('%H:%M:%S')}, every {interval_s:g}s "
            "(Ctrl-C stops)",
            style="dim",
        )
        told = [Text(note, style="yellow") for note in notes]
        return Group(stamp, *told, status_screen(report), *below)

    try:
        if con.is_terminal:
            with Live(
                _Cropped(frame()),
                console=con,
                auto_refresh=False,
                screen=True,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live:
                drawn = 1
                while count <= 0 or drawn < count:
                    time.sleep(interval_s)
                    live.update(_Cropped(frame()), refresh=True)
                    drawn += 1
        else:
            while count <= 0 or drawn < count:
                if drawn:
                    time.sleep(interval_s)
                con.print(frame())
                drawn += 1
    except KeyboardInterrupt:
        return
