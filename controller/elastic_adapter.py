"""Elastic VRAM adapter: ask an engine to give VRAM back, or to take it again.

An engine started with ``--vram-elastic`` (``../shared/seeds/vram-elastic-reserve-api.txt``,
DESIGN §6) keeps ``reserve_mib`` MiB free on its card by shrinking its expert cache::

    POST {url}/v1/vram          Content-Type: application/json
    {"reserve_mib": N}          (N ≥ 0; null = the reserve the engine started with)

:class:`ElasticClient` makes that call with httpx and returns an
:class:`ElasticAnswer` for every HTTP answer: 200 (``status`` ``"ok"`` or
``"not loaded"`` and the figures), 409 ``model_busy`` (retried with backoff, bounded
in attempts and time, and returned as a 409 answer when the engine stays busy), and
400/503 and the rest, returned at once with the engine's message: whether to
unload and reload is the caller's decision. Only a transport fault (the engine
unreachable, or no answer within ``timeout_s``) raises, as
``ElasticError(transient=True)`` once its retries run out.

:func:`elastic_ok` is the pure verdict of DESIGN §6: only a 200 with
``status: "ok"`` is a call that ran, and for a shrink only
``vram_free_mib >= reserve_mib`` proves the memory came back (partial success is a
200 too).

The client is synchronous (the executor calls it from a worker thread) and ignores
proxy environment variables. The engine forgets the reserve when its server
restarts: remembering what was asked, and asking again, is the executor's job.

This module must not decide anything (whether to shrink, by how much, or what to do
about a refusal), must not unload or load a model, and must not be called by
anything but the executor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
)

from controller.retry import AdapterError, RetryKnobs, attempts_of, backoff_wait

__all__ = [
    "RESIZE_FAILURE_MARKERS",
    "VRAM_PATH",
    "ElasticAnswer",
    "ElasticClient",
    "ElasticError",
    "elastic_ok",
]

VRAM_PATH = "/v1/vram"

#: Phrases of the engine's 400 after a resize that failed half-way: the cache table
#: can no longer be trusted and the model should be unloaded and loaded again.
RESIZE_FAILURE_MARKERS = (
    "refused to release an expert-cache segment",
    "refilling the cache failed",
)

_RETRY_TRANSPORT: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
)
_CONNECT_TIMEOUT_S = 10.0
_ERROR_TEXT_CHARS = 300


class ElasticError(AdapterError):
    """The engine could not be asked at all."""


@dataclass(frozen=True, slots=True)
class ElasticAnswer:
    """One answer of ``POST /v1/vram``.

    ``http_status`` is the final HTTP status; ``status`` is the body's ``status``
    of a 200 (``"ok"``, ``"not loaded"``). The figures are the engine's, measured
    after the call, or ``None`` when the answer has none. ``error`` is the engine's
    message of a non-200 answer; ``raw`` the whole JSON body; ``attempts`` the number
    of requests made (more than one after 409s or transport faults).
    """

    http_status: int
    status: str | None = None
    reserve_mib: int | None = None
    vram_free_mib: int | None = None
    expert_cache_mib: int | None = None
    expert_cache_full_mib: int | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1

    @property
    def busy(self) -> bool:
        """409: a request was still running or queued; ask again later."""
        return self.http_status == 409

    @property
    def resize_failed(self) -> bool:
        """A 400 saying the resize failed half-way (the seed's two failure paths)."""
        text = (self.error or "").lower()
        return self.http_status == 400 and any(m in text for m in RESIZE_FAILURE_MARKERS)

    @property
    def needs_reload(self) -> bool:
        """What DESIGN §6 answers with unload/reload: a 503, or a failed resize."""
        return self.http_status == 503 or self.resize_failed

    @property
    def cache_whole(self) -> bool | None:
        """Whether the expert cache is at its full size again (``None``: not reported)."""
        if self.expert_cache_mib is None or self.expert_cache_full_mib is None:
            return None
        return self.expert_cache_mib >= self.expert_cache_full_mib


class _BusyError(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _error_text(body: Any, response: httpx.Response) -> str:
    """The engine's message: OpenAI-style ``{"error": {"message", "type"}}`` or text."""
    parts: list[str] = []
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping):
            for key in ("message", "type", "code"):
                value = err.get(key)
                if isinstance(value, str) and value.strip():
                    parts.append(value.strip())
        elif isinstance(err, str) and err.strip():
            parts.append(err.strip())
        for key in ("message", "detail"):
            value = body.get(key)
            if isinstance(value, str) and value.strip():
                parts.append(value.strip())
    text = " | ".join(dict.fromkeys(parts)) if parts else response.text.strip()
    return (text or response.reason_phrase or "no body")[:_ERROR_TEXT_CHARS]


def _answer(response: httpx.Response, attempts: int) -> ElasticAnswer:
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    raw: dict[str, Any] = dict(body) if isinstance(body, Mapping) else {}
    code = response.status_code
    if code == 200 and raw:
        status = raw.get("status")
        return ElasticAnswer(
            http_status=code,
            status=status if isinstance(status, str) else None,
            reserve_mib=_int(raw.get("reserve_mib")),
            vram_free_mib=_int(raw.get("vram_free_mib")),
            expert_cache_mib=_int(raw.get("expert_cache_mib")),
            expert_cache_full_mib=_int(raw.get("expert_cache_full_mib")),
            raw=raw,
            attempts=attempts,
        )
    return ElasticAnswer(
        http_status=code,
        error=_error_text(body, response),
        raw=raw,
        attempts=attempts,
    )


class ElasticClient(RetryKnobs):
    """Calls engines' ``POST /v1/vram`` for the executor.

    ``timeout_s`` bounds each request (an engine may take a while: it waits for a
    running request before it resizes); ``attempts`` and ``max_wait_s`` bound the
    retries of 409 and of transport faults (no retry starts after ``max_wait_s``
    seconds; backoff sleeps start at ``initial_wait_s`` and double). ``transport``
    replaces httpx's network transport in tests. Use it as a context manager or call
    :meth:`close`.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 150,
        attempts: int = 5,
        max_wait_s: float = 60,
        initial_wait_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, not {timeout_s}")
        self.set_retry_knobs(
            attempts=attempts, max_wait_s=max_wait_s, initial_wait_s=initial_wait_s
        )
        self.timeout_s = float(timeout_s)
        self._http = httpx.Client(
            timeout=httpx.Timeout(self.timeout_s, connect=min(_CONNECT_TIMEOUT_S, self.timeout_s)),
            transport=transport,
            trust_env=False,
            follow_redirects=False,
        )

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> ElasticClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_reserve(
        self, url: str, reserve_mib: int | None, *, token: str | None = None
    ) -> ElasticAnswer:
        """``POST {url}/v1/vram {"reserve_mib": reserve_mib}``; the engine's answer.

        ``reserve_mib`` is the free VRAM (MiB) to leave on the card: a whole number
        ≥ 0, or ``None`` for the engine's start-up reserve (grow back). Returns an
        :class:`ElasticAnswer` for any HTTP answer (judge it with
        :func:`elastic_ok`); raises :class:`ElasticError` only when no answer came.
        """
        if reserve_mib is not None and (
            isinstance(reserve_mib, bool) or not isinstance(reserve_mib, int) or reserve_mib < 0
        ):
            raise ValueError(f"reserve_mib must be a whole number ≥ 0 or None, not {reserve_mib!r}")
        target = url.rstrip("/") + VRAM_PATH
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        content = json.dumps({"reserve_mib": reserve_mib}).encode()

        def attempt() -> httpx.Response:
            response = self._http.post(target, content=content, headers=headers)
            if response.status_code == 409:
                raise _BusyError(response)
            return response

        retrying = Retrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_wait_s),
            wait=backoff_wait(self.initial_wait_s, self.max_wait_s),
            retry=retry_if_exception_type((_BusyError, *_RETRY_TRANSPORT)),
            reraise=True,
        )
        try:
            response = retrying(attempt)
        except _BusyError as exc:
            return _answer(exc.response, attempts_of(retrying))
        except _RETRY_TRANSPORT as exc:
            tries = attempts_of(retrying)
            raise ElasticError(
                f"POST {target}: no answer after {tries} attempts: {type(exc).__name__}: {exc}",
                transient=True,
                attempts=tries,
            ) from exc
        except httpx.HTTPError as exc:  # a malformed URL, an unsupported scheme…
            raise ElasticError(
                f"POST {target}: {type(exc).__name__}: {exc}", transient=False
            ) from exc
        return _answer(response, attempts_of(retrying))


def elastic_ok(answer: ElasticAnswer, reserve_mib: int | None) -> tuple[bool, str]:
    """Whether a ``/v1/vram`` call did what was asked (DESIGN §6), and why (pure).

    Only a 200 with ``status: "ok"`` is a call that ran. For a shrink
    (``reserve_mib`` not ``None``) only ``vram_free_mib >= reserve_mib`` proves the
    memory came back; a grow-back (``None``) succeeds with any ``ok`` (the text says
    whether the cache is whole again). Everything else is ``False`` with the reason:
    ``"not loaded"``, ``"busy (409)"``, ``"engine refused (400): …"``,
    ``"engine unavailable (503): …"``, ``"partial: vram_free_mib 6000 < reserve_mib 8000"``.
    """
    code = answer.http_status
    if code == 409:
        return False, f"busy (409): {answer.error or 'model_busy'}"
    if code == 400:
        kind = "resize failed, reload the model" if answer.resize_failed else "engine refused"
        return False, f"{kind} (400): {answer.error or 'invalid_request_error'}"
    if code == 503:
        return False, f"engine unavailable (503): {answer.error or 'server_error'}"
    if code != 200:
        return False, f"HTTP {code}: {answer.error or 'no message'}"
    if answer.status == "not loaded":
        return False, "not loaded: the reserve applies when the model loads"
    if answer.status != "ok":
        return False, f"unexpected status {answer.status!r} in a 200 answer"
    free = answer.vram_free_mib
    cache = ""
    if answer.expert_cache_mib is not None and answer.expert_cache_full_mib is not None:
        cache = f", expert cache {answer.expert_cache_mib}/{answer.expert_cache_full_mib} MiB"
    if reserve_mib is None:
        whole = answer.cache_whole
        note = "" if whole is not False else " (cache not whole: no VRAM for more segments)"
        return True, f"ok: grown back, vram_free_mib {free}{cache}{note}"
    if free is None:
        return False, "ok answer without vram_free_mib: cannot prove the memory came back"
    if free < reserve_mib:
        return False, f"partial: vram_free_mib {free} < reserve_mib {reserve_mib}{cache}"
    return True, f"ok: vram_free_mib {free} >= reserve_mib {reserve_mib}{cache}"
