"""Measured idleness and busy-aware victims in the pure core (docs/eviction.md).

``request_expiry`` from the rules of ``statemachine.planning.idleness``, then the planner:
an on-demand serve running for a request without its own TTL stops once its count
of requests in flight has read 0 for ``idle_ttl_s``, never while it reads above 0;
without a source the TTL counts from the request; an unknown count counts from the
request or the last busy reading. The victim choice spares a busy serve.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from statemachine.answers.pending import pending_starts
from statemachine.domain import types as sm
from statemachine.planning import placement
from statemachine.planning.idleness import (
    IdleBasis,
    in_force,
    request_end,
    request_expiry,
    requests_in_force,
)
from statemachine.planning.planner import plan_transitions

M = sm.InFlightSource.METRICS
T0 = 1_000.0
TTL = 60.0


def od(idle_ttl_s: float | None = TTL) -> sm.ServeSpec:
    return sm.ServeSpec(
        "od",
        "c-od",
        ("a",),
        4000,
        sm.Residency.ON_DEMAND,
        idle_ttl_s=idle_ttl_s,
    )


EXPIRY = [
    # (request ttl, spec idle ttl, in flight, now, basis, expires_at)
    pytest.param(
        30.0, TTL, sm.InFlightObs(0, M, T0), T0 + 30, IdleBasis.TTL, T0 + 30, id="own-ttl"
    ),
    pytest.param(None, None, sm.InFlightObs(0, M, T0), T0 + 1e6, IdleBasis.NONE, None, id="no-ttl"),
    pytest.param(None, TTL, sm.NO_SOURCE, T0 + TTL, IdleBasis.REQUEST, T0 + TTL, id="no-source"),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(0, M, T0 + 100),
        T0 + 159,
        IdleBasis.MEASURED,
        T0 + 160,
        id="idle-since-later-than-request",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(0, M, T0 - 500),
        T0 + 59,
        IdleBasis.MEASURED,
        T0 + 60,
        id="idle-before-the-request-counts-from-the-request",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(3, M, None, T0 + 500),
        T0 + 1e6,
        IdleBasis.MEASURED,
        None,
        id="busy-never-expires",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(None, M, None, T0 + 200),
        T0 + 259,
        IdleBasis.UNKNOWN,
        T0 + 260,
        id="unknown-counts-from-the-last-busy-reading",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(None, M),
        T0 + 60,
        IdleBasis.UNKNOWN,
        T0 + 60,
        id="unknown-never-busy-counts-from-the-request",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(None, M, None, T0 + 200, T0 + 300),
        T0 + 359,
        IdleBasis.UNKNOWN,
        T0 + 360,
        id="unknown-counts-from-a-wake-after-the-last-busy-reading",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(None, M, None, T0 + 400, T0 + 300),
        T0 + 459,
        IdleBasis.UNKNOWN,
        T0 + 460,
        id="unknown-counts-from-a-busy-reading-after-the-wake",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(0, M, T0 + 300, None, T0 + 500),
        T0 + 559,
        IdleBasis.MEASURED,
        T0 + 560,
        id="idle-counts-from-a-wake-after-idle-since",
    ),
    pytest.param(
        None,
        TTL,
        sm.InFlightObs(0, M, T0 + 600, None, T0 + 500),
        T0 + 659,
        IdleBasis.MEASURED,
        T0 + 660,
        id="idle-since-after-the-wake-counts",
    ),
]


@pytest.mark.parametrize(("ttl", "idle_ttl", "obs", "now", "basis", "expires"), EXPIRY)
def test_request_expiry(
    ttl: float | None,
    idle_ttl: float | None,
    obs: sm.InFlightObs,
    now: float,
    basis: IdleBasis,
    expires: float | None,
) -> None:
    end = request_expiry(sm.OnDemandRequest("od", T0, ttl), od(idle_ttl), obs)
    assert end.basis is basis
    assert end.expires_at == expires
    assert end.expired(now) == (expires is not None and now >= expires)
    if expires is not None:
        assert not end.expired(expires - 0.001)
        assert end.expired(expires)


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 50),
    idle_since=st.none() | st.floats(0, 1e6),
    busy_at=st.none() | st.floats(0, 1e6),
    now=st.floats(0, 1e7),
)
def test_a_busy_serve_is_never_expired_by_idleness(
    count: int, idle_since: float | None, busy_at: float | None, now: float
) -> None:
    end = request_expiry(
        sm.OnDemandRequest("od", T0), od(), sm.InFlightObs(count, M, idle_since, busy_at)
    )
    event("busy, with a time it was seen busy" if busy_at is not None else "busy, no time")
    assert not end.expired(now)


@settings(max_examples=300, deadline=None)
@given(busy_at=st.none() | st.floats(0, 1e6), now=st.floats(0, 1e7))
def test_an_unknown_count_never_ends_a_request_sooner_than_the_request_ttl(
    busy_at: float | None, now: float
) -> None:
    unknown = request_expiry(
        sm.OnDemandRequest("od", T0), od(), sm.InFlightObs(None, M, None, busy_at)
    )
    from_request = request_expiry(sm.OnDemandRequest("od", T0), od(), sm.NO_SOURCE)
    assert unknown.expires_at is not None and from_request.expires_at is not None
    assert unknown.expires_at >= from_request.expires_at


# ----- the planner ------------------------------------------------------------------------
def _desired(
    *serves: sm.ServeSpec, requests: tuple[sm.OnDemandRequest, ...] = ()
) -> sm.DesiredState:
    return sm.DesiredState({"a": sm.GpuRole("a", 10_000)}, {s.name: s for s in serves}, requests)


def _running(*names: str) -> dict[str, sm.ContainerObs]:
    return {f"c-{n}": sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", 0.0) for n in names}


@pytest.mark.parametrize(
    ("obs", "now", "stops"),
    [
        pytest.param(sm.InFlightObs(0, M, T0 + 100), T0 + 159, False, id="idle-not-long-enough"),
        pytest.param(sm.InFlightObs(0, M, T0 + 100), T0 + 160, True, id="idle-long-enough"),
        pytest.param(sm.InFlightObs(2, M, None, T0 + 150), T0 + 10_000, False, id="busy"),
        pytest.param(sm.NO_SOURCE, T0 + 60, True, id="no-source-from-the-request"),
        pytest.param(sm.NO_SOURCE, T0 + 59, False, id="no-source-not-yet"),
        pytest.param(sm.InFlightObs(None, M, None, T0 + 500), T0 + 559, False, id="unknown-recent"),
    ],
)
def test_the_planner_stops_an_idle_on_demand_serve(
    obs: sm.InFlightObs, now: float, stops: bool
) -> None:
    desired = _desired(od(), requests=(sm.OnDemandRequest("od", T0),))
    observed = sm.Observed(True, _running("od"), in_flight={"od": obs})
    plan = plan_transitions(desired, observed, None, now)
    stopped = [st.serve for st in plan.steps if st.action == "stop"]
    assert stopped == (["od"] if stops else [])
    if stops and obs.source is not None:
        assert "no request in flight for 60s" in plan.steps[0].reason


def test_the_planner_evicts_the_idle_one_of_two_victims() -> None:
    a = sm.ServeSpec("a", "c-a", ("a",), 4000, sm.Residency.EVICTABLE)
    b = sm.ServeSpec("b", "c-b", ("a",), 4000, sm.Residency.EVICTABLE)
    big = sm.ServeSpec("big", "c-big", ("a",), 5000, sm.Residency.ON_DEMAND)
    desired = _desired(a, b, big, requests=(sm.OnDemandRequest("big", T0),))
    for busy, idle in (("a", "b"), ("b", "a")):
        observed = sm.Observed(
            True,
            _running("a", "b"),
            in_flight={busy: sm.InFlightObs(1, M, None, T0), idle: sm.InFlightObs(0, M, T0)},
        )
        plan = plan_transitions(desired, observed, None, T0 + 1)
        assert [st.serve for st in plan.steps if st.action == "stop"] == [idle]
    # unknown is not idle: with one unknown and one busy the name decides as before
    observed = sm.Observed(True, _running("a", "b"), in_flight={"b": sm.InFlightObs(2, M)})
    plan = plan_transitions(desired, observed, None, T0 + 1)
    assert [st.serve for st in plan.steps if st.action == "stop"] == ["a"]


def test_idleness_never_counts_from_before_the_container_started() -> None:
    req = sm.OnDemandRequest("od", T0)
    started = T0 + 200.0  # a long start: the engine came up 200 s after the request
    unknown = request_expiry(req, od(), sm.InFlightObs(None, M), started)
    assert (unknown.basis, unknown.expires_at) == (IdleBasis.UNKNOWN, started + TTL)
    idle = request_expiry(req, od(), sm.InFlightObs(0, M, T0 + 50), started)
    assert (idle.expires_at, idle.idle_since) == (started + TTL, started)
    # without a source the TTL counts from the request, as it did before measuring
    plain = request_expiry(req, od(), sm.NO_SOURCE, started)
    assert plain.expires_at == T0 + TTL
    # the planner takes the start from the observation
    desired = _desired(od(), requests=(req,))
    running = {"c-od": sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", started)}
    observed = sm.Observed(True, running, in_flight={"od": sm.InFlightObs(None, M)})
    assert not plan_transitions(desired, observed, None, started + TTL - 1).steps
    assert [
        st.serve
        for st in plan_transitions(desired, observed, None, started + TTL).steps
        if st.action == "stop"
    ] == ["od"]


def test_a_serve_with_a_source_that_has_not_run_since_the_request_waits_for_its_run() -> None:
    req = sm.OnDemandRequest("od", T0)
    desired = _desired(od(), requests=(req,))
    late = T0 + 10 * TTL
    # waiting for room (never started, or stopped before the request): the request stays
    for before in (None, T0 - 5.0):
        c = sm.ContainerObs(sm.ContainerState.EXITED, started_at=T0 - 100, finished_at=before)
        observed = sm.Observed(True, {"c-od": c}, in_flight={"od": sm.InFlightObs(None, M)})
        end = request_end(req, od(), observed)
        assert (end.basis, end.expires_at) == (IdleBasis.PENDING, None)
        plan = plan_transitions(desired, observed, None, late)
        assert [st.serve for st in plan.steps if st.action == "start"] == ["od"]
    # it ran after the request and stopped: the request stays ended (no restart)
    ran = sm.ContainerObs(sm.ContainerState.EXITED, started_at=T0 + 5, finished_at=T0 + 5 + TTL)
    observed = sm.Observed(True, {"c-od": ran}, in_flight={"od": sm.InFlightObs(None, M)})
    assert request_end(req, od(), observed).expired(T0 + 5 + TTL)
    assert not plan_transitions(desired, observed, None, T0 + 5 + TTL).steps
    # a start in progress has not run yet either
    starting = sm.Observed(
        True,
        {"c-od": sm.ContainerObs(sm.ContainerState.RUNNING, "starting", T0 + 1)},
        starting={"od": sm.StartingObs(("a",), 4000)},
        in_flight={"od": sm.InFlightObs(None, M)},
    )
    assert request_end(req, od(), starting).basis is IdleBasis.PENDING
    # without a source the TTL counts from the request, as before
    plain = sm.Observed(True, {"c-od": sm.ContainerObs(sm.ContainerState.EXITED)})
    assert request_end(req, od(), plain).expires_at == T0 + TTL


def test_a_sleeper_that_is_requested_has_not_run_until_it_is_woken() -> None:
    # its container runs, but its engine sleeps: like a serve waiting for room, its
    # idle_ttl_s counts once it has been woken, never while it sleeps
    from statemachine.domain.types import SleepObs, SleepState

    req = sm.OnDemandRequest("od", T0)
    old = sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", T0 - 3600)
    asleep = sm.Observed(
        True,
        {"c-od": old},
        in_flight={"od": sm.InFlightObs(0, M, T0 - 3000)},
        sleep={"od": SleepObs(SleepState.ASLEEP, 1, 1000, 2000)},
    )
    end = request_end(req, od(), asleep)
    assert (end.basis, end.expires_at) == (IdleBasis.PENDING, None)


def test_the_json_counts_down_to_the_deadline_and_stops_at_zero() -> None:
    """GET /v1/serves: ``expires_in_s`` is the deadline minus now while it is ahead,
    0 once it has passed (never negative), and ``unknown`` (None) without a deadline."""
    end = request_expiry(sm.OnDemandRequest("od", T0), od(), sm.InFlightObs(0, M, T0 + 20))
    assert end.expires_at == T0 + 20 + TTL
    ahead = end.to_json(T0 + 50)
    assert ahead == {
        "ttl_basis": "measured",
        "ttl_s": TTL,
        "expires_at": T0 + 20 + TTL,
        "expires_in_s": 30.0,
        "expired": False,
        "idle_since": T0 + 20,
        "in_flight": 0,
    }
    assert end.to_json(T0 + 80 - 0.5)["expires_in_s"] == 0.5
    at = end.to_json(T0 + 80)
    assert (at["expires_in_s"], at["expired"]) == (0.0, True)
    past = end.to_json(T0 + 80 + 30)
    assert (past["expires_in_s"], past["expired"]) == (0.0, True)
    busy = request_expiry(sm.OnDemandRequest("od", T0), od(), sm.InFlightObs(2, M)).to_json(T0)
    assert (busy["expires_at"], busy["expires_in_s"], busy["in_flight"]) == (None, None, 2)


def test_one_request_in_flight_keeps_the_serve_busy() -> None:
    end = request_expiry(sm.OnDemandRequest("od", T0), od(), sm.InFlightObs(1, M, None, T0 + 5))
    assert (end.basis, end.expires_at, end.in_flight) == (IdleBasis.MEASURED, None, 1)
    assert not end.expired(T0 + 100 * TTL)


def test_a_container_that_stopped_at_the_instant_of_the_request_has_run_for_it() -> None:
    """It was running when the request came (it ran up to its ``FinishedAt``): the
    request's idleness was measured and ended, it does not wait for another run."""
    req = sm.OnDemandRequest("od", T0)
    stopped = sm.ContainerObs(sm.ContainerState.EXITED, started_at=T0 - 500, finished_at=T0)
    observed = sm.Observed(True, {"c-od": stopped}, in_flight={"od": sm.InFlightObs(None, M)})
    end = request_end(req, od(), observed)
    assert (end.basis, end.expires_at) == (IdleBasis.UNKNOWN, T0 + TTL)
    just_before = sm.ContainerObs(
        sm.ContainerState.EXITED, started_at=T0 - 500, finished_at=T0 - 0.001
    )
    waiting = sm.Observed(True, {"c-od": just_before}, in_flight={"od": sm.InFlightObs(None, M)})
    assert request_end(req, od(), waiting).basis is IdleBasis.PENDING


def test_a_request_for_a_serve_the_manifest_no_longer_has_keeps_its_own_ttl() -> None:
    """No spec: no idle_ttl_s to measure; the request's own ttl_s still ends it, and
    without one it lasts until ``down`` (nothing is read from the observation)."""
    observed = sm.Observed(True, {})
    own = request_end(sm.OnDemandRequest("gone", T0, 30.0), None, observed)
    assert (own.basis, own.ttl_s, own.expires_at) == (IdleBasis.TTL, 30.0, T0 + 30.0)
    none = request_end(sm.OnDemandRequest("gone", T0), None, observed)
    assert (none.basis, none.ttl_s, none.expires_at) == (IdleBasis.NONE, None, None)


# ----- one answer: is the request still in force? --------------------------------------
R = sm.InFlightSource.ROUTER
CONTAINERS = {
    "absent": None,
    "running": sm.ContainerObs(sm.ContainerState.RUNNING, "healthy", T0 + 10),
    # it ran for the request and stopped (its request ended while it ran)
    "stopped-after": sm.ContainerObs(
        sm.ContainerState.EXITED, started_at=T0 + 10, finished_at=T0 + 700
    ),
    # it stopped before the request: waiting for room
    "stopped-before": sm.ContainerObs(
        sm.ContainerState.EXITED, started_at=T0 - 900, finished_at=T0 - 100
    ),
}


@settings(max_examples=400, deadline=None)
@given(
    ttl=st.none() | st.sampled_from([30.0, 600.0]),
    idle_ttl=st.none() | st.sampled_from([0.0, TTL, 600.0]),
    flight=st.sampled_from(
        [
            sm.NO_SOURCE,
            sm.InFlightObs(0, M, T0 + 100),
            sm.InFlightObs(0, R, T0 - 50),
            sm.InFlightObs(None, M, None, T0 + 50),
            sm.InFlightObs(2, M, None, T0 + 50),
        ]
    ),
    container=st.sampled_from(sorted(CONTAINERS)),
    after=st.floats(0, 2000),
)
def test_every_site_gives_one_answer_to_whether_a_request_is_in_force(
    ttl: float | None,
    idle_ttl: float | None,
    flight: sm.InFlightObs,
    container: str,
    after: float,
) -> None:
    """The planner, placement, the pending starts and ``requests_in_force`` agree with
    ``in_force`` (the request's end by ``request_end`` not passed), including where the
    raw ``requested_at + ttl_s`` would not: a request without a TTL of its own that
    ended by ``idle_ttl_s``."""
    spec = od(idle_ttl)
    req = sm.OnDemandRequest("od", T0, ttl)
    c = CONTAINERS[container]
    observed = sm.Observed(True, {} if c is None else {"c-od": c}, in_flight={"od": flight})
    now = T0 + after
    force = in_force(req, spec, observed, now)
    event(f"in force, container {container}" if force else f"ended, container {container}")
    assert force is not request_end(req, spec, observed).expired(now)
    desired = _desired(spec, requests=(req,))
    assert requests_in_force(desired, observed, now) == ((req,) if force else ())
    assert placement.wants_to_run(desired, spec, observed, now) is force
    steps = {st.action for st in plan_transitions(desired, observed, None, now).steps}
    waiting = [p.serve for p in pending_starts(desired, observed, policy=None, now=now)]
    if container == "running":
        assert ("stop" in steps) is not force
        assert waiting == []
    else:
        assert ("start" in steps) is force
        assert waiting == (["od"] if force else [])


def test_a_request_without_a_ttl_of_its_own_ends_by_idle_ttl_s_not_never() -> None:
    """The raw TTL would keep it in force for ever (no ``ttl_s``); the rule ends it
    ``idle_ttl_s`` after the request where the serve has no source, and by measured
    idleness where it has one."""
    req = sm.OnDemandRequest("od", T0)
    plain = sm.Observed(True, {})
    assert in_force(req, od(), plain, T0 + TTL - 0.001)
    assert not in_force(req, od(), plain, T0 + TTL)
    ran = sm.ContainerObs(sm.ContainerState.EXITED, started_at=T0 + 5, finished_at=T0 + 500)
    idle = sm.Observed(True, {"c-od": ran}, in_flight={"od": sm.InFlightObs(0, R, T0 + 100)})
    assert in_force(req, od(), idle, T0 + 100 + TTL - 0.001)
    assert not in_force(req, od(), idle, T0 + 100 + TTL)
    # without idle_ttl_s nor ttl_s it lasts until down; a serve the manifest lost too
    assert in_force(req, od(None), plain, T0 + 1e9)
    assert in_force(req, None, plain, T0 + 1e9)
    assert not in_force(sm.OnDemandRequest("gone", T0, 30.0), None, plain, T0 + 30)
    assert in_force(sm.OnDemandRequest("gone", T0, 30.0), None, plain, T0 + 29.999)


def test_requests_in_force_keeps_the_order_and_drops_the_ended() -> None:
    other = sm.ServeSpec("x", "c-x", ("a",), 1000, sm.Residency.ON_DEMAND)
    first = sm.OnDemandRequest("x", T0, 600.0)
    ended = sm.OnDemandRequest("od", T0)  # no source: ends idle_ttl_s after the request
    gone = sm.OnDemandRequest("gone", T0)  # no spec, no TTL: until down
    last = sm.OnDemandRequest("x", T0 + 1)
    desired = _desired(od(), other, requests=(first, ended, gone, last))
    assert requests_in_force(desired, sm.Observed(True, {}), T0 + TTL) == (first, gone, last)
    assert requests_in_force(desired, sm.Observed(True, {}), T0 + 601) == (gone, last)
