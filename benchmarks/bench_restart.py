"""Kill to restart: how soon ``vramctl run`` brings a killed serve back, from Docker's events.

Against the real daemon and a real ``vramctl run`` subprocess (``--no-api`` when this
vramctl has an API, ``--resync`` 5 s, the default backoff: 5 s base), one resident
serve (busybox ``sleep``; no port, no health path), running. Each of ``--rounds``
(default 5) rounds starts a fresh controller (the backoff lives in memory: a fresh one
has no crash loop), lets it see the serve running for ``--healthy-s`` (default 2), and
then, with ``docker kill``:

``first``
    kills the serve once (a death after a healthy run) and measures, from Docker's own
    event times (``timeNano``), the container's ``die`` to its next ``start``
    (``die_to_start_ms``), and the ``die`` to the controller's log record that counted
    it (``X: container exited 137; failure 1, …``: ``die_to_seen_ms``, the time the
    death took to be noticed);
``again``
    once the serve runs again (and was seen running), kills it a second time (a
    repeated failure: held for the promise the log gives, ``next try in Ns``) and
    measures the same, plus ``late_ms``: the next ``start`` event minus the moment the
    promise ran out (the log record's time plus N seconds; negative: before it).

Output: one JSON line per round (``bench: restart``) and a ``restart_summary`` line
(median / p90 by nearest rank / min / max of each figure over the rounds). All clocks
are this host's wall clock (the daemon is local). Progress goes to stderr.

Containers: ``vramctl-test:latest`` (``--image``), ``init=True``, host networking,
``sleep 3600``, labels ``vramctl.bench=1`` and ``vramctl.bench.run=<run id>``;
removed at the end (also on Ctrl-C / SIGTERM), after the controller is stopped.

Usage::

    .venv/bin/python benchmarks/bench_restart.py              # ~1.5 min on 2 cores
    .venv/bin/python benchmarks/bench_restart.py --rounds 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_loop as loop
import docker

#: a restart the loop does not make within this long counts as never (seconds)
RESTART_WAIT_S = 60.0
_PROMISE = re.compile(r"failure (\d+), next try in (\d+)s")


def _event_after(fleet: loop.Fleet, name: str, action: str, t_ns: int) -> int | None:
    """Docker's time (ns) of ``name``'s first ``action`` event after ``t_ns``."""
    for e in list(fleet.own):
        at = int(e.get("timeNano", 0))
        if at > t_ns and e.get("Action") == action and e["Actor"]["Attributes"].get("name") == name:
            return at
    return None


def _counted(ctl: loop.Controller, failure: int, after: float) -> dict[str, Any] | None:
    """The log record of the ``failure``-th failure of the serve, logged after ``after``."""
    return ctl.find(f"s00: container exited 137; failure {failure},", after)


def one_kill(
    fleet: loop.Fleet, ctl: loop.Controller, name: str, failure: int, after_ns: int
) -> dict[str, Any]:
    """Kill ``name``; Docker's die and next start, the record that counted the death."""
    fleet.client.containers.get(name).kill()
    died = loop.wait_for("the die event", lambda: _event_after(fleet, name, "die", after_ns))
    seen = loop.wait_for("the death counted", lambda: _counted(ctl, failure, died / 1e9 - 1.0))
    started = loop.wait_for(
        "the restart",
        lambda: _event_after(fleet, name, "start", died),
        timeout=RESTART_WAIT_S,
    )
    seen_at = float(seen["time"]["timestamp"])
    out: dict[str, Any] = {
        "die_to_seen_ms": round((seen_at - died / 1e9) * 1000, 1),
        "die_to_start_ms": round((started - died) / 1e6, 1),
        "started_ns": started,
    }
    promise = _PROMISE.search(str(seen.get("message", "")))
    out["promised_s"] = 0 if promise is None else int(promise.group(2))
    out["late_ms"] = round((started / 1e9 - (seen_at + out["promised_s"])) * 1000, 1)
    return out


def one_round(fleet: loop.Fleet, tmp: Path, args: argparse.Namespace, extra: Sequence[str]) -> Any:
    name = fleet.names[0]
    path = tmp / "serves.toml"
    path.write_text(loop.manifest([name], {}))
    with loop.controller(tmp, path, args.resync, extra) as ctl:
        time.sleep(args.healthy_s)  # seen running, healthy, by a few cycles
        first = one_kill(fleet, ctl, name, 1, time.time_ns())
        loop.wait_for("running again", lambda: fleet.status(name) == "running")
        time.sleep(args.healthy_s)
        again = one_kill(fleet, ctl, name, 2, first["started_ns"])
        loop.wait_for("running again", lambda: fleet.status(name) == "running")
    for x in (first, again):
        del x["started_ns"]
    return {"bench": "restart", "first": first, "again": again}


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values), 1),
        "p90_ms": round(loop.nearest_rank(values, 0.9), 1),
        "min_ms": round(min(values), 1),
        "max_ms": round(max(values), 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--image", default=loop.DEFAULT_IMAGE)
    parser.add_argument("--rounds", type=int, default=5, help="controllers, two kills each (5)")
    parser.add_argument("--healthy-s", type=float, default=2.0, help="seen running before a kill")
    parser.add_argument("--resync", type=float, default=5.0, help="--resync of run (5)")
    args = parser.parse_args(argv)
    extra = ["--no-api"] if loop.has_api() else []
    client = docker.from_env(timeout=60)
    started = time.perf_counter()
    lines: list[dict[str, Any]] = []
    try:
        with loop.fleet_of(client, args.image) as fleet:
            fleet.follow()
            fleet.grow_to(1)
            for i in range(args.rounds):
                with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
                    line = {**one_round(fleet, Path(tmp), args, extra), "round": i + 1}
                print(json.dumps(line), flush=True)
                lines.append(line)
    except KeyboardInterrupt:
        loop.log("interrupted")
        return 130
    finally:
        client.close()
    summary: dict[str, Any] = {"bench": "restart_summary", "rounds": len(lines)}
    for kill in ("first", "again"):
        summary[kill] = {
            figure: _stats([x[kill][figure] for x in lines])
            for figure in ("die_to_seen_ms", "die_to_start_ms", "late_ms")
        }
        summary[kill]["promised_s"] = sorted({x[kill]["promised_s"] for x in lines})
    print(json.dumps(summary), flush=True)
    loop.log(f"total {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
