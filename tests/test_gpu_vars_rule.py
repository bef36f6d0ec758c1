"""The rule that tells a serve's ``up`` where it was put (statemachine/gpu_vars.py), pure.

Every variable of the table, an unknown one left out (never empty, never 0), two roles
joined by ",", the controller's values winning over ``up_env``, and the placeholders
substituted in each word or refused with the reason. The executor's side is in
tests/test_gpu_vars.py.
"""

from __future__ import annotations

import pytest

from statemachine.gpu_vars import (
    GPU_ENV_NAMES,
    GPU_VARIABLES,
    UnknownPlaceholderError,
    gpu_placement,
)
from statemachine.types import GpuObs, GpuRole

ROLES = {
    "card-a": GpuRole("card-a", 24_000, uuid="GPU-aaaa"),
    "card-b": GpuRole("card-b", 24_000, uuid="GPU-bbbb"),
    "bare": GpuRole("bare", 24_000),
}
SEEN = (GpuObs("GPU-bbbb", index=1), GpuObs("GPU-aaaa", index=0))


def test_the_table_names_each_variable_and_placeholder() -> None:
    assert [(v.env, v.placeholder) for v in GPU_VARIABLES] == [
        ("VRAMCTL_GPU_ROLE", "{gpu_role}"),
        ("VRAMCTL_GPU_UUID", "{gpu_uuid}"),
        ("VRAMCTL_GPU_INDEX", "{gpu_index}"),
    ]
    assert {"VRAMCTL_GPU_ROLE", "VRAMCTL_GPU_UUID", "VRAMCTL_GPU_INDEX"} == GPU_ENV_NAMES


def test_one_role_known_everywhere_gives_every_variable() -> None:
    placed = gpu_placement(("card-b",), ROLES, SEEN)
    assert dict(placed.values) == {
        "VRAMCTL_GPU_ROLE": "card-b",
        "VRAMCTL_GPU_UUID": "GPU-bbbb",
        "VRAMCTL_GPU_INDEX": "1",
    }
    assert not placed.unknown


def test_index_zero_is_a_value() -> None:
    assert gpu_placement(("card-a",), ROLES, SEEN).values["VRAMCTL_GPU_INDEX"] == "0"


def test_two_roles_are_joined_in_the_serves_order() -> None:
    placed = gpu_placement(("card-b", "card-a"), ROLES, SEEN)
    assert dict(placed.values) == {
        "VRAMCTL_GPU_ROLE": "card-b,card-a",
        "VRAMCTL_GPU_UUID": "GPU-bbbb,GPU-aaaa",
        "VRAMCTL_GPU_INDEX": "1,0",
    }


def test_a_role_without_uuid_leaves_uuid_and_index_out() -> None:
    placed = gpu_placement(("bare",), ROLES, SEEN)
    assert dict(placed.values) == {"VRAMCTL_GPU_ROLE": "bare"}
    assert "bare declares no uuid" in placed.unknown["VRAMCTL_GPU_UUID"]
    assert placed.unknown["VRAMCTL_GPU_INDEX"] == placed.unknown["VRAMCTL_GPU_UUID"]  # the same why


def test_one_role_unknown_of_two_leaves_the_variable_out() -> None:
    placed = gpu_placement(("card-a", "bare"), ROLES, SEEN)
    assert dict(placed.values) == {"VRAMCTL_GPU_ROLE": "card-a,bare"}
    assert set(placed.unknown) == {"VRAMCTL_GPU_UUID", "VRAMCTL_GPU_INDEX"}


@pytest.mark.parametrize(
    ("gpus", "why"),
    [
        (None, "NVML was not available at the last observation"),
        ((GpuObs("GPU-other", index=0),), "NVML did not see gpu role card-a's device GPU-aaaa"),
        ((GpuObs("GPU-aaaa"),), "NVML gave no index for gpu role card-a's device GPU-aaaa"),
    ],
)
def test_an_index_nvml_did_not_give_is_left_out(gpus: tuple[GpuObs, ...] | None, why: str) -> None:
    placed = gpu_placement(("card-a",), ROLES, gpus)
    assert dict(placed.values) == {"VRAMCTL_GPU_ROLE": "card-a", "VRAMCTL_GPU_UUID": "GPU-aaaa"}
    assert why in placed.unknown["VRAMCTL_GPU_INDEX"]


def test_an_undeclared_role_and_no_role_know_nothing_but_the_id() -> None:
    placed = gpu_placement(("ghost",), ROLES, SEEN)
    assert dict(placed.values) == {"VRAMCTL_GPU_ROLE": "ghost"}
    assert "no [[gpu_roles]] row" in placed.unknown["VRAMCTL_GPU_UUID"]
    none = gpu_placement((), ROLES, SEEN)
    assert not none.values
    assert set(none.unknown) == GPU_ENV_NAMES


def test_the_controllers_values_win_over_up_env_and_unknown_ones_are_absent() -> None:
    placed = gpu_placement(("bare",), ROLES, SEEN)
    up_env = {"VRAMCTL_GPU_ROLE": "card-a", "VRAMCTL_GPU_UUID": "GPU-aaaa", "OTHER": "x"}
    env = placed.environment(up_env)
    assert env == {"VRAMCTL_GPU_ROLE": "bare", "OTHER": "x"}
    assert placed.environment(None) == {"VRAMCTL_GPU_ROLE": "bare"}
    assert not any(v == "" for v in env.values())


def test_placeholders_are_substituted_in_each_word() -> None:
    placed = gpu_placement(("card-b",), ROLES, SEEN)
    argv = ("./up.sh", "--gpus=device={gpu_uuid}", "{gpu_role}:{gpu_index}", "{dir}", "{x}")
    assert placed.substitute(argv) == (
        "./up.sh",
        "--gpus=device=GPU-bbbb",
        "card-b:1",
        "{dir}",
        "{x}",
    )


def test_an_unknown_placeholder_refuses_with_its_reason() -> None:
    """The refusal names the first unknown placeholder and says why it is unknown, in
    its message and apart (``placeholder``, ``why``)."""
    placed = gpu_placement(("bare",), ROLES, SEEN)
    assert placed.substitute(("up", "{gpu_role}")) == ("up", "bare")
    with pytest.raises(UnknownPlaceholderError) as caught:
        placed.substitute(("up", "{gpu_role}", "--device={gpu_uuid}"))
    assert caught.value.placeholder == "{gpu_uuid}"
    assert caught.value.why.startswith("gpu role bare declares no uuid")
    assert "`up` names {gpu_uuid}, which is unknown for this start" in str(caught.value)
    assert "gpu role bare declares no uuid" in str(caught.value)
