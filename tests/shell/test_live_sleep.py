"""The live ledger over sleeps and wakes: what a running plan's sleep and wake steps hold.

An answer given while a plan wakes a sleeper (reserve_wake, wake, await_ready) or puts
one to sleep (sleep, release_to_residual) must count no less than may be held: the
woken serve at its full reservation from its reserve_wake on, the sleeper's host RAM
from its release_to_residual on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.manifest import load_manifest_set
from controller.service.live import LiveLedger, overlay_observed
from statemachine.domain import types as sm
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import (
    Action,
    Step,
)

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 20000

[host]
ram_mib = 64000
reserve_mib = 0

[[serve]]
name = "big"
container = "c-big"
gpu_role = "a"
vram_mib = 8000
residency = "evictable"
port = 21001
engine = "vllm"
[serve.sleep]
level = 1
residual_mib = 1000
host_ram_mib = 6000

[[serve]]
name = "small"
container = "c-small"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"
port = 21002
engine = "vllm"
[serve.sleep]
level = 1
residual_mib = 1000
host_ram_mib = 4000
"""


@pytest.fixture
def desired(tmp_path: Path) -> sm.DesiredState:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    return load_manifest_set([path]).desired()


def _run(live: LiveLedger, step: Step, outcome: str = "ok") -> None:
    live.step_ended(live.step_begun(step), step, outcome, "")


def _containers(desired: sm.DesiredState) -> dict[str, str]:
    return {s.name: s.container for s in desired.serves.values()}


RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING)


def test_a_wake_counts_the_full_reservation_from_its_reserve_wake_on(
    desired: sm.DesiredState,
) -> None:
    seen = sm.Observed(
        docker_ok=True,
        containers={"c-small": RUNNING},
        sleep={"small": sm.SleepObs(sm.SleepState.ASLEEP, 1, 1000, 4000)},
    )
    assert ledger_from_observed(desired, seen).committed_mib("a") == 1000
    live = LiveLedger()
    mark = live.mark()
    steps = [
        Step(Action.RESERVE_WAKE, "small", ("a",), 4000, "t", to_mib=5000, group="small"),
        Step(Action.WAKE, "small", ("a",), None, "t", group="small"),
        Step(Action.AWAIT_READY, "small", ("a",), None, "t", group="small"),
    ]
    for step in steps:
        _run(live, step)
        now = overlay_observed(seen, live.overlay(mark), _containers(desired))
        # admitted in full: never counted at its residual again while it wakes or runs
        assert ledger_from_observed(desired, now).committed_mib("a") == 5000, step.action
    assert not now.sleep_of("small").asleep and "small" not in now.starting


def test_a_confirmed_sleep_counts_its_host_ram(desired: sm.DesiredState) -> None:
    seen = sm.Observed(docker_ok=True, containers={"c-big": RUNNING})
    live = LiveLedger()
    mark = live.mark()
    _run(live, Step(Action.SLEEP, "big", ("a",), None, "t", group="small"))
    asked = overlay_observed(seen, live.overlay(mark), _containers(desired))
    assert ledger_from_observed(desired, asked).committed_mib("a") == 8000  # not yet confirmed
    release = Step(
        Action.RELEASE_TO_RESIDUAL,
        "big",
        ("a",),
        7000,
        "t",
        to_mib=1000,
        group="small",
        host_mib=6000,
    )
    _run(live, release)
    now = overlay_observed(seen, live.overlay(mark), _containers(desired))
    ledger = ledger_from_observed(desired, now)
    assert ledger.committed_mib("a") == 1000
    assert ledger.host_committed_mib() == 6000  # its weights are in host RAM now


def test_up_timings_of_a_wake_count_the_wake_as_its_start(desired: sm.DesiredState) -> None:
    from controller.interfaces.upwait import timings
    from controller.service.live import StepEnded

    steps = [
        StepEnded("small", "reserve_wake", "small", "ok", "", 100.0, 100.1),
        StepEnded("small", "wake", "small", "ok", "", 100.1, 103.0),
        StepEnded("small", "await_ready", "small", "ok", "", 103.0, 105.5),
    ]
    times = timings(desired.serves["small"], steps, 99.0, 106.0)
    assert times["started_s"] == 2.9 and times["ready_s"] == 2.5, times


def test_up_timings_count_a_victims_sleep_as_making_room(desired: sm.DesiredState) -> None:
    from controller.interfaces.upwait import timings
    from controller.service.live import StepEnded

    steps = [
        StepEnded("big", "sleep", "small", "ok", "", 100.0, 101.0),
        StepEnded("big", "release_to_residual", "small", "ok", "", 101.0, 102.5),
    ]
    assert timings(desired.serves["small"], steps, 99.0, 106.0)["made_room_s"] == 2.5
