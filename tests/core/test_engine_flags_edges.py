"""Edges of engine enforcement (statemachine.flags.fraction, docs/design.md §3).

The boundaries an operator meets: a reservation of the whole device, a budget exactly
at the tolerance, one decimal place, a tolerance of 0 where a fraction of a MiB
decides "more" or "less"; the exact fraction of a rendered flag in its JSON; the
worst of several disagreeing roles; and which words of a command line or an image
reference name its engine. Pure: imports statemachine only.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction

import pytest

from statemachine import engines
from statemachine.domain.types import GpuRole
from statemachine.flags.fraction import (
    SGLANG_FLAG,
    SOURCE_NVML,
    VLLM_FLAG,
    DeviceTotal,
    FindingKind,
    RenderResult,
    check_fraction,
    engine_of_argv,
    engine_of_image,
    exact_fraction,
    flag_from_variable,
    flag_values,
    fraction_for,
    render_flag,
    role_totals,
)

TOTAL = 97887  # one RTX PRO 6000 Max-Q, as the real manifest declares it
SMALL = 32607
TOTALS = role_totals(
    {
        "a": GpuRole("a", capacity_mib=TOTAL),
        "b": GpuRole("b", capacity_mib=TOTAL),
        "small": GpuRole("small", capacity_mib=SMALL),
    }
)
ROUND = {"x": DeviceTotal("x", 100_000)}  # a round device: the tolerance is 100 MiB


# ── arithmetic ─────────────────────────────────────────────────────────────────


def test_one_decimal_place_is_enough_and_zero_is_refused() -> None:
    assert fraction_for(48000, 96000, places=1) == Decimal("0.5")
    assert fraction_for(TOTAL, TOTAL, places=1) == Decimal("1.0")
    # 0 places could only write 0 or 1: refused before any arithmetic, even for the
    # whole device, whose fraction 1 it could write
    for vram in (TOTAL, 3200):
        with pytest.raises(ValueError, match="places must be at least 1, got 0"):
            fraction_for(vram, TOTAL, places=0)


def test_a_reservation_too_small_for_the_places_renders_no_flag() -> None:
    # 9 MiB of 97887 MiB is 0.000091…: 4 places cannot hold the engine to it
    result = render_flag("tiny", "vllm", 9, ("a",), TOTALS)
    assert result.fraction is None
    assert result.problem_kind is FindingKind.NO_DEVICE_TOTAL
    assert result.problem == (
        "9 MiB of 97887 MiB is 0 at 4 decimal places; "
        "the engine cannot be held to so small a reservation"
    )
    finding = check_fraction(result, None)
    assert finding is not None
    assert finding.message == f"cannot check {VLLM_FLAG}: {result.problem}"


def test_a_one_mib_device_is_a_device() -> None:
    assert exact_fraction(1, 1) == Fraction(1)
    assert fraction_for(1, 1) == Decimal("1.0000")


# ── render ─────────────────────────────────────────────────────────────────────


def test_a_reservation_of_the_whole_device_renders_one() -> None:
    result = render_flag("whole", "vllm", TOTAL, ("a",), TOTALS)
    assert result.problem is None
    assert result.text == "--gpu-memory-utilization 1.0000"
    assert result.exact == Fraction(1)
    assert result.explanation == (
        "97887 MiB / 97887 MiB (declared capacity of role a) = 1.0000 exactly (97887 MiB)"
    )


def test_render_json_carries_the_exact_fraction() -> None:
    result = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    assert result.exact == Fraction(3200, TOTAL)
    data = result.to_json()
    assert data["exact_fraction"] == 3200 / TOTAL
    assert data["rounding"] == "down to 4 places"


def test_tensor_parallel_exact_is_the_smallest_per_gpu_fraction() -> None:
    result = render_flag("tp2", "vllm", 16000, ("a", "small"), TOTALS)
    # 16000/97887 = 0.1634… on role a, 16000/32607 = 0.4906… on role small
    assert result.exact == Fraction(16000, TOTAL)
    assert result.to_json()["exact_fraction"] == 16000 / TOTAL


@pytest.mark.parametrize(
    ("engine", "vram_mib", "roles"),
    [
        ("vllm", 40000, ("small",)),  # exceeds the device: a total, no fraction
        ("vllm", 3200, ()),  # no role: no total
        ("vllm", None, ("a",)),  # no reservation
        ("audio", 3200, ("a",)),  # no flag for the engine
    ],
)
def test_no_exact_fraction_without_a_rendered_value(
    engine: str, vram_mib: int | None, roles: tuple[str, ...]
) -> None:
    result = render_flag("s", engine, vram_mib, roles, TOTALS)
    assert result.fraction is None
    assert result.exact is None
    assert result.to_json()["exact_fraction"] is None


def test_tensor_parallel_on_equal_devices_names_no_smallest_role() -> None:
    result = render_flag("tp2", "vllm", 94721, ("a", "b"), TOTALS)
    assert result.explanation == (
        "94721 MiB on each of 2 GPUs (tensor parallel; the fraction applies per GPU) / "
        "97887 MiB (declared capacity of roles a, b) = 0.967657… → 0.9676, rounded down "
        "to 4 places so the engine's 94715.5 MiB stays within the 94721 MiB reservation"
    )


# ── check_fraction ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize("found", ["0.501", "0.499"])
def test_a_budget_exactly_at_the_tolerance_passes(found: str) -> None:
    render = render_flag("s", "vllm", 50000, ("x",), ROUND)
    # 0.501 × 100000 = 50100 MiB, 100 MiB over; 0.001 of the device is 100 MiB
    assert check_fraction(render, found) is None
    beyond = check_fraction(render, "0.5011")
    assert beyond is not None
    assert beyond.facts["delta_mib"] == 110.0
    assert beyond.facts["tolerance_mib"] == 100.0


@pytest.mark.parametrize(
    ("found", "words", "found_mib", "delta_mib"),
    [
        ("0.0327", "0.9 MiB more than", 3200.9, 0.9),  # +0.905 MiB
        ("0.03269", "0.1 MiB less than", 3199.9, -0.1),  # -0.067 MiB
        ("0.02", "1242.3 MiB less than", 1957.7, -1242.3),
    ],
)
def test_with_no_tolerance_a_fraction_of_a_mib_says_more_or_less(
    found: str, words: str, found_mib: float, delta_mib: float
) -> None:
    render = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    finding = check_fraction(render, found, tolerance=0)
    assert finding is not None
    assert finding.kind is FindingKind.DISAGREES
    assert f"{words} its 3200 MiB reservation (3200/97887 = 0.032691…)" in finding.message
    assert "beyond the tolerance of ±0 MiB" in finding.message
    assert finding.facts["found_mib"] == found_mib
    assert finding.facts["delta_mib"] == delta_mib
    assert finding.facts["tolerance_mib"] == 0.0


@pytest.mark.parametrize("roles", [("small", "a"), ("a", "small")])
def test_the_worst_disagreeing_role_is_reported(roles: tuple[str, ...]) -> None:
    render = render_flag("tp2", "vllm", 16000, roles, TOTALS)
    # 0.9 gives 88098.3 MiB on role a (+72098.3) and 29346.3 MiB on role small
    # (+13346.3): both beyond the tolerance, role a the worse, in either order
    finding = check_fraction(render, "0.9")
    assert finding is not None
    assert finding.facts["role"] == "a"
    assert finding.facts["delta_mib"] == 72098.3
    assert finding.facts["total_mib"] == TOTAL
    assert "72098.3 MiB more than its 16000 MiB reservation (16000/97887 = 0.163454…)" in (
        finding.message
    )


def test_equally_wrong_roles_report_the_first() -> None:
    render = render_flag("tp2", "vllm", 94721, ("b", "a"), TOTALS)
    finding = check_fraction(render, "0.5")
    assert finding is not None
    assert finding.facts["role"] == "b"
    assert finding.facts["delta_mib"] == -45777.5
    assert "48943.5 MiB of 97887 MiB (declared capacity of role b)" in finding.message


def test_missing_flag_names_vllms_default_and_the_smallest_fraction_device() -> None:
    render = render_flag("tp2", "vllm", 16000, ("small", "a"), TOTALS)
    finding = check_fraction(render, None)
    assert finding is not None
    assert finding.kind is FindingKind.MISSING_FLAG
    assert finding.message == (
        "runs vLLM without --gpu-memory-utilization: the engine sizes itself by its own "
        "default fraction of the device (vLLM's default is 0.9 or more), not by the "
        f"16000 MiB reservation; add --gpu-memory-utilization 0.1634 ({render.explanation})"
    )
    assert finding.facts == {
        "flag": VLLM_FLAG,
        "found": None,
        "expected": "0.1634",
        "vram_mib": 16000,
        "total_mib": TOTAL,  # role a's: the smallest per-GPU fraction
    }


def test_missing_flag_on_sglang_claims_no_vllm_default() -> None:
    render = render_flag("fast", "sglang", 3200, ("a",), TOTALS)
    finding = check_fraction(render, None)
    assert finding is not None
    assert finding.message.startswith(
        "runs SGLang without --mem-fraction-static: the engine sizes itself by its own "
        "default fraction of the device, not by the 3200 MiB reservation; add "
        f"{SGLANG_FLAG} ${{VRAMCTL_FRACTION_OF_FREE}} ("
    )


@pytest.mark.parametrize("vram_mib", [3200, None])
def test_no_engine_flag_is_said_as_rendered(vram_mib: int | None) -> None:
    render = render_flag("stt", "audio", vram_mib, ("a",), TOTALS)
    finding = check_fraction(render, None)
    assert finding is not None
    assert finding.kind is FindingKind.NO_ENGINE_FLAG
    assert finding.message == render.problem
    assert finding.message.startswith("engine 'audio' has no memory-fraction flag")


def test_no_reservation_and_no_flag_is_said_as_rendered() -> None:
    render = render_flag("x", "vllm", None, ("a",), TOTALS)
    finding = check_fraction(render, None)
    assert finding is not None
    assert finding.kind is FindingKind.NO_RESERVATION
    assert finding.message == "no reservation (vram_mib): there is nothing for the flag to enforce"
    assert finding.facts == {"flag": VLLM_FLAG, "found": None, "expected": None}


def test_a_render_built_without_an_engine_names_it_unknown() -> None:
    # RenderResult is public: a caller may render for a flag whose engine it does not know
    total = DeviceTotal("a", TOTAL)
    render = RenderResult("s", None, VLLM_FLAG, 3200, (total,), Decimal("0.0326"), "3200/97887")
    finding = check_fraction(render, None)
    assert finding is not None
    assert finding.kind is FindingKind.MISSING_FLAG
    assert finding.message.startswith(
        "runs an unknown engine without --gpu-memory-utilization: the engine sizes itself "
        "by its own default fraction of the device, not by the 3200 MiB reservation"
    )


# ── engines and flags ──────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        # words after the first option are its values, not the program
        (["python3", "bench.py", "--served-model-name", "llama-server"], None),
        (["python3", "proxy.py", "--upstream", "vllm.entrypoints.openai.api_server"], None),
        # `serve` after another program is not SGLang's
        (["ollama", "serve"], None),
        (["lmdeploy", "serve", "api_server", "m"], None),
        (["sglang", "--model-path", "m"], None),
    ],
)
def test_engine_of_argv_reads_the_program_words_only(argv: list[str], engine: str | None) -> None:
    assert engine_of_argv(argv) == engine


def test_the_word_after_a_flag_is_its_value_even_when_it_is_the_flag() -> None:
    # `--gpu-memory-utilization --gpu-memory-utilization=0.5` gives the first flag the
    # second word as its value (the engine refuses such a line): not a readable 0.5
    argv = ["serve", VLLM_FLAG, f"{VLLM_FLAG}=0.5"]
    assert flag_values(argv, VLLM_FLAG) == [f"{VLLM_FLAG}=0.5"]


def test_engine_of_image_reads_no_digest() -> None:
    # the text after `@` is a digest, however it is spelled: only the repository counts
    assert engine_of_image("example/tts@vllm:0123abcd") is None
    assert engine_of_image("example/sglang@sha256:0123abcd") == "sglang"


# ── what a caller's own result and inputs get ─────────────────────────────────────


def test_an_exact_fraction_is_refused_outside_a_positive_reservation_within_the_device() -> None:
    """``exact_fraction`` answers only for 0 < vram_mib ≤ total_mib, as ``fraction_for``."""
    assert exact_fraction(TOTAL, TOTAL) == 1
    for vram_mib, total_mib in ((TOTAL + 1, TOTAL), (0, TOTAL), (3200, 0), (-1, TOTAL)):
        with pytest.raises(ValueError, match=r"reservation|device total"):
            exact_fraction(vram_mib, total_mib)


def test_a_measured_total_of_a_role_without_a_capacity_row_is_kept() -> None:
    """A role NVML measured but the manifest has no capacity row for still has a total,
    with the measured source; a role with both has the measured one."""
    totals = role_totals({"a": GpuRole("a", capacity_mib=TOTAL)}, {"a": 97000, "z": 48000})
    assert totals == {
        "a": DeviceTotal("a", 97000, SOURCE_NVML),
        "z": DeviceTotal("z", 48000, SOURCE_NVML),
    }


def test_the_tolerance_said_is_that_of_the_worst_role_not_the_last() -> None:
    """A disagreement names the worst role and its own tolerance (0.001 of that device),
    wherever that role stands in the serve's list."""
    render = render_flag("tp2", "vllm", 16000, ("a", "small"), TOTALS)
    finding = check_fraction(render, "0.9")
    assert finding is not None and finding.facts["role"] == "a"
    assert finding.facts["tolerance_mib"] == 97.9  # 0.001 × 97887, not × 32607
    assert "beyond the tolerance of ±97.9 MiB (0.001 of the device)" in finding.message


def test_a_render_of_an_engine_without_a_fraction_flag_claims_no_default() -> None:
    """A caller's result for an engine that has no memory-fraction flag (llama.cpp) under
    a flag it names is a missing flag with no engine default claimed."""
    total = DeviceTotal("a", TOTAL)
    render = RenderResult("s", "llamacpp", VLLM_FLAG, 3200, (total,), Decimal("0.0326"), "e")
    finding = check_fraction(render, None)
    assert finding is not None and finding.kind is FindingKind.MISSING_FLAG
    assert "default is" not in finding.message
    assert finding.message.startswith("runs llama.cpp without --gpu-memory-utilization: ")


def test_a_result_without_a_fraction_and_without_a_problem_kind_lacks_a_device_total() -> None:
    """A caller's result with a flag and a reservation but no fraction and no problem
    kind is checked as a missing device total: a note, not an error."""
    render = RenderResult("s", "vllm", VLLM_FLAG, 3200, (), None, "", problem="no total")
    finding = check_fraction(render, "0.0326")
    assert finding is not None and finding.kind is FindingKind.NO_DEVICE_TOTAL
    assert not finding.is_error
    assert finding.message == "cannot check --gpu-memory-utilization: no total"


def test_a_result_renders_no_words_without_a_flag_and_no_exact_fraction_without_its_terms() -> None:
    """A caller's result renders argv only with both a flag and a value, and an exact
    fraction only with a reservation, a device total and a fraction."""
    total = DeviceTotal("a", TOTAL)
    fraction = Decimal("0.0326")
    no_flag = RenderResult("s", "audio", None, 3200, (total,), fraction, "e")
    assert (no_flag.argv, no_flag.text) == ((), None)
    no_vram = RenderResult("s", "vllm", VLLM_FLAG, None, (total,), fraction, "e")
    no_total = RenderResult("s", "vllm", VLLM_FLAG, 3200, (), fraction, "e")
    assert (no_vram.exact, no_total.exact) == (None, None)
    assert no_vram.to_json()["exact_fraction"] is None
    assert no_total.to_json()["exact_fraction"] is None
    whole = RenderResult("s", "vllm", VLLM_FLAG, 3200, (total,), fraction, "e")
    assert whole.exact == Fraction(3200, TOTAL)


@pytest.fixture
def no_fraction_engine() -> Iterator[None]:
    """The registry with only the engines that have no memory-fraction flag, restored
    in its order afterwards."""
    saved = engines.engines()
    for engine in saved:
        engines.unregister(engine.name)
    try:
        for engine in saved:
            if engine.memory_flag is None:
                engines.register(engine)
        yield
    finally:
        for engine in engines.engines():
            engines.unregister(engine.name)
        for engine in saved:
            engines.register(engine)


@pytest.mark.usefixtures("no_fraction_engine")
def test_without_a_fraction_engine_no_command_sets_a_fraction_from_a_variable() -> None:
    """A variable on a command line is a fraction flag's value only after such a flag:
    with no engine that has one registered, none is."""
    assert not flag_from_variable("serve m --gpu-memory-utilization $UTIL")
    assert not flag_from_variable("serve m --port ${PORT:-8000}")
