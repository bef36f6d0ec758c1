"""Docker adapter: one read-only snapshot of the containers a manifest set names.

This is the only module that imports ``docker`` for reading (the executor, which
mutates containers, is the only other user). Each cycle it answers, for every
container name the manifest set declares: the container's state in the snapshot's
vocabulary (docs/design.md §5), its Docker healthcheck status where it has one, its start
time (the ISO 8601 string Docker gives), its exit code, whether the kernel OOM-killed
it, and its Compose labels (``com.docker.compose.project`` / ``.service``): the pure core
tells a serve's own container from another project's by the project label
(:func:`statemachine.domain.types.foreign_project`, docs/design.md §3). Containers
that request GPUs but that no manifest declares are listed as *undeclared GPU
containers* (docs/design.md §3, drift).

API calls per cycle (the call-count design)
-------------------------------------------
Docker has no batched inspect, and its list endpoint (``GET /containers/json``, one
call for all containers) lacks what the snapshot needs: ``OOMKilled``, ``StartedAt``,
the exact healthcheck status, and ``HostConfig.DeviceRequests`` / ``Runtime``. So a
cycle is **one list call** plus **one inspect per container whose details may have
changed since they were last read**, and the inspect results are kept in an
:class:`InspectCache` keyed by container Id. The list is the change detector; a
cached entry is re-read when, for that Id,

* the list's ``State`` changes, or its ``Status`` text changes other than in its
  human duration (``"Up 3 minutes (healthy)"`` → ``"Up 3 minutes (unhealthy)"``,
  ``"Exited (0) …"`` → ``"Exited (137) …"``), or
* the duration in ``Status`` went backwards: Docker prints the time since the last
  start (``Up …``) or the last exit (``Exited (N) … ago``); if that is now shorter
  than the previous cycle's reading plus the time elapsed between the two list calls
  (measured conservatively on a monotonic clock), the container was restarted (or
  exited again) in between even though ``State`` looks unchanged.

Only declared containers are re-inspected on change. Any other container is
inspected once per Id, to learn whether it requests a GPU (device requests and
runtime cannot change after creation), and its state comes from the list. Hence:
the first cycle costs ``1 + (containers on the host)`` calls; a **steady-state
cycle costs exactly 1 call however many serves there are**; a cycle after ``k``
declared containers changed or ``k`` new containers appeared costs ``1 + k``. Each
:class:`ContainerSnapshot` reports ``api_calls`` and the names it ``inspected``.
A container an event named since the last cycle (:meth:`InspectCache.touch`, the
loop's events thread) is re-inspected whatever the list says: Docker sends ``die``
before its list shows the container exited, and the cycle that event asks for must see
the death. The one blind spot left: a declared container that restarted and reached
the same state, health and status text within the conservative slack (about half a
second of the elapsed time) keeps its previous ``started_at`` until its next change,
unless the loop followed its events (it does: see ``controller/service/docker_events.py``).

Docker's states map onto the snapshot's one to one, except ``removing`` (the
process has already stopped; the container is on its way out), which is reported
as ``exited`` with ``docker_state: "removing"``. An unknown state of a declared
container makes the whole snapshot unreadable (fail closed), as does any Docker
error other than a container disappearing between the list and its inspect (that
container is absent for the cycle). A daemon that cannot be reached gives
``docker_ok=False`` and the error message, and the snapshot it converts to
(``"docker": "error"``) makes the ledger treat every container as unknown; no
exception leaves :func:`observe_containers`.

The client honours ``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH`` and
the current Docker context (:func:`make_client`, through ``docker.from_env``).
:func:`event_filters` gives the filters of an event stream of the named containers
only (the loop follows its observed containers that way, so other containers on a
shared daemon wake nothing).

One observation is a ``_Cycle``: one list call, then per row its cache entry read or
refreshed (``_Cycle.read_row``, the list's timing in a ``_Listing``, a newer state
from inspect by ``_moved_on``) and the container's model built from it.

This module only reads: it must not create, start, stop, kill, pause, rename or
remove a container, pull an image or change anything else on the daemon, and it
must not decide anything (that is the pure core's job).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import docker
from docker.errors import DockerException, NotFound

from controller.adapters.docker.reach import docker_endpoint, unreachable_message
from controller.snapshot import ContainerModel, GpuModel, SnapshotModel
from statemachine.domain.types import ContainerState

__all__ = [
    "COMPOSE_PROJECT_LABEL",
    "COMPOSE_SERVICE_LABEL",
    "DEFAULT_TIMEOUT_S",
    "MAX_EVENT_NAMES",
    "ContainerObserver",
    "ContainerSnapshot",
    "EventStreamRefusedError",
    "InspectCache",
    "UndeclaredGpuContainer",
    "event_filters",
    "gpu_request",
    "make_client",
    "manifest_containers",
    "map_docker_state",
    "observe_containers",
    "open_events",
    "status_age_bounds",
]

#: Seconds any single Docker API call may take before the cycle gives up on it.
DEFAULT_TIMEOUT_S = 10.0

COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"

#: Seconds of slack for the "duration went backwards" restart check: the daemon's
#: clock and our monotonic clock need not tick in perfect step.
_AGE_SLACK_S = 0.5

#: Docker's state words (``State`` in the list, ``State.Status`` in inspect).
_DOCKER_STATES: Mapping[str, ContainerState] = {
    "created": ContainerState.CREATED,
    "running": ContainerState.RUNNING,
    "paused": ContainerState.PAUSED,
    "restarting": ContainerState.RESTARTING,
    "exited": ContainerState.EXITED,
    "dead": ContainerState.DEAD,
    # Only reported once the process has stopped; the container is being deleted.
    "removing": ContainerState.EXITED,
}

#: States in which Docker's ExitCode describes the last run (not a reset 0).
_EXIT_CODE_STATES = frozenset(
    {ContainerState.EXITED, ContainerState.DEAD, ContainerState.RESTARTING}
)

#: States in which Docker's healthcheck status describes the container now.
_HEALTH_STATES = frozenset({ContainerState.RUNNING, ContainerState.PAUSED})

_DOCKER_ZERO_TIME = "0001-01-01T00:00:00Z"

# go-units HumanDuration, which Docker uses in the list's Status text.
_DURATION = re.compile(
    r"Less than a second|About a minute|About an hour"
    r"|(?P<n>\d+) (?P<unit>second|minute|hour|day|week|month|year)s?"
)
_HOUR = 3600.0


def map_docker_state(docker_state: str) -> ContainerState | None:
    """The snapshot's state for Docker's state word; ``None`` for a word we do not know."""
    return _DOCKER_STATES.get(docker_state.strip().lower())


def status_age_bounds(status: str) -> tuple[float, float] | None:
    """Bounds ``[lo, hi)`` in seconds of the duration in a list ``Status`` text.

    ``"Up 3 minutes (healthy)"`` → ``(180, 240)``; ``"Exited (3) 2 hours ago"`` →
    ``(5400, 9000)``; ``"Created"`` → ``None``. The bounds follow go-units'
    ``HumanDuration`` rounding (hours are rounded, everything else truncated).
    """
    m = _DURATION.search(status)
    if m is None:
        return None
    text = m.group(0)
    if text == "Less than a second":
        return (0.0, 1.0)
    if text == "About a minute":
        return (60.0, 120.0)
    if text == "About an hour":
        return (_HOUR, 1.5 * _HOUR)
    n = int(m.group("n"))
    unit = m.group("unit")
    if unit == "second":
        return (float(n), n + 1.0)
    if unit == "minute":
        return (60.0 * n, 60.0 * (n + 1))
    if unit == "hour":
        return ((n - 0.5) * _HOUR, (n + 0.5) * _HOUR)
    if unit == "day":
        return ((24 * n - 0.5) * _HOUR, (24 * n + 23.5) * _HOUR)
    if unit == "week":
        return ((168 * n - 0.5) * _HOUR, (168 * n + 167.5) * _HOUR)
    if unit == "month":
        return ((720 * n - 0.5) * _HOUR, (720 * n + 719.5) * _HOUR)
    return (8760.0 * n * _HOUR, 8760.0 * (n + 1) * _HOUR)  # year


def _status_key(status: str) -> str:
    """The Status text with its duration blanked: what must stay equal between cycles."""
    return _DURATION.sub("…", status)


def _nvidia_devices_visible(env: object) -> bool:
    if not isinstance(env, list):
        return False
    for item in env:
        if isinstance(item, str) and item.startswith("NVIDIA_VISIBLE_DEVICES="):
            value = item.partition("=")[2].strip().lower()
            return value not in {"", "void", "none"}
    return False


def gpu_request(inspect: Mapping[str, Any]) -> str | None:
    """Why a container (its ``docker inspect`` document) gets GPUs; ``None`` if it does not.

    A container requests GPUs when it has a device request with the ``gpu``
    capability or the ``nvidia`` driver (``docker run --gpus``, Compose
    ``deploy.resources.reservations.devices``), maps an NVIDIA device node or CDI
    device (``/dev/nvidia0``, ``nvidia.com/gpu=all``), or runs under an NVIDIA
    runtime with ``NVIDIA_VISIBLE_DEVICES`` set (the legacy ``--runtime=nvidia``; a
    daemon whose default runtime is nvidia gives every container that runtime, so
    the runtime alone is not enough).
    """
    host = inspect.get("HostConfig")
    host = host if isinstance(host, Mapping) else {}
    for request in host.get("DeviceRequests") or ():
        if not isinstance(request, Mapping):
            continue
        driver = str(request.get("Driver") or "").lower()
        caps = request.get("Capabilities") or ()
        has_gpu_cap = any(
            isinstance(group, list) and "gpu" in [str(c).lower() for c in group] for group in caps
        )
        if has_gpu_cap or driver == "nvidia":
            what = "gpu capability" if has_gpu_cap else "nvidia driver"
            return f"device request ({what}, count {request.get('Count')})"
    for device in host.get("Devices") or ():
        if not isinstance(device, Mapping):
            continue
        path = str(device.get("PathOnHost") or "")
        if path.startswith("/dev/nvidia") or path.startswith("nvidia.com/gpu"):
            return f"device {path}"
    runtime = str(host.get("Runtime") or "")
    config = inspect.get("Config")
    env = config.get("Env") if isinstance(config, Mapping) else None
    if "nvidia" in runtime.lower() and _nvidia_devices_visible(env):
        return f"runtime {runtime} with NVIDIA_VISIBLE_DEVICES"
    return None


# ── results ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class UndeclaredGpuContainer:
    """A container that requests GPUs but that no manifest declares.

    ``state`` is the snapshot's state word (``running``, ``created``…), or Docker's
    own word where it has one we do not know. ``reason`` says how it gets GPUs.
    """

    name: str
    id: str
    state: str
    image: str
    compose_project: str | None
    compose_service: str | None
    reason: str


@dataclass(frozen=True)
class ContainerSnapshot:
    """One observation of the declared containers.

    ``containers`` holds every declared container that exists (one missing is
    absent), keyed by container name. When ``docker_ok`` is False, ``error`` says
    why, ``containers`` and ``undeclared_gpu`` are empty, and the snapshot means
    *unknown*, not *absent*. ``api_calls`` counts the Docker API calls this cycle
    made; ``inspected`` names the containers it inspected.
    """

    docker_ok: bool
    error: str | None = None
    containers: dict[str, ContainerModel] = field(default_factory=dict)
    undeclared_gpu: list[UndeclaredGpuContainer] = field(default_factory=list)
    api_calls: int = 0
    inspected: tuple[str, ...] = ()

    @property
    def docker(self) -> Literal["ok", "error"]:
        """The snapshot contract's ``docker`` field."""
        return "ok" if self.docker_ok else "error"

    def to_snapshot_model(
        self, *, gpus: list[GpuModel] | None = None, taken_at: str | float | None = None
    ) -> SnapshotModel:
        """The observed-snapshot contract (docs/design.md §5), with two extra keys.

        ``undeclared_gpu_containers`` lists the undeclared GPU containers and
        ``docker_error`` carries the error when Docker could not be read.
        """
        return SnapshotModel.model_validate(
            {
                "docker": self.docker,
                "containers": dict(self.containers),
                "gpus": gpus,
                "taken_at": taken_at,
                "docker_error": self.error,
                "undeclared_gpu_containers": [asdict(u) for u in self.undeclared_gpu],
            }
        )


# ── the cache ──────────────────────────────────────────────────────────────────


@dataclass(slots=True)
class _Details:
    """What one inspect told us that the list does not."""

    started_at: str | None
    exit_code: int | None
    finished_at: str | None
    oom_killed: bool | None
    health: str | None
    gpu_reason: str | None
    #: the ``VRAMCTL_GPU_ROLE`` its environment holds: the card its ``up`` was told
    gpu_role: str | None = None


@dataclass(slots=True)
class _Entry:
    details: _Details
    key: tuple[str, str]  # (State, Status with its duration blanked)
    age_lo: float | None  # lower bound of Status's duration at the last list
    seen_end: float  # monotonic time when that list call had returned
    stale: bool = False  # changed since inspected (only tracked, not re-read, if undeclared)


#: touched as a container id: every container is inspected again by the next list (an
#: event stream was opened again, and the events while none was open are unknown)
EVERY_CONTAINER = "*"


class InspectCache:
    """Inspect results by container Id, reused while the list shows no change.

    Keep one per loop (a :class:`ContainerObserver` does) so that steady-state
    cycles cost one API call. Entries for containers that left the list are dropped
    each cycle. ``clock`` is the monotonic clock the restart check measures with.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._touched: set[str] = set()  # ids an event named since the last cycle took them
        self._touched_all = False  # EVERY_CONTAINER was touched since then

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget everything: the next cycle inspects every container again."""
        self._entries.clear()

    def touch(self, container_id: str) -> None:
        """An event of this container (any thread): the next cycle inspects it again.

        Docker sends a container's ``die`` event before its list shows it exited (the
        list still says ``Up …``, inspect already says ``exited``), so the cycle the
        event asks for cannot rely on the list to see the change.
        """
        if container_id:
            with self._lock:
                if container_id == EVERY_CONTAINER:
                    self._touched_all = True
                else:
                    self._touched.add(container_id)

    def take_touched(self) -> frozenset[str]:
        """The ids touched since the last call (a cycle takes them before its list):
        every cached one after :data:`EVERY_CONTAINER` was touched."""
        with self._lock:
            out, self._touched = frozenset(self._touched), set()
            every, self._touched_all = self._touched_all, False
        # the entries are read outside the lock: only the cycle's thread changes them
        return (out | frozenset(self._entries)) if every else out


# ── the client ─────────────────────────────────────────────────────────────────


def make_client(
    *, timeout: float = DEFAULT_TIMEOUT_S, environment: Mapping[str, str] | None = None
) -> docker.DockerClient:
    """A Docker client from the usual environment (``DOCKER_HOST``, TLS, context).

    The API version is negotiated with the daemon, so this makes one API call and
    raises :class:`docker.errors.DockerException` when the daemon cannot be reached.
    ``timeout`` bounds every later call too.
    """
    kwargs: dict[str, Any] = {"timeout": timeout}
    if environment is not None:
        kwargs["environment"] = dict(environment)
    return docker.from_env(**kwargs)


#: Most container names an event stream is filtered to; with more, the stream has every
#: container's events (a filter is sent in the request's URL, and proxies in front of a
#: daemon may bound its length).
MAX_EVENT_NAMES = 256


def event_filters(client: docker.DockerClient, names: Collection[str]) -> dict[str, Any]:
    """The filters of a Docker event stream for the containers named ``names``.

    Docker matches each ``container`` filter against an event's container name and id,
    by prefix, and keeps an event that matches any of them, whether the container
    existed when the stream began or not: a declared container created or started later
    (by the controller, an ``up`` command or by hand) is in the stream. With no names,
    more than :data:`MAX_EVENT_NAMES`, or a daemon reached over SSH (its stream cannot be
    closed from another thread, so it could never be refreshed), the filter is only
    ``type=container``: every container's events.
    """
    filters: dict[str, Any] = {"type": "container"}
    over_ssh = str(getattr(client.api, "base_url", "")).endswith("//ssh")
    if names and len(names) <= MAX_EVENT_NAMES and not over_ssh:
        filters["container"] = sorted(set(names))
    return filters


class EventStreamRefusedError(Exception):
    """The daemon, or a proxy in front of it, answered an event stream's request with
    an error status (docker-py's stream would only end, empty, as if closed)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the event stream's request was answered with HTTP {status}")
        self.status = status

    @property
    def client_error(self) -> bool:
        """The request itself is refused (a proxy that bounds a request line answers
        414 or 400): the same request is refused again, an unfiltered one may not be."""
        return 400 <= self.status < 500


def open_events(client: docker.DockerClient, filters: Mapping[str, Any]) -> Any:
    """Docker's event stream with ``filters`` (decoded), or :class:`EventStreamRefusedError`
    when its request is answered with an error status."""
    stream = client.events(decode=True, filters=dict(filters))
    status = getattr(getattr(stream, "_response", None), "status_code", None)
    if isinstance(status, int) and status >= 400:
        with contextlib.suppress(Exception):
            stream.close()
        raise EventStreamRefusedError(status)
    return stream


def manifest_containers(serves: Mapping[str, Any]) -> tuple[str, ...]:
    """The container names of a manifest set's serves (``ManifestSet.serves``), deduplicated."""
    return tuple(dict.fromkeys(str(serve.container) for serve in serves.values()))


class _UnreadableError(Exception):
    """Docker answered something this cycle cannot be built on."""


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def client_endpoint(client: Any) -> str:
    """Where a client made elsewhere talks to: its socket, else its base URL."""
    api = getattr(client, "api", client)
    path = getattr(getattr(api, "_custom_adapter", None), "socket_path", None)
    if isinstance(path, str) and path:
        return f"unix://{path}"
    base = str(getattr(api, "base_url", "") or "the Docker client's daemon")
    return re.sub(r"^https?://", "tcp://", base)  # as DOCKER_HOST would name it


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _names(row: Mapping[str, Any]) -> list[str]:
    """A list row's own names (``/name``), without legacy link aliases (``/a/b``)."""
    out = []
    for raw in row.get("Names") or ():
        if isinstance(raw, str):
            name = raw[1:] if raw.startswith("/") else raw
            if name and "/" not in name:
                out.append(name)
    return out


def _details(doc: Mapping[str, Any], state: ContainerState) -> _Details:
    raw_state = doc.get("State")
    st: Mapping[str, Any] = raw_state if isinstance(raw_state, Mapping) else {}
    started = _str(st.get("StartedAt")) or None
    if started is not None and started.startswith(_DOCKER_ZERO_TIME[:10]):
        started = None
    finished = _str(st.get("FinishedAt")) or None
    if finished is not None and finished.startswith(_DOCKER_ZERO_TIME[:10]):
        finished = None
    exit_code = st.get("ExitCode")
    raw_health = st.get("Health")
    health = _str(raw_health.get("Status")) if isinstance(raw_health, Mapping) else ""
    oom = st.get("OOMKilled")
    return _Details(
        started_at=started,
        exit_code=exit_code if isinstance(exit_code, int) and state in _EXIT_CODE_STATES else None,
        oom_killed=oom if isinstance(oom, bool) else None,
        finished_at=finished,
        # Docker keeps the last health of a stopped container; like `docker ps`, show it
        # only while the container is up.
        health=health if health and health != "none" and state in _HEALTH_STATES else None,
        gpu_reason=gpu_request(doc),
        gpu_role=told_gpu_role(doc),
    )


def told_gpu_role(doc: Mapping[str, Any]) -> str | None:
    """The ``VRAMCTL_GPU_ROLE`` an inspected container was created with (its
    environment): the card its ``up`` was told (statemachine/ledger/gpu_vars.py); ``None`` when
    it does not say."""
    config = doc.get("Config")
    env = config.get("Env") if isinstance(config, Mapping) else None
    for entry in env if isinstance(env, list) else ():
        key, _, value = str(entry).partition("=")
        if key == "VRAMCTL_GPU_ROLE":
            return value or None
    return None


class _Cycle:
    """One observation: one list call, then the inspects the cache cannot answer."""

    def __init__(self, client: Any, cache: InspectCache, calls: int) -> None:
        self.api = client.api
        self.cache = cache
        self.calls = calls
        self.inspected: list[str] = []

    def inspect(self, cid: str, name: str) -> Mapping[str, Any] | None:
        self.calls += 1
        self.inspected.append(name)
        try:
            doc = self.api.inspect_container(cid)
        except NotFound:
            return None
        if not isinstance(doc, Mapping):
            raise _UnreadableError(f"docker inspect {name}: unexpected answer {type(doc).__name__}")
        return doc

    def run(self, names: Collection[str]) -> ContainerSnapshot:
        wanted = set(names)
        cache = self.cache
        touched = cache.take_touched()  # before the list: an event after it is kept
        list_start = cache.clock()
        self.calls += 1
        rows = self.api.containers(all=True)
        self.listing = _Listing(touched, list_start, cache.clock())
        if not isinstance(rows, list):
            raise _UnreadableError(f"docker ps: unexpected answer {type(rows).__name__}")

        containers: dict[str, ContainerModel] = {}
        undeclared: list[UndeclaredGpuContainer] = []
        seen: set[str] = set()
        for row in rows:
            if not isinstance(row, Mapping):
                continue
            cid = _str(row.get("Id"))
            names_of = _names(row)
            if not cid or not names_of:
                continue
            declared = [n for n in names_of if n in wanted]
            name = declared[0] if declared else names_of[0]
            read = self.read_row(row, cid, name, declared=bool(declared))
            if read is None:  # removed between the list and the inspect: absent
                continue
            seen.add(cid)
            entry, docker_state, state = read
            raw_labels = row.get("Labels")
            labels: Mapping[str, Any] = raw_labels if isinstance(raw_labels, Mapping) else {}
            project = labels.get(COMPOSE_PROJECT_LABEL)
            service = labels.get(COMPOSE_SERVICE_LABEL)
            project = project if isinstance(project, str) else None
            service = service if isinstance(service, str) else None
            if declared:
                assert state is not None  # checked in read_row
                d = entry.details
                fields: dict[str, Any] = {
                    "id": cid,
                    "state": state,
                    "health": d.health,
                    "started_at": d.started_at,
                    "exit_code": d.exit_code,
                    "oom_killed": d.oom_killed,
                    "finished_at": d.finished_at,
                    "compose_project": project,
                    "compose_service": service,
                }
                if d.gpu_role is not None:
                    fields["gpu_role"] = d.gpu_role
                if docker_state == "removing":
                    fields["docker_state"] = docker_state
                model = ContainerModel.model_validate(fields)
                for n in declared:
                    containers[n] = model
            elif entry.details.gpu_reason is not None:
                undeclared.append(
                    UndeclaredGpuContainer(
                        name=name,
                        id=cid[:12],
                        state=str(state) if state is not None else docker_state,
                        image=_str(row.get("Image")),
                        compose_project=project,
                        compose_service=service,
                        reason=entry.details.gpu_reason,
                    )
                )

        for gone in set(cache._entries) - seen:
            del cache._entries[gone]
        undeclared.sort(key=lambda u: u.name)
        return ContainerSnapshot(
            docker_ok=True,
            containers=containers,
            undeclared_gpu=undeclared,
            api_calls=self.calls,
            inspected=tuple(self.inspected),
        )

    def read_row(
        self, row: Mapping[str, Any], cid: str, name: str, *, declared: bool
    ) -> tuple[_Entry, str, ContainerState | None] | None:
        """One list row's cache entry (inspected when the cache cannot answer), its
        Docker state word and its state; ``None`` when the container went away."""
        docker_state = _str(row.get("State")).lower()
        status = _str(row.get("Status"))
        key = (docker_state, _status_key(status))
        bounds = status_age_bounds(status)
        state = map_docker_state(docker_state)
        if declared and state is None:
            raise _UnreadableError(f"container {name}: unknown docker state {docker_state!r}")
        listing = self.listing
        entry = self.cache._entries.get(cid)
        if entry is not None:
            # The least time the daemon can have seen pass since it last printed it:
            elapsed_min = listing.start - entry.seen_end
            went_back = (
                entry.age_lo is not None
                and bounds is not None
                and bounds[1] < entry.age_lo + elapsed_min - _AGE_SLACK_S
            )
            if entry.key != key or went_back or cid in listing.touched:
                entry.stale = True
            entry.key, entry.age_lo, entry.seen_end = (
                key,
                None if bounds is None else bounds[0],
                listing.end,
            )
            if not (declared and entry.stale):
                return entry, docker_state, state
        doc = self.inspect(cid, name)
        if doc is None:
            self.cache._entries.pop(cid, None)
            return None
        fresh_word, fresh_state, stale = _moved_on(doc, docker_state, state)
        if stale:
            # It moved on since the list: report what inspect saw, re-read next cycle.
            if declared and fresh_state is None:
                raise _UnreadableError(f"container {name}: unknown docker state {fresh_word!r}")
            docker_state, state = fresh_word, fresh_state
        entry = _Entry(
            details=_details(doc, state or ContainerState.RUNNING),
            key=key,
            age_lo=None if bounds is None else bounds[0],
            seen_end=self.listing.end,
            stale=stale,
        )
        self.cache._entries[cid] = entry
        return entry, docker_state, state


@dataclass(frozen=True, slots=True)
class _Listing:
    """When one list call ran, and the containers events touched before it."""

    touched: Collection[str]
    start: float
    end: float


def _moved_on(
    doc: Mapping[str, Any], docker_state: str, state: ContainerState | None
) -> tuple[str, ContainerState | None, bool]:
    """Inspect's state word and state, and whether they differ from the list's."""
    raw_state = doc.get("State")
    fresh_word = _str(raw_state.get("Status")).lower() if isinstance(raw_state, Mapping) else ""
    if not fresh_word or fresh_word == docker_state:
        return docker_state, state, False
    return fresh_word, map_docker_state(fresh_word), True


def _error(message: str, calls: int) -> ContainerSnapshot:
    return ContainerSnapshot(docker_ok=False, error=message, api_calls=calls)


def observe_containers(
    names: Collection[str],
    *,
    client: docker.DockerClient | None = None,
    cache: InspectCache | None = None,
    where: str | None = None,
) -> ContainerSnapshot:
    """One snapshot of the named containers (and of undeclared GPU containers).

    ``client`` defaults to a fresh :func:`make_client` (one extra API call, closed
    afterwards). Without a ``cache`` every container is inspected; pass the same
    :class:`InspectCache` every cycle (or use :class:`ContainerObserver`) to get the
    one-call steady state. Never raises for anything Docker does: an unreachable
    daemon or an API error gives ``docker_ok=False`` with the error, one line that says
    ``where`` it looked (default: where :func:`make_client` looks, or where ``client``
    talks to) and what to do (:func:`controller.adapters.docker.reach.unreachable_message`).
    """
    calls = 0
    own = client is None
    if where is None:
        where = docker_endpoint() if client is None else client_endpoint(client)
    if client is None:
        calls += 1
        try:
            client = make_client()
        except Exception as exc:  # a malformed environment must not stop the loop either
            return _error(unreachable_message(exc, where), calls)
    cycle = _Cycle(client, cache if cache is not None else InspectCache(), calls)
    try:
        return cycle.run(names)
    except _UnreadableError as exc:
        return _error(str(exc), cycle.calls)
    except (DockerException, OSError) as exc:  # requests' errors are OSErrors
        return _error(unreachable_message(exc, where), cycle.calls)
    except Exception as exc:  # fail closed rather than end the loop
        return _error(f"docker snapshot failed: {_describe(exc)}", cycle.calls)
    finally:
        if own:
            with contextlib.suppress(Exception):
                client.close()


class ContainerObserver:
    """Observes containers cycle after cycle with one client and one :class:`InspectCache`.

    Without a ``client`` it makes one on first use (and again after a failure to
    make one, so a daemon that comes up later is found) and closes it in
    :meth:`close`. A client passed in is the caller's to close.
    """

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._owns_client = client is None
        #: where it looks, said in every error (read again each time a client is made)
        self.where = client_endpoint(client) if client is not None else docker_endpoint()
        self._timeout = timeout
        self.cache = InspectCache(clock=clock)

    def observe(self, names: Collection[str]) -> ContainerSnapshot:
        """One snapshot; see :func:`observe_containers`."""
        calls = 0
        if self._client is None:
            calls = 1
            self.where = docker_endpoint()
            try:
                self._client = make_client(timeout=self._timeout)
            except Exception as exc:
                return _error(unreachable_message(exc, self.where), calls)
        snap = observe_containers(names, client=self._client, cache=self.cache, where=self.where)
        if not snap.docker_ok:
            self.cache.clear()  # the daemon may have restarted: trust nothing cached
        if calls:
            snap = ContainerSnapshot(
                docker_ok=snap.docker_ok,
                error=snap.error,
                containers=snap.containers,
                undeclared_gpu=snap.undeclared_gpu,
                api_calls=snap.api_calls + calls,
                inspected=snap.inspected,
            )
        return snap

    def close(self) -> None:
        """Close the client if this observer made it."""
        if self._owns_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
