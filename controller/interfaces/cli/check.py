"""``vramctl validate``: check a manifest set, every error located by file, entry and
field, and each serve's ``[serve.model]`` against its files.

A renderer: the checks are the manifest model's and ``controller.service.model_estimates``'.
Must not import the manifest model, rich, the core, the server, Docker or HTTP
libraries at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer

from controller.interfaces.cli.app import _command, _lazy
from controller.interfaces.cli.common import _load, _print_json
from controller.interfaces.cli.options import (
    JsonOpt,
    ManifestOpt,
    StrictOpt,
    ValidateRouterUrlOpt,
)

if TYPE_CHECKING:
    from controller.interfaces import render
    from controller.manifest import ManifestSet
else:
    render = _lazy("controller.interfaces.render")


@_command("Check a manifest set and say where it is wrong.")
def validate(
    manifest: ManifestOpt = [],  # noqa: B006
    json_out: JsonOpt = False,
    router_url: ValidateRouterUrlOpt = None,
    strict: StrictOpt = False,
) -> None:
    """Check a manifest set: every error located by file, entry and field.

    A serve with a [serve.model] is checked against its model's files: one that cannot
    be read (model.path), or whose vram_mib is below its weights + KV cache, is an
    error; a vram_mib above them by more than 25 % + 2 GiB is a hint (docs/sizing.md).

    Exit 0 when valid, 1 when not (the errors on stderr, and with --json in the answer).
    """
    from controller.service.model_estimates import model_problems, serve_models
    from statemachine.admission import no_router_warning, router_tiers

    mset = _load(manifest, strict=strict, json_out=json_out)
    desired = mset.desired()
    models = serve_models(mset)
    model_errors, hints = model_problems(mset, models)
    tiers = {} if router_url else router_tiers(desired)
    router_warnings = [no_router_warning(tiers)] if tiers else []
    for warning in router_warnings:
        render.warn(warning)
    for hint in hints:
        render.warn(f"hint: {hint}")
    if model_errors:
        _model_invalid(mset, model_errors, hints, models, json_out)
    if json_out:
        _print_json(_valid_json(mset, [*mset.warnings, *router_warnings], hints, models))
        return
    render.validated(mset, desired)
    if models:
        from controller.interfaces.model_report import validate_lines

        for line in validate_lines(models):
            render.out.print(line)


def _valid_json(
    mset: ManifestSet, warnings: list[str], hints: list[str], models: dict[str, Any]
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
    errors: list[Any],
    hints: list[str],
    models: dict[str, Any],
    json_out: bool,
) -> NoReturn:
    """Exit 1 on the models' errors: each on stderr, and with --json the answer."""
    for err in errors:
        render.error(str(err))
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
    raise typer.Exit(1)
