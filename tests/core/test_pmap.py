"""statemachine.ledger.pmap.PMap against a dict built by the same assignments and deletions.

A ledger keeps its holdings in a PMap, so the holdings must read exactly as the dict
they replace: same items, same order, same lookups, and no version changed by an update
made from it (an earlier ledger stays what it was).
"""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from statemachine.ledger.pmap import PMap

KEYS = st.sampled_from([f"k{i}" for i in range(40)])
#: (key, value) sets it, (key, None) deletes it when present
OPS = st.lists(st.tuples(KEYS, st.none() | st.integers(0, 9)), max_size=400)


def check(m: PMap[str, int], d: dict[str, int]) -> None:
    assert list(m) == list(d)
    assert list(m.items()) == list(d.items())
    assert list(m.keys()) == list(d.keys())
    assert list(m.values()) == list(d.values())
    assert len(m) == len(d)
    assert m == d and d == m
    for i in range(40):
        k = f"k{i}"
        assert (k in m) is (k in d)
        assert m.get(k) == d.get(k)
        assert m.get(k, -1) == d.get(k, -1)
        if k in d:
            assert m[k] == d[k]
        else:
            with pytest.raises(KeyError):
                m[k]


@settings(max_examples=150, deadline=None)
@given(start=st.dictionaries(KEYS, st.integers(0, 9)), ops=OPS)
def test_a_pmap_reads_as_the_dict_of_the_same_updates(
    start: dict[str, int], ops: list[tuple[str, int | None]]
) -> None:
    m = PMap(start)
    d = dict(start)
    kept: list[tuple[PMap[str, int], dict[str, int]]] = []
    for n, (key, value) in enumerate(ops):
        event("a delete" if value is None else "a set")
        if value is None:
            if key not in d:
                event("a delete of a missing key")
                with pytest.raises(KeyError):
                    m.delete(key)
                continue
            m = m.delete(key)
            del d[key]
        else:
            m = m.set(key, value)
            d[key] = value
        if n % 7 == 0:
            check(m, d)
            kept.append((m, dict(d)))
    check(m, d)
    for old, was in kept:  # every earlier version is what it was
        check(old, was)


def test_a_key_deleted_and_set_again_comes_last_as_in_a_dict() -> None:
    m = PMap({"a": 1, "b": 2, "c": 3}).delete("a").set("a", 4)
    assert list(m.items()) == [("b", 2), ("c", 3), ("a", 4)]
    m = PMap({"a": 1, "b": 2}).set("z", 0).delete("z").set("z", 5).set("b", 7)
    assert list(m.items()) == [("a", 1), ("b", 7), ("z", 5)]
    assert repr(m) == "PMap({'a': 1, 'b': 7, 'z': 5})"


def test_many_updates_keep_every_version_and_the_order() -> None:
    """Past the size at which changes are folded into a new base, still a dict's answers."""
    m: PMap[int, int] = PMap()
    d: dict[int, int] = {}
    versions = []
    for i in range(300):
        m, d[i] = m.set(i, i), i
        if i % 3 == 0:
            m = m.delete(i // 2) if i // 2 in d else m
            d.pop(i // 2, None)
        versions.append((m, dict(d)))
    for old, was in versions:
        assert list(old.items()) == list(was.items())
        assert len(old) == len(was)


def test_a_copied_or_pickled_pmap_is_the_same_mapping() -> None:
    """A deletion is kept as a sentinel until folded; a copy (copy.deepcopy, pickle)
    must not make the deleted key come back."""
    import copy
    import pickle

    m = PMap({"a": 1, "b": 2, "c": 3}).delete("a").set("d", 4)
    for clone in (copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert "a" not in clone and clone.get("a") is None
        assert dict(clone) == {"b": 2, "c": 3, "d": 4} and list(clone) == ["b", "c", "d"]
        assert clone == m and len(clone) == 3
        assert clone.set("a", 9).get("a") == 9 and list(clone.set("a", 9))[-1] == "a"


def _update_allocates(m: PMap[int, int], key: int, value: int | None) -> tuple[PMap[int, int], int]:
    """``m`` with ``key`` set (``value`` None: deleted), and the most bytes the update had
    allocated at once (tracemalloc: a count, not a time)."""
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    after = m.delete(key) if value is None else m.set(key, value)
    _, peak = tracemalloc.get_traced_memory()
    return after, peak - before


def test_an_update_of_a_large_map_copies_a_few_changes_not_the_map() -> None:
    """What a ledger operation relies on (the module's promise, benchmarks/README.md):
    a holding set or released copies the changes since the last fold, never the whole
    map, while the changes stay under about the square root of the map's size (200 here)."""
    n = 40_000
    m: PMap[int, int] = PMap({i: i for i in range(n)})
    d = dict(m)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        whole = dict(m)
        copy_bytes = tracemalloc.get_traced_memory()[1] - before
        del whole
        for i in range(150):  # a new key, a changed one, a deleted one: 150 changes in all
            key, value = [(n + i, i), (i, -i), (i, None)][i % 3]
            m, allocated = _update_allocates(m, key, value)
            assert allocated < copy_bytes // 10, (i, allocated, copy_bytes)
            if value is None:
                del d[key]
            else:
                d[key] = value
    finally:
        tracemalloc.stop()
    assert list(m.items()) == list(d.items())
