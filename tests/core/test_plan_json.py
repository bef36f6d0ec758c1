"""statemachine.planning.plan_types's JSON forms: the policy a journal records, read back for a
replay.

``Policy.from_json`` reads what the journal recorded with each cycle (controller/tools/
replay.py plans with it again): a malformed record must be refused with a ``ValueError``
that names the field and the value, never read as some other policy, and never crash
with another exception. Pure: imports statemachine only.
"""

from __future__ import annotations

import pytest

from statemachine.domain.types import GpuRole, HostBudget
from statemachine.ledger.reservations import Ledger
from statemachine.planning.plan_types import Action, Plan, Policy, Step
from statemachine.planning.victims import DEFAULT_EXACT_LIMIT


def test_an_absent_field_reads_as_the_default_policy() -> None:
    assert Policy.from_json({}) == Policy()
    assert Policy().exact_search_limit == DEFAULT_EXACT_LIMIT


@pytest.mark.parametrize("limit", [0, 1, 7])
def test_an_exact_search_limit_of_zero_or_more_is_taken_as_recorded(limit: int) -> None:
    assert Policy.from_json({"exact_search_limit": limit}).exact_search_limit == limit


@pytest.mark.parametrize("limit", [-1, -2, "5", 2.0, True, None])
def test_an_exact_search_limit_that_is_not_a_count_is_refused_naming_it(limit: object) -> None:
    with pytest.raises(ValueError, match=r"exact_search_limit: expected a count, got ") as err:
        Policy.from_json({"exact_search_limit": limit})
    assert repr(limit) in str(err.value)


@pytest.mark.parametrize("field", ["no_shrink", "no_sleep"])
@pytest.mark.parametrize("names", ["moe", ("moe",), [1], ["moe", None]])
def test_a_name_list_that_is_not_a_list_of_names_is_refused(field: str, names: object) -> None:
    with pytest.raises(ValueError, match=rf"{field}: expected a list of names"):
        Policy.from_json({field: names})


@pytest.mark.parametrize(
    "hold", [["llm"], "llm", {"llm": 3}, {3: "backoff"}, {"llm": None}, {"a": "x", "b": 1}]
)
def test_a_hold_that_is_not_names_with_reasons_is_refused(hold: object) -> None:
    with pytest.raises(ValueError, match=r"hold: expected names with reasons"):
        Policy.from_json({"hold": hold})


def test_a_recorded_policy_reads_back_as_itself() -> None:
    policy = Policy(
        exact_search_limit=0,
        no_shrink=frozenset({"moe"}),
        hold={"llm": "backing off after 3 failed starts"},
        no_sleep=frozenset({"coder"}),
    )
    assert Policy.from_json(policy.to_json()) == policy


def _plan(host: HostBudget | None, *, unknown: bool = False) -> Plan:
    roles = {"gpu0": GpuRole(id="gpu0", capacity_mib=80_000, reserve_mib=1_000)}
    before = Ledger(roles, unknown=unknown, host=host, host_holdings={"coder": 6_000})
    return Plan(steps=(), blocked=(), ledger_before=before, ledger_after=before)


def test_a_plan_with_a_host_budget_shows_the_host_ledger_before_and_after() -> None:
    out = _plan(HostBudget(ram_mib=64_000, reserve_mib=8_000)).to_json()
    line = {
        "ram_mib": 64_000,
        "reserve_mib": 8_000,
        "budget_mib": 56_000,
        "committed_mib": 6_000,
        "free_mib": 50_000,
        "reservations": [{"serve": "coder", "mib": 6_000}],
    }
    assert out["host_ledger_before"] == line
    assert out["host_ledger_after"] == line


def test_an_unknown_host_ledger_prints_unknown_not_zero() -> None:
    out = _plan(HostBudget(ram_mib=64_000), unknown=True).to_json()
    assert out["host_ledger_before"]["committed_mib"] is None
    assert out["host_ledger_before"]["free_mib"] is None
    assert out["host_ledger_after"]["budget_mib"] == 64_000


def test_a_plan_without_a_host_budget_has_no_host_ledger() -> None:
    out = _plan(None).to_json()
    assert "host_ledger_before" not in out
    assert "host_ledger_after" not in out
    assert out["ledger_before"]["gpu0"]["budget_mib"] == 79_000


# ---- a step read back from a saved plan (`vramctl apply PLAN`) ----------------------


def _step_json(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "action": "shrink",
        "serve": "el",
        "gpu_roles": ["g0"],
        "mib": 2000,
        "reason": "make room",
        "to_mib": 6000,
        "group": "q",
    }
    return {k: v for k, v in {**base, **over}.items() if v is not _ABSENT}


_ABSENT = object()


def test_every_step_the_planner_writes_reads_back_equal() -> None:
    steps = [
        Step(Action.SHRINK, "el", ("g0",), 2000, "make room", to_mib=6000, group="q"),
        Step(Action.RESERVE, "q", ("g0", "g1"), 900, "start q", group="q"),
        Step(Action.RESERVE_WAKE, "s", ("g0",), None, "outside the ledger", group="s"),
        Step(Action.RELEASE_TO_RESIDUAL, "s", ("g0",), 500, "down", to_mib=100, host_mib=64),
        Step(Action.STOP, "old", ("g0",), None, "stop old", group="q"),
    ]
    assert [Step.from_json(s.to_json()) for s in steps] == steps


def test_a_step_without_a_group_is_its_own_serves() -> None:
    assert Step.from_json(_step_json(group=_ABSENT)).group == "el"


@pytest.mark.parametrize("action", ["shrink", "grow", "release_to_residual"])
def test_a_resize_without_the_figure_it_resizes_to_is_refused(action: str) -> None:
    """The ledger and the executor need ``to_mib``: a step without it would pass the
    ledger's check as moving nothing and then fail on the host."""
    with pytest.raises(ValueError, match=f"{action} el: to_mib: required"):
        Step.from_json(_step_json(action=action, to_mib=_ABSENT))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("action", "teleport"),
        ("serve", 7),
        ("serve", _ABSENT),
        ("gpu_roles", "g0"),
        ("gpu_roles", [0]),
        ("mib", "2000"),
        ("mib", -1),
        ("mib", True),
        ("to_mib", 6000.5),
        ("host_mib", -64),
        ("reason", None),
        ("group", 3),
    ],
)
def test_a_malformed_field_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field}:"):
        Step.from_json(_step_json(**{field: value}))


def test_a_step_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="expected an object, got list"):
        Step.from_json(["shrink", "el"])


def test_zero_mib_is_a_figure_not_a_malformed_field() -> None:
    """A wake that needs nothing more moves 0 MiB: read back as 0, not refused."""
    step = Step.from_json(_step_json(action="reserve_wake", mib=0, to_mib=4000, host_mib=0))
    assert (step.mib, step.to_mib, step.host_mib) == (0, 4000, 0)
