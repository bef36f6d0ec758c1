"""Requests accepted but not yet planned count in every answer (``up``, fit, ledger).

No Docker: a controller whose observations the test scripts (as
``tests/shell/test_queue_api.py`` does); the loop never runs, so a request ``up`` accepts
stays recorded and unplanned, which is the window these answers must cover. The pure
part (:mod:`statemachine.answers.pending`) is tested on its own below.

Budget 10000 on role ``a``, a resident holding 4000: ``up a`` (5000) fits, and then
``up b`` (5000, same role) must not: a's start is what the next cycle does first, and
an on-demand serve is never another request's victim.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.service import controller_on, observe, running_for
from test_api import TOKEN, Asgi, auth

from controller.service.loop import Controller
from controller.service.queue_pump import active_requests
from statemachine.answers.fit import fit_serve
from statemachine.answers.pending import PENDING_STATE, pending_starts, with_pending
from statemachine.domain.types import ContainerObs, ContainerState, Observed, OnDemandRequest

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0

[[serve]]
name = "res"
container = "c-res"
gpu_role = "a"
vram_mib = 4000
residency = "resident"
desired = "running"

[[serve]]
name = "a"
container = "c-a"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"

[[serve]]
name = "b"
container = "c-b"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"

[[serve]]
name = "ev"
container = "c-ev"
gpu_role = "a"
vram_mib = 5000
residency = "evictable"

[[serve]]
name = "p1"
container = "c-p1"
gpu_role = "a"
vram_mib = 100
residency = "on-demand"
port = 18001

[[serve]]
name = "p2"
container = "c-p2"
gpu_role = "a"
vram_mib = 100
residency = "on-demand"
port = 18001

[[serve]]
name = "small"
container = "c-small"
gpu_role = "a"
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


@pytest.fixture
def api(controller: Controller) -> Iterator[Asgi]:
    a = Asgi(controller, TOKEN)
    yield a
    a.close()


def role(body: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return next(r for r in body["gpu_roles"] if r["gpu_role"] == name)


def test_two_ups_back_to_back_cannot_both_be_promised_the_same_room(
    controller: Controller, api: Asgi
) -> None:
    observe(controller, {"res": running()})
    r = api.post("/v1/serves/a/up", headers=auth())
    assert r.status_code == 202, r.text
    # the loop has not planned a yet: nothing holds its 5000 MiB but the request
    r = api.post("/v1/serves/b/up", headers=auth())
    assert r.status_code == 429, r.text
    body = r.json()
    assert "a" in body["error"] and "requested, not yet planned" in body["error"]
    terms = role(body)
    assert terms["budget_mib"] == 10000 and terms["committed_mib"] == 9000
    assert terms["free_mib"] == 1000 and terms["shortfall_mib"] == 4000
    assert {"serve": "a", "mib": 5000, "state": PENDING_STATE} in terms["reservations"]
    assert {"serve": "res", "mib": 4000} in terms["reservations"]
    assert [p["serve"] for p in body["pending"]] == ["a"]
    # what still fits beside a is accepted
    r = api.post("/v1/serves/small/up", headers=auth())
    assert r.status_code == 202, r.text
    # asking again about a's own request is not refused by a itself
    assert api.post("/v1/serves/a/up", headers=auth()).status_code == 202


def test_fit_and_ledger_say_what_is_requested_and_not_yet_planned(
    controller: Controller, api: Asgi
) -> None:
    observe(controller, {"res": running()})
    assert api.post("/v1/serves/a/up", headers=auth()).status_code == 202
    fit = api.get("/v1/fit/b").json()
    assert fit["fits"] is False, fit
    assert role(fit)["free_mib"] == 1000
    assert [p["serve"] for p in fit["pending"]] == ["a"]
    ledger = api.get("/v1/ledger").json()
    line = role(ledger)
    # held: res; promised beside it: a (no room to make for it)
    assert line["committed_mib"] == 4000 and line["free_mib"] == 6000, line
    assert line["pending_mib"] == 5000 and line["promised_mib"] == 9000, line
    assert line["pending"] == [
        {"serve": "a", "mib": 5000, "state": PENDING_STATE, "making_room": []}
    ], line
    assert [p["serve"] for p in ledger["pending"]] == ["a"]
    # once a's request ends (down), the room is free again
    assert api.post("/v1/serves/a/down", headers=auth()).status_code == 202
    assert api.get("/v1/fit/b").json()["fits"] is True
    line = role(api.get("/v1/ledger").json())
    assert line["promised_mib"] == 4000 and line["pending"] == [], line


def test_a_queued_request_is_admitted_only_when_the_pending_one_is_gone(
    controller: Controller, api: Asgi
) -> None:
    observe(controller, {"res": running()})
    assert api.post("/v1/serves/a/up", headers=auth()).status_code == 202
    r = api.post("/v1/serves/b/up", json={"queue": True}, headers=auth())
    assert r.status_code == 202 and r.json()["queued"] is True, r.text
    # still queued: a's pending start holds the room
    r = api.post("/v1/serves/b/up", json={"wait_s": 0.3}, headers=auth())
    assert r.status_code == 202 and r.json()["queued"] is True, r.text
    assert api.post("/v1/serves/a/down", headers=auth()).status_code == 202
    r = api.post("/v1/serves/b/up", json={"wait_s": 0.3}, headers=auth())
    assert r.status_code == 202 and not r.json().get("queued"), r.text
    assert api.get("/v1/queue").json()["roles"] == {}
    assert "b" in active_requests(controller, time.time())


def test_an_on_demand_request_goes_ahead_of_an_evictable_ones_as_the_planner_orders(
    controller: Controller, api: Asgi
) -> None:
    """The planner starts on-demand requesters before the evictable backfill, and an
    evictable serve being started is blocked rather than evicted: ``up b`` after an
    accepted ``up ev`` fits, as the next cycle will start b and leave ev waiting."""
    observe(controller, {"res": running()})
    assert api.post("/v1/serves/ev/up", headers=auth()).status_code == 202
    assert [p["serve"] for p in api.get("/v1/ledger").json()["pending"]] == ["ev"]
    r = api.post("/v1/serves/b/up", headers=auth())
    assert r.status_code == 202, r.text
    assert r.json()["fit"]["pending"] == []
    # the ledger now counts b (the next cycle starts it), not ev (it waits for room)
    ledger = api.get("/v1/ledger").json()
    assert [p["serve"] for p in ledger["pending"]] == ["b"]
    assert role(ledger)["promised_mib"] == 9000 and role(ledger)["pending_mib"] == 5000
    # and a second on-demand request after b is refused, naming b
    r = api.post("/v1/serves/a/up", headers=auth())
    assert r.status_code == 429 and "b 5000 MiB (requested, not yet planned)" in r.json()["error"]


def test_the_ledger_tells_what_is_held_from_what_is_promised(
    controller: Controller, api: Asgi
) -> None:
    """``up a`` fits after evicting ev; until ev's release is confirmed (a stop, a sleep
    that hangs), the role holds res + ev, and a is promised on top: the ledger counts
    what is held (not overcommitted), shows a as pending beside the room being made for
    it, and a refusal still counts everything that may be held."""
    observe(controller, {"res": running(), "ev": running()})  # 4000 + 5000 of 10000
    r = api.post("/v1/serves/a/up", headers=auth())
    assert r.status_code == 202 and r.json()["fit"]["evict"] == ["ev"], r.text
    line = role(api.get("/v1/ledger").json())
    assert line["committed_mib"] == 9000 and line["free_mib"] == 1000, line
    assert line["overcommitted"] is False, line
    assert {x["serve"] for x in line["reservations"]} == {"res", "ev"}, line
    assert line["pending"] == [
        {
            "serve": "a",
            "mib": 5000,
            "state": PENDING_STATE,
            "making_room": [{"serve": "ev", "action": "release", "mib": 5000}],
        }
    ], line
    assert line["pending_mib"] == 5000 and line["making_room_mib"] == 5000, line
    assert line["promised_mib"] == 14000, line  # committed + pending: what up counts
    metrics = api.get("/metrics").text
    assert 'vramctl_role_overcommitted{role="a"} 0.0' in metrics, metrics
    # a refusal counts everything that may be held: ev in full and a's promise
    r = api.post("/v1/serves/b/up", headers=auth())
    assert r.status_code == 429 and "a 5000 MiB (requested, not yet planned)" in r.json()["error"]


def test_a_port_held_by_a_request_not_yet_planned_blocks_the_next(
    controller: Controller, api: Asgi
) -> None:
    observe(controller, {"res": running()})
    assert api.post("/v1/serves/p1/up", json={"ttl_s": 60}, headers=auth()).status_code == 202
    r = api.post("/v1/serves/p2/up", headers=auth())
    # p1 goes away when its request ends: a wait (429), not never (409), naming p1
    assert r.status_code == 429, r.text
    assert "p1" in r.json()["error"] and "requested, not yet planned" in r.json()["error"]
    assert r.json()["blockers"] == ["p1"] and 55 <= int(r.headers["retry-after"]) <= 60


# ── the pure part ─────────────────────────────────────────────────────────────


def _desired(controller: Controller, *requests: str) -> Any:
    now = time.time()
    base = controller.mset.desired()
    return type(base)(
        roles=base.roles,
        serves=base.serves,
        requests=tuple(OnDemandRequest(s, now - i) for i, s in enumerate(requests)),
        host=base.host,
    )


def _observed(**holding: int) -> Observed:
    return Observed(
        docker_ok=True,
        containers={
            f"c-{k}": ContainerObs(ContainerState.RUNNING, started_at=time.time() - 100)
            for k in holding
        },
    )


def test_pending_starts_counts_what_the_next_cycle_reserves(controller: Controller) -> None:
    now = time.time()
    obs = _observed(res=4000)
    pending = pending_starts(_desired(controller, "a"), obs, policy=None, now=now)
    assert [(p.serve, p.gpu_roles, p.mib) for p in pending] == [("a", ("a",), 5000)]
    # the one asked about is not its own holder
    assert pending_starts(_desired(controller, "a"), obs, policy=None, now=now, requester="a") == ()
    # a serve already running for its request is counted by the observation, not here
    both = _observed(res=1, a=1)
    assert pending_starts(_desired(controller, "a"), both, policy=None, now=now) == ()
    # a request the next cycle cannot start (no room: a then b, by age) is not counted
    pending = pending_starts(_desired(controller, "b", "a"), obs, policy=None, now=now)
    assert [p.serve for p in pending] == ["a"]
    # laid over the observation, the fit of b sees a's reservation
    desired = _desired(controller, "a")
    fit = fit_serve(desired, with_pending(obs, pending), "b", now=now)
    assert not fit.fits and dict(fit.terms[0].reservations)["a"] == 5000
    assert fit_serve(desired, obs, "b", now=now).fits  # the defect: blind to a
