"""What the journal adds to each observation: start reservations, sleep, elastic reserves.

The host shows which containers run, not what they were started with nor what their
engine was told since. :class:`JournalOverlays` lays the journal's records over each
observation and keeps them true to it: a container keeps the reservation it was started
with until it stops (:meth:`JournalOverlays.started_in_force`), a sleeper is a sleeper
until its engine says otherwise (:meth:`JournalOverlays.sleep_in_force`), an elastic
reserve holds until its engine restarts (:func:`elastic_in_force`). Observing writes
nothing: what an observation finds the journal should learn (a start record that ends or
is found, a sleeper forgotten or seen, a reserve void) is a :class:`Learned`, which the
loop writes once the observation is taken in. This module also records what the executor
reports (starts, sleeps) and what the manifest in force declares. With docker unreadable
nothing is dropped or recorded on its strength.

The journal and the manifest are given to each call (the loop owns them); what is held
here is only what was already said (a note is logged once, not every cycle) and the
sleep probe. This module must not plan or act on a container.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from loguru import logger

from controller.adapters.docker.read import manifest_containers
from controller.adapters.sleep import SleepClient
from controller.manifest import ManifestSet
from controller.service.executor import ExecutionReport, Outcome
from controller.service.overlay_rules import (
    StartedRecords,
    elastic_kept,
    started_models,
    started_records,
)
from controller.service.records import RecordStore
from controller.service.sleeping import SleepersNow, observe_sleep
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
        desired: DesiredState,
        snap: SnapshotModel,
        records: dict[str, StartedWith],
        known: dict[str, StartedWith] | None = None,
    ) -> tuple[dict[str, StartedWithModel], StartedRecords]:
        """The start reservations of the containers that still run (journal records),
        by :func:`started_records`, and what the journal should learn to stay true to
        them (:meth:`Learned.write`): a record whose container stopped ends, one found
        running without a record is added. Nothing is written here."""
        found = started_records(desired, snap, records, known)
        for container in found.dropped:
            if container in self._no_longer_declared:
                logger.info(
                    "{} (no longer declared) stopped; its {} MiB are released",
                    container,
                    records[container].mib,
                )
        held = found.applied(records)
        declared = {s.container for s in desired.serves.values()}
        self._say_undeclared({c: r for c, r in held.items() if c not in declared})
        return started_models(held), found

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
        self, sleeping: Mapping[str, SleepRecord], desired: DesiredState, snap: SnapshotModel
    ) -> tuple[dict[str, SleepStateModel], SleepersNow]:
        """The sleep state of every serve that can sleep (``sleeping``: the journal's
        sleep records), and what the journal should learn to stay true to it.

        A sleeper whose container stopped, or started again since its sleep (awake and
        full), or whose engine says it is awake, is to be forgotten; what each recorded
        sleeper was seen as is to be journalled every cycle. Nothing is written here.
        """
        models, now = observe_sleep(desired, snap, sleeping, self._sleep_probe)
        for note in now.notes:
            if note not in self._sleep_said:
                logger.info("sleep: {}", note)
        self._sleep_said = set(now.notes)
        return models, now


@dataclass(frozen=True, slots=True)
class Learned:
    """What one observation found that the journal should learn; the observation writes
    nothing, the loop writes this after it (:meth:`write`)."""

    #: the start records that end and those found (:func:`started_records`)
    started: StartedRecords = field(default_factory=StartedRecords)
    #: the sleepers as this observation found them (what to forget, what each was seen as)
    sleep: SleepersNow = field(default_factory=lambda: SleepersNow({}, {}, [], []))
    #: the serves whose elastic reserve is void (:func:`elastic_kept`)
    elastic_void: tuple[str, ...] = ()
    #: when the observation was taken (epoch seconds)
    at: float = 0.0

    def write(self, journal: Journal, records: RecordStore) -> None:
        """Keep the journal and the serves' placements (``records``) true to this
        observation."""
        for container in self.started.dropped:
            records.unplace(container)
        for container, rec in self.started.added.items():
            records.place(container, rec, self.at)
        for name in self.elastic_void:
            journal.set_elastic(name, None, self.at)
            logger.info("{}: the engine restarted or stopped; its elastic reserve is void", name)
        for container in self.sleep.forget:
            journal.forget_sleeping(container)
        for container, seen in self.sleep.seen.items():
            journal.saw_sleeping(container, seen, self.at)


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
    records: RecordStore, report: ExecutionReport, desired: DesiredState, now: float
) -> None:
    """Record the placement of each container this plan started (see above)."""
    for r in report.results:
        if r.step.action is not Action.START or r.outcome is not Outcome.OK:
            continue
        spec = desired.serves.get(r.step.serve)
        if spec is None or not r.step.mib or not r.step.gpu_roles:
            continue  # outside the ledger; or no longer declared: its start counts it
        # the roles and MiB the start was planned with, whatever the manifest says now
        records.place(spec.container, StartedWith(spec.name, r.step.gpu_roles, r.step.mib), now)


def elastic_in_force(
    journal: Journal, mset: ManifestSet, snap: SnapshotModel
) -> tuple[dict[str, int], tuple[str, ...]]:
    """The journal's elastic reserves in force (:func:`elastic_kept`), and those of
    engines that restarted since, void (docker read: said so; :meth:`Learned.write`
    journals it). Nothing is written here."""
    kept, void = elastic_kept(journal.elastic(), journal.elastic_set_at(), mset, snap)
    return kept, void if snap.docker == "ok" else ()


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
