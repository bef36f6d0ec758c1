"""Pure tests of the per-serve record (``statemachine.lifecycle.serve_record``).

The record's lifecycle state moves only along the machine's declared transitions:
by a trigger the executor fires, or by an observation (the observation triggers,
``recover`` / ``reset`` for a failed serve, the confirmations an observation brings),
and where the machine declares no path the record is adopted in the state seen. The
expected paths below are written out by hand, independently of the module's table.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from statemachine.answers.status_report import host_status
from statemachine.domain import types as sm
from statemachine.lifecycle.backoff import Backoff
from statemachine.lifecycle.machine import IllegalTransition, LifecycleState, Trigger, next_state
from statemachine.lifecycle.serve_record import (
    CLEAN_EXITS,
    OBSERVATION_PATHS,
    ServeRecord,
    fire,
    observation_path,
    observe,
    plan_reading,
    reading,
)

S = LifecycleState
T = Trigger

#: what an observation can show of a serve
READINGS = (S.STOPPED, S.STARTING, S.RUNNING, S.ASLEEP, S.FAILED)

#: the declared paths, by hand: (state, seen) -> triggers
EXPECTED_PATHS = {
    (S.STOPPED, S.RUNNING): ("observe_running",),
    (S.STOPPED, S.ASLEEP): ("observe_running", "observe_asleep"),
    (S.RESERVED, S.STOPPED): ("abandon",),
    (S.RESERVED, S.RUNNING): ("abandon", "observe_running"),
    (S.RESERVED, S.FAILED): ("start_failed",),
    (S.STARTING, S.RUNNING): ("ready",),
    (S.STARTING, S.FAILED): ("start_failed",),
    (S.RUNNING, S.STOPPED): ("observe_stopped",),
    (S.RUNNING, S.ASLEEP): ("observe_asleep",),
    (S.RUNNING, S.FAILED): ("fail",),
    (S.QUIESCING, S.STOPPED): ("observe_stopped",),
    (S.QUIESCING, S.FAILED): ("fail",),
    (S.DRAINING, S.STOPPED): ("observe_stopped",),
    (S.DRAINING, S.FAILED): ("fail",),
    (S.STOPPING, S.STOPPED): ("stopped",),
    (S.STOPPING, S.FAILED): ("stop_failed",),
    (S.SLEEPING, S.ASLEEP): ("slept",),
    (S.SLEEPING, S.FAILED): ("fail",),
    (S.ASLEEP, S.STOPPED): ("observe_stopped",),
    (S.ASLEEP, S.RUNNING): ("observe_awake",),
    (S.ASLEEP, S.FAILED): ("fail",),
    (S.WAKING, S.RUNNING): ("ready",),
    (S.WAKING, S.FAILED): ("fail",),
    (S.FAILED, S.STOPPED): ("reset",),
    (S.FAILED, S.RUNNING): ("recover",),
    (S.FAILED, S.ASLEEP): ("recover", "observe_asleep"),
}


def test_the_observation_paths_are_the_ones_written_out_here() -> None:
    assert {k: tuple(str(t) for t in v) for k, v in OBSERVATION_PATHS.items()} == EXPECTED_PATHS


@pytest.mark.parametrize(("pair", "path"), sorted(EXPECTED_PATHS.items()))
def test_each_path_is_legal_and_ends_where_the_observation_shows(
    pair: tuple[LifecycleState, LifecycleState], path: tuple[str, ...]
) -> None:
    state, seen = pair
    for trigger in path:
        moved = next_state(state, trigger)
        assert moved is not None, f"{trigger} is not legal from {state}"
        state = moved
    assert state is seen


@given(st.sampled_from(list(S)), st.sampled_from(READINGS))
def test_observation_always_lands_on_what_was_seen(state: LifecycleState, seen: S) -> None:
    record = ServeRecord("omni", state)
    moved = observe(record, seen)
    assert moved.lifecycle is seen
    assert moved.serve == "omni"
    path = observation_path(state, seen)
    event(
        "already there"
        if state is seen
        else "a declared path"
        if (state, seen) in EXPECTED_PATHS
        else "adopted"
    )
    if state is seen:
        assert path == ()
    elif (state, seen) in EXPECTED_PATHS:
        assert path == EXPECTED_PATHS[(state, seen)]
    else:
        assert path is None  # adopted: no declared path


def test_a_record_with_no_declared_path_is_adopted_in_the_state_seen() -> None:
    assert observation_path(S.RUNNING, S.STARTING) is None
    assert observation_path(S.STOPPED, S.FAILED) is None
    record = ServeRecord("omni", S.RUNNING, no_sleep=True)
    assert observe(record, S.STARTING) == ServeRecord("omni", S.STARTING, no_sleep=True)


def test_observation_keeps_the_marks() -> None:
    b = Backoff(failures=2)
    record = ServeRecord("omni", S.FAILED, backoff=b, no_shrink=True, ran_healthy=5.0)
    moved = observe(record, S.RUNNING)
    assert moved == ServeRecord("omni", S.RUNNING, backoff=b, no_shrink=True, ran_healthy=5.0)
    assert moved.backoff is b


def test_a_failed_serve_is_recovered_when_seen_running_and_reset_when_seen_down() -> None:
    failed = ServeRecord("omni", S.FAILED)
    assert observe(failed, S.RUNNING).lifecycle is S.RUNNING
    assert observation_path(S.FAILED, S.RUNNING) == (T.RECOVER,)
    assert observation_path(S.FAILED, S.STOPPED) == (T.RESET,)
    assert observe(failed, S.FAILED) == failed


def test_fire_moves_the_record_along_a_legal_trigger() -> None:
    record = ServeRecord("omni", unreleased=True)
    reserved = fire(record, "reserve")
    assert reserved == ServeRecord("omni", S.RESERVED, unreleased=True)
    assert fire(fire(reserved, "start"), "ready").lifecycle is S.RUNNING


def test_fire_refuses_an_illegal_trigger_and_names_it() -> None:
    with pytest.raises(IllegalTransition) as err:
        fire(ServeRecord("omni"), "start")
    assert (err.value.serve, err.value.state, err.value.trigger) == ("omni", "stopped", "start")
    with pytest.raises(IllegalTransition):
        fire(ServeRecord("omni", S.RUNNING), "no such trigger")


def test_a_fresh_record_is_stopped_with_no_marks() -> None:
    record = ServeRecord("omni")
    assert record.lifecycle is S.STOPPED
    assert record.backoff is None and record.placement is None
    assert not (record.no_sleep or record.no_shrink or record.quiesced or record.unreleased)
    assert record.stopped_by_us is None and record.ran_healthy is None


# --- what an observation shows ----------------------------------------------------------


def test_clean_exits_are_none_zero_sigint_and_sigterm() -> None:
    assert frozenset({None, 0, 130, 143}) == CLEAN_EXITS


@pytest.mark.parametrize(
    ("obs", "state"),
    [
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, oom_killed=False), S.STOPPED),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=143), S.STOPPED),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=137), S.FAILED),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=1), S.FAILED),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, oom_killed=True), S.FAILED),
        (sm.ContainerObs(sm.ContainerState.DEAD, exit_code=0), S.FAILED),
        (sm.ContainerObs(sm.ContainerState.CREATED, exit_code=1), S.STOPPED),
        (sm.ContainerObs(sm.ContainerState.ABSENT), S.STOPPED),
        (sm.ContainerObs(sm.ContainerState.RESTARTING, exit_code=1), S.STARTING),
        (sm.ContainerObs(sm.ContainerState.RUNNING, health="starting"), S.STARTING),
        (sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy"), S.RUNNING),
        (sm.ContainerObs(sm.ContainerState.RUNNING, health="unhealthy"), S.RUNNING),
        (sm.ContainerObs(sm.ContainerState.PAUSED), S.RUNNING),
    ],
)
def test_reading_of_a_container(obs: sm.ContainerObs, state: LifecycleState) -> None:
    assert reading(obs) is state


def test_reading_of_a_sleeping_engine_and_of_a_start_in_progress() -> None:
    up = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy")
    assert reading(up, asleep=True) is S.ASLEEP
    assert (
        reading(sm.ContainerObs(sm.ContainerState.RUNNING, health="starting"), asleep=True)
        is S.ASLEEP
    )
    assert reading(sm.ContainerObs(sm.ContainerState.ABSENT), asleep=True) is S.STOPPED
    assert reading(sm.ContainerObs(sm.ContainerState.ABSENT), starting=True) is S.STARTING
    assert reading(up, asleep=True, starting=True) is S.STARTING


@pytest.mark.parametrize(
    ("obs", "asleep", "state"),
    [
        (sm.ContainerObs(sm.ContainerState.RUNNING, health="starting"), False, S.RUNNING),
        (sm.ContainerObs(sm.ContainerState.RESTARTING), False, S.RUNNING),
        (sm.ContainerObs(sm.ContainerState.RUNNING), True, S.ASLEEP),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=137), False, S.STOPPED),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=137), True, S.STOPPED),
        (sm.ContainerObs(sm.ContainerState.ABSENT), False, S.STOPPED),
    ],
)
def test_plan_reading_is_held_or_not(obs: sm.ContainerObs, asleep: bool, state: S) -> None:
    assert plan_reading(obs, asleep=asleep) is state


def test_plan_reading_defaults_to_awake() -> None:
    assert plan_reading(sm.ContainerObs(sm.ContainerState.RUNNING)) is S.RUNNING


@given(st.sampled_from(list(sm.ContainerState)), st.booleans())
def test_a_failed_record_is_planned_from_reset_or_recover(
    state: sm.ContainerState, up: bool
) -> None:
    obs = sm.ContainerObs(state, exit_code=1)
    planned = observe(ServeRecord("omni", S.FAILED), plan_reading(obs, asleep=up))
    event(f"planned from {planned.lifecycle.value}")
    assert planned.lifecycle in (S.STOPPED, S.RUNNING, S.ASLEEP)
    assert (planned.lifecycle is S.STOPPED) is (not obs.holds)


# --- status reads the record ------------------------------------------------------------


def test_status_shows_each_serves_record_moved_by_the_observation() -> None:
    omni = sm.ServeSpec(
        "omni", "omni-ctr", ("g0",), 4000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING
    )
    desired = sm.DesiredState({"g0": sm.GpuRole("g0", 20_000, 0)}, {"omni": omni})
    killed = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=137)
    observed = sm.Observed(docker_ok=True, containers={"omni-ctr": killed})
    records = {"omni": ServeRecord("omni", S.RUNNING)}
    (row,) = host_status(desired, observed, records).serves
    assert row.lifecycle == "failed"
    (row,) = host_status(desired, observed).serves  # no record: a fresh one, moved the same
    assert row.lifecycle == "failed"
    (row,) = host_status(desired, sm.Observed(docker_ok=False), records).serves
    assert row.lifecycle == "unknown"
