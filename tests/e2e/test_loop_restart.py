"""A killed serve comes back when the loop says it will, measured from Docker's events.

Against the real daemon, with the loop in-process and a resync of an hour, so that only
Docker's events and the loop's own wake-ups can restart anything: a resident that ran
healthy and is ``docker kill``ed is seen dead from Docker's ``die`` event (not at a
resync) and started again at once; killed again it is held for the promised backoff
and started when the hold ends (the loop wakes itself), not at some later resync.

The delays are read from Docker's own event times (``die`` -> the next ``start`` of
the same container) and checked against what the loop promised (the backoff's
``until`` that ``/v1/serves`` shows), with generous slack: the latency itself is
measured by ``benchmarks/bench_restart.py``, not asserted here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pynvml
import pytest
from support.fakes_nvml import FakeNvml, nvml_error
from support.waiting import wait_for
from test_loop_events import Running, create, manifest, names

from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.snapshot import epoch_seconds

__all__ = ["names"]  # the fixture, shared with test_loop_events

pytestmark = pytest.mark.docker

#: the backoff's base here (seconds): the second death in a row is held this long
BASE_S = 2.0
#: what a restart may lag behind its promise on a loaded test machine (seconds): a
#: minute, and still far from the hour of the resync, so a restart that comes at all
#: came from the loop's own wake-up
SLACK_S = 60.0


class DockerEvents:
    """Docker's own ``die`` and ``start`` events of one container, with Docker's times."""

    def __init__(self, client: docker.DockerClient, name: str) -> None:
        self.events: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._stream = client.events(decode=True, filters={"type": "container", "container": name})
        self._name = name
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for e in self._stream:
                action = str(e.get("Action") or e.get("status") or "")
                if (e.get("Actor") or {}).get("Attributes", {}).get("name") != self._name:
                    continue
                if action in ("start", "die"):
                    with self._lock:
                        self.events.append((action, int(e["timeNano"]) / 1e9))
        except Exception:  # closed
            return

    def seen(self) -> list[tuple[str, float]]:
        with self._lock:
            return list(self.events)

    def start_after(self, t: float) -> float | None:
        return next((at for what, at in self.seen() if what == "start" and at > t), None)

    def die_after(self, t: float) -> float | None:
        return next((at for what, at in self.seen() if what == "die" and at > t), None)

    def close(self) -> None:
        self._stream.close()


@pytest.fixture
def controller(tmp_path: Path) -> Callable[[str], Controller]:
    def make(container: str) -> Controller:
        path = tmp_path / "serves.toml"
        path.write_text(manifest([("res", container, "running")]))
        c = Controller(
            RunOptions(
                manifests=(path,),
                state_dir=tmp_path / "state",
                resync_s=3600.0,
                backoff_base_s=BASE_S,
            ),
            load_manifest_set([path]),
        )
        c.nvml = FakeNvml(init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
        return c

    return make


@pytest.fixture
def events(docker_client: docker.DockerClient) -> Iterator[Callable[[str], DockerEvents]]:
    made: list[DockerEvents] = []

    def follow(name: str) -> DockerEvents:
        made.append(DockerEvents(docker_client, name))
        return made[-1]

    yield follow
    for e in made:
        e.close()


def _kill_and_time_the_restart(
    client: docker.DockerClient, name: str, seen: DockerEvents, after: float
) -> tuple[float, float]:
    """Kill ``name``; Docker's times of its death and of the next start after it."""
    client.containers.get(name).kill()
    died = wait_for("docker's die event", lambda: seen.die_after(after))
    started = wait_for("the restart", lambda: seen.start_after(died), timeout=BASE_S + 2 * SLACK_S)
    return died, started


def _started_by_the_loop(run: Running, seen: DockerEvents, name: str) -> float:
    """Docker's time of the loop's own start of ``name``, once a cycle saw it running."""
    first = wait_for("the loop to start res", lambda: seen.start_after(0.0))
    wait_for("a cycle that saw it running", lambda: run.woken_by("docker start", name, "running"))
    return first


def test_a_killed_serve_is_seen_dead_by_the_cycle_its_die_event_asks_for(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    controller: Callable[[str], Controller],
    events: Callable[[str], DockerEvents],
) -> None:
    """Docker sends ``die`` before its container list shows the container exited: the
    cycle that event wakes must still see the death (and count it), not a later one."""
    name = names("res")
    create(docker_client, test_image, name)
    seen = events(name)
    c = controller(name)
    run = Running(c)
    try:
        first = _started_by_the_loop(run, seen, name)
        docker_client.containers.get(name).kill()
        wait_for("docker's die event", lambda: seen.die_after(first))
        woken = wait_for(
            "a cycle woken by the die event",
            lambda: [s for r, s in run.seen() if f"docker die {name}" in r],
        )
        assert woken[0].get(name) == "exited", woken
        assert c.view().backoff["res"].failures == 1
    finally:
        run.stop()


def _promises(c: Controller) -> Callable[[int], float | None]:
    """What the loop promised after each failure of res: the backoff's ``until`` (what
    ``/v1/serves`` shows) as the cycle that counted it left it (a healthy start lifts it
    later)."""
    seen: dict[int, float] = {}

    def note(ctl: Controller) -> None:
        b = ctl.view().backoff.get("res")
        if b is not None:
            seen.setdefault(b.failures, b.until)

    c.on_cycle.append(note)
    return seen.get


def test_a_killed_resident_is_restarted_when_the_loop_promised(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    controller: Callable[[str], Controller],
    events: Callable[[str], DockerEvents],
) -> None:
    name = names("res")
    create(docker_client, test_image, name)
    seen = events(name)
    c = controller(name)
    promised = _promises(c)
    run = Running(c)
    try:
        first = _started_by_the_loop(run, seen, name)

        # 1. killed after a healthy run: started again at once (the first death is not held)
        died, again = _kill_and_time_the_restart(docker_client, name, seen, first)
        until = wait_for("the first failure counted", lambda: promised(1))
        assert until - died < 1.0, f"the first death is held {until - died:.1f}s"
        assert again - died < SLACK_S, f"restarted {again - died:.1f}s after its death"
        assert "exited 137" in c.view().backoff["res"].last_failure
        wait_for("a cycle that saw res running again", lambda: _running_since(c, name, again))

        # 2. killed again: held for the backoff's base, started when the hold ends
        died2, again2 = _kill_and_time_the_restart(docker_client, name, seen, again)
        until2 = wait_for("the second failure counted", lambda: promised(2))
        assert until2 - died2 == pytest.approx(BASE_S, abs=1.0), until2 - died2
        # never before the promise (Docker's clock and the loop's are the host's)...
        assert again2 >= until2 - 0.05, f"started {until2 - again2:.2f}s before the hold ended"
        # ...and when it ends, not at a resync an hour away
        assert again2 - until2 < SLACK_S, f"started {again2 - until2:.1f}s after the hold"
    finally:
        run.stop()


def _running_since(c: Controller, name: str, started: float) -> bool:
    snap = c.last.snapshot
    m = None if snap is None else snap.containers.get(name)
    return m is not None and str(m.state) == "running" and _epoch(m.started_at) >= started - 1.0


def _epoch(value: Any) -> float:
    out = epoch_seconds(value)
    return 0.0 if out is None else out
