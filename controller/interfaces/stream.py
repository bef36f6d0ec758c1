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

The client side (:func:`follow_events`, in :mod:`controller.interfaces.client`, so
that a command reading the stream loads no server) reconnects after a dropped connection with the
last id it saw, so nothing is missed silently (a ``gap`` says what was).

This module reads the bus and writes HTTP; it decides and changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from controller.interfaces.client import (
    HEARTBEAT_S,
    MEDIA_TYPE,
)
from controller.service.events import KINDS, Event, EventBus, Gap

#: What a browser's EventSource waits before it reconnects (the ``retry:`` field), ms.
RETRY_MS = 2000


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


def events_router(
    bus: EventBus,
    full_detail: Callable[[Request], bool],
    error: Callable[[int, str], Exception],
    heartbeat_s: float = HEARTBEAT_S,
) -> APIRouter:
    """The router of ``GET /v1/events`` over ``bus`` (the API includes it).

    ``full_detail`` says whether a request may see free text (and refuses a wrong
    token); ``error(status, message)`` builds the API's own error for a bad id.
    """
    router = APIRouter()

    @router.get(
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

    return router
