"""A serve's ``up`` command, carried out by ``vramctl apply`` on the real daemon.

The ``up`` here is a shell script in the stack's folder (beside the manifest) that
creates and starts the serve's busybox container with the ``docker`` CLI, and writes
down the environment it was given. ``vramctl`` runs from the repository root, not
from that folder, as it does under systemd.

* a relative ``up`` executable (``./bin/up.sh``) is checked by the preflight where it
  runs, in the manifest's folder;
* the command gets a clean environment: what a ``docker`` / ``docker compose`` needs,
  the variables the operator names in ``VRAMCTL_UP_ENV_PASS`` and the serve's
  ``up_env``, never the controller's tokens (not even when named) or anything else.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound
from support.cli import run_cli
from support.serving import free_port

from controller.manifest import ManifestError, load_manifest_set

ROOT = Path(__file__).resolve().parents[2]


def vramctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, cwd=ROOT, timeout=180)


class Stack:
    """A stack folder: ``serves.toml`` and ``bin/up.sh``, one serve ``job``."""

    def __init__(self, tmp: Path, image: str, client: docker.DockerClient) -> None:
        self.client = client
        self.dir = tmp / "stack"
        (self.dir / "bin").mkdir(parents=True)
        self.container = f"vramctl-test-{uuid.uuid4().hex[:8]}-job"
        self.port = free_port()
        self.dump = self.dir / "up.env"
        script = self.dir / "bin" / "up.sh"
        httpd = (
            f"mkdir -p /www && echo ok > /www/health && "
            f"exec httpd -f -p 127.0.0.1:{self.port} -h /www"
        )
        script.write_text(
            "#!/bin/sh\n"
            "set -e\n"
            "env -0 > up.env\n"  # relative: the command runs in the manifest's folder
            "printf '%s\\n' \"$@\" > up.args\n"
            f"docker run -d --name {self.container} --network host --init "
            f"--label vramctl.test=1 {image} sh -c '{httpd}'\n"
        )
        script.chmod(0o755)
        self.manifest = self.dir / "serves.toml"
        self.args = self.dir / "up.args"

    def write(self, extra: str = "", *, up: str = "./bin/up.sh", uuid: str | None = None) -> None:
        row = f'uuid = "{uuid}"' if uuid else ""
        self.manifest.write_text(
            f"""
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0
{row}

[[serve]]
name = "job"
container = "{self.container}"
gpu_role = "a"
vram_mib = 1000
residency = "resident"
desired = "running"
port = {self.port}
health = "/health"
start_timeout_s = 60
up = "{up}"
{extra}
"""
        )

    def apply(self, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        plan = self.dir.parent / "plan.json"
        made = vramctl("plan", "-m", str(self.manifest), "--out", str(plan), env=env)
        assert made.returncode == 0, made.stdout + made.stderr
        return vramctl("apply", "-m", str(self.manifest), str(plan), env=env)

    def environment(self) -> dict[str, str]:
        """What the ``up`` command was given, as it dumped it."""
        pairs = [p for p in self.dump.read_bytes().split(b"\0") if p]
        return dict(p.decode().split("=", 1) for p in pairs)

    def arguments(self) -> list[str]:
        """The arguments the ``up`` command was given, one a line as it wrote them."""
        return self.args.read_text().splitlines()

    def state(self) -> str | None:
        try:
            return str(self.client.containers.get(self.container).status)
        except NotFound:
            return None

    def remove(self) -> None:
        with contextlib.suppress(NotFound):
            self.client.containers.get(self.container).remove(force=True)


@pytest.fixture
def stack(docker_client: docker.DockerClient, test_image: str, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, test_image, docker_client)
    try:
        yield s
    finally:
        s.remove()


def base_env() -> dict[str, str]:
    return dict(os.environ, COLUMNS="200", NO_COLOR="1")


@pytest.mark.docker
def test_a_relative_up_executable_is_found_in_the_manifests_folder(stack: Stack) -> None:
    stack.write()
    assert stack.dir != ROOT  # vramctl runs elsewhere, as under systemd
    r = stack.apply(base_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not found" not in r.stdout + r.stderr
    assert stack.state() == "running"


#: What the controller's environment holds that no ``up`` command may see.
SECRETS = {
    "VRAMCTL_TOKEN": "api-token-s3cr3t",
    "VRAMCTL_ROUTER_TOKEN": "router-token-s3cr3t",
    "ANVIL_ROUTER_TOKEN": "anvil-token-s3cr3t",
    "OCR_TOKEN": "engine-token-s3cr3t",
    "SOME_UNRELATED": "x",
}


@pytest.mark.docker
def test_up_gets_a_clean_environment_and_the_serves_up_env(stack: Stack) -> None:
    stack.write(
        'up_env = { STACK_PROFILE = "gpu", COMPOSE_PROJECT_NAME = "anvil", '
        'MODEL_DIR = "/srv/models with space" }'
    )
    env = {
        **base_env(),
        **SECRETS,
        "LANG": "C.UTF-8",
        "LC_TIME": "C",
        "TZ": "UTC",
        "COMPOSE_FILE": "compose.yaml",
        "XDG_RUNTIME_DIR": "/run/user/0",
    }
    r = stack.apply(env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert stack.state() == "running"  # docker found and reached in the clean environment
    got = stack.environment()
    for name in SECRETS:
        assert name not in got, (name, got)
    assert not any("s3cr3t" in v for v in got.values())
    assert got["STACK_PROFILE"] == "gpu" and got["MODEL_DIR"] == "/srv/models with space"
    assert got["COMPOSE_PROJECT_NAME"] == "anvil"  # the manifest wins over the controller's
    assert got["PATH"] == env["PATH"]
    for name in ("LANG", "LC_TIME", "TZ", "COMPOSE_FILE", "XDG_RUNTIME_DIR"):
        assert got[name] == env[name], name
    if "HOME" in env:
        assert got["HOME"] == env["HOME"]
    if "DOCKER_HOST" in env:
        assert got["DOCKER_HOST"] == env["DOCKER_HOST"]
    # nothing else: the names passed on are the documented ones and up_env's
    from controller.adapters.docker.actions import UP_ENV_PASS, UP_ENV_PREFIXES

    assert got["VRAMCTL_GPU_ROLE"] == "a"  # the controller's own: where it put the serve
    # and what its engine will find free there (statemachine/ledger/gpu_vars.py)
    memory = {"VRAMCTL_FREE_MIB", "VRAMCTL_FRACTION_OF_FREE", "VRAMCTL_FIT_TARGET_MIB"}
    assert all(got[name].replace(".", "", 1).isdigit() for name in memory), got
    allowed = set(UP_ENV_PASS) | {"STACK_PROFILE", "MODEL_DIR", "PWD", "SHLVL", "_", "OLDPWD"}
    allowed |= {"VRAMCTL_GPU_ROLE", *memory}
    extra = {k for k in got if k not in allowed and not k.startswith(UP_ENV_PREFIXES)}
    assert not extra, extra


@pytest.mark.docker
def test_a_variable_named_in_vramctl_up_env_pass_reaches_up(stack: Stack) -> None:
    """The example's case: an image tag the compose file interpolates, set per run."""
    stack.write()
    env = {
        **base_env(),
        **SECRETS,
        "STANDIN_IMAGE": "standin:0123abcd",
        "VRAMCTL_UP_ENV_PASS": "STANDIN_IMAGE, NOT_SET_HERE",
    }
    env.pop("NOT_SET_HERE", None)
    r = stack.apply(env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert stack.state() == "running"
    got = stack.environment()
    assert got["STANDIN_IMAGE"] == "standin:0123abcd"
    for name in SECRETS:
        assert name not in got, (name, got)
    assert "NOT_SET_HERE" not in got
    said = " ".join((r.stdout + r.stderr).split())
    assert "VRAMCTL_UP_ENV_PASS names NOT_SET_HERE, which this environment does not have" in said


@pytest.mark.docker
@pytest.mark.parametrize(
    ("listed", "words"),
    [
        ("STANDIN_IMAGE VRAMCTL_TOKEN", "VRAMCTL_TOKEN is the controller's own secret"),
        ("ANVIL_ROUTER_TOKEN", "ANVIL_ROUTER_TOKEN is the controller's own secret"),
        ("IMAGE-TAG", "'IMAGE-TAG' is not an environment variable name"),
        ("VRAMCTL_GPU_ROLE", "VRAMCTL_GPU_ROLE is set by the controller for each start"),
    ],
)
def test_vramctl_up_env_pass_is_refused_before_anything_runs(
    stack: Stack, listed: str, words: str
) -> None:
    stack.write()
    r = stack.apply({**base_env(), **SECRETS, "VRAMCTL_UP_ENV_PASS": listed})
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 1, said
    assert f"VRAMCTL_UP_ENV_PASS: {words}" in said
    assert stack.state() is None  # nothing was started
    assert not stack.dump.exists()  # the up command never ran


@pytest.mark.docker
def test_up_is_told_its_gpu_role_in_its_environment_and_arguments(stack: Stack) -> None:
    """The role reserved for the start reaches ``up``: ``VRAMCTL_GPU_ROLE`` and
    ``{gpu_role}``; the declared uuid as ``VRAMCTL_GPU_UUID`` and ``{gpu_uuid}``. The
    controller's values win over the serve's ``up_env``; NVML absent here, the index is
    unknown and left out (never empty)."""
    stack.write(
        'up_env = { VRAMCTL_GPU_ROLE = "elsewhere", VRAMCTL_GPU_INDEX = "7", KEEP = "1" }',
        up="./bin/up.sh --role={gpu_role} {gpu_uuid} plain",
        uuid="GPU-vramctl-test-0",
    )
    r = stack.apply(base_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert stack.state() == "running"
    got = stack.environment()
    assert got["VRAMCTL_GPU_ROLE"] == "a"
    assert got["VRAMCTL_GPU_UUID"] == "GPU-vramctl-test-0"
    assert got["KEEP"] == "1"
    assert stack.arguments() == ["--role=a", "GPU-vramctl-test-0", "plain"]
    if "VRAMCTL_GPU_INDEX" in got:  # only where this host's NVML sees that device
        assert got["VRAMCTL_GPU_INDEX"] not in ("", "7")


@pytest.mark.docker
def test_an_unknown_placeholder_fails_the_start_without_running_up(stack: Stack) -> None:
    stack.write(up="./bin/up.sh --gpus=device={gpu_uuid}")  # role "a" declares no uuid
    r = stack.apply(base_env())
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0, said
    assert "`up` names {gpu_uuid}, which is unknown for this start" in said, said
    assert "gpu role a declares no uuid" in said, said
    assert stack.state() is None  # nothing was started
    assert not stack.dump.exists()  # the up command never ran


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('up_env = "A=1"', "must be a table"),
        ('up_env = { "1BAD" = "x" }', "not a valid environment variable name"),
        ('up_env = { "A-B" = "x" }', "not a valid environment variable name"),
        ("up_env = { A = 1 }", "must be a string"),
        ('up_env = { A = "nul\\u0000byte" }', "NUL"),
    ],
)
def test_up_env_is_validated(tmp_path: Path, value: str, words: str) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(f'[[serve]]\nname = "s"\ncontainer = "c-s"\nup = "true"\n{value}\n')
    with pytest.raises(ManifestError) as caught:
        load_manifest_set([path])
    assert 'serve "s" (#1): up_env' in str(caught.value) and words in str(caught.value)


def test_up_env_loads_as_a_table_of_strings(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text('[[serve]]\nname = "s"\ncontainer = "c-s"\nup_env = { A = "1", B_2 = "" }\n')
    assert load_manifest_set([path]).serves["s"].up_env == {"A": "1", "B_2": ""}
