"""The tensors' bytes of safetensors files, from each file's header alone.

A safetensors file starts with 8 bytes (little-endian: the header's length N), then N
bytes of JSON naming each tensor's ``dtype``, ``shape`` and ``data_offsets``
(``[begin, end)`` in the data after the header); a tensor's bytes are ``end − begin``.
Only the header is read, never a tensor; a file shorter than its header or its offsets
say is refused as truncated.

It must not load tensors nor compute anything beyond the sums of what the headers say.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.adapters.model_files.common import ModelFileError

__all__ = ["HeaderSums", "read_headers"]

#: safetensors refuses a header longer than this (100 MB): a longer one is not its format
MAX_HEADER = 100_000_000
LENGTH_BYTES = 8


@dataclass(frozen=True, slots=True)
class HeaderSums:
    """What the headers say: bytes and tensors, and each dtype's bytes."""

    bytes: int
    tensors: int
    dtypes: dict[str, int]


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """The header's JSON and where the data begins; ModelFileError when truncated or
    not a safetensors header."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(LENGTH_BYTES)
        if len(head) < LENGTH_BYTES:
            raise ModelFileError(
                f"{path}: truncated safetensors header: {len(head)} of its 8 length bytes"
            )
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER:
            raise ModelFileError(f"{path}: not a safetensors file (a header of {length} bytes)")
        if LENGTH_BYTES + length > size:
            raise ModelFileError(
                f"{path}: truncated safetensors header: it announces {length} bytes of JSON, "
                f"the file holds {size - LENGTH_BYTES} after the length"
            )
        raw = fh.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(
            f"{path}: not a safetensors file: its header is not JSON ({exc})"
        ) from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: not a safetensors file: its header is not a JSON object")
    return header, LENGTH_BYTES + length


def _span(path: Path, name: str, entry: Any) -> tuple[str, int, int]:
    """A tensor's dtype and its ``[begin, end)``; ModelFileError when malformed."""
    offsets: Any = entry.get("data_offsets") if isinstance(entry, dict) else None
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise ModelFileError(f"{path}: tensor {name!r} has no [begin, end] data_offsets")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise ModelFileError(f"{path}: tensor {name!r}: data_offsets {offsets} run backwards")
    return str(entry.get("dtype", "?")), begin, end


def _sums(path: Path) -> HeaderSums:
    """One file's tensor bytes, checked against the file's length."""
    header, data_start = _header(path)
    total, tensors, last = 0, 0, 0
    dtypes: dict[str, int] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, begin, end = _span(path, name, entry)
        total += end - begin
        tensors += 1
        last = max(last, end)
        dtypes[dtype] = dtypes.get(dtype, 0) + end - begin
    size = path.stat().st_size
    if data_start + last > size:
        raise ModelFileError(
            f"{path}: truncated: its tensors end at byte {data_start + last}, the file has {size}"
        )
    return HeaderSums(total, tensors, dtypes)


def read_headers(paths: list[Path]) -> HeaderSums:
    """The sums over ``paths`` (the shards of one model)."""
    total, tensors = 0, 0
    dtypes: dict[str, int] = {}
    for path in paths:
        one = _sums(path)
        total += one.bytes
        tensors += one.tensors
        for dtype, size in one.dtypes.items():
            dtypes[dtype] = dtypes.get(dtype, 0) + size
    return HeaderSums(total, tensors, dtypes)
