"""Starts beside the loop: the tracker, orphaned ``up`` commands, and the executor's seams.

Each case is a way a start carried out beside the loop could let the ledger count less
than the host holds, or leave a serve counted as starting for good:

- an old start's late end must not erase a newer start of the same serve (tokens);
- a start that cannot be recorded must not run on unsupervised;
- a start in progress counts on the roles it was started on, declared or not;
- an orphaned ``up`` whose leader exited while its group works on still holds its room;
- a refused stop in one group refuses the starts of other groups that needed it;
- a later step of a serve whose start is still in progress never holds the plan;
- the loop learns a start's failure before the start leaves the tracker, records
  results that arrive while its plan still executes, and readmits the tiers of starts
  a killed controller left pending.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from docker import DockerClient
from support.fake_docker import FakeContainers
from support.service import controller_on
from support.waiting import WAIT_S, wait_for

from controller.adapters.docker.actions import DockerActions
from controller.service.executor import Executor, ExecutorConfig, Outcome, StepResult
from controller.service.live import LiveLedger
from controller.service.loop import Controller
from controller.service.starts import StartTracker, group_alive, proc_start_ticks, supervise_orphans
from controller.store.journal import Journal, UpRecord, journal_path
from statemachine.domain import types as sm
from statemachine.ledger.reservations import Ledger, ledger_from_observed
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)

# ── the tracker ──────────────────────────────────────────────────────────────


def test_an_old_starts_late_end_does_not_erase_a_newer_start() -> None:
    t = StartTracker()
    old = t.begin("x", ("a",), 4000)
    t.end("x", old)
    new = t.begin("x", ("a",), 4000)
    t.end("x", old)  # the first start's thread ends late
    assert t.snapshot() == {"x": sm.StartingObs(("a",), 4000)}
    t.end("x", new)
    assert t.snapshot() == {}


def test_a_journal_that_cannot_be_written_does_not_break_the_start(tmp_path: Path) -> None:
    j = Journal.open(journal_path(tmp_path))
    t = StartTracker(journal=j)
    j.close()  # every write now raises
    token = t.begin("x", ("a",), 1000)
    t.up_spawned("x", os.getpid(), roles=("a",), mib=1000, timeout_s=10)  # logged, not raised
    t.end("x", token)
    assert t.snapshot() == {}


def test_an_up_that_cannot_be_recorded_does_not_run_on(tmp_path: Path) -> None:
    marker = tmp_path / "still-ran"
    # run_up needs no daemon: a client that never connects
    docker = DockerActions(DockerClient(base_url="unix:///nonexistent.sock", version="1.41"))

    spawned: list[int] = []

    def refuse(pid: int) -> None:
        spawned.append(pid)
        raise RuntimeError("journal is locked")

    with pytest.raises(RuntimeError, match="locked"):
        docker.run_up(
            ["sh", "-c", f"sleep 2; touch {marker}"],
            cwd=tmp_path,
            timeout_s=30,
            on_spawn=refuse,
        )
    # once nothing of its process group runs, the marker can no longer appear
    (group,) = spawned
    wait_for("the unrecorded `up`'s group to end", lambda: not group_alive(group))
    assert not marker.exists(), "the unrecorded `up` ran on after its start failed"


# ── the ledger ───────────────────────────────────────────────────────────────


def test_a_start_in_progress_counts_on_the_roles_it_was_started_on() -> None:
    roles = {"g0": sm.GpuRole("g0", 10_000), "g1": sm.GpuRole("g1", 10_000)}
    moved = sm.ServeSpec(
        "llm", "c-llm", ("g1",), 6000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING
    )
    starting = {"llm": sm.StartingObs(("g0",), 6000)}
    ledger = ledger_from_observed(
        sm.DesiredState(roles, {"llm": moved}), sm.Observed(True, {}, starting=starting)
    )
    # moved to g1 while it loads on g0: both hold it until the start ends
    assert (ledger.committed_mib("g0"), ledger.committed_mib("g1")) == (6000, 6000)
    # and removed from the manifest while it loads: still counted where it started
    gone = ledger_from_observed(
        sm.DesiredState(roles, {}), sm.Observed(True, {}, starting=starting)
    )
    assert (gone.committed_mib("g0"), gone.committed_mib("g1")) == (6000, 0)


# ── orphaned `up` commands ───────────────────────────────────────────────────


def test_an_orphan_whose_leader_exited_is_followed_by_its_group(tmp_path: Path) -> None:
    # the leader backgrounds its work and exits: the group lives on
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 3 & exit 0"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    ticks = proc_start_ticks(leader.pid)
    leader.wait()
    assert group_alive(leader.pid)
    j = Journal.open(journal_path(tmp_path))
    j.add_up(UpRecord("od", leader.pid, ticks, ("a",), 6000, time.time() + 60, time.time()))
    t = StartTracker(journal=j)
    stop = threading.Event()
    ended = threading.Event()
    assert supervise_orphans(t, j, stop=stop, poll_s=0.05, on_end=lambda s: ended.set()) == ["od"]
    assert t.snapshot() == {"od": sm.StartingObs(("a",), 6000)}
    assert ended.wait(WAIT_S), "the group ended but the orphan was not released"
    assert t.snapshot() == {} and j.ups() == []
    stop.set()
    j.close()


def test_a_record_of_a_process_that_is_gone_is_dropped(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    ticks = proc_start_ticks(proc.pid)
    proc.wait()
    j = Journal.open(journal_path(tmp_path))
    j.add_up(UpRecord("od", proc.pid, ticks, ("a",), 6000, time.time() + 60, time.time()))
    t = StartTracker(journal=j)
    assert supervise_orphans(t, j, stop=threading.Event()) == []
    assert t.snapshot() == {} and j.ups() == []
    j.close()


# ── the executor ─────────────────────────────────────────────────────────────


class Containers(FakeContainers):
    """In-memory container runtime: state per container, start and stop flip it."""

    def __init__(self, running: set[str], existing: set[str]) -> None:
        super().__init__(running, exited=existing)
        self.started: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def start(self, name: str) -> None:
        self.gate.wait(30)
        self.started.append(name)
        super().start(name)

    @staticmethod
    def port_in_use(port: int) -> bool:
        return False


def serve(name: str, mib: int, **kw: Any) -> sm.ServeSpec:
    return sm.ServeSpec(
        name, f"c-{name}", ("a",), mib, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING, **kw
    )


def step(action: Action, name: str, mib: int | None, group: str, **kw: Any) -> Step:
    return Step(action, name, ("a",), mib, "", group=group, **kw)


def make_executor(desired: sm.DesiredState, docker: Containers, **kw: Any) -> Executor:
    return Executor(
        desired,
        docker=docker,  # type: ignore[arg-type]
        config=ExecutorConfig(poll_s=0.01),
        **kw,
    )


def test_a_refused_stop_refuses_the_starts_that_needed_it() -> None:
    # f holds the port g needs; f's stop (in its own group) drains a router tier and no
    # router is configured: the preflight refuses f's group, so g must not start either
    f = sm.ServeSpec(
        "f",
        "c-f",
        ("a",),
        2000,
        sm.Residency.EVICTABLE,
        sm.DesiredRun.STOPPED,
        port=9000,
        router_tier="tier-f",
    )
    g = serve("g", 2000, port=9000)
    desired = sm.DesiredState({"a": sm.GpuRole("a", 10_000)}, {"f": f, "g": g})
    docker = Containers(running={"c-f"}, existing={"c-g"})
    plan = Plan(
        (
            step(Action.QUIESCE, "f", 2000, "f"),
            step(Action.DRAIN, "f", 2000, "f"),
            step(Action.STOP, "f", 2000, "f"),
            step(Action.RELEASE, "f", 2000, "f"),
            step(Action.RESERVE, "g", 2000, "g"),
            step(Action.START, "g", 2000, "g"),
            step(Action.AWAIT_READY, "g", None, "g"),
        ),
        (),
        Ledger({}),
        Ledger({}),
    )
    observed = sm.Observed(True, {"c-f": sm.ContainerObs(sm.ContainerState.RUNNING)})
    report = make_executor(desired, docker).execute(plan, observed)
    assert docker.started == [] and docker.state["c-f"] == "running"
    assert sorted(report.refused_groups) == ["f", "g"]
    assert all(r.outcome is Outcome.SKIPPED for r in report.results)


def test_a_later_step_of_a_start_in_progress_does_not_hold_the_plan() -> None:
    x, y = serve("x", 2000), serve("y", 2000)
    desired = sm.DesiredState({"a": sm.GpuRole("a", 10_000)}, {"x": x, "y": y})
    docker = Containers(running=set(), existing={"c-x", "c-y"})
    docker.gate.clear()  # x's start hangs
    ended: list[list[StepResult]] = []
    ex = make_executor(
        desired,
        docker,
        starts=StartTracker(),
        on_start_done=lambda r, rel: (ended.append(r), rel()),
    )
    plan = Plan(
        (
            step(Action.RESERVE, "x", 2000, "x"),
            step(Action.START, "x", 2000, "x"),
            step(Action.AWAIT_READY, "x", None, "x"),
            # a later group resizes x (the planner may shrink a serve started earlier)
            step(Action.GROW, "x", 0, "y", to_mib=2000),
            step(Action.RESERVE, "y", 2000, "y"),
            step(Action.START, "y", 2000, "y"),
        ),
        (),
        Ledger({}),
        Ledger({}),
    )
    t0 = time.monotonic()
    report = ex.execute(plan, sm.Observed(True, {}), skip_preflight=True)
    assert time.monotonic() - t0 < 20  # returned while x's start still hangs
    grow = next(r for r in report.results if r.step.action is Action.GROW)
    assert grow.outcome is Outcome.SKIPPED and "still in progress" in grow.detail
    assert ex.starts is not None and ex.starts.active("x")
    docker.gate.set()
    assert ex.starts is not None
    ex.starts.join(30)
    deadline = time.monotonic() + 10
    while ex.starts.snapshot() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ex.starts.snapshot() == {}
    assert sorted(r.step.serve for batch in ended for r in batch) == ["x", "x"]
    # the rest of the grow's group waits for the next plan with it
    assert [r.outcome for r in report.results if r.step.serve == "y"] == [Outcome.SKIPPED] * 2


def test_a_start_the_live_ledger_calls_ready_is_no_longer_in_progress_in_the_tracker() -> None:
    # an observation takes the live ledger's mark, then reads the tracker: one taken
    # after the await_ready's end is told must not find the start still in progress, or
    # it counts the serve as starting (never a victim) though the start has ended
    x = serve("x", 2000)
    docker = Containers(running=set(), existing={"c-x"})
    ex = make_executor(
        sm.DesiredState({"a": sm.GpuRole("a", 10_000)}, {"x": x}),
        docker,
        starts=StartTracker(),
        on_start_done=lambda _results, release: release(),
    )
    ex.live = live = LiveLedger()
    assert ex.starts is not None
    tracker = ex.starts
    in_progress_when_ready: list[dict[str, sm.StartingObs]] = []

    def told() -> None:  # on the writer's thread, after each change of the live ledger
        if "x" in live.overlay(0).ready:
            in_progress_when_ready.append(tracker.snapshot())

    live.listen(told)
    plan = Plan(
        (
            step(Action.RESERVE, "x", 2000, "x"),
            step(Action.START, "x", 2000, "x"),
            step(Action.AWAIT_READY, "x", None, "x"),
        ),
        (),
        Ledger({}),
        Ledger({}),
    )
    ex.execute(plan, sm.Observed(True, {}), skip_preflight=True)
    tracker.join(WAIT_S)
    wait_for("the live ledger to say x is ready", lambda: in_progress_when_ready)
    assert all("x" not in seen for seen in in_progress_when_ready), in_progress_when_ready


# ── the loop's bookkeeping ───────────────────────────────────────────────────

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000

[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "a"
vram_mib = 4000
residency = "on-demand"
router_tier = "fast"
"""


def controller(tmp_path: Path) -> Controller:
    return controller_on(tmp_path, MANIFEST)


def failed_await(at: float) -> StepResult:
    return StepResult(
        step(Action.AWAIT_READY, "llm", None, "llm"),
        Outcome.FAILED,
        "c-llm exited (1) while starting",
        1.0,
        ended_at=at,
    )


def test_a_starts_failure_is_learned_before_it_leaves_the_tracker(tmp_path: Path) -> None:
    c = controller(tmp_path)
    token = c.starts.begin("llm", ("a",), 4000)
    seen: list[tuple[bool, bool]] = []

    def release() -> None:
        seen.append(("llm" in c.backoff, c.starts.active("llm")))
        c.starts.end("llm", token)

    c.reconciler.lessons.start_ended(1, [failed_await(time.time())], release)
    assert seen == [(True, True)]  # the backoff was there while it still counted
    assert not c.starts.active("llm")


def test_results_that_end_while_the_plan_executes_reach_the_journal(tmp_path: Path) -> None:
    c = controller(tmp_path)
    cid = c.journal.record_cycle(
        at=1.0,
        manifest_digest="d",
        manifest_files={},
        observed={"docker": "ok"},
        plan={"steps": []},
        requests=[],
        dry_run=False,
    )
    c.start_outcomes.outcomes[cid] = None  # the plan is executing
    c.reconciler.lessons.start_ended(cid, [failed_await(time.time())], lambda: None)
    assert [r.step.serve for r in c.start_outcomes.early[cid]] == ["llm"]


def test_tiers_of_starts_a_killed_controller_left_pending_are_readmitted(tmp_path: Path) -> None:
    c = controller(tmp_path)
    plan = {
        "steps": [
            {"action": "reserve", "serve": "llm"},
            {"action": "start", "serve": "llm"},
            {"action": "await_ready", "serve": "llm"},
            {"action": "readmit", "serve": "llm"},
        ]
    }
    cid = c.journal.record_cycle(
        at=1.0,
        manifest_digest="d",
        manifest_files={},
        observed={"docker": "ok"},
        plan=plan,
        requests=[],
        dry_run=False,
    )
    c.journal.record_outcome(
        cid,
        {
            "ok": True,
            "steps": [{"action": "reserve", "serve": "llm", "outcome": "ok"}],
            "pending": ["llm"],
        },
    )
    c.reconciler.lessons.recover_tiers()
    assert c.serve_records.quiesced == {"llm"}


def test_an_expired_request_does_not_end_while_its_serve_is_starting(tmp_path: Path) -> None:
    c = controller(tmp_path)
    c.journal.add_request("llm", 100.0, 1.0)  # expired long ago
    starting = sm.Observed(True, {}, starting={"llm": sm.StartingObs(("a",), 4000)})
    c.reconciler.lessons.end_finished_requests(starting, 1000.0)
    assert [r.serve for r in c.journal.active_requests()] == ["llm"]
    c.reconciler.lessons.end_finished_requests(sm.Observed(True, {}), 1000.0)
    assert c.journal.active_requests() == []


def test_a_start_that_ended_healthy_is_no_longer_in_progress_before_its_end_is_taken_in() -> None:
    # the start's thread says so as it ends; the loop records it and ends it a moment
    # later: an observation in between counts it running with its reservation, as the
    # live answers do, not as a start in progress (which is never a victim)
    tracker = StartTracker()
    token = tracker.begin("a", ("g",), 4000)
    other = tracker.begin("b", ("g",), 1000)
    tracker.succeeded("a", token)
    assert tracker.snapshot() == {"b": sm.StartingObs(("g",), 1000)}
    assert tracker.ran() == {"a": sm.StartingObs(("g",), 4000)}
    assert tracker.active("a")  # ended by the loop, not here
    tracker.succeeded("b", other + 1)  # an older start's word for a newer start: nothing
    assert "b" in tracker.snapshot() and "b" not in tracker.ran()
    tracker.end("a", token)
    assert tracker.ran() == {} and "a" not in tracker.snapshot()
    again = tracker.begin("a", ("g",), 4000)  # a new start of the same serve is in progress
    assert tracker.snapshot()["a"] == sm.StartingObs(("g",), 4000) and again != token
