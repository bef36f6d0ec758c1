"""What the executor has done and holds since the last observation: the live ledger.

An observation (docker, NVML, the journal's records) is taken at the start of each
cycle; the plan it leads to can run for minutes (a drain, a stop that waits for its
timeout, a start that loads a model). The interfaces must never answer from that
observation alone: a reserve the running plan made, a container it started, are held
memory the observation does not show. :class:`LiveLedger` is the record of those
changes, written by the executor (from any of its threads) as each step begins and
ends, and read by the loop's view:

- a reserve or a start: the serve holds its roles and MiB from then on, whatever the
  observation showed (counted like a start in progress); a start that ended healthy:
  it runs, counted with the reservation it was started with;
- a confirmed release: the serve holds nothing any more (its container exited and,
  where NVML sees it, the memory came back);
- a grow counts the serve at its full reservation from the moment it begins, a
  resize that ended at the figure the engine's answer proves;
- a stop alone changes nothing: the memory counts until its release is confirmed;
  a failed start keeps counting until the next observation shows what it holds;
- a reserve_wake: the sleeper holds its full reservation from then on (counted like a
  start in progress, no longer asleep), and once its await_ready ends healthy it
  runs at that reservation; a sleep alone changes nothing (the engine counts at its
  full reservation until the sleep is confirmed); a release_to_residual that ended:
  the serve counts as asleep at its residual and, at level 1, its host RAM (or, when
  it was stopped instead, at no less than what it held after the release).

Each event has a sequence number; an observation takes :meth:`LiveLedger.mark`
before it reads anything, and the events before its mark are in what it saw
(:meth:`LiveLedger.overlay` gives only those after). :func:`overlay_observed` lays an
overlay over an observation, for the same pure functions (ledger, fit, status) to
answer from (each held serve laid by ``_lay_held``, each slept one by ``_lay_slept``,
on a ``_Draft`` of the parts it rewrites). Never less is counted than may be held.

This module decides nothing and mutates nothing outside its own record.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from statemachine.domain.types import (
    ContainerObs,
    ContainerState,
    Observed,
    SleepObs,
    SleepState,
    StartedWith,
    StartingObs,
)
from statemachine.planning.plan_types import (
    Action,
    Step,
)

#: events kept at most (older ones are in every observation since)
_MAX_EVENTS = 4096


@dataclass(frozen=True, slots=True)
class InFlight:
    """A step the executor is carrying out now."""

    serve: str
    action: str
    group: str
    since: float

    def to_json(self) -> dict[str, Any]:
        """JSON form (``running_s``: how long it has run so far)."""
        return {
            "serve": self.serve,
            "action": self.action,
            "group": self.group,
            "since": self.since,
            "running_s": round(max(0.0, time.time() - self.since), 3),
        }


@dataclass(frozen=True, slots=True)
class StepEnded:
    """One step that ended, as the live ledger saw it (for ``up``'s timings)."""

    serve: str
    action: str
    group: str
    outcome: str
    detail: str
    began_at: float
    ended_at: float


@dataclass(frozen=True, slots=True)
class Overlay:
    """What changed since an observation: serves now held, released, resized."""

    #: serve -> roles and MiB it holds since (reserved, started)
    held: Mapping[str, StartingObs] = field(default_factory=dict)
    #: serves whose release was confirmed since (and not held again after it)
    released: frozenset[str] = frozenset()
    #: serves whose start has ended healthy since (their container runs): held since,
    #: or held before the observation's mark (it saw the start in progress)
    ready: frozenset[str] = frozenset()
    #: elastic serve -> the MiB it is counted at now (``None``: its full reservation)
    elastic: Mapping[str, int | None] = field(default_factory=dict)
    #: the steps in progress now
    in_flight: tuple[InFlight, ...] = ()
    #: serves confirmed asleep since -> (residual MiB on each role, host RAM MiB)
    slept: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON form (what the answers add to the observation)."""
        return {
            "held": {
                n: {"gpu_roles": list(s.gpu_roles), "mib": s.mib} for n, s in self.held.items()
            },
            "released": sorted(self.released),
            "ready": sorted(self.ready),
            "elastic": dict(self.elastic),
            "slept": {
                n: {"residual_mib": r, "host_ram_mib": h} for n, (r, h) in self.slept.items()
            },
        }


@dataclass(frozen=True, slots=True)
class _Event:
    seq: int
    serve: str
    kind: str  # "held", "ready", "released", "elastic", "slept"
    roles: tuple[str, ...] = ()
    mib: int | None = None
    host_mib: int = 0


class LiveLedger:
    """Thread-safe record of the executor's holdings and steps since each observation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._events: list[_Event] = []
        self._running: dict[int, tuple[Step, float]] = {}
        self._ended: list[StepEnded] = []
        self._listeners: list[Callable[[], None]] = []

    # -- the writer side (the executor) ----------------------------------------------
    def step_begun(self, step: Step) -> int:
        """``step`` begins now; returns its token for :meth:`step_ended`."""
        with self._lock:
            self._seq += 1
            token = self._seq
            self._running[token] = (step, time.time())
            if step.action is Action.GROW:  # counted before the call: it may grow in part
                self._add("elastic", step.serve, mib=None)
        self._changed()
        return token

    def step_ended(
        self, token: int, step: Step, outcome: str, detail: str, elastic_mib: int | None = -1
    ) -> None:
        """``step`` ended with ``outcome``; ``elastic_mib`` (not -1): what it counts at now."""
        with self._lock:
            _step, began = self._running.pop(token, (step, time.time()))
            ok = outcome == "ok"
            roles, mib = tuple(step.gpu_roles), step.mib or 0
            if ok and step.action in (Action.RESERVE, Action.START, Action.AWAIT_READY):
                if roles and mib > 0:
                    self._add("held", step.serve, roles=roles, mib=mib)
                if step.action is Action.AWAIT_READY:
                    self._add("ready", step.serve, roles=roles, mib=mib)
            elif ok and step.action is Action.RESERVE_WAKE:
                # the full reservation is admitted: it counts full from now on
                self._add("held", step.serve, roles=roles, mib=step.to_mib or mib)
            elif ok and step.action is Action.RELEASE_TO_RESIDUAL:
                residual = step.to_mib if step.to_mib is not None else mib
                self._add(
                    "slept", step.serve, roles=roles, mib=residual, host_mib=step.host_mib or 0
                )
            elif ok and step.action is Action.RELEASE:
                self._add("released", step.serve)
            if elastic_mib != -1:
                self._add("elastic", step.serve, mib=elastic_mib)
            self._ended.append(
                StepEnded(
                    step.serve,
                    str(step.action),
                    step.group,
                    outcome,
                    detail,
                    began,
                    time.time(),
                )
            )
            del self._ended[:-512]
        self._changed()

    def _add(self, kind: str, serve: str, **kw: Any) -> None:
        self._seq += 1
        self._events.append(_Event(self._seq, serve, kind, **kw))
        del self._events[:-_MAX_EVENTS]

    # -- the reader side (the loop's view) -------------------------------------------
    def mark(self) -> int:
        """The sequence number an observation starts at (take it before reading)."""
        with self._lock:
            return self._seq

    def overlay(self, since: int) -> Overlay:
        """What changed after the observation that took ``since`` as its mark."""
        held: dict[str, StartingObs] = {}
        released: set[str] = set()
        ready: set[str] = set()
        elastic: dict[str, int | None] = {}
        slept: dict[str, tuple[int, int]] = {}
        with self._lock:
            events = [e for e in self._events if e.seq > since]
            running = sorted(self._running.values(), key=lambda r: r[1])
        for e in events:
            if e.kind == "held":
                before = held.get(e.serve)
                roles = (
                    e.roles if before is None else tuple(dict.fromkeys(before.gpu_roles + e.roles))
                )
                mib = e.mib or 0 if before is None else max(before.mib, e.mib or 0)
                held[e.serve] = StartingObs(roles, mib)
                released.discard(e.serve)
                slept.pop(e.serve, None)  # woken (or started again): full from now on
                if e.kind == "held":
                    ready.discard(e.serve)  # a new start of it: not ready until it says so
            elif e.kind == "ready":  # held since, or before the mark (laid as seen)
                ready.add(e.serve)
            elif e.kind == "released":
                held.pop(e.serve, None)
                ready.discard(e.serve)
                slept.pop(e.serve, None)
                released.add(e.serve)
            elif e.kind == "slept":
                held.pop(e.serve, None)
                ready.discard(e.serve)
                released.discard(e.serve)
                slept[e.serve] = (e.mib or 0, e.host_mib)
            elif e.kind == "elastic":
                elastic[e.serve] = e.mib
        in_flight = tuple(InFlight(st.serve, str(st.action), st.group, at) for st, at in running)
        return Overlay(
            MappingProxyType(held),
            frozenset(released),
            frozenset(ready),
            MappingProxyType(elastic),
            in_flight,
            MappingProxyType(slept),
        )

    def forget_before(self, mark: int) -> None:
        """Drop the events an observation taken at ``mark`` has seen (bounded memory)."""
        with self._lock:
            self._events = [e for e in self._events if e.seq > mark]

    def ended(self, since: float, group: str | None = None) -> list[StepEnded]:
        """The steps that ended at or after ``since`` (epoch s), of ``group`` if given."""
        with self._lock:
            return [
                r
                for r in self._ended
                if r.ended_at >= since and (group is None or r.group == group)
            ]

    def running(self) -> tuple[InFlight, ...]:
        """The steps in progress now."""
        with self._lock:
            items = sorted(self._running.values(), key=lambda r: r[1])
        return tuple(InFlight(st.serve, str(st.action), st.group, at) for st, at in items)

    # -- who is told of changes --------------------------------------------------------
    def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from the writer's thread) after each change."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for callback in list(self._listeners):
            with contextlib.suppress(Exception):  # a listener must never break a step
                callback()


def overlay_observed(
    observed: Observed, overlay: Overlay, containers_of: Mapping[str, str]
) -> Observed:
    """``observed`` with what the executor did since laid over it (see the module doc).

    Held serves count like starts in progress (their roles and MiB, whatever their
    container showed); those whose start ended healthy since count as running with
    the reservation they were started with (no longer starting); released serves'
    containers count as exited; resized elastic serves at their figure now.
    ``containers_of``: serve -> its container. Docker unreadable stays unknown.
    """
    if not observed.docker_ok:
        return observed
    draft = _Draft(
        starting=dict(observed.starting),
        containers=dict(observed.containers),
        started_with=dict(observed.started_with),
        sleep=dict(observed.sleep),
    )
    for name, event in overlay.held.items():
        _lay_held(draft, observed, name, event, containers_of.get(name), name in overlay.ready)
    for name in overlay.ready - overlay.held.keys():
        # its reserve and start were before the mark: the observation saw it starting
        if name in observed.starting:
            held = observed.starting[name]
            _lay_held(draft, observed, name, held, containers_of.get(name), True)
    for name, (residual, host) in overlay.slept.items():
        _lay_slept(draft, observed, name, containers_of.get(name), residual, host)
    released: set[str] = set()
    for name in overlay.released:
        container = containers_of.get(name)
        if name in draft.starting or container is None:
            continue
        released.add(name)
        was = observed.container(container)
        if was.holds:
            draft.containers[container] = replace(
                was, state=ContainerState.EXITED, gpu_used_mib=None
            )
    return replace(
        observed,
        starting=MappingProxyType(draft.starting),
        containers=MappingProxyType(draft.containers),
        started_with=MappingProxyType(draft.started_with),
        sleep=MappingProxyType(draft.sleep),
        elastic_mib=MappingProxyType(_elastic(observed.elastic_mib, overlay.elastic)),
        unreleased=observed.unreleased - released,
    )


@dataclass(slots=True)
class _Draft:
    """The parts of an observation an overlay rewrites, as it is being laid."""

    starting: dict[str, StartingObs]
    containers: dict[str, ContainerObs]
    started_with: dict[str, StartedWith]
    sleep: dict[str, SleepObs]


def _lay_held(
    draft: _Draft,
    observed: Observed,
    name: str,
    held: StartingObs,
    container: str | None,
    ready: bool,
) -> None:
    """A held serve: starting with its roles and MiB, or running once its start ended
    healthy (``ready``); never counted below the reservation it was started with."""
    draft.sleep.pop(name, None)  # woken or started since: it holds its full reservation
    record = observed.started_with.get(container) if container is not None else None
    if record is not None and observed.container(container or "").holds:
        # it still runs with the reservation it was started with: never count less
        roles = tuple(dict.fromkeys(held.gpu_roles + record.gpu_roles))
        held = StartingObs(roles, max(held.mib, record.mib))
    if ready and container is not None:
        # its start ended healthy: it runs, with the reservation it was started with
        draft.starting.pop(name, None)
        if not observed.container(container).holds:
            draft.containers[container] = ContainerObs(ContainerState.RUNNING)
        draft.started_with[container] = StartedWith(name, held.gpu_roles, held.mib)
        return
    before = draft.starting.get(name)
    if before is None:
        draft.starting[name] = held
    else:
        roles = tuple(dict.fromkeys(before.gpu_roles + held.gpu_roles))
        draft.starting[name] = StartingObs(roles, max(before.mib, held.mib))


def _lay_slept(
    draft: _Draft,
    observed: Observed,
    name: str,
    container: str | None,
    residual: int,
    host: int,
) -> None:
    """A serve put to sleep: asleep, holding at least its residual and host RAM."""
    if container is None or name in draft.starting:
        return
    if not observed.container(container).holds:  # started since, then put to sleep
        draft.containers[container] = ContainerObs(ContainerState.RUNNING)
    recorded = observed.sleep_of(name)
    draft.sleep[name] = SleepObs(
        state=SleepState.ASLEEP,
        level=1 if host else recorded.level,
        residual_mib=max(residual, recorded.residual_mib or 0),
        host_ram_mib=max(host, recorded.host_ram_mib or 0),
    )


def _elastic(before: Mapping[str, int], now: Mapping[str, int | None]) -> dict[str, int]:
    out = dict(before)
    for name, mib in now.items():
        if mib is None:
            out.pop(name, None)
        else:
            out[name] = mib
    return out
