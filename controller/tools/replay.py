"""Replay: re-plan recorded inputs against a manifest set and show what would change.

``vramctl replay JOURNAL|SNAPSHOT -m …`` answers "what would this manifest change have
done last night?". For every recorded cycle of a journal (:mod:`controller.store.journal`),
or for one observed snapshot file, :func:`replay` rebuilds the planner's inputs:

- the observation from the recorded snapshot (``parse_snapshot(...).to_observed()``);
- the desired state from the **given** manifest set, with the on-demand requests the
  cycle recorded (a snapshot file may carry a ``requests`` list too);
- ``now`` = the cycle's recorded time (a snapshot's ``taken_at``, else 0);
- the planner policy the cycle recorded (the loop's backoff holds and ``no_shrink``
  serves), so a cycle planned under a hold replays as the loop decided it; a cycle
  recorded before the journal kept it, or a snapshot, plans with the default policy;
  a ``policy`` given to :func:`replay` replaces the recorded one;

and calls the current :func:`statemachine.planning.planner.plan_transitions`. The new plan's
steps are compared with the recorded plan's as ``"action serve mib"`` lines (difflib), with a
``"placed serve on role"`` line per placement decision,
and the sets of blocked serves are compared too.

Nothing is executed: this module must not touch docker, NVML, the network or the
router; it opens the journal read-only and writes nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from controller.manifest import ManifestSet
from controller.snapshot import SnapshotError, parse_snapshot
from controller.store.journal import CycleRecord, Journal, JournalError
from statemachine.answers.situation import Situation
from statemachine.domain.types import OnDemandRequest
from statemachine.planning.plan_types import (
    Policy,
)

__all__ = [
    "SQLITE_MAGIC",
    "CycleReplay",
    "ReplayError",
    "ReplayReport",
    "render_replay",
    "replay",
    "step_line",
]

#: The first 16 bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"

SourceKind = Literal["journal", "snapshot"]


class ReplayError(Exception):
    """The source cannot be replayed (unreadable, unknown format, no such cycle)."""


@dataclass(frozen=True, slots=True)
class CycleReplay:
    """One cycle re-planned.

    ``added`` / ``removed`` are step lines (:func:`step_line`) in the new plan but not
    the recorded one and vice versa; ``diff`` is the whole new plan as difflib lines
    (``"  "`` kept, ``"+ "`` added, ``"- "`` removed), in order. ``blocked_added`` /
    ``blocked_removed`` are serves blocked now but not then, and vice versa. Without a
    recorded plan (a snapshot source) nothing is compared: ``same`` is False and every
    new step is ``added``. ``error`` is set (and the plan empty) when the recorded
    inputs could not be rebuilt.
    """

    id: int
    at: float
    same: bool
    added: list[str]
    removed: list[str]
    blocked_added: list[str]
    blocked_removed: list[str]
    new_plan: dict[str, Any]
    recorded_plan: dict[str, Any] | None
    manifest_changed: bool
    manifest_digest: str | None = None
    diff: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def status(self) -> Literal["same", "differs", "unrecorded", "error"]:
        """One word for the header: same, differs, unrecorded (no plan to compare), error."""
        if self.error is not None:
            return "error"
        if self.recorded_plan is None:
            return "unrecorded"
        return "same" if self.same else "differs"

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "id": self.id,
            "at": self.at,
            "status": self.status,
            "same": self.same,
            "manifest_changed": self.manifest_changed,
            "manifest_digest": self.manifest_digest,
            "added": list(self.added),
            "removed": list(self.removed),
            "blocked_added": list(self.blocked_added),
            "blocked_removed": list(self.blocked_removed),
            "diff": list(self.diff),
            "error": self.error,
            "new_plan": self.new_plan,
            "recorded_plan": self.recorded_plan,
        }


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """Every replayed cycle, oldest first."""

    source: str
    kind: SourceKind
    manifest_digest: str
    cycles: list[CycleReplay]

    @property
    def differs(self) -> bool:
        """True when some recorded cycle would now plan differently."""
        return any(c.status == "differs" for c in self.cycles)

    @property
    def errors(self) -> list[CycleReplay]:
        """Cycles whose recorded inputs could not be rebuilt."""
        return [c for c in self.cycles if c.error is not None]

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "source": self.source,
            "kind": self.kind,
            "manifest_digest": self.manifest_digest,
            "summary": {
                "cycles": len(self.cycles),
                "same": sum(c.status == "same" for c in self.cycles),
                "differs": sum(c.status == "differs" for c in self.cycles),
                "unrecorded": sum(c.status == "unrecorded" for c in self.cycles),
                "errors": len(self.errors),
            },
            "cycles": [c.to_json() for c in self.cycles],
        }


# ── comparing plans ──────────────────────────────────────────────────────────


def step_line(step: Mapping[str, Any]) -> str:
    """A plan step (JSON) as one comparable line: ``"action serve [mib] [(to N)]"``."""
    parts = [str(step.get("action")), str(step.get("serve"))]
    if step.get("mib") is not None:
        parts.append(str(step["mib"]))
    if step.get("to_mib") is not None:
        parts.append(f"(to {step['to_mib']})")
    return " ".join(parts)


def _lines(plan: Mapping[str, Any] | None) -> list[str]:
    """The steps' lines, then a ``"placed serve on role"`` line per placement decision
    (docs/placement.md): a replay reproduces where each placed serve goes."""
    if plan is None:
        return []
    steps = [step_line(s) for s in plan.get("steps") or []]
    return steps + [
        f"placed {p.get('serve')} on {p.get('role') or 'every candidate'}"
        for p in plan.get("placements") or []
    ]


def _blocked(plan: Mapping[str, Any] | None) -> set[str]:
    if plan is None:
        return set()
    return {str(b.get("serve")) for b in plan.get("blocked") or []}


def _compare(
    new: Mapping[str, Any], recorded: Mapping[str, Any] | None
) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    """(added, removed, diff, blocked_added, blocked_removed)."""
    old_lines, new_lines = _lines(recorded), _lines(new)
    added: list[str] = []
    removed: list[str] = []
    diff: list[str] = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            diff.extend(f"  {line}" for line in new_lines[j1:j2])
            continue
        removed.extend(old_lines[i1:i2])
        added.extend(new_lines[j1:j2])
        diff.extend(f"- {line}" for line in old_lines[i1:i2])
        diff.extend(f"+ {line}" for line in new_lines[j1:j2])
    old_blocked, new_blocked = _blocked(recorded), _blocked(new)
    return (
        added,
        removed,
        diff,
        sorted(new_blocked - old_blocked),
        sorted(old_blocked - new_blocked),
    )


# ── re-planning ──────────────────────────────────────────────────────────────


def _requests(raw: Any, where: str) -> tuple[OnDemandRequest, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ReplayError(f"{where}: requests: expected a list, got {type(raw).__name__}")
    out: list[OnDemandRequest] = []
    for i, item in enumerate(raw):
        try:
            ttl = item.get("ttl_s")
            out.append(
                OnDemandRequest(
                    serve=str(item["serve"]),
                    requested_at=float(item["requested_at"]),
                    ttl_s=None if ttl is None else float(ttl),
                    released=bool(item.get("released", False)),
                )
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ReplayError(f"{where}: requests[{i}]: not a request ({exc!r})") from None
    return tuple(out)


def _replay_one(
    *,
    cycle_id: int,
    at: float,
    observed: Any,
    requests: Any,
    recorded_plan: dict[str, Any] | None,
    recorded_digest: str | None,
    mset: ManifestSet,
    policy: Policy | None,
    where: str,
    recorded_policy: Any = None,
) -> CycleReplay:
    changed = recorded_digest is not None and recorded_digest != mset.digest
    try:
        obs = parse_snapshot(observed, source=where).to_observed()
        desired = dataclasses.replace(mset.desired(), requests=_requests(requests, where))
        if policy is None and recorded_policy is not None:
            try:
                policy = Policy.from_json(recorded_policy)
            except ValueError as exc:
                raise ReplayError(f"the recorded {exc}") from None
    except (SnapshotError, ReplayError) as exc:
        return CycleReplay(
            id=cycle_id,
            at=at,
            same=False,
            added=[],
            removed=[],
            blocked_added=[],
            blocked_removed=[],
            new_plan={},
            recorded_plan=recorded_plan,
            manifest_changed=changed,
            manifest_digest=recorded_digest,
            error=str(exc),
        )
    new_plan = Situation(desired, obs, at, policy or Policy()).plan.to_json()
    added, removed, diff, b_added, b_removed = _compare(new_plan, recorded_plan)
    same = recorded_plan is not None and not (added or removed or b_added or b_removed)
    return CycleReplay(
        id=cycle_id,
        at=at,
        same=same,
        added=added,
        removed=removed,
        blocked_added=b_added,
        blocked_removed=b_removed,
        new_plan=new_plan,
        recorded_plan=recorded_plan,
        manifest_changed=changed,
        manifest_digest=recorded_digest,
        diff=diff,
    )


def _read_head(source: Path) -> bytes:
    try:
        with source.open("rb") as fh:
            return fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise ReplayError(f"{source}: cannot read: {exc.strerror or exc}") from None


def _replay_journal(
    source: Path, mset: ManifestSet, cycle: int | None, policy: Policy | None
) -> ReplayReport:
    try:
        with Journal.open(source, readonly=True) as journal:
            records: Sequence[CycleRecord] = journal.cycles(cycle=cycle)
            if cycle is not None and not records:
                ids = journal.cycle_ids()
                have = f"cycles {ids[0]}-{ids[-1]}" if ids else "no cycles"
                raise ReplayError(f"{source}: no cycle {cycle} in the journal ({have})")
    except JournalError as exc:
        raise ReplayError(str(exc)) from None
    cycles = [
        _replay_one(
            cycle_id=rec.id,
            at=rec.at,
            observed=rec.observed,
            requests=rec.requests,
            recorded_plan=rec.plan,
            recorded_digest=rec.manifest_digest,
            mset=mset,
            policy=policy,
            where=f"{source}: cycle {rec.id}: observed",
            recorded_policy=rec.policy,
        )
        for rec in records
    ]
    return ReplayReport(str(source), "journal", mset.digest, cycles)


def _replay_snapshot(
    source: Path, mset: ManifestSet, cycle: int | None, policy: Policy | None
) -> ReplayReport:
    if cycle is not None:
        raise ReplayError(f"{source}: a single observed snapshot has no cycles to select")
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReplayError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReplayError(
            f"{source}: neither a vramctl journal (SQLite) nor an observed snapshot (JSON): {exc}"
        ) from None
    if not isinstance(data, dict) or "docker" not in data:
        raise ReplayError(
            f'{source}: JSON, but not an observed snapshot (no top-level "docker" key)'
        )
    try:
        taken = parse_snapshot(data, source=str(source)).taken_at_epoch()
    except SnapshotError as exc:
        raise ReplayError(str(exc)) from None
    entry = _replay_one(
        cycle_id=0,
        at=taken if taken is not None else 0.0,
        observed=data,
        requests=data.get("requests"),
        recorded_plan=None,
        recorded_digest=None,
        mset=mset,
        policy=policy,
        where=str(source),
    )
    if entry.error is not None:
        raise ReplayError(entry.error)
    return ReplayReport(str(source), "snapshot", mset.digest, [entry])


def replay(
    source: Path,
    mset: ManifestSet,
    *,
    cycle: int | None = None,
    policy: Policy | None = None,
) -> ReplayReport:
    """Re-plan ``source`` (a journal, or one observed snapshot JSON) against ``mset``.

    A journal is recognised by the SQLite header; anything else must be a snapshot.
    ``cycle`` selects one recorded cycle; ``policy`` replaces the policy each cycle
    recorded (by default each cycle is planned with its own). Raises
    :class:`ReplayError` (naming the file) when the source cannot be read, has an
    unknown format, or lacks the cycle. A
    journal cycle whose recorded snapshot no longer parses is reported with ``error``
    instead of stopping the whole replay. Nothing is executed.
    """
    source = Path(source)
    try:
        is_dir = source.is_dir()
    except OSError as exc:  # a folder above it this user may not search
        raise ReplayError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if is_dir:
        raise ReplayError(f"{source}: a directory; give the journal file or a snapshot file")
    if _read_head(source) == SQLITE_MAGIC:
        return _replay_journal(source, mset, cycle, policy)
    return _replay_snapshot(source, mset, cycle, policy)


# ── rendering ────────────────────────────────────────────────────────────────

_STATUS_STYLE = {
    "same": "green",
    "differs": "bold yellow",
    "unrecorded": "cyan",
    "error": "bold red",
}


def _when(at: float) -> str:
    if at <= 0:
        return "time unknown"
    return datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="seconds")


def _render_diff(c: CycleReplay, console: Console) -> None:
    """A cycle whose plan differs: the diff's lines, then the blocked serves it changes."""
    for line in c.diff:
        if line.startswith("+ "):
            console.print(f"  [green]{escape(line)}[/green]")
        elif line.startswith("- "):
            console.print(f"  [red]{escape(line)}[/red]")
    reasons = {str(b.get("serve")): str(b.get("reason")) for b in c.new_plan["blocked"]}
    for serve in c.blocked_added:
        console.print(
            f"  [yellow]+ blocked {escape(serve)}[/yellow]"
            f"  [dim]— {escape(reasons.get(serve, ''))}[/dim]"
        )
    for serve in c.blocked_removed:
        console.print(f"  [yellow]- blocked {escape(serve)}[/yellow]")


def render_replay(report: ReplayReport, console: Console) -> None:
    """The human answer of ``replay``: per cycle a header, then ``+`` / ``-`` lines."""
    if not report.cycles:
        console.print(f"{escape(report.source)}: no recorded cycles")
        return
    for c in report.cycles:
        style = _STATUS_STYLE[c.status]
        label = "cycle" if report.kind == "journal" else "snapshot"
        ident = f"{label} {c.id}" if report.kind == "journal" else label
        note = " [dim](recorded under another manifest)[/dim]" if c.manifest_changed else ""
        console.print(f"[bold]{ident}[/bold]  {_when(c.at)}  [{style}]{c.status}[/{style}]{note}")
        if c.error is not None:
            console.print(f"    [red]{escape(c.error)}[/red]")
        elif c.status == "unrecorded":
            for line in c.added:
                console.print(f"  [green]+ {escape(line)}[/green]")
            for serve in c.blocked_added:
                console.print(f"  [yellow]+ blocked {escape(serve)}[/yellow]")
        elif not c.same:
            _render_diff(c, console)
    if report.kind == "journal":
        summary = report.to_json()["summary"]
        console.print(
            f"{summary['cycles']} cycles: {summary['same']} same, {summary['differs']} differ"
            + (f", {summary['errors']} could not be rebuilt" if summary["errors"] else "")
        )
