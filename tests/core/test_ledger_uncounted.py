"""``held_uncounted``: the serves of the ledger that occupy memory though no ledger
counts them (the executor's check before a reserve and before a start's Docker call);
and what the observed ledger counts for a serve outside it that has a start record."""

from __future__ import annotations

from statemachine.domain import types as sm
from statemachine.ledger.reservations import GpuReservation, held_uncounted, ledger_from_observed

ROLES = {"g": sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING)


def _serve(name: str, mib: int | None = 2_000, roles: tuple[str, ...] = ("g",)) -> sm.ServeSpec:
    return sm.ServeSpec(name, f"c-{name}", roles, mib, sm.Residency.EVICTABLE)


def test_a_running_serve_no_ledger_counts_is_listed_at_its_declared_reservation() -> None:
    desired = sm.DesiredState(ROLES, {"b": _serve("b", 3_000), "a": _serve("a")})
    observed = sm.Observed(True, {"c-a": RUNNING, "c-b": RUNNING})
    assert held_uncounted(desired, observed, lambda _n: False) == [
        GpuReservation("b", ("g",), 3_000),
        GpuReservation("a", ("g",), 2_000),
    ]


def test_what_a_ledger_counts_is_not_listed() -> None:
    desired = sm.DesiredState(ROLES, {"a": _serve("a"), "b": _serve("b")})
    observed = sm.Observed(True, {"c-a": RUNNING, "c-b": RUNNING})
    assert held_uncounted(desired, observed, lambda n: n == "a") == [
        GpuReservation("b", ("g",), 2_000)
    ]


def test_a_container_that_holds_nothing_is_not_listed() -> None:
    desired = sm.DesiredState(ROLES, {"a": _serve("a"), "b": _serve("b")})
    for state in (sm.ContainerState.EXITED, sm.ContainerState.CREATED, sm.ContainerState.ABSENT):
        observed = sm.Observed(True, {"c-a": sm.ContainerObs(state)})
        assert held_uncounted(desired, observed, lambda _n: False) == []
    paused = sm.Observed(True, {"c-a": sm.ContainerObs(sm.ContainerState.PAUSED)})
    assert [r.holder for r in held_uncounted(desired, paused, lambda _n: False)] == ["a"]


def test_a_serve_outside_the_ledger_is_not_listed() -> None:
    desired = sm.DesiredState(
        ROLES, {"none": _serve("none", None), "elsewhere": _serve("elsewhere", roles=("h",))}
    )
    observed = sm.Observed(True, {"c-none": RUNNING, "c-elsewhere": RUNNING})
    assert held_uncounted(desired, observed, lambda _n: False) == []


def test_nothing_is_listed_when_docker_cannot_be_read() -> None:
    desired = sm.DesiredState(ROLES, {"a": _serve("a")})
    assert held_uncounted(desired, sm.Observed(False, {"c-a": RUNNING}), lambda _n: False) == []


def test_a_record_of_a_serve_outside_the_ledger_counts_only_on_roles_with_a_row() -> None:
    """A serve the ledger does not govern (no vram_mib) whose running container has a
    start record counts the record's MiB on the record's roles that have a capacity
    row, and nothing where none has one."""
    proxy = _serve("proxy", None)
    desired = sm.DesiredState(ROLES, {"proxy": proxy})
    for on, counted in ((("g", "h"), True), (("h",), False)):
        observed = sm.Observed(
            True, {"c-proxy": RUNNING}, started_with={"c-proxy": sm.StartedWith("proxy", on, 1_500)}
        )
        ledger = ledger_from_observed(desired, observed)
        assert ledger.holds("proxy") is counted, on
        assert ledger.free_mib("g") == (8_500 if counted else 10_000)
        if counted:
            assert ledger.holdings["proxy"] == GpuReservation("proxy", ("g",), 1_500)
