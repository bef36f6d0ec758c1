"""Smoke test of the real Docker set-up the other docker tests rely on.

A busybox ``httpd`` in the test image, on host networking and a free loopback
port, serves a file from a bind-mounted folder; it answers over HTTP, and a
plain ``docker stop`` ends it promptly (``init=True`` forwards SIGTERM).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from docker.models.containers import Container
from support.serving import free_port
from support.waiting import WAIT_S

BusyboxFactory = Callable[..., Container]


def _get(url: str, deadline_s: float) -> bytes:
    """GET ``url``, retrying until it answers or ``deadline_s`` seconds pass."""
    deadline = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                body: bytes = response.read()
                return body
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last_error = exc
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {deadline_s}s: {last_error!r}")


@pytest.mark.docker
def test_busybox_httpd_container_serves_then_stops(
    busybox_container: BusyboxFactory, tmp_path: Path
) -> None:
    www = tmp_path / "www"
    www.mkdir()
    (www / "health").write_text("ok from vramctl-test\n")
    www.chmod(0o755)
    port = free_port()

    container = busybox_container(
        ["httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", "/www"],
        volumes={str(www): {"bind": "/www", "mode": "ro"}},
    )
    container.reload()
    assert container.status == "running", container.logs().decode(errors="replace")

    body = _get(f"http://127.0.0.1:{port}/health", deadline_s=WAIT_S)
    assert body == b"ok from vramctl-test\n"

    started = time.monotonic()
    container.stop(timeout=10)
    stop_s = time.monotonic() - started
    container.reload()
    assert container.status == "exited"
    # With an init as PID 1 the SIGTERM reaches httpd: no 10 s wait for SIGKILL.
    assert stop_s < 5, f"docker stop took {stop_s:.1f}s; is init=True in effect?"
