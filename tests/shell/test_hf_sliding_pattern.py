"""A Gemma-3-style ``sliding_window_pattern`` in a safetensors ``config.json``
(controller/adapters/model_files/hf_config.py; the cache: statemachine/sizing/needs.py).

The rule pinned: ``sliding_window_pattern = N`` means N - 1 sliding-window (local)
layers, then 1 layer that attends to the whole context, repeated; so of ``L`` layers,
``L // N`` are full and ``L - L // N`` slide. That is Hugging Face transformers' own
reading (``Gemma3TextConfig``: layer ``i`` is ``"sliding_attention"`` when
``(i + 1) % sliding_window_pattern`` is not 0, else ``"full_attention"``), which is
also what the newer configs spell out as ``layer_types``. Read the other way round
(``L // N`` sliding), a Gemma 3 12B's cache at 32768 tokens comes out 4.35 times too
large; no other test used the key.

The figures are those of the Gemma 3 configs (``text_config`` of the multimodal
checkpoints): 12B has 48 layers, 8 KV heads, head_dim 256; 4B has 34 layers (not a
multiple of 6), 4 KV heads, head_dim 256; both a window of 1024 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.model_files.hf_config import read_config
from statemachine.sizing.needs import kv_cache

# Gemma 3 12B, f16 (2 bytes), one sequence of 32768 tokens:
#   per token and layer: 2 (key + value) × 8 KV heads × 256 head_dim × 2 bytes = 8192
#   48 layers, pattern 6: full = 48 // 6 = 8 (layers 6, 12, ..., 48), sliding = 40
#   tokens cached: 8 × 32768 + 40 × 1024 = 262144 + 40960 = 303104
#   bytes: 8192 × 303104 = 2483027968
#   (inverted, 40 full and 8 sliding: 8192 × (40 × 32768 + 8 × 1024) = 8192 × 1318912
#   = 10804527104 bytes, 4.35 times as much)
GEMMA3_12B = {"layers": 48, "kv_heads": 8, "full": 8, "sliding": 40, "bytes": 2483027968}
# Gemma 3 4B, f16, one sequence of 32768 tokens:
#   per token and layer: 2 × 4 KV heads × 256 × 2 bytes = 4096
#   34 layers, pattern 6: full = 34 // 6 = 5 (layers 6, 12, 18, 24, 30), sliding = 29
#   (layers 31 to 34 slide: the last group is cut before its full layer)
#   tokens cached: 5 × 32768 + 29 × 1024 = 163840 + 29696 = 193536
#   bytes: 4096 × 193536 = 792723456
GEMMA3_4B = {"layers": 34, "kv_heads": 4, "full": 5, "sliding": 29, "bytes": 792723456}
CONTEXT = 32768


def _gemma3(layers: int, kv_heads: int, **text: Any) -> dict[str, Any]:
    """A Gemma-3-style multimodal config.json: the language model under ``text_config``."""
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": layers,
            "num_attention_heads": 2 * kv_heads,
            "num_key_value_heads": kv_heads,
            "head_dim": 256,
            "max_position_embeddings": 131072,
            "sliding_window": 1024,
            **text,
        },
        "vision_config": {"model_type": "siglip_vision_model"},
    }


def _read(tmp_path: Path, config: dict[str, Any]) -> Any:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    arch, _dtype = read_config(path)
    return arch


@pytest.mark.parametrize("model", [GEMMA3_12B, GEMMA3_4B], ids=["gemma-3-12b", "gemma-3-4b"])
def test_sliding_window_pattern_6_is_five_local_layers_then_one_global(
    tmp_path: Path, model: dict[str, int]
) -> None:
    """Rule: ``sliding_window_pattern = 6`` makes every 6th layer global and the other
    five slide; the cache is the global layers at the whole context plus the sliding
    ones at their window (figures by hand above)."""
    arch = _read(tmp_path, _gemma3(model["layers"], model["kv_heads"], sliding_window_pattern=6))
    assert (arch.layers, arch.sliding_window, arch.sliding_layers) == (
        model["layers"],
        1024,
        model["sliding"],
    )
    assert arch.layers - arch.sliding_layers == model["full"]
    term = kv_cache(arch, context=CONTEXT)
    assert term.bytes == model["bytes"]
    assert term.formula is not None
    assert f"{model['full']} layers × {CONTEXT} tokens" in term.formula
    assert f"{model['sliding']} layers × 1024 tokens" in term.formula


@pytest.mark.parametrize("model", [GEMMA3_12B, GEMMA3_4B], ids=["gemma-3-12b", "gemma-3-4b"])
def test_the_pattern_reads_as_the_layer_types_transformers_builds_from_it(
    tmp_path: Path, model: dict[str, int]
) -> None:
    """Rule: a config with the pattern and one with the ``layer_types`` transformers
    derives from it (``"sliding_attention" if (i + 1) % 6 else "full_attention"``) give
    the same layers and the same cache."""
    layers = model["layers"]
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    spelled = _read(tmp_path, _gemma3(layers, model["kv_heads"], layer_types=types))
    by_pattern = _read(tmp_path, _gemma3(layers, model["kv_heads"], sliding_window_pattern=6))
    assert spelled.sliding_layers == by_pattern.sliding_layers == model["sliding"]
    assert kv_cache(spelled, context=CONTEXT).bytes == kv_cache(by_pattern, context=CONTEXT).bytes
