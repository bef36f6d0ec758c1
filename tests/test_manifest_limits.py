"""What a manifest may cost, and what it may say: every excess is a located error.

The loader bounds a manifest's size, its nesting and the time its parse may take,
refuses files that are not regular (a FIFO would block the process), and validates
values to what the runtime can carry out (finite, bounded timeouts; Docker's container
name rule; no NUL byte in an ``up`` argument). Each case checks the located error,
never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.manifest import LocatedError, ManifestError, load_manifest_set

ROLE = """
[[gpu_roles]]
id = "a"
vram_mib = 1000
"""


def serve(body: str = "", name: str = "s1", container: str = "c1") -> str:
    return f'\n[[serve]]\nname = "{name}"\ncontainer = "{container}"\n{body}\n'


def errors_of(path: Path) -> list[LocatedError]:
    with pytest.raises(ManifestError) as info:
        load_manifest_set([path])
    return info.value.errors


def test_non_utf8_bytes_are_located_by_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_bytes((ROLE + serve()).encode() + b'# caf\xe9 au lait\n')
    (err,) = errors_of(path)
    assert "not UTF-8 text" in err.message
    assert err.line == ROLE.count("\n") + serve().count("\n") + 1
    assert err.column == len("# caf") + 1
    assert str(err).startswith(f"{path}: line {err.line}, column {err.column}: not UTF-8")
