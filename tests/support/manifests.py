"""Manifest texts (TOML) that several test modules start from, each written once.

A module adds its own serves or keys after one of these; nothing here reads, loads or
checks a manifest.
"""

from __future__ import annotations

# One card role ``a`` of 10000 MiB and one resident serve ``res`` of 2000 MiB, running.
ONE_RESIDENT = """
[[gpu_roles]]
id = "a"
vram_mib = 10000

[[serve]]
name = "res"
container = "c-res"
gpu_role = "a"
vram_mib = 2000
residency = "resident"
desired = "running"
"""
