"""End to end: ``vramctl run`` puts an evictable serve to sleep instead of stopping it.

On the real Docker daemon, as in tests/e2e/test_run_e2e.py (the controller a subprocess;
the tests look only at Docker, the test engine and the journal). The sleeper ``big``
is a busybox container (httpd answering its health path) whose engine is the test
engine (tests/fake_engine.py, vLLM's protocol unless a test asks for SGLang's) in this
process on a port of its own, declared as the serve's ``[serve.sleep] url``; ``small``
is an on-demand serve that does not fit beside ``big`` awake (8000 + 5000 > 10000 MiB)
but fits beside its residual (1000 + 5000). The controller has no NVML here: a vLLM
sleep is confirmed by the engine's own ``GET /is_sleeping``, an SGLang one by its
answer alone (SGLang cannot say; its record keeps it counted asleep).

Every poll of the containers checks the budget with ``big`` counted at its residual
while its engine sleeps, at its full reservation otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import NotFound
from fake_engine import FakeEngine
from support.serving import free_port
from support.waiting import WAIT_S, wait_for
from test_run_e2e import (
    BUDGET_MIB,
    HOLDS,
    REPO,
    ROLE,
    Fleet,
    Run,
    _follow_events,
    healthy,
    serve_toml,
)

from controller.store.journal import Journal

pytestmark = pytest.mark.docker

BIG_MIB, SMALL_MIB, RESIDUAL_MIB, HOST_RAM_MIB = 8000, 5000, 1000, 6000
#: a test run with each engine's protocol (``big``'s engine; SGLang cannot say it sleeps)
BOTH = pytest.mark.parametrize("sfleet", ["vllm", "sglang"], indirect=True)
HOST = "[host]\nram_mib = 65536\nreserve_mib = 8192\n"


@dataclass
class SleepFleet(Fleet):
    """A fleet whose ``big`` has the test engine; polls count a sleeper at its residual."""

    engine: FakeEngine = field(default_factory=FakeEngine)

    def states(self) -> dict[str, str]:
        cs = self.client.containers.list(
            all=True, filters={"name": self.prefix, "label": "vramctl.test=1"}
        )
        out = {str(c.name).removeprefix(self.prefix): str(c.status) for c in cs}
        held = 0
        for serve, st in out.items():
            if st not in HOLDS:
                continue
            asleep = serve == "big" and self.engine.is_sleeping
            held += RESIDUAL_MIB if asleep else self.mib.get(serve, 0)
        assert held <= BUDGET_MIB, f"overcommit seen by a poll: {out} holds {held} MiB"
        return out

    def start_api(self, port: int) -> Run:
        """``vramctl run`` with its HTTP API on ``port`` (to read its ledger)."""
        log_path = self.tmp / f"run{len(self.runs) + 1}.log"
        argv = [sys.executable, "-m", "controller.interfaces.cli", "run", "-m"]
        argv += [str(self.manifest), "--state-dir", str(self.state_dir), "--resync", "1"]
        argv += ["--log-json", "--api", f"127.0.0.1:{port}"]
        env = dict(os.environ, COLUMNS="200", NO_COLOR="1", VRAMCTL_TOKEN="e2e-token")
        with log_path.open("wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        run = Run(proc, log_path, f"127.0.0.1:{port}")
        self.runs.append(run)
        return run

    def sleeping(self) -> dict[str, Any]:
        with Journal.open(self.journal, readonly=True) as j:
            return dict(j.sleeping())

    def steps_of(self, action: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(the plan, its outcome) of every journalled cycle with a step ``action``."""
        out = []
        for c in self.cycles():
            plan = c.plan
            if any(s.get("action") == action for s in plan.get("steps", [])):
                out.append((plan, c.outcome or {}))
        return out


@pytest.fixture
def sfleet(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    test_image: str,
    tmp_path: Path,
) -> Iterator[SleepFleet]:
    """The fleet with a vLLM engine, or the protocol passed (``indirect=True``)."""
    protocol = getattr(request, "param", "vllm")
    prefix = f"vramctl-test-sleep-{uuid.uuid4().hex[:8]}-"
    engine = FakeEngine(protocol, weights_mib=5000, kv_mib=1500, residual_mib=900, wake_s=0.2)
    f = SleepFleet(docker_client, test_image, tmp_path, prefix, engine=engine)
    # a stream quiet for longer than the client's read timeout would end silently and
    # miss the events after it: an hour, and the stream is closed at teardown
    events_client = docker.from_env(timeout=3600)
    stream, thread = _follow_events(events_client, prefix, f.events)
    engine.start()
    try:
        yield f
    finally:
        for run in f.runs:
            if run.proc.poll() is None:
                run.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(10)
        for name in f.created:
            with contextlib.suppress(NotFound):
                docker_client.containers.get(name).remove(force=True)
        engine.stop()
        with contextlib.suppress(Exception):
            stream.close()
        thread.join(5)
        events_client.close()


def manifest(f: SleepFleet, pb: int, ps: int, *, level: int = 1) -> str:
    host_ram = f"host_ram_mib = {HOST_RAM_MIB}\n" if level == 1 else ""
    big = serve_toml(
        "big",
        mib=BIG_MIB,
        residency="evictable",
        port=pb,
        desired="running",
        extra=(
            f'engine = "{f.engine.protocol}"\n'
            f"[serve.sleep]\nlevel = {level}\nresidual_mib = {RESIDUAL_MIB}\n{host_ram}"
            f'url = "{f.engine.url}"\nprotocol = "{f.engine.protocol}"\n'
        ),
    )
    small = serve_toml("small", mib=SMALL_MIB, residency="on-demand", port=ps)
    return HOST + ROLE + small + big


def setup(f: SleepFleet, *, level: int = 1) -> tuple[int, int]:
    """big running, small requested without a TTL: the request ends when the test ends
    it (:meth:`Fleet.end_request`), never while the test still looks at it."""
    pb, ps = free_port(), free_port()
    f.container("big", port=pb, mib=BIG_MIB, running=True)
    f.container("small", port=ps, mib=SMALL_MIB, running=False)
    f.write(manifest(f, pb, ps, level=level))
    wait_for("big healthy", lambda: healthy(pb))
    f.request("small")
    return pb, ps


def reservations(outcome: dict[str, Any], role: str = "a") -> dict[str, int]:
    line = (outcome.get("ledger") or {}).get(role) or {}
    return {r["serve"]: r["mib"] for r in line.get("reservations", [])}


def test_a_request_puts_the_evictable_serve_to_sleep_and_its_end_wakes_it(
    sfleet: SleepFleet,
) -> None:
    f = sfleet
    _, ps = setup(f)
    since = time.time_ns()
    run = f.start().started()
    run.wait_step("big release_to_residual ok")
    run.wait_step("small await_ready ok")
    assert healthy(ps)
    assert f.state("big") == "running"  # the container keeps running
    assert f.engine.is_sleeping and f.engine.level == 1
    assert f.starts("big", since) == 0  # never stopped, never started
    # the ledger holds its residual, the host ledger its RAM, the journal the sleeper
    plan, outcome = f.steps_of("sleep")[-1]
    assert reservations(outcome).get("big") == RESIDUAL_MIB, json.dumps(outcome)
    host_after = plan.get("host_ledger_after") or {}
    assert {"serve": "big", "mib": HOST_RAM_MIB} in host_after.get("reservations", []), plan
    rec = f.sleeping()[f.name("big")]
    assert rec.level == 1 and rec.residual_mib == RESIDUAL_MIB

    # the request ends: small stops, big is woken (not cold-started)
    f.end_request("small")
    f.wait_state("small", "exited")
    run.wait_step("big wake ok")
    run.wait_step("big await_ready ok")
    assert not f.engine.is_sleeping and f.engine.used_mib == f.engine.full_mib
    assert f.starts("big", since) == 0 and f.state("big") == "running"
    wait_for("the sleep record forgotten", lambda: f.sleeping() == {})
    assert run.stop() == 0


@pytest.mark.parametrize("sfleet", ["sglang"], indirect=True)
def test_an_sglang_sleeper_is_released_on_a_request_and_resumed_at_its_end(
    sfleet: SleepFleet,
) -> None:
    # SGLang cannot say whether it sleeps and NVML is not seen here: the release's
    # answer confirms the sleep, the record keeps it counted at its residual, and the
    # engine is never asked anything but to release and resume (docs/protocols.md)
    f = sfleet
    _, ps = setup(f)
    since = time.time_ns()
    run = f.start().started()
    run.wait_step("big release_to_residual ok")
    run.wait_step("small await_ready ok")
    assert healthy(ps)
    assert f.state("big") == "running" and f.starts("big", since) == 0
    assert f.engine.is_sleeping and f.engine.sleeping_tags == {"weights", "kv_cache"}
    assert "SGLang cannot say whether it sleeps" in run.text()
    _, outcome = f.steps_of("sleep")[-1]
    assert reservations(outcome).get("big") == RESIDUAL_MIB, json.dumps(outcome)
    rec = f.sleeping()[f.name("big")]
    assert rec.level == 1 and rec.residual_mib == RESIDUAL_MIB and rec.started_at

    f.end_request("small")
    f.wait_state("small", "exited")
    run.wait_step("big wake ok")
    run.wait_step("big await_ready ok")
    assert not f.engine.is_sleeping and f.engine.used_mib == f.engine.full_mib
    assert f.starts("big", since) == 0 and f.state("big") == "running"
    wait_for("the sleep record forgotten", lambda: f.sleeping() == {})
    asked = [(r.path, r.json) for r in f.engine.calls]
    tags = {"tags": ["kv_cache", "weights"]}
    assert asked == [("/release_memory_occupation", tags), ("/resume_memory_occupation", tags)]
    assert run.stop() == 0


def test_a_level2_wake_reloads_the_weights(sfleet: SleepFleet) -> None:
    f = sfleet
    setup(f, level=2)
    since = time.time_ns()
    run = f.start().started()
    run.wait_step("big release_to_residual ok")
    assert f.engine.level == 2 and not f.engine.weights_valid
    f.end_request("small")
    run.wait_step("big wake ok")
    run.wait_step("big reload ok")
    run.wait_step("big await_ready ok")
    assert f.engine.weights_valid and not f.engine.prefix_cache_stale
    rpc = [r.json for r in f.engine.calls if r.path == "/collective_rpc"]
    assert rpc == [{"method": "reload_weights"}]
    assert f.starts("big", since) == 0
    assert run.stop() == 0


def test_a_sleep_that_is_not_confirmed_falls_back_to_a_stop(sfleet: SleepFleet) -> None:
    f = sfleet
    f.engine.sleep_takes_effect = False  # answers 200, keeps saying it is awake
    _, ps = setup(f)
    run = f.start().started()
    run.wait_step("big release_to_residual ok", timeout=30 + WAIT_S)  # after the 30 s bound
    assert "stopped instead" in run.text()
    f.wait_state("big", "exited")
    run.wait_step("small await_ready ok")
    assert healthy(ps)
    assert f.sleeping() == {}
    assert run.stop() == 0


@BOTH
def test_a_controller_restarted_while_a_serve_sleeps_neither_double_counts_nor_forgets(
    sfleet: SleepFleet,
) -> None:
    f = sfleet
    setup(f)
    first = f.start().started()
    first.wait_step("small await_ready ok")
    assert f.engine.is_sleeping
    first.stop(sig=__import__("signal").SIGKILL)
    since = time.time_ns()

    api = free_port()
    second: Run = f.start_api(api).started()

    def ledger() -> dict[str, int] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/ledger", timeout=2) as r:
                body = json.loads(r.read())
        except OSError:
            return None
        (role,) = body["gpu_roles"]
        return {x["serve"]: x["mib"] for x in role["reservations"]}

    # three whole cycles: nothing is stopped, started or woken, and big is counted once,
    # at its residual (awake, small would not fit beside it)
    wait_for("the new controller's ledger", ledger)
    until = (second.cycles() or 0) + 1 + 3  # the one under way may have begun before

    def three_cycles_unchanged() -> bool:
        assert f.states() == {"big": "running", "small": "running"}
        seen = ledger()  # None: this read timed out
        assert seen in (None, {"big": RESIDUAL_MIB, "small": SMALL_MIB}), seen
        return seen is not None and (second.cycles() or 0) >= until

    wait_for("three cycles that change nothing", three_cycles_unchanged)
    assert f.starts("small", since) == 0 and f.starts("big", since) == 0
    assert not [s for s in second.steps() if s.split()[1] in ("stop", "sleep", "wake")]
    assert f.engine.is_sleeping
    assert f.name("big") in f.sleeping()
    # and it is not forgotten: once the request ends, the new controller wakes it
    f.end_request("small")
    f.wait_state("small", "exited")
    second.wait_step("big wake ok")
    assert not f.engine.is_sleeping and f.starts("big", since) == 0
    assert second.stop() == 0


@BOTH
def test_a_container_restarted_while_asleep_is_awake_and_counted_full(sfleet: SleepFleet) -> None:
    f = sfleet
    setup(f)
    api = free_port()
    run = f.start_api(api).started()
    run.wait_step("small await_ready ok")
    assert f.engine.is_sleeping and f.name("big") in f.sleeping()
    # the container restarts (a crash and its restart policy, a `docker restart`): its
    # engine comes back awake, loading its weights again
    f.client.containers.get(f.name("big")).restart(timeout=5)
    f.engine.restart()
    wait_for("the sleep record forgotten", lambda: f.sleeping() == {})
    # for the restart: seen between its stop and its start, or seen started again after
    # (which of the two depends on when a cycle looks; either ends the record)
    big = f.name("big")
    over = (f"{big} is not running: no longer asleep", "started again since it was put to sleep")
    wait_for("the restart logged", lambda: any(n in run.text() for n in over))

    def big_mib() -> int | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/ledger", timeout=2) as r:
            (role,) = json.loads(r.read())["gpu_roles"]
        return {x["serve"]: x["mib"] for x in role["reservations"]}.get("big")

    wait_for("big counted full", lambda: big_mib() == BIG_MIB)
    assert run.stop() == 0
