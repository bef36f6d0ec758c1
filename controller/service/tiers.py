"""The router tiers a plan may have left quiesced: tracked after each plan and start,
kept in the journal, and recovered from it when a controller starts.

A serve quiesced and not stopped (its group failed: the undo's readmit may have failed
too), or whose readmit did not succeed, is readmitted by the next plan while it runs (a
redundant readmit is harmless: the router answers false). The set of such serves is the
loop's (``quiesced``, given to each function and changed in place); the journal's record
of it is kept equal to it here.

This module must not plan or act: it only keeps the set and its journal record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableSet
from typing import Any

from loguru import logger

from controller.store.journal import Journal

#: the recent cycles whose handed-off starts may not have reported their end
_RECENT = 32


def track_tiers(
    quiesced: MutableSet[str], journal: Callable[[], Journal], steps: list[dict[str, Any]]
) -> None:
    """Remember the tiers a plan may have left quiesced; forget the readmitted ones."""
    before = set(quiesced)
    _track(quiesced, steps)
    journal_tiers(quiesced, journal, before)


def _track(quiesced: MutableSet[str], steps: list[dict[str, Any]]) -> None:
    # a serve put to sleep keeps its tier quiesced until it is woken, like a stopped one
    stopped = {
        s["serve"]
        for s in steps
        if s["action"] in ("stop", "sleep", "release_to_residual") and s["outcome"] == "ok"
    }
    for s in steps:
        name = s["serve"]
        if s["action"] == "quiesce" and s["outcome"] == "ok" and name not in stopped:
            quiesced.add(name)
        elif s["action"] == "readmit":
            if s["outcome"] == "ok":
                quiesced.discard(name)
            else:
                quiesced.add(name)


def journal_tiers(
    quiesced: MutableSet[str], journal: Callable[[], Journal], before: set[str]
) -> None:
    """Keep the journal's record of the tiers left quiesced as ``quiesced`` is now
    (``journal`` is asked for here: without one, that is said and the set kept)."""
    try:
        journal().set_quiesced(sorted(quiesced - before), time.time())
        journal().forget_quiesced(sorted(before - quiesced))
    except Exception as exc:  # a locked journal: the next change writes it again
        logger.error("journal: cannot record the tiers left quiesced: {}", exc)


def recover_tiers(
    quiesced: MutableSet[str], journal: Callable[[], Journal], *, dry_run: bool
) -> None:
    """On start: the tiers the journal says were left quiesced; and the last
    journalled cycle may have ended mid-plan (SIGKILL, a crash).

    A dry run skips both: it quiesced and executed nothing, and its journal's plans
    (never carried out, so without an outcome) are no cycle that ended mid-plan.
    """
    if dry_run:
        return
    quiesced |= set(journal().quiesced())
    if quiesced:
        logger.info(
            "tiers of {} were left quiesced: readmitted while their serves run",
            ", ".join(sorted(quiesced)),
        )
    before = set(journal().quiesced())
    try:
        _recover_from_cycles(quiesced, journal)
    finally:
        journal_tiers(quiesced, journal, before)


def _recover_from_cycles(quiesced: MutableSet[str], journal: Callable[[], Journal]) -> None:
    ids = journal().cycle_ids()
    if not ids:
        return
    # starts handed off by recent cycles that never reported their end: their
    # readmit may not have happened
    for cid in ids[-_RECENT:-1]:
        (rec,) = journal().cycles(cycle=cid)
        if rec.outcome is not None:
            readmit_pending(quiesced, rec.plan, rec.outcome)
    (last,) = journal().cycles(cycle=ids[-1])
    if last.outcome is not None:
        track_tiers(quiesced, journal, list(last.outcome.get("steps", [])))
        readmit_pending(quiesced, last.plan, last.outcome)
        _say(quiesced, "starts were in progress when the last controller ended")
        return
    for s in last.plan.get("steps", []):
        if s.get("action") in ("quiesce", "readmit"):
            quiesced.add(str(s.get("serve")))
    _say(quiesced, "the last cycle ended mid-plan")


def _say(quiesced: MutableSet[str], why: str) -> None:
    if quiesced:
        logger.info(
            "{}: tiers of {} are readmitted while they run", why, ", ".join(sorted(quiesced))
        )


def readmit_pending(
    quiesced: MutableSet[str], plan: dict[str, Any], outcome: dict[str, Any]
) -> None:
    """The readmits of ``plan`` whose starts had not ended (``pending``): quiesced still."""
    pending = set(outcome.get("pending") or [])
    for s in plan.get("steps", []):
        if s.get("action") == "readmit" and s.get("serve") in pending:
            quiesced.add(str(s.get("serve")))
