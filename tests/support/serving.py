"""Helpers for tests that run serve containers: a free loopback port and a health path.

A serve in these tests is a busybox container (the FROM scratch test image) running
``httpd`` on the host's loopback, answering ``GET /health``.
"""

from __future__ import annotations

import os
import random
import socket

#: test ports come from below the kernel's ephemeral range (32768-60999 by default):
#: a port the kernel hands out with ``bind(0)`` can be taken, moments later, as the
#: source port of any outgoing loopback connection (the controller's own requests to
#: a test router or a health path), and the preflight then rightly finds it in use
_PORTS = (20000, 32000)
_handed: set[int] = set()


def _worker_slice() -> range:
    """This pytest-xdist worker's share of the test port range (all of it unparallel)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (_PORTS[1] - _PORTS[0]) // max(count, 1)
    start = _PORTS[0] + index * width
    return range(start, start + width)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, never handed out before in this process.

    Drawn at random from this worker's slice of a range outside the ephemeral ports,
    so neither another worker nor an outgoing connection takes it before its serve
    binds it.
    """
    ports = _worker_slice()
    for _ in range(200):
        port = random.choice(ports)
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port
    raise RuntimeError(f"no free test port in {ports.start}-{ports.stop - 1}")


def httpd(port: int, *, delay_s: int = 0) -> list[str]:
    """Serve /health on loopback; with ``delay_s``, only after sleeping that long."""
    pre = f"sleep {delay_s}; " if delay_s else ""
    return [
        "sh",
        "-c",
        f"{pre}mkdir -p /www && echo ok > /www/health && exec httpd -f -p 127.0.0.1:{port} -h /www",
    ]
