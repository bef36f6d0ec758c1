"""``statemachine.answers.hypothetical``'s refusals and its serve, pure (the fit answers on the
example manifest are tests/shell/test_hypothetical.py)."""

from __future__ import annotations

import pytest

from statemachine.answers.hypothetical import HYPOTHETICAL, HypotheticalError, with_hypothetical
from statemachine.domain.types import DesiredState, GpuRole, Residency, ServeSpec

ROLES = {"b": GpuRole("b", 8000), "a": GpuRole("a", 8000)}
DESIRED = DesiredState(ROLES, {"x": ServeSpec("x", "c-x", ("a",), 1000)})


def test_the_serve_added_is_on_demand_on_the_one_role_asked() -> None:
    added = with_hypothetical(DESIRED, 1, "b")
    assert added.serves[HYPOTHETICAL] == ServeSpec(
        HYPOTHETICAL, HYPOTHETICAL, ("b",), 1, residency=Residency.ON_DEMAND
    )
    assert added.serves["x"] == DESIRED.serves["x"] and added.roles == ROLES


@pytest.mark.parametrize(
    ("desired", "mib", "role", "message"),
    [
        (DESIRED, 10, "c", 'no gpu role "c" in the manifest set (roles: a, b)'),
        (DesiredState({}, {}), 10, "c", 'no gpu role "c" in the manifest set (roles: none)'),
        (DESIRED, 0, "a", "vram_mib must be a positive number of MiB, not 0"),
        (DESIRED, -1, "a", "vram_mib must be a positive number of MiB, not -1"),
        (DESIRED, True, "a", "vram_mib must be a positive number of MiB, not True"),
        (DESIRED, 1.5, "a", "vram_mib must be a positive number of MiB, not 1.5"),
    ],
)
def test_a_question_that_cannot_be_asked_says_why(
    desired: DesiredState, mib: int, role: str, message: str
) -> None:
    with pytest.raises(HypotheticalError) as caught:
        with_hypothetical(desired, mib, role)
    assert str(caught.value) == message


def test_a_name_the_set_declares_is_refused() -> None:
    with pytest.raises(HypotheticalError, match='already declares a serve "x"'):
        with_hypothetical(DESIRED, 10, "a", name="x")
    assert "y" in with_hypothetical(DESIRED, 10, "a", name="y").serves


PLACED = DesiredState(
    {"a": GpuRole("a", 8000, 1000), "b": GpuRole("b", 6000), "c": GpuRole("c", 9000)}, {}
)


def test_a_placed_one_is_what_the_manifest_gives_a_serve_with_placement() -> None:
    added = with_hypothetical(PLACED, 6000, placement=["c", "a"])
    assert added.serves[HYPOTHETICAL] == ServeSpec(
        HYPOTHETICAL,
        HYPOTHETICAL,
        ("c", "a"),
        6000,
        residency=Residency.ON_DEMAND,
        placement=("c", "a"),
    )
    assert not added.serves[HYPOTHETICAL].placed  # every candidate until one is chosen
    # a budget exactly the size is enough
    assert with_hypothetical(PLACED, 7000, placement=["a"]).serves[HYPOTHETICAL].placed
    assert with_hypothetical(PLACED, 1, "b").serves[HYPOTHETICAL].placement == ()


@pytest.mark.parametrize(
    ("mib", "role", "placement", "message"),
    [
        (10, None, None, "ask with exactly one of gpu_role or placement, not neither"),
        (10, "a", ["a"], "ask with exactly one of gpu_role or placement, not both"),
        (10, None, [], "placement must name at least one candidate role"),
        (10, None, ["a", "b", "a"], 'placement names "a" more than once'),
        (10, None, ["a", "d"], 'no gpu role "d" in the manifest set (roles: a, b, c)'),
        (0, None, ["a"], "vram_mib must be a positive number of MiB, not 0"),
        (
            7001,
            None,
            ["c", "a"],
            'placement candidate "a" has a budget of 7000 MiB (capacity 8000 - reserve '
            "1000), less than vram_mib 7001: it can never hold this serve",
        ),
        (
            6001,
            None,
            ["b"],
            'placement candidate "b" has a budget of 6000 MiB (capacity 6000 - reserve '
            "0), less than vram_mib 6001: it can never hold this serve",
        ),
    ],
)
def test_a_placed_question_that_cannot_be_asked_says_why(
    mib: int, role: str | None, placement: list[str] | None, message: str
) -> None:
    with pytest.raises(HypotheticalError) as caught:
        with_hypothetical(PLACED, mib, role, placement=placement)
    assert str(caught.value) == message
