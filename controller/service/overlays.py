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
from controller.service.overlay_rules import (
    elastic_kept,
    started_models,
    started_records,
)
from controller.service.sleeping import observe_sleep
from controller.snapshot import SleepStateModel, SnapshotModel, StartedWithModel
from controller.store.journal import Journal, SleepRecord
from statemachine.domain.types import DesiredState, StartedWith
from statemachine.planning.plan_types import (
    Action,
)


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
        """The start reservations of the containers that still run (journal records),
        by :func:`started_records`, and the journal kept true to them: a record whose
        container stopped is forgotten, one found running without a record is written.
        ``records`` is updated in place."""
        found = started_records(desired, snap, records, known)
        for container in found.dropped:
            journal.forget_started(container)
            rec = records.pop(container)
            if container in self._no_longer_declared:
                logger.info(
                    "{} (no longer declared) stopped; its {} MiB are released", container, rec.mib
                )
        at = time.time()
        for container, rec in found.added.items():
            journal.set_started(container, rec.serve, rec.gpu_roles, rec.mib, at)
            records[container] = rec
        declared = {s.container for s in desired.serves.values()}
        self._say_undeclared({c: r for c, r in records.items() if c not in declared})
        return started_models(records)

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
    """The journal's elastic reserves in force (:func:`elastic_kept`); those of engines
    that restarted since are voided in the journal (docker read: said so)."""
    kept, void = elastic_kept(journal.elastic(), journal.elastic_set_at(), mset, snap)
    for name in void if snap.docker == "ok" else ():
        journal.set_elastic(name, None, time.time())
        logger.info("{}: the engine restarted or stopped; its elastic reserve is void", name)
    return kept


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
