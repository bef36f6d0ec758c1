"""Which recorded requests an answer counts as pending, and at what figures
(statemachine/answers/pending.py), pure: each request is judged on its own (one that does not
count never hides the ones after it), a sleeper's request counts at its full
reservation, and nothing counts while Docker cannot be read. The API's use of it is
tests/shell/test_pending_requests.py."""

from __future__ import annotations

from support.core import spec

from statemachine.answers.pending import PendingStart, pending_starts, with_pending
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.planning.plan_types import (
    Policy,
)

NOW = 10_000.0
OND = sm.Residency.ON_DEMAND
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 100)


def sv(name: str, mib: int | None, **kw: object) -> sm.ServeSpec:
    return spec(name, mib, OND, **kw)


def desired(*serves: sm.ServeSpec, requests: tuple[sm.OnDemandRequest, ...]) -> sm.DesiredState:
    return sm.DesiredState(
        {"a": sm.GpuRole("a", 40_000, 0)},
        {s.name: s for s in serves},
        requests,
        host=sm.HostBudget(64_000, 4_000),
    )


def req(serve: str, ttl_s: float | None = None, at: float = NOW - 10) -> sm.OnDemandRequest:
    return sm.OnDemandRequest(serve, at, ttl_s)


def pending(
    d: sm.DesiredState, obs: sm.Observed, requester: str | None = None
) -> list[PendingStart]:
    return list(pending_starts(d, obs, policy=Policy(), now=NOW, requester=requester))


def test_a_request_counts_at_the_reservation_its_start_takes() -> None:
    d = desired(sv("x", 6000), requests=(req("x"),))
    assert pending(d, sm.Observed(True, {})) == [PendingStart("x", ("a",), 6000, ())]


def test_nothing_counts_while_docker_cannot_be_read() -> None:
    d = desired(sv("x", 6000), requests=(req("x"),))
    assert pending(d, sm.Observed(False, {})) == []


def test_a_request_that_does_not_count_never_hides_the_ones_after_it() -> None:
    serves = (sv("gone", 1000), sv("run", 2000), sv("late", 3000), sv("x", 6000))
    skipped = {
        "not in the manifest": (req("ghost"), sm.Observed(True, {})),
        "the requester itself": (req("me"), sm.Observed(True, {})),
        "starting": (
            req("gone"),
            sm.Observed(True, {}, starting={"gone": sm.StartingObs(("a",), 1000)}),
        ),
        "expired": (req("late", ttl_s=5.0, at=NOW - 10), sm.Observed(True, {})),
        "holding memory awake": (req("run"), sm.Observed(True, {"c-run": UP})),
    }
    for why, (first, obs) in skipped.items():
        d = desired(*serves, sv("me", 500), requests=(first, req("x")))
        got = pending(d, obs, requester="me")
        assert [p.serve for p in got] == ["x"], why
        assert got[0].mib == 6000, why


def test_a_sleepers_request_counts_at_its_full_reservation() -> None:
    nap = sm.Sleep(1, 1000, SleepProtocol.VLLM, 20_000)
    d = desired(sv("s", 8000, sleep=nap), requests=(req("s"),))
    obs = sm.Observed(
        True,
        {"c-s": UP},
        sleep={"s": sm.SleepObs(sm.SleepState.ASLEEP, level=1)},
    )
    assert [(p.serve, p.mib) for p in pending(d, obs)] == [("s", 8000)]


def test_an_unknown_requester_adds_nothing_to_the_plan() -> None:
    d = desired(sv("x", 6000), requests=(req("x"),))
    assert pending(d, sm.Observed(True, {}), requester="ghost") == [
        PendingStart("x", ("a",), 6000, ())
    ]


def test_pending_starts_are_counted_as_starts_in_progress() -> None:
    obs = sm.Observed(True, {})
    assert with_pending(obs, ()) == obs
    laid = with_pending(obs, (PendingStart("x", ("a",), 6000),))
    assert laid.starting == {"x": sm.StartingObs(("a",), 6000)}
