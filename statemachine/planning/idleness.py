"""Measured idleness: when an on-demand request ends (docs/eviction.md#measured-idleness).

A request with its own ``ttl_s`` lasts that long from the request. A request without
one takes the serve's ``idle_ttl_s``, which means "no request in flight for that
long", measured where the serve has a source of in-flight counts (its engine's
metrics, its router tier):

- the count reads 0: the request ends ``idle_ttl_s`` after the latest of the request,
  the container's start, its engine's wake (``woke_at``) and the time since which every
  reading has been 0 (``idle_since``);
- the count reads above 0: the request does not end while it does;
- the source exists but the count is unknown now (unreachable, metric missing): the
  TTL counts from the latest of the request, the container's start, its engine's wake
  and the last reading above 0 (a serve seen busy a moment ago is not stopped because
  one reading failed, nor one whose engine does not answer yet right after a long start
  or a wake that came long after the request);
- the serve has a source but has not run since the request (it waits for room, or
  its start is in progress): the request does not end; idleness starts with its run;
- the serve has no source: the TTL counts from the request.

Once a request has ended it stays ended as its serve stops: the serve stopped after the
request (docker's ``FinishedAt``), and its deadline counts from its last start, which is
no later than the idleness that ended it.

:func:`in_force` is the one answer to "is this request still in force?": its end as
:func:`request_end` finds it has not passed. The planner, placement, the pending
starts, ``up``'s answers, fit's shortcut, the loop and the request queue all ask it;
the raw ``requested_at + ttl_s`` is never the answer (a request without a TTL of its own
can end by ``idle_ttl_s``).

Pure: no I/O, no clock (the observation carries the times), no logging.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from statemachine.domain.types import (
    NO_SOURCE,
    DesiredState,
    InFlightObs,
    Observed,
    OnDemandRequest,
    ServeSpec,
)


class IdleBasis(StrEnum):
    """What a request's end counts from."""

    TTL = "ttl"  # the request's own ttl_s, from the request
    MEASURED = "measured"  # idle_ttl_s of measured idleness
    REQUEST = "request"  # idle_ttl_s from the request: the serve has no source
    UNKNOWN = "unknown"  # idle_ttl_s; a source, but its count is unknown now
    PENDING = "pending"  # idle_ttl_s; a source, and the serve has not run since the request
    NONE = "none"  # no TTL: the request lasts until `down`


@dataclass(frozen=True, slots=True)
class RequestExpiry:
    """When one request ends, and why then."""

    basis: IdleBasis
    ttl_s: float | None
    #: when the request ends; ``None``: not while things stay as observed (no TTL, busy)
    expires_at: float | None
    #: the time idleness counts from (measured), else ``None``
    idle_since: float | None = None
    in_flight: int | None = None

    def expired(self, now: float) -> bool:
        """True once the request has ended."""
        return self.expires_at is not None and now >= self.expires_at

    def to_json(self, now: float) -> dict[str, Any]:
        """JSON form (GET /v1/serves): the basis, the deadline and what it counts from."""
        return {
            "ttl_basis": str(self.basis),
            "ttl_s": self.ttl_s,
            "expires_at": self.expires_at,
            "expires_in_s": None if self.expires_at is None else max(0.0, self.expires_at - now),
            "expired": self.expired(now),
            "idle_since": self.idle_since,
            "in_flight": self.in_flight,
        }


def request_end(req: OnDemandRequest, spec: ServeSpec | None, observed: Observed) -> RequestExpiry:
    """When ``req`` ends, as ``observed`` shows its serve (in flight, container start)."""
    if spec is None:
        return request_expiry(req, spec)
    c = observed.container(spec.container)
    # it has run since the request: it runs now (awake: a sleeper's container runs while
    # its engine sleeps), or it stopped after the request
    awake = not observed.sleep_of(spec.name).asleep
    ran = (c.holds and spec.name not in observed.starting and awake) or (
        c.finished_at is not None and c.finished_at >= req.requested_at
    )
    return request_expiry(req, spec, observed.requests_in_flight(req.serve), c.started_at, ran)


def in_force(req: OnDemandRequest, spec: ServeSpec | None, observed: Observed, now: float) -> bool:
    """True while ``req`` (for ``spec``; ``None``: a serve the manifest no longer has)
    is in force at ``now``: its end (:func:`request_end`) has not passed."""
    return not request_end(req, spec, observed).expired(now)


def requests_in_force(
    desired: DesiredState, observed: Observed, now: float
) -> tuple[OnDemandRequest, ...]:
    """The requests of ``desired`` in force at ``now`` (:func:`in_force`), in order."""
    return tuple(
        r for r in desired.requests if in_force(r, desired.serves.get(r.serve), observed, now)
    )


def _latest(first: float, *others: float | None) -> float:
    return max([first, *(o for o in others if o is not None)])


def request_expiry(
    req: OnDemandRequest,
    spec: ServeSpec | None,
    in_flight: InFlightObs = NO_SOURCE,
    started_at: float | None = None,
    ran: bool = True,
) -> RequestExpiry:
    """When ``req`` (for ``spec``, whose in-flight observation is ``in_flight``, whose
    container started at ``started_at``, and which has run since the request or not)
    ends."""
    if req.ttl_s is not None:
        return RequestExpiry(IdleBasis.TTL, req.ttl_s, req.requested_at + req.ttl_s)
    ttl = spec.idle_ttl_s if spec is not None else None
    if ttl is None:
        return RequestExpiry(IdleBasis.NONE, None, None)
    count = in_flight.count
    if in_flight.source is None:
        return RequestExpiry(IdleBasis.REQUEST, ttl, req.requested_at + ttl)
    if not ran:
        return RequestExpiry(IdleBasis.PENDING, ttl, None)
    if count is None:
        start = _latest(req.requested_at, started_at, in_flight.woke_at, in_flight.busy_at)
        return RequestExpiry(IdleBasis.UNKNOWN, ttl, start + ttl)
    if count > 0:
        return RequestExpiry(IdleBasis.MEASURED, ttl, None, None, count)
    since = _latest(req.requested_at, started_at, in_flight.woke_at, in_flight.idle_since)
    return RequestExpiry(IdleBasis.MEASURED, ttl, since + ttl, since, 0)
