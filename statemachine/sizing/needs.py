"""What a model needs on a GPU, term by term, from figures read off its files (docs/sizing.md).

Weights are the sum of the tensors' byte sizes (exact: the files say them). The KV cache is
``2 × layers × KV heads × head_dim × context × bytes per element × parallel`` (keys and
values, for each sequence), exact for a model whose every layer caches the whole context
with those figures. Layers that differ are said: sliding-window layers are counted at
their window where the files say which layers they are, and the cache is ``unknown``
otherwise; MLA and recurrent (SSM) layers make it ``unknown``, with the reason. What no
file holds (the CUDA context, activations, CUDA graphs, the engine's own overheads) is
``unknown``, never 0, unless the engine's registry entry documents a figure, which is then
an assumption with its source. A total is only ever "at least weights + KV".

This module must not read files nor import anything from ``controller``: every input is a
plain figure (``controller.adapters.model_files`` reads them from GGUF and safetensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from statemachine.engines.spec import Engine

__all__ = [
    "KV_DTYPES",
    "MIB",
    "OVERHEAD_TERMS",
    "Architecture",
    "Estimate",
    "KvDtype",
    "KvTerm",
    "Overhead",
    "Weights",
    "estimate",
    "kv_cache",
    "kv_per_token_layer",
    "kv_token_text",
    "kv_unknown",
    "overheads",
]

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class KvDtype:
    """How a cache element is stored: ``block_bytes`` bytes hold ``block_elements``
    elements (ggml's quantized types store blocks of 32 elements with their scale)."""

    name: str
    block_bytes: int
    block_elements: int
    note: str

    @property
    def per_element(self) -> Fraction:
        """Bytes per element, exactly (q8_0: 34/32)."""
        return Fraction(self.block_bytes, self.block_elements)

    def text(self) -> str:
        """The size as the formula shows it: ``2 bytes (f16)``, ``34/32 bytes (q8_0: …)``."""
        size = str(self.block_bytes)
        if self.block_elements != 1:
            size += f"/{self.block_elements}"
        return f"{size} bytes ({self.name}{': ' + self.note if self.note else ''})"


#: how many elements one of ggml's quantized blocks holds (ggml/src/ggml-common.h: ``QK4_0``,
#: ``QK8_0`` …)
_GGML_BLOCK = 32


def _ggml(name: str, block_bytes: int) -> KvDtype:
    """One of ggml's quantized types: a block of :data:`_GGML_BLOCK` elements in
    ``block_bytes`` bytes, its scale included."""
    note = f"ggml blocks of {_GGML_BLOCK} elements in {block_bytes} bytes"
    return KvDtype(name, block_bytes, _GGML_BLOCK, note)


#: The cache types ``--kv-dtype`` takes: floats, the 8-bit floats vLLM and SGLang store
#: (``fp8`` is vLLM's name for its default 8-bit format), and ggml's quantized types,
#: blocks of 32 elements with their scale (ggml/src/ggml-common.h: ``block_q4_0`` …).
#: Which engine stores which is each engine's :class:`~statemachine.engines.spec.CacheTypes`.
KV_DTYPES: dict[str, KvDtype] = {
    d.name: d
    for d in (
        KvDtype("f16", 2, 1, ""),
        KvDtype("bf16", 2, 1, ""),
        KvDtype("f32", 4, 1, ""),
        KvDtype("fp8", 1, 1, "an 8-bit float"),
        KvDtype("fp8_e4m3", 1, 1, "an 8-bit float"),
        KvDtype("fp8_e5m2", 1, 1, "an 8-bit float"),
        _ggml("q8_0", 34),
        _ggml("q5_1", 24),
        _ggml("q5_0", 22),
        _ggml("q4_1", 20),
        _ggml("q4_0", 18),
        _ggml("iq4_nl", 18),
    )
}


@dataclass(frozen=True, slots=True)
class Weights:
    """The tensors' bytes as the files give them: ``files`` read, ``tensors`` counted."""

    bytes: int
    tensors: int
    files: tuple[str, ...]
    #: the weights' dtype(s) as the files name them (``F16, Q8_0``; config's torch_dtype)
    dtype: str | None = None
    #: each layer's (block's) tensor bytes, by block number, where the files name them
    #: (GGUF's ``blk.N.*``); empty where they were not read by layer
    layer_bytes: tuple[int, ...] = ()

    @property
    def non_layer_bytes(self) -> int:
        """The bytes of the tensors of no layer (embeddings, output, norms)."""
        return self.bytes - sum(self.layer_bytes)


@dataclass(frozen=True, slots=True)
class Architecture:
    """The figures the KV cache depends on, and where they were read (``source``).

    ``kv_heads``, ``key_length`` and ``value_length`` are ``None`` only where the layers
    are of a kind the formula does not describe (``unsupported`` says which). A sliding
    window is ``sliding_window`` tokens on ``sliding_layers`` of the layers (``None``:
    the files do not say which layers).
    """

    source: str
    layers: int
    kv_heads: int | None
    key_length: int | None
    value_length: int | None
    context_length: int | None
    sliding_window: int | None = None
    sliding_layers: int | None = None
    unsupported: str | None = None

    @property
    def head_dim(self) -> int | None:
        """The head dimension when keys and values share it, else ``None``."""
        return self.key_length if self.key_length == self.value_length else None


@dataclass(frozen=True, slots=True)
class KvTerm:
    """The KV cache: its bytes (``None``: unknown, ``reason`` says why), the formula with
    its figures, and what was assumed to get them."""

    bytes: int | None
    formula: str | None
    assumptions: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Overhead:
    """A term no file holds: its bytes where an engine's registry entry documents them
    (an assumption, ``source`` names it), else ``None`` with the ``reason``."""

    term: str
    bytes: int | None
    source: str | None = None
    reason: str | None = None


#: The terms a model's files cannot give, in the order they are shown.
OVERHEAD_TERMS: tuple[tuple[str, str], ...] = (
    ("cuda_context", "the CUDA context and the libraries' workspaces"),
    ("activations", "activations and temporary buffers of a forward pass"),
    ("cuda_graphs", "captured CUDA graphs"),
    ("engine_overhead", "the engine's own allocations"),
)


def used_context(arch: Architecture, context: int | None) -> int | None:
    """The context the estimate uses: the asked one, else the model's own (or None)."""
    return _context(arch, context)[0]


def _context(arch: Architecture, context: int | None) -> tuple[int | None, str]:
    """The context used and where it came from (``--context``, or the model's own)."""
    if context is not None:
        return context, "--context"
    return arch.context_length, f"the model's own, {arch.source}"


def _dims(arch: Architecture) -> tuple[int, int, int]:
    """KV heads, key length and value length: all known wherever the formula applies
    (``unsupported`` is ``None``)."""
    heads, key, value = arch.kv_heads, arch.key_length, arch.value_length
    assert heads is not None
    assert key is not None
    assert value is not None
    return heads, key, value


def _row_problem(arch: Architecture, dtype: KvDtype) -> str | None:
    """Why a quantized cache cannot hold these rows (ggml stores whole blocks), or None."""
    heads, key, value = _dims(arch)
    for kind, length in (("key", key), ("value", value)):
        row = heads * length
        if row % dtype.block_elements:
            return (
                f"a {kind} row of {heads} KV heads × {length} = {row} elements is "
                f"not a multiple of {dtype.name}'s block of {dtype.block_elements}"
            )
    return None


def _per_token_layer(arch: Architecture, dtype: KvDtype) -> Fraction:
    """Bytes of keys and values one layer caches per token of one sequence."""
    heads, key, value = _dims(arch)
    return heads * (key + value) * dtype.per_element


def _n(count: int, word: str) -> str:
    """``1 layer``, ``32 layers``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _dims_text(arch: Architecture) -> str:
    """``8 KV heads × 128 head_dim``, or with the key and value lengths apart."""
    if arch.head_dim is not None:
        return f"{arch.kv_heads} KV heads × {arch.head_dim} head_dim"
    return f"{arch.kv_heads} KV heads × ({arch.key_length} key + {arch.value_length} value length)"


def _formula(arch: Architecture, cached: str, dtype: KvDtype, parallel: int) -> str:
    """The formula with its figures (the bytes are appended by the caller): keys and
    values (2 ×, where they share a head_dim), what is ``cached``, the element size and
    the sequences."""
    two = "2 × " if arch.head_dim is not None else ""
    return f"{two}{cached} × {dtype.text()} × {_n(parallel, 'parallel sequence')}"


def _sliding(arch: Architecture, context: int, dtype: KvDtype, parallel: int) -> KvTerm:
    """The cache of a model some of whose layers attend to a window of fewer tokens than
    the context: counted at the window where the files say which layers those are."""
    window = arch.sliding_window
    assert window is not None
    per = _per_token_layer(arch, dtype) * parallel
    everywhere = int(per * arch.layers * context)
    if arch.sliding_layers is None:
        lowest = int(per * arch.layers * window)
        return KvTerm(
            None,
            None,
            reason=(
                f"some of the {arch.layers} layers attend to a sliding window of {window} "
                f"tokens, and the files do not say which: the cache lies between {lowest} "
                f"bytes (every layer at its window) and {everywhere} bytes (every layer at "
                f"{context} tokens)"
            ),
        )
    full = arch.layers - arch.sliding_layers
    total = int(per * (full * context + arch.sliding_layers * window))
    tokens = (
        f"{_dims_text(arch)} × ({_n(full, 'layer')} × {context} tokens + "
        f"{_n(arch.sliding_layers, 'layer')} × {window} tokens)"
    )
    assumption = (
        f"the {arch.sliding_layers} sliding-window layers cache only their window of "
        f"{window} tokens; an engine that caches {context} tokens on every layer needs "
        f"{everywhere} bytes"
    )
    formula = f"{_formula(arch, tokens, dtype, parallel)} = {total} bytes"
    return KvTerm(total, formula, (assumption,))


def kv_cache(
    arch: Architecture, *, context: int | None, kv_dtype: str = "f16", parallel: int = 1
) -> KvTerm:
    """The KV cache of ``parallel`` sequences of ``context`` tokens each (``None``: the
    model's own context length) stored as ``kv_dtype`` (a key of :data:`KV_DTYPES`)."""
    dtype = KV_DTYPES[kv_dtype]
    if parallel < 1 or (context is not None and context < 1):
        raise ValueError("context and parallel must be at least 1")
    if arch.unsupported is not None:
        return KvTerm(None, None, reason=arch.unsupported)
    used, _ = _context(arch, context)
    if used is None:
        return KvTerm(None, None, reason="the files give no context length: pass --context")
    problem = _row_problem(arch, dtype)
    if problem is not None:
        return KvTerm(None, None, reason=problem)
    if arch.sliding_window is not None and arch.sliding_window < used and arch.sliding_layers != 0:
        return _sliding(arch, used, dtype, parallel)
    total = _per_token_layer(arch, dtype) * arch.layers * used * parallel
    tokens = f"{_n(arch.layers, 'layer')} × {_dims_text(arch)} × {used} tokens"
    return KvTerm(int(total), f"{_formula(arch, tokens, dtype, parallel)} = {int(total)} bytes")


def kv_unknown(arch: Architecture, kv_dtype: str) -> str | None:
    """Why no KV figure can be given for ``arch`` stored as ``kv_dtype`` (a kind the
    formula does not describe, a quantized row that is not whole blocks, sliding layers
    the files do not name), or None: :func:`kv_per_token_layer` holds."""
    if arch.unsupported is not None:
        return arch.unsupported
    problem = _row_problem(arch, KV_DTYPES[kv_dtype])
    if problem is None and arch.sliding_window is not None and arch.sliding_layers is None:
        return (
            f"some of the {arch.layers} layers attend to a sliding window of "
            f"{arch.sliding_window} tokens, and the files do not say which"
        )
    return problem


def kv_token_text(arch: Architecture, kv_dtype: str) -> str:
    """One layer's keys and values of one token as the formulas show them:
    ``2 × 8 KV heads × 128 head_dim × 2 bytes (f16)``."""
    two = "2 × " if arch.head_dim is not None else ""
    return f"{two}{_dims_text(arch)} × {KV_DTYPES[kv_dtype].text()}"


def kv_per_token_layer(arch: Architecture, kv_dtype: str) -> Fraction:
    """Bytes of keys and values one layer caches per token of one sequence."""
    return _per_token_layer(arch, KV_DTYPES[kv_dtype])


def overheads(engine: Engine | None) -> tuple[Overhead, ...]:
    """The terms no file holds: what ``engine``'s registry entry documents (an
    assumption with its source), every other one unknown with the reason."""
    documented = {} if engine is None else {f.term: f for f in engine.documented_overheads}
    out: list[Overhead] = []
    for term, what in OVERHEAD_TERMS:
        figure = documented.get(term)
        if figure is not None:
            out.append(Overhead(term, figure.bytes, source=figure.source))
            continue
        if engine is None:
            why = f"{what}: not in the model's files; no --engine given"
        else:
            why = f"{what}: not in the model's files, nor documented by {engine.display}'s entry"
        out.append(Overhead(term, None, reason=why))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Estimate:
    """One model's needs: weights, the KV cache of the asked context, dtype and parallel
    sequences, and the terms no file holds. ``at_least_bytes`` is weights + KV (``None``
    while the KV cache is unknown): never a total of everything."""

    model: str
    format: str
    weights: Weights
    architecture: Architecture
    context: int | None
    context_source: str
    kv_dtype: str
    parallel: int
    kv: KvTerm
    overheads: tuple[Overhead, ...]
    engine: str | None = None

    @property
    def at_least_bytes(self) -> int | None:
        """Weights + KV cache, the least the model needs (the rest unknown)."""
        return None if self.kv.bytes is None else self.weights.bytes + self.kv.bytes

    def unknown(self) -> list[dict[str, str]]:
        """The unknown terms by name, each with its reason."""
        out = [
            {"term": o.term, "reason": o.reason or ""} for o in self.overheads if o.bytes is None
        ]
        if self.kv.bytes is None:
            out.insert(0, {"term": "kv_cache", "reason": self.kv.reason or ""})
        return out

    def to_json(self) -> dict[str, Any]:
        """The ``estimate --json`` answer (docs/sizing.md)."""
        arch = self.architecture
        return {
            "model": self.model,
            "format": self.format,
            "files": list(self.weights.files),
            "tensors": self.weights.tensors,
            "weights_dtype": self.weights.dtype,
            "weights_bytes": self.weights.bytes,
            "kv_cache_bytes": self.kv.bytes,
            "at_least_bytes": self.at_least_bytes,
            "architecture": {
                "source": arch.source,
                "layers": arch.layers,
                "kv_heads": arch.kv_heads,
                "head_dim": arch.head_dim,
                "key_length": arch.key_length,
                "value_length": arch.value_length,
                "context_length": arch.context_length,
                "sliding_window": arch.sliding_window,
                "sliding_layers": arch.sliding_layers,
                "context": self.context,
                "context_source": self.context_source,
                "kv_dtype": self.kv_dtype,
                "parallel": self.parallel,
            },
            "formula": self.kv.formula,
            "assumptions": list(self.kv.assumptions),
            "engine": self.engine,
            "overheads": [
                {"term": o.term, "bytes": o.bytes, "source": o.source}
                for o in self.overheads
                if o.bytes is not None
            ],
            "unknown": self.unknown(),
        }


def estimate(
    model: str,
    fmt: str,
    weights: Weights,
    arch: Architecture,
    *,
    context: int | None = None,
    kv_dtype: str = "f16",
    parallel: int = 1,
    engine: Engine | None = None,
    kv: KvTerm | None = None,
) -> Estimate:
    """The estimate of a model from what its files say (``model`` names it, ``fmt`` is
    ``gguf`` or ``safetensors``), for the asked context, cache dtype, parallel sequences
    and engine; ``kv``, where given, is the KV cache as that engine lays it out
    (:func:`statemachine.sizing.kv_layout.engine_kv_term`), else the plain formula's."""
    used, source = _context(arch, context)
    return Estimate(
        model=model,
        format=fmt,
        weights=weights,
        architecture=arch,
        context=used,
        context_source=source,
        kv_dtype=kv_dtype,
        parallel=parallel,
        kv=kv or kv_cache(arch, context=context, kv_dtype=kv_dtype, parallel=parallel),
        overheads=overheads(engine),
        engine=None if engine is None else engine.name,
    )
