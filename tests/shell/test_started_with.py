"""A running container keeps the reservation it was started with, whatever the manifest
says now (``Observed.started_with``, the controller's journal record).

Pure-core tests of the ledger and the status report; the loop's record keeping is
tested end to end in tests/e2e/test_run_e2e.py (a half-written manifest under ``run``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from controller.store.journal import Journal
from statemachine.answers.status_report import host_status
from statemachine.domain import types as sm
from statemachine.ledger.reservations import ledger_from_observed, no_longer_declared
from statemachine.planning.plan_types import (
    Action,
    Policy,
)
from statemachine.planning.planner import (
    plan_transitions,
)
from statemachine.planning.simulate import apply_plan

ROLES = {"a": sm.GpuRole("a", 10_000), "b": sm.GpuRole("b", 10_000)}
RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=100.0)
EXITED = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)
B = sm.ServeSpec("b", "c-b", ("a",), 6000, sm.Residency.ON_DEMAND, sm.DesiredRun.RUNNING, port=None)


def desired(*serves: sm.ServeSpec) -> sm.DesiredState:
    return sm.DesiredState(ROLES, {s.name: s for s in serves})


def observed(
    containers: dict[str, sm.ContainerObs], records: dict[str, sm.StartedWith]
) -> sm.Observed:
    return sm.Observed(True, containers, started_with=records)


def test_a_running_container_no_longer_declared_keeps_its_room() -> None:
    want = desired(B)
    obs = observed({"c-a": RUNNING, "c-b": EXITED}, {"c-a": sm.StartedWith("a", ("a",), 6000)})
    ledger = ledger_from_observed(want, obs)
    assert ledger.committed_mib("a") == 6000 and ledger.holds("a")
    plan = plan_transitions(want, obs, Policy(), now=200.0)
    assert not [s for s in plan.steps if s.action is Action.START], plan.to_json()
    assert [b.serve for b in plan.blocked] == ["b"]
    status = host_status(want, obs).to_json()
    assert status["no_longer_declared"] == [
        {"serve": "a", "container": "c-a", "gpu_roles": ["a"], "reservation_mib": 6000}
    ]


def test_once_it_stops_the_record_counts_nothing() -> None:
    want = desired(B)
    obs = observed({"c-a": EXITED}, {"c-a": sm.StartedWith("a", ("a",), 6000)})
    assert ledger_from_observed(want, obs).committed_mib("a") == 0
    assert no_longer_declared(want, obs) == []
    plan = plan_transitions(want, obs, Policy(), now=200.0)
    assert [s.action for s in plan.steps if s.serve == "b"][:2] == [Action.RESERVE, Action.START]


def test_declared_smaller_or_elsewhere_counts_the_larger_on_both() -> None:
    smaller = sm.ServeSpec("a", "c-a", ("b",), 2000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING)
    obs = observed({"c-a": RUNNING}, {"c-a": sm.StartedWith("a", ("a",), 6000)})
    ledger = ledger_from_observed(desired(smaller), obs)
    assert ledger.holdings["a"].gpu_roles == ("b", "a")
    assert (ledger.committed_mib("a"), ledger.committed_mib("b")) == (6000, 6000)
    larger = sm.ServeSpec("a", "c-a", ("a",), 8000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING)
    assert ledger_from_observed(desired(larger), obs).committed_mib("a") == 8000


def test_a_name_taken_by_a_declared_serve_gets_its_container_beside_it() -> None:
    renamed = sm.ServeSpec("a", "c-a2", ("a",), 1000, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING)
    obs = observed({"c-a": RUNNING, "c-a2": RUNNING}, {"c-a": sm.StartedWith("a", ("a",), 6000)})
    ledger = ledger_from_observed(desired(renamed), obs)
    assert ledger.reservations_on("a") == (("a", 1000), ("a (c-a)", 6000))


def test_roles_without_a_capacity_row_cannot_be_counted() -> None:
    obs = observed({"c-a": RUNNING}, {"c-a": sm.StartedWith("a", ("gone",), 6000)})
    assert no_longer_declared(desired(B), obs) == []
    assert ledger_from_observed(desired(B), obs).holdings == {}


def test_docker_unreadable_is_unknown_not_zero() -> None:
    obs = sm.Observed(False, started_with={"c-a": sm.StartedWith("a", ("a",), 6000)})
    assert ledger_from_observed(desired(B), obs).unknown
    assert no_longer_declared(desired(B), obs) == []


def test_the_journal_keeps_start_reservations_and_opens_older_files(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with Journal.open(path) as j:
        j.set_started("c-a", "a", ("a", "b"), 6000, 1.0)
        j.set_started("c-a", "a", ("a",), 7000, 2.0)  # a new start replaces the record
        assert j.started() == {"c-a": sm.StartedWith("a", ("a",), 7000)}
        j.forget_started("c-a")
        assert j.started() == {}
    with sqlite3.connect(path) as conn:  # a journal written before the table existed
        conn.execute("DROP TABLE started")
    with Journal.open(path, readonly=True) as j:
        assert j.started() == {}
    with Journal.open(path) as j:  # opened for writing, the table is added
        j.set_started("c-b", "b", ("a",), 1000, 3.0)
        assert j.started() == {"c-b": sm.StartedWith("b", ("a",), 1000)}


def _elastic_started_bigger(b_used: int) -> tuple[sm.DesiredState, sm.Observed]:
    """``el`` started at 8000 MiB on a and b (its record), declared 6000 on both now,
    shrunk to 4000; ``other`` holds ``b_used`` on b."""
    el = sm.ServeSpec(
        "el",
        "c-el",
        ("a", "b"),
        6000,
        sm.Residency.EVICTABLE,
        sm.DesiredRun.RUNNING,
        elastic=sm.Elastic("http://127.0.0.1:1", floor_mib=1000, segment_mib=512),
    )
    other = sm.ServeSpec(
        "other", "c-other", ("b",), b_used, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING
    )
    obs = sm.Observed(
        True,
        {"c-el": RUNNING, "c-other": RUNNING},
        elastic_mib={"el": 4000},
        started_with={"c-el": sm.StartedWith("el", ("a", "b"), 8000)},
    )
    return desired(el, other), obs


def _plan_applied(
    want: sm.DesiredState, obs: sm.Observed
) -> tuple[list[tuple[Action, str, int | None, int | None]], sm.Observed]:
    """The plan's steps, and the host once they are done, whose ledger must be the one
    the plan promised."""
    plan = plan_transitions(want, obs, Policy(), now=200.0)
    after = apply_plan(want, obs, plan, 200.0)
    assert ledger_from_observed(want, after).holdings == plan.ledger_after.holdings
    return [(s.action, s.serve, s.mib, s.to_mib) for s in plan.steps], after


def test_an_elastic_serve_grows_back_to_what_it_was_started_with() -> None:
    """Whole again, it counts the larger figure it was started with, on every role of
    either (the ledger): its grow back is to that figure, so the plan's ledger is the one
    the host shows once the grow is done, and the next plan has nothing to do."""
    want, obs = _elastic_started_bigger(1000)
    steps, after = _plan_applied(want, obs)
    assert steps == [(Action.GROW, "el", 4000, 8000)]
    assert plan_transitions(want, after, Policy(), now=200.0).empty


def test_an_elastic_serve_grows_by_the_room_on_every_role_it_holds() -> None:
    """It holds b too, where ``other``'s 5000 and its own 4000 leave 1000 of 10000 free:
    it grows by the whole segments that fit there (one of 512 MiB), not by the 6000 its
    role a has free."""
    want, obs = _elastic_started_bigger(5000)
    steps, _ = _plan_applied(want, obs)
    assert steps == [(Action.GROW, "el", 512, 4512)]


def test_a_partial_grow_of_a_serve_started_bigger_stays_below_its_declared_figure() -> None:
    """Room for 3000 more on b, not for the 4000 back to whole: a grow to its declared
    6000 or more is a grow back to whole (the executor asks the engine for its start-up
    default, and the ledger then counts the 8000 it was started with), so the partial
    grow stops below 6000, in whole segments: 3 of 512, to 5536."""
    want, obs = _elastic_started_bigger(3000)
    steps, after = _plan_applied(want, obs)
    assert steps == [(Action.GROW, "el", 1536, 5536)]
    assert plan_transitions(want, after, Policy(), now=200.0).empty
