"""Swap latency: an on-demand request until the requester is healthy, stop vs sleep.

Against a real ``vramctl run`` subprocess on the real Docker daemon (with its HTTP API
on a free loopback port), two ways of making room on one 10000 MiB role for an
on-demand serve ``small`` (5000 MiB) beside an evictable ``big`` (8000 MiB):

``stop``
    ``big`` has no ``[serve.sleep]``: the request stops it and cold-starts ``small``,
    whose container loads for ``--cold-s`` seconds (busybox ``sleep``, then httpd on
    its health path) before it answers.
``sleep``
    Both can sleep (the test engine of tests/fake_engine.py, vLLM's protocol, one per
    serve, in this process). ``small`` sleeps already (its container runs, its engine
    sleeps, the journal holds its sleep record, as after an earlier swap): the request
    puts ``big`` to sleep and wakes ``small``, whose engine takes ``--wake-s`` seconds
    in all to wake (two ``/wake_up`` calls, weights then KV cache).

The default load and wake times are the published figures for Qwen3-Coder-30B on an
A100 (vLLM's sleep-mode blog: a 47 s cold start against a 2.9 s level-1 wake), scaled
down ten times: 4.7 s and 0.29 s.

Each repetition prepares the state by hand with no controller running (in ``stop``, it
first times Docker's own stop of ``big`` and start of ``small`` through the SDK, then
puts them back: ``docker_s``), starts the controller, waits until it has run two
cycles without a step (converged), then sends ``POST /v1/serves/small/up`` with
``wait_s``, as a waiting client does, from a client made before the clock starts. The
latency is from the send to that held answer (200, ready). Meanwhile the bench polls
(every 10 ms) until ``small`` is healthy as the engine sees it (``seen_ready_s``:
``stop``, its health path answers 2xx; ``sleep``, its engine says it is awake and its
health path answers).

The controller's own share is the latency less the engine's (``--cold-s`` or
``--wake-s``) and less Docker's own stop and start (``stop`` only): the API's
acceptance, the cycle's observation and plan, the victim's sleep and its confirmation,
the requester's reserve and wake calls, the detection of its readiness and the answer.
``phases_ms`` says where each went, in ms from the send, read off the controller's
log (``VRAMCTL_LOG_LEVEL=DEBUG``): ``accepted`` (the API recorded the request), the
cycle's parts, each step's start and end, ``answered``. The controller is stopped
(SIGTERM) after each repetition.

Output: one JSON line per repetition and one ``summary`` line: the median of each mode,
the medians of the controller's share, their ratio (stop / sleep) beside the engines'
own (``cold_s / wake_s``) and the one over the other (``ratio_vs_engines``, 1: the
controller adds nothing to either side).

Not measured: NVML (none here: a sleep is confirmed by the engine's ``/is_sleeping``;
with NVML the executor also waits for the device to show the memory back), router
drains, real engines (the test engine's figures are set, not measured).

Usage::

    .venv/bin/python benchmarks/bench_swap.py --reps 5   # ~1.5 min here
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import httpx
from benchkit import run_argv
from docker.errors import NotFound

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fake_engine import FakeEngine  # noqa: E402
from support.serving import free_port  # noqa: E402

from controller.store.journal import Journal, SleepRecord, journal_path  # noqa: E402

TOKEN = "bench-token"
ROLE = """
[host]
ram_mib = 65536
reserve_mib = 8192

[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def serve(name: str, mib: int, residency: str, port: int, extra: str = "") -> str:
    want = 'desired = "running"' if residency == "evictable" else ""
    return f"""
[[serve]]
name = "{name}"
container = "@{name}"
gpu_role = "a"
vram_mib = {mib}
residency = "{residency}"
port = {port}
health = "/health"
start_timeout_s = 60
stop_timeout_s = 5
{want}
{extra}
"""


def sleep_table(engine: FakeEngine) -> str:
    return (
        'engine = "vllm"\n[serve.sleep]\nlevel = 1\nresidual_mib = 1000\n'
        f'host_ram_mib = 6000\nurl = "{engine.url}"\nprotocol = "vllm"\n'
    )


def health_cmd(port: int, delay_s: float = 0.0) -> list[str]:
    pre = f"sleep {delay_s}; " if delay_s > 0 else ""
    return [
        "sh",
        "-c",
        f"{pre}mkdir -p /www && echo ok > /www/health && exec httpd -f -p 127.0.0.1:{port} -h /www",
    ]


#: the bench's own probe client: one, since a new client per poll (its TLS context)
#: would take the CPU from the test engines that answer in this process
_PROBE = httpx.Client(trust_env=False)


def healthy(port: int) -> bool:
    try:
        return _PROBE.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(
    what: str, check: Callable[[], bool], timeout: float = 60.0, poll: float = 0.01
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(poll)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client = docker.from_env(timeout=60)
        self.prefix = f"vramctl-bench-swap-{uuid.uuid4().hex[:8]}-"
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-swap-"))
        self.created: list[str] = []
        self.ports = {"big": free_port(), "small": free_port()}
        self.api = free_port()
        #: the requester's client, made before each request is timed (a router keeps
        #: its own): a new one loads its TLS context, about 20 ms that are neither the
        #: controller's nor the engine's; one per controller, so no connection is left
        #: over from the one before
        self.http = httpx.Client(trust_env=False)

    def name(self, s: str) -> str:
        return self.prefix + s

    def container(self, s: str, command: list[str]) -> None:
        c = self.client.containers.create(
            self.args.image,
            command,
            name=self.name(s),
            init=True,
            network_mode="host",
            labels={"vramctl.bench": "1"},
        )
        self.created.append(c.name)

    def status(self, s: str) -> str:
        return str(self.client.containers.get(self.name(s)).status)

    def ensure(self, s: str, running: bool) -> None:
        c = self.client.containers.get(self.name(s))
        if running and c.status != "running":
            c.start()
        if not running and c.status == "running":
            c.stop(timeout=5)

    def docker_own(self) -> float:
        """Docker's own stop of ``big`` and start of ``small`` (their SDK calls timed),
        then put back: what a stop → cold start costs with no controller."""
        big = self.client.containers.get(self.name("big"))
        small = self.client.containers.get(self.name("small"))
        t0 = time.monotonic()
        big.stop(timeout=5)
        small.start()
        took = time.monotonic() - t0
        small.stop(timeout=5)
        big.start()
        wait_for("big healthy", lambda: healthy(self.ports["big"]))
        return round(took, 3)

    def controller(self, state: Path, manifest: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ, VRAMCTL_TOKEN=TOKEN, PYTHONPATH=str(REPO))
        env["VRAMCTL_LOG_LEVEL"] = "DEBUG"  # each cycle's phases
        argv = run_argv(manifest, state, 1, "--api", f"127.0.0.1:{self.api}")
        out = (state.parent / "run.log").open("ab")
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def converged(self, state: Path) -> None:
        """The API answers and two cycles pass with no step (nothing left to do)."""
        wait_for(
            "the API",
            lambda: _ok(f"http://127.0.0.1:{self.api}/healthz"),
            timeout=60,
            poll=0.05,
        )
        time.sleep(2.5)

    def request(self, result: dict[str, float]) -> None:
        """``up small`` held until it is ready (``wait_s``): its send and answer times."""
        result["sent"] = time.time()
        r = self.http.post(
            f"http://127.0.0.1:{self.api}/v1/serves/small/up",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={"ttl_s": 3600, "wait_s": 60},
            timeout=90,
        )
        result["answered"] = time.time()
        if r.status_code != 200 or not r.json().get("ready"):
            raise RuntimeError(f"up answered {r.status_code}: {r.text}")

    def run_mode(self, mode: str) -> list[dict[str, Any]]:
        args = self.args
        engines: dict[str, FakeEngine] = {}
        if mode == "sleep":
            per_call = args.wake_s / 2  # weights, then KV cache
            for s in ("big", "small"):
                engines[s] = FakeEngine("vllm", wake_s=per_call).start()
        pb, ps = self.ports["big"], self.ports["small"]
        self.prefix = f"vramctl-bench-swap-{uuid.uuid4().hex[:8]}-"
        self.container("big", health_cmd(pb))
        cold = args.cold_s if mode == "stop" else 0.0
        self.container("small", health_cmd(ps, cold))
        big_extra = sleep_table(engines["big"]) if mode == "sleep" else ""
        small_extra = sleep_table(engines["small"]) if mode == "sleep" else ""
        body = (ROLE + serve("big", 8000, "evictable", pb, big_extra)).replace("@", self.prefix)
        body += serve("small", 5000, "on-demand", ps, small_extra).replace("@", self.prefix)
        rows = []
        try:
            for rep in range(args.reps):
                work = self.tmp / f"{mode}-{rep}"
                state = work / "state"
                state.mkdir(parents=True)
                manifest = work / "serves.toml"
                manifest.write_text(body)
                self.ensure("big", True)
                wait_for("big healthy", lambda: healthy(pb))
                if mode == "stop":
                    self.ensure("small", False)
                else:
                    self.ensure("small", True)
                    engines["big"].restart()  # awake and full
                    engines["small"].restart()
                    httpx.post(engines["small"].url + "/sleep?level=1", timeout=5)
                    started = self.client.api.inspect_container(self.name("small"))["State"][
                        "StartedAt"
                    ]
                    with Journal.open(journal_path(state)) as j:
                        j.set_sleeping(
                            SleepRecord(
                                container=self.name("small"),
                                serve="small",
                                level=1,
                                gpu_roles=("a",),
                                residual_mib=1000,
                                host_ram_mib=6000,
                                started_at=str(started),
                                since=time.time(),
                            )
                        )
                docker_s = self.docker_own() if mode == "stop" else 0.0
                self.http.close()
                self.http = httpx.Client(trust_env=False)
                proc = self.controller(state, manifest)
                try:
                    self.converged(state)
                    if mode == "stop" and self.status("small") == "running":
                        raise RuntimeError("small started before the request")
                    times: dict[str, float] = {}
                    asker = threading.Thread(target=self.request, args=(times,))
                    asker.start()
                    if mode == "stop":
                        wait_for("small healthy", lambda: healthy(ps), timeout=120)
                        engine_s = args.cold_s
                    else:
                        e = engines["small"]
                        wait_for(
                            "small awake and healthy",
                            lambda e=e: not e.is_sleeping and healthy(ps),  # type: ignore[misc]
                            timeout=120,
                        )
                        engine_s = args.wake_s
                    seen = time.time()
                    asker.join(90)
                    if "answered" not in times:
                        raise RuntimeError("up was not answered")
                    total = times["answered"] - times["sent"]
                finally:
                    proc.send_signal(signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(30)
                    if proc.poll() is None:
                        proc.kill()
                victim = self.status("big")
                asleep = engines["big"].is_sleeping if mode == "sleep" else None
                row = {
                    "bench": "swap",
                    "mode": mode,
                    "rep": rep,
                    "latency_s": round(total, 3),
                    "seen_ready_s": round(seen - times["sent"], 3),
                    "engine_s": engine_s,
                    "docker_s": docker_s,
                    "controller_s": round(total - engine_s - docker_s, 3),
                    "phases_ms": phases(work / "run.log", times["sent"], times["answered"]),
                    "victim_container": victim,
                    "victim_asleep": asleep,
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            for s in ("big", "small"):
                with contextlib.suppress(NotFound):
                    self.client.containers.get(self.name(s)).remove(force=True)
            for e in engines.values():
                e.stop()
        return rows

    def cleanup(self) -> None:
        for name in self.created:
            with contextlib.suppress(NotFound):
                self.client.containers.get(name).remove(force=True)


def phases(log: Path, sent: float, answered: float) -> dict[str, Any]:
    """Where the time went, in ms from the request's send, from the controller's log:
    when the API accepted it, each cycle's parts after it, each step's start and end,
    and the answer."""
    out: dict[str, Any] = {}
    ms = lambda t: round((t - sent) * 1000, 1)  # noqa: E731
    for line in log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        rec = json.loads(line)["record"]
        at = rec["time"]["timestamp"]
        if at < sent:
            continue
        msg, extra = rec["message"], rec["extra"]
        if msg.startswith("api: up small"):
            out.setdefault("accepted", ms(at))
        elif msg.startswith("cycle ") and "request up" in msg:
            out["cycle"] = msg.split(": ", 1)[1]
        elif "duration" in extra:
            out[f"{extra['serve']} {extra['action']}"] = [ms(at - extra["duration"]), ms(at)]
    out["answered"] = ms(answered)
    return out


def _ok(url: str) -> bool:
    try:
        return _PROBE.get(url, timeout=0.5).status_code // 100 == 2
    except httpx.HTTPError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cold-s", type=float, default=4.7, help="the requester's cold load")
    p.add_argument("--wake-s", type=float, default=0.29, help="the requester's wake")
    p.add_argument("--image", default=os.environ.get("VRAMCTL_TEST_IMAGE", "vramctl-test:latest"))
    p.add_argument("--modes", default="stop,sleep")
    args = p.parse_args(argv)
    bench = Bench(args)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for mode in args.modes.split(","):
            log(f"bench_swap: mode {mode}, {args.reps} repetitions")
            results[mode] = bench.run_mode(mode)
    finally:
        bench.cleanup()
    med = {m: statistics.median(r["latency_s"] for r in rows) for m, rows in results.items()}
    own = {m: statistics.median(r["controller_s"] for r in rows) for m, rows in results.items()}
    summary: dict[str, Any] = {
        "bench": "swap_summary",
        "reps": args.reps,
        "cold_s": args.cold_s,
        "wake_s": args.wake_s,
        "median_latency_s": {m: round(v, 3) for m, v in med.items()},
        "median_controller_s": {m: round(v, 3) for m, v in own.items()},
    }
    if "stop" in med and "sleep" in med and med["sleep"] > 0:
        ratio = med["stop"] / med["sleep"]
        engines = args.cold_s / args.wake_s
        summary["ratio_stop_over_sleep"] = round(ratio, 2)
        summary["engine_ratio"] = round(engines, 2)
        summary["ratio_vs_engines"] = round(ratio / engines, 3)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
