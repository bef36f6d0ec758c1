"""Victim sets by cost (statemachine/planning/victims.py: ``cost_key``, ``cheapest_cover``), the
order the planner uses where it counts how often each serve is used (docs/eviction.md,
"Reload costs by use").

Written from the rules: the cost key is fewest possibly busy, then cheapest to bring back
(unknown costs first counted), then fewest victims, then least freed beyond the need,
then the victims' priorities, starts and names; the cheapest cover takes the idle
candidates before the possibly busy, each by its cost per MiB on the short roles (names
on a tie), until every short role is covered, then drops the victims the cover does not
need, the dearest first; an unknown cost on a short role leaves no cover. Pure.
"""

from __future__ import annotations

from statemachine.planning.victims import Candidate, cheapest_cover, cost_key


def c(
    name: str,
    mib: int,
    cost: float | None,
    *,
    roles: tuple[str, ...] = ("r",),
    busy: int | None = 0,
    priority: int = 0,
    started: float | None = None,
) -> Candidate:
    return Candidate(name, roles, mib, priority, started, busy, cost)


def names(found: tuple[Candidate, ...] | None) -> list[str] | None:
    return None if found is None else [x.name for x in found]


def test_the_cost_key_term_by_term() -> None:
    a = c("a", 6000, 10.0, busy=1, priority=2, started=5.0)
    b = c("b", 3000, 2.5, priority=7)
    assert cost_key([a, b], {"r": 8000}) == (1, (0, 12.5), 2, 1000, (7, 2), (5.0, 0.0), ("a", "b"))
    assert cost_key([], {"r": 0}) == (0, (0, 0.0), 0, 0, (), (), ())


def test_the_cost_comes_before_the_count_and_the_busy_before_the_cost() -> None:
    short = {"r": 4000}
    two_cheap = [c("a", 2000, 1.0), c("b", 2000, 1.0)]
    one_dear = [c("d", 4000, 90.0)]
    assert cost_key(two_cheap, short) < cost_key(one_dear, short)
    busy_cheap = [c("e", 4000, 1.0, busy=None)]  # an unknown count is possibly busy
    assert cost_key(one_dear, short) < cost_key(busy_cheap, short)


def test_the_cheapest_cover_goes_by_cost_per_mib() -> None:
    # x frees 10000 at 20 s (0.002 s/MiB), y 1000 at 5 s (0.005 s/MiB): x, though dearer
    short = {"r": 1000}
    assert names(cheapest_cover([c("y", 1000, 5.0), c("x", 10_000, 20.0)], short)) == ["x"]


def test_the_cheapest_cover_takes_the_idle_before_the_possibly_busy() -> None:
    short = {"r": 1000}
    found = cheapest_cover([c("busy", 1000, 1.0, busy=2), c("idle", 1000, 100.0)], short)
    assert names(found) == ["idle"]


def test_a_cost_of_nothing_is_the_cheapest_and_names_break_a_tie() -> None:
    short = {"r": 1000}
    assert names(cheapest_cover([c("y", 1000, 0.5), c("x", 1000, 0.0)], short)) == ["x"]
    # both cost nothing: by name, whatever they free
    assert names(cheapest_cover([c("b", 1000, 0.0), c("a", 2000, 0.0)], short)) == ["a"]


def test_the_cheapest_cover_takes_until_covered_then_drops_what_it_does_not_need() -> None:
    # cheap frees 3000 of 3001: dear must be taken too, and then cheap is not needed
    found = cheapest_cover([c("cheap", 3000, 0.3), c("dear", 5000, 5.0)], {"r": 3001})
    assert names(found) == ["dear"]
    # nothing beyond the need: the first that covers ends the taking
    found = cheapest_cover([c("a", 2000, 0.2), c("b", 2000, 0.4), c("z", 2000, 0.6)], {"r": 4000})
    assert names(found) == ["a", "b"]


def test_only_the_short_roles_count() -> None:
    other = c("other", 5000, None, roles=("s",))  # its cost unknown, on a role not short
    found = cheapest_cover([other, c("a", 1000, 1.0)], {"r": 1, "s": 0})
    assert names(found) == ["a"]
    # what a candidate frees on a role that is not short does not count toward its cost
    both = c("both", 1000, 4.0, roles=("r", "s"))
    alone = c("alone", 1000, 3.0)
    assert names(cheapest_cover([both, alone], {"r": 1000})) == ["alone"]


def test_an_unknown_cost_on_a_short_role_leaves_no_cover() -> None:
    assert cheapest_cover([c("a", 1000, None), c("b", 5000, 1.0)], {"r": 1000}) is None
    assert cheapest_cover([c("a", 1000, 1.0)], {"r": 2000}) is None  # not enough


def test_a_cover_drops_the_dearest_victim_it_does_not_need_first() -> None:
    # by cost per MiB a, b, c are taken (6500 MiB for 4000); then, the dearest first:
    # c is needed, b is not (a + c = 5000 still cover), a then is
    a, b, cc = c("a", 2000, 0.0), c("b", 1500, 0.4), c("c", 3000, 0.9)
    assert names(cheapest_cover([a, b, cc], {"r": 4000})) == ["a", "c"]
    # a cover that frees exactly the need is a cover: b is dropped when a + c free 4000
    assert names(cheapest_cover([a, b, c("c", 2000, 0.9)], {"r": 4000})) == ["a", "c"]
    assert names(cheapest_cover([a, c("d", 2000, 0.5)], {"r": 4000})) == ["a", "d"]


def test_the_cost_per_mib_counts_a_candidate_of_one_mib_and_one_of_none() -> None:
    # one MiB at 1 s (1 s/MiB) against two MiB at 1.5 s (0.75 s/MiB)
    assert names(cheapest_cover([c("a", 1, 1.0), c("b", 2, 1.5)], {"r": 1})) == ["b"]
    # a candidate that frees nothing is weighed at its cost per one MiB, never divided by 0
    assert names(cheapest_cover([c("none", 0, 1.0), c("b", 2, 1.5)], {"r": 1})) == ["b"]
