"""Health probe adapter: ``GET http://127.0.0.1:{port}{health}`` answering 2xx.

One short HTTP request per call, through httpx, straight to the serve: the
environment's proxy settings (``HTTP_PROXY``, ``ALL_PROXY``, ...) and ``.netrc`` are
ignored (``trust_env=False``), since a proxy would answer for a port where nothing
listens and declare a dead serve healthy. It must not retry, wait or decide: the
executor polls it within the serve's ``start_timeout_s``; :class:`HealthProber` asks
every running serve once per observation, concurrently (what ``status`` and the page
show in their health column).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import httpx

#: most concurrent probes of one observation
MAX_WORKERS = 8


def http_ready(url: str, *, timeout_s: float = 2.0) -> bool:
    """True when ``url`` answers 2xx now, asked directly; any error or other status is False.

    Through one client kept for the process (made on the first call): a new client
    loads its TLS context, about 20 ms, which a start awaiting its health path would
    otherwise pay on every poll."""
    return _ok(_SHARED.client(), url, timeout_s)


class _LazyClient:
    """One httpx client, made on first use (thread-safe: httpx clients are)."""

    def __init__(self) -> None:
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(trust_env=False, follow_redirects=False)
            return self._client


_SHARED = _LazyClient()


def warm() -> None:
    """Make :func:`http_ready`'s client now, before a start awaits its first poll."""
    _SHARED.client()


class HealthProber:
    """Asks many health URLs at once, concurrently, with one HTTP client kept from call
    to call (made on the first call with a URL: a client loads its TLS context, more
    than a loop's probes cost; closed by :meth:`close`). Thread-safe; never raises."""

    def __init__(self, *, timeout_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __call__(self, urls: Mapping[str, str]) -> dict[str, bool]:
        """Each name's URL asked once: True when it answered 2xx now."""
        if not urls:
            return {}
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(trust_env=False, follow_redirects=False)
            client = self._client
        workers = min(MAX_WORKERS, len(urls))
        with ThreadPoolExecutor(workers, thread_name_prefix="probe") as pool:
            futures = {n: pool.submit(_ok, client, url, self.timeout_s) for n, url in urls.items()}
            return {name: fut.result() for name, fut in futures.items()}

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _ok(client: httpx.Client, url: str, timeout_s: float) -> bool:
    try:
        response = client.get(url, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return 200 <= response.status_code < 300
