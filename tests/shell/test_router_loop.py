"""The loop's memory of router tiers it left quiesced, and the router client it is wired
with (no daemon: the Controller's bookkeeping and the journal are driven directly).

A tier the controller quiesced and could not readmit is readmitted by later cycles
until the router accepts, so the memory of it must outlive the controller (a journal
table); and the client's retry budget for 503 ``server_busy`` covers the longest drain
of the manifest's tiers.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support.manifests import ONE_RESIDENT

from controller.adapters.router import busy_budget_s
from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.service.wiring import make_executor
from controller.store.journal import Journal, journal_path

MANIFEST = (
    ONE_RESIDENT
    + """router_tier = "res-tier"
drain_timeout_s = 45

[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "a"
vram_mib = 2000
residency = "on-demand"
router_tier = "llm-tier"
drain_timeout_s = 900

[[serve]]
name = "plain"
container = "c-plain"
gpu_role = "a"
vram_mib = 1000
residency = "on-demand"
drain_timeout_s = 3000
"""
)


def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    return path


def controller(tmp_path: Path) -> Controller:
    path = manifest(tmp_path)
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state"), load_manifest_set([path])
    )
    c.journal = Journal.open(journal_path(tmp_path / "state"))
    return c


def step(action: str, serve: str, outcome: str) -> dict[str, object]:
    return {"action": action, "serve": serve, "outcome": outcome}


def test_a_tier_left_quiesced_is_remembered_by_the_journal_across_restarts(
    tmp_path: Path,
) -> None:
    c = controller(tmp_path)
    c.reconciler.lessons.track_tiers([step("start", "llm", "ok"), step("readmit", "llm", "failed")])
    assert c.serve_records.quiesced == {"llm"}
    assert set(c.journal.quiesced()) == {"llm"}
    c.journal.close()

    # a new controller, no cycle journalled that names it: the table remembers it
    again = controller(tmp_path)
    assert again.journal.cycle_ids() == []
    again.reconciler.lessons.recover_tiers()
    assert again.serve_records.quiesced == {"llm"}

    # the router accepted a later readmit: forgotten, also by the journal
    again.reconciler.lessons.track_tiers([step("readmit", "llm", "ok")])
    assert again.serve_records.quiesced == set()
    assert again.journal.quiesced() == {}


def test_the_quiesced_table_is_created_on_open_when_missing(tmp_path: Path) -> None:
    path = journal_path(tmp_path / "state")
    Journal.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE quiesced")
    with Journal.open(path) as journal:
        journal.set_quiesced(["res"], 12.0)
        assert journal.quiesced() == {"res": 12.0}
        journal.set_quiesced(["res"], 99.0)  # remembered since the first time
        assert journal.quiesced() == {"res": 12.0}
        journal.forget_quiesced(["res", "never"])
        assert journal.quiesced() == {}


@pytest.mark.docker
def test_the_router_client_waits_out_the_longest_drain_of_the_manifests_tiers(
    tmp_path: Path,
) -> None:
    mset = load_manifest_set([manifest(tmp_path)])
    executor = make_executor(mset, router_url="http://127.0.0.1:9", router_token_file=None)
    assert executor.router is not None
    # "plain" has no router tier: its drain timeout is never waited behind
    assert executor.router.busy_wait_s == busy_budget_s([45, 900])
    assert executor.router.busy_wait_s > 900


def test_a_dry_run_neither_reads_nor_records_tiers_left_quiesced(tmp_path: Path) -> None:
    """A dry run executed nothing: its journal's plans (never carried out, so with no
    outcome) are no cycle that ended mid-plan, and no tier is quiesced on their account."""
    path = manifest(tmp_path)
    state = tmp_path / "state"
    dry_path = journal_path(state).with_name("journal.dry-run.sqlite3")
    with Journal.open(dry_path) as journal:
        # what an earlier dry run journalled: a plan that quiesces, never executed
        journal.record_cycle(
            at=1.0,
            manifest_digest="d",
            manifest_files={},
            observed={},
            plan={"steps": [step("quiesce", "res", "planned"), step("readmit", "res", "planned")]},
            requests=[],
            dry_run=True,
        )
        journal.set_quiesced(["llm"], 1.0)  # as an earlier dry run wrongly recorded it

    c = Controller(
        RunOptions(manifests=(path,), state_dir=state, dry_run=True), load_manifest_set([path])
    )
    c.journal = Journal.open(dry_path)
    c.reconciler.lessons.recover_tiers()
    assert c.serve_records.quiesced == set()  # so no plan of this dry run readmits a tier
    assert set(c.journal.quiesced()) == {"llm"}  # nothing written on its account either
    c.journal.close()
