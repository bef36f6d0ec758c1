"""The health probe against real loopback servers, with proxies in the environment.

A probe of a serve's own loopback port must go straight to it: a proxy named by
``HTTP_PROXY`` / ``ALL_PROXY`` (common on hosts behind a corporate proxy) would
answer for a port where nothing listens, and declare a dead serve healthy.
"""

from __future__ import annotations

import pytest
from fake_http import FakeHTTPServer, Recorded, Reply
from support.serving import free_port

from controller.adapters.health import http_ready


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"])
def test_a_proxy_in_the_environment_never_answers_for_the_serve(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with FakeHTTPServer(lambda _: Reply(200, "proxied ok")) as proxy:
        monkeypatch.setenv(variable, f"http://127.0.0.1:{proxy.port}")
        nothing_there = free_port()
        assert not http_ready(f"http://127.0.0.1:{nothing_there}/health", timeout_s=5)
        assert proxy.calls == []  # the proxy was never asked


def test_the_probe_goes_straight_to_the_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    def serve(request: Recorded) -> Reply:
        return Reply(204 if request.path == "/health" else 404, "")

    with (
        FakeHTTPServer(lambda _: Reply(503, "proxy says no")) as proxy,
        FakeHTTPServer(serve) as server,
    ):
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        assert http_ready(f"http://127.0.0.1:{server.port}/health", timeout_s=5)
        assert not http_ready(f"http://127.0.0.1:{server.port}/other", timeout_s=5)
        assert proxy.calls == [] and [c.path for c in server.calls] == ["/health", "/other"]
