"""Reading a model's files for ``vramctl estimate`` (docs/sizing.md): GGUF and safetensors.

:func:`read_model` takes a path as the operator gives it — a ``.gguf`` file (the first
of a split model), a ``.safetensors`` file, a folder of safetensors shards, or a
``model.safetensors.index.json`` — and returns the tensors' bytes (:class:`Weights`) and
the architecture the KV cache depends on (:class:`Architecture`), from the files'
headers and metadata alone: no tensor is read. A path that is missing, of another
format, truncated, or whose config lacks a figure raises :class:`ModelFileError`, the
file (and the key) named.

Only this package imports ``gguf`` (the ``model files`` contract of ``lint-imports``),
lazily, so a command that estimates nothing loads neither it nor numpy. It must not
compute the estimate: ``statemachine.sizing.needs`` does, from what this returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from controller.adapters.model_files.common import ModelFileError
from controller.adapters.model_files.gguf_file import read_gguf
from controller.adapters.model_files.hf_config import read_config
from controller.adapters.model_files.safetensors_file import read_headers
from statemachine.sizing.needs import Architecture, Weights

__all__ = ["ModelFileError", "ModelFiles", "read_model"]

GGUF_MAGIC = b"GGUF"
INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """What a model's files say: their format (``gguf``, ``safetensors``), the weights
    and the architecture."""

    format: str
    weights: Weights
    architecture: Architecture


def _index_shards(index: Path) -> list[Path]:
    """The files a ``model.safetensors.index.json`` maps its tensors to, in order."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{index}: not JSON ({exc})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFileError(f"{index}: no weight_map naming the shards")
    shards = [index.with_name(str(name)) for name in sorted(set(weight_map.values()))]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise ModelFileError(f"{index}: its weight_map names missing files: {', '.join(missing)}")
    return shards


def _folder_shards(folder: Path) -> list[Path]:
    """A folder's shards: its index's, else every ``.safetensors`` file in it."""
    indexes = sorted(folder.glob(f"*{INDEX_SUFFIX}"))
    if indexes:
        return _index_shards(indexes[0])
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ModelFileError(
            f"{folder}: no .safetensors files nor {INDEX_SUFFIX} in this folder "
            "(for a GGUF model, give its .gguf file)"
        )
    return shards


def _safetensors(shards: list[Path], config: Path) -> ModelFiles:
    """The safetensors model made of ``shards``, described by ``config``."""
    sums = read_headers(shards)
    arch, dtype = read_config(config)
    kinds = ", ".join(sorted(sums.dtypes, key=lambda d: (-sums.dtypes[d], d)))
    named = f"{kinds} (config torch_dtype {dtype})" if dtype else kinds
    weights = Weights(sums.bytes, sums.tensors, tuple(str(s) for s in shards), named)
    return ModelFiles("safetensors", weights, arch)


def _magic(path: Path) -> bytes:
    with path.open("rb") as fh:
        return fh.read(len(GGUF_MAGIC))


def read_model(path: Path) -> ModelFiles:
    """The weights and architecture of the model at ``path``."""
    try:
        return _read(path)
    except OSError as exc:
        raise ModelFileError(f"{exc.filename or path}: cannot be read ({exc.strerror})") from None


def _read(path: Path) -> ModelFiles:
    """:func:`read_model`, an OSError left to it."""
    if not path.exists():
        raise ModelFileError(f"{path}: no such file or folder")
    if path.is_dir():
        return _safetensors(_folder_shards(path), path / "config.json")
    if path.name.endswith(INDEX_SUFFIX):
        return _safetensors(_index_shards(path), path.with_name("config.json"))
    if path.suffix == ".gguf" or _magic(path) == GGUF_MAGIC:
        weights, arch = read_gguf(path)
        return ModelFiles("gguf", weights, arch)
    if path.suffix == ".safetensors":
        return _safetensors([path], path.with_name("config.json"))
    raise ModelFileError(
        f"{path}: not a GGUF file (no GGUF magic) nor a .safetensors file, folder or {INDEX_SUFFIX}"
    )
