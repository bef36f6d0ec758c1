"""Chaos: the controller never overcommits and never starts a serve twice, under faults.

``test_chaos_campaign`` runs ``vramctl run`` (a subprocess, its API on a free port, a
token) on the real Docker daemon, reaching Docker only through a proxy socket the test
can cut (``tests/chaos/proxy.py``). One role with a 10000 MiB budget and six busybox
serves: two residents, two evictables, two on-demand; three are pre-created
containers the controller ``docker start``s, three are created by their ``up``
commands (which wait a little first). A seeded driver applies random operations —
manifest edits saved by rename and in place (``desired`` flips, ``vram_mib``
changes, serves removed and added back), truncated / invalid / non-UTF-8 files that
are put right a moment later, on-demand ``up`` / ``down`` through the API,
``docker kill`` and ``docker rm -f``, ``docker start`` behind the controller's back,
SIGKILL of the controller and a restart, the Docker socket cut and restored — while
the monitor (``tests/chaos/monitor.py``) replays Docker's events and records every
start the *controller* made that took the role over budget, and every double start.
Starts are attributed exactly: the controller's go through the proxy, which notes
each request and Docker's answer; the driver's own go straight to the daemon and are
noted before they are made.

At the end the socket is restored, a final manifest is written and the requests are
ended; the controller must reach it (within its own declared backoff plus a minute)
and the monitor must have recorded no controller-caused overcommit, no double start
and no start it cannot attribute. Each start of the controller is judged by its own
records, with no time window: the journaled cycle that planned its last admission
(the manifest version, the reservations) and its last container list before the
Docker call or the ``up`` (see ``tests/chaos/monitor.py``); only a container started
by hand after that list is left out of its count. The controller exiting on its own
(other than refusing an invalid manifest at start-up), a traceback in its log, or a
5xx other than 503 from its API fail the campaign too. The summary (seed, operations
by kind, starts by cause, what the judgement read, violations with the operations
before each) is printed, and written as JSON to ``$VRAMCTL_CHAOS_REPORT`` when set.

``test_chaos_placement_rounds`` runs the same campaign on three stand-in cards
(``tests/chaos/placement.py``): pinned serves and serves with ``placement = [...]``,
each container made by its ``up`` with the card it was told (``VRAMCTL_GPU_ROLE``),
and among the faults the placement edits — re-pins (a pinned serve to another card, a
placed serve to a pinned card and back), a card dropped from a placed serve's
candidates (often the one it runs on), a card added. The monitor counts each container
on the card it was made for, and also fails the campaign on a start of the controller
of a container made for another card than its plan chose (``wrong_card``), and on a
``double_count``: the controller's ledger (``GET /v1/ledger``, polled every second, and
its journaled cycles') counting one serve on two cards while it runs on one. Settling
also waits for each running serve to be on a card its final declaration names and
for ``vramctl plan`` to have nothing left to do.

Bounds: ``VRAMCTL_CHAOS_OPS`` (default 100; the placement rounds 40) operations and
``VRAMCTL_CHAOS_SECONDS`` (default 150; 60) seconds, whichever comes first;
``--chaos-long`` makes it 1000 / 900.
``VRAMCTL_CHAOS_SKIP`` (comma-separated: operation kinds such as ``sigkill``, ``cut``,
or edit kinds ``desired``, ``mib``, ``presence``) leaves some out, to look at one fault
at a time. ``VRAMCTL_CHAOS_SEED`` replays a campaign (the seed is printed; the timing of a real
daemon makes a replay close, not identical).

An ``/mcp`` session flood (``test_an_mcp_session_flood_...``, ``tests/chaos/mcp_flood.py``)
opens ``VRAMCTL_CHAOS_MCP_SESSIONS`` (default 2000; ``--chaos-long`` 10,000) sessions
without the token against the campaign's controller and never closes them: its resident
memory must stay within 20 % of what it was before, every opening must be answered, and
the SDK's client with the token must be served after.

The monitor itself is checked without Docker on synthetic event feeds with the
controller records they imply: it must flag a controller start over budget, however
close in time to an outside start or an edit, and must not flag what the driver did
or what the controller could not yet see. Every campaign that failed stays here as
such a feed (seed 983412849).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import docker
import pytest
from chaos.driver import Campaign
from chaos.monitor import (
    NS,
    ControllerView,
    Cycle,
    EventItem,
    LedgerItem,
    ListItem,
    Model,
    ModelItem,
    Monitor,
    RequestItem,
    ServeDecl,
)
from chaos.placement import PlacementCampaign
from chaos.proxy import DockerProxy
from docker.errors import NotFound

# ── the monitor on synthetic feeds (no Docker) ──────────────────────────────

S = NS  # one second in the feed's nanoseconds


def model(**mibs: int) -> Model:
    return Model({"a": 10_000}, {k: ServeDecl("a", v) for k, v in mibs.items()})


def start(
    t: float,
    serve: str,
    who: str = "controller",
    status: int | None = 204,
    *,
    up: bool = False,
    card: str = "",
) -> list[object]:
    """A start request (controller through the socket, or the driver) and its event.

    ``up``: the controller's `up` started it (its `docker run` starts by id); with
    ``status=409`` that `up`'s create of a container that exists. ``card``: the card
    the container was made for.
    """
    name, cid = f"c-{serve}", f"{serve:0<64}"
    code = status if who == "controller" else None
    kind = "create" if status == 409 else "start"
    ref = cid[:12] if up and status != 409 else name
    req = RequestItem(int(t * S), who, kind, ref, code)  # type: ignore[arg-type]
    if status in (304, 409):  # Docker emits no event for a start of a running container
        return [req]
    return [req, EventItem(int((t + 0.05) * S), "start", cid, name, serve, card)]


def die(t: float, serve: str) -> EventItem:
    return EventItem(int(t * S), "die", f"{serve:0<64}", f"c-{serve}", serve)


def cycle(
    at: float,
    m: Model,
    *,
    started: dict[str, int] | None = None,
    on: dict[str, str] | None = None,
    **reserved: int,
) -> Cycle:
    """A journaled cycle at ``at`` under ``m``: the starts it reserved (``on``: the card
    it chose for each, where said), what it saw running."""
    held = {f"c-{k}": v for k, v in (started or {}).items()}
    cards = {k: (v,) for k, v in (on or {}).items()}
    return Cycle(int(at * S), m, f"m{at:g}", held, {}, reserved, cards)


def view(
    *cycles: Cycle,
    looks: tuple[float, ...] = (),
    ledgers: tuple[LedgerItem, ...] = (),
    **spawns: float,
) -> ControllerView:
    """The controller's records: its cycles, its container lists, when its `up`s began,
    its cycles' ledgers."""
    return ControllerView(
        cycles,
        tuple(int(t * S) for t in sorted(looks)),
        {k: (int(v * S),) for k, v in spawns.items()},
        ledgers,
    )


def judged(feed: list[object], v: ControllerView) -> Monitor:
    return Monitor().feed(feed).judge(v)  # type: ignore[arg-type]


def test_monitor_flags_a_controller_start_over_budget() -> None:
    m0 = model(a=6000, b=5000)
    feed = [ModelItem(0, m0)]
    feed += start(1, "a") + start(2, "b")  # 11000 of 10000, both by the controller
    m = Monitor().feed(feed)  # type: ignore[arg-type]
    assert m.violations == [] and [c.over for c in m.candidates] == [False, True]
    m.judge(view(cycle(0.5, m0, a=6000), cycle(1.5, m0, b=5000), looks=(0.9, 1.9)))
    assert [v.kind for v in m.violations] == ["overcommit"], m.violations
    assert m.violations[0].serve == "b" and "11000 of 10000" in m.violations[0].detail
    assert "a 6000 + b 5000 = 11000 of 10000 MiB" in m.violations[0].detail
    assert m.starts == {"controller": 2}


def test_monitor_blames_the_controller_for_a_start_into_room_taken_by_hand() -> None:
    # defect shape: a start by hand well before; the controller's start overcommits
    m0 = model(a=6000, b=5000)
    feed = [ModelItem(0, m0)]
    feed += start(1, "a", who="outside") + start(5, "b")
    m = judged(feed, view(cycle(4.5, m0, b=5000), looks=(4.9,)))
    assert [v.kind for v in m.violations] == ["overcommit"]
    assert "a=6000(declared 6000, by outside)" in m.violations[0].detail


def test_monitor_does_not_blame_the_controller_for_outside_starts() -> None:
    m0 = model(a=6000, b=5000)
    feed = [ModelItem(0, m0)]
    feed += start(1, "a") + start(2, "b", who="outside")  # the driver overcommits
    feed += start(3.0, "a", status=304)  # a redundant start of its own: not a double start
    m = judged(feed, view(cycle(0.5, m0, a=6000), looks=(0.9, 2.9)))
    assert m.violations == []
    assert {n.kind for n in m.notes} == {"outside_overcommit", "redundant_start"}


def test_an_outside_start_the_controllers_last_look_came_after_is_no_excuse() -> None:
    # the driver starts a 0.3 s before the controller's request for b. Only what the
    # controller's last container list saw counts, however close: no time window
    m0 = model(a=6000, b=5000)
    feed = [ModelItem(0, m0), *start(4.7, "a", who="outside"), *start(5, "b")]  # a runs 4.75

    def verdict(look: float) -> Monitor:
        return judged(feed, view(cycle(4.0, m0, b=5000), looks=(3.0, look)))

    (v,) = verdict(4.76).violations  # its list was answered 10 ms after a started
    assert v.kind == "overcommit" and v.serve == "b"
    assert "last look at 4.760s" in v.detail and "a 6000 + b 5000 = 11000" in v.detail
    late = verdict(4.74)  # answered just before: the controller could not see a
    assert late.violations == [] and [n.kind for n in late.notes] == ["excused"]
    assert "b 5000 = 5000 of 10000 MiB; left out, started after it: a started 4.750s" in (
        late.notes[0].detail
    )


def test_an_up_is_judged_by_the_look_before_it_began() -> None:
    # b's `up` began at 3.0 (after the controller's list at 2.99) and created b at 4.0;
    # the driver started a by hand at 3.55, while the `up` waited: nobody's fault
    m0 = model(a=6000, b=5000)
    feed = [ModelItem(0, m0), *start(3.5, "a", who="outside"), *start(4, "b", up=True)]
    looks = (2.99, 3.6)  # the loop listed again at 3.6: no look of this start's
    m = judged(feed, view(cycle(2.5, m0, b=5000), looks=looks, b=3.0))
    assert m.violations == [] and [n.kind for n in m.notes] == ["excused"], m.violations
    # when the `up` began is not known, the create is its own call: the look at 3.6 counts
    (v,) = judged(feed, view(cycle(2.5, m0, b=5000), looks=looks)).violations
    assert v.kind == "overcommit"


def test_an_edit_counts_from_the_cycle_that_planned_the_start() -> None:
    old, new = model(a=6000, b=3000), model(a=6000, b=5000)
    feed = [ModelItem(0, old), *start(1, "a")]
    feed += [ModelItem(int(10 * S), new)]  # b grows ...
    feed += start(10.5, "b")  # ... 0.5 s before the controller starts it
    a_run = cycle(0.5, old, a=6000)
    # planned under the manifest before the edit: 6000 + 3000 fit
    m = judged(feed, view(a_run, cycle(9.0, old, started={"a": 6000}, b=3000), looks=(10.4,)))
    assert m.violations == [] and [n.kind for n in m.notes] == ["excused"]
    assert "manifest m9" in m.notes[0].detail
    # the journal shows it had read the edit when it planned b: its fault, however soon
    ahead = view(a_run, cycle(10.2, new, started={"a": 6000}, b=5000), looks=(10.4,))
    (v,) = judged(feed, ahead).violations
    assert v.kind == "overcommit" and "manifest m10.2" in v.detail
    assert "a 6000 + b 5000 = 11000 of 10000 MiB" in v.detail


def test_monitor_excuses_an_edit_that_lands_while_two_starts_are_in_flight() -> None:
    # seed 983412849: b's start (reserved at 2000) and c's (reserved at 5000) are both
    # under way beside a (3000, no longer declared) when b is raised to 3000; b's
    # container comes up just after the edit, c's just after b's. Each start was
    # planned under the manifest before the edit, where 3000 + 2000 + 5000 fit.
    def feed(c_at: float) -> list[object]:
        items: list[object] = [ModelItem(0, model(a=3000, b=2000, c=5000)), *start(0.5, "a")]
        items += [ModelItem(1 * S, model(b=2000, c=5000))]  # a removed, still running
        items += [ModelItem(int(3.1 * S), model(b=3000, c=5000))]  # b raised mid-start
        return items + start(3.3, "b", up=True) + start(c_at, "c", up=True)

    first = cycle(0.2, model(a=3000, b=2000, c=5000), a=3000)
    before = cycle(2.0, model(b=2000, c=5000), started={"a": 3000}, b=2000, c=5000)
    m = judged(feed(3.85), view(first, before, looks=(0.4, 2.1, 2.2), b=2.15, c=2.25))
    assert m.violations == [], m.violations
    assert [n.kind for n in m.notes] == ["excused"] and m.notes[0].serve == "c"
    assert "a 3000 + b 2000 + c 5000 = 10000 of 10000 MiB" in m.notes[0].detail
    # c planned again after the edit, beside b at 3000: no manifest lets it fit
    after = cycle(8.0, model(b=3000, c=5000), started={"a": 3000, "b": 2000}, c=5000)
    late = view(first, before, after, looks=(0.4, 2.1, 2.2, 8.1), b=2.15, c=8.2)
    (v,) = judged(feed(9.0), late).violations
    assert v.kind == "overcommit" and v.serve == "c" and "11000 of 10000" in v.detail


def test_a_start_no_journaled_cycle_planned_is_an_overcommit() -> None:
    m0 = model(a=6000, b=5000)
    feed = [ModelItem(0, m0), *start(1, "a", who="outside"), *start(5, "b")]
    (v,) = judged(feed, view(looks=(4.9,))).violations
    assert v.kind == "overcommit" and v.detail.startswith("[no journaled cycle before")


def test_monitor_keeps_counting_a_removed_or_shrunk_serve_that_still_runs() -> None:
    m0 = model(a=6000, b=5000)
    feed = [ModelItem(0, m0), *start(1, "a")]
    feed += [ModelItem(int(2 * S), model(b=5000))]  # a leaves the manifest, still running
    feed += start(10, "b")
    first = cycle(0.5, m0, a=6000)
    gone = cycle(9.5, model(b=5000), started={"a": 6000}, b=5000)
    m = judged(feed, view(first, gone, looks=(0.9, 9.9)))
    assert [v.kind for v in m.violations] == ["overcommit"]
    assert "a=6000(undeclared" in m.violations[0].detail
    assert m.violations[0].detail.startswith("[counts serves no longer declared, still running: a]")
    shrunk = [ModelItem(0, m0), *start(1, "a")]
    shrunk += [ModelItem(int(2 * S), model(a=4000, b=5000)), *start(10, "b")]
    lower = cycle(9.5, model(a=4000, b=5000), started={"a": 6000}, b=5000)
    (v,) = judged(shrunk, view(first, lower, looks=(0.9, 9.9))).violations
    assert v.kind == "overcommit" and v.detail.startswith(
        "[counts reservations above today's declaration: a 6000>4000]"
    )
    # once a dies, the room is b's
    freed = [ModelItem(0, m0), *start(1, "a"), die(5, "a"), *start(6, "b")]
    assert not any(c.over for c in Monitor().feed(freed).candidates)  # type: ignore[arg-type]


def test_monitor_flags_double_starts_and_starts_nobody_asked_for() -> None:
    feed = [ModelItem(0, model(a=2000)), *start(1, "a", who="outside")]
    feed += start(5, "a", status=304)  # the controller starts what the driver started 4 s ago
    feed += start(6, "a", status=409, up=True)  # its `up` too
    feed += [EventItem(int(9 * S), "start", "f" * 64, "c-a2", "a")]  # a second container of a
    m = judged(feed, view(looks=(4.9,)))
    kinds = [v.kind for v in m.violations]
    assert kinds == ["double_start", "double_start", "double_start", "unattributed"], m.violations
    # its last look came before the driver's start: a redundant start, no double start
    m = judged(feed[:4], view(looks=(0.9,)))
    assert m.violations == [] and [n.kind for n in m.notes] == ["redundant_start"]


def test_monitor_matches_by_id_and_notices_lists_that_disagree() -> None:
    cid = "b" * 64
    feed = [ModelItem(0, model(b=1000))]
    feed += [RequestItem(S, "controller", "start", cid[:12], 204)]
    feed += [EventItem(S + 1, "start", cid, "c-b", "b")]
    feed += [ListItem(2 * S, frozenset()), ListItem(3 * S, frozenset())]  # b missing twice
    m = Monitor().feed(feed)  # type: ignore[arg-type]
    assert m.starts == {"controller": 1}
    assert [v.kind for v in m.violations] == ["monitor_gap"]
    assert "the events say it runs, the list does not" in m.violations[0].detail
    # a list asked for before a start and answered after it is no disagreement
    slow = [ModelItem(0, model(b=1000)), RequestItem(S, "controller", "start", cid[:12], 204)]
    slow += [EventItem(2 * S, "start", cid, "c-b", "b")]
    slow += [ListItem(int(2.5 * S), frozenset(), since=int(1.5 * S))]
    slow += [ListItem(int(3.5 * S), frozenset({cid}), since=int(3.4 * S))]
    assert Monitor().feed(slow).violations == []  # type: ignore[arg-type]


def cards(
    pinned: dict[str, tuple[str, int]], placed: dict[str, tuple[tuple[str, ...], int]]
) -> Model:
    """Cards a and b (10000 MiB each): serves pinned (role, MiB) and placed (candidates, MiB)."""
    serves = {n: ServeDecl(r, mib) for n, (r, mib) in pinned.items()}
    serves |= {n: ServeDecl("", mib, placement=c) for n, (c, mib) in placed.items()}
    return Model({"a": 10_000, "b": 10_000}, serves)


def test_a_container_made_for_an_old_card_counts_on_it_whatever_its_serve_says_now() -> None:
    # x was re-pinned from a to b; the controller starts its old container, made for a
    m1 = cards({"x": ("b", 6000), "y": ("a", 5000)}, {})
    c = cycle(0.5, m1, x=6000, y=5000)

    def feed(x_card: str) -> list[object]:
        return [ModelItem(0, m1), *start(1, "y", card="a"), *start(2, "x", card=x_card)]

    (v,) = judged(feed("a"), view(c, looks=(0.9, 1.9))).violations
    assert v.kind == "overcommit" and v.serve == "x", v
    assert "role a: 11000 of 10000 MiB held" in v.detail and "made for a" in v.detail
    assert "y 5000 + x 6000 = 11000 of 10000 MiB" in v.detail
    assert judged(feed("b"), view(c, looks=(0.9, 1.9))).violations == []
    # made without the variable: on the card its serve names now
    assert judged(feed(""), view(c, looks=(0.9, 1.9))).violations == []


def test_a_start_of_a_container_made_for_another_card_than_its_plan_chose_is_a_finding() -> None:
    m1 = cards({"x": ("b", 6000)}, {"p": (("a", "b"), 2000)})
    planned = cycle(0.5, m1, on={"x": "b", "p": "a"}, x=6000, p=2000)
    feed = [ModelItem(0, m1), *start(1, "x", card="a"), *start(2, "p", card="a", up=True)]
    (v,) = judged(feed, view(planned, looks=(0.9,), p=1.5)).violations
    assert v.kind == "wrong_card" and v.serve == "x", v
    assert "made for a (a docker start of the container)" in v.detail and "on b" in v.detail
    assert judged(feed[:1] + feed[3:], view(planned, looks=(0.9,), p=1.5)).violations == []


def test_a_placed_serve_made_for_no_known_card_counts_on_every_candidate() -> None:
    m0 = cards({"q": ("b", 5000)}, {"p": (("a", "b"), 6000)})
    feed = [ModelItem(0, m0), *start(1, "q", card="b"), *start(2, "p")]
    m = Monitor().feed(feed)  # type: ignore[arg-type]
    assert [(c.role, c.over) for c in m.candidates] == [("b", False), ("a", False), ("b", True)]
    assert m.max_held == {"a": 6000, "b": 11000}
    told = [ModelItem(0, m0), *start(1, "q", card="b"), *start(2, "p", card="a")]
    assert not any(c.over for c in Monitor().feed(told).candidates)  # type: ignore[arg-type]


def counted(
    t: float, observed: float, source: str = "api", busy: str = "", **on: str
) -> LedgerItem:
    """A ledger answer read at ``t`` of the observation at ``observed``: serve -> roles."""
    roles = {k: tuple(v) for k, v in on.items()}
    return LedgerItem(int(t * S), source, int(observed * S), roles, frozenset(busy.split()))


def test_monitor_flags_a_ledger_counting_one_serve_on_two_cards_in_two_observations() -> None:
    m0 = cards({}, {"p": (("a", "b"), 4000)})
    runs = [ModelItem(0, m0), *start(1, "p", card="a")]
    twice = [counted(2.5, 2, p="ab"), counted(2.7, 2, p="ab"), counted(3.5, 3, p="ab")]
    (v,) = judged([*runs, *twice], view()).violations
    assert v.kind == "double_count" and v.serve == "p", v
    assert "counts p on a, b while one container of it runs, c-p, created for a" in v.detail
    assert "p=4000(declared 4000, by controller, on a)" in judged(runs, view()).notes[0].detail
    assert "the manifest then declared placement ['a', 'b']" in v.detail
    once = judged([*runs, counted(2.5, 2, p="ab"), counted(3.5, 3, p="a")], view())
    assert once.violations == []
    assert [n.kind for n in once.notes if "count" in n.kind] == ["double_count_once"]
    # the journal's cycles are judged alike
    journal = view(ledgers=(counted(2.5, 2, "journal", p="ab"), counted(9, 8, "journal", p="ba")))
    assert [v.kind for v in judged(runs, journal).violations] == ["double_count"]


def test_a_double_count_is_no_finding_where_it_may_be_right() -> None:
    m0 = cards({}, {"p": (("a", "b"), 4000)})
    runs = [ModelItem(0, m0), *start(1, "p", card="a")]
    both = [counted(2.5, 2, p="ab"), counted(3.5, 3, p="ab")]

    def quiet(feed: list[object]) -> None:
        m = judged(feed, view())
        assert m.violations == [] and not any("count" in n.kind for n in m.notes), m.notes

    quiet([*runs, *(counted(2.5 + i, 2 + i, busy="p", p="ab") for i in range(2))])  # a step
    quiet([*runs[:1], *start(1, "p"), *both])  # made for no known card: every candidate
    quiet([*runs, counted(1.5, 1.0, p="ab"), counted(2.5, 1.04, p="ab")])  # seen before p ran
    # p moves to b: answers read after its new run began, of observations before
    moved = [*runs, die(2.9, "p"), RequestItem(int(3.1 * S), "controller", "start", "c-p", 204)]
    moved += [EventItem(int(3.2 * S), "start", "e" * 64, "c-p", "p", "b")]
    quiet([*moved, counted(3.5, 2.8, p="ab"), counted(4.5, 2.85, p="ab")])
    # its container started again in between: two runs, each in one observation only
    again = [*runs, counted(2.5, 2, p="ab"), die(2.9, "p"), *start(3.0, "p", card="a")]
    m = judged([*again, counted(3.5, 3.2, p="ab")], view())
    assert m.violations == [] and [n.kind for n in m.notes if "count" in n.kind] == [
        "double_count_once",
        "double_count_once",
    ], m.notes


# ── the proxy on the real daemon ─────────────────────────────────────────────


@pytest.mark.docker
def test_proxy_notes_starts_with_their_answer_and_can_be_cut(
    docker_client: docker.DockerClient, test_image: str, tmp_path: Path
) -> None:
    seen: list[RequestItem] = []
    sock_dir = Path(f"/tmp/vc-proxy-{uuid.uuid4().hex[:8]}")
    sock_dir.mkdir()
    proxy = DockerProxy(sock_dir / "d.sock", _daemon(), seen.append).start()
    name = f"vramctl-test-{uuid.uuid4().hex[:12]}"
    docker_client.containers.create(
        test_image, ["sleep", "60"], name=name, init=True, labels={"vramctl.test": "1"}
    )
    via = docker.DockerClient(base_url=proxy.url, timeout=10)
    try:
        via.api.start(name)
        via.api.start(name)  # already running: 304
        deadline = time.monotonic() + 10
        while [r.status for r in seen] != [204, 304] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(r.kind, r.ref, r.status) for r in seen] == [
            ("start", name, 204),
            ("start", name, 304),
        ]
        proxy.cut()
        with pytest.raises(Exception):  # noqa: B017 - requests' ConnectionError, wrapped or not
            via.api.inspect_container(name)
        with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError):
            s.connect(str(proxy.path))
        proxy.restore()
        assert via.api.inspect_container(name)["State"]["Running"] is True
    finally:
        via.close()
        proxy.close()
        with contextlib.suppress(NotFound):
            docker_client.containers.get(name).remove(force=True)
        sock_dir.rmdir()


def _daemon() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


@pytest.mark.docker
def test_an_mcp_session_flood_leaves_the_controllers_memory_and_the_token_alone(
    docker_client: docker.DockerClient, test_image: str, request: pytest.FixtureRequest
) -> None:
    long = bool(request.config.getoption("--chaos-long"))
    n = int(os.environ.get("VRAMCTL_CHAOS_MCP_SESSIONS") or (10_000 if long else 2_000))
    tmp = Path(f"/tmp/vc-flood-{uuid.uuid4().hex[:8]}")  # short: the proxy's socket path
    tmp.mkdir()
    c = Campaign(docker_client, test_image, tmp, seed=0, ops_max=0, seconds_max=0)
    try:
        c.setup()  # its serves converge under the flood
        c.start_controller()
        assert c.wait_api(60), "the controller never answered"
        result = c.mcp_flood(n)
        exited = c.controller is None or not c.controller.alive()
        c.stop()
        crashes = [m for _t, _run, m in c.controller_log() if "[traceback: " in m]
    finally:
        c.teardown()
    print(f"\nmcp flood: {result.brief()}")
    problems = [*result.problems(), *crashes, *(["the controller exited"] if exited else [])]
    if not problems:
        shutil.rmtree(tmp, ignore_errors=True)
    assert not problems, "\n".join(problems) + f" (logs: {tmp})"


@pytest.mark.docker
def test_the_harness_flags_an_overcommit_made_through_the_controllers_socket(
    docker_client: docker.DockerClient, test_image: str
) -> None:
    """The whole pipeline, without a controller: proxy, event stream, timeline, monitor.

    Starts sent through the proxy socket (as the controller's would be: its client
    and its `up` commands) that take the role over budget are flagged; the driver's
    own start is not; a start through the socket of what the driver started is a
    double start.
    """
    tmp = Path(f"/tmp/vc-harness-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    c = Campaign(docker_client, test_image, tmp, seed=0, ops_max=0, seconds_max=0)
    try:
        c.setup()  # the initial model: res1 3000, res2 2000, ev1 3000, ... of 10000
        via = docker.DockerClient(base_url=c.proxy.url, timeout=30)
        try:
            via.api.start(c.container_name("res1"))
            via.api.start(c.container_name("ev1"))  # 6000
            od1 = c.container_name("od1")
            c.timeline.put(RequestItem(time.time_ns(), "outside", "start", od1))
            docker_client.api.start(od1)  # 10000, by the driver: nobody's fault
            # the `up` begins (its look at the host) once od1 runs: Docker stamped od1's
            # start before answering, so the monitor orders it first, with no window
            up = subprocess.run(
                ["/bin/sh", str(tmp / "up-res2.sh")], capture_output=True, check=False
            )
            assert up.returncode == 0, up.stderr  # 12000: the controller's `up` overcommits
            via.api.start(od1)  # what the driver started before this call: 304
        finally:
            via.close()
        c.timeline.flush()
        m = c.monitor.judge(c.controller_view())  # no controller: no journal, no list
    finally:
        c.teardown()
        shutil.rmtree(tmp, ignore_errors=True)
    assert m.starts == {"controller": 3, "outside": 1}, m.starts
    kinds = sorted(v.kind for v in m.violations)
    assert kinds == ["double_start", "overcommit"], m.violations
    (over,) = [v for v in m.violations if v.kind == "overcommit"]
    assert over.serve == "res2" and "12000 of 10000" in over.detail, over
    # within budget, res1 and ev1 are recounted too: no journaled cycle planned them
    assert [(n.kind, n.serve) for n in m.notes] == [
        ("own_view_over", "res1"),
        ("own_view_over", "ev1"),
    ], m.notes


# ── the campaign ─────────────────────────────────────────────────────────────


def _bounds(request: pytest.FixtureRequest, ops: int, seconds: float) -> tuple[int, float, int]:
    """Operations, seconds and seed of a campaign: the environment's, else ``--chaos-long``'s
    (1000 / 900), else ``ops`` / ``seconds``; the seed ``VRAMCTL_CHAOS_SEED``, else drawn."""
    long = bool(request.config.getoption("--chaos-long"))
    ops = int(os.environ.get("VRAMCTL_CHAOS_OPS") or (1000 if long else ops))
    seconds = float(os.environ.get("VRAMCTL_CHAOS_SECONDS") or (900 if long else seconds))
    seed = int(os.environ.get("VRAMCTL_CHAOS_SEED") or random.SystemRandom().randrange(10**9))
    return ops, seconds, seed


def _campaign(
    kind: type[Campaign],
    docker_client: docker.DockerClient,
    test_image: str,
    bounds: tuple[int, float, int],
) -> None:
    """Run one campaign of ``kind``; fail with its problems, each violation with the
    operations before it (a failed campaign keeps its folder: logs, journal, manifests)."""
    ops, seconds, seed = bounds
    print(f"\nchaos: seed {seed} (replay with VRAMCTL_CHAOS_SEED={seed}), {ops} ops / {seconds:g}s")
    # a short folder: the proxy's unix socket path must stay under 108 bytes
    tmp = Path(f"/tmp/vc-chaos-{seed}-{uuid.uuid4().hex[:6]}")
    tmp.mkdir()
    skip = frozenset(filter(None, os.environ.get("VRAMCTL_CHAOS_SKIP", "").split(",")))
    campaign = kind(docker_client, test_image, tmp, seed, ops, seconds, skip=skip)
    try:
        campaign.setup()
        campaign.run()
        converged = campaign.settle()
        campaign.stop()
    finally:
        campaign.teardown()
    summary = campaign.summary(converged)
    report = os.environ.get("VRAMCTL_CHAOS_REPORT")
    if report:
        Path(report).write_text(json.dumps(summary, indent=1))
    brief = {k: v for k, v in summary.items() if k not in ("ops_log",)}
    print("chaos summary:", json.dumps(brief, indent=1))
    problems = []
    if summary["violations"]:
        problems.append(
            f"{len(summary['violations'])} violation(s): "
            + json.dumps(summary["violations"], indent=1)
        )
    if not converged[0]:
        problems.append(f"the final manifest was not reached: {converged[1]}")
    problems += summary["findings"]
    if not problems:  # a failed campaign keeps its logs, journal and manifests
        shutil.rmtree(tmp, ignore_errors=True)
    assert not problems, f"seed {seed}: " + "\n".join(problems)


@pytest.mark.docker
def test_chaos_campaign(
    docker_client: docker.DockerClient, test_image: str, request: pytest.FixtureRequest
) -> None:
    _campaign(Campaign, docker_client, test_image, _bounds(request, 100, 150))


@pytest.mark.docker
def test_chaos_placement_rounds(
    docker_client: docker.DockerClient, test_image: str, request: pytest.FixtureRequest
) -> None:
    """Three stand-in cards, pinned and placed serves, re-pins and candidates dropped and
    added (``tests/chaos/placement.py``) beside the faults above: no overcommit on any
    card as each container's own card counts it, no double start, no double count in
    the controller's ledgers, and at the end every desired serve on a card it declares
    with ``vramctl plan`` empty. CI-sized: 40 operations / 60 seconds."""
    _campaign(PlacementCampaign, docker_client, test_image, _bounds(request, 40, 60))
