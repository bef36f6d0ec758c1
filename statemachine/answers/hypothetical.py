"""A serve nobody declared, for the question "could N MiB run on this role now?".

``with_hypothetical`` adds to the desired state an on-demand serve of ``vram_mib`` on
one role, or placed among candidate roles as a manifest's ``placement`` serve is, with
no container, port or router tier: the fit answer for it
(:func:`statemachine.answers.fit.fit_serve`) is then what a new on-demand serve of that size
would cost, with every term, by the rules a declared one meets (only an on-demand
requester may evict). ``vramctl mcp``'s ``can_fit`` asks it this way.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from statemachine.domain.types import DesiredState, Residency, ServeSpec

#: the hypothetical serve's name (and container name): one no manifest can declare
HYPOTHETICAL = "(hypothetical)"


class HypotheticalError(ValueError):
    """The question cannot be asked of this manifest set (the message says why)."""


def _roles_asked(
    desired: DesiredState, gpu_role: str | None, placement: Sequence[str] | None
) -> tuple[str, ...]:
    """The candidate roles asked, checked against the set (one role for ``gpu_role``)."""
    if (gpu_role is None) == (placement is None):
        both = "both" if gpu_role is not None else "neither"
        raise HypotheticalError(f"ask with exactly one of gpu_role or placement, not {both}")
    asked = (gpu_role,) if gpu_role is not None else tuple(placement or ())
    if not asked:
        raise HypotheticalError("placement must name at least one candidate role")
    for role in asked:
        if asked.count(role) > 1:
            raise HypotheticalError(f'placement names "{role}" more than once')
        if role not in desired.roles:
            known = ", ".join(sorted(desired.roles)) or "none"
            raise HypotheticalError(f'no gpu role "{role}" in the manifest set (roles: {known})')
    return asked


def with_hypothetical(
    desired: DesiredState,
    vram_mib: int,
    gpu_role: str | None = None,
    *,
    placement: Sequence[str] | None = None,
    name: str = HYPOTHETICAL,
) -> DesiredState:
    """``desired`` with an on-demand serve ``name`` of ``vram_mib`` added, on ``gpu_role``
    or placed among the candidate roles ``placement`` (exactly one of them).

    A placed one is what the manifest gives for a serve with ``placement``: ``placement``
    the candidates in the order asked, ``gpu_roles`` every candidate until
    :mod:`statemachine.planning.placement` chooses one (:func:`statemachine.answers.fit.fit_serve`
    answers it on the card its request would be placed on).

    Raises :class:`HypotheticalError` for neither or both of ``gpu_role`` and
    ``placement``, an empty or repeated candidate list, a role the set has no capacity
    row for, a size that is not a positive number of MiB, a candidate whose budget is
    below the size (it could never hold the serve), or a name the set declares already."""
    roles = _roles_asked(desired, gpu_role, placement)
    if isinstance(vram_mib, bool) or not isinstance(vram_mib, int) or vram_mib <= 0:
        raise HypotheticalError(f"vram_mib must be a positive number of MiB, not {vram_mib!r}")
    if placement is not None:
        for r in roles:
            role = desired.roles[r]
            if vram_mib > role.budget_mib:
                raise HypotheticalError(
                    f'placement candidate "{r}" has a budget of {role.budget_mib} MiB '
                    f"(capacity {role.capacity_mib} - reserve {role.reserve_mib}), less "
                    f"than vram_mib {vram_mib}: it can never hold this serve"
                )
    if name in desired.serves:
        raise HypotheticalError(f'the manifest set already declares a serve "{name}"')
    spec = ServeSpec(
        name=name,
        container=name,
        gpu_roles=roles,
        vram_mib=vram_mib,
        residency=Residency.ON_DEMAND,
        placement=roles if placement is not None else (),
    )
    return replace(desired, serves={**desired.serves, name: spec})
