"""``vramctl validate``'s answer, without typer: what the typer command (``check``) and
the quick path (``quick``) both run. :func:`validate_code` checks the manifest set, each
serve's ``[serve.model]`` against its files (only where one declares it), warns of
router tiers without a router, prints the answer and gives the exit code. Its lines
are written as they are where rich would print them so (``plain``), so rich is loaded
only where it changes what is printed.

A renderer: the checks are the manifest model's and ``controller.service.model_estimates``'.
Must not import typer, the manifest model, rich, the core, the server, Docker or HTTP
libraries at import time; ``model_estimates`` (model files, compose flags) is imported
only when a serve declares a model.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.interfaces.cli.plain import (
    ExitCodeError,
    _lazy,
    _print_json,
    as_is,
    error,
    load_set,
    warn,
)

if TYPE_CHECKING:
    from controller.interfaces import render
    from controller.manifest import LocatedError, ManifestSet
    from statemachine.domain.types import DesiredState
else:
    render = _lazy("controller.interfaces.render")

Models = dict[str, Any]


def validate_code(
    manifest: list[Path], *, json_out: bool, router_url: str | None, strict: bool
) -> int:
    """Check the set and print the answer: 0 when valid, 1 when not."""
    try:
        _validate(manifest, json_out=json_out, router_url=router_url, strict=strict)
    except ExitCodeError as stop:
        return stop.code
    return 0


def _validate(
    manifest: list[Path], *, json_out: bool, router_url: str | None, strict: bool
) -> None:
    from statemachine.planning.router_tiers import no_router_warning, router_tiers

    mset = load_set(manifest, strict=strict, json_out=json_out)
    desired = mset.desired()
    models, model_errors, hints = _models(mset)
    tiers = {} if router_url else router_tiers(desired)
    router_warnings = [no_router_warning(tiers)] if tiers else []
    for warning in router_warnings:
        warn(warning)
    for hint in hints:
        warn(f"hint: {hint}")
    if model_errors:
        _model_invalid(mset, model_errors, hints, models, json_out)
    if json_out:
        _print_json(_valid_json(mset, [*mset.warnings, *router_warnings], hints, models))
        return
    _validated(mset, desired, models)


def _validated(mset: ManifestSet, desired: DesiredState, models: Models) -> None:
    """The answer for a valid set: written as it is where rich would print it so (and no
    serve declares a model), else by ``render``."""
    from controller.interfaces.validated_text import VALID, validated_lines

    head, *roles = validated_lines(mset, desired)
    lines = [f"{VALID}{head}", *roles]
    if not models and all(as_is(sys.stdout, line) for line in lines):
        for line in lines:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        return
    render.validated(mset, desired)
    if models:
        from controller.interfaces.model_report import validate_lines

        for line in validate_lines(models):
            render.out.print(line)


def _models(mset: ManifestSet) -> tuple[Models, list[LocatedError], list[str]]:
    """Each model's entry, the errors and the hints (``model_estimates``); none read, and
    nothing imported for them, when no serve declares a ``[serve.model]``."""
    if all(rt.model is None for rt in mset.runtime().values()):
        return {}, [], []
    from controller.service.model_estimates import model_problems, serve_models

    models = serve_models(mset)
    model_errors, hints = model_problems(mset, models)
    return models, model_errors, hints


def _valid_json(
    mset: ManifestSet, warnings: list[str], hints: list[str], models: Models
) -> dict[str, Any]:
    """``validate --json``'s answer for a valid set."""
    desired = mset.desired()
    return {
        "valid": True,
        "files": [str(f) for f in mset.files],
        "digest": mset.digest,
        "gpu_roles": {
            r.id: {
                "capacity_mib": r.capacity_mib,
                "reserve_mib": r.reserve_mib,
                "budget_mib": r.budget_mib,
            }
            for r in desired.roles.values()
        },
        "serves": len(desired.serves),
        "warnings": warnings,
        "hints": hints,
        "models": models,
    }


def _model_invalid(
    mset: ManifestSet,
    errors: list[LocatedError],
    hints: list[str],
    models: Models,
    json_out: bool,
) -> None:
    """ExitCodeError 1 on the models' errors: each on stderr, and with --json the answer."""
    for err in errors:
        error(str(err))
    if json_out:
        _print_json(
            {
                "valid": False,
                "files": [str(f) for f in mset.files],
                "errors": [err.to_json() for err in errors],
                "warnings": mset.warnings,
                "hints": hints,
                "models": models,
            }
        )
    raise ExitCodeError(1)
