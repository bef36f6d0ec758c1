"""End to end with Docker Compose v2: serves are Compose services, created by their ``up``.

Each serve's manifest ``up`` is the command people write,
``docker compose -f {dir}/docker-compose.yml [--profile P] up -d SERVICE``, run by the
controller in its clean environment (no HOME needed: the plugin lives in a system
folder). The stack is a real Compose project of busybox test containers
(tests/compose_stack.py); the controller is ``vramctl run`` as a subprocess with its
HTTP API, and the on-demand request comes through that API (``vramctl up``).

* the loop creates the serves with Compose (one behind ``--profile``), the snapshot
  shows their Compose labels, an edit stops one and starts it again (the container
  Compose made, kept and restarted), an on-demand request evicts it through the loop
  and the end of the request brings it back: never over budget, nothing started twice;
* an ``up`` naming a service the file lacks, and an ``up`` whose Compose run fails,
  end in a failed start that quotes Compose's own error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import docker
import pytest
from compose_stack import ComposeStack, stack_beside
from support.manifests import serve_toml
from support.serving import free_port
from support.waiting import wait_for
from test_run_e2e import REPO, Fleet, Run, _env, fleet, healthy, vramctl

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["fleet"]  # the fixture, used by name

BUDGET = 10_000
TOKEN = "compose-test-token-0123456789"


@pytest.fixture
def stack(fleet: Fleet, test_image: str) -> Iterator[ComposeStack]:
    with stack_beside(fleet, test_image) as s:
        yield s


def serve(
    stack: ComposeStack,
    name: str,
    mib: int,
    residency: str,
    *,
    desired: str = "",
    profile: str | None = None,
    service: str | None = None,
) -> str:
    want = f'desired = "{desired}"' if desired else ""
    up = stack.up_command(service or name, profile=profile)
    container, port = stack.container(name), stack.services[name].port
    extra = f'up = "{up}"\n{want}'
    return serve_toml(name, container, mib, residency, port, start_timeout_s=60, extra=extra)


ROLE = f"""
[[gpu_roles]]
id = "a"
vram_mib = {BUDGET}
reserve_mib = 0
"""


def start_with_api(fleet: Fleet, port: int) -> Run:
    token = fleet.tmp / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    log = fleet.tmp / f"run{len(fleet.runs) + 1}.log"
    argv = [
        sys.executable,
        "-m",
        "controller.cli",
        "run",
        "-m",
        str(fleet.manifest),
        "--state-dir",
        str(fleet.state_dir),
        "--resync",
        "1",
        "--log-json",
        "--api",
        f"127.0.0.1:{port}",
        "--token-file",
        str(token),
    ]
    env = _env()
    env.pop("HOME", None)  # `up` commands find the Compose plugin without it
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    run = Run(proc, log)
    fleet.runs.append(run)
    return run


def test_compose_serves_are_created_stopped_started_and_evicted_by_the_loop(
    fleet: Fleet, stack: ComposeStack, docker_client: docker.DockerClient
) -> None:
    stack.add("res")
    stack.add("evi", profiles=("extra",))  # only `--profile extra` brings it up
    stack.add("ond")
    stack.write()
    fleet.mib.update(res=3000, evi=4000, ond=5000)  # res + evi + ond > 10000: evi must go
    res = serve(stack, "res", 3000, "resident", desired="running")
    evi_on = serve(stack, "evi", 4000, "evictable", desired="running", profile="extra")
    evi_off = serve(stack, "evi", 4000, "evictable", desired="stopped", profile="extra")
    ond = serve(stack, "ond", 5000, "on-demand")
    fleet.manifest.write_text(ROLE + res + evi_on + ond)

    api = free_port()
    run = start_with_api(fleet, api).started()
    run.wait_step("res await_ready ok")
    run.wait_step("evi await_ready ok")
    assert healthy(stack.services["res"].port) and healthy(stack.services["evi"].port)
    assert "ond" not in fleet.states()

    # Compose made them: its labels are on the containers, and the snapshot reads them
    for name in ("res", "evi"):
        labels = docker_client.containers.get(stack.container(name)).labels
        assert labels["com.docker.compose.project"] == stack.project
        assert labels["com.docker.compose.service"] == name
    seen = vramctl("observe", "-m", str(fleet.manifest))
    assert seen.returncode == 0, seen.stdout + seen.stderr
    containers = json.loads(seen.stdout)["containers"]
    evi = containers[stack.container("evi")]  # keyed by container name
    assert (evi["compose_project"], evi["compose_service"]) == (stack.project, "evi"), evi

    # an edit stops evi (the container is kept) and another starts that container again
    evi_id = docker_client.containers.get(stack.container("evi")).id
    fleet.manifest.write_text(ROLE + res + evi_off + ond)
    fleet.wait_state("evi", "exited")
    fleet.manifest.write_text(ROLE + res + evi_on + ond)
    fleet.wait_state("evi", "running")
    wait_for("evi healthy again", lambda: healthy(stack.services["evi"].port))
    assert docker_client.containers.get(stack.container("evi")).id == evi_id

    # the on-demand request through the API: evi is evicted, ond created by its `up`
    asked = vramctl(
        "up",
        "ond",
        "--ttl",
        "600",
        "--api",
        f"127.0.0.1:{api}",
        "--token-file",
        str(fleet.tmp / "token"),
    )
    assert asked.returncode == 0, asked.stdout + asked.stderr
    run.wait_step("ond await_ready ok")
    assert fleet.state("evi") == "exited"
    assert healthy(stack.services["ond"].port)
    labels = docker_client.containers.get(stack.container("ond")).labels
    assert labels["com.docker.compose.service"] == "ond"

    # the request ends: ond stops, evi (desired running) comes back
    done = vramctl(
        "down", "ond", "--api", f"127.0.0.1:{api}", "--token-file", str(fleet.tmp / "token")
    )
    assert done.returncode == 0, done.stdout + done.stderr
    fleet.wait_state("ond", "exited")
    fleet.wait_state("evi", "running")
    wait_for("evi healthy after the request", lambda: healthy(stack.services["evi"].port))

    assert run.stop() == 0
    fleet.assert_never_overcommitted()
    # each start came from one decision: res once, evi three times (up, edit, after ond)
    assert fleet.starts("res") == 1
    assert fleet.starts("evi") == 3
    assert fleet.starts("ond") == 1


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("wrong-service", "no such service: nosuch"),
        ("failing-up", "vramctl-test-no-such-image"),
    ],
)
def test_a_failing_compose_up_is_a_failed_start_that_quotes_compose(
    fleet: Fleet, stack: ComposeStack, case: str, needle: str
) -> None:
    if case == "wrong-service":
        stack.add("job")
        body = serve(stack, "job", 1000, "resident", desired="running", service="nosuch")
    else:
        stack.add("job", image="vramctl-test-no-such-image:absent")  # pull_policy: never
        body = serve(stack, "job", 1000, "resident", desired="running")
    stack.write()
    fleet.manifest.write_text(ROLE + body)
    plan = fleet.tmp / "plan.json"
    made = vramctl("plan", "-m", str(fleet.manifest), "--out", str(plan))
    assert made.returncode == 0, made.stdout + made.stderr
    r = vramctl(
        "apply", "-m", str(fleet.manifest), str(plan), "--json", "--state-dir", str(fleet.state_dir)
    )
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    failed = [x for x in report["steps"] if x["outcome"] == "failed"]
    assert [x["action"] for x in failed] == ["start"], report["steps"]
    detail = failed[0]["detail"]
    assert detail.startswith("`up` exited 1: "), detail  # says what failed, then Compose's words
    assert needle in detail and "docker compose -f" in detail, detail
    assert report["ledger"] is not None and not report["ok"]
    # sparse: the names as listed, no inspect of each (a container another test removes
    # between the list and its inspect would fail the list)
    listed = fleet.client.containers.list(all=True, sparse=True)
    assert f"/{stack.container('job')}" not in {n for c in listed for n in c.attrs["Names"]}
