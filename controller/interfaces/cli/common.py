"""What the commands share: loading the manifest set (:func:`_load`, typer's exit over
``plain.load_set``), the observation, live or saved (:func:`_observe`,
:func:`_observe_live`), the situation every answer is given from (:func:`_situation`,
read over the state directory's journal), one located line and an exit code
(:func:`_fail`), and the exit codes beyond 0 and 1 (:data:`EXIT_UNOBSERVED`,
:data:`EXIT_BAD_INPUT`).

It decides nothing: the arithmetic lives in ``statemachine``. Must not import the
manifest model, rich, the core, the server, Docker or HTTP libraries at import time:
each helper imports what it uses when it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from controller.interfaces.cli.plain import ExitCodeError, _lazy, load_set

if TYPE_CHECKING:
    from controller.interfaces import render
    from controller.manifest import ManifestSet
    from controller.service.situation import JournalRecords
    from controller.snapshot import SnapshotModel
    from statemachine.answers.situation import Situation
else:
    render = _lazy("controller.interfaces.render")


#: ``status``, ``fit``, ``plan``, ``observe``: Docker could not be read, so the answer is unknown
EXIT_UNOBSERVED = 3


#: bad input, as a usage error's (``estimate``'s input; a state directory this user may
#: not read or lock)
EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = 1) -> NoReturn:
    render.error(message)
    raise typer.Exit(code)


def _load(
    manifests: list[Path], *, strict: bool = False, json_out: bool = False, code: int = 1
) -> ManifestSet:
    """The manifest set; exit ``code`` when it does not load (:func:`load_set`)."""
    try:
        return load_set(manifests, strict=strict, json_out=json_out, code=code)
    except ExitCodeError as stop:
        raise typer.Exit(stop.code) from None


def _observe(
    observed: Path | None,
    mset: ManifestSet,
    *,
    nvml_in_answer: bool = False,
    records: JournalRecords | None = None,
    notes: list[str] | None = None,
    code: int = 1,
) -> SnapshotModel:
    """The observation: live, or the saved ``observed`` (exit ``code`` when it does not
    load)."""
    from controller.snapshot import SnapshotError, load_snapshot

    if observed is None:
        return _observe_live(mset, notes, nvml_in_answer=nvml_in_answer, records=records)
    try:
        return load_snapshot(observed)
    except SnapshotError as exc:
        _fail(str(exc), code)


def _observe_live(
    mset: ManifestSet,
    notes: list[str] | None = None,
    *,
    nvml_in_answer: bool = False,
    records: JournalRecords | None = None,
) -> SnapshotModel:
    """One live observation; what could not be read is printed on stderr, or added to
    ``notes`` (``status --watch`` tells it inside its draw). ``nvml_in_answer``: the
    answer itself says NVML is unavailable and why (``status``), so it is not said here.
    ``records``: the loop's journal, whose recorded containers are observed too and
    whose sleepers are asked whether they still sleep, as the loop asks."""
    from controller.adapters.docker.read import ContainerObserver, manifest_containers
    from controller.adapters.health import HealthProber
    from controller.adapters.self_sleep import SelfSleepReader
    from controller.adapters.sleep import SleepClient
    from controller.service.inflight import InFlightTracker, observe_in_flight
    from controller.service.observe import observe_host, observe_probes, observe_self_sleep
    from controller.service.sleeping import observe_sleep

    names = manifest_containers(mset.serves)
    if records is not None:
        names = tuple(dict.fromkeys((*names, *records.started, *records.declared)))
    observer = ContainerObserver()
    try:
        snap = observe_host(names, observer=observer)
    finally:
        observer.close()
    sleeping = records.sleeping if records is not None else {}
    snap.sleep, _now_asleep = observe_sleep(
        mset.desired(), snap, sleeping, SleepClient(probe_timeout_s=1.0, attempts=1, max_wait_s=0)
    )
    # one reading, no history: idleness is known as of now only (counted from a request)
    tracker = InFlightTracker(log_changes=False)  # no log line amid the answer
    try:
        readings = observe_in_flight(snap, mset, tracker)
    finally:
        tracker.close()  # one reading: its HTTP client is not kept
    for name, reading in readings.items():
        if reading.error:
            render.warn(f"{name}: requests in flight unknown: {reading.error}")
    snap.in_flight = {
        name: reading.model_copy(update={"idle_since": None}) for name, reading in readings.items()
    }
    prober, reader = HealthProber(), SelfSleepReader()
    try:
        snap.probes = observe_probes(snap, mset, prober)
        snap.self_asleep = observe_self_sleep(snap, mset, reader)
    finally:
        prober.close()
        reader.close()
    if snap.docker_error:  # one line: where it looked and what to do (adapters/docker/reach)
        _say(render.error, f"{snap.docker_error}", notes)
    if snap.nvml_error and not nvml_in_answer:
        _say(render.warn, f"nvml: {snap.nvml_error}", notes)
    return snap


def _say(show: Callable[[str], None], message: str, notes: list[str] | None) -> None:
    if notes is None:
        show(message)
    else:
        notes.append(message)


def _exit_if_unobserved(snap: SnapshotModel, observed: Path | None) -> None:
    """Exit :data:`EXIT_UNOBSERVED` when the observation has no Docker state (the answer
    printed before is then unknown, not an answer about the host)."""
    if snap.to_observed().docker_ok:
        return
    if observed is not None:  # live, the error line was printed as it was observed
        why = snap.docker_error or "no reason recorded"
        render.error(f"{observed}: docker could not be read when this was observed: {why}")
    raise typer.Exit(EXIT_UNOBSERVED)


def _readable_state_dir(
    manifest: list[Path], state_dir: Path | None, code: int = EXIT_BAD_INPUT
) -> None:
    """Exit ``code`` with one paragraph (the directory, what could not be read, how to fix
    it) when the state directory the command reads is there but this user may not read
    it: its answer would be given without the loop's requests and records."""
    from controller.store.journal import StateDirError, default_state_dir, journal_to_read

    try:
        journal_to_read(state_dir or default_state_dir(list(manifest)))
    except StateDirError as exc:
        _fail(str(exc), code)


def _footprint_samples(manifest: list[Path], state_dir: Path | None) -> list[Any]:
    """The footprint samples of the state directory `run` uses (read only)."""
    from controller.interfaces.footprint_report import load_samples
    from controller.store.journal import default_state_dir

    samples, why = load_samples(state_dir or default_state_dir(list(manifest)))
    if why is not None and state_dir is not None:
        render.warn(f"footprints: {why}")
    return samples


def _situation(
    mset: ManifestSet,
    manifest: list[Path],
    observed: Path | None,
    state_dir: Path | None,
    *,
    router_url: str | None = None,
    nvml_in_answer: bool = False,
    notes: list[str] | None = None,
) -> tuple[SnapshotModel, Situation]:
    """The situation every answer of the CLI is given from (docs/design.md, one
    situation): one observation (live, or the saved ``observed``) with the running
    loop's journal laid over it, read only, from ``state_dir`` (default: the one `run`
    uses). A saved observation is read with a journal only when ``--state-dir`` names
    one. What could not be read, and what was assumed instead, is said on stderr (or in
    ``notes``)."""
    from controller.service.situation import read_journal, snapshot_situation
    from controller.store.journal import default_state_dir

    records, why = None, None
    if observed is None or state_dir is not None:
        records, why = read_journal(state_dir or default_state_dir(list(manifest)))
    snap = _observe(observed, mset, nvml_in_answer=nvml_in_answer, records=records, notes=notes)
    sit = snapshot_situation(mset, snap, records, unread=why, router=bool(router_url))
    for note in sit.notes:
        _say(render.warn, note, notes)
    return snap, sit
