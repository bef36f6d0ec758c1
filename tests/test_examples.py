"""Every example in manifests/examples/ validates, and plans from its saved observation.

The examples are what an operator tries first; each ``NAME.toml`` has a
``NAME.observed.json`` beside it so ``plan`` and ``fit`` work without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.manifest import load_manifest_set
from controller.snapshot import load_snapshot
from statemachine.fit import fit_serve
from statemachine.ledger import Refusal
from statemachine.planner import Policy, plan_transitions
from statemachine.simulate import apply_plan, ledger_prefixes
from statemachine.types import Residency

EXAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "examples"
MANIFESTS = sorted(EXAMPLES.glob("*.toml"))


def test_there_are_examples() -> None:
    assert {p.stem for p in MANIFESTS} >= {"single-card", "two-card"}


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_example_validates_and_plans(manifest: Path) -> None:
    mset = load_manifest_set([manifest])
    assert not mset.warnings, mset.warnings
    snapshot_path = manifest.with_suffix(".observed.json")
    assert snapshot_path.exists(), f"{manifest.name} needs {snapshot_path.name} beside it"
    snap = load_snapshot(snapshot_path)
    desired, observed = mset.desired(), snap.to_observed()
    now = snap.taken_at_epoch() or 0.0
    plan = plan_transitions(desired, observed, Policy(), now)
    assert plan.steps, "an example should show a change set"
    for step, ledger in ledger_prefixes(plan):
        assert not isinstance(ledger, Refusal), f"{step}: {ledger.message}"
        for role in ledger.roles:
            assert ledger.committed_mib(role) <= ledger.roles[role].budget_mib
    again = plan_transitions(desired, apply_plan(desired, observed, plan, now), Policy(), now)
    assert again.empty, [s.to_json() for s in again.steps]
    for serve in desired.serves.values():
        if serve.residency is Residency.ON_DEMAND:
            answer = fit_serve(desired, observed, serve.name, now=now)
            assert answer.fits, answer.reason
            assert answer.evict, f"{serve.name}: the example should show an eviction"
