"""The serves that declare a router tier, and what ``run`` and ``validate`` say once
about them when no router is configured (:func:`router_tiers`,
:func:`no_router_warning`); ``statemachine.planning.admission`` holds the rules a request meets
without a router. Its own module so that ``validate`` reads them without the ledger and
the planner.

Pure: functions of their arguments; no I/O, no clock, no logging. Must not import the
ledger, the planner or anything outside ``statemachine.domain.types``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statemachine.domain.types import DesiredState


def router_tiers(desired: DesiredState) -> dict[str, str]:
    """Serve -> its router tier, for every serve that declares one (by name)."""
    return {
        name: spec.router_tier for name, spec in sorted(desired.serves.items()) if spec.router_tier
    }


def no_router_warning(tiers: Mapping[str, str]) -> str:
    """What ``run`` and ``validate`` say when serves declare a tier and no router is set."""
    named = ", ".join(f"{name} ({tier})" for name, tier in tiers.items())
    return (
        f"no router is configured (--router-url / VRAMCTL_ROUTER_URL), and {len(tiers)} "
        f"serve(s) declare a router tier, drained before a stop or a sleep: {named}. "
        "Without a router they are never stopped or put to sleep: a plan that would is "
        "refused by the preflight, and a request (up, down) that needs it is refused at once"
    )
