"""The budget monitor: Docker's events, replayed in time order, against the declared budget.

The monitor is fed five kinds of items, each stamped with the host's wall clock in
nanoseconds (Docker's ``timeNano`` is the same clock on the same host):

* :class:`ModelItem` — the manifest the test *means* (the driver's model, never a
  half-written file): per serve its role (or its ``placement`` candidates) and
  reservation, per role (a card) its budget;
* :class:`RequestItem` — a container ``start`` or ``create`` request, either seen on
  the controller's Docker socket (``who="controller"``, with Docker's status code once
  the answer passed) or made by the driver itself (``who="outside"``);
* :class:`EventItem` — a container event (``start``, ``die``, ``destroy``), with the
  card the container was created for where it says (its ``VRAMCTL_GPU_ROLE``, which
  the campaign's ``up`` also writes in a label, so that Docker's events carry it);
* :class:`ListItem` — a fresh container list (which containers run), to cross-check
  what the events said;
* :class:`LedgerItem` — what the controller's ``GET /v1/ledger`` counted on each
  role (its journaled cycles' ledgers come with :class:`ControllerView`).

Items are processed strictly in time order (:class:`Timeline` holds them back for a
short watermark so that late arrivals from other threads sort in first). The
monitor keeps the running containers, each with its *cause* (who started it), the
reservation it was started with and the card it runs on. A running container counts
``max(reservation it was started with, what the model declares now)``: a running
engine may hold what it was started with, whatever the manifest now says. It counts on
the card it was created for, whatever its serve declares now (a container made for an
old card and started again runs on the old card); where that is not known (a container
made without the variable), on every card its serve's last declaration names (a placed
serve's: all its candidates, as the controller's ledger counts it).

Findings (:class:`Violation`), judged at the end (:meth:`Monitor.judge`) against the
controller's own records (:class:`ControllerView`: its journaled cycles, each with the
manifest it planned under and the reservations it held, the container lists it asked
Docker for, and when each of its ``up`` commands began), with no time window:

* ``overcommit`` — a start the controller made took a role over budget (as the model
  counts it) and the controller's own view does not explain it. That view is the one of
  its *last admission*: of the controller's starts that run at that moment, the one whose
  last look at the host (its last container list before its Docker call, or before its
  ``up`` began) came last, and the journaled cycle that planned it (else the latest
  before that look). Under that cycle's manifest, every running container is counted at
  the largest of its declaration there, the start reservation the cycle's observation
  recorded for it, the reservation of a start in progress, and (a start of the
  controller) what the plan that started it reserved; a container the driver started
  *after* that last look is left out (the controller could not have seen it). Within
  the budget of that manifest: the start is ``excused`` (a note that names the cycle,
  the manifest and what it left out); over it, or with no journaled cycle before the
  look: an overcommit (a start with no look before it has its own call for a look). A
  start the driver made that overcommits is ``outside_overcommit``: reported, never the
  controller's fault;
* ``double_start`` — a second running container of one serve; a start of a container
  that already runs; the controller's start (Docker answered 304) or ``up`` create (409)
  of a serve whose container the driver started before the controller's last look (else
  a ``redundant_start`` note);
* ``own_view_over`` (a note) — a controller start within budget as the model counts it
  that its own view, recounted as above, puts over (every controller start is
  recounted, so that the count runs on real records in every campaign);
* ``wrong_card`` — the controller started a container made for another card than the
  one the journaled cycle that planned the start (as above) chose for it: a container
  made for an old card, started again after a re-pin or a move;
* ``double_count`` — one of the controller's ledgers (a ``GET /v1/ledger`` answer, a
  journaled cycle's) counts a serve on two or more roles while one container of it
  runs, created for a known card, from before the ledger's observation until the
  ledger was read, and no other; in two observations in a row of one source (one
  alone is a ``double_count_once`` note). A serve the answer may rightly count twice
  for a moment is left out: a step of it in flight or done since the observation (the
  API's ``in_flight`` and ``since_observed``), a start in progress, memory not back;
* ``unattributed`` — a start that neither the controller's socket nor the driver
  requested: the harness cannot say whose it is (a harness gap; it fails the test);
* ``monitor_gap`` — a container list disagreed with the events twice in a row.

What stays uncertain leans toward blame, never toward an excuse: a look is the moment
the list's answer reached the proxy, so a container Docker started while it was taking
the list counts as seen; a list another thread of the controller had answered between
a start's own list and its call counts as that start's look.

The module is plain Python (no Docker) so a synthetic event feed can drive it.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

NS = 1_000_000_000

Who = Literal["controller", "outside"]


@dataclass(frozen=True)
class ServeDecl:
    """What the model declares for one serve: its pinned ``role``, or the ``placement``
    candidates it may run on (its ``role`` is then empty)."""

    role: str
    mib: int
    up_delay_s: float = 0.0  # an `up` that waits before it creates: widens the race window
    placement: tuple[str, ...] = ()

    @property
    def cards(self) -> tuple[str, ...]:
        """The cards the manifest lets the serve run on: its candidates, else its role."""
        return self.placement or (self.role,)


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
    kind: Literal["start", "create", "list"]  # a list is no start: the proxy's own
    ref: str  # a container name or id (a prefix of the id), as the request named it
    status: int | None = None  # Docker's answer; None: not (yet) seen


@dataclass
class EventItem:
    t: int
    action: str
    cid: str
    name: str
    serve: str
    card: str = ""  # the card the container was created for (its VRAMCTL_GPU_ROLE); "": unknown


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


@dataclass(frozen=True)
class LedgerItem:
    """What one of the controller's ledgers counts: a ``GET /v1/ledger`` answer read at
    ``t`` (``source="api"``) or a journaled cycle's ``ledger_before``, planned at ``t``
    (``source="journal"``); both count from the observation taken at ``observed_at``.

    ``busy``: serves the answer may count twice for a moment and be right (a step in
    flight, held or released since the observation, a start in progress, memory not
    back after a stop).
    """

    t: int
    source: str
    observed_at: int
    counted: Mapping[str, tuple[str, ...]]  # serve -> the roles its reservations are on
    busy: frozenset[str] = frozenset()


Item = ModelItem | RequestItem | EventItem | ListItem | LedgerItem


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
    by_up: bool = False  # started by the controller's `up` (its `docker run`), not itself
    card: str = ""  # the card it was created for (its VRAMCTL_GPU_ROLE); "": unknown
    end: int | None = None  # its die (or destroy) event; None: still runs


@dataclass(frozen=True)
class Violation:
    kind: str
    t: int
    serve: str
    detail: str
    request_t: int = 0  # when the start was asked for (0: not a start)


@dataclass(frozen=True)
class Cycle:
    """One cycle the controller journaled: when it planned, under which manifest, with what.

    ``started_with`` (container -> MiB) and ``starting`` (serve -> MiB) are the
    reservations its observation recorded; ``reserved`` (serve -> MiB) what its plan
    reserved for each start it planned, and ``cards`` (serve -> roles) where.
    """

    at: int
    model: Model
    digest: str = ""
    started_with: Mapping[str, int] = field(default_factory=dict)
    starting: Mapping[str, int] = field(default_factory=dict)
    reserved: Mapping[str, int] = field(default_factory=dict)
    cards: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ControllerView:
    """The controller's own records, to judge its starts by (see the module).

    ``cycles`` oldest first; ``looks``: when the answer of each container list it asked
    Docker for reached the proxy; ``spawns``: per serve, when each of its ``up``
    commands began; ``ledgers``: what its journaled cycles' ledgers counted.
    """

    cycles: Sequence[Cycle] = ()
    looks: Sequence[int] = ()
    spawns: Mapping[str, Sequence[int]] = field(default_factory=dict)
    ledgers: Sequence[LedgerItem] = ()

    def call_t(self, by_up: bool, serve: str, request_t: int) -> int:
        """When the controller made the call behind a request: its ``up`` began, or the
        request itself (a ``docker start``, or an ``up`` whose beginning is not known)."""
        if not by_up:
            return request_t
        began = _last_at_or_before(sorted(self.spawns.get(serve, ())), request_t)
        return request_t if began is None else began

    def look(self, call_t: int) -> int:
        """The controller's last look at the host before ``call_t`` (none: the call)."""
        found = _last_at_or_before(self.looks, call_t)
        return call_t if found is None else found

    def look_of(self, r: RunRecord) -> int:
        return self.look(self.call_t(r.by_up, r.serve, r.request_t))

    def cycle_at(self, t: int) -> Cycle | None:
        """The latest cycle the controller planned at or before ``t``."""
        i = bisect.bisect_right([c.at for c in self.cycles], t)
        return self.cycles[i - 1] if i else None

    def planned(self, serve: str, t: int) -> Cycle | None:
        """The latest cycle at or before ``t`` whose plan reserved a start of ``serve``."""
        for c in reversed(self.cycles):
            if c.at <= t and serve in c.reserved:
                return c
        return None


def _last_at_or_before(times: Sequence[int], t: int) -> int | None:
    i = bisect.bisect_right(times, t)
    return times[i - 1] if i else None


@dataclass(frozen=True)
class _Candidate:
    """A controller start, to be recounted in the controller's own view."""

    start: RunRecord
    role: str
    running: tuple[RunRecord, ...]  # on the role, the start among them
    why: str  # what the model's count says
    over: bool = True  # over budget as the model counts it


@dataclass(frozen=True)
class _Suspect:
    """A ledger answer counting a serve on several roles while one container of it runs."""

    run: RunRecord
    roles: tuple[str, ...]
    answer: LedgerItem


@dataclass(frozen=True)
class _Rerun:
    """The controller asked to start a container that ran already (304, or 409)."""

    request: RequestItem
    run: RunRecord
    how: str


@dataclass
class Monitor:
    """Per-role running reservations, attribution of starts, the findings."""

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
    t0: int | None = None  # the first item's time: reports count from it
    candidates: list[_Candidate] = field(default_factory=list)  # judged by :meth:`judge`
    recounted: int = 0  # controller starts :meth:`judge` recounted in their own view
    reruns: list[_Rerun] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)  # every run, in start order
    ledgers: list[LedgerItem] = field(default_factory=list)  # the API's, judged at the end
    _list_misses: set[str] = field(default_factory=set)
    _last_event: dict[str, int] = field(default_factory=dict)

    # ── inputs ──────────────────────────────────────────────────────────────
    def process(self, item: Item) -> None:
        self.last_t = max(self.last_t, item.t)
        if self.t0 is None:
            self.t0 = item.t
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
                run = self.running.pop(item.cid, None)
                if run is not None:
                    run.end = item.t
        elif isinstance(item, LedgerItem):
            self.ledgers.append(item)
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

    def _decl(self, serve: str, t: int) -> ServeDecl | None:
        model = self.model_at(t)
        return None if model is None else model.serves.get(serve)

    def _last_decl(self, serve: str, t: int) -> ServeDecl | None:
        for mt, model in reversed(self.models):
            if mt <= t and serve in model.serves:
                return model.serves[serve]
        return None

    # ── what the roles hold ──────────────────────────────────────────────────
    def _cards_of(self, r: RunRecord, t: int) -> tuple[str, ...]:
        """The cards a run counts on: the one its container was created for, else every
        card its serve's last declaration names (a placed serve's: all its candidates)."""
        if r.card:
            return (r.card,)
        decl = self._last_decl(r.serve, t)
        return () if decl is None else decl.cards

    def held(self, role: str, model: Model, *, t: int) -> int:
        """MiB the running containers hold on ``role`` under ``model``."""
        total = 0
        for r in self.running.values():
            if role not in self._cards_of(r, t):
                continue
            now = model.serves.get(r.serve)
            total += max(r.mib, now.mib if now is not None else 0)
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
        self.reruns.append(_Rerun(item, run, how))

    # ── starts ───────────────────────────────────────────────────────────────
    def _attribute(self, ev: EventItem) -> tuple[str, int, bool]:
        """Who started it, when it was asked for, and whether by an ``up``: the executor
        starts a container by its name, an ``up``'s ``docker run`` by the id it created."""
        mine = [p for p in self.pending if p.t <= ev.t and _matches(p.ref, ev.cid, ev.name)]
        self.pending = [p for p in self.pending if p not in mine]
        if not mine:
            return "unattributed", ev.t, False
        confirmed = [p for p in mine if p.who == "controller" and p.status is not None]
        chosen = min(confirmed or mine, key=lambda p: p.t)
        by_up = chosen.who == "controller" and chosen.ref.lstrip("/") != ev.name
        return chosen.who, chosen.t, by_up

    def _start(self, ev: EventItem) -> None:
        cause, req_t, by_up = self._attribute(ev)
        self.starts[cause] = self.starts.get(cause, 0) + 1
        self._double_start(ev, cause)
        decl = self._decl(ev.serve, ev.t)
        last = decl or self._last_decl(ev.serve, ev.t)
        mib = last.mib if last else 0
        run = RunRecord(ev.cid, ev.name, ev.serve, cause, ev.t, mib, req_t, by_up, ev.card)
        self.running[ev.cid] = run
        self.last_run[ev.name] = run
        self.runs.append(run)
        if cause == "unattributed":
            self.violations.append(
                Violation(
                    "unattributed", ev.t, ev.serve, f"nobody asked for the start of {ev.name}"
                )
            )
        if last is None:
            return
        for role in self._cards_of(run, ev.t):
            self._count_start(run, role)

    def _double_start(self, ev: EventItem, cause: str) -> None:
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

    def _count_start(self, run: RunRecord, role: str) -> None:
        """What ``run``'s start makes ``role`` hold: a candidate (the controller's), or an
        ``outside_overcommit`` note (the driver's, over budget)."""
        model = self.model_at(run.t)
        if model is None or role not in model.budgets:
            return
        budget = model.budgets[role]
        held = self.held(role, model, t=run.t)
        self.max_held[role] = max(self.max_held.get(role, 0), held)
        summary = self._describe(role, model, run.t, held, budget)
        if run.cause == "controller":  # every one is recounted in its own view (:meth:`judge`)
            running = tuple(r for r in self.running.values() if role in self._cards_of(r, run.t))
            over = held > budget
            why = self._why(role, model, run.t, summary) if over else summary
            self.candidates.append(_Candidate(run, role, running, why, over))
        elif run.cause == "outside" and held > budget:
            self.notes.append(Violation("outside_overcommit", run.t, run.serve, summary))

    def _why(self, role: str, model: Model, t: int, summary: str) -> str:
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
            if role not in self._cards_of(r, t):
                continue
            now = model.serves.get(r.serve)
            if now is not None:
                declared += now.mib
                if r.mib > now.mib:
                    lowered.append(f"{r.serve} {r.mib}>{now.mib}")
            else:
                last = self._last_decl(r.serve, t)
                remembered += last.mib if last is not None else r.mib
                gone.append(r.serve)
        tags = []
        if gone:
            tags.append(f"[counts serves no longer declared, still running: {', '.join(gone)}]")
        if lowered:
            tags.append(f"[counts reservations above today's declaration: {', '.join(lowered)}]")
        figures = (
            f" (at start {self.held(role, model, t=t)}, as declared {declared + remembered}, "
            f"only declared {declared})"
        )
        return " ".join([*tags, summary]) + figures

    def _describe(self, role: str, model: Model, t: int, held: int, budget: int) -> str:
        parts = []
        for r in sorted(self.running.values(), key=lambda r: r.t):
            if role not in self._cards_of(r, t):
                continue
            now = model.serves.get(r.serve)
            declared = "undeclared" if now is None else f"declared {now.mib}"
            made = ""  # the card, where its serve does not name that card alone
            if r.card and (now is None or r.card not in now.cards):
                made = f", made for {r.card}"
            elif r.card and now is not None and now.placement:
                made = f", on {r.card}"
            parts.append(f"{r.serve}={r.mib}({declared}, by {r.cause}{made})")
        return f"role {role}: {held} of {budget} MiB held: " + ", ".join(parts)

    # ── judgement, against the controller's own records ─────────────────────────
    def judge(self, view: ControllerView) -> Monitor:
        """Turn the candidates into overcommits or ``excused`` notes, and the controller's
        starts of running containers into double starts or ``redundant_start`` notes,
        by ``view`` (see the module). Call it once, after the last item."""
        for c in self.candidates:
            verdict, text = self._judge_start(c, view)
            self.recounted += 1
            if not c.over:  # within budget in fact: its own view over it is only said
                if verdict:
                    self.notes.append(Violation("own_view_over", c.start.t, c.start.serve, text))
                continue
            kind = "overcommit" if verdict else "excused"
            found = Violation(kind, c.start.t, c.start.serve, text, c.start.request_t)
            (self.violations if verdict else self.notes).append(found)
        for rr in self.reruns:
            self._judge_rerun(rr, view)
        self._judge_counts([*self.ledgers, *view.ledgers])
        self._judge_cards(view)
        self.candidates, self.reruns = [], []
        self.violations.sort(key=lambda v: v.t)
        return self

    def _judge_start(self, c: _Candidate, view: ControllerView) -> tuple[bool, str]:
        """(the controller's fault, the detail): the count of its last admission's view."""
        ctrl = [r for r in c.running if r.cause == "controller"]
        last = max(ctrl, key=view.look_of)
        look = view.look_of(last)
        at = f"its last look at {self._s(look)} (for {last.serve}'s start)"
        # the manifest that start was admitted under: the cycle that planned it
        cycle = view.planned(last.serve, look) or view.cycle_at(look)
        if cycle is None:
            return True, f"[no journaled cycle before {at}] {c.why}"
        budget = cycle.model.budgets.get(c.role)
        manifest = f"cycle at {self._s(cycle.at)}, manifest {cycle.digest[:12] or '?'}"
        if budget is None:
            return True, f"[{manifest} declares no role {c.role}] {c.why}"
        terms: list[str] = []
        unseen: list[str] = []
        total = 0
        for r in sorted(c.running, key=lambda r: r.t):
            if r.cause == "outside" and r.t > look:
                unseen.append(f"{r.serve} started {self._s(r.t)}")
                continue
            mib = self._as_counted(r, cycle, view)
            total += mib
            terms.append(f"{r.serve} {mib}")
        count = f"{' + '.join(terms)} = {total} of {budget} MiB"
        left = f"; left out, started after it: {', '.join(unseen)}" if unseen else ""
        if total <= budget:
            return False, f"{c.why}; the controller's view at {at}, {manifest}: {count}{left}"
        return True, f"{c.why}; even as the controller saw it at {at}, {manifest}: {count}{left}"

    def _s(self, t: int) -> str:
        """A time of the feed for a report: seconds since its first item."""
        return f"{(t - (self.t0 or 0)) / NS:.3f}s"

    @staticmethod
    def _as_counted(r: RunRecord, cycle: Cycle, view: ControllerView) -> int:
        """What the controller's view at ``cycle`` counts ``r`` at (see the module)."""
        decl = cycle.model.serves.get(r.serve)
        figures = [
            decl.mib if decl is not None else None,
            cycle.started_with.get(r.name),
            cycle.starting.get(r.serve),
        ]
        if r.cause == "controller":
            planned = view.planned(r.serve, view.look_of(r))
            figures.append(planned.reserved[r.serve] if planned is not None else None)
        known = [f for f in figures if f is not None]
        return max(known) if known else r.mib  # nothing the controller knew: the model's

    def _judge_rerun(self, rr: _Rerun, view: ControllerView) -> None:
        item, run = rr.request, rr.run
        look = view.look(view.call_t(item.kind == "create", run.serve, item.t))
        seen = run.cause == "outside" and run.t <= look
        text = (
            f"the controller started {run.name} ({rr.how}) while it ran since {self._s(run.t)}, "
            f"started by {run.cause}; its last look at {self._s(look)}"
            + (" showed it running" if seen else "")
        )
        kind = "double_start" if seen else "redundant_start"
        (self.violations if seen else self.notes).append(Violation(kind, item.t, run.serve, text))

    def _judge_cards(self, view: ControllerView) -> None:
        """``wrong_card`` (see the module): each start of the controller against the card
        the cycle that planned it chose."""
        for r in self.runs:
            if r.cause != "controller" or not r.card:
                continue
            cycle = view.planned(r.serve, view.look_of(r))
            told = cycle.cards.get(r.serve) if cycle is not None else None
            if cycle is None or not told or r.card in told:
                continue
            how = "its `up` made it" if r.by_up else "a docker start of the container"
            text = (
                f"the controller started {r.name}, made for {r.card} ({how}), for the start "
                f"its cycle at {self._s(cycle.at)} (manifest {cycle.digest[:12] or '?'}) "
                f"planned on {'/'.join(told)}"
            )
            self.violations.append(Violation("wrong_card", r.t, r.serve, text, r.request_t))

    # ── double counts: the controller's ledgers against the run history ──────────
    def _judge_counts(self, answers: Sequence[LedgerItem]) -> None:
        """``double_count`` (see the module): the suspects of each answer, then, per
        source, those two of its observations in a row show (one alone: a note)."""
        by_source: dict[str, dict[int, dict[str, _Suspect]]] = {}
        for a in answers:
            found = by_source.setdefault(a.source, {}).setdefault(a.observed_at, {})
            found.update(self._suspects(a))
        for observations in by_source.values():
            self._persisting(observations)

    def _suspects(self, a: LedgerItem) -> dict[str, _Suspect]:
        """Serves ``a`` counts on several roles, not busy, with one run of theirs from
        before its observation to its answer and none other, created for a known card."""
        out: dict[str, _Suspect] = {}
        for serve, roles in a.counted.items():
            if len(roles) < 2 or serve in a.busy:
                continue
            runs = [
                r
                for r in self.runs
                if r.serve == serve and r.t <= a.t and (r.end is None or r.end >= a.observed_at)
            ]
            if len(runs) != 1:
                continue
            (r,) = runs
            if r.card and r.t <= a.observed_at and (r.end is None or r.end >= a.t):
                out[serve] = _Suspect(r, roles, a)
        return out

    def _persisting(self, observations: Mapping[int, Mapping[str, _Suspect]]) -> None:
        prev: Mapping[str, _Suspect] = {}
        told: set[tuple[str, str, int]] = set()
        for at in sorted(observations):
            now = observations[at]
            for serve, sus in now.items():
                before = prev.get(serve)
                key = (serve, sus.run.cid, sus.run.t)  # one run: a restart is another
                if before is not None and before.run is sus.run and key not in told:
                    told.add(key)
                    text = self._count_text(sus, before)
                    self.violations.append(Violation("double_count", sus.answer.t, serve, text))
            prev = now
        for now in observations.values():
            for serve, sus in now.items():
                if (serve, sus.run.cid, sus.run.t) not in told:
                    told.add((serve, sus.run.cid, sus.run.t))
                    text = self._count_text(sus, None)
                    self.notes.append(Violation("double_count_once", sus.answer.t, serve, text))

    def _count_text(self, sus: _Suspect, before: _Suspect | None) -> str:
        a, r = sus.answer, sus.run
        decl = self._last_decl(r.serve, a.observed_at)
        declared = (
            "nothing"
            if decl is None
            else (
                f"placement {list(decl.placement)}" if decl.placement else f"gpu_role {decl.role}"
            )
        )
        again = (
            f" (and in the observation at {self._s(before.answer.observed_at)} before it)"
            if before is not None
            else ""
        )
        return (
            f"the controller's {a.source} ledger of the observation at {self._s(a.observed_at)}"
            f"{again}, read at {self._s(a.t)}, counts {r.serve} on {', '.join(sus.roles)} while "
            f"one container of it runs, {r.name}, created for {r.card} (started "
            f"{self._s(r.t)} by {r.cause}); the manifest then declared {declared}"
        )

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
