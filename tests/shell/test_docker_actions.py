"""The mutating Docker adapter: real containers, real commands, and a fake daemon.

``@pytest.mark.docker`` tests start, stop, inspect and read the logs of busybox
containers on the real daemon. The retry tests point a ``docker.DockerClient`` at a
small fake Docker API on loopback that answers 5xx on cue, so the transient/permanent
split and the bounded retries are pinned without a flaky daemon. ``run_up`` and the
preflight probes need no daemon at all.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound
from docker.models.containers import Container
from fake_http import FakeHTTPServer, Recorded, Reply
from support.serving import free_port
from support.waiting import wait_for

from controller.adapters.docker.actions import ActionError, DockerActions
from statemachine.domain.types import ContainerState

BusyboxFactory = Callable[..., Container]
CONTAINER_PREFIX = "vramctl-test-"  # as tests/conftest.py names its containers
TEST_LABEL = "vramctl.test"
API = "1.41"


def fast(client: docker.DockerClient) -> DockerActions:
    """Actions with the default 4 attempts and a tiny backoff, so retry tests stay fast."""
    return DockerActions(client, attempts=4, max_wait_s=5.0, initial_wait_s=0.01)


@pytest.fixture
def actions(docker_client: docker.DockerClient) -> DockerActions:
    return fast(docker_client)


@pytest.fixture
def created(docker_client: docker.DockerClient, test_image: str) -> Iterator[str]:
    """A busybox container that exists but was never started; removed afterwards."""
    name = f"{CONTAINER_PREFIX}{uuid.uuid4().hex[:12]}"
    container = docker_client.containers.create(
        test_image,
        ["sleep", "3600"],
        name=name,
        labels={TEST_LABEL: "1"},
        init=True,
        network_mode="host",
    )
    try:
        yield name
    finally:
        with contextlib.suppress(NotFound):
            container.remove(force=True)


@pytest.fixture
def offline_actions() -> DockerActions:
    """Actions on a client whose daemon is never contacted (for run_up and probes)."""
    client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{free_port()}", version=API)
    return fast(client)


# ── the real daemon ────────────────────────────────────────────────────────────


@pytest.mark.docker
def test_start_stop_inspect_on_a_real_container(actions: DockerActions, created: str) -> None:
    before = actions.inspect(created)
    assert before is not None and before.state == ContainerState.CREATED
    assert before.started_at is None and before.exit_code is None

    actions.start(created)
    running = actions.inspect(created)
    assert running is not None and running.state == ContainerState.RUNNING
    assert running.started_at is not None
    assert running.id is not None and len(running.id) == 64
    actions.start(created)  # already started: Docker's 304 is a success

    actions.stop(created, timeout_s=5)
    assert actions.exists(created)  # stop keeps the container
    stopped = actions.inspect(created)
    assert stopped is not None and stopped.state == ContainerState.EXITED
    # init=True: its SIGTERM ended it (143), not the SIGKILL at the timeout (137)
    assert stopped.exit_code == 143 and stopped.oom_killed is False
    actions.stop(created, timeout_s=5)  # already stopped: a success too

    actions.start(created)  # and it starts again
    again = actions.inspect(created)
    assert again is not None and again.state == ContainerState.RUNNING


@pytest.mark.docker
def test_stop_of_a_never_started_container_is_a_success(
    actions: DockerActions, created: str
) -> None:
    actions.stop(created, timeout_s=1)
    assert actions.exists(created)


@pytest.mark.docker
def test_logs_returns_the_last_lines(
    actions: DockerActions, busybox_container: BusyboxFactory
) -> None:
    container = busybox_container(
        # Docker orders stdout and stderr by arrival: the pause keeps "oops" last.
        ["sh", "-c", "for i in 1 2 3 4 5; do echo line$i; done; sleep 1; echo oops >&2; sleep 3600"]
    )

    def last_lines() -> str:
        return actions.logs(container.name, tail=3)

    wait_for('"oops" in the last lines', lambda: "oops" in last_lines(), seen=last_lines)
    assert last_lines() == "line4\nline5\noops"
    assert actions.logs(container.name).startswith("line1\n")


@pytest.mark.docker
def test_absent_container(actions: DockerActions) -> None:
    name = f"{CONTAINER_PREFIX}absent-{uuid.uuid4().hex[:8]}"
    assert actions.inspect(name) is None
    assert actions.exists(name) is False
    acts: list[Callable[[], None]] = [lambda: actions.start(name), lambda: actions.stop(name, 1)]
    for act in acts:
        with pytest.raises(ActionError) as info:
            act()
        assert (info.value.transient, info.value.status, info.value.attempts) == (False, 404, 1)
        assert name in info.value.message
    text = actions.logs(name)
    assert "does not exist" in text and name in text


# ── a fake daemon: transient faults are retried, permanent ones are not ─────────


class FakeDocker(FakeHTTPServer):
    """Answers ``POST /v1.41/containers/x/{start,stop}`` with a scripted status list."""

    def __init__(self, statuses: list[tuple[int, str]]) -> None:
        super().__init__()
        self.statuses = list(statuses)

    def handle(self, request: Recorded) -> Reply:
        if request.method == "POST" and request.path.startswith(f"/v{API}/containers/x/"):
            status, message = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
            return Reply(status, {"message": message} if message else None)
        return Reply(404, {"message": f"page not found: {request.path}"})

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=f"tcp://127.0.0.1:{self.port}", version=API)


def test_5xx_is_retried_until_it_succeeds() -> None:
    with FakeDocker([(500, "daemon hiccup"), (500, "daemon hiccup"), (204, "")]) as fake:
        fast(fake.client()).start("x")
        assert [c.path for c in fake.calls] == [f"/v{API}/containers/x/start"] * 3


def test_5xx_until_attempts_run_out_is_transient() -> None:
    with FakeDocker([(500, "daemon hiccup")]) as fake:
        actions = fast(fake.client())
        with pytest.raises(ActionError) as info:
            actions.start("x")
        assert len(fake.calls) == 4
    err = info.value
    assert (err.transient, err.status, err.attempts) == (True, 500, 4)
    assert "daemon hiccup" in err.message and "after 4 attempts" in err.message


def test_retries_are_bounded_in_time_too() -> None:
    with FakeDocker([(503, "busy")]) as fake:
        actions = DockerActions(fake.client(), attempts=1000, max_wait_s=0.3, initial_wait_s=0.05)
        begin = time.monotonic()
        with pytest.raises(ActionError) as info:
            actions.start("x")
        assert time.monotonic() - begin < 3
    assert info.value.transient is True and 1 < info.value.attempts < 20


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (404, "No such container: x"),
        (409, "container is marked for removal"),
        (400, "bad parameter"),
        (500, "OCI runtime create failed: exec: sleepz: executable file not found in $PATH"),
    ],
    ids=["404", "409", "400", "500-oci"],
)
def test_permanent_faults_are_raised_at_once(status: int, message: str) -> None:
    with FakeDocker([(status, message)]) as fake:
        actions = fast(fake.client())
        with pytest.raises(ActionError) as info:
            actions.start("x")
        assert len(fake.calls) == 1
    assert (info.value.transient, info.value.status, info.value.attempts) == (False, status, 1)
    assert message in info.value.message


@pytest.mark.parametrize("action", ["start", "stop"])
def test_not_modified_is_a_success(action: str) -> None:
    with FakeDocker([(304, "")]) as fake:
        actions = fast(fake.client())
        if action == "start":
            actions.start("x")
        else:
            actions.stop("x", timeout_s=4.2)
        (call,) = fake.calls
    if action == "stop":
        assert call.query == {"t": "5"}  # Docker takes whole seconds: rounded up


def test_unreachable_daemon_is_transient_after_retries(offline_actions: DockerActions) -> None:
    with pytest.raises(ActionError) as info:
        offline_actions.start("x")
    assert info.value.transient is True
    assert info.value.attempts == 4
    assert "unreachable" in info.value.message


def test_logs_never_raise(offline_actions: DockerActions) -> None:
    text = offline_actions.logs("x")
    assert text.startswith("(logs of x unavailable: ")


# ── run_up ─────────────────────────────────────────────────────────────────────


def test_run_up_runs_the_argv_without_a_shell(
    offline_actions: DockerActions, tmp_path: Path
) -> None:
    script = "import os; print('x'); print(os.getcwd()); print('$HOME')"
    result = offline_actions.run_up([sys.executable, "-c", script], cwd=tmp_path, timeout_s=30)
    assert result.ok and result.returncode == 0 and not result.timed_out
    assert result.output.splitlines() == ["x", str(tmp_path), "$HOME"]
    assert result.argv == (sys.executable, "-c", script)
    assert result.message.endswith(": exit 0")


def test_run_up_gets_a_clean_environment_plus_the_given_one(
    offline_actions: DockerActions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VRAMCTL_TOKEN", "s3cr3t")
    monkeypatch.setenv("VRAMCTL_ROUTER_TOKEN", "s3cr3t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("DOCKER_CONTEXT", "default")
    monkeypatch.setenv("COMPOSE_PROFILES", "gpu")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    script = tmp_path / "up.sh"
    script.write_text("#!/bin/sh\nenv -0 > env.dump\n")
    script.chmod(0o755)
    result = offline_actions.run_up(
        ["./up.sh"], cwd=tmp_path, timeout_s=30, env={"EXTRA": "a b", "COMPOSE_PROFILES": "cpu"}
    )
    assert result.ok, result.message
    pairs = [p for p in (tmp_path / "env.dump").read_bytes().split(b"\0") if p]
    got = dict(p.decode().split("=", 1) for p in pairs)
    assert "s3cr3t" not in " ".join(got.values())
    assert got["EXTRA"] == "a b" and got["COMPOSE_PROFILES"] == "cpu"
    assert got["DOCKER_CONTEXT"] == "default" and got["LC_ALL"] == "C.UTF-8"
    assert got["PATH"] == os.environ["PATH"]


def test_run_up_keeps_the_tail_of_stdout_and_stderr(
    offline_actions: DockerActions, tmp_path: Path
) -> None:
    script = (
        "import sys\n"
        "for i in range(100): print(f'line {i}', flush=True)\n"
        "print('failed to start', file=sys.stderr); sys.exit(3)"
    )
    result = offline_actions.run_up([sys.executable, "-c", script], cwd=tmp_path, timeout_s=30)
    assert result.returncode == 3 and not result.ok
    lines = result.output.splitlines()
    assert lines[-1] == "failed to start" and lines[-2] == "line 99"
    assert "line 0" not in lines and len(lines) == 40
    assert result.message.endswith(": exit 3")


def test_run_up_missing_executable_is_127(offline_actions: DockerActions, tmp_path: Path) -> None:
    result = offline_actions.run_up(["vramctl-no-such-program", "up"], cwd=tmp_path, timeout_s=5)
    assert result.returncode == 127
    assert "executable not found: vramctl-no-such-program" in result.message


def test_run_up_not_executable_is_126(offline_actions: DockerActions, tmp_path: Path) -> None:
    script = tmp_path / "up.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    result = offline_actions.run_up([str(script)], cwd=tmp_path, timeout_s=5)
    assert result.returncode == 126


def test_run_up_missing_cwd_is_127(offline_actions: DockerActions, tmp_path: Path) -> None:
    result = offline_actions.run_up(
        [sys.executable, "-c", "pass"], cwd=tmp_path / "gone", timeout_s=5
    )
    assert result.returncode == 127 and "working directory not found" in result.message


def test_run_up_timeout_kills_the_whole_group(
    offline_actions: DockerActions, tmp_path: Path
) -> None:
    # The child spawns a grandchild that keeps the output pipe open: both must die.
    script = (
        "import subprocess, sys, time\n"
        "print('starting', flush=True)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)"
    )
    begin = time.monotonic()
    result = offline_actions.run_up([sys.executable, "-c", script], cwd=tmp_path, timeout_s=1)
    assert time.monotonic() - begin < 30  # not held by the grandchild's 60 s on the pipe
    assert result.returncode is None and result.timed_out and not result.ok
    assert "timed out after 1 s" in result.message
    assert result.output == "starting"


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_run_up_needs_a_positive_timeout(
    offline_actions: DockerActions, tmp_path: Path, bad: float
) -> None:
    with pytest.raises(ValueError, match="timeout"):
        offline_actions.run_up(["true"], cwd=tmp_path, timeout_s=bad)


def test_run_up_needs_an_argv(offline_actions: DockerActions, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty argv"):
        offline_actions.run_up([], cwd=tmp_path, timeout_s=5)


# ── preflight probes ───────────────────────────────────────────────────────────


def test_executable_exists(tmp_path: Path) -> None:
    assert DockerActions.executable_exists(sys.executable)
    assert DockerActions.executable_exists("sh")
    assert not DockerActions.executable_exists("vramctl-no-such-program")
    assert not DockerActions.executable_exists("")
    tool = tmp_path / "bin" / "up"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    assert not DockerActions.executable_exists("bin/up", cwd=tmp_path)  # not executable
    tool.chmod(0o755)
    assert DockerActions.executable_exists("bin/up", cwd=tmp_path)
    assert DockerActions.executable_exists(str(tool))


def test_port_in_use_follows_a_listener() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        assert DockerActions.port_in_use(port)
        assert DockerActions.port_in_use(port, host="127.0.0.1")
    finally:
        listener.close()
    assert not DockerActions.port_in_use(port)
