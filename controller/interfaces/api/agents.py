"""``/mcp``: the agents' tools (:mod:`controller.interfaces.mcp_server`) over Streamable HTTP.

The same MCP server as ``vramctl mcp``, served by the API inside ``vramctl run`` and
answering from the running controller's live view, the objects ``GET /v1/ledger``,
``/v1/serves`` and ``/v1/fit`` answer from (:mod:`controller.interfaces.api.reads`),
never from a fresh observation:

- ``reservation_status``: ``GET /v1/ledger``'s roles (what is held, and the requests
  promised beside it), the host line;
- ``serves_status``: ``GET /v1/serves``'s rows (backoff, request, queue, footprint);
- ``can_fit``: ``GET /v1/fit/{serve}``'s answer (the requests accepted and not yet
  planned counted as held); ``{"vram_mib"}`` or ``{"model_path"}`` with ``gpu_role`` or
  ``placement``: the same for a hypothetical on-demand serve (model files are read on
  the controller's machine);
- ``plan_preview``: the plan an edited manifest would cause on the live observation;
  it reads no file but the manifest files ``vramctl run`` was started with.

Security is the API's (docs/agents.md): the Host / Origin guard of every route, then
the SDK's DNS-rebinding protection (``TransportSecuritySettings``) with the API's
address and ``--allow-origin``. ``/mcp`` is a read as the API's reads are: without
``Authorization`` it answers the read tools with names, states and figures only (the
free text withheld, as ``GET /v1/serves`` without the token, and every refusal a fixed
wording that echoes nothing); with the right token, in full, and the writes; a wrong
token is refused (403) before the body is read
(:class:`~controller.interfaces.api.guard.WriteGuard`). The sessions opened without the
token are bounded in count and lifetime, beside the token's own allowance
(:mod:`controller.interfaces.api.mcp_sessions`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import Request
from starlette.routing import Route

from controller.interfaces.api import reads, verbs
from controller.interfaces.api.context import ApiContext, detail
from controller.interfaces.api.errors import ApiError
from controller.interfaces.api.guard import MCP_AUTHORIZED, MCP_PATH
from controller.interfaces.api.mcp_sessions import SessionPools, sdk_max_sessions
from controller.interfaces.api.settings import LOOPBACK_NAMES, NO_TOKEN_MESSAGE, ApiSettings
from controller.interfaces.mcp_server import (
    Asked,
    Caller,
    ToolError,
    Tools,
    check_tool_arguments,
    http_transport,
    manifest_refusal,
)
from controller.manifest import ManifestError, ManifestSet, load_manifest_set
from controller.service.events import Event, Subscription
from controller.service.loop_port import LoopView

#: why a write is refused over HTTP without the token
WRITES_NEED_TOKEN = (
    "the writes need the API's token: send 'Authorization: Bearer TOKEN' (the token of "
    "`vramctl run --token-file` / VRAMCTL_TOKEN) with the requests to /mcp"
)


def caller_of(settings: ApiSettings) -> Callable[[Any], Caller]:
    """Who asks: the token the API's guard checked on the HTTP request of the call."""
    why_not = WRITES_NEED_TOKEN if settings.token is not None else NO_TOKEN_MESSAGE

    def who(ctx: Any) -> Caller:
        request = getattr(ctx, "request", None)
        authorized = isinstance(request, Request) and bool(request.scope.get(MCP_AUTHORIZED))
        return Caller(full=authorized, may_write=authorized, why_not=why_not, request=request)

    return who


class LiveBackend:
    """The tools' answers from the running controller (see the module doc).

    Every answer is computed on the loop's own event loop, between two of its awaits,
    as the API's routes are: nothing races the loop."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.tools = Tools(LiveSource(ctx))

    async def answer(
        self, name: str, arguments: Mapping[str, Any], caller: Caller
    ) -> dict[str, Any]:
        check_tool_arguments(name, arguments)
        args = dict(arguments)
        try:
            if name in self.tools.handlers:
                return self.tools.call(name, args, full=caller.full)
            if not caller.may_write or not isinstance(caller.request, Request):
                raise ToolError(caller.why_not, caller.why_not)
            if name == "request_up":
                return await self.request_up(args, caller, caller.request)
            return await self.release(args, caller.request)
        except ApiError as exc:
            raise ToolError(_refusal(exc.status, {"error": exc.message, **exc.body})) from None

    # the writes: the API's own routes, on the request that carried the call -------

    async def request_up(
        self, args: dict[str, Any], caller: Caller, request: Request
    ) -> dict[str, Any]:
        """``POST /v1/serves/{serve}/up``: admitted, queued or refused (every term);
        with ``wait_s``, held until ready, with a progress notification per event of
        the controller's stream that concerns it."""
        serve = str(args["serve"])
        try:
            body = verbs.UpBody(ttl_s=args.get("ttl_s"), wait_s=args.get("wait_s") or None)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ToolError(f"request_up: {problems}") from None
        sub = self.ctx.bus.subscribe()
        stop = asyncio.Event()
        relay = asyncio.ensure_future(_relay(sub, serve, caller, stop)) if body.wait_s else None
        try:
            response = await verbs.up(serve, request, self.ctx, body)
        finally:
            stop.set()  # the relay sends what came before the answer, then ends
            if relay is not None:
                await asyncio.wait({relay}, timeout=2.0)
                relay.cancel()  # a client that reads no notifications holds no answer
            sub.close()
        return _answer(response)

    async def release(self, args: dict[str, Any], request: Request) -> dict[str, Any]:
        """``POST /v1/serves/{serve}/down``."""
        return _answer(await verbs.down(str(args["serve"]), request, self.ctx))


class LiveSource:
    """The read tools' inputs inside ``vramctl run``: the loop's live situation (the
    one ``GET /v1/ledger``, ``/v1/serves`` and ``/v1/fit`` answer from), never a fresh
    observation. Asked on the loop's own event loop, as the routes are. ``plan_preview``
    reads no file but these (its ``manifest_path`` must name one of them)."""

    any_file = False

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def files(self) -> tuple[Path, ...]:
        """The manifest files the controller runs from (its options'; none for a port
        that has none)."""
        options = getattr(self.ctx.controller, "options", None)
        return tuple(Path(f) for f in getattr(options, "manifests", ()))

    def load(self, paths: tuple[Path, ...]) -> ManifestSet:
        return _load(paths)

    def ask(self, edit: ManifestSet | None = None, *, full: bool = True) -> Asked:
        view = self.ctx.controller.view()
        sit = self.ctx.controller.situation()
        if edit is not None:  # the edit, with the host and the requests as they are
            sit = sit.with_desired(replace(edit.desired(), requests=sit.desired.requests))
        return Asked(
            sit,
            reads.row_extras(self.ctx, view),
            self._source(view),
            self._notes(view, full),
            observed=view.snapshot is not None,
            digest=view.manifest_digest,
        )

    def _source(self, view: LoopView) -> dict[str, Any]:
        return {
            "manifests": [str(f) for f in self.files()],
            "observed": "live",
            "observed_at": view.observed_at,
            "docker": "unknown"
            if view.snapshot is None
            else ("ok" if view.snapshot.to_observed().docker_ok else "error"),
            "controller": "vramctl run",
            "cycles": view.cycles,
            "in_flight": [f.to_json() for f in view.live.in_flight],
        }

    def _notes(self, view: LoopView, full: bool) -> list[str]:
        notes: list[str] = []
        if view.snapshot is None:
            notes.append(
                "the controller has not completed its first cycle: what depends on the "
                "host is unknown (null)"
            )
        elif not view.snapshot.to_observed().docker_ok:
            notes.append("docker could not be read in the last cycle: nothing would be admitted")
        notes.extend(self.ctx.manifest_errors(view, full))
        if not full:
            notes.append(str(detail(False)["detail_note"]))
        return notes


def _answer(response: JSONResponse) -> dict[str, Any]:
    """A route's answer as the tool's: a success as it is, a refusal a tool error."""
    data = json.loads(bytes(response.body))
    if not isinstance(data, dict):
        data = {"answer": data}
    if response.status_code >= 400:
        raise ToolError(_refusal(response.status_code, data))
    retry = response.headers.get("retry-after")
    return {**data, "status": response.status_code, "retry_after_s": _number(retry)}


def _refusal(status: int, body: dict[str, Any]) -> str:
    """A refusal's text: its reason first, then the API's whole body (every term)."""
    reason = body.get("error") or body.get("message") or f"refused ({status})"
    return f"{reason}\n\n{json.dumps({**body, 'status': status}, indent=2)}"


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


async def _relay(sub: Subscription, serve: str, caller: Caller, stop: asyncio.Event) -> None:
    """Send a progress notification for each event about ``serve``'s request: the plan
    begun and ended, each step (the victims' too), its lifecycle, the request's own.
    Once ``stop`` is set (the answer is ready), what was published before it is sent
    too, so every step the answer rests on has been told before the answer."""
    if caller.progress is None:
        return
    sent = [0]
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not sub.closed and not stop.is_set():
            nxt = asyncio.ensure_future(sub.next(1.0))
            await asyncio.wait({nxt, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if nxt.done():
                await _send(nxt.result(), serve, caller, sent)
            else:  # the answer is ready: what is queued is taken below
                nxt.cancel()
        await _send(sub.take(), serve, caller, sent)
    finally:
        stopping.cancel()


async def _send(items: list[Any], serve: str, caller: Caller, sent: list[int]) -> None:
    """One progress notification per event of ``items`` about ``serve``'s request."""
    assert caller.progress is not None
    for item in items:
        message = _progress_message(item, serve) if isinstance(item, Event) else None
        if message is not None:
            sent[0] += 1
            await caller.progress(sent[0], None, message)


def _progress_message(event: Event, serve: str) -> str | None:
    """One line for an event about ``serve``'s request; ``None``: not about it."""
    d = event.data
    if event.kind == "plan.begun":
        steps = ", ".join(f"{s['action']} {s['serve']}" for s in d.get("steps", []))
        return f"plan of cycle {d.get('cycle')}: {steps or 'nothing to do'}"
    if event.kind == "step":
        return f"{d.get('action')} {d.get('serve')}: {d.get('outcome')}"
    if event.kind == "plan.ended":
        return f"plan of cycle {d.get('cycle')} ended ({'ok' if d.get('ok') else 'not ok'})"
    if d.get("serve") != serve:
        return None
    if event.kind == "lifecycle":
        return f"{serve}: {d.get('from')} -> {d.get('to')}"
    if event.kind.startswith("request."):
        return f"{serve}: {event.kind}"
    return None


def _load(paths: tuple[Path, ...]) -> ManifestSet:
    try:
        return load_manifest_set(list(paths))
    except ManifestError as exc:
        raise manifest_refusal(exc, "fix the file, then ask again") from None


def allowed_hosts(settings_host: str | None, port: int | None) -> list[str] | None:
    """The Host values the MCP transport accepts: the API's loopback address (with its
    port when known); ``None`` (not checked there) when the API is bound elsewhere."""
    if settings_host is None or settings_host not in LOOPBACK_NAMES:
        return None
    suffix = f":{port}" if port else ":*"
    return [f"{n}{suffix}" for n in ("127.0.0.1", "localhost", "[::1]")]


def mount_mcp(app: FastAPI, ctx: ApiContext) -> None:
    """Serve the MCP server at ``/mcp`` in ``app``, behind the bounds on its sessions
    (:mod:`controller.interfaces.api.mcp_sessions`), its session manager and their
    expiry run in the app's lifespan (uvicorn runs it: :mod:`controller.interfaces.api.serving`)."""
    settings = ctx.settings
    transport = http_transport(
        LiveBackend(ctx),
        caller_of(settings),
        allowed_hosts=allowed_hosts(settings.bind_host, settings.bind_port),
        allowed_origins=list(settings.allow_origins),
        max_sessions=sdk_max_sessions(settings),
    )
    pools = SessionPools(transport, settings)
    app.router.routes.append(Route(MCP_PATH, endpoint=pools))
    app.state.close_mcp_sessions = transport.close_sessions

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        async with transport.run(), pools.expiring():
            yield

    app.router.lifespan_context = lifespan
