"""The controller's image, built and run as a Compose service beside a stack of serves.

The image is built by ``bin/build-image`` (wheels built here, installed offline in the
image) on the Debian base and the docker-CLI image that tests/docker/ensure-compose.sh
made, and run exactly as docs/deploy/compose-snippet.yml says: the snippet copied next
to the stack's ``docker-compose.yml`` with ``/srv/stack`` replaced by the stack's
folder, ``DOCKER_GID`` in the stack's ``.env``, the API token as a file secret owned by
uid 10001, started with ``docker compose -f docker-compose.yml -f vramctl.compose.yml
up -d vramctl``. A third file changes only what this machine lacks or shares: no
NVIDIA runtime, the image's tag, a container name and API port of the test's own, a
1 s resync, no restart policy.

Then, with the serves' ``up`` commands (``docker compose -f {dir}/docker-compose.yml
up -d S``) running inside the controller's container:

* the non-root controller (uid 10001) reaches the socket through the group it was
  given, and Compose inside the image creates the stack's resident serve;
* an edit of the manifest on the host adds a serve whose health comes late; the
  controller container is restarted while that start is in flight (mid-plan), and
  the restarted controller neither starts it again nor starts anything twice;
* an on-demand serve is brought up from the host through the containerised API.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from compose_stack import ComposeStack, compose_available, docker_compose
from support.serving import free_port
from support.waiting import WAIT_S, wait_for
from test_run_e2e import _follow_events, healthy, vramctl

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SNIPPET = REPO / "docs" / "deploy" / "compose-snippet.yml"
IMAGE = "vramctl:test"
TOKEN = "container-test-token-0123456789"


@pytest.fixture(scope="session")
def controller_image() -> str:
    """``bin/build-image`` on the local bases; Docker's layer cache keeps repeats short."""
    compose_available()
    base = os.environ.get("VRAMCTL_PYTHON_IMAGE", "vramctl-debian-python:bookworm")
    cli = os.environ.get("VRAMCTL_DOCKER_CLI_IMAGE", "vramctl-docker-cli:local")
    r = subprocess.run(
        [
            str(REPO / "bin" / "build-image"),
            "-t",
            IMAGE,
            "--python-image",
            base,
            "--docker-cli-image",
            cli,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert r.returncode == 0, f"bin/build-image failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return IMAGE


def test_the_state_volume_starts_empty_and_the_users_alone(controller_image: str) -> None:
    # no /etc/skel dotfiles (.bashrc, .profile) land in the operator's state volume
    r = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", controller_image, "-c",
         "ls -A /var/lib/vramctl; stat -c 'owner %u mode %a' /var/lib/vramctl"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["owner 10001 mode 700"], r.stdout


class Deployment:
    """The stack folder, the controller's Compose files and its container."""

    def __init__(self, tmp: Path, test_image: str, client: docker.DockerClient) -> None:
        self.client = client
        self.stack = ComposeStack(tmp / f"stack-{uuid.uuid4().hex[:6]}", test_image)
        self.dir = self.stack.dir
        self.ctl = f"{self.stack.project}-vramctl"
        self.api = free_port()
        self.files = ["docker-compose.yml", "vramctl.compose.yml", "test.override.yml"]

    @property
    def manifest(self) -> Path:
        return self.dir / "serves.toml"

    def prepare(self, image: str) -> None:
        self.stack.write()
        gid = os.stat("/var/run/docker.sock").st_gid
        (self.dir / ".env").write_text(f"DOCKER_GID={gid}\n")
        secrets = self.dir / "secrets"
        secrets.mkdir()
        token = secrets / "vramctl_token"
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
        os.chown(token, 10001, -1)  # the image's user must read the bind-mounted secret
        # the snippet, with the one change it asks for: the stack's folder for /srv/stack
        text = SNIPPET.read_text()
        code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert "\n".join(code).count("/srv/stack") == 3, "the snippet says: three places"
        (self.dir / "vramctl.compose.yml").write_text(text.replace("/srv/stack", str(self.dir)))
        (self.dir / "test.override.yml").write_text(
            f"""services:
  vramctl:
    image: {image}
    container_name: {self.ctl}
    runtime: !reset null
    restart: "no"
    labels: {{"vramctl.test": "1"}}
    environment:
      VRAMCTL_API: 127.0.0.1:{self.api}
      VRAMCTL_RESYNC: "1"
"""
        )

    def compose(self, *args: str) -> subprocess.CompletedProcess[str]:
        files = [a for f in self.files for a in ("-f", f)]
        return docker_compose(*files, *args, cwd=self.dir)

    def logs(self) -> str:
        r = subprocess.run(
            ["docker", "logs", self.ctl], capture_output=True, text=True, timeout=30, check=False
        )
        return r.stdout + r.stderr

    def wait_log(self, needle: str, since: int = 0) -> None:
        def seen() -> bool:
            return needle in self.logs()[since:]

        try:
            wait_for(f"{needle!r} in the controller's log", seen, WAIT_S)
        except AssertionError:
            raise AssertionError(f"{needle!r} not logged:\n{self.logs()[-6000:]}") from None

    def cycles(self) -> int | None:
        """The containerised loop's count of completed cycles (``/healthz``, from the host)."""
        try:
            url = f"http://127.0.0.1:{self.api}/healthz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(json.load(r)["cycles"])
        except (OSError, ValueError, KeyError):
            return None

    def cycled(self, n: int) -> None:
        """Wait until ``n`` whole cycles ran after this call (the one under way may have
        begun before it, so it does not count)."""
        under_way = wait_for(
            "the loop's cycle count", lambda: (c := self.cycles()) is not None and c + 1
        )
        wait_for(f"{n} more cycles", lambda: (self.cycles() or 0) >= under_way + n, WAIT_S)

    def serve(self, name: str, mib: int, residency: str, desired: str = "") -> str:
        want = f'desired = "{desired}"' if desired else ""
        return f"""
[[serve]]
name = "{name}"
container = "{self.stack.container(name)}"
gpu_role = "a"
vram_mib = {mib}
residency = "{residency}"
port = {self.stack.services[name].port}
health = "/health"
start_timeout_s = 60
stop_timeout_s = 5
up = "{self.stack.up_command(name)}"
{want}
"""

    def down(self) -> None:
        self.compose("--profile", "*", "down", "-t", "0", "-v", "--remove-orphans")
        with contextlib.suppress(docker.errors.NotFound):
            self.client.containers.get(self.ctl).remove(force=True)


@pytest.fixture
def deployment(
    controller_image: str, test_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> Iterator[Deployment]:
    d = Deployment(tmp_path, test_image, docker_client)
    try:
        yield d
    finally:
        d.down()


ROLE = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0
"""


def test_the_image_runs_beside_the_stack_and_survives_a_restart_mid_start(
    deployment: Deployment, controller_image: str, docker_client: docker.DockerClient
) -> None:
    d = deployment
    d.stack.add("res")
    d.stack.add("late", delay_s=6)  # its health answers 6 s after its start
    d.stack.add("ond")
    d.prepare(controller_image)
    res = d.serve("res", 3000, "resident", desired="running")
    late = d.serve("late", 3000, "resident", desired="running")
    ond = d.serve("ond", 3000, "on-demand")
    d.manifest.write_text(ROLE + res)

    events: list[dict[str, object]] = []
    # a stream quiet for longer than the client's read timeout would end silently and
    # miss the events after it: an hour, and the stream is closed at teardown
    events_client = docker.from_env(timeout=3600)
    stream, thread = _follow_events(events_client, d.stack.project + "-", events)
    try:
        up = d.compose("up", "-d", "vramctl")  # as documented: start ONLY vramctl
        assert up.returncode == 0, up.stdout + up.stderr

        # non-root, reaching the socket through the group the snippet adds
        ids = subprocess.run(
            ["docker", "exec", d.ctl, "id", "-u"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        groups = subprocess.run(
            ["docker", "exec", d.ctl, "id", "-G"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert ids.stdout.strip() == "10001", ids.stdout + ids.stderr
        assert str(os.stat("/var/run/docker.sock").st_gid) in groups.stdout.split()

        # Compose inside the image creates the resident serve from its `up`
        d.wait_log("res await_ready: ok")
        assert healthy(d.stack.services["res"].port)
        labels = docker_client.containers.get(d.stack.container("res")).labels
        assert labels["com.docker.compose.project"] == d.stack.project

        # an edit on the host: the late serve joins; restart the controller mid-start
        d.manifest.write_text(ROLE + res + late)
        wait_for(
            "late's container running",
            lambda: _state(docker_client, d, "late") == "running",
            WAIT_S,
        )
        assert not healthy(d.stack.services["late"].port), "restart must come mid-start"
        before = len(d.logs())
        restarted = subprocess.run(
            ["docker", "restart", "-t", "10", d.ctl],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert restarted.returncode == 0, restarted.stderr
        d.wait_log("vramctl run: ", since=before)
        wait_for("late healthy", lambda: healthy(d.stack.services["late"].port), WAIT_S)
        d.cycled(3)  # three cycles of the restarted controller: nothing more may start
        assert _starts(events, d, "late") == 1, d.logs()[-6000:]
        assert _starts(events, d, "res") == 1, d.logs()[-6000:]
        assert _state(docker_client, d, "res") == "running"

        # an on-demand serve, asked for from the host through the containerised API
        d.manifest.write_text(ROLE + res + late + ond)
        d.wait_log("manifest: reloaded (3 serves)")
        asked = vramctl(
            "up",
            "ond",
            "--ttl",
            "600",
            "--api",
            f"127.0.0.1:{d.api}",
            "--token-file",
            str(d.dir / "secrets" / "vramctl_token"),
        )
        assert asked.returncode == 0, asked.stdout + asked.stderr
        wait_for("ond healthy", lambda: healthy(d.stack.services["ond"].port), WAIT_S)
        # the event stream is read on its own thread: its start may come after the health
        wait_for("ond's start in the event stream", lambda: _starts(events, d, "ond") >= 1)
        assert _starts(events, d, "ond") == 1
    finally:
        with contextlib.suppress(Exception):
            stream.close()
        thread.join(5)
        events_client.close()


def _state(client: docker.DockerClient, d: Deployment, serve: str) -> str | None:
    try:
        return str(client.containers.get(d.stack.container(serve)).status)
    except docker.errors.NotFound:
        return None


def _starts(events: list[dict[str, object]], d: Deployment, serve: str) -> int:
    name = d.stack.container(serve)
    return sum(
        1
        for e in list(events)
        if e.get("Action") == "start"
        and (e.get("Actor") or {}).get("Attributes", {}).get("name") == name  # type: ignore[union-attr]
    )
