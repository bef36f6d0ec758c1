"""pytest plugin of the mutation run: the line map, and the tests one mutant runs.

Loaded by ``tests/mutation/mutate.py`` with ``-p selection``; does nothing unless one
of its two variables is set:

``VRAMCTL_MUTATION_MAP=<file>``
    the unmutated run: coverage (its C tracer) measures ``statemachine/`` (or the
    folders ``VRAMCTL_MUTATION_MEASURE`` names, comma-separated) with one
    dynamic context per test (the test's node id), and at the end the plugin writes
    to ``<file>`` (JSON) which tests ran each line, each test's time and the lines run
    outside every test (at import and collection: a module's constants, its ``def``
    lines with their defaults).
``VRAMCTL_MUTATION_TESTS=<file>``
    a mutant's run: ``<file>`` holds a JSON list of node ids; only those tests run,
    in that order (the fastest first: most mutants fail the first test that reaches
    them). A listed test that is not collected is a usage error (exit 4): a mutant is
    never judged on fewer tests than it was given.

It only measures and selects; which tests a mutant gets is decided by ``mutate.py``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_state: dict[str, Any] = {"cov": None, "seconds": {}}


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("VRAMCTL_MUTATION_MAP"):
        return
    import coverage  # the dev extra's; only the map run needs it

    folders = os.environ.get("VRAMCTL_MUTATION_MEASURE", "statemachine").split(",")
    cov = coverage.Coverage(
        data_file=None,
        config_file=False,
        include=[str(Path.cwd() / folder / "*.py") for folder in folders],
    )
    cov.start()
    _state["cov"] = cov


def _module_key(path: Path) -> str:
    """``ledger`` for statemachine/ledger/reservations.py (``engines.vllm`` below it), the dotted
    path for the shell's modules (``controller.service.sleeping``): the names mutation.toml
    gives them."""
    relative = path.resolve().relative_to(Path.cwd().resolve()).with_suffix("")
    if relative.parts[0] == "statemachine":
        return ".".join(relative.parts[1:])
    return ".".join(relative.parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    cov = _state["cov"]
    if cov is None:
        yield
        return
    cov.switch_context(item.nodeid)
    t0 = time.perf_counter()
    yield
    _state["seconds"][item.nodeid] = time.perf_counter() - t0
    cov.switch_context("")


def pytest_unconfigure(config: pytest.Config) -> None:
    cov = _state["cov"]
    if cov is None:
        return
    cov.stop()
    data = cov.get_data()
    lines: dict[str, dict[str, list[str]]] = {}
    outside: dict[str, list[int]] = {}
    for filename in data.measured_files():
        module = _module_key(Path(filename))
        by_line = data.contexts_by_lineno(filename)
        lines[module] = {str(n): sorted(c for c in cs if c) for n, cs in by_line.items()}
        outside[module] = sorted(n for n, cs in by_line.items() if "" in cs)
    Path(os.environ["VRAMCTL_MUTATION_MAP"]).write_text(
        json.dumps({"lines": lines, "outside": outside, "seconds": _state["seconds"]})
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    chosen = os.environ.get("VRAMCTL_MUTATION_TESTS")  # read here: a warm process's
    if not chosen:  # fork sets it per mutant (tests/mutation/forkserver.py)
        return
    if session.testsfailed:  # a test file no longer imports: the mutant broke it, and
        return  # pytest stops on the collection error (exit 2: killed), not a usage error
    wanted: list[str] = json.loads(Path(chosen).read_text())
    by_id = {item.nodeid: item for item in items}
    missing = [n for n in wanted if n not in by_id]
    if missing:
        raise pytest.UsageError(f"mutation run: tests not collected: {', '.join(missing[:5])}")
    keep = set(wanted)
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in keep])
    items[:] = [by_id[n] for n in wanted]
