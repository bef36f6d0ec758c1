"""Wall-clock benchmark of ``statemachine.planning.planner.plan_transitions`` on growing fleets.

What it measures: the time of one ``plan_transitions(desired, observed, policy, now)``
call, in-process, on synthetic fleets of ``serves`` x ``roles`` (serves in 10, 100,
1000; GPU roles in 2, 8, 32), for four scenarios:

``steady``
    Every serve that is desired running is running and fits; on-demand serves are
    idle with no request; a few serves are desired stopped and stopped. The plan is
    empty (0 steps, 0 blocked). This is the cost of every reconcile tick on a
    converged host.
``cold``
    The same kind of fleet, sized so that what is desired running is about 1.25 x the
    budget of every role, and nothing is running. The plan is a long list of starts
    (residents first, then evictable backfill by priority); the backfill that does not
    fit is blocked, each with its full arithmetic. The cost after a host reboot.
``evict``
    A fleet that fills ~95 % of every role's budget (residents and evictables), plus
    one idle on-demand serve per role (at most serves/4 of them) that is requested,
    each asking for ~30 % of a GPU: each request must evict evictables (several when
    the role holds many small serves). Requesters that residents crowd out are blocked.
``exclusive``
    A fleet at ~70 % fill, residents only on even roles, some GPU-free sidecars, and
    requested exclusive on-demand serves on odd roles (R/4 of them, at least one):
    each stops every GPU-inference serve on its role, sidecars stay. One more
    exclusive requester spans roles 0 and 1 and is blocked by a resident.

Fleets are built by a seeded ``random.Random`` (``--seed``), so runs are comparable
across commits and machines. Sizes are scaled to the role budget (``serves/roles``
serves share a GPU), which is unrealistic in absolute MiB at 1000 x 2 but keeps every
scenario meaningful at every size: it is the algorithmic growth that is measured.

Each (scenario, serves, roles) is warmed up once, then timed with
``time.perf_counter_ns`` for at least ``--min-reps`` repetitions and until ~``--budget-s``
seconds are spent (capped at ``--max-reps``), with the garbage collector collected
before and disabled during the timed calls (as ``timeit`` does). One JSON line is
printed per (scenario, serves, roles): ``median_ms``, ``p90_ms``, ``min_ms``, ``reps``,
``steps``, ``blocked``. A last line gives median(largest serves) / median(next largest)
per scenario and role count, so super-linear growth is visible (10x serves: ~10 is
linear, ~100 quadratic).

What it does not measure: building the fleet (manifest parsing, snapshot decoding),
``Plan.to_json`` and printing, the lifecycle machine, the executor, docker or NVML,
elastic shrink / grow paths, memory use, or multi-process contention. Absolute numbers
depend on the machine and Python build; compare runs on the same machine only.

Usage::

    .venv/bin/python benchmarks/bench_planner.py            # full: ~30 s on 2 cores
    .venv/bin/python benchmarks/bench_planner.py --quick    # smoke: ~1 s
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchkit import BUDGET_MIB, NOW, cards

from statemachine.domain import types as st
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)

MIN_MIB = 16
MAX_SERVE_FRACTION = 0.6
BASE_PORT = 20_000

#: the clock the calls are timed with: wall time (``perf_counter_ns``), or with ``--clock
#: cpu`` this thread's CPU time (``thread_time_ns``), which leaves out the time the
#: process waits for a core on a shared machine
CLOCK = time.perf_counter_ns

FULL_SERVES = (10, 100, 1000)
FULL_ROLES = (2, 8, 32)
QUICK_SERVES = (10, 100)
QUICK_ROLES = (2, 8)


@dataclass(frozen=True, slots=True)
class Fleet:
    """A desired state and an observation to plan from."""

    desired: st.DesiredState
    observed: st.Observed


@dataclass(slots=True)
class _Draft:
    """A serve before its size is known."""

    name: str
    roles: tuple[str, ...]
    residency: st.Residency | None
    desired: st.DesiredRun | None
    running: bool
    weight: float
    priority: int
    router_tier: str | None
    gpu_inference: bool = True
    exclusive: bool = False
    mib: int | None = None


def _requester(name: str, roles: tuple[str, ...], mib: int, *, exclusive: bool = False) -> _Draft:
    """An on-demand serve that does not run yet (it asks to), ``mib`` on ``roles``."""
    return _Draft(
        name=name,
        roles=roles,
        residency=st.Residency.ON_DEMAND,
        desired=None,
        running=False,
        weight=1.0,
        priority=5,
        router_tier=None,
        exclusive=exclusive,
        mib=mib,
    )


def _role_ids(n: int) -> list[str]:
    return [f"gpu{i:02d}" for i in range(n)]


def _placement(
    rng: random.Random, i: int, ids: Sequence[str], pool: Sequence[int], *, span: bool
) -> tuple[str, ...]:
    """Round-robin over ``pool`` (role indexes); with ``span``, ~15 % span two adjacent roles."""
    first = pool[i % len(pool)]
    if span and len(ids) >= 2 and rng.random() < 0.15:
        return (ids[first], ids[(first + 1) % len(ids)])
    return (ids[first],)


def _size(drafts: Sequence[_Draft], fill: float) -> None:
    """Give every drafted serve in ``drafts`` a size so each role's total is <= fill x budget.

    A serve gets its weight's share of the target on each of its roles, the smallest of
    those shares, so the sum on every role is bounded by the target (to within MIN_MIB
    per serve on roles holding more serves than the target has MiB, never here). No
    serve gets more than MAX_SERVE_FRACTION of a GPU, so a role with a single serve
    stays under the target instead of holding one serve that can never fit.
    """
    target = BUDGET_MIB * fill
    weight_on: dict[str, float] = {}
    for d in drafts:
        for r in d.roles:
            weight_on[r] = weight_on.get(r, 0.0) + d.weight
    for d in drafts:
        share = min(target * d.weight / weight_on[r] for r in d.roles)
        d.mib = max(MIN_MIB, int(min(share, BUDGET_MIB * MAX_SERVE_FRACTION)))


def _residency(rng: random.Random) -> tuple[st.Residency, st.DesiredRun | None]:
    x = rng.random()
    if x < 0.25:
        return st.Residency.RESIDENT, st.DesiredRun.RUNNING
    if x < 0.80:
        return st.Residency.EVICTABLE, st.DesiredRun.RUNNING
    if x < 0.95:
        return st.Residency.ON_DEMAND, None
    return st.Residency.EVICTABLE, st.DesiredRun.STOPPED


def _draft_fleet(
    rng: random.Random,
    n: int,
    ids: Sequence[str],
    *,
    running: bool,
    resident_roles: Sequence[int] | None = None,
) -> list[_Draft]:
    """``n`` serves of the mixed fleet; desired-running ones are ``running`` or not."""
    drafts: list[_Draft] = []
    all_roles = list(range(len(ids)))
    for i in range(n):
        residency, desired = _residency(rng)
        pool, span = all_roles, True
        if residency is st.Residency.RESIDENT and resident_roles is not None:
            pool, span = list(resident_roles), False
        drafts.append(
            _Draft(
                name=f"s{i:04d}",
                roles=_placement(rng, i, ids, pool, span=span),
                residency=residency,
                desired=desired,
                running=running and desired is st.DesiredRun.RUNNING,
                weight=rng.uniform(0.5, 1.5),
                priority=rng.randrange(0, 10),
                router_tier=f"tier-{i % 3}" if rng.random() < 0.2 else None,
            )
        )
    return drafts


def _to_fleet(
    drafts: Sequence[_Draft], ids: Sequence[str], requests: Sequence[st.OnDemandRequest] = ()
) -> Fleet:
    serves: dict[str, st.ServeSpec] = {}
    containers: dict[str, st.ContainerObs] = {}
    for i, d in enumerate(drafts):
        serves[d.name] = st.ServeSpec(
            name=d.name,
            container=f"c-{d.name}",
            gpu_roles=d.roles,
            vram_mib=d.mib,
            residency=d.residency,
            desired=d.desired,
            port=BASE_PORT + i,
            exclusive=d.exclusive,
            gpu_inference=d.gpu_inference,
            priority=d.priority,
            min_runtime_s=0.0,
            router_tier=d.router_tier,
        )
        if d.running:
            # started 1..24 h ago; alternate 'exited' and absent for the others
            started = NOW - 3600.0 * (1 + i % 24)
            containers[f"c-{d.name}"] = st.ContainerObs(
                st.ContainerState.RUNNING, health="healthy", started_at=started
            )
        elif i % 2 == 0:
            containers[f"c-{d.name}"] = st.ContainerObs(st.ContainerState.EXITED, exit_code=0)
    desired = st.DesiredState(roles=cards(ids), serves=serves, requests=tuple(requests))
    return Fleet(desired, st.Observed(docker_ok=True, containers=containers))


def build_steady(n: int, r: int, seed: int) -> Fleet:
    """Converged: everything desired running runs and fits (~90 % fill)."""
    rng = random.Random(f"steady/{n}/{r}/{seed}")
    ids = _role_ids(r)
    drafts = _draft_fleet(rng, n, ids, running=True)
    _size([d for d in drafts if d.running], 0.90)
    _size([d for d in drafts if not d.running], 0.50)
    return _to_fleet(drafts, ids)


def build_cold(n: int, r: int, seed: int) -> Fleet:
    """Nothing runs; what is desired running is ~1.25 x every role's budget."""
    rng = random.Random(f"cold/{n}/{r}/{seed}")
    ids = _role_ids(r)
    drafts = _draft_fleet(rng, n, ids, running=False)
    _size([d for d in drafts if d.desired is st.DesiredRun.RUNNING], 1.25)
    _size([d for d in drafts if d.desired is not st.DesiredRun.RUNNING], 0.50)
    return _to_fleet(drafts, ids)


def _load(drafts: Sequence[_Draft], role: str, *, evictable_only: bool = False) -> int:
    return sum(
        d.mib or 0
        for d in drafts
        if d.running
        and role in d.roles
        and (not evictable_only or d.residency is st.Residency.EVICTABLE)
    )


def build_evict(n: int, r: int, seed: int) -> Fleet:
    """~95 % full; one requested on-demand serve per role (<= n/4) that must evict."""
    rng = random.Random(f"evict/{n}/{r}/{seed}")
    ids = _role_ids(r)
    k = max(1, min(r, n // 4))  # one requester per role, at most a quarter of the fleet
    drafts = _draft_fleet(rng, n - k, ids, running=True)
    # the idle on-demand serves of the mix stay idle; only the k requesters are asked for
    _size([d for d in drafts if d.running], 0.95)
    _size([d for d in drafts if not d.running], 0.50)
    requests: list[st.OnDemandRequest] = []
    # spread the requesters over the roles that hold something to evict
    targets = [x for x in ids if _load(drafts, x, evictable_only=True) > 0] or list(ids)
    for j in range(k):
        role = targets[(j * len(targets)) // k]
        free = BUDGET_MIB - _load(drafts, role)
        want = int(BUDGET_MIB * 0.30)
        # must need eviction where there is anything to evict, and never exceed what
        # eviction could free (so the blocked ones are blocked by residents, not size)
        want = min(max(want, free + MIN_MIB), free + _load(drafts, role, evictable_only=True))
        name = f"od{j:03d}"
        drafts.append(_requester(name, (role,), max(MIN_MIB, want)))
        requests.append(st.OnDemandRequest(name, NOW - 60.0 + j, ttl_s=3600.0))
    return _to_fleet(drafts, ids, requests)


def build_exclusive(n: int, r: int, seed: int) -> Fleet:
    """~70 % full, residents on even roles; exclusive requesters on odd roles (+1 blocked)."""
    rng = random.Random(f"exclusive/{n}/{r}/{seed}")
    ids = _role_ids(r)
    odd = [i for i in range(r) if i % 2 == 1]
    k = max(1, min(len(odd), r // 4, n // 4))
    even = [i for i in range(r) if i % 2 == 0]
    drafts = _draft_fleet(rng, n - k - 1, ids, running=True, resident_roles=even)
    for d in drafts:
        if d.residency is st.Residency.EVICTABLE and rng.random() < 0.10:
            d.gpu_inference = False  # a sidecar: may run beside an exclusive serve
    _size([d for d in drafts if d.running], 0.70)
    _size([d for d in drafts if not d.running], 0.50)
    # spread the requesters over the odd roles that run something they must stop
    busy = [
        ids[i]
        for i in odd
        if any(d.running and d.gpu_inference and ids[i] in d.roles for d in drafts)
    ] or [ids[i] for i in odd]
    requesters: list[tuple[str, tuple[str, ...]]] = [
        (f"ex{j:03d}", (busy[(j * len(busy)) // k],)) for j in range(k)
    ]
    requesters.append((f"ex{k:03d}", (ids[0], ids[1])))  # role 0 holds residents: blocked
    requests: list[st.OnDemandRequest] = []
    for j, (name, roles) in enumerate(requesters):
        drafts.append(_requester(name, roles, BUDGET_MIB // 2, exclusive=True))
        requests.append(st.OnDemandRequest(name, NOW - 60.0 + j, ttl_s=3600.0))
    return _to_fleet(drafts, ids, requests)


SCENARIOS: dict[str, Callable[[int, int, int], Fleet]] = {
    "steady": build_steady,
    "cold": build_cold,
    "evict": build_evict,
    "exclusive": build_exclusive,
}


def _check(scenario: str, n: int, plan: Plan) -> None:
    """Fail loudly when a scenario does not exercise what it claims (fleet builder bug)."""
    actions = [s.action for s in plan.steps]
    problem = None
    if scenario == "steady" and (plan.steps or plan.blocked):
        problem = "steady fleet is not converged"
    elif scenario == "cold" and Action.START not in actions:
        problem = "cold plan starts nothing"
    elif scenario == "cold" and n >= 100 and not plan.blocked:
        problem = "cold plan blocks nothing"
    elif scenario in ("evict", "exclusive") and n >= 100 and Action.STOP not in actions:
        problem = f"{scenario} plan stops nothing"
    elif scenario == "exclusive" and n >= 100 and not plan.blocked:
        problem = "exclusive plan blocks nothing"
    if problem:
        raise SystemExit(f"bench_planner: {problem} ({scenario}, {n} serves)")


def _percentile(sorted_ns: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of an ascending sequence."""
    idx = max(0, math.ceil(q * len(sorted_ns)) - 1)
    return sorted_ns[idx]


def time_plan(
    fleet: Fleet, min_reps: int, max_reps: int, budget_s: float
) -> tuple[list[int], Plan]:
    """Warm up once, then time calls until ``min_reps`` and ``budget_s`` are both met."""
    policy = Policy()
    plan = plan_transitions(fleet.desired, fleet.observed, policy, NOW)  # warm-up
    samples: list[int] = []
    budget_ns = int(budget_s * 1e9)
    spent = 0
    gc.collect()
    gc.disable()
    try:
        while len(samples) < max_reps and (len(samples) < min_reps or spent < budget_ns):
            t0 = CLOCK()
            plan_transitions(fleet.desired, fleet.observed, policy, NOW)
            dt = CLOCK() - t0
            samples.append(dt)
            spent += dt
    finally:
        gc.enable()
    return samples, plan


def run(
    serves: Sequence[int],
    roles: Sequence[int],
    scenarios: Sequence[str],
    *,
    min_reps: int,
    max_reps: int,
    budget_s: float,
    seed: int,
) -> dict[tuple[str, int, int], float]:
    """Print one JSON line per (scenario, serves, roles); return the medians in ms."""
    medians: dict[tuple[str, int, int], float] = {}
    for scenario in scenarios:
        for n in serves:
            for r in roles:
                fleet = SCENARIOS[scenario](n, r, seed)
                samples, plan = time_plan(fleet, min_reps, max_reps, budget_s)
                _check(scenario, n, plan)
                ordered = sorted(samples)
                median_ms = statistics.median(ordered) / 1e6
                medians[(scenario, n, r)] = median_ms
                row = {
                    "scenario": scenario,
                    "serves": len(fleet.desired.serves),
                    "roles": r,
                    "median_ms": round(median_ms, 3),
                    "p90_ms": round(_percentile(ordered, 0.90) / 1e6, 3),
                    "min_ms": round(ordered[0] / 1e6, 3),
                    "reps": len(ordered),
                    "steps": len(plan.steps),
                    "blocked": len(plan.blocked),
                }
                print(json.dumps(row), flush=True)
    return medians


def growth(
    medians: dict[tuple[str, int, int], float],
    serves: Sequence[int],
    roles: Sequence[int],
    scenarios: Sequence[str],
) -> dict[str, object]:
    """median(largest serves) / median(next largest), per scenario and role count."""
    big, small = sorted(set(serves))[-1], sorted(set(serves))[-2]
    ratios = {
        scenario: {
            str(r): round(medians[(scenario, big, r)] / medians[(scenario, small, r)], 2)
            for r in roles
        }
        for scenario in scenarios
    }
    return {"growth": f"median({big} serves)/median({small} serves)", "by_roles": ratios}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: serves (10, 100) x roles (2, 8), 3 reps, ~0.05 s per size",
    )
    parser.add_argument("--seed", type=int, default=0, help="fleet seed (default 0)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="run only this scenario (repeatable; default: all)",
    )
    parser.add_argument(
        "--serves", type=int, nargs="+", default=None, help="fleet sizes (default 10 100 1000)"
    )
    parser.add_argument(
        "--roles", type=int, nargs="+", default=None, help="GPU role counts (default 2 8 32)"
    )
    parser.add_argument("--min-reps", type=int, default=None, help="default 5 (quick: 3)")
    parser.add_argument("--max-reps", type=int, default=1000, help="default 1000")
    parser.add_argument("--budget-s", type=float, default=None, help="default 1.0 (quick: 0.05)")
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="wall (default) or cpu time"
    )
    args = parser.parse_args(argv)
    global CLOCK  # noqa: PLW0603 (a benchmark script: one clock for the run)
    CLOCK = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns

    serves: Sequence[int] = args.serves or (QUICK_SERVES if args.quick else FULL_SERVES)
    roles: Sequence[int] = args.roles or (QUICK_ROLES if args.quick else FULL_ROLES)
    if min(serves) < 2 or min(roles) < 1:
        parser.error("--serves must be >= 2 and --roles >= 1")
    if (args.min_reps is not None and args.min_reps < 1) or args.max_reps < 1:
        parser.error("--min-reps and --max-reps must be >= 1")
    min_reps: int = args.min_reps if args.min_reps is not None else (3 if args.quick else 5)
    budget_s: float = args.budget_s if args.budget_s is not None else (0.05 if args.quick else 1.0)
    scenarios: list[str] = args.scenario or list(SCENARIOS)
    medians = run(
        serves,
        roles,
        scenarios,
        min_reps=min_reps,
        max_reps=max(args.max_reps, min_reps),
        budget_s=budget_s,
        seed=args.seed,
    )
    if len(set(serves)) >= 2:
        print(json.dumps(growth(medians, serves, roles, scenarios)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
