"""One verdict on a serve's model (statemachine/flags/verdict.py), pure: the engine's own
limits decide; the plain comparison in bytes where no limit holds the engine. The front
ends that give it are pinned in tests/shell/test_one_verdict.py."""

from __future__ import annotations

from statemachine import engines
from statemachine.flags.model_limits import ModelInput
from statemachine.flags.verdict import load_verdict, model_terms
from statemachine.sizing.model_fit import ModelTerms
from statemachine.sizing.needs import MIB, Architecture, Weights

#: four layers of 100 MiB and 50 MiB of no layer; 8 KV heads × 128: 4096 bytes a token
#: and layer, 16 MiB of KV at 1024 tokens
BLOCKS = (100 * MIB,) * 4
ARCH = Architecture("test (llama)", 4, 8, 128, 128, 8192)


def model(context: int | None = 1024) -> ModelInput:
    return ModelInput(Weights(sum(BLOCKS) + 50 * MIB, 9, ("m.gguf",), "F16", BLOCKS), ARCH, context)


def terms(context: int = 1024) -> ModelTerms:
    return ModelTerms(sum(BLOCKS) + 50 * MIB, context * 4 * 4096, formula="…")


def test_a_partial_offload_is_valid_and_says_where_its_layers_run() -> None:
    got = load_verdict(engines.get("llamacpp"), 300, terms(), model(), gpus=1)
    assert got.verdict == "ok" and got.shortfall_mib is None
    assert got.note == (
        "loads partly on the GPU: --n-gpu-layers 3 puts the output layer and the last 2 of "
        "4 layers there, the other 2 run on the CPU"
    )
    assert got.message.startswith(got.note)
    assert "weights + KV cache at the serve's context, 466 MiB, would not fit vram_mib 300" in (
        got.message
    )


def test_every_layer_on_the_gpu_keeps_the_plain_verdict_with_a_note() -> None:
    got = load_verdict(engines.get("llamacpp"), 1000, terms(), model(), gpus=1)
    assert got.verdict == "ok"
    assert got.note == "--n-gpu-layers 5: every layer on the GPU"
    assert got.message.startswith("vram_mib 1000 ≥ weights 450 MiB")


def test_a_refused_limit_is_cannot_load_with_its_terms() -> None:
    got = load_verdict(engines.get("llamacpp"), 40, terms(), model(), gpus=1)
    assert got.verdict == "cannot_load" and got.error
    assert got.message.startswith(
        f"--n-gpu-layers: not even the tensors of no layer fit: {50 * MIB} > {40 * MIB}"
    )


def test_vllm_is_valid_at_the_context_that_fits_unless_one_is_declared() -> None:
    """No declared context: the model's own 8192 would not fit 460 MiB, the context that
    fits does; a declared 8192 that does not fit is refused."""
    own = ModelTerms(sum(BLOCKS) + 50 * MIB, 8192 * 4 * 4096, formula="…")
    fitted = load_verdict(engines.get("vllm"), 460, own, model(None), gpus=1)
    assert fitted.verdict == "ok"
    assert fitted.note is not None
    assert fitted.note.startswith("--max-model-len ") and "the longest context that fits" in (
        fitted.note
    )
    declared = load_verdict(engines.get("vllm"), 460, own, model(8192), gpus=1)
    assert declared.verdict == "cannot_load"
    assert "the declared context 8192 does not fit" in declared.message


def test_without_a_holding_limit_weights_and_kv_are_compared_in_bytes() -> None:
    """onnx-genai has no limit that holds its KV cache (and none without an overhead),
    an unknown engine none at all: the plain comparison."""
    for engine in (engines.get("onnx-genai"), None):
        over = load_verdict(engine, 465, terms(), model(), gpus=1)
        assert (over.verdict, over.shortfall_mib, over.note) == ("cannot_load", 1, None)
        fits = load_verdict(engine, 466, terms(), model(), gpus=1)
        assert (fits.verdict, fits.note) == ("ok", None)


def test_a_limit_whose_figures_are_unknown_leaves_the_plain_verdict() -> None:
    """A KV cache the formula does not describe (MLA): vLLM's limit is unknown, not a
    holding one; the verdict is the plain comparison, its KV cache unknown."""
    mla = Architecture("test (deepseek)", 4, None, None, None, 8192, unsupported="MLA")
    m = ModelInput(Weights(sum(BLOCKS) + 50 * MIB, 9, ("m.gguf",), "F16", BLOCKS), mla)
    weights_only = ModelTerms(sum(BLOCKS) + 50 * MIB, None, kv_reason="MLA")
    got = load_verdict(engines.get("vllm"), 460, weights_only, m, gpus=1)
    assert (got.verdict, got.note) == ("unknown", None)


def test_the_plain_terms_are_the_weights_and_the_kv_cache_at_the_serves_context() -> None:
    """Its declared context, else the model's own; unknown without either; on its GPUs."""
    declared = model_terms(model(1024), gpus=2)
    assert (declared.weights_bytes, declared.kv_bytes, declared.roles) == (
        sum(BLOCKS) + 50 * MIB,
        1024 * 4 * 4096,
        2,
    )
    assert declared.formula is not None and "1024 tokens" in declared.formula
    own = model_terms(model(None), gpus=1)
    assert (own.kv_bytes, own.roles) == (8192 * 4 * 4096, 1)
    none = ModelInput(model().weights, Architecture("p", 4, 8, 128, 128, None))
    unknown = model_terms(none, gpus=1)
    assert (unknown.kv_bytes, unknown.kv_reason) == (None, "the files give no context")
    mla = Architecture("p", 4, None, None, None, 8192, unsupported="MLA")
    odd = model_terms(ModelInput(model().weights, mla), gpus=1)
    assert (odd.kv_bytes, odd.kv_reason) == (None, "MLA")
