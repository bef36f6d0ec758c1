"""The rule that tells a serve's ``up`` where it was put (statemachine/ledger/gpu_vars.py).

Every variable of the table, an unknown one left out (never empty, never 0), two roles
joined by ",", the controller's values winning over ``up_env``, and the placeholders
substituted in each word or refused with the reason; then the executor's start giving
them to ``up`` (the in-memory runtime of tests/shell/test_executor_ledger.py), and the start
and the preflight refusing an unknown placeholder before ``up`` runs (the rule's own
tests, pure, are tests/core/test_gpu_vars_rule.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from support.fake_docker import FakeContainers as Containers
from support.fake_docker import quick_elastic, quick_executor

from controller.adapters.docker.actions import UpResult
from controller.manifest import load_manifest_set
from controller.manifest.runtime import ServeRuntime
from controller.service.executor import Executor, Outcome
from statemachine.domain import types as sm
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)

ROLES = {
    "card-a": sm.GpuRole("card-a", 24_000, uuid="GPU-aaaa"),
    "card-b": sm.GpuRole("card-b", 24_000, uuid="GPU-bbbb"),
    "bare": sm.GpuRole("bare", 24_000),
}
SEEN = (sm.GpuObs("GPU-bbbb", index=1), sm.GpuObs("GPU-aaaa", index=0))


def test_the_manifest_loads_placeholders_in_up(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n\n'
        '[[serve]]\nname = "s"\ncontainer = "c-s"\ngpu_role = "a"\nvram_mib = 100\n'
        'up = "{dir}/up.sh --gpu {gpu_role} --uuid={gpu_uuid} {gpu_index}"\n'
    )
    mset = load_manifest_set([path])
    assert not mset.warnings
    argv = mset.up_argv("s")
    assert argv is not None
    assert argv[1:] == ["--gpu", "{gpu_role}", "--uuid={gpu_uuid}", "{gpu_index}"]


# ── the executor's start: what `up` is given ────────────────────────────────────


class UpRecorder(Containers):
    """The in-memory runtime of tests/shell/test_executor_ledger.py whose ``up`` is recorded
    (and creates the container); ``executable_exists`` and ``port_in_use`` answer for the
    preflight."""

    def __init__(self) -> None:
        super().__init__(set())
        self.ups: list[tuple[tuple[str, ...], dict[str, str]]] = []

    def run_up(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        on_spawn: Callable[[int], None] | None = None,
    ) -> UpResult:
        self.ups.append((tuple(argv), dict(env or {})))
        self.state["llm"] = "running"
        return UpResult(tuple(argv), 0, "", "ok", 0.0)

    def executable_exists(self, name: str, *, cwd: Path) -> bool:
        return True

    def port_in_use(self, port: int) -> bool:
        return False


def _start(
    roles: Mapping[str, sm.GpuRole], on: tuple[str, ...], up: tuple[str, ...], tmp: Path
) -> tuple[Executor, Plan, sm.Observed, UpRecorder]:
    llm = sm.ServeSpec("llm", "llm", on, 4000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING)
    desired = sm.DesiredState(roles, {"llm": llm})
    docker = UpRecorder()
    runtime = ServeRuntime(
        "llm",
        up_argv=up,
        manifest_dir=tmp,
        up_env={"VRAMCTL_GPU_ROLE": "elsewhere", "VRAMCTL_GPU_INDEX": "9", "KEEP": "1"},
    )
    ex = quick_executor(
        desired, docker, lambda: SEEN, elastic=quick_elastic(), runtime={"llm": runtime}
    )
    ledger = Ledger(roles, [])
    steps = (
        Step(Action.RESERVE, "llm", on, 4000, "desired running", group="llm"),
        Step(Action.START, "llm", on, 4000, "desired running", group="llm"),
    )
    observed = sm.Observed(True, {}, gpus=SEEN)
    return ex, Plan(steps, (), ledger, ledger), observed, docker


def test_a_start_gives_up_every_variable_and_substitutes_its_arguments(tmp_path: Path) -> None:
    up = ("./up.sh", "--roles={gpu_role}", "{gpu_uuid}", "--index", "{gpu_index}")
    ex, plan, observed, docker = _start(ROLES, ("card-b", "card-a"), up, tmp_path)
    report = ex.execute(plan, observed)
    assert [r.outcome for r in report.results] == [Outcome.OK, Outcome.OK], report.results
    ((argv, env),) = docker.ups
    assert argv == ("./up.sh", "--roles=card-b,card-a", "GPU-bbbb,GPU-aaaa", "--index", "1,0")
    assert env["VRAMCTL_GPU_ROLE"] == "card-b,card-a"
    assert env["VRAMCTL_GPU_UUID"] == "GPU-bbbb,GPU-aaaa"
    assert env["VRAMCTL_GPU_INDEX"] == "1,0"  # the controller's, not up_env's "9"
    assert env["KEEP"] == "1"


def test_a_start_on_a_role_without_uuid_leaves_uuid_out_and_refuses_its_placeholder(
    tmp_path: Path,
) -> None:
    ex, plan, observed, docker = _start(ROLES, ("bare",), ("./up.sh", "{gpu_role}"), tmp_path)
    ex.execute(plan, observed)
    ((argv, env),) = docker.ups
    assert argv == ("./up.sh", "bare")
    assert env["VRAMCTL_GPU_ROLE"] == "bare"
    assert "VRAMCTL_GPU_UUID" not in env and "VRAMCTL_GPU_INDEX" not in env  # not even up_env's

    # the start itself refuses, before `up` runs (the preflight left out)
    ex, plan, observed, docker = _start(
        ROLES, ("bare",), ("./up.sh", "--gpus=device={gpu_uuid}"), tmp_path
    )
    report = ex.execute(plan, observed, skip_preflight=True)
    start = report.results[-1]
    assert (start.step.action, start.outcome) == (Action.START, Outcome.FAILED)
    assert "`up` names {gpu_uuid}, which is unknown for this start" in start.detail
    assert "gpu role bare declares no uuid" in start.detail and "`up` is not run" in start.detail
    assert not docker.ups
    assert not report.ledger.holds("llm")  # the failed group's reservation given back

    # the preflight refuses the group first: nothing of it runs
    report = ex.execute(plan, observed)
    assert any("`up` names {gpu_uuid}" in p for p in report.preflight), report.preflight
    assert not report.results and not docker.ups


def test_a_start_tells_up_the_fraction_of_what_it_will_find_free(tmp_path: Path) -> None:
    """SGLang's --mem-fraction-static is of the memory free when it starts: the start
    gives ``up`` its reservation over that, from the run's ledger (another serve holds
    8000 of card-a's 24000: 4000 ÷ 16000 = 0.2500) and NVML's last reading (it measured
    less free than the ledger leaves: the ledger's figure, the larger, is taken)."""
    up = ("./up.sh", "--mem-fraction-static={fraction_of_free}", "--fit-target={fit_target_mib}")
    ex, plan, _, docker = _start(ROLES, ("card-a",), up, tmp_path)
    other = sm.ServeSpec(
        "other", "other", ("card-a",), 8000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING
    )
    llm = ex.desired.serves["llm"]
    ex.desired = sm.DesiredState(ROLES, {"llm": llm, "other": other})
    docker.state["other"] = "running"
    seen = (sm.GpuObs("GPU-aaaa", index=0, free_mib=15000),)
    running = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0)
    report = ex.execute(plan, sm.Observed(True, {"other": running}, gpus=seen))
    assert [r.outcome for r in report.results] == [Outcome.OK, Outcome.OK], report.results
    ((argv, env),) = docker.ups
    assert argv == ("./up.sh", "--mem-fraction-static=0.2500", "--fit-target=12000")
    assert env["VRAMCTL_FREE_MIB"] == "16000"
    assert env["VRAMCTL_FRACTION_OF_FREE"] == "0.2500"


def test_render_shows_sglangs_fraction_for_a_start_on_the_observed_host() -> None:
    """render names the variable and, with an observation, what a start would set now:
    the card's 49140 MiB less what the others hold in the ledger (the summarizer's own
    reservation left out), and its 8192 MiB over that."""
    from test_enforce_render_lint import cli

    repo = Path(__file__).resolve().parents[2] / "manifests" / "examples"
    args = ("render", "summarizer", "-m", str(repo / "sleep-card.toml"))
    observed = ("--observed", str(repo / "sleep-card.observed.json"))
    r = cli(*args, *observed)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["--mem-fraction-static", "${VRAMCTL_FRACTION_OF_FREE}"]
    assert (
        "at a start on the observed host: VRAMCTL_FREE_MIB=26612; "
        "VRAMCTL_FRACTION_OF_FREE=0.3078 (vram_mib 8192 ÷ the MiB free)"
    ) in r.stderr
    assert 8192 * 10**4 // 26612 == 3078
    plain = cli(*args)
    assert plain.returncode == 0 and "at a start" not in plain.stderr
