"""What the HTTP adapters share: one httpx client's set-up and life, and reading answers.

:class:`HttpAdapter` is the base of the adapters that talk HTTP to a peer (elastic,
sleep, router): it keeps the retry bounds (:class:`~controller.adapters.retry.RetryKnobs`),
opens one synchronous ``httpx.Client`` that ignores proxy environment variables and
follows no redirect, and closes it (``close`` or a ``with`` block).
:func:`bounded_timeout` is a call's timeout with its connect phase capped;
:func:`json_or_none` an answer's JSON body, or ``None`` when it has none;
:func:`endpoint` a peer's base URL joined with a path; :data:`CONNECT_FAULTS` and
:data:`NO_ANSWER_FAULTS` the two families of transport faults the adapters tell apart.

This module must not decide anything (what to call, what an answer means, whether to
retry a given fault: each adapter says that) and makes no request of its own.
"""

from __future__ import annotations

import json
from typing import Any, Self

import httpx

from controller.adapters.retry import RetryKnobs

__all__ = [
    "CONNECT_FAULTS",
    "NO_ANSWER_FAULTS",
    "HttpAdapter",
    "bounded_timeout",
    "endpoint",
    "json_or_none",
]

#: Faults after which the request cannot have reached the peer (no connection was made).
CONNECT_FAULTS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)
#: Faults after which no answer came (a refused or reset connection, a timeout, a broken
#: answer): the request may have reached the peer.
NO_ANSWER_FAULTS: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
)


class HttpAdapter(RetryKnobs):
    """An adapter with one HTTP client (``self._http``) and retry bounds.

    Subclasses call :meth:`open_http` once in their ``__init__`` (after checking their
    own arguments). Use it as a context manager or call :meth:`close`.
    """

    _http: httpx.Client

    def open_http(self, *, transport: httpx.BaseTransport | None, **options: Any) -> None:
        """Open the client: no proxy from the environment, no redirect followed.

        ``transport`` replaces httpx's network transport in tests; ``options`` are
        passed to ``httpx.Client`` (``base_url``, ``headers``, ``timeout``).
        """
        self._http = httpx.Client(
            transport=transport, trust_env=False, follow_redirects=False, **options
        )

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bounded_timeout(timeout_s: float, connect_cap_s: float) -> httpx.Timeout:
    """``timeout_s`` for the whole call, at most ``connect_cap_s`` of it to connect."""
    return httpx.Timeout(timeout_s, connect=min(connect_cap_s, timeout_s))


def json_or_none(response: httpx.Response) -> Any:
    """The answer's JSON body; ``None`` when the body is not JSON."""
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return None


def endpoint(url: str, path: str) -> str:
    """``url`` (with or without a trailing slash) joined with ``path``."""
    return url.rstrip("/") + path
