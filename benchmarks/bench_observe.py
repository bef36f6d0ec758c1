"""Cost of observing N containers on the real Docker daemon: our observer vs ``docker inspect``.

What it measures, for N = 1, 20 and 100 running busybox containers (``--sizes``),
all named in the "manifest" that is observed, on the local daemon:

``ours_steady``
    One :meth:`controller.adapters.docker.read.ContainerObserver.observe` cycle in steady
    state: the observer has already seen every container (one warm-up cycle), so a
    cycle is one list call and no inspect (docs/design.md §5 docker adapter call-count
    design).
``ours_cold``
    The first cycle of a fresh observer (fresh :class:`InspectCache`, same client):
    one list call plus one inspect per container *on the host*, declared or not.
``cli_per_container``
    The naive approach: ``docker inspect NAME`` through the docker CLI, one process
    per container (``subprocess.run`` each, JSON parsed).
``cli_one_call``
    To be fair to the CLI: one ``docker inspect NAME1 … NAMEN`` process for all names
    (the CLI still sends one inspect request per name: the Engine API has no batched
    inspect).

Each line of output is one JSON object per (approach, N): ``median_ms``, ``p90_ms``
(nearest rank), ``min_ms``, ``reps``, ``api_calls`` (median Docker API calls per
snapshot as our adapter counts them; for the CLI the inspect requests it must send,
N either way), ``api_calls_max``, ``processes`` (docker CLI processes spawned per
snapshot) and ``host_containers`` (all containers on the daemon at that moment,
which is what a cold cycle inspects). Then one ``ratio`` line per N and pairing:
naive (``cli_*``) median over ours (``ours_*``) median.

Repetitions are adaptive: at least ``--min-reps`` and until ~``--budget-s`` seconds
per (approach, N) are spent (capped at ``--max-reps``), so the whole run stays
within ~2–3 minutes on 2 cores, container set-up and removal included.

What it does not measure: NVML (``observe_gpus``), snapshot conversion and printing
(``observe_host``, ``vramctl observe``), the CLI tools' own request count beyond the
inspects (the docker CLI may also ping the daemon to negotiate the API version),
daemon-side CPU, memory use, containers that change state between cycles (a cycle
after ``k`` changes costs ``1 + k`` calls), a remote daemon (TLS / ssh), or daemons
with thousands of unrelated containers. The daemon may be shared: other containers
appearing during a steady-state series make that cycle inspect them
(``api_calls_max`` shows it). Absolute numbers depend on the machine; compare the
approaches within one run.

Containers are created with the docker SDK from ``vramctl-test:latest`` (``--image``)
with ``init=True``, host networking, command ``sleep 3600``, labels
``vramctl.bench=1`` and ``vramctl.bench.run=<this run's id>``; every container of this
run is force-removed at the end, also on Ctrl-C, SIGTERM or an exception.

Usage::

    .venv/bin/python benchmarks/bench_observe.py              # full: ~1.5 min on 2 cores
    .venv/bin/python benchmarks/bench_observe.py --sizes 1,5 --budget-s 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import docker
from benchkit import BENCH_LABEL, RUN_LABEL, remove_labelled, removed_at_exit, start_sleeper

from controller.adapters.docker.read import ContainerObserver, ContainerSnapshot

DEFAULT_IMAGE = "vramctl-test:latest"


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed snapshot."""

    seconds: float
    api_calls: int
    processes: int


def _number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


class Result(NamedTuple):
    """One (approach, N) series."""

    approach: str
    n: int
    samples: tuple[Sample, ...]
    host_containers: int

    @property
    def median_ms(self) -> float:
        return statistics.median(s.seconds for s in self.samples) * 1000.0

    def to_json(self) -> dict[str, Any]:
        times = sorted(s.seconds * 1000.0 for s in self.samples)
        p90 = times[max(0, math.ceil(0.9 * len(times)) - 1)]
        calls = [s.api_calls for s in self.samples]
        return {
            "approach": self.approach,
            "n": self.n,
            "median_ms": round(self.median_ms, 3),
            "p90_ms": round(p90, 3),
            "min_ms": round(times[0], 3),
            "reps": len(times),
            "api_calls": _number(statistics.median(calls)),
            "api_calls_max": max(calls),
            "processes": self.samples[0].processes,
            "host_containers": self.host_containers,
        }


def timed_series(
    one: Callable[[], Sample], *, budget_s: float, min_reps: int, max_reps: int
) -> tuple[Sample, ...]:
    """Run ``one`` at least ``min_reps`` times and until ``budget_s`` is spent."""
    out: list[Sample] = []
    start = time.perf_counter()
    while len(out) < max_reps and (len(out) < min_reps or time.perf_counter() - start < budget_s):
        out.append(one())
    return tuple(out)


# ------------------------------------------------------------------ the approaches


def ours_steady(observer: ContainerObserver, names: Sequence[str]) -> Sample:
    t0 = time.perf_counter()
    snap = observer.observe(names)
    dt = time.perf_counter() - t0
    check_ours(snap, names)
    return Sample(dt, snap.api_calls, 0)


def ours_cold(client: docker.DockerClient, names: Sequence[str]) -> Sample:
    observer = ContainerObserver(client)  # fresh cache, same (already negotiated) client
    t0 = time.perf_counter()
    snap = observer.observe(names)
    dt = time.perf_counter() - t0
    check_ours(snap, names)
    return Sample(dt, snap.api_calls, 0)


def check_ours(snap: ContainerSnapshot, names: Sequence[str]) -> None:
    """Fail loudly rather than time an error path."""
    if not snap.docker_ok:
        raise RuntimeError(f"observer failed: {snap.error}")
    seen = snap.containers
    missing = [n for n in names if n not in seen or seen[n].state != "running"]
    if missing:
        raise RuntimeError(f"observer did not see running: {missing[:5]}")


def docker_inspect(names: Sequence[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        ["docker", "inspect", *names], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"docker inspect failed: {done.stderr.strip()}")
    docs: list[dict[str, Any]] = json.loads(done.stdout)
    return docs


def cli_per_container(names: Sequence[str]) -> Sample:
    t0 = time.perf_counter()
    states = []
    for name in names:
        (doc,) = docker_inspect([name])
        states.append(doc["State"]["Status"])
    dt = time.perf_counter() - t0
    if states.count("running") != len(names):
        raise RuntimeError(f"docker inspect saw {states}")
    return Sample(dt, len(names), len(names))


def cli_one_call(names: Sequence[str]) -> Sample:
    t0 = time.perf_counter()
    docs = docker_inspect(names)
    dt = time.perf_counter() - t0
    if [d["State"]["Status"] for d in docs].count("running") != len(names):
        raise RuntimeError("docker inspect did not see every container running")
    return Sample(dt, len(names), 1)


# --------------------------------------------------------------- the containers


class Fleet:
    """This run's benchmark containers; :meth:`remove_all` removes every one of them."""

    def __init__(self, client: docker.DockerClient, image: str) -> None:
        self.client = client
        self.image = image
        self.run_id = uuid.uuid4().hex[:8]
        self.names: list[str] = []

    def grow_to(self, n: int) -> None:
        """Create and start containers until there are ``n`` (4 at a time)."""
        new = [f"vramctl-bench-{self.run_id}-{i:03d}" for i in range(len(self.names), n)]
        with ThreadPoolExecutor(max_workers=4) as pool:
            for name in pool.map(self._run, new):
                self.names.append(name)

    def _run(self, name: str) -> str:
        return start_sleeper(self.client, self.image, name, self.run_id)

    def remove_all(self) -> int:
        """Force-remove every container labelled with this run's id; the count removed."""
        return remove_labelled(self.client, f"{RUN_LABEL}={self.run_id}")


# ----------------------------------------------------------------------- driver


def host_container_count(client: docker.DockerClient) -> int:
    return len(client.api.containers(all=True))


def measure(
    client: docker.DockerClient, fleet: Fleet, n: int, args: argparse.Namespace, cli: bool
) -> list[Result]:
    names = fleet.names[:n]
    series = {"min_reps": args.min_reps, "max_reps": args.max_reps}
    results = []

    observer = ContainerObserver(client)
    observer.observe(names)  # the first cycle: fills the cache
    host = host_container_count(client)
    steady = timed_series(lambda: ours_steady(observer, names), budget_s=args.budget_s, **series)
    results.append(Result("ours_steady", n, steady, host))

    cold = timed_series(lambda: ours_cold(client, names), budget_s=args.budget_s, **series)
    results.append(Result("ours_cold", n, cold, host))

    if cli:
        naive = timed_series(lambda: cli_per_container(names), budget_s=2 * args.budget_s, **series)
        results.append(Result("cli_per_container", n, naive, host))
        one = timed_series(lambda: cli_one_call(names), budget_s=args.budget_s, **series)
        results.append(Result("cli_one_call", n, one, host))
    return results


def ratio_lines(results: Sequence[Result]) -> list[dict[str, Any]]:
    lines = []
    by = {(r.approach, r.n): r for r in results}
    for n in sorted({r.n for r in results}):
        for naive in ("cli_per_container", "cli_one_call"):
            for ours in ("ours_steady", "ours_cold"):
                a, b = by.get((naive, n)), by.get((ours, n))
                if a is None or b is None:
                    continue
                lines.append(
                    {
                        "ratio": f"{naive}/{ours}",
                        "n": n,
                        "value": round(a.median_ms / b.median_ms, 1),
                    }
                )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1,20,100", help="container counts (default 1,20,100)")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--budget-s", type=float, default=8.0, help="seconds per series")
    parser.add_argument("--min-reps", type=int, default=3)
    parser.add_argument("--max-reps", type=int, default=300)
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})

    cli = shutil.which("docker") is not None
    if not cli:
        print("# docker CLI not found: the cli_* approaches are skipped", file=sys.stderr)
    client = docker.from_env(timeout=60)
    leftovers = client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}=1"})
    if leftovers:
        print(
            f"# note: {len(leftovers)} containers labelled {BENCH_LABEL}=1 from another run "
            "exist (not touched; they add to host_containers)",
            file=sys.stderr,
        )
    started = time.perf_counter()
    results: list[Result] = []
    try:
        fleet = Fleet(client, args.image)
        with removed_at_exit(fleet.remove_all):  # however the run ends
            for n in sizes:
                t0 = time.perf_counter()
                fleet.grow_to(n)
                print(
                    f"# {n} containers running ({time.perf_counter() - t0:.1f}s to create)",
                    file=sys.stderr,
                )
                for result in measure(client, fleet, n, args, cli):
                    results.append(result)
                    print(json.dumps(result.to_json()), flush=True)
        for line in ratio_lines(results):
            print(json.dumps(line), flush=True)
    except KeyboardInterrupt:
        print("# interrupted", file=sys.stderr)
        return 130
    finally:
        client.close()
    print(f"# total {time.perf_counter() - started:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
