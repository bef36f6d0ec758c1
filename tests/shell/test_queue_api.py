"""The request queue and the live ledger, against the ASGI app and the pure overlay.

No Docker: a controller whose observations the test scripts (as ``tests/shell/test_api.py``
does), and the live ledger fed as the executor feeds it. The real daemon's queue,
``wait_s`` and live answers are in ``tests/e2e/test_live_answers.py``.

* a queued request ends at its own deadline (429 saying so), and when what it waits
  for can never come (a resident now holds the room: 429 "cannot fit any more");
* the queue per role is bounded: over the bound, 429 says so;
* the live ledger: a reserve counts from the moment it is made, a confirmed release
  frees, an observation taken after them absorbs them; steps in flight are listed;
* the queue's requests in force are the planner's: a request without a TTL of its own
  ends by the serve's ``idle_ttl_s``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.service import controller_on, observe, running_for
from test_api import TOKEN, Asgi, auth

from controller.interfaces.upwait import RequestQueue
from controller.service.live import LiveLedger, overlay_observed
from controller.service.loop import Controller
from controller.service.queue_pump import active_requests
from statemachine.domain.types import ContainerObs, ContainerState, Observed, StartingObs
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import (
    Action,
    Step,
)
from statemachine.planning.planner import (
    plan_transitions,
)

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0

[[gpu_roles]]
id = "b"
vram_mib = 10000
reserve_mib = 0

[[serve]]
name = "hog"
container = "c-hog"
gpu_role = "a"
vram_mib = 6000
residency = "on-demand"

[[serve]]
name = "wall"
container = "c-wall"
gpu_role = "a"
vram_mib = 6000
residency = "resident"

[[serve]]
name = "q"
container = "c-q"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"

[[serve]]
name = "q2"
container = "c-q2"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"

[[serve]]
name = "other"
container = "c-other"
gpu_role = "b"
vram_mib = 1000
residency = "on-demand"
"""


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = controller_on(tmp_path, MANIFEST)
    yield c
    c.journal.close()


def running() -> dict[str, Any]:
    return running_for(100)


class Client(Asgi):
    """:class:`test_api.Asgi`, keeping the app's request queue at hand."""

    def __init__(self, controller: Controller) -> None:
        super().__init__(controller, TOKEN)
        transport = self.client._transport
        assert isinstance(transport, httpx.ASGITransport)
        self.queue: RequestQueue = transport.app.state.up_queue  # type: ignore[attr-defined]


@pytest.fixture
def api(controller: Controller) -> Iterator[Client]:
    a = Client(controller)
    yield a
    a.close()


def test_a_queued_request_ends_at_its_deadline(controller: Controller, api: Client) -> None:
    controller.journal.add_request("hog", time.time(), None)
    observe(controller, {"hog": running()})
    r = api.post(
        "/v1/serves/q/up", json={"queue": True, "queue_s": 0.3, "wait_s": 30}, headers=auth()
    )
    assert r.status_code == 429, r.text
    assert "in the queue" in r.json()["error"] and r.json()["queue"]["outcome"] == "deadline"
    assert api.get("/v1/queue").json()["roles"] == {}


def test_a_queued_request_ends_when_it_can_never_fit(controller: Controller, api: Client) -> None:
    controller.journal.add_request("hog", time.time(), None)
    observe(controller, {"hog": running()})
    r = api.post("/v1/serves/q/up", json={"queue": True}, headers=auth())
    assert r.status_code == 202 and r.json()["queue"]["position"] == {"a": 1}, r.text
    # a request on another role does not compete: it is not held behind q
    r = api.post("/v1/serves/other/up", headers=auth())
    assert r.status_code == 202 and r.json().get("queued") is None, r.text
    # the resident now runs beside hog: room for q never comes back
    observe(controller, {"hog": running(), "wall": running()})
    r = api.post("/v1/serves/q/up", json={"wait_s": 30}, headers=auth())
    assert r.status_code == 429, r.text
    assert "cannot fit any more" in r.json()["error"]
    assert r.json()["queue"]["outcome"] == "impossible"


def test_the_queue_of_a_role_is_bounded(controller: Controller, api: Client) -> None:
    controller.journal.add_request("hog", time.time(), None)
    observe(controller, {"hog": running()})
    api.queue.max_per_role = 1
    assert api.post("/v1/serves/q/up", json={"queue": True}, headers=auth()).status_code == 202
    r = api.post("/v1/serves/q2/up", json={"queue": True}, headers=auth())
    assert r.status_code == 429, r.text
    assert "the queue of a holds 1 requests already" in r.json()["error"]
    r = api.post("/v1/serves/q/down", headers=auth())
    assert r.status_code == 202 and "queued request ended" in r.json()["message"]
    assert api.get("/v1/queue").json()["roles"] == {}


def _step(action: Action, serve: str = "q", mib: int | None = 5000) -> Step:
    return Step(action=action, serve=serve, reason="test", gpu_roles=("a",), mib=mib, group=serve)


def test_the_live_ledger_counts_a_reserve_at_once_and_an_observation_absorbs_it(
    controller: Controller,
) -> None:
    live = LiveLedger()
    desired = controller.mset.desired()
    containers = {s.name: s.container for s in desired.serves.values()}
    seen = Observed(docker_ok=True, containers={"c-hog": ContainerObs(ContainerState.RUNNING)})
    mark = live.mark()
    token = live.step_begun(_step(Action.RESERVE))
    assert [f.action for f in live.overlay(mark).in_flight] == ["reserve"]
    live.step_ended(token, _step(Action.RESERVE), "ok", "reserved")
    now = overlay_observed(seen, live.overlay(mark), containers)
    assert ledger_from_observed(desired, now).committed_mib("a") == 11000  # hog + q
    # hog's stop and release, confirmed
    live.step_ended(
        live.step_begun(_step(Action.STOP, "hog", None)), _step(Action.STOP, "hog", None), "ok", ""
    )
    after_stop = overlay_observed(seen, live.overlay(mark), containers)
    assert ledger_from_observed(desired, after_stop).committed_mib("a") == 11000  # not yet
    release = _step(Action.RELEASE, "hog", 6000)
    live.step_ended(live.step_begun(release), release, "ok", "released")
    freed = overlay_observed(seen, live.overlay(mark), containers)
    assert ledger_from_observed(desired, freed).committed_mib("a") == 5000
    assert not freed.container("c-hog").holds
    # a failed start keeps counting until an observation says otherwise
    live.step_ended(
        live.step_begun(_step(Action.AWAIT_READY)), _step(Action.AWAIT_READY), "failed", "x"
    )
    assert ledger_from_observed(
        desired, overlay_observed(seen, live.overlay(mark), containers)
    ).holds("q")
    # an observation taken after these events sees them itself: nothing is laid over it
    later = live.mark()
    assert live.overlay(later).held == {} and live.overlay(later).released == frozenset()


def test_a_grow_counts_at_full_from_its_beginning() -> None:
    live = LiveLedger()
    mark = live.mark()
    grow = Step(
        action=Action.GROW,
        serve="el",
        reason="t",
        gpu_roles=("a",),
        mib=1000,
        group="el",
        to_mib=8000,
    )
    live.step_begun(grow)
    seen = Observed(docker_ok=True, elastic_mib={"el": 7000})
    assert "el" not in overlay_observed(seen, live.overlay(mark), {"el": "c-el"}).elastic_mib


def test_a_start_that_ended_healthy_counts_as_running_not_starting(
    controller: Controller,
) -> None:
    live = LiveLedger()
    desired = controller.mset.desired()
    containers = {s.name: s.container for s in desired.serves.values()}
    seen = Observed(docker_ok=True)  # observed before q was started
    mark = live.mark()
    for action in (Action.RESERVE, Action.START, Action.AWAIT_READY):
        live.step_ended(live.step_begun(_step(action)), _step(action), "ok", "")
    now = overlay_observed(seen, live.overlay(mark), containers)
    assert "q" not in now.starting and now.container("c-q").holds
    assert ledger_from_observed(desired, now).committed_mib("a") == 5000
    # a new start of it (after a stop and release) is starting again
    release = _step(Action.RELEASE)
    live.step_ended(live.step_begun(release), release, "ok", "")
    live.step_ended(live.step_begun(_step(Action.RESERVE)), _step(Action.RESERVE), "ok", "")
    again = overlay_observed(seen, live.overlay(mark), containers)
    assert "q" in again.starting


def test_a_start_that_ends_healthy_after_the_observations_mark_counts_as_running(
    controller: Controller,
) -> None:
    # the observation was taken while q's await_ready ran: it saw the start in progress
    # (its reserve and start are behind the mark); the healthy end after the mark is
    # laid over it, or q would count as starting (never a victim) until the next one
    live = LiveLedger()
    desired = controller.mset.desired()
    containers = {s.name: s.container for s in desired.serves.values()}
    for action in (Action.RESERVE, Action.START):
        live.step_ended(live.step_begun(_step(action)), _step(action), "ok", "")
    mark = live.mark()
    seen = Observed(
        docker_ok=True,
        containers={"c-q": ContainerObs(ContainerState.RUNNING)},
        starting={"q": StartingObs(("a",), 5000)},
    )
    ready = _step(Action.AWAIT_READY, mib=None)  # as the planner writes it: no MiB
    live.step_ended(live.step_begun(ready), ready, "ok", "")
    now = overlay_observed(seen, live.overlay(mark), containers)
    assert "q" not in now.starting and now.container("c-q").holds
    assert ledger_from_observed(desired, now).committed_mib("a") == 5000


IDLE_MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0

[[serve]]
name = "idle"
container = "c-idle"
gpu_role = "a"
vram_mib = 4000
residency = "on-demand"
idle_ttl_s = 60
"""


def test_the_queue_and_the_planner_agree_on_a_request_ended_by_idle_ttl_s(
    tmp_path: Path,
) -> None:
    """``idle`` has no source of in-flight counts, and its request no TTL of its own:
    the request ends ``idle_ttl_s`` after it was made (statemachine.planning.idleness.in_force).
    The raw TTL (none) would keep it in force for ever: the queue would hold a place
    for a serve the planner stops."""
    c = controller_on(tmp_path, IDLE_MANIFEST)
    try:
        now = time.time()
        c.journal.add_request("idle", now - 60, None)
        observe(c, {"idle": running()})
        (req,) = c.requests()
        assert req.ttl_s is None
        observed = c.view().observed()
        assert observed is not None

        def stops(at: float) -> list[str]:
            plan = plan_transitions(c.desired(), observed, None, at)
            return [s.serve for s in plan.steps if s.action is Action.STOP]

        assert active_requests(c, now, observed) == {} and active_requests(c, now) == {}
        assert stops(now) == ["idle"]
        # a moment before its end, every answer keeps it
        assert list(active_requests(c, now - 0.5, observed)) == ["idle"]
        assert list(active_requests(c, now - 0.5)) == ["idle"]
        assert stops(now - 0.5) == []
    finally:
        c.journal.close()
