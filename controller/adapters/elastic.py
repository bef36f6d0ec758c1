"""Elastic VRAM adapter: ask an engine to give VRAM back, or to take it again.

An engine started with ``--vram-elastic`` (docs/protocols.md "Elastic VRAM",
docs/design.md §6) keeps ``reserve_mib`` MiB free on its card by shrinking its expert cache::

    POST {url}/v1/vram          Content-Type: application/json
    {"reserve_mib": N}          (N ≥ 0; null = the reserve the engine started with)

and starts a fresh engine with ``POST {url}/v1/unload`` then ``POST {url}/v1/load``.

:class:`ElasticClient` makes those calls with httpx and returns an
:class:`ElasticAnswer` for every HTTP answer: 200 (``status`` ``"ok"`` or
``"not loaded"`` and the figures), 409 ``model_busy`` (returned at once: the engine
already waited for its running request, so "later" means a later cycle), and
400/503 and the rest, returned at once with the engine's message. How long it waits
for an answer is bounded (``timeout_s``, 20 s by default: the engine may hold a resize
up to 300 s before it answers 409, and the loop must not wait with it). Only a
request that got no answer raises ``ElasticError(transient=True)``; it is retried
inside the call only when it cannot have reached the engine (the connection was
refused), since a request that reached it may still run.

:func:`elastic_ok` is the pure verdict of docs/design.md §6 on whether a call *ran* (only a
200 with ``status: "ok"``), with the figures in words. Whether memory came back is
not for the card-wide ``vram_free_mib`` to say (it counts what every program on the
card holds, including room another serve reserved but has not used yet):
:attr:`ElasticAnswer.given_back_mib` is what the engine's own cache says it gave
back (``expert_cache_full_mib - expert_cache_mib``).

The client is synchronous (the executor calls it from a worker thread), sends no
``Origin`` (the engine refuses a foreign one with 403) and ignores proxy environment
variables. The engine's server forgets the reserve when it restarts: remembering what
was asked, and asking again, is the executor's job.

This module must not decide anything (whether to shrink, by how much, what to count,
or when to reload a model) and must not be called by anything but the executor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import retry_if_exception_type

from controller.adapters.http_client import (
    CONNECT_FAULTS,
    NO_ANSWER_FAULTS,
    HttpAdapter,
    bounded_timeout,
    endpoint,
    json_or_none,
)
from controller.adapters.retry import AdapterError, attempts_of, exhausted

__all__ = [
    "LOAD_PATH",
    "RESIZE_FAILURE_MARKERS",
    "UNLOAD_PATH",
    "VRAM_PATH",
    "ElasticAnswer",
    "ElasticClient",
    "ElasticError",
    "elastic_ok",
]

VRAM_PATH = "/v1/vram"
UNLOAD_PATH = "/v1/unload"
LOAD_PATH = "/v1/load"

#: Phrases of the engine's 400 after a resize that failed half-way: the cache table
#: can no longer be trusted and the model should be unloaded and loaded again.
RESIZE_FAILURE_MARKERS = (
    "refused to release an expert-cache segment",
    "refilling the cache failed",
)

#: Faults after which the request cannot have reached the engine: retried in the call.
_RETRY_TRANSPORT = CONNECT_FAULTS
#: Faults after which it may have: no answer, not retried (the engine may still run it).
_NO_ANSWER = NO_ANSWER_FAULTS
_CONNECT_TIMEOUT_S = 10.0
_ERROR_TEXT_CHARS = 300


class ElasticError(AdapterError):
    """No answer came: the engine was unreachable, or did not answer in time.

    Whether a request that timed out ran is unknown: the engine may have taken it
    (and may still run it after the client stopped waiting).
    """


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
    def needs_model_reload(self) -> bool:
        """What docs/design.md §6 answers with unload/reload: a 503, or a failed resize."""
        return self.http_status == 503 or self.resize_failed

    @property
    def ok(self) -> bool:
        """A 200 with ``status: "ok"``: the call ran (the figures say what it did)."""
        return self.http_status == 200 and self.status == "ok"

    @property
    def given_back_mib(self) -> int | None:
        """What the engine's own cache gives back now, whole: full minus current size.

        This, not the card-wide ``vram_free_mib``, says what the engine holds: with the
        serve's reservation at most its full use, it holds at most the reservation minus
        this. ``None`` when the answer does not report both cache figures.
        """
        if not self.ok or self.expert_cache_mib is None or self.expert_cache_full_mib is None:
            return None
        return max(0, self.expert_cache_full_mib - self.expert_cache_mib)

    @property
    def cache_whole(self) -> bool | None:
        """Whether the expert cache is at its full size again (``None``: not reported)."""
        if self.expert_cache_mib is None or self.expert_cache_full_mib is None:
            return None
        return self.expert_cache_mib >= self.expert_cache_full_mib


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
    body = json_or_none(response)
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


class ElasticClient(HttpAdapter):
    """Calls engines' ``POST /v1/vram`` (and ``/v1/unload``, ``/v1/load``) for the executor.

    ``timeout_s`` bounds how long a call waits for the engine's answer (default 20 s:
    the engine may wait up to 300 s for a running request before its 409, and the loop
    is not to be held that long; no answer is "not proven" and asked again on a later
    cycle); ``load_timeout_s`` bounds a ``/v1/load``, which starts an engine.
    ``attempts`` and ``max_wait_s`` bound the retries of a connection that could not be
    made (backoff sleeps start at ``initial_wait_s`` and double). ``transport``
    replaces httpx's network transport in tests. Use it as a context manager or call
    :meth:`close`.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 20,
        load_timeout_s: float = 300,
        attempts: int = 3,
        max_wait_s: float = 10,
        initial_wait_s: float = 1.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, not {timeout_s}")
        if load_timeout_s <= 0:
            raise ValueError(f"load_timeout_s must be > 0, not {load_timeout_s}")
        self.set_retry_knobs(
            attempts=attempts, max_wait_s=max_wait_s, initial_wait_s=initial_wait_s
        )
        self.timeout_s = float(timeout_s)
        self.load_timeout_s = float(load_timeout_s)
        self.open_http(
            transport=transport, timeout=bounded_timeout(self.timeout_s, _CONNECT_TIMEOUT_S)
        )

    def set_reserve(
        self, url: str, reserve_mib: int | None, *, token: str | None = None
    ) -> ElasticAnswer:
        """``POST {url}/v1/vram {"reserve_mib": reserve_mib}``; the engine's answer.

        ``reserve_mib`` is the free VRAM (MiB) to leave on the card: a whole number
        ≥ 0, or ``None`` for the engine's start-up reserve (grow back). Returns an
        :class:`ElasticAnswer` for any HTTP answer (a 409 included); raises
        :class:`ElasticError` only when no answer came.
        """
        if reserve_mib is not None and (
            isinstance(reserve_mib, bool) or not isinstance(reserve_mib, int) or reserve_mib < 0
        ):
            raise ValueError(f"reserve_mib must be a whole number ≥ 0 or None, not {reserve_mib!r}")
        content = json.dumps({"reserve_mib": reserve_mib}).encode()
        return self._post(url, VRAM_PATH, content, token, self.timeout_s)

    def unload(self, url: str, *, token: str | None = None) -> ElasticAnswer:
        """``POST {url}/v1/unload``: the engine frees the model (its cache table too)."""
        return self._post(url, UNLOAD_PATH, b"{}", token, self.timeout_s)

    def load(self, url: str, *, token: str | None = None) -> ElasticAnswer:
        """``POST {url}/v1/load``: a fresh engine (it re-applies the last reserve asked)."""
        return self._post(url, LOAD_PATH, b"{}", token, self.load_timeout_s)

    def _post(
        self, url: str, path: str, content: bytes, token: str | None, timeout_s: float
    ) -> ElasticAnswer:
        target = endpoint(url, path)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        timeout = bounded_timeout(timeout_s, _CONNECT_TIMEOUT_S)

        def attempt() -> httpx.Response:
            return self._http.post(target, content=content, headers=headers, timeout=timeout)

        retrying = self.bounded(retry_if_exception_type(_RETRY_TRANSPORT))
        try:
            response = retrying(attempt)
        except _RETRY_TRANSPORT as exc:
            raise exhausted(
                ElasticError,
                retrying,
                "POST {target}: unreachable after {n} attempts: {fault}",
                target=target,
                fault=f"{type(exc).__name__}: {exc}",
            ) from exc
        except _NO_ANSWER as exc:
            raise ElasticError(
                f"POST {target}: no answer within {timeout_s:g}s: {type(exc).__name__}: {exc}",
                transient=True,
                attempts=attempts_of(retrying),
            ) from exc
        except httpx.HTTPError as exc:  # a malformed URL, an unsupported scheme…
            raise ElasticError(
                f"POST {target}: {type(exc).__name__}: {exc}", transient=False
            ) from exc
        return _answer(response, attempts_of(retrying))


def elastic_ok(answer: ElasticAnswer, reserve_mib: int | None) -> tuple[bool, str]:
    """Whether a ``/v1/vram`` call ran (docs/design.md §6), and what it reports, in words (pure).

    Only a 200 with ``status: "ok"`` is a call that ran. Its figures are put in words:
    ``vram_free_mib`` against ``reserve_mib`` (the engine may end a segment short of the
    reserve, or at its floor, and the figure counts the whole card, so it proves
    nothing about the engine) and the expert cache against its full size, which is
    what the caller judges the engine by (:attr:`ElasticAnswer.given_back_mib`).
    Everything else is ``False`` with the reason: ``"not loaded"``, ``"busy (409)"``,
    ``"engine refused (400): …"``, ``"resize failed, reload the model (400): …"``,
    ``"engine unavailable (503): …"``.
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
    else:
        cache = ", no expert-cache figures"
    if reserve_mib is None:
        whole = answer.cache_whole
        note = "" if whole is not False else " (cache not whole: no VRAM for more segments)"
        return True, f"ok: grown back, vram_free_mib {free}{cache}{note}"
    if free is None:
        return True, f"ok: no vram_free_mib (reserve_mib {reserve_mib}){cache}"
    cmp = ">=" if free >= reserve_mib else "<"
    return True, f"ok: vram_free_mib {free} {cmp} reserve_mib {reserve_mib}{cache}"
