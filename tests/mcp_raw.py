"""``/mcp`` over plain HTTP (httpx), as a client that is not the SDK's would speak it.

A session is opened by hand (``initialize``, then ``notifications/initialized``), a tool
is called with a JSON-RPC ``tools/call`` and its answer read from the response (one
Server-Sent Event, or plain JSON); :func:`flood` opens many sessions and never closes
them (no ``DELETE``), as a careless or hostile client would. Used by the ``/mcp``
tests and the chaos driver (``tests/chaos/driver.py``); nothing here is mocked.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

PROTOCOL = "2025-06-18"
ACCEPT = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": PROTOCOL,
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


def open_session(http: httpx.Client, url: str, headers: dict[str, str] | None = None) -> str:
    """A new session's id (``initialize`` answered 200, then ``initialized`` sent)."""
    r = http.post(url, json=INITIALIZE, headers={**ACCEPT, **(headers or {})})
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    done = http.post(
        url,
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers=session_headers(sid, headers),
    )
    assert done.status_code == 202, done.text
    return sid


def session_headers(sid: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    """The headers of a request inside session ``sid``."""
    return {
        **ACCEPT,
        **(headers or {}),
        "mcp-session-id": sid,
        "mcp-protocol-version": PROTOCOL,
    }


def post(
    http: httpx.Client,
    url: str,
    sid: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """``body`` (any JSON, or ``bytes`` as they are) posted inside session ``sid``."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {**session_headers(sid, headers), "Content-Type": "application/json"}
    return http.post(url, content=content, headers=h)


def call_tool(
    http: httpx.Client,
    url: str,
    sid: str,
    name: Any,
    arguments: Any,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """A ``tools/call`` of ``name`` with ``arguments`` (sent as given, valid or not)."""
    body = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    return post(http, url, sid, body, headers)


def message(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of an answer (the data of its one event, or its JSON body)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        assert data, response.text
        parsed: dict[str, Any] = json.loads(data[-1])
        return parsed
    body: dict[str, Any] = response.json()
    return body


def alive(http: httpx.Client, url: str, sid: str, headers: dict[str, str] | None = None) -> bool:
    """Whether the server still holds session ``sid`` (a ping answered, not 404)."""
    r = post(http, url, sid, {"jsonrpc": "2.0", "id": 9, "method": "ping"}, headers)
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


def flood(url: str, n: int, *, workers: int = 8, timeout_s: float = 30.0) -> Counter[int]:
    """Open ``n`` sessions without the token (``initialize`` only) and leave them open:
    each answer's status code, counted."""
    with httpx.Client(trust_env=False, timeout=timeout_s) as http:

        def one(_: int) -> int:
            return http.post(url, json=INITIALIZE, headers=ACCEPT).status_code

        with ThreadPoolExecutor(workers) as pool:
            return Counter(pool.map(one, range(n)))
