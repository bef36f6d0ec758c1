"""The loop's failure backoff: a serve that crashes after every healthy start backs off
ever longer, a requested serve backs off like a desired-running one, and the count is
forgotten once the serve stays up longer than the cap.

These drive the Controller's bookkeeping directly with observations (no daemon):
what is under test is the arithmetic of the backoff, not docker.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.manifests import ONE_RESIDENT

from controller.manifest import load_manifest_set
from controller.service.executor import ExecutionReport, Outcome, StepResult
from controller.service.loop import Controller, RunOptions
from controller.store.journal import Journal, journal_path
from statemachine.domain.types import ContainerObs, ContainerState, Observed
from statemachine.ledger.reservations import Ledger
from statemachine.lifecycle import backoff
from statemachine.planning.plan_types import (
    Action,
    Step,
)

MANIFEST = (
    ONE_RESIDENT
    + """
[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "a"
vram_mib = 2000
residency = "on-demand"
"""
)


def controller(tmp_path: Path) -> Controller:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    c = Controller(
        RunOptions(
            manifests=(path,), state_dir=tmp_path / "state", backoff_base_s=5, backoff_cap_s=300
        ),
        load_manifest_set([path]),
    )
    c.journal = Journal.open(journal_path(tmp_path / "state"))
    return c


def crashed(started: float) -> Observed:
    return Observed(
        True,
        {
            "c-res": ContainerObs(ContainerState.EXITED, started_at=started, exit_code=1),
            "c-llm": ContainerObs(ContainerState.EXITED, started_at=started, exit_code=1),
        },
    )


def healthy_start(c: Controller, serve: str, at: float) -> None:
    step = Step(Action.AWAIT_READY, serve, ("a",), None, "")
    report = ExecutionReport([StepResult(step, Outcome.OK, "healthy", 0.1)], Ledger({}), {})
    c.reconciler.lessons.learn(report, at)


def test_crash_after_every_healthy_start_doubles_the_backoff(tmp_path: Path) -> None:
    c = controller(tmp_path)
    delays = []
    for i in range(4):
        t = 1000.0 + i * 1000
        c.reconciler.lessons.note_deaths(crashed(t - 50), t)
        delays.append(round(c.backoff["res"].until - t))
        healthy_start(c, "res", t + 10)
        assert c.policy(t + 20).hold == {}  # healthy: no hold until the next crash
    assert delays == [5, 10, 20, 40]


def running(started: float, health: str | None = None) -> Observed:
    return Observed(
        True, {"c-res": ContainerObs(ContainerState.RUNNING, started_at=started, health=health)}
    )


def test_the_first_death_after_a_healthy_run_is_tried_at_once_then_backs_off(
    tmp_path: Path,
) -> None:
    """As Docker's restart policy and the kubelet: a serve seen running that dies is
    started again at once; the deaths after it, within the crash loop, back off from the
    base (5, 10, 20 s), and the loop is woken when each hold ends."""
    c = controller(tmp_path)
    holds = []
    for i in range(4):
        t = 1000.0 + i * 100
        c.reconciler.lessons.note_deaths(
            running(t - 50), t - 10
        )  # seen running (healthy) by this loop
        c.reconciler.lessons.note_deaths(crashed(t - 50), t)
        holds.append(round(c.backoff["res"].until - t))
        assert backoff.next_end(c.backoff, t) == (None if not holds[-1] else t + holds[-1])
        healthy_start(c, "res", t + 1)
    assert holds == [0, 5, 10, 20]
    assert c.backoff["res"].failures == 4


def test_a_death_never_seen_running_healthy_is_held_from_the_first(tmp_path: Path) -> None:
    """Not seen running by this loop (it died between two looks, or before this
    controller began), or last seen unhealthy: no run known healthy, the base hold."""
    c = controller(tmp_path)
    c.reconciler.lessons.note_deaths(crashed(950.0), 1000.0)
    assert round(c.backoff["res"].until - 1000.0) == 5
    (tmp_path / "unhealthy").mkdir()
    c2 = controller(tmp_path / "unhealthy")
    c2.reconciler.lessons.note_deaths(running(950.0, health="unhealthy"), 990.0)
    c2.reconciler.lessons.note_deaths(crashed(950.0), 1000.0)
    assert round(c2.backoff["res"].until - 1000.0) == 5
    # seen running, but an earlier container: this one never was
    (tmp_path / "other").mkdir()
    c3 = controller(tmp_path / "other")
    c3.reconciler.lessons.note_deaths(running(900.0), 940.0)
    c3.reconciler.lessons.note_deaths(crashed(950.0), 1000.0)
    assert round(c3.backoff["res"].until - 1000.0) == 5


def test_after_the_crash_loop_ends_the_next_death_is_tried_at_once_again(tmp_path: Path) -> None:
    c = controller(tmp_path)
    c.reconciler.lessons.note_deaths(running(950.0), 990.0)
    c.reconciler.lessons.note_deaths(crashed(950.0), 1000.0)
    c.reconciler.lessons.note_deaths(running(1001.0), 1002.0)
    c.reconciler.lessons.note_deaths(crashed(1001.0), 1010.0)
    assert c.backoff["res"].failures == 2
    c.reconciler.lessons.note_deaths(running(1011.0), 1400.0)  # up for longer than the 300 s cap
    assert "res" not in c.backoff
    c.reconciler.lessons.note_deaths(crashed(1011.0), 1500.0)
    assert c.backoff["res"].failures == 1 and c.backoff["res"].until == 1500.0


def test_a_requested_serve_backs_off_too(tmp_path: Path) -> None:
    c = controller(tmp_path)
    c.journal.add_request("llm", 900.0, None)
    c.reconciler.lessons.note_deaths(crashed(950.0), 1000.0)
    assert c.backoff["llm"].failures == 1
    assert "llm" in c.policy(1001.0).hold


def test_the_count_is_forgotten_once_the_serve_stays_up(tmp_path: Path) -> None:
    c = controller(tmp_path)
    c.reconciler.lessons.note_deaths(crashed(950.0), 1000.0)
    up = Observed(True, {"c-res": ContainerObs(ContainerState.RUNNING, started_at=1010.0)})
    c.reconciler.lessons.note_deaths(up, 1100.0)
    assert "res" in c.backoff  # up for 90 s: not yet
    c.reconciler.lessons.note_deaths(up, 1400.0)
    assert "res" not in c.backoff  # up for longer than the 300 s cap


def test_tiers_left_quiesced_are_remembered_and_recovered_after_a_kill(tmp_path: Path) -> None:
    c = controller(tmp_path)

    def step(action: str, serve: str, outcome: str) -> dict[str, object]:
        return {"action": action, "serve": serve, "outcome": outcome}

    # a drain that timed out: the undo's readmit may have failed too -> remember it
    c.reconciler.lessons.track_tiers(
        [step("quiesce", "res", "ok"), step("drain", "res", "aborted")]
    )
    assert c.serve_records.quiesced == {"res"}
    c.reconciler.lessons.track_tiers([step("readmit", "res", "ok")])
    assert c.serve_records.quiesced == set()
    # a start interrupted before its readmit
    c.reconciler.lessons.track_tiers(
        [step("start", "llm", "ok"), step("readmit", "llm", "skipped")]
    )
    assert c.serve_records.quiesced == {"llm"}

    # the controller was killed mid-plan: the cycle has a plan and no outcome
    (tmp_path / "again").mkdir()
    c2 = controller(tmp_path / "again")
    c2.journal.record_cycle(
        at=1.0,
        manifest_digest="d",
        manifest_files={},
        observed={"docker": "ok"},
        plan={"steps": [{"action": "quiesce", "serve": "res"}, {"action": "stop", "serve": "res"}]},
        requests=[],
        dry_run=False,
    )
    c2.reconciler.lessons.recover_tiers()
    assert c2.serve_records.quiesced == {"res"}


def test_unreleased_memory_stays_counted_until_nvml_shows_it_back(tmp_path: Path) -> None:
    from controller.snapshot import parse_snapshot

    c = controller(tmp_path)
    c.serve_records.unreleased.add("res")

    def snap(gpus: object, used: int | None, state: str = "exited") -> object:
        return parse_snapshot(
            {
                "docker": "ok",
                "containers": {"c-res": {"state": state, "gpu_used_mib": used}},
                "gpus": gpus,
            }
        )

    device = [{"uuid": "GPU-0", "total_mib": 10000, "used_mib": 3000, "free_mib": 7000}]
    assert c.reconciler.lessons.still_unreleased(snap(None, None)) == [
        "res"
    ]  # no NVML: cannot confirm
    assert c.reconciler.lessons.still_unreleased(snap(device, 2500)) == [
        "res"
    ]  # a process still holds it
    assert (
        c.reconciler.lessons.still_unreleased(snap(device, None)) == []
    )  # nothing attributed any more
    c.serve_records.unreleased.add("res")
    assert (
        c.reconciler.lessons.still_unreleased(snap(None, None, state="running")) == []
    )  # runs: holds as usual


def failed_start(serve: str, *, ended_at: float, died_started_at: float | None) -> ExecutionReport:
    step = Step(Action.AWAIT_READY, serve, ("a",), None, "")
    result = StepResult(
        step,
        Outcome.FAILED,
        "c-res exited (1) while starting",
        20.0,
        ended_at=ended_at,
        died_started_at=died_started_at,
    )
    return ExecutionReport([result], Ledger({}), {})


def test_the_backoff_counts_from_the_failure_not_from_the_cycle(tmp_path: Path) -> None:
    c = controller(tmp_path)
    cycle_began = 1000.0
    # the start failed 20 s into the cycle: the 5 s backoff runs from then
    c.reconciler.lessons.learn(
        failed_start("res", ended_at=1020.0, died_started_at=None), cycle_began
    )
    assert c.backoff["res"].until == 1025.0
    assert "res" in c.policy(1021.0).hold and "res" not in c.policy(1025.5).hold


def test_a_death_seen_by_the_failed_start_is_counted_once(tmp_path: Path) -> None:
    c = controller(tmp_path)
    c.reconciler.lessons.learn(failed_start("res", ended_at=1003.0, died_started_at=1001.0), 1000.0)
    # the next cycle observes the same exited container (started 1001): not a second failure
    c.reconciler.lessons.note_deaths(crashed(1001.0), 1004.0)
    assert c.backoff["res"].failures == 1
    assert c.backoff["res"].until == 1008.0  # the first backoff is 5 s, not 10 s
    # and in the other order: the death observed first, then the start's own report
    (tmp_path / "other").mkdir()
    c2 = controller(tmp_path / "other")
    c2.reconciler.lessons.note_deaths(crashed(1001.0), 1002.0)
    c2.reconciler.lessons.learn(
        failed_start("res", ended_at=1003.0, died_started_at=1001.0), 1000.0
    )
    assert c2.backoff["res"].failures == 1
    # a later crash of a new start counts again
    c.reconciler.lessons.note_deaths(crashed(1100.0), 1101.0)
    assert c.backoff["res"].failures == 2


def test_the_interfaces_read_a_frozen_copy_of_the_loop(tmp_path: Path) -> None:
    """``view()`` copies what the loop knows: later changes do not reach a view taken."""
    c = controller(tmp_path)
    c.failures.fail("res", "container exited 1", 1000.0)
    c.no_shrink.add("llm")
    view = c.view()
    assert view.backoff["res"].failures == 1 and view.no_shrink == frozenset({"llm"})
    assert view.desired is c.mset.desired() and view.snapshot is None and view.cycles == 0
    c.failures.fail("res", "container exited 1", 1010.0)
    c.no_shrink.clear()
    c.manifest_error.append("serves.toml: broken")
    assert view.backoff["res"].failures == 1 and view.no_shrink == frozenset({"llm"})
    assert view.manifest_errors == ()
    assert c.view().backoff["res"].failures == 2 and c.view().manifest_errors
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.cycles = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        view.backoff["llm"] = view.backoff["res"]  # type: ignore[index]
