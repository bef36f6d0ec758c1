"""Serving the API: its socket, bound before the loop starts, and uvicorn as a loop service.

:func:`bind_socket` binds the address at once, so that a port already in use stops
``vramctl run`` (exit 1) with a clear message instead of running without an API;
:func:`api_service` serves an app on it as one of the
:class:`~controller.service.loop.Controller`'s ``services``, on the loop's own event
loop, without uvicorn's signal handling (SIGTERM / SIGINT belong to the loop).

This module starts and stops the server; it reads no controller state.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import uvicorn
from fastapi import FastAPI
from loguru import logger

from controller.interfaces.client import ApiConfigError, base_url
from controller.service.loop import Controller


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for the API (listening starts with the server).

    Bound before the loop starts, so that an address in use is reported at once.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ApiConfigError(f"--api {host}:{port}: cannot resolve {host!r}: {exc}") from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        hint = (
            " (is another `vramctl run` running? choose another --api HOST:PORT, or --no-api)"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise ApiConfigError(
            f"the API cannot listen on {host}:{port}: {exc.strerror or exc}{hint}"
        ) from None
    sock.set_inheritable(False)
    return sock


class _LoopServer(uvicorn.Server):
    """uvicorn without its own signal handling: SIGTERM / SIGINT belong to the loop.

    uvicorn >= 0.29 installs handlers in ``capture_signals`` around ``serve``; the
    controller stops on the signal and cancels its services, which shuts this down.

    Its housekeeping tick (the ``Date`` header, once a second) runs once a second
    instead of ten times, and asking it to exit wakes it at once: an idle controller
    with the API would otherwise wake ten times a second for nothing.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_now = asyncio.Event()
        self._should_exit = False
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:
            self._exit_now.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864_000  # each tick is a second: the header each tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_now.wait(), 1.0)
            should_exit = await self.on_tick(counter)


async def warm_routes(app: FastAPI) -> None:
    """Ask ``app``, in process, for a path no route serves (404), before any client can.

    Starlette builds its middleware stack on the first call, and FastAPI each included
    router's matching state (its routes' schemas) the first time a request is matched
    against it: about 5 ms, which the first ``up`` after a start would otherwise pay.
    A 404 is matched against every router and changes nothing (no route runs).
    """
    path = "/.vramctl-warm-up"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(_message: Any) -> None:
        return None

    try:
        await app(scope, receive, send)
    except Exception as exc:  # the app answers for itself from the first real request
        logger.debug("api: warm-up: {}", exc)


def api_service(
    app: FastAPI, sock: socket.socket
) -> Callable[[Controller], Coroutine[Any, Any, None]]:
    """A ``Controller.services`` entry serving ``app`` on the already bound ``sock``."""

    async def service(_controller: Controller) -> None:
        config = uvicorn.Config(
            app,
            log_config=None,
            lifespan="on",  # the MCP session manager (/mcp) runs in it
            access_log=False,
            timeout_graceful_shutdown=3,
            server_header=False,
        )
        server = _LoopServer(config)
        await warm_routes(app)
        sock.listen(config.backlog)
        host, port = sock.getsockname()[:2]
        logger.info(
            "api: listening on {}",
            base_url(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"),
        )
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            close = getattr(app.state, "close_mcp_sessions", None)
            if close is not None:  # open MCP streams would hold the shutdown up
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(close(), 1.0)
            server.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 5.0)
            raise
        except Exception:
            logger.exception("api: the HTTP server failed; the loop goes on without it")
            return
        if not server.should_exit:
            logger.error("api: the HTTP server stopped; the loop goes on without it")

    return service
