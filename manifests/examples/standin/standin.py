"""A stand-in serve for the examples: answers a health path, and the router's admin API.

Runs where no GPU or model is at hand: ``PORT`` (default 8000) on ``HOST`` (default
127.0.0.1), ``GET /health`` answers 200 ``ok``. It also plays the router of
docs/protocols.md, in the router's own answer shapes: ``POST /v1/admin/transition``
quiesces (keeping the reason), drains (at once: no requests run here) and readmits a
tier (always accepted, ``readmitted: true``), and ``GET /v1/admin/transition
[?tier_id=T]`` answers ``{"tiers": [{"tier_id", "state": "admitting"|"quiesced",
"reason", "active_requests", "draining", "ready"}]}``; any tier exists. Every request
is logged to stdout. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TRANSITION = "/v1/admin/transition"
_LOCK = threading.Lock()
_REASONS: dict[str, str] = {}  # tier -> its quiesce reason ("admitting": admitted)


def _row(tier: str) -> dict[str, object]:
    reason = _REASONS.get(tier, "admitting")
    return {
        "tier_id": tier,
        "state": "admitting" if reason == "admitting" else "quiesced",
        "reason": reason,
        "active_requests": 0,
        "draining": False,
        "ready": True,
    }


class Handler(BaseHTTPRequestHandler):
    server_version = "vramctl-standin/1"

    def _answer(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, body: object) -> None:
        self._answer(status, json.dumps(body).encode(), "application/json")

    def do_GET(self) -> None:
        split = urlsplit(self.path)
        if split.path == "/health":
            self._answer(200, b"ok\n")
        elif split.path == TRANSITION:
            tier = (parse_qs(split.query).get("tier_id") or [None])[0]
            with _LOCK:
                tiers = [tier] if tier else sorted(_REASONS)
                self._json(200, {"tiers": [_row(t) for t in tiers]})
        else:
            self._answer(404, b"not found\n")

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b"{}"
        if urlsplit(self.path).path != TRANSITION:
            self._answer(404, b"not found\n")
            return
        try:
            asked = json.loads(raw or b"{}")
        except ValueError:
            asked = None
        tier = asked.get("tier_id") if isinstance(asked, dict) else None
        if not isinstance(tier, str) or not tier:
            error = {"type": "invalid_transition", "message": "tier_id is required"}
            self._json(400, {"error": error})
            return
        action = asked.get("action")
        with _LOCK:
            if action == "quiesce":
                _REASONS[tier] = str(asked.get("reason") or "promotion")
                result: dict[str, object] = _row(tier)
            elif action == "drain":
                result = {"drained": True, "timed_out": False, "snapshot": _row(tier)}
            elif action == "readmit":
                _REASONS[tier] = "admitting"
                result = {
                    "readmitted": True,
                    "reason": "readiness_passed",
                    "status": {"tiers": [_row(tier)]},
                }
            else:
                error = {"type": "invalid_transition", "message": "unsupported action"}
                self._json(400, {"error": error})
                return
        self._json(200, {"applied": True, "action": action, "result": result})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        sys.stdout.write(f"{self.address_string()} {format % args}\n")
        sys.stdout.flush()


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    name = os.environ.get("STANDIN_NAME", "standin")
    role = os.environ.get("VRAMCTL_GPU_ROLE")  # where the controller put it, if told
    on = f" (gpu role {role})" if role else ""
    print(f"{name}: stand-in listening on {host}:{port}{on}", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
