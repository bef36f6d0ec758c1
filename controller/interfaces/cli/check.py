"""``vramctl validate``: check a manifest set, every error located by file, entry and
field, and each serve's ``[serve.model]`` against its files.

The command's options, help and exit; its answer is ``validating``'s (which the quick
path, ``quick``, runs without typer). Must not import the manifest model, rich, the
core, the server, Docker or HTTP libraries at import time.
"""

from __future__ import annotations

import typer

from controller.interfaces.cli.options import (
    JsonOpt,
    ManifestOpt,
    StrictOpt,
    ValidateRouterUrlOpt,
)
from controller.interfaces.cli.typer_app import _command
from controller.interfaces.cli.validating import validate_code


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
    code = validate_code(manifest, json_out=json_out, router_url=router_url, strict=strict)
    if code:
        raise typer.Exit(code)
