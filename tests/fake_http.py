"""Small real HTTP servers on loopback that stand in for the router and elastic engines.

Import as ``from fake_http import ...`` (pytest puts ``tests/`` on ``sys.path``).

Each server listens on ``127.0.0.1`` on a free port (``http.server``'s
``ThreadingHTTPServer`` in a daemon thread), records every request it gets
(:class:`Recorded`: method, path, query, headers, raw body, decoded JSON, monotonic
time) and is a context manager::

    with FakeRouter(token="t") as router:
        router.script_drain("tier-a", drained=False, timed_out=True)
        client = RouterClient(router.url, "t")
        ...
        assert router.actions() == [("quiesce", "tier-a"), ("drain", "tier-a")]

    with FakeElastic([FakeElastic.busy(), FakeElastic.ok(8000, vram_free_mib=8200)]) as engine:
        ...  # engine.url, engine.reserves() == [8000, 8000]

* :class:`FakeHTTPServer` answers with any ``handler(Recorded) -> Reply``;
* :class:`FakeRouter` speaks the serving stack's router's admin transition protocol
  as that router answers it (docs/protocols.md): four management slots taken without
  waiting (a fifth concurrent request answers 503 ``server_busy``; a drain holds its
  slot for its whole length), 404 when its transition API is not enabled, 401 for a
  bad token, 400 ``invalid_transition`` for a tier it was not configured with or a
  transition the tier's state forbids, dry runs without ``confirm``/``dry_run``, one
  mutation lock held for a whole drain (503 ``server_busy`` meanwhile), readmits that
  answer ``readmitted: false`` with a reason; it keeps a per-tier state and can be
  scripted: a drain's result, leading 503 ``server_busy`` answers, a forced status
  for an action, readmit refusals, readiness, an operator's quiesce, slow status
  reads, slots held by someone else;
* :class:`FakeEngineMetrics` serves ``GET /metrics`` as vLLM, SGLang or llama.cpp
  server write it (Prometheus text), with settable running / waiting counts (or 503);
* :class:`FakeElastic` speaks ``POST /v1/vram`` (the seed's
  ``vram-elastic-reserve-api.txt``): it checks the API key, the content type and
  ``reserve_mib`` as the engine does, then answers the scripted replies in order, and
  a full success once they run out. The ``ok``/``partial``/``not_loaded``/``busy``/
  ``refused``/``resize_failed``/``unavailable`` helpers build the seed's answers.

These are test doubles only: nothing in ``controller/`` may import this module.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "Card",
    "ElasticEngine",
    "FakeElastic",
    "FakeEngineMetrics",
    "FakeHTTPServer",
    "FakeRouter",
    "Recorded",
    "Reply",
    "elastic_error_body",
    "elastic_not_loaded_body",
    "elastic_ok_body",
    "router_error",
]

TRANSITION_PATH = "/v1/admin/transition"
#: the router's management slots: requests to the transition endpoint served at once
#: (its ``BoundedSemaphore(4)``, taken without waiting; docs/protocols.md)
MANAGEMENT_SLOTS = 4
VRAM_PATH = "/v1/vram"


@dataclass(frozen=True)
class Recorded:
    """One request as the fake server received it (header names in lower case)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    json: Any
    time: float  # time.monotonic() when it arrived
    raw_query: str = ""  # the query string as sent (repeated keys kept)

    @property
    def bearer(self) -> str | None:
        """The bearer token of the ``Authorization`` header, if any."""
        auth = self.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None


@dataclass(frozen=True)
class Reply:
    """What the fake answers: ``body`` is sent as JSON unless it is ``str``/``bytes``."""

    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


ReplyLike = Reply | tuple[int, Any]


def _as_reply(value: ReplyLike) -> Reply:
    if isinstance(value, Reply):
        return value
    status, body = value
    return Reply(status, body)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as every asyncio server sets it (uvicorn: vLLM, SGLang): with Nagle
    # on, the body written after the headers waits for the client's delayed ACK (40 ms)
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        try:
            decoded: Any = json.loads(body) if body else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            decoded = None
        request = Recorded(
            method=self.command,
            path=split.path,
            query=query,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            json=decoded,
            time=time.monotonic(),
            raw_query=split.query,
        )
        owner = self.server.owner
        owner._record(request)
        try:
            reply = _as_reply(owner.handle(request))
        except Exception as exc:  # a bug in a scripted handler: say so, loudly
            reply = Reply(500, {"error": f"fake server handler failed: {exc!r}"})
        if reply.delay_s > 0:
            time.sleep(reply.delay_s)
        if isinstance(reply.body, bytes):
            payload, ctype = reply.body, "application/octet-stream"
        elif isinstance(reply.body, str):
            payload, ctype = reply.body.encode(), "text/plain; charset=utf-8"
        elif reply.body is None:
            payload, ctype = b"", ""
        else:
            payload, ctype = json.dumps(reply.body).encode(), "application/json"
        try:
            self.send_response(reply.status)
            headers = dict(reply.headers)
            if ctype and not any(k.lower() == "content-type" for k in headers):
                headers["Content-Type"] = ctype
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if payload and self.command != "HEAD":
                self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
            self.close_connection = True

    # http.server dispatches on these names
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeHTTPServer


class FakeHTTPServer:
    """A loopback HTTP server answering ``handler(request)``; records every request.

    Subclasses override :meth:`handle`. ``calls`` is a snapshot list of the
    requests so far, in arrival order.
    """

    def __init__(self, handler: Callable[[Recorded], ReplyLike] | None = None) -> None:
        self._handler = handler
        self._lock = threading.RLock()
        self._calls: list[Recorded] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        #: the loopback port to listen on (0: a free one)
        self.bind_port = 0

    # ── lifecycle ─────────────────────────────────────────────────────────────

    def start(self) -> FakeHTTPServer:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", self.bind_port), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake server is not started")
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    # ── requests ──────────────────────────────────────────────────────────────

    def _record(self, request: Recorded) -> None:
        with self._lock:
            self._calls.append(request)

    @property
    def calls(self) -> list[Recorded]:
        with self._lock:
            return list(self._calls)

    def clear_calls(self) -> None:
        with self._lock:
            self._calls.clear()

    def handle(self, request: Recorded) -> ReplyLike:
        if self._handler is None:
            return Reply(404, {"error": f"no handler for {request.method} {request.path}"})
        return self._handler(request)


# ── the router ─────────────────────────────────────────────────────────────────


def router_error(status: int, etype: str, message: str) -> Reply:
    """The router's error envelope: ``{"error": {"type": T, "message": M}}``."""
    return Reply(status, {"error": {"type": etype, "message": message}})


def _invalid(message: str = "invalid transition request") -> Reply:
    return router_error(400, "invalid_transition", message)


def _content_free(reason: Any) -> bool:
    """The router's rule for a quiesce reason: a short code of letters, digits, -_."""
    return (
        isinstance(reason, str)
        and 0 < len(reason) <= 128
        and all(ch.isalnum() or ch in "-_." for ch in reason)
    )


@dataclass
class _DrainScript:
    drained: bool
    timed_out: bool
    delay_s: float


@dataclass
class _Forced:
    status: int
    body: Any
    times: int | None  # None: every time


@dataclass
class _ReadmitScript:
    readmitted: bool
    reason: str | None
    nested: bool
    times: int | None  # None: every time; then readmits as usual


class FakeRouter(FakeHTTPServer):
    """The router's admin transition endpoint (docs/protocols.md) with per-tier state.

    It behaves as the serving stack's router does:

    * ``token``: the bearer token the router is configured with. ``None`` means the
      transition API is not enabled: every call to the endpoint answers 404
      ``not_found``. A missing or wrong token answers 401 ``authentication_error``.
    * ``tiers``: the tiers the router is configured with, admitting and ready; any
      other ``tier_id`` answers 400 ``invalid_transition`` on GET and POST (and the
      scripting methods below raise ``KeyError`` for it: a test scripts only tiers the
      router knows).
    * every request to the transition endpoint takes one of :data:`MANAGEMENT_SLOTS`
      slots without waiting, before the token is checked, and keeps it until it is
      answered (a drain: its whole length); with none free it answers 503
      ``server_busy`` ("management busy"). ``status_delay_s``: how long a status read
      takes (the router probes the tier's readiness when its cached probe is stale).
      :meth:`hold_slots` takes slots as someone else's requests would;
      :attr:`management_peak` and :attr:`busy_refusals` say what the endpoint saw.
    * ``GET ?tier_id=T`` answers ``{"tiers": [row]}``, a ``GET`` without one every
      tier; a row is ``{"tier_id", "state": "admitting"|"quiesced", "reason",
      "active_requests", "draining", "ready", "readiness_state", "readiness_reason",
      "expected_model", "observed_model"}``.
    * a quiesce or readmit without ``confirm: true`` and ``dry_run: false`` is a dry
      run (200, ``applied: false``); a quiesce's reason must be a content-free code
      and overwrites the tier's reason; a drain needs the tier quiesced; a readmit
      answers 200 ``{"applied": true, "result": {"readmitted": false, "reason": R}}``
      when the tier is not ready (or a refusal is scripted) and leaves it quiesced.
    * every mutation runs under one lock, held for a whole drain: another mutation
      meanwhile answers 503 ``server_busy``.

    Scripts persist until changed, except busy answers and ``times``-bounded forced
    statuses and readmit refusals, which are used up.
    """

    def __init__(
        self, token: str | None = None, *, tiers: Iterable[str] = (), status_delay_s: float = 0.0
    ) -> None:
        super().__init__()
        self.token = token
        self.status_delay_s = status_delay_s
        self._tiers: dict[str, dict[str, Any]] = {t: self._fresh(t) for t in tiers}
        self._slots = threading.BoundedSemaphore(MANAGEMENT_SLOTS)
        self._serving = 0
        #: the most management requests served at once (slots held by
        #: :meth:`hold_slots` not counted)
        self.management_peak = 0
        #: management requests answered 503 ``server_busy`` for want of a free slot
        self.busy_refusals = 0
        self._drain: dict[str, _DrainScript] = {}
        self._readmit: dict[str, _ReadmitScript] = {}
        self._busy: deque[tuple[str | None, str]] = deque()
        self._forced: dict[str, _Forced] = {}
        self._mutation = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def __enter__(self) -> FakeRouter:
        self.start()
        return self

    @staticmethod
    def _fresh(tier_id: str) -> dict[str, Any]:
        return {
            "tier_id": tier_id,
            "state": "admitting",
            "reason": "admitting",
            "active_requests": 0,
            "draining": False,
            "ready": True,
            "readiness_state": "ready",
            "readiness_reason": "identity_passed",
            "expected_model": tier_id,
            "observed_model": tier_id,
        }

    # ── scripting ─────────────────────────────────────────────────────────────

    def script_drain(
        self,
        tier_id: str,
        *,
        drained: bool | None = None,
        timed_out: bool = False,
        delay_s: float = 0.0,
    ) -> None:
        """How drains of ``tier_id`` end: ``timed_out=True`` leaves requests active.

        ``drained`` defaults to ``not timed_out``; ``delay_s`` makes the router take
        that long (capped at the drain's own timeout) before it answers, holding the
        mutation lock. Unscripted, a drain waits (up to its timeout) until the tier's
        ``active_requests`` is 0.
        """
        with self._lock:
            self._drain[tier_id] = _DrainScript(
                drained=(not timed_out) if drained is None else drained,
                timed_out=timed_out,
                delay_s=delay_s,
            )

    def script_busy(self, n: int, *, action: str | None = None, style: str = "error") -> None:
        """The next ``n`` transitions (of ``action``, or of any) answer 503 server_busy.

        ``style``: ``"error"`` → the router's ``{"error": {"type": "server_busy", …}}``;
        ``"detail"`` → ``{"detail": {"code": "server_busy", …}}``; ``"text"`` → a
        plain-text 503 (not recognisably busy: retried as any 503).
        """
        with self._lock:
            self._busy.extend([(action, style)] * n)

    def force_status(
        self, action: str, status: int, body: Any = None, *, times: int | None = None
    ) -> None:
        """Transitions of ``action`` answer ``status`` (``times`` times, or always)."""
        if body is None:
            body = {"error": {"type": "forced", "message": f"forced {status} for {action}"}}
        with self._lock:
            self._forced[action] = _Forced(status, body, times)

    def script_readmit(
        self,
        tier_id: str,
        *,
        readmitted: bool = False,
        reason: str | None = "identity_not_verified",
        nested: bool = True,
        times: int | None = None,
    ) -> None:
        """How readmits of ``tier_id`` answer (``times`` times, or always).

        A refusal (``readmitted=False``) leaves the tier quiesced; ``nested`` puts the
        fields in ``result`` (the router's form; ``False``: top level, ``applied``
        false).
        """
        with self._lock:
            self._readmit[tier_id] = _ReadmitScript(readmitted, reason, nested, times)

    def set_active(self, tier_id: str, active_requests: int) -> None:
        """Set a tier's in-flight request count (what a drain waits for)."""
        with self._lock:
            self._tier(tier_id)["active_requests"] = active_requests
            self._changed.notify_all()

    def set_ready(self, tier_id: str, ready: bool, reason: str = "identity_http_404") -> None:
        """Whether the tier's backend passes readiness (a readmit needs it to)."""
        with self._lock:
            self._tier(tier_id).update(
                ready=ready,
                readiness_state="ready" if ready else "unavailable",
                readiness_reason="identity_passed" if ready else reason,
            )

    def quiesce_as(self, tier_id: str, reason: str) -> None:
        """Quiesce ``tier_id`` as someone else would (an operator), with ``reason``."""
        with self._lock:
            self._tier(tier_id).update(state="quiesced", reason=reason)

    def tier(self, tier_id: str) -> dict[str, Any]:
        """A copy of the tier's current state."""
        with self._lock:
            return dict(self._tier(tier_id))

    @contextmanager
    def hold_slots(self, n: int) -> Iterator[None]:
        """Hold ``n`` management slots meanwhile, as someone else's requests in progress
        would (an operator's drain, the serving stack's own tools)."""
        for taken in range(n):
            if not self._slots.acquire(timeout=5):
                for _ in range(taken):
                    self._slots.release()
                raise RuntimeError(f"FakeRouter: no management slot free for hold #{taken + 1}")
        try:
            yield
        finally:
            for _ in range(n):
                self._slots.release()

    # ── what was asked ────────────────────────────────────────────────────────

    @property
    def transitions(self) -> list[Recorded]:
        """The POSTs to the transition endpoint, in order."""
        return [c for c in self.calls if c.method == "POST" and c.path == TRANSITION_PATH]

    def actions(self) -> list[tuple[str, str]]:
        """``(action, tier_id)`` of every transition POST received (busy ones included)."""
        out = []
        for c in self.transitions:
            body = c.json if isinstance(c.json, dict) else {}
            out.append((str(body.get("action")), str(body.get("tier_id"))))
        return out

    # ── protocol ──────────────────────────────────────────────────────────────

    def _tier(self, tier_id: str) -> dict[str, Any]:
        state = self._tiers.get(tier_id)
        if state is None:
            raise KeyError(f"FakeRouter has no tier {tier_id!r}: pass it in tiers=")
        return state

    def _known(self, tier_id: str) -> dict[str, Any] | None:
        """The tier's state; ``None`` for a tier the router was not configured with."""
        return self._tiers.get(tier_id)

    def _auth(self, request: Recorded) -> Reply | None:
        if self.token is None:
            return router_error(404, "not_found", f"no route {request.path}")
        if request.bearer != self.token:
            return router_error(401, "authentication_error", "invalid or missing API key")
        return None

    def handle(self, request: Recorded) -> ReplyLike:
        if request.path != TRANSITION_PATH:
            return router_error(404, "not_found", f"no route {request.path}")
        if not self._slots.acquire(blocking=False):
            with self._lock:
                self.busy_refusals += 1
            return router_error(503, "server_busy", "management busy; try again later")
        with self._lock:
            self._serving += 1
            self.management_peak = max(self.management_peak, self._serving)
        try:
            return self._managed(request)
        finally:
            with self._lock:
                self._serving -= 1
            self._slots.release()

    def _managed(self, request: Recorded) -> ReplyLike:
        """One request to the transition endpoint, holding a management slot."""
        denied = self._auth(request)
        if denied is not None:
            return denied
        if request.method == "GET":
            return self._status(request.query.get("tier_id"))
        if request.method == "POST":
            return self._post(request)
        return router_error(405, "method_not_allowed", "method not allowed")

    def _status(self, tier_id: Any) -> Reply:
        if self.status_delay_s > 0:
            time.sleep(self.status_delay_s)
        with self._lock:
            if isinstance(tier_id, str):
                tier = self._known(tier_id)
                if tier is None:
                    return _invalid()
                return Reply(200, {"tiers": [dict(tier)]})
            return Reply(200, {"tiers": [dict(t) for t in self._tiers.values()]})

    def _post(self, request: Recorded) -> Reply:
        body = request.json
        if not isinstance(body, dict):
            return router_error(400, "invalid_request", "request body must be a JSON object")
        action = body.get("action")
        tier_id = body.get("tier_id")
        if action == "status":
            return self._status(tier_id if isinstance(tier_id, str) else None)
        if not isinstance(tier_id, str) or not tier_id:
            return _invalid("tier_id is required")
        with self._lock:
            for i, (busy_action, style) in enumerate(self._busy):
                if busy_action is None or busy_action == action:
                    del self._busy[i]
                    return self._busy_reply(style)
            forced = self._forced.get(str(action))
            if forced is not None:
                if forced.times is not None:
                    forced.times -= 1
                    if forced.times <= 0:
                        del self._forced[str(action)]
                return Reply(forced.status, forced.body)
        if action in ("quiesce", "readmit") and (
            body.get("confirm") is not True or body.get("dry_run", True) is not False
        ):
            return Reply(
                200, {"applied": False, "dry_run": True, "action": action, "tier_id": tier_id}
            )
        if not self._mutation.acquire(blocking=False):
            return router_error(503, "server_busy", "transition mutation busy")
        try:
            if action == "quiesce":
                return self._quiesce(tier_id, body.get("reason") or "promotion")
            if action == "drain":
                return self._drain_tier(tier_id, body.get("timeout"))
            if action == "readmit":
                return self._readmit_tier(tier_id)
            return _invalid("unsupported transition action")
        finally:
            self._mutation.release()

    def _quiesce(self, tier_id: str, reason: Any) -> Reply:
        with self._lock:
            tier = self._known(tier_id)
            if tier is None or not _content_free(reason) or tier["draining"]:
                return _invalid()
            tier.update(state="quiesced", reason=reason)
            return Reply(200, {"applied": True, "action": "quiesce", "result": _snapshot(tier)})

    def _drain_tier(self, tier_id: str, timeout: Any) -> Reply:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            return _invalid()
        with self._lock:
            tier = self._known(tier_id)
            if tier is None or tier["state"] != "quiesced" or tier["draining"]:
                return _invalid()
            script = self._drain.get(tier_id)
            tier["draining"] = True
        try:
            deadline = time.monotonic() + float(timeout)
            if script is not None and script.delay_s > 0:
                time.sleep(min(script.delay_s, float(timeout)))
            with self._lock:
                if script is not None:
                    drained, timed_out = script.drained, script.timed_out
                    if timed_out and not tier["active_requests"]:
                        tier["active_requests"] = 1
                else:
                    while tier["active_requests"] and time.monotonic() < deadline:
                        self._changed.wait(max(0.0, deadline - time.monotonic()))
                    drained = not tier["active_requests"]
                    timed_out = not drained
                tier["draining"] = False
                result = {"drained": drained, "timed_out": timed_out, "snapshot": _snapshot(tier)}
        finally:
            with self._lock:
                tier["draining"] = False
        return Reply(200, {"applied": True, "action": "drain", "result": result})

    def _readmit_tier(self, tier_id: str) -> Reply:
        with self._lock:
            tier = self._known(tier_id)
            if tier is None or tier["draining"]:
                return _invalid()
            script = self._readmit.get(tier_id)
            if script is not None and script.times is not None:
                script.times -= 1
                if script.times <= 0:
                    del self._readmit[tier_id]
            if script is not None and not script.readmitted:
                fields = {"readmitted": False, "reason": script.reason}
                if not script.nested:
                    return Reply(200, {"applied": False, "action": "readmit", **fields})
                fields["status"] = {"tiers": [dict(tier)]}
                return Reply(200, {"applied": True, "action": "readmit", "result": fields})
            if not tier["ready"]:
                result = {
                    "readmitted": False,
                    "reason": tier["readiness_reason"],
                    "status": {"tiers": [dict(tier)]},
                }
                return Reply(200, {"applied": True, "action": "readmit", "result": result})
            tier.update(state="admitting", reason="admitting")
            result = {
                "readmitted": True,
                "reason": "readiness_passed",
                "status": {"tiers": [dict(tier)]},
            }
            return Reply(200, {"applied": True, "action": "readmit", "result": result})

    @staticmethod
    def _busy_reply(style: str) -> Reply:
        message = "transition mutation busy"
        if style == "detail":
            return Reply(503, {"detail": {"code": "server_busy", "message": message}})
        if style == "text":
            return Reply(503, "Service Unavailable")
        return router_error(503, "server_busy", message)


def _snapshot(tier: Mapping[str, Any]) -> dict[str, Any]:
    """The admission part of a tier's row (what quiesce and drain answer with)."""
    keys = ("tier_id", "state", "reason", "active_requests", "draining")
    return {k: tier[k] for k in keys}


# ── the elastic engine ─────────────────────────────────────────────────────────


def elastic_ok_body(
    reserve_mib: int | None,
    *,
    vram_free_mib: int,
    expert_cache_mib: int = 4096,
    expert_cache_full_mib: int = 8192,
    expert_slots: int | None = None,
    expert_slots_full: int | None = None,
    prompt_chunk: int = 512,
) -> dict[str, Any]:
    """The seed's 200 ``status: "ok"`` body (slots default to 1 per 16 MiB of cache)."""
    return {
        "status": "ok",
        "reserve_mib": reserve_mib,
        "expert_slots": expert_cache_mib // 16 if expert_slots is None else expert_slots,
        "expert_slots_full": (
            expert_cache_full_mib // 16 if expert_slots_full is None else expert_slots_full
        ),
        "expert_cache_mib": expert_cache_mib,
        "expert_cache_full_mib": expert_cache_full_mib,
        "vram_free_mib": vram_free_mib,
        "prompt_chunk": prompt_chunk,
    }


def elastic_not_loaded_body(reserve_mib: int | None) -> dict[str, Any]:
    """The seed's 200 answer for an unloaded model."""
    return {
        "status": "not loaded",
        "reserve_mib": reserve_mib,
        "note": "applied when the model loads",
    }


def elastic_error_body(
    message: str, *, type: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    """An OpenAI-style error body, as the engine's server sends."""
    return {"error": {"message": message, "type": type, "code": code}}


class FakeElastic(FakeHTTPServer):
    """An engine's ``POST /v1/vram`` (seed ``vram-elastic-reserve-api.txt``).

    Checks come first, as in the engine: the API key (``token``: 401 without or
    with a wrong one), ``Content-Type: application/json`` (415), a JSON object whose
    ``reserve_mib`` is a whole number ≥ 0 or null (400). Then the scripted replies
    (``responses`` and :meth:`script`) are answered in order; when they run out the
    answer is a full success: ``reserve_mib`` echoed (null → ``start_reserve_mib``)
    and ``vram_free_mib`` equal to it. Other paths answer 404.
    """

    def __init__(
        self,
        responses: Iterable[ReplyLike] = (),
        *,
        token: str | None = None,
        start_reserve_mib: int = 1024,
    ) -> None:
        super().__init__()
        self.token = token
        self.start_reserve_mib = start_reserve_mib
        self._script: deque[Reply] = deque(_as_reply(r) for r in responses)

    def __enter__(self) -> FakeElastic:
        self.start()
        return self

    def script(self, *responses: ReplyLike) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(_as_reply(r) for r in responses)

    @property
    def remaining(self) -> int:
        """Scripted replies not yet answered."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[Recorded]:
        """The POSTs to ``/v1/vram``, in order."""
        return [c for c in self.calls if c.method == "POST" and c.path == VRAM_PATH]

    def reserves(self) -> list[int | None]:
        """``reserve_mib`` of every POST received."""
        return [
            c.json.get("reserve_mib") if isinstance(c.json, dict) else None for c in self.requests
        ]

    # ── the seed's answers ────────────────────────────────────────────────────

    @staticmethod
    def ok(reserve_mib: int | None, *, vram_free_mib: int, **figures: int) -> Reply:
        """200 ``ok`` (``figures``: ``expert_cache_mib``, ``expert_cache_full_mib``, …)."""
        return Reply(200, elastic_ok_body(reserve_mib, vram_free_mib=vram_free_mib, **figures))

    @staticmethod
    def partial(reserve_mib: int, *, vram_free_mib: int, **figures: int) -> Reply:
        """200 ``ok`` that missed the reserve (the cache reached its floor)."""
        assert vram_free_mib < reserve_mib, "a partial answer has vram_free_mib < reserve_mib"
        figures.setdefault("expert_cache_mib", 2048)
        return Reply(200, elastic_ok_body(reserve_mib, vram_free_mib=vram_free_mib, **figures))

    @staticmethod
    def not_loaded(reserve_mib: int | None) -> Reply:
        return Reply(200, elastic_not_loaded_body(reserve_mib))

    @staticmethod
    def busy(message: str = "a request is still running; retry later") -> Reply:
        return Reply(409, elastic_error_body(message, type="model_busy", code="model_busy"))

    @staticmethod
    def refused(message: str = "VRAM needs an engine started with --vram-elastic") -> Reply:
        return Reply(400, elastic_error_body(message))

    @staticmethod
    def resize_failed(message: str = "VRAM: refilling the cache failed: out of memory") -> Reply:
        return Reply(400, elastic_error_body(message))

    @staticmethod
    def unavailable(message: str = "the engine did not answer in 120 s") -> Reply:
        return Reply(503, elastic_error_body(message, type="server_error"))

    # ── protocol ──────────────────────────────────────────────────────────────

    def handle(self, request: Recorded) -> ReplyLike:
        if request.path != VRAM_PATH or request.method != "POST":
            return Reply(404, elastic_error_body(f"no route {request.method} {request.path}"))
        if self.token is not None and request.bearer != self.token:
            return Reply(401, elastic_error_body("invalid API key", type="authentication_error"))
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            return Reply(
                415, elastic_error_body(f"content type must be application/json: {ctype!r}")
            )
        body = request.json
        if not isinstance(body, dict) or "reserve_mib" not in body:
            return Reply(400, elastic_error_body("reserve_mib is required"))
        reserve = body["reserve_mib"]
        if reserve is not None and (
            isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0
        ):
            return Reply(
                400, elastic_error_body(f"reserve_mib must be a whole number >= 0: {reserve!r}")
            )
        with self._lock:
            if self._script:
                return self._script.popleft()
        effective = self.start_reserve_mib if reserve is None else reserve
        cache = 8192 if reserve is None else max(8192 - reserve, 2048)
        return self.ok(effective, vram_free_mib=effective, expert_cache_mib=cache)


# ── the elastic engine as its document states it ───────────────────────────────


class Card:
    """One GPU as the engines on it measure it: free VRAM counts the whole card.

    ``other_used_mib`` is what programs other than the :class:`ElasticEngine` s on the
    card hold *now* (a serve that has reserved memory but not used it yet is not in
    it): that is why a card-wide figure says nothing about one engine.
    """

    def __init__(self, total_mib: int, *, other_used_mib: int = 0) -> None:
        self.total_mib = total_mib
        self.other_used_mib = other_used_mib
        self.engines: list[ElasticEngine] = []
        self.lock = threading.RLock()

    def used_mib(self) -> int:
        with self.lock:
            return self.other_used_mib + sum(e.used_mib for e in self.engines)

    def free_mib(self) -> int:
        """``cudaMemGetInfo``'s free figure: the card's total minus what anything holds."""
        return self.total_mib - self.used_mib()


class ElasticEngine(FakeHTTPServer):
    """An engine's ``POST /v1/vram`` answering as ``vram-elastic-reserve-api.txt`` says.

    The engine holds ``fixed_mib`` (dense weights, K/V, context, prompt buffers) plus an
    expert cache of whole ``segment_mib`` segments, at most ``cache_full_mib`` and never
    below ``floor_cache_mib`` (128 slots plus the smallest prompt-path loan, rounded up
    to a segment). ``reserve_mib`` asks that much VRAM be left free on the whole
    :class:`Card`: a shrink gives back whole segments, keeping enough to cover what must
    stay (so free can end a segment short of the reserve), never below the floor; a grow
    maps segments while a whole one fits beyond the reserve, up to full. Either way the
    answer is 200 ``ok`` with the figures measured after the call; ``null`` is the
    start-up reserve (``start_reserve_mib``). The server remembers the last reserve and
    applies it again after a load.

    Checks, in the engine's order: a foreign ``Origin`` (not in ``trusted_origins``) 403,
    the API key (``token``) 401, the content type 415, ``reserve_mib`` 400. While a
    request runs (:meth:`set_busy`) a resize waits up to ``busy_wait_s`` (300 s in the
    document) for it and then answers 409 ``model_busy``; a resize that got its turn runs
    even if its client stopped waiting. :meth:`fail_next` injects the failure paths:
    ``"release"`` (the driver refuses to release a segment: the slot count shrinks, the
    memory stays mapped, 400), ``"refill"`` (segments are mapped, refilling them fails,
    400) and ``"unavailable"`` (the engine ends mid-resize: the resize happened, 503).
    After either 400 the cache table is ``broken`` until ``POST /v1/unload`` and
    ``POST /v1/load`` start a fresh engine. Unloaded, ``/v1/vram`` answers ``not loaded``
    and only remembers the reserve.
    """

    def __init__(
        self,
        card: Card,
        *,
        fixed_mib: int,
        cache_full_mib: int,
        floor_cache_mib: int,
        segment_mib: int = 512,
        start_reserve_mib: int = 0,
        token: str | None = None,
        trusted_origins: Iterable[str] = (),
        busy_wait_s: float = 300.0,
    ) -> None:
        super().__init__()
        assert segment_mib >= 64, "the engine switches elasticity off below 64 MiB segments"
        assert cache_full_mib % segment_mib == 0, "the cache is whole segments"
        self.card = card
        self.fixed_mib = fixed_mib
        self.segment_mib = segment_mib
        self.full_segments = cache_full_mib // segment_mib
        self.floor_segments = -(-floor_cache_mib // segment_mib)
        self.start_reserve_mib = start_reserve_mib
        self.token = token
        self.trusted_origins = frozenset(trusted_origins)
        self.busy_wait_s = busy_wait_s
        self.segments = self.full_segments
        self.loaded = True
        self.broken = False
        self.remembered: int | None = None  # the last reserve asked (None: start-up default)
        self.reloads = 0
        self.answers: list[dict[str, Any]] = []  # every 200 ok body, in order
        self._idle = threading.Event()
        self._idle.set()
        self._control = threading.Lock()  # the engine's control lock: one resize at a time
        self._fail: deque[str] = deque()
        with card.lock:
            card.engines.append(self)

    def __enter__(self) -> ElasticEngine:
        self.start()
        return self

    # ── the engine's state ───────────────────────────────────────────────────

    @property
    def cache_mib(self) -> int:
        return self.segments * self.segment_mib

    @property
    def cache_full_mib(self) -> int:
        return self.full_segments * self.segment_mib

    @property
    def used_mib(self) -> int:
        """What the engine holds on the card now."""
        return self.fixed_mib + self.cache_mib if self.loaded else 0

    def set_busy(self, busy: bool) -> None:
        """A request is running (resizes wait for it) or no longer."""
        if busy:
            self._idle.clear()
        else:
            self._idle.set()

    def fail_next(self, kind: str) -> None:
        """The next resize fails: ``"release"``, ``"refill"`` or ``"unavailable"``."""
        assert kind in ("release", "refill", "unavailable")
        with self._lock:
            self._fail.append(kind)

    def restart(self) -> None:
        """The engine's server restarts: a full cache, and the reserve is forgotten."""
        with self.card.lock:
            self.segments = self.full_segments
            self.loaded, self.broken, self.remembered = True, False, None

    @property
    def requests(self) -> list[Recorded]:
        """The POSTs to ``/v1/vram``, in order."""
        return [c for c in self.calls if c.method == "POST" and c.path == VRAM_PATH]

    def reserves(self) -> list[int | None]:
        """``reserve_mib`` of every POST to ``/v1/vram`` received."""
        return [
            c.json.get("reserve_mib") if isinstance(c.json, dict) else None for c in self.requests
        ]

    def posts(self) -> list[str]:
        """The paths of every POST received, in order."""
        return [c.path for c in self.calls if c.method == "POST"]

    # ── protocol ──────────────────────────────────────────────────────────────

    def _body(self, reserve: int) -> dict[str, Any]:
        return elastic_ok_body(
            reserve,
            vram_free_mib=self.card.free_mib(),
            expert_cache_mib=self.cache_mib,
            expert_cache_full_mib=self.cache_full_mib,
            prompt_chunk=256 if self.segments == self.floor_segments else 512,
        )

    def _resize(self, reserve: int) -> None:
        """Shrink or grow so that ``reserve`` MiB stay free on the card (card lock held)."""
        seg = self.segment_mib
        free = self.card.free_mib()
        if free < reserve:
            must_stay = self.cache_mib - (reserve - free)
            keep = max(self.floor_segments, -(-max(must_stay, 0) // seg))
            self.segments = min(self.segments, keep)
        else:
            while self.segments < self.full_segments and self.card.free_mib() - seg >= reserve:
                self.segments += 1

    def handle(self, request: Recorded) -> ReplyLike:
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.trusted_origins:
            return Reply(403, elastic_error_body("not from Strata's own page", type="forbidden"))
        if self.token is not None and request.bearer != self.token:
            return Reply(401, elastic_error_body("invalid API key", type="authentication_error"))
        if request.method == "POST" and request.path in ("/v1/unload", "/v1/load"):
            return self._load(request.path == "/v1/load")
        if request.path != VRAM_PATH or request.method != "POST":
            return Reply(404, elastic_error_body(f"no route {request.method} {request.path}"))
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            return Reply(
                415, elastic_error_body(f"content type must be application/json: {ctype!r}")
            )
        body = request.json
        if not isinstance(body, dict) or "reserve_mib" not in body:
            return Reply(400, elastic_error_body("reserve_mib is required"))
        asked = body["reserve_mib"]
        if asked is not None and (
            isinstance(asked, bool) or not isinstance(asked, int) or asked < 0
        ):
            return Reply(
                400, elastic_error_body(f"reserve_mib must be a whole number >= 0: {asked!r}")
            )
        reserve = self.start_reserve_mib if asked is None else asked
        if not self.loaded:
            self.remembered = asked
            return Reply(200, elastic_not_loaded_body(reserve))
        if not self._idle.wait(self.busy_wait_s):
            return Reply(
                409,
                elastic_error_body(
                    "a request is still running or queued", type="model_busy", code="model_busy"
                ),
            )
        with self._control, self.card.lock:
            self.remembered = asked
            with self._lock:
                fail = self._fail.popleft() if self._fail else None
            before = self.segments
            if fail == "release":
                self.broken = True  # the slot count is updated, the segment stays mapped
                return Reply(
                    400,
                    elastic_error_body(
                        "VRAM: the driver refused to release an expert-cache segment"
                    ),
                )
            self._resize(reserve)
            if fail == "refill":
                self.broken = True  # segments are mapped, some experts are not back
                self.segments = max(self.segments, min(before + 1, self.full_segments))
                return Reply(
                    400, elastic_error_body("VRAM: refilling the cache failed: cudaErrorMemory")
                )
            if fail == "unavailable":
                return Reply(
                    503,
                    elastic_error_body("the engine did not answer in 120 s", type="server_error"),
                )
            body = self._body(reserve)
            self.answers.append(body)
            return Reply(200, body)

    def _load(self, load: bool) -> Reply:
        with self._control, self.card.lock:
            if not load:
                self.loaded = False
                return Reply(200, {"status": "unloaded"})
            if self.loaded:
                return Reply(200, {"status": "loaded"})
            room = self.card.free_mib() - self.fixed_mib - self.start_reserve_mib
            if room < self.floor_segments * self.segment_mib:
                return Reply(
                    503,
                    elastic_error_body("the GPU is in use by another program", type="server_error"),
                )
            # sized from what is free now, then the remembered reserve is applied
            self.segments = min(self.full_segments, room // self.segment_mib)
            self.loaded, self.broken = True, False
            self.reloads += 1
            if self.remembered is not None:
                self._resize(self.remembered)
            return Reply(200, {"status": "loaded"})


# ── an engine's Prometheus metrics ────────────────────────────────────────────


class FakeEngineMetrics(FakeHTTPServer):
    """``GET /metrics`` of one engine, with the running and waiting counts set by tests.

    ``engine`` is ``vllm``, ``sglang`` or ``llamacpp``; the page carries that engine's
    in-flight metrics beside a few others, labelled as the engine labels them (vLLM
    and SGLang by ``model_name``; ``models`` gives several series, each with the
    counts). ``set(running, waiting)`` changes the counts; ``fail(status)`` makes the
    page answer an error until ``set`` is called again.
    """

    PAGES: ClassVar[dict[str, tuple[str, str]]] = {
        "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    }

    def __init__(self, engine: str, *, models: tuple[str, ...] = ("m",)) -> None:
        super().__init__()
        if engine not in self.PAGES:
            raise ValueError(f"unknown engine {engine!r}")
        self.engine = engine
        self.models = models
        self._running = 0
        self._waiting = 0
        self._status = 200

    def set(self, running: int, waiting: int = 0) -> None:
        with self._lock:
            self._running, self._waiting, self._status = running, waiting, 200

    def fail(self, status: int = 503) -> None:
        with self._lock:
            self._status = status

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def page(self) -> str:
        """The metrics page as the engine writes it now."""
        with self._lock:
            running, waiting = self._running, self._waiting
        prefix = self.engine
        lines = [
            f"# HELP {prefix}:prompt_tokens_total Number of prefill tokens processed.",
            f"# TYPE {prefix}:prompt_tokens_total counter",
        ]
        labelled = self.engine != "llamacpp"
        for m in self.models:
            labels = f'{{model_name="{m}"}}' if labelled else ""
            lines.append(f"{prefix}:prompt_tokens_total{labels} 1234.0")
        for name, value in zip(self.PAGES[self.engine], (running, waiting), strict=True):
            lines += [f"# HELP {name} Requests.", f"# TYPE {name} gauge"]
            for m in self.models:
                labels = f'{{model_name="{m}"}}' if labelled else ""
                lines.append(f"{name}{labels} {float(value) if labelled else value}")
        return "\n".join(lines) + "\n"

    def handle(self, request: Recorded) -> ReplyLike:
        if request.path != "/metrics":
            return Reply(404, "not found")
        with self._lock:
            status = self._status
        if status != 200:
            return Reply(status, "unavailable")
        return Reply(200, self.page(), {"Content-Type": "text/plain; version=0.0.4"})
