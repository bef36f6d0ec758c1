"""The manifest's JSON Schema, generated from the pydantic models in controller.manifest.

``python -m controller.manifest.schema`` (re)writes ``manifests/vramctl-manifest.schema.json``
so editors (Taplo / Even Better TOML, ...) can validate manifests; ``--check`` only
compares and exits 1 when the file on disk is stale. The schema describes the types and
single-field constraints; rules across fields and files are the loader's.

This module only renders the schema and writes that one file; it reads no manifest and
touches nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.manifest import ManifestFile

#: Where the generated schema lives in the repository.
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "manifests" / "vramctl-manifest.schema.json"

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _drop_null_defaults(node: Any) -> Any:
    """TOML has no null: an optional field's ``"default": null`` only confuses editors."""
    if isinstance(node, dict):
        return {
            key: _drop_null_defaults(value)
            for key, value in node.items()
            if not (key == "default" and value is None)
        }
    if isinstance(node, list):
        return [_drop_null_defaults(item) for item in node]
    return node


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of one manifest file (a dict, ready for ``json.dumps``)."""
    schema: dict[str, Any] = {"$schema": JSON_SCHEMA_DIALECT}
    schema.update(_drop_null_defaults(ManifestFile.model_json_schema(mode="validation")))
    return schema


def render_schema() -> str:
    """The schema file's exact text: sorted keys, indent 2, trailing newline."""
    return json.dumps(manifest_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the schema file; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m controller.manifest.schema", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=SCHEMA_PATH, help="where to write")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the file differs; write nothing"
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    text = render_schema()
    if args.check:
        try:
            current = out.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            print(
                f"{out} is stale; regenerate with: python -m controller.manifest.schema",
                file=sys.stderr,
            )
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
