"""Requests in flight per serve, and since when each has been idle (measured idleness).

:class:`InFlightTracker` reads every running serve's count of requests in flight
(:mod:`controller.adapters.engine_metrics`: its engine's metrics, else its router
tier) once per observation, and keeps, per serve, since when every reading has been 0
(``idle_since``), when a count above 0 was last read (``busy_at``; and, across its
stops and sleeps, :meth:`InFlightTracker.last_busy`), when it was first read awake
after it was read asleep (``woke_at``), and each time it went busy (its uses,
:meth:`InFlightTracker.uses`: how often it is asked for). The clock lives
here; the pure core gets these times in :class:`statemachine.domain.types.InFlightObs` and
decides with them (:mod:`statemachine.planning.idleness`, :mod:`statemachine.planning.victims`).

An unknown reading (no answer, no metric) resets ``idle_since``: idleness is counted
only across readings that all said 0. A serve that is not running is not read; one
whose engine sleeps is read, but its idleness starts afresh when it is woken: a request
it was woken for counts from the wake, as one it was started for counts from the
container's start.

This module must not decide anything nor change the host: it reads and remembers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from controller.adapters.engine_metrics import (
    DEFAULT_TIMEOUT_S,
    InFlightReader,
    InFlightReading,
    InFlightSources,
    engine_kind,
)
from controller.adapters.router import router_token
from controller.manifest import ManifestSet
from controller.snapshot import InFlightModel, SnapshotModel
from statemachine.planning.reuse import MAX_USES

_HOLDING = ("running", "paused", "restarting")


def sources_for(
    mset: ManifestSet, *, router_url: str | None, router_token: str | None
) -> dict[str, InFlightSources]:
    """Each serve's sources of in-flight counts (see docs/manifest.md, ``metrics_url``)."""
    out: dict[str, InFlightSources] = {}
    for name, serve in mset.serves.items():
        out[name] = InFlightSources(
            metrics_url=serve.metrics_source(),
            engine=engine_kind(serve.engine),
            router_url=router_url if serve.router_tier else None,
            router_tier=serve.router_tier if router_url else None,
            router_token=router_token,
        )
    return out


@dataclass(slots=True)
class _Seen:
    idle_since: float | None = None
    busy_at: float | None = None
    woke_at: float | None = None


class InFlightTracker:
    """Reads the counts each observation and remembers idle-since / busy-at per serve."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        reader: Callable[[Mapping[str, InFlightSources]], Mapping[str, InFlightReading]]
        | None = None,
        log_changes: bool = True,
    ) -> None:
        #: False for a one-shot reading (the CLI): it says what it read itself
        self._log_changes = log_changes
        self._clock = clock
        self._reader = reader
        self._seen: dict[str, _Seen] = {}
        #: serves last read asleep: the first reading awake after it is their wake
        self._asleep: set[str] = set()
        #: serve -> when a count above 0 was last read, kept when it stops or sleeps
        #: (when it was last used: what makes it a cheap victim or not)
        self._last_busy: dict[str, float] = {}
        #: serve -> when a count above 0 was read after one that was not (each a use;
        #: the last MAX_USES), kept when it stops or sleeps (statemachine/planning/reuse.py)
        self._uses: dict[str, deque[float]] = {}
        self._busy_now: set[str] = set()
        self._errors: dict[str, str | None] = {}
        self._lock = threading.Lock()
        #: one HTTP client for every observation (made on the first read that needs one)
        self._http = InFlightReader(timeout_s=timeout_s)

    def close(self) -> None:
        """Close the HTTP client (a later read makes a new one for itself)."""
        self._http.close()

    def read(
        self,
        sources: Mapping[str, InFlightSources],
        running: Collection[str],
        asleep: Collection[str] = (),
    ) -> dict[str, InFlightModel]:
        """The counts of the ``running`` serves now, with what is remembered of each; a
        serve with a source that is not running is listed with its source, unread (its
        idleness starts with its run). A serve ``asleep`` is read, but nothing is
        remembered of it: its idleness starts with its wake (``woke_at``, its first
        reading awake)."""
        wanted = {n: s for n, s in sources.items() if n in running}
        readings = self._reader(wanted) if self._reader is not None else self._http(wanted)
        now = self._clock()
        out: dict[str, InFlightModel] = {}
        with self._lock:
            for name in list(self._seen):
                if name not in running:  # stopped: its next run starts afresh
                    del self._seen[name]
            self._asleep &= set(running)  # a stopped sleeper's next run is a start
            self._busy_now &= set(running)  # a stop ends a busy stretch: its next is a use
            for name, r in readings.items():
                seen = self._seen.setdefault(name, _Seen())
                if name not in asleep and name in self._asleep:
                    self._asleep.discard(name)
                    seen.woke_at = now
                if not r.count:
                    self._busy_now.discard(name)
                if r.count is None:
                    seen.idle_since = None
                elif r.count > 0:
                    seen.idle_since = None
                    seen.busy_at = now
                    self._last_busy[name] = now
                    if name not in self._busy_now:
                        self._busy_now.add(name)
                        self._uses.setdefault(name, deque(maxlen=MAX_USES)).append(now)
                elif seen.idle_since is None:
                    seen.idle_since = now
                if name in asleep:
                    self._asleep.add(name)
                    seen = self._seen.pop(name)
                    seen.idle_since = seen.busy_at = seen.woke_at = None
                self._say(name, r)
                out[name] = InFlightModel(
                    count=r.count,
                    source=r.source,
                    idle_since=seen.idle_since if r.count == 0 else None,
                    busy_at=seen.busy_at,
                    woke_at=seen.woke_at,
                    error=r.error,
                )
        for name, src in sources.items():
            if name not in out and src.kind is not None:
                out[name] = InFlightModel(count=None, source=src.kind)
        return out

    def last_busy(self) -> dict[str, float]:
        """Serve -> when a count above 0 was last read (a copy), whether or not it has
        run since; serves never seen busy are absent."""
        with self._lock:
            return dict(self._last_busy)

    def uses(self) -> dict[str, tuple[float, ...]]:
        """Serve -> when it was seen going busy (oldest first, the last
        :data:`~statemachine.planning.reuse.MAX_USES`), since this tracker began; serves never
        seen busy are absent."""
        with self._lock:
            return {n: tuple(u) for n, u in self._uses.items()}

    def _say(self, name: str, r: InFlightReading) -> None:
        """Log a serve's read error once when it changes, not every cycle."""
        if not self._log_changes or self._errors.get(name) == r.error:
            return
        self._errors[name] = r.error
        if r.error:
            logger.info("{}: requests in flight unknown: {}", name, r.error)
        elif r.source is not None:
            logger.info("{}: requests in flight readable from its {}", name, r.source)


def observe_in_flight(
    snap: SnapshotModel,
    mset: ManifestSet,
    tracker: InFlightTracker,
    *,
    router_url: str | None = None,
    router_token_file: Path | None = None,
) -> dict[str, InFlightModel]:
    """The requests in flight of the manifest set's running serves, as ``snap`` shows them
    (nothing when docker could not be read: no serve is known to run)."""
    if snap.docker != "ok":
        return {}
    running = [
        name
        for name, s in mset.serves.items()
        if (c := snap.containers.get(s.container)) is not None and c.state in _HOLDING
    ]
    # a sleeper's container runs while its engine sleeps: its idleness is counted from
    # its wake on, as a serve that has just started
    asleep = {n for n, z in snap.sleep.items() if z.state == "asleep"}
    token = None
    if router_url is not None:
        try:
            token = router_token(router_token_file)
        except Exception:  # an unreadable token file: the executor's preflight says so
            token = None
    sources = sources_for(mset, router_url=router_url, router_token=token)
    return tracker.read(sources, running, asleep=asleep)
