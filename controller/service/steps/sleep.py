"""The executor's sleep and wake steps, each a handler given the run's context.

Around a sleep: (quiesce → drain →) ``sleep`` → ``release_to_residual``; around a wake:
``reserve_wake`` → ``wake`` (→ ``reload`` at level 2) → ``await_ready`` → ``readmit``.

- ``sleep`` asks the engine (:mod:`controller.adapters.sleep`) after noting what the
  devices and the container used. An engine that answers 404 (not started with its
  sleep flag) or refuses is **stopped instead**, and the step says so;
- ``release_to_residual`` confirms the sleep (the engine says it sleeps and, where NVML
  sees the devices, the memory came down by what the container used less its
  residual, within ``memory_wait_s``), then counts the serve at ``residual_mib`` and,
  at level 1, its ``host_ram_mib`` on the host. A sleep that does not confirm is a
  stop instead: the container is stopped and its whole reservation released once the
  stop is confirmed, as after any stop;
- ``reserve_wake`` admits the full reservation again (refused: nothing is woken) and
  gives the host RAM back;
- ``wake`` / ``reload`` wake the engine (and reload a level-2 sleeper's weights) within
  ``start_timeout_s``; when either fails the serve is stopped, counted at its full
  reservation until the stop is confirmed, and left to a cold start with backoff.

What changed is reported per serve (``sleeps``: the journal record of a serve now
asleep, ``None`` for one no longer asleep) for the loop to journal.

This module must not decide what to put to sleep (the planner does) and reaches the
host only through the executor's adapters (the run's ``ex``).
"""

from __future__ import annotations

import time

from loguru import logger

from controller.adapters.docker.actions import ActionError
from controller.adapters.sleep import SleepClient, SleepError, SleepNotEnabledError
from controller.service.sleeping import (
    Sleeper,
    SleepNotConfirmedError,
    WakeFailedError,
    confirm_asleep,
    sleeper_of,
    wake_engine,
)
from controller.service.steps.containers import release, stop
from controller.service.steps.context import RunContext
from controller.service.steps.lifecycle import fire
from controller.service.steps.results import StepError
from controller.store.journal import SleepRecord
from statemachine.domain.types import COMMITTED_STATES, ServeSpec
from statemachine.ledger.reservations import Refusal
from statemachine.lifecycle.machine import Trigger
from statemachine.planning.plan_types import Action, Step

__all__ = [
    "SLEEP_ACTIONS",
    "release_to_residual",
    "reload",
    "reserve_wake",
    "sleep",
    "wake",
]

#: The step kinds this part of the executor carries out.
SLEEP_ACTIONS = frozenset(
    {Action.SLEEP, Action.RELEASE_TO_RESIDUAL, Action.RESERVE_WAKE, Action.WAKE, Action.RELOAD}
)


def note_sleep(run: RunContext, s: ServeSpec, rec: SleepRecord | None) -> None:
    """``s`` is now asleep (its record) or no longer asleep (None): kept for the report
    and told at once to the executor's ``on_sleep`` (the loop's journal), so a crash
    before the plan ends leaves the journal true about an engine that sleeps."""
    run.sleeps[s.name] = rec
    if run.ex.on_sleep is not None:
        run.ex.on_sleep(s.container, rec)


def sleep_client(run: RunContext) -> SleepClient:
    client = run.ex.sleep
    if client is None:
        client = run.ex.sleep = SleepClient()
    return client


def sleep(run: RunContext, step: Step, s: ServeSpec) -> str:
    if s.sleep is None:
        raise StepError(f"{s.name} declares no [serve.sleep]")
    sl = sleeper_of(s)
    before = run.role_used(s.gpu_roles)
    attributed = run.observed.container(s.container).gpu_used_mib
    run.before_sleep[s.name] = (before, attributed)
    fire(run, s.name, Trigger.SLEEP)
    try:
        sent = sleep_client(run).sleep(sl.url, sl.protocol, sl.level)
    except SleepNotEnabledError as exc:
        run.sleep_unsupported[s.name] = str(exc)
        logger.error(
            "{}: {}; stopped instead (vramctl lint --compose names the missing flag)",
            s.name,
            exc,
        )
        return stop_instead(run, step, s, f"the engine has no sleep API: {exc}")
    except SleepError as exc:
        return stop_instead(run, step, s, f"the engine did not sleep: {exc}")
    for members in run.quiesced.values():  # its tier stays quiesced while it sleeps
        if s.name in members:
            members.remove(s.name)
    return f"{sent} to {sl.url}"


def stop_instead(run: RunContext, step: Step, s: ServeSpec, why: str) -> str:
    """Stop ``s`` instead of putting it to sleep; its release is then a full one."""
    run.stopped_instead[s.name] = why
    detail = stop(run, step, s)
    before, attributed = run.before_sleep.get(s.name, ({}, None))
    # what must come back is what it used before the sleep was asked
    run.used_before_stop[s.name] = before
    run.attributed[s.name] = attributed
    logger.warning("{}: {}: stopped instead", s.name, why)
    return f"{why}: stopped instead ({detail})"


def release_to_residual(run: RunContext, step: Step, s: ServeSpec) -> str:
    if s.name not in run.stopped_instead:
        sl = sleeper_of(s)
        before, attributed = run.before_sleep.get(s.name, ({}, None))
        cfg = run.ex.config
        try:
            how = confirm_asleep(
                sleep_client(run),
                sl,
                before=before,
                attributed_mib=attributed,
                devices=lambda: run.role_used(s.gpu_roles),
                wait_s=cfg.memory_wait_s,
                poll_s=cfg.poll_s,
                tolerance_mib=cfg.memory_tolerance_mib,
                stop_event=run.ex.stop_event,
            )
        except SleepNotConfirmedError as exc:
            stop_instead(run, step, s, str(exc))
        else:
            return count_asleep(run, step, s, sl, how)
    why = run.stopped_instead[s.name]
    released = release(run, step, s)
    note_sleep(run, s, None)
    return f"{why}: stopped instead; {released}"


def count_asleep(run: RunContext, step: Step, s: ServeSpec, sl: Sleeper, how: str) -> str:
    """Count the confirmed sleeper at its residual (and its host RAM); when the host
    budget cannot take it now, the serve is stopped instead and released in full."""
    to = step.to_mib if step.to_mib is not None else sl.residual_mib
    host = step.host_mib if step.host_mib is not None else sl.host_ram_mib
    slept = run.ledger.sleep(s.name, to, host)
    if isinstance(slept, Refusal):
        stop_instead(run, step, s, f"asleep, but the ledger refuses it: {slept.message}")
        why = run.stopped_instead[s.name]
        released = release(run, step, s)
        note_sleep(run, s, None)
        return f"{why}: stopped instead; {released}"
    run.ledger = slept
    try:
        state = run.ex.docker.inspect(s.container)
    except ActionError:
        state = None
    started = None if state is None or state.started_at is None else str(state.started_at)
    # container, serve, level, roles, residual MiB, host RAM MiB, its start, since
    record = SleepRecord(s.container, s.name, sl.level, s.gpu_roles, to, host, started, time.time())
    note_sleep(run, s, record)
    fire(run, s.name, Trigger.SLEPT)
    on_host = f" and {host} MiB of host RAM" if host else ""
    return f"asleep ({how}): holds {to} MiB on {', '.join(s.gpu_roles)}{on_host}"


def reserve_wake(run: RunContext, step: Step, s: ServeSpec) -> str:
    to = step.to_mib if step.to_mib is not None else s.vram_mib
    if to is None:
        raise StepError(f"{s.name} has no reservation to wake into")
    woken = run.ledger.wake(s.name, to)
    if isinstance(woken, Refusal):
        raise StepError(f"the ledger refuses: {woken.message}")
    run.ledger = woken
    fire(run, s.name, Trigger.RESERVE_WAKE)
    back = f"; {step.host_mib} MiB of host RAM given back" if step.host_mib else ""
    return f"reserved {to} MiB on {', '.join(s.gpu_roles)} to wake into{back}"


def wake(run: RunContext, step: Step, s: ServeSpec) -> str:
    sl = sleeper_of(s)
    fire(run, s.name, Trigger.WAKE)
    try:
        how = wake_engine(
            sleep_client(run),
            sl,
            timeout_s=run.ex.runtime(s.name).start_timeout_s,
            poll_s=run.ex.config.poll_s,
            stop_event=run.ex.stop_event,
        )
    except WakeFailedError as exc:
        raise StepError(f"{exc}; {stop_failed_wake(run, s)}") from None
    note_sleep(run, s, None)
    return how


def reload(run: RunContext, step: Step, s: ServeSpec) -> str:
    sl = sleeper_of(s)
    fire(run, s.name, Trigger.RELOAD)
    try:
        done = sleep_client(run).reload(
            sl.url, sl.protocol, timeout_s=run.ex.runtime(s.name).start_timeout_s
        )
    except SleepError as exc:
        raise StepError(
            f"{s.name}: reload after the wake failed: {exc}; {stop_failed_wake(run, s)}"
        ) from None
    return ", ".join(done) or "nothing to reload"


def stop_failed_wake(run: RunContext, s: ServeSpec) -> str:
    """A wake or reload failed: stop the container (a cold start follows, with
    backoff); its full reservation is held until Docker shows it exited."""
    note_sleep(run, s, None)
    if run.machines[s.name].state != "failed":
        fire(run, s.name, Trigger.WAKE_FAILED)
    try:
        run.ex.docker.stop(s.container, run.ex.runtime(s.name).stop_timeout_s)
        state = run.ex.docker.inspect(s.container)
    except ActionError as exc:
        return f"stopping {s.container} failed too ({exc}): its full reservation is kept"
    if state is not None and state.state in COMMITTED_STATES:
        return f"{s.container} is still {state.state}: its full reservation is kept"
    result = run.ledger.release(s.name)
    if not isinstance(result, Refusal):
        run.ledger = result
    return f"{s.container} stopped: a cold start follows"
