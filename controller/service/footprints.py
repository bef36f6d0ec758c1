"""Measuring footprints: device readings around the starts and stops the executor makes.

:class:`FootprintRecorder` is handed to the executor (its ``footprints``), which calls
it at the points where memory moves:

- a start: :meth:`~FootprintRecorder.before_start` (just before ``docker start`` /
  ``up``), :meth:`~FootprintRecorder.after_start` (once healthy; the settle reading
  follows ``settle_s`` later on a timer thread, so nothing waits for it) or
  :meth:`~FootprintRecorder.start_failed`;
- a stop: :meth:`~FootprintRecorder.before_stop` (before ``docker stop``),
  :meth:`~FootprintRecorder.after_stop` (once the release is confirmed, or the container
  exited for a serve outside the ledger) or :meth:`~FootprintRecorder.stop_failed`;
- a wake, a sleep or a sleeper's stop: opened as a start / stop and always ended as a
  failed one (a move on the serve's roles, no sample: what moves is not its footprint).

Each reading is the devices' used MiB and the containers' per-process figures
(:class:`Reading`). Each window is a :class:`statemachine.sizing.footprint.Movement`; the
serves whose windows overlap on the same GPU role are named in the sample, which is
then not attributable (the arithmetic is :mod:`statemachine.sizing.footprint`'s). The loop
also hands every cycle's observation to :meth:`~FootprintRecorder.observe`: it raises
the peak of the serves that run (while nothing else moved on their GPU since their
start) and records changes it sees that no window covers (a crash, a start by hand)
as movements, so they make overlapping deltas unattributable too.

Samples go to the journal (``footprints`` table, bounded per serve) and survive a
restart; a start still settling when the controller stops is recorded with its
settle reading unknown. The peak of a serve started before this controller started
is not followed (its reading before the start is not known).

This module must not mutate anything on the host, and a failing reading or journal
write must never fail a step: every hook logs and carries on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from loguru import logger

from statemachine.domain.types import DesiredState, GpuRole, Observed, ServeSpec
from statemachine.sizing.footprint import (
    Footprint,
    Movement,
    Sample,
    others_in_window,
    start_sample,
    stop_sample,
    summarise,
    with_peak,
)

__all__ = [
    "DEFAULT_SETTLE_S",
    "NO_FOOTPRINTS",
    "FootprintJournal",
    "FootprintRecorder",
    "Footprints",
    "Reading",
]

#: Seconds after a serve is healthy before the "steady" reading (engines finish
#: allocating caches and graphs around their first requests).
DEFAULT_SETTLE_S = 30.0
#: How long a closed window is kept to be named by the windows that overlap it.
_KEEP_MOVEMENTS_S = 6 * 3600.0


@dataclass(frozen=True, slots=True)
class Reading:
    """The host's memory at one moment.

    ``devices`` maps a device UUID to its used MiB (``None`` for a figure NVML could not
    read); ``devices`` itself is ``None`` when NVML is unavailable. ``containers`` maps
    a container name to the MiB the driver attributes to its processes (``None``:
    unknown, as on WSL2).
    """

    devices: Mapping[str, int | None] | None
    containers: Mapping[str, int | None] = field(default_factory=dict)

    @classmethod
    def of(cls, observed: Observed) -> Reading:
        """The reading an observation carries."""
        devices = None if observed.gpus is None else {g.uuid: g.used_mib for g in observed.gpus}
        return cls(devices, {n: c.gpu_used_mib for n, c in observed.containers.items()})

    def used(self, role: GpuRole | None) -> int | None:
        """The used MiB of ``role``'s device (``None``: unknown)."""
        if self.devices is None or role is None or not role.uuid:
            return None
        return self.devices.get(role.uuid)


class FootprintJournal(Protocol):
    """The journal's footprint table (``controller.store.journal.Journal``)."""

    def add_footprint(
        self, serve: str, kind: str, role: str, at: float, sample: Mapping[str, object]
    ) -> int: ...

    def update_footprint(self, sample_id: int, sample: Mapping[str, object]) -> None: ...

    def footprints(self, serve: str | None = None) -> list[tuple[int, dict[str, object]]]: ...


class Footprints(Protocol):
    """What the executor calls around its starts and stops (never raises)."""

    def before_start(self, s: ServeSpec, roles: Mapping[str, GpuRole]) -> None: ...
    def after_start(self, s: ServeSpec) -> None: ...
    def start_failed(self, s: ServeSpec) -> None: ...
    def before_stop(self, s: ServeSpec, roles: Mapping[str, GpuRole]) -> None: ...
    def after_stop(self, s: ServeSpec) -> None: ...
    def stop_failed(self, s: ServeSpec) -> None: ...


class _NoFootprints:
    """Records nothing (``vramctl apply``, tests that do not measure)."""

    def _before(self, s: ServeSpec, roles: Mapping[str, GpuRole]) -> None:
        return None

    def _after(self, s: ServeSpec) -> None:
        return None

    before_start = before_stop = _before
    after_start = start_failed = after_stop = stop_failed = _after


NO_FOOTPRINTS: Footprints = _NoFootprints()


@dataclass
class _Window:
    """A start or stop in progress: its readings so far."""

    serve: ServeSpec
    kind: str
    roles: dict[str, GpuRole | None]
    movement: Movement
    before: Reading
    after: Reading | None = None
    timer: threading.Timer | None = None


class _Measured(TypedDict):
    """The terms a start's and a stop's sample share (``statemachine.sizing.footprint``)."""

    at: float
    declared_mib: int | None
    before_mib: int | None
    after_mib: int | None
    others: Sequence[str]


@dataclass
class _Run:
    """A serve started here and still running: its start samples, to raise their peak."""

    serve: ServeSpec
    roles: dict[str, GpuRole | None]
    began: float
    samples: dict[int, Sample]  # journal id (or a negative local one) -> sample


class _SampleStore:
    """Where the samples go: the journal, or this process's memory without one."""

    def __init__(self, journal: FootprintJournal | None, lock: threading.RLock) -> None:
        self.journal = journal
        self._lock = lock
        self._local: list[Sample] = []  # without a journal
        self._next_local = -1

    def add(self, sample: Sample) -> int:
        """Keep one sample; its id (negative when local, 0 when the journal failed)."""
        if self.journal is None:
            with self._lock:
                self._local.append(sample)
                self._next_local -= 1
                return self._next_local
        try:
            return self.journal.add_footprint(
                sample.serve, sample.kind, sample.role, sample.at, sample.to_json()
            )
        except Exception as exc:
            logger.error("journal: cannot record {}'s footprint sample: {}", sample.serve, exc)
            return 0

    def replace(self, sample_id: int, old: Sample, new: Sample) -> None:
        """Put ``new`` in the place of ``old`` (kept under ``sample_id``)."""
        if self.journal is None:
            with self._lock:
                self._local = [new if s is old else s for s in self._local]
            return
        if sample_id > 0:
            try:
                self.journal.update_footprint(sample_id, new.to_json())
            except Exception as exc:
                logger.error("journal: cannot update {}'s peak: {}", new.serve, exc)

    def samples(self, serve: str | None = None) -> list[Sample]:
        """The kept samples, of one serve or of all."""
        if self.journal is None:
            with self._lock:
                return [s for s in self._local if serve is None or s.serve == serve]
        return samples_of(self.journal, serve)


class FootprintRecorder:
    """Takes the readings, names the overlapping moves, journals the samples."""

    def __init__(
        self,
        read: Callable[[], Reading],
        *,
        journal: FootprintJournal | None = None,
        settle_s: float = DEFAULT_SETTLE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._read_host = read
        self.settle_s = settle_s
        self.clock = clock
        self._lock = threading.RLock()
        self._store = _SampleStore(journal, self._lock)
        self._windows: dict[tuple[str, str], _Window] = {}
        self._movements: list[Movement] = []
        self._runs: dict[str, _Run] = {}
        self._last_holds: dict[str, bool] | None = None
        self._last_at: float | None = None
        self._closed = False

    @property
    def journal(self) -> FootprintJournal | None:
        """The journal the samples go to (``None``: kept in this process)."""
        return self._store.journal

    # -- readings ---------------------------------------------------------------------
    def _read(self) -> Reading:
        try:
            return self._read_host()
        except Exception as exc:  # a reading that fails is unknown, never 0
            logger.warning("footprint: cannot read the devices: {}", exc)
            return Reading(None)

    # -- the executor's hooks ---------------------------------------------------------
    def before_start(self, s: ServeSpec, roles: Mapping[str, GpuRole]) -> None:
        self._begin(s, "start", roles)

    def after_start(self, s: ServeSpec) -> None:
        try:
            window = self._window(s.name, "start")
            if window is None:
                return
            window.after = self._read()
            if self.settle_s <= 0 or self._closed:
                self._finish_start(window, settled=not self._closed)
                return
            timer = threading.Timer(self.settle_s, self._finish_start, args=(window, True))
            timer.daemon = True
            timer.name = f"footprint-{s.name}"
            window.timer = timer
            timer.start()
        except Exception:
            logger.exception("footprint: {}'s start could not be measured", s.name)

    def start_failed(self, s: ServeSpec) -> None:
        self._abandon(s.name, "start")

    def before_stop(self, s: ServeSpec, roles: Mapping[str, GpuRole]) -> None:
        settling = self._window(s.name, "start")
        if settling is not None and settling.after is not None:
            # stopped before its settle reading: the start is recorded without one
            if settling.timer is not None:
                settling.timer.cancel()
            self._finish_start(settling, settled=False)
        window = self._begin(s, "stop", roles)
        if window is not None:
            self._end_run(s.name, window.before)

    def after_stop(self, s: ServeSpec) -> None:
        try:
            window = self._window(s.name, "stop")
            if window is None:
                return
            after = self._read()
            now = self.clock()
            with self._lock:
                self._close(window, now)
                samples = []
                for role_id, role in window.roles.items():
                    samples.append(
                        stop_sample(
                            s.name,
                            role_id,
                            **self._measured(s, window, role_id, role, after, now),
                            process_before_mib=window.before.containers.get(s.container),
                        )
                    )
            for sample in samples:
                self._store.add(sample)
        except Exception:
            logger.exception("footprint: {}'s stop could not be measured", s.name)

    def stop_failed(self, s: ServeSpec) -> None:
        self._abandon(s.name, "stop")

    # -- the loop's hook --------------------------------------------------------------
    def observe(self, observed: Observed, desired: DesiredState, now: float) -> None:
        """One cycle's observation: raise peaks, and note moves no window covers."""
        try:
            self._observe(observed, desired, now)
        except Exception:
            logger.exception("footprint: the observation could not be used")

    def _observe(self, observed: Observed, desired: DesiredState, now: float) -> None:
        if not observed.docker_ok:
            return
        holds = {
            s.name: observed.container(s.container).holds
            for s in desired.serves.values()
            if s.gpu_roles
        }
        reading = Reading.of(observed)
        with self._lock:
            # a window nothing will end: a stop whose release never ran (no stop is in
            # progress between cycles), a start left unawaited (interrupted): closed, or
            # it would make every later change on its GPU unattributable
            for (name, kind), window in list(self._windows.items()):
                if kind == "stop" or (window.after is None and name not in observed.starting):
                    self._close(window, now)
            windowed = {name for name, _ in self._windows}
            if self._last_holds is not None and self._last_at is not None:
                for name, now_holds in holds.items():
                    was = self._last_holds.get(name)
                    if was is None or was == now_holds or name in windowed:
                        continue
                    if _covered(self._movements, name, self._last_at):
                        continue  # the executor's own window covers it
                    self._movements.append(
                        Movement(
                            name,
                            "seen",
                            frozenset(desired.serves[name].gpu_roles),
                            self._last_at,
                            now,
                        )
                    )
            self._last_holds, self._last_at = holds, now
            runs = list(self._runs.items())
        for name, run in runs:
            if not holds.get(name, False):
                self._end_run(name, None)
                continue
            self._raise_peak(run, reading, now)
        self._forget_old(now)

    # -- what the interfaces read -----------------------------------------------------
    def samples(self, serve: str | None = None) -> list[Sample]:
        """The recorded samples (the journal's, or this process's without one)."""
        return self._store.samples(serve)

    def summary(self, desired: DesiredState) -> dict[str, Footprint]:
        """Declared vs measured for every serve of ``desired`` on a GPU role."""
        return summaries(desired, self.samples())

    def close(self) -> None:
        """Record the starts still settling with what is known; take no more readings."""
        with self._lock:
            self._closed = True
            pending = [w for (_, kind), w in self._windows.items() if kind == "start"]
        for window in pending:
            if window.timer is not None and window.after is not None:
                window.timer.cancel()
                self._finish_start(window, settled=False)

    # -- inside -----------------------------------------------------------------------
    def _begin(self, s: ServeSpec, kind: str, roles: Mapping[str, GpuRole]) -> _Window | None:
        if not s.gpu_roles:
            return None
        try:
            before = self._read()
            now = self.clock()
            movement = Movement(s.name, kind, frozenset(s.gpu_roles), now)
            window = _Window(s, kind, {r: roles.get(r) for r in s.gpu_roles}, movement, before)
            with self._lock:
                old = self._windows.pop((s.name, kind), None)
                if old is not None:
                    self._close(old, now)
                self._windows[(s.name, kind)] = window
                self._movements.append(movement)
            return window
        except Exception:
            logger.exception("footprint: {}'s {} could not be measured", s.name, kind)
            return None

    def _close(self, window: _Window, now: float) -> None:
        """End a window's movement (under the lock)."""
        closed = _ended(window.movement, now)
        self._movements = [closed if m is window.movement else m for m in self._movements]
        window.movement = closed
        key = (window.serve.name, window.kind)
        if self._windows.get(key) is window:
            del self._windows[key]

    def _window(self, name: str, kind: str) -> _Window | None:
        """The open window of ``name``'s start or stop (``kind``), if any."""
        with self._lock:
            return self._windows.get((name, kind))

    def _abandon(self, name: str, kind: str) -> None:
        with self._lock:
            window = self._windows.get((name, kind))
            if window is None:
                return
            if window.timer is not None:
                window.timer.cancel()
            self._close(window, self.clock())  # memory moved: the window stays as a move

    def _measured(
        self,
        s: ServeSpec,
        window: _Window,
        role_id: str,
        role: GpuRole | None,
        after: Reading,
        now: float,
    ) -> _Measured:
        """What a start's and a stop's sample on one role share: the readings around it,
        the declared figure and the other moves in its window."""
        return _Measured(
            at=now,
            declared_mib=s.vram_mib,
            before_mib=window.before.used(role),
            after_mib=after.used(role),
            others=self._others(s.name, role_id, window.movement.began, now),
        )

    def _others(self, serve: str, role: str, began: float, ended: float | None) -> tuple[str, ...]:
        return others_in_window(serve, role, began, ended, self._movements)

    def _finish_start(self, window: _Window, settled: bool) -> None:
        try:
            s = window.serve
            with self._lock:
                if self._windows.get((s.name, "start")) is not window:
                    return  # abandoned (a failure, a stop) meanwhile
            late = self._read() if settled and not self._closed else Reading(None)
            now = self.clock()
            after = window.after or Reading(None)
            with self._lock:
                if self._windows.get((s.name, "start")) is not window:
                    return
                self._close(window, now)
                samples = []
                for role_id, role in window.roles.items():
                    sample = start_sample(
                        s.name,
                        role_id,
                        **self._measured(s, window, role_id, role, after, now),
                        settled_mib=late.used(role),
                        process_after_mib=after.containers.get(s.container),
                        process_settled_mib=late.containers.get(s.container),
                    )
                    for r in (after, late):
                        sample = with_peak(
                            sample, r.used(role), process_mib=r.containers.get(s.container)
                        )
                    samples.append(sample)
            ids = {self._store.add(sample): sample for sample in samples}
            with self._lock:
                self._runs[s.name] = _Run(s, window.roles, window.movement.began, ids)
        except Exception:
            logger.exception("footprint: {}'s start could not be recorded", window.serve.name)

    def _raise_peak(self, run: _Run, reading: Reading, now: float) -> None:
        with self._lock:
            self._raise_peak_locked(run, reading, now)

    def _raise_peak_locked(self, run: _Run, reading: Reading, now: float) -> None:
        for sample_id, sample in list(run.samples.items()):
            if sample.method.value == "delta" and self._others(
                run.serve.name, sample.role, run.began, now
            ):
                continue  # something else moved on the GPU since: the total proves nothing
            role = run.roles.get(sample.role)
            raised = with_peak(
                sample, reading.used(role), process_mib=reading.containers.get(run.serve.container)
            )
            if raised is not sample:
                run.samples[sample_id] = raised
                self._store.replace(sample_id, sample, raised)

    def _end_run(self, name: str, last: Reading | None) -> None:
        with self._lock:
            run = self._runs.pop(name, None)
        if run is not None and last is not None:
            self._raise_peak(run, last, self.clock())

    def _forget_old(self, now: float) -> None:
        with self._lock:
            self._movements = [
                m for m in self._movements if m.ended is None or m.ended >= now - _KEEP_MOVEMENTS_S
            ]


def _covered(movements: Sequence[Movement], name: str, since: float) -> bool:
    """Whether a start or stop window of ``name`` was still open at or after ``since``."""
    return any(
        m.serve == name and m.kind != "seen" and (m.ended is None or m.ended >= since)
        for m in movements
    )


def _ended(movement: Movement, now: float) -> Movement:
    """The same movement, ended at ``now``."""
    return Movement(movement.serve, movement.kind, movement.roles, movement.began, now)


def samples_of(journal: FootprintJournal, serve: str | None = None) -> list[Sample]:
    """The journal's samples (rows it cannot read are skipped)."""
    out: list[Sample] = []
    for _, data in journal.footprints(serve):
        try:
            out.append(Sample.from_json(data))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def summaries(desired: DesiredState, samples: Sequence[Sample]) -> dict[str, Footprint]:
    """Declared vs measured for every serve of ``desired`` on a GPU role."""
    return {
        s.name: summarise(s.name, s.vram_mib, samples)
        for s in desired.serves.values()
        if s.gpu_roles
    }
