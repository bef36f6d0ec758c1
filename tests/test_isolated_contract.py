"""The fit shortcut's own contract (statemachine/isolated.py), case by case.

tests/test_fit_isolated.py shows over random hosts that wherever
:func:`statemachine.isolated.decide` answers, it answers as the planner. These tests
pin *when* it answers and what: on small hosts built by hand, each case calls
``decide`` directly (with the ledger, and with the plain reading where there is one:
both answer alike) and checks its answer, and, where it answers, that the answer is
the planner's plan for the isolated request (:func:`statemachine.fit.request_plan`):
the same stops, in the same order, the same drains, nothing shrunk, slept or blocked.
Where it declines (``None``), the caller runs the planner.
"""

from __future__ import annotations

from dataclasses import replace

from strategies import NOW

from statemachine.fit import request_plan
from statemachine.isolated import NO_ROOM_NEEDED, Decision, decide, plain_reading
from statemachine.ledger import ledger_from_observed
from statemachine.plan import Action, Policy
from statemachine.types import (
    ContainerObs,
    ContainerState,
    DesiredState,
    Elastic,
    GpuRole,
    Observed,
    Residency,
    ServeSpec,
)

ROLES = {
    "g": GpuRole("g", capacity_mib=10_000, reserve_mib=0),
    "h": GpuRole("h", capacity_mib=10_000, reserve_mib=0),
}
RUNNING = ContainerObs(ContainerState.RUNNING, started_at=NOW - 900)
WANT = ServeSpec("want", "c-want", ("g",), 6_000, Residency.ON_DEMAND)


def _evictable(name: str, roles: tuple[str, ...] = ("g",), mib: int = 5_000) -> ServeSpec:
    return ServeSpec(name, f"c-{name}", roles, mib, Residency.EVICTABLE)


def _decide(serves: list[ServeSpec], observed: Observed, want: ServeSpec = WANT) -> Decision | None:
    """``decide`` for ``want`` on a host of ``serves``, by the ledger and by the plain
    reading (where the observation is plain: both must agree)."""
    desired = DesiredState(ROLES, {s.name: s for s in [*serves, want]})
    ledger = ledger_from_observed(desired, observed)
    got = decide(desired, observed, want, ledger, Policy(), NOW)
    reading = plain_reading(desired, observed)
    if reading is not None:
        assert decide(desired, observed, want, reading, Policy(), NOW) == got
    return got


def _planned(serves: list[ServeSpec], observed: Observed, want: ServeSpec = WANT) -> Decision:
    """The planner's plan for the isolated request, as a decision: its stops and drains
    (and nothing shrunk, slept, woken or blocked, which no decision says)."""
    desired = DesiredState(ROLES, {s.name: s for s in [*serves, want]})
    plan = request_plan(desired, observed, want.name, now=NOW)
    assert not plan.blocked, plan.blocked
    assert not {s.action for s in plan.steps} & {Action.SHRINK, Action.SLEEP, Action.WAKE}
    return Decision(
        tuple(s.serve for s in plan.steps if s.action is Action.STOP),
        tuple(s.serve for s in plan.steps if s.action is Action.DRAIN),
    )


def _answers(serves: list[ServeSpec], observed: Observed, want: ServeSpec = WANT) -> Decision:
    """``decide``'s answer, checked to be the planner's."""
    got = _decide(serves, observed, want)
    assert got is not None, "the shortcut declined"
    assert got == _planned(serves, observed, want)
    return got


def _running(*serves: ServeSpec, obs: ContainerObs = RUNNING) -> Observed:
    return Observed(True, {s.container: obs for s in serves})


# ----- the requester's own rules -----------------------------------------------------------


def test_a_requester_with_an_idle_ttl_is_decided_while_its_request_lasts() -> None:
    want = replace(WANT, idle_ttl_s=300.0)
    assert _answers([], Observed(True), want) == NO_ROOM_NEEDED


def test_a_requester_whose_container_is_its_own_projects_is_decided() -> None:
    want = replace(WANT, compose_project="mine")
    exited = ContainerObs(ContainerState.EXITED, compose_project="mine")
    assert _answers([], Observed(True, {"c-want": exited}), want) == NO_ROOM_NEEDED


def test_a_requester_whose_container_is_another_projects_is_left_to_the_planner() -> None:
    want = replace(WANT, compose_project="mine")
    exited = ContainerObs(ContainerState.EXITED, compose_project="theirs")
    assert _decide([], Observed(True, {"c-want": exited}), want) is None


def test_a_requester_on_a_role_without_a_capacity_row_needs_no_room() -> None:
    """The ledger does not govern a serve on a role it has no row for: no shortfall."""
    want = replace(WANT, gpu_roles=("x",))
    evi = _evictable("evi", mib=9_000)
    assert _answers([evi], _running(evi), want) == NO_ROOM_NEEDED


def test_a_request_that_fits_exactly_needs_no_room() -> None:
    """6,000 MiB asked, 6,000 free: nothing to stop, and the elastic holder on the role
    (which could give memory back) is not weighed."""
    ela = replace(_evictable("ela", mib=4_000), elastic=Elastic("http://ela", floor_mib=1_000))
    assert _answers([ela], _running(ela)) == NO_ROOM_NEEDED
    assert _decide([replace(ela, vram_mib=4_001)], _running(ela)) is None  # 1 MiB short


# ----- the running serves: conflicts and loads -----------------------------------------------


def test_an_exclusive_requester_does_not_conflict_with_a_serve_on_another_role() -> None:
    want = replace(WANT, exclusive=True)
    other = _evictable("other", ("h",))
    assert _answers([other], _running(other), want) == NO_ROOM_NEEDED
    on_g = _evictable("on-g")
    assert _decide([on_g], _running(on_g), want) is None  # the planner stops it first


def test_a_free_sized_requester_waits_only_for_a_free_sized_start() -> None:
    """An engine that sizes itself from free memory is serialised only behind another
    such engine still loading on one of its roles: a running, healthy peer of any kind
    does not hold it."""
    want = replace(WANT, sizes_from_free=True)
    plain = _evictable("plain", mib=2_000)
    assert _answers([plain], _running(plain), want) == NO_ROOM_NEEDED
    sized = replace(plain, sizes_from_free=True)
    assert _answers([sized], _running(sized), want) == NO_ROOM_NEEDED
    loading = ContainerObs(ContainerState.RUNNING, health="starting", started_at=NOW - 5)
    assert _decide([sized], _running(sized, obs=loading), want) is None
    assert _answers([plain], _running(plain, obs=loading), want) == NO_ROOM_NEEDED


# ----- the candidates ------------------------------------------------------------------------


def test_only_holders_on_a_short_role_are_weighed() -> None:
    """Short on g only: the elastic serve on h (which could give memory back) is no
    candidate, so the decision stands (a holder on g that could give back is left to
    the planner)."""
    evi = _evictable("evi")
    ela = replace(_evictable("ela", ("h",)), elastic=Elastic("http://ela", floor_mib=1_000))
    assert _answers([evi, ela], _running(evi, ela)) == Decision(("evi",))
    ela_g = replace(ela, gpu_roles=("g",))
    assert _decide([evi, ela_g], _running(evi, ela_g)) is None


def test_two_short_roles_are_each_covered_and_the_victims_named_in_order() -> None:
    """Short on g and on h: a victim on each role, named in the order of their names
    whatever the order the serves are declared in (the plan's stops)."""
    want = replace(WANT, gpu_roles=("g", "h"))
    on_h, on_g = _evictable("b-on-h", ("h",)), _evictable("a-on-g", ("g",))
    for serves in ([on_h, on_g], [on_g, on_h]):
        assert _answers(serves, _running(on_h, on_g), want) == Decision(("a-on-g", "b-on-h"))


def test_a_container_of_another_project_is_never_a_victim() -> None:
    """A serve whose container is another Compose project's holds its memory, protected:
    with nothing else to stop the planner says what blocks; its own project's container
    is stopped."""
    evi = replace(_evictable("evi"), compose_project="mine")
    theirs = ContainerObs(ContainerState.RUNNING, started_at=NOW - 900, compose_project="theirs")
    assert _decide([evi], _running(evi, obs=theirs)) is None
    ours = replace(theirs, compose_project="mine")
    assert _answers([evi], _running(evi, obs=ours)) == Decision(("evi",))


def test_a_victim_inside_its_min_runtime_is_protected() -> None:
    """min_runtime_s protects a serve only while it lasts: 1 s protects a start 0.5 s
    old; 60 s no longer protects one started 900 s ago; 0 protects nothing."""
    young = replace(_evictable("evi"), min_runtime_s=1.0)
    just_started = ContainerObs(ContainerState.RUNNING, started_at=NOW - 0.5)
    assert _decide([young], _running(young, obs=just_started)) is None
    old = replace(young, min_runtime_s=60.0)
    assert _answers([old], _running(old)) == Decision(("evi",))
    assert _decide([old], _running(old, obs=just_started)) is None
    unprotected = replace(young, min_runtime_s=0.0)
    assert _answers([unprotected], _running(unprotected, obs=just_started)) == Decision(("evi",))
