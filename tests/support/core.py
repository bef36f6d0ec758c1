"""Builders of the pure core's inputs that many test modules share (statemachine only).

Each module keeps its own short builder (its name and defaults) and reaches the
``ServeSpec`` through :func:`spec`. Nothing here plans, checks or asserts.
"""

from __future__ import annotations

from typing import Any

from statemachine.domain.types import Residency, ServeSpec


def spec(
    name: str,
    mib: int | None,
    residency: Residency | None = None,
    *,
    roles: tuple[str, ...] = ("a",),
    **kw: Any,
) -> ServeSpec:
    """Serve ``name`` in container ``c-<name>`` on ``roles``; ``kw``: the other fields."""
    return ServeSpec(
        name=name, container=f"c-{name}", gpu_roles=roles, vram_mib=mib, residency=residency, **kw
    )
