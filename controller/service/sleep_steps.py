"""The executor's sleep and wake steps (a part of ``executor._Run``, kept apart).

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
host only through the executor's adapters.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

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
from controller.store.journal import SleepRecord
from statemachine.ledger import Refusal
from statemachine.lifecycle import ServeLifecycle, Trigger
from statemachine.plan import Action, Step
from statemachine.types import COMMITTED_STATES, ServeSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from controller.service.executor import Executor
    from statemachine.ledger import Ledger
    from statemachine.types import DesiredState, Observed

__all__ = ["SLEEP_ACTIONS", "SleepSteps"]

#: The step kinds this part of the executor carries out.
SLEEP_ACTIONS = frozenset(
    {Action.SLEEP, Action.RELEASE_TO_RESIDUAL, Action.RESERVE_WAKE, Action.WAKE, Action.RELOAD}
)


class SleepSteps:
    """The sleep and wake steps of one execution (mixed into ``executor._Run``)."""

    if TYPE_CHECKING:  # provided by _Run
        ex: Executor
        desired: DesiredState
        observed: Observed
        ledger: Ledger
        machines: dict[str, ServeLifecycle]
        quiesced: dict[str, list[str]]
        used_before_stop: dict[str, dict[str, int]]
        attributed: dict[str, int | None]

        def fire(self, serve: str, trigger: Trigger) -> None: ...
        def role_used(self, roles: tuple[str, ...]) -> dict[str, int]: ...
        def stop(self, step: Step, s: ServeSpec) -> str: ...
        def release(self, step: Step, s: ServeSpec) -> str: ...

    def init_sleep_steps(self) -> None:
        #: serve -> what its devices and container used before its sleep
        self.before_sleep: dict[str, tuple[dict[str, int], int | None]] = {}
        #: serves stopped instead of put to sleep (-> why), whose release is a full one
        self.stopped_instead: dict[str, str] = {}
        #: serve -> its journal record now asleep, or None: no longer asleep
        self.sleeps: dict[str, SleepRecord | None] = {}
        #: serves whose engine answered the sleep API with 404 -> the engine's words
        self.sleep_unsupported: dict[str, str] = {}

    def note_sleep(self, s: ServeSpec, rec: SleepRecord | None) -> None:
        """``s`` is now asleep (its record) or no longer asleep (None): kept for the report
        and told at once to the executor's ``on_sleep`` (the loop's journal), so a crash
        before the plan ends leaves the journal true about an engine that sleeps."""
        self.sleeps[s.name] = rec
        if self.ex.on_sleep is not None:
            self.ex.on_sleep(s.container, rec)

    def sleep_handlers(self) -> dict[Action, Callable[[Step, ServeSpec], str]]:
        return {
            Action.SLEEP: self.sleep,
            Action.RELEASE_TO_RESIDUAL: self.release_to_residual,
            Action.RESERVE_WAKE: self.reserve_wake,
            Action.WAKE: self.wake,
            Action.RELOAD: self.reload,
        }

    def sleep_client(self) -> SleepClient:
        client = self.ex.sleep
        if client is None:
            client = self.ex.sleep = SleepClient()
        return client

    # -- sleep --------------------------------------------------------------------
    def sleep(self, step: Step, s: ServeSpec) -> str:
        if s.sleep is None:
            raise StepErrorLike(f"{s.name} declares no [serve.sleep]")
        sl = sleeper_of(s)
        before = self.role_used(s.gpu_roles)
        attributed = self.observed.container(s.container).gpu_used_mib
        self.before_sleep[s.name] = (before, attributed)
        self.fire(s.name, Trigger.SLEEP)
        try:
            sent = self.sleep_client().sleep(sl.url, sl.protocol, sl.level)
        except SleepNotEnabledError as exc:
            self.sleep_unsupported[s.name] = str(exc)
            logger.error(
                "{}: {}; stopped instead (vramctl lint --compose names the missing flag)",
                s.name,
                exc,
            )
            return self.stop_instead(step, s, f"the engine has no sleep API: {exc}")
        except SleepError as exc:
            return self.stop_instead(step, s, f"the engine did not sleep: {exc}")
        for members in self.quiesced.values():  # its tier stays quiesced while it sleeps
            if s.name in members:
                members.remove(s.name)
        return f"{sent} to {sl.url}"

    def stop_instead(self, step: Step, s: ServeSpec, why: str) -> str:
        """Stop ``s`` instead of putting it to sleep; its release is then a full one."""
        self.stopped_instead[s.name] = why
        detail = self.stop(step, s)
        before, attributed = self.before_sleep.get(s.name, ({}, None))
        # what must come back is what it used before the sleep was asked
        self.used_before_stop[s.name] = before
        self.attributed[s.name] = attributed
        logger.warning("{}: {}: stopped instead", s.name, why)
        return f"{why}: stopped instead ({detail})"

    def release_to_residual(self, step: Step, s: ServeSpec) -> str:
        if s.name not in self.stopped_instead:
            sl = sleeper_of(s)
            before, attributed = self.before_sleep.get(s.name, ({}, None))
            cfg = self.ex.config
            try:
                how = confirm_asleep(
                    self.sleep_client(),
                    sl,
                    before=before,
                    attributed_mib=attributed,
                    devices=lambda: self.role_used(s.gpu_roles),
                    wait_s=cfg.memory_wait_s,
                    poll_s=cfg.poll_s,
                    tolerance_mib=cfg.memory_tolerance_mib,
                    stop_event=self.ex.stop_event,
                )
            except SleepNotConfirmedError as exc:
                self.stop_instead(step, s, str(exc))
            else:
                return self.count_asleep(step, s, sl, how)
        why = self.stopped_instead[s.name]
        released = self.release(step, s)
        self.note_sleep(s, None)
        return f"{why}: stopped instead; {released}"

    def count_asleep(self, step: Step, s: ServeSpec, sl: Sleeper, how: str) -> str:
        """Count the confirmed sleeper at its residual (and its host RAM); when the host
        budget cannot take it now, the serve is stopped instead and released in full."""
        to = step.to_mib if step.to_mib is not None else sl.residual_mib
        host = step.host_mib if step.host_mib is not None else sl.host_ram_mib
        slept = self.ledger.sleep(s.name, to, host)
        if isinstance(slept, Refusal):
            self.stop_instead(step, s, f"asleep, but the ledger refuses it: {slept.message}")
            why = self.stopped_instead[s.name]
            released = self.release(step, s)
            self.note_sleep(s, None)
            return f"{why}: stopped instead; {released}"
        self.ledger = slept
        try:
            state = self.ex.docker.inspect(s.container)
        except ActionError:
            state = None
        started = None if state is None or state.started_at is None else str(state.started_at)
        self.note_sleep(
            s,
            SleepRecord(
                container=s.container,
                serve=s.name,
                level=sl.level,
                gpu_roles=s.gpu_roles,
                residual_mib=to,
                host_ram_mib=host,
                started_at=started,
                since=time.time(),
            ),
        )
        self.fire(s.name, Trigger.SLEPT)
        on_host = f" and {host} MiB of host RAM" if host else ""
        return f"asleep ({how}): holds {to} MiB on {', '.join(s.gpu_roles)}{on_host}"

    # -- wake ---------------------------------------------------------------------
    def reserve_wake(self, step: Step, s: ServeSpec) -> str:
        to = step.to_mib if step.to_mib is not None else s.vram_mib
        if to is None:
            raise StepErrorLike(f"{s.name} has no reservation to wake into")
        woken = self.ledger.wake(s.name, to)
        if isinstance(woken, Refusal):
            raise StepErrorLike(f"the ledger refuses: {woken.message}")
        self.ledger = woken
        self.fire(s.name, Trigger.RESERVE_WAKE)
        back = f"; {step.host_mib} MiB of host RAM given back" if step.host_mib else ""
        return f"reserved {to} MiB on {', '.join(s.gpu_roles)} to wake into{back}"

    def wake(self, step: Step, s: ServeSpec) -> str:
        sl = sleeper_of(s)
        self.fire(s.name, Trigger.WAKE)
        try:
            how = wake_engine(
                self.sleep_client(),
                sl,
                timeout_s=self.ex.runtime(s.name).start_timeout_s,
                poll_s=self.ex.config.poll_s,
                stop_event=self.ex.stop_event,
            )
        except WakeFailedError as exc:
            raise StepErrorLike(f"{exc}; {self.stop_failed_wake(s)}") from None
        self.note_sleep(s, None)
        return how

    def reload(self, step: Step, s: ServeSpec) -> str:
        sl = sleeper_of(s)
        self.fire(s.name, Trigger.RELOAD)
        try:
            done = self.sleep_client().reload(
                sl.url, sl.protocol, timeout_s=self.ex.runtime(s.name).start_timeout_s
            )
        except SleepError as exc:
            raise StepErrorLike(
                f"{s.name}: reload after the wake failed: {exc}; {self.stop_failed_wake(s)}"
            ) from None
        return ", ".join(done) or "nothing to reload"

    def stop_failed_wake(self, s: ServeSpec) -> str:
        """A wake or reload failed: stop the container (a cold start follows, with
        backoff); its full reservation is held until Docker shows it exited."""
        self.note_sleep(s, None)
        if self.machines[s.name].state != "failed":
            self.fire(s.name, Trigger.WAKE_FAILED)
        try:
            self.ex.docker.stop(s.container, self.ex.runtime(s.name).stop_timeout_s)
            state = self.ex.docker.inspect(s.container)
        except ActionError as exc:
            return f"stopping {s.container} failed too ({exc}): its full reservation is kept"
        if state is not None and state.state in COMMITTED_STATES:
            return f"{s.container} is still {state.state}: its full reservation is kept"
        result = self.ledger.release(s.name)
        if not isinstance(result, Refusal):
            self.ledger = result
        return f"{s.container} stopped: a cold start follows"


def StepErrorLike(message: str) -> Exception:  # noqa: N802 - raised like a class
    """The executor's :class:`~controller.service.executor.StepError` (imported late:
    the executor imports this module)."""
    from controller.service.executor import StepError

    return StepError(message)
