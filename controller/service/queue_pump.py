"""The request queue's pump: queued ``up`` requests admitted in order as room frees.

:class:`QueuePump` owns the :class:`~controller.service.request_queue.RequestQueue` (the FIFO
per GPU role) and runs beside the loop (:meth:`QueuePump.run`, one of the controller's
services): after every change, and each second, it admits the heads of the queues that
fit now (recorded as on-demand requests through the port's ``request_up``), ends those
that never will, those past their deadline, and those nobody waits for any more, and
publishes ``request.admitted`` / ``request.ended`` on the event bus. ``up`` with
``"queue": true`` adds to it; ``down`` ends a queued request.

:func:`decide_up_on_live` is the one way an ``up`` is decided on the live observation
(:func:`statemachine.answers.up_decision.decide_up`), for the pump and the API alike.

It changes the loop only through the port's ``request_up``; it serves no HTTP (the API,
:mod:`controller.interfaces.api`, reads and adds to its queue).
"""

from __future__ import annotations

import time
from typing import Any

from loguru import logger

from controller.service.events import EventBus
from controller.service.loop_port import LoopPort, LoopView
from controller.service.request_queue import SETTLE_S, QueueEntry, RequestQueue, blocked_now
from statemachine.answers.up_decision import UpDecision
from statemachine.domain.types import DesiredState, Observed, OnDemandRequest
from statemachine.planning.admission import could_fit_later
from statemachine.planning.idleness import in_force


def decide_up_on_live(controller: LoopPort, serve: str, retry_after_s: float) -> UpDecision:
    """The answer to ``up`` for ``serve`` from the loop's live situation
    (:meth:`statemachine.answers.situation.Situation.up`)."""
    return controller.situation().up(serve, default_retry_s=retry_after_s)


def active_requests(
    controller: LoopPort, now: float, observed: Observed | None = None
) -> dict[str, OnDemandRequest]:
    """The recorded requests in force at ``now``, by serve: the planner's rule
    (:func:`statemachine.planning.idleness.in_force`) on ``observed`` (``None``: the loop's live
    observation)."""
    if observed is None:
        observed = controller.view().observed() or Observed(docker_ok=False)
    serves = controller.desired().serves
    return {
        r.serve: r for r in controller.requests() if in_force(r, serves.get(r.serve), observed, now)
    }


def recorded_requests(controller: LoopPort) -> dict[str, OnDemandRequest]:
    """Every recorded request, expired ones included (their serve is being stopped)."""
    return {r.serve: r for r in controller.requests()}


class QueuePump:
    """The scheduler of the request queue (see the module doc).

    Touched only from the event loop's thread (the API's handlers and :meth:`run`).
    """

    def __init__(
        self,
        controller: LoopPort,
        bus: EventBus,
        retry_after_s: float,
        queue: RequestQueue | None = None,
    ) -> None:
        self.controller = controller
        self.bus = bus
        self.retry_after_s = retry_after_s
        self.queue = queue if queue is not None else RequestQueue()

    def notify(self, kind: str, **data: Any) -> None:
        """A request queue's event (``request_queued`` ...) on the bus (``request.queued``)."""
        self.bus.publish("request." + kind.removeprefix("request_"), **data)

    async def run(self) -> None:
        """Beside the loop: the queue is looked at after every change, and each second."""
        while True:
            await self.controller.wait_change(1.0)
            try:
                self.process()
            except Exception:  # a bug must not end the pump
                logger.exception("api: the request queue failed")

    def process(self) -> None:
        """Admit the heads of the queues that fit now; end those that never will, and
        those nobody waits for any more."""
        if not self.queue.waiting() and not self.queue.settling():
            return
        self.withdraw_abandoned(time.time())
        view = self.controller.view()
        observed = view.observed()
        if observed is None or not observed.docker_ok:
            return  # nothing is decided on an unknown host: they wait
        now = time.time()
        self._settle(view, observed, now)
        desired = self.controller.desired()
        for entry in self.queue.eligible():
            self._admit_or_end(entry, view, observed, desired, now)

    def _settle(self, view: LoopView, observed: Observed, now: float) -> None:
        """Free the place of each admitted entry the live ledger counts now, whose request
        ended, that waited past :data:`SETTLE_S`, or that a later plan blocks."""
        active = active_requests(self.controller, now, observed)
        for entry in self.queue.settling():
            counted = (
                entry.serve in observed.starting
                or observed.container(view.desired.serves[entry.serve].container).holds
                if entry.serve in view.desired.serves
                else True
            )
            gone = entry.serve not in active
            stale = entry.left_at is not None and now - entry.left_at > SETTLE_S
            if counted or gone or stale or blocked_now(view, entry.serve, entry.left_at or now):
                self.queue.settled(entry)

    def _admit_or_end(
        self,
        entry: QueueEntry,
        view: LoopView,
        observed: Observed,
        desired: DesiredState,
        now: float,
    ) -> None:
        """Admit ``entry`` when it fits now; end it when it is gone, can never fit, or its
        deadline passed; else it waits. ``desired``: as the pass began."""
        if entry.serve not in desired.serves:
            self.queue.leave(entry, "impossible", now, 404, {"error": f"{entry.serve} is gone"})
            self.notify("request_ended", serve=entry.serve, outcome="impossible")
            return
        decision = decide_up_on_live(self.controller, entry.serve, self.retry_after_s)
        if decision.status == 202:
            self.controller.request_up(entry.serve, entry.ttl_s)
            self.queue.leave(entry, "admitted", now, 202, {"message": decision.message})
            logger.info(
                "api: queued up {} admitted after {:.1f}s: {}",
                entry.serve,
                now - entry.enqueued_at,
                decision.message,
            )
            self.notify("request_admitted", serve=entry.serve)
            return
        never = None
        if decision.status == 429:
            never = could_fit_later(
                desired, observed, entry.serve, recorded_requests(self.controller)
            )
        if decision.status == 409 or never is not None:
            self._end_impossible(entry, decision, never or decision.message, now)
        elif now >= entry.deadline:
            self._end_at_deadline(entry, decision, now)

    def _end_impossible(
        self, entry: QueueEntry, decision: UpDecision, why: str, now: float
    ) -> None:
        self.queue.leave(
            entry,
            "impossible",
            now,
            decision.status,
            {**decision.body, "error": f"the queued request cannot fit any more: {why}"},
        )
        logger.info("api: queued up {} ended: {}", entry.serve, why)
        self.notify("request_ended", serve=entry.serve, outcome="impossible")

    def _end_at_deadline(self, entry: QueueEntry, decision: UpDecision, now: float) -> None:
        self.queue.leave(
            entry,
            "deadline",
            now,
            429,
            {
                **decision.body,
                "error": f"waited {now - entry.enqueued_at:.0f}s in the queue, its "
                f"queue_s, and it does not fit yet: {decision.message}",
            },
        )
        logger.info("api: queued up {} ended at its deadline", entry.serve)
        self.notify("request_ended", serve=entry.serve, outcome="deadline")

    def withdraw_abandoned(self, now: float) -> None:
        """End the queued requests whose every waiting client went away."""
        for entry in self.queue.abandoned():
            self.queue.leave(
                entry,
                "withdrawn",
                now,
                None,
                {
                    "error": f"the client waiting for the queued request of {entry.serve} "
                    "went away before it was admitted: nothing was recorded or started for it"
                },
            )
            logger.info(
                "api: queued up {} withdrawn after {:.1f}s: its waiting client went away",
                entry.serve,
                now - entry.enqueued_at,
            )
            self.notify("request_ended", serve=entry.serve, outcome="withdrawn")
