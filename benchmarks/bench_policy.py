"""Eviction policies on a multi-model host: the wait until a request is served, by trace.

What it measures: on a simulated clock, in-process (no Docker), the same traces of
requests replayed through ``vramctl``'s planner and through the rules of its peers, each
written from the peer's source (file and commit in each class's docstring), side by
side in one run. A request waits while its model is not loaded and awake, and while the
policy holds it back: a cold start or a wake, the room made or waited for, a load
queued behind another. Reported per trace family and policy: mean and p95 wait (over
every request of every seed), cold starts, wakes, whether the schedule was feasible
(no card over its memory, the host never over its RAM: an infeasible one is reported,
not ranked), and per seed whether vramctl's mean wait beat the best peer's.

The models: four profiles whose cold start and level-1 wake are the published figures
of vLLM's sleep-mode blog (its A100 runs); the VRAM each reserves and the host RAM its
level-1 sleep takes (its weights) are this benchmark's own, chosen so that a card of
80 GiB holds the largest alone and several of the smaller ones; a sleeper keeps 1 GiB
on its card. Host RAM is 192 GiB a card.

=================  ========  ===========  ======  ======
profile            VRAM GiB  sleep RAM    cold s  wake s
=================  ========  ===========  ======  ======
Qwen3-0.6B         8         2            21      0.10
Phi-3-vision       16        8            46      0.8
Qwen3-30B-A3B      40        32           47      2.9
Qwen3-235B-A22B    76        64           98      5.4
=================  ========  ===========  ======  ======

Every model is a vLLM engine, which sizes itself from the free memory it measures as it
starts: two cold starts on one card at once take each other's room, so they happen one
at a time per card. vramctl's planner serialises them itself; a peer that overlaps them
gets, in its favour, what a retry would give (each start begins when the card's last
one ends) rather than the failure.

The traces (:data:`FAMILIES`; ``--hours``, 2 by default, per seed): 1-4 cards and 6-20
models drawn from the profiles, arrivals with a mean gap of 45 s, each for a model drawn
with Zipf popularity (weight ``1/rank^1.1`` over a shuffled order); one in six brings a
burst of 2-6 more requests for the same model within 10 s; each request, once its model
is ready, keeps it busy for an exponential time (mean 8 s, at least 1 s). The families
vary one thing each: 20 s gaps and 20 s busy, uniform popularity, long busy times (120 s
and 300 s), one card, four cards, every model fitting at once, 3-5 models, busy (10 s
gaps) and quiet (180 s) hosts, small models only, large models only. The hour before
each trace is drawn the same way and replayed through every policy as its warm-up, from
an empty host: what is measured is a host that has been serving for an hour (its waits,
cold starts and wakes are not counted; its feasibility is checked), not the first loads
of an empty one. It is also what a controller that ran through it counts of the uses
(vramctl's ``Policy.uses``) and what an operator knows of the traffic (llama-swap's
sleepers).

The policies (victims are idle models unless a rule says it drains busy ones):

``vramctl``
    ``statemachine.planning.planner.plan_transitions`` as ``vramctl run`` calls it: the reload
    costs (``Policy.reload``: the profile's cold start and wake, as a measured median
    would be), when each model was last used, and how often (``Policy.uses``: every
    arrival so far, the warm-up's among them); a model with a request waiting or loading, or
    in flight, is an on-demand requester, one without is an evictable serve that may be
    put to sleep or stopped; every model has ``[serve.sleep]`` level 1, ``placement`` =
    every card, and is a vLLM engine (``sizes_from_free``); the ``[host]`` budget is the
    host RAM; its start or wake in progress is observed as one. Planned again at the
    same instant until the plan does nothing (at most 5), at every event, and every 5 s
    while a request waits (the loop's resync); its steps applied (stop, sleep, start,
    wake).
``vramctl_no_reuse``, ``vramctl_no_costs``, ``vramctl_no_sleep``, ``vramctl_pinned``
    The ablations: without ``Policy.uses`` (the rules of docs/eviction.md "Reload costs
    by use" off), without any cost, with no model able to sleep, and with each model
    pinned to one card (:func:`balanced_cards`) instead of placed.

The peers (:class:`Ollama`, :class:`LlamaSwapGroups`, :class:`LlamaSwapMatrix` with and
without sleep, :class:`Anvil`, :class:`Lemonade`, :class:`LemonadeAutoEvict`): each
class says what it follows and where a reading was taken in the peer's favour.
llama-swap with sleep (``llama_swap_sleep:WAY``) runs three ways of choosing which
models sleep (:func:`sleep_subsets`); the best of the three is ranked.

Output: a table per family on stderr; one JSON line per family and policy, one
``policy_family`` line per family (the best peer, vramctl's ratio to it, the ablations'
ratios, seeds won and lost), and one ``policy_summary`` line.

Usage::

    .venv/bin/python benchmarks/bench_policy.py            # 13 families x 30 seeds x 2 h
    .venv/bin/python benchmarks/bench_policy.py --quick    # 4 families x 5 seeds x 1 h
    .venv/bin/python benchmarks/bench_policy.py --family one_card --seeds 10
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from benchkit import NOW

from statemachine.planning.plan_types import Action, Policy

try:  # a tree from before reload costs (run_all.py --base): its planner runs without
    from statemachine.planning.plan_types import RestoreCost
except ImportError:  # pragma: no cover - only in an older tree
    RestoreCost = None  # type: ignore[assignment,misc]
from statemachine.domain.types import (
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
    StartingObs,
)
from statemachine.planning.planner import plan_transitions

SLEEP_WAYS = ("saved_per_ram", "most_requested", "slowest_start")
PEERS = (
    "ollama",
    "llama_swap_groups",
    "llama_swap_matrix",
    "anvil",
    "lemonade",
    "lemonade_auto_evict",
)
GIB = 1024
CARD_MIB = 80 * GIB
HOST_RAM_MIB_PER_CARD = 192 * GIB
RESIDUAL_MIB = 1 * GIB
MAX_PLANS = 5
#: the uses a controller remembers per serve (statemachine/planning/reuse.py)
MAX_USES = 64
#: the hour before the trace: every policy's warm-up, uncounted (its uses are counted)
HISTORY_S = 3600.0
KEEP_ALIVE_S = 300.0


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
class Family:
    """A kind of host and trace: what is drawn per seed (the module's docstring)."""

    name: str
    title: str
    cards: tuple[int, int] = (1, 4)
    models: tuple[int, int] = (6, 20)
    profiles: tuple[int, ...] = (0, 1, 2, 3)
    #: Zipf exponent of the popularity (0: uniform)
    zipf: float = 1.1
    gap_s: float = 45.0
    busy_s: float = 8.0
    #: every model fits at once (as many cards as first-fit needs, at most 4)
    fit_all: bool = False


FAMILIES = (
    Family("default", "the default trace"),
    Family("documented", "20 s gaps, 20 s busy", gap_s=20.0, busy_s=20.0),
    Family("uniform", "uniform popularity", zipf=0.0),
    Family("busy120", "long busy times, mean 120 s", busy_s=120.0),
    Family("busy300", "long busy times, mean 300 s", busy_s=300.0),
    Family("one_card", "a single card", cards=(1, 1)),
    Family("four_cards", "four cards", cards=(4, 4)),
    Family("all_fit", "every model fits at once", fit_all=True),
    Family("few_models", "3-5 models", models=(3, 5)),
    Family("busy_host", "a busy host: 10 s gaps", gap_s=10.0),
    Family("quiet_host", "a quiet host: 180 s gaps", gap_s=180.0),
    Family("small_only", "small models only (0.6B, Phi-3)", profiles=(0, 1)),
    Family("large_only", "large models only (30B, 235B)", profiles=(2, 3)),
)
BY_FAMILY = {f.name: f for f in FAMILIES}
QUICK = ("default", "one_card", "busy120", "small_only")


@dataclass(frozen=True, slots=True)
class Host:
    family: str
    seed: int
    cards: tuple[str, ...]
    models: tuple[tuple[str, Profile], ...]
    #: (arrival s, model, busy s), in arrival order
    requests: tuple[tuple[float, str, float], ...]
    #: the hour before: (arrival s < 0, model, busy s), drawn the same way; replayed
    #: through every policy as its warm-up, its waits, cold starts and wakes not counted
    history: tuple[tuple[float, str, float], ...] = ()

    @property
    def host_ram_mib(self) -> int:
        return HOST_RAM_MIB_PER_CARD * len(self.cards)


def _fits_all(sizes: Sequence[int], cards: int) -> bool:
    """First-fit decreasing puts every size on ``cards`` cards of :data:`CARD_MIB`."""
    free = [CARD_MIB] * cards
    for mib in sorted(sizes, reverse=True):
        card = next((i for i, f in enumerate(free) if f >= mib), None)
        if card is None:
            return False
        free[card] -= mib
    return True


def _draw_models(fam: Family, rng: random.Random) -> tuple[int, list[Profile]]:
    """How many cards, and the models' profiles."""
    choices = [PROFILES[i] for i in fam.profiles]
    if not fam.fit_all:
        cards = rng.randint(*fam.cards)
        return cards, [rng.choice(choices) for _ in range(rng.randint(*fam.models))]
    cards = rng.randint(*fam.cards)
    drawn: list[Profile] = []
    while len(drawn) < fam.models[1]:
        p = rng.choice(choices)
        if not _fits_all([x.vram_gib * GIB for x in [*drawn, p]], cards):
            break
        drawn.append(p)
    return cards, drawn


def build(family: str, seed: int, hours: float) -> Host:
    """The host and trace of ``family`` and ``seed`` (the same for every policy)."""
    fam = BY_FAMILY[family]
    rng = random.Random(f"policy/{seed}" if family == "default" else f"policy/{family}/{seed}")
    n_cards, profiles = _draw_models(fam, rng)
    cards = tuple(f"gpu{i}" for i in range(n_cards))
    models = tuple((f"m{i:02d}", p) for i, p in enumerate(profiles))
    k = len(models)
    order = [name for name, _ in models]
    rng.shuffle(order)
    weights = [1.0 / (rank + 1) ** fam.zipf for rank in range(k)]
    requests: list[tuple[float, str, float]] = []
    t = -HISTORY_S
    end = hours * 3600.0
    while True:
        t += rng.expovariate(1 / fam.gap_s)
        if t >= end:
            break
        model = rng.choices(order, weights)[0]
        burst = rng.randint(2, 6) if rng.random() < 1 / 6 else 0
        for at in [t, *sorted(t + rng.uniform(0, 10) for _ in range(burst))]:
            requests.append((at, model, max(1.0, rng.expovariate(1 / fam.busy_s))))
    requests.sort()
    history = tuple(r for r in requests if r[0] < 0)
    measured = tuple(r for r in requests if r[0] >= 0)
    return Host(family, seed, cards, models, measured, history)


# ── the simulated host ──────────────────────────────────────────────────────────────


@dataclass(slots=True)
class Model:
    name: str
    profile: Profile
    #: off | loading | ready | asleep | draining (ready, taking no new request, stopped
    #: once its requests in flight end)
    state: str = "off"
    card: str | None = None
    in_flight: int = 0
    #: (arrival, busy s) of the requests not yet served
    queue: list[tuple[float, float]] = field(default_factory=list)
    last_used: float | None = None
    started_at: float | None = None
    #: when its last load began (lemonade's access time counts it)
    loaded_at: float | None = None
    #: when requests for it arrived (what a controller sees as its uses)
    uses: list[float] = field(default_factory=list)

    @property
    def mib(self) -> int:
        return self.profile.vram_gib * GIB

    @property
    def ram_mib(self) -> int:
        return self.profile.sleep_ram_gib * GIB

    def held(self) -> int:
        """VRAM it holds on its card now."""
        if self.state in ("loading", "ready", "draining"):
            return self.mib
        return RESIDUAL_MIB if self.state == "asleep" else 0

    @property
    def idle(self) -> bool:
        """Loaded (or asleep), nothing in flight, nothing waiting: a victim may be it."""
        return self.state in ("ready", "asleep") and self.in_flight == 0 and not self.queue

    @property
    def waiting(self) -> bool:
        """A request waits for it to be loaded (or woken)."""
        return bool(self.queue) and self.state in ("off", "asleep")


@dataclass(slots=True)
class Tally:
    waits: list[float] = field(default_factory=list)
    cold: int = 0
    wakes: int = 0
    #: checks that found a card over its memory or the host over its RAM
    odd: int = 0
    peak_ram_mib: int = 0


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
        self.ticking = False
        #: card -> when the last cold start on it ends
        self.cold_until: dict[str, float] = {}
        #: the warm-up (the hour before) is over: waits, cold starts and wakes count
        self.counting = False

    def push(self, at: float, kind: str, name: str, busy: float = 0.0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, name, busy))

    def free(self, card: str) -> int:
        return CARD_MIB - sum(m.held() for m in self.models.values() if m.card == card)

    def ram_used(self) -> int:
        return sum(m.ram_mib for m in self.models.values() if m.state == "asleep")

    @property
    def loading(self) -> bool:
        return any(m.state == "loading" for m in self.models.values())

    def run(self) -> Tally:
        for at, name, busy in (*self.host.history, *self.host.requests):
            self.push(at, "arrive", name, busy)
        while self.events:
            at, _, kind, name, busy = heapq.heappop(self.events)
            self.now = at
            self.counting = at >= 0.0
            m = self.models[name]
            if kind == "arrive":
                m.queue.append((at, busy))
                m.uses.append(at)
            elif kind == "done":
                m.in_flight -= 1
                m.last_used = at
                if m.in_flight == 0 and m.state == "draining":
                    m.state, m.card, m.started_at = "off", None, None
                elif m.in_flight == 0 and not m.queue and self.policy.ttl_s is not None:
                    self.push(at + self.policy.ttl_s, "expire", name)
            elif kind == "ready" and m.state == "loading":
                m.state = "ready"
            elif kind == "expire":
                self.policy.expire(self, m)
            elif kind == "tick":
                self.ticking = False
            self.dispatch()
            self.policy.decide(self)
            self.dispatch()
            self.check()
            tick = self.policy.tick_s
            if (
                tick is not None
                and not self.ticking
                and any(x.waiting for x in self.models.values())
            ):
                self.ticking = True  # the controller's resync: it plans again while one waits
                self.push(at + tick, "tick", name)
        return self.tally

    def dispatch(self) -> None:
        """Serve each ready model's waiting requests, oldest first, as its policy lets."""
        if self.policy.admission_paused(self):
            return
        for m in self.models.values():
            while m.state == "ready" and m.queue and m.in_flight < self.policy.parallel:
                arrived, busy = m.queue.pop(0)
                if arrived >= 0.0:
                    self.tally.waits.append(self.now - arrived)
                m.in_flight += 1
                m.last_used = self.now
                self.push(self.now + busy, "done", m.name)

    # the actions a policy takes; a stop or a sleep takes no time here
    def stop(self, m: Model) -> None:
        """Stop ``m``, idle (a sleeper whose requests wait may be stopped: they wait on)."""
        assert m.idle or (m.state == "asleep" and not m.in_flight), f"{m.name} stopped busy"
        m.state, m.card, m.started_at = "off", None, None

    def drain(self, m: Model) -> None:
        """Stop ``m`` once its requests in flight end; it takes no new one meanwhile."""
        assert m.state == "ready", f"{m.name} drained while {m.state}"
        if m.in_flight == 0:
            m.state, m.card, m.started_at = "off", None, None
        else:
            m.state = "draining"

    def sleep(self, m: Model) -> None:
        assert m.idle and m.state == "ready", f"{m.name} slept while not idle and awake"
        m.state = "asleep"

    def load(self, m: Model, card: str) -> None:
        if m.state == "asleep":
            assert m.card == card, f"{m.name} woken on {card}, asleep on {m.card}"
            self.tally.wakes += self.counting
            seconds = m.profile.wake_s
        else:
            assert m.state == "off", f"{m.name} loaded while {m.state}"
            self.tally.cold += self.counting
            # vLLM sizes itself from the free memory it measures as it starts: two starts
            # on one card at once take each other's room (its memory profiling fails or
            # undersizes), so a policy that overlaps them gets what a retry would give,
            # in its favour: each start begins once the card's last one has ended
            begins = max(self.now, self.cold_until.get(card, -math.inf))
            seconds = begins - self.now + m.profile.cold_s
            self.cold_until[card] = self.now + seconds
            m.card, m.started_at = card, self.now
        m.state, m.loaded_at = "loading", self.now
        self.push(self.now + seconds, "ready", m.name)

    def check(self) -> None:
        ram = self.ram_used()
        self.tally.peak_ram_mib = max(self.tally.peak_ram_mib, ram)
        over = [c for c in self.host.cards if self.free(c) < 0]
        if ram > self.host.host_ram_mib:
            over.append("host RAM")
        if over:
            self.tally.odd += 1
            print(
                f"# ODD {self.policy.name} {self.host.family} seed {self.host.seed}: "
                f"{', '.join(over)} over at {self.now:.1f}s",
                file=sys.stderr,
            )


# ── the policies ───────────────────────────────────────────────────────────────────


class Rule:
    """How one policy turns the host's state into stops, sleeps and loads."""

    name = ""
    #: requests a loaded model serves at once (the rest wait in its queue)
    parallel: float = math.inf
    #: seconds idle after which :meth:`expire` is called (None: never)
    ttl_s: float | None = None
    #: while a request waits, the policy decides again this often even if nothing
    #: happens (None: only when something happens)
    tick_s: float | None = None

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
        """A model idle for :attr:`ttl_s` since its last request ended (no-op here)."""

    def admission_paused(self, sim: Sim) -> bool:
        """No request may start now, even on a loaded model."""
        return False


def balanced_cards(host: Host) -> dict[str, str]:
    """Each model's card as an operator would pin it: the largest first, each to the card
    with the least VRAM pinned so far (the first such card)."""
    pinned = dict.fromkeys(host.cards, 0)
    out: dict[str, str] = {}
    for name, p in sorted(host.models, key=lambda x: (-x[1].vram_gib, x[0])):
        card = min(host.cards, key=lambda c: (pinned[c], host.cards.index(c)))
        out[name] = card
        pinned[card] += p.vram_gib * GIB
    return out


class Anvil(Rule):
    """anvil's ``serves up`` (ADR-0017, 2026-07-13, items 6 and 8: "evict evictable
    reservations until the requested reservation fits"; eviction "drains through
    AdmissionLease before serves down releases the reservation"). Each serve is pinned
    to its ``gpu_role`` (:func:`balanced_cards`); victims on that card largest first,
    busy or not (a busy one drained: it takes no new request, and is stopped once its
    requests end). The order is the one this benchmark was given for anvil; its source
    is not public."""

    name = "anvil"

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.card = balanced_cards(host)

    def place(self, sim: Sim, m: Model) -> None:
        card = self.card[m.name]
        on = [x for x in sim.models.values() if x.card == card and x is not m]
        if any(x.state == "draining" for x in on):
            return  # room is being made: the start waits for it
        if sim.free(card) < m.mib:
            victims = sorted((x for x in on if x.state == "ready"), key=lambda x: (-x.mib, x.name))
            if sim.free(card) + sum(x.mib for x in victims) < m.mib:
                return  # a load in progress holds the rest: wait for it
            freed = sim.free(card)
            for v in victims:
                if freed >= m.mib:
                    break
                freed += v.mib
                sim.drain(v)
            if sim.free(card) < m.mib:
                return  # draining: loaded when the victims' requests end
        sim.load(m, card)


def _touched(m: Model) -> float:
    """When ``m`` was last loaded or used (lemonade's access time); never: -inf."""
    return max(t for t in (m.loaded_at, m.last_used, -math.inf) if t is not None)


class Lemonade(Rule):
    """lemonade's router with its defaults (lemonade-sdk/lemonade e385039,
    ``src/cpp/server/router.cpp``): ``max_loaded_models`` 1 per type
    (``resources/defaults.json``), so one LLM loaded at a time; on a miss the least
    recently accessed server (``find_lru_server_in_pool``: the later of its load and its
    last request's start) is evicted, busy or not, its requests awaited
    (``evict_server`` → ``wait_until_not_busy``) under the router's lock, which also
    holds back every new request; loads one at a time (``load_model``: ``is_loading_``),
    and a request through auto-load waits while any load runs. No memory check: it
    loads on the first card (each model fits a card alone)."""

    name = "lemonade"
    #: ``max_loaded_models`` (per type; every model here is an LLM); None: unlimited
    limit: int | None = 1

    def admission_paused(self, sim: Sim) -> bool:
        return any(m.state in ("loading", "draining") for m in sim.models.values())

    def decide(self, sim: Sim) -> None:
        if sim.loading:
            return  # one load at a time: the next waits for it
        super().decide(sim)

    def place(self, sim: Sim, m: Model) -> None:
        if sim.loading or any(x.state == "draining" for x in sim.models.values()):
            return
        loaded = [x for x in sim.models.values() if x.state == "ready"]
        if self.limit is not None and len(loaded) >= self.limit:
            lru = min(loaded, key=_touched)
            sim.drain(lru)
            if lru.state == "draining":
                return
        sim.load(m, self.host.cards[0])


class LemonadeAutoEvict(Lemonade):
    """lemonade with ``auto_evict`` on (``eviction_engine.cpp``), read in its favour:
    ``max_loaded_models`` -1 (unlimited: a count cap of 1 would leave nothing to score),
    and the memory-pressure pass (every 2 s at 90 % used, one eviction a pass) taken at
    once, as often as a load needs: idle models on the card with the most free memory
    evicted by ``idle_ms / (load_ms x evict_weight_factor)`` (weight 1, the highest
    first, ``load_ms`` the model's cold start) until the model fits; if the idle ones
    cannot make it fit, the load waits (lemonade would load, fail, and unload every
    model). A model idle for ``evict_idle_timeout`` (300 s) is evicted."""

    name = "lemonade_auto_evict"
    limit = None
    ttl_s = 300.0

    def place(self, sim: Sim, m: Model) -> None:
        if sim.loading:
            return

        def score(x: Model) -> tuple[float, str]:
            idle_ms = (sim.now - _touched(x)) * 1000
            return (-(idle_ms / (x.profile.cold_s * 1000 * 1.0)), x.name)

        for card in sorted(sim.host.cards, key=lambda c: (-sim.free(c), c)):
            idle = [x for x in sim.models.values() if x.card == card and x.idle]
            if sim.free(card) + sum(x.held() for x in idle) < m.mib:
                continue
            for victim in sorted(idle, key=score):
                if sim.free(card) >= m.mib:
                    break
                sim.stop(victim)
            sim.load(m, card)
            return

    def expire(self, sim: Sim, m: Model) -> None:
        used = _touched(m)
        if m.idle and m.state == "ready" and sim.now - used >= self.ttl_s - 1e-9:
            sim.stop(m)


class Ollama(Rule):
    """Ollama's scheduler (ollama/ollama fb30760, v0.33.0-rc2, ``server/sched.go``).

    - one request for a model not loaded is handled at a time, in arrival order
      (``processPending``), and a load holds the queue until the model is ready
      (``load`` → ``WaitUntilRunning``): one load at a time, the head of the queue first;
    - ``OLLAMA_NUM_PARALLEL`` 1 (``envconfig/config.go``): a model serves one request at
      a time, the rest wait on its semaphore (and count as busy);
    - at most 3 loaded models a GPU (``defaultModelsPerGPU``);
    - with another model loaded a model fits a GPU when it takes at most 80 % of its free
      memory (``load``: "leave headroom"); the GPU with the most free memory is taken
      (``bestSingleGPUFit``); with none loaded, no check. Where no single GPU fits at
      80 % Ollama spreads the model over the GPUs; read in its favour here: it loads on
      the GPU with the most free memory if it fits there whole;
    - else one runner is unloaded (``findRunnerToUnload``: by keep-alive, all the
      default, then by name; the first idle one, else the first, awaited), and the
      queue waits for it (``unloadedCh``) before it tries again;
    - idle models unloaded after the 5-minute keep-alive. The VRAM-recovery wait after
      an unload (0.5-1.5 s) is left out, in Ollama's favour.
    """

    name = "ollama"
    parallel = 1
    ttl_s = KEEP_ALIVE_S
    per_gpu = 3
    headroom = 0.8

    def decide(self, sim: Sim) -> None:
        while not sim.loading and not any(x.state == "draining" for x in sim.models.values()):
            waiting = sorted(
                (m for m in sim.models.values() if m.waiting), key=lambda m: m.queue[0]
            )
            if not waiting or not self.place_one(sim, waiting[0]):
                return

    def place_one(self, sim: Sim, m: Model) -> bool:
        """Load ``m``, or unload a runner for it; False when the queue must wait."""
        loaded = [x for x in sim.models.values() if x.state in ("loading", "ready")]
        if len(loaded) < self.per_gpu * len(sim.host.cards):
            card = self.fit(sim, m, bool(loaded))
            if card is not None:
                sim.load(m, card)
                return False  # the queue waits for the load
        runners = sorted(loaded, key=lambda x: (KEEP_ALIVE_S, x.name))
        idle = [x for x in runners if x.idle]
        if idle:
            sim.stop(idle[0])
            return True  # unloaded: try again
        sim.drain(runners[0])  # unloaded once its requests end; the queue waits
        return runners[0].state == "off"

    def fit(self, sim: Sim, m: Model, others: bool) -> str | None:
        cards = sorted(sim.host.cards, key=lambda c: (-sim.free(c), sim.host.cards.index(c)))
        if not others:
            return cards[0]
        for card in cards:
            if m.mib <= self.headroom * sim.free(card):
                return card
        return cards[0] if m.mib <= sim.free(cards[0]) else None

    def expire(self, sim: Sim, m: Model) -> None:
        used = m.last_used if m.last_used is not None else 0.0
        if m.idle and m.state == "ready" and sim.now - used >= KEEP_ALIVE_S - 1e-9:
            sim.stop(m)


class LlamaSwapGroups(Rule):
    """llama-swap's groups (mostlygeek/llama-swap 0bdb372, ``internal/router/group.go``,
    ``fifo.go``): one group per card, ``swap: true`` (one model of a group runs at a
    time), ``exclusive: false`` (a group never unloads another), each model in the group
    of its card (:func:`balanced_cards`); a request for a model whose group runs another
    waits until that one has no request in flight (``conflictsWithInFlight``: new requests
    for the running one are still served meanwhile), then the swap stops it and starts the
    model; no ``ttl`` (the default: never unloaded). Requests over the per-model
    ``concurrencyLimit`` (10) would get 429; none is turned away here, in its favour."""

    name = "llama_swap_groups"

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.card = balanced_cards(host)

    def place(self, sim: Sim, m: Model) -> None:
        card = self.card[m.name]
        others = [x for x in sim.models.values() if x.card == card and x is not m]
        if any(x.state == "loading" or (x.state == "ready" and not x.idle) for x in others):
            return  # the group's running model is busy (or starting): wait
        for x in others:
            if x.state == "ready":
                self.evict(sim, x)
        sim.load(m, card)

    def evict(self, sim: Sim, x: Model) -> None:
        sim.stop(x)


class LlamaSwapMatrix(LlamaSwapGroups):
    """llama-swap's ``matrix`` router (``internal/matrix/program.go``, ``Program.Solve``):
    the operator's sets allow every combination of models that fits each card (each model
    pinned to its card, :func:`balanced_cards`; with the sleepers' residuals counted, so
    the sets never overcommit); a request for a model not running keeps the combination of
    it and the running models with the least ``evict_costs`` of the models left out, the
    cost of each model its cold start in seconds (its wake where it sleeps: the costs an
    operator would write), and evicts the rest, waiting while any of them is busy (as
    groups do); models not running are not weighed. With ``sleepers``, the models an
    operator starts through ``cmd/vllm-wrapper`` (PR #941: ``cmdStop`` puts vLLM to sleep
    at level 1, ``cmd`` wakes it): stopped, each sleeps, holding its residual VRAM and its
    weights in host RAM, and wakes when next requested; llama-swap sees it stopped."""

    name = "llama_swap_matrix"

    def __init__(self, host: Host, sleepers: frozenset[str] = frozenset(), name: str = "") -> None:
        super().__init__(host)
        self.sleepers = sleepers
        self.name = name or self.name

    def cost(self, x: Model) -> float:
        return x.profile.wake_s if x.name in self.sleepers else x.profile.cold_s

    def fits(self, card: str, keep: Sequence[Model]) -> bool:
        """The set kept on ``card`` fits beside the residuals of the card's sleepers."""
        kept = {x.name for x in keep}
        residual = sum(
            RESIDUAL_MIB for n in self.sleepers if self.card[n] == card and n not in kept
        )
        return sum(x.mib for x in keep) + residual <= CARD_MIB

    def place(self, sim: Sim, m: Model) -> None:
        card = self.card[m.name]
        running = [
            x for x in sim.models.values() if x.card == card and x.state in ("loading", "ready")
        ]
        best: tuple[float, tuple[Model, ...]] | None = None
        for k in range(len(running) + 1):
            for out in combinations(running, k):
                keep = [x for x in running if x not in out]
                if self.fits(card, [m, *keep]):
                    cost = sum(self.cost(x) for x in out)
                    if best is None or cost < best[0]:
                        best = (cost, out)
        assert best is not None  # leaving every running model out always fits
        evicted = best[1]
        if any(not x.idle or x.state == "loading" for x in evicted):
            return  # a victim is busy (or starting): the request waits
        for x in evicted:
            if x.name in self.sleepers:
                sim.sleep(x)
            else:
                sim.stop(x)
        sim.load(m, card)


def sleep_subsets(host: Host) -> dict[str, frozenset[str]]:
    """The three ways an operator might choose which models start through vllm-wrapper,
    each greedy under the budgets (the host RAM of every sleeper at once, and on each card
    the others' residuals beside its largest model): the most cold-start seconds saved per
    GiB of host RAM, the most requested in the hour before the trace (what an operator
    knows of the traffic: the same hour vramctl's journal remembers), the slowest cold
    start."""
    card = balanced_cards(host)
    asked = Counter(name for _, name, _ in host.history)
    profiles = dict(host.models)
    ways: dict[str, Callable[[str], Any]] = {
        "saved_per_ram": lambda n: (
            -(profiles[n].cold_s - profiles[n].wake_s) / profiles[n].sleep_ram_gib,
            n,
        ),
        "most_requested": lambda n: (-asked[n], n),
        "slowest_start": lambda n: (-profiles[n].cold_s, n),
    }
    out: dict[str, frozenset[str]] = {}
    for way, key in ways.items():
        chosen: list[str] = []
        for n in sorted(profiles, key=key):
            trial = [*chosen, n]
            if sum(profiles[x].sleep_ram_gib * GIB for x in trial) > host.host_ram_mib:
                continue
            if all(_room_beside(c, trial, card, profiles) for c in host.cards):
                chosen = trial
        out[way] = frozenset(chosen)
    return out


def _room_beside(
    card: str, sleepers: Sequence[str], pinned: Mapping[str, str], profiles: Mapping[str, Profile]
) -> bool:
    """Every model pinned to ``card`` fits beside the residuals of its other sleepers."""
    on = [n for n, c in pinned.items() if c == card]
    asleep = [n for n in sleepers if pinned[n] == card]
    return all(
        profiles[n].vram_gib * GIB + RESIDUAL_MIB * len([s for s in asleep if s != n]) <= CARD_MIB
        for n in on
    )


class Vramctl(Rule):
    """The planner (``statemachine.planning.planner.plan_transitions``), with its variants."""

    #: ``vramctl run``'s resync (``--resync``, 5 s): it plans again while one waits
    tick_s = 5.0

    def __init__(
        self,
        host: Host,
        *,
        name: str,
        costs: bool = True,
        sleeps: bool = True,
        placed: bool = True,
        reuse: bool = True,
    ) -> None:
        super().__init__(host)
        self.name, self.costs, self.sleeps, self.placed, self.reuse = (
            name,
            costs,
            sleeps,
            placed,
            reuse,
        )
        self.roles = {c: GpuRole(c, CARD_MIB, 0) for c in host.cards}
        self.host_ram = HostBudget(host.host_ram_mib)
        self.pinned = balanced_cards(host)

    def spec(self, m: Model) -> ServeSpec:
        asked = bool(m.queue) or m.in_flight > 0 or m.state == "loading"
        sleep = Sleep(1, RESIDUAL_MIB, "vllm", m.ram_mib)
        cards = tuple(self.host.cards) if self.placed else (self.pinned[m.name],)
        return ServeSpec(
            name=m.name,
            container=f"c-{m.name}",
            gpu_roles=cards if m.card is None else (m.card,),
            placement=cards if self.placed else (),
            vram_mib=m.mib,
            residency=Residency.ON_DEMAND if asked else Residency.EVICTABLE,
            sleep=sleep if self.sleeps else None,
            sizes_from_free=True,  # vLLM: its starts on a GPU one at a time
        )

    def inputs(self, sim: Sim) -> tuple[DesiredState, Observed, Policy]:
        models = sim.models.values()
        serves = {m.name: self.spec(m) for m in models}
        # one request recorded per request routed (each ``up``), as the journal keeps them
        requests = tuple(
            OnDemandRequest(m.name, NOW + at)
            for m in models
            if m.queue or m.in_flight > 0 or m.state == "loading"
            for at in ([a for a, _ in m.queue] or [sim.now])
        )
        holding = [m for m in models if m.state != "off"]
        observed = Observed(
            docker_ok=True,
            containers={
                # the controller tells each container its card (``VRAMCTL_GPU_ROLE``)
                f"c-{m.name}": ContainerObs(
                    ContainerState.RUNNING,
                    started_at=NOW + (m.started_at or 0.0),
                    gpu_role=m.card,
                )
                for m in holding
            },
            started_with={
                f"c-{m.name}": StartedWith(m.name, (m.card or "",), m.mib) for m in holding
            },
            sleep={
                m.name: SleepObs(SleepState.ASLEEP, 1, RESIDUAL_MIB, m.ram_mib)
                for m in models
                if m.state == "asleep"
            },
            in_flight={m.name: InFlightObs(m.in_flight, InFlightSource.METRICS) for m in holding},
            # a start or wake awaiting health: the controller's own start in progress
            starting={
                m.name: StartingObs((m.card or "",), m.mib) for m in models if m.state == "loading"
            },
        )
        policy = Policy()
        if self.costs and RestoreCost is not None:
            policy = Policy(
                reload={
                    m.name: RestoreCost(m.profile.cold_s, m.profile.wake_s if self.sleeps else None)
                    for m in models
                },
                last_used={m.name: NOW + m.last_used for m in models if m.last_used is not None},
                **self.known_uses(sim),
            )
        desired = DesiredState(self.roles, serves, requests, self.host_ram)
        return desired, observed, policy

    def known_uses(self, sim: Sim) -> dict[str, Any]:
        """``Policy.uses`` where this tree's planner reads them and the variant weighs
        reuse: the arrivals so far, the last :data:`MAX_USES` of each."""
        if not self.reuse or "uses" not in Policy.__dataclass_fields__:
            return {}
        return {
            "uses": {
                m.name: tuple(NOW + t for t in m.uses[-MAX_USES:]) for m in sim.models.values()
            }
        }

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


def _swap_sleep(way: str) -> Callable[[Host], Rule]:
    def make(h: Host) -> Rule:
        return LlamaSwapMatrix(h, sleep_subsets(h)[way], name=f"llama_swap_sleep:{way}")

    return make


MAKERS: dict[str, Callable[[Host], Rule]] = {
    "vramctl": lambda h: Vramctl(h, name="vramctl"),
    "vramctl_no_reuse": lambda h: Vramctl(h, name="vramctl_no_reuse", reuse=False),
    "vramctl_no_costs": lambda h: Vramctl(h, name="vramctl_no_costs", costs=False),
    "vramctl_no_sleep": lambda h: Vramctl(h, name="vramctl_no_sleep", sleeps=False),
    "vramctl_pinned": lambda h: Vramctl(h, name="vramctl_pinned", placed=False),
    "ollama": Ollama,
    "llama_swap_groups": LlamaSwapGroups,
    "llama_swap_matrix": LlamaSwapMatrix,
    **{f"llama_swap_sleep:{w}": _swap_sleep(w) for w in SLEEP_WAYS},
    "anvil": Anvil,
    "lemonade": Lemonade,
    "lemonade_auto_evict": LemonadeAutoEvict,
}
OURS = ("vramctl", "vramctl_no_reuse", "vramctl_no_costs", "vramctl_no_sleep", "vramctl_pinned")


# ── the report ─────────────────────────────────────────────────────────────────────


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def run_one(task: tuple[str, int, float, str]) -> tuple[str, int, str, Tally]:
    """One policy over one seed of one family (a worker's unit)."""
    family, seed, hours, policy = task
    host = build(family, seed, hours)
    return family, seed, policy, Sim(host, MAKERS[policy](host)).run()


@dataclass(slots=True)
class Row:
    """One policy over one family's seeds."""

    policy: str
    by_seed: dict[int, Tally]

    def waits(self) -> list[float]:
        return [w for t in self.by_seed.values() for w in t.waits]

    def mean(self) -> float:
        return statistics.fmean(self.waits())

    def seed_mean(self, seed: int) -> float:
        waits = self.by_seed[seed].waits
        return statistics.fmean(waits) if waits else 0.0

    @property
    def feasible(self) -> bool:
        return not any(t.odd for t in self.by_seed.values())

    def to_json(self, family: str) -> dict[str, Any]:
        tallies = self.by_seed.values()
        return {
            "bench": "policy",
            "family": family,
            "policy": self.policy,
            "requests": len(self.waits()),
            "mean_wait_s": round(self.mean(), 3),
            "p95_wait_s": round(p95(self.waits()), 3),
            "cold_starts": sum(t.cold for t in tallies),
            "wakes": sum(t.wakes for t in tallies),
            "infeasible_checks": sum(t.odd for t in tallies),
            "peak_sleep_ram_gib": max(t.peak_ram_mib for t in tallies) // GIB,
        }


def peer_rows(rows: Mapping[str, Row]) -> dict[str, Row]:
    """The peers' rows as ranked: llama-swap with sleep is the best of its three ways of
    choosing the sleepers (named with the way); an infeasible row is left out."""
    out = {p: r for p, r in rows.items() if p in PEERS and r.feasible}
    ways = [r for p, r in rows.items() if p.startswith("llama_swap_sleep:") and r.feasible]
    if ways:
        best = min(ways, key=Row.mean)
        out[best.policy] = best
    return out


def family_summary(family: str, rows: Mapping[str, Row]) -> dict[str, Any]:
    peers = peer_rows(rows)
    out: dict[str, Any] = {"bench": "policy_family", "family": family}
    if not peers or "vramctl" not in rows:
        return out
    best = min(peers.values(), key=Row.mean)
    ours = rows["vramctl"]
    seeds = sorted(ours.by_seed)
    wins = sum(ours.seed_mean(s) < best.seed_mean(s) for s in seeds)
    losses = sum(ours.seed_mean(s) > best.seed_mean(s) for s in seeds)
    out.update(
        seeds=len(seeds),
        best_peer=best.policy,
        best_peer_mean_wait_s=round(best.mean(), 3),
        vramctl_mean_wait_s=round(ours.mean(), 3),
        vramctl_vs_best_peer=round(ours.mean() / best.mean(), 3),
        seed_wins=wins,
        seed_losses=losses,
        vramctl_feasible=ours.feasible,
    )
    for p in OURS[1:]:
        if p in rows:
            out[f"{p}_vs_best_peer"] = round(rows[p].mean() / best.mean(), 3)
    return out


def table(family: str, rows: Mapping[str, Row]) -> str:
    head = ("policy", "mean wait s", "p95 wait s", "cold starts", "wakes", "feasible")
    lines = [head]
    for r in rows.values():
        j = r.to_json(family)
        lines.append(
            (
                r.policy,
                f"{j['mean_wait_s']:.2f}",
                f"{j['p95_wait_s']:.1f}",
                str(j["cold_starts"]),
                str(j["wakes"]),
                "yes" if r.feasible else f"NO ({j['infeasible_checks']})",
            )
        )
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    body = "\n".join(
        "| " + " | ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) + " |" for x in lines
    )
    return f"## {family}: {BY_FAMILY[family].title}\n{body}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--quick", action="store_true", help=f"5 seeds x 1 h of {', '.join(QUICK)}")
    p.add_argument("--family", choices=[f.name for f in FAMILIES], action="append")
    p.add_argument("--only", choices=list(MAKERS), action="append")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    families = args.family or [f.name for f in FAMILIES]
    if args.quick:
        args.seeds, args.hours = 5, 1.0
        families = args.family or list(QUICK)
    policies = args.only or list(MAKERS)
    seeds = range(args.seed, args.seed + args.seeds)
    tasks = [(f, s, args.hours, pol) for f in families for pol in policies for s in seeds]
    results: dict[str, dict[str, Row]] = {f: {} for f in families}
    with multiprocessing.get_context("fork").Pool(max(1, args.jobs)) as pool:
        for family, seed, policy, tally in pool.imap_unordered(run_one, tasks, chunksize=2):
            row = results[family].setdefault(policy, Row(policy, {}))
            row.by_seed[seed] = tally
    summaries = []
    for family in families:
        rows = {pol: results[family][pol] for pol in policies}
        print(table(family, rows), file=sys.stderr)
        for row in rows.values():
            print(json.dumps(row.to_json(family)))
        summary = family_summary(family, rows)
        summaries.append(summary)
        print(json.dumps(summary))
    ranked = [s for s in summaries if "vramctl_vs_best_peer" in s]
    if ranked:
        worst = max(ranked, key=lambda s: s["vramctl_vs_best_peer"])
        default = next((s for s in ranked if s["family"] == "default"), None)
        print(
            json.dumps(
                {
                    "bench": "policy_summary",
                    "seeds": [seeds.start, seeds.stop - 1],
                    "hours": args.hours,
                    "families": len(ranked),
                    "default_vs_best_peer": default and default["vramctl_vs_best_peer"],
                    "default_best_peer": default and default["best_peer"],
                    "worst_family": worst["family"],
                    "worst_vs_best_peer": worst["vramctl_vs_best_peer"],
                    "families_lost": sum(s["vramctl_vs_best_peer"] > 1 for s in ranked),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
