"""Human output of the CLI (rich): tables and explanations of what the core answered.

Every number printed here comes from the core's result objects; a ``None`` figure is
printed as ``unknown``, never as 0. Errors and warnings go to stderr. ``status`` is
printed in parts: the roles' table, the host line, the serves' table, the notes.

On a terminal narrower than :data:`NARROW_BELOW` columns ``status``'s tables are laid
out narrow: the roles' capacity and reserve are left to the bars above them, a serve's
container state and health are said beside its lifecycle in one ``state`` column, its
drift is left to its role's, and NVML's columns are left out while NVML is not read;
each column is given at least its longest word
(:func:`controller.interfaces.table_fit.fit_words`), so no word is cut.

This module must not compute anything the core did not: it formats only.
"""

from __future__ import annotations

import difflib
import functools
import os
import sys
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from controller.interfaces.table_fit import fit_words
from controller.interfaces.validated_text import VALID, validated_lines

if TYPE_CHECKING:  # the core's result types; a command imports the core it calls
    from collections.abc import Iterable

    from controller.manifest import ManifestSet
    from controller.service.executor import ExecutionReport, StepResult
    from statemachine.answers.fit import FitResult
    from statemachine.answers.status_report import HostStatus, RoleStatus, ServeStatus
    from statemachine.domain.types import DesiredState
    from statemachine.planning.plan_types import Plan

# piped output (logs, CI, `| less`) gets wide tables instead of rich's 80 columns
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
# emoji=False: a ":name:" in a serve name or a reason is text, not an emoji code
out = Console(highlight=False, soft_wrap=True, width=_WIDTH, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

UNKNOWN = "unknown"
#: a console narrower than this gets ``status``'s narrow tables (module docstring)
NARROW_BELOW = 120


def narrow() -> bool:
    """True when ``out`` is narrower than :data:`NARROW_BELOW` columns."""
    return out.width < NARROW_BELOW


def prose(text: str | Text) -> None:
    """A line of words under the tables: wrapped between words on a narrow console, as
    it is elsewhere (a pipe's reader greps whole lines)."""
    out.print(text, soft_wrap=not narrow())


def mib(value: int | None) -> str:
    """A MiB figure, or ``unknown``."""
    return UNKNOWN if value is None else f"{value}"


def signed(value: int | None) -> str:
    """A signed MiB delta, or ``unknown``."""
    return UNKNOWN if value is None else f"{value:+d}"


def error(message: str) -> None:
    """One located error line on stderr."""
    err.print(Text("error: ", style="bold red") + Text(message))


def warn(message: str) -> None:
    """One warning line on stderr."""
    err.print(Text("warning: ", style="yellow") + Text(message))


def unknown_serve(name: str, desired: DesiredState) -> str:
    """The message for a serve name the manifest set does not declare."""
    close = difflib.get_close_matches(name, list(desired.serves), n=1, cutoff=0.6)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return f'no serve named "{name}" in the manifest set{hint}'


def validated(mset: ManifestSet, desired: DesiredState) -> None:
    """The human answer of ``validate``."""
    head, *roles = validated_lines(mset, desired, escape)
    out.print(f"[green]{VALID}[/green]{head}")
    for line in roles:
        out.print(line)


def status(report: HostStatus, nvml_why: str | None = None) -> None:
    """The human answer of ``status``; ``nvml_why``: what NVML answered, where it is known."""
    if not report.docker_ok:
        prose(
            "[bold red]docker could not be read[/bold red]: committed MiB is unknown; "
            "nothing would be admitted or stopped (fail closed)"
        )
    if not report.nvml_ok:
        why = nvml_why or "NVML unavailable"
        prose(Text(why, style="yellow") + ": device figures are unknown")
    out.print(_narrow_roles(report) if narrow() else _roles_table(report))
    if report.host is not None:  # the [host] budget the sleepers' weights are held in
        h = report.host
        held = ", ".join(f"{n} {m}" for n, m in h.reservations) or "nothing"
        prose(
            f"host RAM (MiB): ram {h.ram_mib}, reserve {h.reserve_mib}, budget {h.budget_mib}, "
            f"committed {mib(h.committed_mib)}, free {mib(h.free_mib)} (held by sleepers: "
            f"{escape(held)})"
        )
    out.print(_narrow_serves(report) if narrow() else _serves_table(report))
    _status_notes(report)


def _roles_table(report: HostStatus) -> Table:
    """The GPU roles' ledger against the device."""
    roles = Table(title="GPU roles (MiB)", title_justify="left")
    for col in ("role", "capacity", "reserve", "budget", "committed", "free", "nvml used", "drift"):
        roles.add_column(col, justify="left" if col == "role" else "right")
    for r in report.roles:
        v = r.ledger
        roles.add_row(
            Text(v.gpu_role),
            mib(v.capacity_mib),
            mib(v.reserve_mib),
            mib(v.budget_mib),
            _committed(r),
            mib(v.free_mib),
            mib(r.nvml_used_mib) if r.device_found else UNKNOWN,
            _role_drift(r),
        )
    return roles


def _committed(r: RoleStatus) -> Text:
    committed = Text(mib(r.ledger.committed_mib))
    if r.overcommitted:
        committed.append(" OVER", style="bold red")
    return committed


def _role_drift(r: RoleStatus) -> str:
    drift = signed(r.drift_used_mib)
    if r.drift_total_mib:
        drift += f" (device total {signed(r.drift_total_mib)} vs declared)"
    return drift


def _narrow_roles(report: HostStatus) -> Table:
    """The roles' table on a narrow console: capacity and reserve are the bars' (above
    it); NVML's columns only while NVML is read."""
    roles = Table(title="GPU roles (MiB)", title_justify="left")
    nvml = ["nvml used", "drift"] if report.nvml_ok else []
    cols = ["role", "budget", "committed", "free", *nvml]
    for col in cols:
        roles.add_column(col, justify="left" if col == "role" else "right")
    for r in report.roles:
        v = r.ledger
        row: list[Text | str] = [Text(v.gpu_role), mib(v.budget_mib), _committed(r)]
        row.append(mib(v.free_mib))
        if report.nvml_ok:
            row += [mib(r.nvml_used_mib) if r.device_found else UNKNOWN, _role_drift(r)]
        roles.add_row(*row)
    return fit_words(roles, out.width)


def _held(s: ServeStatus) -> str:
    """What a serve holds in the ledger, in words (``-`` when it is not in it)."""
    if s.in_ledger and s.committed and s.residual_mib is not None:
        return f"{s.residual_mib} asleep (of {s.reservation_mib})"  # what it holds asleep
    if not s.in_ledger:
        return "-"
    if s.committed:
        return mib(s.reservation_mib)
    return UNKNOWN if s.committed is None else f"0 of {s.reservation_mib}"


def _serves_table(report: HostStatus) -> Table:
    """The serves: declaration, container, lifecycle, and what each holds."""
    serves = Table(title="Serves", title_justify="left")
    cols = ("serve", "role", "residency", "desired", "container", "health", "lifecycle")
    for col in cols:
        serves.add_column(col, overflow="fold")
    for col in ("reserved MiB", "nvml used", "drift"):
        serves.add_column(col, justify="right")
    for s in report.serves:
        serves.add_row(
            Text(s.serve),
            Text(",".join(s.gpu_roles) or "-"),
            s.residency or "-",
            desired_cell(s),
            s.state,
            Text(s.health or "-"),
            s.lifecycle,
            _held(s),
            mib(s.nvml_used_mib) if s.committed else "-",
            signed(s.drift_mib) if s.committed else "-",
        )
    return serves


def _narrow_serves(report: HostStatus) -> Table:
    """The serves' table on a narrow console: the container's state and health beside
    the lifecycle (where they say more), no drift (its role's is above), NVML's used
    only while NVML is read."""
    serves = Table(title="Serves", title_justify="left")
    for col in ("serve", "role", "residency", "desired", "state"):
        serves.add_column(col)
    for col in ["reserved MiB"] + (["nvml used"] if report.nvml_ok else []):
        serves.add_column(col, justify="right")
    for s in report.serves:
        row = [
            Text(s.serve),
            Text(", ".join(s.gpu_roles) or "-"),
            Text(s.residency or "-"),
            Text(desired_cell(s)),
            Text(state_cell(s)),
            Text(_held(s)),
        ]
        if report.nvml_ok:
            row.append(Text(mib(s.nvml_used_mib) if s.committed else "-"))
        serves.add_row(*row)
    return fit_words(serves, out.width)


def state_cell(s: ServeStatus) -> str:
    """The lifecycle, then the container's state and health where they say more."""
    said = [s.lifecycle]
    said += [s.state] if s.state != s.lifecycle else []
    said += [s.health] if s.health and s.health != "-" else []
    return ", ".join(said)


def table(t: Table) -> None:
    """Print a table of ``status`` (below the ledger's and the serves'): on a narrow
    console with each column as wide as its longest word at least."""
    out.print(fit_words(t, out.width) if narrow() else t)


def _status_notes(report: HostStatus) -> None:
    """The lines under the tables: starts in flight, foreign containers, undeclared GPU
    containers, and containers no longer declared."""
    for s in report.serves:
        line = in_flight_line(s)
        if line is not None:
            prose(escape(line))
    for s in report.serves:
        if s.self_sleep == "asleep":
            prose(escape(self_sleep_line(s)))
    for s in report.serves:
        if s.foreign_project is not None:
            prose(f"[bold yellow]foreign[/bold yellow]: {escape(foreign_line(s))}")
    if report.undeclared_gpu:
        prose(
            "[bold red]undeclared GPU containers[/bold red] (no manifest reserves their memory): "
            + escape(", ".join(report.undeclared_gpu))
        )
    for holder, container, on_roles, kept in report.no_longer_declared:
        prose(
            f"[bold yellow]no longer declared[/bold yellow]: {escape(container)} (started as "
            f"{escape(holder)}) keeps {kept} MiB on {escape(', '.join(on_roles))} until it stops"
        )


_BASIS = {
    "measured": "measured idleness",
    "request": "idle_ttl_s from the request: no source of in-flight counts",
    "unknown": "idle_ttl_s from the request or the last busy reading: the count is unknown",
    "pending": "idle_ttl_s, counted once it has run since the request",
    "ttl": "its own TTL, from the request",
    "none": "no TTL: until `down`",
}


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def foreign_line(s: ServeStatus) -> str:
    """What a serve whose container is another Compose project's is, in words."""
    held = (
        f"its {s.reservation_mib} MiB counted while it runs"
        if s.in_ledger and s.reservation_mib is not None
        else "not in the ledger"
    )
    return (
        f"{s.serve}: container {s.container} ({s.state}) belongs to compose project "
        f"{s.foreign_project}: never started, stopped or removed; {held}"
    )


def desired_cell(s: ServeStatus) -> str:
    """What the serve is desired to be, and why when it is not the manifest's word."""
    if s.evicted_for:
        return f"{s.desired} (evicted for {', '.join(s.evicted_for)})"
    if s.desired_by == "request":
        return f"{s.desired} (request)"
    return s.desired or "unmanaged"


def self_sleep_line(s: ServeStatus) -> str:
    """A serve whose engine put itself to sleep (llama.cpp's --sleep-idle-seconds)."""
    kept = f"{s.held_mib} MiB" if s.held_mib is not None else "its reservation"
    return (
        f"{s.serve}: asleep by itself (its engine unloaded the model when idle); the ledger "
        f"keeps {kept} for it, since any request reloads it"
    )


def in_flight_line(s: ServeStatus) -> str | None:
    """A running serve's requests in flight and what its request's end counts from."""
    if s.state not in ("running", "paused", "restarting"):
        return None
    if s.in_flight_source is None and s.ttl_basis is None:
        return None
    if s.in_flight is not None:
        flight = f"{s.in_flight} requests in flight ({s.in_flight_source})"
        if s.in_flight == 0 and s.idle_since is not None:
            flight += f", idle since {_clock(s.idle_since)}"
    elif s.in_flight_source is None:
        flight = "requests in flight unknown (no source)"
    else:
        flight = f"requests in flight unknown ({s.in_flight_source} unreadable)"
    if s.ttl_basis is None:
        return f"{s.serve}: {flight}"
    ends = f"its request ends at {_clock(s.request_ends_at)}" if s.request_ends_at else None
    if ends is None and s.ttl_basis == "measured" and s.request_ends_at is None:
        ends = "idle_ttl_s counts once it is idle" if s.in_flight else None
    tail = f"{ends}; " if ends else ""
    return f"{s.serve}: {flight}; {tail}TTL: {_BASIS.get(s.ttl_basis, s.ttl_basis)}"


def committed(mib_: int | None, reservations: Iterable[tuple[str, int]]) -> str:
    """A role's committed MiB and its terms (``K (a 1 + b 2)``), or ``unknown``: no
    ``(nothing)`` beside a figure that is not known."""
    if mib_ is None:
        return UNKNOWN
    return f"{mib_} ({' + '.join(f'{h} {m}' for h, m in reservations) or 'nothing'})"


def fit(result: FitResult) -> None:
    """The human answer of ``fit``."""
    style = "green" if result.fits else "red" if result.known else "yellow"
    if result.reason.startswith(f"{result.serve} "):  # it says who and whether itself
        out.print(Text(result.reason, style=style))
    else:
        verdict = (
            "cannot be answered (unknown)"
            if not result.known
            else "fits"
            if result.fits
            else "does not fit"
        )
        out.print(Text(f"{result.serve}: ") + Text(verdict, style=style) + f": {result.reason}")
    for t in result.terms:
        out.print(
            escape(
                f"  {t.gpu_role}: capacity {t.capacity_mib} - reserve {t.reserve_mib} = budget "
                f"{t.budget_mib}; committed {committed(t.committed_mib, t.reservations)}; "
                f"free {mib(t.free_mib)}; requested {t.requested_mib}; "
                f"shortfall {mib(t.shortfall_mib)}"
            )
        )
    for label, items in (
        ("drain", result.drain),
        ("evict", result.evict),
        ("sleep", result.sleep),
        ("blockers", result.blockers),
    ):
        if items:
            out.print(f"  {label}: " + escape(", ".join(items)))
    for s in result.shrink:
        out.print(
            escape(f"  shrink: {s['serve']} gives back {s['give_mib']} MiB (to {s['to_mib']} MiB)")
        )
    for p in result.protected:  # why each blocker may not be stopped now
        out.print(escape(f"  protected: {p.serve} ({mib(p.mib)} MiB): {p.why}"))
    if result.placement is not None:  # a placed serve: where, why, each candidate
        out.print(escape(f"  placement: {result.placement.reason}"))
        for c in result.placement.candidates:
            out.print(escape(f"    {c.text()}"))


def plan(result: Plan) -> None:
    """The human answer of ``plan``: a reviewable change set."""
    from statemachine.planning.plan_types import Action

    if result.empty and not result.blocked:
        out.print("[green]nothing to do[/green]: the host matches the manifest")
    for note in result.notes:
        out.print(f"[bold red]note[/bold red]: {escape(note)}")
    if result.steps:
        out.print(f"[bold]{len(result.steps)} steps[/bold]:")
    for i, s in enumerate(result.steps, 1):
        amount = ""
        if s.mib is not None and s.action in (Action.RESERVE, Action.RELEASE):
            amount = f" {s.mib} MiB"
        elif s.to_mib is not None:
            amount = f" {s.mib} MiB (to {s.to_mib})"
        roles = f" [{', '.join(s.gpu_roles)}]" if s.gpu_roles else ""
        style = _step_styles().get(s.action, "")
        out.print(
            f"  {i:>3}. [{style}]{s.action:<11}[/{style}] {escape(s.serve + roles)}{amount}"
            f"  [dim]— {escape(s.reason)}[/dim]"
        )
    for b in result.blocked:
        out.print(f"[yellow]blocked[/yellow] {escape(b.serve)}: {escape(b.reason)}")
        for p in b.protected:
            out.print(escape(f"    protected: {p.serve} ({mib(p.mib)} MiB): {p.why}"))
    for d in result.placements:  # where each placed serve runs, and why
        where = d.role or "every candidate (unknown card)"
        out.print(escape(f"placed {d.serve} on {where} ({d.how}): {d.reason}"))
    table = Table(title="Ledger (MiB): before → after", title_justify="left")
    for col in ("role", "budget", "committed", "free"):
        table.add_column(col, justify="left" if col == "role" else "right")
    for rid in result.ledger_after.roles:
        before = result.ledger_before.view(rid)
        after = result.ledger_after.view(rid)
        table.add_row(
            Text(rid),
            mib(before.budget_mib),
            f"{mib(before.committed_mib)} → {mib(after.committed_mib)}",
            f"{mib(before.free_mib)} → {mib(after.free_mib)}",
        )
    host_before, host_after = result.ledger_before.host_view(), result.ledger_after.host_view()
    if host_before is not None and host_after is not None:
        table.add_row(
            Text("host RAM"),
            mib(host_before.budget_mib),
            f"{mib(host_before.committed_mib)} → {mib(host_after.committed_mib)}",
            f"{mib(host_before.free_mib)} → {mib(host_after.free_mib)}",
        )
    out.print(table)


@functools.cache
def _step_styles() -> dict[str, str]:
    from statemachine.planning.plan_types import Action

    return {
        Action.STOP: "red",
        Action.RELEASE: "red",
        Action.QUIESCE: "yellow",
        Action.DRAIN: "yellow",
        Action.SHRINK: "yellow",
        Action.START: "green",
        Action.RESERVE: "green",
        Action.GROW: "green",
        Action.AWAIT_READY: "cyan",
        Action.READMIT: "cyan",
        Action.SLEEP: "yellow",
        Action.RELEASE_TO_RESIDUAL: "yellow",
        Action.RESERVE_WAKE: "green",
        Action.WAKE: "green",
        Action.RELOAD: "green",
    }


_OUTCOME_STYLE = {
    "ok": "green",
    "failed": "bold red",
    "aborted": "yellow",
    "interrupted": "yellow",
    "skipped": "dim",
}


def step_result(result: StepResult) -> None:
    """One line of progress as a step finishes."""
    style = _OUTCOME_STYLE.get(str(result.outcome), "")
    out.print(
        f"  [{style}]{result.outcome:<7}[/{style}] {escape(str(result.step.action)):<11} "
        f"{escape(result.step.serve)}  "
        f"[dim]{result.duration_s:.2f}s — {escape(result.detail)}[/dim]"
    )
    if result.logs:
        out.print("[dim]    last log lines:[/dim]")
        for line in result.logs.rstrip().splitlines()[-20:]:
            out.print(f"[dim]    | {escape(line)}[/dim]")


def apply_summary(report: ExecutionReport, mismatches: list[str]) -> None:
    """The final summary of ``apply``."""
    if report.preflight:
        out.print("[bold red]preflight refused the plan; nothing was changed:[/bold red]")
        for problem in report.preflight:
            out.print(f"  - {escape(problem)}")
        return
    counts: dict[str, int] = {}
    for r in report.results:
        counts[str(r.outcome)] = counts.get(str(r.outcome), 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    verdict = "[green]done[/green]" if report.ok else "[bold red]incomplete[/bold red]"
    out.print(f"{verdict}: {summary}")
    if report.stopped_early:
        out.print("[yellow]stopped early: the controller was asked to stop[/yellow]")
    for fault in report.undo_faults:
        out.print(
            f"[bold red]undo fault[/bold red]: {escape(fault.serve)} (undoing group "
            f"{escape(fault.group)} after {escape(fault.after)}): {escape(fault.fault)}"
        )
    for line in mismatches:
        out.print(f"[bold red]ledger mismatch[/bold red]: {escape(line)}")
