"""The control loop's readers of the host: one container reader per use, and what the
loop says once about a host it cannot read.

The loop reads the host for three purposes, each with a container reader of its own so
none waits for another: its cycles' observations (:meth:`HostReader.observe`), the
executor's look right before it admits a reserve (:meth:`HostReader.observe_now`), and
a footprint's reading around a start or stop (:meth:`HostReader.footprint_reading`,
from a start's thread too). A docker event makes a container stale in every reader's
cache (:meth:`HostReader.touch`). Readers are made on first use by ``make_observer``
(the loop passes its own reader class), and closed together.

:class:`HostNotices` logs when docker or NVML becomes unreadable or readable again:
once when that changes, not every cycle.

This module must not plan, decide or change anything on the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from loguru import logger

from controller.adapters.docker.read import ContainerObserver, manifest_containers
from controller.adapters.nvml import NvmlApi, observe_gpus
from controller.manifest import ManifestSet
from controller.service.footprints import Reading
from controller.service.observe import observe_host
from controller.service.wiring import containers_now
from controller.snapshot import SnapshotModel
from statemachine.domain.types import Observed


class HostReader:
    """The loop's container readers (cycles, the executor, footprints), made on first use."""

    def __init__(self, make_observer: Callable[[], ContainerObserver]) -> None:
        self._make = make_observer
        self.observer: ContainerObserver | None = None  # the cycles' reader
        self.fresh: ContainerObserver | None = None  # the executor's own reader
        self._fp_observer: ContainerObserver | None = None  # the footprints' reader
        self._fp_lock = threading.Lock()

    def observe(self, names: tuple[str, ...], nvml: NvmlApi | None) -> SnapshotModel:
        """The containers ``names`` and the devices, for a cycle (in its worker thread)."""
        if self.observer is None:
            self.observer = self._make()
        return observe_host(names, observer=self.observer, nvml=nvml)

    def observe_now(self, mset: ManifestSet) -> Observed:
        """The containers as they are now (the executor admits each reserve against it)."""
        if self.fresh is None:
            self.fresh = self._make()
        return containers_now(mset, self.fresh)

    def footprint_reading(self, mset: ManifestSet, nvml: NvmlApi | None) -> Reading:
        """Devices and containers now, for a footprint (from a start's thread too).

        The devices are read first: without them (NVML unavailable) no container's
        memory can be attributed either, and the reading is unknown as a whole without
        asking docker (the executor takes it right before its docker start or stop).
        """
        with self._fp_lock:
            gpu = observe_gpus(nvml)
            if gpu.gpus is None:
                return Reading(None)
            if self._fp_observer is None:
                self._fp_observer = self._make()
            names = manifest_containers(mset.serves)
            snap = observe_host(names, observer=self._fp_observer, nvml=nvml, gpu=gpu)
        return Reading.of(snap.to_observed())

    def touch(self, cid: str) -> None:
        """Container ``cid`` is inspected again by every reader's next list."""
        for observer in (self.observer, self.fresh, self._fp_observer):
            if observer is not None:
                observer.cache.touch(cid)

    def close(self, *, footprints: Callable[[], None] | None = None) -> None:
        """Close the readers (``footprints``, run between: starts still settling read
        through the footprints' reader until they are recorded)."""
        if self.observer is not None:
            self.observer.close()
        if footprints is not None:
            footprints()
        if self._fp_observer is not None:
            self._fp_observer.close()
        if self.fresh is not None:
            self.fresh.close()


class HostNotices:
    """Says once when docker or NVML becomes unreadable or readable again."""

    def __init__(self) -> None:
        self._docker_said: str | None = None  # the Docker error last logged
        self._nvml_said: str | None = None  # the NVML error last logged

    def say(self, snap: SnapshotModel, observed: Observed) -> None:
        """Log what changed since the last observation, if anything did."""
        docker_said = None if observed.docker_ok else snap.docker_error or "unreadable"
        if docker_said != self._docker_said:
            if docker_said is not None:
                logger.warning("{}; acting on nothing until it can be read", docker_said)
            else:
                logger.info("docker: readable again")
            self._docker_said = docker_said
        if snap.nvml_error != self._nvml_said:
            if snap.nvml_error:
                logger.warning("nvml: {}; device figures and drift are unknown", snap.nvml_error)
            else:
                logger.info("nvml: devices readable")
            self._nvml_said = snap.nvml_error
