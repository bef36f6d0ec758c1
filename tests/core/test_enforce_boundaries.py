"""The limit flags at their boundaries (statemachine/flags/model_limits.py): a figure that fits
exactly fits, one byte more does not; suffixed values read exactly as the engines read
them; the last of repeated flags wins. Pure: statemachine only."""

from __future__ import annotations

import pytest
from test_enforce_arithmetic import GIB, arch, llama, model, one

from statemachine import engines
from statemachine.engines.spec import LimitFlag, LimitKind
from statemachine.flags.fraction import FindingKind
from statemachine.flags.model_limits import (
    ModelInput,
    check_cache_types,
    check_elastic,
    check_limit,
    found_value,
    largest_context,
    render_elastic,
    render_limits,
)
from statemachine.sizing.needs import MIB, Architecture, Weights


def test_weights_exactly_the_reservation_leave_no_token_rather_than_exceed_it() -> None:
    (limit,) = one("vllm", 16 * 1024, model(16 * GIB))
    assert limit.refused and "not one token's KV cache" in str(limit.problem)
    (over,) = one("vllm", 16 * 1024, model(16 * GIB + 1))
    assert over.refused and "exceed the reservation by 1 bytes" in str(over.problem)


def test_a_declared_context_that_is_exactly_the_limit_fits() -> None:
    (limit,) = one("vllm", 20000, model(context=28928))
    assert limit.value == 28928 and "does not fit" not in limit.explanation
    (more,) = one("vllm", 20000, model(context=28929))
    assert "the declared context 28929 does not fit" in more.explanation


def test_weights_and_kv_exactly_the_reservation_put_every_layer_on_the_gpu() -> None:
    m = llama((100 * MIB,) * 4, 50 * MIB)  # 450 MiB of weights + 16 MiB of KV
    (layers, _) = one("llamacpp", 466, m)
    assert layers.value == 5  # all 4 and the output layer
    (fewer, _) = one("llamacpp", 465, m)
    assert fewer.value == 4  # 50 + 3 × 104 = 362 ≤ 465 < 466: the output layer and 3


def test_the_tensors_of_no_layer_exactly_the_reservation_fit_with_no_layer() -> None:
    (layers, _) = one("llamacpp", 50, llama((100 * MIB,) * 4, 50 * MIB))
    assert (layers.value, layers.refused) == (1, False)  # the output layer alone


def test_a_layer_that_fits_exactly_is_counted_and_one_more_is_named_by_its_own_bytes() -> None:
    # the last layer 150 MiB + 4 MiB of KV beside 50 MiB: exactly 204 MiB
    m = llama((100 * MIB, 120 * MIB, 110 * MIB, 150 * MIB), 50 * MIB)
    (layers, _) = one("llamacpp", 204, m)
    assert layers.value == 2  # the output layer and the last
    # one layer more is the third (110 MiB), not the second: 204 + 110 + 4 = 318 MiB
    assert f"one layer more: {318 * MIB} bytes > {204 * MIB}" in layers.explanation


def test_without_a_model_only_the_flags_that_need_none_are_rendered() -> None:
    assert render_limits(engines.get("vllm"), 20000, None, gpus=1) == ()
    assert render_limits(engines.get("llamacpp"), 20000, None, gpus=1) == ()
    (unread,) = render_limits(engines.get("vllm"), 20000, "m.gguf: no such file", gpus=1)
    assert unread.value is None and "m.gguf: no such file" in str(unread.problem)


def test_every_suffix_reads_its_exact_multiple() -> None:
    (limit,) = one("vllm", 20000, model())  # 28928 tokens
    # 28.928k, 28.25K, 0.028928m and 0.027587890625M are each exactly 28928
    for exact in ("28.928k", "28.25K", "0.028928m", "0.027587890625M", "0k", "0"):
        assert check_limit(limit, exact, serve="s") is None, exact
    for bad in ("-0.001k", "28.9281k"):
        got = check_limit(limit, bad, serve="s")
        assert got is not None and got.kind is FindingKind.BAD_VALUE, bad


def test_the_elastic_configuration_holds_the_segment_and_the_flag_switches_it_on() -> None:
    config = engines.get("strata").elastic
    assert config is not None
    want = render_elastic(config, 1024)
    assert want.to_json()["config"] == {config.key: True, config.segment_key: 1024}
    assert want.to_json()["argv"] == ["--vram-elastic", "--vram-segment-mib", "1024"]
    for on in (["--vram-elastic"], ["--vram_elastic=true"], ["--vram-elastic=ON"]):
        assert [f.kind for f in check_elastic(want, on, serve="moe")] == [
            FindingKind.ELASTIC_SEGMENT_UNREAD
        ], on
    for off in (["--vram-elastic=0"], ["--vram-elasticity"], []):
        assert [f.kind for f in check_elastic(want, off, serve="moe")] == [
            FindingKind.ELASTIC_OFF
        ], off


# ── the search's cap, the defaults, the reasons a limit is unknown ─────────────────


def test_a_context_without_cap_is_searched_up_to_two_to_the_fortieth_tokens() -> None:
    tiny = Architecture("tiny", 1, 1, 1, 1, None)  # 4 bytes of f16 KV a token
    m = ModelInput(Weights(0, 1, ("m.gguf",), "F16"), tiny)
    assert largest_context(m, 1 << 50, None) == 1 << 40
    assert largest_context(m, 4 << 20, None) == 1 << 20  # below the cap: the bytes decide


def test_a_model_input_has_one_sequence_unless_told() -> None:
    m = ModelInput(Weights(0, 1, ("m.gguf",), "F16"), arch())
    assert m.parallel == 1 and m.kv(8192).bytes == GIB


def test_a_serve_on_no_role_is_held_to_one_reservation() -> None:
    vllm, m = engines.get("vllm"), model()
    assert render_limits(vllm, 20000, m, gpus=0) == render_limits(vllm, 20000, m, gpus=1)
    (two,) = render_limits(vllm, 20000, m, gpus=2)
    assert two.value is not None and two.value > 28928


def test_a_spaced_value_is_never_read_as_a_flag() -> None:
    flag = LimitFlag("--ctx-size", LimitKind.CONTEXT_SIZE, ("-c",))
    assert found_value(["-c", "-c", "8"], flag) == "-c"  # "-c" is the first -c's value
    assert found_value(["-c=-c", "-c", "8"], flag) == "8"


def test_without_a_context_llamacpps_limits_are_unknown_with_the_reason() -> None:
    m = model(layers=(GIB // 2,) * 32, arch_=arch(context=None))
    ngl, ctx = one("llamacpp", 20000, m)
    why = "no context: the files give none and [serve.model] sets none"
    assert (ngl.value, ngl.problem, ngl.refused) == (None, why, False)
    assert (ctx.value, ctx.problem, ctx.refused) == (None, why, False)


def test_a_kv_cache_the_formula_does_not_describe_leaves_the_layers_unknown() -> None:
    recurrent = Architecture("test (mamba)", 32, None, None, None, 4096, unsupported="recurrent")
    (ngl, ctx) = one("llamacpp", 20000, model(layers=(GIB // 2,) * 32, arch_=recurrent))
    assert ngl.value is None and not ngl.refused
    assert ngl.problem is not None and ngl.problem.startswith("the KV cache is unknown: ")
    assert ctx.value == 4096  # the context needs no KV figure


@pytest.mark.parametrize(
    ("k", "v", "consequence"),
    [
        ("bf16", "bf16", "the KV cache would be the same size as the one the limits"),
        ("f32", "f32", "the KV cache would be 2× larger than the one the limits"),
        ("q4_0", "q4_0", "the KV cache would be 3.56× (32/9) smaller than the one"),
        ("iq4_nl", "iq4_nl", "the KV cache would be 3.56× (32/9) smaller than the one"),
        ("tq1_0", "tq1_0", "the KV cache would be of a size unknown here, not the one"),
        ("f16", "bf16", "its values would be the same size as those the limits"),
    ],
)
def test_each_cache_type_is_compared_with_the_one_the_limits_were_sized_at(
    k: str, v: str, consequence: str
) -> None:
    config = engines.get("llamacpp").cache_types
    assert config is not None
    found = check_cache_types(config, "f16", ["llama-server", "-ctk", k, "-ctv", v], serve="s")
    assert found is not None and found.kind is FindingKind.CACHE_TYPE
    assert consequence in found.message
    assert "its keys" not in found.message  # a half of the wanted type is not mentioned


# ── how a value on the command line is read ───────────────────────────────────────


def test_a_declared_context_caps_the_search_where_the_files_give_no_context_length() -> None:
    """Without the model's own context length, the serve's declared context is the cap:
    it asks no more, so no more is allowed even where more would fit."""
    (limit,) = one("vllm", 20000, model(context=4096, arch_=arch(context=None)))
    assert limit.value == 4096
    assert "capped at the declared context 4096 ([serve.model] context)" in limit.explanation


def test_a_layer_count_within_a_partial_split_fits_and_a_word_is_not_a_count() -> None:
    """Only ``all`` and a count ≤ −2 mean every layer; ``auto`` and −1 are sized from the
    device's free memory (an error naming it); a count up to the layers that fit is
    within the limit, and any other word is not a whole number."""
    (some, _) = one("llamacpp", 300, llama((100 * MIB,) * 4, 50 * MIB))
    assert some.value == 3
    for within in ("0", "1", "3"):
        assert check_limit(some, within, serve="s") is None, within
    for free in ("auto", "AUTO", "-1", " -1 "):
        got = check_limit(some, free, serve="s")
        assert got is not None and got.kind is FindingKind.SIZED_FROM_FREE, free
        assert got.is_error and "free memory" in got.message
        assert "write --n-gpu-layers 3" in got.message
    for word in ("most", "2x", "", "-"):
        got = check_limit(some, word, serve="s")
        assert got is not None and got.kind is FindingKind.BAD_VALUE, word


def test_only_a_context_length_flag_reads_a_suffix() -> None:
    """vLLM's and SGLang's context flags read ``4k``; llama.cpp's ``--ctx-size`` and
    ``--n-gpu-layers`` take a plain count, so a suffixed value is not a whole number."""
    (layers, ctx) = one("llamacpp", 80000, model(layers=(1,) * 32, context=4096))
    assert (layers.value, ctx.value) == (33, 4096)
    for limit, word in ((ctx, "4k"), (ctx, "1K"), (layers, "1k")):
        got = check_limit(limit, word, serve="s")
        assert got is not None and got.kind is FindingKind.BAD_VALUE, word


def test_only_a_ctx_size_of_0_is_read_as_the_models_own_context() -> None:
    """``--ctx-size 0`` is the model's own context; any other count is itself, so one
    within the serve's context fits."""
    (_, ctx) = one("llamacpp", 80000, model(layers=(1,) * 32, context=4096))
    assert ctx.value == 4096 and ctx.zero_means == 131072
    for within in ("4096", "2048", "1"):
        assert check_limit(ctx, within, serve="s") is None, within
    over = check_limit(ctx, "0", serve="s")
    assert over is not None and over.kind is FindingKind.LIMIT_TOO_LARGE


# ── the memory flag's budget, byte limits as onnx-genai reads them, a fitted limit ──


def test_a_flag_budget_counts_on_every_gpu_and_only_where_smaller() -> None:
    """Tensor parallel: what the flag gives each GPU × the GPUs, where that is less than
    the reservation on all of them; exactly the reservation is no budget of its own."""
    m = model()
    vllm = engines.get("vllm")
    (two,) = render_limits(vllm, 10000, m, gpus=2, flag_budget=(10000 * MIB - 16384, "f"))
    assert "f = 10485743616 bytes × 2 = 20971487232 bytes (the smaller)" in two.explanation
    (one_gpu,) = render_limits(vllm, 20000, m, gpus=1, flag_budget=(20000 * MIB - 16384, "f"))
    assert "f = 20971503616 bytes = 20971503616 bytes (the smaller)" in one_gpu.explanation
    (same,) = render_limits(vllm, 20000, m, gpus=1, flag_budget=(20000 * MIB, "f"))
    assert "memory flag" not in same.explanation
    # an engine whose memory flag does not hold its weights and KV cache: no budget
    gguf = llama((100 * MIB,) * 4, 50 * MIB)
    (layers, _, _) = render_limits(
        engines.get("llamacpp"), 500, gguf, gpus=1, flag_budget=(300 * MIB, "f")
    )
    assert layers.value == 5 and "memory flag" not in layers.explanation


def test_every_layer_fitting_exactly_takes_any_count_of_all_layers() -> None:
    m = llama((100 * MIB,) * 4, 50 * MIB)  # 450 MiB of weights + 16 MiB of KV
    (layers, _) = one("llamacpp", 466, m)
    assert (layers.value, layers.all_at) == (5, 5)
    assert check_limit(layers, "999", serve="s") is None


@pytest.mark.parametrize(
    ("exact", "over"),
    [
        ("3072000KiB", "3072001KiB"),
        ("3000MiB", "3001MiB"),
        ("2.9296875GiB", "2.9296876GiB"),
        ("3145728KB", "3145729KB"),
        ("3145.728MB", "3145.729MB"),
        ("3.145728GB", "3.145729GB"),
        ("3145728000", "3145728001"),
    ],
)
def test_each_byte_unit_reads_its_exact_multiple(exact: str, over: str) -> None:
    """3000 MiB written in each unit onnx-genai reads is exactly the limit; the least
    step more is over it."""
    (limit,) = render_limits(engines.get("onnx-genai"), 3200, None, gpus=1, overhead_mib=200)
    assert limit.value == 3000 * MIB
    assert check_limit(limit, exact, serve="s") is None, exact
    got = check_limit(limit, over, serve="s")
    assert got is not None and got.kind is FindingKind.LIMIT_TOO_LARGE, over


def test_a_byte_limit_of_a_fraction_or_nothing_reads_as_the_engine_reads_it() -> None:
    (limit,) = render_limits(
        engines.get("onnx-genai"), 3200, None, gpus=1, overhead_mib=200, device_mib=100_000
    )
    for zero in ("0", "0.0", "0MiB", "0.0MiB"):
        assert check_limit(limit, zero, serve="s") is None, zero
    whole = check_limit(limit, "1.0", serve="s")  # the whole device: a fraction, not 1 byte
    assert whole is not None and whole.kind is FindingKind.LIMIT_TOO_LARGE
    assert check_limit(limit, "1", serve="s") is None  # one byte
    for bad in ("infMiB", "nan", "-0.5MiB"):
        got = check_limit(limit, bad, serve="s")
        assert got is not None and got.kind is FindingKind.BAD_VALUE, bad


def test_a_limit_the_engine_fits_to_the_reservation_passes_without_a_value() -> None:
    """llama.cpp's --fit to the start's target: no -ngl, or auto, passes; a count is
    checked as ever; an unknown limit stays unknown."""
    (layers, _) = one("llamacpp", 300, llama((100 * MIB,) * 4, 50 * MIB))
    for found in (None, "auto", "-1"):
        assert check_limit(layers, found, serve="s", fitted=True) is None, found
    big = check_limit(layers, "5", serve="s", fitted=True)
    assert big is not None and big.kind is FindingKind.LIMIT_TOO_LARGE
    assert check_limit(layers, "2", serve="s", fitted=True) is None
    for found in (None, "auto"):
        plain = check_limit(layers, found, serve="s")
        assert plain is not None and plain.is_error, found
    (unknown, _) = one("llamacpp", 80000, model())  # no per-layer bytes: unknown
    got = check_limit(unknown, None, serve="s", fitted=True)
    assert got is not None and got.kind is FindingKind.LIMIT_UNKNOWN


def test_an_elastic_segment_left_to_the_configuration_says_it_is_not_the_default() -> None:
    config = engines.get("strata").elastic
    assert config is not None
    (unread,) = check_elastic(render_elastic(config, 1024), ["--vram-elastic"], serve="m")
    assert unread.message.endswith(
        'must hold "vram_segment_mib": 1024 (the engine\'s default, 512, is not it); or '
        "write --vram-segment-mib 1024"
    )


def test_a_fit_to_the_reservation_needs_the_starts_target_and_fit_left_on() -> None:
    from statemachine.flags.model_limits import fits_to_reservation

    flag = engines.get("llamacpp").limit_flags[0]
    target = "--fit-target ${VRAMCTL_FIT_TARGET_MIB}"
    assert fits_to_reservation(flag, ["llama-server"], f"llama-server {target}")
    assert fits_to_reservation(flag, [], "llama-server -fitt=$VRAMCTL_FIT_TARGET_MIB")
    assert fits_to_reservation(flag, ["--fit", "on"], f"--fit on {target}")
    assert fits_to_reservation(flag, ["--fit=off", "--fit", "on"], f"{target}")  # the last
    for argv in (["--fit", "off"], ["--fit=off"], ["-fit", "off"], ["--fit", "on", "-fit=off"]):
        assert not fits_to_reservation(flag, argv, target), argv
    assert fits_to_reservation(flag, ["--fit"], target + " --fit")  # no value: not off
    for raw in (
        "--fit-target 1024",
        "--fit-target $OTHER",
        "--fit-target ${VRAMCTL_FIT_TARGET_MIBS}",
    ):
        assert not fits_to_reservation(flag, [], raw), raw
    vllm = engines.get("vllm").limit_flags[0]
    assert not fits_to_reservation(vllm, [], target)  # an engine without a fit target


def test_vllms_cache_type_is_its_default_without_a_flag_and_a_type_it_must_be_told() -> None:
    types = engines.get("vllm").cache_types
    assert types is not None
    assert check_cache_types(types, "bf16", [], serve="s") is None
    assert check_cache_types(types, "f16", ["--kv-cache-dtype", "auto"], serve="s") is None
    told = check_cache_types(types, "fp8", [], serve="s")
    assert told is not None and "write --kv-cache-dtype fp8" in told.message
    wrong = check_cache_types(types, "fp8_e5m2", ["--kv-cache-dtype", "fp8"], serve="s")
    assert wrong is not None and "the same size as" in wrong.message


def test_a_flag_budget_of_the_whole_reservation_on_each_gpu_is_no_budget_of_its_own() -> None:
    (two,) = render_limits(
        engines.get("vllm"), 10000, model(), gpus=2, flag_budget=(10000 * MIB, "f")
    )
    assert "memory flag" not in two.explanation
