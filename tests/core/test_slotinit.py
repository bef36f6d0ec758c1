"""direct_init: the same frozen dataclass, built by a faster __init__ of the same signature."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from dataclasses import InitVar, dataclass, field

import pytest

from statemachine.domain.slotinit import direct_init
from statemachine.ledger.reservations import GpuReservation, RoleTerms
from statemachine.planning.plan_types import Action, Blocked, Protected, Step


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "b"
    c: tuple[int, ...] = ()


@direct_init
@dataclass(frozen=True, slots=True)
class _Fast:
    a: int
    b: str = "b"
    c: tuple[int, ...] = ()


def test_same_signature_as_the_dataclass_init() -> None:
    assert str(inspect.signature(_Fast.__init__)) == str(inspect.signature(_Plain.__init__))
    for cls in (Step, Protected, Blocked, GpuReservation, RoleTerms):
        names = [f.name for f in dataclasses.fields(cls)]
        params = list(inspect.signature(cls.__init__).parameters)[1:]
        assert params == names, cls


def test_sets_every_field_positionally_by_keyword_and_by_default() -> None:
    assert (_Fast(1).a, _Fast(1).b, _Fast(1).c) == (1, "b", ())
    x = _Fast(2, "x", (3,))
    assert (x.a, x.b, x.c) == (2, "x", (3,))
    y = _Fast(c=(4,), a=5)
    assert (y.a, y.b, y.c) == (5, "b", (4,))
    with pytest.raises(TypeError):
        _Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Fast(1, "b", (), 4)  # type: ignore[call-arg]


def test_still_frozen_equal_hashable_copyable_and_picklable() -> None:
    step = Step(Action.START, "a", ("gpu0",), 100, "why", None, "a", None)
    twin = Step(
        action=Action.START, serve="a", gpu_roles=("gpu0",), mib=100, reason="why", group="a"
    )
    assert step == twin and hash(step) == hash(twin)
    assert repr(step) == (
        "Step(action=<Action.START: 'start'>, serve='a', gpu_roles=('gpu0',), mib=100, "
        "reason='why', to_mib=None, group='a', host_mib=None)"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.mib = 1  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(step)) == step
    assert copy.deepcopy(step) == step
    assert dataclasses.replace(step, mib=7).mib == 7
    assert Blocked("a", "r").protected == () and Blocked("a", "r").terms == ()


def test_refuses_what_it_cannot_build() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True)
    class NoInit:
        a: int = field(default=0, init=False)

    @dataclass(frozen=True, slots=True)
    class KwOnly:
        a: int = field(kw_only=True)

    @dataclass(frozen=True, slots=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: InitVar[int]

    for cls in (NoSlots, NotFrozen, Factory, NoInit, KwOnly, Post, WithInitVar):
        with pytest.raises(TypeError, match=cls.__name__):
            direct_init(cls)
    with pytest.raises(TypeError, match="int"):
        direct_init(int)


@dataclass(frozen=True, slots=True)
class _Base:
    a: int


@direct_init
@dataclass(frozen=True, slots=True)
class _Derived(_Base):
    b: str


def test_a_field_a_dataclass_base_declares_is_set_in_its_slot() -> None:
    got = _Derived(1, "x")
    assert (got.a, got.b) == (1, "x")
    assert got == _Derived(a=1, b="x") and got != _Derived(2, "x")
    assert dataclasses.replace(got, a=3) == _Derived(3, "x")
    terms = RoleTerms(
        reserve_mib=1,
        budget_mib=9,
        committed_mib=2,
        free_mib=7,
        reservations=(),
        requested_mib=3,
        shortfall_mib=0,
        gpu_role="g",
        capacity_mib=10,
    )
    assert (terms.reserve_mib, terms.gpu_role, terms.capacity_mib) == (1, "g", 10)
