"""``up`` that waits, over a real uvicorn server: what happens while, and after, it waits.

The API app runs on uvicorn in a thread on a loopback port; the controller behind it
never cycles: the test says what a cycle observed (as ``tests/shell/test_queue_api.py`` does)
and, where the loop would have planned, asks the real planner for that plan. Clients
are real HTTP clients that wait, and go away, as a terminal's ``vramctl up --wait``
does when it is interrupted.

* a plan made while an ``up`` waits blocks its serve (the victim restarted inside its
  ``min_runtime_s``): the waiting client gets the 429 of an ``up`` refused at once,
  with the arithmetic and where its request stands, not a 500;
* a string holding a lone surrogate (``"\\ud800"``, valid JSON) is a 422 that spells
  what it echoes, not a 500;
* a queued request whose only waiting client goes away leaves the queue at once
  (``withdrawn``): it is never admitted later with nobody waiting; one that another
  client still waits on, or was told is queued, or that said ``"outlive_client":
  true``, stays.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from support.service import controller_on
from support.serving import free_port
from support.waiting import wait_for

from controller.interfaces.api import ApiSettings, create_app
from controller.interfaces.upwait import RequestQueue
from controller.manifest import load_manifest_set
from controller.service.loop import Controller, CycleSummary, RunOptions
from controller.service.queue_pump import QueuePump
from controller.snapshot import parse_snapshot
from controller.store.journal import Journal, journal_path
from statemachine.planning.plan_types import (
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

TOKEN = "up-wait-test-token-0123456789"

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0

[[serve]]
name = "ocr"
container = "c-ocr"
gpu_role = "a"
vram_mib = 6000
residency = "evictable"
desired = "running"
min_runtime_s = 20
port = 9101

[[serve]]
name = "fast"
container = "c-fast"
gpu_role = "a"
vram_mib = 6000
residency = "on-demand"
port = 9102

[[serve]]
name = "q2"
container = "c-q2"
gpu_role = "a"
vram_mib = 6000
residency = "on-demand"
port = 9103
"""


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


class Server:
    """The API app on uvicorn in a thread, on a free loopback port, and beside it the
    request queue's pump, as ``vramctl run`` serves them (``attach_api``).

    ``looks`` counts the pump's looks at the queue (each :meth:`QueuePump.process` that
    returned), so that a test can wait until the pump has looked after a change
    (:meth:`pump_looked`) instead of for a figure of seconds."""

    def __init__(self, controller: Controller) -> None:
        settings = ApiSettings(token=TOKEN, bind_host="127.0.0.1", retry_after_s=5.0)
        self.app = create_app(controller, settings)
        self.queue: RequestQueue = self.app.state.up_queue
        self.looks = 0
        pump: QueuePump = self.app.state.api.pump
        process = pump.process

        def counted() -> None:
            process()
            self.looks += 1

        pump.process = counted  # type: ignore[method-assign]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self.thread.start()
        wait_for("the server", lambda: self.server.started)
        self.http = httpx.Client(base_url=self.url, timeout=60.0, trust_env=False)

    async def _serve(self) -> None:
        pump = asyncio.ensure_future(self.app.state.queue_pump())
        try:
            await self.server.serve()
        finally:
            pump.cancel()

    def pump_looked(self) -> None:
        """Wait until the pump has looked at the queue after this call: two more looks
        (the one under way may have begun before it)."""
        mark = self.looks
        wait_for("two more looks of the queue's pump", lambda: self.looks >= mark + 2)

    def gone_noticed(self, serve: str, clients: int) -> None:
        """Wait until the server has seen the newest of ``clients`` waiting clients of
        ``serve``'s queued request go away (its disconnect, as the pump reads it)."""

        def noticed() -> bool:
            entry = self.queue.get(serve)
            assert entry is not None, f"{serve} is no longer queued"
            return len(entry.waiters) == clients and entry.waiters[-1].is_set()

        wait_for(f"the server to see {serve}'s client #{clients} go away", noticed)

    def up(self, serve: str, **body: Any) -> httpx.Response:
        return self.http.post(f"/v1/serves/{serve}/up", json=body, headers=auth())

    def up_and_go_away(self, serve: str, **body: Any) -> None:
        """An ``up`` whose client stops waiting after 0.5 s and closes its connection."""
        with (
            httpx.Client(base_url=self.url, timeout=0.5, trust_env=False) as impatient,
            pytest.raises(httpx.ReadTimeout),
        ):
            impatient.post(f"/v1/serves/{serve}/up", json=body, headers=auth())

    def close(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = controller_on(tmp_path, MANIFEST)
    yield c
    c.journal.close()


@pytest.fixture
def api(controller: Controller) -> Iterator[Server]:
    server = Server(controller)
    yield server
    server.close()


@pytest.fixture
def said() -> Iterator[list[str]]:
    """What the controller logs while the test runs."""
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    yield lines
    logger.remove(sink)


def observe(c: Controller, containers: dict[str, Any], *, plan: bool = False) -> None:
    """Say a cycle observed ``containers`` (serve name -> container fields) now;
    ``plan``: and planned on it, as the loop does (the real planner's plan)."""
    now = time.time()
    snap = parse_snapshot(
        {"docker": "ok", "containers": {f"c-{k}": v for k, v in containers.items()}, "gpus": None}
    )
    made = plan_transitions(c.desired(), snap.to_observed(), Policy(), now) if plan else None
    c.last = CycleSummary(at=now, snapshot=snap, plan=made)
    c.cycles += 1


def running(for_s: float) -> dict[str, Any]:
    return {"state": "running", "started_at": time.time() - for_s}


# ── item: a plan that blocks a waiting up is a refusal with its arithmetic ────


def test_a_waiting_up_blocked_by_a_later_plan_gets_the_429_with_its_arithmetic(
    controller: Controller, api: Server, said: list[str]
) -> None:
    observe(controller, {"ocr": running(100)})  # past its min_runtime_s: evictable
    answers: list[httpx.Response] = []
    waiter = threading.Thread(target=lambda: answers.append(api.up("fast", wait_s=30)))
    waiter.start()
    wait_for("fast's request recorded", lambda: bool(controller.requests()))
    # the victim's container is restarted by hand before the loop stops it: it is inside
    # its min_runtime_s again, and the loop's next plan blocks fast
    time.sleep(0.05)
    observe(controller, {"ocr": running(0)}, plan=True)
    assert controller.last.plan is not None
    assert [b.serve for b in controller.last.plan.blocked] == ["fast"]
    waiter.join(30)
    [r] = answers
    assert r.status_code == 429, r.text
    body = r.json()
    assert "ocr" in body["error"] and body["protected"][0]["serve"] == "ocr"
    assert 15 <= int(r.headers["retry-after"]) <= 21
    role = body["gpu_roles"][0]
    assert (role["budget_mib"], role["requested_mib"]) == (10000, 6000)
    # where the request stood when the plan blocked it, and what becomes of it
    assert body["stage"] == "recorded" and body["timings"]["total_s"] >= 0
    assert "stays recorded" in body["note"] and "down" in body["note"]
    assert [r.serve for r in controller.requests()] == ["fast"]
    refused = [line for line in said if line.startswith("api: up fast from")]
    assert refused and all("from 127.0.0.1" in line for line in refused), said


# ── item: a lone surrogate in a JSON string ──────────────────────────────────


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ('{"wait_s": "\\ud800"}', "wait_s"),
        ('{"ttl_s": "\\udfff"}', "ttl_s"),
        ('{"queue": "\\ud800"}', "queue"),
        ('{"queue_s": ["\\udbff\\udbff"]}', "queue_s"),
        ('{"\\ud800": 1}', "body"),
    ],
    ids=["wait_s", "ttl_s", "queue", "queue_s-list", "key"],
)
def test_a_lone_surrogate_is_a_422_that_spells_what_it_echoes(
    controller: Controller, api: Server, raw: str, where: str
) -> None:
    observe(controller, {"ocr": running(100)})
    r = api.http.post(
        "/v1/serves/fast/up",
        content=raw.encode(),
        headers={**auth(), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    r.content.decode("utf-8")  # strict UTF-8: no lone surrogate was written
    body = json.loads(r.text)
    assert body["problems"] and body["problems"][0].startswith(f"{where}: "), body
    assert body["error"].startswith(f"invalid request: {where}: ")
    # the input is echoed, each lone surrogate written out as text
    assert "\\ud" in str(body["detail"][0]["input"]), body["detail"]
    assert controller.requests() == ()


# ── item: a queued request does not outlive the client that waits for it ─────


def block_fast_behind_a_request(controller: Controller) -> None:
    """q2 runs for a request, 6000 of 10000: fast (6000) can fit once it ends."""
    controller.journal.add_request("q2", time.time(), None)
    observe(controller, {"q2": running(100)})


def requested(controller: Controller) -> set[str]:
    """The serves with a recorded request (an ended one stays until its serve is down)."""
    return {r.serve for r in controller.requests()}


def queued(api: Server) -> list[str]:
    return [e["serve"] for e in api.http.get("/v1/queue").json()["roles"].get("a", [])]


def test_a_queued_request_whose_waiting_client_goes_away_is_withdrawn(
    controller: Controller, api: Server, said: list[str]
) -> None:
    block_fast_behind_a_request(controller)
    api.up_and_go_away("fast", wait_s=60, queue=True)
    wait_for("fast's queued request withdrawn", lambda: queued(api) == [])
    [entry] = api.http.get("/v1/queue").json()["recent"]
    assert (entry["serve"], entry["outcome"]) == ("fast", "withdrawn")
    assert "went away" in entry["message"]
    # its room comes: nothing is admitted for it, nobody is evicted for it
    assert api.http.post("/v1/serves/q2/down", headers=auth()).status_code == 202
    observe(controller, {})
    api.pump_looked()  # it finds nothing to admit
    assert "fast" not in requested(controller)
    assert any("withdrawn" in line and "fast" in line for line in said), said


def test_a_queued_request_stays_while_someone_still_waits_for_it_or_was_told_so(
    controller: Controller, api: Server
) -> None:
    block_fast_behind_a_request(controller)
    # one client waits on, a second waits on the same entry and goes away
    answers: list[httpx.Response] = []
    patient = threading.Thread(target=lambda: answers.append(api.up("fast", wait_s=10, queue=True)))
    patient.start()
    wait_for("fast queued", lambda: queued(api) == ["fast"])
    entry = api.queue.get("fast")
    assert entry is not None
    api.up_and_go_away("fast", wait_s=60, queue=True)
    api.gone_noticed("fast", clients=2)
    api.pump_looked()
    assert queued(api) == ["fast"]
    # it stayed for the patient client, still waiting then: not told it is queued yet
    assert not entry.kept and not entry.waiters[0].is_set()
    patient.join(30)
    # the patient client's wait ran out: it was told the request is queued, so it stays
    [r] = answers
    assert r.status_code == 202 and r.json()["queued"] is True, r.text
    assert entry.kept
    api.up_and_go_away("fast", wait_s=60, queue=True)
    api.gone_noticed("fast", clients=3)
    api.pump_looked()
    assert queued(api) == ["fast"]


def test_a_queued_request_that_says_it_outlives_its_client_stays_and_is_admitted(
    controller: Controller, api: Server
) -> None:
    block_fast_behind_a_request(controller)
    api.up_and_go_away("fast", wait_s=60, queue=True, outlive_client=True)
    api.pump_looked()  # after its client went away
    assert queued(api) == ["fast"]
    entry = api.queue.get("fast")
    assert entry is not None and entry.kept and entry.waiters == []  # none it waits for
    assert api.http.post("/v1/serves/q2/down", headers=auth()).status_code == 202
    observe(controller, {})
    # asked about again, it is admitted now that it fits
    r = api.up("fast", wait_s=0.5)
    assert r.status_code == 202, r.text
    assert "fast" in requested(controller)


# ── item: a waiting up against a dry run is answered once the loop has planned it ──


def test_a_waiting_up_against_a_dry_run_gets_the_plans_steps_and_never_waits_out(
    tmp_path: Path, said: list[str]
) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state", dry_run=True),
        load_manifest_set([path]),
    )
    c.journal = Journal.open(journal_path(c.state_dir).with_name("journal.dry-run.sqlite3"))
    api = Server(c)
    try:
        observe(c, {})
        answers: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: answers.append(api.up("fast", wait_s=20)))
        waiter.start()
        wait_for("fast's request recorded", lambda: bool(c.requests()))
        time.sleep(0.05)
        observe(c, {}, plan=True)  # the dry run's loop plans it (and executes nothing)
        waiter.join(60)
        assert answers, "the answer was held although a dry run never makes it ready"
        [r] = answers
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["dry_run"] is True and body["ready"] is False
        assert body["stage"] == "dry run"
        assert "nothing is executed" in body["message"] and "never" in body["message"]
        # what a real run would do: the plan's steps of fast's group
        assert [(s["action"], s["serve"]) for s in body["steps"]] == [
            ("reserve", "fast"),
            ("start", "fast"),
            ("await_ready", "fast"),
        ]
        assert "not ready after wait_s" not in body["message"]
    finally:
        api.close()
        c.journal.close()
