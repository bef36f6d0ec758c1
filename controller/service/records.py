"""The store of the serve records: one :class:`~statemachine.lifecycle.serve_record.ServeRecord` per
serve.

The store keeps each serve's record, with its lifecycle state remembered in the journal
(table ``serve_records``): loaded when the controller starts, so a serve's lifecycle
state survives a restart and is moved on from there, never re-derived. It is moved
forward

- by observation (:meth:`RecordStore.observe`, once per observation of the loop): each
  record along the declared path to what its container shows
  (:func:`statemachine.lifecycle.serve_record.observe`);
- by execution: the executor takes its machines from the records
  (:meth:`RecordStore.machines`, each moved to the plan's reading of its container) and
  the machines' states after the plan come back (:meth:`RecordStore.settle`).

Status, the API, metrics and the page read the records through the loop's view
(:meth:`RecordStore.snapshot`). The loop's per-serve marks (backoff, no sleep, no
shrink, tiers left quiesced, releases not yet confirmed, its own stops, healthy runs
seen) are fields of the records too, read and written through set- and dict-like views
(:class:`MarkSet`, :class:`FieldMap`) so no copy of them lives anywhere else; only the
lifecycle state is remembered in the journal (the marks are as durable as they were:
the tiers left quiesced have their own table, the rest lives as long as the process).
A record's placement (the card(s) its container holds its reservation on) is kept in
the journal's start records, its only home: the store writes them (:meth:`RecordStore.place`,
:meth:`RecordStore.unplace`), the loop's observation reads them
(:meth:`RecordStore.started`), and :meth:`RecordStore.snapshot` fills each record's
``placement`` from them; none is held in memory, so a restart reads back the same.
The store is thread-safe (a start carried out beside the loop settles its machine from
its own thread).

This module must not decide what to do, nor touch docker or NVML: it moves records
with the pure functions of ``statemachine/lifecycle/serve_record.py`` and writes the journal.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, MutableSet
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from loguru import logger

from controller.store.journal import Journal
from statemachine.domain.types import DesiredState, Observed, StartedWith
from statemachine.lifecycle.backoff import Backoff
from statemachine.lifecycle.machine import LifecycleState, ServeLifecycle, Trigger
from statemachine.lifecycle.serve_record import (
    ServeRecord,
    observation_path,
    observe,
    plan_reading,
    reading,
)

V = TypeVar("V")

#: how many observation moves the store keeps (for the log and the tests)
MOVES_KEPT = 256


@dataclass(frozen=True, slots=True)
class Move:
    """A record moved by observation: from, to, and the declared triggers it took
    (``None``: no declared path, the record was adopted in the state seen)."""

    serve: str
    before: LifecycleState
    after: LifecycleState
    triggers: tuple[Trigger, ...] | None


class RecordStore:
    """Every serve's record, kept in the journal once one is attached."""

    def __init__(
        self,
        journal: Journal | None = None,
        *,
        journal_of: Callable[[], Journal | None] | None = None,
    ) -> None:
        self._journal: Journal | None = None
        #: where the start records are kept (the loop's journal once open; else the
        #: attached one)
        self._journal_of = journal_of or (lambda: self._journal)
        self._lock = threading.Lock()
        self._records: dict[str, ServeRecord] = {}
        self._unsaved: dict[str, str] = {}  # moves the journal could not take yet
        self._seen: deque[Move] = deque(maxlen=MOVES_KEPT)  # the last observation moves
        #: the marks, as the loop reads and writes them
        self.backoff: FieldMap[Backoff] = FieldMap(self, "backoff")
        self.no_sleep = MarkSet(self, "no_sleep")
        self.no_shrink = MarkSet(self, "no_shrink")
        self.quiesced = MarkSet(self, "quiesced")
        self.unreleased = MarkSet(self, "unreleased")
        self.stopped_by_us: FieldMap[float | None] = FieldMap(self, "stopped_by_us")
        self.ran_healthy: FieldMap[float] = FieldMap(self, "ran_healthy")
        if journal is not None:
            self.attach(journal)

    def attach(self, journal: Journal) -> None:
        """Keep the lifecycle states in ``journal`` from now on, starting from its own."""
        for name, state in journal.lifecycles().items():
            try:
                lifecycle = LifecycleState(state)
            except ValueError:  # a state this version does not know: start over
                logger.warning("{}: unknown lifecycle state {!r} in the journal", name, state)
                continue
            with self._lock:
                self._records[name] = replace(self._get(name), lifecycle=lifecycle)
        self._journal = journal

    def _get(self, name: str) -> ServeRecord:
        return self._records.get(name) or ServeRecord(name)

    def mark(self, name: str, **changes: Any) -> None:
        """Set fields of serve ``name``'s record (its marks; not its lifecycle)."""
        with self._lock:
            self._records[name] = replace(self._get(name), **changes)

    def marked(self, field: str) -> list[str]:
        """The serves whose record has ``field`` set (true, or not ``None``), sorted."""
        with self._lock:
            return sorted(n for n, r in self._records.items() if _set(getattr(r, field)))

    def get(self, name: str) -> ServeRecord:
        """Serve ``name``'s record (a fresh ``stopped`` one when it has none)."""
        with self._lock:
            return self._get(name)

    def observed_moves(self) -> list[Move]:
        """The last :data:`MOVES_KEPT` moves observation made, oldest first."""
        with self._lock:
            return list(self._seen)

    def snapshot(self) -> Mapping[str, ServeRecord]:
        """Every record now, with its placement (:meth:`started`), as a frozen mapping
        (a journal that cannot be read: the records without their placement, said)."""
        try:
            started = self.started()
        except Exception as exc:  # a closed or locked journal: the records stand alone
            logger.warning("journal: the serves' placements cannot be read: {}", exc)
            started = {}
        placed: dict[str, tuple[str, ...]] = {}
        for rec in started.values():
            placed[rec.serve] = tuple(dict.fromkeys(placed.get(rec.serve, ()) + rec.gpu_roles))
        with self._lock:
            records = dict(self._records)
        for name, roles in placed.items():
            records[name] = replace(records.get(name) or ServeRecord(name), placement=roles)
        return MappingProxyType(records)

    # ------------------------------------------------------- the placements
    def started(self) -> dict[str, StartedWith]:
        """Container -> the reservation it holds, as its start placed it or as it was
        found running (the journal's start records); empty without a journal."""
        journal = self._journal_of()
        return {} if journal is None else journal.started()

    def place(self, container: str, rec: StartedWith, at: float) -> None:
        """``container`` (serve ``rec.serve``) holds ``rec.mib`` MiB on ``rec.gpu_roles``
        from ``at``: its start placed it there, or it was found running (replaces any)."""
        journal = self._journal_of()
        if journal is not None:
            journal.set_started(container, rec.serve, rec.gpu_roles, rec.mib, at)

    def unplace(self, container: str) -> None:
        """``container`` stopped: it holds no reservation any more."""
        journal = self._journal_of()
        if journal is not None:
            journal.forget_started(container)

    def observe(self, desired: DesiredState, observed: Observed) -> None:
        """Move each declared serve's record to what ``observed`` shows of its container.

        Nothing moves when Docker could not be read (nothing is known).
        """
        if not observed.docker_ok:
            return
        seen = {
            s.name: reading(
                observed.container(s.container),
                asleep=observed.sleep_of(s.name).asleep,
                starting=s.name in observed.starting,
            )
            for s in desired.serves.values()
            if not self._started_since(s.name, observed)
        }
        self._move(seen.items())

    def _started_since(self, name: str, observed: Observed) -> bool:
        """True when ``observed`` shows a start of ``name`` in progress but its record is
        already ``running``: the observation was taken before that start ended (the
        start's end moved the record since), and must not move it back."""
        return name in observed.starting and self.get(name).lifecycle is LifecycleState.RUNNING

    def machines(
        self, names: Iterable[str], desired: DesiredState, observed: Observed
    ) -> dict[str, ServeLifecycle]:
        """One lifecycle machine per serve named, from its record moved to the plan's
        reading of its container (:func:`statemachine.lifecycle.serve_record.plan_reading`)."""
        out: dict[str, ServeLifecycle] = {}
        for name in dict.fromkeys(names):
            obs = observed.container(desired.serves[name].container)
            seen = plan_reading(obs, asleep=observed.sleep_of(name).asleep)
            record = observe(self.get(name), seen)
            out[name] = ServeLifecycle(name, record.lifecycle)
        return out

    def settle(self, lifecycles: Mapping[str, str]) -> None:
        """The records take the states an execution's machines were left in (the
        machine is the authority: its state is the record's)."""
        self._put((name, LifecycleState(state), False) for name, state in lifecycles.items())

    def _move(self, seen: Iterable[tuple[str, LifecycleState]]) -> None:
        """Move each named record along its declared path to what was seen."""
        self._put((name, state, True) for name, state in seen)

    def _put(self, moves: Iterable[tuple[str, LifecycleState, bool]]) -> None:
        """Apply each move (observed: along the declared path; else the state as is) and
        remember in the journal the records that changed, in the order they moved (the
        lock is held throughout: a move's write never overtakes a later move's)."""
        with self._lock:
            for name, state, observed in moves:
                before = self._records.get(name)
                record = before or ServeRecord(name)
                after = observe(record, state) if observed else replace(record, lifecycle=state)
                if after != before:
                    self._records[name] = after
                    self._unsaved[name] = str(after.lifecycle)
                if observed and after.lifecycle is not record.lifecycle:
                    path = observation_path(record.lifecycle, after.lifecycle)
                    self._seen.append(Move(name, record.lifecycle, after.lifecycle, path))
            if self._journal is None:  # in memory only: nothing to remember
                self._unsaved.clear()
                return
            if not self._unsaved:
                return
            try:
                self._journal.set_lifecycles(self._unsaved, time.time())
            except Exception as exc:  # a locked journal: the next move writes them again
                logger.error("journal: cannot record the serves' lifecycle states: {}", exc)
                return
            self._unsaved = {}


def _set(value: object) -> bool:
    """Whether a mark is set: a flag that is true, a value that is not ``None``."""
    return value is True or (value is not None and not isinstance(value, bool))


class MarkSet(MutableSet[str]):
    """The serves whose record carries flag ``field``: a set, as the loop uses it."""

    def __init__(self, store: RecordStore, field: str) -> None:
        self._store = store
        self._field = field

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> set[Any]:
        return set(it)  # ``a - b`` and the like are plain sets

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and getattr(self._store.get(name), self._field) is True

    def __iter__(self) -> Iterator[str]:
        return iter(self._store.marked(self._field))

    def __len__(self) -> int:
        return len(self._store.marked(self._field))

    def add(self, value: str) -> None:
        self._store.mark(value, **{self._field: True})

    def discard(self, value: str) -> None:
        if value in self:
            self._store.mark(value, **{self._field: False})

    def __repr__(self) -> str:
        return f"MarkSet({self._field}: {self._store.marked(self._field)})"


class FieldMap(MutableMapping[str, V], Generic[V]):
    """Serve -> the value of field ``field`` of its record, for the serves that have one
    (``None`` is no value): a dict, as the loop uses it."""

    def __init__(self, store: RecordStore, field: str) -> None:
        self._store = store
        self._field = field

    def __getitem__(self, name: str) -> V:
        value: V | None = getattr(self._store.get(name), self._field)
        if value is None:
            raise KeyError(name)
        return value

    def __setitem__(self, name: str, value: V) -> None:
        self._store.mark(name, **{self._field: value})

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._store.mark(name, **{self._field: None})

    def __iter__(self) -> Iterator[str]:
        return iter(self._store.marked(self._field))

    def __len__(self) -> int:
        return len(self._store.marked(self._field))

    def __repr__(self) -> str:
        return f"FieldMap({self._field}: {dict(self.items())!r})"
