"""``vramctl estimate``: what a model needs, term by term, read from its files without
loading a tensor (``statemachine.sizing.needs``; printed by
:mod:`controller.interfaces.estimate_report`). Takes no manifest and observes nothing.

Must not import the manifest model, rich, the core, the server, Docker or HTTP
libraries at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from controller.interfaces.cli.common import _fail
from controller.interfaces.cli.options import (
    ContextOpt,
    EstimateEngineOpt,
    JsonOpt,
    KvDtypeOpt,
    ParallelOpt,
    PathArg,
)
from controller.interfaces.cli.plain import _lazy, _print_json
from controller.interfaces.cli.typer_app import _command

if TYPE_CHECKING:
    from controller.interfaces import render
else:
    render = _lazy("controller.interfaces.render")


@_command("What a model needs, term by term, read from its files.")
def estimate(
    path: PathArg,
    context: ContextOpt = None,
    kv_dtype: KvDtypeOpt = "f16",
    parallel: ParallelOpt = 1,
    engine: EstimateEngineOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What a model needs, term by term, read from its files without loading a tensor.

    Weights are the tensors' sizes; the KV cache is 2 × layers × KV heads × head_dim ×
    context × bytes per element × parallel; the CUDA context, activations, CUDA graphs
    and the engine's overheads are unknown (measure them with `vramctl calibrate`).
    Exit 0 with the estimate, 2 on bad input (a missing path, another format, a
    truncated file, a config.json without a figure).
    """
    from controller.adapters.model_files import ModelFileError, read_model
    from controller.interfaces.estimate_report import print_estimate
    from statemachine import engines
    from statemachine.sizing import needs as sizing
    from statemachine.sizing.kv_layout import engine_kv_term

    if kv_dtype not in sizing.KV_DTYPES:
        known = ", ".join(sizing.KV_DTYPES)
        raise typer.BadParameter(f"{kv_dtype!r}: one of {known}", param_hint="'--kv-dtype'")
    found = engines.lookup(engine)
    if engine is not None and found is None:
        known = ", ".join(engines.names())
        raise typer.BadParameter(f"no engine {engine!r}; known: {known}", param_hint="'--engine'")
    try:
        files = read_model(path)
    except ModelFileError as exc:
        _fail(str(exc), 2)
    layout_kv = None
    if found is not None:
        layout_kv = engine_kv_term(
            files.architecture,
            context=context,
            kv_dtype=kv_dtype,
            parallel=parallel,
            layout=found.kv_layout,
        )
    result = sizing.estimate(
        str(path),
        files.format,
        files.weights,
        files.architecture,
        context=context,
        kv_dtype=kv_dtype,
        parallel=parallel,
        engine=found,
        kv=layout_kv,
    )
    if json_out:
        _print_json(result.to_json())
        return
    print_estimate(result, render.out)
