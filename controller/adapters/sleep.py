"""Sleep adapter: ask an engine (vLLM, SGLang) to give its memory back without exiting.

What is called for each protocol is its engine's ``sleep`` entry in
:mod:`statemachine.engines` (paths, query, body, the ``is_sleeping`` path or none); this
module only makes the calls. The built-in protocols (docs/protocols.md "Sleep and wake"):

- **vLLM** (started with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``):
  ``POST {url}/sleep?level=1|2`` (level 1 moves the weights to host RAM and drops the
  KV cache, level 2 drops both), ``POST {url}/wake_up?tags=weights`` then
  ``?tags=kv_cache``, ``GET {url}/is_sleeping`` → ``{"is_sleeping": bool}``. After a
  level-2 wake the weights must be loaded again: ``POST {url}/collective_rpc
  {"method": "reload_weights"}`` (between the two wakes, as vLLM's own example does),
  then ``POST {url}/reset_prefix_cache``. Without the dev-mode variable the endpoints
  do not exist: 404.
- **SGLang** (started with ``--enable-memory-saver``): ``POST
  {url}/release_memory_occupation`` and ``POST {url}/resume_memory_occupation`` with
  ``{"tags": ["kv_cache", "weights"]}``. A release while requests run is refused (400,
  "…only when server is idle"). SGLang has no endpoint that says whether it sleeps:
  :meth:`SleepClient.is_sleeping` answers ``None`` for it.

Either engine may answer before its memory is actually freed: whether it was is for
the executor to see on the device. A 404 means the engine was not started with the
flag (:class:`SleepNotEnabledError`); any other non-2xx raises :class:`SleepError` with the
engine's own message. Only a request that cannot have reached the engine (the
connection refused) is retried inside a call, and ``GET /is_sleeping`` (read only) on
any transport fault too; every call waits a bounded time for its answer.

The client is synchronous (the executor calls it from its thread) and ignores proxy
environment variables. This module must not decide anything (whether to sleep, what
to count, when to give up) and must be called only by the executor and the observation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Unpack

import httpx
from tenacity import retry_if_exception_type

from controller.adapters.http_client import (
    CONNECT_FAULTS,
    HttpAdapter,
    bounded_timeout,
    endpoint,
    json_or_none,
)
from controller.adapters.retry import AdapterError, Fault, attempts_of
from statemachine import engines
from statemachine.engines import HttpCall, SleepApi

__all__ = [
    "SleepClient",
    "SleepError",
    "SleepNotEnabledError",
]

_RETRY_CONNECT = CONNECT_FAULTS
_RETRY_READ: tuple[type[Exception], ...] = (httpx.TransportError,)
_CONNECT_TIMEOUT_S = 5.0
_TEXT_CHARS = 300


class SleepError(AdapterError):
    """The engine did not do what was asked: no answer, or an answer that says no.

    ``busy`` is set when the engine refused because requests still run (SGLang's
    release): trying again later may work.
    """

    def __init__(self, message: str, *, busy: bool = False, **fault: Unpack[Fault]) -> None:
        super().__init__(message, **fault)
        self.busy = busy


class SleepNotEnabledError(SleepError):
    """The engine answered 404: it was not started with its sleep flag."""


def _text(response: httpx.Response) -> str:
    """The engine's own message: FastAPI's ``detail``, SGLang's ``error.message``, or text."""
    body = json_or_none(response)
    if body is None:
        return response.text.strip()[:_TEXT_CHARS] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message") is not None:
            return str(err["message"])[:_TEXT_CHARS]
        if body.get("detail") is not None:
            return str(body["detail"])[:_TEXT_CHARS]
        if body.get("message") is not None:
            return str(body["message"])[:_TEXT_CHARS]
    return json.dumps(body)[:_TEXT_CHARS]


class SleepClient(HttpAdapter):
    """Puts engines to sleep and wakes them (any engine with a sleep API), bounded and retried.

    ``timeout_s`` bounds each sleep call and ``GET /is_sleeping`` (``probe_timeout_s``);
    a wake is given the time the caller passes (its ``start_timeout_s``). ``attempts``,
    ``max_wait_s`` and ``initial_wait_s`` bound the retries of a connection that could
    not be made. ``transport`` replaces httpx's network transport in tests.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 60.0,
        probe_timeout_s: float = 2.0,
        attempts: int = 3,
        max_wait_s: float = 5.0,
        initial_wait_s: float = 0.25,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if timeout_s <= 0 or probe_timeout_s <= 0:
            raise ValueError("timeout_s and probe_timeout_s must be > 0")
        self.set_retry_knobs(
            attempts=attempts, max_wait_s=max_wait_s, initial_wait_s=initial_wait_s
        )
        self.timeout_s = float(timeout_s)
        self.probe_timeout_s = float(probe_timeout_s)
        self.open_http(transport=transport)

    # ── the calls ────────────────────────────────────────────────────────────

    def sleep(self, url: str, protocol: str, level: int) -> str:
        """Put the engine to sleep; what was sent, in words. Raises :class:`SleepError`."""
        api = _api(protocol)
        if level not in (1, 2):
            raise ValueError(f"level must be 1 or 2, not {level!r}")
        return self._call(url, api.sleep, level=level)

    def wake(self, url: str, protocol: str, *, timeout_s: float) -> list[str]:
        """Wake the engine; the calls made, in order. Raises :class:`SleepError` at the
        first that fails. After a level-2 sleep of an engine that drops its weights
        they are garbage until :meth:`reload`."""
        api = _api(protocol)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, not {timeout_s}")
        return [self._call(url, call, timeout_s=timeout_s) for call in api.wake]

    def reload(self, url: str, protocol: str, *, timeout_s: float) -> list[str]:
        """After a level-2 wake: load the weights again and reset what depends on them
        (vLLM: ``reload_weights``, then the prefix cache); the calls made. An engine
        that keeps its weights (SGLang) has none: nothing."""
        api = _api(protocol)
        return [self._call(url, call, timeout_s=timeout_s) for call in api.reload]

    def is_sleeping(self, url: str, protocol: str) -> bool | None:
        """Whether the engine says it sleeps; ``None`` when it cannot say (SGLang has no
        such call: no request is made).

        Raises :class:`SleepError` when it cannot be asked, or answers something else.
        """
        api = _api(protocol)
        if api.is_sleeping is None:
            return None
        target = endpoint(url, api.is_sleeping)
        response = self._send(
            lambda t: self._http.get(target, timeout=t),
            f"GET {target}",
            self.probe_timeout_s,
            _RETRY_READ,
        )
        body = json_or_none(response)
        key = api.is_sleeping_key
        value = body.get(key) if isinstance(body, dict) else None
        if not isinstance(value, bool):
            raise SleepError(
                f"GET {target}: answer has no boolean {key}: {response.text[:_TEXT_CHARS]!r}",
                transient=False,
                status=response.status_code,
            )
        return value

    # ── HTTP ─────────────────────────────────────────────────────────────────

    def _call(
        self, url: str, call: HttpCall, *, level: int | None = None, timeout_s: float | None = None
    ) -> str:
        """One ``POST`` of an engine's sleep API, as its registry entry describes it."""
        return self._post(
            url, call.path, params=call.query(level), body=call.body, timeout_s=timeout_s
        )

    def _post(
        self,
        url: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        timeout_s: float | None = None,
    ) -> str:
        target = endpoint(url, path)
        query = "&".join(f"{k}={v}" for k, v in (params or {}).items())
        what = f"POST {path}" + (f"?{query}" if query else "")
        content = b"" if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self._send(
            lambda t: self._http.post(
                target, params=params, content=content, headers=headers, timeout=t
            ),
            f"POST {target}" + (f"?{query}" if query else ""),
            self.timeout_s if timeout_s is None else timeout_s,
            _RETRY_CONNECT,
        )
        return what

    def _send(
        self,
        call: Callable[[httpx.Timeout], httpx.Response],
        what: str,
        timeout_s: float,
        retry_on: tuple[type[Exception], ...],
    ) -> httpx.Response:
        timeout = bounded_timeout(timeout_s, _CONNECT_TIMEOUT_S)
        retrying = self.bounded(retry_if_exception_type(retry_on))
        try:
            response = retrying(lambda: call(timeout))
        except httpx.TransportError as exc:
            tries = attempts_of(retrying)
            raise SleepError(
                f"{what}: no answer within {timeout_s:g}s ({tries} attempt"
                f"{'s' if tries > 1 else ''}): {type(exc).__name__}: {exc}",
                transient=True,
                attempts=tries,
            ) from exc
        except httpx.HTTPError as exc:  # a malformed URL, an unsupported scheme…
            raise SleepError(f"{what}: {type(exc).__name__}: {exc}", transient=False) from exc
        status = response.status_code
        if 200 <= status < 300:
            return response
        text = _text(response)
        if status == 404:
            raise SleepNotEnabledError(
                f"{what} answered 404 ({text}): the engine was not started with its sleep flag",
                transient=False,
                status=404,
            )
        busy = status == 400 and "idle" in text
        raise SleepError(
            f"{what} answered {status}: {text}",
            transient=busy or status in (502, 503, 504),
            status=status,
            busy=busy,
        )


def _api(protocol: str) -> SleepApi:
    """The sleep API of the engine called exactly ``protocol``; ValueError naming the
    registered ones when there is none."""
    api = engines.sleep_api(protocol)
    if api is None:
        known = ", ".join(e.name for e in engines.sleeping_engines())
        raise ValueError(f"protocol must be one of {known}, not {protocol!r}")
    return api
