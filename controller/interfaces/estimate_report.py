"""``vramctl estimate`` as printed: what the model is, a table of the terms (bytes and
MiB, each with where it comes from), the KV formula with its figures, what was assumed,
and the least the model needs (docs/sizing.md).

Every figure is :class:`statemachine.sizing.needs.Estimate`'s; an unknown term is printed
``unknown`` with its reason, never 0, and no total is printed but "at least weights +
KV cache (the rest unknown)". This module must not compute a figure nor read a file.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from statemachine.sizing.needs import MIB, Estimate

__all__ = ["print_estimate"]

UNKNOWN = "unknown"


def _mib(value: int | None) -> str:
    """Bytes as MiB to a tenth, or ``unknown``."""
    return UNKNOWN if value is None else f"{value / MIB:,.1f}"


def _bytes(value: int | None) -> str:
    return UNKNOWN if value is None else f"{value:,}"


def _heading(result: Estimate) -> list[str]:
    """The model and the architecture figures used, as lines."""
    w, a = result.weights, result.architecture
    files = "1 file" if len(w.files) == 1 else f"{len(w.files)} files"
    tensors = "1 tensor" if w.tensors == 1 else f"{w.tensors} tensors"
    dtype = f": {w.dtype}" if w.dtype else ""
    lines = [f"model: {result.model} ({result.format}, {tensors} in {files}{dtype})"]
    if a.unsupported is not None:
        lines.append(f"architecture from {a.source}: {a.layers} layers")
        return lines
    dims = (
        f"head_dim {a.head_dim}"
        if a.head_dim is not None
        else (f"key length {a.key_length}, value length {a.value_length}")
    )
    sequences = "sequence" if result.parallel == 1 else "sequences"
    lines.append(
        f"architecture from {a.source}: {a.layers} layers, {a.kv_heads} KV heads, {dims}; "
        f"context {result.context if result.context is not None else UNKNOWN} "
        f"({result.context_source}), KV cache {result.kv_dtype}, "
        f"{result.parallel} parallel {sequences}"
    )
    if a.sliding_window is not None:
        which = UNKNOWN if a.sliding_layers is None else str(a.sliding_layers)
        lines.append(f"sliding window: {a.sliding_window} tokens on {which} of the layers")
    return lines


def _table(result: Estimate) -> Table:
    """One row per term: bytes, MiB, and where the figure comes from (or why unknown)."""
    table = Table(title="What the model needs", title_justify="left")
    for column in ("term", "bytes", "MiB", "from"):
        table.add_column(column, justify="right" if column in ("bytes", "MiB") else "left")
    weights = result.weights.bytes
    table.add_row(
        "weights",
        _bytes(weights),
        _mib(weights),
        "the tensors' sizes in the files, all counted on the GPU",
    )
    kv = result.kv
    kv_from = "the formula below" if kv.bytes is not None else kv.reason or ""
    table.add_row("kv_cache", _bytes(kv.bytes), _mib(kv.bytes), kv_from)
    for o in result.overheads:
        told = f"assumed: {o.source}" if o.bytes is not None else o.reason or ""
        table.add_row(o.term, _bytes(o.bytes), _mib(o.bytes), told)
    return table


def _total(result: Estimate) -> str:
    """The least the model needs, or why there is no figure."""
    rest = ", ".join(u["term"] for u in result.unknown() if u["term"] != "kv_cache")
    least = result.at_least_bytes
    if least is None:
        return (
            f"at least: weights {_bytes(result.weights.bytes)} bytes "
            f"({_mib(result.weights.bytes)} MiB) + the KV cache (unknown); the rest unknown"
            + (f": {rest}" if rest else "")
        )
    return (
        f"at least: {_bytes(least)} bytes ({_mib(least)} MiB) = weights + KV cache; "
        "the rest unknown" + (f": {rest}" if rest else "")
    )


def print_estimate(result: Estimate, out: Console) -> None:
    """The human answer of ``estimate`` on ``out``."""
    for line in _heading(result):
        out.print(line, markup=False)
    out.print(_table(result))
    if result.kv.formula is not None:
        out.print(Text(f"KV cache = {result.kv.formula}"))
    for assumption in result.kv.assumptions:
        out.print(Text(f"assumed: {assumption}"))
    out.print(Text(_total(result)))
    if any(o.bytes is None for o in result.overheads):
        out.print(Text(f"measure what is {UNKNOWN} with `vramctl calibrate` (docs/sizing.md)"))
