"""The planner and starts in progress (``Observed.starting``).

The executor carries a start out beside the loop (``up``, then the wait for health), so
the planner sees serves whose start is in progress: they hold their reservation whatever
their container shows (absent, created, running but not yet healthy), are not started
again, not stopped, not chosen as victims and not resized until the start ends; and
engines that size themselves from free memory at load (vLLM, SGLang) start one at a
time per GPU role, while other serves start side by side. Written from those rules.
"""

from __future__ import annotations

from support.core import spec

from statemachine.domain import types as sm
from statemachine.ledger.reservations import Refusal, ledger_from_observed
from statemachine.planning.plan_types import (
    Plan,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.planning.simulate import ledger_prefixes

NOW = 10_000.0
RUN, STOP = sm.DesiredRun.RUNNING, sm.DesiredRun.STOPPED
RES, EVI, OND = sm.Residency.RESIDENT, sm.Residency.EVICTABLE, sm.Residency.ON_DEMAND


def serve(
    name: str, mib: int, residency: sm.Residency, desired: sm.DesiredRun | None = RUN, **kw: object
) -> sm.ServeSpec:
    return spec(name, mib, residency, desired=desired, **kw)


def desired(
    *serves: sm.ServeSpec, requests: tuple[sm.OnDemandRequest, ...] = ()
) -> sm.DesiredState:
    return sm.DesiredState({"a": sm.GpuRole("a", 10_000, 0)}, {s.name: s for s in serves}, requests)


def up() -> sm.ContainerObs:
    return sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 1000)


def lines(plan: Plan) -> list[str]:
    return [f"{s.action} {s.serve}" for s in plan.steps]


def test_a_start_in_progress_holds_its_reservation_whatever_its_container_shows() -> None:
    d = desired(serve("slow", 6000, RES), serve("other", 5000, RES))
    for container in ({}, {"c-slow": sm.ContainerObs(sm.ContainerState.CREATED)}):
        obs = sm.Observed(True, container, starting={"slow": sm.StartingObs(("a",), 6000)})
        ledger = ledger_from_observed(d, obs)
        assert ledger.committed_mib("a") == 6000
        plan = plan_transitions(d, obs, Policy(), NOW)
        # not started twice, and the other resident (5000) does not fit beside it
        assert lines(plan) == []
        assert [b.serve for b in plan.blocked] == ["other"]
        assert "free 4000" in plan.blocked[0].reason


def test_a_start_in_progress_counts_at_least_what_was_reserved_for_it() -> None:
    # the manifest now declares less than was reserved for the start: the larger counts
    d = desired(serve("slow", 2000, RES))
    ledger = ledger_from_observed(
        d, sm.Observed(True, {}, starting={"slow": sm.StartingObs(("a",), 6000)})
    )
    assert ledger.committed_mib("a") == 6000


def test_a_start_in_progress_is_not_a_victim_and_not_stopped() -> None:
    d = desired(
        serve("evi", 6000, EVI),
        serve("llm", 6000, OND, None),
        requests=(sm.OnDemandRequest("llm", NOW - 1),),
    )
    plan = plan_transitions(
        d, sm.Observed(True, {}, starting={"evi": sm.StartingObs(("a",), 6000)}), Policy(), NOW
    )
    assert lines(plan) == []
    (blocked,) = plan.blocked
    assert blocked.serve == "llm"
    assert any(p.serve == "evi" and "in progress" in p.why for p in blocked.protected)
    # desired stopped while starting: the stop waits until the start has ended
    d2 = desired(serve("evi", 6000, EVI, STOP))
    assert (
        lines(
            plan_transitions(
                d2, sm.Observed(True, {}, starting={"evi": sm.StartingObs(("a",), 6000)}), None, NOW
            )
        )
        == []
    )
    # once the start has ended (the container runs, nothing in progress) it is stopped
    after = plan_transitions(d2, sm.Observed(True, {"c-evi": up()}), None, NOW)
    assert lines(after) == ["stop evi", "release evi"]


def test_a_start_in_progress_is_not_resized() -> None:
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=1000)
    d = desired(
        serve("moe", 6000, EVI, elastic=el),
        serve("llm", 6000, OND, None),
        requests=(sm.OnDemandRequest("llm", NOW - 1),),
    )
    shrunk = sm.Observed(
        True,
        {"c-moe": up()},
        elastic_mib={"moe": 3000},
        starting={"moe": sm.StartingObs(("a",), 3000)},
    )
    assert not any(
        s.action in ("shrink", "grow") for s in plan_transitions(d, shrunk, None, NOW).steps
    )


def test_engines_that_size_from_free_memory_start_one_at_a_time_per_gpu() -> None:
    a = serve("a", 3000, RES, sizes_from_free=True)
    b = serve("b", 3000, RES, sizes_from_free=True)
    c = serve("c", 3000, RES)  # llama.cpp or a sidecar: allocates what it asks for
    d = desired(a, b, c)
    cold = plan_transitions(d, sm.Observed(True, {}), None, NOW)
    starts = [s.serve for s in cold.steps if s.action == "start"]
    assert starts == ["a", "c"]
    (blocked,) = cold.blocked
    assert blocked.serve == "b" and "waits for the start of a" in blocked.reason
    # a in progress from an earlier plan: b still waits, c (not sizing from free) starts
    mid = plan_transitions(
        d, sm.Observed(True, {}, starting={"a": sm.StartingObs(("a",), 3000)}), None, NOW
    )
    assert [s.serve for s in mid.steps if s.action == "start"] == ["c"]
    assert [x.serve for x in mid.blocked] == ["b"]
    # a's start ended: b may start now
    done = plan_transitions(d, sm.Observed(True, {"c-a": up(), "c-c": up()}), None, NOW)
    assert [s.serve for s in done.steps if s.action == "start"] == ["b"]
    for step, result in ledger_prefixes(done):
        assert not isinstance(result, Refusal), (step, result)


def test_sizing_engines_on_other_gpus_start_side_by_side() -> None:
    roles = {"a": sm.GpuRole("a", 10_000, 0), "b": sm.GpuRole("b", 10_000, 0)}
    a = serve("a", 3000, RES, sizes_from_free=True)
    b = sm.ServeSpec("b", "c-b", ("b",), 3000, RES, RUN, sizes_from_free=True)
    plan = plan_transitions(
        sm.DesiredState(roles, {"a": a, "b": b}), sm.Observed(True, {}), None, NOW
    )
    assert [s.serve for s in plan.steps if s.action == "start"] == ["a", "b"]


def test_a_sizing_engine_still_loading_outside_the_controller_holds_the_next() -> None:
    # a vLLM started by an earlier controller (or a restart policy) whose healthcheck
    # still says "starting": another such engine on the GPU waits for it too
    a = serve("a", 3000, RES, sizes_from_free=True)
    b = serve("b", 3000, RES, sizes_from_free=True)
    loading = sm.ContainerObs(sm.ContainerState.RUNNING, health="starting", started_at=NOW - 5)
    plan = plan_transitions(desired(a, b), sm.Observed(True, {"c-a": loading}), None, NOW)
    assert [s.serve for s in plan.steps if s.action == "start"] == []
    assert [x.serve for x in plan.blocked] == ["b"]
    healthy = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=NOW - 5)
    plan = plan_transitions(desired(a, b), sm.Observed(True, {"c-a": healthy}), None, NOW)
    assert [s.serve for s in plan.steps if s.action == "start"] == ["b"]


def test_a_start_in_progress_is_not_grown_to_what_its_container_was_started_with() -> None:
    """An elastic serve whose start is in progress is not resized until the start ends,
    not even grown back to the larger reservation its container's record names; once
    the start has ended it grows back to that figure as the room allows."""
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=1000)
    d = desired(serve("moe", 6000, EVI, elastic=el))
    record = {"c-moe": sm.StartedWith("moe", ("a",), 8000)}
    starting = sm.Observed(
        True, {"c-moe": up()}, starting={"moe": sm.StartingObs(("a",), 6000)}, started_with=record
    )
    assert plan_transitions(d, starting, None, NOW).steps == ()
    ended = sm.Observed(True, {"c-moe": up()}, started_with=record, elastic_mib={"moe": 6000})
    plan = plan_transitions(d, ended, None, NOW)
    assert [(f"{s.action} {s.serve}", s.mib, s.to_mib) for s in plan.steps] == [
        ("grow moe", 2000, 8000)
    ]
