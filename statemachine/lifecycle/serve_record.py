"""One record per serve: its lifecycle state and the per-serve marks, as a frozen value.

A :class:`ServeRecord` is what the controller knows of one serve between observations:
its lifecycle state (the machine of :mod:`statemachine.lifecycle.machine` is its only authority),
its failure backoff and the marks the loop keeps of it (no sleep / no shrink until it
starts again, a stop made by the controller, a healthy run seen, a release not yet
confirmed, a tier left quiesced) and its placement: the card(s) its container holds
its reservation on, as its start chose them or as it was found running (kept in the
journal's start records, their storage: ``controller/service/records.py`` fills it). The
facts the journal keeps in tables of their own (a sleep's record, an ``up`` in progress,
an elastic reserve) stay there, their one home.

The record moves in two ways, both pure and both through declared triggers only:

- by *execution*: :func:`fire` applies one trigger (the executor's step outcomes);
- by *observation*: :func:`observe` moves the record to what an observation shows
  (a :func:`reading` of the container: ``stopped``, ``starting``, ``running``,
  ``asleep`` or ``failed``) along the declared path :data:`OBSERVATION_PATHS` names for
  its state: ``observe_running`` / ``observe_stopped`` / ``observe_asleep`` /
  ``observe_awake`` for adoption and outside changes, ``recover`` / ``reset`` for a
  failed serve seen running again or confirmed down, ``fail`` / ``start_failed`` /
  ``stop_failed`` for a failure seen, ``ready`` / ``stopped`` / ``slept`` for a step
  whose confirmation the observation brings, ``abandon`` for a reservation no start
  followed. Where the machine declares no path (say ``running`` seen ``starting``
  because Docker restarts the container) the record is *adopted* in the state seen,
  as :class:`~statemachine.lifecycle.machine.ServeLifecycle` allows a machine to begin in any
  state; :func:`observation_path` returns ``None`` for those.

The state a plan's execution starts from is the record moved to the
:func:`plan_reading` (a container that holds memory is ``running`` or ``asleep``,
anything else ``stopped``): a failed serve whose container is down is ``reset``
(it may be planned again), one whose health is still starting is taken ``ready``.

This module is pure: no I/O, no clock (times are arguments), no logging, no docker.
It must not decide what to do (the planner does) nor carry anything out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final

from statemachine.domain.types import ContainerObs, ContainerState
from statemachine.lifecycle.backoff import Backoff
from statemachine.lifecycle.machine import IllegalTransition, LifecycleState, Trigger, next_state

_S = LifecycleState
_T = Trigger

#: Exit codes of a container that was asked to stop (``docker stop`` sends SIGTERM:
#: 128 + 15; SIGINT: 128 + 2) or ended cleanly: not a crash.
CLEAN_EXITS: Final[frozenset[int | None]] = frozenset({None, 0, 130, 143})


@dataclass(frozen=True, slots=True)
class ServeRecord:
    """What the controller knows of one serve: its lifecycle state and its marks."""

    serve: str
    lifecycle: LifecycleState = LifecycleState.STOPPED
    #: its failure backoff (``None``: no failure counted); the loop's live count, which
    #: ``statemachine/lifecycle/backoff.py`` moves in place
    backoff: Backoff | None = None
    #: its engine has no sleep API or its last sleep did not confirm (stop instead)
    no_sleep: bool = False
    #: its last elastic shrink failed: evicted instead of shrunk
    no_shrink: bool = False
    #: its router tier may have been left quiesced by the controller
    quiesced: bool = False
    #: stopped, but NVML has not yet shown the memory back
    unreleased: bool = False
    #: ``started_at`` of the container the controller stopped (not a crash)
    stopped_by_us: float | None = None
    #: ``started_at`` of its container last seen running healthy
    ran_healthy: float | None = None
    #: the card(s) its container holds its reservation on, as its start chose them (a
    #: placed serve's one card) or as it was found running; ``None``: it holds none
    placement: tuple[str, ...] | None = None


def fire(record: ServeRecord, trigger: str) -> ServeRecord:
    """``record`` moved by ``trigger``; raises :class:`IllegalTransition` if not legal."""
    dest = next_state(record.lifecycle, trigger)
    if dest is None:
        raise IllegalTransition(record.serve, record.lifecycle, trigger)
    return replace(record, lifecycle=dest)


def reading(obs: ContainerObs, *, asleep: bool = False, starting: bool = False) -> LifecycleState:
    """The lifecycle state an observation of the serve's container shows.

    ``starting``: the controller has the serve's start in progress. A container that
    holds memory is ``asleep`` when its engine says so, ``starting`` while Docker
    restarts it or its healthcheck says starting, else ``running``; one that was
    OOM-killed, is dead, or exited with a code other than a clean one
    (:data:`CLEAN_EXITS`) is ``failed``; otherwise ``stopped``.
    """
    if starting or obs.state is ContainerState.RESTARTING:
        return _S.STARTING
    if obs.holds:
        if asleep:
            return _S.ASLEEP
        return _S.STARTING if obs.health == "starting" else _S.RUNNING
    if obs.state is ContainerState.DEAD or obs.oom_killed:
        return _S.FAILED
    if obs.state is ContainerState.EXITED and obs.exit_code not in CLEAN_EXITS:
        return _S.FAILED
    return _S.STOPPED


def plan_reading(obs: ContainerObs, *, asleep: bool = False) -> LifecycleState:
    """The state a plan made from this observation expects the serve in.

    A container that holds memory is ``asleep`` (its engine says so) or ``running``;
    anything else is ``stopped`` (a failed serve's container is down: it may be planned).
    """
    if obs.holds:
        return _S.ASLEEP if asleep else _S.RUNNING
    return _S.STOPPED


def _paths() -> Mapping[tuple[LifecycleState, LifecycleState], tuple[Trigger, ...]]:
    """The declared path from each (state, reading) pair that has one."""
    paths: dict[tuple[LifecycleState, LifecycleState], tuple[Trigger, ...]] = {
        (_S.STOPPED, _S.RUNNING): (_T.OBSERVE_RUNNING,),
        (_S.STOPPED, _S.ASLEEP): (_T.OBSERVE_RUNNING, _T.OBSERVE_ASLEEP),
        (_S.RESERVED, _S.STOPPED): (_T.ABANDON,),
        (_S.RESERVED, _S.RUNNING): (_T.ABANDON, _T.OBSERVE_RUNNING),
        (_S.RESERVED, _S.FAILED): (_T.START_FAILED,),
        (_S.STARTING, _S.RUNNING): (_T.READY,),
        (_S.STARTING, _S.FAILED): (_T.START_FAILED,),
        (_S.RUNNING, _S.STOPPED): (_T.OBSERVE_STOPPED,),
        (_S.RUNNING, _S.ASLEEP): (_T.OBSERVE_ASLEEP,),
        (_S.STOPPING, _S.STOPPED): (_T.STOPPED,),
        (_S.STOPPING, _S.FAILED): (_T.STOP_FAILED,),
        (_S.SLEEPING, _S.ASLEEP): (_T.SLEPT,),
        (_S.ASLEEP, _S.STOPPED): (_T.OBSERVE_STOPPED,),
        (_S.ASLEEP, _S.RUNNING): (_T.OBSERVE_AWAKE,),
        (_S.WAKING, _S.RUNNING): (_T.READY,),
        (_S.FAILED, _S.STOPPED): (_T.RESET,),
        (_S.FAILED, _S.RUNNING): (_T.RECOVER,),
        (_S.FAILED, _S.ASLEEP): (_T.RECOVER, _T.OBSERVE_ASLEEP),
    }
    for state in (_S.QUIESCING, _S.DRAINING):
        paths[(state, _S.STOPPED)] = (_T.OBSERVE_STOPPED,)
    for state in (_S.RUNNING, _S.QUIESCING, _S.DRAINING, _S.SLEEPING, _S.ASLEEP, _S.WAKING):
        paths[(state, _S.FAILED)] = (_T.FAIL,)
    return MappingProxyType(paths)


#: (state, reading) -> the triggers that move a record in ``state`` to what the
#: observation shows. A pair missing here (and not equal) has no declared path: adopted.
OBSERVATION_PATHS: Final = _paths()


def observation_path(state: LifecycleState, seen: LifecycleState) -> tuple[Trigger, ...] | None:
    """The triggers that move ``state`` to ``seen`` (none when equal); ``None``: adopted."""
    if state is seen:
        return ()
    return OBSERVATION_PATHS.get((state, seen))


def observe(record: ServeRecord, seen: LifecycleState) -> ServeRecord:
    """``record`` moved to the observed ``seen`` state, along its declared path if any."""
    path = observation_path(record.lifecycle, seen)
    if path is None:
        return replace(record, lifecycle=seen)
    for trigger in path:
        record = fire(record, trigger)
    return record
