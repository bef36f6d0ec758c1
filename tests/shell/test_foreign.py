"""A container of another Compose project that bears a serve's container name is foreign.

A second copy of a stack on the same daemon (another Compose project, the same
``container_name``) must never be started, stopped or removed by the controller; while
it runs it holds memory, so the ledger counts it, and ``status``, ``/v1/serves`` and
``/metrics`` say it is foreign, with its project (docs/design.md §3, foreign containers).
A serve's project is its ``compose_project``, else the ``-p`` / ``--project-name`` of its
``up`` (docs/manifest.md).

The Docker tests run the real planner and executor against real containers on the real
daemon that carry another project's ``com.docker.compose.project`` label.
"""

# ruff: noqa: F811  (``host`` and ``client``: the fixtures of test_executor_e2e and test_api)
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from support.service import controller_on
from support.serving import free_port, httpd
from support.strategies import Scenario, scenarios
from test_api import Asgi, client, observe  # noqa: F401
from test_executor_e2e import ROLE, Host, actions, host, serve_toml  # noqa: F401
from test_planner_foreign import _host, _spec

from controller.adapters.docker.read import COMPOSE_PROJECT_LABEL
from controller.interfaces.metrics import Metrics
from controller.manifest import ManifestError, load_manifest_set
from controller.manifest.models import compose_project_of
from controller.service.executor import ExecutorConfig
from controller.service.loop import Controller
from controller.service.wiring import make_executor
from statemachine.answers.fit import fit_serve, fit_serve_by_planner, request_plan
from statemachine.answers.status_report import host_status
from statemachine.domain import types as sm
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import Action, Policy
from statemachine.planning.planner import plan_transitions

PROJECT = COMPOSE_PROJECT_LABEL  # com.docker.compose.project, as Compose sets it
OURS, THEIRS = "ours", "theirs"
NOW = 1_000_000.0


# ── the manifest: compose_project, or the project `up` names ─────────────────


@pytest.mark.parametrize(
    ("up", "project"),
    [
        ("docker compose -p ours up -d svc", "ours"),
        ("docker compose --project-name ours up -d svc", "ours"),
        ("docker compose --project-name=ours up -d svc", "ours"),
        ("docker compose -pours up", "ours"),
        ("docker compose -p=ours up", "ours"),
        ("docker --context lab compose -f {dir}/c.yml -p ours up -d", "ours"),
        ("/usr/bin/docker-compose -p ours up -d", "ours"),
        ("docker compose -p first -p ours up", "ours"),  # Compose takes the last
        ("docker compose -f c.yml up -d svc", None),
        ("docker compose run -p 8080:80 svc", None),  # run's -p publishes a port
        ("docker run -p 8080:80 --name compose img", None),
        ("sh -c 'docker compose -p ours up'", None),  # a shell is not looked into
    ],
)
def test_the_project_is_read_from_ups_project_name_flag(up: str, project: str | None) -> None:
    assert compose_project_of(shlex.split(up)) == project


def _load(tmp_path: Path, serve: str) -> sm.DesiredState:
    path = tmp_path / "m.toml"
    path.write_text('[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n' + serve)
    return load_manifest_set([path]).desired()


def test_a_serve_owns_the_project_it_declares_or_its_up_names(tmp_path: Path) -> None:
    base = '[[serve]]\nname = "s"\ncontainer = "s-c"\n'
    declared = _load(tmp_path, base + 'compose_project = "ours"\n')
    assert declared.serves["s"].compose_project == "ours"
    from_up = _load(tmp_path, base + 'up = "docker compose -p ours up -d s"\n')
    assert from_up.serves["s"].compose_project == "ours"
    from_env = _load(
        tmp_path,
        base + 'up = "docker compose up -d s"\n[serve.up_env]\nCOMPOSE_PROJECT_NAME = "ours"\n',
    )
    assert from_env.serves["s"].compose_project == "ours"
    assert _load(tmp_path, base).serves["s"].compose_project is None


@pytest.mark.parametrize(
    ("fields", "where", "says"),
    [
        (
            'compose_project = "ours"\nup = "docker compose -p theirs up -d s"\n',
            "compose_project",
            'is "ours" but up runs the stack as Compose project "theirs"',
        ),
        ('compose_project = "Ours"\n', "compose_project", "must be a Docker Compose project"),
        ('up = "docker compose -p Ours up"\n', "up", 'names the Compose project "Ours"'),
    ],
)
def test_a_project_that_cannot_be_owned_is_a_manifest_error(
    tmp_path: Path, fields: str, where: str, says: str
) -> None:
    with pytest.raises(ManifestError) as err:
        _load(tmp_path, '[[serve]]\nname = "s"\ncontainer = "s-c"\n' + fields)
    text = str(err.value)
    assert f'serve "s" (#1): {where}: ' in text and says in text, text


# ── the planner: nothing of another project is acted on ──────────────────────


def _theirs(state: sm.ContainerState = sm.ContainerState.RUNNING) -> sm.ContainerObs:
    return sm.ContainerObs(state, started_at=NOW - 3600, compose_project=THEIRS, exit_code=0)


def test_a_foreign_container_is_neither_stopped_nor_started_and_counts_while_it_runs() -> None:
    old = _spec("old", sm.Residency.EVICTABLE, 2000, desired=sm.DesiredRun.STOPPED)
    emb = _spec("emb", sm.Residency.RESIDENT, 3000, desired=sm.DesiredRun.RUNNING)
    desired = _host(old, emb)
    observed = sm.Observed(
        docker_ok=True,
        containers={"c-old": _theirs(), "c-emb": _theirs(sm.ContainerState.EXITED)},
    )
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert plan.steps == ()
    blocked = {b.serve: b.reason for b in plan.blocked}
    assert set(blocked) == {"emb"}
    assert "container c-emb belongs to compose project theirs, not ours" in blocked["emb"]
    # it holds memory while it runs: counted at the serve's reservation
    assert ledger_from_observed(desired, observed).committed_mib("a") == 2000
    rows = {s.serve: s for s in host_status(desired, observed).serves}
    assert rows["old"].foreign_project == THEIRS and rows["old"].committed
    assert rows["emb"].foreign_project == THEIRS and not rows["emb"].committed


def test_a_foreign_container_is_never_a_victim_nor_shrunk() -> None:
    ocr = _spec("ocr", sm.Residency.EVICTABLE, 6000, desired=sm.DesiredRun.RUNNING)
    fast = _spec("fast", sm.Residency.ON_DEMAND, 6000)
    desired = _host(ocr, fast, requests=(sm.OnDemandRequest("fast", NOW - 1),))
    observed = sm.Observed(docker_ok=True, containers={"c-ocr": _theirs()})
    plan = plan_transitions(desired, observed, Policy(), NOW)
    assert plan.steps == ()
    (b,) = plan.blocked
    assert b.serve == "fast"
    (guard,) = b.protected
    assert guard.serve == "ocr" and "compose project theirs" in guard.why
    # the same serve, its own project's container: evicted as before
    ours = sm.Observed(
        docker_ok=True, containers={"c-ocr": replace(_theirs(), compose_project=OURS)}
    )
    steps = [(s.action, s.serve) for s in plan_transitions(desired, ours, Policy(), NOW).steps]
    assert (Action.STOP, "ocr") in steps and (Action.START, "fast") in steps


def test_an_unlabelled_container_or_an_undeclared_project_is_the_serves_own() -> None:
    old = _spec("old", sm.Residency.EVICTABLE, 2000, desired=sm.DesiredRun.STOPPED)
    by_hand = sm.Observed(
        docker_ok=True, containers={"c-old": replace(_theirs(), compose_project=None)}
    )
    assert [s.action for s in plan_transitions(_host(old), by_hand, Policy(), NOW).steps][:1] == [
        Action.STOP
    ]
    anyone = _host(replace(old, compose_project=None))
    mine = sm.Observed(docker_ok=True, containers={"c-old": _theirs()})
    assert [s.action for s in plan_transitions(anyone, mine, Policy(), NOW).steps][:1] == [
        Action.STOP
    ]


@st.composite
def _hosts_with_foreign(draw: st.DrawFn) -> Scenario:
    """A random scenario in which some serves own a project and some of their
    containers bear another's label."""
    sc = draw(scenarios(docker_ok=True))
    serves = dict(sc.desired.serves)
    containers = dict(sc.observed.containers)
    for name, s in sc.desired.serves.items():
        if not draw(st.booleans()):
            continue
        serves[name] = replace(s, compose_project=OURS)
        obs = containers.get(s.container)
        if obs is not None:
            label = draw(st.sampled_from([THEIRS, THEIRS, OURS, None]))  # foreign: half
            containers[s.container] = replace(obs, compose_project=label)
    return replace(
        sc,
        desired=replace(sc.desired, serves=serves),
        observed=replace(sc.observed, containers=containers),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_hosts_with_foreign())
def test_no_plan_touches_a_foreign_container_and_fit_answers_as_the_planner(
    sc: Scenario,
) -> None:
    note(repr(sc))
    foreign = {n for n, s in sc.desired.serves.items() if sc.observed.foreign(s) is not None}
    plan = plan_transitions(sc.desired, sc.observed, sc.policy, sc.now)
    event(f"foreign containers: {min(len(foreign), 2)}{'+' if len(foreign) > 2 else ''}")
    event("the plan does something" if plan.steps else "the plan is empty")
    assert not [s for s in plan.steps if s.serve in foreign]
    for name in sc.desired.serves:
        got = fit_serve(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        ref = fit_serve_by_planner(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        assert got == ref, name
        alone = request_plan(sc.desired, sc.observed, name, policy=sc.policy, now=sc.now)
        assert not [s for s in alone.steps if s.serve in foreign], name


# ── status, /v1/serves and /metrics say so ───────────────────────────────────


MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000

[[serve]]
name = "ocr"
container = "c-ocr"
gpu_role = "a"
vram_mib = 6000
residency = "evictable"
desired = "stopped"
compose_project = "ours"
"""


@pytest.fixture
def foreign_controller(tmp_path: Path) -> Controller:
    c = controller_on(tmp_path, MANIFEST)
    observe(c, {"ocr": {"state": "running", "compose_project": THEIRS}})
    return c


def test_the_api_and_the_metrics_report_the_foreign_container(
    foreign_controller: Controller, client: Callable[..., Asgi]
) -> None:
    try:
        rows = client(foreign_controller).get("/v1/serves").json()["serves"]
        (row,) = rows
        assert row["foreign_project"] == THEIRS and row["committed"] is True
        metrics = Metrics()
        metrics.update_ledger(foreign_controller)
        families = text_string_to_metric_families(metrics.render().decode())
        series = [
            (s.labels, s.value)
            for f in families
            if f.name == "vramctl_serve_foreign"
            for s in f.samples
        ]
        assert series == [({"serve": "ocr", "compose_project": THEIRS}, 1.0)]
        # once the container is the serve's own again, the series is gone
        observe(foreign_controller, {"ocr": {"state": "running", "compose_project": OURS}})
        metrics.update_ledger(foreign_controller)
        assert "vramctl_serve_foreign{" not in metrics.render().decode()
    finally:
        foreign_controller.journal.close()


def test_status_prints_the_foreign_container_with_its_project(tmp_path: Path) -> None:
    manifest = tmp_path / "serves.toml"
    manifest.write_text(MANIFEST)
    snap = tmp_path / "observed.json"
    snap.write_text(
        json.dumps(
            {
                "docker": "ok",
                "containers": {"c-ocr": {"state": "running", "compose_project": THEIRS}},
            }
        )
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller.interfaces.cli",
            "status",
            "-m",
            str(manifest),
            "--observed",
            str(snap),
        ],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "foreign: ocr: container c-ocr (running) belongs to compose project theirs: never "
        "started, stopped or removed; its 6000 MiB counted while it runs"
    ) in " ".join(r.stdout.split()), r.stdout


# ── the real daemon ──────────────────────────────────────────────────────────


def _container(host: Host, serve: str, *, port: int, running: bool, project: str) -> None:
    """A container of Compose project ``project`` (its label, as Compose sets it)."""
    c = host.client.containers.create(
        host.image,
        httpd(port),
        name=host.name(serve),
        init=True,
        network_mode="host",
        labels={"vramctl.test": "1", PROJECT: project, "com.docker.compose.service": serve},
    )
    host.created.append(c.name)
    if running:
        c.start()


@pytest.mark.docker
def test_another_projects_container_on_the_daemon_is_never_stopped_or_started(
    host: Host,
) -> None:
    p_old, p_emb = free_port(), free_port()
    mset = host.manifest(
        ROLE
        + serve_toml(
            "old",
            mib=2000,
            residency="evictable",
            port=p_old,
            extra='desired = "stopped"\ncompose_project = "ours"',
        )
        + serve_toml(
            "emb",
            mib=3000,
            residency="resident",
            port=p_emb,
            extra='desired = "running"\nup = "docker compose -p ours up -d emb"',
        )
    )
    # a second copy of the stack: another project made both containers
    _container(host, "old", port=p_old, running=True, project=THEIRS)
    _container(host, "emb", port=p_emb, running=False, project=THEIRS)
    plan, report, after = host.execute(mset)
    assert actions(report) == []
    assert {b.serve for b in plan.blocked} == {"emb"}
    # nothing acts later either: the next cycle, observing the daemon afresh, plans
    # nothing (the first started nothing that could still be under way)
    plan, report, after = host.execute(mset)
    assert actions(report) == [] and {b.serve for b in plan.blocked} == {"emb"}
    assert host.state("old") == "running" and host.state("emb") == "created"
    # the running one holds memory: counted in the ledger at the serve's reservation
    assert report.ledger.committed_mib("a") == 2000
    assert after.foreign(mset.desired().serves["old"]) == THEIRS


@pytest.mark.docker
def test_a_foreign_container_that_appears_after_the_observation_is_left_alone(
    host: Host,
) -> None:
    p_old = free_port()
    mset = host.manifest(
        ROLE
        + serve_toml(
            "old",
            mib=2000,
            residency="evictable",
            port=p_old,
            extra='desired = "stopped"\ncompose_project = "ours"',
        )
    )
    _container(host, "old", port=p_old, running=True, project=OURS)
    desired = mset.desired()
    observed = host.observe(mset)
    plan = plan_transitions(desired, observed, Policy(), time.time())
    assert [s.action for s in plan.steps] == [Action.STOP, Action.RELEASE]
    # between the observation and the execution, the name passes to another project
    host.client.containers.get(host.name("old")).remove(force=True)
    _container(host, "old", port=p_old, running=True, project=THEIRS)
    executor = make_executor(
        mset,
        router_url=None,
        router_token_file=None,
        gpus=host.gpus_for(mset),
        config=ExecutorConfig(poll_s=0.1, memory_wait_s=5.0),
    )
    report = executor.execute(plan, observed)
    assert not report.ok
    assert any("belongs to compose project theirs, not ours" in p for p in report.preflight), (
        report.to_json()
    )
    assert host.state("old") == "running"
