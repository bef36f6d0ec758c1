"""``up`` for a serve that sleeps: its running container is not "already running"."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.service import controller_on
from test_api import TOKEN, Asgi, auth, client  # noqa: F401 - the fixture

from controller.manifest import load_manifest_set
from controller.service.loop import Controller, CycleSummary, RunOptions
from controller.snapshot import parse_snapshot

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000

[[serve]]
name = "big"
container = "c-big"
gpu_role = "a"
vram_mib = 8000
residency = "evictable"
desired = "running"
port = 21001
engine = "vllm"
[serve.sleep]
level = 1
residual_mib = 1000
host_ram_mib = 6000

[[serve]]
name = "small"
container = "c-small"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"
port = 21002
engine = "vllm"
[serve.sleep]
level = 1
residual_mib = 1000
host_ram_mib = 4000
"""


@pytest.fixture
def idle(tmp_path: Path) -> Iterator[Controller]:
    controller = controller_on(tmp_path, MANIFEST)
    yield controller
    controller.journal.close()


def test_up_of_a_sleeping_serve_is_recorded_and_planned_as_a_wake(
    idle: Controller,
    client: Callable[..., Asgi],  # noqa: F811
) -> None:
    c = client(idle)
    now = time.time()
    snap = parse_snapshot(
        {
            "docker": "ok",
            "containers": {
                "c-big": {"state": "running", "started_at": now - 600},
                "c-small": {"state": "running", "started_at": now - 600},
            },
            "gpus": None,
            "sleep": {
                "small": {"state": "asleep", "level": 1, "residual_mib": 1000, "host_ram_mib": 4000}
            },
        }
    )
    idle.last = CycleSummary(at=now, snapshot=snap)
    idle.cycles += 1
    r = c.post("/v1/serves/small/up", json={"ttl_s": 60}, headers=auth(TOKEN))
    assert r.status_code == 202, r.text
    body = r.json()
    assert body.get("accepted") is True and body["request"] is not None, body
    actions = [(s["action"], s["serve"]) for s in body["steps"]]
    assert ("sleep", "big") in actions and ("wake", "small") in actions, actions
    assert [q.serve for q in idle.journal.active_requests()] == ["small"]


def test_up_with_wait_of_a_sleeping_serve_is_not_ready_while_it_sleeps(
    idle: Controller,
    client: Callable[..., Asgi],  # noqa: F811
) -> None:
    # its container runs, but its engine sleeps: it is not ready until it is woken
    c = client(idle)
    now = time.time()
    snap = parse_snapshot(
        {
            "docker": "ok",
            "containers": {
                "c-big": {"state": "running", "started_at": now - 600},
                "c-small": {"state": "running", "started_at": now - 600},
            },
            "gpus": None,
            "sleep": {
                "small": {"state": "asleep", "level": 1, "residual_mib": 1000, "host_ram_mib": 4000}
            },
        }
    )
    idle.last = CycleSummary(at=now, snapshot=snap)
    idle.cycles += 1
    r = c.post("/v1/serves/small/up", json={"ttl_s": 60, "wait_s": 0.5}, headers=auth(TOKEN))
    assert r.status_code == 202, r.text
    assert r.json().get("ready") is not True, r.json()
    assert [q.serve for q in idle.journal.active_requests()] == ["small"]


def test_the_metrics_show_the_host_ram_line_and_what_each_sleeper_holds_there(
    tmp_path: Path,
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from controller.interfaces.metrics import Metrics

    path = tmp_path / "serves.toml"
    path.write_text("[host]\nram_mib = 64000\nreserve_mib = 4000\n" + MANIFEST)
    controller = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state"), load_manifest_set([path])
    )
    now = time.time()
    sleeping = {
        "docker": "ok",
        "containers": {"c-small": {"state": "running", "started_at": now - 600}},
        "gpus": None,
        "sleep": {
            "small": {"state": "asleep", "level": 1, "residual_mib": 1000, "host_ram_mib": 4000}
        },
    }
    controller.last = CycleSummary(at=now, snapshot=parse_snapshot(sleeping))
    metrics = Metrics()
    metrics.update_ledger(controller)

    def samples(name: str) -> dict[str, float]:
        families = text_string_to_metric_families(metrics.render().decode())
        return {
            ",".join(s.labels.values()): s.value
            for f in families
            for s in f.samples
            if s.name == name
        }

    assert samples("vramctl_host_ram_mib") == {
        "budget": 60000,
        "committed": 4000,
        "free": 56000,
    }
    assert samples("vramctl_serve_host_ram_mib") == {"small": 4000}
    # docker unreadable: what sleepers hold is unknown, absent (never 0)
    controller.last = CycleSummary(
        at=now, snapshot=parse_snapshot({"docker": "error", "containers": {}, "gpus": None})
    )
    metrics.update_ledger(controller)
    assert samples("vramctl_host_ram_mib") == {"budget": 60000}
    assert samples("vramctl_serve_host_ram_mib") == {}
