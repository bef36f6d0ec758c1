"""The per-serve lifecycle machine: which state a serve is in and which step may come next.

Every serve the controller manages moves through the states of :class:`LifecycleState`
(stopped → reserved → starting → running → quiescing → draining → stopping → stopped,
with ``failed`` beside them; a serve that can sleep also goes running/draining →
sleeping → asleep → waking → running). The states and the transitions between them are declared
as *data* (:data:`STATES`, :data:`TRANSITIONS`), each with a short ``doc``; the
``transitions`` library's synchronous :class:`~transitions.Machine` is built from that
data with ``auto_transitions=False`` and enforces it. The executor fires one trigger per
step outcome (``start`` after it started the container, ``ready`` when health answered,
``stopped`` when the release is confirmed, …); a trigger that is not legal from the
current state raises :class:`IllegalTransition`, never a silent no-op. Observation
fires the others on each serve's record (``statemachine/lifecycle/serve_record.py``:
``observe_*``, ``recover``, ``reset``, ``abandon``, …).

Public API:

- :class:`ServeLifecycle` — one serve's machine: ``state``, ``fire``, ``allowed``, ``can``.
- :func:`next_state` / :func:`allowed_triggers` — the same table as pure functions, for
  the planner and for property tests.
- :func:`holds_reservation` / :data:`HOLDING_STATES` — which states claim the serve's
  reservation in the ledger.
- :func:`mermaid_diagram` / :func:`lifecycle_markdown` — the generated documentation
  (``docs/lifecycle.md``, written by ``docs/gen_lifecycle.py``).

Choices:

- Elastic shrink and grow are ``running → running`` self-transitions (``shrink`` /
  ``grow``), not a ``resizing`` state: the serve stays in service and keeps a
  reservation throughout; only the reservation's size changes, and that is the ledger's
  business. The executor fires them once a resize is *confirmed*; a refused resize
  (409) fires nothing, a broken one fires ``fail``.
- ``failed`` does not hold a reservation in the machine's view. A failed serve's memory
  is whatever its container really holds, and the ledger counts that from observation
  (a running, paused or restarting container is committed, docs/design.md §3), so a failed start
  whose container exited holds nothing and a failed stop whose container is still up is
  still counted — without the machine double-counting or leaking either.
- One shared ``Machine`` (built once, lazily) serves every :class:`ServeLifecycle`; a
  serve is a tiny model object that is never registered with it, so creating thousands
  of serves is cheap and nothing accumulates in the shared machine.

This module is pure: no I/O, no clock reads, no logging of its own, no docker, no
NVML. Machine callbacks are not used at all (there is no rollback after a state change).
Note that the ``transitions`` library itself emits ``logging`` records (INFO on every
state enter/exit) on the ``transitions`` logger; the shell decides their level.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from functools import cache
from types import MappingProxyType
from typing import Any, Final, TypedDict

from transitions import Machine, MachineError

from statemachine.planning.plan_types import Action


class LifecycleState(StrEnum):
    """The states of a serve's lifecycle; the values are the names the machine uses."""

    STOPPED = "stopped"
    RESERVED = "reserved"
    STARTING = "starting"
    RUNNING = "running"
    QUIESCING = "quiescing"
    DRAINING = "draining"
    STOPPING = "stopping"
    SLEEPING = "sleeping"
    ASLEEP = "asleep"
    WAKING = "waking"
    FAILED = "failed"


class Trigger(StrEnum):
    """The triggers of the machine; the values are the names :data:`TRANSITIONS` uses."""

    RESERVE = "reserve"
    ABANDON = "abandon"
    START = "start"
    READY = "ready"
    START_FAILED = "start_failed"
    SHRINK = "shrink"
    GROW = "grow"
    QUIESCE = "quiesce"
    DRAIN = "drain"
    READMIT = "readmit"
    STOP = "stop"
    STOPPED = "stopped"
    STOP_FAILED = "stop_failed"
    FAIL = "fail"
    RECOVER = "recover"
    RESET = "reset"
    OBSERVE_RUNNING = "observe_running"
    OBSERVE_STOPPED = "observe_stopped"
    SLEEP = "sleep"
    SLEPT = "slept"
    RESERVE_WAKE = "reserve_wake"
    WAKE = "wake"
    RELOAD = "reload"
    WAKE_FAILED = "wake_failed"
    OBSERVE_ASLEEP = "observe_asleep"
    OBSERVE_AWAKE = "observe_awake"


class StateSpec(TypedDict):
    """One declared state: its name, whether it holds the reservation, what it means."""

    name: LifecycleState
    holds: bool
    doc: str


class TransitionSpec(TypedDict):
    """One declared transition: ``trigger`` moves any of ``source`` to ``dest``."""

    trigger: str
    source: tuple[LifecycleState, ...]
    dest: LifecycleState
    doc: str


_S = LifecycleState

#: The states, in the order the documentation lists them.
STATES: Final[tuple[StateSpec, ...]] = (
    {
        "name": _S.STOPPED,
        "holds": False,
        "doc": "No container runs for the serve and the controller holds no reservation "
        "for it. Every machine starts here unless it is adopted in another state.",
    },
    {
        "name": _S.RESERVED,
        "holds": True,
        "doc": "The ledger admitted the serve's reservation and the executor holds it for "
        "the start that follows; the container has not been started yet.",
    },
    {
        "name": _S.STARTING,
        "holds": True,
        "doc": "The container was started; the controller waits (up to start_timeout_s) "
        "for its health check.",
    },
    {
        "name": _S.RUNNING,
        "holds": True,
        "doc": "The container runs and is in service. Elastic shrink and grow happen "
        "here, as self-transitions: the serve stays in service while its reservation "
        "is resized.",
    },
    {
        "name": _S.QUIESCING,
        "holds": True,
        "doc": "Its router tier was told to quiesce: no new requests are routed to it, "
        "work in flight continues. The first step of stopping a serve with a router tier.",
    },
    {
        "name": _S.DRAINING,
        "holds": True,
        "doc": "Its router tier has drained the requests in flight, within "
        "drain_timeout_s. A drain that times out stops nothing: the serve stays "
        "quiescing and the undo readmits its tier.",
    },
    {
        "name": _S.STOPPING,
        "holds": True,
        "doc": "A stop was issued. The reservation is held until the release is confirmed: "
        "the container exited and, where NVML sees the device, the memory came back.",
    },
    {
        "name": _S.SLEEPING,
        "holds": True,
        "doc": "The engine was asked to sleep (after its router tier was drained). The full "
        "reservation is held until the sleep is confirmed: the engine says it is asleep "
        "and, where NVML sees the device, the memory came down. A sleep that does not "
        "confirm is a stop instead.",
    },
    {
        "name": _S.ASLEEP,
        "holds": True,
        "doc": "The container runs and its engine sleeps: it holds residual_mib on its "
        "roles and, at level 1, host_ram_mib on the host budget. Its router tier stays "
        "quiesced. Woken (reserve_wake, wake) or stopped, never started.",
    },
    {
        "name": _S.WAKING,
        "holds": True,
        "doc": "The ledger admitted the full reservation again and the engine is being "
        "woken (and, after a level-2 sleep, its weights reloaded); health is awaited "
        "within start_timeout_s. A wake that fails is a stop and a cold start.",
    },
    {
        "name": _S.FAILED,
        "holds": False,
        "doc": "A start, a stop or the running container failed. The machine claims no "
        "reservation here: whatever the container still holds is counted by the ledger "
        "from observation. Left by reset (confirmed down), recover (seen running again) "
        "or stop (clean up a container that is still up).",
    },
)

#: Every state except ``stopped``: where ``fail`` is legal from.
_NOT_STOPPED: Final = tuple(s for s in _S if s is not _S.STOPPED)

#: The graph: each trigger, the states it is legal from and the state it leads to. A trigger
#: has one row (its sources are a tuple), so ``(source, trigger)`` pairs are unique: the
#: machine is deterministic.
_GRAPH: Final[Mapping[Trigger, tuple[tuple[LifecycleState, ...], LifecycleState]]] = {
    Trigger.RESERVE: ((_S.STOPPED,), _S.RESERVED),
    Trigger.ABANDON: ((_S.RESERVED,), _S.STOPPED),
    Trigger.START: ((_S.RESERVED,), _S.STARTING),
    Trigger.READY: ((_S.STARTING, _S.WAKING), _S.RUNNING),
    Trigger.START_FAILED: ((_S.RESERVED, _S.STARTING), _S.FAILED),
    Trigger.SHRINK: ((_S.RUNNING,), _S.RUNNING),
    Trigger.GROW: ((_S.RUNNING,), _S.RUNNING),
    Trigger.QUIESCE: ((_S.RUNNING,), _S.QUIESCING),
    Trigger.DRAIN: ((_S.QUIESCING,), _S.DRAINING),
    Trigger.READMIT: ((_S.QUIESCING, _S.DRAINING), _S.RUNNING),
    Trigger.STOP: (
        (_S.STARTING, _S.RUNNING, _S.QUIESCING, _S.DRAINING, _S.SLEEPING, _S.ASLEEP, _S.FAILED),
        _S.STOPPING,
    ),
    Trigger.STOPPED: ((_S.STOPPING,), _S.STOPPED),
    Trigger.STOP_FAILED: ((_S.STOPPING,), _S.FAILED),
    Trigger.FAIL: (_NOT_STOPPED, _S.FAILED),
    Trigger.RESET: ((_S.FAILED,), _S.STOPPED),
    Trigger.RECOVER: ((_S.FAILED,), _S.RUNNING),
    Trigger.OBSERVE_RUNNING: ((_S.STOPPED,), _S.RUNNING),
    Trigger.OBSERVE_STOPPED: ((_S.RUNNING, _S.QUIESCING, _S.DRAINING, _S.ASLEEP), _S.STOPPED),
    Trigger.SLEEP: ((_S.RUNNING, _S.DRAINING), _S.SLEEPING),
    Trigger.SLEPT: ((_S.SLEEPING,), _S.ASLEEP),
    Trigger.RESERVE_WAKE: ((_S.ASLEEP,), _S.WAKING),
    Trigger.WAKE: ((_S.WAKING,), _S.WAKING),
    Trigger.RELOAD: ((_S.WAKING,), _S.WAKING),
    Trigger.WAKE_FAILED: ((_S.WAKING,), _S.FAILED),
    Trigger.OBSERVE_ASLEEP: ((_S.RUNNING,), _S.ASLEEP),
    Trigger.OBSERVE_AWAKE: ((_S.ASLEEP,), _S.RUNNING),
}

#: What each transition means, in words (the last column of docs/lifecycle.md's table).
_MEANING: Final[Mapping[Trigger, str]] = {
    Trigger.RESERVE: "The ledger admitted the reservation; the executor holds it for a start.",
    Trigger.ABANDON: "The reservation is given back before any start was attempted (an earlier "
    "step failed or the plan was superseded); nothing ran, nothing to confirm.",
    Trigger.START: "The executor started the container; its health is awaited next.",
    Trigger.READY: "Health answered (2xx, or Docker's healthcheck) within start_timeout_s, after a "
    "start or a wake.",
    Trigger.START_FAILED: "The start could not be issued, the container exited, or health did not "
    "come within start_timeout_s.",
    Trigger.SHRINK: "An elastic shrink was confirmed (the engine's expert cache gave back what the "
    "plan takes); the reservation got smaller, the serve stays in service.",
    Trigger.GROW: "An elastic grow back toward the declared reservation was confirmed; the ledger "
    "admitted the larger reservation first.",
    Trigger.QUIESCE: "The router tier was told to quiesce: no new requests reach the serve.",
    Trigger.DRAIN: "The router tier drained the requests in flight (within drain_timeout_s).",
    Trigger.READMIT: "The stop was called off or the router refused it: the tier is readmitted and "
    "the serve is back in service.",
    Trigger.STOP: "The executor asked Docker to stop the container. From running: a serve without "
    "a router tier (no quiesce, no drain); from starting: a cancelled start; from sleeping: a "
    "sleep that did not confirm (or an engine without the sleep API); from asleep: a sleeper whose "
    "residual is in the way, or no longer wanted; from failed: cleaning up a container that is "
    "still up.",
    Trigger.STOPPED: "The release is confirmed (container exited; where NVML sees the device, the "
    "memory came back) and the reservation is released.",
    Trigger.STOP_FAILED: "The container did not stop within stop_timeout_s, or the release could "
    "not be confirmed.",
    Trigger.FAIL: "A failure seen by the executor or in observation (crash, OOM kill, unhealthy, a "
    "non-transient adapter error). Legal from every state but stopped; idempotent on failed.",
    Trigger.RESET: "Observation confirms the container is down (exited or absent); the serve may "
    "be planned again, after backoff.",
    Trigger.RECOVER: "Observation shows the container running again (e.g. Docker restarted it, or "
    "it was started while no controller ran): back in service without a new start.",
    Trigger.OBSERVE_RUNNING: "Adoption: Docker shows the container running though the machine says "
    "stopped (controller start, or a start outside the controller).",
    Trigger.OBSERVE_STOPPED: "Docker shows the container exited cleanly or absent with no stop in "
    "progress (a manual docker stop, a stale restored state); a crash is fail.",
    Trigger.SLEEP: "The executor asked the engine to sleep. From running: a serve without a router "
    "tier; from draining: its tier quiesced and drained, as before a stop.",
    Trigger.SLEPT: "The sleep is confirmed and the reservation came down to residual_mib (and, at "
    "level 1, host_ram_mib was taken on the host budget).",
    Trigger.RESERVE_WAKE: "The ledger admitted the full reservation again (and the host RAM was "
    "given back); the wake follows.",
    Trigger.WAKE: "The engine was asked to wake; health is awaited next (after a reload at "
    "level 2).",
    Trigger.RELOAD: "Level 2: the weights the sleep dropped were reloaded (and the prefix "
    "cache reset).",
    Trigger.WAKE_FAILED: "The wake or the reload failed, or health did not come within "
    "start_timeout_s: the serve is stopped and cold-started, with backoff.",
    Trigger.OBSERVE_ASLEEP: "Adoption: the engine says it is asleep though the machine says "
    "running (a controller restart while it slept).",
    Trigger.OBSERVE_AWAKE: "The engine says it is awake though the machine says asleep (its "
    "container restarted, or it was woken outside the controller): awake and counted full.",
}

#: The transitions, in the graph's order: :data:`_GRAPH`'s rows with their meaning.
TRANSITIONS: Final[tuple[TransitionSpec, ...]] = tuple(
    {"trigger": t.value, "source": source, "dest": dest, "doc": _MEANING[t]}
    for t, (source, dest) in _GRAPH.items()
)


def _index(
    states: tuple[StateSpec, ...], transitions: tuple[TransitionSpec, ...]
) -> tuple[
    dict[tuple[str, str], LifecycleState],
    tuple[str, ...],
    dict[LifecycleState, tuple[str, ...]],
]:
    """Check the declared data and index it: the table, the triggers, allowed per state.

    Raises ``ValueError`` if the data names a state that is not declared, declares a
    state twice, or maps one ``(source, trigger)`` pair twice.
    """
    names = [spec["name"] for spec in states]
    if len(set(names)) != len(names) or set(names) != set(LifecycleState):
        raise ValueError(f"STATES must declare each LifecycleState once, got {names}")
    table: dict[tuple[str, str], LifecycleState] = {}
    triggers: list[str] = []
    for spec in transitions:
        trigger = spec["trigger"]
        if trigger not in triggers:
            triggers.append(trigger)
        for source in spec["source"]:
            key = (LifecycleState(source).value, trigger)
            if key in table:
                raise ValueError(f"transition {trigger!r} from {key[0]!r} declared twice")
            table[key] = LifecycleState(spec["dest"])
    allowed = {
        state: tuple(t for t in triggers if (state.value, t) in table) for state in LifecycleState
    }
    if set(triggers) != set(Trigger):
        raise ValueError(f"TRANSITIONS must use each Trigger, got {triggers}")
    return table, tuple(triggers), allowed


_TABLE, _TRIGGERS, _ALLOWED = _index(STATES, TRANSITIONS)

#: Every trigger, in declared order.
TRIGGERS: Final[tuple[str, ...]] = _TRIGGERS

#: The one table from a plan step's action to the trigger its success fires. A release
#: confirms the stop (``stopped``), a release to the residual confirms the sleep
#: (``slept``); the other actions fire the trigger of their name.
ACTION_TRIGGERS: Final[Mapping[Action, Trigger]] = MappingProxyType(
    {
        Action.QUIESCE: Trigger.QUIESCE,
        Action.DRAIN: Trigger.DRAIN,
        Action.STOP: Trigger.STOP,
        Action.RELEASE: Trigger.STOPPED,
        Action.SHRINK: Trigger.SHRINK,
        Action.GROW: Trigger.GROW,
        Action.RESERVE: Trigger.RESERVE,
        Action.SLEEP: Trigger.SLEEP,
        Action.RELEASE_TO_RESIDUAL: Trigger.SLEPT,
        Action.RESERVE_WAKE: Trigger.RESERVE_WAKE,
        Action.WAKE: Trigger.WAKE,
        Action.RELOAD: Trigger.RELOAD,
        Action.START: Trigger.START,
        Action.AWAIT_READY: Trigger.READY,
        Action.READMIT: Trigger.READMIT,
    }
)


def trigger_for(action: Action) -> Trigger:
    """The trigger a step of ``action`` fires when it succeeds (:data:`ACTION_TRIGGERS`)."""
    return ACTION_TRIGGERS[action]


#: The states in which the machine claims the serve's reservation.
HOLDING_STATES: Final[frozenset[LifecycleState]] = frozenset(
    spec["name"] for spec in STATES if spec["holds"]
)


def next_state(state: str, trigger: str) -> LifecycleState | None:
    """The state ``trigger`` leads to from ``state``, or ``None`` if it is not legal there.

    Computed from :data:`TRANSITIONS` alone; unknown states and triggers give ``None``.
    """
    return _TABLE.get((str(state), trigger))


def allowed_triggers(state: str) -> tuple[str, ...]:
    """The triggers legal from ``state``, in declared order (empty for an unknown state)."""
    try:
        return _ALLOWED[LifecycleState(state)]
    except ValueError:
        return ()


def holds_reservation(state: str) -> bool:
    """Whether a serve in ``state`` holds its reservation in the machine's view.

    ``reserved`` through ``stopping`` do; ``stopped`` and ``failed`` do not (see the
    module docstring for why ``failed`` does not). Raises ``ValueError`` for a name that
    is not a :class:`LifecycleState`.
    """
    return LifecycleState(state) in HOLDING_STATES


class IllegalTransition(Exception):  # noqa: N818  (the name the callers know it by)
    """A trigger that is not legal from the serve's current state (or not a trigger at all).

    Attributes: ``serve``, ``state``, ``trigger`` and ``allowed`` (the triggers that were
    legal from ``state``).
    """

    def __init__(self, serve: str, state: str, trigger: str) -> None:
        """Record the serve, its state and the refused trigger."""
        super().__init__(serve, state, trigger)
        self.serve = serve
        self.state = str(state)
        self.trigger = trigger
        self.allowed = allowed_triggers(state)

    def __str__(self) -> str:
        """E.g. ``serve "omni": cannot "start" while "stopped" (allowed: reserve)``."""
        allowed = ", ".join(self.allowed) or "none"
        what = "cannot" if self.trigger in TRIGGERS else "unknown trigger"
        return (
            f'serve "{self.serve}": {what} "{self.trigger}" while "{self.state}" '
            f"(allowed: {allowed})"
        )


def _machine_config() -> dict[str, Any]:
    """The keyword arguments every machine built from the data shares."""
    return {
        "states": [spec["name"].value for spec in STATES],
        "transitions": [
            {
                "trigger": spec["trigger"],
                "source": [s.value for s in spec["source"]],
                "dest": spec["dest"].value,
            }
            for spec in TRANSITIONS
        ],
        "initial": LifecycleState.STOPPED.value,
        "auto_transitions": False,
        "ignore_invalid_triggers": False,
        "send_event": False,
        "queued": False,
    }


@cache
def lifecycle_machine() -> Machine:
    """The one shared synchronous ``Machine`` built from the data (built on first use).

    It has no models of its own: :class:`ServeLifecycle` fires its events on a per-serve
    model object, so the machine holds configuration only.
    """
    return Machine(model=None, name="lifecycle", **_machine_config())


class _Model:
    """The object the machine moves: a serve's state and nothing else."""

    __slots__ = ("state",)

    def __init__(self, state: str) -> None:
        self.state = state


class ServeLifecycle:
    """One serve's lifecycle: its current state and the triggers that move it.

    >>> lc = ServeLifecycle("omni")
    >>> lc.fire("reserve")
    <LifecycleState.RESERVED: 'reserved'>
    >>> lc.allowed()
    ('abandon', 'start', 'start_failed', 'fail')
    """

    __slots__ = ("_model", "_serve")

    def __init__(self, serve: str, initial: str = LifecycleState.STOPPED) -> None:
        """A machine for ``serve`` in state ``initial`` (adoption may start it elsewhere).

        Raises ``ValueError`` if ``initial`` is not a :class:`LifecycleState`.
        """
        try:
            state = LifecycleState(initial)
        except ValueError:
            known = ", ".join(LifecycleState)
            raise ValueError(
                f'serve "{serve}": unknown lifecycle state "{initial}" (known: {known})'
            ) from None
        self._serve = serve
        self._model = _Model(state.value)

    @property
    def serve(self) -> str:
        """The serve's name."""
        return self._serve

    @property
    def state(self) -> LifecycleState:
        """The current state."""
        return LifecycleState(self._model.state)

    def fire(self, trigger: str) -> LifecycleState:
        """Apply ``trigger`` and return the new state.

        Raises :class:`IllegalTransition` (state unchanged) if ``trigger`` is not legal
        from the current state or is not a trigger of this machine.
        """
        state = self.state
        event = lifecycle_machine().events.get(trigger)
        if event is None:
            raise IllegalTransition(self._serve, state, trigger)
        try:
            event.trigger(self._model)
        except MachineError as exc:
            raise IllegalTransition(self._serve, state, trigger) from exc
        return self.state

    def allowed(self) -> tuple[str, ...]:
        """The triggers legal from the current state, in declared order."""
        return _ALLOWED[self.state]

    def can(self, trigger: str) -> bool:
        """Whether ``trigger`` is legal from the current state."""
        return (self._model.state, trigger) in _TABLE

    def __repr__(self) -> str:
        """E.g. ``ServeLifecycle('omni', state='running')``."""
        return f"ServeLifecycle({self._serve!r}, state={self._model.state!r})"


class _DiagramModel:
    """A plain model for the diagram machine (it binds ``get_graph`` onto it)."""


def mermaid_diagram() -> str:
    """The lifecycle as a mermaid ``stateDiagram-v2``, drawn by ``transitions`` itself.

    Uses ``GraphMachine(graph_engine="mermaid")`` (available since transitions 0.9.1).
    The library writes ``title`` verbatim between the ``---`` front-matter fences, so it
    is given as ``title: …`` to make that valid YAML mermaid reads as the title; trailing
    spaces are stripped so the text survives editors that strip them.
    """
    from transitions.extensions.diagrams import GraphMachine

    model = _DiagramModel()
    GraphMachine(
        model=model,
        graph_engine="mermaid",
        title="title: vramctl serve lifecycle",
        show_conditions=False,
        show_state_attributes=False,
        **_machine_config(),
    )
    get_graph = getattr(model, "get_graph")  # noqa: B009  (bound by GraphMachine at runtime)
    source = str(get_graph().source)
    return "\n".join(line.rstrip() for line in source.splitlines())


def lifecycle_markdown() -> str:
    """The text of ``docs/lifecycle.md``: states, the diagram and the transition table."""
    lines = [
        "# Serve lifecycle",
        "",
        "<!-- Generated from statemachine/lifecycle/machine.py by `python docs/gen_lifecycle.py`."
        " Do not edit. -->",
        "",
        "Each serve the controller manages has one lifecycle machine "
        "(`statemachine.lifecycle.machine.ServeLifecycle`). The executor fires one trigger per "
        "step "
        "outcome; a trigger that is not legal from the current state raises "
        "`IllegalTransition`. Observation moves each serve's record "
        "(`statemachine.lifecycle.serve_record`) to what its container shows along the declared "
        "triggers (`observe_*`, `recover`, `reset`, `fail`, and the confirmations it "
        "brings); where none leads there the record is adopted in the state seen. "
        "A state *holds* the reservation when the machine claims the "
        "serve's reserved MiB in the ledger; what a container really holds is always also "
        "counted from observation.",
        "",
        "## States",
        "",
    ]
    for spec in STATES:
        holds = "holds the reservation" if spec["holds"] else "holds no reservation"
        lines += [f"**`{spec['name']}`** ({holds}). {spec['doc']}", ""]
    lines += ["## Diagram", "", "```mermaid", mermaid_diagram(), "```", ""]
    lines += [
        "## Transitions",
        "",
        "| trigger | from | to | meaning |",
        "|---|---|---|---|",
    ]
    for tspec in TRANSITIONS:
        sources = ", ".join(f"`{s}`" for s in tspec["source"])
        doc = tspec["doc"].replace("|", "\\|")
        lines.append(f"| `{tspec['trigger']}` | {sources} | `{tspec['dest']}` | {doc} |")
    lines.append("")
    return "\n".join(lines)
