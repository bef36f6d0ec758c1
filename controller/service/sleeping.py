"""Putting engines to sleep and waking them: confirmation, health, and what is asleep now.

The executor's sleep and wake steps and the loop's observation share this module:

- :func:`confirm_asleep` waits (bounded) after an engine's sleep answer until the
  engine says it sleeps (vLLM's ``GET /is_sleeping``; SGLang cannot say, its answer is
  all there is) and, where NVML sees the role's devices and what the container used
  is known, until the devices show the memory down by what the container used less
  the residual it keeps (the engines answer before the memory is freed);
- :func:`wake_engine` wakes an engine and waits for it to say it is awake, within the
  serve's ``start_timeout_s`` (health is the executor's ``await_ready``; a level-2
  reload is a step of its own);
- :func:`sleepers_in_force` reads the journal's sleep records against the containers
  and the engines' own answers, every cycle: a container that stopped, or started
  again since it was put to sleep, is awake (or down) and its record is forgotten; an
  engine that says it is awake is counted full; one that cannot be asked (vLLM
  unreachable) is counted full too, its record kept (what it holds is unknown, and
  the ledger never counts less than it may hold).

This module must not decide what to put to sleep or wake (the planner does), nor
mutate anything but through the sleep adapter it is handed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from controller.adapters.sleep import SleepClient, SleepError
from controller.service.pauses import pauses
from controller.snapshot import SleepStateModel, SnapshotModel
from controller.store.journal import SleepRecord
from statemachine import engines
from statemachine.domain.types import DesiredState, ServeSpec

__all__ = [
    "ASLEEP",
    "AWAKE",
    "UNKNOWN",
    "ContainerNow",
    "SleepNotConfirmedError",
    "Sleeper",
    "SleepersNow",
    "WakeFailedError",
    "ask_engines",
    "confirm_asleep",
    "observe_sleep",
    "running_containers",
    "sleeper_of",
    "sleepers_in_force",
    "wake_engine",
]

ASLEEP, AWAKE, UNKNOWN = "asleep", "awake", "unknown"


@dataclass(frozen=True, slots=True)
class Sleeper:
    """How one serve is put to sleep and woken (its ``[serve.sleep]`` table, resolved)."""

    serve: str
    container: str
    url: str
    protocol: str
    level: int
    gpu_roles: tuple[str, ...]
    residual_mib: int
    host_ram_mib: int


def sleeper_of(s: ServeSpec) -> Sleeper:
    """How ``s`` is put to sleep and woken (it must declare ``[serve.sleep]``)."""
    z = s.sleep
    assert z is not None
    url = z.url or (f"http://127.0.0.1:{s.port}" if s.port is not None else "")
    return Sleeper(
        serve=s.name,
        container=s.container,
        url=url,
        protocol=str(z.protocol),
        level=z.level,
        gpu_roles=s.gpu_roles,
        residual_mib=z.residual_mib,
        host_ram_mib=z.host_mib,
    )


class SleepNotConfirmedError(Exception):
    """The engine answered, but its sleep was not confirmed within the bound."""


class WakeFailedError(Exception):
    """A wake failed, or the engine was not awake and healthy within the bound."""


def confirm_asleep(
    client: SleepClient,
    sl: Sleeper,
    *,
    before: Mapping[str, int],
    attributed_mib: int | None,
    devices: Callable[[], Mapping[str, int]],
    wait_s: float,
    poll_s: float = 0.05,
    tolerance_mib: int = 256,
    stop_event: threading.Event | None = None,
) -> str:
    """Wait until the sleep is confirmed; what confirmed it, in words.

    ``before`` is each role's device ``used_mib`` before the sleep (empty: NVML does
    not see them), ``attributed_mib`` what NVML attributed to the container then
    (``None``: unknown), ``devices()`` the roles' ``used_mib`` now. The memory must
    come down by ``attributed_mib − residual_mib × roles`` (less ``tolerance_mib``).
    Raises :class:`SleepNotConfirmedError` at ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    pause = pauses(poll_s)
    keeps = sl.residual_mib * max(1, len(sl.gpu_roles))
    expect = None if attributed_mib is None or not before else attributed_mib - keeps
    said: bool | None = None
    why = ""
    while True:
        engine_ok = not _can_say(sl.protocol)
        if not engine_ok:
            try:
                said = client.is_sleeping(sl.url, sl.protocol)
                engine_ok = said is True
                why = "" if engine_ok else "the engine says it is not sleeping"
            except SleepError as exc:
                why = f"the engine cannot say whether it sleeps: {exc}"
        memory_ok, back, now = True, None, dict(before)
        if expect is not None:
            now = dict(devices())
            back = sum(before[r] - now[r] for r in before if r in now)
            memory_ok = back >= expect - tolerance_mib
        if engine_ok and memory_ok:
            return _confirmed_by(sl, expect, back)
        if not memory_ok:
            figures = ", ".join(f"{r} used {before[r]} -> {now.get(r, '?')} MiB" for r in before)
            why = (why + "; " if why and not engine_ok else "") + (
                f"NVML shows {back} MiB back of the {expect} expected ({figures})"
            )
        if time.monotonic() >= deadline or (stop_event is not None and stop_event.is_set()):
            raise SleepNotConfirmedError(
                f"{sl.serve}'s sleep is not confirmed within {wait_s:g}s: {why}"
            )
        time.sleep(next(pause))


def _can_say(protocol: str) -> bool:
    """True when the protocol's engine can be asked whether it sleeps (its registry
    entry has an ``is_sleeping`` call)."""
    api = engines.sleep_api(protocol)
    return api is not None and api.can_say


def _display(protocol: str) -> str:
    """The engine's name as people write it (``SGLang``)."""
    found = engines.lookup(protocol)
    return protocol if found is None else found.display


def _confirmed_by(sl: Sleeper, expect: int | None, back: int | None) -> str:
    engine = (
        "the engine says it sleeps"
        if _can_say(sl.protocol)
        else f"the engine answered ({_display(sl.protocol)} cannot say whether it sleeps)"
    )
    if expect is None:
        return f"{engine}; NVML cannot attribute memory to the container: not measured"
    return f"{engine}; NVML shows {back} MiB back (expected {expect})"


def wake_engine(
    client: SleepClient,
    sl: Sleeper,
    *,
    timeout_s: float,
    poll_s: float = 0.05,
    stop_event: threading.Event | None = None,
) -> str:
    """Wake the engine and wait, within ``timeout_s``, until it says it is awake (vLLM;
    SGLang's answer is all there is). Health is awaited after (the executor's
    ``await_ready``). Raises :class:`WakeFailedError` with the engine's words.
    """
    deadline = time.monotonic() + timeout_s
    try:
        calls = client.wake(sl.url, sl.protocol, timeout_s=timeout_s)
    except SleepError as exc:
        raise WakeFailedError(f"{sl.serve}: wake failed: {exc}") from None
    if not _can_say(sl.protocol):
        return ", ".join(calls)
    said = ""
    pause = pauses(poll_s)
    while True:
        try:
            if client.is_sleeping(sl.url, sl.protocol) is False:
                return f"{', '.join(calls)}; the engine says it is awake"
            said = "the engine still says it sleeps"
        except SleepError as exc:
            said = f"the engine cannot say whether it sleeps: {exc}"
        if time.monotonic() >= deadline or (stop_event is not None and stop_event.is_set()):
            raise WakeFailedError(
                f"{sl.serve} not awake after start_timeout_s {timeout_s:g}s "
                f"({', '.join(calls)}): {said}"
            )
        time.sleep(next(pause))


@dataclass(frozen=True, slots=True)
class ContainerNow:
    """What the observation shows of a container: whether it runs, and since when."""

    running: bool
    started_at: str | None


@dataclass(frozen=True, slots=True)
class SleepersNow:
    """The sleepers in force after one observation, and what to tell the journal."""

    #: container -> its record, for the sleepers counted asleep (at their residual)
    asleep: dict[str, SleepRecord]
    #: container -> asleep | awake | unknown, as this observation found each record
    seen: dict[str, str]
    #: containers whose record is over (stopped, restarted, or awake): forget them
    forget: list[str]
    #: what was found, in words, for the log (one line per sleeper whose state changed)
    notes: list[str]


def sleepers_in_force(
    records: Mapping[str, SleepRecord],
    containers: Mapping[str, ContainerNow],
    ask: Callable[[SleepRecord], bool | None],
) -> SleepersNow:
    """Which recorded sleepers are asleep now.

    ``ask(record)`` is the engine's own answer (``True`` asleep, ``False`` awake,
    ``None`` it cannot say: SGLang); it raises :class:`SleepError` when it cannot be
    asked. A container not running, or started since its sleep, is forgotten (down, or
    awake and full after its restart); an engine that says it is awake is forgotten
    (counted full); one that cannot be asked is counted full, its record kept.
    """
    asleep: dict[str, SleepRecord] = {}
    seen: dict[str, str] = {}
    forget: list[str] = []
    notes: list[str] = []
    for container, rec in records.items():
        now = containers.get(container)
        if now is None or not now.running:
            forget.append(container)
            notes.append(f"{rec.serve}: {container} is not running: no longer asleep")
            continue
        if rec.started_at is not None and now.started_at != rec.started_at:
            forget.append(container)
            notes.append(
                f"{rec.serve}: {container} started again since it was put to sleep: "
                "awake and counted full"
            )
            continue
        try:
            said = ask(rec)
        except SleepError as exc:
            seen[container] = UNKNOWN
            if rec.seen != UNKNOWN:
                notes.append(
                    f"{rec.serve}: cannot ask whether it sleeps ({exc}): counted full "
                    "until it answers"
                )
            continue
        if said is False:
            forget.append(container)
            notes.append(f"{rec.serve}: the engine says it is awake: counted full")
            continue
        seen[container] = ASLEEP
        asleep[container] = rec
    return SleepersNow(asleep, seen, forget, notes)


def ask_engines(
    client: SleepClient, where: Mapping[str, tuple[str, str]]
) -> Callable[[SleepRecord], bool | None]:
    """``ask`` for :func:`sleepers_in_force`: ``where`` maps a serve to its engine's
    ``(url, protocol)``; a serve no longer there (not declared, no ``[serve.sleep]``)
    cannot be asked."""

    def ask(rec: SleepRecord) -> bool | None:
        found = where.get(rec.serve)
        if found is None:
            raise SleepError(
                f"{rec.serve} no longer declares [serve.sleep]: its engine cannot be asked",
                transient=False,
            )
        return client.is_sleeping(found[0], found[1])

    return ask


def running_containers(
    states: Iterable[tuple[str, str | None, str | None]],
) -> dict[str, ContainerNow]:
    """``(name, state, started_at)`` triples as :class:`ContainerNow` by name."""
    return {
        name: ContainerNow(state in ("running", "paused", "restarting"), started)
        for name, state, started in states
    }


_HOLDING = ("running", "paused", "restarting")


def observe_sleep(
    desired: DesiredState,
    snap: SnapshotModel,
    records: Mapping[str, SleepRecord],
    client: SleepClient,
) -> tuple[dict[str, SleepStateModel], SleepersNow]:
    """Every serve that can sleep, as it is now: the snapshot's ``sleep`` and what the
    journal should learn (:func:`sleepers_in_force`).

    Recorded sleepers are checked against their containers and engines. A running
    serve with no record is asked too: one that says it sleeps (put to sleep by a
    controller that lost its journal, or by hand) is reported asleep without a record
    (the core counts it at the residual the manifest declares); one that cannot be
    asked is unknown (counted full); one that cannot say (SGLang: the adapter answers
    ``None`` without a request) is not reported, counted full. Docker unreadable:
    nothing is asked or changed.
    """
    if snap.docker != "ok":
        return {}, SleepersNow({}, {}, [], [])
    containers = {
        name: ContainerNow(c.state in _HOLDING, None if c.started_at is None else str(c.started_at))
        for name, c in snap.containers.items()
    }
    sleepers = {s.name: sleeper_of(s) for s in desired.serves.values() if s.sleep is not None}
    where = {name: (sl.url, sl.protocol) for name, sl in sleepers.items()}
    now = sleepers_in_force(records, containers, ask_engines(client, where))
    out: dict[str, SleepStateModel] = {}
    for container, rec in records.items():
        seen = now.seen.get(container)
        if seen is None:
            continue
        out[rec.serve] = SleepStateModel(
            state=ASLEEP if seen == ASLEEP else UNKNOWN,
            level=rec.level,
            residual_mib=rec.residual_mib,
            host_ram_mib=rec.host_ram_mib,
        )
    recorded = {rec.serve for rec in records.values()}
    for name, sl in sleepers.items():
        c = containers.get(sl.container)
        if name in recorded or c is None or not c.running:
            continue
        try:
            said = client.is_sleeping(sl.url, sl.protocol)
        except SleepError:
            out[name] = SleepStateModel(state=UNKNOWN)
            continue
        if said:
            out[name] = SleepStateModel(state=ASLEEP)
            now.notes.append(
                f"{name}: the engine says it sleeps, though this controller has no record "
                "of putting it to sleep: counted at the residual the manifest declares"
            )
    return out, now
