"""The loop's failure backoff: a serve that crashes after every healthy start backs off
ever longer, a requested serve backs off like a desired-running one, and the count is
forgotten once the serve stays up longer than the cap.

These drive the Controller's bookkeeping directly with observations (no daemon):
what is under test is the arithmetic of the backoff, not docker.
"""

from __future__ import annotations

from pathlib import Path

from controller.executor import ExecutionReport, Outcome, StepResult
from controller.journal import Journal, journal_path
from controller.loop import Controller, RunOptions
from controller.manifest import load_manifest_set
from statemachine.ledger import Ledger
from statemachine.planner import Action, Step
from statemachine.types import ContainerObs, ContainerState, Observed

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000

[[serve]]
name = "res"
container = "c-res"
gpu_role = "a"
vram_mib = 2000
residency = "resident"
desired = "running"

[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "a"
vram_mib = 2000
residency = "on-demand"
"""


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
    c._learn(report, at)


def test_crash_after_every_healthy_start_doubles_the_backoff(tmp_path: Path) -> None:
    c = controller(tmp_path)
    delays = []
    for i in range(4):
        t = 1000.0 + i * 1000
        c._note_deaths(crashed(t - 50), t)
        delays.append(round(c.backoff["res"].until - t))
        healthy_start(c, "res", t + 10)
        assert c.policy(t + 20).hold == {}  # healthy: no hold until the next crash
    assert delays == [5, 10, 20, 40]


def test_a_requested_serve_backs_off_too(tmp_path: Path) -> None:
    c = controller(tmp_path)
    c.journal.add_request("llm", 900.0, None)
    c._note_deaths(crashed(950.0), 1000.0)
    assert c.backoff["llm"].failures == 1
    assert "llm" in c.policy(1001.0).hold


def test_the_count_is_forgotten_once_the_serve_stays_up(tmp_path: Path) -> None:
    c = controller(tmp_path)
    c._note_deaths(crashed(950.0), 1000.0)
    up = Observed(True, {"c-res": ContainerObs(ContainerState.RUNNING, started_at=1010.0)})
    c._note_deaths(up, 1100.0)
    assert "res" in c.backoff  # up for 90 s: not yet
    c._note_deaths(up, 1400.0)
    assert "res" not in c.backoff  # up for longer than the 300 s cap
