"""Cost of the control loop (``vramctl run``) on the real Docker daemon.

Two measurements, each against a real ``vramctl run`` subprocess
(``python -m controller.interfaces.cli run -m MANIFEST --state-dir TMP --log-json``, plus
``--no-api`` when this vramctl has an API, unless a mode asks for the API):

``reaction``
    A manifest of ``--serves`` (default 5) resident serves, all desired running and
    running (busybox ``sleep``; no port, no health path). The benchmark flips one
    serve's ``desired`` (running -> stopped -> running ...) ``--edits`` times (default
    10), rewriting the file in place, and measures from the moment the write returned
    to the **first Docker call of the resulting plan**: the controller is given
    ``DOCKER_HOST`` pointing at a recording proxy (:class:`RecordingProxy`, a relay on
    a unix socket in the run's temporary folder to the daemon's socket) that
    timestamps every request line it relays, and ``reaction_ms`` is the time of the
    first request that changes that container (``POST /containers/NAME/stop``,
    ``/kill``, ``/start``, ``/restart``, ``/pause``, ``/unpause``, or
    ``/containers/create?name=NAME``) after the write. ``calls_before`` counts the
    requests the controller made in between (reads: the observation, the
    executor's checks). The proxy's own cost is measured before the edits (``GET
    /_ping`` straight to the daemon and through the proxy, interleaved, 3 x 200
    each: the ``proxy_overhead`` line, ``proxy_added_us`` in the summary); a call is
    late by at most ``calls_before`` times that. Beside it, nothing hidden:
    ``event_ms`` is the write to the first Docker *event* of that container
    (``timeNano`` of the first ``kill`` / ``stop`` / ``start`` event; ``docker stop``
    shows first as ``kill``): Docker emits ``kill`` when a stop *begins* but
    ``start`` only once the container *has started*, so for starts ``event_ms``
    includes the daemon's own start (100-350 ms here). ``detect_ms`` is the write to
    the controller's ``manifest: reloaded`` log record (its loguru timestamp), i.e.
    the file watcher's share (inotify; a change is read once the file was quiet for
    20 ms, 300 ms cap), and ``step_begin_ms`` the write to the moment the executor
    began the stop / start step (its log record's time minus the step's duration).
    After each edit it waits for the plan to finish (the container in its new state
    and the plan's last step logged) and 0.5 s more. All clocks are this host's wall
    clock (the daemon is local).

``idle``
    ``--idle-serves`` (default 20) such serves, all converged, the default resync
    (``--resync``, 5 s). After a 5 s warm-up, the controller process's CPU time
    (``/proc/PID/stat`` utime + stime; it spawns no children) and resident memory
    (``/proc/PID/status`` VmRSS, sampled every second) over ``--idle-s`` (default 60)
    seconds. Modes (``--modes``): ``no-api`` (``--no-api``) and ``api`` (the HTTP API
    on a free loopback port, as an operator runs it by default). Each line also counts
    Docker container events on the whole daemon during the window (``daemon_events``:
    every one of them wakes the loop for a cycle, so a busy shared daemon costs more)
    and those of the benchmark's own containers (``own_events``: must be 0, nothing
    is touched when converged).

Output: a ``proxy_overhead`` line, one JSON line per edit (``bench: reaction``), a
``reaction_summary`` line (median / p90 by nearest rank / min / max of the first call,
and under ``event`` of the first event, over all edits and per direction), and one
``idle`` line per mode (the idle controller talks to the daemon directly). Progress
goes to stderr.

Not measured: serves with health paths (``await_ready`` time is the serve's, not the
loop's), router / elastic calls, NVML, manifests of many files, edits that do not
validate, a remote daemon. Absolute numbers depend on the machine.

Containers: ``vramctl-test:latest`` (``--image``), ``init=True``, host networking,
``sleep 3600``, labels ``vramctl.bench=1`` and ``vramctl.bench.run=<run id>``; every
container of this run is force-removed at the end (also on Ctrl-C / SIGTERM), after
the controller is killed.

Usage::

    .venv/bin/python benchmarks/bench_loop.py                     # ~2.5 min on 2 cores
    .venv/bin/python benchmarks/bench_loop.py --edits 4 --idle-s 10 --modes no-api  # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from benchkit import (
    RUN_LABEL,
    remove_labelled,
    removed_at_exit,
    run_argv,
    start_sleeper,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IMAGE = "vramctl-test:latest"
WAIT_S = 30.0
FIRST_CALLS = frozenset({"kill", "stop", "start"})
CLK_TCK = os.sysconf("SC_CLK_TCK")
KIB_PER_MIB = 1024.0


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values), 1),
        "p90_ms": round(nearest_rank(values, 0.9), 1),
        "min_ms": round(min(values), 1),
        "max_ms": round(max(values), 1),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def has_api() -> bool:
    """True when this vramctl's ``run`` has the HTTP API (and so ``--no-api``)."""
    out = subprocess.run(
        [sys.executable, "-m", "controller.interfaces.cli", "run", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, COLUMNS="200", NO_COLOR="1"),
        timeout=60,
        check=True,
    )
    return "--no-api" in out.stdout


# ------------------------------------------------------------------ the host side


@dataclass
class Fleet:
    """This run's containers, and Docker's events for them (and for the whole daemon)."""

    client: docker.DockerClient
    image: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    names: list[str] = field(default_factory=list)
    own: list[dict[str, Any]] = field(default_factory=list)  # events of our containers
    daemon_events: int = 0  # container events on the whole daemon
    _stream: Any = None

    def follow(self) -> None:
        """Follow Docker's container events from now on (a daemon thread)."""
        events_client = docker.from_env(timeout=60)
        self._stream = events_client.events(decode=True, filters={"type": "container"})
        prefix = self.prefix

        def pump() -> None:
            with contextlib.suppress(Exception):  # closed at the end
                for e in self._stream:
                    self.daemon_events += 1
                    name = str((e.get("Actor") or {}).get("Attributes", {}).get("name", ""))
                    if name.startswith(prefix):
                        self.own.append(e)

        threading.Thread(target=pump, daemon=True, name="docker-events").start()

    @property
    def prefix(self) -> str:
        return f"vramctl-bench-loop-{self.run_id}-"

    def grow_to(self, n: int) -> None:
        """Start ``sleep`` containers until there are ``n``."""
        for i in range(len(self.names), n):
            name = f"{self.prefix}s{i:02d}"
            self.names.append(start_sleeper(self.client, self.image, name, self.run_id))

    def status(self, name: str) -> str:
        return str(self.client.containers.get(name).status)

    def first_call_after(self, name: str, t_ns: int) -> dict[str, Any] | None:
        for e in list(self.own):
            if (
                int(e.get("timeNano", 0)) >= t_ns
                and e.get("Action") in FIRST_CALLS
                and e["Actor"]["Attributes"].get("name") == name
            ):
                return e
        return None

    def own_events_between(self, t0_ns: int, t1_ns: int) -> int:
        return sum(1 for e in list(self.own) if t0_ns <= int(e.get("timeNano", 0)) < t1_ns)

    def remove_all(self) -> int:
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.close()
        return remove_labelled(self.client, f"{RUN_LABEL}={self.run_id}")


@contextlib.contextmanager
def fleet_of(client: docker.DockerClient, image: str) -> Iterator[Fleet]:
    """A :class:`Fleet` whose containers are removed however the block ends."""
    fleet = Fleet(client, image)
    with removed_at_exit(fleet.remove_all):
        yield fleet


def manifest(names: Sequence[str], desired: dict[str, str]) -> str:
    out = ['[[gpu_roles]]\nid = "a"\nvram_mib = 100000\nreserve_mib = 0\n']
    for i, name in enumerate(names):
        out.append(
            f'\n[[serve]]\nname = "s{i:02d}"\ncontainer = "{name}"\ngpu_role = "a"\n'
            f'vram_mib = 1000\nresidency = "resident"\n'
            f'desired = "{desired.get(name, "running")}"\nstop_timeout_s = 5\n'
        )
    return "".join(out)


# ------------------------------------------------------------------ the recording proxy

#: an HTTP/1.x request line at the start of a request (docker-py sends each request's
#: head in one write, so a line is never split between reads in practice; the tail of
#: a read is carried over all the same)
_REQUEST_LINE = re.compile(rb"(?:^|\r\n)(GET|HEAD|POST|PUT|DELETE|PATCH) (\S+) HTTP/1\.[01]\r\n")
#: the requests that change a container: the plan's first docker call is one of these
_MUTATING = re.compile(
    r"^/(?:v[\d.]+/)?containers/(?:(?P<ref>[^/?]+)/(?P<verb>stop|kill|start|restart|pause"
    r"|unpause)|create\?(?:.*&)?name=(?P<created>[^&]+))"
)


@dataclass
class RecordingProxy:
    """A unix-socket relay to the Docker socket that timestamps every request line.

    The controller is given ``DOCKER_HOST=unix://<path>`` (docker-py's ``from_env``
    honours it, and so does every client the controller makes), so each Docker API
    request it sends passes here: the time its request line arrived (this host's
    wall clock, ``time.time_ns()`` right after the read), its method and its path are
    recorded, and the bytes are relayed unchanged both ways (long-lived streams, such
    as the event stream, included). :meth:`overhead_us` measures what the relay adds
    to one request.
    """

    upstream: str
    path: Path
    requests: list[tuple[int, str, str]] = field(default_factory=list)
    _server: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _conns: list[socket.socket] = field(default_factory=list)

    def start(self) -> RecordingProxy:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()
        return self

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                daemon.connect(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, daemon]
            threading.Thread(target=self._pump, args=(client, daemon, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(daemon, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        tail = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if requests:
                    now = time.time_ns()
                    buf = tail + data
                    for m in _REQUEST_LINE.finditer(buf):
                        if m.end() > len(tail):  # not one seen in the last read already
                            method, target = m.group(1).decode(), m.group(2).decode()
                            with self._lock:
                                self.requests.append((now, method, target))
                    tail = buf[-256:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def first_mutation(self, refs: set[str], t_ns: int) -> tuple[int, str, str] | None:
        """The first request after ``t_ns`` that changes a container named in ``refs``
        (its name or id): stop, kill, start, restart, pause, unpause, create."""
        with self._lock:
            seen = list(self.requests)
        for at, method, target in seen:
            if at < t_ns or method != "POST":
                continue
            m = _MUTATING.match(urllib.parse.unquote(target))
            if m is None:
                continue
            ref = m.group("ref") or m.group("created")
            if ref in refs or any(r.startswith(ref) for r in refs if len(ref) >= 12):
                return at, method, target
        return None

    def between(self, t0_ns: int, t1_ns: int) -> list[tuple[int, str, str]]:
        """The requests whose line arrived in ``[t0_ns, t1_ns)``."""
        with self._lock:
            return [r for r in self.requests if t0_ns <= r[0] < t1_ns]

    def overhead_us(self, n: int = 200) -> dict[str, float]:
        """Median and p90 of ``GET /_ping`` straight to the daemon and through here (us)."""

        def ping(path: str) -> float:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
                times = []
                for _ in range(n):
                    t0 = time.perf_counter_ns()
                    s.sendall(b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n")
                    got = b""
                    while b"\r\n\r\nOK" not in got:
                        chunk = s.recv(4096)
                        if not chunk:
                            raise RuntimeError("the daemon closed the connection")
                        got += chunk
                    times.append((time.perf_counter_ns() - t0) / 1000)
            return statistics.median(times)

        direct, proxied = [], []
        for _ in range(3):  # interleaved, so that both see the same machine
            direct.append(ping(self.upstream))
            proxied.append(ping(str(self.path)))
        with self._lock:  # the pings are not the controller's
            self.requests = [r for r in self.requests if r[2] != "/_ping" or r[1] != "GET"]
        d, p = statistics.median(direct), statistics.median(proxied)
        return {"direct_us": round(d, 1), "proxied_us": round(p, 1), "added_us": round(p - d, 1)}

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()


@contextlib.contextmanager
def recording_proxy(tmp: Path) -> Iterator[RecordingProxy]:
    upstream = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not upstream.startswith("unix://"):
        raise SystemExit(f"bench_loop: the recording proxy needs a unix socket, not {upstream}")
    proxy = RecordingProxy(upstream.removeprefix("unix://"), tmp / "docker.sock").start()
    try:
        yield proxy
    finally:
        proxy.close()


# ------------------------------------------------------------------ the controller


@dataclass
class Controller:
    """A ``vramctl run`` subprocess logging JSON into a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls,
        tmp: Path,
        manifest_path: Path,
        resync_s: float,
        extra: Sequence[str],
        docker_host: str | None = None,
    ) -> Controller:
        log_path = tmp / f"run-{uuid.uuid4().hex[:6]}.log"
        argv = run_argv(manifest_path, tmp / "state", resync_s, *extra)
        with log_path.open("wb") as fh:
            env = dict(os.environ)
            if docker_host is not None:
                env["DOCKER_HOST"] = docker_host
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        ctl = cls(proc, log_path)
        wait_for("the controller to start", lambda: ctl.find("vramctl run: ") or ctl.dead())
        if proc.poll() is not None:
            raise RuntimeError(f"vramctl run exited {proc.returncode}:\n{log_path.read_text()}")
        return ctl

    def dead(self) -> bool:
        return self.proc.poll() is not None

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                out.append(json.loads(line)["record"])
        return out

    def find(self, needle: str, after: float = 0.0) -> dict[str, Any] | None:
        for r in self.records():
            if needle in str(r.get("message", "")) and float(r["time"]["timestamp"]) >= after:
                return r
        return None

    def step_begin(self, serve: str, action: str, after: float) -> float | None:
        """When the executor began ``serve``'s ``action`` step (log time - its duration)."""
        for r in self.records():
            x = r.get("extra") or {}
            t = float(r["time"]["timestamp"])
            if x.get("serve") == serve and x.get("action") == action and t >= after:
                return t - float(x.get("duration", 0.0))
        return None

    def step_done(self, serve: str, action: str, after: float) -> bool:
        for r in self.records():
            x = r.get("extra") or {}
            if (
                x.get("serve") == serve
                and x.get("action") == action
                and float(r["time"]["timestamp"]) >= after
            ):
                if x.get("outcome") != "ok":
                    raise RuntimeError(f"{serve} {action}: {r.get('message')}")
                return True
        return False

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)

    def status_field(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
        raise RuntimeError(f"no {key} in /proc/{self.proc.pid}/status")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@contextlib.contextmanager
def controller(
    tmp: Path,
    manifest_path: Path,
    resync_s: float,
    extra: Sequence[str],
    docker_host: str | None = None,
) -> Iterator[Controller]:
    ctl = Controller.start(tmp, manifest_path, resync_s, extra, docker_host)
    try:
        yield ctl
    finally:
        rc = ctl.stop()
        if rc != 0:
            log(f"vramctl run exited {rc}")


# ------------------------------------------------------------------ the benchmarks


def one_edit(
    fleet: Fleet,
    proxy: RecordingProxy,
    ctl: Controller,
    path: Path,
    names: Sequence[str],
    desired: str,
) -> dict[str, Any]:
    """Flip the first serve to ``desired``; time the reaction; wait for the plan to end."""
    target, serve = names[0], "s00"
    refs = {target, fleet.client.containers.get(target).id}
    text = manifest(names, {target: desired})
    path.write_text(text)
    t_ns = time.time_ns()
    t_wall = t_ns / 1e9
    call = wait_for("the plan's first docker call", lambda: proxy.first_mutation(refs, t_ns))
    first = wait_for("the plan's first docker event", lambda: fleet.first_call_after(target, t_ns))
    reloaded = wait_for("the reload log", lambda: ctl.find("manifest: reloaded", t_wall))
    last = "release" if desired == "stopped" else "await_ready"
    want = "exited" if desired == "stopped" else "running"
    wait_for(
        "the plan to finish",
        lambda: ctl.step_done(serve, last, t_wall) and fleet.status(target) == want,
    )
    begin = ctl.step_begin(serve, "stop" if desired == "stopped" else "start", t_wall)
    assert begin is not None
    return {
        "bench": "reaction",
        "direction": "stop" if desired == "stopped" else "start",
        "first_call": f"{call[1]} {call[2]}",
        "reaction_ms": round((call[0] - t_ns) / 1e6, 1),
        # the controller's requests from the write to that call (every one passed the
        # relay: their number times proxy_added_us bounds what the relay cost the call)
        "calls_before": len(proxy.between(t_ns, call[0])),
        "first_event": first.get("Action"),
        "event_ms": round((int(first["timeNano"]) - t_ns) / 1e6, 1),
        "detect_ms": round((float(reloaded["time"]["timestamp"]) - t_wall) * 1000, 1),
        "step_begin_ms": round((begin - t_wall) * 1000, 1),
    }


def _summary(lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        **stats([x["reaction_ms"] for x in lines]),
        "event": stats([x["event_ms"] for x in lines]),
        "median_step_begin_ms": round(statistics.median(x["step_begin_ms"] for x in lines), 1),
    }


def bench_reaction(
    fleet: Fleet, tmp: Path, args: argparse.Namespace, extra: Sequence[str]
) -> list[dict[str, Any]]:
    fleet.grow_to(args.serves)
    names = fleet.names[: args.serves]
    path = tmp / "serves.toml"
    path.write_text(manifest(names, {}))
    lines: list[dict[str, Any]] = []
    with recording_proxy(tmp) as proxy:
        overhead = {"bench": "proxy_overhead", **proxy.overhead_us()}
        print(json.dumps(overhead), flush=True)
        with controller(tmp, path, args.resync, extra, proxy.docker_host) as ctl:
            time.sleep(1.0)  # let the first cycle find nothing to do
            for i in range(args.edits):
                line = {
                    "edit": i + 1,
                    **one_edit(fleet, proxy, ctl, path, names, ("stopped", "running")[i % 2]),
                }
                print(json.dumps(line), flush=True)
                lines.append(line)
                time.sleep(0.5)
    summary: dict[str, Any] = {
        "bench": "reaction_summary",
        "serves": args.serves,
        "edits": len(lines),
        **_summary(lines),
        "median_detect_ms": round(statistics.median(x["detect_ms"] for x in lines), 1),
        "proxy_added_us": overhead["added_us"],
    }
    for direction in ("stop", "start"):
        some = [x for x in lines if x["direction"] == direction]
        if some:
            summary[direction] = _summary(some)
    print(json.dumps(summary), flush=True)
    return [overhead, *lines, summary]


def bench_idle(
    fleet: Fleet, tmp: Path, args: argparse.Namespace, mode: str, extra: Sequence[str]
) -> dict[str, Any]:
    fleet.grow_to(args.idle_serves)
    names = fleet.names[: args.idle_serves]
    path = tmp / "serves.toml"
    path.write_text(manifest(names, {}))
    wait_for("all running", lambda: all(fleet.status(n) == "running" for n in names))
    with controller(tmp, path, args.resync, extra) as ctl:
        time.sleep(args.warmup_s)
        t0_ns, daemon0 = time.time_ns(), fleet.daemon_events
        cpu0, wall0 = ctl.cpu_s(), time.monotonic()
        rss: list[int] = []
        deadline = wall0 + args.idle_s
        while time.monotonic() < deadline:
            rss.append(ctl.status_field("VmRSS"))
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        cpu1, wall1 = ctl.cpu_s(), time.monotonic()
        rss.append(ctl.status_field("VmRSS"))
        threads = ctl.status_field("Threads")
        t1_ns, daemon1 = time.time_ns(), fleet.daemon_events
        if ctl.dead():
            raise RuntimeError("the controller died during the idle window")
    line = {
        "bench": "idle",
        "mode": mode,
        "serves": len(names),
        "resync_s": args.resync,
        "window_s": round(wall1 - wall0, 1),
        "cpu_s": round(cpu1 - cpu0, 3),
        "cpu_pct": round(100.0 * (cpu1 - cpu0) / (wall1 - wall0), 3),
        "rss_mib_mean": round(statistics.mean(rss) / KIB_PER_MIB, 1),
        "rss_mib_max": round(max(rss) / KIB_PER_MIB, 1),
        "threads": threads,
        "daemon_events": daemon1 - daemon0,
        "own_events": fleet.own_events_between(t0_ns, t1_ns),
    }
    print(json.dumps(line), flush=True)
    return line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--only", choices=("reaction", "idle"), default=None)
    parser.add_argument("--serves", type=int, default=5, help="serves for reaction (5)")
    parser.add_argument("--edits", type=int, default=10, help="manifest edits (10)")
    parser.add_argument("--idle-serves", type=int, default=20, help="serves for idle (20)")
    parser.add_argument("--idle-s", type=float, default=60.0, help="idle window seconds (60)")
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--resync", type=float, default=5.0, help="--resync of run (5)")
    parser.add_argument("--modes", default=None, help="idle modes: no-api,api (default: both)")
    args = parser.parse_args(argv)

    api = has_api()
    modes = [m for m in (args.modes or "no-api,api").split(",") if m.strip()]
    if not api:
        modes = ["no-api"]  # this vramctl has no API at all
    base = ["--no-api"] if api else []

    client = docker.from_env(timeout=60)
    started = time.perf_counter()
    try:
        with fleet_of(client, args.image) as fleet:
            fleet.follow()
            if args.only in (None, "reaction"):
                with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
                    bench_reaction(fleet, Path(tmp), args, base)
            if args.only in (None, "idle"):
                for mode in modes:
                    extra = base if mode == "no-api" else ["--api", f"127.0.0.1:{free_port()}"]
                    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
                        log(f"idle, {mode}: {args.idle_serves} serves, {args.idle_s:g}s")
                        bench_idle(fleet, Path(tmp), args, mode, extra)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        client.close()
    log(f"total {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
