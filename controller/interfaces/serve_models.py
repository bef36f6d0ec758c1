"""The figures of the serves' ``[serve.model]`` for ``render`` and ``lint --compose``.

For each serve whose manifest declares ``[serve.model]``, its files are read
(:func:`controller.adapters.model_files.read_model`: headers and metadata, no tensor)
into a :class:`statemachine.enforce.ModelInput` with the serve's context, cache dtype and
parallel sequences; a model whose files cannot be read is the located reason instead, so
its limits are printed ``unknown``. A serve without ``[serve.model]`` is left out: it
keeps only its memory-fraction flag.

It must not compute a limit (``statemachine.enforce`` does) nor print anything.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.adapters.model_files import ModelFileError, read_model
from controller.manifest import ManifestSet
from statemachine.enforce import Model, ModelInput

__all__ = ["serve_models"]


def serve_models(mset: ManifestSet, names: Iterable[str] | None = None) -> dict[str, Model]:
    """Serve name → its model's figures (or why they are unknown), for ``names`` (default:
    every serve) that declare ``[serve.model]``."""
    runtime = mset.runtime()
    out: dict[str, Model] = {}
    for name in mset.serves if names is None else names:
        ref = runtime[name].model
        if ref is None:
            continue
        try:
            files = read_model(ref.path)
        except ModelFileError as exc:
            out[name] = str(exc)
            continue
        out[name] = ModelInput(
            files.weights, files.architecture, ref.context, ref.kv_dtype, ref.parallel
        )
    return out
