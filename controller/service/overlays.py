"""What the journal adds to each observation: start reservations, sleep, elastic reserves.

The host shows which containers run, not what they were started with nor what their
engine was told since. :class:`JournalOverlays` lays the journal's records over each
observation and keeps them true to it: a container keeps the reservation it was started
with until it stops (:meth:`JournalOverlays.started_in_force`), a sleeper is a sleeper
until its engine says otherwise (:meth:`JournalOverlays.sleep_in_force`), an elastic
reserve holds until its engine restarts (:meth:`JournalOverlays.elastic_in_force`); and
it records what the executor reports (starts, sleeps) and what the manifest in force
declares. With docker unreadable nothing is dropped or recorded on its strength.

The journal and the manifest are given to each call (the loop owns them); what is held
here is only what was already said (a note is logged once, not every cycle) and the
sleep probe. This module must not plan or act on a container.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from loguru import logger

from controller.adapters.docker.read import manifest_containers
from controller.adapters.sleep import SleepClient
from controller.manifest import ManifestSet
from controller.service.executor import ExecutionReport, Outcome
from controller.service.sleeping import observe_sleep
from controller.snapshot import SleepStateModel, SnapshotModel, StartedWithModel, epoch_seconds
from controller.store.journal import Journal, SleepRecord
from statemachine.planner import Action
from statemachine.types import DesiredState, StartedWith

#: the container states that hold a reservation
_HOLDING = ("running", "paused", "restarting")


class JournalOverlays:
    """The journal's records laid over each observation, kept true to it."""

    def __init__(self) -> None:
        self._no_longer_declared: set[str] = set()  # running containers said to be so
        # the engines' sleep state is asked every cycle: one quick try, no retries
        self._sleep_probe = SleepClient(probe_timeout_s=1.0, attempts=1, max_wait_s=0)
        self._sleep_said: set[str] = set()  # sleep notes logged (said once, not every cycle)

    def started_in_force(
        self,
        journal: Journal,
        desired: DesiredState,
        snap: SnapshotModel,
        records: dict[str, StartedWith],
        known: dict[str, StartedWith] | None = None,
    ) -> dict[str, StartedWithModel]:
        """The start reservations of the containers that still run (journal records).

        A container keeps the reservation it was started with until it stops, whatever
        the manifest says now (an edit, a file caught mid-write): the record is dropped
        only once docker shows the container stopped or gone. A declared container
        found running without a record (started before this controller, or by hand)
        is recorded with its declared reservation (a placed serve's: every candidate),
        unless its start is in progress; a container no manifest in force
        declares, found running without a record, with the last reservation a manifest
        declared for it (``known``: started by hand while a file caught mid-write was in
        force, or after its serve was removed). With docker unreadable nothing is
        dropped or recorded.
        """
        declared = {s.container: s for s in desired.serves.values()}
        if snap.docker == "ok":
            self._drop_stopped(journal, snap, records)
            # a start in progress is recorded by its own end, on the roles it reserved
            # (a placed serve's one card; recorded here it would be every candidate)
            found = {
                container: StartedWith(spec.name, spec.gpu_roles, spec.vram_mib)
                for container, spec in declared.items()
                if spec.vram_mib is not None
                and desired.in_ledger(spec)
                and spec.name not in snap.starting
            }
            _record_running(journal, snap, records, found)
            undeclared = {c: r for c, r in (known or {}).items() if c not in declared}
            _record_running(journal, snap, records, undeclared)
        self._say_undeclared({c: r for c, r in records.items() if c not in declared})
        return {
            c: StartedWithModel(serve=r.serve, gpu_roles=list(r.gpu_roles), mib=r.mib)
            for c, r in records.items()
        }

    def _drop_stopped(
        self, journal: Journal, snap: SnapshotModel, records: dict[str, StartedWith]
    ) -> None:
        """A record whose container docker shows stopped or gone is dropped."""
        for container, rec in list(records.items()):
            c = snap.containers.get(container)
            if c is None or c.state not in _HOLDING:
                journal.forget_started(container)
                del records[container]
                if container in self._no_longer_declared:
                    logger.info(
                        "{} (no longer declared) stopped; its {} MiB are released",
                        container,
                        rec.mib,
                    )

    def _say_undeclared(self, gone: dict[str, StartedWith]) -> None:
        for container, rec in gone.items():
            if container not in self._no_longer_declared:
                logger.warning(
                    "{} is no longer declared (started as serve {}); it keeps its start "
                    "reservation of {} MiB on {} until it stops",
                    container,
                    rec.serve,
                    rec.mib,
                    ", ".join(rec.gpu_roles),
                )
        self._no_longer_declared = set(gone)

    def sleep_in_force(
        self, journal: Journal, desired: DesiredState, snap: SnapshotModel
    ) -> dict[str, SleepStateModel]:
        """The sleep state of every serve that can sleep, and the journal kept true to it.

        A sleeper whose container stopped, or started again since its sleep (awake and
        full), or whose engine says it is awake, is forgotten; what each recorded
        sleeper was seen as is journalled every cycle.
        """
        records = journal.sleeping()
        models, now = observe_sleep(desired, snap, records, self._sleep_probe)
        at = time.time()
        for container in now.forget:
            journal.forget_sleeping(container)
        for container, seen in now.seen.items():
            journal.saw_sleeping(container, seen, at)
        for note in now.notes:
            if note not in self._sleep_said:
                logger.info("sleep: {}", note)
        self._sleep_said = set(now.notes)
        return models


def _record_running(
    journal: Journal,
    snap: SnapshotModel,
    records: dict[str, StartedWith],
    candidates: dict[str, StartedWith],
) -> None:
    """Each candidate found running without a record is recorded with its reservation."""
    for container, rec in candidates.items():
        c = snap.containers.get(container)
        if container not in records and c is not None and c.state in _HOLDING:
            journal.set_started(container, rec.serve, rec.gpu_roles, rec.mib, time.time())
            records[container] = rec


def observed_names(
    journal: Journal,
    mset: ManifestSet,
    records: dict[str, StartedWith],
    known: dict[str, StartedWith],
) -> tuple[str, ...]:
    """The containers an observation reads: the manifest's, and those the journal
    records as started (``records``: still holding their reservation) or as declared
    before (``known``)."""
    return tuple(dict.fromkeys(manifest_containers(mset.serves) + tuple(records) + tuple(known)))


def record_starts(
    journal: Journal, report: ExecutionReport, desired: DesiredState, now: float
) -> None:
    """Record the reservation of each container this plan started (see above)."""
    for r in report.results:
        if r.step.action is not Action.START or r.outcome is not Outcome.OK:
            continue
        spec = desired.serves.get(r.step.serve)
        if spec is None or not r.step.mib or not r.step.gpu_roles:
            continue  # outside the ledger; or no longer declared: its start counts it
        # the roles and MiB the start was planned with, whatever the manifest says now
        journal.set_started(spec.container, spec.name, r.step.gpu_roles, r.step.mib, now)


def elastic_in_force(journal: Journal, mset: ManifestSet, snap: SnapshotModel) -> dict[str, int]:
    """The journal's elastic reserves, minus those of engines that restarted since.

    An engine forgets its reserve when its server restarts (a crash, a restart
    policy, a manual ``docker restart``): a container that is down, or that started
    after the reserve was asked for, holds its full reservation again.
    """
    set_at = journal.elastic_set_at()
    out: dict[str, int] = {}
    for name, mib in journal.elastic().items():
        spec = mset.serves.get(name)
        c = snap.containers.get(spec.container) if spec is not None else None
        started = _epoch_or_none(c.started_at) if c is not None else None
        if (
            c is None
            or c.state != "running"
            or (started is not None and started > set_at.get(name, 0.0))
        ):
            if snap.docker == "ok":
                journal.set_elastic(name, None, time.time())
                logger.info(
                    "{}: the engine restarted or stopped; its elastic reserve is void", name
                )
            continue
        out[name] = mib
    return out


def journal_sleep(journal: Callable[[], Journal], container: str, rec: SleepRecord | None) -> None:
    """A sleep confirmed (or ended) mid-plan is journalled at once: a controller that
    dies before the plan ends still finds the sleeper, counts it and wakes it."""
    try:
        if rec is not None:
            journal().set_sleeping(rec)
        else:
            journal().forget_sleeping(container)
    except Exception as exc:  # the plan's end records it again
        logger.warning("journal: the sleep record of {} not written now: {}", container, exc)


def remember_declared(journal: Callable[[], Journal], desired: DesiredState) -> None:
    """Journal what the manifest in force declares for each container (see
    :meth:`Journal.set_declared`): a container that later runs undeclared counts.
    (``journal`` is asked for here: without one, that is said, and nothing lost.)"""
    records = {
        s.container: StartedWith(s.name, s.gpu_roles, s.vram_mib)
        for s in desired.serves.values()
        if s.vram_mib is not None and desired.in_ledger(s)
    }
    try:
        journal().set_declared(records, time.time())
    except Exception as exc:  # a locked journal: the next reload tries again
        logger.error("journal: cannot record the declared reservations: {}", exc)


def _epoch_or_none(value: str | float | None) -> float | None:
    try:
        return epoch_seconds(value)
    except ValueError:
        return None
