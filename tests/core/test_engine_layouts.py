"""Each engine's KV cache as its own source lays it out (statemachine/sizing/kv_layout.py and
the engines' modules), pinned on exact figures and against oracles written the way each
engine's code counts:

* vLLM (``vllm/v1/core/kv_cache_utils.py``): a request of ``max_model_len`` needs, per
  layer group, ``cdiv(len, 16)`` blocks of a full-attention group and
  ``cdiv(min(window − 1 + max_num_batched_tokens, len), 16) + 1`` of a sliding one; the
  groups' blocks × the bytes of a block must fit the KV memory less one block (the null
  block); the KV memory is ``fraction × total`` less the weights;
* llama.cpp (``src/llama-context.cpp``, ``src/llama-kv-cache-iswa.cpp``): each slot's
  context is padded to 256 cells; a sliding layer keeps ``pad(min(n_ctx_seq, n_swa +
  n_ubatch), 256)``; ``-ngl N`` puts the output layer on the GPU first.

Pure: statemachine only.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from hypothesis import event, given
from hypothesis import strategies as st

from statemachine import engines
from statemachine.engines.spec import KvLayout
from statemachine.flags.fraction import FindingKind
from statemachine.flags.model_limits import ModelInput, check_limit, render_limits
from statemachine.sizing.kv_layout import engine_kv, engine_kv_term, layer_groups
from statemachine.sizing.needs import MIB, Architecture, Weights

#: Llama-3-8B in BF16: 8030261248 parameters × 2 bytes; 32 layers, 8 KV heads × 128
LLAMA_8B = Weights(8030261248 * 2, 291, ("model.safetensors",), "BF16")
LLAMA_ARCH = Architecture("config.json (llama)", 32, 8, 128, 128, 131072)
#: a card of 24564 MiB (a 24 GiB card as NVML reports it)
CARD_MIB = 24564


def vllm_budget(vram_mib: int) -> tuple[int, str]:
    """What vLLM's rendered fraction gives it on the card, as :meth:`budget` computes."""
    fraction = Decimal(math.floor(Fraction(vram_mib, CARD_MIB) * 10**4)) / 10**4
    return math.floor(Fraction(fraction) * CARD_MIB * MIB), f"{fraction} × {CARD_MIB} MiB"


def vllm_len(vram_mib: int, model: ModelInput) -> int | None:
    (limit,) = render_limits(
        engines.get("vllm"), vram_mib, model, gpus=1, flag_budget=vllm_budget(vram_mib)
    )
    return limit.value


# ── vLLM ───────────────────────────────────────────────────────────────────────


def vllm_fits(arch: Architecture, length: int, available: int, batched: int = 8192) -> bool:
    """vLLM's check, as its code counts: each group's blocks for one request of
    ``length`` × the bytes of a block ≤ the KV memory less the null block."""
    page = 16 * 2 * (arch.kv_heads or 0) * (arch.key_length or 0) * 2  # bf16, one layer
    sliding = (arch.sliding_layers or 0) if arch.sliding_window else 0
    kinds = {"full": arch.layers - sliding, "sliding": sliding}
    counts = [n for n in kinds.values() if n]
    size = min(counts)
    if max(counts) < size * 1.25:
        size = max(counts)
    blocks = 0
    for kind, n in kinds.items():
        if not n:
            continue
        groups = math.ceil(n / size)
        if kind == "full":
            per = math.ceil(length / 16)
        else:
            assert arch.sliding_window is not None
            per = math.ceil(min(arch.sliding_window - 1 + batched, length) / 16) + 1
        blocks += groups * per
    block_bytes = page * size
    return blocks * block_bytes <= available - block_bytes


def test_vllms_length_is_whole_blocks_of_its_fractions_budget_less_the_null_block() -> None:
    """8B BF16 at 20000 MiB of a 24564 MiB card: the fraction 0.8141 gives vLLM
    20968953505 bytes (2566495 fewer than the reservation); less the weights, 2340
    blocks of 16 tokens × 131072 bytes; one is the null block: 2339 × 16 = 37424
    tokens, where the reservation's bytes token by token gave 37467."""
    model = ModelInput(LLAMA_8B, LLAMA_ARCH)
    assert vllm_budget(20000)[0] == 20968953505
    assert vllm_len(20000, model) == 37424 == 2339 * 16
    left = 20968953505 - LLAMA_8B.bytes
    assert vllm_fits(LLAMA_ARCH, 37424, left) and not vllm_fits(LLAMA_ARCH, 37425, left)
    (limit,) = render_limits(
        engines.get("vllm"), 20000, model, gpus=1, flag_budget=vllm_budget(20000)
    )
    assert "the engine's budget is its memory flag's, 0.8141 × 24564 MiB = 20968953505" in (
        limit.explanation
    )
    assert "+ 1 × 16 tokens × 32 layers the pool keeps back" in limit.explanation


def test_a_flag_budget_larger_than_the_reservation_is_not_used() -> None:
    model = ModelInput(LLAMA_8B, LLAMA_ARCH)
    (limit,) = render_limits(
        engines.get("vllm"), 20000, model, gpus=1, flag_budget=(20000 * MIB + 1, "x")
    )
    assert "memory flag" not in limit.explanation
    assert limit.value == ((20000 * MIB - LLAMA_8B.bytes) // (16 * 131072) - 1) * 16


def test_vllm_fits_its_own_length_with_auto_or_minus_one() -> None:
    """``--max-model-len auto`` and ``-1`` make vLLM fit the length within what its
    fraction gives it: the reservation holds, lint accepts them."""
    (limit,) = render_limits(engines.get("vllm"), 20000, ModelInput(LLAMA_8B, LLAMA_ARCH), gpus=1)
    for word in ("auto", "AUTO", "-1", " auto "):
        assert check_limit(limit, word, serve="s") is None, word
    got = check_limit(limit, "-2", serve="s")
    assert got is not None and got.kind is FindingKind.BAD_VALUE


#: a Gemma-3-shaped hybrid: 48 layers, 40 of them at a window of 1024 tokens (5:1)
GEMMA = Architecture("config.json (gemma3)", 48, 8, 256, 256, 131072, 1024, 40)


def test_vllm_keeps_the_window_and_a_batch_on_sliding_layers() -> None:
    """Gemma-3-shaped, 32768 tokens: 8 full layers × 2048 blocks + 40 sliding layers ×
    (cdiv(1024 − 1 + 8192, 16) + 1 = 577 blocks), each block 16 tokens × 8192 bytes a
    layer; the pool keeps one block of one group (8 layers) back."""
    layout = engines.get("vllm").kv_layout
    got = engine_kv(GEMMA, context=32768, kv_dtype="bf16", parallel=1, layout=layout)
    per = 2 * 8 * 256 * 2
    assert got.bytes == per * (8 * 32768 + 40 * 577 * 16 + 16 * 8)
    assert got.formula is not None and "40 sliding-window layers × 9232 tokens" in got.formula
    window_only = per * (8 * 32768 + 40 * 1024)
    assert got.bytes - window_only == per * (40 * (9232 - 1024) + 128)  # 2.6 GiB more


def test_vllms_window_counts_one_token_less_than_window_plus_batch() -> None:
    """A window of 1026: 1026 − 1 + 8192 = 9217 tokens, 577 blocks (+ 1), not the 576
    of 9216: the edge of a block is where a token's difference shows."""
    arch = Architecture("p", 6, 8, 256, 256, 131072, 1026, 5)
    layout = engines.get("vllm").kv_layout
    got = engine_kv(arch, context=65536, kv_dtype="bf16", parallel=1, layout=layout)
    assert got.formula is not None and "5 sliding-window layers × 9248 tokens" in got.formula
    assert got.bytes == 2 * 8 * 256 * 2 * (65536 + 5 * 578 * 16 + 16)


@given(
    layers=st.integers(2, 64),
    sliding_share=st.integers(0, 6),
    window=st.integers(64, 8192),
    kv_heads=st.sampled_from([1, 2, 4, 8]),
    head=st.sampled_from([64, 128, 256]),
    vram_mib=st.integers(2000, 80000),
    weights_share=st.fractions(0, 1),
    context=st.integers(256, 262144),
)
def test_vllms_rendered_length_passes_vllms_check_and_one_more_does_not(
    layers: int,
    sliding_share: int,
    window: int,
    kv_heads: int,
    head: int,
    vram_mib: int,
    weights_share: Fraction,
    context: int,
) -> None:
    sliding = layers * sliding_share // 7
    arch = Architecture("p", layers, kv_heads, head, head, context, window, sliding)
    weights = int(vram_mib * MIB * weights_share)
    model = ModelInput(Weights(weights, 1, ("m",), "BF16"), arch, kv_dtype="bf16")
    (limit,) = render_limits(engines.get("vllm"), vram_mib, model, gpus=1)
    left = vram_mib * MIB - weights
    event("hybrid" if 0 < sliding < layers else "uniform")
    if limit.value is None:
        event("nothing fits")
        assert limit.refused and not vllm_fits(arch, 1, left)
        return
    event("capped" if limit.value == context else "fitted")
    assert vllm_fits(arch, limit.value, left)
    if limit.value < context:
        assert not vllm_fits(arch, limit.value + 1, left)


def test_vllms_groups_pad_each_kind_to_one_size() -> None:
    vllm = engines.get("vllm").kv_layout
    assert layer_groups(10, 52, vllm) == (10, 60, 10)  # Gemma-3-27B: 6 groups of 10 sliding
    assert layer_groups(13, 12, vllm) == (13, 13, 13)  # under 1.25 ×: the larger count
    assert layer_groups(8, 40, vllm) == (8, 40, 8)
    assert layer_groups(32, 0, vllm) == (32, 0, 32)  # one kind: one group of every layer
    assert layer_groups(10, 52, KvLayout()) == (10, 52, 52)  # no groups: as they are
    # 5 is not under 1.25 × 4: the smaller count, 4 (vLLM: max < min × 1.25)
    assert layer_groups(5, 4, vllm) == (8, 4, 4)
    assert layer_groups(4, 4, vllm) == (4, 4, 4)


def test_a_model_without_layers_caches_nothing() -> None:
    none = Architecture("p", 0, 8, 128, 128, 8192)
    for engine in ("vllm", "llamacpp"):
        layout = engines.get(engine).kv_layout
        got = engine_kv(none, context=8192, kv_dtype="bf16", parallel=1, layout=layout)
        assert got.bytes == 0, engine


# ── llama.cpp ──────────────────────────────────────────────────────────────────


def llama_cells(arch: Architecture, context: int, slots: int) -> int:
    """llama.cpp's cells (× layers), as its code counts with ``-np slots``: each slot's
    context padded to 256; a sliding layer keeps pad(min(n_ctx_seq, n_swa + 512), 256)."""
    n_ctx = math.ceil(context * slots / 256) * 256
    seq = math.ceil((n_ctx // slots) / 256) * 256
    sliding = (arch.sliding_layers or 0) if arch.sliding_window else 0
    swa = 0
    if sliding:
        assert arch.sliding_window is not None
        swa = math.ceil(min(seq, arch.sliding_window + 512) / 256) * 256
    return slots * ((arch.layers - sliding) * seq + sliding * swa)


@given(
    context=st.integers(1, 131072),
    slots=st.integers(1, 8),
    sliding=st.integers(0, 40),
    window=st.integers(128, 8192),
)
def test_llamacpps_cache_is_padded_as_its_code_pads_it(
    context: int, slots: int, sliding: int, window: int
) -> None:
    arch = Architecture("p", 48, 8, 128, 128, 131072, window, sliding)
    layout = engines.get("llamacpp").kv_layout
    got = engine_kv(arch, context=context, kv_dtype="f16", parallel=slots, layout=layout)
    event("padded" if context % 256 else "whole")
    assert got.bytes == llama_cells(arch, context, slots) * 2 * 8 * 128 * 2


def test_llamacpp_pins_a_gemma_shaped_model_at_its_padded_window() -> None:
    """Gemma-3-shaped at 8000 tokens, one slot: 8 full layers × 8192 cells (8000 padded
    to 256) + 40 sliding layers × 1536 (1024 + 512)."""
    layout = engines.get("llamacpp").kv_layout
    got = engine_kv(GEMMA, context=8000, kv_dtype="f16", parallel=1, layout=layout)
    assert got.bytes == 2 * 8 * 256 * 2 * (8 * 8192 + 40 * 1536)


def test_llamacpp_renders_its_slots_and_counts_the_output_layer_first() -> None:
    blocks = (100 * MIB,) * 4
    arch = Architecture("gguf (llama)", 4, 8, 128, 128, 8192)
    model = ModelInput(Weights(sum(blocks) + 50 * MIB, 9, ("m.gguf",), "F16", blocks), arch, 1000)
    layers, ctx, slots = render_limits(engines.get("llamacpp"), 300, model, gpus=1)
    assert (ctx.value, slots.value) == (1000, 1)
    # 1000 tokens pad to 1024 cells: 4 MiB of KV a layer; 50 + 2 × 104 ≤ 300 < 362
    assert layers.value == 3
    assert "4 layers × 1024 tokens" in layers.explanation
    assert check_limit(slots, None, serve="s") is not None  # the default is 4 slots
    too_many = check_limit(slots, "4", serve="s")
    assert too_many is not None and too_many.kind is FindingKind.LIMIT_TOO_LARGE
    assert check_limit(slots, "1", serve="s") is None


def test_what_the_formula_does_not_describe_is_unknown_as_the_engine_lays_it_out() -> None:
    """The reasons the plain formula gives: a kind it does not describe, a quantized
    row that is not whole blocks, sliding layers the files do not name."""
    layout = engines.get("vllm").kv_layout
    mla = Architecture("p", 4, None, None, None, 8192, unsupported="MLA")
    assert engine_kv(mla, context=16, kv_dtype="bf16", parallel=1, layout=layout).reason == "MLA"
    odd = Architecture("p", 4, 1, 40, 40, 8192)  # a row of 40 elements: not blocks of 32
    got = engine_kv(odd, context=16, kv_dtype="q8_0", parallel=1, layout=layout)
    assert got.bytes is None and got.reason is not None and "not a multiple of q8_0" in got.reason
    unnamed = Architecture("p", 4, 8, 128, 128, 8192, 1024, None)
    got = engine_kv(unnamed, context=16, kv_dtype="bf16", parallel=1, layout=layout)
    assert got.bytes is None and got.reason is not None and "do not say which" in got.reason
    named = Architecture("p", 4, 8, 128, 128, 8192, 1024, 2)
    assert engine_kv(named, context=16, kv_dtype="bf16", parallel=1, layout=layout).bytes


def test_token_by_token_is_the_plain_formula_with_every_window_at_its_size() -> None:
    """The default layout (SGLang's, onnx-genai's here) adds nothing: the sizing's own
    formula, sliding layers at their window."""
    from statemachine.sizing.needs import kv_cache

    for context in (512, 1024, 1025, 32768):
        plain = kv_cache(GEMMA, context=context, kv_dtype="bf16", parallel=2)
        got = engine_kv(GEMMA, context=context, kv_dtype="bf16", parallel=2, layout=KvLayout())
        assert got.bytes == plain.bytes, context


def test_vllms_window_and_batch_are_counted_to_the_token() -> None:
    """A window of 1025: 1025 − 1 + 8192 = 9216 tokens, exactly 576 blocks (+ 1); one
    token more of either would take a block more."""
    arch = Architecture("p", 6, 8, 256, 256, 131072, 1025, 5)
    layout = engines.get("vllm").kv_layout
    got = engine_kv(arch, context=65536, kv_dtype="bf16", parallel=1, layout=layout)
    assert got.bytes == 2 * 8 * 256 * 2 * (65536 + 5 * 577 * 16 + 16)


def test_llamacpps_window_keeps_its_ubatch_to_the_cell() -> None:
    """A window of 257: 257 + 512 = 769 cells, padded to 1024; one fewer would pad to
    768."""
    arch = Architecture("p", 6, 8, 256, 256, 131072, 257, 5)
    layout = engines.get("llamacpp").kv_layout
    got = engine_kv(arch, context=8192, kv_dtype="f16", parallel=1, layout=layout)
    assert got.bytes == 2 * 8 * 256 * 2 * (8192 + 5 * 1024)


def test_a_row_that_is_not_whole_blocks_is_said_before_unnamed_windows() -> None:
    both = Architecture("p", 4, 1, 40, 40, 8192, 1024, None)
    layout = engines.get("llamacpp").kv_layout
    got = engine_kv(both, context=16, kv_dtype="q8_0", parallel=1, layout=layout)
    assert got.reason is not None and "not a multiple of q8_0" in got.reason


# ── `vramctl estimate --engine`: the KV term as the engine lays it out ─────────


def test_the_estimates_kv_term_is_the_engines_layout_where_it_has_one() -> None:
    """llama.cpp: 1000 tokens × 2 slots are 1024 cells each (what the real server
    allocates: tests/e2e/test_real_engine_sizing.py); the model's own context when none is
    asked; a token-by-token engine keeps the plain formula (None: no override)."""
    arch = Architecture("gguf (llama)", 4, 2, 32, 32, 2048)
    llama = engines.get("llamacpp").kv_layout
    got = engine_kv_term(arch, context=1000, kv_dtype="f16", parallel=2, layout=llama)
    assert got is not None and got.bytes == 2 * 2 * 32 * 2 * 4 * 1024 * 2 == 2097152
    assert got.formula is not None and got.formula.startswith(
        f"as the engine lays it out ({llama.source}): "
    )
    assert got.formula.endswith("= 2097152 bytes")
    own = engine_kv_term(arch, context=None, kv_dtype="f16", parallel=1, layout=llama)
    assert own is not None and own.bytes == 2 * 2 * 32 * 2 * 4 * 2048
    sglang = engines.get("sglang").kv_layout
    assert engine_kv_term(arch, context=1000, kv_dtype="f16", parallel=2, layout=sglang) is None


def test_the_estimates_kv_term_says_why_where_the_engine_cannot_count_it() -> None:
    llama = engines.get("llamacpp").kv_layout
    no_context = Architecture("gguf (llama)", 4, 2, 32, 32, None)
    got = engine_kv_term(no_context, context=None, kv_dtype="f16", parallel=1, layout=llama)
    assert got is not None and got.bytes is None and got.formula is None
    assert got.reason == "the files give no context length: pass --context"
    mla = Architecture("p", 4, None, None, None, 8192, unsupported="MLA")
    got = engine_kv_term(mla, context=16, kv_dtype="f16", parallel=1, layout=llama)
    assert got is not None and (got.bytes, got.formula, got.reason) == (None, None, "MLA")
    asked = engine_kv_term(no_context, context=300, kv_dtype="f16", parallel=1, layout=llama)
    assert asked is not None and asked.bytes == 2 * 2 * 32 * 2 * 4 * 512


def test_a_context_above_the_models_own_is_rendered_with_the_engines_warning() -> None:
    """llama.cpp allocates a context above n_ctx_train and warns (the real server's
    words: tests/e2e/test_real_engine_faults.py); at or below it, nothing is said."""
    arch = Architecture("m.gguf (llama)", 4, 4, 64, 64, 2048)
    weights = Weights(5 * MIB, 39, ("m.gguf",), "F16", (MIB,) * 4)
    llama = engines.get("llamacpp")
    # padded to 256 cells as the engine pads it: 2000 is 2048 (not above), 2049 is 2304
    for context, said in ((8192, True), (2048, False), (2000, False), (2049, True), (1000, False)):
        model = ModelInput(weights, arch, context, parallel=2)
        ctx = render_limits(llama, 6000, model, gpus=1)[1]
        warned = [t for t in ctx.terms if "above the model's own" in t]
        assert bool(warned) is said, (context, ctx.terms)
    model = ModelInput(weights, arch, 8192, parallel=2)
    (term,) = [t for t in render_limits(llama, 6000, model, gpus=1)[1].terms if "above" in t]
    assert term == (
        "context 8192 is above the model's own 2048 (m.gguf (llama)): llama.cpp allocates it "
        'and warns "n_ctx_seq (8192) > n_ctx_train (2048) -- possible training context '
        'overflow" (src/llama-context.cpp); answers past 2048 tokens may degrade'
    )
    padded = ModelInput(weights, arch, 2049)
    (term,) = [t for t in render_limits(llama, 6000, padded, gpus=1)[1].terms if "above" in t]
    assert term.startswith("context 2304 is above the model's own 2048")
    assert '"n_ctx_seq (2304) > n_ctx_train (2048) -- possible' in term
    unknown = ModelInput(weights, Architecture("m", 4, 4, 64, 64, None), 8192)
    assert not [t for t in render_limits(llama, 6000, unknown, gpus=1)[1].terms if "above" in t]


def test_the_estimate_carries_the_engines_kv_term_where_given() -> None:
    """``vramctl estimate --engine llamacpp``: the estimate's KV cache is the engine's
    layout (1000 tokens padded to 1024), its weights and the rest as before."""
    from statemachine.sizing.needs import estimate

    arch = Architecture("gguf (llama)", 4, 2, 32, 32, 2048)
    weights = Weights(4_730_880, 39, ("m.gguf",), "F16")
    llama = engines.get("llamacpp")
    term = engine_kv_term(arch, context=1000, kv_dtype="f16", parallel=2, layout=llama.kv_layout)
    est = estimate("m.gguf", "gguf", weights, arch, context=1000, parallel=2, engine=llama, kv=term)
    assert est.kv is term and est.kv.bytes == 2 * 2 * 32 * 2 * 4 * 1024 * 2
    plain = estimate("m.gguf", "gguf", weights, arch, context=1000, parallel=2, engine=llama)
    assert plain.kv.bytes == 2 * 2 * 32 * 2 * 4 * 1000 * 2  # without it: the plain formula
    assert (est.context, est.weights) == (plain.context, plain.weights) == (1000, weights)


def test_the_verdicts_terms_count_the_kv_cache_as_the_serves_engine_lays_it_out() -> None:
    """status, fit, validate and render weigh the same KV figure as ``estimate --engine``:
    llama.cpp's 1000 tokens × 2 slots are 1024 cells each; without an engine (or with one
    that stores token by token) the plain formula's 1000."""
    from statemachine.flags.verdict import model_terms

    arch = Architecture("gguf (llama)", 4, 2, 32, 32, 2048)
    model = ModelInput(Weights(4_730_880, 39, ("m.gguf",), "F16"), arch, 1000, parallel=2)
    laid = model_terms(model, 1, engines.get("llamacpp"))
    assert laid.kv_bytes == 2 * 2 * 32 * 2 * 4 * 1024 * 2
    assert laid.formula is not None and laid.formula.startswith("as the engine lays it out")
    for plain in (model_terms(model, 1), model_terms(model, 1, engines.get("sglang"))):
        assert plain.kv_bytes == 2 * 2 * 32 * 2 * 4 * 1000 * 2
    assert laid.weights_bytes == 4_730_880 and laid.roles == 1
    none = ModelInput(model.weights, Architecture("m", 4, 2, 32, 32, None), None)
    assert model_terms(none, 1, engines.get("llamacpp")).kv_bytes is None
