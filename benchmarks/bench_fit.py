"""One admission decision: ``fit_serve`` against a greedy "largest first" admission.

What it measures: the wall time of one decision "can X start now, and whom must it
evict", in-process, on ``--instances`` random instances (default 2,000; seeded): 1 or 2
GPU roles (80 GiB cards, 2 GiB reserve), 0-2 running residents, 3-12 running committed
evictables (sizes, priorities and start times at random), and one idle on-demand
requester (on one role, or spanning both) asking for 10-70 % of a card. Two deciders,
the same inputs (a ``DesiredState`` and an ``Observed``), the same run, interleaved:

``vramctl``
    ``statemachine.answers.fit.fit_serve``: the planner's answer in isolation (the observed
    ledger, ``ledger_from_observed``; the shortfall, the victim search, every term of
    the arithmetic).
``largest_first``
    The simplest peer that gives the same answer, written here: the ledger from the
    observation (``ledger_from_observed``: the same accounting, so both decide on the
    same committed MiB), each
    role's terms for the request, and if it is short the running evictables on its
    short roles, largest first, until every role is covered (the way a stack's own
    greedy admission decides). No reasons, no min_runtime or start-in-progress rules
    (the instances have none of those, so both decide on the same facts).

Each decider is timed per instance (``time.perf_counter_ns``, the GC collected before
and off during the timed calls, ``--reps`` calls per instance, the median kept); the
output gives the median and p90 over instances, and the ratio of the medians.

Victims, where both evict: ``fewer`` / ``same`` / ``more`` victims for vramctl, and of
the same-count cases the share where vramctl frees less surplus (MiB freed beyond the
shortfall, summed over the short roles), the same, or more. ``worse`` counts the
instances where vramctl's choice is worse on (count, surplus) or where one fits and the
other does not: it must be 0.

Not measured: the fit JSON, the CLI/HTTP round trip, elastic shrink, min_runtime_s,
starts in progress, exclusive serves (the peer has none of these).

Usage::

    .venv/bin/python benchmarks/bench_fit.py                 # ~30 s on 2 cores
    .venv/bin/python benchmarks/bench_fit.py --instances 200 # smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchkit import BUDGET_MIB, NOW, cards

from statemachine.answers.fit import fit_serve
from statemachine.domain.types import (
    ContainerObs,
    ContainerState,
    DesiredRun,
    DesiredState,
    Observed,
    Residency,
    ServeSpec,
)
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.victims import Candidate, largest_first

REQUESTER = "want"
#: wall time, or with ``--clock cpu`` this thread's CPU time (no wait for a core)
CLOCK = time.perf_counter_ns


@dataclass(frozen=True, slots=True)
class Instance:
    desired: DesiredState
    observed: Observed


@dataclass(frozen=True, slots=True)
class Decision:
    """Fits or not, and the victims (names)."""

    fits: bool
    victims: frozenset[str]


def build(rng: random.Random) -> Instance:
    n_roles = rng.choice((1, 2))
    ids = [f"gpu{i}" for i in range(n_roles)]
    roles = cards(ids)
    serves: dict[str, ServeSpec] = {}
    containers: dict[str, ContainerObs] = {}
    load = dict.fromkeys(ids, 0)

    def place(name: str, residency: Residency, mib: int, on: tuple[str, ...], **kw: object) -> None:
        serves[name] = ServeSpec(
            name=name,
            container=f"c-{name}",
            gpu_roles=on,
            vram_mib=mib,
            residency=residency,
            desired=DesiredRun.RUNNING if residency is Residency.RESIDENT else None,
            **kw,  # type: ignore[arg-type]
        )

    for i in range(rng.randint(0, 2)):
        on = (rng.choice(ids),)
        mib = rng.randint(2_000, 16_000)
        if load[on[0]] + mib > BUDGET_MIB // 2:
            continue
        place(f"res{i}", Residency.RESIDENT, mib, on)
        containers[f"c-res{i}"] = ContainerObs(ContainerState.RUNNING, started_at=NOW - 86_400)
        load[on[0]] += mib
    for i in range(rng.randint(3, 12)):
        on = (rng.choice(ids),) if n_roles == 1 or rng.random() < 0.8 else tuple(ids)
        room = min(BUDGET_MIB - load[r] for r in on)
        if room < 1_000:
            continue
        mib = min(room, rng.randint(1_000, 30_000))
        place(f"evi{i}", Residency.EVICTABLE, mib, on, priority=rng.randint(0, 5))
        containers[f"c-evi{i}"] = ContainerObs(
            ContainerState.RUNNING, started_at=NOW - rng.randint(600, 86_400)
        )
        for r in on:
            load[r] += mib
    on = (rng.choice(ids),) if n_roles == 1 or rng.random() < 0.7 else tuple(ids)
    want = rng.randint(int(0.1 * BUDGET_MIB), int(0.7 * BUDGET_MIB))
    place(REQUESTER, Residency.ON_DEMAND, want, on)
    return Instance(
        DesiredState(roles=roles, serves=serves),
        Observed(docker_ok=True, containers=containers),
    )


def decide_vramctl(inst: Instance) -> Decision:
    got = fit_serve(inst.desired, inst.observed, REQUESTER, now=NOW)
    return Decision(got.fits, frozenset(got.evict))


def decide_largest_first(inst: Instance) -> Decision:
    """The peer: the same answer (fits, each role's terms, whom to stop), greedily.

    The ledger from the observation (the same accounting as vramctl's, so both decide on
    the same committed MiB), each role's terms for the request, and if it is short the
    running evictables on its short roles, largest first, until every role is covered.
    """
    desired, observed = inst.desired, inst.observed
    want = desired.serves[REQUESTER]
    assert want.vram_mib is not None
    ledger = ledger_from_observed(desired, observed)
    terms = ledger.terms(want.name, want.gpu_roles, want.vram_mib)
    short = {t.gpu_role: t.shortfall_mib for t in terms if t.shortfall_mib}
    if not short:
        return Decision(True, frozenset())
    pool = [
        Candidate(s.name, s.gpu_roles, ledger.holdings[s.name].mib, s.priority)
        for s in desired.serves.values()
        if s.residency is Residency.EVICTABLE
        and ledger.holds(s.name)
        and observed.container(s.container).holds
        and any(r in short for r in s.gpu_roles)
    ]
    chosen = largest_first(pool, short)
    if chosen is None:
        return Decision(False, frozenset())
    return Decision(True, frozenset(c.name for c in chosen))


def surplus(inst: Instance, victims: frozenset[str]) -> int:
    """MiB the victims free beyond the requester's shortfall, over its short roles."""
    desired, observed = inst.desired, inst.observed
    want = desired.serves[REQUESTER]
    assert want.vram_mib is not None
    out = 0
    for r in want.gpu_roles:
        committed = sum(
            s.vram_mib or 0
            for s in desired.serves.values()
            if r in s.gpu_roles and observed.container(s.container).holds
        )
        need = want.vram_mib - (desired.roles[r].budget_mib - committed)
        if need > 0:
            out += (
                sum(
                    desired.serves[v].vram_mib or 0
                    for v in victims
                    if r in desired.serves[v].gpu_roles
                )
                - need
            )
    return out


def time_one(decide: Callable[[Instance], Decision], inst: Instance, reps: int) -> float:
    """Median µs of ``reps`` calls."""
    samples = []
    for _ in range(reps):
        t0 = CLOCK()
        decide(inst)
        samples.append(CLOCK() - t0)
    return statistics.median(samples) / 1000


def p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def run(instances: int, seed: int, reps: int) -> dict[str, object]:
    rng = random.Random(f"fit/{seed}")
    insts = [build(rng) for _ in range(instances)]
    ours_us: list[float] = []
    peer_us: list[float] = []
    quality = {
        "both_evict": 0,
        "fewer": 0,
        "same_count": 0,
        "more": 0,
        "less_surplus": 0,
        "same_surplus": 0,
        "more_surplus": 0,
        "worse": 0,
        "fits_both": 0,
        "fits_neither": 0,
    }
    for inst in insts:
        a, b = decide_vramctl(inst), decide_largest_first(inst)  # warm, and compared
        if a.fits != b.fits:
            quality["worse"] += a.fits < b.fits
        elif not a.fits:
            quality["fits_neither"] += 1
        else:
            quality["fits_both"] += 1
            if a.victims or b.victims:
                quality["both_evict"] += 1
                if len(a.victims) < len(b.victims):
                    quality["fewer"] += 1
                elif len(a.victims) > len(b.victims):
                    quality["more"] += 1
                    quality["worse"] += 1
                else:
                    quality["same_count"] += 1
                    sa, sb = surplus(inst, a.victims), surplus(inst, b.victims)
                    key = (
                        "less_surplus" if sa < sb else "more_surplus" if sa > sb else "same_surplus"
                    )
                    quality[key] += 1
                    quality["worse"] += sa > sb
    gc.collect()
    gc.disable()
    try:
        for inst in insts:  # interleaved: the same instance, the same moment
            ours_us.append(time_one(decide_vramctl, inst, reps))
            peer_us.append(time_one(decide_largest_first, inst, reps))
    finally:
        gc.enable()
    ours, peer = statistics.median(ours_us), statistics.median(peer_us)
    evicting = quality["both_evict"] or 1
    return {
        "bench": "fit",
        "instances": instances,
        "seed": seed,
        "reps": reps,
        "vramctl_median_us": round(ours, 1),
        "vramctl_p90_us": round(p90(ours_us), 1),
        "largest_first_median_us": round(peer, 1),
        "largest_first_p90_us": round(p90(peer_us), 1),
        "ratio": round(ours / peer, 2),
        "less_surplus_share": round(quality["less_surplus"] / evicting, 3),
        **quality,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=5, help="timed calls per instance (5)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args(argv)
    global CLOCK  # noqa: PLW0603 (a benchmark script: one clock for the run)
    CLOCK = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    out = run(args.instances, args.seed, args.reps)
    print(json.dumps(out), flush=True)
    return 1 if out["worse"] else 0


if __name__ == "__main__":
    sys.exit(main())
