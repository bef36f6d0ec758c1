"""pytest plugin of the mutation run: the ``mutation`` Hypothesis profile and test order.

Loaded by ``tests/mutation/mutate.py`` with ``-p hypothesis_profile
--hypothesis-profile=mutation``. Derandomized (the same examples for every mutant,
so a score is repeatable), no example database (no mutant learns from another) and
no shrinking (a mutant is killed by the first failing example; its minimal form
does not matter), no per-example deadline and no "too slow" health check (a busy
machine must not kill a mutant). The examples per test stay those each test sets.

The example-based tests (tables, pinned cases) run before the Hypothesis properties,
keeping each file's order otherwise: with ``-x`` most mutants fail a table in well
under a second, and only those the tables miss pay for the properties. The same
tests run either way, so the order changes the time of a run, never its score.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "mutation",
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    print_blob=False,
    # as tests/conftest.py's profile: no wall-clock judgement (a machine busy beside
    # the run must not kill a mutant the tests pass)
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _is_property(item: pytest.Item) -> bool:
    obj = getattr(item, "obj", None)
    if getattr(obj, "is_hypothesis_test", False):
        return True
    cls = getattr(item, "cls", None)  # a RuleBasedStateMachine's TestCase carries settings
    return isinstance(getattr(cls, "settings", None), settings)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_is_property)  # stable: each group keeps the files' order
