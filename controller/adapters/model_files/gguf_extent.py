"""How far a GGUF file must go, from its own header: what a truncated file lacks.

``gguf``'s reader memory-maps the file and fails on one cut short with numpy's words
(``cannot reshape array of size 44 into shape (64,32)``). Where it fails, this module
walks the header, the metadata and the tensor table as the GGUF format lays them out
(magic, version, counts; each key and its typed value; each tensor's name, dimensions,
type and offset; the data after them at ``general.alignment``), reading only the bytes
of those parts, and says where the file ends against where they say it must:
``truncated at byte N of M`` (the end of the last tensor's data), or ``of at least M``
where the cut falls inside the metadata or the tensor table (what follows is not known).

It reads no tensor data and computes no estimate; it does not judge a file that is
long enough (the reader's error stands then). It does not import ``gguf`` (only
``gguf_file`` does): the tensor types' block sizes are given to it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

__all__ = ["truncation"]

#: the fixed sizes of the GGUF value types (``GGUFValueType``): 0-7 and 10-12
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32
#: a tensor type (``GGMLQuantizationType``'s number) -> (elements per block, bytes per block)
Blocks = Mapping[int, tuple[int, int]]


class _Short(Exception):  # noqa: N818 (reads as what happened)
    """The file ends before ``need`` bytes, inside ``part``."""

    def __init__(self, need: int, part: str) -> None:
        super().__init__(part)
        self.need = need
        self.part = part


class _Cursor:
    """Reads the file's parts in order; :class:`_Short` where it ends too soon."""

    def __init__(self, handle: BinaryIO, size: int, order: str) -> None:
        self.handle, self.size, self.order, self.part = handle, size, order, "header"

    def skip(self, n: int) -> None:
        end = self.handle.tell() + n
        if end > self.size:
            raise _Short(end, self.part)
        self.handle.seek(end)

    def read(self, fmt: str) -> int:
        n = struct.calcsize(fmt)
        data = self.handle.read(n)
        if len(data) < n:
            raise _Short(self.handle.tell() - len(data) + n, self.part)
        return int(struct.unpack(self.order + fmt, data)[0])

    def string(self) -> bytes:
        n = self.read("Q")
        start = self.handle.tell()
        self.skip(n)
        self.handle.seek(start)
        return self.handle.read(n)


def _value(cur: _Cursor, kind: int) -> int | None:
    """Skip one value of type ``kind``; an integer value's figure (for the alignment)."""
    if kind == _STRING:
        cur.string()
    elif kind == _ARRAY:
        item, count = cur.read("I"), cur.read("Q")
        if item in _SIZES:
            cur.skip(_SIZES[item] * count)
        else:
            for _ in range(count):
                _value(cur, item)
    elif kind in (4, 5):
        return cur.read("i" if kind == 5 else "I")
    elif kind in _SIZES:
        cur.skip(_SIZES[kind])
    else:
        raise ValueError(f"unknown value type {kind}")
    return None


def _metadata(cur: _Cursor, count: int) -> int:
    """Walk ``count`` key-value pairs; the data's alignment they give."""
    cur.part, alignment = "metadata", _DEFAULT_ALIGNMENT
    for _ in range(count):
        key = cur.string()
        figure = _value(cur, cur.read("I"))
        if key == b"general.alignment" and figure:
            alignment = figure
    return alignment


def _tensors_end(cur: _Cursor, count: int, blocks: Blocks) -> int:
    """Walk the tensor table; where the last tensor's data ends, from the data's start."""
    cur.part, end = "tensor table", 0
    for _ in range(count):
        cur.string()
        elements = 1
        for _dim in range(cur.read("I")):
            elements *= cur.read("Q")
        block, size = blocks[cur.read("I")]
        end = max(end, cur.read("Q") + elements // block * size)
    return end


def _walk(handle: BinaryIO, size: int, blocks: Blocks) -> int | None:
    """The byte the file must reach (None: it is not a GGUF header this reads)."""
    magic = handle.read(4)
    if len(magic) < 4 and b"GGUF".startswith(magic):
        raise _Short(4, "header")
    if magic != b"GGUF":
        return None
    cur = _Cursor(handle, size, "<")
    version = cur.read("I")
    cur.order = ">" if version & 0xFFFF == 0 else "<"  # a big-endian file, as gguf reads it
    tensors, keys = cur.read("Q"), cur.read("Q")
    alignment = _metadata(cur, keys)
    end = _tensors_end(cur, tensors, blocks)
    start = -(-handle.tell() // alignment) * alignment
    return start + end


def truncation(path: Path, blocks: Blocks) -> str | None:
    """``PATH: truncated at byte N of M …`` when the GGUF file ``path`` ends before its
    header, metadata, tensor table or tensor data says it does; None when it does not
    (or its header cannot be walked: the reader's own error says more then).
    ``blocks``: each tensor type's elements per block and bytes per block."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            need = _walk(handle, size, blocks)
    except _Short as short:
        return (
            f"{path}: truncated at byte {size} of at least {short.need} (its {short.part} "
            "goes on past the end: a copy or download cut short?)"
        )
    except (OSError, ValueError, KeyError, struct.error, OverflowError):
        return None
    if need is None or need <= size:
        return None
    return (
        f"{path}: truncated at byte {size} of {need} (its tensor table puts the end of its "
        "data there: a copy or download cut short?)"
    )
