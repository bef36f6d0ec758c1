"""Router adapter: the serving stack's router transitions (quiesce, drain, readmit).

The real stack's router (ADR-0018, docs/design.md §6) takes a serve's tier out of rotation
and back in through one admin endpoint::

    POST {router}/v1/admin/transition
    Authorization: Bearer <token>
    {"action": "quiesce"|"drain"|"readmit", "tier_id": T, "confirm": true,
     "dry_run": false, "reason": "eviction", "timeout": S}      (timeout: drain only)

and ``GET {router}/v1/admin/transition?tier_id=T`` reads a tier's state
(``{"tiers": [{"tier_id", "state": "admitting"|"quiesced", "reason",
"active_requests", "draining", "ready", ...}]}``), parsed by :meth:`RouterClient.tier_state`
into a :class:`TierState` whose missing fields are ``None``, never 0.
:class:`RouterClient` makes these calls with httpx and parses the answers into a
:class:`TransitionAnswer`: ``applied``, and for a drain ``drained`` / ``timed_out``,
for a readmit ``readmitted`` / ``reason`` (read from ``result`` or from the top
level, whichever carries them). A readmit the router refuses is answered 200 with
``readmitted: false`` and a reason (``identity_not_configured``,
``identity_http_404``, ``identity_not_verified``, a readiness reason): the caller
must look at ``readmitted``, never at the status alone.

What the router answers and what each answer means here (docs/protocols.md has the
table): an unknown ``tier_id`` is 400 ``invalid_transition`` (GET and POST); a router
whose transition API is not enabled (no auth token configured) answers 404 on the
endpoint; a missing or wrong token is 401.

Faults. The router does one mutation at a time, under one lock held for a whole drain,
and answers 503 ``server_busy`` to any other mutation meanwhile. Busy answers are
retried for ``busy_wait_s`` seconds (set it to cover the longest drain the client may
wait behind: :func:`busy_budget_s`), polling at most every :data:`BUSY_POLL_MAX_S`;
other 503s (and 502/504/429, and a connection that fails or times out) are retried
with backoff, bounded in attempts and in ``max_wait_s``; then ``RouterError(
transient=True)``. 400/401/403/404/422 and other answers that no retry can change are
raised at once as ``RouterError(transient=False)`` naming the status and the router's
error text (and its error type in ``code``). A drain call's HTTP timeout is its drain
timeout plus :data:`DRAIN_HTTP_MARGIN_S`, so the router always answers first.

The client is synchronous (the executor calls it from a worker thread), ignores
proxy environment variables (the bearer token goes only to the configured URL),
and takes an httpx transport for tests.

This module must not decide anything: when to drain, what a timed-out drain means
(the executor leaves that serve running, docs/design.md §6), or whether to stop a
container, or whether a tier quiesced by someone else may be readmitted. It must not be
called by anything but the executor (and preflight's :meth:`RouterClient.check`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Unpack, get_args

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type

from controller.adapters.http_client import NO_ANSWER_FAULTS, HttpAdapter, json_or_none
from controller.adapters.retry import AdapterError, Fault, attempts_of, backoff_wait, exhausted
from controller.manifest.fields import DEFAULT_DRAIN_TIMEOUT_S

__all__ = [
    "BUSY_MARGIN_S",
    "BUSY_POLL_MAX_S",
    "DRAIN_HTTP_MARGIN_S",
    "MAX_DRAIN_TIMEOUT_S",
    "QUIESCE_REASON",
    "TOKEN_ENV_VARS",
    "TRANSITION_PATH",
    "RouterClient",
    "RouterError",
    "TierState",
    "TransitionAction",
    "TransitionAnswer",
    "busy_budget_s",
    "is_own_reason",
    "router_token",
]

TransitionAction = Literal["quiesce", "drain", "readmit"]
_ACTIONS: frozenset[str] = frozenset(get_args(TransitionAction))

TRANSITION_PATH = "/v1/admin/transition"
#: The router's upper bound on a drain's ``timeout`` (seconds).
MAX_DRAIN_TIMEOUT_S = 3600.0
#: Seconds a drain call's HTTP timeout exceeds the drain timeout it asks for.
DRAIN_HTTP_MARGIN_S = 10.0
#: The reason the controller quiesces a tier with: a content-free code (the router
#: accepts letters, digits, ``-``, ``_`` and ``.``), by which the controller knows a
#: quiesce as its own (:func:`is_own_reason`).
QUIESCE_REASON = "vramctl-eviction"
#: Reasons of quiesces the controller made: its own, and the one earlier versions sent.
_OWN_REASONS = frozenset({QUIESCE_REASON, "eviction"})
#: Seconds added to the longest drain a busy answer may stand for (the drain's own
#: HTTP margin, the router's bookkeeping, one poll).
BUSY_MARGIN_S = 30.0
#: The longest pause between two tries of a busy answer.
BUSY_POLL_MAX_S = 5.0
#: Where :func:`router_token` looks when no token file is given, in order.
TOKEN_ENV_VARS = ("VRAMCTL_ROUTER_TOKEN", "ANVIL_ROUTER_TOKEN")

#: Statuses that mean "not now" rather than "no": retried.
_RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Transport faults worth another try (a refused or reset connection, a timeout).
_RETRY_TRANSPORT = NO_ANSWER_FAULTS
_ERROR_TEXT_CHARS = 300


class RouterError(AdapterError):
    """A router call that failed; ``code`` is the router's error type where it gave one
    (``invalid_transition``, ``server_busy``, ``not_found``...)."""

    def __init__(self, message: str, *, code: str | None = None, **fault: Unpack[Fault]) -> None:
        super().__init__(message, **fault)
        self.code = code


def is_own_reason(reason: str | None) -> bool:
    """Whether a quiesced tier's ``reason`` is one the controller quiesces with."""
    return reason in _OWN_REASONS


def busy_budget_s(drain_timeouts_s: Iterable[float]) -> float:
    """How long to retry 503 ``server_busy``: the longest drain it may wait behind.

    The router holds its mutation lock for a whole drain, so a quiesce may meet busy
    answers for as long as any drain runs. The controller's own drains last at most
    the manifest's longest ``drain_timeout_s``; the budget is that plus the drain's
    HTTP margin plus :data:`BUSY_MARGIN_S` (with no drain timeout known, the
    manifest default's). A drain someone else runs for longer than that still ends
    the step (transient, nothing stopped).
    """
    longest = max((float(t) for t in drain_timeouts_s), default=DEFAULT_DRAIN_TIMEOUT_S)
    return longest + DRAIN_HTTP_MARGIN_S + BUSY_MARGIN_S


@dataclass(frozen=True, slots=True)
class TierState:
    """One tier as the router reports it; a field the answer lacks is ``None``.

    ``state`` is ``"admitting"`` or ``"quiesced"`` on the real router; ``reason`` the
    quiesce reason (``"admitting"`` when admitting); ``active_requests`` the requests
    in flight (``None`` when not reported: unknown, never 0); ``raw`` the row as sent.
    """

    tier_id: str
    state: str | None
    reason: str | None
    active_requests: int | None
    draining: bool | None
    ready: bool | None
    readiness_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def quiesced(self) -> bool:
        """The router takes no new requests for the tier."""
        return self.state == "quiesced"

    @property
    def admitting(self) -> bool:
        """The router routes new requests to the tier."""
        return self.state == "admitting"

    @property
    def quiesced_by_other(self) -> bool:
        """Quiesced with a reason the controller does not quiesce with."""
        return self.quiesced and not is_own_reason(self.reason)


@dataclass(frozen=True, slots=True)
class TransitionAnswer:
    """The router's answer to a transition.

    ``drained``/``timed_out`` come with a drain, ``readmitted``/``reason`` with a
    readmit that did not happen; a field the answer lacks is ``None``. ``raw`` is
    the whole JSON body; ``attempts`` the number of requests it took.
    """

    applied: bool
    action: str
    drained: bool | None = None
    timed_out: bool | None = None
    readmitted: bool | None = None
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1


class _RetryableAnswerError(Exception):
    """An HTTP answer that means "try again later" (503 server_busy and the like)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def router_token(
    token_file: Path | None, *, environ: Mapping[str, str] | None = None
) -> str | None:
    """The router's bearer token: the file's stripped text, else the environment.

    With ``token_file`` the file must be readable and non-empty (``RouterError``,
    permanent, otherwise). Without it, ``VRAMCTL_ROUTER_TOKEN`` and then
    ``ANVIL_ROUTER_TOKEN`` are read; ``None`` when neither is set (or both are blank).
    """
    if token_file is not None:
        path = Path(token_file)
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RouterError(
                f"cannot read router token file {path}: {exc.strerror or exc}", transient=False
            ) from exc
        if not token:
            raise RouterError(f"router token file {path} is empty", transient=False)
        return token
    env = os.environ if environ is None else environ
    for var in TOKEN_ENV_VARS:
        value = env.get(var, "").strip()
        if value:
            return value
    return None


def _error_text(response: httpx.Response) -> str:
    """The router's own words for an error answer (FastAPI ``detail``, ``error``, text)."""
    body = json_or_none(response)
    parts: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str) and value.strip():
            parts.append(value.strip())
        elif isinstance(value, Mapping):
            for key in ("code", "type", "error", "message", "msg", "detail", "reason"):
                if key in value:
                    add(value[key])
        elif isinstance(value, list):
            for item in value[:3]:
                if isinstance(item, Mapping) and "msg" in item:
                    loc = item.get("loc")
                    where = ".".join(str(p) for p in loc) if isinstance(loc, list) else ""
                    parts.append(f"{where}: {item['msg']}" if where else str(item["msg"]))
                else:
                    add(item)

    if isinstance(body, Mapping):
        for key in ("error", "detail", "message", "reason"):
            if key in body:
                add(body[key])
    text = "; ".join(dict.fromkeys(parts)) if parts else response.text.strip()
    text = text or response.reason_phrase or "no body"
    return text[:_ERROR_TEXT_CHARS]


def _mentions_busy(response: httpx.Response) -> bool:
    return "server_busy" in response.text


def _error_code(response: httpx.Response) -> str | None:
    """The router's error type: ``{"error": {"type": T}}`` (or ``code``), else ``None``."""
    body = json_or_none(response)
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    if isinstance(error, str) and error:
        return error
    for holder in (error, body.get("detail"), body):
        if isinstance(holder, Mapping):
            for key in ("type", "code"):
                value = holder.get(key)
                if isinstance(value, str) and value:
                    return value
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _parse_tier(tier_id: str, body: Mapping[str, Any]) -> TierState | None:
    """The row of ``tier_id`` in a status answer (``{"tiers": [...]}`` or one flat row)."""
    rows = body.get("tiers")
    row: Mapping[str, Any] | None = None
    if isinstance(rows, list):
        for item in rows:
            if isinstance(item, Mapping) and item.get("tier_id") == tier_id:
                row = item
                break
    elif "state" in body:
        row = body
    if row is None:
        return None
    return TierState(
        tier_id=tier_id,
        state=_str(row.get("state")),
        reason=_str(row.get("reason")),
        active_requests=_int(row.get("active_requests")),
        draining=_bool(row.get("draining")),
        ready=_bool(row.get("ready")),
        readiness_reason=_str(row.get("readiness_reason")),
        raw=dict(row),
    )


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _parse_transition(action: str, body: Mapping[str, Any], attempts: int) -> TransitionAnswer:
    result = body.get("result")
    inner: Mapping[str, Any] = result if isinstance(result, Mapping) else {}

    def pick(key: str) -> Any:
        return inner[key] if key in inner else body.get(key)

    reason = pick("reason")
    answered_action = body.get("action")
    return TransitionAnswer(
        applied=body.get("applied") is True,
        action=answered_action if isinstance(answered_action, str) else action,
        drained=_bool(pick("drained")),
        timed_out=_bool(pick("timed_out")),
        readmitted=_bool(pick("readmitted")),
        reason=reason if isinstance(reason, str) else None,
        raw=dict(body),
        attempts=attempts,
    )


class RouterClient(HttpAdapter):
    """Calls the router's admin transition endpoint for the executor.

    ``timeout_s`` bounds each request (a drain's is its drain timeout plus
    :data:`DRAIN_HTTP_MARGIN_S`); ``attempts`` and ``max_wait_s`` bound the retries
    of transport faults and of 502/503/504/429 answers (no retry starts after
    ``max_wait_s`` seconds, and the backoff sleeps, starting at ``initial_wait_s`` and
    doubling, never add up to more). A 503 ``server_busy`` answer is retried for
    ``busy_wait_s`` seconds instead (when larger; no bound on attempts there), pausing
    at most :data:`BUSY_POLL_MAX_S` between tries: the router holds its mutation lock
    for a whole drain, so pass :func:`busy_budget_s` of the drains it may wait behind.
    ``transport`` replaces httpx's network transport in tests. Use it as a context
    manager or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout_s: float = 10,
        attempts: int = 6,
        max_wait_s: float = 30,
        initial_wait_s: float = 0.5,
        busy_wait_s: float | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, not {timeout_s}")
        if busy_wait_s is not None and not (math.isfinite(busy_wait_s) and busy_wait_s >= 0):
            raise ValueError(f"busy_wait_s must be a finite number >= 0, not {busy_wait_s}")
        #: seconds a 503 server_busy is retried (the other retries: ``max_wait_s``)
        self.busy_wait_s = float(busy_wait_s if busy_wait_s is not None else busy_budget_s(()))
        self.set_retry_knobs(
            attempts=attempts, max_wait_s=max_wait_s, initial_wait_s=initial_wait_s
        )
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._has_token = bool(token)
        self.open_http(
            transport=transport,
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
        )

    # ── the calls ─────────────────────────────────────────────────────────────

    def transition(
        self,
        action: TransitionAction,
        tier_id: str,
        *,
        drain_timeout_s: float | None = None,
        reason: str = QUIESCE_REASON,
    ) -> TransitionAnswer:
        """Ask the router to quiesce, drain or readmit ``tier_id``.

        A drain needs ``drain_timeout_s`` with 0 < S ≤ 3600 (``ValueError``
        otherwise); the other actions ignore it and send no ``timeout``. Returns the
        parsed answer of a 2xx; raises :class:`RouterError` for anything else.
        """
        if action not in _ACTIONS:
            raise ValueError(
                f"unknown router action {action!r}; expected one of {sorted(_ACTIONS)}"
            )
        if not tier_id:
            raise ValueError("tier_id must not be empty")
        body: dict[str, Any] = {
            "action": action,
            "tier_id": tier_id,
            "confirm": True,
            "dry_run": False,
            "reason": reason,
        }
        timeout = httpx.Timeout(self.timeout_s)
        if action == "drain":
            if drain_timeout_s is None:
                raise ValueError("a drain needs drain_timeout_s (0 < S ≤ 3600)")
            if not (math.isfinite(drain_timeout_s) and 0 < drain_timeout_s <= MAX_DRAIN_TIMEOUT_S):
                raise ValueError(
                    f"drain timeout must satisfy 0 < S ≤ {MAX_DRAIN_TIMEOUT_S:g}, "
                    f"not {drain_timeout_s}"
                )
            seconds = float(drain_timeout_s)
            body["timeout"] = int(seconds) if seconds.is_integer() else seconds
            timeout = httpx.Timeout(
                self.timeout_s + seconds + DRAIN_HTTP_MARGIN_S, connect=self.timeout_s
            )
        what = f"router {action} {tier_id}"
        response, attempts = self._request(
            what, lambda: self._http.post(TRANSITION_PATH, json=body, timeout=timeout)
        )
        payload = self._ok_json(what, response, attempts)
        return _parse_transition(action, payload, attempts)

    def tier_state(self, tier_id: str) -> TierState:
        """The tier's state as the router reports it (``GET ?tier_id=T``).

        Raises :class:`RouterError` like :meth:`transition` (an unknown tier: 400
        ``invalid_transition``, permanent), and permanently too when a 2xx answer
        carries no row for the tier.
        """
        what = f"router state of {tier_id}"
        response, attempts = self._request(
            what, lambda: self._http.get(TRANSITION_PATH, params={"tier_id": tier_id})
        )
        body = self._ok_json(what, response, attempts)
        state = _parse_tier(tier_id, body)
        if state is None:
            raise RouterError(
                f"{what}: router answered {response.status_code} without a row for "
                f"{tier_id!r}: {response.text[:_ERROR_TEXT_CHARS]!r}",
                transient=False,
                status=response.status_code,
                attempts=attempts,
            )
        return state

    def check(self, *, tier_id: str | None = None) -> str | None:
        """Preflight: ``None`` when the router answers and accepts the token, else why not.

        One request, no retries: ``GET`` the transition endpoint (for ``tier_id``
        when given). Any HTTP answer means reachable, except 401/403 (the token is
        missing or wrong), 404 (the transition API is not enabled: the router has no
        auth token configured) and, with a ``tier_id``, 400 ``invalid_transition`` (the
        router does not know the tier) or a 2xx without a row for it.
        """
        params = {"tier_id": tier_id} if tier_id else None
        try:
            response = self._http.get(TRANSITION_PATH, params=params)
        except httpx.HTTPError as exc:
            return f"router unreachable at {self.base_url}: {type(exc).__name__}: {exc}"
        status = response.status_code
        if status in (401, 403):
            hint = "" if self._has_token else " (no router token configured)"
            return (
                f"router at {self.base_url} refused the token ({status}): "
                f"{_error_text(response)}{hint}"
            )
        if status == 404:
            return (
                f"router at {self.base_url} has no transition API at {TRANSITION_PATH} "
                f"(404: {_error_text(response)}): it is not enabled (the router needs an "
                "auth token configured) or this is not the router"
            )
        if tier_id and status == 400:
            return (
                f"router at {self.base_url} does not know tier {tier_id!r} "
                f"(400: {_error_text(response)})"
            )
        if tier_id and 200 <= status < 300:
            body = json_or_none(response)
            if not isinstance(body, dict) or _parse_tier(tier_id, body) is None:
                return (
                    f"router at {self.base_url} answered {status} for tier {tier_id!r} "
                    f"without a row for it: {response.text[:_ERROR_TEXT_CHARS]!r}"
                )
        return None

    # ── plumbing ──────────────────────────────────────────────────────────────

    def _request(self, what: str, send: Callable[[], httpx.Response]) -> tuple[httpx.Response, int]:
        """Send with retries; the final answer (any status) and the number of attempts."""

        def attempt() -> httpx.Response:
            response = send()
            if response.status_code in _RETRY_STATUSES:
                raise _RetryableAnswerError(response)
            return response

        retrying = Retrying(
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception_type((_RetryableAnswerError, *_RETRY_TRANSPORT)),
            reraise=True,
        )
        try:
            response = retrying(attempt)
        except _RetryableAnswerError as exc:
            tries = attempts_of(retrying)
            status = exc.response.status_code
            busy = " (server_busy)" if _mentions_busy(exc.response) else ""
            raise RouterError(
                f"{what}: router answered {status}{busy} after {tries} attempts: "
                f"{_error_text(exc.response)}",
                transient=True,
                status=status,
                attempts=tries,
                code=_error_code(exc.response),
            ) from exc
        except _RETRY_TRANSPORT as exc:
            raise exhausted(
                RouterError,
                retrying,
                "{what}: router unreachable at {url} after {n} attempts: {fault}",
                what=what,
                url=self.base_url,
                fault=f"{type(exc).__name__}: {exc}",
            ) from exc
        except httpx.HTTPError as exc:  # a malformed URL, an unsupported scheme…
            raise RouterError(
                f"{what}: {type(exc).__name__}: {exc}", transient=False, attempts=1
            ) from exc
        return response, attempts_of(retrying)

    @staticmethod
    def _busy(state: RetryCallState) -> bool:
        outcome = state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        return (
            isinstance(exc, _RetryableAnswerError)
            and exc.response.status_code == 503
            and _mentions_busy(exc.response)
        )

    def _stop(self, state: RetryCallState) -> bool:
        """Busy answers: stop after ``busy_wait_s``; the rest: attempts or ``max_wait_s``."""
        elapsed = float(state.seconds_since_start or 0.0)
        if self._busy(state) and self.busy_wait_s > self.max_wait_s:
            return elapsed >= self.busy_wait_s
        return state.attempt_number >= self.attempts or elapsed >= self.max_wait_s

    def _wait(self, state: RetryCallState) -> float:
        if self._busy(state) and self.busy_wait_s > self.max_wait_s:
            delay = backoff_wait(self.initial_wait_s, self.busy_wait_s)(state)
            return min(delay, BUSY_POLL_MAX_S)
        return backoff_wait(self.initial_wait_s, self.max_wait_s)(state)

    def _ok_json(self, what: str, response: httpx.Response, attempts: int) -> dict[str, Any]:
        status = response.status_code
        if not 200 <= status < 300:
            raise RouterError(
                f"{what}: router answered {status}: {_error_text(response)}",
                transient=False,
                status=status,
                attempts=attempts,
                code=_error_code(response),
            )
        body = json_or_none(response)
        if not isinstance(body, dict):
            raise RouterError(
                f"{what}: router answered {status} without a JSON object: "
                f"{response.text[:_ERROR_TEXT_CHARS]!r}",
                transient=False,
                status=status,
                attempts=attempts,
            )
        return body
