"""The KV cache as an engine lays it out (docs/sizing.md, "As each engine counts").

:func:`engine_kv` counts the bytes an engine allocates for ``parallel`` sequences of
``context`` tokens, from its :class:`~statemachine.engines.spec.KvLayout`: whole
granules per sequence and layer (vLLM's 16-token blocks, llama.cpp's context padded to
256), sliding-window layers at the window plus the batch the engine keeps beside it,
vLLM's layer groups padded to one size, and the granules its pool keeps back (vLLM's
null block). With the default layout (token by token) it is the plain formula of
:func:`statemachine.sizing.needs.kv_cache` with every sliding layer at its window.

Pure: no I/O, nothing from ``controller``; integers and exact fractions only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from statemachine.engines.spec import KvLayout
from statemachine.sizing.needs import (
    Architecture,
    KvTerm,
    kv_per_token_layer,
    kv_token_text,
    kv_unknown,
    used_context,
)

__all__ = ["EngineKv", "engine_kv", "engine_kv_term", "layer_groups"]


def _up(n: int, granule: int) -> int:
    """``n`` rounded up to a whole number of granules."""
    return -(-n // granule) * granule


@dataclass(frozen=True, slots=True)
class EngineKv:
    """The bytes an engine allocates, or why they are unknown (``bytes`` ``None``)."""

    bytes: int | None
    formula: str | None = None
    reason: str | None = None


def layer_groups(full: int, sliding: int, layout: KvLayout) -> tuple[int, int, int]:
    """The full and sliding layers as the engine counts them, and the layers one pool
    granule spans: padded to one group size where ``layout.grouped`` (vLLM: the smaller
    kind's count, or the larger's when under 1.25 × the smaller), else as they are."""
    kinds = [n for n in (full, sliding) if n]
    if not layout.grouped or len(kinds) < 2:
        return full, sliding, max(kinds, default=0)
    low, high = min(kinds), max(kinds)
    size = high if high * 4 < low * 5 else low
    return _up(full, size), _up(sliding, size), size


def engine_kv(
    arch: Architecture, *, context: int, kv_dtype: str, parallel: int, layout: KvLayout
) -> EngineKv:
    """What the engine allocates for ``parallel`` sequences of ``context`` tokens."""
    problem = kv_unknown(arch, kv_dtype)
    if problem is not None:
        return EngineKv(None, reason=problem)
    g = layout.granule
    per = kv_per_token_layer(arch, kv_dtype)
    sliding = (arch.sliding_layers or 0) if arch.sliding_window is not None else 0
    full_n, slide_n, span = layer_groups(arch.layers - sliding, sliding, layout)
    cells = _up(context, g)
    terms = [f"{full_n} layers × {cells} tokens"]
    total = full_n * cells
    if slide_n:
        assert arch.sliding_window is not None
        kept = arch.sliding_window + layout.window_offset + layout.batch_tokens
        window_cells = min(cells, _up(kept, g)) + layout.window_granules * g
        terms.append(f"{slide_n} sliding-window layers × {window_cells} tokens")
        total += slide_n * window_cells
    reserved = layout.reserved_granules * g * span
    size = math.ceil(per * (total * parallel + reserved))
    kept_back = (
        f" + {layout.reserved_granules} × {g} tokens × {span} layers the pool keeps back"
        if reserved
        else ""
    )
    seqs = f"{parallel} parallel sequence{'' if parallel == 1 else 's'}"
    formula = (
        f"{kv_token_text(arch, kv_dtype)} = {per} bytes per token and layer × "
        f"({' + '.join(terms)}) × {seqs}{kept_back} = {size} bytes"
    )
    return EngineKv(size, formula)


def engine_kv_term(
    arch: Architecture, *, context: int | None, kv_dtype: str, parallel: int, layout: KvLayout
) -> KvTerm | None:
    """The estimate's KV term as the engine lays it out (``vramctl estimate --engine``),
    or None for an engine whose layout is the default (token by token: the plain
    formula's figure)."""
    if layout == KvLayout():
        return None
    used = used_context(arch, context)
    if used is None:
        return KvTerm(None, None, reason="the files give no context length: pass --context")
    kv = engine_kv(arch, context=used, kv_dtype=kv_dtype, parallel=parallel, layout=layout)
    if kv.bytes is None:
        return KvTerm(None, None, reason=kv.reason)
    return KvTerm(kv.bytes, f"as the engine lays it out ({layout.source}): {kv.formula}")
