"""NVML adapter: what the GPUs hold, read through ``pynvml`` (package ``nvidia-ml-py``).

Per device it reports the UUID, the NVML index, the name and total / used / free MiB
(:class:`controller.snapshot.GpuModel`, the ``gpus`` list of the observed snapshot);
per process on a device it reports the memory the driver attributes to it and, through
the process's cgroup, the docker container it runs in (:class:`GpuProcess`). A gpu role
is linked to its device by the role's ``uuid`` in the manifest; that join is not made
here.

Unknown is never zero. No NVML library, no driver, or a failed ``nvmlInit``: the
observation has ``gpus=None`` (the snapshot's ``"gpus": null``) and says why in
``error``; nothing is raised, so the controller keeps working. A device whose memory
cannot be read keeps its place with ``None`` figures. A process whose memory the driver
reports as not available (WSL2, MIG without privileges, Windows WDDM) has
``used_mib=None``. A device whose process list cannot be read is named in
``process_errors``, and per-container figures are then unknown as well.

Sessions: every :func:`observe_gpus` call does its own ``nvmlInit`` ... ``nvmlShutdown``
(``nvmlShutdown`` in ``finally``, only after a successful init). That costs an init per
cycle but survives a driver reload or upgrade between cycles (stale handles would
otherwise fail until the process restarts), and leaves no NVML state between calls.

The seam is :class:`NvmlApi`: exactly the ``pynvml`` functions used here. The real
implementation is the ``pynvml`` module itself, imported lazily inside
:func:`observe_gpus` so that a broken install cannot break importing the controller.
Tests pass a scripted fake that raises ``pynvml``'s own exception classes.

Verified in the installed ``pynvml`` (13.x) source:

* ``NVMLError(code)`` returns the subclass for the code (``NVMLError_LibraryNotFound``,
  ``NVMLError_DriverNotLoaded``, ``NVMLError_NotSupported``, ...); ``nvmlInit`` without
  ``libnvidia-ml.so.1`` raises ``NVMLError_LibraryNotFound``; ``nvmlShutdown`` when the
  library never loaded raises ``NVMLError_Uninitialized``.
* The unversioned process-list calls turn ``NVMLError_FunctionNotFound`` into
  ``NVMLLibraryMismatchError``, which is *not* an ``NVMLError``: both are caught.
* The process-list calls already turn ``usedGpuMemory == NVML_VALUE_NOT_AVAILABLE``
  (2**64-1) into ``None``; the sentinel is mapped to ``None`` here as well, for any
  binding that passes it through.
* ``nvmlDeviceGetMemoryInfo`` (v1) gives ``total``, ``free``, ``used`` in bytes, with
  ``used = total - free`` (driver-reserved memory counts as used).

This module must not change GPU state: it only reads (no clocks, modes, resets or
process kills). It is the only module that imports ``pynvml``. It does not talk to
docker: mapping container ids to names is the caller's, from the docker snapshot.
When the controller runs in a container, per-process attribution needs the host's PID
and cgroup namespaces (``pid: host``, ``cgroup: host``): NVML reports host PIDs.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from controller.snapshot import GpuModel

MIB = 2**20
#: NVML's "value not available" for unsigned 64-bit figures (``usedGpuMemory``).
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1

__all__ = [
    "GpuObservation",
    "GpuProcess",
    "NvmlApi",
    "container_of_pid",
    "observe_gpus",
    "running_on_wsl",
    "usage_by_container",
]


class NvmlMemory(Protocol):
    """``nvmlDeviceGetMemoryInfo``'s answer (``c_nvmlMemory_t``), in bytes."""

    @property
    def total(self) -> int: ...
    @property
    def free(self) -> int: ...
    @property
    def used(self) -> int: ...


class NvmlProcess(Protocol):
    """One entry of a running-process list (pynvml's friendly object)."""

    @property
    def pid(self) -> int: ...
    @property
    def usedGpuMemory(self) -> int | None: ...  # noqa: N802 - NVML's field name


class NvmlApi(Protocol):
    """The ``pynvml`` functions this adapter uses; the ``pynvml`` module satisfies it."""

    def nvmlInit(self) -> None: ...  # noqa: N802
    def nvmlShutdown(self) -> None: ...  # noqa: N802
    def nvmlDeviceGetCount(self) -> int: ...  # noqa: N802
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...  # noqa: N802
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...  # noqa: N802
    def nvmlDeviceGetName(self, handle: Any) -> str: ...  # noqa: N802
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> NvmlMemory: ...  # noqa: N802
    def nvmlDeviceGetComputeRunningProcesses(  # noqa: N802
        self, handle: Any
    ) -> Sequence[NvmlProcess]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(  # noqa: N802
        self, handle: Any
    ) -> Sequence[NvmlProcess]: ...


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process NVML lists on a device.

    ``used_mib`` is ``None`` where the driver does not report per-process memory;
    ``container`` is the 64-hex docker container id from the process's cgroup, or
    ``None`` for a host process or one that could not be attributed.
    """

    uuid: str
    pid: int
    used_mib: int | None
    container: str | None


@dataclass(frozen=True, slots=True)
class GpuObservation:
    """One NVML reading.

    ``gpus`` is ``None`` when NVML is unavailable (``error`` says why). Devices that
    NVML counts but that could not be read at all (no handle or no UUID) are left out
    of ``gpus`` and named by index in ``device_errors``. ``process_errors`` maps a
    device UUID to why its process list is unknown.
    """

    gpus: list[GpuModel] | None
    error: str | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    device_errors: dict[int, str] = field(default_factory=dict)
    process_errors: dict[str, str] = field(default_factory=dict)

    @property
    def processes_complete(self) -> bool:
        """True when every readable device's process list was read.

        Only then does "no process of a container" mean the container holds no GPU
        memory; otherwise it means unknown.
        """
        return self.gpus is not None and not self.device_errors and not self.process_errors

    def snapshot_gpus(self) -> list[dict[str, Any]] | None:
        """The snapshot's ``gpus`` value (docs/design.md §5): a list of devices, or ``None``."""
        if self.gpus is None:
            return None
        return [g.model_dump(mode="json") for g in self.gpus]


def _mib(value: int | None) -> int | None:
    """Bytes to whole MiB (rounded down); the not-available sentinel stays unknown."""
    if value is None or value < 0 or value >= NVML_VALUE_NOT_AVAILABLE:
        return None
    return int(value) // MIB


def _describe(exc: BaseException) -> str:
    """``message (ClassName)``; pynvml's ``__str__`` may itself call into NVML."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    name = type(exc).__name__
    return f"{text} ({name})" if text else name


# One container id: 64 hex digits as a whole path element, or ending one after a
# runtime prefix (``docker-<id>.scope``, ``cri-containerd-<id>.scope``, ``crio-<id>``,
# ``libpod-<id>``).
_CONTAINER_ID = re.compile(r"(?:^|[/\-:])([0-9a-f]{64})(?:\.scope)?(?=/|$)")


def container_of_pid(pid: int, *, proc_root: str | Path = "/proc") -> str | None:
    """The docker container id a process runs in, from ``<proc_root>/<pid>/cgroup``.

    Understands cgroup v2 (``0::/system.slice/docker-<id>.scope``) and v1
    (``4:memory:/docker/<id>``), Kubernetes (``/kubepods/.../<id>``,
    ``cri-containerd-<id>.scope``, ``crio-<id>.scope``), podman (``libpod-<id>``) and
    nested containers (the innermost id wins). Returns ``None`` for a process that has
    gone, cannot be read, or runs outside a container. Reads one file; never raises
    for a missing process.
    """
    if pid <= 0:
        return None
    try:
        text = (Path(proc_root) / str(pid) / "cgroup").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        # hierarchy-id:controllers:path; the path may itself hold ':'
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ids = _CONTAINER_ID.findall(parts[2].strip())
        if ids:
            return str(ids[-1])
    return None


def running_on_wsl(*, proc_root: str | Path = "/proc") -> bool:
    """True under WSL (its kernel release names Microsoft); False when unreadable."""
    try:
        release = (Path(proc_root) / "sys" / "kernel" / "osrelease").read_text(encoding="utf-8")
    except OSError:
        return False
    lowered = release.lower()
    return "microsoft" in lowered or "wsl" in lowered


def usage_by_container(
    processes: Iterable[GpuProcess],
    id_to_name: Mapping[str, str],
    *,
    names: Iterable[str] = (),
    complete: bool = True,
) -> dict[str, int | None]:
    """GPU memory per container name, summed over its processes on all devices.

    ``id_to_name`` maps docker container ids (from the docker snapshot) to names;
    processes of other containers or of the host are left out. A container with any
    process of unknown usage gets ``None`` (unknown), never a partial sum.

    ``names`` are containers the caller wants a figure for even when no process of
    theirs is listed: ``0`` when the process lists were ``complete``
    (:attr:`GpuObservation.processes_complete`), else ``None``. With ``complete``
    False every figure is ``None``: a device whose list could not be read may hold
    more of any container's memory.
    """
    totals: dict[str, int | None] = {}
    for proc in processes:
        if proc.container is None:
            continue
        name = id_to_name.get(proc.container)
        if name is None:
            continue
        if proc.used_mib is None or (name in totals and totals[name] is None):
            totals[name] = None
        else:
            totals[name] = (totals.get(name) or 0) + proc.used_mib
    for name in names:
        totals.setdefault(name, 0)
    if not complete:
        return dict.fromkeys(totals)
    return totals


def _load_pynvml() -> tuple[NvmlApi | None, tuple[type[BaseException], ...], str | None]:
    """The real ``pynvml`` module and its error classes, or why it cannot be imported."""
    try:
        import pynvml
    except Exception as exc:  # ImportError, or a broken install failing at import
        return None, (), f"NVML unavailable: pynvml cannot be imported: {_describe(exc)}"
    errors: list[type[BaseException]] = []
    for attr in ("NVMLError", "NVMLLibraryMismatchError"):
        cls = getattr(pynvml, attr, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            errors.append(cls)
    return cast(NvmlApi, pynvml), tuple(errors), None


def observe_gpus(
    api: NvmlApi | None = None,
    *,
    pid_to_container: Callable[[int], str | None] | None = None,
    wsl: bool | None = None,
) -> GpuObservation:
    """Read every device and its processes once; never raises, never changes the GPU.

    ``api`` defaults to the ``pynvml`` module. ``pid_to_container`` maps a host PID to
    a docker container id (default :func:`container_of_pid` on ``/proc``). ``wsl``
    (default: detected) marks every device whose process list comes back empty as
    unknown, since WSL2 may list no processes at all; processes it does list carry
    ``used_mib=None`` there anyway.
    """
    real, errors, import_error = _load_pynvml()
    if api is None:
        if real is None:
            return GpuObservation(gpus=None, error=import_error)
        api = real
    if pid_to_container is None:
        pid_to_container = container_of_pid
    if wsl is None:
        wsl = running_on_wsl()

    try:
        api.nvmlInit()
    except errors as exc:
        return GpuObservation(gpus=None, error=f"NVML unavailable: {_describe(exc)}")
    except Exception as exc:  # an adapter fails to "unknown", whatever the cause
        return GpuObservation(gpus=None, error=f"NVML init failed: {_describe(exc)}")
    try:
        return _read_devices(api, errors, pid_to_container, wsl=wsl)
    except Exception as exc:  # not an NVML error: a bug or a broken binding
        return GpuObservation(gpus=None, error=f"NVML observation failed: {_describe(exc)}")
    finally:
        # the reading is complete; a failed shutdown changes nothing in it
        with contextlib.suppress(Exception):
            api.nvmlShutdown()


def _read_devices(
    api: NvmlApi,
    errors: tuple[type[BaseException], ...],
    pid_to_container: Callable[[int], str | None],
    *,
    wsl: bool,
) -> GpuObservation:
    try:
        count = int(api.nvmlDeviceGetCount())
    except errors as exc:
        return GpuObservation(gpus=None, error=f"NVML device count failed: {_describe(exc)}")

    gpus: list[GpuModel] = []
    processes: list[GpuProcess] = []
    device_errors: dict[int, str] = {}
    process_errors: dict[str, str] = {}
    for index in range(count):
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
            uuid = str(api.nvmlDeviceGetUUID(handle))
        except errors as exc:
            device_errors[index] = _describe(exc)
            continue

        name: str | None
        try:
            name = str(api.nvmlDeviceGetName(handle))
        except errors:
            name = None

        total = used = free = None
        try:
            mem = api.nvmlDeviceGetMemoryInfo(handle)
            total, used, free = _mib(mem.total), _mib(mem.used), _mib(mem.free)
        except errors:
            pass  # figures stay unknown, the device stays listed
        gpus.append(
            GpuModel(
                uuid=uuid, index=index, name=name, total_mib=total, used_mib=used, free_mib=free
            )
        )

        listed, why = _device_processes(api, errors, handle)
        if why is not None:
            process_errors[uuid] = why
        elif wsl and not listed:
            process_errors[uuid] = "WSL2: the driver may list no processes"
        for pid, used_bytes in listed.items():
            processes.append(
                GpuProcess(
                    uuid=uuid,
                    pid=pid,
                    used_mib=_mib(used_bytes),
                    container=pid_to_container(pid),
                )
            )

    return GpuObservation(
        gpus=gpus,
        processes=processes,
        device_errors=device_errors,
        process_errors=process_errors,
    )


def _device_processes(
    api: NvmlApi, errors: tuple[type[BaseException], ...], handle: Any
) -> tuple[dict[int, int | None], str | None]:
    """PID -> used bytes (``None``: not available) over compute and graphics lists.

    A process in both lists (type C+G) is counted once, keeping a known figure. A
    failed compute list makes the device's processes unknown. A graphics list the
    device does not support (``NVMLError_NotSupported``, e.g. a headless data-centre
    card) means no graphics processes; any other failure makes them unknown.
    """
    found: dict[int, int | None] = {}

    def merge(procs: Iterable[NvmlProcess]) -> None:
        for p in procs:
            pid = int(p.pid)
            used = p.usedGpuMemory
            if used is not None and used >= NVML_VALUE_NOT_AVAILABLE:
                used = None
            if pid not in found or found[pid] is None:
                found[pid] = used

    try:
        merge(api.nvmlDeviceGetComputeRunningProcesses(handle))
    except errors as exc:
        return {}, f"compute process list: {_describe(exc)}"
    try:
        merge(api.nvmlDeviceGetGraphicsRunningProcesses(handle))
    except errors as exc:
        if not _is_not_supported(exc):
            return found, f"graphics process list: {_describe(exc)}"
    return found, None


def _is_not_supported(exc: BaseException) -> bool:
    """True for pynvml's ``NVMLError_NotSupported`` (NVML_ERROR_NOT_SUPPORTED = 3)."""
    return type(exc).__name__ == "NVMLError_NotSupported" or getattr(exc, "value", None) == 3
