"""Docker's event stream, followed for the control loop: an event of an observed
container asks for a cycle.

:class:`DockerEvents` runs in a thread of its own (:meth:`DockerEvents.run`). The
stream is filtered to the containers the loop observes (``event_filters``: by name, so
one created or started later is in it too, and by id, so a renamed one is too); an
observation whose containers give another filter closes it (:meth:`DockerEvents.follow`)
and it is opened again at once with the new one. Each time it is opened a cycle is asked
for, and every container is inspected again by it (``touch`` of
:data:`~controller.adapters.docker.read.EVERY_CONTAINER`): whatever happened while no
stream was open is observed then, a death too that the list does not show yet. That
cycle costs an inspect of each container, paid only when the stream is opened (at
start, after a failure, when the observed containers change), never in steady state.
A stream that ends by itself, or cannot be opened, is tried again after a pause; a
filtered stream a proxy refuses (a bound on the request line) is followed unfiltered
instead.

Its inputs are explicit: how to make a client and open a stream, which readers' caches
an event makes stale (``touch``), the loop's stop event, and the callback that asks the
loop for a cycle (given to :meth:`DockerEvents.run`; it must be safe to call from this
thread). This module must not observe, plan or act on anything: it only asks for cycles.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from loguru import logger

from controller.adapters.docker.read import (
    EVERY_CONTAINER,
    EventStreamRefusedError,
    event_filters,
)

#: the events that can change what the loop observes
_WANTED = frozenset({"start", "die", "oom", "stop", "destroy", "pause", "unpause", "rename"})
#: seconds between two tries after the stream ended or failed
_PAUSE_S = 2.0


class DockerEvents:
    """The event stream of the observed containers, opened again whenever it ends."""

    def __init__(
        self,
        make_client: Callable[[], Any],
        open_stream: Callable[[Any, dict[str, Any]], Any],
        touch: Callable[[str], None],
        stop: threading.Event,
    ) -> None:
        self._make_client = make_client
        self._open_stream = open_stream
        self._touch = touch
        self._stop = stop
        self._lock = threading.Lock()
        #: the containers the loop observes: the stream is filtered to them
        self.names: frozenset[str] = frozenset()
        #: the stream open now, its client and the filters it was opened with
        self.stream: Any = None
        self.client: Any = None
        self.filters: dict[str, Any] | None = None
        self._refresh = False  # the stream was closed for a new filter
        #: a filtered stream was refused (a proxy's bound): every container's events
        self._unfiltered = False
        #: the ids (short) of the observed containers at the last observation
        self._ids: tuple[str, ...] = ()

    def run(self, wake: Callable[[str], object]) -> None:
        """Thread: the stream's events -> ``wake(reason)``; reconnects until the stop."""
        while not self._stop.is_set():
            client = stream = None
            filters: dict[str, Any] = {}
            try:
                client = self._make_client()
                filters = self._filters_now(client)
                stream = self._open_stream(client, filters)
                if not self._opened(stream, client, filters):  # the names changed meanwhile
                    continue
                self._touch(EVERY_CONTAINER)  # the events missed while none was open
                wake("docker events followed")
                self._pump(stream, wake)
                # ended by itself (docker-py ends a stream quietly on a read error, or
                # when the daemon answers its request with an error): paced as a
                # failure, or each reopening would ask for a cycle at once
                if not self._refreshed() and not self._stop.is_set():
                    logger.debug("docker events: the stream ended; reconnecting")
                    self._stop.wait(_PAUSE_S)
            except Exception as exc:
                if self._stop.is_set():
                    break
                self._failed(exc, filters)
            finally:
                self._forget(stream, client)

    def _filters_now(self, client: Any) -> dict[str, Any]:
        """The filter of the names followed now (a refresh asked for is taken)."""
        with self._lock:
            names, self._refresh = self.names, False
        return self._filters_for(client, names)

    def _opened(self, stream: Any, client: Any, filters: dict[str, Any]) -> bool:
        """Keep the stream opened; False when the names changed while it was opened."""
        with self._lock:
            self.stream, self.client, self.filters = stream, client, filters
            return self._filters_for(client, self.names) == filters

    def _pump(self, stream: Any, wake: Callable[[str], object]) -> None:
        """Each followed event of a container that can change what is observed: a cycle."""
        for event in stream:
            if self._stop.is_set():
                break
            status = str(event.get("status") or event.get("Action") or "")
            if (status in _WANTED or status.startswith("health_status")) and self.followed(event):
                self.touch(event)  # before the cycle it asks for reads the list
                name = str((event.get("Actor") or {}).get("Attributes", {}).get("name", ""))
                wake(f"docker {status} {name}")

    def _failed(self, exc: Exception, filters: Mapping[str, Any]) -> None:
        """The stream failed: unfiltered from now on where a proxy refused the filter,
        at once where it was closed for a new filter, else after a pause."""
        if isinstance(exc, EventStreamRefusedError) and exc.client_error and "container" in filters:
            logger.warning(
                "docker events: the stream filtered to {} containers is refused "
                "({}); following every container's events instead",
                len(filters["container"]),
                exc,
            )
            with self._lock:
                self._unfiltered = True
            return
        if not self._refreshed():  # closed for a new filter: opened again at once
            logger.debug("docker events: {}; reconnecting", exc)
            self._stop.wait(_PAUSE_S)

    def _refreshed(self) -> bool:
        """True when the stream was closed for a new filter (taken: only the first try
        after it is at once)."""
        with self._lock:
            refreshed, self._refresh = self._refresh, False
        return refreshed

    def _forget(self, stream: Any, client: Any) -> None:
        with self._lock:
            self.stream = self.client = self.filters = None
        for closing in (stream, client):
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing.close()

    def follow(self, names: tuple[str, ...]) -> None:
        """The containers the loop observes now: the event stream follows them.

        Called with each observation's names (in its worker thread); when they give the
        open stream another filter, the stream is closed, and the events thread opens it
        again with the new one (and asks for a cycle: nothing between is missed).
        """
        wanted = frozenset(names)
        with self._lock:
            if wanted == self.names:
                return
            self.names = wanted
            stream, client, filters = self.stream, self.client, self.filters
            if stream is None or client is None or self._filters_for(client, wanted) == filters:
                return  # not open (it is opened with these names), or the same filter
            self._refresh = True
        with contextlib.suppress(Exception):
            stream.close()

    def follow_observed(self, names: tuple[str, ...], ids: tuple[str, ...] | None = None) -> None:
        """Follow an observation's containers: ``names``, and by id those seen at the
        last observation (``ids``: those seen at this one, kept for the next)."""
        if ids is not None:
            self._ids = ids
        self.follow(names + self._ids)

    def followed(self, event: Mapping[str, Any]) -> bool:
        """True when ``event`` is of a container the loop follows: Docker matches the
        filter by prefix (``web`` also has ``web-old``'s events), so the event's name,
        or its id, is checked here (every event while no names are known)."""
        with self._lock:
            names = self.names
        if not names:
            return True
        actor = event.get("Actor") or {}
        attributes = actor.get("Attributes") or {}
        cid = str(actor.get("ID") or event.get("id") or "")
        return str(attributes.get("name", "")) in names or cid[:12] in names

    def touch(self, event: Mapping[str, Any]) -> None:
        """The container of ``event`` is inspected again by every reader's next list:
        Docker sends ``die`` before its list shows the container exited, so without this
        the cycle the event asks for would still see it running (and the death would
        wait for a later trigger)."""
        self._touch(str((event.get("Actor") or {}).get("ID") or event.get("id") or ""))

    def _filters_for(self, client: Any, names: Collection[str]) -> dict[str, Any]:
        """The event stream's filters for ``names`` (every container's events once a
        filtered stream was refused). Called with the lock held or from the events
        thread, which alone sets ``_unfiltered``."""
        return event_filters(client, () if self._unfiltered else names)

    def close(self) -> None:
        """Close the stream open now (the thread sees the stop event and ends)."""
        with self._lock:
            stream = self.stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
