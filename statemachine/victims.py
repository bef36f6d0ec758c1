"""Victim choice: which committed evictable serves to stop so a requester fits.

``choose_victims`` is a pure function of the candidates and the shortfall per role.
The order of preference (docs/design.md §3) is lexicographic over a candidate set:

1. fewest victims;
2. fewest victims that may be busy: a victim counts as idle only when its count of
   requests in flight is known to be 0 (an unknown count is possibly busy, never idle);
3. cheapest to bring back: fewest victims whose cost is unknown, then the least sum of
   the known costs (``cost_s``: the seconds a victim takes to come back, weighted by
   how recently it was used; the planner computes it, :func:`reload_weight`);
4. least VRAM freed beyond the shortfall (overshoot, summed over the roles short);
5. lower ``priority`` (the most important victim in the set as unimportant as possible);
6. least recently started (the most recent start in the set as old as possible);
7. names (determinism).

Where no candidate has a cost, term 3 ties every set of a size: the order is the one
before costs were known.

While there are at most ``exact_limit`` candidates the search is exact: sets are
enumerated by size, sizes that even the largest candidates cannot cover are skipped,
and the first size with a cover yields the best set by the key above (a cover's
victims that may be busy and its overshoot are read off tables first; the whole key
is computed only for the covers best on those). For one short role that size is the
fewest largest candidates that cover, so only its sets are enumerated, and a cover by
one victim is found in one pass. The search reads candidates as plain rows
(:data:`Row`, a :class:`Candidate`'s fields): :func:`victim_names` gives its answer for
rows without building a :class:`Candidate` for each. Beyond the
bound a documented greedy is used: *largest first* (take candidates by MiB, largest
first, until every role's shortfall is covered), then *prune* (drop any victim whose
removal keeps the cover, smallest first) and *swap* (replace a victim by the smallest
unchosen candidate that still covers). Pruning and swapping only ever lower the count
or the MiB freed, so the result is never worse than largest-first on either. The same
greedy is also run over the idle candidates alone; the best of the four answers
(largest-first and improved, over all candidates and over the idle ones) by the key
above is chosen.

Pure: no I/O, no clock, no docker.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, combinations, compress
from math import fsum

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
    #: (:func:`reload_weight`); ``None`` is unknown
    cost_s: float | None = None

    @property
    def idle(self) -> bool:
        """True only when the serve is known to have no request in flight."""
        return self.in_flight == 0


def freed(victims: Sequence[Candidate], shortfall: Mapping[str, int]) -> dict[str, int]:
    """MiB freed on each role that is short."""
    return {role: sum(v.mib for v in victims if role in v.gpu_roles) for role in shortfall}


def covers(victims: Sequence[Candidate], shortfall: Mapping[str, int]) -> bool:
    """True when stopping ``victims`` frees at least the shortfall on every role."""
    got = freed(victims, shortfall)
    return all(got[r] >= need for r, need in shortfall.items())


def overshoot(victims: Sequence[Candidate], shortfall: Mapping[str, int]) -> int:
    """MiB freed beyond the shortfall, summed over the roles that are short."""
    got = freed(victims, shortfall)
    return sum(got[r] - need for r, need in shortfall.items())


def possibly_busy(victims: Sequence[Candidate]) -> int:
    """How many of ``victims`` are not known to be idle."""
    return sum(1 for v in victims if not v.idle)


#: how long after its last use a victim's cost weighs half (:func:`reload_weight`): five
#: minutes, the keep-alive Ollama and most model servers give an idle model
RECENCY_HALF_S = 300.0


def reload_weight(idle_s: float | None) -> float:
    """How much bringing back a victim idle for ``idle_s`` seconds counts: 1 just used,
    1/2 after :data:`RECENCY_HALF_S`, 1/3 after twice that... (``None``, unknown: 1)."""
    if idle_s is None or idle_s <= 0:
        return 1.0
    return RECENCY_HALF_S / (RECENCY_HALF_S + idle_s)


def reload_key(costs: Sequence[float | None]) -> tuple[int, float]:
    """How many victims' costs are unknown, then the sum of the known ones (exactly
    rounded: the same set sums the same in any order)."""
    return (sum(1 for c in costs if c is None), fsum(c for c in costs if c is not None))


def preference_key(
    victims: Sequence[Candidate], shortfall: Mapping[str, int]
) -> tuple[int, int, tuple[int, float], int, tuple[int, ...], tuple[float, ...], tuple[str, ...]]:
    """The lexicographic preference key of a victim set (smaller is better)."""
    return (
        len(victims),
        possibly_busy(victims),
        reload_key([v.cost_s for v in victims]),
        overshoot(victims, shortfall),
        tuple(sorted((v.priority for v in victims), reverse=True)),
        tuple(sorted((v.started_at or 0.0 for v in victims), reverse=True)),
        tuple(sorted(v.name for v in victims)),
    )


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
                del unchosen[i], keys[i]
                i = bisect_left(keys, _swap_order(v))
                unchosen.insert(i, v)
                keys.insert(i, _swap_order(v))
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
    rows = [
        (c.name, c.gpu_roles, c.mib, c.priority, c.started_at, c.in_flight, c.cost_s) for c in pool
    ]
    picks = exact_cover(rows, short)
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


#: A candidate as the exact search reads it: a :class:`Candidate`'s fields in order
#: (name, gpu_roles, mib, priority, started_at, in_flight, cost_s) as a plain tuple, so a
#: caller with many candidates need not build an object for each (``Candidate(*row)``).
Row = tuple[str, tuple[str, ...], int, int, float | None, int | None, float | None]


def exact_cover(rows: Sequence[Row], short: Mapping[str, int]) -> tuple[int, ...] | None:
    """The best cover of ``short`` (role -> MiB, every need positive) among ``rows``, by
    the order of preference, as indices into ``rows`` in the order of their names; None
    when even all of them do not cover. Every row is on a short role (the search does
    not look for one that is not): :func:`choose_victims`' search up to its bound."""
    if len(short) == 1:
        ((_role, need),) = short.items()
        return _one_role(rows, need)
    return _many_roles(rows, short)


def _one_role(rows: Sequence[Row], need: int) -> tuple[int, ...] | None:
    """:func:`exact_cover` for one short role (``need`` on it; every row is on it).

    Only the fewest largest rows that cover fix the size: no fewer rows cover, and
    those do, so every cover of that size is a candidate answer and no other is."""
    mib = [row[2] for row in rows]
    # one victim covers (the need is positive): the best single cover, by the order's
    # terms for one victim
    if max(mib, default=0) >= need:
        best = min(
            (
                row[5] != 0,
                reload_key((row[6],)),
                row[2],
                row[3],
                row[4] or 0.0,
                row[0],
                i,
            )
            for i, row in enumerate(rows)
            if row[2] >= need
        )
        return (best[-1],)
    least = _fewest(mib, need)
    if least > len(rows):
        return None
    busy = [0 if row[5] == 0 else 1 for row in rows]
    # each cover of that size with the key's (possibly busy, MiB freed): what it frees
    # orders covers as its overshoot does (the need is one figure for all of them).
    # combinations() of the indices, the MiB and the busy flags yield the same picks
    # in the same order: each set's figures are summed from its own tuples
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
    return _best(rows, heads)


def _many_roles(rows: Sequence[Row], short: Mapping[str, int]) -> tuple[int, ...] | None:
    """:func:`exact_cover` for several short roles, by enumeration: the first size with
    a cover holds the best set by the order."""
    # what each row frees on each short role, by index: a set covers when, on every
    # role, the sum of its rows reaches the need (covers() without the walk)
    gives = [([row[2] if r in row[1] else 0 for row in rows], need) for r, need in short.items()]
    # sizes below the fewest of each role's largest rows that cover it cannot cover;
    # more than all the rows: even all of them do not
    least = max(_fewest(give, need) for give, need in gives)
    if least > len(rows):
        return None
    busy = [0 if row[5] == 0 else 1 for row in rows]
    (first, first_need), *rest = gives
    # all the rows cover, so some size up to that has a cover: the loop returns
    for k in range(least, len(rows) + 1):
        # the sets of size k that cover the first role: what each frees on it, in the
        # order combinations() yields the sets (of its column and of the indices alike)
        on_first = map(first_need.__le__, map(sum, combinations(first, k)))
        heads = []
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
            return _best(rows, heads)
    return None  # unreachable: all the rows are a cover of the last size


def _best(rows: Sequence[Row], heads: list[tuple[int, int, tuple[int, ...]]]) -> tuple[int, ...]:
    """The best of covers of one size, each as (possibly busy, MiB freed, picks): the
    best on those first (with the cost to bring back between them where some row has a
    cost), then on the rest of the key (priorities, starts, names)."""
    least_busy = min(h[0] for h in heads)
    idle = [(f, picks) for b, f, picks in heads if b == least_busy]
    if any(row[6] is not None for row in rows):
        # the cost to bring back, then the MiB freed (what orders the overshoot: the
        # need is one figure for all of them)
        keyed = [((reload_key([rows[i][6] for i in picks]), f), picks) for f, picks in idle]
        least = min(k for k, _ in keyed)
        tied = [picks for k, picks in keyed if k == least]
    else:
        least_freed = min(f for f, _ in idle)
        tied = [picks for f, picks in idle if f == least_freed]
    # (the rest of the key is computed only where covers tie on those)
    best = tied[0] if len(tied) == 1 else min(tied, key=lambda p: _rest_of_key(rows, p))
    return tuple(sorted(best, key=lambda i: rows[i][0]))


def _rest_of_key(
    rows: Sequence[Row], picks: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[float, ...], tuple[str, ...]]:
    """The end of :func:`preference_key` for the rows ``picks``: priorities highest
    first, starts latest first (unknown as 0), names."""
    chosen = [rows[i] for i in picks]
    return (
        tuple(sorted((row[3] for row in chosen), reverse=True)),
        tuple(sorted((row[4] or 0.0 for row in chosen), reverse=True)),
        tuple(sorted(row[0] for row in chosen)),
    )


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
    return None if picks is None else tuple(rows[i][0] for i in picks)
