"""The rule that tells a serve's ``up`` where it was put (statemachine/ledger/gpu_vars.py), pure.

Every variable of the table, an unknown one left out (never empty, never 0), two roles
joined by ",", the controller's values winning over ``up_env``, and the placeholders
substituted in each word or refused with the reason. The executor's side is in
tests/shell/test_gpu_vars.py.
"""

from __future__ import annotations

import pytest

from statemachine.domain.types import GpuObs, GpuRole
from statemachine.ledger.gpu_vars import (
    GPU_ENV_NAMES,
    GPU_VARIABLES,
    Unknown,
    UnknownPlaceholderError,
    free_at_start,
    gpu_placement,
    start_free_mib,
)
from statemachine.ledger.reservations import GpuReservation, Ledger

ROLES = {
    "card-a": GpuRole("card-a", 24_000, uuid="GPU-aaaa"),
    "card-b": GpuRole("card-b", 24_000, uuid="GPU-bbbb"),
    "bare": GpuRole("bare", 24_000),
}
SEEN = (GpuObs("GPU-bbbb", index=1), GpuObs("GPU-aaaa", index=0))
#: the variables of an engine that sizes itself from free memory: unknown without it
MEMORY = {"VRAMCTL_FREE_MIB", "VRAMCTL_FRACTION_OF_FREE", "VRAMCTL_FIT_TARGET_MIB"}


def test_the_table_names_each_variable_and_placeholder() -> None:
    assert [(v.env, v.placeholder) for v in GPU_VARIABLES] == [
        ("VRAMCTL_GPU_ROLE", "{gpu_role}"),
        ("VRAMCTL_GPU_UUID", "{gpu_uuid}"),
        ("VRAMCTL_GPU_INDEX", "{gpu_index}"),
        ("VRAMCTL_FREE_MIB", "{free_mib}"),
        ("VRAMCTL_FRACTION_OF_FREE", "{fraction_of_free}"),
        ("VRAMCTL_FIT_TARGET_MIB", "{fit_target_mib}"),
    ]
    assert {"VRAMCTL_GPU_ROLE", "VRAMCTL_GPU_UUID", "VRAMCTL_GPU_INDEX"} | MEMORY == GPU_ENV_NAMES


def test_one_role_known_everywhere_gives_every_variable() -> None:
    placed = gpu_placement(("card-b",), ROLES, SEEN)
    assert dict(placed.values) == {
        "VRAMCTL_GPU_ROLE": "card-b",
        "VRAMCTL_GPU_UUID": "GPU-bbbb",
        "VRAMCTL_GPU_INDEX": "1",
    }
    assert set(placed.unknown) == MEMORY  # no free memory given


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
    assert set(placed.unknown) == {"VRAMCTL_GPU_UUID", "VRAMCTL_GPU_INDEX"} | MEMORY


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


# ── what an engine that sizes itself from free memory is told ─────────────────────


def test_sglangs_fraction_is_the_reservation_over_what_it_will_find_free() -> None:
    """20000 MiB on a 24564 MiB card whose others hold 6000: SGLang finds 18564 free and
    takes --mem-fraction-static × that: 20000 ÷ 18564 is more than all of it, so the
    start is refused with why; at 12000 MiB, 12000 ÷ 18564 = 0.6464 (rounded down)."""
    roles = {"a": GpuRole("a", 24564)}
    free, how = start_free_mib(24564, 6000, None)
    assert (free, how) == (18564, "capacity 24564 − 6000 MiB the others hold = 18564")
    big = gpu_placement(("a",), roles, None, free={"a": free}, vram_mib=20000)
    assert "VRAMCTL_FRACTION_OF_FREE" not in big.values
    assert "has 18564 MiB free, less than vram_mib 20000" in big.unknown["VRAMCTL_FIT_TARGET_MIB"]
    fits = gpu_placement(("a",), roles, None, free={"a": free}, vram_mib=12000)
    assert fits.values["VRAMCTL_FRACTION_OF_FREE"] == "0.6464"
    assert 0.6464 * 18564 <= 12000 < 0.6465 * 18564
    assert fits.values["VRAMCTL_FIT_TARGET_MIB"] == "6564"
    assert fits.values["VRAMCTL_FREE_MIB"] == "18564"
    word = fits.substitute(["--mem-fraction-static={fraction_of_free}"])
    assert word == ("--mem-fraction-static=0.6464",)


def test_the_free_memory_is_the_larger_of_the_ledgers_and_nvmls() -> None:
    """The engine finds what is really free: where NVML measured more free than the
    ledger leaves (the others hold less than their reservations), that; never less
    than the ledger leaves, since the others keep within their reservations."""
    assert start_free_mib(24564, 6000, 20000)[0] == 20000
    assert start_free_mib(24564, 6000, 17000) == (
        18564,
        "capacity 24564 − 6000 MiB the others hold = 18564 (NVML measured 17000 free)",
    )


def test_several_roles_take_the_least_fraction_and_a_target_each() -> None:
    roles = {"a": GpuRole("a", 24564), "b": GpuRole("b", 24564)}
    placed = gpu_placement(("a", "b"), roles, None, free={"a": 24564, "b": 18564}, vram_mib=12000)
    assert placed.values["VRAMCTL_FRACTION_OF_FREE"] == "0.4885"  # 12000 ÷ 24564
    assert placed.values["VRAMCTL_FIT_TARGET_MIB"] == "12564,6564"
    unknown = gpu_placement(("a", "b"), roles, None, free={"a": Unknown("no")}, vram_mib=1)
    assert set(unknown.unknown) >= MEMORY


def test_a_reservation_that_is_all_the_free_memory_is_the_whole_of_it() -> None:
    roles = {"a": GpuRole("a", 24564)}
    placed = gpu_placement(("a",), roles, None, free={"a": 12000}, vram_mib=12000)
    assert placed.values["VRAMCTL_FRACTION_OF_FREE"] == "1.0000"
    assert placed.values["VRAMCTL_FIT_TARGET_MIB"] == "0"
    short = gpu_placement(("a",), roles, None, free={"a": 11999}, vram_mib=12000)
    assert "has 11999 MiB free, less than vram_mib 12000" in short.unknown["VRAMCTL_FIT_TARGET_MIB"]
    no_mib = gpu_placement(("a",), roles, None, free={"a": 11999}, vram_mib=None)
    assert no_mib.unknown["VRAMCTL_FRACTION_OF_FREE"] == "the serve has no vram_mib"


def test_nvml_reading_the_same_as_the_ledger_is_said_as_the_ledger() -> None:
    assert start_free_mib(24564, 6000, 18564) == (
        18564,
        "capacity 24564 − 6000 MiB the others hold = 18564 (NVML measured 18564 free)",
    )


def test_the_free_memory_at_a_start_leaves_the_serves_own_reservation_out() -> None:
    """The ledger holds the serve's own reservation once it is reserved: what the
    engine finds free is what the others leave, each role on its own, with NVML's
    reading of the role's device where it is more."""
    roles = {
        "a": GpuRole("a", 24564, uuid="GPU-aaaa"),
        "b": GpuRole("b", 24564, uuid="GPU-bbbb"),
    }
    ledger = Ledger(
        roles,
        [
            GpuReservation("llm", ("a", "b"), 8000),
            GpuReservation("other", ("a",), 6000),
            GpuReservation("third", ("b",), 2000),
        ],
    )
    seen = (GpuObs("GPU-aaaa", free_mib=20000), GpuObs("GPU-bbbb", free_mib=1000))
    got = free_at_start(("a", "b", "ghost"), "llm", ledger, roles, seen)
    assert got["a"] == 20000  # NVML measured more than the 18564 the ledger leaves
    assert got["b"] == 22564  # the ledger's: 24564 − 2000
    ghost = got["ghost"]
    assert isinstance(ghost, Unknown) and "no [[gpu_roles]] row" in ghost.why
    # a serve not yet in the ledger: every reservation there is another's
    assert free_at_start(("a",), "new", ledger, roles, None) == {"a": 24564 - 14000}
    # a role the serve is not on in the ledger: nothing of its own to leave out
    mine = Ledger(roles, [GpuReservation("llm", ("a",), 8000)])
    assert free_at_start(("b",), "llm", mine, roles, None) == {"b": 24564}


def test_an_undeclared_role_first_leaves_the_others_known() -> None:
    roles = {"a": GpuRole("a", 24564)}
    got = free_at_start(("ghost", "a"), "llm", Ledger(roles, []), roles, None)
    assert isinstance(got["ghost"], Unknown) and got["a"] == 24564
