"""A serve's record survives a controller restart and is moved on by observation.

Against the real daemon, with the loop in-process: the lifecycle state each serve's
record holds is kept in the journal, loaded by the next controller and moved on from
there by what it observes (along the lifecycle machine's declared triggers), never
re-derived from the containers alone. A container killed outside the controller while
it was down is seen as a failure of a *running* serve (``fail``); the record stays
``failed`` while its backoff holds it, across another restart; once the container runs
again the next controller *recovers* it (``recover``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import docker
import pynvml
import pytest
from support.fakes_nvml import FakeNvml, nvml_error
from support.waiting import wait_for
from test_loop_events import Running, create, manifest, names

from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.store.journal import Journal, journal_path
from statemachine.lifecycle.machine import LifecycleState, Trigger

__all__ = ["names"]  # the fixture, shared with test_loop_events

pytestmark = pytest.mark.docker

S = LifecycleState


def _controller(path: Path, state: Path, *, hold_s: float) -> Controller:
    c = Controller(
        RunOptions(
            manifests=(path,),
            state_dir=state,
            resync_s=3600.0,
            backoff_base_s=hold_s,
            backoff_cap_s=max(hold_s, 1.0),
        ),
        load_manifest_set([path]),
    )
    c.nvml = FakeNvml(init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    return c


def _journalled(state: Path) -> dict[str, str]:
    with Journal.open(journal_path(state), readonly=True) as j:
        return j.lifecycles()


#: the reason of the cycle a test asks for (:func:`_looked_again`)
LOOK_AGAIN = "test: look again"


def _plans(c: Controller) -> list[tuple[tuple[str, ...], list[str]]]:
    """Each cycle's reasons and plan (``"action serve"``), as ``c``'s loop runs them."""
    seen: list[tuple[tuple[str, ...], list[str]]] = []

    def note(c: Controller) -> None:
        plan = c.last.plan
        steps = [] if plan is None else [f"{s.action} {s.serve}" for s in plan.steps]
        seen.append((c.last.reasons, steps))

    c.on_cycle.append(note)
    return seen


def _looked_again(c: Controller, seen: list[tuple[tuple[str, ...], list[str]]]) -> list[str]:
    """Ask ``c``'s running loop for a cycle now and wait for it to end: its plan."""
    aio = wait_for("the loop to start", lambda: c.aio)
    aio.call_soon_threadsafe(c.trigger, LOOK_AGAIN)

    def ended() -> tuple[list[str]] | None:
        return next(((steps,) for why, steps in list(seen) if LOOK_AGAIN in why), None)

    (steps,) = wait_for("the cycle asked for", ended)
    return steps


def test_the_lifecycle_survives_a_restart_and_a_killed_serve_is_failed_then_recovered(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    ctr = names("kept")
    create(docker_client, test_image, ctr)
    path, state = tmp_path / "serves.toml", tmp_path / "state"
    path.write_text(manifest([("kept", ctr, "running")]))

    # the first controller starts the serve: its record is running, and journalled
    first = _controller(path, state, hold_s=3600.0)
    run = Running(first)
    try:
        # running in its record and in the journal: an observation taken while the start
        # was in progress may still be applied after it (the next one moves it on)
        wait_for(
            "kept running in its record and journalled",
            lambda: (
                first.serve_records.get("kept").lifecycle is S.RUNNING
                and _journalled(state) == {"kept": "running"}
            ),
        )
    finally:
        run.stop()
    assert _journalled(state) == {"kept": "running"}

    # killed while no controller runs
    docker_client.containers.get(ctr).kill()
    wait_for("the kill", lambda: docker_client.containers.get(ctr).status == "exited")

    # the next controller starts from the journal's "running": the dead container is a
    # failure of a running serve (fail), and the backoff holds it failed
    second = _controller(path, state, hold_s=3600.0)
    planned = _plans(second)
    run = Running(second)
    try:
        failed = wait_for(
            "kept failed in its record",
            lambda: second.serve_records.get("kept").lifecycle is S.FAILED,
        )
        assert failed
        moves = [m for m in second.serve_records.observed_moves() if m.serve == "kept"]
        assert [(m.before, m.after, m.triggers) for m in moves] == [
            (S.RUNNING, S.FAILED, (Trigger.FAIL,))
        ]
        assert second.backoff["kept"].failures == 1
        # held: a cycle asked for after the failure was recorded plans nothing for it
        assert _looked_again(second, planned) == []
        assert docker_client.containers.get(ctr).status == "exited"
        assert second.serve_records.get("kept").lifecycle is S.FAILED
    finally:
        run.stop()
    assert _journalled(state) == {"kept": "failed"}

    # Docker (or someone) runs it again while no controller runs: the next controller
    # finds the failed serve running and recovers it, without a start of its own
    docker_client.containers.get(ctr).start()
    started = docker_client.containers.get(ctr).attrs["State"]["StartedAt"]
    third = _controller(path, state, hold_s=3600.0)
    run = Running(third)
    try:
        wait_for(
            "kept recovered in its record",
            lambda: third.serve_records.get("kept").lifecycle is S.RUNNING,
        )
        moves = [m for m in third.serve_records.observed_moves() if m.serve == "kept"]
        assert [(m.before, m.after, m.triggers) for m in moves] == [
            (S.FAILED, S.RUNNING, (Trigger.RECOVER,))
        ]
        assert docker_client.containers.get(ctr).attrs["State"]["StartedAt"] == started
    finally:
        run.stop()
    assert _journalled(state) == {"kept": "running"}
