"""The NVML adapter without a GPU (docs/design.md §7).

Three kinds of test:

* the real ``pynvml`` module on this GPU-less host: ``nvmlInit`` raises
  ``NVMLError_LibraryNotFound`` and the adapter turns it into ``gpus: null``;
* :class:`FakeNvml` (in ``fakes_nvml``, shared with ``test_observe``), a scripted
  stand-in at the :class:`NvmlApi` seam that reports the devices and processes a test
  scripts and raises ``pynvml``'s *own* exception classes (``pynvml.NVMLError(code)``
  maps the code to its subclass, as the real binding does);
* :class:`FakeLibNvml`, a stand-in for ``libnvidia-ml.so`` at the ctypes boundary, so
  that the real ``pynvml`` functions run end to end - including its conversion of
  ``usedGpuMemory == NVML_VALUE_NOT_AVAILABLE`` to ``None``.

Cgroup attribution reads fake ``/proc/<pid>/cgroup`` files in a temporary directory.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest
from support.fakes_nvml import GIB, FakeDevice, FakeNvml, FakeProc, nvml_error

from controller.adapters.nvml import (
    MIB,
    NVML_VALUE_NOT_AVAILABLE,
    GpuObservation,
    GpuProcess,
    container_of_pid,
    observe_gpus,
    running_on_wsl,
    usage_by_container,
)
from controller.snapshot import parse_snapshot

SUCCESS: int = pynvml.NVML_SUCCESS
INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-55555555-6666-7777-8888-999999999999"
CID_A = "a" * 64
CID_B = "0123456789abcdef" * 4
CID_C = "fedcba9876543210" * 4


# --------------------------------------------------------------------------- fakes


def by_pid(mapping: Mapping[int, str]) -> Callable[[int], str | None]:
    return mapping.get


def observe(fake: FakeNvml, pids: Mapping[int, str] | None = None, **kw: Any) -> GpuObservation:
    kw.setdefault("wsl", False)
    obs = observe_gpus(fake, pid_to_container=by_pid(pids or {}), **kw)
    assert fake.initialised == 0, "every successful nvmlInit is matched by nvmlShutdown"
    return obs


def libnvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


no_libnvml = pytest.mark.skipif(libnvml_present(), reason="libnvidia-ml.so.1 is installed here")


# ------------------------------------------------------------ pynvml's own behaviour


@pytest.mark.parametrize(
    ("code", "cls_name", "text"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound", "Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded", "Driver Not Loaded"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "NVMLError_NotSupported", "Not Supported"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVMLError_NoPermission", "Insufficient Permissions"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost", "GPU is lost"),
        (
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "NVMLError_LibRmVersionMismatch",
            "version mismatch",
        ),
    ],
)
def test_pynvml_maps_error_codes_to_its_own_subclasses(code: int, cls_name: str, text: str) -> None:
    exc = pynvml.NVMLError(code)
    assert type(exc) is getattr(pynvml, cls_name)
    assert isinstance(exc, pynvml.NVMLError)
    assert exc.value == code
    assert text.lower() in str(exc).lower()


def test_pynvml_library_mismatch_error_is_not_an_nvml_error() -> None:
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)


@no_libnvml
def test_real_pynvml_without_library_raises_library_not_found() -> None:
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    # and a shutdown after that failure is itself an error: never call it then
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


@no_libnvml
def test_real_adapter_without_library_says_gpus_null_and_does_not_raise() -> None:
    obs = observe_gpus()
    assert obs.gpus is None
    assert obs.error is not None
    assert "library not found" in obs.error.lower()
    assert "NVMLError_LibraryNotFound" in obs.error
    assert obs.processes == []
    assert not obs.processes_complete
    assert obs.snapshot_gpus() is None
    # twice: nothing is left half-initialised
    assert observe_gpus().gpus is None


# ------------------------------------------------------------------- devices


def test_devices_report_uuid_index_name_and_mib() -> None:
    fake = FakeNvml(
        [
            FakeDevice(UUID0, total=48 * GIB, used=20 * GIB + 123),
            FakeDevice(UUID1, name="NVIDIA GeForce RTX 4090", total=24 * GIB - 1, used=MIB - 1),
        ]
    )
    obs = observe(fake)
    assert obs.error is None
    assert obs.gpus is not None
    g0, g1 = obs.gpus
    assert (g0.uuid, g0.index, g0.name) == (UUID0, 0, "NVIDIA RTX 6000 Ada Generation")
    assert (g0.total_mib, g0.used_mib, g0.free_mib) == (49152, 20480, 28671)
    assert (g1.uuid, g1.index, g1.name) == (UUID1, 1, "NVIDIA GeForce RTX 4090")
    # bytes // 2**20: partial MiB round down
    assert (g1.total_mib, g1.used_mib, g1.free_mib) == (24575, 0, 24575)
    assert fake.calls == ["init", "shutdown"]
    assert obs.processes_complete


def test_no_devices_is_an_empty_list_not_null() -> None:
    obs = observe(FakeNvml([]))
    assert obs.gpus == []
    assert obs.error is None
    assert obs.processes_complete


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_UNKNOWN,
    ],
)
def test_failed_init_is_gpus_null_with_the_reason_and_no_shutdown(code: int) -> None:
    exc = nvml_error(code)
    fake = FakeNvml([FakeDevice(UUID0)], init_error=exc)
    obs = observe(fake)
    assert obs.gpus is None
    assert obs.error == f"NVML unavailable: {exc} ({type(exc).__name__})"
    assert fake.calls == ["init"]


def test_failed_device_count_is_gpus_null() -> None:
    fake = FakeNvml([FakeDevice(UUID0)], count_error=pynvml.NVML_ERROR_GPU_IS_LOST)
    obs = observe(fake)
    assert obs.gpus is None
    assert obs.error is not None
    assert "GPU is lost" in obs.error
    assert fake.calls == ["init", "shutdown"]


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_GPU_IS_LOST])
def test_unreadable_memory_keeps_the_device_with_unknown_figures(code: int) -> None:
    obs = observe(FakeNvml([FakeDevice(UUID0, memory_error=code), FakeDevice(UUID1, used=GIB)]))
    assert obs.gpus is not None
    g0, g1 = obs.gpus
    assert g0.uuid == UUID0
    assert (g0.total_mib, g0.used_mib, g0.free_mib) == (None, None, None)
    assert g1.used_mib == 1024
    # unknown survives the snapshot contract as null, never 0
    snap = parse_snapshot({"docker": "ok", "gpus": obs.snapshot_gpus()})
    gpus = snap.to_observed().gpus
    assert gpus is not None
    assert gpus[0].used_mib is None
    assert gpus[0].total_mib is None


def test_unreadable_name_is_unknown() -> None:
    obs = observe(FakeNvml([FakeDevice(UUID0, name_error=pynvml.NVML_ERROR_NOT_SUPPORTED)]))
    assert obs.gpus is not None
    assert obs.gpus[0].name is None
    assert obs.gpus[0].total_mib == 48 * 1024


def test_device_without_handle_or_uuid_is_left_out_and_named() -> None:
    fake = FakeNvml(
        [
            FakeDevice(UUID0, handle_error=pynvml.NVML_ERROR_NO_PERMISSION),
            FakeDevice(UUID1),
            FakeDevice("GPU-x", uuid_error=pynvml.NVML_ERROR_GPU_IS_LOST),
        ]
    )
    obs = observe(fake)
    assert obs.gpus is not None
    assert [(g.uuid, g.index) for g in obs.gpus] == [(UUID1, 1)]
    assert set(obs.device_errors) == {0, 2}
    assert "Insufficient Permissions" in obs.device_errors[0]
    assert "NVMLError_GpuIsLost" in obs.device_errors[2]
    assert not obs.processes_complete


def test_failed_shutdown_does_not_spoil_the_reading() -> None:
    fake = FakeNvml(
        [FakeDevice(UUID0, used=GIB)],
        shutdown_error=nvml_error(pynvml.NVML_ERROR_UNKNOWN),
    )
    obs = observe(fake)
    assert obs.gpus is not None
    assert obs.gpus[0].used_mib == 1024
    assert obs.error is None


def test_a_non_nvml_failure_is_gpus_null_not_a_crash() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:  # noqa: N802
            raise RuntimeError("binding exploded")

    fake = Broken([FakeDevice(UUID0)])
    obs = observe(fake)
    assert obs.gpus is None
    assert obs.error is not None
    assert "binding exploded" in obs.error
    assert "RuntimeError" in obs.error
    assert fake.calls == ["init", "shutdown"]


def test_init_failing_with_a_foreign_exception_is_gpus_null() -> None:
    obs = observe(FakeNvml(init_error=OSError("libnvidia-ml.so.1: bad ELF")))
    assert obs.gpus is None
    assert obs.error is not None
    assert "bad ELF" in obs.error


# ------------------------------------------------------------------ processes


def test_processes_are_attributed_to_containers() -> None:
    fake = FakeNvml(
        [
            FakeDevice(UUID0, used=30 * GIB, compute=[FakeProc(100, 20 * GIB), FakeProc(101, GIB)]),
            FakeDevice(UUID1, used=9 * GIB, compute=[FakeProc(200, 8 * GIB + 5)]),
        ]
    )
    obs = observe(fake, {100: CID_A, 200: CID_A, 101: CID_B})
    assert obs.processes == [
        GpuProcess(uuid=UUID0, pid=100, used_mib=20480, container=CID_A),
        GpuProcess(uuid=UUID0, pid=101, used_mib=1024, container=CID_B),
        GpuProcess(uuid=UUID1, pid=200, used_mib=8192, container=CID_A),
    ]
    assert obs.processes_complete
    usage = usage_by_container(
        obs.processes, {CID_A: "vllm", CID_B: "embed"}, names=["vllm", "embed", "ocr"]
    )
    assert usage == {"vllm": 20480 + 8192, "embed": 1024, "ocr": 0}


def test_per_process_not_available_is_unknown_never_zero() -> None:
    """WSL2 / WDDM / MIG without privileges: pynvml gives usedGpuMemory None."""
    fake = FakeNvml(
        [
            FakeDevice(
                UUID0,
                used=20 * GIB,
                compute=[
                    FakeProc(100, None),
                    FakeProc(101, NVML_VALUE_NOT_AVAILABLE),  # a binding that passes it raw
                    FakeProc(102, 2 * GIB),
                ],
            )
        ]
    )
    obs = observe(fake, {100: CID_A, 101: CID_B, 102: CID_B})
    assert [p.used_mib for p in obs.processes] == [None, None, 2048]
    # the device figures are still known
    assert obs.gpus is not None
    assert obs.gpus[0].used_mib == 20480
    usage = usage_by_container(obs.processes, {CID_A: "a", CID_B: "b"})
    assert usage == {"a": None, "b": None}  # never a partial sum


def test_wsl_lists_processes_without_memory() -> None:
    fake = FakeNvml([FakeDevice(UUID0, used=12 * GIB, compute=[FakeProc(100, None)])])
    obs = observe(fake, {100: CID_A}, wsl=True)
    assert obs.processes == [GpuProcess(UUID0, 100, None, CID_A)]
    assert usage_by_container(obs.processes, {CID_A: "vllm"}) == {"vllm": None}


def test_wsl_with_an_empty_process_list_is_unknown_not_idle() -> None:
    fake = FakeNvml([FakeDevice(UUID0, used=12 * GIB)])
    obs = observe(fake, wsl=True)
    assert obs.processes == []
    assert UUID0 in obs.process_errors
    assert not obs.processes_complete
    usage = usage_by_container(
        obs.processes, {CID_A: "vllm"}, names=["vllm"], complete=obs.processes_complete
    )
    assert usage == {"vllm": None}
    # off WSL the same empty list means no process holds memory
    off = observe(FakeNvml([FakeDevice(UUID0, used=12 * GIB)]), wsl=False)
    assert off.processes_complete
    assert usage_by_container(off.processes, {}, names=["vllm"]) == {"vllm": 0}


@pytest.mark.parametrize(
    "exc",
    [
        nvml_error(pynvml.NVML_ERROR_NO_PERMISSION),
        nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED),
        pynvml.NVMLLibraryMismatchError("Unversioned function called ..."),
    ],
)
def test_unreadable_compute_list_makes_processes_unknown(exc: BaseException) -> None:
    fake = FakeNvml(
        [
            FakeDevice(UUID0, used=GIB, compute_error=exc),
            FakeDevice(UUID1, used=GIB, compute=[FakeProc(7, GIB)]),
        ]
    )
    obs = observe(fake, {7: CID_A})
    assert obs.gpus is not None
    assert len(obs.gpus) == 2
    assert set(obs.process_errors) == {UUID0}
    assert type(exc).__name__ in obs.process_errors[UUID0]
    assert obs.processes == [GpuProcess(UUID1, 7, 1024, CID_A)]
    assert not obs.processes_complete
    usage = usage_by_container(
        obs.processes, {CID_A: "a"}, names=["a", "b"], complete=obs.processes_complete
    )
    assert usage == {"a": None, "b": None}


def test_graphics_processes_count_once_and_unsupported_graphics_is_none() -> None:
    fake = FakeNvml(
        [
            FakeDevice(
                UUID0,
                compute=[FakeProc(1, None), FakeProc(2, GIB)],
                graphics=[FakeProc(1, 3 * GIB), FakeProc(2, GIB), FakeProc(3, MIB)],
            ),
            FakeDevice(
                UUID1,
                compute=[FakeProc(4, GIB)],
                graphics_error=nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED),
            ),
        ]
    )
    obs = observe(fake)
    assert [(p.uuid, p.pid, p.used_mib) for p in obs.processes] == [
        (UUID0, 1, 3072),  # C+G process: the known figure wins
        (UUID0, 2, 1024),  # listed twice, counted once
        (UUID0, 3, 1),
        (UUID1, 4, 1024),
    ]
    assert obs.processes_complete


def test_failed_graphics_list_keeps_compute_processes_but_is_incomplete() -> None:
    fake = FakeNvml(
        [
            FakeDevice(
                UUID0,
                compute=[FakeProc(1, GIB)],
                graphics_error=nvml_error(pynvml.NVML_ERROR_NO_PERMISSION),
            )
        ]
    )
    obs = observe(fake, {1: CID_A})
    assert obs.processes == [GpuProcess(UUID0, 1, 1024, CID_A)]
    assert "graphics" in obs.process_errors[UUID0]
    assert not obs.processes_complete


def test_default_attribution_reads_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import controller.adapters.nvml as mod

    write_cgroup(tmp_path, 100, f"0::/system.slice/docker-{CID_A}.scope\n")
    real = mod.container_of_pid
    monkeypatch.setattr(mod, "container_of_pid", lambda pid: real(pid, proc_root=tmp_path))
    obs = observe_gpus(
        FakeNvml([FakeDevice(UUID0, compute=[FakeProc(100, GIB), FakeProc(9, 1)])]), wsl=False
    )
    assert [(p.pid, p.container) for p in obs.processes] == [(100, CID_A), (9, None)]


# ------------------------------------------------------------------ cgroups


def write_cgroup(root: Path, pid: int, text: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(text, encoding="utf-8")


CGROUP_V1_DOCKER = f"""\
12:pids:/docker/{CID_A}
11:memory:/docker/{CID_A}
4:devices:/docker/{CID_A}
1:name=systemd:/docker/{CID_A}
0::/system.slice/containerd.service
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"0::/system.slice/docker-{CID_A}.scope\n", CID_A),
        (CGROUP_V1_DOCKER, CID_A),
        # rootless docker under the user's systemd
        (
            f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{CID_B}.scope\n",
            CID_B,
        ),
        # kubernetes, cgroupfs driver and systemd driver
        (f"0::/kubepods/burstable/pod1f2e-33/{CID_B}\n", CID_B),
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice/"
            f"cri-containerd-{CID_B}.scope\n",
            CID_B,
        ),
        (f"0::/kubepods.slice/kubepods-pod1.slice/crio-{CID_C}.scope\n", CID_C),
        (f"0::/machine.slice/libpod-{CID_C}.scope/container\n", CID_C),
        # seen from a private cgroup namespace: the path climbs out with ../
        (f"0::/../../system.slice/docker-{CID_A}.scope\n", CID_A),
        # docker in docker: the innermost container
        (f"0::/docker/{CID_A}/docker/{CID_B}\n", CID_B),
        # host processes and unreadable positions
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/\n", None),
        ("0::/system.slice/docker.service\n", None),
        (f"0::/docker/{CID_A[:63]}\n", None),  # 63 hex digits is no id
        (f"0::/docker/{CID_A}x\n", None),
        ("", None),
        ("garbage without colons\n", None),
    ],
)
def test_container_of_pid(tmp_path: Path, text: str, expected: str | None) -> None:
    write_cgroup(tmp_path, 4242, text)
    assert container_of_pid(4242, proc_root=tmp_path) == expected


def test_container_of_pid_for_a_process_that_has_gone(tmp_path: Path) -> None:
    assert container_of_pid(999999, proc_root=tmp_path) is None
    assert container_of_pid(0, proc_root=tmp_path) is None
    assert container_of_pid(-1, proc_root=tmp_path) is None


def test_container_of_pid_on_this_host_does_not_raise() -> None:
    import os

    result = container_of_pid(os.getpid())
    assert result is None or len(result) == 64


def test_running_on_wsl(tmp_path: Path) -> None:
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    osrelease = tmp_path / "sys" / "kernel" / "osrelease"
    osrelease.write_text("5.15.153.1-microsoft-standard-WSL2\n")
    assert running_on_wsl(proc_root=tmp_path)
    osrelease.write_text("6.1.0-18-amd64\n")
    assert not running_on_wsl(proc_root=tmp_path)
    assert not running_on_wsl(proc_root=tmp_path / "nowhere")


# ------------------------------------------------------------ usage per container


def test_usage_by_container_sums_and_unknown_wins() -> None:
    procs = [
        GpuProcess(UUID0, 1, 100, CID_A),
        GpuProcess(UUID1, 2, 50, CID_A),
        GpuProcess(UUID0, 3, 10, CID_B),
        GpuProcess(UUID0, 4, None, CID_B),
        GpuProcess(UUID0, 5, 7, CID_B),  # after the unknown: still unknown
        GpuProcess(UUID0, 6, 999, None),  # host process
        GpuProcess(UUID0, 7, 999, CID_C),  # a container docker does not know
    ]
    assert usage_by_container(procs, {CID_A: "a", CID_B: "b"}) == {"a": 150, "b": None}
    assert usage_by_container(procs, {CID_A: "a"}, names=["a", "idle"]) == {"a": 150, "idle": 0}
    assert usage_by_container(procs, {CID_A: "a"}, names=["idle"], complete=False) == {
        "a": None,
        "idle": None,
    }
    assert usage_by_container([], {}) == {}


# --------------------------------------------- the real pynvml over a fake libnvidia-ml


@dataclass
class LibDevice:
    uuid: str
    name: str
    total: int
    used: int
    procs: list[tuple[int, int]]  # (pid, raw usedGpuMemory as the C struct holds it)


class FakeLibNvml:
    """``libnvidia-ml.so`` at the ctypes boundary: the C functions pynvml looks up.

    Each takes the ctypes arguments pynvml passes and returns an NVML return code.
    """

    def __init__(self, devices: list[LibDevice]) -> None:
        self.devices = devices
        self.calls: list[str] = []

    @staticmethod
    def _dev_index(handle: Any) -> int:
        value = ctypes.cast(handle, ctypes.c_void_p).value
        assert value is not None
        return int(value) - 1

    def nvmlInitWithFlags(self, flags: int) -> int:  # noqa: N802
        self.calls.append("init")
        return SUCCESS

    def nvmlShutdown(self) -> int:  # noqa: N802
        self.calls.append("shutdown")
        return SUCCESS

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:  # noqa: N802
        count._obj.value = len(self.devices)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:  # noqa: N802
        slot = ctypes.c_void_p.from_address(ctypes.addressof(device._obj))
        slot.value = int(index.value) + 1
        return SUCCESS

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:  # noqa: N802
        buf.value = self.devices[self._dev_index(handle)].uuid.encode()
        return SUCCESS

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:  # noqa: N802
        buf.value = self.devices[self._dev_index(handle)].name.encode()
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, mem: Any) -> int:  # noqa: N802
        dev = self.devices[self._dev_index(handle)]
        mem._obj.total, mem._obj.used, mem._obj.free = dev.total, dev.used, dev.total - dev.used
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(  # noqa: N802
        self, handle: Any, count: Any, procs: Any
    ) -> int:
        listed = self.devices[self._dev_index(handle)].procs
        if procs is None:
            count._obj.value = len(listed)
            return INSUFFICIENT_SIZE if listed else SUCCESS
        for i, (pid, used) in enumerate(listed):
            procs[i].pid = pid
            procs[i].usedGpuMemory = used
        count._obj.value = len(listed)
        return SUCCESS

    def nvmlDeviceGetGraphicsRunningProcesses_v3(  # noqa: N802
        self, handle: Any, count: Any, procs: Any
    ) -> int:
        count._obj.value = 0
        return SUCCESS


@pytest.fixture
def fake_libnvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLibNvml]:
    lib = FakeLibNvml(
        [
            LibDevice(
                UUID0,
                "NVIDIA RTX 6000 Ada Generation",
                48 * GIB,
                20 * GIB,
                [(100, 18 * GIB), (101, NVML_VALUE_NOT_AVAILABLE)],
            ),
            LibDevice(UUID1, "NVIDIA GeForce RTX 4090", 24 * GIB, 0, []),
        ]
    )
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    yield lib


def test_real_pynvml_code_paths_over_a_fake_library(fake_libnvml: FakeLibNvml) -> None:
    # pynvml's own conversion: NVML_VALUE_NOT_AVAILABLE in the C struct -> None
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        raw = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        assert [(p.pid, p.usedGpuMemory) for p in raw] == [(100, 18 * GIB), (101, None)]
        assert pynvml.nvmlDeviceGetUUID(handle) == UUID0  # bytes decoded to str
    finally:
        pynvml.nvmlShutdown()

    obs = observe_gpus(pid_to_container=by_pid({100: CID_A, 101: CID_B}), wsl=False)
    assert obs.error is None
    assert obs.gpus is not None
    assert [(g.uuid, g.index, g.name, g.total_mib, g.used_mib, g.free_mib) for g in obs.gpus] == [
        (UUID0, 0, "NVIDIA RTX 6000 Ada Generation", 49152, 20480, 28672),
        (UUID1, 1, "NVIDIA GeForce RTX 4090", 24576, 0, 24576),
    ]
    assert obs.processes == [
        GpuProcess(UUID0, 100, 18432, CID_A),
        GpuProcess(UUID0, 101, None, CID_B),
    ]
    assert fake_libnvml.calls == ["init", "shutdown", "init", "shutdown"]
