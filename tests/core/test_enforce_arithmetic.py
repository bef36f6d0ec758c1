"""The limit flags' arithmetic (statemachine/flags/model_limits.py), pinned on exact figures.

A 32-layer model with 8 KV heads × 128 head_dim caches 2 × 32 × 8 × 128 × 2 = 131072
bytes of f16 keys and values per token; a reservation of 20000 MiB less 16 GiB of weights
leaves 3791650816 bytes, exactly 28928 tokens. llama.cpp offloads its last layers first,
so the layer split is pinned on uneven layers. The arithmetic is pinned here with each
engine's flags laid out token by token (:data:`PLAIN`); each engine's own layout (vLLM's
blocks, llama.cpp's padding, sliding windows) is pinned in tests/core/test_engine_layouts.py.
Pure: statemachine only.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from hypothesis import event, given
from hypothesis import strategies as st

from statemachine import engines
from statemachine.engines.spec import Engine, KvLayout, LimitFlag, LimitKind
from statemachine.flags.fraction import FindingKind
from statemachine.flags.model_limits import (
    NOT_SUBTRACTED,
    Limit,
    ModelInput,
    check_cache_types,
    check_elastic,
    check_limit,
    found_value,
    largest_context,
    render_cache_types,
    render_elastic,
    render_limits,
)
from statemachine.sizing.needs import KV_DTYPES, MIB, Architecture, Weights

GIB = 1024 * MIB


def arch(layers: int = 32, context: int | None = 131072) -> Architecture:
    return Architecture("test (llama)", layers, 8, 128, 128, context)


def model(
    weights: int = 16 * GIB,
    *,
    layers: tuple[int, ...] = (),
    context: int | None = None,
    parallel: int = 1,
    kv_dtype: str = "f16",
    arch_: Architecture | None = None,
) -> ModelInput:
    return ModelInput(
        Weights(weights, 291, ("m.gguf",), "F16", layers),
        arch_ or arch(),
        context,
        kv_dtype,
        parallel,
    )


#: vLLM's and llama.cpp's flags with the KV cache laid out token by token and the
#: reservation as the budget (llama.cpp's --n-gpu-layers and --ctx-size only)
PLAIN: dict[str, Engine] = {
    "vllm": replace(engines.get("vllm"), kv_layout=KvLayout(), budget_from_flag=False),
    "llamacpp": replace(
        engines.get("llamacpp"),
        kv_layout=KvLayout(),
        limit_flags=engines.get("llamacpp").limit_flags[:2],
    ),
}


def plain(engine: str) -> Engine:
    return PLAIN.get(engine) or engines.get(engine)


def one(engine: str, vram_mib: int, m: ModelInput | str | None) -> tuple[Limit, ...]:
    return render_limits(plain(engine), vram_mib, m, gpus=1)


# ── max context (vLLM --max-model-len, SGLang --context-length) ─────────────────


def test_the_kv_cache_of_one_token_is_131072_bytes() -> None:
    assert model().kv(1).bytes == 131072
    assert model().kv(8192).bytes == GIB  # 1 GiB at 8192 tokens


def test_the_largest_context_is_what_the_reservation_leaves_after_the_weights() -> None:
    (limit,) = one("vllm", 20000, model())
    assert limit.argv == ("--max-model-len", "28928")
    assert 20000 * MIB - 16 * GIB == 28928 * 131072  # every byte left is used
    text = limit.explanation
    assert "reservation 20000 MiB × 1048576 = 20971520000 bytes" in text
    assert "weights 17179869184 bytes" in text
    assert "left for the KV cache 20971520000 − 17179869184 = 3791650816 bytes" in text
    assert "131072 bytes" in text and "one token more: 3791781888 bytes > 3791650816" in text
    assert "unknown" in text  # the terms no file holds are said, not counted as 0


def test_tensor_parallel_counts_the_reservation_on_every_gpu() -> None:
    (two,) = render_limits(plain("vllm"), 10000, model(), gpus=2)
    assert two.value == 28928  # 2 × 10000 MiB is the 20000 MiB of one GPU
    assert "reservation 10000 MiB × 1048576 × 2 GPUs (tensor parallel) = 20971520000" in (
        two.explanation
    )
    (limit,) = render_limits(engines.get("onnx-genai"), 10000, None, gpus=2, overhead_mib=0)
    assert limit.value == 10000 * MIB  # one device's limit


def test_sglang_renders_no_context_limit_its_context_bounds_no_memory() -> None:
    """SGLang's pool is sized by its fraction of the memory free at its start; a longer
    --context-length is capped at the pool: no limit flag to render."""
    assert one("sglang", 20000, model()) == ()


def test_parallel_sequences_and_a_quantized_cache_divide_the_room() -> None:
    (four,) = one("vllm", 20000, model(parallel=4))
    assert four.value == 28928 // 4
    (q8,) = one("vllm", 20000, model(kv_dtype="q8_0"))
    per_token = 32 * 8 * 256 * 34 // 32  # keys and values, 34 bytes a block of 32
    assert q8.value == 3791650816 // per_token == 54452


def test_the_context_is_capped_at_the_models_own() -> None:
    (limit,) = one("vllm", 80000, model(arch_=arch(context=8192)))
    assert limit.value == 8192
    assert "capped at the model's own context length 8192" in limit.explanation
    # a declared context longer than the model's own is capped at the model's
    (longer,) = one("vllm", 80000, model(context=16384, arch_=arch(context=8192)))
    assert longer.value == 8192 and "the model's own context length 8192" in longer.explanation
    (same,) = one("vllm", 80000, model(context=8192, arch_=arch(context=8192)))
    assert same.value == 8192 and "capped at the declared context 8192" in same.explanation


def test_the_context_is_capped_at_the_declared_one_where_more_would_fit() -> None:
    # 28928 tokens fit 20000 MiB; the serve asks 4096, and 4096 is what it gets
    (limit,) = one("vllm", 20000, model(context=4096))
    assert limit.value == 4096
    assert "capped at the declared context 4096 ([serve.model] context)" in limit.explanation
    assert "does not fit" not in limit.explanation
    (exact,) = one("vllm", 20000, model(context=28928))
    assert exact.value == 28928 and "capped at the declared context 28928" in exact.explanation


def test_a_declared_context_that_does_not_fit_is_said() -> None:
    (limit,) = one("vllm", 20000, model(context=32768))
    assert (limit.value, limit.refused) == (None, True)
    assert limit.problem == (
        "cannot load in its reservation: the declared context 32768 does not fit: at most "
        "28928 tokens do"
    )


def test_weights_larger_than_the_reservation_are_refused_with_every_term() -> None:
    (limit,) = one("vllm", 16000, model())
    assert (limit.value, limit.refused) == (None, True)
    assert limit.problem is not None
    assert "exceed the reservation by 402653184 bytes" in limit.problem  # 16 GiB − 16000 MiB
    assert "reservation 16000 MiB × 1048576 = 16777216000 bytes" in limit.explanation
    assert "weights 17179869184 bytes" in limit.explanation


def test_not_one_token_fitting_is_refused() -> None:
    (limit,) = one("vllm", 16385, model(16 * GIB + MIB - 1))  # 1 byte left after weights
    assert (limit.value, limit.refused) == (None, True)
    assert "not one token's KV cache (131072 bytes) fits the 1 bytes left" in str(limit.problem)


def test_an_unknown_kv_cache_is_unknown_not_refused() -> None:
    mla = Architecture("x", 32, None, None, None, 4096, unsupported="MLA")
    (limit,) = one("vllm", 20000, model(arch_=mla))
    assert (limit.value, limit.refused, limit.problem) == (
        None,
        False,
        "the KV cache is unknown: MLA",
    )


def test_a_serve_without_a_model_renders_no_limit_and_unreadable_files_are_unknown() -> None:
    assert one("vllm", 20000, None) == ()
    assert one("sglang", 20000, None) == ()
    assert one("llamacpp", 20000, None) == ()
    (limit,) = one("vllm", 20000, "m.gguf: no such file")
    assert limit.value is None and not limit.refused
    assert limit.problem == "the model's files cannot be read: m.gguf: no such file"
    assert render_limits(engines.get("vllm"), None, model(), gpus=1) == ()


@given(
    layers=st.integers(1, 96),
    kv_heads=st.integers(1, 16),
    head_dim=st.sampled_from([64, 96, 128, 256]),
    dtype=st.sampled_from(sorted(KV_DTYPES)),
    parallel=st.integers(1, 8),
    # room for no token, and (mostly) room for many: 64 MiB to 64 GiB left
    left=st.integers(0, 1 << 36) | st.integers(1 << 26, 1 << 36),
    cap=st.none() | st.integers(1, 1 << 20),
)
def test_the_chosen_context_fits_and_one_token_more_would_not(
    layers: int, kv_heads: int, head_dim: int, dtype: str, parallel: int, left: int, cap: int | None
) -> None:
    m = ModelInput(
        Weights(0, 0, ()),
        Architecture("p", layers, kv_heads, head_dim, head_dim, cap),
        None,
        dtype,
        parallel,
    )
    found = largest_context(m, left, cap)
    event("no context fits" if not found else "capped" if found == cap else "a context fits")
    if found:
        size = m.kv(found).bytes
        assert size is not None and size <= left
    if cap is None or found < cap:
        over = m.kv(found + 1).bytes
        assert over is not None and over > left


# ── llama.cpp: --n-gpu-layers and --ctx-size ────────────────────────────────────


def llama(blocks: tuple[int, ...], rest: int, context: int = 1024) -> ModelInput:
    return model(sum(blocks) + rest, layers=blocks, context=context, arch_=arch(len(blocks), 8192))


def test_all_layers_and_the_output_layer_when_weights_and_kv_fit() -> None:
    m = llama((100 * MIB,) * 4, 50 * MIB)  # 4 MiB of KV per layer at 1024 tokens
    layers, ctx = one("llamacpp", 500, m)
    assert layers.argv == ("--n-gpu-layers", "5")
    assert "all 4 layers and the output layer, 5 as llama.cpp counts them" in layers.explanation
    assert "450 MiB" not in layers.explanation  # bytes, never a rounded figure
    assert f"{450 * MIB} + {16 * MIB} = {466 * MIB} ≤ {500 * MIB}" in layers.explanation
    assert ctx.argv == ("--ctx-size", "1024")


def test_the_last_layers_that_fit_run_on_the_gpu() -> None:
    # the last layer (150 MiB + 4 MiB of KV) fits beside the 50 MiB of no layer; the next
    # (100 + 4) would make 308 > 300: one layer, where the first two would have fitted
    m = llama((100 * MIB, 100 * MIB, 100 * MIB, 150 * MIB), 50 * MIB)
    (layers, _) = one("llamacpp", 300, m)
    assert layers.value == 2  # the output layer (counted first) and the last layer
    text = layers.explanation
    assert f"tensors of no layer {50 * MIB} bytes" in text
    assert f"the last 1 layers {150 * MIB} bytes + 1 × {4 * MIB} bytes of KV" in text
    assert f"one layer more: {308 * MIB} bytes > {300 * MIB}" in text
    assert (
        "--n-gpu-layers 2: llama.cpp counts the output layer first, then the last 1 layers; "
        "the other 3 run on the CPU"
    ) in text


def test_even_layers_split_at_the_largest_count_that_fits() -> None:
    (layers, _) = one("llamacpp", 300, llama((100 * MIB,) * 4, 50 * MIB))
    assert layers.value == 3  # 50 + 2 × 104 = 258 ≤ 300 < 362: the output layer and 2


def test_no_layer_at_all_when_only_the_rest_fits_and_a_refusal_below_it() -> None:
    (zero, _) = one("llamacpp", 100, llama((100 * MIB,) * 4, 50 * MIB))
    assert zero.value == 1  # the output layer alone
    (refused, _) = one("llamacpp", 40, llama((100 * MIB,) * 4, 50 * MIB))
    assert (refused.value, refused.refused) == (None, True)
    assert f"not even the tensors of no layer fit: {50 * MIB} > {40 * MIB}" == refused.problem


def test_the_context_size_is_the_serves_context_times_its_sequences() -> None:
    m = model(layers=(1,) * 32, context=4096, parallel=4)
    (_, ctx) = one("llamacpp", 80000, m)
    assert ctx.value == 16384
    assert "context 4096 ([serve.model] context) × 4 parallel sequences" in ctx.explanation
    (_, own) = one("llamacpp", 80000, model(layers=(1,) * 32))
    assert own.value == 131072  # the model's own context


def test_layers_the_files_do_not_split_are_unknown() -> None:
    (layers, _) = one("llamacpp", 80000, model())  # safetensors-like: no blk.N bytes
    assert layers.value is None and not layers.refused
    assert "tensor bytes for 0 layers of 32" in str(layers.problem)


@given(
    blocks=st.lists(st.integers(1, 1 << 28), min_size=1, max_size=40),
    rest=st.integers(0, 1 << 28),
    vram_mib=st.integers(1, 1 << 14),
    context=st.integers(1, 8192),
)
def test_the_layer_split_fits_and_one_layer_more_would_not(
    blocks: list[int], rest: int, vram_mib: int, context: int
) -> None:
    m = llama(tuple(blocks), rest, context)
    (layers, _) = one("llamacpp", vram_mib, m)
    event(
        "nothing fits"
        if layers.value is None
        else "every layer"
        if layers.value > len(blocks)
        else "some layers"
    )
    if layers.value is None:
        assert rest > vram_mib * MIB
        return
    per = m.kv(context).bytes
    assert per is not None
    per //= len(blocks)
    if layers.value > len(blocks):  # all of them
        assert m.weights.bytes + per * len(blocks) <= vram_mib * MIB
        return
    n = layers.value - 1  # the output layer is counted first
    used = rest + sum(blocks[len(blocks) - n :]) + n * per
    assert used <= vram_mib * MIB
    if n < len(blocks):
        assert used + blocks[len(blocks) - n - 1] + per > vram_mib * MIB


# ── onnx-genai: --vram-limit ────────────────────────────────────────────────────


def onnx(vram_mib: int, overhead_mib: int | None, device_mib: int | None = None) -> Limit:
    (limit,) = render_limits(
        engines.get("onnx-genai"),
        vram_mib,
        None,
        gpus=1,
        overhead_mib=overhead_mib,
        device_mib=device_mib,
    )
    return limit


def test_the_vram_limit_is_the_reservation_less_the_declared_overhead() -> None:
    """onnx-genai's limit holds its weights and KV cache, not its CUDA context,
    activations or runtime: the reservation less the serve's engine_overhead_mib."""
    limit = onnx(3200, 700)
    assert limit.argv == ("--vram-limit", str(2500 * MIB))
    assert "reservation 3200 MiB × 1048576 = 3355443200 bytes" in limit.explanation
    assert "engine_overhead_mib 700 (declared): (3200 − 700) MiB × 1048576 = 2621440000" in (
        limit.explanation
    )
    with_model = render_limits(engines.get("onnx-genai"), 3200, model(), gpus=1, overhead_mib=0)
    assert with_model[0].value == 3200 * MIB


def test_without_a_declared_overhead_the_vram_limit_is_unknown_not_the_reservation() -> None:
    limit = onnx(3200, None)
    assert (limit.value, limit.refused, limit.argv) == (None, False, ())
    assert "declare engine_overhead_mib" in str(limit.problem)
    unknown = check_limit(limit, "3355443200", serve="s")
    assert unknown is not None and unknown.kind is FindingKind.LIMIT_UNKNOWN
    refused = onnx(3200, 3200)
    assert refused.refused and "leaves nothing of vram_mib 3200" in str(refused.problem)


def test_the_vram_limit_is_read_as_the_engine_reads_it() -> None:
    """Bytes, binary and decimal units (rounded), a fraction of the device, auto."""
    limit = onnx(3200, 200, device_mib=100_000)  # 3000 MiB = 3145728000 bytes
    for within in ("3145728000", "3000MiB", "2.9GiB", "3GB", "0.03", "1024KiB"):
        assert check_limit(limit, within, serve="s") is None, within
    for over in ("3145728001", "3001MiB", "3.2GB", "0.031"):
        got = check_limit(limit, over, serve="s")
        assert got is not None and got.kind is FindingKind.LIMIT_TOO_LARGE, over
    auto = check_limit(limit, "auto", serve="s")
    assert auto is not None and auto.kind is FindingKind.SIZED_FROM_FREE
    for bad in ("3TiB", "1.5", "-1", "lots", "4e9"):
        got = check_limit(limit, bad, serve="s")
        assert got is not None and got.kind is FindingKind.BAD_VALUE, bad
    no_device = onnx(3200, 200)
    got = check_limit(no_device, "0.5", serve="s")
    assert got is not None and got.kind is FindingKind.BAD_VALUE  # of a total unknown here


# ── checks ──────────────────────────────────────────────────────────────────────


def test_a_missing_or_too_large_value_is_an_error_with_every_term() -> None:
    (limit,) = one("vllm", 20000, model())
    missing = check_limit(limit, None, serve="s")
    assert missing is not None and missing.kind is FindingKind.MISSING_LIMIT and missing.is_error
    assert "add --max-model-len 28928" in missing.message
    assert "3791650816" in missing.message
    large = check_limit(limit, "32768", serve="s")
    assert large is not None and large.kind is FindingKind.LIMIT_TOO_LARGE
    assert "--max-model-len 32768 is more than the 28928" in large.message
    assert check_limit(limit, "28928", serve="s") is None
    assert check_limit(limit, "8192", serve="s") is None  # less keeps within it too
    bad = check_limit(limit, "32x", serve="s")
    assert bad is not None and bad.kind is FindingKind.BAD_VALUE


def test_any_count_of_all_layers_is_all_layers_but_not_where_only_some_fit() -> None:
    (every, _) = one("llamacpp", 500, llama((100 * MIB,) * 4, 50 * MIB))
    assert check_limit(every, "999", serve="s") is None
    (some, _) = one("llamacpp", 300, llama((100 * MIB,) * 4, 50 * MIB))
    for found in ("999", "-2", "-7", "all", "ALL", "4"):
        got = check_limit(some, found, serve="s")
        assert got is not None and got.kind is FindingKind.LIMIT_TOO_LARGE, found


def test_a_context_may_be_written_with_a_suffix_and_a_ctx_size_of_0_is_the_models() -> None:
    (limit,) = one("vllm", 20000, model())  # 28928 tokens
    assert check_limit(limit, "28k", serve="s") is None  # 28000
    assert check_limit(limit, "28.9k", serve="s") is None  # 28900
    for over in ("29k", "28.5K", "1m"):  # 29000, 29184, 1000000
        got = check_limit(limit, over, serve="s")
        assert got is not None and got.kind is FindingKind.LIMIT_TOO_LARGE, over
    for bad in ("28.12345k", "xk", "infk", "-1k"):
        got = check_limit(limit, bad, serve="s")
        assert got is not None and got.kind is FindingKind.BAD_VALUE, bad
    (_, ctx) = one("llamacpp", 80000, model(layers=(1,) * 32, context=4096))
    zero = check_limit(ctx, "0", serve="s")  # llama.cpp: the model's own, 131072
    assert zero is not None and zero.kind is FindingKind.LIMIT_TOO_LARGE
    (_, own) = one("llamacpp", 80000, model(layers=(1,) * 32))
    assert check_limit(own, "0", serve="s") is None


def test_a_refusal_is_an_error_and_an_unknown_a_note() -> None:
    (refused,) = one("vllm", 16000, model())
    got = check_limit(refused, "4096", serve="s")
    assert got is not None and got.kind is FindingKind.DOES_NOT_FIT and got.is_error
    (unknown,) = one("vllm", 16000, "gone")
    note = check_limit(unknown, None, serve="s")
    assert note is not None and note.kind is FindingKind.LIMIT_UNKNOWN and not note.is_error


def test_a_flag_is_found_under_every_spelling_and_the_last_wins() -> None:
    layers = LimitFlag("--n-gpu-layers", LimitKind.GPU_LAYERS, ("-ngl", "--gpu-layers"))
    assert found_value(["llama-server", "-ngl", "12"], layers) == "12"
    assert found_value(["--n_gpu_layers=7", "--gpu-layers", "9"], layers) == "9"
    assert found_value(["-ngl", "3", "--n-gpu-layers=4"], layers) == "4"
    assert found_value(["--ctx-size", "5"], layers) is None
    assert found_value(["-ngl"], layers) == ""
    limit = LimitFlag("--vram-limit", LimitKind.VRAM_BYTES, env="LIMIT")
    assert found_value(["serve"], limit, {"LIMIT": "5"}) == "5"
    assert found_value(["--vram-limit", "6"], limit, {"LIMIT": "5"}) == "6"  # the flag wins
    assert found_value(["serve"], layers, {"LIMIT": "5"}) is None


# ── the elastic engine ──────────────────────────────────────────────────────────


def test_an_elastic_serve_needs_the_flag_and_its_segment() -> None:
    config = engines.get("strata").elastic
    assert config is not None
    want = render_elastic(config, 512)
    assert want.argv == ("--vram-elastic", "--vram-segment-mib", "512")
    assert want.explanation == (
        "elastic.segment_mib 512 (the manifest): the engine reads its expert-cache segment "
        'from its --vram-segment-mib 512, else its configuration: "vram_segment_mib": 512, '
        "or no entry (the engine's default is 512)"
    )
    off = check_elastic(want, ["strata", "--model", "m"], serve="moe")
    assert [f.kind for f in off] == [FindingKind.ELASTIC_OFF] and off[0].is_error
    assert 'unless its configuration says "vram_elastic": true' in off[0].message
    assert check_elastic(want, ["--vram_elastic=false"], serve="moe")[0].kind is (
        FindingKind.ELASTIC_OFF
    )
    (unread,) = check_elastic(want, ["--vram-elastic"], serve="moe")
    assert unread.kind is FindingKind.ELASTIC_SEGMENT_UNREAD and not unread.is_error
    assert unread.message.endswith(
        'must hold "vram_segment_mib": 512, or no entry (the engine\'s default is 512); or '
        "write --vram-segment-mib 512"
    )
    other = render_elastic(config, 1024)
    # the engine's segment flag is read: the manifest's segment, or an error
    assert check_elastic(other, ["--vram-elastic", "--vram-segment-mib=1024"], serve="m") == []
    assert check_elastic(other, ["--vram-elastic", "--vram-segment-mib", "1024"], serve="m") == []
    (wrong,) = check_elastic(other, ["--vram-elastic", "--vram-segment-mib", "512"], serve="m")
    assert wrong.kind is FindingKind.DISAGREES and wrong.is_error
    assert wrong.message == (
        "--vram-segment-mib 512 is not the manifest's elastic.segment_mib 1024: every "
        "POST /v1/vram would resize by another step than the ledger counts; write "
        "--vram-segment-mib 1024"
    )


# ── the KV cache's element type (llama.cpp --cache-type-k / --cache-type-v) ────────


def test_llamacpps_cache_type_flags_are_its_own_names() -> None:
    config = engines.get("llamacpp").cache_types
    assert config is not None and config.default == "f16"
    assert [(f.name, f.half, f.aliases, f.env) for f in config.flags] == [
        ("--cache-type-k", "keys", ("-ctk",), "LLAMA_ARG_CACHE_TYPE_K"),
        ("--cache-type-v", "values", ("-ctv",), "LLAMA_ARG_CACHE_TYPE_V"),
    ]
    vllm = engines.get("vllm").cache_types
    assert vllm is not None and [f.name for f in vllm.flags] == ["--kv-cache-dtype"]


def test_the_cache_type_flags_are_rendered_only_off_the_default() -> None:
    config = engines.get("llamacpp").cache_types
    want = render_cache_types(config, "q4_0")
    assert want is not None
    assert want.argv == ("--cache-type-k", "q4_0", "--cache-type-v", "q4_0")
    assert render_cache_types(config, "f16") is None
    assert render_cache_types(config, None) is None  # no [serve.model]
    assert render_cache_types(engines.get("onnx-genai").cache_types, "q4_0") is None


def test_the_cache_type_check_takes_the_last_spelling_and_the_environment() -> None:
    config = engines.get("llamacpp").cache_types
    assert config is not None
    argv = ["llama-server", "-ctk", "f16", "--cache-type-k", "q8_0", "-ctv", "q8_0"]
    assert check_cache_types(config, "q8_0", argv, serve="s") is None
    env = {"LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_CACHE_TYPE_V": "q8_0"}
    assert check_cache_types(config, "q8_0", ["llama-server"], env, serve="s") is None
    assert check_cache_types(config, "f16", ["llama-server"], serve="s") is None


def test_halves_of_different_types_are_each_compared() -> None:
    config = engines.get("llamacpp").cache_types
    assert config is not None
    argv = ["llama-server", "-ctk", "f32", "-ctv", "q4_0"]
    found = check_cache_types(config, "f16", argv, serve="s", service="svc")
    assert found is not None and found.is_error and found.kind is FindingKind.CACHE_TYPE
    assert found.message == (
        "the command stores its KV cache as --cache-type-k f32, --cache-type-v q4_0 but "
        "[serve.model] kv_dtype is f16: its keys would be 2× larger than those the limits "
        "were sized for (4 bytes (f32) an element against 2 bytes (f16)); its values would "
        "be 3.56× (32/9) smaller than those the limits were sized for (18/32 bytes (q4_0: "
        "ggml blocks of 32 elements in 18 bytes) an element against 2 bytes (f16)); write "
        "--cache-type-k f16 --cache-type-v f16"
    )
    assert KV_DTYPES["f16"].per_element / KV_DTYPES["q4_0"].per_element == Fraction(32, 9)


# ── every term of an explanation, in order ───────────────────────────────────────


#: one layer's keys and values of one token, as the formulas show them
ROW = "2 × 8 KV heads × 128 head_dim × 2 bytes (f16) = 4096 bytes per token and layer"


def test_the_context_explanation_names_the_kv_cache_at_the_context_found() -> None:
    """The max-context explanation shows the KV cache at the context it found, its
    formula and bytes against the bytes left, between the per-token figure and the next."""
    (limit,) = one("vllm", 20000, model())
    assert limit.terms[3:6] == (
        f"KV cache at one token, as the engine lays it out: {ROW} × (32 layers × 1 tokens) "
        "× 1 parallel sequence = 131072 bytes",
        f"at 28928 tokens: {ROW} × (32 layers × 28928 tokens) × 1 parallel sequence = "
        "3791650816 bytes ≤ 3791650816",
        "one token more: 3791781888 bytes > 3791650816",
    )


def test_the_layer_split_explains_the_whole_kv_cache_its_excess_and_one_layers_kv() -> None:
    """Where only some layers fit, the explanation gives every term in order: the whole
    KV cache, weights + KV cache over the reservation, the tensors of no layer, one
    layer's KV cache, the layers that fit, the one more that would not, the rest."""
    m = llama((100 * MIB, 100 * MIB, 100 * MIB, 150 * MIB), 50 * MIB)
    (layers, _) = one("llamacpp", 300, m)
    kv = ROW + " × ({} × 1024 tokens) × 1 parallel sequence"
    assert layers.terms == (
        f"reservation 300 MiB × 1048576 = {300 * MIB} bytes",
        f"weights {500 * MIB} bytes (291 tensors, read from the files)",
        f"KV cache as the engine lays it out: {kv.format('4 layers')} = {16 * MIB} bytes",
        f"weights + KV cache {516 * MIB} bytes > {300 * MIB}",
        f"tensors of no layer {50 * MIB} bytes, counted on the GPU (an upper bound: llama.cpp "
        "keeps the token embeddings on the CPU)",
        f"KV cache of one layer {kv.format('1 layers')} = {4 * MIB} bytes",
        f"the last 1 layers {150 * MIB} bytes + 1 × {4 * MIB} bytes of KV + {50 * MIB} = "
        f"{204 * MIB} ≤ {300 * MIB}",
        f"one layer more: {308 * MIB} bytes > {300 * MIB}",
        "--n-gpu-layers 2: llama.cpp counts the output layer first, then the last 1 layers; "
        "the other 3 run on the CPU",
        NOT_SUBTRACTED,
    )


def test_every_layer_on_the_gpu_is_explained_by_the_whole_kv_cache() -> None:
    """Where every layer fits, the explanation names the whole KV cache's formula
    before the sum of weights and KV cache that fits."""
    (layers, _) = one("llamacpp", 500, llama((100 * MIB,) * 4, 50 * MIB))
    kv = f"{ROW} × (4 layers × 1024 tokens) × 1 parallel sequence"
    assert layers.terms[2] == f"KV cache as the engine lays it out: {kv} = {16 * MIB} bytes"
    assert layers.terms[3].startswith(f"weights + KV cache {450 * MIB} + {16 * MIB} = ")
