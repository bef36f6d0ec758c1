"""The undo of a failed group (docs/protocols.md#the-undo-of-a-failed-group).

When a step fails, the rest of its group is skipped and what the group left half-done
is undone: every tier it quiesced and did not stop is readmitted (a refusal leaves it
quiesced, named in the report's ``left_quiesced``), a tier someone else had quiesced
is put back in service untouched, and each serve it reserved or started is settled
(stopped if it runs, its reservation released once Docker shows it down). A failed
shrink or grow has nothing to undo. A transition the lifecycle machine refuses here
is collected as an :class:`~controller.service.steps.results.UndoFault`, not raised,
so the undo of the group's other serves goes on.

This module must not undo anything but what the run recorded as its own.
"""

from __future__ import annotations

from collections.abc import Callable

from loguru import logger

from controller.service.steps.context import RunContext
from controller.service.steps.lifecycle import back_in_service, settle_failed_start
from controller.service.steps.results import StepError, UndoFault
from controller.service.steps.router import readmit_tier
from statemachine.lifecycle.machine import IllegalTransition
from statemachine.planning.plan_types import (
    Action,
    Step,
)


def compensate(run: RunContext, failed: Step) -> list[UndoFault]:
    """Undo what the failed step's group left half-done; the faults it met."""
    return undo_group(run, failed.group, f"{failed.action} {failed.serve}", failed)


def compensate_all(run: RunContext, why: str) -> None:
    """Undo every group still half-done (the plan ended, or the controller stops)."""
    groups = [*run.quiesced, *run.others_quiesced, *set(run.reserved.values())]
    for group in dict.fromkeys(groups):
        undo_group(run, group, why, None)


def undo_group(run: RunContext, group: str, after: str, failed: Step | None) -> list[UndoFault]:
    """Undo ``group``: readmit what it quiesced, settle what it reserved or started.

    Every serve's undo is attempted whatever another one met. A transition the
    lifecycle machine refuses here is a bug: it is not passed over but collected,
    logged at ERROR, kept in the run's ``undo_faults`` (the report's ``undo_faults``, which
    makes it not ok) and returned, for the failed step's detail.
    """
    faults: list[UndoFault] = []
    for name in run.quiesced.pop(group, []):
        _undo_one(run, faults, group, after, name, _readmit_undone)
    for name in run.others_quiesced.pop(group, []):
        logger.warning(
            "{}: nothing was stopped; tier {} stays quiesced by whoever quiesced it",
            name,
            run.serve(name).router_tier,
        )
        _undo_one(run, faults, group, after, name, back_in_service)
    for name, g in list(run.reserved.items()):
        if g != group:
            continue
        del run.reserved[name]
        _undo_one(run, faults, group, after, name, settle_failed_start)
        token = run.tokens.pop(name, None)
        if run.ex.starts is not None and not run.detached and token is not None:
            run.ex.starts.end(name, token)
    if failed is not None and failed.action is Action.AWAIT_READY:
        serve = failed.serve
        _undo_one(run, faults, group, after, serve, settle_failed_start)
    # a failed shrink or grow has nothing to undo: resize() left the ledger counting
    # what the engine's answer proves it holds (or its full reservation), and asking
    # the engine to grow back would take memory the ledger may have given away
    run.undo_faults.extend(faults)
    return faults


def _undo_one(
    run: RunContext,
    faults: list[UndoFault],
    group: str,
    after: str,
    serve: str,
    undo: Callable[[RunContext, str], object],
) -> None:
    """Run one serve's undo; a fault it meets is collected and logged, not raised, so
    the undo of the group's other serves goes on."""
    try:
        undo(run, serve)
        return
    except IllegalTransition as exc:  # the machine refused: a bug of the undo's path
        fault = UndoFault(serve, group, exc.trigger, after, f"lifecycle: {exc}")
        logger.error("the undo of group {} (after {}): {}", group, after, fault.fault)
    except Exception as exc:  # a bug too; it must not leave the others undone
        logger.exception(
            "the undo of group {} (after {}): {}: unexpected error", group, after, serve
        )
        fault = UndoFault(
            serve, group, None, after, f"unexpected error: {type(exc).__name__}: {exc}"
        )
    faults.append(fault)


def _readmit_undone(run: RunContext, name: str) -> None:
    """Readmit the tier of ``name``, which its group quiesced and did not stop."""
    s = run.serve(name)
    try:
        detail = readmit_tier(run, s) if s.router_tier is not None else "no router tier"
    except StepError as exc:
        # a legal refusal, not a fault of the undo: the router refused (or could not
        # be asked) to readmit. The tier stays quiesced, named in the report's
        # left_quiesced, and the loop readmits it on later cycles while it runs
        run.left_quiesced[name] = str(exc)
        logger.error(
            "{}: nothing was stopped, but tier {} is left quiesced: {}",
            name,
            s.router_tier,
            exc,
        )
    else:
        logger.info("{}: {} (nothing was stopped)", name, detail)
    back_in_service(run, name)


def undo_text(faults: list[UndoFault]) -> str:
    """What a failed step's detail adds about its undo: "the undo of group G met N
    fault(s): …"."""
    n = len(faults)
    return f"the undo of group {faults[0].group} met {n} fault{'s' if n > 1 else ''}: " + (
        "; ".join(f"{f.serve}: {f.fault}" for f in faults)
    )
