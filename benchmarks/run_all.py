"""Every benchmark in one run, this tree beside a base commit, as one table.

What it runs, each as its own process with the tree's code on ``PYTHONPATH`` (so the
``vramctl run`` the loop benchmark starts is that tree's too):

* ``bench_planner.py`` at 100 and 1000 serves x 2 and 32 roles (medians; growth
  1000/100; the 1000 x 32 time);
* ``bench_fit.py`` on 2,000 instances (``fit_serve`` against a largest-first
  admission, both in the same process; the victims compared);
* ``bench_loop.py --only reaction`` (10 manifest edits on 5 serves: the write to the
  first Docker call of the plan, as a recording proxy on the Docker socket sees the
  request; to the first Docker event of the container; to the loop's beginning of the
  step);
* ``bench_loop.py --only idle --modes api`` (20 serves and the HTTP API, idle: CPU and
  RSS of ``vramctl run``);
* ``bench_restart.py`` (a resident ``docker kill``ed after a healthy run, then again:
  Docker's ``die`` to the next ``start``, and the start against the log's promise).
* ``bench_cli.py`` (``vramctl --help`` and ``validate`` of the single-card example as
  processes, start to exit: wall and CPU medians, beside the interpreter's own start).
* ``bench_placement.py`` (20 random multi-GPU fleets x 200 on-demand requests, in-process:
  refusals, cold starts and evictions with vramctl's placement, with serves pinned round
  robin, and with Ollama's "most free memory" rule; ``--quick``: 5 x 60).
* ``bench_swap.py`` (an on-demand ``up`` with ``wait_s`` against a real ``vramctl run``:
  stop + cold start and sleep + wake, 5 repetitions each; ``--quick``: 2): the
  controller's own share of each (less the engine's load or wake and Docker's own stop
  and start) and the stop / sleep ratio beside the engines' own.
* ``bench_policy.py`` (13 trace families x 30 simulated hosts x 2 h of requests through
  the planner and through Ollama's, llama-swap's, anvil's and lemonade's rules, each
  from its source; ``--quick``: 4 families x 5 hosts x 1 h): per family, mean and p95
  wait, cold starts and wakes, and vramctl's ratio to the best peer.

With ``--base COMMIT`` (default: none) the commit is exported (``git archive``) into a
temporary folder, *this* tree's ``benchmarks/`` is copied over its own, and every
benchmark runs there too, right after the same benchmark here: the two columns are
measured by the same code, on the same machine, minutes apart. The machine is shared
and noisy: read the medians, and compare columns of one run only.

The planner and fit calls are timed in CPU time by default (``--clock cpu``: the time
the process waits for a core on a busy shared machine is left out; ``--clock wall`` for
wall time). The table gives, per figure, the base, this tree, the goal and whether this tree
meets it. ``--json FILE`` also writes every benchmark's own output lines.

Usage::

    .venv/bin/python benchmarks/run_all.py --base a417679     # ~6 min on 2 cores
    .venv/bin/python benchmarks/run_all.py --quick             # ~1.5 min, this tree only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit import markdown_table

REPO = Path(__file__).resolve().parents[1]
BENCHES = ("planner", "fit", "reaction", "idle", "restart", "cli", "placement", "swap", "policy")
Lines = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Figure:
    """One row of the table: how to read it off a benchmark's lines, and its goal."""

    bench: str
    name: str
    read: Callable[[Lines], float | None]
    goal: str = ""
    meets: Callable[[float], bool] | None = None
    unit: str = ""


def _where(lines: Lines, **match: Any) -> dict[str, Any] | None:
    for line in lines:
        if all(line.get(k) == v for k, v in match.items()):
            return line
    return None


def _planner_median(scenario: str, serves: int, roles: int) -> Callable[[Lines], float | None]:
    def read(lines: Lines) -> float | None:
        line = _where(lines, scenario=scenario, serves=serves, roles=roles)
        return None if line is None else float(line["median_ms"])

    return read


def _planner_growth(scenario: str, roles: int) -> Callable[[Lines], float | None]:
    def read(lines: Lines) -> float | None:
        line = next((x for x in lines if "growth" in x), None)
        return None if line is None else float(line["by_roles"][scenario][str(roles)])

    return read


def _field(match: dict[str, Any], *keys: str) -> Callable[[Lines], float | None]:
    def read(lines: Lines) -> float | None:
        line = _where(lines, **match)
        for key in keys:
            if line is None:
                return None
            line = line.get(key)
        return None if line is None else float(line)  # type: ignore[arg-type]

    return read


def figures() -> list[Figure]:
    out: list[Figure] = []
    for scenario in ("steady", "cold", "evict", "exclusive"):
        out.append(
            Figure(
                "planner",
                f"{scenario} 1000x32 median",
                _planner_median(scenario, 1000, 32),
                "<= 10",
                lambda v: v <= 10.0,
                "ms",
            )
        )
        for roles in (2, 32):
            out.append(
                Figure(
                    "planner",
                    f"{scenario} growth 100->1000, {roles} roles",
                    _planner_growth(scenario, roles),
                    "<= ~12",
                    lambda v: v <= 12.5,
                    "x",
                )
            )
    fit = {"bench": "fit"}
    out += [
        Figure("fit", "fit_serve median", _field(fit, "vramctl_median_us"), unit="us"),
        Figure("fit", "largest-first median", _field(fit, "largest_first_median_us"), unit="us"),
        Figure("fit", "fit / largest-first", _field(fit, "ratio"), "<= 1", lambda v: v <= 1.0),
        Figure("fit", "worse victims (instances)", _field(fit, "worse"), "0", lambda v: v == 0),
        Figure("fit", "frees less surplus (share)", _field(fit, "less_surplus_share")),
    ]
    react = {"bench": "reaction_summary"}
    out += [
        Figure(
            "loop",
            "reaction median (first docker call)",
            _field(react, "median_ms"),
            "<= 80",
            lambda v: v <= 80.0,
            "ms",
        ),
        Figure(
            "loop",
            "reaction p90 (first docker call)",
            _field(react, "p90_ms"),
            "<= 120",
            lambda v: v <= 120.0,
            "ms",
        ),
        Figure("loop", "stops: to POST .../stop", _field(react, "stop", "median_ms"), unit="ms"),
        Figure("loop", "starts: to POST .../start", _field(react, "start", "median_ms"), unit="ms"),
        Figure(
            "loop", "reaction median (first docker event)", _field(react, "event", "median_ms"),
            unit="ms",
        ),
        Figure(
            "loop", "reaction p90 (first docker event)", _field(react, "event", "p90_ms"),
            unit="ms",
        ),
        Figure(
            "loop", "stops: to the kill event", _field(react, "stop", "event", "median_ms"),
            unit="ms",
        ),
        Figure(
            "loop", "starts: to the start event", _field(react, "start", "event", "median_ms"),
            unit="ms",
        ),
        Figure("loop", "to the step's begin", _field(react, "median_step_begin_ms"), unit="ms"),
        Figure("loop", "to the reload", _field(react, "median_detect_ms"), unit="ms"),
        Figure("loop", "recording proxy: added per request", _field(react, "proxy_added_us"),
               unit="us"),
    ]  # fmt: skip
    idle = {"bench": "idle", "mode": "api"}
    out += [
        Figure(
            "loop",
            "idle CPU, 20 serves + API",
            _field(idle, "cpu_pct"),
            "<= 0.5",
            lambda v: v <= 0.5,
            "% core",
        ),
        Figure(
            "loop",
            "idle RSS max, 20 serves + API",
            _field(idle, "rss_mib_max"),
            "<= 80",
            lambda v: v <= 80.0,
            "MiB",
        ),
        Figure("loop", "daemon events in the idle window", _field(idle, "daemon_events")),
    ]
    restart = {"bench": "restart_summary"}
    out += [
        Figure("restart", "first kill: die to start median",
               _field(restart, "first", "die_to_start_ms", "median_ms"), "<= 1000",
               lambda v: v <= 1000.0, "ms"),
        Figure("restart", "first kill: die to seen median",
               _field(restart, "first", "die_to_seen_ms", "median_ms"), "<= 500",
               lambda v: v <= 500.0, "ms"),
        Figure("restart", "again: late on the promise p90",
               _field(restart, "again", "late_ms", "p90_ms"), "<= 1000",
               lambda v: v <= 1000.0, "ms"),
    ]  # fmt: skip
    out += [
        Figure("cli", "python -c pass median", _field({"command": "python"}, "median_ms"),
               unit="ms"),
        Figure("cli", "--help median", _field({"command": "help"}, "median_ms"), "<= 250",
               lambda v: v <= 250.0, "ms"),
        Figure("cli", "validate median", _field({"command": "validate"}, "median_ms"), "<= 350",
               lambda v: v <= 350.0, "ms"),
        Figure("cli", "--help CPU median", _field({"command": "help"}, "cpu_median_ms"),
               unit="ms"),
        Figure("cli", "validate CPU median", _field({"command": "validate"}, "cpu_median_ms"),
               "<= 200", lambda v: v <= 200.0, "ms"),
        Figure("cli", "load average (1 min) at the start",
               _field({"bench": "cli_load"}, "loadavg_1m_before")),
    ]  # fmt: skip
    ours, pinned, most = (
        {"bench": "placement", "policy": p} for p in ("vramctl", "pinned", "most_free")
    )
    ratios = {"bench": "placement_ratio"}
    out += [
        Figure("placement", "refusals, vramctl (sum)", _field(ours, "refusals")),
        Figure("placement", "refusals, pinned round robin", _field(pinned, "refusals")),
        Figure("placement", "refusals, most free (Ollama)", _field(most, "refusals")),
        Figure("placement", "refusals vramctl / most free", _field(ratios, "refusals_vs_most_free"),
               "<= 1", lambda v: v <= 1.0),
        Figure("placement", "refusals vramctl / pinned", _field(ratios, "refusals_vs_pinned"),
               "<= 1", lambda v: v <= 1.0),
        Figure("placement", "cold starts, vramctl", _field(ours, "starts")),
        Figure("placement", "cold starts vramctl / most free",
               _field(ratios, "starts_vs_most_free")),
        Figure("placement", "evictions, vramctl", _field(ours, "evictions")),
        Figure("placement", "refused with room, vramctl", _field(ours, "with_room"), "0",
               lambda v: v == 0),
        Figure("placement", "overcommitted steps, vramctl", _field(ours, "overcommitted"), "0",
               lambda v: v == 0),
        Figure("placement", "unconverged steps, vramctl", _field(ours, "not_converged"), "0",
               lambda v: v == 0),
    ]  # fmt: skip
    swap = {"bench": "swap_summary"}
    # each way back: the key of its figures, its name, the goal of the controller's share
    ways = (("sleep", "sleep->wake", 50.0), ("stop", "stop->cold start", 150.0))
    out += [
        Figure(
            "swap",
            f"{way}: controller's share median",
            _ms(swap, "median_controller_s", key),
            f"<= {goal_ms:.0f}",
            lambda v, goal_ms=goal_ms: v <= goal_ms,
            "ms",
        )
        for key, way, goal_ms in ways
    ]
    out += [
        Figure("swap", f"{way} latency median", _ms(swap, "median_latency_s", key), unit="ms")
        for key, way, _ in ways
    ]
    out += [
        Figure(
            "swap",
            "stop/sleep ratio / engines' ratio",
            _field(swap, "ratio_vs_engines"),
            "0.85-1.15",
            lambda v: 0.85 <= v <= 1.15,
        ),
    ]
    ours = {"bench": "policy", "family": "default", "policy": "vramctl"}
    default = {"bench": "policy_family", "family": "default"}
    summary = {"bench": "policy_summary"}
    out += [
        Figure("policy", "vramctl mean wait (default)", _field(ours, "mean_wait_s"), unit="s"),
        Figure("policy", "vramctl p95 wait (default)", _field(ours, "p95_wait_s"), unit="s"),
        Figure("policy", "vramctl cold starts (default)", _field(ours, "cold_starts")),
        Figure("policy", "vramctl wakes (default)", _field(ours, "wakes")),
        Figure("policy", "best peer mean wait (default)",
               _field(default, "best_peer_mean_wait_s"), unit="s"),
        Figure("policy", "vramctl / best peer (default)",
               _field(summary, "default_vs_best_peer"), "<= 0.8", lambda v: v <= 0.8),
        Figure("policy", "vramctl / best peer (worst family)",
               _field(summary, "worst_vs_best_peer"), "<= 1", lambda v: v <= 1.0),
        Figure("policy", "families vramctl loses", _field(summary, "families_lost"),
               "0", lambda v: v == 0),
        Figure("policy", "without uses / best peer (default)",
               _field(default, "vramctl_no_reuse_vs_best_peer")),
    ]  # fmt: skip
    return out


def _ms(match: dict[str, Any], *keys: str) -> Callable[[Lines], float | None]:
    read = _field(match, *keys)

    def in_ms(lines: Lines) -> float | None:
        value = read(lines)
        return None if value is None else value * 1000.0

    return in_ms


def commands(quick: bool, clock: str) -> dict[str, list[str]]:
    py = sys.executable
    idle_s = "20" if quick else "60"
    return {
        "planner": [
            py, "benchmarks/bench_planner.py", "--serves", "100", "1000", "--roles", "2", "32",
            "--budget-s", "0.2" if quick else "0.5", "--clock", clock,
        ],
        "fit": [py, "benchmarks/bench_fit.py", "--instances", "300" if quick else "2000",
                "--clock", clock],
        "reaction": [py, "benchmarks/bench_loop.py", "--only", "reaction"],
        "idle": [py, "benchmarks/bench_loop.py", "--only", "idle", "--modes", "api",
                 "--idle-s", idle_s],
        "restart": [py, "benchmarks/bench_restart.py", "--rounds", "2" if quick else "5"],
        "cli": [py, "benchmarks/bench_cli.py", "--runs", "7" if quick else "21"],
        "placement": [py, "benchmarks/bench_placement.py", *(["--quick"] if quick else [])],
        "swap": [py, "benchmarks/bench_swap.py", "--reps", "2" if quick else "5"],
        "policy": [py, "benchmarks/bench_policy.py", *(["--quick"] if quick else [])],
    }  # fmt: skip


def run_one(tree: Path, argv: Sequence[str]) -> Lines:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    print(
        f"# {tree.name}: {' '.join(argv[1:3])} ... {time.monotonic() - started:.0f}s,"
        f" exit {proc.returncode}",
        file=sys.stderr,
        flush=True,
    )
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr[-2000:])
    lines: Lines = []
    for raw in proc.stdout.splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    return lines


def export(commit: str, into: Path) -> Path:
    """``commit``'s tree in ``into``, with this tree's benchmarks over its own."""
    tree = into / f"base-{commit[:12]}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    shutil.rmtree(tree / "benchmarks", ignore_errors=True)
    shutil.copytree(REPO / "benchmarks", tree / "benchmarks")
    return tree


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value == int(value) and abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def table(rows: list[Figure], results: dict[str, dict[str, Lines]], trees: list[str]) -> str:
    head = ["bench", "figure", "unit", *trees, "goal", "met"]
    body: list[list[str]] = []
    for f in rows:
        values = [f.read(results[t][f.bench if f.bench != "loop" else _loop_of(f)]) for t in trees]
        now = values[-1]
        met = "" if f.meets is None or now is None else ("yes" if f.meets(now) else "NO")
        body.append([f.bench, f.name, f.unit, *(_fmt(v) for v in values), f.goal, met])
    return markdown_table(head, body)


def _loop_of(f: Figure) -> str:
    return "idle" if f.name.startswith(("idle", "daemon")) else "reaction"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--base", default=None, help="a commit to measure beside this tree")
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke)")
    parser.add_argument("--only", action="append", choices=BENCHES)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="cpu",
        help="what the planner and fit calls are timed by: CPU time (default: a shared"
        " machine's wait for a core left out) or wall time",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every output line here")
    args = parser.parse_args(argv)
    cmds = commands(args.quick, args.clock)
    wanted = args.only or list(cmds)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vramctl-bench-") as tmp:
        trees: dict[str, Path] = {}
        if args.base:
            trees[f"base {args.base[:9]}"] = export(args.base, Path(tmp))
        trees["this tree"] = REPO
        results: dict[str, dict[str, Lines]] = {t: {} for t in trees}
        for bench in wanted:  # each benchmark on both trees, one right after the other
            for label, tree in trees.items():
                results[label][bench] = run_one(tree, cmds[bench])
    for got in results.values():
        for bench in BENCHES:
            got.setdefault(bench, [])
    shown = [f for f in figures() if (f.bench if f.bench != "loop" else _loop_of(f)) in wanted]
    print(table(shown, results, list(trees)))
    print(f"# {time.monotonic() - started:.0f}s in all", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
