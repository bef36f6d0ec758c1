"""Each serve's model estimate, from its ``[serve.model]`` (docs/sizing.md).

:func:`serve_estimate` reads a serve's model files (``controller.adapters.model_files``)
and gives ``statemachine.sizing.needs``'s estimate for the context, cache dtype and parallel
sequences the manifest declares, or a :class:`ModelUnreadable` naming the file: never an
exception, so ``status``, ``fit`` and the page keep answering when a model folder is not
mounted yet. Answers are cached by the path and the modification times of what is read
(the file or folder, its entries, the ``config.json`` beside a file), so a status or a
page polled every second reads headers only when the files change.
:func:`serve_models` gives every serve's entry as the answers print it
(``statemachine.sizing.model_fit``'s check and figures); :func:`limit_inputs` gives ``render`` and
``lint --compose`` the same figures as ``statemachine.flags.model_limits``'s inputs.

This module must not decide anything (the comparisons are ``statemachine.sizing.model_fit``'s)
nor write a file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.adapters.model_files import ModelFileError, read_model
from controller.manifest import LocatedError, ManifestSet
from controller.manifest.runtime import ModelRef
from controller.tools.compose_lint import serve_flag_budget
from statemachine import engines
from statemachine.domain.types import ServeSpec
from statemachine.engines.spec import Engine
from statemachine.flags.model_limits import Model, ModelInput
from statemachine.flags.verdict import load_verdict
from statemachine.sizing import needs as sizing
from statemachine.sizing.kv_layout import engine_kv_term
from statemachine.sizing.model_fit import ModelTerms, calibrate_verdict

__all__ = [
    "ModelUnreadable",
    "limit_inputs",
    "model_problems",
    "serve_estimate",
    "serve_models",
    "terms_of",
]


@dataclass(frozen=True, slots=True)
class ModelUnreadable:
    """A model whose files cannot be read: ``message`` names the file (and the key)."""

    path: Path
    message: str


Entry = dict[str, Any]
_Key = tuple[str, int | None, str, int, str | None, tuple[tuple[str, int, int], ...]]
_CACHE: dict[_Key, sizing.Estimate | ModelUnreadable] = {}
_LOCK = threading.Lock()
_MAX_CACHED = 256


def _stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What the answer depends on: name, mtime and size of the path, of a folder's
    entries, and of the ``config.json`` beside a file (missing ones left out)."""
    paths = [path]
    if path.is_dir():
        paths += sorted(path.iterdir())
    else:
        paths.append(path.with_name("config.json"))
    out: list[tuple[str, int, int]] = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((p.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _read(ref: ModelRef, engine: Engine | None) -> sizing.Estimate | ModelUnreadable:
    """The estimate of ``ref``'s files, read now, the KV cache as ``engine`` lays it out
    (where it has a layout: what ``vramctl estimate --engine`` counts)."""
    try:
        files = read_model(ref.path)
    except ModelFileError as exc:
        return ModelUnreadable(ref.path, str(exc))
    laid = None
    if engine is not None:
        laid = engine_kv_term(
            files.architecture,
            context=ref.context,
            kv_dtype=ref.kv_dtype,
            parallel=ref.parallel,
            layout=engine.kv_layout,
        )
    return sizing.estimate(
        str(ref.path),
        files.format,
        files.weights,
        files.architecture,
        context=ref.context,
        kv_dtype=ref.kv_dtype,
        parallel=ref.parallel,
        kv=laid,
    )


def serve_estimate(
    ref: ModelRef, engine: Engine | None = None
) -> sizing.Estimate | ModelUnreadable:
    """The estimate of a serve's ``[serve.model]`` run by ``engine`` (``None``: unknown, the
    plain formula), cached while its files are unchanged."""
    name = None if engine is None else engine.name
    try:
        key: _Key = (str(ref.path), ref.context, ref.kv_dtype, ref.parallel, name, _stamp(ref.path))
    except OSError as exc:
        return ModelUnreadable(ref.path, f"{ref.path}: cannot be read ({exc.strerror})")
    with _LOCK:
        found = _CACHE.get(key)
    if found is not None:
        return found
    answer = _read(ref, engine)
    with _LOCK:
        if len(_CACHE) >= _MAX_CACHED:
            _CACHE.clear()
        _CACHE[key] = answer
    return answer


def terms_of(est: sizing.Estimate, roles: int) -> ModelTerms:
    """The figures ``statemachine.sizing.model_fit`` compares, for a serve on ``roles`` GPU
    roles."""
    return ModelTerms(
        weights_bytes=est.weights.bytes,
        kv_bytes=est.kv.bytes,
        roles=max(1, roles),
        formula=est.kv.formula,
        kv_reason=est.kv.reason,
    )


def _summary(est: sizing.Estimate, terms: ModelTerms) -> dict[str, Any]:
    """The estimate's figures as the answers carry them (``null`` where unknown)."""
    return {
        "weights_bytes": est.weights.bytes,
        "kv_cache_bytes": est.kv.bytes,
        "at_least_bytes": est.at_least_bytes,
        "weights_mib": terms.weights_mib,
        "kv_cache_mib": terms.kv_mib,
        "known_mib": terms.known_mib,
        "roles": terms.roles,
        "context_used": est.context,
        "formula": est.kv.formula,
        "unknown": est.unknown(),
    }


@dataclass(frozen=True, slots=True)
class _Engine:
    """What the verdict needs of a serve's engine: the engine (``None``: not one the
    registry knows) and what its memory flag gives it on one GPU."""

    engine: Engine | None
    budget: tuple[int, str] | None


def _entry(
    ref: ModelRef, spec: ServeSpec, measured: Mapping[str, int | None] | None, eng: _Engine
) -> Entry:
    """One serve's model entry: what it declares, the estimate's terms, the check (the
    one verdict, :func:`statemachine.flags.verdict.load_verdict`), and with ``measured`` the
    measured footprint and the calibration verdict."""
    out: Entry = {
        "path": str(ref.path),
        "context": ref.context,
        "kv_dtype": ref.kv_dtype,
        "parallel": ref.parallel,
        "vram_mib": spec.vram_mib,
    }
    est = serve_estimate(ref, eng.engine)
    cards = 1 if spec.placement else len(spec.gpu_roles)  # a placed serve holds one card
    terms = None if isinstance(est, ModelUnreadable) else terms_of(est, cards)
    if measured is not None:
        got = measured.get(spec.name)
        out["measured_mib"] = got
        out["calibration"] = calibrate_verdict(spec.vram_mib, terms, got).to_json()
    if isinstance(est, ModelUnreadable) or terms is None:
        error = est.message if isinstance(est, ModelUnreadable) else "no estimate"
        return {**out, "error": error, "estimate": None, "check": None}
    check = None
    if spec.vram_mib is not None and spec.gpu_roles:
        model = ModelInput(est.weights, est.architecture, ref.context, ref.kv_dtype, ref.parallel)
        verdict = load_verdict(
            eng.engine, spec.vram_mib, terms, model, gpus=cards, flag_budget=eng.budget
        )
        check = verdict.to_json()
    return {**out, "error": None, "estimate": _summary(est, terms), "check": check}


def serve_models(
    mset: ManifestSet, measured: Mapping[str, int | None] | None = None
) -> dict[str, Entry]:
    """Each serve that declares a ``[serve.model]``: its entry (``error`` naming the file
    when it cannot be read; ``check`` ``null`` without a reservation on a GPU role).
    With ``measured`` (serve -> measured footprint MiB, ``None``: none), each entry also
    has ``measured_mib`` and ``calibration`` (``statemachine.sizing.model_fit``'s verdict)."""
    desired = mset.desired()
    out: dict[str, Entry] = {}
    for name, rt in mset.runtime().items():
        if rt.model is not None and name in desired.serves:
            eng = _Engine(engines.lookup(mset.serves[name].engine), serve_flag_budget(mset, name))
            out[name] = _entry(rt.model, desired.serves[name], measured, eng)
    return out


def model_problems(
    mset: ManifestSet, models: Mapping[str, Entry]
) -> tuple[list[LocatedError], list[str]]:
    """``validate``'s errors (a model that cannot be read, at ``model.path``; a serve that
    cannot load in its reservation, at ``vram_mib``) and hints (a reservation above the
    bound), each located by file and serve, from :func:`serve_models`' ``models``."""
    errors: list[LocatedError] = []
    hints: list[str] = []
    for name, entry in models.items():
        file = str(mset.source(name))
        if entry["error"] is not None:
            errors.append(LocatedError(file, name, "model.path", entry["error"]))
            continue
        check = entry["check"]
        if check is None:
            continue
        if check["verdict"] == "cannot_load":
            errors.append(LocatedError(file, name, "vram_mib", check["message"]))
        elif check["verdict"] == "oversized":
            hints.append(str(LocatedError(file, name, "vram_mib", check["message"])))
    return errors, hints


def limit_inputs(mset: ManifestSet, names: Iterable[str] | None = None) -> dict[str, Model]:
    """Serve name → what its limit flags are computed from (or why that is unknown), for
    ``names`` (default: every serve) that declare ``[serve.model]``."""
    runtime = mset.runtime()
    out: dict[str, Model] = {}
    for name in mset.serves if names is None else names:
        ref = runtime[name].model
        if ref is None:
            continue
        est = serve_estimate(ref)
        out[name] = (
            est.message
            if isinstance(est, ModelUnreadable)
            else ModelInput(est.weights, est.architecture, ref.context, ref.kv_dtype, ref.parallel)
        )
    return out
