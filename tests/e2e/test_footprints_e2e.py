"""End to end: the control loop measures a serve's footprint on the real Docker daemon.

The loop (``Controller.run``, in-process so that it can be handed the scripted NVML of
tests/support/fakes_nvml.py) starts and stops a busybox serve container; the scripted device's
used total follows Docker: it grows by what the serve "takes" while its container
really runs. Per-process figures are unavailable, as on WSL2 (the driver lists the
process with no memory figure), so the device delta is the only evidence. The samples
are checked in the journal, through a second controller on the same state directory,
and through ``vramctl calibrate`` / ``status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import NotFound
from support.cli import run_cli
from support.fakes_nvml import FakeDevice, FakeMemory, FakeNvml, FakeProc
from support.serving import free_port, httpd
from support.waiting import WAIT_S, wait_for

from controller.adapters.nvml import MIB
from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.store.journal import Journal, JournalError, journal_path

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-footprint-e2e"
BASE_MIB = 700
TAKES_MIB = 5200  # 30 % more than the 4000 it declares


class DockerDrivenNvml(FakeNvml):
    """One device whose used total is the driver's base plus what the serve takes
    while Docker shows its container running; its process has no memory figure."""

    def __init__(self, client: docker.DockerClient, container: str) -> None:
        super().__init__([FakeDevice(UUID, total=24_000 * MIB)])
        self.client = client
        self.container = container

    def _running(self) -> bool:
        try:
            return str(self.client.containers.get(self.container).status) == "running"
        except NotFound:
            return False

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> FakeMemory:  # noqa: N802
        dev = self._device(handle)
        dev.used = (BASE_MIB + (TAKES_MIB if self._running() else 0)) * MIB
        dev.compute = [FakeProc(pid=999_999_999, usedGpuMemory=None)] if self._running() else []
        return super().nvmlDeviceGetMemoryInfo(handle)


MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 24000
uuid = "{uuid}"

[[serve]]
name = "llm"
container = "{container}"
gpu_role = "a"
vram_mib = 4000
port = {port}
health = "/health"
desired = "{desired}"
start_timeout_s = 60
stop_timeout_s = 5
"""


class Running:
    """A controller running its loop in a thread of its own."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.code: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code.append(asyncio.run(self.controller.run()))

    def stop(self) -> None:
        aio = wait_for("the loop to start", lambda: self.controller.aio)
        aio.call_soon_threadsafe(self.controller.stop)
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive() and self.code == [0]


@pytest.fixture
def container(docker_client: docker.DockerClient, test_image: str) -> Iterator[tuple[str, int]]:
    name = f"vramctl-test-{uuid.uuid4().hex[:8]}-llm"
    port = free_port()
    docker_client.containers.create(
        test_image,
        httpd(port),
        name=name,
        init=True,
        network_mode="host",
        labels={"vramctl.test": "1"},
    )
    yield name, port
    with contextlib.suppress(NotFound):
        docker_client.containers.get(name).remove(force=True)


def test_the_loop_records_start_and_stop_deltas_that_survive_a_restart(
    docker_client: docker.DockerClient, container: tuple[str, int], tmp_path: Path
) -> None:
    name, port = container
    path = tmp_path / "serves.toml"

    def write(desired: str) -> None:
        text = MANIFEST.format(uuid=UUID, container=name, port=port, desired=desired)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    write("running")
    state = tmp_path / "state"
    nvml = DockerDrivenNvml(docker_client, name)

    def controller() -> Controller:
        options = RunOptions(manifests=(path,), state_dir=state, resync_s=0.5, settle_s=0.3)
        return Controller(options, load_manifest_set([path]), nvml=nvml)

    def samples() -> list[dict[str, Any]]:
        if not journal_path(state).is_file():
            return []
        try:
            with Journal.open(journal_path(state), readonly=True) as journal:
                return [d for _, d in journal.footprints("llm")]
        except JournalError:  # the loop is creating it: its schema is not there yet
            return []

    first = Running(controller())
    try:
        (start,) = wait_for("the start's sample", lambda: samples() or None)
        assert str(docker_client.containers.get(name).status) == "running"
        assert (start["kind"], start["role"], start["method"]) == ("start", "a", "delta")
        assert start["attributable"] is True and start["others"] == []
        assert (start["before_mib"], start["delta_mib"], start["steady_mib"]) == (
            BASE_MIB,
            TAKES_MIB,
            TAKES_MIB,
        )
        view = wait_for(
            "the loop's view of the footprint",
            lambda: first.controller.view().footprints.get("llm"),
        )
        assert view["measured_mib"] == TAKES_MIB and view["exceeds_reservation"] is True
        write("stopped")
        stop = wait_for(
            "the stop's sample", lambda: next((d for d in samples() if d["kind"] == "stop"), None)
        )
        assert str(docker_client.containers.get(name).status) == "exited"
        assert (stop["method"], stop["attributable"], stop["delta_mib"]) == ("delta", True, 5200)
    finally:
        first.stop()

    # a new controller on the same state directory: the samples are still there
    second = Running(controller())
    try:
        view = wait_for(
            "the second controller's view",
            lambda: (
                second.controller.view().footprints.get("llm") if second.controller.cycles else None
            ),
        )
        assert view["samples"] == 2 and view["measured_mib"] == TAKES_MIB
        assert view["exceeds_reservation"] is True and view["over_pct"] == 30.0
    finally:
        second.stop()

    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", PYTHONPATH=str(REPO))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env, cwd=REPO)

    r = cli("calibrate", "-m", str(path), "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    (proposal,) = json.loads(r.stdout)["serves"]
    assert proposal["attributable_samples"] == 2 and proposal["proposed_mib"] is None
    r = cli("calibrate", "-m", str(path), "--state-dir", str(state), "--min-samples", "2")
    assert "proposed vram_mib = 5888" in r.stdout, r.stdout  # 5200 + 10 % -> 23 x 256
    r = cli("status", "-m", str(path), "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    assert "OVER its reservation by 30 %" in r.stdout, r.stdout
