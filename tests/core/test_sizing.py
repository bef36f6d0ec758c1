"""The sizing arithmetic (statemachine/sizing/needs.py), pure: the KV formula pinned on published
architectures, the cache dtypes, layers that differ, the terms no file holds, the JSON."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from statemachine import engines
from statemachine.engines.spec import Detection, DocumentedFigure, Engine
from statemachine.sizing.needs import (
    KV_DTYPES,
    MIB,
    OVERHEAD_TERMS,
    Architecture,
    KvTerm,
    Overhead,
    Weights,
    estimate,
    kv_cache,
    overheads,
)

GIB = 1024 * MIB


def _arch(
    layers: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    context_length: int | None = 131072,
    **extra: object,
) -> Architecture:
    return Architecture(
        "config.json",
        layers,
        kv_heads,
        head_dim,
        head_dim,
        context_length,
        **extra,  # type: ignore[arg-type]
    )


LLAMA_31_8B = _arch(32, 8, 128, 131072)
QWEN3_06B = _arch(28, 8, 128, 40960)


def test_llama_3_1_8b_caches_128_kib_per_token_and_1_gib_at_8192_tokens() -> None:
    assert kv_cache(LLAMA_31_8B, context=1).bytes == 131072
    term = kv_cache(LLAMA_31_8B, context=8192)
    assert term.bytes == GIB
    assert term.formula == (
        "2 × 32 layers × 8 KV heads × 128 head_dim × 8192 tokens × 2 bytes (f16) × "
        "1 parallel sequence = 1073741824 bytes"
    )
    assert term.assumptions == ()


def test_llama_3_1_8b_at_its_own_context_is_16_gib() -> None:
    assert kv_cache(LLAMA_31_8B, context=None).bytes == 16 * GIB


def test_qwen3_0_6b_caches_112_kib_per_token() -> None:
    assert kv_cache(QWEN3_06B, context=1).bytes == 2 * 28 * 8 * 128 * 2 == 114688
    assert kv_cache(QWEN3_06B, context=None).bytes == 114688 * 40960 == 4480 * MIB


@pytest.mark.parametrize(
    ("dtype", "per_token"),
    [("f32", 262144), ("f16", 131072), ("bf16", 131072), ("q8_0", 69632), ("q4_0", 36864)],
)
def test_each_cache_dtype_stores_its_bytes_per_element(dtype: str, per_token: int) -> None:
    # q8_0: 65536 elements per token in 2048 blocks of 34 bytes; q4_0: of 18 bytes
    assert kv_cache(LLAMA_31_8B, context=1, kv_dtype=dtype).bytes == per_token


def test_the_quantized_dtypes_say_they_are_ggml_blocks() -> None:
    formula = kv_cache(LLAMA_31_8B, context=2, kv_dtype="q8_0").formula
    assert formula is not None and "34/32 bytes (q8_0: ggml blocks of 32 elements" in formula


def test_a_quantized_cache_whose_row_is_not_whole_blocks_is_unknown() -> None:
    term = kv_cache(_arch(kv_heads=1, head_dim=80), context=16, kv_dtype="q4_0")
    assert term.bytes is None
    assert term.reason is not None and "80 = 80 elements" in term.reason
    assert kv_cache(_arch(kv_heads=1, head_dim=80), context=16, kv_dtype="f16").bytes == 163840


def test_keys_and_values_of_different_lengths_are_counted_apart() -> None:
    arch = Architecture("GGUF metadata", 2, 4, 192, 128, 1024)
    term = kv_cache(arch, context=10)
    assert term.bytes == 2 * 4 * (192 + 128) * 10 * 2
    assert term.formula is not None and term.formula.startswith(
        "2 layers × 4 KV heads × (192 key + 128 value length) × 10 tokens"
    )
    assert arch.head_dim is None


def test_parallel_sequences_are_in_the_formula() -> None:
    term = kv_cache(LLAMA_31_8B, context=8192, parallel=4)
    assert term.bytes == 4 * GIB
    assert term.formula is not None and "× 4 parallel sequences =" in term.formula


def test_no_context_length_anywhere_is_unknown_and_says_to_pass_one() -> None:
    term = kv_cache(_arch(context_length=None), context=None)
    assert term.bytes is None and term.reason is not None and "--context" in term.reason


def test_a_context_or_parallel_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        kv_cache(LLAMA_31_8B, context=0)
    with pytest.raises(ValueError):
        kv_cache(LLAMA_31_8B, context=8, parallel=0)


def test_sliding_window_layers_are_counted_at_their_window_and_say_so() -> None:
    arch = _arch(layers=6, kv_heads=1, head_dim=4, sliding_window=16, sliding_layers=5)
    term = kv_cache(arch, context=100)
    per = 2 * 1 * 4 * 2
    assert term.bytes == per * (1 * 100 + 5 * 16)
    assert (
        term.formula is not None
        and "2 × 1 KV heads × 4 head_dim × (1 layer × 100 tokens + 5 layers × 16 tokens)"
        in term.formula
    )
    assert term.assumptions and f"needs {per * 6 * 100} bytes" in term.assumptions[0]


def test_a_window_no_shorter_than_the_context_changes_nothing() -> None:
    arch = _arch(sliding_window=4096, sliding_layers=16)
    assert kv_cache(arch, context=4096) == kv_cache(LLAMA_31_8B, context=4096)


def test_a_window_on_no_layer_changes_nothing() -> None:
    arch = _arch(sliding_window=512, sliding_layers=0)
    assert kv_cache(arch, context=8192) == kv_cache(LLAMA_31_8B, context=8192)


def test_sliding_layers_the_files_do_not_name_make_the_cache_unknown_with_its_bounds() -> None:
    arch = _arch(layers=2, kv_heads=1, head_dim=4, sliding_window=10)
    term = kv_cache(arch, context=100)
    assert term.bytes is None
    assert term.reason is not None
    assert "between 320 bytes" in term.reason and "and 3200 bytes" in term.reason


def test_layers_the_formula_does_not_describe_make_the_cache_unknown() -> None:
    arch = Architecture("config.json", 61, None, None, None, 4096, unsupported="MLA: why")
    term = kv_cache(arch, context=None)
    assert (term.bytes, term.formula, term.reason) == (None, None, "MLA: why")


@given(
    context=st.integers(1, 1 << 20),
    parallel=st.integers(1, 64),
    scale=st.integers(2, 8),
    dtype=st.sampled_from(sorted(KV_DTYPES)),
)
def test_the_cache_is_linear_in_context_and_parallel(
    context: int, parallel: int, scale: int, dtype: str
) -> None:
    one = kv_cache(LLAMA_31_8B, context=context, kv_dtype=dtype, parallel=parallel).bytes
    event(f"kv dtype {dtype}")
    longer = kv_cache(LLAMA_31_8B, context=context * scale, kv_dtype=dtype, parallel=parallel)
    wider = kv_cache(LLAMA_31_8B, context=context, kv_dtype=dtype, parallel=parallel * scale)
    assert one is not None
    assert longer.bytes == wider.bytes == one * scale


@given(
    layers=st.integers(1, 128),
    kv_heads=st.integers(1, 64),
    blocks=st.integers(1, 16),
    context=st.integers(1, 1 << 18),
)
def test_q4_0_is_smaller_than_q8_0_smaller_than_f16(
    layers: int, kv_heads: int, blocks: int, context: int
) -> None:
    arch = _arch(layers, kv_heads, 32 * blocks)
    sizes = [kv_cache(arch, context=context, kv_dtype=d).bytes for d in ("q4_0", "q8_0", "f16")]
    event("a long context (over 32k)" if context > 32_768 else "a short context")
    q4, q8, f16 = sizes
    assert q4 is not None and q8 is not None and f16 is not None
    assert q4 < q8 < f16 < (kv_cache(arch, context=context, kv_dtype="f32").bytes or 0)


@pytest.fixture
def documenting() -> Iterator[Engine]:
    engine = Engine(
        "docserve",
        "DocServe",
        Detection(programs=("doc-serve",)),
        documented_overheads=(DocumentedFigure("cuda_graphs", 512 * MIB, "DocServe's README"),),
    )
    engines.register(engine)
    yield engine
    engines.unregister("docserve")


def test_without_an_engine_every_overhead_is_unknown_never_zero() -> None:
    found = overheads(None)
    assert [o.term for o in found] == [t for t, _ in OVERHEAD_TERMS]
    assert all(o.bytes is None and o.reason for o in found)
    assert all("no --engine given" in (o.reason or "") for o in found)


def test_the_built_in_engines_document_no_overhead() -> None:
    for engine in engines.engines():
        assert all(o.bytes is None for o in overheads(engine)), engine.name
        assert engine.display in (overheads(engine)[0].reason or "")


def test_a_figure_an_engine_documents_is_an_assumption_with_its_source(
    documenting: Engine,
) -> None:
    found = {o.term: o for o in overheads(engines.get("docserve"))}
    assert (found["cuda_graphs"].bytes, found["cuda_graphs"].source) == (
        512 * MIB,
        "DocServe's README",
    )
    assert found["activations"].bytes is None


def test_the_json_carries_every_term_and_names_the_unknown_ones(documenting: Engine) -> None:
    weights = Weights(16 * GIB, 291, ("model.gguf",), "F16")
    result = estimate(
        "model.gguf", "gguf", weights, LLAMA_31_8B, context=8192, engine=documenting
    ).to_json()
    assert result["weights_bytes"] == 16 * GIB
    assert result["kv_cache_bytes"] == GIB
    assert result["at_least_bytes"] == 17 * GIB
    arch = result["architecture"]
    assert (arch["layers"], arch["kv_heads"], arch["head_dim"]) == (32, 8, 128)
    assert (arch["context"], arch["context_source"], arch["kv_dtype"], arch["parallel"]) == (
        8192,
        "--context",
        "f16",
        1,
    )
    assert result["formula"].endswith("= 1073741824 bytes")
    assert result["overheads"] == [
        {"term": "cuda_graphs", "bytes": 512 * MIB, "source": "DocServe's README"}
    ]
    assert [u["term"] for u in result["unknown"]] == [
        "cuda_context",
        "activations",
        "engine_overhead",
    ]


def test_an_unknown_cache_is_null_in_the_json_and_first_of_the_unknown_terms() -> None:
    arch = _arch(context_length=None)
    result = estimate("m", "safetensors", Weights(10, 1, ("m",)), arch).to_json()
    assert result["kv_cache_bytes"] is None and result["at_least_bytes"] is None
    assert result["unknown"][0]["term"] == "kv_cache"
    assert result["architecture"]["context_source"] == "the model's own, config.json"


@pytest.mark.parametrize("parallel", [1, 2, 3])
def test_sliding_window_layers_cache_their_window_for_each_parallel_sequence(
    parallel: int,
) -> None:
    # per token and layer: 1 KV head × (4 + 4) × 2 bytes = 16 bytes for each sequence
    arch = _arch(layers=6, kv_heads=1, head_dim=4, sliding_window=16, sliding_layers=5)
    term = kv_cache(arch, context=100, parallel=parallel)
    total = 16 * parallel * (1 * 100 + 5 * 16)
    sequences = "1 parallel sequence" if parallel == 1 else f"{parallel} parallel sequences"
    assert term.bytes == total
    assert term.formula == (
        "2 × 1 KV heads × 4 head_dim × (1 layer × 100 tokens + 5 layers × 16 tokens) × "
        f"2 bytes (f16) × {sequences} = {total} bytes"
    )
    assert term.assumptions == (
        "the 5 sliding-window layers cache only their window of 16 tokens; an engine that "
        f"caches 100 tokens on every layer needs {16 * parallel * 6 * 100} bytes",
    )


@pytest.mark.parametrize("parallel", [1, 2, 3])
def test_unnamed_sliding_layers_bound_the_cache_of_every_parallel_sequence(
    parallel: int,
) -> None:
    arch = _arch(layers=2, kv_heads=1, head_dim=4, sliding_window=10)
    term = kv_cache(arch, context=100, parallel=parallel)
    assert (term.bytes, term.formula) == (None, None)
    assert term.reason == (
        "some of the 2 layers attend to a sliding window of 10 tokens, and the files do not "
        f"say which: the cache lies between {320 * parallel} bytes (every layer at its "
        f"window) and {3200 * parallel} bytes (every layer at 100 tokens)"
    )


def test_the_json_gives_each_unknown_term_its_reason() -> None:
    arch = _arch(context_length=None)
    result = estimate("m", "safetensors", Weights(10, 1, ("m",)), arch).to_json()
    assert result["unknown"] == [
        {"term": "kv_cache", "reason": "the files give no context length: pass --context"},
        {
            "term": "cuda_context",
            "reason": "the CUDA context and the libraries' workspaces: not in the model's "
            "files; no --engine given",
        },
        {
            "term": "activations",
            "reason": "activations and temporary buffers of a forward pass: not in the "
            "model's files; no --engine given",
        },
        {
            "term": "cuda_graphs",
            "reason": "captured CUDA graphs: not in the model's files; no --engine given",
        },
        {
            "term": "engine_overhead",
            "reason": "the engine's own allocations: not in the model's files; no --engine given",
        },
    ]


def test_an_unknown_term_without_a_reason_is_listed_with_an_empty_one() -> None:
    """Every unknown term of the JSON carries a reason as text: a KV cache or an overhead
    unknown without one (a caller's own term) has the empty reason, never null."""
    arch = _arch()
    built = estimate("m", "safetensors", Weights(10, 1, ("m",)), arch)
    bare = replace(built, kv=KvTerm(None, None), overheads=(Overhead("cuda_graphs", None),))
    assert bare.unknown() == [
        {"term": "kv_cache", "reason": ""},
        {"term": "cuda_graphs", "reason": ""},
    ]
    assert bare.to_json()["unknown"] == bare.unknown()


def test_each_cache_type_is_the_size_its_engine_stores() -> None:
    """ggml's types as ggml's own table gives them (gguf's GGML_QUANT_SIZES: elements a
    block, bytes a block); the 8-bit floats one byte an element."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, kind in KV_DTYPES.items():
        if name.startswith("fp8"):
            assert (kind.block_bytes, kind.block_elements) == (1, 1), name
            continue
        elements, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
        assert (kind.block_bytes, kind.block_elements) == (size, elements), name
