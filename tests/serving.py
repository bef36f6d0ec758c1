"""Helpers for tests that run serve containers: a free loopback port and a health path.

A serve in these tests is a busybox container (the FROM scratch test image) running
``httpd`` on the host's loopback, answering ``GET /health``.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def httpd(port: int, *, delay_s: int = 0) -> list[str]:
    """Serve /health on loopback; with ``delay_s``, only after sleeping that long."""
    pre = f"sleep {delay_s}; " if delay_s else ""
    return [
        "sh",
        "-c",
        f"{pre}mkdir -p /www && echo ok > /www/health && exec httpd -f -p 127.0.0.1:{port} -h /www",
    ]
