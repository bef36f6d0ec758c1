"""A persistent mapping: an immutable dict whose updates share the unchanged entries.

:class:`PMap` is what :class:`statemachine.ledger.reservations.Ledger` keeps its holdings in: every
ledger operation returns a new ledger, and copying a dict of every holding for each
admit or release made a plan of ``n`` starts cost ``O(n^2)``. A :class:`PMap` is a base
dict plus a small dict of changes (``_delta``); :meth:`PMap.set` and
:meth:`PMap.delete` copy the changes only, and fold them into a new base once there are
more than about the square root of the base's size, so an update costs ``O(sqrt n)``
amortised while lookups stay ``O(1)``.

It reads as a dict built by the same assignments and deletions would: same items,
and the same iteration order (an assigned key keeps its place, a new key comes last, a
key deleted and set again comes last). Neither dict is ever mutated once a
:class:`PMap` holds it, so every earlier version stays valid.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from math import isqrt
from typing import Generic, TypeVar, cast, final

K = TypeVar("K")
V = TypeVar("V")

#: a key of the base deleted in the changes
_GONE = object()

#: changes kept unfolded at least up to this many (below it a fold is never worth it)
_MIN_DELTA = 16


@final
class PMap(Mapping[K, V], Generic[K, V]):
    """An immutable mapping; :meth:`set` and :meth:`delete` return new ones."""

    __slots__ = ("_base", "_delta", "_flat", "_len")

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        self._base: dict[K, V] = dict(items or {})
        self._delta: dict[K, object] = {}
        self._len = len(self._base)
        self._flat: dict[K, V] | None = self._base

    @staticmethod
    def _own(items: dict[K, V]) -> PMap[K, V]:
        """A map of ``items``, which the caller hands over: it never mutates it again
        (no copy, unlike the constructor)."""
        return PMap._of(items, {}, len(items))

    @staticmethod
    def _of(base: dict[K, V], delta: dict[K, object], length: int) -> PMap[K, V]:
        obj: PMap[K, V] = PMap.__new__(PMap)
        obj._base = base
        obj._delta = delta
        obj._len = length
        obj._flat = None if delta else base
        return obj

    # ----- reading -------------------------------------------------------------------
    def __getitem__(self, key: K) -> V:
        if key in self._delta:
            value = self._delta[key]
            if value is _GONE:
                raise KeyError(key)
            return cast(V, value)
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        flat = self._flat
        if flat is not None:  # no changes pending, or folded: one dict says
            return key in flat
        if key in self._delta:
            return self._delta[key] is not _GONE
        return key in self._base

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        """The value of ``key``, or ``default``."""
        flat = self._flat
        if flat is not None:
            return flat.get(key, default)
        if key in self._delta:
            value = self._delta[key]
            return default if value is _GONE else cast(V, value)
        return self._base.get(key, default)

    def getter(self) -> Callable[[K], V | None]:
        """``get`` as the bound method of one dict (the items folded once, then kept):
        for a caller that looks up many keys of the same map."""
        return self._flattened().get

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        return iter(self._flattened())

    def keys(self) -> KeysView[K]:
        """The keys (a view of a dict nothing mutates)."""
        return self._flattened().keys()

    def values(self) -> ValuesView[V]:
        """The values, in order."""
        return self._flattened().values()

    def items(self) -> ItemsView[K, V]:
        """The items, in order."""
        return self._flattened().items()

    def __repr__(self) -> str:
        return f"PMap({self._flattened()!r})"

    def __reduce__(self) -> tuple[type[PMap[K, V]], tuple[dict[K, V]]]:
        # copied and pickled as its items: a deletion pending in the changes is a
        # sentinel known by identity, which a copy of the changes would not keep
        return (PMap, (dict(self._flattened()),))

    def _flattened(self) -> dict[K, V]:
        """The items as one dict (built once per map, then kept; never mutated)."""
        flat = self._flat
        if flat is None:
            flat = dict(self._base)
            for key, value in self._delta.items():
                if value is _GONE:
                    del flat[key]
                else:
                    flat[key] = cast(V, value)
            self._flat = flat
        return flat

    # ----- updates -------------------------------------------------------------------
    def set(self, key: K, value: V) -> PMap[K, V]:
        """A map like this one with ``key`` -> ``value``."""
        changes = self._delta
        if key in changes:
            if changes[key] is _GONE:
                # deleted from the base, set again: it comes last, as in a dict
                flat = dict(self._flattened())
                flat[key] = value
                return PMap._of(flat, {}, len(flat))
            length = self._len
        else:
            length = self._len if key in self._base else self._len + 1
        delta = dict(changes)
        delta[key] = value
        return self._folded(delta, length)

    def delete(self, key: K) -> PMap[K, V]:
        """A map like this one without ``key`` (``KeyError`` when it has none)."""
        if key not in self:
            raise KeyError(key)
        delta = dict(self._delta)
        if key in self._base:
            delta[key] = _GONE
        else:
            del delta[key]  # set since the base: forgetting the change deletes it
        return self._folded(delta, self._len - 1)

    def _folded(self, delta: dict[K, object], length: int) -> PMap[K, V]:
        """The map of base + ``delta``, its changes folded into a new base when many."""
        if len(delta) <= max(_MIN_DELTA, isqrt(len(self._base))):
            return PMap._of(self._base, delta, length)
        flat = PMap._of(self._base, delta, length)._flattened()
        return PMap._of(flat, {}, length)
