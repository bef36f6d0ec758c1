"""``GET /v1/events`` (Server-Sent Events) and the client ``vramctl events`` follows it with.

The route streams the controller's event bus (:mod:`controller.service.events`) as
``text/event-stream``: one SSE event per bus event, ``id:`` its sequence number,
``event:`` its kind, ``data:`` one line of JSON ``{"id", "kind", "at", "data"}``. A reader
resumes with the ``Last-Event-ID`` header (or ``?since=ID``): it gets every event after
that id still kept, preceded by a ``gap`` event (no ``id:``; data ``{"after", "first",
"missed", "reason"}``) when some are no longer kept; a reader that falls behind gets a
``gap`` the same way and goes on. A comment line (``: keepalive``) is sent after
``heartbeat_s`` of silence, so proxies keep the connection; when the controller stops,
an ``end`` event (no ``id:``) closes the stream. The kinds are listed in
docs/operations.md ("Event stream").

It is read-only like the other GETs: no token needed; without one the free-text
fields of an event (a failed step's detail, a refusal's message) are ``null`` and
named in ``withheld``; a wrong token is 403.

The client side (:func:`follow_events`) reconnects after a dropped connection with the
last id it saw, so nothing is missed silently (a ``gap`` says what was).

This module reads the bus and writes HTTP; it decides and changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import StreamingResponse

from controller.service.events import KINDS, Event, EventBus, Gap

#: Seconds of silence before a keepalive comment.
HEARTBEAT_S = 15.0
#: What a browser's EventSource waits before it reconnects (the ``retry:`` field), ms.
RETRY_MS = 2000
MEDIA_TYPE = "text/event-stream"


#: One SSE event of the stream, as OpenAPI before 3.2 describes an event stream (the
#: media type's ``schema`` is each event's): ``event`` the kind, ``data`` one JSON line.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": sorted({*KINDS, "gap", "end"})},
        "data": {
            "type": "string",
            "description": 'one line of JSON: {"id", "kind", "at", "data"[, "withheld"]} '
            '(gap and end: {"kind", "data"})',
        },
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "retry": {"type": "integer", "minimum": 0},
    },
}


class StreamRefused(Exception):  # noqa: N818 (reads as what happened)
    """The API refused the stream (a status other than 200); the message says why."""


class StreamUnreachable(Exception):  # noqa: N818 (reads as what happened)
    """Nothing answers at the API address (on the first try)."""


def sse_event(kind: str, data: dict[str, Any], event_id: int | None = None) -> str:
    """One SSE event: ``id:`` (when given), ``event:``, ``data:`` (one JSON line)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _item_text(item: Event | Gap, full: bool) -> str:
    if isinstance(item, Gap):
        return sse_event("gap", {"kind": "gap", "data": item.to_json()})
    return sse_event(item.kind, item.to_json(full=full), item.id)


def parse_last_id(header: str | None, since: str | None) -> int | None:
    """The id a reader resumes after (``Last-Event-ID`` wins over ``?since``); ValueError if bad."""
    for where, text in (("Last-Event-ID", header), ("since", since)):
        if text is None or not text.strip():
            continue
        value = text.strip()
        if not value.isdigit():
            raise ValueError(f"{where}: {value[:40]!r} is not an event id (a whole number >= 0)")
        return int(value)
    return None


def register_events(
    app: FastAPI,
    bus: EventBus,
    full_detail: Callable[[Request], bool],
    error: Callable[[int, str], Exception],
    heartbeat_s: float = HEARTBEAT_S,
) -> None:
    """Add ``GET /v1/events`` to ``app`` over ``bus``.

    ``full_detail`` says whether a request may see free text (and refuses a wrong
    token); ``error(status, message)`` builds the API's own error for a bad id.
    """

    @app.get(
        "/v1/events",
        response_class=StreamingResponse,
        responses={200: {"content": {MEDIA_TYPE: {"schema": SSE_EVENT_SCHEMA}}}},
    )
    async def events(
        request: Request,
        since: Annotated[
            str | None, Query(description="Begin after this event id (as Last-Event-ID).")
        ] = None,
        last_event_id: Annotated[
            str | None,
            Header(description="The last event id the reader saw: the stream resumes after it."),
        ] = None,
    ) -> StreamingResponse:
        """The event stream (Server-Sent Events); resume with ``Last-Event-ID``."""
        full = full_detail(request)
        try:
            last_id = parse_last_id(last_event_id, since)
        except ValueError as exc:
            raise error(422, str(exc)) from None

        async def stream() -> AsyncIterator[str]:
            sub = bus.subscribe(last_id)
            try:
                # the first chunk: the reader knows it is subscribed once it has it
                yield f"retry: {RETRY_MS}\n: vramctl events, last id {bus.last_id}\n\n"
                while True:
                    items = await sub.next(heartbeat_s)
                    if not items:
                        if sub.closed:
                            yield sse_event(
                                "end", {"kind": "end", "data": {"reason": "the controller stops"}}
                            )
                            return
                        yield f": keepalive {time.time():.0f}\n\n"
                        continue
                    yield "".join(_item_text(item, full) for item in items)
            finally:
                sub.close()

        return StreamingResponse(
            stream(),
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


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
    last = since
    connected_once = False
    timeout = httpx.Timeout(10.0, read=read_timeout_s)
    with httpx.Client(base_url=url, timeout=timeout, trust_env=False) as client:
        while True:
            ask = dict(headers)
            if last is not None:
                ask["Last-Event-ID"] = str(last)
            why = "the connection dropped"
            try:
                with client.stream("GET", "/v1/events", headers=ask) as response:
                    if response.status_code != 200:
                        response.read()
                        raise StreamRefused(_refusal(response))
                    connected_once = True
                    lines = response.iter_lines()
                    if on_open is not None:
                        lines = _opened(lines, on_open)
                    for event_id, kind, data in parse_sse(lines):
                        item = _decode(kind, data)
                        if event_id is not None and event_id.isdigit():
                            last = int(event_id)
                        if kind == "end":
                            why = "the controller stopped"
                        if not on_item(item):
                            return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if not connected_once:
                    raise StreamUnreachable(f"no vramctl run answers at {url} ({exc})") from None
                why = "nothing answers"
            except httpx.HTTPError as exc:
                why = f"the connection dropped ({type(exc).__name__})"
            if on_reconnect is not None:
                on_reconnect(why)
            sleep(retry_s)


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
