"""Admission: who may be requested, what cannot run together, when protected memory frees.

The rules an on-demand request meets before and after the planner:

- :func:`can_request`: a serve may be requested unless it is unknown, desired
  ``stopped``, or resident and desired running (the loop runs it already). The API
  answers 404 / 409 with these words.
- :func:`conflict`: why two serves cannot run at the same time (exclusive mode on a
  shared role, a shared port). The planner stops what conflicts with a start; the API
  tells a permanent conflict (409) from a wait (429) with the same rule.
- :func:`inside_min_runtime` / :func:`frees_up_in`: how long until a protected serve
  may go away by itself (an evictable victim leaving its ``min_runtime_s``, an
  on-demand request running out), which is the API's ``Retry-After``.

Pure: functions of their arguments (``now`` included); no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping

from statemachine.idleness import request_end
from statemachine.types import (
    DesiredRun,
    DesiredState,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
)


def can_request(desired: DesiredState, serve: str) -> str | None:
    """None when ``serve`` may be requested on demand; else why not (the API's 404/409)."""
    spec = desired.serves.get(serve)
    if spec is None:
        return f"no serve named {serve!r}"
    if spec.desired is DesiredRun.STOPPED:
        return f'{serve} is desired = "stopped" in the manifest'
    if spec.residency is Residency.RESIDENT and spec.desired is DesiredRun.RUNNING:
        return f"{serve} is resident and desired running: the loop runs it already"
    return None


def _shares_role(a: ServeSpec, b: ServeSpec) -> bool:
    return any(r in b.gpu_roles for r in a.gpu_roles)


def conflict(s: ServeSpec, other: ServeSpec) -> str | None:
    """Why ``s`` cannot run while ``other`` runs (exclusivity, a shared port); else None.

    Memory is the ledger's business; this is the rest of what a start needs stopped.
    """
    if other.exclusive and s.gpu_inference and _shares_role(s, other):
        return f"exclusive on {', '.join(other.gpu_roles)}"
    if s.exclusive and other.gpu_inference and _shares_role(s, other):
        return f"{s.name} needs {', '.join(s.gpu_roles)} to itself"
    if s.port is not None and other.port == s.port:
        return f"holds port {s.port}"
    return None


def inside_min_runtime(s: ServeSpec, observed: Observed, now: float) -> float | None:
    """Seconds since ``s`` started while still inside its ``min_runtime_s``, else None."""
    if s.min_runtime_s <= 0:
        return None
    started = observed.container(s.container).started_at
    if started is None:
        return None
    age = now - started
    return age if age < s.min_runtime_s else None


def frees_up_in(
    spec: ServeSpec,
    requester: ServeSpec,
    observed: Observed,
    requests: Mapping[str, OnDemandRequest],
    now: float,
    default: float,
) -> float | None:
    """Seconds until protected ``spec`` may go away by itself; None when it never does.

    An evictable serve protected only by its ``min_runtime_s`` frees when that ends (for
    an on-demand requester, the only kind that evicts); an on-demand serve running for a
    request frees when the request's TTL ends (``default`` when it has none).
    """
    age = inside_min_runtime(spec, observed, now)
    if (
        spec.residency is Residency.EVICTABLE
        and requester.residency is Residency.ON_DEMAND
        and age is not None
    ):
        return spec.min_runtime_s - age
    if spec.residency is Residency.ON_DEMAND and spec.desired is not DesiredRun.RUNNING:
        req = requests.get(spec.name)
        if req is None:
            return None
        end = request_end(req, spec, observed)
        if end.expires_at is not None:
            return max(0.0, end.expires_at - now)
        return default
    return None
