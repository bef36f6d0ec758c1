"""Golden plans: the plan JSON for every example and the fixture manifests, byte for byte.

Each case plans a manifest set against a saved (or synthetic) observation, with and
without on-demand requests and a backoff hold, and compares the whole plan JSON
(steps, blocked serves, ledger before and after, notes) with the file stored under
``tests/golden/``. A refactor must leave every golden unchanged; a change of
behaviour shows as a diff here first.

Regenerate after an intended change of behaviour, and review the diff::

    VRAMCTL_REGEN_GOLDEN=1 PYTHONPATH=$PWD python -m pytest tests/shell/test_golden_plans.py
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controller.manifest import load_manifest_set
from controller.snapshot import SnapshotModel, load_snapshot
from statemachine.domain.types import OnDemandRequest, Residency
from statemachine.planning.plan_types import (
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
FIX = Path(__file__).resolve().parents[1] / "fixtures"
ANVIL = FIX / "anvil-serving"
ANVIL_SET = [ANVIL / "serves.toml", ANVIL / "serves.voice.toml", ANVIL / "serves.comfyui.toml"]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REGEN = os.environ.get("VRAMCTL_REGEN_GOLDEN") == "1"
NOW = 1_800_000_000.0


def _snapshot_of(data: dict[str, Any]) -> SnapshotModel:
    return SnapshotModel.model_validate(data)


def _anvil_observations() -> dict[str, SnapshotModel]:
    saved = load_snapshot(FIX / "anvil-serving.observed.json")
    raw = json.loads((FIX / "anvil-serving.observed.json").read_text(encoding="utf-8"))
    empty = {"docker": "ok", "taken_at": NOW, "containers": {}, "gpus": raw["gpus"]}
    empty["gpus"] = [dict(g, used_mib=0, free_mib=g["total_mib"]) for g in raw["gpus"]]
    exited = dict(
        raw, containers={n: {"state": "exited", "exit_code": 0} for n in raw["containers"]}
    )
    crashed = dict(
        raw,
        containers={
            n: ({"state": "exited", "exit_code": 137, "oom_killed": True} if i % 2 else c)
            for i, (n, c) in enumerate(raw["containers"].items())
        },
    )
    no_docker = {"docker": "error", "taken_at": NOW, "docker_error": "socket refused"}
    return {
        "saved": saved,
        "empty-host": _snapshot_of(empty),
        "all-exited": _snapshot_of(exited),
        "half-crashed": _snapshot_of(crashed),
        "docker-error": _snapshot_of(no_docker),
    }


def _cases() -> list[tuple[str, list[Path], SnapshotModel]]:
    cases: list[tuple[str, list[Path], SnapshotModel]] = []
    for manifest in sorted(EXAMPLES.glob("*.toml")):
        cases.append(
            (
                f"example-{manifest.stem}",
                [manifest],
                load_snapshot(manifest.with_suffix(".observed.json")),
            )
        )
    for label, snap in _anvil_observations().items():
        cases.append((f"anvil-{label}", ANVIL_SET, snap))
    for name in ("serves.toml", "serves.voice.toml", "serves.comfyui.toml"):
        cases.append(
            (
                f"anvil-{Path(name).stem}-saved",
                [ANVIL / name],
                load_snapshot(FIX / "anvil-serving.observed.json"),
            )
        )
    return cases


CASES = _cases()


def _plans(paths: list[Path], snap: SnapshotModel) -> dict[str, Any]:
    """Every plan of one case: as is, each on-demand serve requested, and a hold."""
    mset = load_manifest_set(paths)
    desired, observed = mset.desired(), snap.to_observed()
    now = snap.taken_at_epoch() or NOW
    out: dict[str, Any] = {"plain": plan_transitions(desired, observed, Policy(), now).to_json()}
    on_demand = [s.name for s in desired.serves.values() if s.residency is Residency.ON_DEMAND]
    for serve in on_demand:
        asked = replace(desired, requests=(OnDemandRequest(serve, now - 1.0, 600.0),))
        out[f"request:{serve}"] = plan_transitions(asked, observed, Policy(), now).to_json()
    if len(on_demand) >= 2:
        both = tuple(OnDemandRequest(s, now - 1.0 - i, None) for i, s in enumerate(on_demand))
        out["request:all"] = plan_transitions(
            replace(desired, requests=both), observed, Policy(), now
        ).to_json()
    hold = {s.name: "backoff: 2 failures" for s in list(desired.serves.values())[:2]}
    out["hold"] = plan_transitions(desired, observed, Policy(hold=hold), now).to_json()
    elastic = frozenset(s.name for s in desired.serves.values())
    if on_demand:
        asked = replace(desired, requests=(OnDemandRequest(on_demand[0], now - 1.0),))
        out["no-shrink"] = plan_transitions(
            asked, observed, Policy(no_shrink=elastic), now
        ).to_json()
    return out


@pytest.mark.parametrize(("name", "paths", "snap"), CASES, ids=[c[0] for c in CASES])
def test_golden_plan(name: str, paths: list[Path], snap: SnapshotModel) -> None:
    text = json.dumps(_plans(paths, snap), indent=2, sort_keys=True) + "\n"
    golden = GOLDEN / f"{name}.json"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden.name} missing: regenerate with VRAMCTL_REGEN_GOLDEN=1"
    assert golden.read_text(encoding="utf-8") == text, (
        f"the plans of {name} changed; if intended, regenerate with VRAMCTL_REGEN_GOLDEN=1"
    )


def test_goldens_have_steps_and_blocked() -> None:
    """The goldens cover plans with steps, blocked serves and evictions (not only no-ops)."""
    texts = [p.read_text(encoding="utf-8") for p in sorted(GOLDEN.glob("*.json"))]
    assert len(texts) == len(CASES)
    plans = [plan for t in texts for plan in json.loads(t).values()]
    assert any(p["steps"] for p in plans)
    assert any(p["blocked"] for p in plans)
    assert any(s["action"] == "stop" for p in plans for s in p["steps"])  # evictions
