"""The answer to an on-demand ``up``: admit (202), refuse (409 / 429) or fail closed (503).

:func:`decide_up` asks the planner what this request alone would do on an observation
(as ``GET /v1/fit`` does), counting the recorded requests that the next cycle starts
and nothing holds yet (:mod:`statemachine.answers.pending`) as held, so two requests are never
promised the same room. The HTTP API (docs/design.md §5) answers with its status,
message, body and ``Retry-After``; the request queue re-decides with it each time it
looks at a queued request. 404 (unknown serve) and the request-level 409
(:func:`statemachine.planning.admission.can_request`) are checked before it.

:func:`mark_pending` marks, in a fit or ledger JSON, the reservations held for
requests not yet planned.

Pure: functions of their arguments (``now`` included); no I/O, no clock, no logging,
nothing from ``controller``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from statemachine.answers.fit import FitResult, fit_serve, request_plan
from statemachine.answers.pending import (
    PENDING_STATE,
    PendingStart,
    pending_starts,
    with_pending,
)
from statemachine.domain.types import DesiredState, Observed, OnDemandRequest
from statemachine.planning import placement
from statemachine.planning.admission import (
    conflict,
    frees_up_in,
    no_router_reason,
    router_needs,
)
from statemachine.planning.idleness import requests_in_force
from statemachine.planning.plan_types import (
    Blocked,
    Policy,
)


@dataclass(frozen=True, slots=True)
class UpDecision:
    """What ``up`` answers: status, message, body, and Retry-After when 429."""

    status: int
    message: str
    body: dict[str, Any] = field(default_factory=dict)
    retry_after_s: int | None = None


def mark_pending(data: dict[str, Any], pending: tuple[PendingStart, ...]) -> dict[str, Any]:
    """``data`` (fit or ledger JSON, with ``gpu_roles``) with the pending starts said so.

    Each role's reservation held for a request not yet planned gets ``"state":
    "requested, not yet planned"``, and ``pending`` lists those requests.
    """
    names = {p.serve for p in pending}
    roles = []
    for row in data.get("gpu_roles", []):
        reservations = [
            {**res, "state": PENDING_STATE} if res.get("serve") in names else res
            for res in row.get("reservations", [])
        ]
        roles.append({**row, "reservations": reservations} if "reservations" in row else row)
    return {**data, "gpu_roles": roles, "pending": [p.to_json() for p in pending]}


def decide_up(
    desired: DesiredState,
    observed: Observed,
    serve: str,
    *,
    policy: Policy,
    now: float,
    default_retry_s: float,
    router: bool = True,
) -> UpDecision:
    """The answer to ``up`` (404 and the request-level 409 are checked before). Pure.

    ``desired`` holds the recorded requests: those the next cycle starts and nothing
    holds yet (accepted, not yet planned: :mod:`statemachine.answers.pending`) count as held
    on their roles, so two requests are never promised the same room; the body lists
    them under ``pending`` and marks their reservations. ``router``: whether ``run``
    has one; without it a request that drains a tier (a victim's, or its own when it
    ends) is 409 with the fix (``needs_router``), since no cycle could carry it out.
    """
    pending = pending_starts(desired, observed, policy=policy, now=now, requester=serve)
    as_observed, observed = observed, with_pending(observed, pending)
    fit = fit_serve(desired, observed, serve, policy=policy, now=now, placed_on=as_observed)
    fit_json = mark_pending(fit.to_json(), pending)
    if not observed.docker_ok:
        return UpDecision(
            503,
            f"docker could not be read in the last cycle, so nothing is admitted: {fit.reason}",
            {"fit": fit_json},
            max(1, math.ceil(default_retry_s)),
        )
    # a placed serve's steps on the card its fit answered (the loop's: fit_serve)
    on_card = placement.apply(desired, (fit.placement,)) if fit.placement else desired
    plan = request_plan(on_card, observed, serve, policy=policy, now=now)
    own = tuple(st for st in plan.steps if st.group == serve) if fit.fits else ()
    needs = () if router else router_needs(desired, observed, serve, own)
    if needs:
        return UpDecision(
            409,
            no_router_reason(f"up {serve}", needs),
            {"fit": fit_json, "needs_router": [n.to_json() for n in needs]},
        )
    if fit.fits:
        return UpDecision(202, fit.reason, {"fit": fit_json, "steps": [s.to_json() for s in own]})
    blocked = next((b for b in plan.blocked if b.serve == serve), None)
    blocked = _with_pending_named(blocked, fit, pending)
    if blocked is None:  # cannot happen: fit said no but the plan blocks nothing
        return UpDecision(429, fit.reason, dict(fit_json), max(1, math.ceil(default_retry_s)))
    return _refusal(desired, observed, serve, blocked, fit_json, now, default_retry_s)


def _with_pending_named(
    blocked: Blocked | None, fit: FitResult, pending: tuple[PendingStart, ...]
) -> Blocked | None:
    """``blocked`` whose reason names the pending requests counted as held, when one of
    them is part of the shortfall or of the protected serves."""
    names = {p.serve for p in pending}
    if blocked is None:
        return None
    short = any(t.shortfall_mib and any(h in names for h, _ in t.reservations) for t in fit.terms)
    if not short and not any(p.serve in names for p in blocked.protected):
        return blocked
    counted = ", ".join(f"{p.serve} {p.mib} MiB" for p in pending)
    return replace(
        blocked, reason=f"{blocked.reason}; counted as held: {counted} ({PENDING_STATE})"
    )


def _refusal(
    desired: DesiredState,
    observed: Observed,
    serve: str,
    blocked: Blocked,
    fit_json: dict[str, Any],
    now: float,
    default_retry_s: float,
) -> UpDecision:
    """409 when a serve the controller never stops implicitly conflicts for good, else
    429 with the soonest a protected serve frees up as ``Retry-After``."""
    spec = desired.serves[serve]
    terms = {
        "evictable_mib": dict(blocked.evictable_mib),
        "shrinkable_mib": dict(blocked.shrinkable_mib),
    }
    requests: dict[str, OnDemandRequest] = {
        r.serve: r for r in requests_in_force(desired, observed, now)
    }
    conflicting = [
        p
        for p in blocked.protected
        if p.serve in desired.serves and conflict(spec, desired.serves[p.serve]) is not None
    ]
    waits: list[float] = []
    permanent: list[str] = []
    for p in blocked.protected:
        other = desired.serves.get(p.serve)
        if other is None:
            continue
        wait = frees_up_in(other, spec, observed, requests, now, default_retry_s)
        if wait is None:
            if p in conflicting:
                permanent.append(f"{p.serve} ({p.why})")
        else:
            waits.append(wait)
    if conflicting and permanent:
        return UpDecision(
            409,
            f"{serve} cannot start while " + ", ".join(permanent) + " runs, and the controller "
            f"never stops that implicitly: {blocked.reason}",
            {**fit_json, **terms},
        )
    retry = min(waits) if waits else default_retry_s
    return UpDecision(429, blocked.reason, {**fit_json, **terms}, max(1, math.ceil(retry)))
