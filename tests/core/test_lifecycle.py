"""Tests for the per-serve lifecycle machine (``statemachine.lifecycle.machine``).

The expected transition table below is written out by hand, independently of the
module's data, so that a change to the data has to be made here too, on purpose.
"""

from __future__ import annotations

import importlib.util
import pickle
from collections import deque
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from statemachine.lifecycle.machine import (
    HOLDING_STATES,
    STATES,
    TRANSITIONS,
    TRIGGERS,
    IllegalTransition,
    LifecycleState,
    ServeLifecycle,
    allowed_triggers,
    holds_reservation,
    lifecycle_machine,
    lifecycle_markdown,
    mermaid_diagram,
    next_state,
)

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "lifecycle.md"
REGENERATE = ".venv/bin/python docs/gen_lifecycle.py"

S = LifecycleState

#: (source, trigger, dest): every legal transition, by hand.
LEGAL: list[tuple[LifecycleState, str, LifecycleState]] = [
    (S.STOPPED, "reserve", S.RESERVED),
    (S.STOPPED, "observe_running", S.RUNNING),
    (S.RESERVED, "abandon", S.STOPPED),
    (S.RESERVED, "start", S.STARTING),
    (S.RESERVED, "start_failed", S.FAILED),
    (S.RESERVED, "fail", S.FAILED),
    (S.STARTING, "ready", S.RUNNING),
    (S.STARTING, "start_failed", S.FAILED),
    (S.STARTING, "stop", S.STOPPING),
    (S.STARTING, "fail", S.FAILED),
    (S.RUNNING, "shrink", S.RUNNING),
    (S.RUNNING, "grow", S.RUNNING),
    (S.RUNNING, "quiesce", S.QUIESCING),
    (S.RUNNING, "stop", S.STOPPING),
    (S.RUNNING, "fail", S.FAILED),
    (S.RUNNING, "observe_stopped", S.STOPPED),
    (S.QUIESCING, "drain", S.DRAINING),
    (S.QUIESCING, "readmit", S.RUNNING),
    (S.QUIESCING, "stop", S.STOPPING),
    (S.QUIESCING, "fail", S.FAILED),
    (S.QUIESCING, "observe_stopped", S.STOPPED),
    (S.DRAINING, "readmit", S.RUNNING),
    (S.DRAINING, "stop", S.STOPPING),
    (S.DRAINING, "fail", S.FAILED),
    (S.DRAINING, "observe_stopped", S.STOPPED),
    (S.STOPPING, "stopped", S.STOPPED),
    (S.STOPPING, "stop_failed", S.FAILED),
    (S.STOPPING, "fail", S.FAILED),
    (S.FAILED, "stop", S.STOPPING),
    (S.FAILED, "fail", S.FAILED),
    (S.FAILED, "reset", S.STOPPED),
    (S.FAILED, "recover", S.RUNNING),
    # sleep instead of stop
    (S.RUNNING, "sleep", S.SLEEPING),
    (S.DRAINING, "sleep", S.SLEEPING),
    (S.RUNNING, "observe_asleep", S.ASLEEP),
    (S.SLEEPING, "slept", S.ASLEEP),
    (S.SLEEPING, "stop", S.STOPPING),
    (S.SLEEPING, "fail", S.FAILED),
    (S.ASLEEP, "reserve_wake", S.WAKING),
    (S.ASLEEP, "stop", S.STOPPING),
    (S.ASLEEP, "fail", S.FAILED),
    (S.ASLEEP, "observe_awake", S.RUNNING),
    (S.ASLEEP, "observe_stopped", S.STOPPED),
    (S.WAKING, "wake", S.WAKING),
    (S.WAKING, "reload", S.WAKING),
    (S.WAKING, "ready", S.RUNNING),
    (S.WAKING, "wake_failed", S.FAILED),
    (S.WAKING, "fail", S.FAILED),
]
LEGAL_PAIRS = {(src, trigger) for src, trigger, _ in LEGAL}
ILLEGAL: list[tuple[LifecycleState, str]] = [
    (state, trigger)
    for state in LifecycleState
    for trigger in TRIGGERS
    if (state, trigger) not in LEGAL_PAIRS
]


def _ids(case: tuple[object, ...]) -> str:
    return "-".join(str(part) for part in case)


# -- the data -------------------------------------------------------------------------


def test_data_declares_exactly_the_expected_table() -> None:
    declared = {
        (src, spec["trigger"], spec["dest"]) for spec in TRANSITIONS for src in spec["source"]
    }
    assert declared == set(LEGAL)
    assert len(LEGAL) == len(set(LEGAL_PAIRS)), "the hand-written table repeats a pair"


def test_states_data_matches_the_enum_and_is_documented() -> None:
    assert [spec["name"] for spec in STATES] == list(LifecycleState)
    assert all(spec["doc"].strip() for spec in STATES)
    assert all(spec["doc"].strip() for spec in TRANSITIONS)


def test_triggers_are_every_declared_trigger_in_order() -> None:
    assert tuple(dict.fromkeys(spec["trigger"] for spec in TRANSITIONS)) == TRIGGERS


def test_every_state_is_reachable_from_stopped_and_can_get_back_to_stopped() -> None:
    def reachable(start: LifecycleState, edges: list[tuple[str, str]]) -> set[str]:
        seen, queue = {start.value}, deque([start.value])
        while queue:
            here = queue.popleft()
            for a, b in edges:
                if a == here and b not in seen:
                    seen.add(b)
                    queue.append(b)
        return seen

    forward = [(src.value, dest.value) for src, _, dest in LEGAL]
    backward = [(b, a) for a, b in forward]
    everything = {s.value for s in LifecycleState}
    assert reachable(S.STOPPED, forward) == everything
    assert reachable(S.STOPPED, backward) == everything, "some state cannot return to stopped"


# -- legal and illegal transitions ----------------------------------------------------


@pytest.mark.parametrize(("source", "trigger", "dest"), LEGAL, ids=[_ids(c) for c in LEGAL])
def test_legal_transition(source: LifecycleState, trigger: str, dest: LifecycleState) -> None:
    lc = ServeLifecycle("omni", initial=source)
    assert lc.can(trigger)
    assert trigger in lc.allowed()
    assert lc.fire(trigger) == dest
    assert lc.state == dest
    assert isinstance(lc.state, LifecycleState)
    assert next_state(source, trigger) == dest


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL, ids=[_ids(c) for c in ILLEGAL])
def test_illegal_transition_is_rejected(state: LifecycleState, trigger: str) -> None:
    lc = ServeLifecycle("omni", initial=state)
    assert not lc.can(trigger)
    assert trigger not in lc.allowed()
    with pytest.raises(IllegalTransition) as info:
        lc.fire(trigger)
    assert lc.state == state, "a rejected trigger must not move the machine"
    assert next_state(state, trigger) is None
    err = info.value
    assert (err.serve, err.state, err.trigger) == ("omni", state.value, trigger)
    assert err.allowed == lc.allowed()
    assert str(err).startswith(f'serve "omni": cannot "{trigger}" while "{state}" (allowed: ')


def test_cross_product_is_covered() -> None:
    assert len(LEGAL) + len(ILLEGAL) == len(LifecycleState) * len(TRIGGERS)


def test_illegal_transition_message() -> None:
    with pytest.raises(IllegalTransition) as info:
        ServeLifecycle("omni").fire("start")
    assert str(info.value) == (
        'serve "omni": cannot "start" while "stopped" (allowed: reserve, observe_running)'
    )


def test_illegal_transition_pickles() -> None:
    err = IllegalTransition("omni", "stopped", "start")
    clone = pickle.loads(pickle.dumps(err))
    assert str(clone) == str(err)
    assert clone.allowed == err.allowed


def test_illegal_transition_from_a_state_no_machine_knows_allows_none() -> None:
    """A refusal from a state that is not a lifecycle state lists no allowed trigger,
    and says so in words rather than leaving the list empty."""
    err = IllegalTransition("omni", "bogus", "start")
    assert err.allowed == ()
    assert str(err) == 'serve "omni": cannot "start" while "bogus" (allowed: none)'


def test_unknown_trigger_is_rejected_with_our_exception() -> None:
    lc = ServeLifecycle("omni")
    with pytest.raises(IllegalTransition, match=r'unknown trigger "bogus" while "stopped"'):
        lc.fire("bogus")
    assert lc.state == S.STOPPED
    assert not lc.can("bogus")
    assert next_state("stopped", "bogus") is None


def test_auto_transitions_are_off() -> None:
    machine = lifecycle_machine()
    assert machine.auto_transitions is False
    assert not any(name.startswith("to_") for name in machine.events)
    assert set(machine.events) == set(TRIGGERS)
    lc = ServeLifecycle("omni")
    assert not hasattr(lc, "to_running")
    with pytest.raises(IllegalTransition):
        lc.fire("to_running")
    assert lc.state == S.STOPPED


def test_allowed_agrees_with_the_library() -> None:
    machine = lifecycle_machine()
    for state in LifecycleState:
        assert set(allowed_triggers(state)) == set(machine.get_triggers(state.value))
        assert ServeLifecycle("x", initial=state).allowed() == allowed_triggers(state)


def test_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match='unknown lifecycle state "paused"'):
        ServeLifecycle("omni", initial="paused")
    assert allowed_triggers("paused") == ()
    assert next_state("paused", "reserve") is None


def test_initial_state_accepts_plain_strings() -> None:
    lc = ServeLifecycle("omni", initial="running")
    assert lc.state is S.RUNNING
    assert lc.serve == "omni"
    assert repr(lc) == "ServeLifecycle('omni', state='running')"


def test_serves_share_one_machine_and_do_not_register_with_it() -> None:
    machine = lifecycle_machine()
    before = list(machine.models)
    serves = [ServeLifecycle(f"s{i}") for i in range(50)]
    for lc in serves:
        lc.fire("reserve")
    assert lifecycle_machine() is machine
    assert machine.models == before
    a, b = ServeLifecycle("a"), ServeLifecycle("b")
    a.fire("reserve")
    assert b.state == S.STOPPED, "serves must not share state"


def test_a_full_eviction_cycle() -> None:
    lc = ServeLifecycle("victim", initial="running")
    for trigger, state in [
        ("quiesce", S.QUIESCING),
        ("drain", S.DRAINING),
        ("stop", S.STOPPING),
        ("stopped", S.STOPPED),
        ("reserve", S.RESERVED),
        ("start", S.STARTING),
        ("ready", S.RUNNING),
    ]:
        assert lc.fire(trigger) == state


# -- reservations ---------------------------------------------------------------------

HOLDS = {
    S.STOPPED: False,
    S.RESERVED: True,
    S.STARTING: True,
    S.RUNNING: True,
    S.QUIESCING: True,
    S.DRAINING: True,
    S.STOPPING: True,
    S.FAILED: False,
}


@pytest.mark.parametrize(("state", "holds"), HOLDS.items(), ids=[str(s) for s in HOLDS])
def test_holds_reservation(state: LifecycleState, holds: bool) -> None:
    assert holds_reservation(state) is holds
    assert holds_reservation(state.value) is holds
    assert (state in HOLDING_STATES) is holds


def test_holds_reservation_refuses_unknown_states() -> None:
    with pytest.raises(ValueError):
        holds_reservation("paused")


# -- property: the library machine agrees with the data -------------------------------

TRIGGER_OR_JUNK = st.sampled_from((*TRIGGERS, "to_running", "to_stopped", "bogus", ""))


@given(
    initial=st.sampled_from(list(LifecycleState)),
    triggers=st.lists(TRIGGER_OR_JUNK, max_size=60),
)
def test_random_trigger_sequences_agree_with_next_state(
    initial: LifecycleState, triggers: list[str]
) -> None:
    lc = ServeLifecycle("prop", initial=initial)
    for trigger in triggers:
        before = lc.state
        expected = next_state(before, trigger)
        event("a legal move" if expected is not None else "an illegal move refused")
        assert lc.can(trigger) is (expected is not None)
        if expected is None:
            with pytest.raises(IllegalTransition):
                lc.fire(trigger)
            assert lc.state == before
        else:
            assert lc.fire(trigger) == expected
        assert lc.state in set(LifecycleState)
        assert lc.allowed() == allowed_triggers(lc.state)


# -- documentation --------------------------------------------------------------------


def test_mermaid_diagram_has_every_state_and_edge() -> None:
    text = mermaid_diagram()
    assert "stateDiagram-v2" in text
    assert "title: vramctl serve lifecycle" in text
    assert "[*] --> stopped" in text
    for state in LifecycleState:
        assert f'state "{state}" as {state}' in text
    edges = {line.strip().split(":")[0] for line in text.splitlines() if "-->" in line}
    for src, _, dest in LEGAL:
        assert f"{src} --> {dest}" in edges
    assert all(line == line.rstrip() for line in text.splitlines())


def test_markdown_lists_every_state_and_transition() -> None:
    text = lifecycle_markdown()
    assert "Do not edit" in text
    assert "```mermaid\n" in text
    for spec in STATES:
        assert f"**`{spec['name']}`**" in text
    for tspec in TRANSITIONS:
        assert f"| `{tspec['trigger']}` |" in text


def test_docs_lifecycle_md_is_up_to_date() -> None:
    assert DOC.exists(), f"{DOC} is missing; generate it with: {REGENERATE}"
    assert DOC.read_text(encoding="utf-8") == lifecycle_markdown(), (
        f"docs/lifecycle.md is out of date with statemachine/lifecycle/machine.py; "
        f"regenerate it with: {REGENERATE}"
    )


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_lifecycle", REPO / "docs" / "gen_lifecycle.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generator_writes_and_checks(tmp_path: Path) -> None:
    gen = _generator()
    target = tmp_path / "lifecycle.md"
    assert gen.main(["--check"], target=target) == 1
    assert gen.main([], target=target) == 0
    assert target.read_text(encoding="utf-8") == lifecycle_markdown()
    assert gen.main(["--check"], target=target) == 0
    assert gen.main(["--check"]) == 0, f"docs/lifecycle.md is stale; run: {REGENERATE}"


# -- the data's own checks ------------------------------------------------------------


def test_states_declared_twice_or_missing_are_refused() -> None:
    from statemachine.lifecycle.machine import _index

    twice = (*STATES, STATES[0])
    with pytest.raises(ValueError, match="STATES must declare each LifecycleState once"):
        _index(twice, TRANSITIONS)
    with pytest.raises(ValueError, match="STATES must declare each LifecycleState once"):
        _index(STATES[:-1], TRANSITIONS)


def test_a_transition_declared_twice_or_a_trigger_unused_is_refused() -> None:
    from statemachine.lifecycle.machine import _index

    with pytest.raises(ValueError, match="from 'stopped' declared twice"):
        _index(STATES, (*TRANSITIONS, TRANSITIONS[0]))
    with pytest.raises(ValueError, match="TRANSITIONS must use each Trigger"):
        _index(STATES, TRANSITIONS[1:])


def test_a_machine_built_afresh_refuses_what_is_not_a_declared_transition() -> None:
    # each process builds the machine on first use: build it here, as a new one would
    lifecycle_machine.cache_clear()
    machine = lifecycle_machine()
    assert set(machine.events) == set(TRIGGERS), "no to_<state> auto transitions"
    lc = ServeLifecycle("omni")
    for trigger in ("start", "to_running"):
        with pytest.raises(IllegalTransition):
            lc.fire(trigger)
        assert lc.state == S.STOPPED
    assert lc.fire("reserve") == S.RESERVED
