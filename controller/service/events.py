"""The event bus: what the controller does, as a stream of numbered events (``GET /v1/events``).

Every event has a sequence number (``id``, strictly increasing in this process), a
``kind``, a wall-clock timestamp (``at``, epoch seconds) and a JSON payload (``data``).
The kinds and their payloads are a contract, listed in docs/operations.md ("Event
stream"); :data:`KINDS` names them. Publishers are the places where things happen:

- ``lifecycle`` — the executor's one place that applies a lifecycle transition
  (``controller.service.steps.lifecycle.move``): serve, from, to, trigger;
- ``plan.begun`` / ``plan.ended`` — the loop hands a plan to the executor, and the
  executor returns (``pending`` names the starts still running beside the loop: their
  ``step`` events follow);
- ``step`` — each step's outcome, as the executor logs it;
- ``ledger`` — a role's committed / free as the controller counts it, only when they
  change: at each observation and after each step of a plan;
- ``request.admitted`` / ``request.refused`` / ``request.ended`` — the API's ``up`` and
  ``down``; ``request.closed`` — the loop closes a request's record (it ended or
  expired and its serve is down, or its serve is gone); other request kinds
  (``request.queued``) are published with :meth:`EventBus.publish` the same way;
- ``drift`` — an alarm raised or cleared, edge-triggered, from each observation
  (:class:`DriftWatch`).

Delivery, chosen so that nobody waits on a reader:

- :meth:`EventBus.publish` is thread-safe (the loop, the executor and the start
  threads publish; the API reads on its event loop) and never blocks: it appends to a
  bounded ring of recent events and offers the event to each subscriber's bounded
  queue, then wakes the subscriber's event loop with ``call_soon_threadsafe``.
- A subscriber that falls behind (its queue is full) is **not dropped**: its queue is
  emptied and it is marked behind; its next read replays from the ring what it has
  not seen, preceded by a ``gap`` item when the ring no longer holds all of it.
- A subscription opened with ``last_id`` (``Last-Event-ID``) first gets every event
  after that id still in the ring; when the ring no longer holds the one right after
  it (or the id is one this process never issued), a ``gap`` item comes first, naming
  the first id it still has. Nothing is ever skipped without a ``gap``.
- :meth:`EventBus.close` ends every subscription (the controller is stopping).

Payload fields that may carry free text (a failed step's detail, a refusal's message)
are named in :attr:`Event.private`; the API withholds them from readers without the
token, as it withholds them on the other GETs.

This module decides nothing and touches nothing outside itself: no docker, no journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from statemachine.answers.status_report import HostStatus, host_status
from statemachine.domain.types import DesiredState, Observed
from statemachine.ledger.reservations import Ledger, ledger_from_observed

#: The event kinds this controller publishes (the contract of docs/operations.md).
KINDS: Final = frozenset(
    {
        "lifecycle",
        "plan.begun",
        "plan.ended",
        "step",
        "ledger",
        "request.admitted",
        "request.refused",
        "request.queued",
        "request.ended",
        "request.closed",
        "drift",
    }
)

#: Recent events kept for ``Last-Event-ID`` resume.
DEFAULT_BUFFER = 2048
#: Events one subscriber may have waiting before it is marked behind.
DEFAULT_QUEUE = 512


@dataclass(frozen=True, slots=True)
class Event:
    """One published event; ``private`` names the payload keys that may hold free text."""

    id: int
    kind: str
    at: float
    data: Mapping[str, Any]
    private: frozenset[str] = frozenset()

    def to_json(self, *, full: bool = True) -> dict[str, Any]:
        """The JSON form; without ``full`` the private fields are ``null`` and listed."""
        data = dict(self.data)
        withheld = sorted(k for k in self.private if k in data and data[k] is not None)
        if not full:
            for key in withheld:
                data[key] = None
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "at": self.at, "data": data}
        if not full and withheld:
            out["withheld"] = withheld
        return out


@dataclass(frozen=True, slots=True)
class Gap:
    """Events a reader asked for or fell behind on are gone from the ring.

    ``after`` is the last id the reader had, ``first`` the first id the ring still
    holds (the next event the reader gets), ``missed`` how many events it will not
    see (``None`` when unknown: an id this process never issued).
    """

    after: int
    first: int
    missed: int | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        """The JSON form (the ``gap`` event's data)."""
        return {
            "after": self.after,
            "first": self.first,
            "missed": self.missed,
            "reason": self.reason,
        }


Item = Event | Gap


class Subscription:
    """One reader of the bus: its bounded queue, read on one asyncio event loop."""

    def __init__(
        self,
        bus: EventBus,
        loop: asyncio.AbstractEventLoop,
        limit: int,
        replay: list[Item],
        last_id: int,
    ) -> None:
        self._bus = bus
        self._loop = loop
        self._limit = limit
        self._items: deque[Item] = deque(replay)
        self._behind = False
        self._closed = False
        self._wake = asyncio.Event()
        #: the id of the last event handed out (or the bus's last id when it opened)
        self.last_id = last_id
        if replay:
            self._wake.set()

    # called by the bus, under its lock, on any thread
    def _offer(self, event: Event) -> None:
        if self._behind or self._closed:
            return
        if len(self._items) >= self._limit:
            self._items.clear()
            self._behind = True
        else:
            self._items.append(event)
        self._notify()

    def _close(self) -> None:
        self._closed = True
        self._notify()

    def _notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # the reader's loop has ended
            self._loop.call_soon_threadsafe(self._wake.set)

    @property
    def closed(self) -> bool:
        """True once the bus closed (nothing more will come after what is queued)."""
        return self._closed

    def pending(self) -> int:
        """How many items wait to be read (at most the queue's bound, plus a replay)."""
        with self._bus._lock:
            return len(self._items)

    def take(self) -> list[Item]:
        """Everything ready now (non-blocking); a reader that fell behind catches up here."""
        with self._bus._lock:
            self._wake.clear()
            if self._behind:
                self._behind = False
                self._items = deque(self._bus._replay_locked(self.last_id, behind=True))
            items = list(self._items)
            self._items.clear()
        for item in items:
            # after a gap the reader goes on from the first id the ring still held
            self.last_id = item.id if isinstance(item, Event) else item.first - 1
        return items

    async def next(self, timeout_s: float) -> list[Item]:
        """What comes next; an empty list after ``timeout_s`` of silence (a heartbeat)."""
        items = self.take()
        if items or self._closed:
            return items
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        return self.take()

    def close(self) -> None:
        """Stop reading: the bus forgets this subscription."""
        self._bus._unsubscribe(self)


@dataclass
class EventBus:
    """The in-process event bus (see the module docstring). Thread-safe."""

    buffer: int = DEFAULT_BUFFER
    queue: int = DEFAULT_QUEUE
    #: the id of the first event: a controller starts it past any id an earlier one
    #: issued (its start time in milliseconds), so a reader's ``Last-Event-ID`` from
    #: before a restart reads as a gap, never as a position in this process's stream
    first_id: int = 1
    clock: Callable[[], float] = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _ring: deque[Event] = field(init=False, repr=False)
    _subs: list[Subscription] = field(default_factory=list, init=False, repr=False)
    _last: int = field(init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.buffer < 1 or self.queue < 1:
            raise ValueError("the event buffer and queue hold at least one event")
        self._ring = deque(maxlen=self.buffer)
        self._last = self.first_id - 1

    @property
    def last_id(self) -> int:
        """The id of the last event published (``first_id - 1`` before any)."""
        with self._lock:
            return self._last

    def publish(self, kind: str, *, private: Iterable[str] = (), **data: Any) -> Event:
        """Publish one event (any thread; never blocks on a reader) and return it.

        ``data`` must be JSON-serialisable; ``private`` names its free-text keys.
        """
        at = self.clock()
        with self._lock:
            event = Event(
                self._last + 1, kind, at, MappingProxyType(dict(data)), frozenset(private)
            )
            self._last = event.id
            self._ring.append(event)
            for sub in self._subs:
                sub._offer(event)
        return event

    def recent(self) -> list[Event]:
        """The events the ring holds, oldest first."""
        with self._lock:
            return list(self._ring)

    def subscribe(
        self, last_id: int | None = None, *, loop: asyncio.AbstractEventLoop | None = None
    ) -> Subscription:
        """A new reader on ``loop`` (default: the running one).

        ``last_id`` (``Last-Event-ID``): the reader gets every event after it first
        (with a ``gap`` before them where the ring lost some); ``None``: only new ones.
        """
        aio = loop or asyncio.get_running_loop()
        with self._lock:
            replay = [] if last_id is None else self._replay_locked(last_id, behind=False)
            start = self._last if last_id is None else last_id
            sub = Subscription(self, aio, self.queue, replay, start)
            if self._closed:
                sub._closed = True
            else:
                self._subs.append(sub)
        return sub

    def close(self) -> None:
        """End every subscription; later subscriptions end at once (after their replay)."""
        with self._lock:
            self._closed = True
            subs, self._subs = self._subs, []
            for sub in subs:
                sub._close()

    def subscribers(self) -> int:
        """How many readers are subscribed now."""
        with self._lock:
            return len(self._subs)

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._subs.remove(sub)

    def _replay_locked(self, after: int, *, behind: bool) -> list[Item]:
        """The ring's events after ``after``, with a gap first where some are gone."""
        if after > self._last or after < self.first_id - 1:
            first = self._ring[0].id if self._ring else self._last + 1
            gap = Gap(
                after,
                first,
                None,
                f"event {after} was not issued by this controller (it restarted since, or "
                f"the id is wrong): the stream goes on from {first}",
            )
            return [gap, *self._ring]
        events = [e for e in self._ring if e.id > after]
        first = events[0].id if events else self._last + 1
        if first <= after + 1:
            return list(events)
        why = (
            "the reader fell behind (its queue was full)"
            if behind
            else "the events after it are no longer kept"
        )
        return [Gap(after, first, first - after - 1, why), *events]


# ── watchers: publish only what changed ─────────────────────────────────────


@dataclass
class LedgerWatch:
    """Publishes a ``ledger`` event per role whose committed or free changed.

    Fed the ledger as the controller counts it at each point (an observation, a step of
    a plan); the first figures it sees are published as they are (``before`` null).
    Thread-safe: the executor's start threads feed it too.
    """

    bus: EventBus
    _last: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def feed(self, ledger: Ledger, source: str) -> None:
        """Publish what changed since the last ledger fed (``source`` says which count)."""
        with self._lock:
            for role in ledger.roles:
                v = ledger.view(role)
                now = (v.committed_mib, v.free_mib)
                before = self._last.get(role)
                if before == now:
                    continue
                self._last[role] = now
                self.bus.publish(
                    "ledger",
                    gpu_role=role,
                    committed_mib_before=None if before is None else before[0],
                    committed_mib=now[0],
                    free_mib_before=None if before is None else before[1],
                    free_mib=now[1],
                    budget_mib=v.budget_mib,
                    source=source,
                )


#: A role's NVML used over its committed by more than this is an alarm (the metrics'
#: ``VramctlDriftHigh`` rule uses the same figure, docs/operations.md).
DRIFT_ALARM_MIB: Final = 1024


def drift_alarms(status: HostStatus) -> dict[str, dict[str, Any]]:
    """The alarms an observation raises, keyed by what they are about.

    A role overcommitted (committed over its budget); a role whose NVML used exceeds
    its committed by more than :data:`DRIFT_ALARM_MIB` (memory drawn outside the
    ledger); a serve whose NVML figure exceeds its reservation; a GPU container no
    manifest declares. Unknown figures raise nothing (and clear nothing: see
    :class:`DriftWatch`).
    """
    out: dict[str, dict[str, Any]] = {}
    for r in status.roles:
        role = r.ledger.gpu_role
        if r.overcommitted:
            out[f"role:{role}:overcommitted"] = {
                "alarm": "overcommitted",
                "gpu_role": role,
                "committed_mib": r.ledger.committed_mib,
                "budget_mib": r.ledger.budget_mib,
            }
        if r.drift_used_mib is not None and r.drift_used_mib > DRIFT_ALARM_MIB:
            out[f"role:{role}:drift"] = {
                "alarm": "role_drift",
                "gpu_role": role,
                "drift_mib": r.drift_used_mib,
                "nvml_used_mib": r.nvml_used_mib,
                "committed_mib": r.ledger.committed_mib,
            }
    for s in status.serves:
        if s.drift_mib is not None and s.drift_mib > 0:
            out[f"serve:{s.serve}:over"] = {
                "alarm": "serve_over_reservation",
                "serve": s.serve,
                "drift_mib": s.drift_mib,
                "nvml_used_mib": s.nvml_used_mib,
                "held_mib": s.held_mib,
                "reservation_mib": s.reservation_mib,
            }
    for name in status.undeclared_gpu:
        out[f"container:{name}:undeclared"] = {
            "alarm": "undeclared_gpu_container",
            "container": name,
        }
    return out


@dataclass
class DriftWatch:
    """Publishes ``drift`` events when an alarm is raised and when it clears.

    With docker or NVML unreadable the alarms that depend on them are unknown: an
    observation without them clears nothing.
    """

    bus: EventBus
    _raised: dict[str, dict[str, Any]] = field(default_factory=dict)

    def feed(self, status: HostStatus) -> None:
        """One observation's alarms against those raised before."""
        alarms = drift_alarms(status)
        for key, data in alarms.items():
            if key not in self._raised:
                self.bus.publish("drift", state="raised", **data)
            self._raised[key] = data
        if not (status.docker_ok and status.nvml_ok):
            return
        for key in [k for k in self._raised if k not in alarms]:
            data = self._raised.pop(key)
            self.bus.publish("drift", state="cleared", **data)


@dataclass
class ObservationWatch:
    """What each observation publishes: the ledger as observed, and the drift alarms."""

    ledger: LedgerWatch
    drift: DriftWatch

    def feed(self, desired: DesiredState, observed: Observed) -> None:
        """Publish what this observation changed (called once per cycle)."""
        self.ledger.feed(ledger_from_observed(desired, observed), "observation")
        self.drift.feed(host_status(desired, observed))
