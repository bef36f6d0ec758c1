"""The requests a cycle plans (``statemachine.answers.pending.asked_as_of``): those its
observation saw, as they stand now; a request for a serve that had none then is left to
the next cycle (``tests/shell/test_request_after_observation.py`` shows it on the loop).
Pure: the mutation run's pool."""

from __future__ import annotations

from statemachine.answers.pending import asked_as_of
from statemachine.domain.types import OnDemandRequest


def _req(
    serve: str, at: float, ttl: float | None = 300.0, *, released: bool = False
) -> OnDemandRequest:
    return OnDemandRequest(serve, at, ttl, released=released)


def test_a_request_made_after_the_observation_is_left_to_the_next_cycle() -> None:
    assert asked_as_of((), (_req("r", 10.0),)) == ()


def test_a_request_seen_by_the_observation_is_planned_as_it_stands_now() -> None:
    seen = (_req("r", 1.0), _req("s", 2.0))
    renewed = _req("r", 9.0, 600.0)
    assert asked_as_of(seen, (_req("s", 2.0), renewed)) == (_req("s", 2.0), renewed)


def test_a_request_released_since_counts_released_even_if_new() -> None:
    down = _req("r", 9.0, 0.0, released=True)
    assert asked_as_of((_req("r", 1.0),), (down,)) == (down,)
    assert asked_as_of((), (down,)) == (down,)


def test_a_request_ended_since_is_gone() -> None:
    assert asked_as_of((_req("r", 1.0),), ()) == ()
