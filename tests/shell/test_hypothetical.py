"""``statemachine.answers.hypothetical``: "could N MiB run on this role now?" as a fit question."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.manifest import load_manifest_set
from controller.snapshot import load_snapshot
from statemachine.answers.fit import fit_serve
from statemachine.answers.hypothetical import HYPOTHETICAL, HypotheticalError, with_hypothetical
from statemachine.domain.types import DesiredState, Observed, Residency

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
OBSERVED = ROOT / "manifests" / "examples" / "single-card.observed.json"


def _inputs() -> tuple[DesiredState, Observed, float]:
    snap = load_snapshot(OBSERVED)
    return load_manifest_set([EXAMPLE]).desired(), snap.to_observed(), snap.taken_at_epoch() or 0.0


def test_the_hypothetical_serve_is_on_demand_on_one_role() -> None:
    desired, _, _ = _inputs()
    added = with_hypothetical(desired, 1234, "display-card")
    spec = added.serves[HYPOTHETICAL]
    assert spec.residency is Residency.ON_DEMAND
    assert spec.gpu_roles == ("display-card",) and spec.vram_mib == 1234
    assert spec.port is None and spec.router_tier is None and spec.desired is None
    assert added.in_ledger(spec)
    assert HYPOTHETICAL not in desired.serves  # the set itself is left as it was


@pytest.mark.parametrize(
    ("mib", "role", "says"),
    [
        (1000, "nope", 'no gpu role "nope"'),
        (0, "display-card", "positive"),
        (-5, "display-card", "positive"),
        (True, "display-card", "positive"),
    ],
)
def test_a_question_that_cannot_be_asked_is_refused(mib: int, role: str, says: str) -> None:
    desired, _, _ = _inputs()
    with pytest.raises(HypotheticalError, match=says):
        with_hypothetical(desired, mib, role)


def test_it_costs_what_a_declared_serve_of_that_size_costs() -> None:
    desired, observed, now = _inputs()
    for mib, evicted in ((1000, []), (20000, ["ocr"])):
        added = with_hypothetical(desired, mib, "display-card")
        answer = fit_serve(added, observed, HYPOTHETICAL, now=now)
        assert answer.fits and list(answer.evict) == evicted
        [terms] = answer.terms
        assert terms.requested_mib == mib
    too_big = with_hypothetical(desired, 40000, "display-card")
    answer = fit_serve(too_big, observed, HYPOTHETICAL, now=now)
    assert not answer.fits and answer.reason
