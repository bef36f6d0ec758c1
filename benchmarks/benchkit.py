"""What several benchmarks share: the synthetic host's figures, the controller's
command line, removing a benchmark's containers however its run ends, and the Markdown
table their results are printed in.

A helper module, not a benchmark: ``run_all.py`` never runs it, and it starts nothing
itself.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import docker
from docker.errors import NotFound

from statemachine.domain.types import GpuRole

#: the synthetic clock of the in-process benchmarks (seconds since the epoch)
NOW = 1_700_000_000.0
#: one synthetic card: an 80 GiB GPU with 2 GiB kept back
CAPACITY_MIB = 81_920
RESERVE_MIB = 2_048
BUDGET_MIB = CAPACITY_MIB - RESERVE_MIB


#: every benchmark container's label, and the one naming its run (``<label>=<run id>``)
BENCH_LABEL = "vramctl.bench"
RUN_LABEL = "vramctl.bench.run"


def start_sleeper(client: docker.DockerClient, image: str, name: str, run_id: str) -> str:
    """Start ``name``: ``sleep 3600`` under an init, on the host's network, labelled
    with the benchmark's label and ``run_id``; its name."""
    client.containers.run(
        image,
        ["sleep", "3600"],
        detach=True,
        init=True,
        network_mode="host",
        name=name,
        labels={BENCH_LABEL: "1", RUN_LABEL: run_id},
    )
    return name


def cards(ids: Sequence[str]) -> dict[str, GpuRole]:
    """A role per id, each one synthetic card (:data:`CAPACITY_MIB`, :data:`RESERVE_MIB`)."""
    return {r: GpuRole(r, capacity_mib=CAPACITY_MIB, reserve_mib=RESERVE_MIB) for r in ids}


def remove_labelled(client: docker.DockerClient, label: str) -> int:
    """Force-remove every container labelled ``label`` (``key=value``), four at a time;
    the count found (one already gone is not an error)."""
    found = client.containers.list(all=True, filters={"label": label})

    def remove(c: Any) -> None:
        with contextlib.suppress(NotFound):
            c.remove(force=True)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(remove, found))
    return len(found)


def run_argv(manifest: Path, state: Path, resync_s: float, *extra: str) -> list[str]:
    """``vramctl run`` on ``manifest`` with its journal in ``state``, as a child of this
    interpreter, logging JSON lines; ``extra`` goes last."""
    return [
        sys.executable,
        "-m",
        "controller.interfaces.cli",
        "run",
        "-m",
        str(manifest),
        "--state-dir",
        str(state),
        "--resync",
        str(resync_s),
        "--log-json",
        *extra,
    ]


@contextlib.contextmanager
def removed_at_exit(remove_all: Callable[[], int]) -> Iterator[None]:
    """Run the block, then ``remove_all()`` however it ends: a SIGTERM ends it as
    Ctrl-C does, and a second Ctrl-C during the removal is ignored (the removal
    finishes). The count removed goes to stderr."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # let cleanup finish
        try:
            print(f"# removed {remove_all()} benchmark containers", file=sys.stderr, flush=True)
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, previous)


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``head`` and ``rows`` as a Markdown table, each column padded to its widest cell."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    return "\n".join(lines)
