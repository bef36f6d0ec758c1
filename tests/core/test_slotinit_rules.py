"""direct_init's rules the mutation run pins (statemachine/domain/slotinit.py): a dataclass
without fields still gets an ``__init__`` (of no arguments, as the dataclass's own).
Pure: the mutation run's pool."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest

from statemachine.domain.slotinit import direct_init


def test_a_dataclass_without_fields_gets_an_init_of_no_arguments() -> None:
    @direct_init
    @dataclass(frozen=True, slots=True)
    class Empty:
        pass

    assert list(inspect.signature(Empty.__init__).parameters) == ["self"]
    assert Empty() == Empty()
    with pytest.raises(TypeError):
        Empty(1)  # type: ignore[call-arg]
