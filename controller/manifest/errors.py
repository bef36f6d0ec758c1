"""Located manifest errors: where (file, line, entry, field) and what.

``LocatedError`` is one problem; ``ManifestError`` carries them all. Messages quote
the offending value, shortened. No I/O.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Sequence
from typing import Any

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


# ── located errors ─────────────────────────────────────────────────────────────


def _show(value: object, limit: int = 120) -> str:
    """A value as the manifest author would write it (JSON ≈ TOML for scalars), short."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True, slots=True)
class LocatedError:
    """One problem in a manifest, located by file, table entry and field.

    ``serve`` is the entry's name (a serve's ``name``, or a role's ``id`` when
    ``table`` is ``"gpu_roles"``), ``None`` when the entry has no usable name; ``index``
    is the entry's 1-based position in its table. ``line``/``column`` are set for TOML
    syntax errors. ``str()`` gives one line such as
    ``serves.toml: serve "omni" (#3): vram_mib: must be a positive integer of MiB, got true``.
    """

    file: str
    serve: str | None
    field: str | None
    message: str
    table: str | None = "serve"
    index: int | None = None
    line: int | None = None
    column: int | None = None

    @property
    def where(self) -> str | None:
        """The entry label (``serve "omni" (#3)``, ``serve #3``), or ``None``."""
        if self.table is None or (self.serve is None and self.index is None):
            return None
        if self.serve is None:
            return f"{self.table} #{self.index}"
        if self.index is None:
            return f"{self.table} {_show(self.serve)}"
        return f"{self.table} {_show(self.serve)} (#{self.index})"

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            position = f"line {self.line}"
            if self.column is not None:
                position += f", column {self.column}"
            parts.append(position)
        where = self.where
        if where is not None:
            parts.append(where)
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """Each field (``None`` where unknown) and ``text``, the one line ``str()`` gives."""
        return {**dataclasses.asdict(self), "text": str(self)}


class ManifestError(Exception):
    """Every problem found in a manifest set; ``str()`` is one line per problem."""

    def __init__(self, errors: Sequence[LocatedError], warnings: Sequence[str] = ()) -> None:
        """Hold ``errors`` (at least one) and any ``warnings`` found on the way."""
        self.errors: list[LocatedError] = list(errors)
        self.warnings: list[str] = list(warnings)
        super().__init__("\n".join(str(e) for e in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


# ── field validators (messages are what the operator reads) ───────────────────


#: Cutoff for difflib's "did you mean" on unknown keys and values.
NEAR_MISS_CUTOFF = 0.8


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=NEAR_MISS_CUTOFF)
    return f'; did you mean "{close[0]}"?' if close else ""
