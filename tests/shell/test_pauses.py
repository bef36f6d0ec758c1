"""The pauses between a wait's polls (controller.service.pauses): short first, capped."""

from __future__ import annotations

from itertools import islice, pairwise

from hypothesis import event, given
from hypothesis import strategies as st

from controller.service.pauses import FACTOR, FIRST_S, pauses


def test_starts_at_the_first_pause_and_grows_by_the_factor_to_the_cap() -> None:
    got = list(islice(pauses(0.05), 12))
    assert got[0] == FIRST_S
    assert got[1] == FIRST_S * FACTOR
    assert got[2] == FIRST_S * FACTOR * FACTOR
    assert got[-1] == 0.05
    assert got == sorted(got)


def test_a_cap_below_the_first_pause_is_kept_throughout() -> None:
    assert list(islice(pauses(0.001), 3)) == [0.001, 0.001, 0.001]


@given(
    cap=st.floats(min_value=0.001, max_value=5.0),
    first=st.floats(min_value=0.0005, max_value=1.0),
    factor=st.floats(min_value=1.01, max_value=4.0),
)
def test_never_over_the_cap_never_shrinking_and_reaching_it(
    cap: float, first: float, factor: float
) -> None:
    got = list(islice(pauses(cap, first_s=first, factor=factor), 2000))
    event("starts at the cap" if got[0] == cap else "grows to the cap")
    assert all(p <= cap for p in got)
    assert all(b >= a for a, b in pairwise(got))
    assert got[-1] == cap
