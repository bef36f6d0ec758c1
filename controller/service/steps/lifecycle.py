"""The executor's moves of the serves' lifecycle machines, gathered in one place.

One machine per serve of a plan, from its record (:mod:`controller.service.records`)
(:func:`machines_for`); :func:`fire` moves one for a step (an illegal transition fails
the step), :func:`move` for the undo (the caller reports what the machine refuses);
:func:`begin_start` is the start's own moves (``reserve`` first for a serve outside
the ledger, then ``start``); :func:`settle_failed_start`, :func:`settle_machine` and
:func:`back_in_service` settle a failed start or wake and a quiesced serve the undo
puts back in service. Every move is published as a ``lifecycle`` event.

This module must not carry out a step nor decide which transition a step's outcome
means beyond these moves (the handlers call them).
"""

from __future__ import annotations

from loguru import logger

from controller.adapters.docker.actions import ActionError
from controller.service.records import RecordStore
from controller.service.steps.context import RunContext
from controller.service.steps.results import StepError
from statemachine.domain.types import COMMITTED_STATES, ContainerState, DesiredState, Observed
from statemachine.ledger.reservations import Refusal
from statemachine.lifecycle.machine import (
    IllegalTransition,
    LifecycleState,
    ServeLifecycle,
    Trigger,
)
from statemachine.planning.plan_types import (
    Plan,
)


def machines_for(
    records: RecordStore, desired: DesiredState, plan: Plan, observed: Observed
) -> dict[str, ServeLifecycle]:
    """One lifecycle machine per serve of the plan, from its record (the loop's store;
    without one, a fresh store) moved to the plan's reading of its container."""
    return records.machines((st.serve for st in plan.steps), desired, observed)


def fire(run: RunContext, serve: str, trigger: Trigger) -> None:
    """Move ``serve``'s lifecycle machine; an illegal transition fails the step.

    The machine is the authority: a plan (or an executor path) that asks for a
    transition the machine forbids is a bug, so it is logged as an error and raised
    as :class:`StepError` (the step fails, its group is undone), never passed over.
    The undo moves the machines with :func:`move` instead, and reports each
    :class:`IllegalTransition` it meets once it has undone the rest.
    """
    try:
        move(run, serve, trigger)
    except IllegalTransition as exc:
        logger.error("lifecycle: {}", exc)
        raise StepError(f"lifecycle: {exc}") from None


def move(run: RunContext, serve: str, trigger: Trigger) -> None:
    """Move ``serve``'s lifecycle machine and publish the transition.

    Raises :class:`IllegalTransition` (the machine unchanged, nothing published)
    when the machine forbids it; the caller decides how that fails loudly.
    """
    machine = run.machines[serve]
    before = str(machine.state)
    machine.fire(trigger)
    run.ex.events.publish(
        "lifecycle",
        serve=serve,
        cycle=run.cycle,
        trigger=str(trigger),
        **{"from": before, "to": str(machine.state)},
    )


def begin_start(run: RunContext, serve: str) -> None:
    """The start's moves: ``reserve`` first for a serve outside the ledger (it has no
    reserve step), then ``start``."""
    if run.machines[serve].state == "stopped":
        fire(run, serve, Trigger.RESERVE)  # a serve outside the ledger has no reserve step
    fire(run, serve, Trigger.START)


def back_in_service(run: RunContext, name: str) -> None:
    """The machine of ``name``, quiesced by the group being undone, back in service.

    A serve whose stop failed is ``failed`` (``stop_failed``): that is not a fault of
    the undo, and ``failed`` has no ``readmit``. Its machine stays failed; observation
    moves it on (``recover`` while its container runs, ``reset`` once it is down).
    Any other state is asked for ``readmit``, and the machine refuses what it forbids.
    """
    if run.machines[name].state == LifecycleState.FAILED:
        logger.info("{}: its stop failed; its machine stays failed until observed", name)
        return
    move(run, name, Trigger.READMIT)


def settle_failed_start(run: RunContext, name: str) -> None:
    """After a failed start: stop what still runs, and hold exactly what it holds.

    Called by the undo only; a transition the machine refuses raises
    :class:`IllegalTransition` (after the ledger was made true), for the undo to report.
    """
    s = run.serve(name)
    try:
        state = run.ex.docker.inspect(s.container)
        if state is not None and state.state in (
            ContainerState.RUNNING,
            ContainerState.RESTARTING,
        ):
            stop_s = run.ex.runtime(name).stop_timeout_s
            run.ex.docker.stop(s.container, stop_s)
            state = run.ex.docker.inspect(s.container)
    except ActionError as exc:
        logger.error(
            "{}: cannot confirm the failed start is down ({}); keeping its reservation",
            name,
            exc,
        )
        settle_machine(run, name)
        return
    holds = state is not None and state.state in COMMITTED_STATES
    if not holds and run.ledger.holds(name):
        result = run.ledger.release(name)
        if not isinstance(result, Refusal):
            run.ledger = result
    settle_machine(run, name)


def settle_machine(run: RunContext, name: str) -> None:
    """The machine of a failed start (or wake): ``start_failed`` from reserved or
    starting, ``fail`` from any other state, nothing when it is failed already."""
    machine = run.machines[name]
    if machine.state != LifecycleState.FAILED:
        move(
            run,
            name,
            Trigger.START_FAILED
            if machine.state in (LifecycleState.RESERVED, LifecycleState.STARTING)
            else Trigger.FAIL,
        )
