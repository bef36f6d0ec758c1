"""Files the tests write: a manifest read as the controller reads it, a Compose file of
given services, any dedented text.

Nothing here checks what was written or read; the tests do.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from controller.manifest import ManifestSet, load_manifest_set


def write(tmp_path: Path, name: str, text: str) -> Path:
    """``text``, dedented and without its leading blank lines, as ``tmp_path/name``."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def manifest(tmp_path: Path, text: str) -> ManifestSet:
    """The manifest set of ``text`` written as ``tmp_path/serves.toml``."""
    return load_manifest_set([write(tmp_path, "serves.toml", text)])


def compose(tmp_path: Path, services: str, name: str = "docker-compose.yml") -> Path:
    """A Compose file of project ``stack`` with ``services`` (YAML, dedented)."""
    return write(
        tmp_path,
        name,
        "name: stack\nservices:\n"
        + textwrap.indent(textwrap.dedent(services).strip(), "  ")
        + "\n",
    )
