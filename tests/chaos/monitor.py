"""The budget monitor: Docker's events, replayed in time order, against the declared budget.

The monitor is fed four kinds of items, each stamped with the host's wall clock in
nanoseconds (Docker's ``timeNano`` is the same clock on the same host):

* :class:`ModelItem` — the manifest the test *means* (the driver's model, never a
  half-written file): per serve its role and reservation, per role its budget;
* :class:`RequestItem` — a container ``start`` or ``create`` request, either seen on
  the controller's Docker socket (``who="controller"``, with Docker's status code once
  the answer passed) or made by the driver itself (``who="outside"``);
* :class:`EventItem` — a container event (``start``, ``die``, ``destroy``);
* :class:`ListItem` — a fresh container list (which containers run), to cross-check
  what the events said.

Items are processed strictly in time order (:class:`Timeline` holds them back for a
short watermark so that late arrivals from other threads sort in first). The
monitor keeps the running containers, each with its *cause* (who started it) and the
reservation it was started with. A running container counts
``max(reservation it was started with, what the model declares now)``: a running
engine may hold what it was started with, whatever the manifest now says.

Findings (:class:`Violation`):

* ``overcommit`` — a start the controller made took a role over budget. Not flagged
  (and reported as ``race``) when the role is within budget once the containers the
  driver started in the last ``race_s`` before the controller's request are left out
  (the controller could not have seen them), or under some manifest version that was
  in force within ``lag_s`` before the request (the controller may not have reloaded
  yet; the other starts it asked for while that version was in force, or within their
  own ``lag_s`` after, count at that version's figure too: it may have reserved them
  under it, before an edit that landed while their ``up`` ran). A start the driver
  made that overcommits is ``outside_overcommit``: reported, never the controller's
  fault;
* ``double_start`` — a second running container of one serve; the controller's start
  (Docker answered 304) or ``up`` create (409) of a serve whose container the driver
  started more than ``race_s`` earlier; a start of a container that already runs;
* ``unattributed`` — a start that neither the controller's socket nor the driver
  requested: the harness cannot say whose it is (a harness gap; it fails the test);
* ``monitor_gap`` — a container list disagreed with the events twice in a row.

The module is plain Python (no Docker) so a synthetic event feed can drive it.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

NS = 1_000_000_000

Who = Literal["controller", "outside"]


@dataclass(frozen=True)
class ServeDecl:
    """What the model declares for one serve."""

    role: str
    mib: int
    up_delay_s: float = 0.0  # an `up` that waits before it creates: widens the race window


@dataclass(frozen=True)
class Model:
    budgets: Mapping[str, int]
    serves: Mapping[str, ServeDecl]


@dataclass
class ModelItem:
    t: int
    model: Model


@dataclass
class RequestItem:
    t: int
    who: Who
    kind: Literal["start", "create"]
    ref: str  # a container name or id (a prefix of the id), as the request named it
    status: int | None = None  # Docker's answer; None: not (yet) seen


@dataclass
class EventItem:
    t: int
    action: str
    cid: str
    name: str
    serve: str


@dataclass
class ListItem:
    """A container list: asked for at ``since``, answered at ``t``.

    The list is no snapshot of one instant: a container whose events fall between
    the two is left out of the comparison.
    """

    t: int
    running: frozenset[str]  # container ids
    since: int = 0
    names: dict[str, str] | None = None  # id -> name, for the report


Item = ModelItem | RequestItem | EventItem | ListItem


@dataclass
class RunRecord:
    """One run of a container: from its start event to its death."""

    cid: str
    name: str
    serve: str
    cause: str  # controller | outside | unattributed | preexisting
    t: int
    mib: int
    request_t: int


@dataclass(frozen=True)
class Violation:
    kind: str
    t: int
    serve: str
    detail: str
    request_t: int = 0  # when the start was asked for (0: not a start)
    #: a race: the outside starts (serve, time) it was excused for, and the detail an
    #: overcommit would have had (see :func:`promote_races`)
    excused: tuple[tuple[str, int], ...] = ()
    as_overcommit: str = ""


def promote_races(
    notes: Iterable[Violation], admitted: Mapping[str, list[int]], grace_s: float = 0.25
) -> list[Violation]:
    """Races the controller's own admission times show were not races.

    ``admitted`` is, per serve, when the controller admitted a start of it (its log's
    reserve step). A start excused because an outside start came just before its
    request is an overcommit after all when the controller admitted it more than
    ``grace_s`` after every one of those outside starts: a look at the host at
    admission would have seen them.
    """
    out = []
    for n in notes:
        if n.kind != "race" or not n.excused:
            continue
        before = [t for t in admitted.get(n.serve, []) if n.request_t - 60 * NS <= t <= n.request_t]
        if not before:
            continue
        admit = max(before)
        if all(t < admit - grace_s * NS for _, t in n.excused):
            lag = ", ".join(f"{s} {(admit - t) / NS:.2f}s" for s, t in n.excused)
            out.append(
                Violation(
                    "overcommit",
                    n.t,
                    n.serve,
                    f"[admitted after outside starts it could have seen: {lag}] {n.as_overcommit}",
                    n.request_t,
                )
            )
    return out


@dataclass
class Monitor:
    """Per-role running reservations, attribution of starts, the findings."""

    race_s: float = 1.0
    lag_s: float = 3.0
    pending_s: float = 30.0
    models: list[tuple[int, Model]] = field(default_factory=list)
    running: dict[str, RunRecord] = field(default_factory=dict)
    last_run: dict[str, RunRecord] = field(default_factory=dict)  # by container name
    pending: list[RequestItem] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    notes: list[Violation] = field(default_factory=list)  # races, outside overcommits, ...
    starts: dict[str, int] = field(default_factory=dict)  # by cause
    max_held: dict[str, int] = field(default_factory=dict)
    last_t: int = 0
    _list_misses: set[str] = field(default_factory=set)
    _last_event: dict[str, int] = field(default_factory=dict)

    # ── inputs ──────────────────────────────────────────────────────────────
    def process(self, item: Item) -> None:
        self.last_t = max(self.last_t, item.t)
        self._expire(item.t)
        if isinstance(item, ModelItem):
            self.models.append((item.t, item.model))
        elif isinstance(item, RequestItem):
            self._request(item)
        elif isinstance(item, EventItem):
            self._last_event[item.cid] = item.t
            if item.action == "start":
                self._start(item)
            elif item.action in ("die", "destroy"):
                self.running.pop(item.cid, None)
        else:
            self._list(item)

    def feed(self, items: Iterable[Item]) -> Monitor:
        for item in sorted(items, key=lambda i: i.t):
            self.process(item)
        return self

    # ── the model ───────────────────────────────────────────────────────────
    def model_at(self, t: int) -> Model | None:
        i = bisect.bisect_right([m[0] for m in self.models], t)
        return self.models[i - 1][1] if i else None

    def models_between(self, t0: int, t1: int) -> list[Model]:
        """Every model version in force at some moment of [t0, t1]."""
        out = [m for (mt, m) in self.models if t0 < mt <= t1]
        first = self.model_at(t0)
        return ([first] if first is not None else []) + out

    def _decl(self, serve: str, t: int) -> ServeDecl | None:
        model = self.model_at(t)
        return None if model is None else model.serves.get(serve)

    def _last_decl(self, serve: str, t: int) -> ServeDecl | None:
        for mt, model in reversed(self.models):
            if mt <= t and serve in model.serves:
                return model.serves[serve]
        return None

    # ── what the roles hold ──────────────────────────────────────────────────
    def _role_of(self, serve: str, t: int) -> str | None:
        decl = self._last_decl(serve, t)
        return None if decl is None else decl.role

    def held(
        self,
        role: str,
        model: Model,
        *,
        t: int,
        leave_out: frozenset[str] = frozenset(),
        fresh: Mapping[str, int] | None = None,
    ) -> int:
        """MiB the running containers hold on ``role`` under ``model``.

        ``fresh`` (cid -> mib) overrides the start reservation of the containers the
        controller may have planned under this model version (their reservation in it).
        """
        total = 0
        for r in self.running.values():
            if r.cid in leave_out or self._role_of(r.serve, t) != role:
                continue
            start_mib = fresh.get(r.cid, r.mib) if fresh is not None else r.mib
            now = model.serves.get(r.serve)
            total += max(start_mib, now.mib if now is not None else 0)
        return total

    # ── requests ─────────────────────────────────────────────────────────────
    def _expire(self, t: int) -> None:
        horizon = t - int(self.pending_s * NS)
        self.pending = [p for p in self.pending if p.t >= horizon]

    def _run_of(self, ref: str) -> RunRecord | None:
        for r in self.running.values():
            if _matches(ref, r.cid, r.name):
                return r
        return None

    def _request(self, item: RequestItem) -> None:
        if item.who == "outside":
            self.pending.append(item)
            return
        run = self._run_of(item.ref)
        if item.kind == "create":
            if item.status == 409 and run is not None:
                self._already_running(item, run, "its `up` created it again (409)")
            return
        if item.status == 304 or (item.status is None and run is not None):
            if run is not None:
                self._already_running(item, run, "docker start answered 304")
            return
        if item.status is None or 200 <= item.status < 300:
            self.pending.append(item)

    def _already_running(self, item: RequestItem, run: RunRecord, how: str) -> None:
        age = (item.t - run.t) / NS
        text = (
            f"the controller started {run.name} ({how}) while it ran since {age:.2f}s, "
            f"started by {run.cause}"
        )
        if run.cause == "outside" and age > self.race_s:
            self.violations.append(Violation("double_start", item.t, run.serve, text))
        else:
            self.notes.append(Violation("redundant_start", item.t, run.serve, text))

    # ── starts ───────────────────────────────────────────────────────────────
    def _attribute(self, ev: EventItem) -> tuple[str, int]:
        mine = [p for p in self.pending if p.t <= ev.t and _matches(p.ref, ev.cid, ev.name)]
        self.pending = [p for p in self.pending if p not in mine]
        if not mine:
            return "unattributed", ev.t
        confirmed = [p for p in mine if p.who == "controller" and p.status is not None]
        chosen = min(confirmed or mine, key=lambda p: p.t)
        return chosen.who, chosen.t

    def _start(self, ev: EventItem) -> None:
        cause, req_t = self._attribute(ev)
        self.starts[cause] = self.starts.get(cause, 0) + 1
        if ev.cid in self.running:
            self.violations.append(
                Violation("double_start", ev.t, ev.serve, f"{ev.name} started while it runs")
            )
        twin = next(
            (r for r in self.running.values() if r.serve == ev.serve and r.cid != ev.cid), None
        )
        if twin is not None:
            self.violations.append(
                Violation(
                    "double_start",
                    ev.t,
                    ev.serve,
                    f"a second container of {ev.serve} ({ev.name}, by {cause}) while "
                    f"{twin.name} (by {twin.cause}) runs",
                )
            )
        decl = self._decl(ev.serve, ev.t)
        last = decl or self._last_decl(ev.serve, ev.t)
        run = RunRecord(ev.cid, ev.name, ev.serve, cause, ev.t, last.mib if last else 0, req_t)
        self.running[ev.cid] = run
        self.last_run[ev.name] = run
        if cause == "unattributed":
            self.violations.append(
                Violation(
                    "unattributed", ev.t, ev.serve, f"nobody asked for the start of {ev.name}"
                )
            )
        if last is None:
            return
        role = last.role
        model = self.model_at(ev.t)
        if model is None or role not in model.budgets:
            return
        budget = model.budgets[role]
        held = self.held(role, model, t=ev.t)
        self.max_held[role] = max(self.max_held.get(role, 0), held)
        if held <= budget:
            return
        summary = self._describe(role, model, ev.t, held, budget)
        if cause == "outside":
            self.notes.append(Violation("outside_overcommit", ev.t, ev.serve, summary))
            return
        if cause != "controller":
            return  # already a violation of its own
        window_s = self.lag_s + last.up_delay_s
        for m in self.models_between(req_t - int(window_s * NS), req_t):
            decl_m = m.serves.get(ev.serve)
            fresh = self._planned_under(m, ev.t)
            fresh[ev.cid] = decl_m.mib if decl_m is not None else 0
            if self.held(role, m, t=ev.t, fresh=fresh) <= m.budgets.get(role, budget):
                self.notes.append(
                    Violation(
                        "race",
                        ev.t,
                        ev.serve,
                        f"{summary}; fits a manifest of < {window_s:g}s before the request",
                    )
                )
                return
        race_ns = int((self.race_s + last.up_delay_s) * NS)
        recent = frozenset(
            r.cid for r in self.running.values() if r.cause == "outside" and r.t > req_t - race_ns
        )
        if recent and self.held(role, model, t=ev.t, leave_out=recent) <= budget:
            self.notes.append(
                Violation(
                    "race",
                    ev.t,
                    ev.serve,
                    f"{summary}; an outside start came within "
                    f"{self.race_s + last.up_delay_s:g}s of the request",
                    req_t,
                    tuple(sorted((self.running[c].serve, self.running[c].t) for c in recent)),
                    self._why(role, model, ev, summary),
                )
            )
            return
        why = self._why(role, model, ev, summary)
        self.violations.append(Violation("overcommit", ev.t, ev.serve, why, req_t))

    def _planned_under(self, model: Model, t: int) -> dict[str, int]:
        """The containers the controller started that it may have planned under ``model``.

        Each (cid -> its reservation in ``model``) whose own start request came while
        ``model`` was in force or within ``lag_s`` (plus its ``up`` delay) after: the
        controller reserved it then, so its start reservation may be ``model``'s figure
        even when a later version was in force by its start event (an edit that lands
        while its ``up`` runs).
        """
        out: dict[str, int] = {}
        for r in self.running.values():
            decl = model.serves.get(r.serve)
            if r.cause != "controller" or decl is None:
                continue
            last = self._last_decl(r.serve, t)
            window_ns = int((self.lag_s + (last.up_delay_s if last else 0.0)) * NS)
            if any(m is model for m in self.models_between(r.request_t - window_ns, r.request_t)):
                out[r.cid] = decl.mib
        return out

    def _why(self, role: str, model: Model, ev: EventItem, summary: str) -> str:
        """What the count holds that the manifest no longer says, and the total three ways.

        ``at start`` is what the monitor counts (a running container keeps the
        reservation it was started with); ``as declared`` counts what the manifest says
        now, serves it no longer declares at their last declared figure; ``only
        declared`` leaves those out.
        """
        declared = 0
        remembered = 0
        gone: list[str] = []
        lowered: list[str] = []
        for r in sorted(self.running.values(), key=lambda r: r.t):
            if self._role_of(r.serve, ev.t) != role:
                continue
            now = model.serves.get(r.serve)
            if now is not None:
                declared += now.mib
                if r.mib > now.mib:
                    lowered.append(f"{r.serve} {r.mib}>{now.mib}")
            else:
                last = self._last_decl(r.serve, ev.t)
                remembered += last.mib if last is not None else r.mib
                gone.append(r.serve)
        tags = []
        if gone:
            tags.append(f"[counts serves no longer declared, still running: {', '.join(gone)}]")
        if lowered:
            tags.append(f"[counts reservations above today's declaration: {', '.join(lowered)}]")
        figures = (
            f" (at start {self.held(role, model, t=ev.t)}, as declared {declared + remembered}, "
            f"only declared {declared})"
        )
        return " ".join([*tags, summary]) + figures

    def _describe(self, role: str, model: Model, t: int, held: int, budget: int) -> str:
        parts = []
        for r in sorted(self.running.values(), key=lambda r: r.t):
            if self._role_of(r.serve, t) != role:
                continue
            now = model.serves.get(r.serve)
            declared = "undeclared" if now is None else f"declared {now.mib}"
            parts.append(f"{r.serve}={r.mib}({declared}, by {r.cause})")
        return f"role {role}: {held} of {budget} MiB held: " + ", ".join(parts)

    # ── lists ────────────────────────────────────────────────────────────────
    def _list(self, item: ListItem) -> None:
        ours = set(self.running)
        since = (item.since or item.t) - NS // 10
        moving = {cid for cid, t in self._last_event.items() if t >= since}
        missing = ((ours - item.running) | (item.running - ours)) - moving
        persistent = missing & self._list_misses
        for cid in sorted(persistent):
            name = (item.names or {}).get(cid) or (
                self.running[cid].name if cid in self.running else cid[:12]
            )
            way = (
                "the events say it runs, the list does not"
                if cid in ours
                else ("the list says it runs, the events do not")
            )
            self.violations.append(
                Violation(
                    "monitor_gap",
                    item.t,
                    name,
                    f"two container lists in a row disagree with the events: {way}",
                )
            )
        self._list_misses = missing - persistent


def _matches(ref: str, cid: str, name: str) -> bool:
    ref = ref.lstrip("/")
    return bool(ref) and (ref == name or (len(ref) >= 12 and cid.startswith(ref)))


class Timeline:
    """Items from several threads, handed to a :class:`Monitor` in time order.

    An item is processed once it is ``watermark_s`` old, so one that was stamped
    earlier but arrived later (another thread, Docker's event latency) still sorts in
    first. ``flush`` processes everything (at the end of a campaign).
    """

    def __init__(self, monitor: Monitor, watermark_s: float = 3.0) -> None:
        self.monitor = monitor
        self.watermark_ns = int(watermark_s * NS)
        self._heap: list[tuple[int, int, Item]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True, name="chaos-timeline")

    def put(self, item: Item) -> None:
        with self._lock:
            heapq.heappush(self._heap, (item.t, next(self._seq), item))

    def start(self) -> None:
        self._thread.start()

    def _drain(self, upto: int) -> None:
        with self._lock:
            while self._heap and self._heap[0][0] <= upto:
                _, _, item = heapq.heappop(self._heap)
                self.monitor.process(item)

    def _pump(self) -> None:
        while not self._stop.wait(0.1):
            self._drain(time.time_ns() - self.watermark_ns)

    def flush(self) -> None:
        """Wait out the watermark, then process everything that is in."""
        time.sleep(self.watermark_ns / NS + 0.2)
        self._stop.set()
        self._thread.join(5)
        self._drain(2**63)

    def locked(self, fn: Callable[[Monitor], object]) -> object:
        with self._lock:
            return fn(self.monitor)
