"""End to end: the loop times a cold start on the real Docker daemon, and uses it.

The loop (``Controller.run``, in-process) starts a busybox serve whose health page
comes up only a second after its container starts. Before any start the serve's
reload cost is the one its manifest declares (``cold_start_s``); once the loop has
started it and seen it healthy, the cold start is in the journal's ``reloads`` table,
the planner's policy carries the measured figure instead, and ``vramctl status
--json`` shows it with ``basis: "measured"``. A request for the serve is when it was
last used (``Policy.last_used``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound
from support.cli import run_cli
from support.fakes_nvml import FakeDevice, FakeNvml
from support.serving import free_port, httpd
from support.waiting import WAIT_S, wait_for

from controller.adapters.nvml import MIB
from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.store.journal import Journal, JournalError, journal_path
from statemachine.planning.plan_types import RestoreCost

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-reload-e2e"
HEALTH_DELAY_S = 1  # the serve's health page comes up this long after its start

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
desired = "running"
start_timeout_s = 60
stop_timeout_s = 5
cold_start_s = 90
"""


@pytest.fixture
def container(docker_client: docker.DockerClient, test_image: str) -> Iterator[tuple[str, int]]:
    name = f"vramctl-test-{uuid.uuid4().hex[:8]}-llm"
    port = free_port()
    docker_client.containers.create(
        test_image,
        httpd(port, delay_s=HEALTH_DELAY_S),
        name=name,
        init=True,
        network_mode="host",
        labels={"vramctl.test": "1"},
    )
    yield name, port
    with contextlib.suppress(NotFound):
        docker_client.containers.get(name).remove(force=True)


def test_the_loop_journals_a_cold_start_and_plans_and_shows_it(
    docker_client: docker.DockerClient, container: tuple[str, int], tmp_path: Path
) -> None:
    name, port = container
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST.format(uuid=UUID, container=name, port=port))
    state = tmp_path / "state"
    options = RunOptions(manifests=(path,), state_dir=state, resync_s=0.5)
    nvml = FakeNvml([FakeDevice(UUID, total=24_000 * MIB)])
    controller = Controller(options, load_manifest_set([path]), nvml=nvml)
    # before any start: the declared figure, and no use known
    assert controller.policy(time.time()).reload == {"llm": RestoreCost(90.0, None)}
    assert controller.policy(time.time()).last_used == {}

    def measured() -> list[float]:
        if not journal_path(state).is_file():
            return []
        try:
            with Journal.open(journal_path(state), readonly=True) as journal:
                return journal.restore_times().get("llm", {}).get("cold", [])
        except JournalError:  # the loop is creating it: no schema yet
            return []

    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(asyncio.run(controller.run())))
    thread.start()
    try:
        (cold,) = wait_for("the cold start's measurement", measured)
        assert str(docker_client.containers.get(name).status) == "running"
        assert HEALTH_DELAY_S <= cold < WAIT_S
        policy = controller.policy(time.time())
        assert policy.reload == {"llm": RestoreCost(cold, None)}  # measured, not the 90 declared
        assert controller.restore_estimates()["llm"].to_json() == {
            "cold_s": cold,
            "wake_s": None,
            "basis": "measured",
        }
        # a request is a use: its time is the serve's last use
        aio = wait_for("the loop to start", lambda: controller.aio)
        asked = time.time()
        aio.call_soon_threadsafe(controller.request_up, "llm", None)
        used = wait_for("the request", lambda: controller.policy(time.time()).last_used)
        assert used["llm"] >= asked
    finally:
        aio = wait_for("the loop to start", lambda: controller.aio)
        aio.call_soon_threadsafe(controller.stop)
        thread.join(WAIT_S)
    assert not thread.is_alive() and code == [0]

    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", PYTHONPATH=str(REPO))
    argv = ["status", "-m", str(path), "--state-dir", str(state), "--json"]
    r = run_cli(*argv, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["serves"]
    assert row["reload"] == {"cold_s": cold, "wake_s": None, "basis": "measured"}
