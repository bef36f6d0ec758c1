"""Replay: recorded cycles (or one snapshot) re-planned against a manifest set."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from controller.manifest import ManifestSet, load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.snapshot import parse_snapshot
from controller.store import journal as journal_module
from controller.store.journal import Journal
from controller.tools.replay import ReplayError, ReplayReport, render_replay, replay, step_line
from statemachine.domain.types import OnDemandRequest
from statemachine.lifecycle.backoff import Backoff
from statemachine.planning.plan_types import (
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"

MANIFEST = """\
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 1000

[[serve]]
name = "emb"
container = "c-emb"
gpu_role = "a"
vram_mib = 4000
residency = "resident"
desired = "running"

[[serve]]
name = "ocr"
container = "c-ocr"
gpu_role = "a"
vram_mib = 3000
residency = "evictable"
desired = "running"

[[serve]]
name = "asr"
container = "c-asr"
gpu_role = "a"
vram_mib = 4000
residency = "on-demand"
"""

EMPTY: dict[str, Any] = {"docker": "ok", "containers": {}, "gpus": None}
RUNNING: dict[str, Any] = {
    "docker": "ok",
    "containers": {
        "c-emb": {"state": "running", "started_at": 0},
        "c-ocr": {"state": "running", "started_at": 0},
    },
    "gpus": None,
}
ASR_REQUEST = {"serve": "asr", "requested_at": 1990.0, "ttl_s": 600.0}

CYCLE1 = [
    "reserve emb 4000",
    "start emb 4000",
    "await_ready emb",
    "reserve ocr 3000",
    "start ocr 3000",
    "await_ready ocr",
]
CYCLE2 = [
    "stop ocr 3000",
    "release ocr 3000",
    "reserve asr 4000",
    "start asr 4000",
    "await_ready asr",
]


def edited(old: str, new: str) -> str:
    """MANIFEST with one edit (which must apply)."""
    assert MANIFEST.count(old) == 1
    return MANIFEST.replace(old, new)


#: asr's reservation doubled: it no longer fits, even with ocr evicted.
ASR_8000 = edited(
    'vram_mib = 4000\nresidency = "on-demand"', 'vram_mib = 8000\nresidency = "on-demand"'
)
#: ocr flipped to desired stopped.
OCR_STOPPED = edited('"evictable"\ndesired = "running"', '"evictable"\ndesired = "stopped"')


def write_manifest(path: Path, text: str = MANIFEST) -> ManifestSet:
    path.write_text(text)
    return load_manifest_set([path])


def record(
    j: Journal, mset: ManifestSet, at: float, observed: dict[str, Any], reqs: list[Any]
) -> int:
    """Record a cycle the way the loop does: the real planner on the recorded inputs."""
    desired = dataclasses.replace(
        mset.desired(), requests=tuple(OnDemandRequest(**r) for r in reqs)
    )
    plan = plan_transitions(desired, parse_snapshot(observed).to_observed(), None, now=at)
    return j.record_cycle(
        at=at,
        manifest_digest=mset.digest,
        manifest_files={str(p): p.read_text() for p in mset.files},
        observed=observed,
        plan=plan.to_json(),
        requests=reqs,
        dry_run=True,
    )


@pytest.fixture
def journal(tmp_path: Path) -> tuple[Path, ManifestSet, list[int]]:
    mset = write_manifest(tmp_path / "serves.toml")
    path = tmp_path / "state" / "journal.sqlite3"
    with Journal.open(path) as j:
        ids = [record(j, mset, 1000.0, EMPTY, []), record(j, mset, 2000.0, RUNNING, [ASR_REQUEST])]
    return path, mset, ids


def lines(plan: dict[str, Any]) -> list[str]:
    return [step_line(s) for s in plan["steps"]]


def test_same_manifest_replays_same(journal: tuple[Path, ManifestSet, list[int]]) -> None:
    path, mset, ids = journal
    report = replay(path, mset)
    assert report.kind == "journal" and [c.id for c in report.cycles] == ids
    assert [c.status for c in report.cycles] == ["same", "same"]
    assert not report.differs
    one, two = report.cycles
    assert lines(one.new_plan) == CYCLE1 and lines(two.new_plan) == CYCLE2
    assert one.at == 1000.0 and not one.manifest_changed
    assert all(not (c.added or c.removed or c.blocked_added) for c in report.cycles)
    data = report.to_json()
    assert data["summary"] == {
        "cycles": 2,
        "same": 2,
        "differs": 0,
        "unrecorded": 0,
        "errors": 0,
    }
    json.dumps(data)  # JSON-serialisable


def test_bigger_reservation_differs(
    tmp_path: Path, journal: tuple[Path, ManifestSet, list[int]]
) -> None:
    path, _, _ = journal
    changed = write_manifest(
        tmp_path / "changed.toml",
        ASR_8000,
    )
    report = replay(path, changed)
    one, two = report.cycles
    assert one.status == "same" and one.manifest_changed  # asr is not asked for in cycle 1
    assert two.status == "differs" and report.differs
    # 8000 MiB no longer fits even with ocr evicted (emb is resident): nothing is done
    assert two.removed == CYCLE2 and two.added == []
    assert two.blocked_added == ["asr"] and two.blocked_removed == []
    assert two.diff == [f"- {line}" for line in CYCLE2]
    reason = two.new_plan["blocked"][0]["reason"]
    assert "does not fit" in reason and "8000" in reason


def test_desired_flip_differs_only_where_it_matters(
    tmp_path: Path, journal: tuple[Path, ManifestSet, list[int]]
) -> None:
    path, _, _ = journal
    flipped = write_manifest(
        tmp_path / "flipped.toml",
        OCR_STOPPED,
    )
    one, two = replay(path, flipped).cycles
    assert one.status == "differs"
    assert one.removed == ["reserve ocr 3000", "start ocr 3000", "await_ready ocr"]
    assert one.added == []
    assert one.diff[:3] == ["  reserve emb 4000", "  start emb 4000", "  await_ready emb"]
    # cycle 2 stops ocr for another reason (desired stopped, not eviction): same steps
    assert two.status == "same"
    assert "desired stopped" in two.new_plan["steps"][0]["reason"]


def test_cycle_selects_one(journal: tuple[Path, ManifestSet, list[int]]) -> None:
    path, mset, ids = journal
    report = replay(path, mset, cycle=ids[1])
    assert [c.id for c in report.cycles] == [ids[1]]
    with pytest.raises(
        ReplayError, match=rf"journal.sqlite3: no cycle 999 .*cycles {ids[0]}-{ids[1]}"
    ):
        replay(path, mset, cycle=999)


def test_replay_does_not_write_the_journal(journal: tuple[Path, ManifestSet, list[int]]) -> None:
    path, mset, ids = journal
    replay(path, mset)
    with Journal.open(path, readonly=True) as j:
        assert [c.id for c in j.cycles()] == ids
        assert all(c.outcome is None for c in j.cycles())


def test_snapshot_source(tmp_path: Path) -> None:
    mset = write_manifest(tmp_path / "serves.toml")
    snap = tmp_path / "observed.json"
    snap.write_text(json.dumps({**RUNNING, "taken_at": 2000.0, "requests": [ASR_REQUEST]}))
    report = replay(snap, mset)
    assert report.kind == "snapshot"
    (only,) = report.cycles
    assert only.status == "unrecorded" and only.recorded_plan is None and not only.same
    assert only.at == 2000.0 and only.added == CYCLE2 and only.removed == []
    # without requests nothing is asked: the fleet is converged
    snap.write_text(json.dumps(RUNNING))
    (only,) = replay(snap, mset).cycles
    assert only.at == 0.0 and only.added == [] and only.new_plan["blocked"] == []
    with pytest.raises(ReplayError, match="no cycles to select"):
        replay(snap, mset, cycle=1)


def test_example_snapshot_replays() -> None:
    mset = load_manifest_set([EXAMPLES / "single-card.toml"])
    report = replay(EXAMPLES / "single-card.observed.json", mset)
    assert report.cycles[0].error is None
    assert report.cycles[0].at > 0  # taken_at


def test_a_replay_reproduces_where_each_placed_serve_goes() -> None:
    mset = load_manifest_set([EXAMPLES / "placement.toml"])
    (cycle,) = replay(EXAMPLES / "placement.observed.json", mset).cycles
    assert cycle.added[-2:] == ["placed chat-b on card-b", "placed big on card-a"]
    assert [p["role"] for p in cycle.new_plan["placements"]] == ["card-b", "card-a"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"\x00\x01\x02garbage", "neither a vramctl journal"),
        (b"SQLite format 3\x00" + b"\xff" * 200, "journal"),
        (b'{"containers": {}}', 'no top-level "docker"'),
        (b'{"docker": "maybe"}', "docker"),
        (b"[1, 2]", 'no top-level "docker"'),
    ],
)
def test_unknown_or_corrupt_source(tmp_path: Path, content: bytes, match: str) -> None:
    mset = write_manifest(tmp_path / "serves.toml")
    bad = tmp_path / "bad.input"
    bad.write_bytes(content)
    with pytest.raises(ReplayError, match=match) as info:
        replay(bad, mset)
    assert "bad.input" in str(info.value)


def test_missing_source(tmp_path: Path) -> None:
    mset = write_manifest(tmp_path / "serves.toml")
    with pytest.raises(ReplayError, match=r"nowhere\.json: cannot read"):
        replay(tmp_path / "nowhere.json", mset)
    with pytest.raises(ReplayError, match="a directory"):
        replay(tmp_path, mset)


def test_unparseable_recorded_cycle_is_reported_not_fatal(tmp_path: Path) -> None:
    mset = write_manifest(tmp_path / "serves.toml")
    path = tmp_path / "j.sqlite3"
    with Journal.open(path) as j:
        j.record_cycle(
            at=1.0,
            manifest_digest=mset.digest,
            manifest_files={},
            observed={"docker": "weird"},
            plan={"steps": [], "blocked": []},
            requests=[],
            dry_run=False,
        )
        record(j, mset, 1000.0, EMPTY, [])
    report = replay(path, mset)
    bad, good = report.cycles
    assert bad.status == "error" and bad.error is not None and "cycle 1" in bad.error
    assert good.status == "same" and len(report.errors) == 1


def render(report: ReplayReport) -> str:
    buf = io.StringIO()
    render_replay(report, Console(file=buf, width=200, color_system=None))
    return buf.getvalue()


def test_render(tmp_path: Path, journal: tuple[Path, ManifestSet, list[int]]) -> None:
    path, mset, ids = journal
    text = render(replay(path, mset))
    assert f"cycle {ids[0]}  1970-01-01T00:16:40+00:00  same" in text
    assert "2 cycles: 2 same, 0 differ" in text
    changed = write_manifest(
        tmp_path / "changed.toml",
        ASR_8000,
    )
    text = render(replay(path, changed))
    assert "differs" in text and "- stop ocr 3000" in text and "+ blocked asr" in text
    assert "recorded under another manifest" in text
    snap = tmp_path / "o.json"
    snap.write_text(json.dumps({**RUNNING, "requests": [ASR_REQUEST]}))
    text = render(replay(snap, mset))
    assert "snapshot  time unknown  unrecorded" in text and "+ reserve asr 4000" in text


# ── the policy the loop planned with ─────────────────────────────────────────


def held_manifest(tmp_path: Path) -> tuple[Path, str]:
    """Two desired-running serves whose containers do not exist (unique names)."""
    tag = uuid.uuid4().hex[:12]
    text = f"""
[[gpu_roles]]
id = "a"
vram_mib = 10000

[[serve]]
name = "held"
container = "vramctl-test-{tag}-held"
gpu_role = "a"
vram_mib = 2000
residency = "resident"
desired = "running"

[[serve]]
name = "other"
container = "vramctl-test-{tag}-other"
gpu_role = "a"
vram_mib = 2000
residency = "resident"
desired = "running"
"""
    path = tmp_path / "serves.toml"
    path.write_text(text)
    return path, tag


@pytest.mark.docker
def test_a_cycle_planned_under_a_backoff_hold_replays_same(tmp_path: Path) -> None:
    """The loop journals its policy; replay plans each cycle with it, so it agrees."""
    path, _ = held_manifest(tmp_path)
    mset = load_manifest_set([path])
    c = Controller(RunOptions(manifests=(path,), state_dir=tmp_path / "state", dry_run=True), mset)
    journal_file = tmp_path / "state" / "journal.dry-run.sqlite3"
    c.journal = Journal.open(journal_file)
    c.backoff["held"] = Backoff(failures=2, until=9e18, last_failure="container exited 1")
    try:
        summary = asyncio.run(c.reconcile(("test",)))
    finally:
        c.journal.close()
    assert summary.plan is not None
    assert [(s.action, s.serve) for s in summary.plan.steps][:2] == [
        ("reserve", "other"),
        ("start", "other"),
    ]
    assert {b.serve for b in summary.plan.blocked} == {"held"}

    with Journal.open(journal_file, readonly=True) as j:
        (rec,) = j.cycles()
    assert rec.policy is not None and "held" in rec.policy["hold"]

    report = replay(journal_file, mset)
    assert [c.status for c in report.cycles] == ["same"]
    # planned without the hold, the same inputs start "held" too: the policy matters
    unheld = replay(journal_file, mset, policy=Policy())
    assert [c.status for c in unheld.cycles] == ["differs"]
    assert "start held 2000" in unheld.cycles[0].added


def test_a_journal_from_before_the_policy_column_still_opens(tmp_path: Path) -> None:
    """Older journals (no ``cycles.policy``): read-only they read NULL; writable gain it."""
    path = tmp_path / "journal.sqlite3"
    # the schema as released: the cycles table without its policy column
    lines = [ln for ln in journal_module._SCHEMA.splitlines() if " policy " not in ln]
    old_schema = "\n".join(lines).replace("outcome         TEXT,", "outcome         TEXT")
    assert "policy" not in old_schema
    conn = sqlite3.connect(path)
    conn.executescript(old_schema + f"PRAGMA user_version = {journal_module.SCHEMA_VERSION};")
    conn.execute("INSERT INTO manifests VALUES ('d', '{}', 1.0)")
    conn.execute(
        "INSERT INTO cycles (at, manifest_digest, observed, plan, requests, dry_run) "
        "VALUES (1.0, 'd', ?, ?, '[]', 1)",
        (json.dumps(EMPTY), json.dumps({"steps": [], "blocked": []})),
    )
    conn.commit()
    conn.close()
    with Journal.open(path, readonly=True) as j:
        (rec,) = j.cycles()
        assert rec.policy is None
    with Journal.open(path) as j:
        (rec,) = j.cycles()
        assert rec.policy is None
        new = j.record_cycle(
            at=2.0,
            manifest_digest="d",
            manifest_files={},
            observed=EMPTY,
            plan={"steps": [], "blocked": []},
            requests=[],
            dry_run=True,
            policy=Policy(hold={"x": "why"}).to_json(),
        )
        assert j.cycles(cycle=new)[0].policy == {
            "exact_search_limit": Policy().exact_search_limit,
            "no_shrink": [],
            "hold": {"x": "why"},
        }


def test_a_malformed_recorded_policy_is_that_cycles_error(tmp_path: Path) -> None:
    mset = write_manifest(tmp_path / "serves.toml")
    path = tmp_path / "journal.sqlite3"
    with Journal.open(path) as j:
        j.record_cycle(
            at=1.0,
            manifest_digest=mset.digest,
            manifest_files={},
            observed=EMPTY,
            plan={"steps": [], "blocked": []},
            requests=[],
            dry_run=True,
            policy={"hold": ["not", "a", "mapping"]},
        )
    (cycle,) = replay(path, mset).cycles
    assert cycle.status == "error"
    assert cycle.error is not None and "policy: hold" in cycle.error
