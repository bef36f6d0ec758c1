"""The manifest rule tables' helpers: TOML pieces (card roles, one ``[[serve]]`` table),
files written from them, and the located errors their loading gives, compared with the
expected ones.

Shared by the manifest's rule tests; the expectations stay in those tests.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.manifest import LocatedError, ManifestError, load_manifest_set

ROLES = """
[[gpu_roles]]
id = "a"
vram_mib = 1000
reserve_mib = 100

[[gpu_roles]]
id = "b"
vram_mib = 1000
"""


def serve(body: str = "", name: str | None = "s1", container: str | None = "c1") -> str:
    """One [[serve]] table with ``name``/``container`` (omitted when None) and ``body``."""
    lines = ["", "[[serve]]"]
    if name is not None:
        lines.append(f"name = {json.dumps(name)}")
    if container is not None:
        lines.append(f"container = {json.dumps(container)}")
    return "\n".join(lines) + "\n" + textwrap.dedent(body).strip() + "\n"


@dataclass(frozen=True)
class Expect:
    """One expected located error: entry label, field, words in the message, file name."""

    where: str | None
    field: str | None
    words: tuple[str, ...]
    file: str = "serves.toml"


def write(tmp_path: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` (name → TOML text) under ``tmp_path``; their paths, in order."""
    paths = []
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def errors_of(paths: list[Path]) -> list[LocatedError]:
    """The located errors of loading ``paths``; fails when they load."""
    with pytest.raises(ManifestError) as info:
        load_manifest_set(paths)
    assert info.value.errors, "a ManifestError must carry errors"
    assert str(info.value) == "\n".join(str(e) for e in info.value.errors)
    return info.value.errors


def check(errors: list[LocatedError], expected: tuple[Expect, ...]) -> None:
    """Every expected error is present (and nothing else), and reads well as a line."""
    shown = "\n".join(str(e) for e in errors)
    assert len(errors) == len(expected), f"expected {len(expected)} errors, got:\n{shown}"
    for want in expected:
        matches = [
            e
            for e in errors
            if Path(e.file).name == want.file
            and e.where == want.where
            and e.field == want.field
            and all(word in e.message for word in want.words)
        ]
        assert matches, f"no error like {want} in:\n{shown}"
        line = str(matches[0])
        assert want.file in line
        if want.where is not None:
            assert want.where in line
        if want.field is not None:
            assert f": {want.field}: " in line
