"""A short serve that waits for the stops a later start forces (docs/eviction.md;
``_waits_for_later_stops`` in statemachine/planning/planner.py), at its edges.

A serve of the first pass whose shortfall the forced stops of a later serve's start
(a port shared with a running holder) cover waits for them instead of evicting. These
cases pin when it waits and when it must not: a wait that is not warranted lets a
younger request take the room the older one was owed, or leaves the older one blocked;
a wait that is warranted keeps a holder running that an eviction would stop for
nothing. Same builders and style as tests/core/test_planner_rules.py and
tests/core/test_planner_edges.py: a small fleet, the plan expected as ``"action serve"``
lines, written from the rules.
"""

from __future__ import annotations

from support.plan_cases import EVI, OND, RES, RUN, Case, req, serve, up
from support.plan_lines import lines, plan_of, starts

from statemachine.domain.types import ServeSpec
from statemachine.planning.plan_types import (
    Policy,
)

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


def _with_a_later_start_elsewhere(case: Case) -> Case:
    """``case`` with ``od2`` replaced by ``zz``: desired running, outside the ledger (no
    vram_mib) on role b, last in the order; it takes no room from ``od``, and where it
    lands in the plan shows whether ``od`` waited (the order: ``od`` first)."""
    case.serves[4] = serve("zz", None, OND, RUN, roles=("b",))
    case.requests = []
    return case


def test_a_requester_does_not_wait_for_the_stop_of_a_start_held_back() -> None:
    """``web`` is held back by the policy: it starts in no pass, so the stop of ``other``
    it would force never comes, and ``od`` makes its own room in its turn (``other``,
    the one victim that covers its 7000), before ``zz`` after it in the order."""
    case = _with_a_later_start_elsewhere(_held_web_case())
    plan = plan_of(case, Policy(hold={"web": "an operator holds it"}))
    assert lines(plan) == [
        "stop other",
        "release other",
        *starts("od"),
        "start zz",
        "await_ready zz",
    ]
    assert [s.mib for s in plan.steps[:3]] == [10_000, 10_000, 25_000]
    assert [b.serve for b in plan.blocked] == ["web"]


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


#: three roles, budget 30000 each (c: the port holders' starts, outside the ledger)
THREE = {**TWO, "c": (32_000, 2_000)}


def _port_holder(name: str, mib: int, role: str, port: int) -> ServeSpec:
    """A running evictable serve holding ``port``: a start declaring it stops it."""
    return serve(name, mib, EVI, None, roles=(role,), port=port, gpu_inference=True)


def _web(name: str, port: int) -> ServeSpec:
    """A desired-running serve outside the ledger (no vram_mib) declaring ``port``."""
    return serve(name, None, OND, RUN, roles=("c",), port=port)


def _group_lines(name: str, *stopped: str) -> list[str]:
    return [f"{a} {o}" for o in stopped for a in ("stop", "release")] + starts(name)


def _web_lines(name: str, *stopped: str) -> list[str]:
    stops = [f"{a} {o}" for o in stopped for a in ("stop", "release")]
    return [*stops, f"start {name}", f"await_ready {name}"]


def test_a_requester_counts_only_the_stops_of_starts_after_the_one_tried() -> None:
    """In order: ``a1`` (short on role b: evicts there), ``a2`` (stops ``xx`` by its
    start), ``a3`` (short 8000 on role a once ``xx`` is gone), ``a4`` (stops ``yy``,
    10000 on a, by its start). ``a3`` waits for ``yy``'s stop, which comes after it,
    though ``a2``'s entry before it is past: ``evi`` keeps running."""
    case = Case(
        [
            serve("a1", 20_000, OND, RUN, roles=("b",)),
            serve("evb", 15_000, EVI, RUN, roles=("b",)),
            _web("a2", 8001),
            serve("a3", 18_000, OND, RUN),
            _web("a4", 8002),
            _port_holder("xx", 5_000, "a", 8001),
            _port_holder("yy", 10_000, "a", 8002),
            serve("evi", 10_000, EVI, RUN),
        ],
        {"evb": up(), "xx": up(), "yy": up(), "evi": up()},
        [],
        roles=THREE,
    )
    plan = plan_of(case)
    assert lines(plan) == [
        *_group_lines("a1", "evb"),
        *_web_lines("a2", "xx"),
        *_web_lines("a4", "yy"),
        *starts("a3"),
    ]
    assert plan.blocked == ()
    assert "evi" in plan.ledger_after.holdings


def test_a_later_start_whose_first_stop_is_already_made_still_counts_the_next() -> None:
    """``a3``'s start would stop both holders of its port: ``xx`` (role b, which ``a1``
    evicts first) and ``yy`` (10000 on role a). ``a2``, short 8000 on a, waits for the
    stop of ``yy`` (``xx``'s, already made, frees nothing more): ``evi`` keeps running."""
    case = Case(
        [
            serve("a1", 25_000, OND, RUN, roles=("b",)),
            serve("evb", 10_000, EVI, RUN, roles=("b",)),
            serve("a2", 18_000, OND, RUN),
            _web("a3", 8001),
            _port_holder("xx", 10_000, "b", 8001),
            _port_holder("yy", 10_000, "a", 8001),
            serve("evi", 10_000, EVI, RUN),
        ],
        {"xx": up(), "yy": up(), "evi": up(), "evb": up()},
        [],
        roles=THREE,
    )
    plan = plan_of(case)
    assert lines(plan) == [
        *_group_lines("a1", "evb", "xx"),
        *_web_lines("a3", "yy"),
        *starts("a2"),
    ]
    assert plan.blocked == ()
    assert "evi" in plan.ledger_after.holdings


def test_a_stop_two_later_starts_would_force_is_counted_once() -> None:
    """``a2`` and ``a3`` both declare the port of ``xx`` (10000): their starts stop it
    once, which does not cover ``a1``'s 15000 short, so ``a1`` does not wait: it evicts
    ``evi`` and ``xx`` in its own turn, first in the order (and ``a3`` is blocked by
    ``a2`` on the port)."""
    case = Case(
        [
            serve("a1", 25_000, OND, RUN),
            _web("a2", 8001),
            _web("a3", 8001),
            _port_holder("xx", 10_000, "a", 8001),
            serve("evi", 10_000, EVI, RUN),
        ],
        {"xx": up(), "evi": up()},
        [],
        roles=THREE,
    )
    plan = plan_of(case)
    assert [(line, s.group) for line, s in zip(lines(plan), plan.steps, strict=True)] == [
        *((line, "a1") for line in _group_lines("a1", "evi", "xx")),
        *((line, "a2") for line in _web_lines("a2")),
    ]
    (a3,) = plan.blocked
    assert a3.reason == "a3 cannot start: a2: being started in this plan (holds port 8001)"


def test_a_requester_does_not_wait_for_the_stop_its_own_start_forces() -> None:
    """``a2`` declares the port of ``xx`` (10000 on a): its own start stops ``xx``, and
    with that it is still 5000 short, so it evicts ``evi`` too, in its own turn, before
    ``a3`` after it in the order starts (the stop of ``xx`` is no later start's to wait
    for)."""
    case = Case(
        [
            serve("a1", 20_000, OND, RUN, roles=("b",)),
            serve("evb", 15_000, EVI, RUN, roles=("b",)),
            serve("a2", 25_000, OND, RUN, port=8001),
            _web("a3", 8009),
            _port_holder("xx", 10_000, "a", 8001),
            serve("evi", 10_000, EVI, RUN),
        ],
        {"evb": up(), "xx": up(), "evi": up()},
        [],
        roles=THREE,
    )
    plan = plan_of(case)
    assert lines(plan) == [
        *_group_lines("a1", "evb"),
        *_group_lines("a2", "xx", "evi"),
        *_web_lines("a3"),
    ]
    assert plan.blocked == ()


def test_a_later_stop_one_mib_short_of_the_shortfall_is_not_waited_for() -> None:
    """``a1`` is 10001 short on role a; ``a2``'s start would stop ``yy``, 10000 there:
    one MiB short, so ``a1`` does not wait: it evicts ``evi`` and ``yy`` in its own
    turn, first in the order, and ``a2`` then starts with its port free."""
    case = Case(
        [
            serve("a1", 20_001, OND, RUN),
            _web("a2", 8001),
            _port_holder("yy", 10_000, "a", 8001),
            serve("evi", 10_000, EVI, RUN),
        ],
        {"yy": up(), "evi": up()},
        [],
        roles=THREE,
    )
    plan = plan_of(case)
    assert [(line, s.group) for line, s in zip(lines(plan), plan.steps, strict=True)] == [
        *((line, "a1") for line in _group_lines("a1", "evi", "yy")),
        *((line, "a2") for line in _web_lines("a2")),
    ]
    assert [s.mib for s in plan.steps[:5]] == [10_000, 10_000, 10_000, 10_000, 20_001]
    assert plan.blocked == ()


def test_a_later_stop_on_one_role_does_not_cover_a_shortfall_on_another() -> None:
    """``a1`` needs 20000 on roles a and b: on a the stop ``a2``'s start forces would
    cover it, on b it is 1 MiB short and no later stop frees anything there. So it does
    not wait: it evicts on both roles in its own turn (``evb``, and ``evi`` on a), first
    in the order; ``a2`` then stops ``yy`` for its port."""
    case = Case(
        [
            serve("a1", 20_000, OND, RUN, roles=("a", "b")),
            _web("a2", 8001),
            _port_holder("yy", 10_000, "a", 8001),
            serve("evi", 10_000, EVI, RUN),
            serve("evb", 10_001, EVI, RUN, roles=("b",)),
        ],
        {"yy": up(), "evi": up(), "evb": up()},
        [],
        roles=THREE,
    )
    plan = plan_of(case)
    assert [(line, s.group) for line, s in zip(lines(plan), plan.steps, strict=True)] == [
        *((line, "a1") for line in _group_lines("a1", "evb", "evi")),
        *((line, "a2") for line in _web_lines("a2", "yy")),
    ]
    assert plan.blocked == ()


def test_a_requester_does_not_wait_for_the_stop_of_a_start_a_conflict_blocks() -> None:
    """As with ``web`` held back, but ``web`` is blocked by a conflict instead: a
    resident runs exclusive on its role c, and may not be stopped. ``web``'s start never
    comes, nor the stop of ``other`` it would force, so ``od`` stops ``other`` itself in
    its turn, before ``zz`` after it in the order."""
    case = _with_a_later_start_elsewhere(_held_web_case())
    case.serves[3] = serve("web", None, OND, RUN, roles=("c",), port=8001, gpu_inference=True)
    case.serves.append(serve("excl", 5_000, RES, RUN, roles=("c",), exclusive=True))
    case.running["excl"] = up()
    case.roles = THREE
    plan = plan_of(case)
    assert lines(plan) == [
        "stop other",
        "release other",
        *starts("od"),
        "start zz",
        "await_ready zz",
    ]
    assert [b.serve for b in plan.blocked] == ["web"]
    assert "excl runs (exclusive on c) and may not be stopped: resident" in (plan.blocked[0].reason)


def test_a_requester_does_not_wait_for_room_a_younger_request_takes_first() -> None:
    """``web``'s start stops ``other`` (10000 on a), which would cover ``od``'s 7000
    short; but ``od2``, asked for after and tried later in the same pass, fits in the
    free room as it is and would take 15000 of it before the retry, leaving ``od``
    short for good. ``od`` is ahead in the start order (desired running, before any
    request), so it does not wait: it stops ``other`` itself and starts; ``web`` then
    starts with its port free, and ``od2`` is blocked (they cannot run together)."""
    plan = plan_of(_held_web_case())
    assert lines(plan) == [
        "stop other",
        "release other",
        *starts("od"),
        "start web",
        "await_ready web",
    ]
    assert [s.group for s in plan.steps[:2]] == ["od", "od"]
    (od2,) = plan.blocked
    assert od2.serve == "od2"
    assert "committed 27000 (evi 2000 + od 25000); free 3000; needs 15000; short 12000" in (
        od2.reason
    )


def test_a_requester_does_not_wait_for_a_stop_whose_start_takes_the_room_back() -> None:
    """``web`` stops ``other`` (10000 on a) by starting, but itself reserves 10000 on a:
    its start frees nothing there for ``od``, 5000 short and ahead of it in the order
    (by name). ``od`` does not wait: it makes its own room in its turn, for itself and
    for ``web`` after it (``evi`` and ``other``, 20000), and starts first; ``web`` then
    starts with its port free."""
    case = Case(
        [
            serve("od", 15_000, OND, RUN),
            serve("evi", 10_000, EVI, RUN),
            serve("other", 10_000, EVI, None, port=8001, gpu_inference=True),
            serve("web", 10_000, OND, RUN, port=8001),
        ],
        {"evi": up(), "other": up()},
        [],
    )
    plan = plan_of(case)
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop evi", "od"),
        ("release evi", "od"),
        ("stop other", "od"),
        ("release other", "od"),
        *((line, "od") for line in starts("od")),
        *((line, "web") for line in starts("web")),
    ]
    assert plan.blocked == ()
    assert plan.ledger_after.committed_mib("a") == 25_000


def _takes_back_case(od_mib: int) -> Case:
    """``web``'s start stops ``other`` (10000 on a) and reserves 5000 there: it frees a
    net 5000 for ``od``, whose shortfall is ``od_mib`` - 10000 free."""
    return Case(
        [
            serve("od", od_mib, OND, RUN),
            serve("evi", 10_000, EVI, RUN),
            serve("other", 10_000, EVI, None, port=8001, gpu_inference=True),
            serve("web", 5_000, OND, RUN, port=8001),
        ],
        {"evi": up(), "other": up()},
        [],
    )


def test_a_requester_waits_for_a_later_stop_that_covers_it_after_what_that_start_takes() -> None:
    """``od`` is 5000 short; ``web``'s start frees 10000 and takes 5000: exactly the
    5000, so ``od`` waits for it, and ``evi`` keeps running."""
    plan = plan_of(_takes_back_case(15_000))
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop other", "web"),
        ("release other", "web"),
        *((line, "web") for line in starts("web")),
        *((line, "od") for line in starts("od")),
    ]
    assert plan.blocked == ()
    assert set(plan.ledger_after.holdings) == {"evi", "web", "od"}


def test_a_requester_one_mib_beyond_what_a_later_start_nets_does_not_wait() -> None:
    """``od`` is 5001 short, one MiB more than ``web``'s start nets: it does not wait,
    and makes room in its own turn for itself and for ``web`` (``evi`` and ``other``)."""
    plan = plan_of(_takes_back_case(15_001))
    assert [(f"{s.action} {s.serve}", s.group) for s in plan.steps] == [
        ("stop evi", "od"),
        ("release evi", "od"),
        ("stop other", "od"),
        ("release other", "od"),
        *((line, "od") for line in starts("od")),
        *((line, "web") for line in starts("web")),
    ]
    assert plan.blocked == ()


def test_a_later_serve_held_back_takes_no_room_a_requester_waits_for() -> None:
    """As in the case where ``od`` waits for exactly what ``web``'s start nets, with one
    more desired-running serve later in the order, 5000 on role a, held back by the
    policy: it starts in no pass and takes nothing, so ``od`` still waits."""
    case = _takes_back_case(15_000)
    case.serves.append(serve("zz", 5_000, OND, RUN))
    plan = plan_of(case, Policy(hold={"zz": "an operator holds it"}))
    assert lines(plan) == ["stop other", "release other", *starts("web"), *starts("od")]
    assert [b.serve for b in plan.blocked] == ["zz"]
    assert set(plan.ledger_after.holdings) == {"evi", "web", "od"}


def test_a_later_serve_outside_the_ledger_takes_no_room_a_requester_waits_for() -> None:
    """As in the case where ``od`` waits for exactly what ``web``'s start nets, with one
    more desired-running serve later in the order declaring 5000 on role a and on a role
    without a capacity row: outside the ledger, it reserves nothing on a when it starts,
    so ``od`` still waits and ``evi`` keeps running."""
    case = _takes_back_case(15_000)
    case.serves.append(serve("zz", 5_000, OND, RUN, roles=("a", "x")))
    plan = plan_of(case)
    assert lines(plan) == [
        "stop other",
        "release other",
        *starts("web"),
        "start zz",
        "await_ready zz",
        *starts("od"),
    ]
    assert plan.blocked == ()
    assert set(plan.ledger_after.holdings) == {"evi", "web", "od"}
