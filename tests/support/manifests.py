"""Manifest texts (TOML) that several test modules start from, each written once.

A module adds its own serves or keys after one of these; nothing here reads, loads or
checks a manifest.
"""

from __future__ import annotations

# One card role ``a`` of 10000 MiB.
CARD_A = '\n[[gpu_roles]]\nid = "a"\nvram_mib = 10000\n'

# A resident serve ``res`` of 2000 MiB on ``a`` (its ``desired`` left to the caller).
RES_2000 = (
    '\n[[serve]]\nname = "res"\ncontainer = "c-res"\n'
    'gpu_role = "a"\nvram_mib = 2000\nresidency = "resident"\n'
)

# Both, ``res`` desired running.
ONE_RESIDENT = CARD_A + RES_2000 + 'desired = "running"\n'


def serve_toml(
    name: str,
    container: str,
    mib: int,
    residency: str,
    port: int,
    *,
    start_timeout_s: int = 30,
    stop_timeout_s: int = 5,
    extra: str = "",
) -> str:
    """One ``[[serve]]`` on card role ``a`` with a health check at ``/health``, then the
    lines of ``extra``."""
    return f"""
[[serve]]
name = "{name}"
container = "{container}"
gpu_role = "a"
vram_mib = {mib}
residency = "{residency}"
port = {port}
health = "/health"
start_timeout_s = {start_timeout_s}
stop_timeout_s = {stop_timeout_s}
{extra}
"""
