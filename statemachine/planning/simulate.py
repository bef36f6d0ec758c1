"""What the host would look like after a plan succeeds: ``apply_plan``.

Used to check convergence (plan, apply, plan again: nothing to do) and to replay a
plan's effect on the ledger step by step (``ledger_prefixes``). It models success of
every step; failures are the executor's business.

Pure: no I/O, no clock (``now`` is an argument), no docker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from statemachine.domain.types import (
    ContainerObs,
    ContainerState,
    DesiredState,
    InFlightObs,
    Observed,
    ServeSpec,
    SleepObs,
    SleepState,
    StartedWith,
)
from statemachine.ledger.reservations import GpuReservation, Ledger, Refusal, unshrunk_mib
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)


def apply_plan(desired: DesiredState, observed: Observed, plan: Plan, now: float) -> Observed:
    """The observation after every step of ``plan`` succeeded at time ``now``."""
    containers = dict(observed.containers)
    elastic = dict(observed.elastic_mib)
    quiesced = set(observed.quiesced)
    sleep = dict(observed.sleep)
    in_flight = dict(observed.in_flight)
    started_with = dict(observed.started_with)
    for step in plan.steps:
        serve = desired.serves[step.serve]
        if step.action is Action.STOP:
            containers[serve.container] = ContainerObs(
                ContainerState.EXITED, exit_code=0, finished_at=now
            )
            elastic.pop(serve.name, None)  # the engine forgets its reserve when it stops
            sleep.pop(serve.name, None)
            # its start record ends once docker shows it stopped (the shell's rule)
            started_with.pop(serve.container, None)
        elif step.action is Action.RELEASE_TO_RESIDUAL and serve.sleep is not None:
            sleep[serve.name] = SleepObs(
                SleepState.ASLEEP,
                level=serve.sleep.level,
                residual_mib=step.to_mib,
                host_ram_mib=step.host_mib,
            )
            if serve.router_tier:  # its tier stays quiesced while it sleeps
                quiesced.add(serve.name)
        elif step.action is Action.WAKE:
            sleep.pop(serve.name, None)
            if serve.name in in_flight:  # its first reading awake (the shell's tracker)
                in_flight[serve.name] = _woken(in_flight[serve.name], now)
        elif step.action is Action.START:
            containers[serve.container] = ContainerObs(
                ContainerState.RUNNING,
                health="healthy",
                started_at=now,
                gpu_role=",".join(step.gpu_roles),  # what `up` is told: the roles it starts on
            )
            if step.mib:  # as the loop records it (its journal): a start with a reservation
                started_with[serve.container] = StartedWith(serve.name, step.gpu_roles, step.mib)
        elif step.action is Action.READMIT:
            quiesced.discard(serve.name)
        elif step.action in (Action.SHRINK, Action.GROW) and step.to_mib is not None:
            # back to what it holds unshrunk, the engine's figure says nothing more;
            # below it, the figure is what it holds
            full = _unshrunk(serve, started_with.get(serve.container))
            if full is not None and step.to_mib >= full:
                elastic.pop(serve.name, None)
            else:
                elastic[serve.name] = step.to_mib
    # what no step changes (requests in flight but a woken serve's idleness, probes,
    # NVML's figures, starts in progress, memory not back) is carried over as
    # observed; a start is recorded
    return replace(
        observed,
        containers=containers,
        elastic_mib=elastic,
        quiesced=frozenset(quiesced),
        sleep=sleep,
        in_flight=in_flight,
        started_with=started_with,
    )


def _unshrunk(serve: ServeSpec, record: StartedWith | None) -> int | None:
    """What the ledger counts ``serve`` at without an elastic figure: its reservation,
    or the larger one its container was started with (None: no reservation)."""
    return None if serve.vram_mib is None else unshrunk_mib(serve.vram_mib, record)


def _woken(seen: InFlightObs, now: float) -> InFlightObs:
    """What the shell reads of a serve's requests in flight once it is woken at ``now``:
    its idleness and its busy time start afresh from the wake."""
    idle = now if seen.count == 0 else None
    return replace(seen, idle_since=idle, busy_at=None, woke_at=now)


def apply_step(ledger: Ledger, step: Step) -> Ledger | Refusal:
    """One step's effect on the ledger (steps that move no memory return it unchanged)."""
    if step.action is Action.RESERVE and step.mib is not None:
        return ledger.admit(GpuReservation(step.serve, step.gpu_roles, step.mib))
    if step.action is Action.RELEASE:
        return ledger.release(step.serve)
    if step.action in (Action.SHRINK, Action.GROW) and step.to_mib is not None:
        return ledger.resize(step.serve, step.to_mib)
    if step.action is Action.RELEASE_TO_RESIDUAL and step.to_mib is not None:
        return ledger.sleep(step.serve, step.to_mib, step.host_mib or 0)
    if step.action is Action.RESERVE_WAKE and step.to_mib is not None:
        return ledger.wake(step.serve, step.to_mib)
    return ledger


def ledger_prefixes(plan: Plan) -> Iterator[tuple[Step, Ledger | Refusal]]:
    """Replay ``plan`` through the ledger from ``plan.ledger_before``, yielding each result.

    Stops at the first refusal (which is yielded).
    """
    ledger = plan.ledger_before
    for step in plan.steps:
        result = apply_step(ledger, step)
        yield step, result
        if isinstance(result, Refusal):
            return
        ledger = result
