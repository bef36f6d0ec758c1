"""The elastic steps: shrink and grow a serve's expert cache through its VRAM endpoint.

- a shrink counts only as far as the engine's own expert cache shows it gave back
  (free VRAM on the card proves nothing about one engine); a grow counts before the
  call, and a grow, a resize that failed inside the engine (then reloaded) or one
  that got no answer counts the serve at its full reservation (:func:`count`);
- a resize that got no answer is remembered on the executor (``unanswered``): the
  same step asks for the same reserve again, not a new card-wide figure.

This module must not decide what to resize (the planner does) and reaches the engine
only through the run's :class:`~controller.adapters.elastic.ElasticClient`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from loguru import logger

from controller.adapters.docker.actions import ActionError
from controller.adapters.elastic import ElasticAnswer, ElasticError, elastic_ok
from controller.service.steps.context import RunContext
from controller.service.steps.lifecycle import fire
from controller.service.steps.results import ElasticFigure, StepError
from statemachine.domain.types import ServeSpec
from statemachine.ledger.reservations import GpuReservation, Ledger, Refusal
from statemachine.lifecycle.machine import trigger_for
from statemachine.planning.plan_types import (
    Action,
    Step,
)


@dataclass(frozen=True, slots=True)
class _Reserved:
    """The engine's answer to a resize: when, whether it ran, what it holds now."""

    ans: ElasticAnswer
    at: float
    ran: bool
    why: str
    #: what the engine holds after it (``None``: the answer does not say)
    holds: int | None
    #: the reserves asked, "N[, then M]"
    asked: str
    #: "elastic shrink of S": what the step's detail starts with
    action: str

    @property
    def what(self) -> str:
        """ "elastic shrink of S (reserve_mib N[, then M])", for the step's detail."""
        return f"{self.action} (reserve_mib {self.asked})"


def resize(run: RunContext, step: Step, s: ServeSpec) -> str:
    """Resize an elastic serve; the ledger never counts less than the engine holds.

    A grow is admitted by the ledger first (refused there, the engine is not asked)
    and counted before the call. A shrink is counted only once the engine's own
    cache proves it (``expert_cache_full_mib - expert_cache_mib`` covers what the
    plan takes off its reservation); free VRAM on the card proves nothing, as it
    counts room other serves have reserved and not used yet. When the first answer
    shows the engine holding more than the plan counts (the card looked freer than
    the ledger), it is asked once more for the missing MiB above the free VRAM it
    reported. Then:

    - proven: counted at the plan's figure;
    - gave back less (its floor): counted at what it still holds, step failed;
    - 409 busy, or no answer within the client's wait: nothing proven, counted as
      before (a grow: at full, it may have run), step aborted; the same reserve is
      asked again on a later step;
    - 503 or a failure inside the resize: the cache table cannot be trusted; the
      model is unloaded and loaded again (or the container restarted) and the
      serve counted at its full reservation, step failed;
    - refused (400) or ``not loaded``: nothing ran; a ``not loaded`` engine sizes
      its cache afresh when it loads, so it is counted at full.

    What the ledger ends at is reported (``report.elastic``) with the time of the
    answer that established it, for the journal.
    """
    if s.elastic is None or step.to_mib is None or s.vram_mib is None:
        raise StepError(f"{s.name} is not elastic")
    held = run.ledger.holdings.get(s.name)
    if held is None:
        raise StepError(f"{s.name} holds no reservation to resize")
    before, to, full = held.mib, step.to_mib, s.vram_mib
    grow = step.action is Action.GROW
    if grow:
        resized = run.ledger.resize(s.name, to)
        if isinstance(resized, Refusal):
            raise StepError(f"the ledger refuses: {resized.message}")
        run.ledger = resized  # counted before the call: the engine may grow in part
    ans = _ask_reserve(run, step, s, before=before, full=full)
    return _settle_resize(run, step, s, ans, before=before, full=full)


def _ask_reserve(run: RunContext, step: Step, s: ServeSpec, *, before: int, full: int) -> _Reserved:
    """Ask the engine for the reserve that gets ``s`` to ``step.to_mib`` (twice at most).

    No answer raises (a grow counted at full first); a transient one is remembered,
    so the same reserve is asked again by the same step later.
    """
    assert s.elastic is not None and step.to_mib is not None
    to, grow = step.to_mib, step.action is Action.GROW
    el, token = s.elastic, _env_token(s.elastic.token_env)
    pending = run.ex.unanswered.get(s.name)
    if pending is not None and pending[:2] == (str(step.action), to):
        target = pending[2]
    else:
        target = reserve_target(run, step, s)
    what = f"elastic {step.action} of {s.name}"
    asked: list[int | None] = []
    while True:
        asked.append(target)
        try:
            ans = run.ex.elastic.set_reserve(el.url, target, token=token)
        except ElasticError as exc:
            if exc.transient:
                run.ex.unanswered[s.name] = (str(step.action), to, target)
            if grow:
                count(run, s, full, time.time())
                raise StepError(
                    f"{what} (reserve_mib {target}): {exc}; it may have grown: "
                    f"counted at its full {full} MiB until an answer proves less"
                ) from None
            raise StepError(
                f"{what} (reserve_mib {target}): {exc}; nothing proven: counted at "
                f"{before} MiB, the same reserve is asked again later",
                aborted=exc.transient,
            ) from None
        at = time.time()
        run.ex.unanswered.pop(s.name, None)
        ran, why = elastic_ok(ans, target)
        gave = ans.given_back_mib
        holds = None if gave is None else max(0, full - gave)
        if holds is None or holds <= to or len(asked) > 1 or ans.vram_free_mib is None or not ran:
            break
        # the card looked freer than the ledger: ask for what is missing on top
        retry = max(_role_reserve(run, s), ans.vram_free_mib + (holds - to))
        if target is not None and retry <= target:
            break  # it stopped at its floor: asking again changes nothing
        target = retry
    asked_text = ", then ".join(str(a) for a in asked)
    return _Reserved(ans, at, ran, why, holds, asked_text, what)


def _settle_resize(
    run: RunContext, step: Step, s: ServeSpec, r: _Reserved, *, before: int, full: int
) -> str:
    """Count ``s`` at what the engine's answer proves, and say how the step ended."""
    assert step.to_mib is not None
    to, grow, ans, why, holds = step.to_mib, step.action is Action.GROW, r.ans, r.why, r.holds
    if ans.busy:
        raise StepError(
            f"{r.what}: {why}; nothing ran, asked again on a later cycle",
            aborted=True,
        )
    if ans.needs_model_reload:
        count(run, s, full, r.at)
        reload = reload_elastic_model(run, s)
        raise StepError(
            f"{r.what}: {why}; its cache table cannot be "
            f"trusted: {reload}; counted at its full {full} MiB until an answer "
            "proves less"
        )
    if not r.ran:
        if ans.status == "not loaded":
            count(run, s, full, r.at)
            why += f"; counted at its full {full} MiB (it sizes its cache when it loads)"
        raise StepError(f"{r.what}: {why}")
    if holds is None:
        if grow:
            count(run, s, full, r.at)
        raise StepError(
            f"{r.what}: {why}: the answer does not say what "
            f"the engine holds; counted at {full if grow else before} MiB"
        )
    # never less than it holds; rounded to the plan's figure when it holds no more
    count(run, s, max(to, holds), r.at)
    if holds > to:
        raise StepError(
            f"{r.what}: {why}: its cache gives back "
            f"{full - holds} MiB, the plan needs {full - to}: counted at the "
            f"{holds} MiB it still holds"
        )
    fire(run, s.name, trigger_for(step.action))
    return f"{s.name} now holds {to} MiB (reserve_mib {r.asked}; {why})"


def count(run: RunContext, s: ServeSpec, mib: int, at: float) -> None:
    """Count ``s`` at ``mib`` from now on (over the budget if it must be), and say so."""
    resized = run.ledger.resize(s.name, mib)
    if isinstance(resized, Refusal):  # it holds it whether or not it fits: count it
        holdings = [
            r if r.holder != s.name else GpuReservation(r.holder, r.gpu_roles, mib)
            for r in run.ledger.holdings.values()
        ]
        resized = Ledger(
            run.ledger.roles,
            holdings,
            host=run.ledger.host,
            host_holdings=run.ledger.host_holdings,
        )
        logger.error(
            "{}: counted at {} MiB, what its engine may hold, though that is over the budget of {}",
            s.name,
            mib,
            ", ".join(s.gpu_roles),
        )
    run.ledger = resized
    full = s.vram_mib
    run.elastic[s.name] = ElasticFigure(None if full is None or mib >= full else mib, at)


def reload_elastic_model(run: RunContext, s: ServeSpec) -> str:
    """Unload and load the model (a fresh engine); restart the container if that fails."""
    assert s.elastic is not None
    el, token = s.elastic, _env_token(s.elastic.token_env)
    try:
        unload = run.ex.elastic.unload(el.url, token=token)
        if unload.http_status // 100 != 2:
            problem = f"POST /v1/unload answered {unload.http_status}: {unload.error}"
        else:
            load = run.ex.elastic.load(el.url, token=token)
            if load.http_status // 100 == 2:
                return "reloaded (POST /v1/unload, then /v1/load: a fresh engine)"
            problem = f"POST /v1/load answered {load.http_status}: {load.error}"
    except ElasticError as exc:
        problem = str(exc)
    stop_s = run.ex.runtime(s.name).stop_timeout_s
    try:
        run.ex.docker.stop(s.container, stop_s)
        run.ex.docker.start(s.container)
    except ActionError as exc:
        return f"{problem}; restarting {s.container} failed too: {exc}"
    return f"{problem}; container {s.container} restarted instead"


def _role_reserve(run: RunContext, s: ServeSpec) -> int:
    """The role's reserve: never ask the engine to leave less free on the card."""
    role = run.desired.roles.get(s.gpu_roles[0]) if s.gpu_roles else None
    return role.reserve_mib if role is not None else 0


def reserve_target(run: RunContext, step: Step, s: ServeSpec) -> int | None:
    """The ``reserve_mib`` to ask of the engine: the free MiB the card must show after.

    With NVML: the device's free MiB now plus what the shrink gives back (minus what a
    grow takes). Without: the role's capacity minus what the ledger commits after the
    resize (the role's reserve is not counted as free). Never below the role's reserve
    (a partial grow must not ask the engine to leave nothing free on the card). A grow
    back to the full reservation asks for ``null`` (the engine's start-up default).
    Either way the engine's cache figures, not this, prove what it gave back.
    """
    if step.action is Action.GROW and s.vram_mib is not None and (step.to_mib or 0) >= s.vram_mib:
        return None
    delta = step.mib or 0
    signed = delta if step.action is Action.SHRINK else -delta
    least = _role_reserve(run, s)
    gpus = run.ex.gpus()
    if gpus is not None:
        by_uuid = {g.uuid: g for g in gpus}
        role = run.desired.roles.get(s.gpu_roles[0]) if s.gpu_roles else None
        dev = by_uuid.get(role.uuid) if role is not None and role.uuid else None
        if dev is not None and dev.free_mib is not None:
            return max(least, dev.free_mib + signed)
    role = run.desired.roles[s.gpu_roles[0]]
    committed = run.ledger.committed_mib(role.id)
    if step.action is Action.GROW:  # the grow is already counted in the ledger
        committed -= delta
    return max(least, role.capacity_mib - committed + signed)


def _env_token(var: str | None) -> str | None:
    """The value of the environment variable ``var`` (stripped), or ``None``."""
    if not var:
        return None
    value = os.environ.get(var)
    return value.strip() if value else None
