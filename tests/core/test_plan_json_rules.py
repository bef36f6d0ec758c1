"""The policy's JSON form (``statemachine.planning.plan_types.Policy``) and a candidate's terms.

Written from ``Policy.to_json`` / ``Policy.from_json`` (the journal records the policy
with each cycle; ``vramctl replay`` plans again from it, docs/design.md §5): a policy
comes back from its JSON equal, ``last_used`` included; every malformed field is
refused with a ``ValueError`` that names it (never another exception, never a policy
built from it); seconds are numbers that are not negative, and a bool is not one. A
candidate's terms are equal when their JSON is: the blocked reason they carry is not
in the JSON, nor in their equality (as ``Plan.room``). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import pytest

from statemachine.planning.plan_types import CandidateTerms, Policy, RestoreCost

# --- a policy comes back from its JSON --------------------------------------------


def test_a_policy_with_last_used_comes_back_from_its_json_equal() -> None:
    policy = Policy(
        no_shrink=frozenset({"llm"}),
        reload={"llm": RestoreCost(cold_s=40.0, wake_s=2.0)},
        last_used={"llm": 1_000.5, "stt": 0.0},
    )
    out = policy.to_json()
    assert out["last_used"] == {"llm": 1_000.5, "stt": 0.0}
    assert Policy.from_json(out) == policy


def test_a_policy_without_last_used_has_none_in_its_json() -> None:
    # older records have none: the key is written only when there are some
    assert "last_used" not in Policy().to_json()
    assert Policy.from_json(Policy().to_json()) == Policy()


@pytest.mark.parametrize("used", [0, 0.0, 12, 1.5e9])
def test_last_used_takes_any_time_that_is_not_negative_zero_included(used: float) -> None:
    assert Policy.from_json({"last_used": {"llm": used}}).last_used == {"llm": float(used)}


@pytest.mark.parametrize("cold", [0, 0.0, 3, 40.5])
def test_a_reload_cost_takes_any_seconds_that_are_not_negative_zero_included(
    cold: float,
) -> None:
    policy = Policy.from_json({"reload": {"llm": {"cold_s": cold, "wake_s": None}}})
    assert policy.reload == {"llm": RestoreCost(cold_s=float(cold), wake_s=None)}


# --- each malformed field is refused, named ---------------------------------------


@pytest.mark.parametrize("data", [[], "policy", 3, None])
def test_a_policy_that_is_not_an_object_is_refused(data: object) -> None:
    with pytest.raises(ValueError, match=r"^policy: expected an object"):
        Policy.from_json(data)


@pytest.mark.parametrize("reload", [[], ["llm"], "llm", 3])
def test_reload_that_is_not_an_object_is_refused_named(reload: object) -> None:
    with pytest.raises(ValueError, match=r"^policy: reload: expected serves with costs"):
        Policy.from_json({"reload": reload})


@pytest.mark.parametrize("cost", [[], [40.0, 2.0], 40.0, "40"])
def test_a_serve_s_reload_cost_that_is_not_an_object_is_refused_naming_the_serve(
    cost: object,
) -> None:
    with pytest.raises(ValueError, match=r"^policy: reload: llm: expected an object"):
        Policy.from_json({"reload": {"llm": cost}})


@pytest.mark.parametrize("key", ["cold_s", "wake_s"])
@pytest.mark.parametrize("value", [-1, -0.5, True, False, "40", [40]])
def test_reload_seconds_that_are_negative_a_bool_or_not_a_number_are_refused_named(
    key: str, value: object
) -> None:
    with pytest.raises(ValueError, match=rf"^policy: reload: llm: {key}: expected seconds"):
        Policy.from_json({"reload": {"llm": {key: value}}})


@pytest.mark.parametrize("last_used", [[], [["llm", 5.0]], "llm", 5.0])
def test_last_used_that_is_not_an_object_is_refused_named(last_used: object) -> None:
    with pytest.raises(ValueError, match=r"^policy: last_used: expected serves with times"):
        Policy.from_json({"last_used": last_used})


@pytest.mark.parametrize("used", [-1, -0.5, True, False, "5", None, [5.0]])
def test_a_last_used_time_that_is_negative_a_bool_or_not_a_number_is_refused_named(
    used: object,
) -> None:
    with pytest.raises(ValueError, match=r"^policy: last_used: expected serves with times"):
        Policy.from_json({"last_used": {"llm": 5.0, "stt": used}})


def test_a_last_used_serve_that_is_not_a_name_is_refused_named() -> None:
    # from_json takes any mapping (not only parsed JSON, whose keys are strings)
    with pytest.raises(ValueError, match=r"^policy: last_used: expected serves with times"):
        Policy.from_json({"last_used": {3: 5.0}})


# --- a candidate's equality is its JSON's -----------------------------------------


def _terms(**kw: Any) -> CandidateTerms:
    return CandidateTerms("a", 30_000, 25_000, 5_000, 8_000, starts=False, **kw)


def test_candidate_terms_that_differ_only_by_their_blocked_reason_are_equal() -> None:
    why = "a: needs 8000 MiB, 5000 free; nothing evictable"
    with_reason, without = _terms(blocked=why), _terms()
    assert with_reason.to_json() == without.to_json()
    assert with_reason == without
    assert hash(with_reason) == hash(without)
    # a figure of the JSON does count
    assert _terms(stops=1) != without
