"""statemachine.planning.deferred.Deferred stands for the tuple its function builds.

The planner hands out a blocked serve's protected list as a Deferred: whatever reads a
plan (JSON, equality, hashing, printing) must see the tuple, built once.
"""

from __future__ import annotations

from statemachine.planning.deferred import Deferred
from statemachine.planning.plan_types import Blocked, Protected


def test_a_deferred_is_built_once_when_first_read() -> None:
    calls: list[int] = []

    def build() -> tuple[int, ...]:
        calls.append(1)
        return (3, 1, 2)

    d = Deferred(build)
    assert calls == []
    assert len(d) == 3
    assert list(d) == [3, 1, 2]
    assert d[0] == 3 and d[-1] == 2 and d[1:] == (1, 2)
    assert 1 in d and 4 not in d
    assert d.items() == (3, 1, 2)
    assert calls == [1]


def test_a_deferred_equals_its_tuple_and_hashes_as_it() -> None:
    d = Deferred(lambda: (1, 2))
    same, other = (1, 2), (1,)
    assert d == same and same == d  # either side: a tuple defers to the Deferred
    assert d != other and other != d
    assert d != (2, 1)
    assert d == Deferred(lambda: (1, 2)) and d != Deferred(lambda: (1,))
    assert d != [1, 2]  # as a tuple: a list is not equal to it
    assert hash(d) == hash((1, 2))
    assert repr(d) == "(1, 2)"
    assert not Deferred(lambda: ()) and bool(d)


def test_a_blocked_entry_with_a_deferred_list_is_the_entry_with_the_tuple() -> None:
    rows = (Protected("a", 10, "resident: never evicted"),)
    lazy = Blocked("x", "why", protected=Deferred(lambda: rows))
    eager = Blocked("x", "why", protected=rows)
    assert lazy == eager and eager == lazy
    assert hash(lazy) == hash(eager)
    assert repr(lazy) == repr(eager)
    assert lazy.to_json() == eager.to_json()


def test_a_deferred_copies_and_pickles_as_its_tuple() -> None:
    """A tuple can be pickled and deep-copied; an unbuilt Deferred holds a closure,
    which pickle cannot take: it is copied as the tuple it stands for."""
    import copy
    import pickle

    d: Deferred[int] = Deferred(lambda: (1, 2, 3))
    for clone in (pickle.loads(pickle.dumps(d)), copy.deepcopy(d), copy.copy(d)):
        assert clone == (1, 2, 3) and d == clone and hash(clone) == hash(d)
