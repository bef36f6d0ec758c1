"""Victim choice: which committed evictable serves to stop so a requester fits.

``choose_victims`` is a pure function of the candidates and the shortfall per role.
The order of preference (docs/design.md §3) is lexicographic over a candidate set:

1. fewest victims;
2. fewest victims that may be busy: a victim counts as idle only when its count of
   requests in flight is known to be 0 (an unknown count is possibly busy, never idle);
3. cheapest to bring back: fewest victims whose cost is unknown, then the least sum of
   the known costs (``cost_s``: the seconds a victim takes to come back, weighted by
   how recently it was used; the planner computes it, :func:`recency_weight`);
4. least VRAM freed beyond the shortfall (overshoot, summed over the roles short);
5. lower ``priority`` (the most important victim in the set as unimportant as possible);
6. least recently started (the most recent start in the set as old as possible);
7. names (determinism).

The order is written once, in :func:`_key` (a set's key from its figures):
:func:`preference_key`, the exact search and the greedy all compare sets by it.
Where no candidate has a cost, term 3 ties every set of a size: the order is the one
before costs were known.

While there are at most ``exact_limit`` candidates the search is exact: sets are
enumerated by size, sizes that even the largest candidates cannot cover are skipped,
and the first size with a cover yields the best set by the key above (a cover's
victims that may be busy and the MiB it frees are read off tables, and its key is
first built from those and its costs alone; the victims' own terms are computed only
for the covers tied on that). For one short role that size is the fewest largest
candidates that cover, so only its sets are enumerated, and a cover by one victim is
found in one pass. The search reads each candidate by its fields' names, so a
:class:`Row` (a :class:`Candidate`'s fields in a named tuple) serves as well as a
:class:`Candidate`: :func:`victim_names` gives its answer for rows without building a
:class:`Candidate` for each. Beyond the bound a documented greedy is used: *largest
first* (take candidates by MiB, largest first, until every role's shortfall is
covered; of equal MiB the lower priority, then the older start, then the name first),
then *prune* (drop any victim whose removal keeps the cover, smallest first, the name
first of equal MiB)
and *swap* (replace a victim by the smallest unchosen candidate that still covers).
Pruning and swapping only ever lower the count or the MiB freed, so the result is never
worse than largest-first on either. The same greedy is also run over the idle
candidates alone; the best of the four answers (largest-first and improved, over all
candidates and over the idle ones) by the key above is chosen.

Pure: no I/O, no clock, no docker.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate, combinations, compress
from math import fsum
from typing import NamedTuple

DEFAULT_EXACT_LIMIT = 14


@dataclass(frozen=True, slots=True)
class Candidate:
    """A committed evictable serve that may be stopped to make room."""

    name: str
    gpu_roles: tuple[str, ...]
    mib: int
    priority: int = 0
    started_at: float | None = None
    #: requests in flight; ``None`` is unknown (possibly busy), never idle
    in_flight: int | None = None
    #: the seconds it would take to bring back, weighted by how recently it was used
    #: (:func:`recency_weight`); ``None`` is unknown
    cost_s: float | None = None

    @property
    def idle(self) -> bool:
        """True only when the serve is known to have no request in flight."""
        return self.in_flight == 0


class Row(NamedTuple):
    """A candidate as the exact search reads it: a :class:`Candidate`'s fields, by the
    same names, in a plain tuple, so a caller with many candidates need not build an
    object for each (``Candidate(*row)`` is the candidate)."""

    name: str
    gpu_roles: tuple[str, ...]
    mib: int
    priority: int = 0
    started_at: float | None = None
    #: requests in flight; ``None`` is unknown (possibly busy), never idle
    in_flight: int | None = None
    #: the seconds it would take to bring back (weighted); ``None`` is unknown
    cost_s: float | None = None


#: what the order of preference reads of a victim: a :class:`Candidate` or a :class:`Row`
#: (the same fields by name)
Victim = Candidate | Row


def freed(victims: Sequence[Victim], shortfall: Mapping[str, int]) -> dict[str, int]:
    """MiB freed on each role that is short."""
    return {role: sum(v.mib for v in victims if role in v.gpu_roles) for role in shortfall}


def covers(victims: Sequence[Victim], shortfall: Mapping[str, int]) -> bool:
    """True when stopping ``victims`` frees at least the shortfall on every role."""
    got = freed(victims, shortfall)
    return all(got[r] >= need for r, need in shortfall.items())


def overshoot(victims: Sequence[Victim], shortfall: Mapping[str, int]) -> int:
    """MiB freed beyond the shortfall, summed over the roles that are short."""
    got = freed(victims, shortfall)
    return sum(got[r] - need for r, need in shortfall.items())


def possibly_busy(victims: Sequence[Victim]) -> int:
    """How many of ``victims`` may be busy: those not known to be idle (a count of
    requests in flight that is unknown is possibly busy, never idle)."""
    return sum(_busy_flags(victims))


def _busy_flags(victims: Sequence[Victim]) -> list[bool]:
    """Per victim, whether it may be busy (a flag sums as 1): all but those known idle."""
    return [v.in_flight != 0 for v in victims]


#: how long after its last use a victim's cost weighs half (:func:`recency_weight`): five
#: minutes, the keep-alive Ollama and most model servers give an idle model
RECENCY_HALF_S = 300.0


def recency_weight(idle_s: float | None) -> float:
    """How much bringing back a victim idle for ``idle_s`` seconds counts: 1 just used,
    1/2 after :data:`RECENCY_HALF_S`, 1/3 after twice that... (``None``, unknown: 1)."""
    if idle_s is None or idle_s <= 0:
        return 1.0
    return RECENCY_HALF_S / (RECENCY_HALF_S + idle_s)


def restore_key(costs: Sequence[float | None]) -> tuple[int, float]:
    """How many victims' costs are unknown, then the sum of the known ones (exactly
    rounded: the same set sums the same in any order; a cost of 0 adds nothing to it)."""
    return (costs.count(None), fsum(filter(None, costs)))


#: a victim set's place in the order of preference (:func:`_key`), smaller first
PreferenceKey = tuple[
    int, int, tuple[int, float], int, tuple[int, ...], tuple[float, ...], tuple[str, ...]
]


def _key(
    count: int,
    busy: int,
    reload: tuple[int, float],
    over: int,
    priorities: Iterable[int] = (),
    starts: Iterable[float | None] = (),
    names: Sequence[str] = (),
) -> PreferenceKey:
    """The order of preference (the module's docstring), term by term, from a set's
    figures: the one place it is written. Of a set of ``count`` victims, ``busy`` of
    them possibly busy (:func:`possibly_busy`), as dear to bring back as ``reload``
    (:func:`restore_key` of their costs), freeing ``over`` MiB beyond the shortfall
    (:func:`overshoot`), then its victims' ``priorities``, ``starts`` (``None``:
    unknown) and ``names``.

    Without the victims' own figures (the exact search's first comparison of covers,
    whose other figures it reads off its tables) the last terms are empty: that key
    orders sets as the whole key does up to them."""
    if not names:  # the victims' own figures left out, or no victim
        return (count, busy, reload, over, (), (), ())
    return (
        count,
        busy,
        reload,
        over,
        # the most important victim as unimportant as possible, then the next...
        tuple(sorted(priorities, reverse=True)),
        # the most recent start as old as possible (unknown: 0.0, the oldest)
        tuple(sorted([s or 0.0 for s in starts], reverse=True)),
        tuple(sorted(names)),
    )


def preference_key(victims: Sequence[Victim], shortfall: Mapping[str, int]) -> PreferenceKey:
    """The lexicographic preference key of a victim set (smaller is better): :func:`_key`."""
    return _key(
        len(victims),
        possibly_busy(victims),
        restore_key([v.cost_s for v in victims]),
        overshoot(victims, shortfall),
        [v.priority for v in victims],
        [v.started_at for v in victims],
        [v.name for v in victims],
    )


#: a victim set's place in the order by cost (:func:`cost_key`), smaller first
CostKey = tuple[
    int, tuple[int, float], int, int, tuple[int, ...], tuple[float, ...], tuple[str, ...]
]


def cost_key(victims: Sequence[Victim], shortfall: Mapping[str, int]) -> CostKey:
    """The order of preference with the reload cost first: fewest possibly busy, then
    cheapest to bring back, then fewest victims, the rest as :func:`preference_key`.
    The planner compares sets by it where it knows how often each serve is used
    (docs/eviction.md, "Reload costs by use"): two cheap wakes are then taken over one
    dear cold start."""
    key = preference_key(victims, shortfall)
    return (key[1], key[2], key[0], key[3], key[4], key[5], key[6])


def cheapest_cover(
    candidates: Sequence[Candidate], shortfall: Mapping[str, int]
) -> tuple[Candidate, ...] | None:
    """A cover of ``shortfall`` by cost: the idle candidates before the possibly busy,
    each in order of its cost per MiB on the short roles (the cheapest first), taken
    until every role is covered; then a victim whose removal keeps the cover dropped,
    the dearest first. None when a candidate on a short role has no cost (unknown) or
    they do not cover."""
    short = {r: need for r, need in shortfall.items() if need > 0}
    pool = [c for c in candidates if any(r in short for r in c.gpu_roles)]
    if any(c.cost_s is None for c in pool):
        return None

    chosen: list[Candidate] = []
    left = dict(short)
    for c in sorted(pool, key=lambda c: _per_mib(c, short)):
        if all(v <= 0 for v in left.values()):
            break
        if any(left.get(r, 0) > 0 for r in c.gpu_roles):
            chosen.append(c)
            for r in c.gpu_roles:
                if r in left:
                    left[r] -= c.mib
    if any(v > 0 for v in left.values()):
        return None
    for c in sorted(chosen, key=lambda c: (-(c.cost_s or 0.0), c.name)):
        rest = [x for x in chosen if x is not c]
        got = freed(rest, short)
        if all(got[r] >= need for r, need in short.items()):
            chosen = rest
    return tuple(sorted(chosen, key=lambda c: c.name))


def largest_first(
    candidates: Sequence[Candidate], shortfall: Mapping[str, int]
) -> tuple[Candidate, ...] | None:
    """The baseline: take the largest candidates until the shortfall is covered."""
    chosen: list[Candidate] = []
    remaining = dict(shortfall)
    pool = sorted(candidates, key=lambda c: (-c.mib, c.priority, c.started_at or 0.0, c.name))
    for c in pool:
        if all(v <= 0 for v in remaining.values()):
            break
        if not any(remaining.get(r, 0) > 0 for r in c.gpu_roles):
            continue
        chosen.append(c)
        for r in c.gpu_roles:
            if r in remaining:
                remaining[r] -= c.mib
    return tuple(chosen) if all(v <= 0 for v in remaining.values()) else None


def _improve(
    chosen: list[Candidate], candidates: Sequence[Candidate], shortfall: Mapping[str, int]
) -> list[Candidate]:
    # ``got`` is freed(chosen), kept up to date, so each trial is O(roles short) instead
    # of O(victims x roles short); the decisions are exactly those of covers().
    got = freed(chosen, shortfall)

    def covers_after(drop: Candidate, add: Candidate | None = None) -> bool:
        for r, need in shortfall.items():
            g = got[r]
            if r in drop.gpu_roles:
                g -= drop.mib
            if add is not None and r in add.gpu_roles:
                g += add.mib
            if g < need:
                return False
        return True

    def account(c: Candidate, sign: int) -> None:
        for r in c.gpu_roles:
            if r in got:
                got[r] += sign * c.mib

    # prune: drop victims (smallest first) whose removal keeps the cover
    for c in sorted(chosen, key=lambda c: (c.mib, c.name)):
        if covers_after(c):
            chosen = [v for v in chosen if v is not c]
            account(c, -1)
    # swap: replace a victim by the smallest unchosen candidate that still covers
    chosen_ids = {id(c) for c in chosen}
    unchosen = sorted(
        (c for c in candidates if id(c) not in chosen_ids),
        key=_swap_order,
    )
    keys = [_swap_order(c) for c in unchosen]  # kept beside unchosen, for bisect
    for v in sorted(chosen, key=lambda c: (-c.mib, c.name)):
        # a replacement must at least make up what dropping v leaves short on v's
        # roles: the unchosen below that MiB cannot cover, so the walk starts above it
        at = bisect_left(keys, (_least_replacement(v, got, shortfall),))
        for u in unchosen[at:]:
            if u.mib >= v.mib:
                break
            if covers_after(v, u):
                i = unchosen.index(u, at)
                # v is not put back: the later victims are no larger (the walk is largest
                # first) and a walk stops at the first candidate as large as its victim
                del unchosen[i], keys[i]
                chosen = [u if x is v else x for x in chosen]
                account(v, -1)
                account(u, +1)
                break
    return chosen


def _swap_order(c: Candidate) -> tuple[int, int, str]:
    """The order the swap tries unchosen candidates in: smallest first."""
    return (c.mib, c.priority, c.name)


def _least_replacement(v: Candidate, got: Mapping[str, int], shortfall: Mapping[str, int]) -> int:
    """The least MiB a candidate replacing ``v`` needs: what dropping ``v`` leaves short
    on one of its roles (0 when dropping it leaves none short)."""
    return max(
        (need - (got[r] - v.mib) for r, need in shortfall.items() if r in v.gpu_roles),
        default=0,
    )


def _fewest(give: Sequence[int], need: int) -> int:
    """The fewest entries of ``give`` (largest first) whose sum reaches ``need``
    (``len(give) + 1`` when even all of them do not)."""
    # the running sums of the largest first; the first that reaches the need is the
    # k-th (k = its index + 1), and none reaching it gives len + 1
    return bisect_left(list(accumulate(sorted(give, reverse=True))), need) + 1


def choose_victims(
    candidates: Sequence[Candidate],
    shortfall: Mapping[str, int],
    *,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
) -> tuple[Candidate, ...] | None:
    """The best victim set covering ``shortfall`` (role -> MiB), or None if none covers.

    Only roles with a positive shortfall matter; an empty shortfall needs no victims.
    """
    short = {r: need for r, need in shortfall.items() if need > 0}
    if not short:
        return ()
    if len(short) == 1:
        (role,) = short
        pool = [c for c in candidates if role in c.gpu_roles]
    else:
        pool = [c for c in candidates if any(r in short for r in c.gpu_roles)]
    if len(pool) > exact_limit:
        return _greedy(pool, short)
    picks = exact_cover(pool, short)  # a Candidate reads as a row
    return None if picks is None else tuple(pool[i] for i in picks)


def _greedy(pool: list[Candidate], short: Mapping[str, int]) -> tuple[Candidate, ...] | None:
    """The documented greedy over ``pool`` (every candidate on a short role)."""
    baseline = largest_first(pool, short)
    if baseline is None:
        return None
    answers = [tuple(_improve(list(baseline), pool, short)), baseline]
    idle = [c for c in pool if c.idle]
    idle_first = largest_first(idle, short)
    if idle_first is not None:  # the idle candidates alone cover it
        answers += [tuple(_improve(list(idle_first), idle, short)), idle_first]
    best = min(answers, key=lambda s: preference_key(s, short))
    return tuple(sorted(best, key=lambda c: c.name))


def exact_cover(rows: Sequence[Victim], short: Mapping[str, int]) -> tuple[int, ...] | None:
    """The best cover of ``short`` (role -> MiB, every need positive) among ``rows``, by
    the order of preference, as indices into ``rows`` in the order of their names; None
    when even all of them do not cover. Every row is on a short role (the search does
    not look for one that is not): :func:`choose_victims`' search up to its bound."""
    if len(short) == 1:
        ((_role, need),) = short.items()
        return _one_role(rows, need)
    return _many_roles(rows, short)


def _one_role(rows: Sequence[Victim], need: int) -> tuple[int, ...] | None:
    """:func:`exact_cover` for one short role (``need`` on it; every row is on it).

    Only the fewest largest rows that cover fix the size: no fewer rows cover, and
    those do, so every cover of that size is a candidate answer and no other is (one
    row that covers alone: the rows that do, in one pass)."""
    mib = [row.mib for row in rows]
    if max(mib, default=0) >= need:
        # one row covers: the best of those that do, each a set of one (possibly busy
        # unless its count is known to be 0, as _busy_flags says)
        return _first(
            rows,
            [
                (_key(1, row.in_flight != 0, restore_key((row.cost_s,)), row.mib - need), (i,))
                for i, row in enumerate(rows)
                if row.mib >= need
            ],
        )
    least = _fewest(mib, need)
    if least > len(rows):
        return None
    busy = _busy_flags(rows)
    # each cover of that size with its (possibly busy, MiB freed): combinations() of the
    # indices, the MiB and the busy flags yield the same picks in the same order: each
    # set's figures are summed from its own tuples
    heads = [
        (sum(flags), got, picks)
        for picks, gives, flags in zip(
            combinations(range(len(rows)), least),
            combinations(mib, least),
            combinations(busy, least),
            strict=True,
        )
        if (got := sum(gives)) >= need
    ]
    return _best(rows, heads, need)


def _many_roles(rows: Sequence[Victim], short: Mapping[str, int]) -> tuple[int, ...] | None:
    """:func:`exact_cover` for several short roles, by enumeration: the first size with
    a cover holds the best set by the order."""
    # what each row frees on each short role, by index: a set covers when, on every
    # role, the sum of its rows reaches the need (covers() without the walk)
    gives = [
        ([row.mib if r in row.gpu_roles else 0 for row in rows], need) for r, need in short.items()
    ]
    # sizes below the fewest of each role's largest rows that cover it cannot cover;
    # more than all the rows: even all of them do not
    least = max(_fewest(give, need) for give, need in gives)
    if least > len(rows):
        return None
    busy = _busy_flags(rows)
    (first, first_need), *rest = gives
    # all the rows cover, so some size up to that has a cover: the loop returns
    for k in range(least, len(rows) + 1):
        # the sets of size k that cover the first role: what each frees on it, in the
        # order combinations() yields the sets (of its column and of the indices alike)
        on_first = map(first_need.__le__, map(sum, combinations(first, k)))
        heads: list[_Head] = []
        for picks in compress(combinations(range(len(rows)), k), on_first):
            freed_mib = sum(map(first.__getitem__, picks))
            for give, need in rest:
                got = sum(map(give.__getitem__, picks))
                if got < need:
                    break  # covers(combo, short) is False, read off the table
                freed_mib += got
            else:
                heads.append((sum(map(busy.__getitem__, picks)), freed_mib, picks))
        if heads:
            return _best(rows, heads, sum(short.values()))
    return None  # unreachable: all the rows are a cover of the last size


#: a cover as the exact search reads it off its tables: how many of its rows may be
#: busy, the MiB it frees on the short roles, its rows (indices)
_Head = tuple[int, int, tuple[int, ...]]


def _best(rows: Sequence[Victim], heads: list[_Head], need: int) -> tuple[int, ...]:
    """The best of covers of one size by the order, ``need`` the shortfall summed over
    the short roles, as indices in the order of their names (:func:`_first`)."""
    size = len(heads[0][2])
    cost = [row.cost_s for row in rows]
    # where no row has a cost, every cover's costs are all unknown: one figure for all
    alike = None if cost.count(None) < len(cost) else restore_key((None,) * size)
    keyed = [
        (_key(size, busy, alike or restore_key([cost[i] for i in picks]), got - need), picks)
        for busy, got, picks in heads
    ]
    return tuple(sorted(_first(rows, keyed), key=lambda i: rows[i].name))


def _first(
    rows: Sequence[Victim], keyed: list[tuple[PreferenceKey, tuple[int, ...]]]
) -> tuple[int, ...]:
    """The first by the order of covers of one size, each with its key from its figures
    (:func:`_key` without the victims' own): the least, or, where covers tie on it, the
    least of those by the whole key."""
    least, best = min(keyed)
    tied = [picks for key, picks in keyed if key == least]
    if len(tied) > 1:  # alike but for the victims' own figures
        count, busy, reload, over, *_ = least
        best = min(
            tied,
            key=lambda p: _key(
                count,
                busy,
                reload,
                over,
                [rows[i].priority for i in p],
                [rows[i].started_at for i in p],
                [rows[i].name for i in p],
            ),
        )
    return best


def victim_names(
    rows: Sequence[Row], short: Mapping[str, int], *, exact_limit: int = DEFAULT_EXACT_LIMIT
) -> tuple[str, ...] | None:
    """:func:`choose_victims`' answer for candidates given as rows, each on a role of
    ``short`` (every need positive): the victims' names in order, or None if none
    covers. Up to ``exact_limit`` rows no :class:`Candidate` is built."""
    if len(rows) > exact_limit:
        chosen = _greedy([Candidate(*row) for row in rows], short)
        return None if chosen is None else tuple(c.name for c in chosen)
    picks = exact_cover(rows, short)
    return None if picks is None else tuple([rows[i].name for i in picks])


def cheapest_mixed_cover(
    stopped: Sequence[Candidate], slept: Sequence[Candidate], shortfall: Mapping[str, int]
) -> tuple[tuple[Candidate, ...], frozenset[str]] | None:
    """A cover of ``shortfall`` by cost where each candidate may sleep or stop, and which
    of its victims sleep. ``stopped`` and ``slept`` are the same candidates, in the same
    order: as a stop frees and costs, and as a sleep does (one that cannot sleep the same
    in both). A candidate that can sleep is weighed as its sleep and, apart, the rest of
    its stop (:func:`_rest`); the parts are taken as :func:`cheapest_cover` takes
    candidates (:func:`_per_mib`) until covered, the rest of a stop stopping its
    candidate outright. Then, the dearest stop first, a victim the cover does not need
    is dropped, or else its stop turned back into its sleep where that covers. None when
    a cost is unknown on a short role or they do not cover. The victims come back as
    weighed (a sleeper as in ``slept``)."""
    short = {r: need for r, need in shortfall.items() if need > 0}
    pairs = {a.name: (a, b) for a, b in zip(stopped, slept, strict=True) if _on(a, short)}
    parts = [b for _, b in pairs.values()] + [_rest(a, b) for a, b in pairs.values() if a != b]
    if any(p.cost_s is None for p in parts):
        return None
    taken: dict[str, Candidate] = {}
    for part in sorted(parts, key=lambda p: _per_mib(p, short)):
        if covers(list(taken.values()), short):
            break
        a, b = pairs[part.name]
        taken[part.name] = b if part is b and part.name not in taken else a
    if not covers(list(taken.values()), short):
        return None
    for name in sorted(taken, key=lambda n: restore_key([pairs[n][0].cost_s]), reverse=True):
        a, b = pairs[name]
        for less in ({}, {name: b}) if taken[name] is not b else ({},):
            trial = {n: c for n, c in taken.items() if n != name} | less
            if covers(list(trial.values()), short):
                taken = trial
                break
    asleep = frozenset(n for n, c in taken.items() if c != pairs[n][0])
    return tuple(sorted(taken.values(), key=lambda c: c.name)), asleep


def _rest(stop: Candidate, sleep: Candidate) -> Candidate:
    """What stopping a candidate frees and costs beyond putting it to sleep: its residual,
    at its cold start's cost beyond its wake's (unknown where either is)."""
    a, b = stop.cost_s, sleep.cost_s
    return replace(stop, mib=stop.mib - sleep.mib, cost_s=None if a is None or b is None else a - b)


def _on(c: Candidate, short: Mapping[str, int]) -> bool:
    return any(r in short for r in c.gpu_roles)


def _per_mib(c: Candidate, short: Mapping[str, int]) -> tuple[bool, float, str]:
    """The order the cheapest covers take candidates in: the idle before the possibly
    busy, then each by its cost per MiB on the short roles, the cheapest first."""
    mib = sum(c.mib for r in c.gpu_roles if r in short)
    return (not c.idle, (c.cost_s or 0.0) / max(1, mib), c.name)
