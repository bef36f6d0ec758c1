"""The pure comparison of a reservation, its model's estimate and the measured footprint
(``statemachine.sizing.model_fit``; docs/sizing.md, "A serve's model")."""

from __future__ import annotations

import pytest

from statemachine.sizing.model_fit import (
    BOUND_FIXED_MIB,
    BOUND_PCT,
    ModelTerms,
    calibrate_verdict,
    check_reservation,
    excess_bound_mib,
    to_mib,
)

MIB = 1024 * 1024
GIB = 1024 * MIB
FORMULA = "2 × 32 layers × 8 KV heads × 128 head_dim × 8192 tokens × 2 bytes (f16) = 1 GiB"
#: Llama-3.1-8B-like: 15 GiB of weights, 1 GiB of KV at 8192 tokens -> 16384 MiB known
LLAMA = ModelTerms(15 * GIB, GIB, formula=FORMULA)


def test_mib_are_rounded_up_and_split_between_roles() -> None:
    assert to_mib(1) == 1 and to_mib(MIB) == 1 and to_mib(MIB + 1) == 2
    assert to_mib(3 * MIB, 2) == 2  # 1.5 MiB per role, rounded up
    assert to_mib(0) == 0
    with pytest.raises(ValueError, match="parts"):
        to_mib(MIB, 0)


def test_the_bound_is_a_quarter_of_the_known_terms_plus_two_gib() -> None:
    assert (BOUND_PCT, BOUND_FIXED_MIB) == (25, 2048)
    assert excess_bound_mib(16384) == 4096 + 2048
    assert excess_bound_mib(1) == 1 + 2048  # a quarter MiB is rounded up
    assert excess_bound_mib(0) == 2048


def test_a_reservation_below_weights_plus_kv_cannot_load_with_every_term() -> None:
    check = check_reservation(16000, LLAMA)
    assert check.error and not check.hint and check.verdict == "cannot_load"
    assert check.shortfall_mib == 384
    for words in (
        "cannot load in its reservation",
        "vram_mib 16000",
        "weights 15360 MiB",
        "KV cache 1024 MiB",
        FORMULA,
        "= 16384 MiB",
        "short by 384 MiB",
        "overheads (unknown)",
    ):
        assert words in check.message, (words, check.message)
    data = check.to_json()
    assert (data["weights_mib"], data["kv_cache_mib"], data["known_mib"]) == (15360, 1024, 16384)
    assert (data["weights_bytes"], data["kv_cache_bytes"]) == (15 * GIB, GIB)
    assert data["rest"] == "unknown" and data["shortfall_mib"] == 384


def test_a_reservation_of_exactly_the_known_terms_loads() -> None:
    check = check_reservation(16384, LLAMA)
    assert check.verdict == "ok" and check.excess_mib == 0 and check.bound_mib == 6144


def test_a_reservation_at_the_bound_is_no_hint_and_one_mib_above_is() -> None:
    at = check_reservation(16384 + 6144, LLAMA)
    assert at.verdict == "ok" and not at.hint and at.excess_mib == 6144
    assert "at most 6144 MiB" in at.message
    above = check_reservation(16384 + 6145, LLAMA)
    assert above.hint and not above.error and above.excess_mib == 6145
    assert "25 % + 2048 MiB = 6144 MiB" in above.message
    assert "by 6145 MiB" in above.message


def test_the_known_terms_are_the_sum_of_the_figures_printed() -> None:
    tiny = ModelTerms(6976, 32768, formula="…")
    assert (tiny.weights_mib, tiny.kv_mib, tiny.known_mib) == (1, 1, 2)
    assert "weights 1 MiB + KV cache 1 MiB (…) = 2 MiB" in check_reservation(2, tiny).message
    # 6976 + 32768 bytes fit in 1 MiB: compared in bytes, not in the figures rounded apart
    fits = check_reservation(1, tiny)
    assert (fits.verdict, fits.shortfall_mib, fits.excess_mib) == ("ok", None, 0)
    assert "in bytes, 6976 + 32768 = 39744 ≤ 1048576" in fits.message
    two = check_reservation(1, ModelTerms(6976, 32768, roles=2, formula="…"))
    assert "in bytes, 6976 + 32768 = 39744 ≤ 2097152" in two.message  # 1 MiB on each of 2
    over = check_reservation(1, ModelTerms(MIB, 1, formula="…"))
    assert (over.verdict, over.shortfall_mib) == ("cannot_load", 1)  # one byte over: 1 MiB


def test_two_gpu_roles_each_hold_half_the_model() -> None:
    split = ModelTerms(15 * GIB, GIB, roles=2, formula=FORMULA)
    assert (split.weights_mib, split.kv_mib, split.known_mib) == (7680, 512, 8192)
    check = check_reservation(8000, split)
    assert check.error and check.shortfall_mib == 192
    assert "per GPU role (the model split between 2)" in check.message
    assert check_reservation(8192, split).verdict == "ok"


def test_an_unknown_kv_cache_compares_the_weights_alone() -> None:
    terms = ModelTerms(15 * GIB, None, kv_reason="MLA: the latent's layout depends on the engine")
    assert terms.known_mib is None and terms.kv_mib is None
    short = check_reservation(15000, terms)
    assert short.error and short.shortfall_mib == 360
    assert "KV cache unknown (MLA" in short.message
    fine = check_reservation(20000, terms)
    assert fine.verdict == "unknown" and not fine.error and not fine.hint
    assert fine.to_json()["known_mib"] is None  # unknown, never 0


@pytest.mark.parametrize(
    ("vram", "measured", "verdict", "words"),
    [
        (16000, 17000, "cannot_load", "short by 384 MiB"),
        (20000, None, "unknown", "no measured footprint"),
        (20000, 9000, "engine_offloads", "measured 9000 MiB < weights 15360 MiB"),
        (20000, 15800, "kv_smaller", "the estimate's context is too large"),
        (20000, 21000, "overheads_larger", "4616 MiB above weights + KV"),
        (20000, 18000, "consistent", "overheads 1616 MiB"),
        (20000, 20000, "consistent", "≤ vram_mib 20000 MiB"),
        (None, 25000, "consistent", "overheads 8616 MiB"),
    ],
)
def test_calibrate_names_the_term_that_is_off(
    vram: int | None, measured: int | None, verdict: str, words: str
) -> None:
    cal = calibrate_verdict(vram, LLAMA, measured)
    assert cal.verdict == verdict
    assert words in cal.reason, cal.reason
    data = cal.to_json()
    assert data["known_mib"] == 16384 and data["measured_mib"] == measured
    expected = None if measured is None else measured - 16384
    assert data["overheads_mib"] == expected


def test_calibrate_without_an_estimate_or_a_kv_cache_says_so() -> None:
    none = calibrate_verdict(20000, None, 18000)
    assert none.verdict == "unknown" and "cannot be read" in none.reason
    assert none.to_json()["overheads_mib"] is None
    terms = ModelTerms(15 * GIB, None, kv_reason="recurrent layers")
    cal = calibrate_verdict(20000, terms, 16000)
    assert cal.verdict == "consistent" and "KV cache unknown" in cal.reason
    assert cal.to_json()["overheads_mib"] is None
    over = calibrate_verdict(15500, terms, 16000)
    assert over.verdict == "overheads_larger" and "above weights" not in over.reason


def test_one_gpu_role_adds_no_per_role_wording() -> None:
    assert LLAMA.per_role() == ""
    assert check_reservation(16384, LLAMA).message == (
        f"vram_mib 16384 ≥ weights 15360 MiB + KV cache 1024 MiB ({FORMULA}) = 16384 MiB: "
        "0 MiB left for the overheads (unknown; at most 6144 MiB before a hint)"
    )


@pytest.mark.parametrize(
    ("vram", "verdict", "shortfall", "message"),
    [
        (
            15359,
            "cannot_load",
            1,
            "cannot load in its reservation: vram_mib 15359 < weights 15360 MiB, short by "
            "1 MiB before the KV cache unknown (recurrent layers)",
        ),
        (
            15360,
            "unknown",
            None,
            "vram_mib 15360 ≥ weights 15360 MiB; KV cache unknown (recurrent layers): "
            "whether it fits is not known",
        ),
    ],
)
def test_a_reservation_of_exactly_the_weights_may_fit_while_the_kv_is_unknown(
    vram: int, verdict: str, shortfall: int | None, message: str
) -> None:
    check = check_reservation(vram, ModelTerms(15 * GIB, None, kv_reason="recurrent layers"))
    assert (check.verdict, check.shortfall_mib, check.message) == (verdict, shortfall, message)


@pytest.mark.parametrize(
    ("measured", "verdict", "reason"),
    [
        (
            15359,
            "engine_offloads",
            "measured 15359 MiB < weights 15360 MiB: the engine keeps part of the weights off "
            "the GPU (offload, quantization at load), or loads other files",
        ),
        (
            15360,
            "kv_smaller",
            "weights 15360 MiB ≤ measured 15360 MiB < weights + KV 16384 MiB: the engine "
            "caches fewer tokens than the estimate's context × parallel (the estimate's "
            "context is too large)",
        ),
        (
            16383,
            "kv_smaller",
            "weights 15360 MiB ≤ measured 16383 MiB < weights + KV 16384 MiB: the engine "
            "caches fewer tokens than the estimate's context × parallel (the estimate's "
            "context is too large)",
        ),
        (
            16384,
            "consistent",
            "weights + KV 16384 MiB ≤ measured 16384 MiB ≤ vram_mib 20000 MiB: overheads 0 MiB",
        ),
    ],
)
def test_calibrate_at_the_weights_and_at_weights_plus_kv(
    measured: int, verdict: str, reason: str
) -> None:
    cal = calibrate_verdict(20000, LLAMA, measured)
    assert (cal.verdict, cal.reason) == (verdict, reason)


def test_a_kv_cache_without_formula_or_reason_says_so_in_words() -> None:
    """The KV sentence never prints a missing figure as ``None``: a known cache without
    its formula says "no formula", an unknown one without its reason "no reason given"."""
    assert ModelTerms(15 * GIB, GIB).kv_text() == "KV cache 1024 MiB (no formula)"
    assert ModelTerms(15 * GIB, None).kv_text() == "KV cache unknown (no reason given)"
    assert LLAMA.kv_text() == f"KV cache 1024 MiB ({FORMULA})"
