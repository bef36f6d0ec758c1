"""The router's steps: quiesce, drain and readmit a serve's tier.

- a drain that times out or is refused stops nothing (the step is aborted; the undo
  readmits every tier quiesced for the same group);
- a readmit counts only when the router answers ``readmitted: true``: a refusal is
  retried with backoff for ``readmit_wait_s`` and then fails the step (the tier stays
  quiesced; the loop readmits it on later cycles while the serve runs);
- a tier quiesced by someone else (a reason that is not the controller's own) is
  never quiesced again (that would overwrite the reason) nor readmitted.

This module must not decide which tier to quiesce (the planner does) and reaches the
router only through the run's :class:`~controller.adapters.router.RouterClient`.
"""

from __future__ import annotations

import time

from loguru import logger

from controller.adapters.router import RouterError, TierState
from controller.service.steps.context import RunContext
from controller.service.steps.lifecycle import fire
from controller.service.steps.results import StepError
from statemachine.domain.types import ServeSpec
from statemachine.lifecycle.machine import Trigger
from statemachine.planning.plan_types import (
    Step,
)


def tier_state(run: RunContext, tier: str, before: str) -> TierState:
    """The tier's state now; unreadable, the step fails (nothing done on a guess)."""
    try:
        return run.router().tier_state(tier)
    except RouterError as exc:
        raise StepError(f"cannot read the state of tier {tier} before {before}: {exc}") from None


def quiesce(run: RunContext, step: Step, s: ServeSpec) -> str:
    assert s.router_tier is not None
    state = tier_state(run, s.router_tier, "quiescing it (nothing stopped)")
    if state.quiesced_by_other:
        # quiescing again would overwrite its reason, and our readmit would then
        # lift someone else's quiesce: leave it, and never readmit it
        fire(run, s.name, Trigger.QUIESCE)
        run.others_quiesced.setdefault(step.group, []).append(s.name)
        logger.warning(
            "{}: tier {} is already quiesced by someone else (reason {!r}): left as it "
            "is, and never readmitted by vramctl",
            s.name,
            s.router_tier,
            state.reason,
        )
        return (
            f"tier {s.router_tier} already quiesced by someone else (reason "
            f"{state.reason!r}): not quiesced again, never readmitted by vramctl"
        )
    try:
        ans = run.router().transition("quiesce", s.router_tier)
    except RouterError as exc:
        raise StepError(f"router refused quiesce of {s.router_tier}: {exc}") from None
    if not ans.applied:
        raise StepError(f"router did not apply quiesce of {s.router_tier}: {ans.raw}")
    run.quiesced.setdefault(step.group, []).append(s.name)
    fire(run, s.name, Trigger.QUIESCE)
    return f"tier {s.router_tier} quiesced"


def drain(run: RunContext, step: Step, s: ServeSpec) -> str:
    assert s.router_tier is not None
    timeout = run.ex.runtime(s.name).drain_timeout_s
    try:
        ans = run.router().transition("drain", s.router_tier, drain_timeout_s=timeout)
    except RouterError as exc:
        raise StepError(f"drain of {s.router_tier} refused: {exc}", aborted=True) from None
    if not ans.applied or ans.timed_out or ans.drained is False:
        why = "timed out" if ans.timed_out else "was not applied"
        raise StepError(
            f"drain of {s.router_tier} {why} after up to {timeout:g}s: nothing stopped",
            aborted=True,
        )
    fire(run, s.name, Trigger.DRAIN)
    return f"tier {s.router_tier} drained"


def readmit(run: RunContext, step: Step, s: ServeSpec) -> str:
    assert s.router_tier is not None
    if run.ex.router is None:  # nothing was quiesced without a router: nothing to undo
        return f"no router is configured: tier {s.router_tier} not readmitted"
    return readmit_tier(run, s)


def readmit_tier(run: RunContext, s: ServeSpec) -> str:
    """Readmit ``s``'s tier; counts only on ``readmitted: true`` (``StepError`` else).

    An admitting tier needs nothing. A tier quiesced by someone else is left as it
    is (said in the detail and the log). A refusal is asked again with backoff for
    ``readmit_wait_s`` (not ``identity_not_configured``: no wait changes the
    router's configuration); then the step fails and the tier stays quiesced.
    """
    tier = s.router_tier
    assert tier is not None
    state = tier_state(run, tier, "readmitting it (left as it is)")
    if state.admitting:
        return f"tier {tier} already admitting"
    if state.quiesced_by_other:
        logger.warning(
            "{}: tier {} is quiesced by someone else (reason {!r}): not readmitted by "
            "vramctl; whoever quiesced it readmits it",
            s.name,
            tier,
            state.reason,
        )
        return (
            f"tier {tier} is quiesced by someone else (reason {state.reason!r}): "
            "not readmitted by vramctl"
        )
    if not state.quiesced:
        raise StepError(
            f"tier {tier} is in a state vramctl does not know ({state.state!r}): not readmitted"
        )
    cfg = run.ex.config
    begin = time.monotonic()
    pause = cfg.readmit_poll_s
    refusals: list[str] = []
    while True:
        try:
            ans = run.router().transition("readmit", tier)
        except RouterError as exc:
            raise StepError(f"readmit of {tier} refused: {exc}; tier left quiesced") from None
        if ans.readmitted is True or (
            ans.readmitted is None and ans.applied and _admitting_now(run, tier)
        ):
            tries = f" (after {len(refusals)} refusals: {refusals[-1]})" if refusals else ""
            return f"tier {tier} readmitted{tries}"
        reason = ans.reason or (
            "the answer does not say readmitted: true"
            if ans.readmitted is None
            else "no reason given"
        )
        refusals.append(reason)
        elapsed = time.monotonic() - begin
        if (
            reason == "identity_not_configured"
            or elapsed + pause > cfg.readmit_wait_s
            or run.ex.stop_event.wait(pause)
        ):
            break
        pause = min(pause * 2, cfg.readmit_poll_max_s)
    raise StepError(
        f"router refused to readmit tier {tier} {len(refusals)} time(s) in "
        f"{time.monotonic() - begin:.0f}s (last reason: {refusals[-1]}): the tier stays "
        f"quiesced (its clients get 503); readmitted by later cycles while {s.name} runs"
    )


def _admitting_now(run: RunContext, tier: str) -> bool:
    try:
        return run.router().tier_state(tier).admitting
    except RouterError:
        return False
