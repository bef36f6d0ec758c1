"""How long the ``vramctl`` command line takes to answer, as an operator runs it.

What it measures: the wall time of whole processes, start to exit, each run
``--runs`` times (default 21) after ``--warmup`` runs that are not counted (so the
files are in the page cache, as on a machine where vramctl is used):

``python``
    ``python -c pass``: the interpreter's own start, the floor under every figure.
``help``
    ``vramctl --help`` (``python -m controller.interfaces.cli --help``).
``validate``
    ``vramctl validate -m manifests/examples/single-card.toml``.

Each line of output is one JSON object: per command the median, p90, min and max wall
time in ms, the median CPU time (user + system of the process: on a busy shared
machine, what the command itself costs, without its wait for a core), and the modules
a run of it loaded that an answering command must not (a server, Docker or HTTP
library: fastapi, uvicorn, starlette, docker, httpx, pynvml, prometheus_client), read
in one more run. The goals (issue 26, on an idle 2-core machine): ``--help`` <= 250 ms
and ``validate`` <= 350 ms median; and ``validate`` <= 200 ms of CPU (median), what it
costs wherever it runs (its quick path: no typer app, no model files unless a serve
declares a model).

Bytecode: ``--bytecode cached`` (default): the runs keep their bytecode caches under
a new ``PYTHONPYCACHEPREFIX`` folder (the venv and the tree are left as they are) and
the warm-up runs write them (``PYTHONDONTWRITEBYTECODE`` is removed for the runs), as
Python does on an operator's machine after the first command. ``--bytecode
unwritten``: no cache is written (``PYTHONDONTWRITEBYTECODE=1``), so every module that
has none beside it is compiled from source on every run: a venv installed without
bytecode (``uv sync`` without ``--compile-bytecode``) on a machine with
``PYTHONDONTWRITEBYTECODE=1``, as issue 26 measured.

The runs of the commands are interleaved (help, validate, help, ...) so that a
neighbour's load falls on all of them alike; the load average at the start and end
is printed beside the figures. Run from the tree to measure (``run_all.py`` puts that
tree on ``PYTHONPATH``).

Not measured: the commands that talk to a running loop (``up``, ``status`` against
Docker): their time is the loop's and the daemon's, not the command line's.

Usage::

    .venv/bin/python benchmarks/bench_cli.py               # ~20 s on 2 cores
    .venv/bin/python benchmarks/bench_cli.py --runs 5      # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "manifests/examples/single-card.toml"
CLI = [sys.executable, "-m", "controller.interfaces.cli"]
COMMANDS: dict[str, list[str]] = {
    "python": [sys.executable, "-c", "pass"],
    "help": [*CLI, "--help"],
    "validate": [*CLI, "validate", "-m", EXAMPLE],
}
#: what an answering command must never import (docs/operations.md, "The command line")
FORBIDDEN = ("fastapi", "uvicorn", "starlette", "docker", "httpx", "pynvml", "prometheus_client")
#: run a command in-process and print the top-level modules it loaded
PROBE = (
    "import runpy, sys\n"
    "sys.argv = ['vramctl', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('controller.interfaces.cli', run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "sys.stderr.write(' '.join(sorted({m.split('.')[0] for m in sys.modules})) + '\\n')\n"
)


#: where the runs keep their bytecode caches (set in main: a new folder per run)
CACHE: dict[str, str] = {}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update({"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb", **CACHE})
    env.setdefault("PYTHONPATH", str(ROOT))
    return env


def _once(argv: Sequence[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) ms of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        check=False,
    )  # fmt: skip
    took = (time.perf_counter() - started) * 1000.0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000.0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr.decode()}")
    return took, cpu


def _loaded(argv: Sequence[str]) -> list[str]:
    if argv[1] == "-c":
        return []
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv[3:]], cwd=ROOT, env=_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    top = set(proc.stderr.strip().splitlines()[-1].split()) if proc.stderr.strip() else set()
    return sorted(top & set(FORBIDDEN))


def _summary(name: str, runs: list[tuple[float, float]], loaded: list[str]) -> dict[str, object]:
    times = [wall for wall, _ in runs]
    ordered = sorted(times)
    return {
        "bench": "cli",
        "command": name,
        "runs": len(times),
        "median_ms": round(statistics.median(times), 1),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1),
        "min_ms": round(ordered[0], 1),
        "max_ms": round(ordered[-1], 1),
        "cpu_median_ms": round(statistics.median(cpu for _, cpu in runs), 1),
        "forbidden_imports": loaded,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=21, help="counted runs per command")
    parser.add_argument("--warmup", type=int, default=2, help="uncounted runs first")
    parser.add_argument(
        "--bytecode",
        choices=("cached", "unwritten"),
        default="cached",
        help="cached (default): the warm-up runs write the bytecode caches, as Python does"
        " by default; unwritten: none is written, a module without one is compiled each run",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vramctl-bench-pyc-") as pyc:
        if args.bytecode == "cached":
            CACHE["PYTHONPYCACHEPREFIX"] = pyc
        else:
            CACHE["PYTHONDONTWRITEBYTECODE"] = "1"
        _measure(args.runs, args.warmup, args.bytecode)
    return 0


def _measure(runs: int, warmup: int, bytecode: str) -> None:
    load_before = os.getloadavg()[0]
    for _ in range(warmup):
        for cmd in COMMANDS.values():
            _once(cmd)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, cmd in COMMANDS.items():
            times[name].append(_once(cmd))
    for name, cmd in COMMANDS.items():
        line = {**_summary(name, times[name], _loaded(cmd)), "bytecode": bytecode}
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                "bench": "cli_load",
                "loadavg_1m_before": round(load_before, 2),
                "loadavg_1m_after": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
                "bytecode": bytecode,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
