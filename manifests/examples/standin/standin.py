"""A stand-in serve for the examples: answers a health path, and the router's admin API.

Runs where no GPU or model is at hand: ``PORT`` (default 8000) on ``HOST`` (default
127.0.0.1), ``GET /health`` answers 200 ``ok``; ``GET /v1/admin/transition`` answers 200,
and ``POST /v1/admin/transition`` applies nothing and says it did (``applied``,
``drained``, ``readmitted``), so a stand-in can also play the router of
docs/protocols.md. Every request is logged to stdout. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    server_version = "vramctl-standin/1"

    def _answer(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, b"ok\n")
        elif self.path == "/v1/admin/transition":
            self._answer(200, b'{"ok": true}', "application/json")
        else:
            self._answer(404, b"not found\n")

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b"{}"
        if self.path != "/v1/admin/transition":
            self._answer(404, b"not found\n")
            return
        try:
            asked = json.loads(raw or b"{}")
        except ValueError:
            self._answer(400, b'{"error": "not JSON"}', "application/json")
            return
        answer = {"applied": True, "drained": True, "readmitted": True, "request": asked}
        self._answer(200, json.dumps(answer).encode(), "application/json")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        sys.stdout.write(f"{self.address_string()} {format % args}\n")
        sys.stdout.flush()


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    name = os.environ.get("STANDIN_NAME", "standin")
    print(f"{name}: stand-in listening on {host}:{port}", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
