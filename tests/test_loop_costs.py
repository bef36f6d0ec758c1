"""What a cycle of the loop does *not* do: the work it must not repeat for nothing.

A converged loop runs a cycle every resync and on every Docker event of its
containers; a manifest edit runs one before its first Docker call. Work that cycle
repeats without need shows up as idle CPU and as reaction time, so these tests pin
it down by counting (never by timing): connections made, clients built.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fake_http import FakeEngineMetrics

from controller.adapters import engine_metrics
from controller.adapters.engine_metrics import InFlightSources, read_all
from controller.service.inflight import InFlightTracker


class _CountingClient(httpx.Client):
    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> type[_CountingClient]:
    """Counts the HTTP clients the in-flight reader builds (each loads a TLS context)."""
    _CountingClient.made = 0
    monkeypatch.setattr(engine_metrics.httpx, "Client", _CountingClient)
    return _CountingClient


def test_no_source_no_http_client(clients: type[_CountingClient]) -> None:
    """Serves without a metrics page or a router tier are not read: no client is built."""
    got = read_all({"a": InFlightSources(), "b": InFlightSources()})
    assert {n: (r.count, r.source) for n, r in got.items()} == {
        "a": (None, None),
        "b": (None, None),
    }
    assert clients.made == 0
    tracker = InFlightTracker()
    for _ in range(3):
        tracker.read({"a": InFlightSources()}, running={"a"})
    assert clients.made == 0
    tracker.close()


def test_the_tracker_keeps_one_client_across_observations(
    clients: type[_CountingClient],
) -> None:
    """Every observation reads the counts; the HTTP client is built once, not per cycle."""
    tracker = InFlightTracker(timeout_s=2.0)
    with FakeEngineMetrics("vllm") as page:
        page.set(1, 2)
        src = {"od": InFlightSources(page.metrics_url, "vllm")}
        for _ in range(4):
            assert tracker.read(src, running={"od"})["od"].count == 3
        assert len(page.calls) == 4
    assert clients.made == 1
    tracker.close()
    tracker.close()  # closing twice is harmless
