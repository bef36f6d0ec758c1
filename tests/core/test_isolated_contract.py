"""The fit shortcut's own contract (statemachine/answers/planner_shortcut.py), case by case.

tests/core/test_fit_isolated.py shows over random hosts that wherever
:func:`statemachine.answers.planner_shortcut.decide` answers, it answers as the planner. These tests
pin *when* it answers and what: on small hosts built by hand, each case calls
``decide`` directly (with the observed ledger) and checks its answer, and, where it
answers, that the answer is the planner's plan for the isolated request
(:func:`statemachine.answers.fit.request_plan`):
the same stops, in the same order, the same drains, nothing shrunk, slept or blocked.
Where it declines (``None``), the caller runs the planner.
"""

from __future__ import annotations

from dataclasses import replace

from support.strategies import NOW

from statemachine.answers.fit import request_plan
from statemachine.answers.planner_shortcut import NO_ROOM_NEEDED, Decision, decide, whole_terms
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import Action, Policy, RestoreCost

ROLES = {
    "g": sm.GpuRole("g", capacity_mib=10_000, reserve_mib=0),
    "h": sm.GpuRole("h", capacity_mib=10_000, reserve_mib=0),
}
RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 900)
WANT = sm.ServeSpec("want", "c-want", ("g",), 6_000, sm.Residency.ON_DEMAND)


def _evictable(name: str, roles: tuple[str, ...] = ("g",), mib: int = 5_000) -> sm.ServeSpec:
    return sm.ServeSpec(name, f"c-{name}", roles, mib, sm.Residency.EVICTABLE)


def _decide(
    serves: list[sm.ServeSpec],
    observed: sm.Observed,
    want: sm.ServeSpec = WANT,
    policy: Policy = Policy(),
) -> Decision | None:
    """``decide`` for ``want`` on a host of ``serves``, by the observed ledger."""
    desired = sm.DesiredState(ROLES, {s.name: s for s in [*serves, want]})
    ledger = ledger_from_observed(desired, observed)
    return decide(desired, observed, want, ledger, policy, NOW, whole_terms(desired, ledger, want))


def _planned(
    serves: list[sm.ServeSpec],
    observed: sm.Observed,
    want: sm.ServeSpec = WANT,
    policy: Policy = Policy(),
) -> Decision:
    """The planner's plan for the isolated request, as a decision: its stops and drains
    (and nothing shrunk, slept, woken or blocked, which no decision says)."""
    desired = sm.DesiredState(ROLES, {s.name: s for s in [*serves, want]})
    plan = request_plan(desired, observed, want.name, policy=policy, now=NOW)
    assert not plan.blocked, plan.blocked
    assert not {s.action for s in plan.steps} & {Action.SHRINK, Action.SLEEP, Action.WAKE}
    return Decision(
        tuple(s.serve for s in plan.steps if s.action is Action.STOP),
        tuple(s.serve for s in plan.steps if s.action is Action.DRAIN),
    )


def _answers(
    serves: list[sm.ServeSpec],
    observed: sm.Observed,
    want: sm.ServeSpec = WANT,
    policy: Policy = Policy(),
) -> Decision:
    """``decide``'s answer, checked to be the planner's."""
    got = _decide(serves, observed, want, policy)
    assert got is not None, "the shortcut declined"
    assert got == _planned(serves, observed, want, policy)
    return got


def _running(*serves: sm.ServeSpec, obs: sm.ContainerObs = RUNNING) -> sm.Observed:
    return sm.Observed(True, {s.container: obs for s in serves})


# ----- the requester's own rules -----------------------------------------------------------


def test_a_requester_with_an_idle_ttl_is_decided_while_its_request_lasts() -> None:
    want = replace(WANT, idle_ttl_s=300.0)
    assert _answers([], sm.Observed(True), want) == NO_ROOM_NEEDED


def test_a_request_whose_idle_ttl_has_ended_is_left_to_the_planner() -> None:
    """idle_ttl_s = 0: the request ends as it is made (the planner says what follows)."""
    assert _decide([], sm.Observed(True), replace(WANT, idle_ttl_s=0.0)) is None


def test_a_requester_whose_container_is_its_own_projects_is_decided() -> None:
    want = replace(WANT, compose_project="mine")
    exited = sm.ContainerObs(sm.ContainerState.EXITED, compose_project="mine")
    assert _answers([], sm.Observed(True, {"c-want": exited}), want) == NO_ROOM_NEEDED


def test_a_requester_whose_container_is_another_projects_is_left_to_the_planner() -> None:
    want = replace(WANT, compose_project="mine")
    exited = sm.ContainerObs(sm.ContainerState.EXITED, compose_project="theirs")
    assert _decide([], sm.Observed(True, {"c-want": exited}), want) is None


def test_a_requester_on_a_role_without_a_capacity_row_needs_no_room() -> None:
    """The ledger does not govern a serve on a role it has no row for: no shortfall."""
    want = replace(WANT, gpu_roles=("x",))
    evi = _evictable("evi", mib=9_000)
    assert _answers([evi], _running(evi), want) == NO_ROOM_NEEDED


def test_a_request_that_fits_exactly_needs_no_room() -> None:
    """6,000 MiB asked, 6,000 free: nothing to stop, and the elastic holder on the role
    (which could give memory back) is not weighed."""
    ela = replace(_evictable("ela", mib=4_000), elastic=sm.Elastic("http://ela", floor_mib=1_000))
    assert _answers([ela], _running(ela)) == NO_ROOM_NEEDED
    assert _decide([replace(ela, vram_mib=4_001)], _running(ela)) is None  # 1 MiB short


# ----- the running serves: conflicts and loads -----------------------------------------------


def test_an_exclusive_requester_does_not_conflict_with_a_serve_on_another_role() -> None:
    want = replace(WANT, exclusive=True)
    other = _evictable("other", ("h",))
    assert _answers([other], _running(other), want) == NO_ROOM_NEEDED
    on_g = _evictable("on-g")
    assert _decide([on_g], _running(on_g), want) is None  # the planner stops it first


def test_a_stopped_serve_keeps_no_requester_out() -> None:
    """An exclusive serve, or one on the requester's port, conflicts only while it runs
    or starts: stopped, it keeps nothing out."""
    stopped = sm.Observed(True, {"c-excl": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)})
    exclusive = replace(_evictable("excl"), exclusive=True)
    assert _answers([exclusive], stopped) == NO_ROOM_NEEDED
    same_port = replace(_evictable("excl"), port=8000)
    assert _answers([same_port], stopped, replace(WANT, port=8000)) == NO_ROOM_NEEDED


def test_a_requester_conflicts_with_a_serve_on_its_port_on_any_role() -> None:
    want = replace(WANT, port=8000)
    other = replace(_evictable("other", ("h",)), port=8000)
    assert _decide([other], _running(other), want) is None
    elsewhere = replace(other, port=8001)
    assert _answers([elsewhere], _running(elsewhere), want) == NO_ROOM_NEEDED


def test_a_free_sized_requester_waits_only_for_a_free_sized_start() -> None:
    """An engine that sizes itself from free memory is serialised only behind another
    such engine still loading on one of its roles: a running, healthy peer of any kind
    does not hold it."""
    want = replace(WANT, sizes_from_free=True)
    plain = _evictable("plain", mib=2_000)
    assert _answers([plain], _running(plain), want) == NO_ROOM_NEEDED
    sized = replace(plain, sizes_from_free=True)
    assert _answers([sized], _running(sized), want) == NO_ROOM_NEEDED
    loading = sm.ContainerObs(sm.ContainerState.RUNNING, health="starting", started_at=NOW - 5)
    assert _decide([sized], _running(sized, obs=loading), want) is None
    # a start in progress whose container holds nothing yet loads all the same
    begun = sm.Observed(True, starting={"plain": sm.StartingObs(("g",), 2_000)})
    assert _decide([sized], begun, want) is None
    assert _answers([plain], _running(plain, obs=loading), want) == NO_ROOM_NEEDED
    # a requester that does not size itself from free memory never waits for one that does
    assert _answers([sized], _running(sized, obs=loading)) == NO_ROOM_NEEDED
    # a loading serve with a port (so weighed for its conflicts) that does not size
    # itself from free memory holds nothing back either
    ported = replace(plain, port=8001)
    assert _answers([ported], _running(ported, obs=loading), want) == NO_ROOM_NEEDED
    # nor does a peer of that kind loading on another GPU
    on_h = replace(sized, gpu_roles=("h",))
    assert _answers([on_h], _running(on_h, obs=loading), want) == NO_ROOM_NEEDED


# ----- the candidates ------------------------------------------------------------------------


def test_only_holders_on_a_short_role_are_weighed() -> None:
    """Short on g only: the elastic serve on h (which could give memory back) is no
    candidate, so the decision stands (a holder on g that could give back is left to
    the planner)."""
    evi = _evictable("evi")
    ela = replace(_evictable("ela", ("h",)), elastic=sm.Elastic("http://ela", floor_mib=1_000))
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


def test_a_serve_on_both_short_roles_is_weighed_once() -> None:
    """Short on g and on h, with one holder on both: it is one candidate, never counted
    twice (twice it would cover both roles alone and be the best "set")."""
    want = replace(WANT, gpu_roles=("g", "h"), vram_mib=5_000)
    both = _evictable("x", ("g", "h"), mib=2_500)
    on_g, on_h = _evictable("y", ("g",), mib=6_000), _evictable("z", ("h",), mib=5_000)
    serves = [both, on_g, on_h]
    assert _answers(serves, _running(*serves), want) == Decision(("x", "y"))


def test_an_exited_serve_whose_memory_is_not_back_is_no_victim() -> None:
    """A serve whose container exited but whose memory is still counted holds it,
    protected (the planner lists it as exited): the victim is a serve that runs, even
    where the exited one would be the better fit."""
    gone, other = _evictable("gone", mib=3_000), _evictable("other", mib=4_000)
    exited = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)
    observed = sm.Observed(
        True, {"c-gone": exited, "c-other": RUNNING}, unreleased=frozenset({"gone"})
    )
    assert _answers([gone, other], observed) == Decision(("other",))


def test_a_container_of_another_project_is_never_a_victim() -> None:
    """A serve whose container is another Compose project's holds its memory, protected:
    with nothing else to stop the planner says what blocks; its own project's container
    is stopped."""
    evi = replace(_evictable("evi"), compose_project="mine")
    theirs = sm.ContainerObs(
        sm.ContainerState.RUNNING, started_at=NOW - 900, compose_project="theirs"
    )
    assert _decide([evi], _running(evi, obs=theirs)) is None
    ours = replace(theirs, compose_project="mine")
    assert _answers([evi], _running(evi, obs=ours)) == Decision(("evi",))
    # declared before another victim: that one is still weighed (and stopped)
    small, other = replace(evi, vram_mib=3_000), _evictable("other", mib=4_000)
    observed = sm.Observed(True, {"c-evi": theirs, "c-other": RUNNING})
    want = replace(WANT, vram_mib=4_000)  # short 1,000: only "other" can give it
    assert _answers([small, other], observed, want) == Decision(("other",))


def test_a_victim_inside_its_min_runtime_is_protected() -> None:
    """min_runtime_s protects a serve only while it lasts: 1 s protects a start 0.5 s
    old; 60 s no longer protects one started 900 s ago; 0 protects nothing."""
    young = replace(_evictable("evi"), min_runtime_s=1.0)
    just_started = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=NOW - 0.5)
    assert _decide([young], _running(young, obs=just_started)) is None
    old = replace(young, min_runtime_s=60.0)
    assert _answers([old], _running(old)) == Decision(("evi",))
    assert _decide([old], _running(old, obs=just_started)) is None
    # declared before another victim: that one is still weighed (and stopped)
    small, other = replace(young, vram_mib=3_000), _evictable("other", mib=4_000)
    observed = sm.Observed(True, {"c-evi": just_started, "c-other": RUNNING})
    want = replace(WANT, vram_mib=4_000)  # short 1,000: only "other" can give it
    assert _answers([small, other], observed, want) == Decision(("other",))
    unprotected = replace(young, min_runtime_s=0.0)
    assert _answers([unprotected], _running(unprotected, obs=just_started)) == Decision(("evi",))


def test_a_victim_that_could_sleep_instead_is_left_to_the_planner() -> None:
    """The planner weighs a sleep against the stop; where the serve may not sleep (its
    engine refused it: policy.no_sleep) it is a plain victim."""
    sleeper = replace(_evictable("evi"), sleep=sm.Sleep(2, 1_000, SleepProtocol.VLLM))
    assert _decide([sleeper], _running(sleeper)) is None
    no_sleep = Policy(no_sleep=frozenset({"evi"}))
    assert _answers([sleeper], _running(sleeper), policy=no_sleep) == Decision(("evi",))
    # asleep it would still hold all it holds: nothing to weigh, it is stopped
    no_gain = replace(sleeper, sleep=sm.Sleep(2, 5_000, SleepProtocol.VLLM))
    assert _answers([no_gain], _running(no_gain)) == Decision(("evi",))


def test_an_asleep_victim_is_stopped_without_a_drain() -> None:
    """A sleeper's residual in the way is stopped; its router tier is not drained (it
    serves nothing while asleep)."""
    sleeper = replace(
        _evictable("evi"), router_tier="t", sleep=sm.Sleep(2, 1_000, SleepProtocol.VLLM)
    )
    observed = replace(_running(sleeper), sleep={"evi": sm.SleepObs(sm.SleepState.ASLEEP, level=2)})
    want = replace(WANT, vram_mib=9_500)  # 9,000 free beside the residual
    assert _answers([sleeper], observed, want) == Decision(("evi",), ())
    awake = replace(observed, sleep={"evi": sm.SleepObs(sm.SleepState.AWAKE)})
    no_sleep = Policy(no_sleep=frozenset({"evi"}))
    assert _answers([sleeper], awake, want, no_sleep) == Decision(("evi",), ("evi",))
    # elastic too, asleep it gives nothing back (its cache is not mapped): still stopped
    elastic = replace(sleeper, elastic=sm.Elastic("http://evi", 100, None, 100))
    assert _answers([elastic], observed, want) == Decision(("evi",), ())


def _elastic(floor_mib: int, segment_mib: int = 512) -> sm.ServeSpec:
    """An elastic victim holding 5,000 MiB on g (WANT is 1,000 short there)."""
    return replace(
        _evictable("evi"), elastic=sm.Elastic("http://evi", floor_mib, None, segment_mib)
    )


def test_a_victim_that_could_give_a_whole_segment_back_is_left_to_the_planner() -> None:
    """The planner shrinks an elastic victim that can give back at least one whole
    segment above its floor; one that cannot is a plain victim (stopped)."""
    for floor, segment in [(1_000, 512), (4_488, 512), (4_999, 1), (4_999, 0)]:
        ela = _elastic(floor, segment)  # 4,000, one, one, one segment(s) (0 reads as 1 MiB)
        assert _decide([ela], _running(ela)) is None, (floor, segment)
    for floor in (4_489, 4_700, 5_000):  # less than a segment above the floor, or none
        ela = _elastic(floor)
        assert _answers([ela], _running(ela)) == Decision(("evi",)), floor


def test_a_victim_whose_last_shrink_failed_is_a_plain_victim() -> None:
    ela = _elastic(1_000)
    no_shrink = Policy(no_shrink=frozenset({"evi"}))
    assert _answers([ela], _running(ela), policy=no_shrink) == Decision(("evi",))


def test_a_running_serve_outside_the_ledger_is_no_victim_and_hides_none() -> None:
    """A container on g whose serve declares no reservation holds nothing the ledger
    counts: it is no victim, and the holder declared after it still is."""
    proxy = sm.ServeSpec("proxy", "c-proxy", ("g",), None, sm.Residency.EVICTABLE)
    evi = _evictable("evi")
    assert _answers([proxy, evi], _running(proxy, evi)) == Decision(("evi",))


def test_a_requester_whose_start_is_in_progress_is_left_to_the_planner() -> None:
    """A start in progress is the planner's (it plans nothing for it until it ends),
    even for a requester the ledger does not hold (on a role without a capacity row)."""
    want = replace(WANT, gpu_roles=("x",))
    begun = sm.Observed(True, starting={"want": sm.StartingObs(("x",), 6_000)})
    assert _decide([], begun, want) is None
    assert _answers([], sm.Observed(True), want) == NO_ROOM_NEEDED  # not starting: decided


def test_a_placed_serve_held_on_another_card_is_no_candidate() -> None:
    """A placed serve declared on the short role but running (and counted) on its other
    candidate card holds nothing there: it is not weighed, so that it could give memory
    back does not stop the decision; the holder on the short role is stopped."""
    placed = replace(
        _evictable("ela", ("g", "h")),
        placement=("g", "h"),
        elastic=sm.Elastic("http://ela", floor_mib=1_000),
    )
    evi = _evictable("evi")
    observed = replace(
        _running(placed, evi), started_with={"c-ela": sm.StartedWith("ela", ("h",), 5_000)}
    )
    assert _answers([placed, evi], observed) == Decision(("evi",))


# ----- a serve held back by its backoff ------------------------------------------------------


def test_only_a_resident_the_manifest_keeps_running_keeps_its_room_in_backoff() -> None:
    """A resident desired running, in backoff and holding nothing, keeps its room: the
    shortcut leaves that to the planner. An evictable serve, or a resident the manifest
    does not keep running, keeps none: the shortcut decides (docs/eviction.md)."""
    policy = Policy(hold={"back": "failure backoff"})
    resident = sm.ServeSpec(
        "back", "c-back", ("g",), 6_000, sm.Residency.RESIDENT, desired=sm.DesiredRun.RUNNING
    )
    assert _decide([resident], sm.Observed(True), policy=policy) is None
    for keeps_none in (
        replace(resident, residency=sm.Residency.EVICTABLE),
        replace(resident, desired=None),
    ):
        assert _answers([keeps_none], sm.Observed(True), policy=policy) == NO_ROOM_NEEDED
    # one that keeps its room on another card keeps none on the requester's
    on_h = replace(resident, gpu_roles=("h",))
    assert _decide([on_h], sm.Observed(True), policy=policy) == NO_ROOM_NEEDED


def test_a_resident_in_backoff_whose_container_holds_memory_keeps_no_room_of_its_own() -> None:
    """The room kept for a resident in backoff is for one whose container holds nothing:
    one whose container runs is counted at what it holds already, so nothing more is
    kept for it and the shortcut decides (docs/eviction.md)."""
    policy = Policy(hold={"back": "failure backoff"})
    resident = sm.ServeSpec(
        "back", "c-back", ("g",), 3_000, sm.Residency.RESIDENT, desired=sm.DesiredRun.RUNNING
    )
    assert _answers([resident], _running(resident), policy=policy) == NO_ROOM_NEEDED


def test_a_victim_is_weighed_at_its_cold_start_not_its_wake() -> None:
    """A serve the shortcut would stop comes back by a cold start: of two that each
    cover, the cheaper cold start is stopped, whatever their wakes cost."""
    x, y = _evictable("x"), _evictable("y")
    policy = Policy(reload={"x": RestoreCost(10.0, 500.0), "y": RestoreCost(100.0, 1.0)})
    want = replace(WANT, vram_mib=5_000)
    assert _answers([x, y], _running(x, y), want, policy) == Decision(("x",), ())


def test_a_placed_requester_already_on_a_card_is_decided_there() -> None:
    """Once placement has put it on g (fit places it first, as the loop does), the
    shortcut decides for that card as for a pinned serve."""
    want = replace(WANT, placement=("g", "h"))
    evi = _evictable("evi")
    assert _answers([evi], _running(evi), want) == Decision(("evi",))
