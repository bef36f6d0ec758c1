"""One execution's state, handed explicitly to every step handler.

:class:`RunContext` holds what a plan's execution carries from step to step: the
ledger as the steps leave it, the serves' lifecycle machines, the plan's observation,
what each group quiesced and reserved (for its undo), and what the report gathers
(elastic figures, sleeps, undo faults). Its ``ex`` is the executor's side, seen
through :class:`StepHost`: the mutating adapters, the knobs, the start tracker, the
event bus. The executor satisfies that protocol; nothing here imports it.

This module must not carry out a step (the handlers do) nor move a lifecycle
machine (:mod:`controller.service.steps.lifecycle` does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from controller.adapters.docker.actions import DockerActions
from controller.adapters.elastic import ElasticClient
from controller.adapters.router import RouterClient
from controller.adapters.sleep import SleepClient
from controller.manifest.runtime import ServeRuntime
from controller.service.events import EventBus
from controller.service.footprints import Footprints
from controller.service.starts import StartTracker
from controller.service.steps.results import ElasticFigure, StepError, UndoFault
from controller.store.journal import SleepRecord
from statemachine.domain.types import DesiredState, GpuObs, Observed, ServeSpec
from statemachine.ledger.reservations import Ledger
from statemachine.lifecycle.machine import ServeLifecycle


class GpuReader(Protocol):
    """Reads the devices now (``None`` when NVML is unavailable)."""

    def __call__(self) -> tuple[GpuObs, ...] | None: ...


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """Executor knobs (bounds and poll intervals)."""

    #: the longest pause between two polls of a wait (health, sleep, wake, memory);
    #: a wait polls after 2 ms first, then less often up to this (service.pauses)
    poll_s: float = 0.05
    memory_wait_s: float = 30.0
    memory_tolerance_mib: int = 256
    log_tail: int = 40
    #: how long a refused readmit is retried (the model may need seconds after its
    #: health path answers before the router verifies its identity)
    readmit_wait_s: float = 30.0
    #: the first pause between readmit tries; it doubles up to ``readmit_poll_max_s``
    readmit_poll_s: float = 1.0
    readmit_poll_max_s: float = 8.0


class ExecutorReads(Protocol):
    """What the preflight and the step handlers read of the executor: the manifest,
    Docker, the router and each serve's runtime (``executor.Executor`` satisfies it)."""

    desired: DesiredState
    docker: DockerActions
    router: RouterClient | None

    def runtime(self, name: str) -> ServeRuntime:
        """How serve ``name``'s steps are carried out."""
        ...


class StepHost(ExecutorReads, Protocol):
    """All the step handlers use of the executor: what the preflight reads, and the
    mutating adapters, the knobs, the start tracker and the event bus."""

    #: the cycle id of the plan executing now (its events carry it)
    cycle: int | None
    elastic: ElasticClient
    #: the engines' sleep API (made when a plan first needs it)
    sleep: SleepClient | None
    gpus: GpuReader
    config: ExecutorConfig
    on_sleep: Callable[[str, SleepRecord | None], None] | None
    stop_event: threading.Event
    observe_now: Callable[[], Observed] | None
    starts: StartTracker | None
    footprints: Footprints
    unanswered: dict[str, tuple[str, int, int | None]]
    events: EventBus


class RunContext:
    """The state of one execution: the live ledger, the machines, what to undo."""

    def __init__(
        self,
        ex: StepHost,
        ledger: Ledger,
        machines: dict[str, ServeLifecycle],
        observed: Observed,
    ) -> None:
        self.ex = ex
        self.cycle = ex.cycle  # the plan's, for the events this run publishes
        #: the desired state this run was planned for (a start carried out beside the
        #: loop keeps it even when the manifest changes meanwhile)
        self.desired = ex.desired
        self.observed = observed
        self.ledger = ledger
        self.machines = machines
        self.failed_groups: set[str] = set()
        self.quiesced: dict[str, list[str]] = {}  # group -> serves quiesced, not yet stopped
        #: group -> serves whose tier someone else had quiesced (never readmitted here)
        self.others_quiesced: dict[str, list[str]] = {}
        self.reserved: dict[str, str] = {}  # serve -> group, reserved but not yet started
        self.tokens: dict[str, int] = {}  # serve -> its tracker entry, from its reserve
        self.detached = False  # a start's own run: the tracker entry is its job's to end
        #: a start's own run: the plan's run it was handed off from (its ledger goes on
        #: counting what the plan reserves after the hand-off)
        self.parent: RunContext | None = None
        self.used_before_stop: dict[str, dict[str, int]] = {}  # serve -> role -> NVML used
        self.attributed: dict[str, int | None] = {}  # serve -> NVML MiB of its container
        self.elastic: dict[str, ElasticFigure] = {}  # serve -> its count after a resize
        self.left_quiesced: dict[str, str] = {}  # serve -> why its undo left it quiesced
        #: what the undo of failed groups met (an illegal transition): reported, not ok
        self.undo_faults: list[UndoFault] = []
        #: serves whose footprint window is a move only (a sleep, a wake, a sleeper's stop)
        self.moves_only: set[str] = set()
        #: serve -> what its devices and container used before its sleep
        self.before_sleep: dict[str, tuple[dict[str, int], int | None]] = {}
        #: serves stopped instead of put to sleep (-> why), whose release is a full one
        self.stopped_instead: dict[str, str] = {}
        #: serve -> its journal record now asleep, or None: no longer asleep
        self.sleeps: dict[str, SleepRecord | None] = {}
        #: serves whose engine answered the sleep API with 404 -> the engine's words
        self.sleep_unsupported: dict[str, str] = {}

    def serve(self, name: str) -> ServeSpec:
        """The spec of serve ``name`` this run was planned for."""
        return self.desired.serves[name]

    def router(self) -> RouterClient:
        """The router; none configured, the step fails."""
        if self.ex.router is None:
            raise StepError("no router is configured (--router-url / VRAMCTL_ROUTER_URL)")
        return self.ex.router

    def role_used(self, roles: tuple[str, ...]) -> dict[str, int]:
        """role -> the MiB NVML shows used on its device now (a role unseen is absent)."""
        gpus = self.ex.gpus()
        if gpus is None:
            return {}
        by_uuid = {g.uuid: g for g in gpus}
        out: dict[str, int] = {}
        for r in roles:
            uuid = self.desired.roles[r].uuid if r in self.desired.roles else None
            dev = by_uuid.get(uuid) if uuid else None
            if dev is not None and dev.used_mib is not None:
                out[r] = dev.used_mib
        return out

    def logs(self, container: str) -> str:
        """The tail of ``container``'s logs, for a failed step."""
        return self.ex.docker.logs(container, tail=self.ex.config.log_tail)
