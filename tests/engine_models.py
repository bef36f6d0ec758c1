"""Model files the real llama.cpp server loads, written by ``gguf``'s own ``GGUFWriter``.

Each :class:`Shape` is a llama-architecture model of a few layers with random weights
and a byte-level BPE vocabulary (the 256 GPT-2 byte tokens, one merge, and the
``<s>``/``</s>`` control tokens): small enough to load in a second on a CPU, real
enough that ``llama-server`` reads every key and tensor the way it reads a downloaded
model. :data:`SHAPES` are the ones the real-engine tests use: a plain llama, a
grouped-query one, a quantized one (``Q8_0`` matrices, quantized by ``gguf.quants``),
and one with a larger context.

What this module must not do: guess what the engine does with a file. The tests
compare what ``vramctl estimate`` reads here with what the engine reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quantize

F16, Q8_0 = GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0


@dataclass(frozen=True)
class Shape:
    """A model's dimensions and how its matrices are stored."""

    name: str
    layers: int = 4
    embd: int = 256
    heads: int = 4
    kv_heads: int = 4
    ff: int = 512
    context: int = 2048
    matrices: GGMLQuantizationType = F16

    @property
    def head_dim(self) -> int:
        return self.embd // self.heads


SHAPES = {
    s.name: s
    for s in (
        Shape("plain"),
        Shape("gqa", heads=8, kv_heads=2),
        Shape("q8", matrices=Q8_0),
        Shape("long", context=32768),
    )
}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (what byte-level BPE vocabularies hold)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    out: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, their types and the merges of the byte-level vocabulary."""
    tokens = [*_bytes_to_unicode(), "Ġt", "<s>", "</s>"]
    types = [TokenType.NORMAL] * 257 + [TokenType.CONTROL] * 2
    return tokens, [int(t) for t in types], ["Ġ t"]


def _matrix(rng: np.random.Generator, rows: int, cols: int, kind: GGMLQuantizationType) -> Any:
    data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    return quantize(data, kind) if kind != F16 else data.astype(np.float16)


def _tensors(s: Shape, vocab: int) -> dict[str, tuple[Any, GGMLQuantizationType | None]]:
    """Every tensor of the llama graph, as numpy arrays (rows, columns) with their ggml type."""
    rng = np.random.default_rng(len(s.name))
    kv = s.kv_heads * s.head_dim
    out: dict[str, tuple[Any, GGMLQuantizationType | None]] = {
        "token_embd.weight": (_matrix(rng, vocab, s.embd, F16), None),
        "output_norm.weight": (np.ones(s.embd, dtype=np.float32), None),
        "output.weight": (_matrix(rng, vocab, s.embd, F16), None),
    }
    shapes = {
        "attn_q": (s.embd, s.embd),
        "attn_k": (kv, s.embd),
        "attn_v": (kv, s.embd),
        "attn_output": (s.embd, s.embd),
        "ffn_gate": (s.ff, s.embd),
        "ffn_up": (s.ff, s.embd),
        "ffn_down": (s.embd, s.ff),
    }
    raw = s.matrices if s.matrices != F16 else None
    for i in range(s.layers):
        out[f"blk.{i}.attn_norm.weight"] = (np.ones(s.embd, dtype=np.float32), None)
        out[f"blk.{i}.ffn_norm.weight"] = (np.ones(s.embd, dtype=np.float32), None)
        for part, (rows, cols) in shapes.items():
            out[f"blk.{i}.{part}.weight"] = (_matrix(rng, rows, cols, s.matrices), raw)
    return out


def write(shape: Shape, path: Path) -> Path:
    """Write ``shape`` as a GGUF file at ``path`` (its folders made) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, types, merges = vocabulary()
    w = GGUFWriter(path, "llama")
    w.add_name(f"vramctl-test-{shape.name}")
    w.add_file_type(
        LlamaFileType.MOSTLY_Q8_0 if shape.matrices == Q8_0 else LlamaFileType.MOSTLY_F16
    )
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.embd)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ff)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_add_bos_token(True)
    for name, (data, raw) in _tensors(shape, len(tokens)).items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
