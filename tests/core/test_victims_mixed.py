"""A cover where each victim may sleep or stop (statemachine/planning/victims.py:
``cheapest_mixed_cover``), what the planner weighs beside the covers of one kind where it
counts how often each serve is used (docs/eviction.md, "Sleep or stop, victim by victim").

Written from the rule: each candidate that can sleep is weighed as its sleep and, apart,
the rest of its stop (the residual beyond, at the cold start's cost beyond the wake's);
the parts are taken the idle first, the cheapest per MiB first, until every short role is
covered; then victims are dropped and stops turned back into sleeps, the dearest first,
while the cover holds. An unknown cost on a short role, or too little, leaves no cover.
Pure.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from statemachine.planning.victims import Candidate, cheapest_mixed_cover, freed


def c(name: str, mib: int, cost: float | None, *, busy: int | None = 0) -> Candidate:
    return Candidate(name, ("r",), mib, 0, None, busy, cost)


def pair(
    name: str, mib: int, cold: float, residual: int, wake: float
) -> tuple[Candidate, Candidate]:
    """A candidate as its stop, and as its sleep."""
    return c(name, mib, cold), c(name, mib - residual, wake)


def mixed(
    pairs: list[tuple[Candidate, Candidate]], need: int
) -> tuple[dict[str, int], set[str]] | None:
    got = cheapest_mixed_cover([a for a, _ in pairs], [b for _, b in pairs], {"r": need})
    return None if got is None else ({v.name: v.mib for v in got[0]}, set(got[1]))


def test_the_popular_one_sleeps_the_rare_one_stops_and_a_sleeper_stops() -> None:
    pop = pair("pop", 16, 40.0, 1, 1.0)  # its cold start is dear: it is used often
    rare = pair("rare", 8, 2.0, 1, 0.1)
    sleeper = (c("s", 1, 3.0), c("s", 1, 3.0))  # asleep already: it can only stop
    # all asleep free 15 + 7 + 1 = 23; all stopped 25 (cost 45); mixed 24 (cost 6)
    assert mixed([pop, rare, sleeper], 24) == ({"pop": 15, "rare": 8, "s": 1}, {"pop"})


def test_where_their_sleeps_cover_none_is_stopped() -> None:
    got = mixed([pair("a", 16, 40.0, 1, 1.0), pair("b", 8, 2.0, 1, 0.1)], 20)
    assert got == ({"a": 15, "b": 7}, {"a", "b"})


def test_what_the_cover_does_not_need_is_dropped_and_a_stop_it_does_not_need_sleeps() -> None:
    # the cheapest parts first: b asleep, a asleep, then b's rest; a alone would do
    assert mixed([pair("a", 16, 40.0, 1, 1.0), pair("b", 8, 2.0, 1, 0.1)], 15) == (
        {"a": 15},
        {"a"},
    )
    # 16 needed: a's sleep and b's sleep (22) do; dropping b leaves 15: kept asleep
    assert mixed([pair("a", 16, 40.0, 1, 1.0), pair("b", 8, 2.0, 1, 0.1)], 16) == (
        {"a": 15, "b": 7},
        {"a", "b"},
    )


def test_an_unknown_cost_or_too_little_leaves_no_cover() -> None:
    assert mixed([pair("a", 16, 40.0, 1, 1.0), (c("b", 8, None), c("b", 7, 0.1))], 4) is None
    assert mixed([pair("a", 16, 40.0, 1, 1.0), (c("b", 8, 2.0), c("b", 7, None))], 4) is None
    assert mixed([pair("a", 16, 40.0, 1, 1.0), (c("b", 8, None), c("b", 8, None))], 4) is None
    assert mixed([pair("a", 16, 40.0, 1, 1.0)], 17) is None


def test_the_idle_before_the_possibly_busy() -> None:
    busy = (c("busy", 16, 0.1, busy=None), c("busy", 15, 0.01, busy=None))
    assert mixed([busy, pair("idle", 16, 50.0, 1, 5.0)], 15) == ({"idle": 15}, {"idle"})


def test_the_cheapest_per_mib_first_not_the_cheapest() -> None:
    # x 0.3 s per MiB, y 0.3, z 0.4: x covers alone (3 s), where by cost alone z and y
    # would be taken (3.8 s)
    alike = [
        (c(n, mib, cost), c(n, mib, cost))
        for n, mib, cost in [("x", 10, 3.0), ("y", 6, 1.8), ("z", 5, 2.0)]
    ]
    assert mixed(alike, 10) == ({"x": 10}, set())


def test_the_stop_taken_is_the_one_whose_cold_start_costs_least_beyond_its_wake() -> None:
    # both asleep free 18 of 19: one must stop; a's stop costs 49 s beyond its sleep, b's 4
    got = mixed([pair("a", 10, 50.0, 1, 1.0), pair("b", 10, 5.0, 1, 1.0)], 19)
    assert got == ({"a": 9, "b": 10}, {"a"})


def test_the_rest_of_a_stop_is_weighed_per_mib_of_its_residual() -> None:
    # p's stop beyond its sleep: 1 MiB at 11 s; q: 1 MiB at 5 s: p sleeps, q stops
    assert mixed([pair("p", 10, 12.0, 1, 1.0), (c("q", 1, 5.0), c("q", 1, 5.0))], 10) == (
        {"p": 9, "q": 1},
        {"p"},
    )


def test_a_sleep_that_frees_all_its_stop_would() -> None:
    # no residual: its stop frees nothing more, at 19 s more; weighed, never divided by 0
    assert mixed([pair("p", 10, 20.0, 0, 1.0)], 10) == ({"p": 10}, {"p"})


def test_the_cost_per_mib_counts_each_short_role_a_victim_frees() -> None:
    x = Candidate("x", ("r", "s"), 5, 0, None, 0, 8.0)  # 8 s for 10 MiB on the short roles
    y = Candidate("y", ("r",), 5, 0, None, 0, 5.0)
    z = Candidate("z", ("s",), 5, 0, None, 0, 5.0)
    got = cheapest_mixed_cover([x, y, z], [x, y, z], {"r": 5, "s": 5})
    assert got is not None and [v.name for v in got[0]] == ["x"]


def test_the_dearest_victim_is_the_first_the_cover_may_do_without() -> None:
    # a, b and c are taken (0.1, 0.2 and 0.5 s per MiB); either a or b is not needed:
    # b, the dearer, is dropped
    taken = [
        (c(n, mib, cost), c(n, mib, cost))
        for n, mib, cost in [("a", 4, 0.4), ("b", 4, 0.8), ("c", 6, 3.0)]
    ]
    assert mixed(taken, 10) == ({"a": 4, "c": 6}, set())


def test_a_role_short_of_nothing_counts_for_no_candidate() -> None:
    # x frees 5 MiB on r at 8 s (1.6 s per MiB: s, short of nothing, does not count),
    # y 5 MiB at 6 s (1.2): y
    x = Candidate("x", ("r", "s"), 5, 0, None, 0, 8.0)
    y = Candidate("y", ("r",), 5, 0, None, 0, 6.0)
    got = cheapest_mixed_cover([x, y], [x, y], {"r": 5, "s": 0})
    assert got is not None and [v.name for v in got[0]] == ["y"]


def test_the_rest_of_a_stop_taken_before_its_sleep_stops_it() -> None:
    # p's stop beyond its sleep (0.05 s for 1 MiB) is cheaper per MiB than its sleep
    # (0.95 s for 9): taken first, p stops and covers; q is not taken
    q = (c("q", 1, 0.08), c("q", 1, 0.08))
    assert mixed([pair("p", 10, 1.0, 1, 0.95), q], 10) == ({"p": 10}, set())
    # p's sleep, taken after, leaves it stopped: with q (0.2 s) p stopped covers 11
    q = (c("q", 1, 0.2), c("q", 1, 0.2))
    assert mixed([pair("p", 10, 1.0, 1, 0.95), q], 11) == ({"p": 10, "q": 1}, set())


def test_the_cover_keeps_the_victims_whose_stops_cost_least() -> None:
    # a and b asleep and c: either of a and b is not needed; a's stop is the dearer
    # (9 s against 1.5 s, though its sleep is the cheaper): a is dropped
    a, b = pair("a", 5, 9.0, 1, 0.1), pair("b", 6, 1.5, 1, 0.2)
    cc = (c("c", 8, 8.0), c("c", 8, 8.0))
    assert mixed([a, b, cc], 12) == ({"b": 5, "c": 8}, {"b"})


def test_the_rest_of_a_stop_costs_its_cold_start_less_its_wake() -> None:
    # a: 50 s stopped, 48 s asleep (2 s more for its residual); b: 10 s and 1 s (9 s
    # more): a stops, b sleeps, though a's stop is the dearer
    got = mixed([pair("a", 10, 50.0, 1, 48.0), pair("b", 10, 10.0, 1, 1.0)], 19)
    assert got == ({"a": 10, "b": 9}, {"b"})


costs = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@st.composite
def pools(draw: st.DrawFn) -> tuple[list[tuple[Candidate, Candidate]], int]:
    out = []
    for i in range(draw(st.integers(0, 7))):
        mib, cold = draw(st.integers(1, 40)), draw(costs)
        if draw(st.booleans()):  # it can sleep
            residual, wake = draw(st.integers(0, mib - 1)), draw(costs)
            out.append(pair(f"s{i}", mib, cold, residual, min(wake, cold)))
        else:
            out.append((c(f"s{i}", mib, cold), c(f"s{i}", mib, cold)))
    return out, draw(st.integers(1, 150))


@given(pools())
def test_a_mixed_cover_covers_needs_each_victim_and_each_stop(
    drawn: tuple[list[tuple[Candidate, Candidate]], int],
) -> None:
    pairs, need = drawn
    stopped, slept = [a for a, _ in pairs], [b for _, b in pairs]
    got = cheapest_mixed_cover(stopped, slept, {"r": need})
    if sum(a.mib for a in stopped) < need:
        assert got is None
        return
    assert got is not None  # every one stopped covers: a cover is found
    victims, asleep = got
    by_name = {a.name: (a, b) for a, b in pairs}
    assert len({v.name for v in victims}) == len(victims)
    for v in victims:  # each as weighed: its sleep exactly when it sleeps
        a, b = by_name[v.name]
        assert v == (b if v.name in asleep else a)
        assert v.name not in asleep or a != b
    assert freed(victims, {"r": need})["r"] >= need
    for i, v in enumerate(victims):  # no victim it does not need
        rest = [*victims[:i], *victims[i + 1 :]]
        assert freed(rest, {"r": need})["r"] < need
        a, b = by_name[v.name]
        if v.name not in asleep and a != b:  # no stop that a sleep would do
            assert freed([*rest, b], {"r": need})["r"] < need
