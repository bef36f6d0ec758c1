"""End to end: engine metrics drive victim choice and measured idleness on the real daemon.

``vramctl run`` runs as a subprocess (as in tests/e2e/test_run_e2e.py, whose fleet, waits
and budget checks this file reuses) with its HTTP API on a free loopback port; each
serve's engine metrics are a :class:`fake_http.FakeEngineMetrics` page named by the
serve's ``metrics_url``. The tests set the counts and look at Docker and at
``GET /v1/serves``, never at the controller's memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
import test_run_e2e
from fake_http import FakeEngineMetrics
from support.serving import free_port
from support.waiting import wait_for
from test_run_e2e import (
    REPO,
    RESYNC_S,
    ROLE,
    Fleet,
    Run,
    _env,
    healthy,
    serve_toml,
)

pytestmark = pytest.mark.docker

fleet = test_run_e2e.fleet  # the fixture: the test's containers, manifest and controllers


def start_with_api(fleet: Fleet) -> tuple[Run, httpx.Client]:
    """``vramctl run`` with its API on a free port (read-only GETs need no token)."""
    port = free_port()
    log = fleet.tmp / f"run{len(fleet.runs) + 1}.log"
    argv = [sys.executable, "-m", "controller.interfaces.cli", "run", "-m", str(fleet.manifest)]
    argv += ["--state-dir", str(fleet.state_dir), "--resync", str(RESYNC_S), "--log-json"]
    argv += ["--api", f"127.0.0.1:{port}"]
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=_env(), cwd=REPO)
    run = Run(proc, log)
    fleet.runs.append(run)
    run.started()
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0)

    def answering() -> bool:
        try:
            return bool(http.get("/healthz").json()["cycles"] >= 1)
        except httpx.HTTPError:
            return False

    wait_for("the API's first cycle", answering)
    return run, http


def serve_row(http: httpx.Client, serve: str) -> dict[str, Any]:
    data = http.get("/v1/serves").json()
    row: dict[str, Any] = next(r for r in data["serves"] if r["serve"] == serve)
    row["observed_at"] = data["observed_at"]
    return row


def metrics(url: str) -> str:
    return f'metrics_url = "{url}"'


def test_of_two_evictable_victims_the_idle_one_is_evicted(fleet: Fleet) -> None:
    ports = {"a": free_port(), "b": free_port(), "big": free_port()}
    with FakeEngineMetrics("vllm") as page_a, FakeEngineMetrics("sglang") as page_b:
        page_a.set(2, 1)  # a is busy
        page_b.set(0, 0)  # b is idle
        # a starts first: without the busy rule a (the least recently started, and
        # first by name) would be the victim
        fleet.container("a", port=ports["a"], mib=4000, running=True)
        wait_for("a up", lambda: healthy(ports["a"]))
        fleet.container("b", port=ports["b"], mib=4000, running=True)
        fleet.container("big", port=ports["big"], mib=5000, running=False)
        fleet.write(
            ROLE
            + serve_toml(
                "a",
                mib=4000,
                residency="evictable",
                port=ports["a"],
                desired="running",
                extra=metrics(page_a.metrics_url),
            )
            + serve_toml(
                "b",
                mib=4000,
                residency="evictable",
                port=ports["b"],
                desired="running",
                extra=metrics(page_b.metrics_url),
            )
            + serve_toml("big", mib=5000, residency="on-demand", port=ports["big"])
        )
        wait_for("b up", lambda: healthy(ports["b"]))
        fleet.request("big")
        run = fleet.start().started()
        run.wait_step("big await_ready ok")
        assert fleet.states() == {"a": "running", "b": "exited", "big": "running"}
        stops = [s for s in run.steps() if " stop " in s]
        assert stops == ["b stop ok"], run.steps()
        assert page_a.calls and page_b.calls  # both pages were read
        fleet.assert_never_overcommitted()
        assert run.stop() == 0, run.text()


IDLE_TTL_S = 3.0


def test_an_on_demand_serve_stops_after_measured_idleness_and_not_while_busy(
    fleet: Fleet,
) -> None:
    port = free_port()
    with FakeEngineMetrics("llamacpp") as page:
        page.set(1, 0)  # busy from the start
        fleet.container("od", port=port, mib=4000, running=False)
        fleet.write(
            ROLE
            + serve_toml(
                "od",
                mib=4000,
                residency="on-demand",
                port=port,
                extra=f"idle_ttl_s = {IDLE_TTL_S}\n" + metrics(page.metrics_url),
            )
        )
        fleet.request("od")  # no TTL of its own: idle_ttl_s applies
        requested = time.time()
        run, http = start_with_api(fleet)
        run.wait_step("od await_ready ok")

        # busy: the loop observes it well past the request's TTL and leaves it running
        def busy_past_the_ttl() -> dict[str, Any] | None:
            row = serve_row(http, "od")
            past = (row["observed_at"] or 0) > requested + 2 * IDLE_TTL_S + RESYNC_S
            return row if past and row["in_flight"] == 1 else None

        row = wait_for("od observed busy past its TTL", busy_past_the_ttl)
        assert fleet.state("od") == "running"
        assert row["in_flight_source"] == "metrics"
        assert row["request"]["ttl_basis"] == "measured"
        assert row["request"]["expires_at"] is None  # not while busy
        assert row["ttl_basis"] == "measured"

        # idle: it stops idle_ttl_s after the first reading of 0, not before
        page.set(0, 0)
        idle_from = time.time()
        idle = wait_for(
            "od seen idle", lambda: (r := serve_row(http, "od"))["in_flight"] == 0 and r
        )
        assert idle["idle_since"] is not None and idle["idle_since"] >= idle_from - 0.01
        assert idle["request"]["ttl_basis"] == "measured"
        assert idle["request"]["expires_at"] == pytest.approx(idle["idle_since"] + IDLE_TTL_S)
        fleet.wait_state("od", "exited")
        stopped = time.time()
        assert stopped - idle_from >= IDLE_TTL_S  # never sooner than the idleness measured
        reasons = [
            st["reason"]
            for c in fleet.cycles()
            for st in c.plan["steps"]
            if st["action"] == "stop" and st["serve"] == "od"
        ]
        assert reasons == [f"od has had no request in flight for {IDLE_TTL_S:g}s (idle_ttl_s)"]
        fleet.assert_never_overcommitted()
        assert run.stop() == 0, run.text()


def test_without_a_source_the_ttl_counts_from_the_request_and_status_says_so(
    fleet: Fleet,
) -> None:
    ports = {"plain": free_port(), "dark": free_port()}
    dead = free_port()  # nothing listens there: the source exists, its count is unknown
    fleet.container("plain", port=ports["plain"], mib=2000, running=False)
    fleet.container("dark", port=ports["dark"], mib=2000, running=False)

    def manifest(ttl: float) -> str:
        return (
            ROLE
            + serve_toml(
                "plain",
                mib=2000,
                residency="on-demand",
                port=ports["plain"],
                extra=f"idle_ttl_s = {ttl}",
            )
            + serve_toml(
                "dark",
                mib=2000,
                residency="on-demand",
                port=ports["dark"],
                extra=f"idle_ttl_s = {ttl}\n" + metrics(f"http://127.0.0.1:{dead}/metrics"),
            )
        )

    # no clock decides the checks while both run: the TTL outlasts any slow start, and an
    # edit shortens it once they are done (then it has ended, counted from the request)
    ttl = 3600.0
    fleet.write(manifest(ttl))
    fleet.request("plain")
    fleet.request("dark")
    run, http = start_with_api(fleet)
    run.wait_step("plain await_ready ok")
    run.wait_step("dark await_ready ok")

    def both_running_rows() -> tuple[dict[str, Any], dict[str, Any]] | None:
        plain, dark = serve_row(http, "plain"), serve_row(http, "dark")
        if plain["state"] != "running" or dark["state"] != "running":
            return None
        # an observation taken while the loop had not yet learnt that a start ended still
        # lists the serve as starting: its request is "pending" (it ends on no clock) until
        # the next one
        if "pending" in (dark["ttl_basis"], dark["request"]["ttl_basis"]):
            return None
        return plain, dark

    plain, dark = wait_for("both observed running", both_running_rows)
    assert plain["in_flight"] is None and plain["in_flight_source"] is None  # unknown, not 0
    assert plain["ttl_basis"] == "request" and plain["request"]["ttl_basis"] == "request"
    assert dark["in_flight"] is None and dark["in_flight_source"] == "metrics"
    assert dark["ttl_basis"] == "unknown" and dark["request"]["ttl_basis"] == "unknown"
    with_request = plain["request"]
    assert with_request["expires_at"] == pytest.approx(with_request["requested_at"] + ttl)
    assert with_request["ttl_s"] == ttl

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller.interfaces.cli",
            "status",
            "--json",
            "-m",
            str(fleet.manifest),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["serve"]: row for row in json.loads(r.stdout)["serves"]}
    # a one-shot status reads the sources itself: what the TTL counts from, whatever
    # the containers' states by the time it ran
    assert rows["plain"]["in_flight_source"] is None and rows["plain"]["in_flight"] is None
    assert rows["plain"]["ttl_basis"] == "request"
    assert rows["dark"]["in_flight_source"] == "metrics" and rows["dark"]["in_flight"] is None
    assert rows["dark"]["ttl_basis"] == "unknown"

    # both end by the TTL from the request (never seen busy): as before idleness existed.
    # Edited to 1 s, it has ended for both: the requests were made before the run began
    fleet.write(manifest(1.0))
    fleet.wait_state("plain", "exited")
    fleet.wait_state("dark", "exited")
    # each stop names the request's TTL, not idleness: neither was ever measured idle
    for name in ("plain", "dark"):
        reasons = [
            st["reason"]
            for c in fleet.cycles()
            for st in c.plan["steps"]
            if st["action"] == "stop" and st["serve"] == name
        ]
        assert reasons == [f"the on-demand request for {name} expired (TTL)"], reasons
    fleet.assert_never_overcommitted()
    assert run.stop() == 0, run.text()
