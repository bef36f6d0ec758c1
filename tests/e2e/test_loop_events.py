"""The loop follows Docker's events of the containers it observes, and only those.

Against the real daemon, with the loop in-process and a resync of an hour, so that only
Docker's events (and the loop's own triggers) wake it: a declared container started or
stopped outside the controller wakes a cycle that sees it; a container of someone else
on the same daemon wakes nothing; a container declared by an edit is followed from the
reload on, even when it is created only afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pynvml
import pytest
from docker.errors import NotFound
from support.fakes_nvml import FakeNvml, nvml_error
from support.waiting import WAIT_S, wait_for

from controller.manifest import load_manifest_set
from controller.service import loop_state
from controller.service.loop import Controller, RunOptions

pytestmark = pytest.mark.docker


SERVE = """
[[serve]]
name = "{name}"
container = "{container}"
gpu_role = "a"
vram_mib = 1000
residency = "resident"
desired = "{desired}"
stop_timeout_s = 1
"""


def manifest(serves: list[tuple[str, str, str]]) -> str:
    head = '[[gpu_roles]]\nid = "a"\nvram_mib = 100000\nreserve_mib = 0\n'
    return head + "".join(SERVE.format(name=n, container=c, desired=d) for n, c, d in serves)


class Running:
    """A controller running its loop in a thread; every cycle's reasons and snapshot."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.cycles: list[tuple[tuple[str, ...], dict[str, str]]] = []
        self._lock = threading.Lock()
        controller.on_cycle.append(self._seen)
        self.code: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code.append(asyncio.run(self.controller.run()))

    def _seen(self, c: Controller) -> None:
        snap = c.last.snapshot
        states = {} if snap is None else {n: str(m.state) for n, m in snap.containers.items()}
        with self._lock:
            self.cycles.append((c.last.reasons, states))

    def seen(self) -> list[tuple[tuple[str, ...], dict[str, str]]]:
        with self._lock:
            return list(self.cycles)

    def reasons(self) -> list[str]:
        return [r for reasons, _ in self.seen() for r in reasons]

    def woken_by(self, reason: str, container: str, state: str) -> bool:
        """A cycle asked for by ``reason`` saw ``container`` in ``state``."""
        return any(
            any(r.startswith(reason) for r in reasons) and states.get(container) == state
            for reasons, states in self.seen()
        )

    def stop(self) -> None:
        aio = wait_for("the loop to start", lambda: self.controller.aio)
        aio.call_soon_threadsafe(self.controller.stop)
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive() and self.code == [0]


@pytest.fixture
def names(docker_client: docker.DockerClient) -> Iterator[Callable[[str], str]]:
    made: list[str] = []

    def name(what: str) -> str:
        made.append(f"vramctl-test-{uuid.uuid4().hex[:10]}-{what}")
        return made[-1]

    yield name
    for n in made:
        with contextlib.suppress(NotFound):
            docker_client.containers.get(n).remove(force=True)


def create(client: docker.DockerClient, image: str, name: str) -> None:
    client.containers.create(
        image,
        ["sleep", "3600"],
        name=name,
        init=True,
        network_mode="host",
        labels={"vramctl.test": "1"},
    )


def controller(tmp_path: Path, text: str) -> tuple[Controller, Path]:
    path = tmp_path / "serves.toml"
    path.write_text(text)
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state", resync_s=3600.0),
        load_manifest_set([path]),
    )
    c.nvml = FakeNvml(init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    return c, path


def test_outside_starts_and_stops_of_declared_containers_wake_the_loop_others_do_not(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    kept, off, other = names("kept"), names("off"), names("other")
    for n in (kept, off, other):
        create(docker_client, test_image, n)
    c, _ = controller(tmp_path, manifest([("kept", kept, "running"), ("off", off, "stopped")]))
    run = Running(c)
    try:
        # the loop starts "kept" itself, and its own start is seen
        wait_for("the loop to start kept", lambda: run.woken_by("docker start", kept, "running"))
        wait_for(
            "a cycle after the start",
            lambda: any(s.get(kept) == "running" for _, s in run.seen()[-1:]),
        )
        # someone else's container on the same daemon: no cycle for it
        docker_client.containers.get(other).start()
        # a declared container started outside the controller: seen at once
        docker_client.containers.get(off).start()
        wait_for(
            "the outside start of off",
            lambda: run.woken_by(f"docker start {off}", off, "running"),
        )
        # and one stopped outside
        docker_client.containers.get(kept).stop(timeout=1)
        wait_for(
            "the outside stop of kept",
            lambda: (
                run.woken_by(f"docker die {kept}", kept, "exited")
                or run.woken_by(f"docker stop {kept}", kept, "exited")
            ),
        )
        assert not [r for r in run.reasons() if other in r]
    finally:
        run.stop()


def test_a_container_declared_by_an_edit_is_followed_once_reloaded(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    first, late = names("first"), names("late")
    create(docker_client, test_image, first)
    c, path = controller(tmp_path, manifest([("first", first, "stopped")]))
    run = Running(c)
    try:
        wait_for("the first cycle", run.seen)
        path.write_text(manifest([("first", first, "stopped"), ("late", late, "stopped")]))
        wait_for("the reload", lambda: "late" in c.mset.serves and len(run.seen()) >= 2)
        # created and started by hand after the edit: the loop has never seen it
        create(docker_client, test_image, late)
        docker_client.containers.get(late).start()
        wait_for(
            "the outside start of late",
            lambda: any(states.get(late) == "running" for _, states in run.seen()),
        )
    finally:
        run.stop()


def test_a_declared_container_renamed_away_outside_wakes_the_loop(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """Renamed away, the container is no longer the declared one: the loop must see it
    (Docker's rename event carries only the new name, so a stream filtered by the
    declared names alone never has it, nor the renamed container's later stop)."""
    kept, off, away = names("kept"), names("off"), names("away")
    for n in (kept, off):
        create(docker_client, test_image, n)
    c, _ = controller(tmp_path, manifest([("kept", kept, "running"), ("off", off, "stopped")]))
    run = Running(c)
    try:
        wait_for("the loop to start kept", lambda: run.woken_by("docker start", kept, "running"))
        wait_for(
            "a cycle after the start",
            lambda: any(s.get(kept) == "running" for _, s in run.seen()[-1:]),
        )
        docker_client.containers.get(kept).rename(away)
        # the cycle the rename asked for first: started before it ends, off would be seen
        # running (and stopped) by that cycle, and the one its start asks for would find
        # it exited already (under load, where that cycle is slow)
        wait_for(
            "the rename to wake the loop",
            lambda: any(r.startswith("docker rename") for r in run.reasons()),
        )
        # then a later event of a followed container is seen at once: by the cycle its
        # start event asks for, or by the one the stream's reopening (its filter changed
        # with the rename) asks for, where that one runs first (it touches every container)
        docker_client.containers.get(off).start()
        wait_for(
            "the outside start of off",
            lambda: (
                run.woken_by(f"docker start {off}", off, "running")
                or any(s.get(off) == "running" for _, s in run.seen())
            ),
        )
        assert any(r.startswith("docker rename") for r in run.reasons()), run.reasons()
    finally:
        run.stop()


class _Tapped:
    """A Docker event stream whose events are noted as the events thread reads them."""

    def __init__(self, stream: Any, seen: list[dict[str, Any]]) -> None:
        self._stream, self._seen = stream, seen

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for event in self._stream:
            self._seen.append(event)
            yield event

    def close(self) -> None:
        self._stream.close()


def _started(events: list[dict[str, Any]], name: str) -> bool:
    return any(
        str(e.get("status") or e.get("Action")) == "start"
        and (e.get("Actor") or {}).get("Attributes", {}).get("name") == name
        for e in list(events)
    )


def test_a_container_whose_name_begins_with_a_declared_one_wakes_nothing(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Docker matches a ``container`` event filter by prefix: a stream filtered to
    ``web`` also has the events of ``web-old``. Someone else's container whose name
    merely begins with a declared one's wakes no cycle either: its event reaches the
    events thread (asserted, so the test cannot pass on an event never delivered) and
    the thread triggers nothing for it."""
    off = names("off")
    other = off + "-other"  # someone else's (removed below)
    create(docker_client, test_image, off)
    create(docker_client, test_image, other)
    off_id = docker_client.containers.get(off).id[:12]
    delivered: list[dict[str, Any]] = []  # every event the events thread read
    real_open = loop_state.open_events

    def tapped(client: Any, filters: Any) -> _Tapped:
        return _Tapped(real_open(client, filters), delivered)

    monkeypatch.setattr(loop_state, "open_events", tapped)
    c, _ = controller(tmp_path, manifest([("off", off, "stopped")]))
    triggered: list[str] = []  # every cycle asked for, by the events thread or any other
    real_trigger = c.trigger

    def trigger(reason: str) -> None:
        triggered.append(reason)
        real_trigger(reason)

    c.trigger = trigger  # type: ignore[method-assign]
    run = Running(c)
    try:
        wait_for("the first cycle", run.seen)
        # the stream as it stays: filtered to off's name and id (an observation that
        # changed the filter would reopen it, and lose what happened in between)
        wait_for(
            "the stream filtered to off",
            lambda: (
                c.docker_events.stream is not None
                and set((c.docker_events.filters or {}).get("container", ())) == {off, off_id}
            ),
        )
        docker_client.containers.get(other).start()
        # a later event of the declared container: the stream has delivered the other's
        # start by then (a stream's events come in order)
        docker_client.containers.get(off).start()
        wait_for("off's start to reach the events thread", lambda: _started(delivered, off))
        assert _started(delivered, other), "Docker did not deliver the other's start"
        wait_for("the outside start of off", lambda: f"docker start {off}" in triggered)
        assert not [r for r in triggered if other in r], triggered
        assert not [r for r in run.reasons() if other in r], run.reasons()
    finally:
        run.stop()
        with contextlib.suppress(NotFound):
            docker_client.containers.get(other).remove(force=True)


class _Relay:
    """A unix-socket relay to the Docker socket that can turn unreachable: while
    ``refusing``, each connection is closed at once (every API call fails). Counts the
    connections it accepts."""

    def __init__(
        self, path: Path, upstream: str = "/var/run/docker.sock", max_line: int | None = None
    ) -> None:
        self.path, self.upstream = path, upstream
        self.refusing = False
        #: the longest request line relayed (a proxy's bound); a longer one gets a 414
        self.max_line = max_line
        self.accepted = 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.accepted += 1
            if self.refusing:
                conn.close()
                continue
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(self.upstream)
            for src, dst, out in ((conn, up, True), (up, conn, False)):
                threading.Thread(target=self._pump, args=(src, dst, out), daemon=True).start()

    def _too_long(self, data: bytes) -> bool:
        """True when ``data`` begins a request whose request line passes the bound."""
        if self.max_line is None or not data[:8].split(b" ")[0].isupper():
            return False
        end = data.find(b"\r\n")
        return (end if end >= 0 else len(data)) > self.max_line

    def _pump(self, src: socket.socket, dst: socket.socket, out: bool) -> None:
        try:
            while data := src.recv(65536):
                if out and self._too_long(data):
                    src.sendall(
                        b"HTTP/1.1 414 Request-URI Too Long\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n"
                    )
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._server.close()


def test_the_event_stream_reopened_for_a_new_filter_while_docker_is_down_does_not_spin(
    docker_client: docker.DockerClient,
    names: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream closed for a new filter is opened again at once; when Docker cannot
    be reached right then, the thread must wait between tries as after any other
    failure, not retry in a tight loop for as long as Docker stays down."""
    relay = _Relay(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{relay.path}")
    first, second = names("first"), names("second")
    c, _ = controller(tmp_path, manifest([("first", first, "stopped")]))
    c.docker_events.names = frozenset({first})
    loop = asyncio.new_event_loop()  # call_soon_threadsafe only queues on it
    thread = threading.Thread(target=c.read_docker_events, args=(loop,), daemon=True)
    thread.start()
    try:
        wait_for("the stream to open", lambda: c.docker_events.stream is not None)
        relay.refusing = True  # docker unreachable from now on
        before = relay.accepted
        c.docker_events.follow((first, second))  # a new filter: the open stream is closed
        # every try costs one connection: a tight loop makes hundreds a second, a
        # paced one (2 s between tries) a handful over the same while
        time.sleep(3.0)
        tries = relay.accepted - before
        assert tries <= 10, f"{tries} connection attempts in 3 s while docker was down"
    finally:
        c.stop_event.set()
        thread.join(WAIT_S)
        relay.close()
        loop.close()


def test_an_event_filter_a_proxy_refuses_falls_back_to_every_containers_events(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under the 256 names the filter is sent, in the request's URL; a proxy in front of
    the daemon that bounds a request line (nginx: 8 KiB by default) refuses it. The
    stream must still be followed (unfiltered), not retried with the same filter for
    ever, missing every outside start and stop."""
    relay = _Relay(tmp_path / "docker.sock", max_line=8192)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{relay.path}")
    declared = [names(f"{i:03d}-{uuid.uuid4().hex}") for i in range(200)]
    c, _ = controller(tmp_path, manifest([("first", declared[0], "stopped")]))
    c.docker_events.names = frozenset(declared)
    reasons: list[str] = []
    c.trigger = reasons.append  # type: ignore[method-assign]  # what the thread asks for
    loop = asyncio.new_event_loop()  # run below, a moment at a time, for its callbacks
    thread = threading.Thread(target=c.read_docker_events, args=(loop,), daemon=True)
    thread.start()

    def started() -> bool:
        loop.run_until_complete(asyncio.sleep(0.05))
        return f"docker start {declared[0]}" in reasons

    try:
        create(docker_client, test_image, declared[0])

        # started outside, again and again until the stream has it (it may not be open
        # yet when one start happens)
        def start_seen() -> bool:
            docker_client.containers.get(declared[0]).restart(timeout=0)
            return wait_for_quietly(started, 2.0)

        wait_for("an outside start of a declared container", start_seen)
    finally:
        c.stop_event.set()
        c.docker_events.close()
        thread.join(WAIT_S)
        relay.close()
        loop.close()


def wait_for_quietly(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
    return False
