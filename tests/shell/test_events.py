"""The event stream: the bus (controller.service.events), ``GET /v1/events``, ``vramctl events``.

Three layers:

* the bus alone: sequence numbers, resume from the ring, the ``gap`` item, a reader
  that never reads (publishing goes on; it gets a gap and continues), publishers on
  many threads, the watchers that publish only what changed;
* the route over a real uvicorn server in a thread (a controller that never cycles,
  a bus the test publishes on), read by httpx streaming: redaction and auth like the
  other GETs, ``Last-Event-ID``, heartbeats, a stalled reader over TCP, and the
  client's reconnection after the server went away;
* ``vramctl run`` over real containers (the scenario of tests/shell/test_api.py): an
  eviction and its undo, read by a real client while they happen; every lifecycle
  transition arrives in order with increasing ids, a resume gets exactly the events
  missed, and ``vramctl events`` prints them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import uvicorn
from support.core import spec as core_spec
from support.service import controller_on
from support.serving import free_port
from support.waiting import WAIT_S, wait_for
from test_api import TOKEN, Live, vramctl

from controller.interfaces.api import ApiSettings, create_app
from controller.interfaces.client import follow_events, parse_sse
from controller.service.events import (
    DriftWatch,
    Event,
    EventBus,
    Gap,
    LedgerWatch,
    Subscription,
    drift_alarms,
)
from controller.service.loop import Controller
from statemachine.answers.status_report import host_status
from statemachine.domain import types as sm
from statemachine.ledger.reservations import GpuReservation, Ledger, Refusal

# ── the bus ──────────────────────────────────────────────────────────────────


def ids(items: list[Event | Gap]) -> list[int]:
    return [i.id for i in items if isinstance(i, Event)]


def subscribe(bus: EventBus, last_id: int | None = None) -> Subscription:
    """A subscription for synchronous tests (its own event loop, never run)."""
    loop = asyncio.new_event_loop()
    return bus.subscribe(last_id, loop=loop)


def test_each_event_has_the_next_id_its_kind_time_and_payload() -> None:
    clock = iter([100.0, 101.5, 103.0])
    bus = EventBus(first_id=41, clock=lambda: next(clock))
    assert bus.last_id == 40
    a = bus.publish("lifecycle", serve="llm", trigger="reserve", **{"from": "stopped"})
    b = bus.publish("step", private=("detail",), serve="llm", detail="docker says no")
    c = bus.publish("request.queued", serve="x", position=2)
    assert [e.id for e in (a, b, c)] == [41, 42, 43] and bus.last_id == 43
    assert [e.at for e in (a, b, c)] == [100.0, 101.5, 103.0]
    assert a.to_json() == {
        "id": 41,
        "kind": "lifecycle",
        "at": 100.0,
        "data": {"serve": "llm", "trigger": "reserve", "from": "stopped"},
    }
    # a reader without the token: the free text is withheld, and said to be
    assert b.to_json(full=False)["data"] == {"serve": "llm", "detail": None}
    assert b.to_json(full=False)["withheld"] == ["detail"]
    assert b.to_json(full=True)["data"]["detail"] == "docker says no"
    assert "withheld" not in a.to_json(full=False)


def test_resume_gets_exactly_the_events_after_the_id() -> None:
    bus = EventBus()
    for i in range(10):
        bus.publish("step", n=i)
    sub = subscribe(bus, last_id=6)
    assert ids(sub.take()) == [7, 8, 9, 10]
    bus.publish("step", n=10)
    assert ids(sub.take()) == [11]
    assert sub.take() == []
    # no id: only what comes from now on
    fresh = subscribe(bus)
    assert fresh.take() == []
    bus.publish("step", n=11)
    assert ids(fresh.take()) == [12] and ids(sub.take()) == [12]


def test_an_id_older_than_the_ring_gets_a_gap_naming_the_first_id_kept() -> None:
    bus = EventBus(buffer=4)
    for i in range(10):
        bus.publish("step", n=i)
    items = subscribe(bus, last_id=2).take()
    gap = items[0]
    assert isinstance(gap, Gap)
    assert (gap.after, gap.first, gap.missed) == (2, 7, 4)
    assert "no longer kept" in gap.reason
    assert ids(items[1:]) == [7, 8, 9, 10]
    # the newest id is no gap, nothing to replay
    assert subscribe(bus, last_id=10).take() == []


def test_an_id_this_controller_never_issued_is_a_gap_too() -> None:
    bus = EventBus(first_id=1000)
    for i in range(3):
        bus.publish("step", n=i)
    for stale in (5, 999_999):  # before this controller started; beyond its last id
        items = subscribe(bus, last_id=stale).take()
        gap = items[0]
        assert isinstance(gap, Gap) and gap.missed is None and gap.first == 1000
        assert "not issued by this controller" in gap.reason
        assert ids(items[1:]) == [1000, 1001, 1002]
    assert ids(subscribe(bus, last_id=999).take()) == [1000, 1001, 1002]  # from the very first


def test_a_reader_that_never_reads_does_not_hold_publishing_up() -> None:
    bus = EventBus(buffer=50, queue=8)
    stalled = subscribe(bus)
    done = threading.Event()

    def publish() -> None:
        for i in range(5000):
            bus.publish("step", n=i)
        done.set()

    threading.Thread(target=publish, daemon=True).start()
    assert done.wait(60), "publishing waited on a reader that does not read"
    assert stalled.pending() <= 8  # its queue stays bounded
    # when it reads again: a gap that says what it lost, then the ring to the end
    items = stalled.take()
    gap = items[0]
    assert isinstance(gap, Gap) and gap.after == 0 and gap.first == 4951
    assert gap.missed == 4950 and "fell behind" in gap.reason
    assert ids(items[1:]) == list(range(4951, 5001))
    bus.publish("step", n=5000)
    assert ids(stalled.take()) == [5001]  # and it goes on as any reader


def test_a_reader_that_fell_behind_within_the_ring_misses_nothing() -> None:
    bus = EventBus(buffer=100, queue=3)
    sub = subscribe(bus)
    for i in range(20):
        bus.publish("step", n=i)
    items = sub.take()
    assert not any(isinstance(i, Gap) for i in items)
    assert ids(items) == list(range(1, 21))


def test_publishers_on_many_threads_get_unique_consecutive_ids_in_order() -> None:
    bus = EventBus(buffer=10_000, queue=10_000)
    sub = subscribe(bus)
    threads = [
        threading.Thread(target=lambda t=t: [bus.publish("step", t=t, n=n) for n in range(500)])
        for t in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = sub.take()
    assert ids(got) == list(range(1, 4001))
    for t in range(8):  # each thread's events in the order it published them
        mine = [e.data["n"] for e in got if isinstance(e, Event) and e.data["t"] == t]
        assert mine == list(range(500))


def test_an_async_reader_wakes_on_a_publish_from_another_thread_and_on_close() -> None:
    bus = EventBus()

    async def read() -> tuple[list[Event | Gap], list[Event | Gap], list[Event | Gap], bool]:
        sub = bus.subscribe()
        quiet = await sub.next(0.05)  # nothing: a heartbeat's worth of silence
        threading.Timer(0.05, lambda: bus.publish("step", n=1)).start()
        woke = await sub.next(60.0)
        threading.Timer(0.05, bus.close).start()
        end = await sub.next(60.0)
        return quiet, woke, end, sub.closed

    quiet, woke, end, closed = asyncio.run(read())
    assert quiet == [] and ids(woke) == [1] and end == [] and closed
    assert bus.subscribers() == 0
    # a reader that comes after the close gets what is kept, then the end
    late = subscribe(bus, last_id=0)
    assert ids(late.take()) == [1] and late.closed


def test_the_bus_refuses_a_ring_or_queue_of_nothing() -> None:
    with pytest.raises(ValueError, match="at least one"):
        EventBus(buffer=0)
    with pytest.raises(ValueError, match="at least one"):
        EventBus(queue=0)


ROLE = sm.GpuRole("a", 10000, 1000, uuid="GPU-a")


def spec(name: str, mib: int) -> sm.ServeSpec:
    return core_spec(name, mib, sm.Residency.ON_DEMAND)


def test_the_ledger_watch_publishes_a_role_only_when_its_figures_change() -> None:
    bus = EventBus()
    watch = LedgerWatch(bus)
    empty = Ledger({"a": ROLE})
    watch.feed(empty, "observation")
    watch.feed(empty, "plan")  # the same figures: nothing
    held = empty.admit(GpuReservation("llm", ("a",), 5000))
    assert not isinstance(held, Refusal)
    watch.feed(held, "plan")
    watch.feed(held, "observation")
    watch.feed(Ledger({"a": ROLE}, unknown=True), "observation")
    got = [
        (e.data["committed_mib_before"], e.data["committed_mib"], e.data["free_mib"])
        for e in bus.recent()
    ]
    assert got == [(None, 0, 9000), (0, 5000, 4000), (5000, None, None)]
    assert [e.data["source"] for e in bus.recent()] == ["observation", "plan", "observation"]
    assert all(e.kind == "ledger" and e.data["gpu_role"] == "a" for e in bus.recent())


def observed(used: int | None, llm_used: int | None, docker_ok: bool = True) -> sm.Observed:
    return sm.Observed(
        docker_ok=docker_ok,
        containers={
            "c-llm": sm.ContainerObs(sm.ContainerState.RUNNING, gpu_used_mib=llm_used),
        },
        gpus=None if used is None else (sm.GpuObs("GPU-a", 0, "card", 10000, used, 10000 - used),),
    )


def test_drift_alarms_are_raised_and_cleared_once_each() -> None:
    desired = sm.DesiredState(roles={"a": ROLE}, serves={"llm": spec("llm", 5000)})
    bus = EventBus()
    watch = DriftWatch(bus)
    for obs in (
        observed(5200, 5000),  # within the reservation: nothing
        observed(7000, 5600),  # 2000 over the ledger on the role, 600 over on the serve
        observed(7100, 5700),  # still: no new event
        observed(None, None),  # NVML unreadable: unknown, nothing clears
        observed(5100, 4900),  # back within: both clear
    ):
        watch.feed(host_status(desired, obs))
    got = [(e.data["state"], e.data["alarm"], e.data["drift_mib"]) for e in bus.recent()]
    assert got == [
        ("raised", "role_drift", 2000),
        ("raised", "serve_over_reservation", 600),
        ("cleared", "role_drift", 2100),
        ("cleared", "serve_over_reservation", 700),
    ]
    assert drift_alarms(host_status(desired, observed(5100, 4900))) == {}


# ── the route, over a real server ────────────────────────────────────────────


@pytest.fixture
def idle(tmp_path: Path) -> Iterator[Controller]:
    controller = controller_on(
        tmp_path,
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\n\n[[serve]]\nname = "llm"\n'
        'container = "c-llm"\ngpu_role = "a"\nvram_mib = 5000\nresidency = "on-demand"\n',
    )
    yield controller
    controller.journal.close()


class Server:
    """The API app on uvicorn in a thread, on a loopback port (restartable on the same one)."""

    def __init__(self, controller: Controller, bus: EventBus, heartbeat_s: float = 0.2) -> None:
        settings = ApiSettings(token=TOKEN, bind_host="127.0.0.1", events_heartbeat_s=heartbeat_s)
        self.app = create_app(controller, settings, events=bus)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for("the server", lambda: self.server is not None and self.server.started)

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(30)
            assert not self.thread.is_alive(), "the server did not stop"
        self.server = None


@pytest.fixture
def serve_api(idle: Controller) -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def make(bus: EventBus, heartbeat_s: float = 0.2) -> Server:
        made.append(Server(idle, bus, heartbeat_s))
        made[-1].start()
        return made[-1]

    yield make
    for s in made:
        s.stop()


class Reader:
    """A real SSE client on a thread: every event it reads, decoded, in order."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.items: list[dict[str, Any]] = []
        self.raw: list[tuple[str | None, str]] = []  # (id:, event:) as sent
        self.comments = 0
        self.opened = threading.Event()
        self.status: int | None = None
        self.client = httpx.Client(base_url=url, timeout=httpx.Timeout(30.0), trust_env=False)
        self.thread = threading.Thread(target=self._run, args=(headers or {},), daemon=True)
        self.thread.start()
        assert self.opened.wait(WAIT_S), "the stream did not open"

    def _lines(self, response: httpx.Response) -> Iterator[str]:
        for line in response.iter_lines():
            if line.startswith(":"):
                self.comments += 1
            yield line

    def _run(self, headers: dict[str, str]) -> None:
        with (
            contextlib.suppress(httpx.HTTPError, RuntimeError),
            self.client.stream("GET", "/v1/events", headers=headers) as response,
        ):
            self.status = response.status_code
            self.opened.set()
            if response.status_code != 200:
                return
            for event_id, kind, data in parse_sse(self._lines(response)):
                self.raw.append((event_id, kind))
                self.items.append(json.loads(data))
        self.opened.set()

    def events(self) -> list[dict[str, Any]]:
        return [i for i in self.items if i["kind"] not in ("gap", "end")]

    def wait(
        self, what: str, check: Callable[[list[dict[str, Any]]], bool], timeout: float = WAIT_S
    ) -> None:
        wait_for(what, lambda: check(list(self.items)), timeout, seen=lambda: self.items[-20:])

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def readers() -> Iterator[Callable[..., Reader]]:
    made: list[Reader] = []

    def make(url: str, **headers: str) -> Reader:
        made.append(Reader(url, {k.replace("_", "-"): v for k, v in headers.items()}))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_the_stream_is_read_only_and_redacted_like_the_other_gets(
    serve_api: Callable[..., Server], readers: Callable[..., Reader]
) -> None:
    bus = EventBus()
    srv = serve_api(bus)
    anonymous = readers(srv.url)
    operator = readers(srv.url, Authorization=f"Bearer {TOKEN}")
    assert anonymous.status == operator.status == 200
    wait_for("both subscribed", lambda: bus.subscribers() == 2)
    bus.publish("step", private=("detail",), serve="llm", outcome="failed", detail="up: exit 3")
    for r in (anonymous, operator):
        r.wait("the event", lambda items: len(items) == 1)
    [seen] = anonymous.items
    assert seen["data"]["detail"] is None and seen["withheld"] == ["detail"]
    assert seen["data"]["outcome"] == "failed"
    assert operator.items[0]["data"]["detail"] == "up: exit 3"
    assert "withheld" not in operator.items[0]
    assert anonymous.raw == [(str(seen["id"]), "step")]
    # a wrong token is refused, not answered with less; so is a foreign Origin
    with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
        r = c.get("/v1/events", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 403 and "wrong" in r.json()["error"]
        r = c.get("/v1/events", headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        r = c.get("/v1/events", headers={"Last-Event-ID": "abc"})
        assert r.status_code == 422 and "Last-Event-ID" in r.json()["error"]
        r = c.get("/v1/events", params={"since": "-1"})
        assert r.status_code == 422 and "since" in r.json()["error"]
        # read-only: no write method exists on it
        r = c.post("/v1/events", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 405
    # the command says so too, and stops
    out = vramctl(
        "events", "--api", f"127.0.0.1:{srv.port}", "--count", "1", env={"VRAMCTL_TOKEN": "nope"}
    )
    assert out.returncode == 1 and "refused the event stream: 403" in out.stderr


def test_resume_with_last_event_id_and_the_gap_over_http(
    serve_api: Callable[..., Server], readers: Callable[..., Reader]
) -> None:
    bus = EventBus(buffer=5)
    srv = serve_api(bus)
    for i in range(8):
        bus.publish("step", n=i)
    resumed = readers(srv.url, Last_Event_ID="5")
    resumed.wait("the replay", lambda items: len(items) == 3)
    assert [i["id"] for i in resumed.items] == [6, 7, 8]
    lost = readers(srv.url, Last_Event_ID="1")
    lost.wait("the replay", lambda items: len(items) == 6)
    gap = lost.items[0]
    assert gap["kind"] == "gap" and lost.raw[0] == (None, "gap")  # a gap has no id of its own
    assert gap["data"] == {
        "after": 1,
        "first": 4,
        "missed": 2,
        "reason": "the events after it are no longer kept",
    }
    assert [i["id"] for i in lost.items[1:]] == [4, 5, 6, 7, 8]
    via_query = readers(f"{srv.url}", Last_Event_ID="")
    assert via_query.items == []  # an empty header: new events only
    with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
        with c.stream("GET", "/v1/events", params={"since": "7"}) as r:
            lines = r.iter_lines()
            got = next(parse_sse(lines))
        assert got[0] == "8" and got[1] == "step"


def test_heartbeats_keep_a_quiet_stream_alive_and_the_end_closes_it(
    serve_api: Callable[..., Server], readers: Callable[..., Reader]
) -> None:
    bus = EventBus()
    srv = serve_api(bus, heartbeat_s=0.1)
    quiet = readers(srv.url)
    wait_for("three keepalive comments", lambda: quiet.comments >= 4)  # + the opening one
    assert quiet.items == []
    bus.close()
    quiet.wait("the end event", lambda items: bool(items) and items[-1]["kind"] == "end")
    quiet.thread.join(30)
    assert not quiet.thread.is_alive()  # the server ended the stream


def test_a_stalled_http_reader_does_not_block_publishing_and_gets_a_gap(
    serve_api: Callable[..., Server],
) -> None:
    bus = EventBus(buffer=200, queue=16)
    srv = serve_api(bus, heartbeat_s=60)
    payload = "x" * 4096
    with (
        httpx.Client(base_url=srv.url, trust_env=False, timeout=60) as c,
        c.stream("GET", "/v1/events") as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("retry:")  # subscribed; now it reads nothing
        done = threading.Event()

        def publish() -> None:
            for i in range(4000):  # ~16 MiB: more than the sockets buffer
                bus.publish("step", n=i, pad=payload)
            done.set()

        threading.Thread(target=publish, daemon=True).start()
        assert done.wait(120), "publishing waited on a reader that does not read"
        last = bus.last_id
        got: list[tuple[str | None, str, dict[str, Any]]] = []
        for event_id, kind, data in parse_sse(lines):
            got.append((event_id, kind, json.loads(data)))
            if event_id == str(last):
                break
    numbers = [int(i) for i, _k, _d in got if i is not None]
    assert numbers == sorted(set(numbers)) and numbers[-1] == last
    gaps = [d["data"] for _i, k, d in got if k == "gap"]
    assert gaps, "the reader fell behind further than the ring, yet no gap said so"
    for gap in gaps:  # after each gap the stream goes on at the id it names
        idx = next(n for n, (_i, k, d) in enumerate(got) if k == "gap" and d["data"] == gap)
        assert got[idx + 1][0] == str(gap["first"])
        assert gap["missed"] == gap["first"] - gap["after"] - 1
    assert len(numbers) + sum(g["missed"] for g in gaps) == last  # nothing lost unsaid


def test_the_client_reconnects_with_the_last_id_after_the_server_went_away(
    idle: Controller,
) -> None:
    bus = EventBus()
    srv = Server(idle, bus, heartbeat_s=0.2)
    srv.start()
    seen: list[dict[str, Any]] = []
    reconnects: list[str] = []
    stop = threading.Event()

    def on_item(item: dict[str, Any]) -> bool:
        seen.append(item)
        return not stop.is_set() and item.get("data", {}).get("n") != "last"

    follower = threading.Thread(
        target=follow_events,
        args=(srv.url, on_item),
        kwargs={"on_reconnect": reconnects.append, "retry_s": 0.2, "read_timeout_s": 5.0},
        daemon=True,
    )
    try:
        follower.start()
        wait_for("the follower", lambda: bus.subscribers() == 1)
        for n in range(3):
            bus.publish("step", n=n)
        wait_for("three events", lambda: len(seen) == 3)
        srv.stop()  # the connection drops; the bus goes on
        for n in range(3, 6):
            bus.publish("step", n=n)
        srv.start()  # the same port
        wait_for("the missed events", lambda: len(seen) == 6)
        bus.publish("step", n="last")
        follower.join(30)
        assert not follower.is_alive()
    finally:
        stop.set()
        srv.stop()
    assert [i["id"] for i in seen] == list(range(1, 8))  # none twice, none missed
    assert reconnects and all(
        "dropped" in r or "nothing answers" in r or "stopped" in r for r in reconnects
    )


def test_vramctl_events_without_a_loop_fails_clearly() -> None:
    out = vramctl("events", "--api", f"127.0.0.1:{free_port()}", "--count", "1")
    assert out.returncode == 1
    assert "no vramctl run answers" in out.stderr and "start `vramctl run`" in out.stderr
    out = vramctl("events", "--api", "nowhere", "--count", "1")
    assert out.returncode == 1 and "expected HOST:PORT" in out.stderr


# ── vramctl run over real containers ─────────────────────────────────────────


@pytest.fixture(scope="module")
def live(
    docker_client: docker.DockerClient, test_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    lv = Live(docker_client, test_image, tmp_path_factory.mktemp("events"))
    try:
        lv.create("res", running=True)
        lv.create("omni", running=True)
        lv.create("llm", running=False)
        lv.create("big", running=False)
        lv.create("alt", running=False, port="res")
        lv.create("off", running=False)
        lv.start()
        yield lv
    finally:
        lv.close()


def transitions(
    items: list[dict[str, Any]], serve: str, after: int = 0
) -> list[tuple[str, str, str]]:
    return [
        (i["data"]["from"], i["data"]["to"], i["data"]["trigger"])
        for i in items
        if i["kind"] == "lifecycle" and i["data"]["serve"] == serve and i["id"] > after
    ]


def first(items: list[dict[str, Any]], kind: str, after: int = 0, **data: Any) -> dict[str, Any]:
    return next(
        i
        for i in items
        if i["kind"] == kind
        and i["id"] > after
        and all(i["data"].get(k) == v for k, v in data.items())
    )


@pytest.mark.docker
def test_an_eviction_and_its_undo_arrive_in_order_on_the_stream(
    live: Live, readers: Callable[..., Reader]
) -> None:
    lv = live
    lv.converged(res="running", omni="running", llm="down")
    wait_for("the loop to see it", lambda: lv.committed() == 7000)
    anonymous = readers(lv.url)
    operator = readers(lv.url, Authorization=f"Bearer {TOKEN}")
    r = lv.post("/v1/serves/llm/up", {"ttl_s": 300})
    assert r.status_code == 202, r.text
    up = [
        ("stopped", "reserved", "reserve"),
        ("reserved", "starting", "start"),
        ("starting", "running", "ready"),
    ]
    stop = [("running", "stopping", "stop"), ("stopping", "stopped", "stopped")]
    anonymous.wait("llm running", lambda items: transitions(items, "llm") == up)
    assert transitions(anonymous.items, "omni") == stop
    lv.converged(llm="running", omni="down")
    # its lifecycle moves to running as await_ready ends, just before that step's own
    # event is published: wait for the step's event, not only the move
    anonymous.wait(
        "llm's await_ready step",
        lambda items: any(
            i["kind"] == "step"
            and (i["data"]["action"], i["data"]["serve"]) == ("await_ready", "llm")
            for i in items
        ),
    )
    items = anonymous.events()
    numbers = [i["id"] for i in items]
    assert numbers == sorted(set(numbers)), "ids must increase"
    admitted = first(items, "request.admitted", serve="llm")
    begun = first(items, "plan.begun", admitted["id"])
    assert [(s["action"], s["serve"]) for s in begun["data"]["steps"]][:2] == [
        ("stop", "omni"),
        ("release", "omni"),
    ]
    cycle = begun["data"]["cycle"]
    moves = [i for i in items if i["kind"] == "lifecycle"]
    assert all(i["data"]["cycle"] == cycle and i["id"] > begun["id"] for i in moves)
    # the victim is stopped and released before the requester is reserved
    released = first(items, "lifecycle", serve="omni", to="stopped")
    assert released["id"] < first(items, "lifecycle", serve="llm", to="reserved")["id"]
    # each step's outcome; the ledger as it moved: omni's 4000 out, llm's 5000 in
    steps = [
        (i["data"]["action"], i["data"]["serve"], i["data"]["outcome"])
        for i in items
        if i["kind"] == "step"
    ]
    assert ("stop", "omni", "ok") in steps and ("await_ready", "llm", "ok") in steps
    committed = [
        i["data"]["committed_mib"] for i in items if i["kind"] == "ledger" and i["id"] > begun["id"]
    ]
    assert committed[:2] == [3000, 8000], committed
    ended = first(items, "plan.ended", begun["id"], cycle=cycle)
    assert ended["data"]["ok"] is True
    # without the token a step's free text is withheld; with it, it is there
    step_anon = first(items, "step", serve="omni", action="stop")
    assert step_anon["data"]["detail"] is None and step_anon["withheld"] == ["detail"]
    operator.wait("the same step", lambda got: any(g["id"] == step_anon["id"] for g in got))
    step_full = next(g for g in operator.items if g["id"] == step_anon["id"])
    assert "exited" in step_full["data"]["detail"]

    # a reader that comes back with the id of the plan gets exactly what followed it
    seen_until = items[-1]["id"]
    resumed = readers(lv.url, Last_Event_ID=str(begun["id"]))
    resumed.wait("the replay", lambda got: any(g.get("id") == seen_until for g in got))
    replay = [g["id"] for g in resumed.items if g.get("id") is not None and g["id"] <= seen_until]
    assert replay == [i["id"] for i in items if i["id"] > begun["id"]]
    assert resumed.items[0]["kind"] != "gap"
    # an id this controller never issued (before it started) is a gap, said so
    stale = readers(lv.url, Last_Event_ID="1")
    stale.wait("the gap", bool)
    assert stale.items[0]["kind"] == "gap" and stale.items[0]["data"]["missed"] is None

    # vramctl events replays the same from --since, one JSON line each
    out = vramctl(
        "events", "--api", lv.address, "--since", str(begun["id"]), "--count", "4", "--json"
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [x["id"] for x in lines] == [i["id"] for i in items if i["id"] > begun["id"]][:4]
    text = vramctl("events", "--api", lv.address, "--since", str(begun["id"]), "--count", "3")
    assert text.returncode == 0, text.stderr
    assert len(text.stdout.splitlines()) == 3
    assert "lifecycle: omni running -> stopping (stop)" in text.stdout

    # the undo: down ends the request, llm stops, omni comes back
    mark = items[-1]["id"]
    assert lv.post("/v1/serves/llm/down").status_code == 202
    back = [
        ("stopped", "reserved", "reserve"),
        ("reserved", "starting", "start"),
        ("starting", "running", "ready"),
    ]
    anonymous.wait("omni back", lambda got: transitions(got, "omni", mark) == back)
    assert transitions(anonymous.items, "llm", mark) == stop
    lv.converged(llm="down", omni="running")
    later = [i for i in anonymous.events() if i["id"] > mark]
    assert later[0]["kind"] == "request.ended" and later[0]["data"]["serve"] == "llm"
    assert (
        first(later, "lifecycle", serve="llm", to="stopped")["id"]
        < first(later, "lifecycle", serve="omni", to="reserved")["id"]
    )
    wait_for("the request closed", lambda: lv.serves()["llm"]["request"] is None)
    anonymous.wait("request.closed", lambda got: any(g["kind"] == "request.closed" for g in got))
    numbers = [i["id"] for i in anonymous.events()]
    assert numbers == sorted(set(numbers))


@pytest.mark.docker
def test_a_refused_request_is_on_the_stream_with_its_message_withheld(
    live: Live, readers: Callable[..., Reader]
) -> None:
    lv = live
    anonymous = readers(lv.url)
    r = lv.post("/v1/serves/big/up", {"ttl_s": 60})
    assert r.status_code == 429
    anonymous.wait("the refusal", lambda got: any(g["kind"] == "request.refused" for g in got))
    refused = first(anonymous.items, "request.refused", serve="big")
    assert refused["data"]["status"] == 429 and refused["data"]["message"] is None
    assert refused["data"]["retry_after_s"] == 1 and refused["withheld"] == ["message"]
    # nothing was stopped for it (decided before any cycle, on the last observation)
    assert not any(g["kind"] == "lifecycle" for g in anonymous.items)


def test_the_documented_kinds_are_exactly_the_kinds_published() -> None:
    from controller.interfaces.stream import SSE_EVENT_SCHEMA
    from controller.service.events import KINDS

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text[text.index("### Event stream") :]
    documented = set(re.findall(r"^\| `([a-z.]+)` \|", section, flags=re.MULTILINE))
    assert documented == {*KINDS, "gap", "end"}
    assert set(SSE_EVENT_SCHEMA["properties"]["event"]["enum"]) == documented


@pytest.mark.docker
def test_a_stop_ends_the_stream_and_after_a_restart_old_ids_read_as_a_gap(
    live: Live, readers: Callable[..., Reader]
) -> None:
    lv = live
    reader = readers(lv.url)
    assert lv.post("/v1/serves/big/up", {"ttl_s": 60}).status_code == 429
    reader.wait("the refusal", lambda got: any(g["kind"] == "request.refused" for g in got))
    old = reader.events()[-1]["id"]
    assert lv.stop() == 0
    reader.wait("the end event", lambda got: got[-1]["kind"] == "end")
    reader.thread.join(30)
    assert not reader.thread.is_alive()  # the stream ended with the controller
    lv.start()
    again = readers(lv.url, Last_Event_ID=str(old))
    again.wait("the gap", bool)
    gap = again.items[0]
    assert gap["kind"] == "gap" and gap["data"]["after"] == old
    assert gap["data"]["missed"] is None and gap["data"]["first"] > old
    assert "not issued by this controller" in gap["data"]["reason"]
    later = [g["id"] for g in again.items[1:] if g["kind"] != "end"]
    assert all(i >= gap["data"]["first"] for i in later)
