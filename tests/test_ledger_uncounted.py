"""``held_uncounted``: the serves of the ledger that hold memory though no ledger counts
them (the executor's check before a reserve and before a start's Docker call)."""

from __future__ import annotations

from statemachine.ledger import GpuReservation, held_uncounted
from statemachine.types import (
    ContainerObs,
    ContainerState,
    DesiredState,
    GpuRole,
    Observed,
    Residency,
    ServeSpec,
)

ROLES = {"g": GpuRole("g", capacity_mib=10_000, reserve_mib=0)}
RUNNING = ContainerObs(ContainerState.RUNNING)


def _serve(name: str, mib: int | None = 2_000, roles: tuple[str, ...] = ("g",)) -> ServeSpec:
    return ServeSpec(name, f"c-{name}", roles, mib, Residency.EVICTABLE)


def test_a_running_serve_no_ledger_counts_is_listed_at_its_declared_reservation() -> None:
    desired = DesiredState(ROLES, {"b": _serve("b", 3_000), "a": _serve("a")})
    observed = Observed(True, {"c-a": RUNNING, "c-b": RUNNING})
    assert held_uncounted(desired, observed, lambda _n: False) == [
        GpuReservation("b", ("g",), 3_000),
        GpuReservation("a", ("g",), 2_000),
    ]


def test_what_a_ledger_counts_is_not_listed() -> None:
    desired = DesiredState(ROLES, {"a": _serve("a"), "b": _serve("b")})
    observed = Observed(True, {"c-a": RUNNING, "c-b": RUNNING})
    assert held_uncounted(desired, observed, lambda n: n == "a") == [
        GpuReservation("b", ("g",), 2_000)
    ]


def test_a_container_that_holds_nothing_is_not_listed() -> None:
    desired = DesiredState(ROLES, {"a": _serve("a"), "b": _serve("b")})
    for state in (ContainerState.EXITED, ContainerState.CREATED, ContainerState.ABSENT):
        observed = Observed(True, {"c-a": ContainerObs(state)})
        assert held_uncounted(desired, observed, lambda _n: False) == []
    paused = Observed(True, {"c-a": ContainerObs(ContainerState.PAUSED)})
    assert [r.holder for r in held_uncounted(desired, paused, lambda _n: False)] == ["a"]


def test_a_serve_outside_the_ledger_is_not_listed() -> None:
    desired = DesiredState(
        ROLES, {"none": _serve("none", None), "elsewhere": _serve("elsewhere", roles=("h",))}
    )
    observed = Observed(True, {"c-none": RUNNING, "c-elsewhere": RUNNING})
    assert held_uncounted(desired, observed, lambda _n: False) == []


def test_nothing_is_listed_when_docker_cannot_be_read() -> None:
    desired = DesiredState(ROLES, {"a": _serve("a")})
    assert held_uncounted(desired, Observed(False, {"c-a": RUNNING}), lambda _n: False) == []
