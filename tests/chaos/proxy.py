"""A unix-socket forwarder to the Docker daemon that a test can cut, and that notes starts.

The controller under test is given ``DOCKER_HOST=unix://<proxy.sock>``; every byte
between it (its SDK client, its event stream, the ``docker`` CLI of its ``up``
commands) and the daemon passes here. ``cut()`` closes every connection and removes
the socket (new connections are refused, as with a daemon that is down);
``restore()`` listens again. The daemon's own socket is only ever connected to as a
client: nothing here can disturb other users of the daemon.

Each request line ``POST /vX/containers/REF/start`` or ``POST
/vX/containers/create?name=NAME`` on a client connection is reported to ``on_request``
as a :class:`~chaos.monitor.RequestItem` stamped when the proxy received it (before
it is forwarded), and its ``status`` is filled in from the status line of the answer
(HTTP/1.1 clients send a connection's next request only after the answer, so the next
status line on that connection is this request's). Each container list
(``GET /vX/containers/json``) answered 200 is a *look* at the host: :attr:`looks`
holds when each answer's status line passed, in order.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, unquote

from chaos.monitor import RequestItem

_REQUEST = re.compile(
    rb"POST (?:/v[0-9.]+)?/containers/(?:([^/?\s]+)/start|create\?([^\s]*))[ ?]"
    rb"|(GET) (?:/v[0-9.]+)?/containers/json[ ?]"
)
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")
_TAIL = 512


class _Conn:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.awaiting: list[RequestItem] = []
        self.lock = threading.Lock()

    def close(self) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class DockerProxy:
    """Forward ``path`` to the daemon's socket ``upstream``; cut and restore on demand."""

    def __init__(
        self, path: Path, upstream: str, on_request: Callable[[RequestItem], None]
    ) -> None:
        self.path = path
        self.upstream = upstream
        self.on_request = on_request
        self.cuts = 0
        #: when the answer to each container list the clients asked for passed (ns)
        self.looks: list[int] = []
        self.connections = 0
        self._conns: set[_Conn] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="chaos-proxy")

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    # ── control ─────────────────────────────────────────────────────────────
    def start(self) -> DockerProxy:
        self._listen()
        self._thread.start()
        return self

    def cut(self) -> None:
        """Refuse new connections and close every open one."""
        self.cuts += 1
        self._cut.set()
        self._close_listener()
        with self._lock:
            conns, self._conns = set(self._conns), set()
        for c in conns:
            c.close()

    def restore(self) -> None:
        if self._cut.is_set():
            self._listen()
            self._cut.clear()

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(5)

    # ── plumbing ────────────────────────────────────────────────────────────
    def _listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(self.path))
        s.listen(64)
        s.settimeout(0.2)
        with self._lock:
            self._listener = s

    def _close_listener(self) -> None:
        with self._lock:
            s, self._listener = self._listener, None
        if s is not None:
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                s = self._listener
            if s is None:
                time.sleep(0.05)
                continue
            try:
                client, _ = s.accept()
            except (TimeoutError, OSError):
                continue
            if self._cut.is_set():
                client.close()
                continue
            try:
                up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                up.connect(self.upstream)
            except OSError:
                client.close()
                continue
            conn = _Conn(client, up)
            with self._lock:
                self._conns.add(conn)
                self.connections += 1
            threading.Thread(target=self._pump_requests, args=(conn,), daemon=True).start()
            threading.Thread(target=self._pump_answers, args=(conn,), daemon=True).start()

    def _pump_requests(self, conn: _Conn) -> None:
        tail = b""
        try:
            while True:
                data = conn.client.recv(65536)
                if not data:
                    break
                buf = tail + data
                for m in _REQUEST.finditer(buf):
                    if m.end() <= len(tail):
                        continue  # seen with the previous chunk
                    self._note(conn, m)
                tail = buf[-_TAIL:]
                conn.upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(conn)

    def _note(self, conn: _Conn, m: re.Match[bytes]) -> None:
        now = time.time_ns()
        if m.group(3) is not None:  # a list: its answer is a look, not a start
            with conn.lock:
                conn.awaiting.append(RequestItem(now, "controller", "list", ""))
            return
        if m.group(1) is not None:
            item = RequestItem(now, "controller", "start", unquote(m.group(1).decode()))
        else:
            query = parse_qs(m.group(2).decode(errors="replace"))
            name = (query.get("name") or [""])[0]
            if not name:
                return
            item = RequestItem(now, "controller", "create", name)
        with conn.lock:
            conn.awaiting.append(item)
        self.on_request(item)

    def _pump_answers(self, conn: _Conn) -> None:
        tail = b""
        try:
            while True:
                data = conn.upstream.recv(65536)
                if not data:
                    break
                with conn.lock:
                    if conn.awaiting:
                        buf = tail + data
                        for m in _STATUS.finditer(buf):
                            if m.end() <= len(tail) or not conn.awaiting:
                                continue
                            item = conn.awaiting.pop(0)
                            item.status = int(m.group(1))
                            if item.kind == "list" and item.status == 200:
                                with self._lock:
                                    self.looks.append(time.time_ns())
                        tail = buf[-64:]
                    else:
                        tail = b""
                conn.client.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        with self._lock:
            self._conns.discard(conn)
