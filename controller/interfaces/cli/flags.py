"""The engine flags that enforce the reservations: ``render`` (SERVE's flags, their
arithmetic on stderr) and ``lint`` (do the compose files' engine flags enforce them?).

Renderers of :mod:`controller.tools.compose_lint` and ``statemachine.flags.fraction``;
they read the compose files, never change them. (Not named ``render``: each command
module binds that name to :mod:`controller.interfaces.render`.) Must not import the
manifest model, rich, the core, the server, Docker or HTTP libraries at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from controller.interfaces.cli.common import _fail, _load, _observe
from controller.interfaces.cli.options import (
    ComposeOpt,
    DeviceTotalOpt,
    JsonOpt,
    ManifestOpt,
    ObservedOpt,
    RenderEngineOpt,
    RenderServeArg,
    ToleranceOpt,
    UseEnvOpt,
)
from controller.interfaces.cli.plain import _lazy, _print_json
from controller.interfaces.cli.typer_app import _command

if TYPE_CHECKING:
    from controller.interfaces import render
    from controller.manifest import ManifestSet
    from controller.tools.compose_lint import RenderedServe
else:
    render = _lazy("controller.interfaces.render")


def _measured_totals(observed: Path | None, mset: ManifestSet) -> dict[str, int] | None:
    """NVML device totals by role id from an observed snapshot; None without one."""
    from statemachine.flags.fraction import measured_totals

    if observed is None:
        return None
    gpus = _observe(observed, mset).to_observed().gpus
    return measured_totals(mset.desired().roles, gpus)


@_command(
    "Print the engine flag that enforces SERVE's reservation.", "render"
)  # not `def render`: that would shadow the `render` module
def render_cmd(
    serve: RenderServeArg,
    manifest: ManifestOpt = [],  # noqa: B006
    compose: ComposeOpt = [],  # noqa: B006
    engine: RenderEngineOpt = None,
    device_total: DeviceTotalOpt = None,
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Print the engine flag that enforces SERVE's reservation (docs/limits.md), and with
    [serve.model] its engine's limit flags (docs/sizing.md); the arithmetic on stderr.

    Exit 0 with the flags, 1 when there is none (no reservation, an engine without a
    memory-fraction or limit flag, no device total), when the model cannot load in the
    reservation, or on errors.
    """
    from controller.service.model_estimates import limit_inputs
    from controller.tools.compose_lint import ComposeError, render_serve
    from statemachine.flags.fraction import SOURCE_NVML

    mset = _load(manifest)
    if serve not in mset.serves:
        _fail(render.unknown_serve(serve, mset.desired()))
    measured: dict[str, int] | None = None
    source = SOURCE_NVML
    if device_total is not None:
        measured = dict.fromkeys(mset.serves[serve].roles, device_total)
        source = "--device-total"
    else:
        measured = _measured_totals(observed, mset)
    try:
        answer = render_serve(
            mset,
            serve,
            measured=measured,
            measured_source=source,
            engine=engine,
            compose_paths=compose,
            models=limit_inputs(mset, [serve]),
        )
    except ComposeError as exc:
        for problem in exc.problems:
            render.error(problem)
        raise typer.Exit(1) from None
    # the engine's fraction flag, where it has one, is needed as before
    unfit = answer.result.flag is not None and answer.result.text is None
    rendered = bool(answer.argv) and not answer.cannot_load and not unfit
    now = _start_values(mset, serve, observed) if answer.result.of_free else None
    if json_out:
        _print_json(answer.to_json() if now is None else {**answer.to_json(), "at_start": now})
    elif not rendered:
        problems = [str(answer.result.problem)] if unfit or not answer.argv else []
        problems += [f"{x.flag.name}: {x.explanation}" for x in answer.refused]
        if not answer.refused and answer.verdict is not None and answer.verdict.error:
            problems.append(answer.verdict.message)
        for problem in problems:
            render.error(f"{serve}: {problem}")
    else:
        _render_flags(answer)
        if now is not None:
            render.err.print(f"at a start on the observed host: {now['text']}", markup=False)
    raise typer.Exit(0 if rendered else 1)


def _start_values(mset: ManifestSet, serve: str, observed: Path | None) -> dict[str, Any] | None:
    """What a start of ``serve`` would set now on the host ``observed`` saw
    (``VRAMCTL_FREE_MIB``, ``VRAMCTL_FRACTION_OF_FREE``: statemachine/ledger/gpu_vars.py), the
    others counted as the ledger counts them; ``None`` without an observation."""
    from statemachine.ledger.gpu_vars import free_at_start, gpu_placement
    from statemachine.ledger.reservations import ledger_from_observed

    if observed is None:
        return None
    obs = _observe(observed, mset).to_observed()
    desired = mset.desired()
    spec = desired.serves[serve]
    roles = spec.gpu_roles
    free = free_at_start(roles, serve, ledger_from_observed(desired, obs), desired.roles, obs.gpus)
    placed = gpu_placement(roles, desired.roles, obs.gpus, free=free, vram_mib=spec.vram_mib)
    names = ("VRAMCTL_FREE_MIB", "VRAMCTL_FRACTION_OF_FREE")
    values = {n: placed.values.get(n) for n in names}
    said = "; ".join(
        f"{n}={v}" if v is not None else f"{n} unknown: {placed.unknown[n]}"
        for n, v in values.items()
    )
    return {**values, "text": f"{said} (vram_mib {spec.vram_mib} ÷ the MiB free)"}


def _render_flags(answer: RenderedServe) -> None:
    """``render``'s answer: the flags on stdout, their arithmetic on stderr (a limit
    whose value is unknown is said so, never 0)."""
    result, needs = answer.result, answer.sleep
    flags = " ".join(needs.flags) if needs is not None else ""
    render.out.print(" ".join(w for w in (*answer.argv, flags) if w), markup=False)
    if result.text is not None:
        render.err.print(result.explanation, markup=False)
    for limit in answer.limits:
        value = "unknown" if limit.value is None else str(limit.value)
        render.err.print(f"{limit.flag.name} {value}: {limit.explanation}", markup=False)
    if answer.cache_types is not None:
        cache = answer.cache_types
        render.err.print(f"{' '.join(cache.argv)}: {cache.explanation}", markup=False)
    if answer.elastic is not None:
        render.err.print(f"elastic: {answer.elastic.explanation}", markup=False)
    if needs is not None:
        env = " ".join(f"{k}={v}" for k, v in sorted(needs.env.items()))
        render.err.print(
            f"[serve.sleep]: the engine's sleep API needs {needs.text}"
            + (f" (set {env} in its environment)" if env else ""),
            markup=False,
        )


@_command("Check the compose files' engine memory flags.")
def lint(
    manifest: ManifestOpt = [],  # noqa: B006
    compose: ComposeOpt = [],  # noqa: B006
    tolerance: ToleranceOpt = 0.001,
    observed: ObservedOpt = None,
    use_env: UseEnvOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Do the compose files' engine flags enforce the reservations? Exit 0 clean, 1 not.

    Errors: a serve whose command lacks its engine's memory-fraction flag or sets a
    fraction off its reservation by more than the tolerance. Notes explain the rest.
    """
    import os
    from decimal import Decimal

    from controller.service.model_estimates import limit_inputs
    from controller.tools.compose_lint import ComposeError, lint_compose, report_lines

    mset = _load(manifest)
    if not compose:
        _fail("no compose file given: pass --compose FILE (repeat to merge several)")
    try:
        report = lint_compose(
            mset,
            compose,
            measured=_measured_totals(observed, mset),
            tolerance=Decimal(str(tolerance)),
            environ=dict(os.environ) if use_env else None,
            models=limit_inputs(mset),
        )
    except ComposeError as exc:
        for problem in exc.problems:
            render.error(problem)
        raise typer.Exit(1) from None
    if json_out:
        _print_json(report.to_json())
    else:
        for line in report_lines(report):
            render.out.print(line, markup=False)
    raise typer.Exit(0 if report.ok else 1)
