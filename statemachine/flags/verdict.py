"""One answer to "can this serve's model load in its reservation?" (docs/sizing.md, "One
verdict"), given by ``validate``, ``render``, ``fit`` and ``status`` alike.

:func:`load_verdict` reads the engine's limit flags for the reservation
(:func:`statemachine.flags.model_limits.render_limits`, the engine's own arithmetic): a refused
limit is "cannot load" with its terms; a limit that holds the engine to the reservation
(vLLM's fitted context, llama.cpp's layers on the GPU) makes the serve valid, with a note
saying what runs where; without such a limit (an engine that has none, or a limit
unknown), the plain comparison of weights + KV cache with the reservation, in bytes
(:func:`statemachine.sizing.model_fit.check_reservation`).

Pure: figures in, a frozen answer out; no I/O, nothing from ``controller``.
"""

from __future__ import annotations

from dataclasses import replace

from statemachine.engines.spec import Engine, LimitKind
from statemachine.flags.model_limits import Limit, ModelInput, render_limits
from statemachine.sizing.kv_layout import engine_kv_term
from statemachine.sizing.model_fit import (
    CANNOT_LOAD,
    OK,
    ModelTerms,
    ReservationCheck,
    check_reservation,
)

__all__ = ["load_verdict", "model_terms"]

#: the limits that hold the engine's weights and KV cache to the reservation
_HOLDING = frozenset({LimitKind.MAX_CONTEXT, LimitKind.GPU_LAYERS})


def model_terms(model: ModelInput, gpus: int, engine: Engine | None = None) -> ModelTerms:
    """The weights and the KV cache at the serve's context (its declared one, else the
    model's own), on ``gpus`` roles, the cache as ``engine`` lays it out where it has a
    layout (:func:`statemachine.sizing.kv_layout.engine_kv_term`, what ``estimate --engine``
    counts): what the plain comparison weighs."""
    context = model.context if model.context is not None else model.arch.context_length
    if context is None:
        return ModelTerms(model.weights.bytes, None, gpus, kv_reason="the files give no context")
    laid = None
    if engine is not None:
        laid = engine_kv_term(
            model.arch,
            context=context,
            kv_dtype=model.kv_dtype,
            parallel=model.parallel,
            layout=engine.kv_layout,
        )
    kv = laid or model.kv(context)
    return ModelTerms(model.weights.bytes, kv.bytes, gpus, kv.formula, kv.reason)


def _note(limit: Limit, layers: int) -> str:
    """What a holding limit makes of the serve: where its layers run, or its context."""
    value = limit.value
    assert value is not None
    if limit.flag.kind is LimitKind.GPU_LAYERS and limit.all_at is None:
        return (
            f"loads partly on the GPU: {limit.flag.name} {value} puts the output layer and "
            f"the last {value - 1} of {layers} layers there, the other {layers - value + 1} "
            "run on the CPU"
        )
    if limit.flag.kind is LimitKind.GPU_LAYERS:
        return f"{limit.flag.name} {value}: every layer on the GPU"
    return f"{limit.flag.name} {value}: the longest context that fits"


def load_verdict(
    engine: Engine | None,
    vram_mib: int,
    terms: ModelTerms,
    model: ModelInput,
    *,
    gpus: int,
    flag_budget: tuple[int, str] | None = None,
) -> ReservationCheck:
    """The verdict on ``model`` in ``vram_mib`` (on each of ``gpus`` roles) under
    ``engine`` (``None``: unknown), ``terms`` its weights and KV cache at the serve's
    context; ``flag_budget`` what the engine's memory flag gives it on one GPU."""
    base = check_reservation(vram_mib, terms)
    limits = render_limits(engine, vram_mib, model, gpus=gpus, flag_budget=flag_budget)
    refused = next((limit for limit in limits if limit.refused), None)
    if refused is not None:
        message = f"{refused.flag.name}: {refused.explanation}"
        return replace(base, verdict=CANNOT_LOAD, message=message)
    holding = [x for x in limits if x.value is not None and x.flag.kind in _HOLDING]
    if not holding:
        return base
    notes = "; ".join(_note(limit, model.arch.layers) for limit in holding)
    if base.verdict == OK:
        return replace(base, note=notes)
    whole = (
        f"weights + KV cache at the serve's context, {terms.known_mib} MiB, would not fit "
        f"vram_mib {vram_mib}"
        if base.verdict == CANNOT_LOAD
        else terms.kv_text()
    )
    return replace(base, verdict=OK, message=f"{notes} ({whole})", shortfall_mib=None, note=notes)
