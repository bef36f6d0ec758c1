"""A Deferred answers equality as its tuple does (statemachine/planning/deferred.py): whatever it
is compared with, the answer is the one the tuple it stands for gives, so a reader
cannot tell a plan's lazily built list from the tuple. (On the right of ``==`` the left
operand's ``__eq__`` answers first, as it would for the tuple.) Pure: the mutation run's
pool."""

from __future__ import annotations

from statemachine.planning.deferred import Deferred


class _EqualToTheTuple:
    """An object that says it equals one tuple (as a reader's own record type might):
    it answers for a tuple and for nothing else it does not know."""

    def __init__(self, items: tuple[int, ...]) -> None:
        self.items = items

    def __eq__(self, other: object) -> bool:
        return isinstance(other, tuple) and other == self.items

    __hash__ = None  # type: ignore[assignment]


def test_a_deferred_is_equal_to_whatever_its_tuple_is_equal_to() -> None:
    tup = (1, 2)
    d = Deferred(lambda: tup)
    like, unlike = _EqualToTheTuple(tup), _EqualToTheTuple((2, 1))
    assert (tup == like) is True and (tup == unlike) is False  # the tuple's answers
    assert (d == like) is True and (d != like) is False
    assert (d == unlike) is False and (d != unlike) is True


def test_a_deferred_is_unequal_to_what_its_tuple_is_unequal_to() -> None:
    tup = (1, 2)
    d = Deferred(lambda: tup)
    for other in ([1, 2], {1, 2}, "12", None, 3, object()):
        assert (d == other) is (tup == other), other
        assert (d != other) is (tup != other), other
