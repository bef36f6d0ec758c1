"""Placement on a multi-GPU host: vramctl's best fit against hand pinning and Ollama's rule.

What it measures: what three ways of choosing a serve's card cost over a sequence of
on-demand requests, in-process (the planner and the simulator, no Docker), on the same
random fleets and the same requests, side by side in one run:

``vramctl``
    Every serve declares ``placement`` = every card that can hold its reservation (all
    the cards, less those the manifest would refuse as too small), and the planner
    places it (``statemachine/planning/placement.py``, docs/placement.md): held serves stay; else
    best fit (the candidate left with the least free MiB); else the candidate whose
    plan makes room at the least cost.
``pinned``
    The same serves pinned by hand, round robin: serve ``i`` on card ``i mod n``, or
    the next card in order whose budget can hold it.
``most_free``
    Ollama's rule (``server/sched.go``, ``pickBestFullFitByLibrary``: the GPUs sorted by
    free memory, descending, the first one the model fits on taken): each time a serve
    that holds nothing wants to run, it is pinned to the card that can hold it with the
    most free MiB in the ledger (``ledger_from_observed``) just before planning
    (several in one step: oldest request first, each that fits taking its MiB from the
    card it got), then planned as pinned. A serve that runs keeps the card it started on.

The fleets (``--seed``, one fleet per seed, ``--seeds`` of them): 2-8 cards, each of 24,
48 or 80 GiB (2 GiB kept back, as ``benchkit``'s card); 6-20 serves, each
``residency = "on-demand"`` with ``desired`` unset, of a footprint drawn from model
sizes (2, 3, 6, 10, 18, 20, 30, 36, 42, 70 GiB: embeddings to a 70B model in fp8, weights
and cache) that fits at least one card of the host. ``--requests`` steps (one minute
each): at every step one request arrives for a serve drawn with Zipf popularity
(weight 1/rank over a shuffled order), held for 1 to 3 x cards steps
(``OnDemandRequest`` with that TTL: when it runs out the planner stops the serve, unless
another request for it is still in force). ``--evictable SHARE`` makes that share of
the serves ``evictable`` and ``desired = "running"`` instead (backfill that on-demand
requests may stop); requests go to the on-demand serves only.

Each step, for each policy: the requests in force are handed to the planner, the plan
applied as if every step succeeded (``statemachine.planning.simulate.apply_plan``), and planned
again until the plan is empty (at most 5 plans a step, as the loop's next ticks would),
then counted:

``starts``      START steps (cold starts);
``evictions``   STOP steps of running serves made to make room for another (``group``
                names another serve);
``ends``        STOP steps of serves whose request ended (the TTL ran out);
``refusals``    requests whose serve does not run at the end of the step they arrived in;
``with_room``   of those, the refusals while a card that can hold the serve had room for
                it at the end of the step (a pinned serve waits for its own card);
``waits``       serve-steps: a serve with a request in force that does not run.

And checked, each a line on stderr with a reproducer when it fails: no card is committed
beyond its budget (the starts recorded, summed per card; and the ledger's own
``overcommitted``), the plans of a step converge (an empty plan within 5), a placed
serve runs on one of its candidates, an on-demand serve whose requests all ended no
longer runs (``stale``).

Output: a table per policy (sum over seeds, median per seed) and the ratios
vramctl / peer of the sums, the seeds on which vramctl refused (evicted) fewer, as many
or more than each peer, then one JSON line per policy and one with the ratios and those
seed counts (``--json``: the JSON lines only, a line per seed and policy as well).

Not measured: time (see bench_planner.py), elastic shrink, sleep, exclusive serves,
tensor-parallel serves, a start or stop that fails; Ollama's eviction order and its
splitting of a model over several GPUs (here all three policies evict by the planner's
rules, so only the choice of the card differs).

Usage::

    .venv/bin/python benchmarks/bench_placement.py                   # 20 seeds x 200 requests
    .venv/bin/python benchmarks/bench_placement.py --quick           # 5 seeds x 60 requests
    .venv/bin/python benchmarks/bench_placement.py --evictable 0.3   # with evictable backfill
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from benchkit import NOW, RESERVE_MIB, markdown_table

from statemachine.domain.types import (
    DesiredRun,
    DesiredState,
    GpuRole,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
)
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning import placement
from statemachine.planning.plan_types import Action, Plan, Policy
from statemachine.planning.planner import plan_transitions
from statemachine.planning.simulate import apply_plan

GIB = 1024
CARD_GIB = (24, 48, 80)
FOOTPRINT_GIB = (2, 3, 6, 10, 18, 20, 30, 36, 42, 70)
STEP_S = 60.0
MAX_PLANS = 5
POLICIES = ("vramctl", "pinned", "most_free")
COUNTS = ("starts", "evictions", "ends", "refusals", "with_room", "waits")
CHECKS = ("overcommitted", "not_converged", "off_candidates", "stale")


@dataclass(frozen=True, slots=True)
class Fleet:
    """One host: its cards, its serves (as declared, unplaced), and the requests."""

    seed: int
    roles: dict[str, GpuRole]
    serves: tuple[ServeSpec, ...]
    #: (step it arrives at, serve, steps it is held)
    requests: tuple[tuple[int, str, int], ...]


@dataclass(slots=True)
class Tally:
    """What one policy did on one fleet."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    checks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    plans: int = 0


def build(seed: int, n_requests: int, hold: int, evictable: float) -> Fleet:
    """The fleet and requests of ``seed`` (the same for every policy)."""
    rng = random.Random(f"placement/{seed}")
    n = rng.randint(2, 8)
    roles = {
        f"gpu{i}": GpuRole(f"gpu{i}", rng.choice(CARD_GIB) * GIB, RESERVE_MIB) for i in range(n)
    }
    largest = max(r.budget_mib for r in roles.values())
    sizes = [g * GIB for g in FOOTPRINT_GIB if g * GIB <= largest]
    k = rng.randint(6, 20)
    n_evictable = min(k - 1, round(evictable * k))
    serves = []
    for i in range(k):
        backfill = i >= k - n_evictable
        serves.append(
            ServeSpec(
                name=f"s{i:02d}",
                container=f"c-s{i:02d}",
                vram_mib=rng.choice(sizes),
                residency=Residency.EVICTABLE if backfill else Residency.ON_DEMAND,
                desired=DesiredRun.RUNNING if backfill else None,
            )
        )
    asked = [s.name for s in serves if s.residency is Residency.ON_DEMAND]
    rng.shuffle(asked)
    weights = [1.0 / (rank + 1) for rank in range(len(asked))]
    requests = tuple(
        (t, rng.choices(asked, weights)[0], rng.randint(1, hold * n)) for t in range(n_requests)
    )
    return Fleet(seed, roles, tuple(serves), requests)


def holds(s: ServeSpec, roles: dict[str, GpuRole]) -> tuple[str, ...]:
    """The cards whose budget can hold ``s`` (declared order)."""
    return tuple(r for r, g in roles.items() if g.budget_mib >= (s.vram_mib or 0))


def round_robin(fleet: Fleet) -> dict[str, str]:
    """Serve i on card i mod n, or the next card in order that can hold it."""
    ids = list(fleet.roles)
    out: dict[str, str] = {}
    for i, s in enumerate(fleet.serves):
        fits = holds(s, fleet.roles)
        out[s.name] = next(
            ids[(i + j) % len(ids)] for j in range(len(ids)) if ids[(i + j) % len(ids)] in fits
        )
    return out


def running(s: ServeSpec, observed: Observed) -> bool:
    return observed.container(s.container).holds


def started_on(s: ServeSpec, observed: Observed) -> tuple[str, ...] | None:
    record = observed.started_with.get(s.container)
    return None if record is None else record.gpu_roles


class Chooser:
    """How a policy turns the fleet and the requests in force into a desired state."""

    name = ""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def desired(
        self, requests: tuple[OnDemandRequest, ...], observed: Observed, now: float
    ) -> DesiredState:
        raise NotImplementedError

    def executed(self, desired: DesiredState, plan: Plan) -> DesiredState:
        """The desired state the plan's execution sees (its starts' records)."""
        return desired


class Placed(Chooser):
    name = "vramctl"

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        self.serves: dict[str, ServeSpec] = {}
        for s in fleet.serves:
            cands = holds(s, fleet.roles)
            self.serves[s.name] = replace(s, gpu_roles=cands, placement=cands)

    def desired(
        self, requests: tuple[OnDemandRequest, ...], observed: Observed, now: float
    ) -> DesiredState:
        return DesiredState(self.fleet.roles, self.serves, requests)

    def executed(self, desired: DesiredState, plan: Plan) -> DesiredState:
        return placement.apply(desired, plan.placements)


class Pinned(Chooser):
    name = "pinned"

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        on = round_robin(fleet)
        self.serves = {s.name: replace(s, gpu_roles=(on[s.name],)) for s in fleet.serves}

    def desired(
        self, requests: tuple[OnDemandRequest, ...], observed: Observed, now: float
    ) -> DesiredState:
        return DesiredState(self.fleet.roles, self.serves, requests)


class MostFree(Chooser):
    name = "most_free"

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        first = next(iter(fleet.roles))
        self.pin = {s.name: holds(s, fleet.roles)[0] if s.vram_mib else first for s in fleet.serves}

    def _state(self, requests: tuple[OnDemandRequest, ...]) -> DesiredState:
        serves = {s.name: replace(s, gpu_roles=(self.pin[s.name],)) for s in self.fleet.serves}
        return DesiredState(self.fleet.roles, serves, requests)

    def desired(
        self, requests: tuple[OnDemandRequest, ...], observed: Observed, now: float
    ) -> DesiredState:
        for s in self.fleet.serves:  # a serve that runs keeps the card it started on
            on = started_on(s, observed)
            if running(s, observed) and on is not None:
                self.pin[s.name] = on[0]
        current = self._state(requests)
        ledger = ledger_from_observed(current, observed)
        free: dict[str, int] = {}
        for r in self.fleet.roles:
            view = ledger.view(r)
            assert view.committed_mib is not None
            free[r] = view.budget_mib - view.committed_mib
        asked: dict[str, float] = {}
        for req in sorted(requests, key=lambda q: q.requested_at):
            if not req.expired(now):
                asked.setdefault(req.serve, req.requested_at)
        wanting = [s for s in self.fleet.serves if s.desired is DesiredRun.RUNNING]
        wanting += sorted(
            (s for s in self.fleet.serves if s.name in asked), key=lambda s: asked[s.name]
        )
        for s in wanting:
            if running(s, observed):
                continue
            fits = holds(s, self.fleet.roles)
            best = max(fits, key=lambda r: (free[r], -list(self.fleet.roles).index(r)))
            self.pin[s.name] = best
            if free[best] >= (s.vram_mib or 0):  # one that cannot start there takes nothing
                free[best] -= s.vram_mib or 0
        return self._state(requests)


MAKERS: dict[str, Callable[[Fleet], Chooser]] = {
    "vramctl": Placed,
    "pinned": Pinned,
    "most_free": MostFree,
}


def committed_per_card(desired: DesiredState, observed: Observed) -> dict[str, int]:
    """MiB held per card, from the starts recorded (the truth the simulator keeps)."""
    out = dict.fromkeys(desired.roles, 0)
    for s in desired.serves.values():
        if running(s, observed):
            record = observed.started_with.get(s.container)
            assert record is not None, f"{s.name} runs without a start record"
            for r in record.gpu_roles:
                out[r] += record.mib
    return out


def odd(fleet: Fleet, policy: str, step: int, what: str) -> None:
    """One failed check on stderr, with its reproducer."""
    print(
        f"# ODD {what}: policy {policy}, seed {fleet.seed}, step {step}; reproduce:"
        f" bench_placement.py --seed {fleet.seed} --seeds 1 --requests {step + 1}"
        f" --only {policy} --verbose",
        file=sys.stderr,
        flush=True,
    )


def simulate(fleet: Fleet, name: str, verbose: bool = False) -> Tally:
    """Run the requests of ``fleet`` under policy ``name``."""
    pol = MAKERS[name](fleet)
    tally = Tally()
    c = tally.counts
    observed = Observed(docker_ok=True)
    by_name = {s.name: s for s in fleet.serves}
    for step, serve, _held in fleet.requests:
        now = NOW + step * STEP_S
        # in force, and those whose TTL ran out this step (the planner stops their serve)
        requests = tuple(
            OnDemandRequest(n, NOW + t * STEP_S, ttl_s=d * STEP_S)
            for t, n, d in fleet.requests
            if t <= step <= t + d
        )
        for _ in range(MAX_PLANS):
            desired = pol.desired(requests, observed, now)
            plan = plan_transitions(desired, observed, Policy(), now)
            tally.plans += 1
            if not plan.steps:
                break
            for st in plan.steps:
                if st.action is Action.START:
                    c["starts"] += 1
                elif st.action is Action.STOP and running(desired.serves[st.serve], observed):
                    c["evictions" if st.group and st.group != st.serve else "ends"] += 1
            if verbose:
                print(
                    f"# step {step} {name}: "
                    + ", ".join(f"{st.action} {st.serve} {'/'.join(st.gpu_roles)}"
                                for st in plan.steps if st.action in (Action.START, Action.STOP))
                    + "".join(f"; blocked {b.serve}" for b in plan.blocked),
                    file=sys.stderr,
                )  # fmt: skip
            observed = apply_plan(pol.executed(desired, plan), observed, plan, now)
        else:
            tally.checks["not_converged"] += 1
            odd(fleet, name, step, "a step's plans do not converge")
        per_card = committed_per_card(desired, observed)
        over = [r for r, mib in per_card.items() if mib > fleet.roles[r].budget_mib]
        over += list(ledger_from_observed(desired, observed).overcommitted())
        if over:
            tally.checks["overcommitted"] += 1
            odd(fleet, name, step, f"card(s) {sorted(set(over))} overcommitted")
        for s in fleet.serves:
            on = started_on(s, observed)
            if running(s, observed) and on is not None and on[0] not in holds(s, fleet.roles):
                tally.checks["off_candidates"] += 1
                odd(fleet, name, step, f"{s.name} runs on {on[0]}, not a candidate")
        if not running(by_name[serve], observed):
            c["refusals"] += 1
            need = by_name[serve].vram_mib or 0
            free = [
                fleet.roles[r].budget_mib - per_card[r] for r in holds(by_name[serve], fleet.roles)
            ]
            c["with_room"] += max(free) >= need
        in_force = {q.serve for q in requests if not q.expired(now)}
        for s in fleet.serves:
            if s.desired is None and s.name not in in_force and running(s, observed):
                tally.checks["stale"] += 1
                odd(fleet, name, step, f"{s.name} runs with no request in force")
        c["waits"] += sum(not running(by_name[n], observed) for n in in_force)
    return tally


def ratio(a: float, b: float) -> float | None:
    return None if b == 0 else round(a / b, 3)


def summarise(tallies: dict[str, list[Tally]]) -> list[dict[str, Any]]:
    """One line per policy (sums, medians per seed, checks), and the ratios."""
    lines: list[dict[str, Any]] = []
    for name, ts in tallies.items():
        line: dict[str, Any] = {"bench": "placement", "policy": name, "seeds": len(ts)}
        for key in COUNTS:
            values = [t.counts[key] for t in ts]
            line[key] = sum(values)
            line[f"{key}_median"] = statistics.median(values)
        for key in CHECKS:
            line[key] = sum(t.checks[key] for t in ts)
        line["plans"] = sum(t.plans for t in ts)
        lines.append(line)
    ours = lines[0] if lines and lines[0]["policy"] == "vramctl" else None
    if ours is not None:
        out: dict[str, Any] = {"bench": "placement_ratio"}
        for peer in lines[1:]:
            for key in COUNTS:
                out[f"{key}_vs_{peer['policy']}"] = ratio(ours[key], peer[key])
            for key in ("refusals", "evictions"):  # per seed: vramctl fewer / same / more
                pairs = list(zip(tallies["vramctl"], tallies[peer["policy"]], strict=True))
                out[f"{key}_seeds_vs_{peer['policy']}"] = [
                    sum(a.counts[key] < b.counts[key] for a, b in pairs),
                    sum(a.counts[key] == b.counts[key] for a, b in pairs),
                    sum(a.counts[key] > b.counts[key] for a, b in pairs),
                ]
        lines.append(out)
    return lines


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and v != int(v):
        return f"{v:.3g}"
    return str(int(v)) if isinstance(v, float) else str(v)


def table(lines: list[dict[str, Any]]) -> str:
    policies = [x for x in lines if x["bench"] == "placement"]
    ratios = next((x for x in lines if x["bench"] == "placement_ratio"), {})
    head = ["policy", *(f"{k} (median)" for k in COUNTS), *CHECKS]
    rows = [
        [
            p["policy"],
            *(f"{p[k]} ({_fmt(p[f'{k}_median'])})" for k in COUNTS),
            *(str(p[k]) for k in CHECKS),
        ]
        for p in policies
    ]
    for peer in policies[1:]:
        rows.append(
            [
                f"vramctl / {peer['policy']}",
                *(_fmt(ratios.get(f"{k}_vs_{peer['policy']}")) for k in COUNTS),
                *([""] * len(CHECKS)),
            ]
        )
    return markdown_table(head, rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seeds", type=int, default=None, help="fleets (default 20; quick 5)")
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per fleet (default 200; quick 60)"
    )
    parser.add_argument(
        "--hold", type=int, default=3, help="a request is held 1 to HOLD x cards steps (3)"
    )
    parser.add_argument(
        "--evictable", type=float, default=0.0, help="share of serves evictable, desired running"
    )
    parser.add_argument("--quick", action="store_true", help="5 seeds x 60 requests (smoke)")
    parser.add_argument("--only", action="append", choices=POLICIES, help="one policy (repeat)")
    parser.add_argument("--json", action="store_true", help="JSON lines only, one per seed too")
    parser.add_argument("--verbose", action="store_true", help="every step's starts and stops")
    args = parser.parse_args(argv)
    seeds = args.seeds or (5 if args.quick else 20)
    n_requests = args.requests or (60 if args.quick else 200)
    wanted = [p for p in POLICIES if not args.only or p in args.only]
    started = time.monotonic()
    tallies: dict[str, list[Tally]] = {p: [] for p in wanted}
    cards_seen: list[int] = []
    for seed in range(args.seed, args.seed + seeds):
        fleet = build(seed, n_requests, args.hold, args.evictable)
        cards_seen.append(len(fleet.roles))
        for name in wanted:
            t = simulate(fleet, name, args.verbose)
            tallies[name].append(t)
            if args.json:
                print(json.dumps({"bench": "placement_seed", "seed": seed, "policy": name,
                                  "cards": len(fleet.roles), "serves": len(fleet.serves),
                                  **t.counts, **t.checks}), flush=True)  # fmt: skip
    lines = summarise(tallies)
    for line in lines:
        line.update(requests=n_requests, first_seed=args.seed, evictable=args.evictable)
    if not args.json:
        print(
            f"# {seeds} fleets (seeds {args.seed}-{args.seed + seeds - 1}, "
            f"{min(cards_seen)}-{max(cards_seen)} cards) x {n_requests} requests, "
            f"evictable share {args.evictable:g}: sums (median per seed); "
            f"{time.monotonic() - started:.0f}s"
        )
        print(table(lines))
        for peer in wanted[1:] if wanted[0] == "vramctl" else ():
            seeds_vs = {k: lines[-1][f"{k}_seeds_vs_{peer}"] for k in ("refusals", "evictions")}
            print(
                f"# per seed, vramctl against {peer} (fewer/same/more): "
                + "; ".join(f"{k} {'/'.join(map(str, v))}" for k, v in seeds_vs.items())
            )
    for line in lines:
        print(json.dumps(line), flush=True)
    failed = sum(x.get(k, 0) for x in lines for k in CHECKS)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
