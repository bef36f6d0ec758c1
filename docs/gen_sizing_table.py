"""Write the table of ``docs/sizing.md``'s "As each engine counts": what vramctl renders
for each engine beside what the engine's own arithmetic yields, for model files written
by gguf's own writer (their headers whole, their tensor data a sparse hole: the readers
take every figure from the headers).

Usage (from the repository root, with the project installed in the venv)::

    .venv/bin/python docs/gen_sizing_table.py          # regenerate the table
    .venv/bin/python docs/gen_sizing_table.py --check  # exit 1 if it is out of date

The engines' arithmetic here is written from each engine's source, apart from vramctl's
(``statemachine/sizing/kv_layout.py``, ``statemachine/flags/model_limits.py``): vLLM's
``check_enough_kv_cache_memory`` (whole 16-token blocks per layer group, the null block
kept back, in ``fraction × total`` less the weights), SGLang's ``profile_max_num_token``
(its pool: ``fraction × free − weights``), llama.cpp's ``llm_load_tensors`` layer split
(``-ngl N``: the output layer and the last N − 1 layers on the GPU) with its padded
context. tests/shell/test_sizing_table.py checks every row: each rendered limit within the
engine's maximum, the engine's weights and KV cache within the reservation.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from controller.adapters.model_files import read_model
from statemachine import engines
from statemachine.flags.fraction import fraction_for
from statemachine.flags.model_limits import ModelInput, render_limits
from statemachine.sizing.needs import MIB, Architecture, Weights

Q = GGMLQuantizationType
TARGET = Path(__file__).resolve().parent / "sizing.md"
BEGIN, END = (
    "<!-- generated: engine table (docs/gen_sizing_table.py) -->",
    "<!-- end: engine table -->",
)

#: the card, the reservations and what the others hold
CARD_MIB = 24564
RESERVATIONS = (20000, 12000)
HELD = (0, 2048, 6000)
#: llama.cpp's declared context, onnx-genai's declared overhead
LLAMA_CONTEXT = 8192
ONNX_OVERHEAD_MIB = 512


@dataclass(frozen=True)
class Shape:
    """A model's shape, written as a GGUF file of ``kind`` tensors."""

    name: str
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    kind: str  # "bf16", "q8_0", "q4_k_m"
    window: int | None = None
    full_every: int = 0  # a hybrid: every n-th layer attends to the whole context
    experts: int = 0


SHAPES = (
    Shape("8B BF16", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, "bf16"),
    Shape("8B Q8_0", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, "q8_0"),
    Shape("8B Q4_K_M", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, "q4_k_m"),
    Shape(
        "Gemma-3-shaped 12B Q4_K_M",
        "gemma3",
        48,
        3840,
        16,
        8,
        256,
        15360,
        262144,
        131072,
        "q4_k_m",
        window=1024,
        full_every=6,
    ),
    Shape(
        "MoE 30B-A3B Q4_K_M",
        "qwen3moe",
        48,
        2048,
        32,
        4,
        128,
        768,
        151936,
        40960,
        "q4_k_m",
        experts=128,
    ),
)


def _qtype(shape: Shape, role: str) -> Q:
    """The type a tensor of ``role`` takes in ``shape``'s kind (Q4_K_M: Q6_K for the
    value projections, the FFN down projections and the output, as llama.cpp's recipe)."""
    if role == "norm":
        return Q.F32
    if shape.kind == "bf16":
        return Q.BF16
    if shape.kind == "q8_0":
        return Q.Q8_0
    return Q.Q6_K if role in {"v", "down", "output"} else Q.Q4_K


def _tensors(s: Shape) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """Each tensor's name, shape (rows, …, columns) and role."""
    yield "token_embd.weight", (s.vocab, s.hidden), "embd"
    yield "output_norm.weight", (s.hidden,), "norm"
    yield "output.weight", (s.vocab, s.hidden), "output"
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (s.hidden,), "norm"
        yield f"{b}.attn_q.weight", (q, s.hidden), "q"
        yield f"{b}.attn_k.weight", (kv, s.hidden), "k"
        yield f"{b}.attn_v.weight", (kv, s.hidden), "v"
        yield f"{b}.attn_output.weight", (s.hidden, q), "o"
        yield f"{b}.ffn_norm.weight", (s.hidden,), "norm"
        if s.experts:
            yield f"{b}.ffn_gate_inp.weight", (s.experts, s.hidden), "norm"
            yield f"{b}.ffn_gate_exps.weight", (s.experts, s.ffn, s.hidden), "gate"
            yield f"{b}.ffn_up_exps.weight", (s.experts, s.ffn, s.hidden), "up"
            yield f"{b}.ffn_down_exps.weight", (s.experts, s.hidden, s.ffn), "down"
        else:
            yield f"{b}.ffn_gate.weight", (s.ffn, s.hidden), "gate"
            yield f"{b}.ffn_up.weight", (s.ffn, s.hidden), "up"
            yield f"{b}.ffn_down.weight", (s.hidden, s.ffn), "down"


def write(shape: Shape, path: Path) -> Path:
    """``shape`` as a GGUF file by gguf's writer: the header whole, the data a hole."""
    w = GGUFWriter(path, shape.arch)
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    if shape.window is not None:
        w.add_sliding_window(shape.window)
        pattern = [(i + 1) % shape.full_every != 0 for i in range(shape.layers)]
        w.add_array(f"{shape.arch}.attention.sliding_window_pattern", pattern)
    data = 0
    for name, dims, role in _tensors(shape):
        qtype = _qtype(shape, role)
        block, size = GGML_QUANT_SIZES[qtype]
        nbytes = math.prod(dims) // block * size
        w.add_tensor_info(name, dims, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        data += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    start = GGUFWriter.ggml_pad(path.stat().st_size, w.data_alignment)
    os.truncate(path, start + data)
    return path


# ── the engines' own arithmetic, from their source ─────────────────────────────


def _per_token(arch: Architecture) -> int:
    """Bytes of 16-bit keys and values of one token on one layer."""
    assert arch.kv_heads and arch.key_length and arch.value_length
    return arch.kv_heads * (arch.key_length + arch.value_length) * 2


def _kinds(arch: Architecture) -> tuple[int, int]:
    sliding = (arch.sliding_layers or 0) if arch.sliding_window else 0
    return arch.layers - sliding, sliding


def vllm_max_len(arch: Architecture, available: int, cap: int, batched: int = 8192) -> int:
    """vLLM's largest max_model_len that passes ``check_enough_kv_cache_memory``: per
    layer group ``cdiv(len, 16)`` blocks (a sliding group ``cdiv(min(window − 1 +
    batched, len), 16) + 1``), × a block's bytes, within ``available`` less the null
    block (``_get_kv_cache_groups_uniform_page_size``: groups of the smaller kind's count,
    or the larger's under 1.25 × it)."""
    full, sliding = _kinds(arch)
    counts = [n for n in (full, sliding) if n]
    size = min(counts)
    if max(counts) < size * 1.25:
        size = max(counts)
    block = 16 * _per_token(arch) * size

    def fits(length: int) -> bool:
        blocks = math.ceil(full / size) * math.ceil(length / 16) if full else 0
        if sliding:
            assert arch.sliding_window is not None
            window = min(arch.sliding_window - 1 + batched, length)
            blocks += math.ceil(sliding / size) * (math.ceil(window / 16) + 1)
        return blocks * block <= available - block

    low, high = 0, cap
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def llama_gpu_bytes(weights: Weights, arch: Architecture, ngl: int, context: int) -> int:
    """What llama.cpp puts on the GPU with ``-ngl ngl`` (llm_load_tensors: the output
    layer, then the last ngl − 1 layers; the token embeddings stay on the CPU) and their
    KV cache (n_ctx padded to 256; a sliding layer pad(min(n_ctx, n_swa + 512), 256))."""
    layers = arch.layers
    on = max(0, min(ngl, layers + 1) - 1)
    cells = math.ceil(context / 256) * 256
    swa = cells
    if arch.sliding_window:
        swa = min(cells, math.ceil((arch.sliding_window + 512) / 256) * 256)
    full, sliding = _kinds(arch)
    kinds = [swa] * sliding + [cells] * full  # the last layers: as many of each as placed
    kv = sum(kinds[len(kinds) - on :]) * _per_token(arch) if on else 0
    rest = weights.non_layer_bytes if ngl >= 1 else 0
    return rest + sum(weights.layer_bytes[layers - on :]) + kv


@dataclass(frozen=True)
class Row:
    """One model at one reservation with the others holding ``held``."""

    model: str
    vram_mib: int
    held_mib: int
    vllm: str
    sglang: str
    llamacpp: str
    onnx: str


def _mib(n: int) -> str:
    return f"{n / MIB:.0f}"


def _vllm(m: ModelInput, vram: int, held: int) -> str:
    fraction = fraction_for(vram, CARD_MIB)
    budget = math.floor(Fraction(fraction) * CARD_MIB * MIB)
    (limit,) = render_limits(engines.get("vllm"), vram, m, gpus=1, flag_budget=(budget, ""))
    if limit.value is None:
        return f"refused: {limit.problem}"
    cap = m.arch.context_length or 0
    most = vllm_max_len(m.arch, budget - m.weights.bytes, cap)
    return (
        f"`--gpu-memory-utilization {fraction} --max-model-len {limit.value}` · vLLM's own: {most}"
    )


def _sglang(m: ModelInput, vram: int, held: int) -> str:
    free = CARD_MIB - held
    fraction = Decimal(vram * 10**4 // free) / 10**4
    share = math.floor(Fraction(fraction) * free * MIB)
    pool = share - m.weights.bytes
    if pool <= 0:
        return f"`{fraction:.4f}` of {free} MiB free: {_mib(share)} MiB, less than the weights"
    return (
        f"`--mem-fraction-static {fraction:.4f}` of {free} MiB free = {_mib(share)} MiB · "
        f"SGLang's pool: {_mib(pool)} MiB"
    )


def _llama(m: ModelInput, vram: int) -> str:
    layers, ctx, _ = render_limits(engines.get("llamacpp"), vram, m, gpus=1)
    if layers.value is None:
        return f"refused: {layers.problem}"
    used = llama_gpu_bytes(m.weights, m.arch, layers.value, LLAMA_CONTEXT)
    return f"`-ngl {layers.value} -c {ctx.value}` · llama.cpp's GPU: {_mib(used)} MiB"


def _onnx(vram: int) -> str:
    (limit,) = render_limits(
        engines.get("onnx-genai"), vram, None, gpus=1, overhead_mib=ONNX_OVERHEAD_MIB
    )
    return f"`--vram-limit {limit.value}` ({_mib(limit.value or 0)} MiB)"


def rows(folder: Path) -> Iterator[Row]:
    """Every row of the table, from files written into ``folder``."""
    for shape in SHAPES:
        files = read_model(write(shape, folder / f"{shape.name.replace(' ', '_')}.gguf"))
        vllm = ModelInput(files.weights, files.architecture)
        llama = ModelInput(files.weights, files.architecture, LLAMA_CONTEXT)
        for vram in RESERVATIONS:
            for held in HELD:
                if vram + held > CARD_MIB:
                    skip = f"not admitted: {vram} + {held} > {CARD_MIB} MiB"
                    yield Row(shape.name, vram, held, skip, skip, skip, skip)
                    continue
                yield Row(
                    shape.name,
                    vram,
                    held,
                    _vllm(vllm, vram, held),
                    _sglang(vllm, vram, held),
                    _llama(llama, vram),
                    _onnx(vram),
                )


def table() -> str:
    """The generated block's text."""
    with tempfile.TemporaryDirectory(prefix="vramctl-sizing-") as tmp:
        found = list(rows(Path(tmp)))
    head = (
        f"A {CARD_MIB} MiB card; vLLM without a declared context, llama.cpp at "
        f"{LLAMA_CONTEXT} tokens, onnx-genai with engine_overhead_mib {ONNX_OVERHEAD_MIB}.\n\n"
        "| model | vram_mib | others hold | vLLM | SGLang | llama.cpp | onnx-genai |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r.model} | {r.vram_mib} | {r.held_mib} | {r.vllm} | {r.sglang} | {r.llamacpp} | "
        f"{r.onnx} |\n"
        for r in found
    )
    return head + body


def main(argv: Sequence[str] | None = None, *, target: Path = TARGET) -> int:
    """Write (or with ``--check`` compare) the block in ``target``; return the status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    text = target.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{table()}{END}{tail}"
    if args.check:
        return 0 if new == text else 1
    target.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
