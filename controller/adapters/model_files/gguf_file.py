"""A GGUF model's weights and architecture, through ``gguf``'s own reader.

``GGUFReader`` memory-maps the file and parses its metadata and tensor table; no tensor
is read. A tensor's bytes are the reader's ``n_bytes`` (elements × type size / block
size, ``gguf.GGML_QUANT_SIZES``), summed by layer too (``blk.N.*``; the rest are the
tensors of no layer) for llama.cpp's ``--n-gpu-layers``. The KV cache's figures are the metadata's
``{arch}.block_count``, ``.attention.head_count``, ``.attention.head_count_kv``
(default: the heads), ``.attention.key_length`` / ``.value_length`` (default:
``.embedding_length / .attention.head_count``) and ``.context_length``; MLA
(``.attention.kv_lora_rank``), recurrent layers (``{arch}.ssm.*``) and KV heads that
differ by layer make it ``unsupported``; a sliding window is counted on the layers
``.attention.sliding_window_pattern`` names. A model split in several files
(``split.count``: ``NAME-00001-of-0000N.gguf``) is summed over all of them.

It must not compute the cache (``statemachine.sizing.needs`` does) nor read a tensor.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.adapters.model_files.common import ModelFileError, positive_int
from controller.adapters.model_files.gguf_extent import truncation
from statemachine.sizing.needs import Architecture, Weights

__all__ = ["read_gguf"]

_SHARD = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
#: a layer's tensor: ``blk.N.…``
_BLOCK = re.compile(r"^blk\.(?P<no>\d+)\.")


def _reader(path: Path) -> Any:
    """``GGUFReader`` on ``path``; ModelFileError when it is not a readable GGUF file."""
    from gguf import GGML_QUANT_SIZES, GGUFReader  # numpy and gguf load only for an estimate

    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, OSError) as exc:
        # a file cut short is said so, with its size against its header's, not in numpy's words
        cut = truncation(path, {int(kind): sizes for kind, sizes in GGML_QUANT_SIZES.items()})
        raise ModelFileError(cut or f"{path}: not a readable GGUF file ({exc})") from None


def _value(reader: Any, key: str) -> Any:
    """The metadata value of ``key`` (a list for an array), or None when absent."""
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _shards(path: Path, reader: Any) -> list[Path]:
    """Every file of a split model (``split.count`` > 1), in order; ``[path]`` otherwise."""
    count = _value(reader, "split.count")
    if not count or int(count) < 2:
        return [path]
    named = _SHARD.match(path.name)
    if named is None:
        raise ModelFileError(
            f"{path}: split.count is {count} but the name is not NAME-0000K-of-0000N.gguf"
        )
    prefix = named["prefix"]
    shards = [
        path.with_name(f"{prefix}-{i:05d}-of-{int(count):05d}.gguf")
        for i in range(1, int(count) + 1)
    ]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise ModelFileError(f"{path}: split in {count} files; missing: {', '.join(missing)}")
    return shards


def _weights(shards: list[Path], readers: list[Any]) -> Weights:
    """The tensors' bytes over every shard, the tensor types by bytes, and each block's
    bytes (its ``blk.N.*`` tensors)."""
    by_type: dict[str, int] = {}
    by_block: dict[int, int] = {}
    tensors = 0
    for reader in readers:
        for tensor in reader.tensors:
            name = tensor.tensor_type.name
            size = int(tensor.n_bytes)
            by_type[name] = by_type.get(name, 0) + size
            block = _BLOCK.match(str(tensor.name))
            if block is not None:
                number = int(block["no"])
                by_block[number] = by_block.get(number, 0) + size
            tensors += 1
    order = sorted(by_type, key=lambda t: (-by_type[t], t))
    blocks = tuple(by_block.get(i, 0) for i in range(max(by_block, default=-1) + 1))
    files = tuple(str(s) for s in shards)
    return Weights(sum(by_type.values()), tensors, files, ", ".join(order), blocks)


def _uniform(reader: Any, key: str, where: str) -> int | str | None:
    """A figure the same on every layer (an array of one value counts); a text saying
    why where it differs by layer; None where the key is absent."""
    value = _value(reader, key)
    if isinstance(value, list):
        distinct = sorted(set(value))
        if len(distinct) != 1:
            return f"{key}: {distinct}"
        value = distinct[0]
    return None if value is None else positive_int(value, key, where)


def _unsupported(reader: Any, arch: str) -> str | None:
    """Why the KV formula does not describe these layers, or None."""
    rank = _value(reader, f"{arch}.attention.kv_lora_rank")
    if rank:
        return (
            f"MLA ({arch}.attention.kv_lora_rank {rank}): the cache holds a compressed "
            "latent per token whose layout depends on the engine"
        )
    if any(key.startswith(f"{arch}.ssm.") for key in reader.fields):
        return (
            f"recurrent layers ({arch}.ssm.*) keep a state per sequence that the KV "
            "formula does not describe"
        )
    return None


def _sliding(reader: Any, arch: str, layers: int) -> tuple[int | None, int | None]:
    """The sliding window and how many layers use it (None: the metadata does not say)."""
    window = _value(reader, f"{arch}.attention.sliding_window")
    if not window:
        return None, None
    pattern = _value(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == layers:
        return int(window), sum(1 for p in pattern if p)
    if isinstance(pattern, bool):
        return int(window), layers if pattern else 0
    return int(window), None


def _lengths(reader: Any, arch: str, heads: int, where: str) -> tuple[int, int]:
    """The key and value lengths per head (default: embedding_length / head_count)."""
    key_length = _value(reader, f"{arch}.attention.key_length")
    value_length = _value(reader, f"{arch}.attention.value_length")
    if key_length is not None and value_length is not None:
        return (
            positive_int(key_length, f"{arch}.attention.key_length", where),
            positive_int(value_length, f"{arch}.attention.value_length", where),
        )
    embedding = _need(reader, f"{arch}.embedding_length", where)
    if embedding % heads:
        raise ModelFileError(
            f"{where}: {arch}.embedding_length {embedding} is not a multiple of the {heads} heads"
        )
    head_dim = embedding // heads
    return (
        head_dim if key_length is None else positive_int(key_length, "key_length", where),
        head_dim if value_length is None else positive_int(value_length, "value_length", where),
    )


def _need(reader: Any, key: str, where: str) -> int:
    """A required positive integer of the metadata; ModelFileError naming the key."""
    value = _value(reader, key)
    if value is None:
        raise ModelFileError(f"{where}: no metadata key {key} (needed for the KV cache)")
    return positive_int(value, key, where)


def _attention(reader: Any, arch: str, base: Architecture, where: str) -> Architecture:
    """``base`` (layers, context) with the attention figures of the metadata."""
    heads = _uniform(reader, f"{arch}.attention.head_count", where)
    if heads is None:
        raise ModelFileError(
            f"{where}: no metadata key {arch}.attention.head_count (needed for the KV cache)"
        )
    kv_heads = _uniform(reader, f"{arch}.attention.head_count_kv", where)
    kv_heads = heads if kv_heads is None else kv_heads
    if isinstance(heads, str) or isinstance(kv_heads, str):
        why = heads if isinstance(heads, str) else kv_heads
        return replace(base, unsupported=f"the attention heads differ by layer ({why})")
    key_length, value_length = _lengths(reader, arch, heads, where)
    window, sliding_layers = _sliding(reader, arch, base.layers)
    return replace(
        base,
        kv_heads=kv_heads,
        key_length=key_length,
        value_length=value_length,
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


def _architecture(reader: Any, where: str) -> Architecture:
    """The figures of the KV cache in the metadata."""
    arch = _value(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{where}: no metadata key general.architecture")
    layers = _need(reader, f"{arch}.block_count", where)
    context = _value(reader, f"{arch}.context_length")
    context = None if context is None else positive_int(context, f"{arch}.context_length", where)
    base = Architecture(f"{where} ({arch})", layers, None, None, None, context)
    why = _unsupported(reader, arch)
    return replace(base, unsupported=why) if why else _attention(reader, arch, base, where)


def read_gguf(path: Path) -> tuple[Weights, Architecture]:
    """The weights of the model ``path`` is (or the first file of) and its architecture."""
    first = _reader(path)
    shards = _shards(path, first)
    readers = [first if s == path else _reader(s) for s in shards]
    head = readers[0]
    return _weights(shards, readers), _architecture(head, str(shards[0]))
