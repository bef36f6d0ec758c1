"""A scripted NVML for tests without a GPU, shared by the NVML and observation tests.

:class:`FakeNvml` stands in for the ``pynvml`` module at the adapter's
:class:`controller.adapters.nvml.NvmlApi` seam: it reports the devices and processes a
test scripts and raises ``pynvml``'s *own* exception classes (``pynvml.NVMLError(code)``
maps the code to its subclass, as the real binding does). It also checks that no
device call happens outside ``nvmlInit`` / ``nvmlShutdown``.

Import as ``from support.fakes_nvml import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

from controller.adapters.nvml import MIB

__all__ = ["GIB", "FakeDevice", "FakeMemory", "FakeNvml", "FakeProc", "nvml_error"]

GIB = 1024 * MIB


def nvml_error(code: int) -> pynvml.NVMLError:
    """The exception the real binding raises for an NVML return code."""
    return pynvml.NVMLError(code)


@dataclass
class FakeProc:
    """pynvml's friendly process object: ``pid`` and ``usedGpuMemory`` (bytes/None)."""

    pid: int
    usedGpuMemory: int | None  # noqa: N815 - NVML's field name


@dataclass
class FakeMemory:
    total: int
    free: int
    used: int


@dataclass
class FakeDevice:
    """One scripted device; an ``*_error`` code makes that call raise."""

    uuid: str
    name: str = "NVIDIA RTX 6000 Ada Generation"
    total: int = 48 * GIB
    used: int = 0
    compute: list[FakeProc] = field(default_factory=list)
    graphics: list[FakeProc] = field(default_factory=list)
    handle_error: int | None = None
    uuid_error: int | None = None
    name_error: int | None = None
    memory_error: int | None = None
    compute_error: BaseException | None = None
    graphics_error: BaseException | None = None


class FakeNvml:
    """Scripted NVML at the adapter seam; raises pynvml's own exception classes."""

    def __init__(
        self,
        devices: list[FakeDevice] | None = None,
        *,
        init_error: BaseException | None = None,
        count_error: int | None = None,
        shutdown_error: BaseException | None = None,
    ) -> None:
        self.devices = devices or []
        self.init_error = init_error
        self.count_error = count_error
        self.shutdown_error = shutdown_error
        self.calls: list[str] = []
        self.initialised = 0

    def _device(self, handle: Any) -> FakeDevice:
        assert self.initialised > 0, "NVML used outside nvmlInit/nvmlShutdown"
        assert isinstance(handle, FakeDevice)
        return handle

    def nvmlInit(self) -> None:  # noqa: N802
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("shutdown")
        if self.initialised == 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)  # as the real binding
        self.initialised -= 1
        if self.shutdown_error is not None:
            raise self.shutdown_error

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        assert self.initialised > 0
        if self.count_error is not None:
            raise nvml_error(self.count_error)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        assert self.initialised > 0
        dev = self.devices[index]
        if dev.handle_error is not None:
            raise nvml_error(dev.handle_error)
        return dev

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        dev = self._device(handle)
        if dev.uuid_error is not None:
            raise nvml_error(dev.uuid_error)
        return dev.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        dev = self._device(handle)
        if dev.name_error is not None:
            raise nvml_error(dev.name_error)
        return dev.name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> FakeMemory:  # noqa: N802
        dev = self._device(handle)
        if dev.memory_error is not None:
            raise nvml_error(dev.memory_error)
        return FakeMemory(total=dev.total, free=dev.total - dev.used, used=dev.used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[FakeProc]:  # noqa: N802
        dev = self._device(handle)
        if dev.compute_error is not None:
            raise dev.compute_error
        return list(dev.compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[FakeProc]:  # noqa: N802
        dev = self._device(handle)
        if dev.graphics_error is not None:
            raise dev.graphics_error
        return list(dev.graphics)
