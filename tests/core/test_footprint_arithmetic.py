"""A footprint's arithmetic (statemachine/sizing/footprint.py), pure: which windows overlap,
what a stop's sample says, how a peak is raised, how samples are summarised (every
term of declared vs measured) and how a ``vram_mib`` is proposed. The executor's and
the interfaces' use of it is tests/shell/test_footprints.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from statemachine.sizing.footprint import (
    Method,
    Movement,
    Sample,
    propose,
    start_sample,
    stop_sample,
    summarise,
    with_peak,
)


def window(began: float, ended: float | None, roles: str = "a") -> Movement:
    return Movement("other", "start", frozenset(roles), began, ended)


def test_windows_overlap_only_on_a_shared_role_and_touching_ends_count() -> None:
    assert not window(10, 20, "b").overlaps(10, 20, ("a",))
    assert not window(30, 40).overlaps(10, 20, ("a",))
    assert not window(10, 20).overlaps(30, 40, ("a",))
    assert window(10, 20).overlaps(20, 30, ("a",))
    assert window(20, 30).overlaps(10, 20, ("a",))
    assert window(10, None).overlaps(500, None, ("a",))
    assert window(10, 20).overlaps(0, None, ("a",))


def test_a_stop_is_measured_by_the_process_figure_else_the_device_delta() -> None:
    common = {"at": 5.0, "declared_mib": 4000, "before_mib": 9000, "after_mib": 3000}
    proc = stop_sample("x", "a", **common, process_before_mib=5500)  # type: ignore[arg-type]
    assert (proc.method, proc.attributable, proc.delta_mib) == (Method.PROCESS, True, 5500)
    alone = stop_sample("x", "a", **common)  # type: ignore[arg-type]
    assert (alone.method, alone.attributable, alone.delta_mib) == (Method.DELTA, True, 6000)
    crowd = stop_sample("x", "a", **common, others=("y",))  # type: ignore[arg-type]
    assert (crowd.method, crowd.attributable, crowd.delta_mib) == (Method.DELTA, False, 6000)
    assert crowd.note.startswith("y moved on the same GPU")
    blind = stop_sample("x", "a", at=5.0, declared_mib=4000, before_mib=None, after_mib=3000)
    assert (blind.method, blind.attributable, blind.figure_mib) == (Method.UNKNOWN, False, None)


def test_a_sample_read_back_without_the_flag_is_not_attributable() -> None:
    s = start_sample(
        "x", "a", at=1.0, declared_mib=4000, before_mib=1000, after_mib=5000, settled_mib=None
    )
    data = s.to_json()
    assert Sample.from_json(data) == s
    del data["attributable"]
    assert Sample.from_json(data).attributable is False


def test_only_an_attributable_start_has_its_peak_raised() -> None:
    start = start_sample(
        "x", "a", at=1.0, declared_mib=4000, before_mib=1000, after_mib=5000, settled_mib=None
    )
    assert with_peak(start, 7000).peak_mib == 6000
    crowd = start_sample(
        "x",
        "a",
        at=1.0,
        declared_mib=4000,
        before_mib=1000,
        after_mib=5000,
        settled_mib=None,
        others=("y",),
    )
    assert with_peak(crowd, 7000) == crowd
    stop = stop_sample("x", "a", at=5.0, declared_mib=4000, before_mib=9000, after_mib=3000)
    assert with_peak(stop, 20_000) == stop


def sample(
    at: float, mib: int, *, role: str = "a", ok: bool = True, method: Method = Method.DELTA
) -> Sample:
    return Sample("x", "start", role, at, 4000, method, ok, delta_mib=mib)


def test_summarise_takes_the_largest_attributable_figure_per_role_and_overall() -> None:
    samples = [
        sample(1.0, 9000, ok=False),  # proves nothing, but the ones after it count
        sample(2.0, 3000),
        sample(3.0, 4500),
        sample(4.0, 3500),
        sample(5.0, 2000, role="b"),
    ]
    f = summarise("x", 4000, samples)
    assert f.measured_mib == 4500
    assert f.by_role == {"a": 4500, "b": 2000}
    assert (f.samples, f.evidence) == (5, 4)
    assert f.last == samples[-1]
    assert f.exceeds and f.over_pct == 12.5


def test_the_first_of_equal_figures_names_the_method() -> None:
    f = summarise("x", None, [sample(1.0, 4000, method=Method.PROCESS), sample(2.0, 4000)])
    assert (f.measured_mib, f.method) == (4000, Method.PROCESS)
    assert not f.exceeds and f.over_pct is None


def test_a_figure_equal_to_the_declaration_does_not_exceed_it() -> None:
    f = summarise("x", 4000, [sample(1.0, 4000)])
    assert not f.exceeds and f.over_pct is None


def test_over_pct_is_rounded_to_one_decimal() -> None:
    f = summarise("x", 768, [sample(1.0, 1000)])
    assert f.over_pct == 30.2


def test_propose_refuses_impossible_parameters_each_alone() -> None:
    good = [sample(float(i), 1000) for i in range(3)]
    for bad in ({"margin_pct": -0.1}, {"granule_mib": 0}, {"min_samples": 0}):
        with pytest.raises(ValueError, match="margin_pct >= 0, granule_mib >= 1"):
            propose("x", 1024, good, **bad)  # type: ignore[arg-type]
    p = propose("x", 1000, good, margin_pct=0.0, granule_mib=1, min_samples=1)
    assert (p.proposed_mib, p.enough) == (1000, True)


def test_too_few_samples_propose_nothing_but_say_the_peak() -> None:
    p = propose("x", 4096, [sample(1.0, 3000), sample(2.0, 3900), sample(3.0, 9000, ok=False)])
    assert (p.peak_mib, p.proposed_mib, p.enough) == (3900, None, False)
    assert p.why == "not enough evidence: 2 attributable sample(s) of 3, at least 3 needed"


def test_the_proposal_shows_every_term_of_its_arithmetic() -> None:
    samples = [sample(1.0, 1000), sample(2.0, 3000), sample(3.0, 2000)]
    p = propose("x", None, samples, margin_pct=10.0, granule_mib=256)
    assert p.arithmetic == (
        "peak 3000 MiB (largest of 3 attributable samples) + 10 % = 3300.0 MiB, "
        "rounded up to a multiple of 256 MiB = 3328 MiB"
    )
    assert p.why == "no vram_mib declared"


def test_the_rounding_ignores_float_error_but_not_a_billionth_of_a_granule() -> None:
    exact = [sample(float(i), 327_690) for i in range(3)]
    assert propose("x", None, exact, margin_pct=10.0, granule_mib=1).proposed_mib == 360_459
    tiny = [sample(float(i), 1) for i in range(3)]
    assert propose("x", None, tiny, margin_pct=2e-7, granule_mib=1).proposed_mib == 2


def test_the_reason_compares_the_proposal_with_the_declaration() -> None:
    samples = [sample(float(i), 1000) for i in range(3)]
    why = {
        d: propose("x", d, samples, margin_pct=0.0, granule_mib=256).why for d in (1024, 768, 2048)
    }
    assert why == {
        1024: "the declared vram_mib is what the evidence supports",
        768: "256 MiB more than declared",
        2048: "1024 MiB less than declared",
    }


def test_the_defaults_give_the_documented_example() -> None:
    # docs/operations.md (calibrate): --margin-pct 10, --granule-mib 256, --min-samples 3
    samples = [sample(1.0, 4200), sample(2.0, 4000), sample(3.0, 3900)]
    p = propose("x", 4000, samples)
    assert (p.margin_pct, p.granule_mib, p.min_samples) == (10.0, 256, 3)
    line = (
        "peak 4200 MiB (largest of 3 attributable samples) + 10 % = 4620.0 MiB, "
        "rounded up to a multiple of 256 MiB = 4864 MiB"
    )
    assert p.arithmetic == line
    assert line in (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def test_a_start_without_a_reading_before_is_unknown() -> None:
    """No device reading before the start (NVML came up since): no delta can be taken,
    whatever the readings after say; the sample is unknown, never a figure."""
    s = start_sample(
        "x", "a", at=1.0, declared_mib=4000, before_mib=None, after_mib=5000, settled_mib=6000
    )
    assert (s.method, s.attributable, s.figure_mib) == (Method.UNKNOWN, False, None)


def test_a_start_with_only_a_settled_reading_is_measured_by_it() -> None:
    """A start whose reading after the health check is missing but whose reading after
    the settle time is known is measured by the device delta: its steady figure."""
    s = start_sample(
        "x", "a", at=1.0, declared_mib=4000, before_mib=1000, after_mib=None, settled_mib=5500
    )
    assert (s.method, s.attributable) == (Method.DELTA, True)
    assert (s.delta_mib, s.steady_mib, s.figure_mib) == (None, 4500, 4500)


def test_a_start_with_only_a_settled_process_figure_is_measured_by_the_driver() -> None:
    """The container's per-process figure after the settle time alone is enough for
    the ``process`` method: it wins over the device delta (attributable whatever else
    moved on the GPU)."""
    s = start_sample(
        "x",
        "a",
        at=1.0,
        declared_mib=4000,
        before_mib=1000,
        after_mib=9000,
        settled_mib=9000,
        others=("y",),
        process_settled_mib=4200,
    )
    assert (s.method, s.attributable) == (Method.PROCESS, True)
    assert (s.delta_mib, s.steady_mib, s.figure_mib) == (None, 4200, 4200)


def test_the_method_not_the_flag_decides_whether_a_peak_is_read() -> None:
    """A sample of the unknown method gains no peak from a device reading, even where
    its row says attributable (a journal row read back): only a delta sample's peak is
    the device's used total minus its reading before."""
    unknown = Sample("x", "start", "a", 1.0, 4000, Method.UNKNOWN, True, before_mib=1000)
    assert with_peak(unknown, 7000) == unknown
    delta = replace(unknown, method=Method.DELTA)
    assert with_peak(delta, 7000).peak_mib == 6000


def test_an_attributable_sample_without_a_figure_is_no_evidence() -> None:
    """A row read back as attributable but with every figure unknown proves nothing: it
    is counted as a sample, not as evidence, sets no measured figure and does not count
    toward a proposal."""
    blank = Sample.from_json(
        {"serve": "x", "kind": "start", "role": "a", "at": 9.0, "attributable": True}
    )
    assert blank.attributable and not blank.evidence
    f = summarise("x", 4000, [sample(1.0, 3000), blank])
    assert (f.measured_mib, f.samples, f.evidence) == (3000, 2, 1)
    p = propose("x", 4000, [sample(1.0, 3000), sample(2.0, 3100), blank])
    assert (p.evidence, p.proposed_mib) == (2, None)


def test_a_zero_declaration_is_exceeded_without_a_percentage() -> None:
    """Any figure exceeds a declared 0 MiB; no percentage over nothing is given."""
    f = summarise("x", 0, [sample(1.0, 500)])
    assert f.exceeds and f.over_pct is None


def test_the_reason_says_by_how_much_the_proposal_is_below_the_declaration() -> None:
    samples = [sample(float(i), 1000) for i in range(3)]
    p = propose("x", 1536, samples, margin_pct=0.0, granule_mib=256)
    assert (p.proposed_mib, p.why) == (1024, "512 MiB less than declared")
