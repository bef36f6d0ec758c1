"""The in-flight reader against real HTTP servers: each engine's metrics page, the router.

Every page is served by :class:`fake_http.FakeEngineMetrics` (the metric names and
labels the engines write); the router tier's state by a plain fake server answering as
the real router does (``{"tiers": [{"tier_id", "state", "active_requests", ...}]}``,
400 ``invalid_transition`` for a tier it does not know). An unknown count is ``None``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from fake_http import (
    MANAGEMENT_SLOTS,
    FakeEngineMetrics,
    FakeHTTPServer,
    FakeRouter,
    Recorded,
    Reply,
)

from controller.adapters.engine_metrics import (
    MAX_ROUTER_READS,
    ROUTER_BUDGET_TIMEOUTS,
    InFlightReading,
    InFlightSources,
    engine_kind,
    parse_in_flight,
    read_all,
    read_metrics,
    read_router_tier,
)
from statemachine.domain.types import InFlightSource

ENGINES = ["vllm", "sglang", "llamacpp"]


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_page_reads_running_plus_waiting(engine: str) -> None:
    with FakeEngineMetrics(engine) as page, httpx.Client() as client:
        page.set(3, 2)
        got = read_metrics(client, page.metrics_url, engine)
        assert (got.count, got.source, got.error) == (5, InFlightSource.METRICS, None)
        page.set(0, 0)
        assert read_metrics(client, page.metrics_url, engine).count == 0
        # without the engine named, the page's own metrics tell which it is
        page.set(1, 0)
        assert read_metrics(client, page.metrics_url, None).count == 1


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_series_is_summed(engine: str) -> None:
    with FakeEngineMetrics(engine, models=("m1", "m2", "m3")) as page, httpx.Client() as c:
        page.set(2, 1)
        assert read_metrics(c, page.metrics_url, engine).count == 9


def test_the_real_pages_parse() -> None:
    vllm = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0\n'
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 4.0\n'
    )
    assert parse_in_flight(vllm, "vllm") == 7
    llama = (
        "# HELP llamacpp:requests_processing Number of requests processing.\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        "llamacpp:requests_processing 1\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        "llamacpp:requests_deferred 0\n"
    )
    assert parse_in_flight(llama, "llamacpp") == 1
    assert parse_in_flight(llama, None) == 1


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        pytest.param("", "vllm", id="empty"),
        pytest.param("vllm:num_requests_running 1\n", "vllm", id="waiting-missing"),
        pytest.param("other_metric 3\n", None, id="no-known-engine"),
        pytest.param("vllm:num_requests_running{ 1\n", "vllm", id="malformed"),
        pytest.param(
            "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n", "vllm", id="nan"
        ),
        pytest.param(
            "vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n", "vllm", id="negative"
        ),
        pytest.param(
            "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n", "vllm", id="other-engine"
        ),
    ],
)
def test_a_page_without_the_count_is_unknown_never_0(text: str, engine: str | None) -> None:
    assert parse_in_flight(text, engine) is None


def test_an_unreachable_or_failing_page_is_unknown() -> None:
    with FakeEngineMetrics("vllm") as page, httpx.Client() as client:
        page.fail(503)
        got = read_metrics(client, page.metrics_url, "vllm")
        assert got.count is None and got.source is InFlightSource.METRICS
        assert "HTTP 503" in (got.error or "")
        url = page.metrics_url
    gone = read_metrics(httpx.Client(), url, "vllm", timeout_s=0.5)
    assert gone.count is None and gone.error


def test_a_slow_page_is_unknown_within_the_timeout() -> None:
    release = threading.Event()

    def slow(_req: Recorded) -> Reply:
        release.wait(30)
        return Reply(200, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    with FakeHTTPServer(slow) as server, httpx.Client() as client:
        t0 = time.monotonic()
        got = read_metrics(client, server.url + "/metrics", "vllm", timeout_s=0.3)
        took = time.monotonic() - t0
        release.set()
    assert got.count is None and "Timeout" in (got.error or "")
    assert took < 20.0  # bounded by the timeout (0.3 s), not by the page (30 s)


def _router(tiers: dict[str, int | None]) -> FakeHTTPServer:
    def handler(req: Recorded) -> Reply:
        if req.path != "/v1/admin/transition" or req.method != "GET":
            return Reply(404, {"error": "not_found"})
        if req.bearer != "tok":
            return Reply(401, {"error": "unauthorized"})
        tier = req.query.get("tier_id")
        if tier not in tiers:
            return Reply(400, {"error": "invalid_transition", "detail": f"unknown tier {tier}"})
        row = {"tier_id": tier, "state": "admitting", "reason": None, "draining": False}
        row |= {"ready": True, "active_requests": tiers[tier]}
        return Reply(200, {"tiers": [row]})

    return FakeHTTPServer(handler)


def test_the_router_tier_gives_active_requests() -> None:
    with _router({"t1": 4, "t0": 0, "tnull": None}) as router, httpx.Client() as client:
        got = read_router_tier(client, router.url, "t1", "tok")
        assert (got.count, got.source) == (4, InFlightSource.ROUTER)
        assert read_router_tier(client, router.url, "t0", "tok").count == 0
        assert read_router_tier(client, router.url, "tnull", "tok").count is None
        unknown = read_router_tier(client, router.url, "typo", "tok")
        assert unknown.count is None and "HTTP 400" in (unknown.error or "")
        assert read_router_tier(client, router.url, "t1", "wrong").count is None
        assert router.calls[0].query == {"tier_id": "t1"}


def test_read_all_prefers_the_engine_then_the_router_and_reads_concurrently() -> None:
    release = threading.Event()

    def slow(_req: Recorded) -> Reply:
        release.wait(30)
        return Reply(503, "")

    with (
        FakeEngineMetrics("sglang") as eng,
        _router({"t": 2}) as router,
        FakeHTTPServer(slow) as hung1,
        FakeHTTPServer(slow) as hung2,
    ):
        eng.set(1, 1)
        sources = {
            "engine": InFlightSources(eng.metrics_url, "sglang", router.url, "t", "tok"),
            "router-only": InFlightSources(None, None, router.url, "t", "tok"),
            "engine-down": InFlightSources(hung1.url + "/metrics", "vllm", router.url, "t", "tok"),
            "both-down": InFlightSources(hung2.url + "/metrics", "vllm"),
            "none": InFlightSources(),
        }
        t0 = time.monotonic()
        got = read_all(sources, timeout_s=0.5)
        took = time.monotonic() - t0
        release.set()
    assert got["engine"].count == 2 and got["engine"].source is InFlightSource.METRICS
    assert got["router-only"].count == 2 and got["router-only"].source is InFlightSource.ROUTER
    assert got["engine-down"].count == 2 and got["engine-down"].source is InFlightSource.ROUTER
    assert got["both-down"].count is None and got["both-down"].source is InFlightSource.METRICS
    assert got["none"].count is None and got["none"].source is None
    assert took < 20.0  # bounded by the timeouts, not by the pages (30 s)


ROUTER_ONLY = {f"tier-{i}": i for i in range(8)}  # eight router-only serves, tier -> count


def _router_only(router: FakeRouter) -> dict[str, InFlightSources]:
    for tier, count in ROUTER_ONLY.items():
        router.set_active(tier, count)
    return {t: InFlightSources(None, None, router.url, t, "tok") for t in ROUTER_ONLY}


def test_router_reads_stay_within_the_routers_management_slots() -> None:
    """The router serves four management requests at once and refuses a fifth: eight
    router-only serves are read without ever asking it for more than two at once (a
    slot left for the controller's own drain and one for an operator's)."""
    with FakeRouter("tok", tiers=ROUTER_ONLY, status_delay_s=0.1) as router:
        got = read_all(_router_only(router))
        assert {n: r.count for n, r in got.items()} == ROUTER_ONLY
        assert all(r.source is InFlightSource.ROUTER for r in got.values())
        assert router.management_peak == MAX_ROUTER_READS < MANAGEMENT_SLOTS
        assert router.busy_refusals == 0


def test_a_router_out_of_slots_is_asked_again_within_the_budget() -> None:
    """With three of the router's four slots taken by others (a drain, an operator), a
    read it refuses with 503 server_busy is asked again: every count is still known."""
    with FakeRouter("tok", tiers=ROUTER_ONLY, status_delay_s=0.05) as router:
        sources = _router_only(router)
        with router.hold_slots(MANAGEMENT_SLOTS - 1):
            got = read_all(sources)
        assert router.busy_refusals > 0  # the fifth request was refused ...
        assert {n: r.count for n, r in got.items()} == ROUTER_ONLY  # ... and asked again


def test_a_router_that_stays_busy_is_unknown_within_the_budget() -> None:
    """A router with no slot free for the whole budget gives unknown, saying why, after
    about three timeouts (not one per serve): the reads that had their turn name the busy
    answers, the others that their turn never came."""
    with FakeRouter("tok", tiers=ROUTER_ONLY) as router:
        sources = _router_only(router)
        with router.hold_slots(MANAGEMENT_SLOTS):
            t0 = time.monotonic()
            got = read_all(sources, timeout_s=0.3)
            took = time.monotonic() - t0
    assert all(r.count is None for r in got.values())
    errors = [r.error or "" for r in got.values()]
    busy = "still HTTP 503 server_busy when its 0.6 s were up"
    assert sum(busy in e for e in errors) >= MAX_ROUTER_READS
    assert all(busy in e or "no turn within 0.6 s" in e for e in errors)
    assert took < (ROUTER_BUDGET_TIMEOUTS + 1) * 0.3 + 5.0  # bounded by the budget


@pytest.mark.parametrize(
    ("label", "kind"),
    [
        ("vLLM", "vllm"),
        ("sglang", "sglang"),
        ("llama.cpp", "llamacpp"),
        ("tgi", None),
        (None, None),
    ],
)
def test_engine_labels(label: str | None, kind: str | None) -> None:
    assert engine_kind(label) == kind


# ----- the tracker: since when each serve has been idle -----------------------------------
def test_the_tracker_keeps_idle_since_and_busy_at() -> None:
    from controller.service.inflight import InFlightTracker

    clock = [100.0]
    tracker = InFlightTracker(clock=lambda: clock[0], timeout_s=0.5)
    with FakeEngineMetrics("vllm") as page:
        src = {"od": InFlightSources(page.metrics_url, "vllm"), "off": InFlightSources()}
        page.set(0)
        first = tracker.read(src, running={"od", "off"})
        assert first["od"].count == 0 and first["od"].idle_since == 100.0
        assert first["off"].count is None and first["off"].source is None
        clock[0] = 130.0
        assert tracker.read(src, running={"od"})["od"].idle_since == 100.0  # still idle
        page.set(2, 1)
        clock[0] = 140.0
        busy = tracker.read(src, running={"od"})["od"]
        assert (busy.count, busy.idle_since, busy.busy_at) == (3, None, 140.0)
        page.set(0)
        clock[0] = 150.0
        again = tracker.read(src, running={"od"})["od"]
        assert (again.idle_since, again.busy_at) == (150.0, 140.0)
        page.fail()
        clock[0] = 160.0
        lost = tracker.read(src, running={"od"})["od"]
        assert (lost.count, lost.idle_since, lost.busy_at) == (None, None, 140.0)
        page.set(0)
        clock[0] = 170.0
        # idleness counts only across readings that all said 0
        assert tracker.read(src, running={"od"})["od"].idle_since == 170.0
        # a serve that is not running is listed with its source, unread; "off" has none
        stopped = tracker.read(src, running=set())
        assert set(stopped) == {"od"}
        assert (stopped["od"].count, stopped["od"].source) == (None, InFlightSource.METRICS)
        assert (stopped["od"].idle_since, stopped["od"].busy_at) == (None, None)
        # and when it runs again it starts afresh
        clock[0] = 180.0
        fresh = tracker.read(src, running={"od"})["od"]
        assert (fresh.idle_since, fresh.busy_at) == (180.0, None)


def test_a_sleepers_idleness_starts_afresh_when_it_is_woken(
    tmp_path: Path,
) -> None:
    # asleep, its idleness says nothing of its run since a request: once woken it is
    # counted from its first reading awake, as a serve that has just started; that
    # reading is its wake (woke_at), kept while it stays awake, whatever it reads
    from controller.manifest import load_manifest_set
    from controller.service.inflight import InFlightTracker, observe_in_flight
    from controller.snapshot import parse_snapshot

    path = tmp_path / "serves.toml"
    path.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 20000\n\n'
        '[[serve]]\nname = "od"\ncontainer = "c-od"\ngpu_role = "a"\nvram_mib = 5000\n'
        'residency = "on-demand"\nport = 21002\nengine = "vllm"\n'
        "[serve.sleep]\nlevel = 2\nresidual_mib = 1000\n"
    )
    mset = load_manifest_set([path])

    counts: list[int | None] = [0]

    def reader(wanted: Mapping[str, InFlightSources]) -> dict[str, InFlightReading]:
        return {n: InFlightReading(counts[0], InFlightSource.METRICS) for n in wanted}

    clock = [100.0]
    tracker = InFlightTracker(clock=lambda: clock[0], reader=reader)
    running = {"docker": "ok", "containers": {"c-od": {"state": "running"}}, "gpus": None}
    first = observe_in_flight(parse_snapshot(running), mset, tracker)["od"]
    assert (first.idle_since, first.woke_at) == (100.0, None)  # never seen asleep
    clock[0] = 200.0
    asleep = parse_snapshot({**running, "sleep": {"od": {"state": "asleep", "level": 2}}})
    seen = observe_in_flight(asleep, mset, tracker)["od"]  # read: asleep, it serves nothing
    assert (seen.count, seen.idle_since, seen.busy_at, seen.woke_at) == (0, None, None, None)
    clock[0] = 900.0  # woken
    woken = observe_in_flight(parse_snapshot(running), mset, tracker)["od"]
    assert (woken.idle_since, woken.woke_at) == (900.0, 900.0)
    counts[0], clock[0] = None, 950.0  # its metrics unreadable a moment: the wake stays
    unknown = observe_in_flight(parse_snapshot(running), mset, tracker)["od"]
    assert (unknown.count, unknown.idle_since, unknown.woke_at) == (None, None, 900.0)
    stopped = {"docker": "ok", "containers": {"c-od": {"state": "exited"}}, "gpus": None}
    observe_in_flight(parse_snapshot(asleep.model_dump()), mset, tracker)
    observe_in_flight(parse_snapshot(stopped), mset, tracker)
    counts[0], clock[0] = 0, 990.0  # stopped asleep, then started: a start, not a wake
    again = observe_in_flight(parse_snapshot(running), mset, tracker)["od"]
    assert (again.idle_since, again.woke_at) == (990.0, None)


def test_the_tracker_counts_a_use_each_time_a_serve_goes_busy() -> None:
    """Each stretch of readings above 0 is one use, at its first reading; a 0 or an
    unknown reading ends the stretch; the uses outlive a stop (statemachine/planning/reuse.py)."""
    from controller.service.inflight import InFlightTracker

    counts: list[int | None] = []
    clock = [0.0]

    def reader(wanted: Mapping[str, InFlightSources]) -> dict[str, InFlightReading]:
        return {n: InFlightReading(counts[-1], InFlightSource.METRICS) for n in wanted}

    tracker = InFlightTracker(clock=lambda: clock[0], reader=reader, log_changes=False)
    src = {"od": InFlightSources("http://127.0.0.1:9/metrics", "vllm")}
    for at, count, running in [
        (1.0, 0, True),
        (2.0, 2, True),  # a use at 2
        (3.0, 5, True),  # the same stretch
        (4.0, 0, True),
        (5.0, 1, True),  # a use at 5
        (6.0, None, True),  # unknown: the stretch ends
        (7.0, 1, True),  # a use at 7
        (8.0, 1, False),  # stopped: not read, its uses kept
        (9.0, 3, True),  # running again, busy: a use at 9
    ]:
        clock[0] = at
        counts.append(count)
        tracker.read(src, running={"od"} if running else set())
    assert tracker.uses() == {"od": (2.0, 5.0, 7.0, 9.0)}
