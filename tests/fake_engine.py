"""A test engine that speaks vLLM's and SGLang's sleep protocols, on loopback.

Import as ``from fake_engine import ...`` (pytest puts ``tests/`` on ``sys.path``), or
run it as a process (``python tests/fake_engine.py --port P --protocol vllm ...``) for
tests that drive a ``vramctl run`` subprocess: it prints ``ready PORT`` once it listens.

It answers as the real servers do (their HTTP handlers were read for this: vLLM's
``entrypoints/serve/sleep/api_router.py``, ``serve/dev/rpc/api_router.py`` and
``serve/cache/api_router.py``; SGLang's ``srt/entrypoints/http_server.py`` and its
scheduler's memory-occupation mixin), status codes and bodies included:

**vLLM** (``protocol="vllm"``; the endpoints exist only with ``VLLM_SERVER_DEV_MODE=1``,
so ``enabled=False`` answers every one of them with FastAPI's 404
``{"detail": "Not Found"}``):

- ``POST /sleep?level=1|2[&mode=abort|wait]`` → 200, empty body. Level 1 keeps the
  weights in host RAM and drops the KV cache; any other level drops both (vLLM's worker
  offloads the weights only for level 1). ``mode`` defaults to ``abort``: requests in
  flight are aborted (counted in :attr:`FakeEngine.aborted`); ``wait`` waits for them.
  A level that is not a number → 500 ``Internal Server Error`` (vLLM's ``int(level)``
  raises). Already asleep: 200 and nothing changes (the executor warns and returns).
  The answer comes before the memory is freed (``free_lag_s``).
- ``POST /wake_up[?tags=weights][&tags=kv_cache]`` → 200, empty body, after
  ``wake_s`` (the call awaits the engine). No tags wakes everything; the engine is
  asleep until every tag is awake. Not asleep: 200, nothing changes.
- ``GET /is_sleeping`` → ``{"is_sleeping": bool}``.
- ``POST /collective_rpc {"method": "reload_weights"}`` → ``{"results": [null]}`` (one
  worker); without ``method`` → 400 ``{"detail": "Missing 'method' in request body"}``;
  a body that is not JSON → 400 ``{"detail": "JSON decode error: ..."}``.
- ``POST /reset_prefix_cache`` → 200, empty body.

After a level-2 wake the weights are garbage until ``reload_weights``
(:attr:`FakeEngine.weights_valid`), and the prefix cache is stale until
``reset_prefix_cache``.

**SGLang** (``protocol="sglang"``): ``POST /release_memory_occupation`` and ``POST
/resume_memory_occupation`` with an optional ``{"tags": [...]}`` (none or empty: both
``weights`` and ``kv_cache``) → 200 with JSON ``null`` (the handler returns nothing).
Release while requests run: 400 ``{"error": {"message": "release_memory_occupation
should be called only when server is idle."}}`` (the scheduler's assertion, answered
by ``_create_error_response``). Resuming a tag that is not released: 400 with the
``KeyError``'s text. Without ``--enable-memory-saver`` (``enabled=False``) SGLang's
memory saver is a no-op: both calls answer 200 and nothing is freed (there is no 404
to tell; only the device shows it).

Both answer ``GET /health`` 200 once loaded (``load_s`` after :meth:`FakeEngine.start`
or :meth:`FakeEngine.restart`), 503 before; asleep, the engine is still healthy (vLLM's
``/health`` checks the engine process, not its weights).

**Memory.** With a scripted NVML device (``device``, a :class:`fakes_nvml.FakeDevice`)
the engine is one process (``pid``) on it: awake it uses ``weights_mib + kv_mib +
residual_mib``; asleep ``residual_mib`` (the CUDA context and buffers it keeps). Either
protocol answers its sleep **before** the memory is freed, as the real engines may
(docs/protocols.md "Sleep and wake"): the drop is applied ``free_lag_s`` after the
answer, :data:`FREE_LAG_S` unless told (``free_lag_s=0`` frees it before the answer).
:attr:`host_ram_mib` is what a level-1 sleeper keeps in host RAM (its weights).

These are test doubles only: nothing in ``controller/`` may import this module.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from fake_http import FakeHTTPServer, Recorded, Reply, ReplyLike

__all__ = ["FREE_LAG_S", "SGLANG_IDLE_MESSAGE", "FakeEngine"]

MIB = 1024 * 1024
#: seconds between a sleep's answer and its memory coming down on the device, by default
FREE_LAG_S = 0.5
SGLANG_IDLE_MESSAGE = "release_memory_occupation should be called only when server is idle."
_TAGS = ("weights", "kv_cache")
_NOT_FOUND = Reply(404, {"detail": "Not Found"})
_VLLM_PATHS = ("/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache")
_SGLANG_PATHS = ("/release_memory_occupation", "/resume_memory_occupation")


class FakeEngine(FakeHTTPServer):
    """One engine that can sleep; see the module docstring for what it answers."""

    def __init__(
        self,
        protocol: str = "vllm",
        *,
        enabled: bool = True,
        weights_mib: int = 6000,
        kv_mib: int = 3000,
        residual_mib: int = 1000,
        load_s: float = 0.0,
        wake_s: float = 0.0,
        reload_s: float = 0.0,
        free_lag_s: float = FREE_LAG_S,
        device: Any = None,
        pid: int = 4242,
    ) -> None:
        super().__init__()
        if protocol not in ("vllm", "sglang"):
            raise ValueError(f"protocol must be vllm or sglang, not {protocol!r}")
        self.protocol = protocol
        self.enabled = enabled
        self.weights_mib = weights_mib
        self.kv_mib = kv_mib
        self.residual_mib = residual_mib
        self.load_s = load_s
        self.wake_s = wake_s
        self.reload_s = reload_s
        self.free_lag_s = free_lag_s
        self.device = device
        self.pid = pid
        #: False: ``/sleep`` answers 200 but nothing happens (a sleep that never takes)
        self.sleep_takes_effect = True
        self.cond = threading.Condition()
        #: tags asleep now (vLLM's executor ``sleeping_tags``; SGLang's ``offload_tags``)
        self.sleeping_tags: set[str] = set()
        self.is_sleeping = False
        self.level: int | None = None
        self.weights_valid = True
        self.prefix_cache_stale = False
        self.in_flight = 0
        self.aborted = 0
        self.loaded_at = 0.0
        self.restarts = 0
        #: a scripted status for the next call of a path: path -> Reply
        self.forced: dict[str, Reply] = {}
        self._used_mib = 0  # what the engine's process uses on its device now
        self._generation = 0  # bumped by restart/sleep/wake: a late free is dropped

    # ── lifecycle ─────────────────────────────────────────────────────────────

    def __enter__(self) -> FakeEngine:
        self.start()
        return self

    def start(self) -> FakeEngine:
        super().start()
        self._load()
        return self

    def stop(self) -> None:
        super().stop()
        self._set_used(0)

    def restart(self) -> None:
        """The container restarted: a fresh engine, awake, loading its weights again."""
        with self.cond:
            self.restarts += 1
            self.sleeping_tags.clear()
            self.is_sleeping = False
            self.level = None
            self.weights_valid = True
            self.prefix_cache_stale = False
            self.in_flight = 0
        self._load()

    def exited(self) -> None:
        """Its container stopped: the process is gone, and so is its memory."""
        with self.cond:
            self._generation += 1
            self.is_sleeping = False
            self.sleeping_tags.clear()
        self._set_used(0)

    def _load(self) -> None:
        self.loaded_at = time.monotonic() + self.load_s
        self._set_used(self.full_mib)

    @property
    def loaded(self) -> bool:
        return time.monotonic() >= self.loaded_at

    @property
    def full_mib(self) -> int:
        return self.weights_mib + self.kv_mib + self.residual_mib

    @property
    def used_mib(self) -> int:
        """What the engine's process uses on its device now."""
        with self.cond:
            return self._used_mib

    @property
    def host_ram_mib(self) -> int:
        """Host RAM a sleeper holds: its weights, for a vLLM level-1 sleep (SGLang stashes
        them the same way when it releases ``weights``)."""
        with self.cond:
            if not self.is_sleeping or "weights" not in self.sleeping_tags:
                return 0
            return self.weights_mib if self.level == 1 else 0

    def set_in_flight(self, n: int) -> None:
        """Requests running now (aborted by a vLLM sleep; refused by an SGLang release)."""
        with self.cond:
            self.in_flight = n
            self.cond.notify_all()

    def force(self, path: str, reply: ReplyLike) -> None:
        """Answer the next call of ``path`` with ``reply`` (once)."""
        status, body = (reply.status, reply.body) if isinstance(reply, Reply) else reply
        self.forced[path] = Reply(status, body)

    # ── memory on the scripted device ────────────────────────────────────────

    def _set_used(self, mib: int) -> None:
        with self.cond:
            delta = mib - self._used_mib
            self._used_mib = mib
            dev = self.device
            if dev is None:
                return
            dev.used = max(0, dev.used + delta * MIB)
            dev.compute = [p for p in dev.compute if p.pid != self.pid]
            if mib > 0:
                from support.fakes_nvml import FakeProc

                dev.compute.append(FakeProc(pid=self.pid, usedGpuMemory=mib * MIB))

    def _held_mib(self) -> int:
        """What the engine holds for its tags as they are now."""
        held = self.residual_mib
        if "weights" not in self.sleeping_tags:
            held += self.weights_mib
        if "kv_cache" not in self.sleeping_tags:
            held += self.kv_mib
        return held

    def _free_later(self) -> None:
        """Apply what the sleep frees after ``free_lag_s`` (the answer came first)."""
        with self.cond:
            self._generation += 1
            gen, target = self._generation, self._held_mib()
        if self.free_lag_s <= 0:
            self._set_used(target)
            return

        def later() -> None:
            time.sleep(self.free_lag_s)
            with self.cond:
                if gen == self._generation:
                    self._set_used(target)

        threading.Thread(target=later, daemon=True).start()

    def _take_now(self) -> None:
        with self.cond:
            self._generation += 1
            self._set_used(self._held_mib())

    # ── HTTP ──────────────────────────────────────────────────────────────────

    def handle(self, request: Recorded) -> ReplyLike:
        forced = self.forced.pop(request.path, None)
        if forced is not None:
            return forced
        if request.path == "/health" and request.method == "GET":
            return Reply(200, None) if self.loaded else Reply(503, None)
        if self.protocol == "vllm" and request.path in _VLLM_PATHS:
            return self._vllm(request) if self.enabled else _NOT_FOUND
        if self.protocol == "sglang" and request.path in _SGLANG_PATHS:
            return self._sglang(request)
        return _NOT_FOUND

    # vLLM
    def _vllm(self, request: Recorded) -> ReplyLike:
        path, method = request.path, request.method
        if path == "/is_sleeping" and method == "GET":
            with self.cond:
                return Reply(200, {"is_sleeping": self.is_sleeping})
        if method != "POST":
            return Reply(405, {"detail": "Method Not Allowed"})
        if path == "/sleep":
            return self._vllm_sleep(request)
        if path == "/wake_up":
            return self._vllm_wake(request)
        if path == "/collective_rpc":
            if request.body and request.json is None:
                return Reply(400, {"detail": "JSON decode error: Expecting value"})
            body = request.json if isinstance(request.json, dict) else {}
            method_name = body.get("method")
            if method_name is None:
                return Reply(400, {"detail": "Missing 'method' in request body"})
            if method_name != "reload_weights":
                return Reply(500, "Internal Server Error")
            if self.reload_s > 0:
                time.sleep(self.reload_s)
            with self.cond:
                self.weights_valid = True
            return Reply(200, {"results": [None]})
        # /reset_prefix_cache
        with self.cond:
            self.prefix_cache_stale = False
        return Reply(200, None)

    def _vllm_sleep(self, request: Recorded) -> ReplyLike:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            return Reply(500, "Internal Server Error")
        mode = request.query.get("mode", "abort")
        with self.cond:
            if mode == "wait":
                while self.in_flight > 0:
                    self.cond.wait(0.05)
            else:
                self.aborted += self.in_flight
                self.in_flight = 0
            if self.is_sleeping:  # "Executor is already sleeping."
                return Reply(200, None)
            if not self.sleep_takes_effect:
                return Reply(200, None)
            self.is_sleeping = True
            self.level = level
            self.sleeping_tags = set(_TAGS)
            if level != 1:
                self.weights_valid = False
        self._free_later()
        return Reply(200, None)

    def _vllm_wake(self, request: Recorded) -> ReplyLike:
        tags = [v for k, v in _query_list(request) if k == "tags"]
        with self.cond:
            if not self.is_sleeping:  # "Executor is not sleeping."
                return Reply(200, None)
            if any(t not in self.sleeping_tags for t in tags):
                return Reply(200, None)  # warned and returned, nothing woken
        if self.wake_s > 0:
            time.sleep(self.wake_s)
        with self.cond:
            if tags:
                self.sleeping_tags -= set(tags)
            else:
                self.sleeping_tags.clear()
            if not self.sleeping_tags:
                self.is_sleeping = False
                if self.level != 1:
                    self.prefix_cache_stale = True
        self._take_now()
        return Reply(200, None)

    # SGLang
    def _sglang(self, request: Recorded) -> ReplyLike:
        if request.method not in ("GET", "POST"):
            return Reply(405, {"detail": "Method Not Allowed"})
        body = request.json if isinstance(request.json, dict) else {}
        tags = list(body.get("tags") or _TAGS)
        if request.path == "/release_memory_occupation":
            with self.cond:
                if self.in_flight > 0:
                    return Reply(400, {"error": {"message": SGLANG_IDLE_MESSAGE}})
                if not self.enabled:
                    return Reply(200, None)  # the memory saver is a no-op without the flag
                self.sleeping_tags |= set(tags)
                self.is_sleeping = True
                self.level = 1
            self._free_later()
            return Reply(200, None)
        with self.cond:
            if not self.enabled:
                return Reply(200, None)
            missing = [t for t in tags if t not in self.sleeping_tags]
            if missing:
                return Reply(400, {"error": {"message": repr(missing[0])}})
        if self.wake_s > 0:
            time.sleep(self.wake_s)
        with self.cond:
            self.sleeping_tags -= set(tags)
            self.is_sleeping = bool(self.sleeping_tags)
        self._take_now()
        return Reply(200, None)


def _query_list(request: Recorded) -> list[tuple[str, str]]:
    """Every ``key=value`` of the query, repeated keys kept (``Recorded.query`` keeps the
    last one only)."""
    from urllib.parse import parse_qsl

    return parse_qsl(request.raw_query, keep_blank_values=True)


def main(argv: list[str] | None = None) -> int:
    """Run one engine as a process until SIGTERM/SIGINT (for tests of ``vramctl run``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--protocol", default="vllm")
    parser.add_argument("--disabled", action="store_true", help="not started with the flag")
    parser.add_argument("--load-s", type=float, default=0.0)
    parser.add_argument("--wake-s", type=float, default=0.0)
    parser.add_argument("--reload-s", type=float, default=0.0)
    parser.add_argument("--free-lag-s", type=float, default=FREE_LAG_S)
    args = parser.parse_args(argv)
    engine = FakeEngine(
        args.protocol,
        enabled=not args.disabled,
        load_s=args.load_s,
        wake_s=args.wake_s,
        reload_s=args.reload_s,
        free_lag_s=args.free_lag_s,
    )
    engine.bind_port = args.port
    engine.start()
    print(f"ready {engine.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
