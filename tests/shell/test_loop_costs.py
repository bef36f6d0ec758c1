"""What a cycle of the loop does *not* do: the work it must not repeat for nothing.

A converged loop runs a cycle every resync and on every Docker event of its
containers; a manifest edit runs one before its first Docker call. Work that cycle
repeats without need shows up as idle CPU and as reaction time, so these tests pin
it down by counting (never by timing): connections made, clients built.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pynvml
import pytest
from fake_http import FakeEngineMetrics
from support.fakes_nvml import GIB, FakeDevice, FakeNvml, nvml_error
from support.manifests import CARD_A, RES_2000

from controller.adapters import engine_metrics
from controller.adapters.docker.read import ContainerSnapshot
from controller.adapters.engine_metrics import InFlightSources, read_all
from controller.manifest import load_manifest_set
from controller.service import loop_state
from controller.service.inflight import InFlightTracker
from controller.service.loop import Controller, RunOptions


class _CountingClient(httpx.Client):
    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> type[_CountingClient]:
    """Counts the HTTP clients the in-flight reader builds (each loads a TLS context)."""
    _CountingClient.made = 0
    monkeypatch.setattr(engine_metrics.httpx, "Client", _CountingClient)
    return _CountingClient


def test_no_source_no_http_client(clients: type[_CountingClient]) -> None:
    """Serves without a metrics page or a router tier are not read: no client is built."""
    got = read_all({"a": InFlightSources(), "b": InFlightSources()})
    assert {n: (r.count, r.source) for n, r in got.items()} == {
        "a": (None, None),
        "b": (None, None),
    }
    assert clients.made == 0
    tracker = InFlightTracker()
    for _ in range(3):
        tracker.read({"a": InFlightSources()}, running={"a"})
    assert clients.made == 0
    tracker.close()


def test_the_tracker_keeps_one_client_across_observations(
    clients: type[_CountingClient],
) -> None:
    """Every observation reads the counts; the HTTP client is built once, not per cycle."""
    tracker = InFlightTracker(timeout_s=2.0)
    with FakeEngineMetrics("vllm") as page:
        page.set(1, 2)
        src = {"od": InFlightSources(page.metrics_url, "vllm")}
        for _ in range(4):
            assert tracker.read(src, running={"od"})["od"].count == 3
        assert len(page.calls) == 4
    assert clients.made == 1
    tracker.close()
    tracker.close()  # closing twice is harmless


# ----- the footprint reading before a start or a stop -------------------------------------
MANIFEST = CARD_A + 'uuid = "GPU-0"\n' + RES_2000


class _CountingObserver:
    """Stands in for the docker reader: counts what the loop makes and asks."""

    made = 0
    observed = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).made += 1

    def observe(self, names: Any) -> ContainerSnapshot:
        type(self).observed += 1
        return ContainerSnapshot(docker_ok=True)

    def close(self) -> None:
        return None


def _controller(tmp_path: Path, nvml: FakeNvml) -> Controller:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state"), load_manifest_set([path])
    )
    c.nvml = nvml
    return c


@pytest.fixture
def observers(monkeypatch: pytest.MonkeyPatch) -> type[_CountingObserver]:
    _CountingObserver.made = _CountingObserver.observed = 0
    monkeypatch.setattr(loop_state, "ContainerObserver", _CountingObserver)
    return _CountingObserver


def test_footprint_reading_without_nvml_asks_docker_nothing(
    tmp_path: Path, observers: type[_CountingObserver]
) -> None:
    """Without NVML no device and no container figure can be known: the reading the
    executor takes right before its docker start or stop is unknown at once."""
    nvml = FakeNvml(init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    c = _controller(tmp_path, nvml)
    reading = c.reconciler.lessons.footprint_reading()
    assert reading.devices is None
    assert reading.containers.get("c-res") is None
    assert (observers.made, observers.observed) == (0, 0)


def test_footprint_reading_with_nvml_reads_the_devices_once(
    tmp_path: Path, observers: type[_CountingObserver]
) -> None:
    nvml = FakeNvml([FakeDevice("GPU-0", used=3 * GIB)])
    c = _controller(tmp_path, nvml)
    reading = c.reconciler.lessons.footprint_reading()
    assert reading.devices == {"GPU-0": 3 * 1024}
    assert nvml.calls.count("init") == 1
    assert (observers.made, observers.observed) == (1, 1)


# ----- what the first plan needs is made at start -----------------------------------------
@pytest.mark.docker
def test_the_first_plans_executor_and_readers_are_made_at_start(tmp_path: Path) -> None:
    """The executor (its docker client negotiates the API version) and the executor's
    container readers (a reader inspects every container on the host the first time)
    are made after the first cycle, before any plan needs them: the first manifest
    edit does not wait for them between its observation and its first docker call."""
    path = tmp_path / "serves.toml"
    name = f"vramctl-test-{uuid.uuid4().hex[:8]}-absent"
    path.write_text(MANIFEST.replace('"c-res"', f'"{name}"') + 'desired = "stopped"\n')
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state"), load_manifest_set([path])
    )
    c.nvml = FakeNvml(init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(asyncio.run(c.run())), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (c.reconciler.current_executor is not None and c.host.fresh is not None):
            assert time.monotonic() < deadline, "the executor was not made after the first cycle"
            time.sleep(0.05)
        assert c.last.plan is not None and not c.last.plan.steps  # no plan needed them
    finally:
        deadline = time.monotonic() + 60
        while c.aio is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.aio is not None
        c.aio.call_soon_threadsafe(c.stop)
        thread.join(60)
    assert code == [0]
