"""Every example in manifests/examples/ validates, and plans from its saved observation.

The examples are what an operator tries first; each ``NAME.toml`` has a
``NAME.observed.json`` beside it so ``plan`` and ``fit`` work without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.manifest import load_manifest_set
from controller.snapshot import load_snapshot
from statemachine.answers.fit import fit_serve
from statemachine.domain.types import Residency
from statemachine.ledger.reservations import Refusal
from statemachine.planning.plan_types import (
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.planning.simulate import apply_plan, ledger_prefixes

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
MANIFESTS = sorted(EXAMPLES.glob("*.toml"))


def test_there_are_examples() -> None:
    assert {p.stem for p in MANIFESTS} >= {"single-card", "two-card"}


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_example_validates_and_plans(manifest: Path) -> None:
    mset = load_manifest_set([manifest])
    assert not mset.warnings, mset.warnings
    snapshot_path = manifest.with_suffix(".observed.json")
    assert snapshot_path.exists(), f"{manifest.name} needs {snapshot_path.name} beside it"
    snap = load_snapshot(snapshot_path)
    desired, observed = mset.desired(), snap.to_observed()
    now = snap.taken_at_epoch() or 0.0
    plan = plan_transitions(desired, observed, Policy(), now)
    assert plan.steps, "an example should show a change set"
    for step, ledger in ledger_prefixes(plan):
        assert not isinstance(ledger, Refusal), f"{step}: {ledger.message}"
        for role in ledger.roles:
            assert ledger.committed_mib(role) <= ledger.roles[role].budget_mib
    again = plan_transitions(desired, apply_plan(desired, observed, plan, now), Policy(), now)
    assert again.empty, [s.to_json() for s in again.steps]
    for serve in desired.serves.values():
        if serve.residency is Residency.ON_DEMAND:
            answer = fit_serve(desired, observed, serve.name, now=now)
            assert answer.fits, answer.reason
            assert answer.evict or answer.sleep, (
                f"{serve.name}: the example should show an eviction (a stop or a sleep)"
            )


@pytest.mark.docker
@pytest.mark.slow
def test_the_single_card_example_runs_for_real_and_evicts(docker_client: object) -> None:
    """``manifests/examples/run single-card``, the documented one command, end to end.

    Stand-in serves created by their Compose ``up`` commands, the on-demand ``fast`` tier
    asked for (refused while ``ocr`` is inside its 120 s ``min_runtime_s``, then
    admitted by draining and stopping ``ocr``), the request ended and ``ocr`` back. Run
    as a new user runs it: on a daemon without an old ``vramctl-example-standin:latest``
    (the compose file's fallback once), so the tag the script builds must reach the
    ``up`` commands through the controller's clean environment.
    """
    import subprocess

    # what a new user has: no `:latest` stand-in left over from an older version (the
    # compose file's old fallback), no stand-in image named by the caller
    subprocess.run(
        ["docker", "image", "rm", "--no-prune", "vramctl-example-standin:latest"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = _run_example("single-card")
    # the controller's log is shown as it goes, from its first line
    assert "tail: cannot open" not in out and "  | INFO    vramctl run: " in out, out[:3000]
    assert "ocr drain: ok" in out and "ocr stop: ok" in out, out[-6000:]
    assert "inside its min_runtime_s 120" in out, out[-6000:]  # the refusal came first
    assert "done: fast was admitted by evicting ocr, which came back" in out, out[-3000:]
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project=vramctl-examples"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert left.stdout.strip() == "", "the example's stack was not removed"


def _run_example(name: str, **extra_env: str) -> str:
    """What ``manifests/examples/run NAME`` printed, stdout and stderr (exit 0 asserted):
    on an API port of its own, with the stand-in image it builds (none named)."""
    import os
    import subprocess

    from compose_stack import compose_available
    from support.serving import free_port

    compose_available()
    env = dict(os.environ, VRAMCTL_EXAMPLE_API=f"127.0.0.1:{free_port()}", COLUMNS="200")
    env.pop("VRAMCTL_STANDIN_IMAGE", None)
    env["VRAMCTL_EXAMPLE_WAIT_S"] = "240"  # a stuck stage fails here, not at the 600 s timeout
    env.update(extra_env)
    r = subprocess.run(
        [str(EXAMPLES / "run"), name],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    # every example runs the router stand-in: nothing may say there is no router
    assert "no router is configured" not in out and "without a router" not in out, out[:6000]
    return out


def _docker(*args: str) -> int:
    import subprocess

    return subprocess.run(
        ["docker", *args], capture_output=True, timeout=120, check=False
    ).returncode


@pytest.mark.docker
@pytest.mark.slow
def test_the_example_makes_its_base_where_docker_hub_cannot_be_reached(
    docker_client: object,
) -> None:
    """``manifests/examples/run single-card`` on a daemon without the stand-in's Debian
    base (a tag of this test's own, so the tests' base is left alone) and without
    ``python:3.11-slim``: where Docker Hub cannot be reached, the script makes the base
    with the tests' own script (tests/docker/ensure-debian-base.sh) and runs to the end;
    where it can, it builds on the image pulled. Its stand-in image is tagged by its
    base too, so it is built afresh here."""
    import re
    import uuid

    base = f"vramctl-debian-python:example-{uuid.uuid4().hex[:8]}"
    assert _docker("image", "inspect", base) != 0
    standin = None
    try:
        out = _run_example("single-card", VRAMCTL_PYTHON_IMAGE=base, VRAMCTL_STANDIN_BASE="")
        built = re.search(r"building the stand-in image (\S+) on (\S+)", out)
        assert built is not None, out[:3000]
        standin, on = built.groups()
        if "python:3.11-slim cannot be pulled" in out:
            assert on == base and "ensure-debian-base: " in out, out[:3000]
            assert _docker("image", "inspect", base) == 0
        else:  # Docker Hub answered here
            assert on == "python:3.11-slim", out[:3000]
        assert "done: fast was admitted by evicting ocr, which came back" in out, out[-3000:]
    finally:
        _docker("image", "rm", "--no-prune", *([standin] if standin else []), base)


@pytest.mark.docker
@pytest.mark.slow
def test_the_placement_example_tells_each_container_its_card(docker_client: object) -> None:
    """``manifests/examples/run placement``: two stand-in cards; each serve's ``up`` is
    given ``VRAMCTL_GPU_ROLE``, which the compose file passes into the container, and the
    on-demand ``big`` evicts ``chat-b`` on card-b and is told card-b."""
    out = _run_example("placement")
    assert "placement-chat-a: VRAMCTL_GPU_ROLE=card-a" in out, out[-6000:]
    assert "placement-chat-b: VRAMCTL_GPU_ROLE=card-b" in out, out[-6000:]
    assert "placement-big: VRAMCTL_GPU_ROLE=card-b" in out, out[-6000:]
    assert "done: big was admitted by evicting chat-b, which came back" in out, out[-3000:]
