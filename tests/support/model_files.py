"""Model files the sizing tests read: a tiny llama GGUF (2 layers, 4 heads, 2 KV heads,
32 wide; its weights are :data:`GGUF_WEIGHTS` bytes), a Hugging Face ``config.json``, and
the larger GGUF of the limit-flag tests (:func:`write_gguf`, :data:`WEIGHTS` bytes).

Nothing here reads a model back or checks a size; the tests do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

Q8_0, Q4_0 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0


def _quantized(rows: int, cols: int, kind: GGMLQuantizationType) -> np.ndarray[Any, Any]:
    """Bytes of a quantized tensor of ``rows × cols`` elements, shaped as ggml stores it."""
    block, size = GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, size=(rows, cols // block * size), dtype=np.uint8)


def _tensors() -> dict[str, np.ndarray[Any, Any]]:
    return {
        "token_embd.weight": np.zeros((64, 32), dtype=np.float16),  # 4096 bytes
        "blk.0.attn_q.weight": _quantized(32, 64, Q8_0),  # 32 × 2 blocks × 34 = 2176
        "blk.0.ffn_up.weight": _quantized(16, 64, Q4_0),  # 16 × 2 blocks × 18 = 576
        "output_norm.weight": np.ones(32, dtype=np.float32),  # 128
    }


GGUF_WEIGHTS = 4096 + 2176 + 576 + 128
RAW = {"blk.0.attn_q.weight": Q8_0, "blk.0.ffn_up.weight": Q4_0}


def write_tiny_gguf(
    path: Path,
    meta: dict[str, Any] | None = None,
    kv_heads: int | list[int] = 2,
    **split: int,
) -> None:
    """A llama-architecture GGUF file: 2 layers, 4 heads, 2 KV heads, 32 embedding."""
    writer = GGUFWriter(path, "llama", **split)
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_head_count_kv(kv_heads)
    writer.add_embedding_length(32)
    writer.add_context_length(256)
    for key, value in (meta or {}).items():
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, value)
    for name, data in _tensors().items():
        writer.add_tensor(name, data, raw_dtype=RAW.get(name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def hf_config(folder: Path, **changes: Any) -> dict[str, Any]:
    """A Hugging Face ``config.json`` in ``folder`` (3 layers, 4 heads, 2 KV heads, 64
    wide, 512 positions, bfloat16), ``changes`` applied (None: a key left out)."""
    config: dict[str, Any] = {
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "max_position_embeddings": 512,
        "torch_dtype": "bfloat16",
    }
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return config


LAYER0, LAYER1, REST = 2097152, 1114112, 1048576
WEIGHTS = LAYER0 + LAYER1 + REST


def write_gguf(path: Path) -> Path:
    """A llama GGUF of 2 layers (an F16 one, a Q8_0 one), 2 KV heads × 8 head_dim, 65536
    tokens of context: :data:`WEIGHTS` bytes of weights."""
    block, size = GGML_QUANT_SIZES[Q8_0]
    q8 = np.zeros((1024, 1024 // block * size), dtype=np.uint8)
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_embedding_length(32)
    writer.add_context_length(65536)
    for name, data, raw in (
        ("token_embd.weight", np.zeros((256, 1024), dtype=np.float16), None),
        ("blk.0.ffn_up.weight", np.zeros((1024, 1024), dtype=np.float16), None),
        ("blk.1.ffn_up.weight", q8, Q8_0),
        ("output.weight", np.zeros((256, 1024), dtype=np.float16), None),
    ):
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
