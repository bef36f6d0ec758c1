"""One live observation of the host: docker containers + NVML devices -> snapshot.

``observe_host`` asks the docker adapter for the manifest set's containers (one list
call per cycle in steady state) and the NVML adapter for the devices and their
processes, attributes per-process GPU memory to containers through their cgroups,
and returns the observed-snapshot contract (docs/design.md §5) that ``vramctl observe``
prints and ``--observed`` reads back. Neither adapter raises: a daemon that cannot
be reached gives ``"docker": "error"``, missing NVML gives ``"gpus": null``.

This module must not change anything on the host: it composes read-only adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path

from controller.adapters.docker.read import ContainerObserver
from controller.adapters.health import HealthProber
from controller.adapters.nvml import GpuObservation, NvmlApi, observe_gpus, usage_by_container
from controller.adapters.self_sleep import SelfSleepReader
from controller.manifest import ManifestSet
from controller.snapshot import Probe, SnapshotModel
from statemachine import engines
from statemachine.domain.types import ContainerState


def observe_host(
    containers: Collection[str],
    *,
    observer: ContainerObserver,
    nvml: NvmlApi | None = None,
    now: datetime | None = None,
    pid_to_container: Callable[[int], str | None] | None = None,
    gpu: GpuObservation | None = None,
) -> SnapshotModel:
    """Observe the named containers and every GPU once; never raises for host faults.

    ``nvml`` defaults to the ``pynvml`` module; ``pid_to_container`` maps a host PID
    that NVML lists to a docker container id (default: its ``/proc/<pid>/cgroup``,
    see :func:`controller.adapters.nvml.container_of_pid`). ``gpu``: the devices as
    the caller read them just before (then NVML is not read again).
    """
    taken = (now or datetime.now(UTC)).isoformat().replace("+00:00", "Z")
    snap = observer.observe(containers)
    if gpu is None:
        gpu = observe_gpus(nvml, pid_to_container=pid_to_container)
    model = snap.to_snapshot_model(gpus=gpu.gpus, taken_at=taken)
    model.nvml_error = gpu.error
    if snap.docker_ok and gpu.gpus is not None:
        id_to_name = {c.id: name for name, c in model.containers.items() if c.id}
        holding = [name for name, c in model.containers.items() if c.state == "running"]
        # a process whose cgroup cannot be read (the controller in its own PID
        # namespace, without `pid: host`) may belong to any container: then no
        # container's figure is known, rather than 0 for all of them
        visible = pid_to_container is not None or all(
            Path(f"/proc/{p.pid}/cgroup").exists() for p in gpu.processes
        )
        usage = usage_by_container(
            gpu.processes,
            id_to_name,
            names=holding,
            complete=gpu.processes_complete and visible,
        )
        for name, used in usage.items():
            model.containers[name].gpu_used_mib = used
    return model


def observe_probes(
    snap: SnapshotModel, mset: ManifestSet, prober: HealthProber
) -> dict[str, Probe]:
    """Each running serve's declared health path asked once, concurrently (``GET
    127.0.0.1:{port}{health}``, 2xx: ``healthy``, else ``unhealthy``): the health
    ``status`` and the page show where the container has no Docker healthcheck of its
    own. A serve not running, without a port or a health path is not asked."""
    urls: dict[str, str] = {}
    for name, serve in mset.serves.items():
        c = snap.containers.get(serve.container)
        if c is None or c.state is not ContainerState.RUNNING or c.health is not None:
            continue
        if serve.port is not None and serve.health:
            urls[name] = f"http://127.0.0.1:{serve.port}{serve.health}"
    answers: dict[str, Probe] = {}
    for name, ok in prober(urls).items():
        answers[name] = "healthy" if ok else "unhealthy"
    return answers


def observe_self_sleep(
    snap: SnapshotModel, mset: ManifestSet, reader: SelfSleepReader
) -> dict[str, bool]:
    """Each running serve whose engine can sleep by itself (llama.cpp), asked whether it
    sleeps now (``GET 127.0.0.1:{port}/props``: read without waking it). Serves left out:
    not running, no port, an engine that cannot, or no answer (unknown)."""
    out: dict[str, bool] = {}
    for name, serve in mset.serves.items():
        engine = engines.lookup(serve.engine)
        c = snap.containers.get(serve.container)
        if engine is None or engine.self_sleep is None or serve.port is None:
            continue
        if c is None or c.state is not ContainerState.RUNNING:
            continue
        said = reader.asleep(f"http://127.0.0.1:{serve.port}", engine.self_sleep)
        if said is not None:
            out[name] = said
    return out
