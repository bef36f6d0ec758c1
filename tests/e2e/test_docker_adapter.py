"""The Docker adapter against a real Docker daemon and the busybox test image.

Nothing here mocks Docker: containers are created, started, killed, paused and
OOM-killed for real, and the adapter reads them back. The pure helpers (state
mapping, ``Status`` duration parsing, GPU-request detection) are also checked on
literal documents shaped like Docker's answers.

The daemon may be shared with other test runs, so call-count assertions are made
about *our* containers (never re-inspected in a steady state) and about the
accounting (``api_calls == 1 + len(inspected)``), and a steady-state cycle of
exactly one call is required to occur, not to be the only thing that happens.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import NotFound
from docker.models.containers import Container
from support.waiting import WAIT_S, wait_for

from controller.adapters.docker.read import (
    EVERY_CONTAINER,
    ContainerObserver,
    ContainerSnapshot,
    InspectCache,
    gpu_request,
    make_client,
    manifest_containers,
    map_docker_state,
    observe_containers,
    status_age_bounds,
)
from controller.manifest import load_manifest_set
from controller.snapshot import parse_snapshot, snapshot_to_json
from statemachine.domain.types import ContainerState

BusyboxFactory = Callable[..., Container]

FIXTURES = Path(__file__).parents[1] / "fixtures"
SECOND_NS = 1_000_000_000


def _name(c: Container) -> str:
    name: str = c.name
    return name


def _wait_until(
    observer: ContainerObserver,
    names: list[str],
    done: Callable[[ContainerSnapshot], bool],
    *,
    timeout_s: float = WAIT_S,
) -> ContainerSnapshot:
    """Observe every 0.1 s until ``done(snapshot)`` (bounded: a last resort)."""
    deadline = time.monotonic() + timeout_s
    snap = observer.observe(names)
    while not done(snap):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s}s: {snap}")
        time.sleep(0.1)
        snap = observer.observe(names)
    return snap


@pytest.fixture
def created_container(
    docker_client: docker.DockerClient, test_image: str
) -> Iterator[Callable[..., Container]]:
    """Factory: a container *created, not started* from the test image; removed at teardown."""
    made: list[Container] = []

    def create(**kwargs: Any) -> Container:
        labels = {"vramctl.test": "1", **kwargs.pop("labels", {})}
        name = kwargs.pop("name", f"vramctl-test-{uuid.uuid4().hex[:12]}")
        c: Container = docker_client.containers.create(
            test_image, ["sleep", "3600"], name=name, labels=labels, **kwargs
        )
        made.append(c)
        return c

    yield create
    for c in reversed(made):
        with contextlib.suppress(NotFound):
            c.remove(force=True)


# ── pure helpers ───────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("word", "state"),
    [
        ("created", ContainerState.CREATED),
        ("running", ContainerState.RUNNING),
        ("paused", ContainerState.PAUSED),
        ("restarting", ContainerState.RESTARTING),
        ("exited", ContainerState.EXITED),
        ("dead", ContainerState.DEAD),
        ("removing", ContainerState.EXITED),
        ("Running", ContainerState.RUNNING),
        ("hibernating", None),
    ],
)
def test_map_docker_state(word: str, state: ContainerState | None) -> None:
    assert map_docker_state(word) == state


@pytest.mark.parametrize(
    ("status", "bounds"),
    [
        ("Created", None),
        ("Removal In Progress", None),
        ("Up Less than a second", (0, 1)),
        ("Up 1 second", (1, 2)),
        ("Up 42 seconds (health: starting)", (42, 43)),
        ("Up About a minute (healthy)", (60, 120)),
        ("Up 3 minutes (unhealthy)", (180, 240)),
        ("Up About an hour (Paused)", (3600, 5400)),
        ("Exited (137) 2 hours ago", (5400, 9000)),
        ("Restarting (1) 5 seconds ago", (5, 6)),
        ("Up 3 days", ((72 - 0.5) * 3600, (72 + 23.5) * 3600)),
        ("Up 2 weeks", ((336 - 0.5) * 3600, (336 + 167.5) * 3600)),
        ("Exited (0) 4 months ago", ((2880 - 0.5) * 3600, (2880 + 719.5) * 3600)),
        ("Up 2 years", (2 * 8760 * 3600, 3 * 8760 * 3600)),
    ],
)
def test_status_age_bounds(status: str, bounds: tuple[float, float] | None) -> None:
    assert status_age_bounds(status) == bounds


@pytest.mark.parametrize(
    ("doc", "gpu"),
    [
        ({"HostConfig": {"Runtime": "runc", "DeviceRequests": None}}, False),
        ({"HostConfig": {"DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}]}}, True),
        (
            {"HostConfig": {"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["0"]}]}},
            True,
        ),
        (
            {"HostConfig": {"DeviceRequests": [{"Driver": "", "Capabilities": [["tpu"]]}]}},
            False,
        ),
        (
            {
                "HostConfig": {"Runtime": "nvidia"},
                "Config": {"Env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]},
            },
            True,
        ),
        ({"HostConfig": {"Runtime": "nvidia"}, "Config": {"Env": ["PATH=/bin"]}}, False),
        (
            {
                "HostConfig": {"Runtime": "nvidia"},
                "Config": {"Env": ["NVIDIA_VISIBLE_DEVICES=void"]},
            },
            False,
        ),
        ({"HostConfig": {"Devices": [{"PathOnHost": "/dev/nvidia0"}]}}, True),
        ({"HostConfig": {"Devices": [{"PathOnHost": "nvidia.com/gpu=all"}]}}, True),
        ({"HostConfig": {"Devices": [{"PathOnHost": "/dev/fuse"}]}}, False),
        ({}, False),
    ],
)
def test_gpu_request(doc: Mapping[str, Any], gpu: bool) -> None:
    assert (gpu_request(doc) is not None) == gpu


def test_manifest_containers_of_the_real_stack() -> None:
    mset = load_manifest_set(sorted((FIXTURES / "anvil-serving").glob("*.toml")))
    names = manifest_containers(mset.serves)
    assert names == tuple(dict.fromkeys(s.container for s in mset.serves.values()))
    assert "vllm-qwen3-embedding" in names


# ── the real daemon ────────────────────────────────────────────────────────────


@pytest.mark.docker
def test_running_exited_killed_and_absent(
    docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    running = busybox_container()
    exited = busybox_container(["sh", "-c", "exit 3"])
    killed = busybox_container()
    killed.kill()
    assert exited.wait(timeout=20)["StatusCode"] == 3
    assert killed.wait(timeout=20)["StatusCode"] == 137
    absent = f"vramctl-test-absent-{uuid.uuid4().hex[:8]}"
    names = [_name(running), _name(exited), _name(killed), absent]

    snap = observe_containers(names, client=docker_client)

    assert snap.docker_ok and snap.error is None
    assert absent not in snap.containers
    for c in (running, exited, killed):
        c.reload()
    r = snap.containers[_name(running)]
    assert r.state is ContainerState.RUNNING
    assert r.health is None and r.exit_code is None and r.oom_killed is False
    assert r.started_at == running.attrs["State"]["StartedAt"]
    assert isinstance(r.started_at, str)
    datetime.fromisoformat(r.started_at[:19])  # docker's ISO 8601, nanoseconds and all
    e = snap.containers[_name(exited)]
    assert (e.state, e.exit_code, e.oom_killed) == (ContainerState.EXITED, 3, False)
    assert e.started_at == exited.attrs["State"]["StartedAt"]
    k = snap.containers[_name(killed)]
    assert (k.state, k.exit_code, k.oom_killed) == (ContainerState.EXITED, 137, False)
    # Without a cache every listed container was inspected once: 1 list + inspects.
    assert snap.api_calls == 1 + len(snap.inspected)
    assert set(names[:3]) <= set(snap.inspected)

    observed = snap.to_snapshot_model().to_observed()
    assert observed.docker_ok
    assert observed.container(absent).state is ContainerState.ABSENT
    assert observed.container(_name(running)).holds
    assert not observed.container(_name(exited)).holds
    started = observed.container(_name(running)).started_at
    assert started is not None and abs(started - time.time()) < 300


@pytest.mark.docker
def test_healthcheck_statuses(
    docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    fast = {"interval": SECOND_NS // 10, "timeout": SECOND_NS, "retries": 1}
    healthy = busybox_container(healthcheck={"test": ["CMD", "true"], **fast})
    unhealthy = busybox_container(healthcheck={"test": ["CMD", "false"], **fast})
    # The first check runs one interval after the start: an hour from now.
    starting = busybox_container(
        healthcheck={"test": ["CMD", "true"], "interval": 3600 * SECOND_NS, "retries": 1}
    )
    names = [_name(healthy), _name(unhealthy), _name(starting)]
    observer = ContainerObserver(docker_client)
    first = observer.observe(names)
    assert first.containers[_name(starting)].health == "starting"

    # The cache must notice health changes from the list alone and re-read them.
    snap = _wait_until(
        observer,
        names,
        lambda s: (
            s.containers[_name(healthy)].health == "healthy"
            and s.containers[_name(unhealthy)].health == "unhealthy"
        ),
    )
    assert snap.containers[_name(starting)].health == "starting"
    assert all(snap.containers[n].state is ContainerState.RUNNING for n in names)

    # Docker keeps a stopped container's last health; the snapshot, like `docker ps`, does not.
    healthy.kill()
    healthy.wait(timeout=20)
    after = observer.observe(names).containers[_name(healthy)]
    assert (after.state, after.health, after.exit_code) == (ContainerState.EXITED, None, 137)


@pytest.mark.docker
def test_oom_killed(docker_client: docker.DockerClient, busybox_container: BusyboxFactory) -> None:
    # A 50 MB shell variable in an 8 MiB cgroup without swap: the kernel OOM-kills it.
    # The daemon sets OOMKilled from the kernel's OOM event, which now and then races
    # the exit (seen about 1 run in 6 on this Docker 20.10): so the snapshot is held to
    # what the daemon itself says for each container, and of four hogs at least one
    # must carry the flag.
    hogs = [
        busybox_container(
            ["sh", "-c", 'x=$(head -c 50000000 /dev/zero | tr "\\0" a); echo ${#x}'],
            mem_limit="8m",
            memswap_limit="8m",
        )
        for _ in range(4)
    ]
    normal = busybox_container(["true"])
    for hog in hogs:
        assert hog.wait(timeout=30)["StatusCode"] == 137
    assert normal.wait(timeout=30)["StatusCode"] == 0

    snap = observe_containers([_name(h) for h in hogs] + [_name(normal)], client=docker_client)

    flags = []
    for hog in hogs:
        h = snap.containers[_name(hog)]
        truth = docker_client.api.inspect_container(hog.id)["State"]["OOMKilled"]
        assert (h.state, h.exit_code, h.oom_killed) == (ContainerState.EXITED, 137, truth)
        flags.append(h.oom_killed)
    assert any(flags), "no hog was reported OOM-killed"
    n = snap.containers[_name(normal)]
    assert (n.state, n.exit_code, n.oom_killed) == (ContainerState.EXITED, 0, False)


@pytest.mark.docker
def test_paused_holds_and_compose_labels(
    docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    composed = busybox_container(
        labels={"com.docker.compose.project": "p", "com.docker.compose.service": "s"}
    )
    plain = busybox_container()
    plain.pause()
    try:
        snap = observe_containers([_name(composed), _name(plain)], client=docker_client)
    finally:
        plain.unpause()

    c = snap.containers[_name(composed)]
    assert (c.compose_project, c.model_extra) == ("p", {"compose_service": "s"})
    assert snap.to_snapshot_model().to_observed().container(_name(composed)).compose_project == "p"
    p = snap.containers[_name(plain)]
    assert p.state is ContainerState.PAUSED
    assert (p.compose_project, p.model_extra) == (None, {"compose_service": None})
    assert snap.to_snapshot_model().to_observed().container(_name(plain)).holds


@pytest.mark.docker
def test_undeclared_gpu_containers(
    docker_client: docker.DockerClient,
    busybox_container: BusyboxFactory,
    created_container: Callable[..., Container],
) -> None:
    # Creating a container that requests GPUs needs no GPU; only starting it would.
    gpus = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    undeclared = created_container(
        device_requests=gpus,
        labels={"com.docker.compose.project": "stack", "com.docker.compose.service": "llm"},
    )
    declared = created_container(device_requests=gpus)
    plain = busybox_container()

    snap = observe_containers([_name(declared), _name(plain)], client=docker_client)

    assert snap.docker_ok
    assert snap.containers[_name(declared)].state is ContainerState.CREATED
    assert snap.containers[_name(declared)].started_at is None
    ours = {u.name: u for u in snap.undeclared_gpu}
    assert _name(declared) not in ours and _name(plain) not in ours
    u = ours[_name(undeclared)]
    assert u.state == "created"
    assert u.id == undeclared.id[:12]
    assert u.image == "vramctl-test:latest" or u.image.startswith("sha256:")
    assert (u.compose_project, u.compose_service) == ("stack", "llm")
    assert "gpu" in u.reason

    # It survives into the snapshot JSON as an extra key, and the JSON reads back.
    data = json.loads(json.dumps(snapshot_to_json(snap.to_snapshot_model())))
    assert _name(undeclared) in {d["name"] for d in data["undeclared_gpu_containers"]}
    assert data["containers"][_name(declared)]["state"] == "created"
    assert parse_snapshot(data).docker == "ok"


@pytest.mark.docker
@pytest.mark.parametrize(
    "host", ["unix:///nonexistent/docker.sock", "tcp://127.0.0.1:1", "bogus://nowhere"]
)
def test_unreachable_daemon_fails_closed(
    host: str, monkeypatch: pytest.MonkeyPatch, docker_client: docker.DockerClient
) -> None:
    monkeypatch.setenv("DOCKER_HOST", host)
    with pytest.raises(docker.errors.DockerException):
        make_client(timeout=2)

    snap = observe_containers(["serve-a"])

    assert snap.docker_ok is False
    assert snap.error and "docker" in snap.error.lower()
    assert snap.containers == {} and snap.undeclared_gpu == []
    assert snap.api_calls == 1
    model = snap.to_snapshot_model()
    assert model.docker == "error"
    assert model.docker_error == snap.error
    assert model.to_observed().docker_ok is False


@pytest.mark.docker
def test_daemon_lost_after_the_client_was_made() -> None:
    # A client that never negotiated (fixed version): the list call itself fails.
    client = docker.DockerClient(base_url="tcp://127.0.0.1:1", version="1.41", timeout=2)
    try:
        snap = observe_containers(["serve-a"], client=client, cache=InspectCache())
    finally:
        client.close()
    assert snap.docker_ok is False
    assert snap.error == (
        "docker unreachable at tcp://127.0.0.1:1: connection refused; "
        "start the Docker daemon, or set DOCKER_HOST to where it listens"
    )
    assert snap.api_calls == 1


@pytest.mark.docker
def test_observer_recovers_when_the_daemon_comes_back(
    monkeypatch: pytest.MonkeyPatch, docker_client: docker.DockerClient
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    observer = ContainerObserver(timeout=2)
    try:
        assert observer.observe(["serve-a"]).docker_ok is False
        monkeypatch.delenv("DOCKER_HOST")
        snap = observer.observe(["serve-a"])
        assert snap.docker_ok, snap.error
        assert "serve-a" not in snap.containers
    finally:
        observer.close()


@pytest.mark.docker
@pytest.mark.parametrize("serves", [1, 20])
def test_steady_state_costs_one_call_however_many_serves(
    serves: int, docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    with ThreadPoolExecutor(max_workers=5) as pool:
        made = list(pool.map(lambda _: busybox_container(), range(serves)))
    names = [_name(c) for c in made]
    observer = ContainerObserver(docker_client)

    first = observer.observe(names)
    assert first.docker_ok
    assert set(names) <= set(first.containers)
    assert set(names) <= set(first.inspected)
    assert first.api_calls == 1 + len(first.inspected)

    calls = []
    for _ in range(5):
        snap = observer.observe(names)
        assert set(names) <= set(snap.containers)
        assert not set(names) & set(snap.inspected), "a steady container was re-inspected"
        assert snap.api_calls == 1 + len(snap.inspected)
        calls.append(snap.api_calls)
        if snap.api_calls == 1:
            break
    # Other runs may add containers to a shared daemon; one quiet cycle must show 1 call.
    assert 1 in calls, calls


@pytest.mark.docker
def test_cache_sees_stop_and_restart(
    docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    c = busybox_container()
    name = _name(c)
    observer = ContainerObserver(docker_client)
    # Let its uptime grow past a few seconds, so a restart visibly shortens it.
    time.sleep(3)
    before = observer.observe([name]).containers[name]
    assert before.state is ContainerState.RUNNING

    # Same state, same Status text but for the duration: only the shorter uptime tells.
    c.restart(timeout=2)
    after = observer.observe([name])
    assert name in after.inspected
    assert after.containers[name].state is ContainerState.RUNNING
    assert after.containers[name].started_at != before.started_at

    c.kill()
    c.wait(timeout=20)
    stopped = observer.observe([name])
    assert name in stopped.inspected
    s = stopped.containers[name]
    assert (s.state, s.exit_code) == (ContainerState.EXITED, 137)

    c.remove(force=True)
    gone = observer.observe([name])
    assert gone.docker_ok and name not in gone.containers
    assert gone.api_calls == 1 + len(gone.inspected)


@pytest.mark.docker
def test_a_container_an_event_touched_is_inspected_again_though_its_row_is_the_same(
    docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    """Docker sends ``die`` before its list shows the container exited: the cycle the
    event asks for inspects the container whatever its list row says, once."""
    c = busybox_container()
    name = _name(c)
    observer = ContainerObserver(docker_client)
    observer.observe([name])
    assert name not in observer.observe([name]).inspected  # steady: the row is the same
    observer.cache.touch(str(c.id))
    touched = observer.observe([name])
    assert name in touched.inspected
    assert touched.containers[name].state is ContainerState.RUNNING
    assert name not in observer.observe([name]).inspected  # taken once


@pytest.mark.docker
def test_every_cached_container_is_inspected_again_once_every_container_is_touched(
    docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    """An event stream opened again touches every container: a death while none was
    open is seen by the next cycle though the list row still says ``Up``."""
    first, second = busybox_container(), busybox_container()
    names = [_name(first), _name(second)]
    observer = ContainerObserver(docker_client)

    def steady() -> bool:  # the rows are the same: nothing inspected again (a container
        # just started may still change its row once, e.g. its health)
        return not observer.observe(names).inspected

    wait_for("a steady list", steady)
    observer.cache.touch(EVERY_CONTAINER)
    assert sorted(observer.observe(names).inspected) == sorted(names)
    wait_for("a steady list again (the touch is taken once)", steady)


class _RemovesBeforeInspect:
    """The real client, except that inspecting ``victim`` first removes it (for real).

    It reproduces, deterministically, a container removed between the list call and
    its inspect; the NotFound comes from the real daemon.
    """

    def __init__(self, client: docker.DockerClient, victim: str) -> None:
        self._real = client.api
        self._victim = victim
        self.api = self

    def containers(self, **kwargs: Any) -> Any:
        return self._real.containers(**kwargs)

    def inspect_container(self, cid: str) -> Any:
        if cid == self._victim:
            self._real.remove_container(cid, force=True)
        return self._real.inspect_container(cid)


@pytest.mark.docker
def test_container_removed_between_list_and_inspect_is_absent(
    docker_client: docker.DockerClient, busybox_container: BusyboxFactory
) -> None:
    victim = busybox_container()
    survivor = busybox_container()
    client = _RemovesBeforeInspect(docker_client, victim.id)

    snap = observe_containers([_name(victim), _name(survivor)], client=client)

    assert snap.docker_ok, snap.error
    assert _name(victim) not in snap.containers
    assert snap.containers[_name(survivor)].state is ContainerState.RUNNING
