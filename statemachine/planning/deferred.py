"""A tuple built when first read: :class:`Deferred`.

The planner's blocked entries list who may not be stopped (``Blocked.protected``). For a
serve that may stop nothing (backfill, residents) that is every holder on its short
roles, so a plan with ``n`` blocked backfill serves on full GPUs built ``O(n)`` entries
for each of them, most never read (a reconcile tick reads the steps, not the reasons).
A :class:`Deferred` holds a pure function of immutable inputs instead and builds the
tuple once, when something reads it.

It stands for that tuple: equal to whatever the tuple is equal to (the tuple itself,
another Deferred of an equal tuple; not a list), the same hash, the same ``repr``, and
the same answers to ``len``, indexing, slicing (a tuple), iteration and ``in``. It
must be given a function without side effects whose inputs nothing changes afterwards.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar, final, overload

T = TypeVar("T")


@final
class Deferred(Sequence[T], Generic[T]):
    """The tuple ``build()`` returns, built on first read and then kept."""

    __slots__ = ("_build", "_items")

    def __init__(self, build: Callable[[], tuple[T, ...]]) -> None:
        self._build: Callable[[], tuple[T, ...]] | None = build
        self._items: tuple[T, ...] = ()

    def items(self) -> tuple[T, ...]:
        """The tuple itself."""
        build = self._build
        if build is not None:
            self._items = build()
            self._build = None
        return self._items

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        return self.items()[index]

    def __len__(self) -> int:
        return len(self.items())

    def __iter__(self) -> Iterator[T]:
        return iter(self.items())

    def __contains__(self, value: object) -> bool:
        return value in self.items()

    def __eq__(self, other: object) -> bool:
        # the tuple's own answer, whatever other is: a tuple hands the question back to
        # another Deferred (its __eq__ does not know it), which answers with its tuple
        return self.items() == other

    def __hash__(self) -> int:
        return hash(self.items())

    def __repr__(self) -> str:
        return repr(self.items())

    def __reduce__(self) -> tuple[type[tuple[T, ...]], tuple[tuple[T, ...]]]:
        # copied and pickled as the tuple it stands for (its build may be a closure)
        return (tuple, (self.items(),))
