"""The pure core's rules for a foreign container and an unknown fit, without the shell.

A container bearing a serve's name but another Compose project's label is never a
victim (docs/design.md); a fit on an observation whose Docker reading failed is not
known, never a "no" (docs/operations.md, exit code 3). These cases also live beside the
shell's tests (tests/shell/test_foreign.py, tests/shell/test_cli_polish.py); here they import only
``statemachine``, so the mutation run of the planner and of fit runs them.
"""

from __future__ import annotations

from support.core import spec

from statemachine.answers.fit import fit_serve
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.planning.plan_types import Action, Policy
from statemachine.planning.planner import plan_transitions

NOW = 1_000_000.0


def _spec(name: str, residency: sm.Residency, mib: int, **kw: object) -> sm.ServeSpec:
    return spec(name, mib, residency, compose_project="ours", **kw)


def _host(*serves: sm.ServeSpec, requests: tuple[sm.OnDemandRequest, ...] = ()) -> sm.DesiredState:
    return sm.DesiredState(
        roles={"a": sm.GpuRole("a", 10_000)},
        serves={s.name: s for s in serves},
        requests=requests,
    )


def _running(project: str) -> sm.ContainerObs:
    return sm.ContainerObs(
        sm.ContainerState.RUNNING, started_at=NOW - 3600, compose_project=project, exit_code=0
    )


def test_an_evictable_serve_whose_container_is_anothers_is_never_the_victim() -> None:
    ocr = _spec("ocr", sm.Residency.EVICTABLE, 6000, desired=sm.DesiredRun.RUNNING)
    fast = _spec("fast", sm.Residency.ON_DEMAND, 6000)
    desired = _host(ocr, fast, requests=(sm.OnDemandRequest("fast", NOW - 1),))
    theirs = sm.Observed(docker_ok=True, containers={"c-ocr": _running("theirs")})
    plan = plan_transitions(desired, theirs, Policy(), NOW)
    assert plan.steps == ()
    (blocked,) = plan.blocked
    assert blocked.serve == "fast"
    (guard,) = blocked.protected
    assert guard.serve == "ocr"
    assert guard.why == (
        "container c-ocr belongs to compose project theirs, not ours: it is left alone "
        "(never started, stopped or removed)"
    )
    # the same container of its own project is evicted as any evictable serve
    ours = sm.Observed(docker_ok=True, containers={"c-ocr": _running("ours")})
    steps = [(s.action, s.serve) for s in plan_transitions(desired, ours, Policy(), NOW).steps]
    assert (Action.STOP, "ocr") in steps and (Action.START, "fast") in steps


def test_a_fit_without_a_docker_reading_is_unknown_not_a_no() -> None:
    fast = _spec("fast", sm.Residency.ON_DEMAND, 6000)
    unread = sm.Observed(docker_ok=False)
    answer = fit_serve(_host(fast), unread, "fast", now=NOW)
    assert answer.known is False
    assert answer.fits is False  # nothing is admitted on it
    assert answer.to_json()["fits"] is None
    read = fit_serve(_host(fast), sm.Observed(docker_ok=True), "fast", now=NOW)
    assert read.known is True and read.fits is True
    assert read.to_json()["fits"] is True


def _exited(project: str) -> sm.ContainerObs:
    return sm.ContainerObs(
        sm.ContainerState.EXITED, started_at=NOW - 3600, compose_project=project, exit_code=0
    )


def test_a_stopped_container_of_another_project_is_never_started_and_says_why() -> None:
    """Exited containers bearing the names of ``a-wanted`` (desired running) and
    ``b-asked`` (requested) belong to another project: neither is started, each blocked
    with why; ``c-idle`` (foreign too, wanted by nobody) is not mentioned; ``d-ours``,
    declared after them all, starts."""
    wanted = _spec("a-wanted", sm.Residency.RESIDENT, 1000, desired=sm.DesiredRun.RUNNING)
    asked = _spec("b-asked", sm.Residency.ON_DEMAND, 1000)
    idle = _spec("c-idle", sm.Residency.EVICTABLE, 1000)
    ours = _spec("d-ours", sm.Residency.RESIDENT, 1000, desired=sm.DesiredRun.RUNNING)
    desired = _host(wanted, asked, idle, ours, requests=(sm.OnDemandRequest("b-asked", NOW - 1),))
    observed = sm.Observed(
        docker_ok=True,
        containers={f"c-{s.name}": _exited("theirs") for s in (wanted, asked, idle)},
    )
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert [(s.action, s.serve) for s in plan.steps] == [
        (Action.RESERVE, "d-ours"),
        (Action.START, "d-ours"),
        (Action.AWAIT_READY, "d-ours"),
    ]
    assert {b.serve: b.reason for b in plan.blocked} == {
        n: f"{n} cannot start: container c-{n} belongs to compose project theirs, not ours: "
        "it is left alone (never started, stopped or removed)"
        for n in ("a-wanted", "b-asked")
    }


def test_grow_back_looks_past_an_elastic_serve_whose_container_is_anothers() -> None:
    """``a-theirs`` (elastic, its running container another project's) is neither grown
    nor in the way: ``b-moe``, shrunk to 3000 of 6000 with the room free, grows back."""
    el = sm.Elastic("http://127.0.0.1:1", floor_mib=1000)
    theirs = _spec("a-theirs", sm.Residency.EVICTABLE, 2000, elastic=el)
    moe = _spec("b-moe", sm.Residency.EVICTABLE, 6000, desired=sm.DesiredRun.RUNNING, elastic=el)
    desired = _host(theirs, moe)
    observed = sm.Observed(
        docker_ok=True,
        containers={"c-a-theirs": _running("theirs"), "c-b-moe": _running("ours")},
        elastic_mib={"a-theirs": 1000, "b-moe": 3000},
    )
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert [(s.action, s.serve, s.mib, s.to_mib) for s in plan.steps] == [
        (Action.GROW, "b-moe", 3000, 6000)
    ]


def test_a_running_container_of_another_project_is_never_stopped_whatever_is_declared() -> None:
    """A serve desired stopped, or whose request ended, is stopped, unless the container
    bearing its name is another project's: that one is left running (never stopped)."""
    off = _spec("off", sm.Residency.EVICTABLE, 1000, desired=sm.DesiredRun.STOPPED)
    done = _spec("done", sm.Residency.ON_DEMAND, 1000, idle_ttl_s=60.0)
    ours = _spec("ours", sm.Residency.EVICTABLE, 1000, desired=sm.DesiredRun.STOPPED)
    desired = _host(off, done, ours, requests=(sm.OnDemandRequest("done", NOW - 3600),))
    observed = sm.Observed(
        docker_ok=True,
        containers={
            "c-off": _running("theirs"),
            "c-done": _running("theirs"),
            "c-ours": _running("ours"),
        },
    )
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert {s.serve for s in plan.steps} == {"ours"}  # only our own is stopped
    assert (Action.STOP, "ours") in [(s.action, s.serve) for s in plan.steps]


def test_an_elastic_serve_whose_container_is_anothers_is_never_shrunk() -> None:
    """A serve whose container is another Compose project's is never resized: it gives
    no memory back to a requester, so the request it would have made room for is
    blocked with nothing shrinkable; the same container of its own project is shrunk
    by the whole segments that cover the shortfall."""
    moe = _spec(
        "moe",
        sm.Residency.EVICTABLE,
        6000,
        desired=sm.DesiredRun.RUNNING,
        elastic=sm.Elastic("http://127.0.0.1:1", 1000),
    )
    fast = _spec("fast", sm.Residency.ON_DEMAND, 6000)
    desired = _host(moe, fast, requests=(sm.OnDemandRequest("fast", NOW - 1),))
    theirs = sm.Observed(docker_ok=True, containers={"c-moe": _running("theirs")})
    plan = plan_transitions(desired, theirs, Policy(), NOW)
    assert plan.steps == ()
    (blocked,) = plan.blocked
    assert blocked.serve == "fast"
    assert "free 4000; needs 6000; short 2000; evictable 0; shrinkable 0" in blocked.reason
    assert blocked.shrinkable_mib == (("a", 0),)
    assert [p.serve for p in blocked.protected] == ["moe"]
    ours = sm.Observed(docker_ok=True, containers={"c-moe": _running("ours")})
    steps = plan_transitions(desired, ours, Policy(), NOW).steps
    assert [(s.action, s.serve, s.mib) for s in steps][:2] == [
        (Action.SHRINK, "moe", 2048),
        (Action.RESERVE, "fast", 6000),
    ]


def test_a_quiesced_serve_whose_container_is_anothers_is_not_readmitted() -> None:
    """A serve whose container is another Compose project's is never acted on: its
    tier, left quiesced, is not readmitted while that container runs; the same
    container of its own project is readmitted."""
    omni = _spec(
        "omni",
        sm.Residency.EVICTABLE,
        3000,
        desired=sm.DesiredRun.RUNNING,
        router_tier="omni-local",
    )
    desired = _host(omni)
    quiesced = frozenset({"omni"})
    theirs = sm.Observed(True, {"c-omni": _running("theirs")}, quiesced=quiesced)
    assert plan_transitions(desired, theirs, Policy(), NOW).steps == ()
    ours = sm.Observed(True, {"c-omni": _running("ours")}, quiesced=quiesced)
    steps = plan_transitions(desired, ours, Policy(), NOW).steps
    assert [(s.action, s.serve) for s in steps] == [(Action.READMIT, "omni")]


def test_a_sleeper_whose_container_is_anothers_is_never_woken() -> None:
    """A serve whose container is another Compose project's is never acted on, whatever
    sleep state is observed for it: while that container runs it is neither woken nor
    reported as blocked; the same container of its own project is woken."""
    coder = _spec(
        "coder",
        sm.Residency.EVICTABLE,
        3000,
        desired=sm.DesiredRun.RUNNING,
        sleep=sm.Sleep(1, 500, SleepProtocol.VLLM),
    )
    desired = _host(coder)
    asleep = {"coder": sm.SleepObs(sm.SleepState.ASLEEP, level=1)}
    theirs = sm.Observed(True, {"c-coder": _running("theirs")}, sleep=asleep)
    plan = plan_transitions(desired, theirs, Policy(), NOW)
    assert plan.steps == () and plan.blocked == ()
    ours = sm.Observed(True, {"c-coder": _running("ours")}, sleep=asleep)
    steps = plan_transitions(desired, ours, Policy(), NOW).steps
    assert [(s.action, s.serve) for s in steps] == [
        (Action.RESERVE_WAKE, "coder"),
        (Action.WAKE, "coder"),
        (Action.AWAIT_READY, "coder"),
    ]
