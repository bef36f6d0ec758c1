"""Builders of a controller under test, without Docker: its manifest, journal and a
snapshot of containers as one cycle would have seen them.

Nothing here runs the loop or checks a result; the tests do.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from controller.manifest import load_manifest_set
from controller.service.loop import Controller, CycleSummary, RunOptions
from controller.snapshot import parse_snapshot
from controller.store.journal import Journal, journal_path


def controller_on(tmp_path: Path, manifest: str, **options: Any) -> Controller:
    """A controller of ``manifest`` (written to ``tmp_path/serves.toml``), state in
    ``tmp_path/state``, its journal open; ``options`` go to :class:`RunOptions`."""
    path = tmp_path / "serves.toml"
    path.write_text(manifest)
    run = RunOptions(manifests=(path,), state_dir=tmp_path / "state", **options)
    c = Controller(run, load_manifest_set([path]))
    c.journal = Journal.open(journal_path(c.state_dir))
    return c


def observe(c: Controller, containers: dict[str, Any]) -> None:
    """One cycle's snapshot: ``containers`` by serve (container ``c-<serve>``), no GPUs."""
    snap = parse_snapshot(
        {"docker": "ok", "containers": {f"c-{k}": v for k, v in containers.items()}, "gpus": None}
    )
    c.last = CycleSummary(at=time.time(), snapshot=snap)
    c.cycles += 1


def running_for(age_s: float) -> dict[str, Any]:
    """A running container's snapshot entry, started ``age_s`` seconds ago."""
    return {"state": "running", "started_at": time.time() - age_s}
