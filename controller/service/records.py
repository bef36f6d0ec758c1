"""The store of the serve records: one :class:`~statemachine.serve_record.ServeRecord` per serve.

The store keeps each serve's record, with its lifecycle state remembered in the journal
(table ``serve_records``): loaded when the controller starts, so a serve's lifecycle
state survives a restart and is moved on from there, never re-derived. It is moved
forward

- by observation (:meth:`RecordStore.observe`, once per observation of the loop): each
  record along the declared path to what its container shows
  (:func:`statemachine.serve_record.observe`);
- by execution: the executor takes its machines from the records
  (:meth:`RecordStore.machines`, each moved to the plan's reading of its container) and
  the machines' states after the plan come back (:meth:`RecordStore.settle`).

Status, the API, metrics and the page read the records through the loop's view
(:meth:`RecordStore.snapshot`). The store is thread-safe (a start carried out beside
the loop settles its machine from its own thread).

This module must not decide what to do, nor touch docker or NVML: it moves records
with the pure functions of ``statemachine/serve_record.py`` and writes the journal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from loguru import logger

from controller.store.journal import Journal
from statemachine.lifecycle import LifecycleState, ServeLifecycle
from statemachine.serve_record import ServeRecord, observe, plan_reading, reading
from statemachine.types import DesiredState, Observed


class RecordStore:
    """Every serve's record, kept in the journal (``None``: in memory only)."""

    def __init__(self, journal: Journal | None = None) -> None:
        self._journal = journal
        self._lock = threading.Lock()
        self._records: dict[str, ServeRecord] = {}
        self._unsaved: dict[str, str] = {}  # moves the journal could not take yet
        if journal is not None:
            for name, state in journal.lifecycles().items():
                try:
                    self._records[name] = ServeRecord(name, LifecycleState(state))
                except ValueError:  # a state this version does not know: start over
                    logger.warning("{}: unknown lifecycle state {!r} in the journal", name, state)

    def get(self, name: str) -> ServeRecord:
        """Serve ``name``'s record (a fresh ``stopped`` one when it has none)."""
        with self._lock:
            return self._records.get(name) or ServeRecord(name)

    def snapshot(self) -> Mapping[str, ServeRecord]:
        """Every record now, as a frozen mapping."""
        with self._lock:
            return MappingProxyType(dict(self._records))

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
        }
        self._move(seen.items())

    def machines(
        self, names: Iterable[str], desired: DesiredState, observed: Observed
    ) -> dict[str, ServeLifecycle]:
        """One lifecycle machine per serve named, from its record moved to the plan's
        reading of its container (:func:`statemachine.serve_record.plan_reading`)."""
        out: dict[str, ServeLifecycle] = {}
        for name in dict.fromkeys(names):
            obs = observed.container(desired.serves[name].container)
            seen = plan_reading(obs, asleep=obs.holds and observed.sleep_of(name).asleep)
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
        remember in the journal the records that changed."""
        changed: dict[str, str] = {}
        with self._lock:
            for name, state, observed in moves:
                before = self._records.get(name)
                record = before or ServeRecord(name)
                after = observe(record, state) if observed else replace(record, lifecycle=state)
                if after != before:
                    self._records[name] = after
                    changed[name] = str(after.lifecycle)
        if changed and self._journal is not None:
            with self._lock:
                self._unsaved.update(changed)
                changed, self._unsaved = self._unsaved, {}
            try:
                self._journal.set_lifecycles(changed, time.time())
            except Exception as exc:  # a locked journal: the next move writes them again
                logger.error("journal: cannot record the serves' lifecycle states: {}", exc)
                with self._lock:
                    self._unsaved = {**changed, **self._unsaved}
