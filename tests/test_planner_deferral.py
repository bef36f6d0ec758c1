"""A short serve that waits for the stops a later start forces (docs/eviction.md;
``_waits_for_later_stops`` in statemachine/planner.py), at its edges.

A serve of the first pass whose shortfall the forced stops of a later serve's start
(a port shared with a running holder) cover waits for them instead of evicting. These
cases pin when it waits and when it must not: a wait that is not warranted lets a
younger request take the room the older one was owed, or leaves the older one blocked;
a wait that is warranted keeps a holder running that an eviction would stop for
nothing. Same builders and style as tests/test_planner_rules.py and
tests/test_planner_edges.py: a small fleet, the plan expected as ``"action serve"``
lines, written from the rules.
"""

from __future__ import annotations

from test_planner_edges import lines, plan_of, starts
from test_planner_rules import EVI, OND, RES, RUN, Case, req, serve, up

from statemachine.planner import Policy

#: two roles, budget 30000 each
TWO = {"a": (32_000, 2_000), "b": (32_000, 2_000)}


def _held_web_case() -> Case:
    """``od`` (desired running) needs 25000 on role a: free 18000, short 7000. ``web``,
    later in the order, declares the port of ``other`` (10000 on a), so its start would
    stop ``other``; ``od2``, asked for after, needs 15000 and fits in the free room as
    it is. The two cannot run together (40000 on a budget of 30000)."""
    return Case(
        [
            serve("od", 25_000, OND, RUN),
            serve("evi", 2_000, EVI, RUN),
            serve("other", 10_000, EVI, None, port=8001, gpu_inference=True),
            serve("web", None, OND, RUN, roles=("b",), port=8001),
            serve("od2", 15_000, OND),
        ],
        {"evi": up(), "other": up()},
        [],
        requests=[req("od2")],
        roles=TWO,
    )


def test_a_requester_does_not_wait_for_the_stop_of_a_start_held_back() -> None:
    """``web`` is held back by the policy: it starts in no pass, so the stop of ``other``
    it would force never comes, and ``od`` makes its own room at once (``other``, the
    one victim that covers its 7000). Waiting would let ``od2``, the younger request,
    take the free room first and leave ``od`` short for good."""
    plan = plan_of(_held_web_case(), Policy(hold={"web": "an operator holds it"}))
    assert lines(plan) == ["stop other", "release other", *starts("od")]
    assert [s.mib for s in plan.steps[:3]] == [10_000, 10_000, 25_000]
    assert {b.serve for b in plan.blocked} == {"web", "od2"}
    (od2,) = [b for b in plan.blocked if b.serve == "od2"]
    assert "committed 27000 (evi 2000 + od 25000); free 3000; needs 15000; short 12000" in (
        od2.reason
    )


def test_a_requester_whose_awaited_start_does_not_fit_evicts_in_the_retry() -> None:
    """``web`` would stop ``other`` by starting, which would cover ``od``'s shortfall, but
    ``web`` itself does not fit on role b (a resident holds 25000 there): ``od`` waits
    in the first pass, nothing is stopped, and the retry that always follows a wait
    has ``od`` evict ``evi`` as it would without ``web``. ``web`` stays blocked with
    its own arithmetic, and ``od`` is not left blocked waiting."""
    case = Case(
        [
            serve("od", 15_000, OND, RUN),
            serve("evi", 15_000, EVI, RUN),
            serve("other", 15_000, EVI, None, port=8001, gpu_inference=True),
            serve("web", 10_000, OND, RUN, roles=("b",), port=8001),
            serve("stt", 25_000, RES, RUN, roles=("b",)),
        ],
        {"evi": up(), "other": up(), "stt": up()},
        [],
        roles=TWO,
    )
    plan = plan_of(case)
    assert lines(plan) == ["stop evi", "release evi", *starts("od")]
    (web,) = plan.blocked
    assert web.serve == "web"
    assert "b: capacity 32000 - reserve 2000 = budget 30000; committed 25000 (stt 25000)" in (
        web.reason
    )
    assert "free 5000; needs 10000; short 5000" in web.reason
