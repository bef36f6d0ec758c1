"""The table from each step kind (:class:`~statemachine.planning.plan_types.Action`) to its handler,
and :func:`do`, which carries out one step through it inside its footprint window.

A handler is a function of the run's context, the step and the serve's spec that
returns the step's detail or raises :class:`~controller.service.steps.results.StepError`.
:data:`IMPLEMENTED_ACTIONS` is the table's keys: a plan with any other step kind is
refused by the preflight (its group only) and, should one reach :func:`do`, fails
loudly there.

This module must not carry out a step itself nor decide what to do on a failure (the
executor and :mod:`controller.service.steps.undo` do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from controller.service.steps import containers, elastic, router
from controller.service.steps import sleep as sleep_steps
from controller.service.steps.context import RunContext
from controller.service.steps.results import StepError
from statemachine.domain.types import DesiredState, ServeSpec
from statemachine.lifecycle.machine import LifecycleState
from statemachine.planning.plan_types import (
    Action,
    Step,
)

#: A step handler: the step's detail, or :class:`StepError`.
Handler = Callable[[RunContext, Step, ServeSpec], str]

HANDLERS: Mapping[Action, Handler] = MappingProxyType(
    {
        Action.QUIESCE: router.quiesce,
        Action.DRAIN: router.drain,
        Action.STOP: containers.stop,
        Action.RELEASE: containers.release,
        Action.SHRINK: elastic.resize,
        Action.GROW: elastic.resize,
        Action.RESERVE: containers.reserve,
        Action.START: containers.start,
        Action.AWAIT_READY: containers.await_ready,
        Action.READMIT: router.readmit,
        Action.SLEEP: sleep_steps.sleep,
        Action.RELEASE_TO_RESIDUAL: sleep_steps.release_to_residual,
        Action.RESERVE_WAKE: sleep_steps.reserve_wake,
        Action.WAKE: sleep_steps.wake,
        Action.RELOAD: sleep_steps.reload,
    }
)

#: The step actions this executor carries out.
IMPLEMENTED_ACTIONS: frozenset[Action] = frozenset(HANDLERS)


def on_its_card(s: ServeSpec, step: Step) -> ServeSpec:
    """A placed serve as ``step`` has it: on the card the plan chose (the step's own
    roles, when they are among its candidates), whatever the spec it was handed says;
    any other serve as it is. A reserve is admitted, a start told and a release freed on
    the card the plan holds the serve on (docs/placement.md)."""
    roles = step.gpu_roles
    if not s.placement or not roles or roles == s.gpu_roles or not set(roles) <= set(s.placement):
        return s
    return replace(s, gpu_roles=roles)


def on_planned_cards(desired: DesiredState, steps: Iterable[Step]) -> DesiredState:
    """``desired`` with each placed serve on the card the plan's steps hold or reserve it
    on (:func:`on_its_card`, the first step naming it): what a saved plan, whose
    placements are its steps, is carried out and recorded with."""
    serves = dict(desired.serves)
    done: set[str] = set()
    for step in steps:
        s = serves.get(step.serve)
        if s is not None and step.serve not in done and step.gpu_roles:
            serves[step.serve] = on_its_card(s, step)
            done.add(step.serve)
    return replace(desired, serves=serves)


def do(run: RunContext, step: Step) -> str:
    """Carry out ``step`` by its handler, its footprint window opened and closed."""
    s = on_its_card(run.serve(step.serve), step)
    handler = HANDLERS.get(step.action)
    if handler is None:  # a step kind the core plans and this executor cannot carry out
        raise StepError(f"{step.action} steps are not implemented by this executor")
    _before(run, step, s)
    detail = handler(run, step, s)
    _after(run, step, s)
    return detail


def _before(run: RunContext, step: Step, s: ServeSpec) -> None:
    """Open the step's footprint window (a start or wake, a stop or sleep).

    A sleep, a wake and a sleeper's stop move memory on the serve's roles, but only
    its residual's worth or the rest: no evidence of its footprint. Their windows are
    opened (other serves' windows they overlap are not attributable) and abandoned
    instead of recorded.
    """
    measure = run.ex.footprints
    moves_only = step.action in (Action.SLEEP, Action.WAKE) or (
        step.action is Action.STOP and run.machines[s.name].state == LifecycleState.ASLEEP
    )
    if moves_only:
        run.moves_only.add(s.name)
    if step.action in (Action.START, Action.WAKE):
        measure.before_start(s, run.desired.roles)
    elif step.action in (Action.STOP, Action.SLEEP):
        measure.before_stop(s, run.desired.roles)


def _after(run: RunContext, step: Step, s: ServeSpec) -> None:
    """Close the footprint window of a step that succeeded: recorded, or abandoned for
    a move only."""
    measure = run.ex.footprints
    if step.action is Action.AWAIT_READY:
        if s.name in run.moves_only:
            run.moves_only.discard(s.name)
            measure.start_failed(s)  # a wake: the window stays as a move, no sample
        else:
            measure.after_start(s)
    elif step.action in (Action.RELEASE, Action.RELEASE_TO_RESIDUAL) or (
        step.action is Action.STOP and not run.ledger.holds(s.name)
    ):
        if s.name in run.moves_only or step.action is Action.RELEASE_TO_RESIDUAL:
            run.moves_only.discard(s.name)
            measure.stop_failed(s)  # a sleep or a sleeper's stop: a move, no sample
        else:
            measure.after_stop(s)  # released (or nothing to release): the stop is confirmed
