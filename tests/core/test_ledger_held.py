"""What the observed ledger holds beyond the declared, running serves (pure).

Written from docs/limits.md and docs/architecture.md:

- a start in progress (``Observed.starting``) holds the larger of what was reserved for it
  and what its serve declares now, on the roles of both (only roles with a capacity row),
  also when no serve declares it any more; a start outside the ledger (0 MiB) holds
  nothing;
- a running container no serve declares now, with a record of the reservation it was
  started with (``Observed.started_with``), holds that reservation under its serve's
  name — ``"NAME (CONTAINER)"`` when a declared serve has that name now —; a declared or
  stopped container is not "no longer declared"; with docker unreadable nothing is.
"""

from __future__ import annotations

from statemachine.domain import types as sm
from statemachine.ledger.reservations import ledger_from_observed, no_longer_declared

ROLES = {"a": sm.GpuRole("a", 10_000), "b": sm.GpuRole("b", 10_000)}
RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=100.0)
EXITED = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)


def serve(name: str, mib: int | None, roles: tuple[str, ...] = ("a",)) -> sm.ServeSpec:
    return sm.ServeSpec(name, f"c-{name}", roles, mib, sm.Residency.RESIDENT, sm.DesiredRun.RUNNING)


def desired(*serves: sm.ServeSpec) -> sm.DesiredState:
    return sm.DesiredState(ROLES, {s.name: s for s in serves})


def held(d: sm.DesiredState, o: sm.Observed) -> dict[str, tuple[tuple[str, ...], int]]:
    ledger = ledger_from_observed(d, o)
    return {n: (r.gpu_roles, r.mib) for n, r in sorted(ledger.holdings.items())}


# ── starts in progress ───────────────────────────────────────────────────────


def test_a_start_no_serve_declares_holds_where_it_started() -> None:
    o = sm.Observed(True, {}, starting={"gone": sm.StartingObs(("b",), 3000)})
    assert held(desired(serve("x", 1000)), o) == {"gone": (("b",), 3000)}


def test_a_start_holds_the_larger_figure_on_the_roles_of_both() -> None:
    o = sm.Observed(True, {}, starting={"x": sm.StartingObs(("a",), 3000)})
    assert held(desired(serve("x", 5000, ("b",))), o) == {"x": (("a", "b"), 5000)}
    assert held(desired(serve("x", 1000, ("a",))), o) == {"x": (("a",), 3000)}


def test_a_start_of_a_serve_without_a_reservation_keeps_what_it_started_with() -> None:
    o = sm.Observed(True, {}, starting={"x": sm.StartingObs(("a",), 3000)})
    assert held(desired(serve("x", None)), o) == {"x": (("a",), 3000)}


def test_a_start_outside_the_ledger_or_on_unknown_roles_holds_nothing() -> None:
    zero = sm.Observed(True, {}, starting={"x": sm.StartingObs(("a",), 0)})
    assert held(desired(serve("x", None)), zero) == {}
    one = sm.Observed(True, {}, starting={"x": sm.StartingObs(("a",), 1)})
    assert held(desired(serve("x", None)), one) == {"x": (("a",), 1)}
    nowhere = sm.Observed(True, {}, starting={"x": sm.StartingObs(("gpu9",), 3000)})
    assert held(desired(), nowhere) == {}


def test_a_start_in_progress_does_not_hide_the_serves_after_it() -> None:
    d = desired(serve("first", 2000), serve("second", 3000))
    o = sm.Observed(True, {"c-second": RUNNING}, starting={"first": sm.StartingObs(("a",), 2000)})
    assert held(d, o) == {"first": (("a",), 2000), "second": (("a",), 3000)}


# ── containers no longer declared ────────────────────────────────────────────


def test_a_running_container_no_serve_declares_holds_its_start_reservation() -> None:
    o = sm.Observed(
        True, {"c-old": RUNNING}, started_with={"c-old": sm.StartedWith("old", ("a",), 4000)}
    )
    assert held(desired(serve("x", 1000)), o) == {"old": (("a",), 4000)}
    assert no_longer_declared(desired(), o)[0][0] == "c-old"


def test_declared_or_stopped_containers_are_not_no_longer_declared() -> None:
    records = {
        "c-a": sm.StartedWith("a", ("a",), 1000),  # declared now (sorted first)
        "c-b-old": sm.StartedWith("old", ("a",), 2000),  # stopped
        "c-z": sm.StartedWith("z", ("a",), 3000),  # running, undeclared: the one
    }
    o = sm.Observed(True, {"c-a": RUNNING, "c-b-old": EXITED, "c-z": RUNNING}, started_with=records)
    assert [(c, r.holder, r.mib) for c, r in no_longer_declared(desired(serve("a", 1000)), o)] == [
        ("c-z", "z", 3000)
    ]


def test_a_record_on_unknown_roles_is_skipped_and_the_next_still_counts() -> None:
    records = {
        "c-1": sm.StartedWith("one", ("gpu9",), 1000),
        "c-2": sm.StartedWith("two", ("a",), 2000),
    }
    o = sm.Observed(True, {"c-1": RUNNING, "c-2": RUNNING}, started_with=records)
    assert [(c, r.holder) for c, r in no_longer_declared(desired(), o)] == [("c-2", "two")]


def test_a_holder_whose_name_a_serve_has_now_is_named_with_its_container() -> None:
    o = sm.Observed(
        True, {"c-old": RUNNING}, started_with={"c-old": sm.StartedWith("x", ("a",), 4000)}
    )
    d = desired(serve("x", 1000))
    assert [r.holder for _, r in no_longer_declared(d, o)] == ["x (c-old)"]
    assert held(d, o) == {"x (c-old)": (("a",), 4000)}


def test_with_docker_unreadable_nothing_is_no_longer_declared() -> None:
    o = sm.Observed(
        False, {"c-old": RUNNING}, started_with={"c-old": sm.StartedWith("o", ("a",), 1)}
    )
    assert no_longer_declared(desired(), o) == []
