"""The table of docs/sizing.md's "As each engine counts" (docs/gen_sizing_table.py):
generated from model files written by gguf's own writer, and every row holds: each
rendered limit within the engine's maximum as the engine's own source counts it, and
what the engine then holds within the reservation."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from controller.adapters.model_files import ModelFiles, read_model
from statemachine import engines
from statemachine.flags.fraction import fraction_for
from statemachine.flags.model_limits import ModelInput, render_limits
from statemachine.sizing.needs import MIB

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs"))
import gen_sizing_table as gen


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelFiles]:
    folder = tmp_path_factory.mktemp("models")
    return {
        s.name: read_model(gen.write(s, folder / f"{i}.gguf")) for i, s in enumerate(gen.SHAPES)
    }


def cases() -> Iterator[tuple[str, int, int]]:
    for shape in gen.SHAPES:
        for vram in gen.RESERVATIONS:
            for held in gen.HELD:
                if vram + held <= gen.CARD_MIB:
                    yield shape.name, vram, held


def test_the_table_in_the_docs_is_the_one_generated() -> None:
    assert gen.main(["--check"]) == 0, "regenerate it: python docs/gen_sizing_table.py"


def test_the_files_are_read_as_written(models: dict[str, ModelFiles]) -> None:
    """The writer's header whole: 8B BF16 is 8030261248 parameters of 2 bytes (and its
    norms of 4); the Gemma shape's 40 of 48 layers attend to a window of 1024."""
    bf16 = models["8B BF16"]
    assert bf16.weights.bytes == 16061054976
    assert len(bf16.weights.layer_bytes) == 32
    gemma = models["Gemma-3-shaped 12B Q4_K_M"].architecture
    assert (gemma.sliding_window, gemma.sliding_layers) == (1024, 40)


@pytest.mark.parametrize(("model", "vram", "held"), list(cases()))
def test_every_row_keeps_each_engine_within_its_maximum_and_the_reservation(
    models: dict[str, ModelFiles], model: str, vram: int, held: int
) -> None:
    files = models[model]
    weights, arch = files.weights, files.architecture
    reservation = vram * MIB
    # vLLM: the rendered length passes vLLM's own check in what its fraction gives it
    fraction = fraction_for(vram, gen.CARD_MIB)
    budget = math.floor(Fraction(fraction) * gen.CARD_MIB * MIB)
    assert budget <= reservation
    (limit,) = render_limits(
        engines.get("vllm"), vram, ModelInput(weights, arch), gpus=1, flag_budget=(budget, "")
    )
    if limit.value is not None:
        most = gen.vllm_max_len(arch, budget - weights.bytes, arch.context_length or 0)
        assert limit.value <= most
    else:
        assert weights.bytes > budget
    # SGLang: its share of what it finds free is at most the reservation
    free = gen.CARD_MIB - held
    share = Fraction(vram * 10**4 // free, 10**4) * free
    assert share <= vram
    # llama.cpp: what its layer split puts on the GPU, with their KV cache, fits
    llama = ModelInput(weights, arch, gen.LLAMA_CONTEXT)
    layers, _, _ = render_limits(engines.get("llamacpp"), vram, llama, gpus=1)
    assert layers.value is not None
    assert gen.llama_gpu_bytes(weights, arch, layers.value, gen.LLAMA_CONTEXT) <= reservation
    # onnx-genai: its limit and the declared overhead make the reservation
    (onnx,) = render_limits(
        engines.get("onnx-genai"), vram, None, gpus=1, overhead_mib=gen.ONNX_OVERHEAD_MIB
    )
    assert onnx.value == (vram - gen.ONNX_OVERHEAD_MIB) * MIB


def test_rows_pinned_on_their_figures() -> None:
    """A few rows by their exact figures: 8B BF16 at 20000 MiB (vLLM 37424 tokens, the
    whole model on llama.cpp's GPU), 12000 MiB (too small for vLLM, 22 of 32 layers for
    llama.cpp), the MoE at 12000 MiB (28 of 48 layers)."""
    text = gen.table()
    assert (
        "| 8B BF16 | 20000 | 0 | `--gpu-memory-utilization 0.8141 --max-model-len 37424` · "
        "vLLM's own: 37424 |"
    ) in text
    assert "| 8B BF16 | 12000 | 0 | refused: cannot load in its reservation: the weights" in text
    assert "`-ngl 23 -c 8192` · llama.cpp's GPU: 11861 MiB" in text
    assert "| MoE 30B-A3B Q4_K_M | 12000 | 6000 |" in text and "`-ngl 29 -c 8192`" in text
    assert "`--mem-fraction-static 0.6464` of 18564 MiB free" in text
