"""Eviction policies on a multi-model host: the wait until a request is served, by trace.

What it measures: on a simulated clock, in-process (no Docker), the same trace of
requests replayed through ``vramctl``'s planner and through re-implementations of its
peers' rules, side by side in one run. A request waits while its model is not loaded
and awake: a cold start or a wake, and before it the room made (or the wait for a busy
model to finish). Reported per policy: mean and p95 wait (over every request of every
seed, and the mean of each seed's), cold starts and wakes.

The host (``--seed``; ``--seeds`` of them): 1-4 cards of 80 GiB, host RAM of 192 GiB a
card; 6-20 models, each drawn from four profiles whose cold start and level-1 wake are
the published figures of vLLM's sleep-mode blog (its A100 runs); the VRAM each
reserves and the host RAM its level-1 sleep takes (its weights) are this benchmark's
own, illustrative, chosen so that one card holds the largest alone and several of the
smaller ones:

=================  ========  ===========  ======  ======
profile            VRAM GiB  sleep RAM    cold s  wake s
=================  ========  ===========  ======  ======
Qwen3-0.6B         8         2            21      0.10
Phi-3-vision       16        8            46      0.8
Qwen3-30B-A3B      40        32           47      2.9
Qwen3-235B-A22B    76        64           98      5.4
=================  ========  ===========  ======  ======

The trace (2 hours by default, ``--hours``): arrivals with a mean gap of 20 s, each for a
model drawn with Zipf popularity (weight ``1/rank^1.1`` over a shuffled order); one in
six brings a burst of 2-6 more requests for the same model within 10 s; each request,
once its model is ready, keeps it busy for an exponential time (mean 20 s, at least 1 s).
A loaded model serves any number of requests at once.

The policies (each a pure function of the host's state; victims are always idle models,
a busy one is waited for):

``vramctl``
    ``statemachine.planner.plan_transitions`` with the reload costs (``Policy.reload``:
    the profile's cold start and wake, as a measured median would be; ``last_used``: the
    last request's end or arrival). A model with a request waiting or in flight is an
    on-demand requester, one without is an evictable serve that may be put to sleep or
    stopped; every model has ``[serve.sleep]`` level 1 and ``placement`` = every card;
    the ``[host]`` budget is the host RAM. Planned again at the same instant until the
    plan is empty (at most 5), and its steps applied (stop, sleep, start, wake).
``vramctl_before``
    The same, without costs (``Policy()``): the victim order before reload costs.
``vramctl_nosleep``
    The same as ``vramctl`` with no model able to sleep: the victim rule alone, against
    peers that cannot sleep either.
``ollama``
    Ollama's scheduler (``server/sched.go``): at most 3 loaded models per GPU
    (``defaultModelsPerGPU``), a model unloaded after 5 minutes idle (the default
    ``keep_alive``); a model that does not fit goes on the GPU with the most free memory
    it fits on (``pickBestFullFitByLibrary``), else a runner is unloaded
    (``findRunnerToUnload``: sorted by session duration, then by model name, the first
    idle one; none idle: the first is waited for) and the fit tried again.
``llama_swap``
    llama-swap's groups: one group per card, ``swap: true`` (one model of a group runs
    at a time), models assigned to the groups round robin in declaration order; loading
    a model stops the one its group runs (waited for while it is busy); no ``ttl``.
``largest_first``
    anvil's rule: on the card with the most free memory that can make room, idle models
    stopped largest first until the model fits.
``lemonade``
    lemonade's score: on that card, idle models stopped by ``idle_ms / (load_ms x
    weight)`` (weight 1), highest first, until the model fits.

No peer can put a model to sleep (none has a sleep API of its engines); the
``vramctl_nosleep`` row compares the victim rules alone. Every policy is checked after
each change: no card holds more than its capacity, no model is both loaded and waiting
with room for it.

Output: a table (one row per policy), then one JSON line per policy and one
``policy_summary`` line with the ratio of vramctl's mean wait to the best peer's.

Usage::

    .venv/bin/python benchmarks/bench_policy.py               # 10 seeds x 2 h (~1 min)
    .venv/bin/python benchmarks/bench_policy.py --quick       # 3 seeds x 1 h
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchkit import NOW

from statemachine.plan import Action, Policy

try:  # a tree from before reload costs (run_all.py --base): its planner runs without
    from statemachine.plan import ReloadCost
except ImportError:  # pragma: no cover - only in an older tree
    ReloadCost = None  # type: ignore[assignment,misc]
from statemachine.planner import plan_transitions
from statemachine.types import (
    ContainerObs,
    ContainerState,
    DesiredState,
    GpuRole,
    HostBudget,
    InFlightObs,
    InFlightSource,
    Observed,
    OnDemandRequest,
    Residency,
    ServeSpec,
    Sleep,
    SleepObs,
    SleepState,
    StartedWith,
)

GIB = 1024
CARD_MIB = 80 * GIB
HOST_RAM_MIB_PER_CARD = 192 * GIB
RESIDUAL_MIB = 1 * GIB
MAX_PLANS = 5
KEEP_ALIVE_S = 300.0
#: the mean gap between arrivals and the mean time a request keeps its model busy
GAP_S = 45.0
BUSY_S = 8.0
OLLAMA_PER_GPU = 3
PEERS = ("ollama", "llama_swap", "largest_first", "lemonade")
POLICIES = ("vramctl", "vramctl_before", "vramctl_nosleep", "vramctl_nosleep_before", *PEERS)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    vram_gib: int
    sleep_ram_gib: int
    cold_s: float
    wake_s: float


PROFILES = (
    Profile("Qwen3-0.6B", 8, 2, 21.0, 0.10),
    Profile("Phi-3-vision", 16, 8, 46.0, 0.8),
    Profile("Qwen3-30B-A3B", 40, 32, 47.0, 2.9),
    Profile("Qwen3-235B-A22B", 76, 64, 98.0, 5.4),
)


@dataclass(frozen=True, slots=True)
class Host:
    seed: int
    cards: tuple[str, ...]
    models: tuple[tuple[str, Profile], ...]
    #: (arrival s, model, busy s), in arrival order
    requests: tuple[tuple[float, str, float], ...]


def build(seed: int, hours: float) -> Host:
    """The host and trace of ``seed`` (the same for every policy)."""
    rng = random.Random(f"policy/{seed}")
    cards = tuple(f"gpu{i}" for i in range(rng.randint(1, 4)))
    k = rng.randint(6, 20)
    models = tuple((f"m{i:02d}", rng.choice(PROFILES)) for i in range(k))
    order = [name for name, _ in models]
    rng.shuffle(order)
    weights = [1.0 / (rank + 1) ** 1.1 for rank in range(k)]
    requests: list[tuple[float, str, float]] = []
    t = 0.0
    end = hours * 3600.0
    while True:
        t += rng.expovariate(1 / GAP_S)
        if t >= end:
            break
        model = rng.choices(order, weights)[0]
        burst = rng.randint(2, 6) if rng.random() < 1 / 6 else 0
        for at in [t, *sorted(t + rng.uniform(0, 10) for _ in range(burst))]:
            requests.append((at, model, max(1.0, rng.expovariate(1 / BUSY_S))))
    requests.sort()
    return Host(seed, cards, models, tuple(requests))


# ── the simulated host ──────────────────────────────────────────────────────────────


@dataclass(slots=True)
class Model:
    name: str
    profile: Profile
    state: str = "off"  # off | loading | ready | asleep
    card: str | None = None
    in_flight: int = 0
    #: (arrival, busy s) of the requests waiting for it to be ready
    queue: list[tuple[float, float]] = field(default_factory=list)
    last_used: float | None = None
    started_at: float | None = None

    @property
    def mib(self) -> int:
        return self.profile.vram_gib * GIB

    def held(self) -> int:
        """VRAM it holds on its card now."""
        if self.state in ("loading", "ready"):
            return self.mib
        return RESIDUAL_MIB if self.state == "asleep" else 0

    @property
    def idle(self) -> bool:
        """Loaded (or asleep), nothing in flight, nothing waiting: a victim may be it."""
        return self.state in ("ready", "asleep") and self.in_flight == 0 and not self.queue

    @property
    def waiting(self) -> bool:
        return bool(self.queue) and self.state in ("off", "asleep")


@dataclass(slots=True)
class Tally:
    waits: list[float] = field(default_factory=list)
    cold: int = 0
    wakes: int = 0
    odd: int = 0


class Sim:
    """One policy's run of one host's trace."""

    def __init__(self, host: Host, policy: Rule) -> None:
        self.host = host
        self.policy = policy
        self.models = {name: Model(name, p) for name, p in host.models}
        self.events: list[tuple[float, int, str, str, float]] = []
        self.seq = 0
        self.tally = Tally()
        self.now = 0.0

    def push(self, at: float, kind: str, name: str, busy: float = 0.0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, name, busy))

    def free(self, card: str) -> int:
        return CARD_MIB - sum(m.held() for m in self.models.values() if m.card == card)

    def run(self) -> Tally:
        for at, name, busy in self.host.requests:
            self.push(at, "arrive", name, busy)
        while self.events:
            at, _, kind, name, busy = heapq.heappop(self.events)
            self.now = at
            m = self.models[name]
            if kind == "arrive":
                if m.state == "ready":
                    self.serve(m, at, busy)
                else:
                    m.queue.append((at, busy))
            elif kind == "done":
                m.in_flight -= 1
                m.last_used = at
                if m.in_flight == 0 and not m.queue:
                    self.push(at + KEEP_ALIVE_S, "expire", name)
            elif kind == "ready" and m.state == "loading":
                m.state = "ready"
                for arrived, b in m.queue:
                    self.serve(m, arrived, b)
                m.queue.clear()
            elif kind == "expire":
                self.policy.expire(self, m)
            self.policy.decide(self)
            self.check()
        return self.tally

    def serve(self, m: Model, arrived: float, busy: float) -> None:
        self.tally.waits.append(self.now - arrived)
        m.in_flight += 1
        m.last_used = self.now
        self.push(self.now + busy, "done", m.name)

    # the actions a policy takes, each at once (a stop or a sleep takes no time here)
    def stop(self, m: Model) -> None:
        assert m.idle, f"{m.name} stopped while not idle"
        m.state, m.card, m.started_at = "off", None, None

    def sleep(self, m: Model) -> None:
        assert m.idle and m.state == "ready", f"{m.name} slept while not idle and awake"
        m.state = "asleep"

    def load(self, m: Model, card: str) -> None:
        if m.state == "asleep":
            assert m.card == card, f"{m.name} woken on {card}, asleep on {m.card}"
            self.tally.wakes += 1
            seconds = m.profile.wake_s
        else:
            self.tally.cold += 1
            seconds = m.profile.cold_s
            m.card, m.started_at = card, self.now
        m.state = "loading"
        self.push(self.now + seconds, "ready", m.name)

    def check(self) -> None:
        for card in self.host.cards:
            if self.free(card) < 0:
                self.tally.odd += 1
                print(
                    f"# ODD {self.policy.name} seed {self.host.seed}: {card} over", file=sys.stderr
                )


# ── the policies ───────────────────────────────────────────────────────────────────


class Rule:
    """How one policy turns the host's state into stops, sleeps and loads."""

    name = ""

    def __init__(self, host: Host) -> None:
        self.host = host

    def decide(self, sim: Sim) -> None:
        """Load each waiting model the policy can make room for (oldest request first)."""
        waiting = sorted((m for m in sim.models.values() if m.waiting), key=lambda m: m.queue[0])
        for m in waiting:
            self.place(sim, m)

    def place(self, sim: Sim, m: Model) -> None:
        raise NotImplementedError

    def expire(self, sim: Sim, m: Model) -> None:
        """A model idle since its last request's end, ``KEEP_ALIVE_S`` ago (no-op here)."""


def _room_by(
    sim: Sim, m: Model, order: Callable[[Model], Any], *, card_first: str = "free"
) -> None:
    """Load ``m`` on the card with the most free memory that can make room with its idle
    models, stopping them in ``order`` until it fits (anvil, lemonade)."""
    if m.state == "asleep":  # never with these policies; kept for clarity
        return
    cards = sorted(sim.host.cards, key=lambda c: (-sim.free(c), c))
    for card in cards:
        idle = [x for x in sim.models.values() if x.card == card and x.idle]
        if sim.free(card) + sum(x.held() for x in idle) < m.mib:
            continue
        for victim in sorted(idle, key=order):
            if sim.free(card) >= m.mib:
                break
            sim.stop(victim)
        sim.load(m, card)
        return


class LargestFirst(Rule):
    name = "largest_first"

    def place(self, sim: Sim, m: Model) -> None:
        _room_by(sim, m, lambda x: (-x.mib, x.name))


class Lemonade(Rule):
    name = "lemonade"

    def place(self, sim: Sim, m: Model) -> None:
        def score(x: Model) -> tuple[float, str]:
            idle_ms = (sim.now - (x.last_used if x.last_used is not None else 0.0)) * 1000
            return (-(idle_ms / (x.profile.cold_s * 1000 * 1.0)), x.name)

        _room_by(sim, m, score)


class LlamaSwap(Rule):
    name = "llama_swap"

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.group = {
            name: host.cards[i % len(host.cards)] for i, (name, _) in enumerate(host.models)
        }

    def place(self, sim: Sim, m: Model) -> None:
        card = self.group[m.name]
        others = [x for x in sim.models.values() if x.card == card and x is not m]
        if any(not x.idle for x in others):
            return  # the group's running model is busy (or loading): wait
        for x in others:
            sim.stop(x)
        sim.load(m, card)


class Ollama(Rule):
    name = "ollama"

    def place(self, sim: Sim, m: Model) -> None:
        limit = OLLAMA_PER_GPU * len(sim.host.cards)
        while True:
            loaded = [x for x in sim.models.values() if x.state in ("loading", "ready")]
            fits = [c for c in sim.host.cards if sim.free(c) >= m.mib]
            if len(loaded) < limit and fits:
                best = max(fits, key=lambda c: (sim.free(c), -sim.host.cards.index(c)))
                sim.load(m, best)
                return
            # findRunnerToUnload: by session duration (all the default), then by name;
            # the first idle one; none idle: the first is waited for (nothing now)
            runners = sorted(loaded, key=lambda x: (KEEP_ALIVE_S, x.name))
            idle = [x for x in runners if x.idle]
            if not idle:
                return
            sim.stop(idle[0])

    def expire(self, sim: Sim, m: Model) -> None:
        used = m.last_used if m.last_used is not None else 0.0
        if m.idle and sim.now - used >= KEEP_ALIVE_S:
            sim.stop(m)


class Vramctl(Rule):
    """The planner, with or without reload costs, with or without sleep."""

    def __init__(self, host: Host, *, costs: bool, sleeps: bool, name: str) -> None:
        super().__init__(host)
        self.costs, self.sleeps, self.name = costs, sleeps, name
        self.roles = {c: GpuRole(c, CARD_MIB, 0) for c in host.cards}
        self.host_ram = HostBudget(HOST_RAM_MIB_PER_CARD * len(host.cards))

    def spec(self, m: Model) -> ServeSpec:
        asked = bool(m.queue) or m.in_flight > 0 or m.state == "loading"
        sleep = Sleep(1, RESIDUAL_MIB, "vllm", m.profile.sleep_ram_gib * GIB)
        cards = tuple(self.host.cards)
        return ServeSpec(
            name=m.name,
            container=f"c-{m.name}",
            gpu_roles=cards if m.card is None else (m.card,),
            placement=cards,
            vram_mib=m.mib,
            residency=Residency.ON_DEMAND if asked else Residency.EVICTABLE,
            sleep=sleep if self.sleeps else None,
        )

    def inputs(self, sim: Sim) -> tuple[DesiredState, Observed, Policy]:
        models = sim.models.values()
        serves = {m.name: self.spec(m) for m in models}
        requests = tuple(
            OnDemandRequest(m.name, NOW + (m.queue[0][0] if m.queue else sim.now))
            for m in models
            if m.queue or m.in_flight > 0 or m.state == "loading"
        )
        holding = [m for m in models if m.state != "off"]
        observed = Observed(
            docker_ok=True,
            containers={
                f"c-{m.name}": ContainerObs(
                    ContainerState.RUNNING, started_at=NOW + (m.started_at or 0.0)
                )
                for m in holding
            },
            started_with={
                f"c-{m.name}": StartedWith(m.name, (m.card or "",), m.mib) for m in holding
            },
            sleep={
                m.name: SleepObs(SleepState.ASLEEP, 1, RESIDUAL_MIB, m.profile.sleep_ram_gib * GIB)
                for m in models
                if m.state == "asleep"
            },
            in_flight={m.name: InFlightObs(m.in_flight, InFlightSource.METRICS) for m in holding},
        )
        policy = Policy()
        if self.costs and ReloadCost is not None:
            policy = Policy(
                reload={
                    m.name: ReloadCost(m.profile.cold_s, m.profile.wake_s if self.sleeps else None)
                    for m in models
                },
                last_used={m.name: NOW + m.last_used for m in models if m.last_used is not None},
            )
        desired = DesiredState(self.roles, serves, requests, self.host_ram)
        return desired, observed, policy

    def decide(self, sim: Sim) -> None:
        for _ in range(MAX_PLANS):
            desired, observed, policy = self.inputs(sim)
            plan = plan_transitions(desired, observed, policy, NOW + sim.now)
            acted = False
            for st in plan.steps:
                m = sim.models[st.serve]
                if st.action is Action.STOP and m.state != "off":
                    sim.stop(m)
                elif st.action is Action.RELEASE_TO_RESIDUAL:
                    sim.sleep(m)
                elif st.action is Action.START:
                    sim.load(m, st.gpu_roles[0])
                elif st.action is Action.WAKE:
                    sim.load(m, m.card or st.gpu_roles[0])
                else:
                    continue
                acted = True
            if not acted:
                return


MAKERS: dict[str, Callable[[Host], Rule]] = {
    "vramctl": lambda h: Vramctl(h, costs=True, sleeps=True, name="vramctl"),
    "vramctl_before": lambda h: Vramctl(h, costs=False, sleeps=True, name="vramctl_before"),
    "vramctl_nosleep": lambda h: Vramctl(h, costs=True, sleeps=False, name="vramctl_nosleep"),
    "vramctl_nosleep_before": lambda h: Vramctl(
        h, costs=False, sleeps=False, name="vramctl_nosleep_before"
    ),
    "ollama": Ollama,
    "llama_swap": LlamaSwap,
    "largest_first": LargestFirst,
    "lemonade": Lemonade,
}


# ── the report ─────────────────────────────────────────────────────────────────────


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def summarise(name: str, tallies: list[Tally]) -> dict[str, Any]:
    waits = [w for t in tallies for w in t.waits]
    return {
        "bench": "policy",
        "policy": name,
        "requests": len(waits),
        "mean_wait_s": round(statistics.fmean(waits), 3),
        "p95_wait_s": round(p95(waits), 3),
        "mean_of_seed_means_s": round(
            statistics.fmean(statistics.fmean(t.waits) for t in tallies), 3
        ),
        "cold_starts": sum(t.cold for t in tallies),
        "wakes": sum(t.wakes for t in tallies),
        "odd": sum(t.odd for t in tallies),
    }


def table(lines: list[dict[str, Any]]) -> str:
    head = ("policy", "mean wait s", "p95 wait s", "mean of seeds s", "cold starts", "wakes")
    keys = ("policy", "mean_wait_s", "p95_wait_s", "mean_of_seed_means_s", "cold_starts", "wakes")
    rows = [head, *[tuple(str(line[k]) for k in keys) for line in lines]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--quick", action="store_true", help="3 seeds x 1 hour")
    p.add_argument("--only", choices=POLICIES, action="append")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.hours = 3, 1.0
    hosts = [build(s, args.hours) for s in range(args.seed, args.seed + args.seeds)]
    lines = []
    for name in args.only or POLICIES:
        tallies = [Sim(h, MAKERS[name](h)).run() for h in hosts]
        lines.append(summarise(name, tallies))
    print(table(lines), file=sys.stderr)
    for line in lines:
        print(json.dumps(line))
    by = {line["policy"]: line for line in lines}
    peers = [by[p] for p in PEERS if p in by]
    if "vramctl" in by and peers:
        best = min(peers, key=lambda line: line["mean_wait_s"])
        summary = {
            "bench": "policy_summary",
            "seeds": [h.seed for h in hosts],
            "hours": args.hours,
            "costs": ReloadCost is not None,
            "best_peer": best["policy"],
            "best_peer_mean_wait_s": best["mean_wait_s"],
            "vramctl_vs_best_peer": round(by["vramctl"]["mean_wait_s"] / best["mean_wait_s"], 3),
        }
        if "vramctl_before" in by:
            summary["vramctl_vs_before"] = round(
                by["vramctl"]["mean_wait_s"] / by["vramctl_before"]["mean_wait_s"], 3
            )
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
