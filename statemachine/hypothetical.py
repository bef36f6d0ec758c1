"""A serve nobody declared, for the question "could N MiB run on this role now?".

``with_hypothetical`` adds to the desired state an on-demand serve of ``vram_mib`` on
one role, with no container, port or router tier: the fit answer for it
(:func:`statemachine.fit.fit_serve`) is then what a new on-demand serve of that size
would cost, with every term, by the rules a declared one meets (only an on-demand
requester may evict). ``vramctl mcp``'s ``can_fit`` asks it this way.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import replace

from statemachine.types import DesiredState, Residency, ServeSpec

#: the hypothetical serve's name (and container name): one no manifest can declare
HYPOTHETICAL = "(hypothetical)"


class HypotheticalError(ValueError):
    """The question cannot be asked of this manifest set (the message says why)."""


def with_hypothetical(
    desired: DesiredState, vram_mib: int, gpu_role: str, *, name: str = HYPOTHETICAL
) -> DesiredState:
    """``desired`` with an on-demand serve ``name`` of ``vram_mib`` on ``gpu_role`` added.

    Raises :class:`HypotheticalError` for a role the set has no capacity row for, a
    size that is not a positive number of MiB, or a name the set declares already."""
    if gpu_role not in desired.roles:
        known = ", ".join(sorted(desired.roles)) or "none"
        raise HypotheticalError(f'no gpu role "{gpu_role}" in the manifest set (roles: {known})')
    if isinstance(vram_mib, bool) or not isinstance(vram_mib, int) or vram_mib <= 0:
        raise HypotheticalError(f"vram_mib must be a positive number of MiB, not {vram_mib!r}")
    if name in desired.serves:
        raise HypotheticalError(f'the manifest set already declares a serve "{name}"')
    spec = ServeSpec(
        name=name,
        container=name,
        gpu_roles=(gpu_role,),
        vram_mib=vram_mib,
        residency=Residency.ON_DEMAND,
    )
    return replace(desired, serves={**desired.serves, name: spec})
