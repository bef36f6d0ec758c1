"""Health probe adapter: ``GET http://127.0.0.1:{port}{health}`` answering 2xx.

One short HTTP request per call, through httpx, straight to the serve: the
environment's proxy settings (``HTTP_PROXY``, ``ALL_PROXY``, ...) and ``.netrc`` are
ignored (``trust_env=False``), since a proxy would answer for a port where nothing
listens and declare a dead serve healthy. It must not retry, wait or decide: the
executor polls it within the serve's ``start_timeout_s``.
"""

from __future__ import annotations

import httpx


def http_ready(url: str, *, timeout_s: float = 2.0) -> bool:
    """True when ``url`` answers 2xx now, asked directly; any error or other status is False."""
    try:
        response = httpx.get(url, timeout=timeout_s, follow_redirects=False, trust_env=False)
    except httpx.HTTPError:
        return False
    return 200 <= response.status_code < 300
