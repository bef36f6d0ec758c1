"""pytest plugin of the mutation run: the ``mutation`` Hypothesis profile.

Loaded by ``tests/mutation/mutate.py`` with ``-p hypothesis_profile
--hypothesis-profile=mutation``. Derandomized (the same examples for every mutant,
so a score is repeatable), no example database (no mutant learns from another) and
no shrinking (a mutant is killed by the first failing example; its minimal form
does not matter). The examples per test stay those each test sets.
"""

from __future__ import annotations

from hypothesis import Phase, settings

settings.register_profile(
    "mutation",
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    print_blob=False,
)
