"""In-flight request counts: the engine's Prometheus metrics, or the router tier's state.

Two read-only sources tell how many requests a serve has in flight
(docs/eviction.md#busy-aware-victim-choice):

- the engine's own ``/metrics`` (Prometheus text, parsed with ``prometheus_client``),
  the names its entry in :mod:`statemachine.engines` gives (``inflight_metrics``):
  vLLM ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``, SGLang
  ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``, llama.cpp server
  ``llamacpp:requests_processing`` + ``llamacpp:requests_deferred``; every series of
  a metric is summed (vLLM and SGLang label theirs by ``model_name``, engine, rank);
- the router's ``GET /v1/admin/transition?tier_id=T``: ``tiers[0].active_requests``.

A count that cannot be read (no answer, a timeout, an error status, a metric missing,
a value that is not a finite number ≥ 0) is ``None``: unknown, never 0. Each read is
bounded by a short timeout (:data:`DEFAULT_TIMEOUT_S`) and :func:`read_all` reads every
serve at once in a small thread pool, so an observation waits at most about one timeout
for the engines however many serves there are.

The router serves :data:`ROUTER_SLOTS` management requests at once and answers 503
``server_busy`` to another (docs/protocols.md): its tiers are read at most
:data:`MAX_ROUTER_READS` at a time (a :class:`RouterGate`), and a busy answer is asked
again after a short pause while the read's budget of :data:`ROUTER_BUDGET_TIMEOUTS`
timeouts lasts (waiting for its turn counts against it; each try has one timeout): a
router read ends within about three timeouts, however many serves are read from it.

This module must not change anything: it only reads.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from statemachine import engines
from statemachine.domain.types import InFlightSource

#: seconds one read may take (connect, read, the whole answer): a loop cycle waits for it
DEFAULT_TIMEOUT_S = 1.0
#: most concurrent reads
MAX_WORKERS = 8
#: management requests the router serves at once; it answers 503 server_busy to another
ROUTER_SLOTS = 4
#: most concurrent reads of one router: its slots but one for a transition of the
#: controller's own (a drain holds its slot for its whole length) and one for an operator
MAX_ROUTER_READS = ROUTER_SLOTS - 2
#: timeouts one router read may spend waiting for its turn and asking again after busy
ROUTER_BUDGET_TIMEOUTS = 2
#: the pause after a first busy answer (doubling up to :data:`BUSY_PAUSE_MAX_S`)
BUSY_PAUSE_S = 0.05
BUSY_PAUSE_MAX_S = 0.25
#: an answer larger than this is not a metrics page: unknown
MAX_BODY_BYTES = 8 * 1024 * 1024

TRANSITION_PATH = "/v1/admin/transition"


def engine_metrics() -> dict[str, tuple[str, ...]]:
    """Engine -> the metrics whose sum is its count of requests in flight: each
    registered engine's ``inflight_metrics`` (:mod:`statemachine.engines`)."""
    return {e.name: e.inflight_metrics for e in engines.engines() if e.inflight_metrics}


def engine_kind(engine: str | None) -> str | None:
    """The engine whose metrics ``engine`` (the manifest's label) names, if known."""
    found = engines.lookup(engine)
    return found.name if found is not None and found.inflight_metrics else None


@dataclass(frozen=True, slots=True)
class InFlightReading:
    """One serve's count (``None``: unknown), where it was read, and why it is unknown."""

    count: int | None
    source: InFlightSource | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class InFlightSources:
    """Where one serve's count can be read: its metrics URL and engine, its router tier."""

    metrics_url: str | None = None
    engine: str | None = None  # a key of engine_metrics(); None: whichever the page has
    router_url: str | None = None
    router_tier: str | None = None
    router_token: str | None = None

    @property
    def kind(self) -> InFlightSource | None:
        """The source read first (the engine's metrics, else the router), if any."""
        if self.metrics_url is not None:
            return InFlightSource.METRICS
        if self.router_url is not None and self.router_tier is not None:
            return InFlightSource.ROUTER
        return None

    @property
    def any(self) -> bool:
        """True when the serve has a source at all."""
        return self.metrics_url is not None or (
            self.router_url is not None and self.router_tier is not None
        )


def parse_in_flight(text: str, engine: str | None = None) -> int | None:
    """The in-flight count in a Prometheus text page; ``None`` when it cannot be told.

    ``engine`` picks the metric names (a key of :func:`engine_metrics`); ``None`` takes
    the first engine whose metrics the page has. Both metrics of the pair must be there.
    """
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception:  # the parser raises ValueError and others on a malformed page
        return None
    known = engine_metrics()
    kinds = [engine] if engine is not None else list(known)
    for kind in kinds:
        names = known.get(kind)
        if names is None or not all(n in families for n in names):
            continue
        total = 0.0
        for n in names:
            samples = [s for s in families[n].samples if s.name == n]
            if not samples:
                return None
            for sample in samples:
                value = float(sample.value)
                if not math.isfinite(value) or value < 0:
                    return None
                total += value
        return round(total)
    return None


def read_metrics(
    client: httpx.Client, url: str, engine: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> InFlightReading:
    """GET the engine's metrics page; the count, or unknown with why."""
    source = InFlightSource.METRICS
    try:
        resp = client.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return InFlightReading(None, source, f"{url}: {type(exc).__name__}: {exc}")
    if resp.status_code != 200:
        return InFlightReading(None, source, f"{url}: HTTP {resp.status_code}")
    if len(resp.content) > MAX_BODY_BYTES:
        return InFlightReading(None, source, f"{url}: the answer is too large")
    count = parse_in_flight(resp.text, engine)
    if count is None:
        wanted = (
            " + ".join(engine_metrics().get(engine, ())) or f"{engine!r}'s metrics"
            if engine
            else "no known engine's metrics"
        )
        return InFlightReading(None, source, f"{url}: {wanted} not found or not a count")
    return InFlightReading(count, source)


class RouterGate:
    """At most :data:`MAX_ROUTER_READS` reads of each router (by URL) at once. Thread-safe."""

    def __init__(self, slots: int = MAX_ROUTER_READS) -> None:
        self.slots = slots
        self._lock = threading.Lock()
        self._gates: dict[str, threading.BoundedSemaphore] = {}

    def of(self, router_url: str) -> threading.BoundedSemaphore:
        """The semaphore of the router at ``router_url``."""
        key = router_url.rstrip("/")
        with self._lock:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = threading.BoundedSemaphore(self.slots)
            return gate


def _is_busy(resp: httpx.Response) -> bool:
    return resp.status_code == 503 and "server_busy" in resp.text


def _get_tier(
    client: httpx.Client,
    url: str,
    tier: str,
    headers: dict[str, str],
    deadline: float,
    timeout_s: float,
) -> httpx.Response | str:
    """The router's answer for ``tier``, a busy one asked again until ``deadline``; or
    why there is none."""
    pause = BUSY_PAUSE_S
    while True:
        try:
            resp = client.get(url, params={"tier_id": tier}, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            return f"router: {type(exc).__name__}: {exc}"
        if not _is_busy(resp):
            return resp
        if time.monotonic() + pause >= deadline:
            return resp
        time.sleep(pause)
        pause = min(2 * pause, BUSY_PAUSE_MAX_S)


def read_router_tier(
    client: httpx.Client,
    router_url: str,
    tier: str,
    token: str | None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    gate: RouterGate | None = None,
) -> InFlightReading:
    """GET the router tier's state; ``tiers[0].active_requests``, or unknown with why.

    The read waits for its turn at ``gate`` (a fresh one when ``None``), asks again
    after a 503 ``server_busy`` (the router's slots are taken) while
    :data:`ROUTER_BUDGET_TIMEOUTS` × ``timeout_s`` last, each try bounded by
    ``timeout_s``. The router answers 400
    ``invalid_transition`` for a tier it does not know and 404 when its transition API
    is not enabled: both are unknown, as is a router still busy at the end.
    """
    source = InFlightSource.ROUTER
    budget = ROUTER_BUDGET_TIMEOUTS * timeout_s
    deadline = time.monotonic() + budget
    slots = (gate or RouterGate()).of(router_url)
    if not slots.acquire(timeout=budget):
        return InFlightReading(
            None,
            source,
            f"router tier {tier}: no turn within {budget:g} s "
            f"(at most {MAX_ROUTER_READS} reads of the router at once)",
        )
    try:
        url = router_url.rstrip("/") + TRANSITION_PATH
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        resp = _get_tier(client, url, tier, headers, deadline, timeout_s)
    finally:
        slots.release()
    if isinstance(resp, str):
        return InFlightReading(None, source, resp)
    if _is_busy(resp):
        return InFlightReading(
            None,
            source,
            f"router tier {tier}: still HTTP 503 server_busy when its {budget:g} s were up",
        )
    if resp.status_code != 200:
        return InFlightReading(None, source, f"router tier {tier}: HTTP {resp.status_code}")
    try:
        tiers = resp.json().get("tiers")
        value = tiers[0].get("active_requests") if isinstance(tiers, list) and tiers else None
    except (ValueError, AttributeError):
        value = None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return InFlightReading(None, source, f"router tier {tier}: no active_requests count")
    return InFlightReading(value, source)


def read_one(
    client: httpx.Client,
    sources: InFlightSources,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    gate: RouterGate | None = None,
) -> InFlightReading:
    """One serve's count: the engine's metrics first (they count every client, queued
    ones too), else the router tier's; no source at all is unknown without a source."""
    if not sources.any:
        return InFlightReading(None, None)
    reading: InFlightReading | None = None
    if sources.metrics_url is not None:
        reading = read_metrics(client, sources.metrics_url, sources.engine, timeout_s=timeout_s)
        if reading.count is not None:
            return reading
    if sources.router_url is not None and sources.router_tier is not None:
        tier = read_router_tier(
            client,
            sources.router_url,
            sources.router_tier,
            sources.router_token,
            timeout_s=timeout_s,
            gate=gate,
        )
        if tier.count is not None or reading is None:
            return tier
        return InFlightReading(None, reading.source, f"{reading.error}; {tier.error}")
    assert reading is not None
    return reading


def read_all(
    sources: Mapping[str, InFlightSources],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client: httpx.Client | None = None,
    gate: RouterGate | None = None,
) -> dict[str, InFlightReading]:
    """Every serve's count, read concurrently (serve -> reading). Never raises.

    Without ``client`` one is made for this call (and closed), only when some serve has
    a source: a client loads its TLS context, which costs more than the reads. The
    router reads share ``gate`` (without one, a gate for this call).
    """
    with_source = {n: s for n, s in sources.items() if s.any}
    out = {n: InFlightReading(None, None) for n, s in sources.items() if not s.any}
    if not with_source:
        return out
    own = client is None
    http = httpx.Client(trust_env=False) if client is None else client
    gate = gate or RouterGate()
    try:
        workers = min(MAX_WORKERS, len(with_source))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="in-flight") as pool:
            futures = {
                n: pool.submit(read_one, http, s, timeout_s=timeout_s, gate=gate)
                for n, s in with_source.items()
            }
            for n, fut in futures.items():
                try:
                    out[n] = fut.result()
                except Exception as exc:  # a bug in a reader must not end the observation
                    src = with_source[n]
                    kind = InFlightSource.METRICS if src.metrics_url else InFlightSource.ROUTER
                    out[n] = InFlightReading(None, kind, repr(exc))
        return out
    finally:
        if own:
            http.close()


class InFlightReader:
    """:func:`read_all` with one HTTP client kept from call to call.

    The client is made on the first call that has a source to read (a client loads its
    TLS context: more than a cycle's reads cost) and closed by :meth:`close`; a call
    after that makes a new one. Calls that overlap share one :class:`RouterGate`.
    Thread-safe.
    """

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._gate = RouterGate()
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __call__(self, sources: Mapping[str, InFlightSources]) -> dict[str, InFlightReading]:
        if not any(s.any for s in sources.values()):
            return read_all(sources, timeout_s=self.timeout_s)  # nothing to read
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(trust_env=False)
            client = self._client
        return read_all(sources, timeout_s=self.timeout_s, client=client, gate=self._gate)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
