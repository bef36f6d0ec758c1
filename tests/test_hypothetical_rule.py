"""``statemachine.hypothetical``'s refusals and its serve, pure (the fit answers on the
example manifest are tests/test_hypothetical.py)."""

from __future__ import annotations

import pytest

from statemachine.hypothetical import HYPOTHETICAL, HypotheticalError, with_hypothetical
from statemachine.types import DesiredState, GpuRole, Residency, ServeSpec

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
