"""Table tests of the ledger's boundaries and refusals (docs/architecture.md, the ledger).

The property test (tests/core/test_ledger_properties.py) draws sizes at random; these pin
the edges it rarely hits: exactly full, one MiB past full, a same-size resize on a
role observed over budget, invalid input (non-positive MiB, empty or repeated role
lists, unknown roles), an unknown ledger, and the ledger built from an observation
(ghost roles, shrunk elastic serves, memory not back after a stop).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.core import spec as core_spec

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import (
    GpuReservation,
    Ledger,
    Refusal,
    RefusalKind,
    _count,
    ledger_from_observed,
    sleeping_reservation,
)

ROLES = {"a": sm.GpuRole("a", 110, 10), "b": sm.GpuRole("b", 200, 0)}  # budgets 100 and 200


def ledger(*holdings: tuple[str, tuple[str, ...], int]) -> Ledger:
    return Ledger(ROLES, [GpuReservation(h, roles, mib) for h, roles, mib in holdings])


def granted(out: Ledger | Refusal) -> Ledger:
    assert isinstance(out, Ledger), out.message if isinstance(out, Refusal) else out
    return out


def refused(out: Ledger | Refusal, kind: RefusalKind) -> Refusal:
    assert isinstance(out, Refusal), "granted what must be refused"
    assert out.kind is kind, out.message
    return out


# ----- admit at the boundary ------------------------------------------------------------
def test_admit_exactly_the_free_mib_fills_the_role() -> None:
    after = granted(ledger(("x", ("a",), 70)).admit(GpuReservation("y", ("a",), 30)))
    assert after.committed_mib("a") == 100
    assert after.free_mib("a") == 0
    assert after.overcommitted() == ()
    assert after.holds("y") and after.holdings["y"].mib == 30


def test_admit_one_mib_past_the_free_mib_is_refused_short_by_one() -> None:
    before = ledger(("x", ("a",), 70))
    out = refused(before.admit(GpuReservation("y", ("a",), 31)), RefusalKind.OVER_BUDGET)
    (t,) = out.terms
    assert (t.budget_mib, t.committed_mib, t.free_mib, t.requested_mib, t.shortfall_mib) == (
        100,
        70,
        30,
        31,
        1,
    )
    assert out.message == (
        "y: a: reserve 31 MiB > free 30 MiB (capacity 110 - reserve 10 = budget 100; "
        "committed 70 = x 70); short by 1 MiB"
    )
    assert not before.holds("y") and before.committed_mib("a") == 70


def test_admit_on_two_roles_is_all_or_nothing_and_names_only_the_short_role() -> None:
    before = ledger(("x", ("a",), 90))
    out = refused(before.admit(GpuReservation("y", ("b", "a"), 20)), RefusalKind.OVER_BUDGET)
    assert [(t.gpu_role, t.shortfall_mib) for t in out.terms] == [("b", 0), ("a", 10)]
    assert out.message.startswith("y: a: reserve 20 MiB > free 10 MiB")
    assert "b:" not in out.message
    assert before.committed_mib("b") == 0
    after = granted(before.admit(GpuReservation("y", ("b", "a"), 10)))
    assert (after.committed_mib("a"), after.committed_mib("b")) == (100, 10)


def test_admit_of_a_holder_already_holding_is_refused() -> None:
    out = refused(
        ledger(("x", ("a",), 10)).admit(GpuReservation("x", ("a",), 5)), RefusalKind.ALREADY_HELD
    )
    assert out.message == "x already holds a reservation; resize it instead"


# ----- resize at the boundary -----------------------------------------------------------
def test_resize_one_mib_past_a_full_role_is_refused() -> None:
    full = ledger(("x", ("a",), 100))
    out = refused(full.resize("x", 101), RefusalKind.OVER_BUDGET)
    (t,) = out.terms
    assert (t.free_mib, t.requested_mib, t.shortfall_mib) == (0, 1, 1)
    assert out.message == (
        "x: a: grow 1 MiB > free 0 MiB (capacity 110 - reserve 10 = budget 100; "
        "committed 100 = x 100); short by 1 MiB"
    )
    assert full.holdings["x"].mib == 100


def test_resize_to_exactly_the_budget_is_granted() -> None:
    after = granted(ledger(("x", ("a",), 60), ("y", ("a",), 10)).resize("x", 90))
    assert after.committed_mib("a") == 100 and after.holdings["x"].mib == 90


def test_same_size_and_shrinking_resizes_are_granted_on_a_role_observed_over_budget() -> None:
    over = ledger(("x", ("a",), 80), ("y", ("a",), 50))  # 130 > budget 100, as observed
    assert over.overcommitted() == ("a",)
    assert over.free_mib("a") == -30
    same = granted(over.resize("x", 80))
    assert same.committed_mib("a") == 130
    shrunk = granted(over.resize("x", 79))
    assert shrunk.committed_mib("a") == 129 and shrunk.holdings["x"].mib == 79
    grow = refused(over.resize("x", 81), RefusalKind.OVER_BUDGET)
    assert grow.terms[0].shortfall_mib == 31


def test_resize_of_a_multi_role_holder_moves_every_role() -> None:
    after = granted(ledger(("x", ("a", "b"), 50)).resize("x", 20))
    assert (after.committed_mib("a"), after.committed_mib("b")) == (20, 20)
    assert after.holdings["x"].gpu_roles == ("a", "b")


def test_resize_and_release_of_a_holder_holding_nothing_are_refused() -> None:
    base = ledger(("x", ("a",), 10))
    assert refused(base.resize("nobody", 5), RefusalKind.NOT_HELD).message == (
        "nobody holds no reservation"
    )
    assert refused(base.release("nobody"), RefusalKind.NOT_HELD).message == (
        "nobody holds no reservation"
    )
    released = granted(base.release("x"))
    assert released.committed_mib("a") == 0 and not released.holds("x")


# ----- invalid input ----------------------------------------------------------------------
@pytest.mark.parametrize("mib", [0, -1, -100, True, 1.5, "10"])
def test_admit_of_a_non_positive_or_non_integer_mib_is_invalid(mib: object) -> None:
    out = refused(
        ledger().admit(GpuReservation("y", ("a",), mib)),  # type: ignore[arg-type]
        RefusalKind.INVALID,
    )
    assert out.message == f"y: reservation must be a positive integer of MiB, got {mib!r}"


@pytest.mark.parametrize("mib", [0, -5])
def test_resize_to_a_non_positive_mib_is_invalid(mib: int) -> None:
    base = ledger(("x", ("a",), 10))
    refused(base.resize("x", mib), RefusalKind.INVALID)
    assert base.committed_mib("a") == 10


def test_one_mib_is_a_valid_reservation() -> None:
    assert granted(ledger().admit(GpuReservation("y", ("a",), 1))).committed_mib("a") == 1


@pytest.mark.parametrize("roles", [(), ("a", "a"), ("a", "b", "a")])
def test_admit_needs_distinct_roles(roles: tuple[str, ...]) -> None:
    out = refused(ledger().admit(GpuReservation("y", roles, 10)), RefusalKind.INVALID)
    assert out.message == f"y: reservation needs distinct gpu roles, got {list(roles)}"


def test_admit_on_a_role_without_capacity_row_is_refused() -> None:
    out = refused(
        ledger().admit(GpuReservation("y", ("a", "nope", "gone"), 10)), RefusalKind.UNKNOWN_ROLE
    )
    assert out.message == "y: no capacity row for gpu role(s) nope, gone"


def test_constructing_a_ledger_from_bad_holdings_raises() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        ledger(("x", ("a",), 10), ("x", ("b",), 10))
    with pytest.raises(ValueError, match="unknown role 'nope'"):
        ledger(("x", ("nope",), 10))


# ----- unknown ledger -----------------------------------------------------------------------
def test_unknown_ledger_admits_and_grows_nothing_and_prints_unknown() -> None:
    unknown = Ledger(ROLES, [GpuReservation("x", ("a",), 10)], unknown=True)
    assert unknown.unknown
    out = refused(unknown.admit(GpuReservation("y", ("a",), 1)), RefusalKind.UNKNOWN_STATE)
    assert "fail closed" in out.message
    (t,) = out.terms
    assert (t.committed_mib, t.free_mib, t.shortfall_mib, t.reservations) == (None, None, None, ())
    refused(unknown.resize("x", 11), RefusalKind.UNKNOWN_STATE)
    assert unknown.view("a").to_json() == {
        "capacity_mib": 110,
        "reserve_mib": 10,
        "budget_mib": 100,
        "committed_mib": None,
        "free_mib": None,
        "reservations": [],
    }
    assert not Ledger(ROLES).unknown


# ----- reading ------------------------------------------------------------------------------
def test_terms_of_a_request_that_fits_have_zero_shortfall() -> None:
    base = ledger(("y", ("a",), 30), ("x", ("a", "b"), 20))
    t = base.terms("z", ("a",), 10)[0]
    assert t.to_json() == {
        "gpu_role": "a",
        "capacity_mib": 110,
        "reserve_mib": 10,
        "budget_mib": 100,
        "committed_mib": 50,
        "free_mib": 50,
        "requested_mib": 10,
        "shortfall_mib": 0,
        "reservations": [{"serve": "x", "mib": 20}, {"serve": "y", "mib": 30}],
    }
    assert base.terms("z", ("a",), 51)[0].shortfall_mib == 1
    assert base.terms("z", ("a",), 50)[0].shortfall_mib == 0
    assert base.reservations_on("b") == (("x", 20),)
    assert base.view("b").to_json()["free_mib"] == 180


def test_exactly_the_budget_is_not_overcommitted_one_more_is() -> None:
    assert ledger(("x", ("a",), 100)).overcommitted() == ()
    assert ledger(("x", ("a", "b"), 101)).overcommitted() == ("a",)


def test_refusal_json_carries_every_term() -> None:
    out = refused(
        ledger(("x", ("a",), 95)).admit(GpuReservation("y", ("a",), 10)), RefusalKind.OVER_BUDGET
    )
    data = out.to_json()
    assert data["kind"] == "over_budget" and data["serve"] == "y"
    assert data["message"] == out.message
    assert data["gpu_roles"][0]["shortfall_mib"] == 5
    assert data["gpu_roles"][0]["reservations"] == [{"serve": "x", "mib": 95}]


# ----- the ledger the host holds -------------------------------------------------------------
def running() -> sm.ContainerObs:
    return sm.ContainerObs(sm.ContainerState.RUNNING, started_at=1.0)


def spec(name: str, mib: int | None, roles: tuple[str, ...] = ("a",), **kw: object) -> sm.ServeSpec:
    return core_spec(
        name, mib, sm.Residency.EVICTABLE, roles=roles, desired=sm.DesiredRun.RUNNING, **kw
    )


def test_ledger_from_observed_counts_what_holds_memory() -> None:
    serves = [
        spec("run", 30),
        spec("paused", 5, ("b",)),
        spec("gone", 40),  # exited: released
        spec("ghost", 25, ("nowhere",)),  # a role with no capacity row: outside the ledger
        spec("none", None),  # no reservation
        spec("moe", 50, ("a", "b"), elastic=sm.Elastic("http://127.0.0.1:1", 10)),
        spec("back", 7),  # exited, memory not back yet: still counted
    ]
    desired = sm.DesiredState(ROLES, {s.name: s for s in serves})
    observed = sm.Observed(
        True,
        {
            "c-run": running(),
            "c-paused": sm.ContainerObs(sm.ContainerState.PAUSED),
            "c-gone": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0),
            "c-ghost": running(),
            "c-none": running(),
            "c-moe": running(),
            "c-back": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0),
        },
        elastic_mib={"moe": 20},
        unreleased=frozenset({"back"}),
    )
    got = ledger_from_observed(desired, observed)
    assert {h: (r.gpu_roles, r.mib) for h, r in got.holdings.items()} == {
        "run": (("a",), 30),
        "paused": (("b",), 5),
        "moe": (("a", "b"), 20),
        "back": (("a",), 7),
    }
    assert (got.committed_mib("a"), got.committed_mib("b")) == (57, 25)
    assert not got.unknown


def test_ledger_from_an_unreadable_docker_is_unknown() -> None:
    desired = sm.DesiredState(ROLES, {"run": spec("run", 30)})
    got = ledger_from_observed(desired, sm.Observed(False, {"c-run": running()}))
    assert got.unknown and got.holdings == {}


def test_a_holder_counted_twice_while_a_ledger_is_built_is_an_error_not_a_sum() -> None:
    """Building a ledger from what the host holds never adds a holder's MiB twice: the
    second count of one name raises (no host can make it: a container no longer
    declared is renamed ``NAME (CONTAINER)`` beside a declared serve of that name)."""
    held: dict[str, GpuReservation] = {}
    committed = {"a": 0}
    _count(held, committed, GpuReservation("x", ("a",), 100))
    with pytest.raises(ValueError, match="'x' appears twice"):
        _count(held, committed, GpuReservation("x", ("a",), 100))
    assert committed == {"a": 100}


def test_an_engine_asleep_without_the_controllers_record_holds_its_residual() -> None:
    """The engine says it sleeps, and the controller has no record of putting it to
    sleep (no level, no host RAM): it holds the residual it declares, at the level it
    declares (level 2: no host RAM), not its full reservation."""
    s = sm.ServeSpec("s", "c-s", ("b",), 150, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING)
    s = replace(s, sleep=sm.Sleep(2, 30, SleepProtocol.VLLM))
    assert sleeping_reservation(s, sm.SleepObs(sm.SleepState.ASLEEP)) == (30, 0)
    assert sleeping_reservation(s, sm.SleepObs(sm.SleepState.UNKNOWN)) is None  # counted awake


def test_a_start_in_progress_of_a_serve_outside_the_ledger_counts_what_was_reserved() -> None:
    """A serve declared on a role without a capacity row is outside the ledger; its start
    in progress (reserved 40 MiB on b before an edit) counts those 40 on b, not what it
    declares now (120)."""
    s = sm.ServeSpec("s", "c-s", ("b", "gone"), 120, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING)
    desired = sm.DesiredState(ROLES, {"s": s})
    observed = sm.Observed(True, {}, starting={"s": sm.StartingObs(("b",), 40)})
    got = ledger_from_observed(desired, observed)
    assert {h: (r.gpu_roles, r.mib) for h, r in got.holdings.items()} == {"s": (("b",), 40)}


def test_an_engine_of_unknown_state_keeps_the_host_ram_of_a_recorded_level_1_sleep() -> None:
    """The engine does not answer (unknown): it is counted awake on the card, and the
    host RAM of a level-1 sleep counts while any record says it was put to sleep: the
    level alone (the declared host RAM), or the host RAM alone (the recorded figure)."""
    s = sm.ServeSpec("s", "c-s", ("b",), 150, sm.Residency.EVICTABLE, sm.DesiredRun.RUNNING)
    s = replace(s, sleep=sm.Sleep(1, 30, SleepProtocol.VLLM, 500))
    assert sleeping_reservation(s, sm.SleepObs(sm.SleepState.UNKNOWN, level=1)) == (None, 500)
    recorded = sm.SleepObs(sm.SleepState.UNKNOWN, host_ram_mib=700)
    assert sleeping_reservation(s, recorded) == (None, 700)
    assert sleeping_reservation(s, sm.SleepObs(sm.SleepState.UNKNOWN)) is None  # no record


def test_two_containers_no_longer_declared_under_one_name_are_both_counted() -> None:
    """Two running containers recorded as started for ``y``, which no serve declares
    now: each is counted at its record (the second under ``y (CONTAINER)``), never one
    in place of the other."""
    desired = sm.DesiredState(ROLES, {})
    up = sm.ContainerObs(sm.ContainerState.RUNNING)
    observed = sm.Observed(
        True,
        {"c-y1": up, "c-y2": up},
        started_with={
            "c-y1": sm.StartedWith("y", ("b",), 40),
            "c-y2": sm.StartedWith("y", ("b",), 60),
        },
    )
    got = ledger_from_observed(desired, observed)
    assert {h: r.mib for h, r in got.holdings.items()} == {"y": 40, "y (c-y2)": 60}
