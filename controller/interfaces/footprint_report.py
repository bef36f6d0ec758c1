"""Measured footprints and reserve waivers as ``status`` and ``calibrate`` show them.

It reads the footprint samples from the journal of a state directory (read only: a
running controller keeps writing), formats declared vs measured per serve, the GPU
roles' reserve waivers, ``calibrate``'s proposals and the patch ``calibrate --patch``
prints. The arithmetic is :mod:`statemachine.sizing.footprint`'s; this module only reads and
formats. It never writes a manifest or the journal.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from controller.manifest import ManifestSet
from controller.service.footprints import samples_of, summaries
from controller.store.journal import (
    Journal,
    JournalError,
    StateDirError,
    journal_path,
    journal_to_read,
)
from statemachine.sizing.footprint import Footprint, Proposal, Sample

__all__ = [
    "footprint_table",
    "load_samples",
    "manifest_patch",
    "proposal_lines",
    "reserve_table",
    "reserves_json",
    "status_footprints",
]

UNKNOWN = "unknown"


def load_samples(state_dir: Path) -> tuple[list[Sample], str | None]:
    """The samples recorded in ``state_dir``'s journal, and why there are none if so."""
    try:
        path = journal_to_read(state_dir)
    except StateDirError as exc:
        return [], str(exc)
    if path is None:
        return [], f"no journal at {journal_path(state_dir)}: `vramctl run` records samples there"
    try:
        with Journal.open(path, readonly=True) as journal:
            return samples_of(journal), None
    except JournalError as exc:
        return [], str(exc)


def status_footprints(mset: ManifestSet, samples: Sequence[Sample]) -> dict[str, Footprint]:
    """Declared vs measured per serve of ``mset`` on a GPU role."""
    return summaries(mset.desired(), samples)


def _mib(value: int | None) -> str:
    """A MiB figure as every other answer prints it (``2048``, not ``2 048``), or unknown."""
    return UNKNOWN if value is None else str(value)


def footprint_table(footprints: Mapping[str, Footprint]) -> Table:
    """Declared vs measured, per serve (``status``)."""
    table = Table(title="Measured footprints (MiB)", title_justify="left")
    for col in ("serve", "declared", "measured", "how", "samples", "last", ""):
        table.add_column(col, justify="right" if col in ("declared", "measured") else "left")
    for name, f in footprints.items():
        flag = Text("")
        if f.exceeds:
            flag = Text(f"OVER its reservation by {f.over_pct:g} %", style="bold red")
        last = "-"
        if f.last is not None:
            s = f.last
            last = f"{s.kind} on {s.role}: {_mib(s.figure_mib)} ({s.method}"
            if s.attributable:
                last += ")"
            else:
                last += f", not attributable: {', '.join(s.others) or s.note})"
        table.add_row(
            Text(name),
            _mib(f.declared_mib),
            _mib(f.measured_mib),
            str(f.method),
            f"{f.samples} ({f.evidence} attributable)",
            Text(last),
            flag,
        )
    return table


def reserves_json(mset: ManifestSet) -> dict[str, dict[str, Any]]:
    """Each role's reserve: its default, the effective value and the rationale."""
    out: dict[str, dict[str, Any]] = {}
    for rid, role in mset.roles.items():
        default = role.reserve_default_mib
        out[rid] = {
            "reserve_mib": role.reserve_mib,
            "reserve_default_mib": default,
            "reserve_rationale": role.reserve_rationale,
            "waived": default is not None and role.reserve_mib < default,
        }
    return out


def reserve_table(mset: ManifestSet) -> Table | None:
    """The roles whose reserve records a default or a rationale (``None``: none does)."""
    rows = {
        rid: r
        for rid, r in reserves_json(mset).items()
        if r["reserve_default_mib"] is not None or r["reserve_rationale"] is not None
    }
    if not rows:
        return None
    table = Table(title="Reserves (MiB)", title_justify="left")
    for col in ("role", "default", "effective", "rationale"):
        table.add_column(col, justify="right" if col in ("default", "effective") else "left")
    for rid, r in rows.items():
        why = r["reserve_rationale"]
        if why:
            rationale = Text(why)
        elif r["waived"]:
            rationale = Text("none recorded", style="yellow")  # the manifest warns
        else:
            rationale = Text("at its default")
        table.add_row(Text(rid), _mib(r["reserve_default_mib"]), _mib(r["reserve_mib"]), rationale)
    return table


def proposal_lines(p: Proposal) -> list[str]:
    """``calibrate``'s human answer for one serve (rich markup escaped)."""
    head = (
        f"[bold]{escape(p.serve)}[/bold]: declared {_mib(p.declared_mib)} MiB; "
        f"{p.samples} sample(s), {p.evidence} attributable"
    )
    if not p.enough:
        return [head, f"  [yellow]{escape(p.why)}[/yellow]"]
    return [
        head,
        f"  {escape(p.arithmetic)}",
        f"  proposed vram_mib = {p.proposed_mib} ({escape(p.why)})",
    ]


_HEADER = re.compile(r"^\s*\[")
_SERVE_HEADER = re.compile(r"^\s*\[\[\s*serve\s*\]\]\s*(#.*)?$")
_VRAM = re.compile(r"^(\s*vram_mib\s*=\s*)(\d[\d_]*)(.*)$")


def _name_line(name: str) -> re.Pattern[str]:
    return re.compile(r"^\s*name\s*=\s*([\"'])" + re.escape(name) + r"\1\s*(#.*)?$")


def manifest_patch(mset: ManifestSet, proposals: Sequence[Proposal]) -> tuple[str, list[str]]:
    """A unified diff setting each proposed ``vram_mib`` (nothing is written).

    Returns the diff and the serves it could not patch (their ``vram_mib`` is not a
    ``vram_mib = N`` line of their ``[[serve]]`` table), with why.
    """
    changes: dict[Path, dict[str, int]] = {}
    for p in proposals:
        if p.proposed_mib is None or p.proposed_mib == p.declared_mib:
            continue
        changes.setdefault(mset.source(p.serve), {})[p.serve] = p.proposed_mib
    diffs: list[str] = []
    problems: list[str] = []
    for path, wanted in changes.items():
        text = mset.texts.get(str(path))
        if text is None:
            text = path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        new = list(lines)
        for serve, mib in wanted.items():
            if not _patch_one(new, serve, mib):
                problems.append(f"{serve}: no `vram_mib = N` line in its [[serve]] table in {path}")
        diffs.extend(difflib.unified_diff(lines, new, fromfile=f"a/{path}", tofile=f"b/{path}"))
    return "".join(diffs), problems


def _patch_one(lines: list[str], serve: str, mib: int) -> bool:
    named = _name_line(serve)
    start: int | None = None
    for i, line in enumerate([*lines, "[end]"]):
        if _HEADER.match(line):
            if start is not None and any(named.match(x) for x in lines[start:i]):
                for j in range(start, i):
                    m = _VRAM.match(lines[j].rstrip("\r\n"))
                    if m:
                        ending = lines[j][len(lines[j].rstrip("\r\n")) :]
                        lines[j] = f"{m.group(1)}{mib}{m.group(3)}{ending}"
                        return True
                return False
            start = i + 1 if _SERVE_HEADER.match(line) else None
    return False
