"""What the model-file readers share: the located error, and the checks of a figure read.

It must not read a file itself nor decide anything: the readers beside it read, the
pure core (``statemachine.sizing.needs``) computes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ModelFileError", "positive_int"]


class ModelFileError(ValueError):
    """A model's files cannot be read as asked: the message names the file (and the key)."""


def positive_int(value: Any, key: str, where: str) -> int:
    """``value`` as a positive integer; ModelFileError naming ``key`` and ``where`` else."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelFileError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value
