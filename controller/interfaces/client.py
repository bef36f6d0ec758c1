"""The client side of ``vramctl run``'s HTTP API: what ``vramctl up`` / ``down`` /
``events`` (and ``run``, for its address and token) use to talk to a running loop.

- the ``--api`` address (:func:`parse_address`, :func:`base_url`) and the token
  (:func:`load_token`: ``--token-file`` or ``VRAMCTL_TOKEN``);
- one request and its JSON answer (:func:`call_api`);
- the event stream's reader (:func:`follow_events`, :func:`parse_sse`) and the line
  ``vramctl events`` prints for an event (:func:`describe`); the stream itself is
  served by :mod:`controller.interfaces.stream` (one connection is ``_follow_once``;
  :func:`follow_events` reconnects, its place kept in a ``_Cursor``).

It imports httpx and nothing of the server (FastAPI, uvicorn, the loop, the adapters):
a command that only talks to the API starts without loading them (docs/architecture.md).
It must not serve HTTP or change anything but through the API.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

#: where ``vramctl run`` listens unless told (``--api``)
DEFAULT_API = "127.0.0.1:8477"
#: Seconds of silence before a keepalive comment.
HEARTBEAT_S = 15.0
MEDIA_TYPE = "text/event-stream"


# ── the address and the token ────────────────────────────────────────────────


class ApiConfigError(Exception):
    """The API's configuration is unusable (address, token file); the message says why."""


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ApiConfigError when malformed."""
    text = address.strip()
    if text.startswith("http://"):
        text = text.removeprefix("http://").rstrip("/")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ApiConfigError(f"--api {address!r}: expected HOST:PORT, e.g. {DEFAULT_API}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ApiConfigError(f"--api {address!r}: write an IPv6 address in brackets, [::1]:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise ApiConfigError(f"--api {address!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ApiConfigError(f"--api {address!r}: port {port} is out of range 0-65535")
    return host, port


def base_url(address: str) -> str:
    """The ``http://`` URL of an ``--api`` address."""
    host, port = parse_address(address)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def load_token(token_file: Path | None, env: dict[str, str] | None = None) -> str | None:
    """The API token: the file's content (stripped) when given, else ``VRAMCTL_TOKEN``."""
    environ = os.environ if env is None else env
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ApiConfigError(
                f"--token-file {token_file}: cannot read it: {exc.strerror or exc}"
            ) from None
        if not token:
            raise ApiConfigError(f"--token-file {token_file}: the file is empty")
        from controller.store.lock import warn_if_open  # loguru: only with a file

        warn_if_open(token_file, "the token file")
        return token
    token = environ.get("VRAMCTL_TOKEN", "").strip()
    return token or None


# ── the client (vramctl up / down) ───────────────────────────────────────────


class ApiUnreachable(Exception):  # noqa: N818 (reads as what happened)
    """Nothing (or nothing usable) answers at the API address."""


def call_api(
    address: str,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, dict[str, Any]]:
    """One request to a running ``vramctl run``: (status, JSON body)."""
    url = base_url(address)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=url, timeout=timeout_s, trust_env=False) as client:
            response = client.request(method, path, headers=headers, json=body)
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise ApiUnreachable(
            f"no vramctl run answers at {url}; start `vramctl run` "
            "(up/down only talk to the running loop, they never act on their own)"
        ) from None
    except httpx.HTTPError as exc:
        raise ApiUnreachable(f"the vramctl API at {url} did not answer: {exc}") from None
    try:
        data = response.json()
    except ValueError:
        raise ApiUnreachable(
            f"{url} answered {response.status_code} but not with vramctl's JSON: "
            "is something else listening there?"
        ) from None
    if not isinstance(data, dict):
        raise ApiUnreachable(f"{url} answered {response.status_code} with unexpected JSON")
    return response.status_code, data


class StreamRefused(Exception):  # noqa: N818 (reads as what happened)
    """The API refused the stream (a status other than 200); the message says why."""


class StreamUnreachable(Exception):  # noqa: N818 (reads as what happened)
    """Nothing answers at the API address (on the first try)."""


# ── the client (vramctl events) ──────────────────────────────────────────────


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str | None, str, str]]:
    """(id, event, data) per SSE event in ``lines``; comments and ``retry:`` are skipped."""
    event_id: str | None = None
    kind = "message"
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                yield event_id, kind, "\n".join(data)
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            event_id = value
        elif name == "event":
            kind = value
        elif name == "data":
            data.append(value)


def follow_events(
    url: str,
    on_item: Callable[[dict[str, Any]], bool],
    *,
    token: str | None = None,
    since: int | None = None,
    on_reconnect: Callable[[str], None] | None = None,
    on_open: Callable[[], None] | None = None,
    retry_s: float = 1.0,
    read_timeout_s: float = 3 * HEARTBEAT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Follow ``url``'s event stream, handing each event's JSON to ``on_item``.

    Returns when ``on_item`` returns False. A dropped connection (or an ``end``: the
    controller stopped) is retried every ``retry_s`` with ``Last-Event-ID`` of the
    last event seen, after ``on_reconnect(why)``. ``on_open()`` is called once the
    stream's first bytes arrive (the reader is subscribed: nothing published from then on
    is missed), each time it is opened. Raises :class:`StreamRefused` when
    the API answers other than 200 and :class:`StreamUnreachable` when nothing answers
    at the first try.
    """
    headers = {"Accept": MEDIA_TYPE}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    cursor = _Cursor(last=since)
    timeout = httpx.Timeout(10.0, read=read_timeout_s)
    with httpx.Client(base_url=url, timeout=timeout, trust_env=False) as client:
        while True:
            ask = dict(headers)
            if cursor.last is not None:
                ask["Last-Event-ID"] = str(cursor.last)
            cursor.why = "the connection dropped"
            try:
                if _follow_once(client, ask, cursor, on_item, on_open):
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if not cursor.connected:
                    raise StreamUnreachable(f"no vramctl run answers at {url} ({exc})") from None
                cursor.why = "nothing answers"
            except httpx.HTTPError as exc:
                cursor.why = f"the connection dropped ({type(exc).__name__})"
            if on_reconnect is not None:
                on_reconnect(cursor.why)
            sleep(retry_s)


@dataclass(slots=True)
class _Cursor:
    """Where a followed stream stands: the last event id seen, whether it was ever
    opened, and why the last connection ended."""

    last: int | None
    connected: bool = False
    why: str = ""


def _follow_once(
    client: httpx.Client,
    ask: dict[str, str],
    cursor: _Cursor,
    on_item: Callable[[dict[str, Any]], bool],
    on_open: Callable[[], None] | None,
) -> bool:
    """One connection to the stream, each event handed to ``on_item``; whether it
    asked to stop. Raises :class:`StreamRefused` on an answer other than 200."""
    with client.stream("GET", "/v1/events", headers=ask) as response:
        if response.status_code != 200:
            response.read()
            raise StreamRefused(_refusal(response))
        cursor.connected = True
        lines = response.iter_lines()
        if on_open is not None:
            lines = _opened(lines, on_open)
        for event_id, kind, data in parse_sse(lines):
            item = _decode(kind, data)
            if event_id is not None and event_id.isdigit():
                cursor.last = int(event_id)
            if kind == "end":
                cursor.why = "the controller stopped"
            if not on_item(item):
                return True
    return False


def _opened(lines: Iterator[str], on_open: Callable[[], None]) -> Iterator[str]:
    """``lines``, calling ``on_open()`` when the first one has arrived."""
    for i, line in enumerate(lines):
        if i == 0:
            on_open()
        yield line


def _decode(kind: str, data: str) -> dict[str, Any]:
    try:
        item = json.loads(data)
    except ValueError:
        return {"kind": kind, "data": {"text": data}}
    if not isinstance(item, dict):
        return {"kind": kind, "data": {"value": item}}
    item.setdefault("kind", kind)
    return item


def _refusal(response: httpx.Response) -> str:
    try:
        message = response.json().get("error", response.text)
    except ValueError:
        message = response.text[:200]
    return f"{response.status_code}: {message}"


def describe(item: dict[str, Any]) -> str:
    """One line for an event, as ``vramctl events`` prints it."""
    kind = str(item.get("kind"))
    d: dict[str, Any] = item.get("data") or {}
    at = item.get("at")
    when = (
        datetime.fromtimestamp(float(at)).strftime("%H:%M:%S.%f")[:-3]
        if isinstance(at, int | float)
        else " " * 12
    )
    ident = f"#{item['id']}" if item.get("id") is not None else "-"
    text = _summary(kind, d)
    if item.get("withheld"):
        text += f"  ({', '.join(item['withheld'])} withheld: no token)"
    return f"{when} {ident} {kind}: {text}"


def _mib(value: Any) -> str:
    return "unknown" if value is None else str(value)


def _summary(kind: str, d: dict[str, Any]) -> str:
    if kind == "lifecycle":
        return f"{d.get('serve')} {d.get('from')} -> {d.get('to')} ({d.get('trigger')})"
    if kind == "plan.begun":
        steps = ", ".join(f"{s.get('action')} {s.get('serve')}" for s in d.get("steps") or [])
        return f"cycle {d.get('cycle')}: {steps}"
    if kind == "plan.ended":
        pending = d.get("pending") or []
        tail = f"; starts still running: {', '.join(pending)}" if pending else ""
        return f"cycle {d.get('cycle')}: {'ok' if d.get('ok') else 'not ok'}{tail}"
    if kind == "step":
        detail = d.get("detail")
        tail = f": {detail}" if detail else ""
        return f"{d.get('serve')} {d.get('action')} {d.get('outcome')}{tail}"
    if kind == "ledger":
        return (
            f"{d.get('gpu_role')} committed {_mib(d.get('committed_mib_before'))} -> "
            f"{_mib(d.get('committed_mib'))}, free {_mib(d.get('free_mib_before'))} -> "
            f"{_mib(d.get('free_mib'))} MiB"
        )
    if kind.startswith("request."):
        rest = {k: v for k, v in d.items() if k != "serve" and v is not None}
        extra = " ".join(f"{k}={v}" for k, v in rest.items())
        return f"{d.get('serve')} {extra}".rstrip()
    if kind == "gap":
        missed = d.get("missed")
        count = "some events" if missed is None else f"{missed} event(s)"
        after, first, reason = d.get("after"), d.get("first"), d.get("reason")
        return f"{count} missed after {after}; going on from {first}: {reason}"
    return " ".join(f"{k}={v}" for k, v in d.items())
