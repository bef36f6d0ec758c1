"""Cost of the control loop (``vramctl run``) on the real Docker daemon.

Two measurements, each against a real ``vramctl run`` subprocess
(``python -m controller.interfaces.cli run -m MANIFEST --state-dir TMP --log-json``, plus
``--no-api`` when this vramctl has an API, unless a mode asks for the API):

``reaction``
    A manifest of ``--serves`` (default 5) resident serves, all desired running and
    running (busybox ``sleep``; no port, no health path). The benchmark flips one
    serve's ``desired`` (running -> stopped -> running ...) ``--edits`` times (default
    10), rewriting the file in place, and measures from the moment the write returned
    to the **first Docker call of the resulting plan**, taken from Docker's own event
    stream (``timeNano`` of the first ``kill`` / ``stop`` / ``start`` event of that
    container after the write; ``docker stop`` shows first as ``kill``). It also
    reports ``detect_ms``: the write to the controller's ``manifest: reloaded`` log
    record (its loguru timestamp), i.e. the file watcher's share (inotify; a change is
    read once the file was quiet for 20 ms, 300 ms cap), and ``step_begin_ms``: the
    write to the moment the executor began the stop / start step (its log record's
    time minus the step's duration). Docker emits ``kill`` when a stop *begins* but
    ``start`` only once the container *has started*, so for starts ``reaction_ms``
    includes the daemon's own start time and ``step_begin_ms`` is the loop's share.
    After each edit it waits for the plan to finish (the container in its new state and
    the plan's last step logged) and 0.5 s more. All clocks are this host's wall clock
    (the daemon is local).

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

Output: one JSON line per edit (``bench: reaction``), a ``reaction_summary`` line
(median / p90 by nearest rank / min / max, over all edits and per direction), and one
``idle`` line per mode. Progress goes to stderr.

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
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import docker
from docker.errors import NotFound

REPO = Path(__file__).resolve().parents[1]
BENCH_LABEL = "vramctl.bench"
RUN_LABEL = "vramctl.bench.run"
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
            self.client.containers.run(
                self.image,
                ["sleep", "3600"],
                detach=True,
                init=True,
                network_mode="host",
                name=name,
                labels={BENCH_LABEL: "1", RUN_LABEL: self.run_id},
            )
            self.names.append(name)

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
        found = self.client.containers.list(
            all=True, filters={"label": f"{RUN_LABEL}={self.run_id}"}
        )
        for c in found:
            with contextlib.suppress(NotFound):
                c.remove(force=True)
        return len(found)


@contextlib.contextmanager
def fleet_of(client: docker.DockerClient, image: str) -> Iterator[Fleet]:
    """A :class:`Fleet` whose containers are removed however the block ends."""
    fleet = Fleet(client, image)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield fleet
    finally:
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # let cleanup finish
        try:
            log(f"removed {fleet.remove_all()} benchmark containers")
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, previous)


def manifest(names: Sequence[str], desired: dict[str, str]) -> str:
    out = ['[[gpu_roles]]\nid = "a"\nvram_mib = 100000\nreserve_mib = 0\n']
    for i, name in enumerate(names):
        out.append(
            f'\n[[serve]]\nname = "s{i:02d}"\ncontainer = "{name}"\ngpu_role = "a"\n'
            f'vram_mib = 1000\nresidency = "resident"\n'
            f'desired = "{desired.get(name, "running")}"\nstop_timeout_s = 5\n'
        )
    return "".join(out)


# ------------------------------------------------------------------ the controller


@dataclass
class Controller:
    """A ``vramctl run`` subprocess logging JSON into a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls, tmp: Path, manifest_path: Path, resync_s: float, extra: Sequence[str]
    ) -> Controller:
        log_path = tmp / f"run-{uuid.uuid4().hex[:6]}.log"
        argv = [
            sys.executable,
            "-m",
            "controller.interfaces.cli",
            "run",
            "-m",
            str(manifest_path),
            "--state-dir",
            str(tmp / "state"),
            "--resync",
            str(resync_s),
            "--log-json",
            *extra,
        ]
        with log_path.open("wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
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
    tmp: Path, manifest_path: Path, resync_s: float, extra: Sequence[str]
) -> Iterator[Controller]:
    ctl = Controller.start(tmp, manifest_path, resync_s, extra)
    try:
        yield ctl
    finally:
        rc = ctl.stop()
        if rc != 0:
            log(f"vramctl run exited {rc}")


# ------------------------------------------------------------------ the benchmarks


def one_edit(
    fleet: Fleet, ctl: Controller, path: Path, names: Sequence[str], desired: str
) -> dict[str, Any]:
    """Flip the first serve to ``desired``; time the reaction; wait for the plan to end."""
    target, serve = names[0], "s00"
    text = manifest(names, {target: desired})
    path.write_text(text)
    t_ns = time.time_ns()
    t_wall = t_ns / 1e9
    first = wait_for("the plan's first docker call", lambda: fleet.first_call_after(target, t_ns))
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
        "first_call": first.get("Action"),
        "reaction_ms": round((int(first["timeNano"]) - t_ns) / 1e6, 1),
        "detect_ms": round((float(reloaded["time"]["timestamp"]) - t_wall) * 1000, 1),
        "step_begin_ms": round((begin - t_wall) * 1000, 1),
    }


def bench_reaction(
    fleet: Fleet, tmp: Path, args: argparse.Namespace, extra: Sequence[str]
) -> list[dict[str, Any]]:
    fleet.grow_to(args.serves)
    names = fleet.names[: args.serves]
    path = tmp / "serves.toml"
    path.write_text(manifest(names, {}))
    lines: list[dict[str, Any]] = []
    with controller(tmp, path, args.resync, extra) as ctl:
        time.sleep(1.0)  # let the first cycle find nothing to do
        for i in range(args.edits):
            line = {
                "edit": i + 1,
                **one_edit(fleet, ctl, path, names, ("stopped", "running")[i % 2]),
            }
            print(json.dumps(line), flush=True)
            lines.append(line)
            time.sleep(0.5)
    summary: dict[str, Any] = {
        "bench": "reaction_summary",
        "serves": args.serves,
        "edits": len(lines),
        **stats([x["reaction_ms"] for x in lines]),
        "median_detect_ms": round(statistics.median(x["detect_ms"] for x in lines), 1),
        "median_step_begin_ms": round(statistics.median(x["step_begin_ms"] for x in lines), 1),
    }
    for direction in ("stop", "start"):
        some = [x for x in lines if x["direction"] == direction]
        if some:
            summary[direction] = {
                **stats([x["reaction_ms"] for x in some]),
                "median_step_begin_ms": round(
                    statistics.median(x["step_begin_ms"] for x in some), 1
                ),
            }
    print(json.dumps(summary), flush=True)
    return [*lines, summary]


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
