"""The test stand-ins speak the engines' own protocols, as their public source has them.

Every route, query parameter, body field, error body, flag and metric name that the
stand-ins (``tests/fake_engine.py``; ``FakeEngineMetrics`` in ``tests/fake_http.py``) and
the engine registry (``statemachine/engines/vllm.py``, ``sglang.py``) use of vLLM's and
SGLang's protocols is a row of ``tests/fixtures/engine_contract.toml``: the fact as they
use it, the places that use it (``users``: the probes below, which read the registry's
objects, the stand-ins' constants, their answers to a few requests, or their source), and
where the engine says so: repository, file, commit and ``quote``, the part of one line of
that file at that commit that shows it. Only that one line is kept, not the upstream code.

The upstream files were read each at its own commit, not from one checkout (full hashes
in the table):

- vllm-project/vllm ``09cb327f`` (``vllm/entrypoints/serve/sleep/api_router.py``,
  ``serve/rpc/api_router.py``, ``serve/cache/api_router.py``), ``005a810b``
  (``vllm/v1/metrics/loggers.py``), ``01181ddf`` (``docs/features/sleep_mode.md``);
- sgl-project/sglang ``9c0549b7`` (``python/sglang/srt/entrypoints/http_server.py``),
  ``c20e3fec`` (``srt/managers/scheduler_update_weights_mixin.py``), ``123c0bc9``
  (``srt/constants.py``), ``00ae9c15`` (``srt/metrics/collector.py``), ``067bfe93``
  (``docs/advanced_features/sglang_for_rl.md``).

Offline, with no upstream checkout, the test asserts that each fact is what every one of
its users uses, that its quote shows it, that every route, tag, flag and in-flight metric
the stand-ins and the registry declare has a row (a new one needs its citation), and that
each recorded ``[[difference]]`` (a stand-in that does not say what the cited source
says) still stands. Renaming a route or a metric in a stand-in or the registry fails it.

To refresh the citations: in a clone of each repository, for each row, ``git show
COMMIT:FILE | grep -F QUOTE`` at a newer commit; set ``commit`` (and ``file`` or ``quote``
where the source moved or changed), update the list above and the line naming the commits
in the registry module's docstring. A difference whose stand-in is brought in line
becomes a ``[[fact]]``.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fake_engine
import pytest
from fake_engine import FakeEngine
from fake_http import FakeEngineMetrics, Recorded, Reply, ReplyLike
from prometheus_client.parser import text_string_to_metric_families

from statemachine import engines
from statemachine.engines.spec import HttpCall, SleepApi

TABLE = Path(__file__).resolve().parents[1] / "fixtures" / "engine_contract.toml"
REPOS = {"vllm": "vllm-project/vllm", "sglang": "sgl-project/sglang"}
FAKE_SOURCE = Path(fake_engine.__file__).read_text(encoding="utf-8")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Fact:
    """One row of ``[[fact]]``: see the table's header."""

    id: str
    engine: str
    fact: str
    users: tuple[str, ...]
    repo: str
    file: str
    commit: str
    quote: str
    match: str = "exact"


@dataclass(frozen=True)
class Difference:
    """One row of ``[[difference]]``: what ``user`` reads now, what the source has instead."""

    id: str
    engine: str
    user: str
    stand_in: str
    upstream: str
    repo: str
    file: str
    commit: str
    quote: str
    note: str


def _table() -> dict[str, list[dict[str, Any]]]:
    with TABLE.open("rb") as f:
        return tomllib.load(f)


FACTS = [Fact(**{**row, "users": tuple(row["users"])}) for row in _table()["fact"]]
DIFFERENCES = [Difference(**row) for row in _table()["difference"]]


# ── the registry ──────────────────────────────────────────────────────────────────────


def _api(engine: str) -> SleepApi:
    api = engines.sleep_api(engine)
    assert api is not None, f"{engine} has no sleep API in the registry"
    return api


def _calls(engine: str) -> tuple[HttpCall, ...]:
    api = _api(engine)
    return (api.sleep, *api.wake, *api.reload)


def _bodies(engine: str) -> list[dict[str, Any]]:
    return [c.body for c in _calls(engine) if isinstance(c.body, dict)]


def registry_paths(engine: str) -> set[str]:
    api = _api(engine)
    return {c.path for c in _calls(engine)} | ({api.is_sleeping} if api.is_sleeping else set())


def registry_query_keys(engine: str) -> set[str]:
    calls = _calls(engine)
    levels = {c.level_param for c in calls if c.level_param is not None}
    return levels | {k for c in calls for k, _ in c.params}


def registry_query_values(engine: str) -> set[str]:
    return {v for c in _calls(engine) for _, v in c.params}


def registry_body_keys(engine: str) -> set[str]:
    return {k for body in _bodies(engine) for k in body}


def registry_body_values(engine: str) -> set[str]:
    return {s for body in _bodies(engine) for s in _strings(list(body.values()))}


def registry_is_sleeping_key(engine: str) -> set[str]:
    return {_api(engine).is_sleeping_key}


def registry_flags(engine: str) -> set[str]:
    api = _api(engine)
    return set(api.flags) | set(api.env)


def registry_metrics(engine: str) -> set[str]:
    found = engines.lookup(engine)
    assert found is not None, f"{engine} is not registered"
    return set(found.inflight_metrics)


# ── the stand-ins ─────────────────────────────────────────────────────────────────────


def fake_paths(engine: str) -> set[str]:
    return set(fake_engine._VLLM_PATHS if engine == "vllm" else fake_engine._SGLANG_PATHS)


def fake_tags(engine: str) -> set[str]:
    return set(fake_engine._TAGS)


def fake_idle_message(engine: str) -> set[str]:
    return {fake_engine.SGLANG_IDLE_MESSAGE}


def fake_literals(engine: str) -> set[str]:
    """The string constants of fake_engine.py's code (docstrings are single constants too,
    but never equal to a short fact)."""
    nodes = ast.walk(ast.parse(FAKE_SOURCE))
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def fake_defaults(engine: str) -> set[str]:
    """The ``.get("key", "default")`` reads of fake_engine.py (its query parameters)."""
    return set(re.findall(r'\.get\("[^"]*", "[^"]*"\)', FAKE_SOURCE))


def fake_query_keys(engine: str) -> set[str]:
    """The repeated query parameters fake_engine.py reads (``k == "name"``)."""
    return set(re.findall(r'\bk == "(\w+)"', FAKE_SOURCE))


def fake_body_keys(engine: str) -> set[str]:
    """The JSON body fields fake_engine.py reads (``body.get("name")``)."""
    return set(re.findall(r'\bbody\.get\("(\w+)"\)', FAKE_SOURCE))


def _request(method: str, path: str, body: bytes = b"") -> Recorded:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return Recorded(method, path, {}, {}, body, parsed, 0.0)


def _asked(engine: FakeEngine, method: str, path: str, body: bytes = b"") -> Reply:
    reply: ReplyLike = engine.handle(_request(method, path, body))
    return reply if isinstance(reply, Reply) else Reply(*reply)


def _answers(engine: str) -> list[Reply]:
    """The stand-in's answers to the calls whose bodies the table cites (not started:
    ``handle`` is called directly)."""
    if engine == "vllm":
        fake = FakeEngine("vllm")
        return [
            _asked(fake, "GET", "/is_sleeping"),
            _asked(fake, "POST", "/collective_rpc", b"{}"),
            _asked(fake, "POST", "/collective_rpc", b"{"),
            _asked(fake, "POST", "/collective_rpc", b'{"method": "reload_weights"}'),
        ]
    fake = FakeEngine("sglang")
    fake.set_in_flight(1)
    return [_asked(fake, "POST", "/release_memory_occupation", b"{}")]


def fake_answers(engine: str) -> set[str]:
    """Every key and string in the stand-in's answers' JSON bodies."""
    return {s for reply in _answers(engine) for s in _strings(reply.body)}


def _page(engine: str) -> str:
    return FakeEngineMetrics(engine).page()


def fake_metrics(engine: str) -> set[str]:
    """The metric families on the stand-in's metrics page, and the names it declares."""
    families = {f.name for f in text_string_to_metric_families(_page(engine))}
    return families | set(FakeEngineMetrics.PAGES[engine])


def fake_labels(engine: str) -> set[str]:
    """The label names of the stand-in's in-flight series."""
    running = FakeEngineMetrics.PAGES[engine][0]
    families = text_string_to_metric_families(_page(engine))
    return {k for f in families if f.name == running for s in f.samples for k in s.labels}


def _strings(value: Any) -> Iterator[str]:
    """The strings of a JSON value: its strings, and its objects' keys."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


PROBES: dict[str, Callable[[str], set[str]]] = {
    "registry.paths": registry_paths,
    "registry.query_keys": registry_query_keys,
    "registry.query_values": registry_query_values,
    "registry.body_keys": registry_body_keys,
    "registry.body_values": registry_body_values,
    "registry.is_sleeping_key": registry_is_sleeping_key,
    "registry.flags": registry_flags,
    "registry.metrics": registry_metrics,
    "fake_engine.paths": fake_paths,
    "fake_engine.tags": fake_tags,
    "fake_engine.idle_message": fake_idle_message,
    "fake_engine.literals": fake_literals,
    "fake_engine.defaults": fake_defaults,
    "fake_engine.query_keys": fake_query_keys,
    "fake_engine.body_keys": fake_body_keys,
    "fake_engine.answers": fake_answers,
    "fake_http.metrics": fake_metrics,
    "fake_http.labels": fake_labels,
}

#: what the stand-ins and the registry declare of each protocol: all of it must be cited
DECLARED = (
    "registry.paths",
    "registry.query_keys",
    "registry.query_values",
    "registry.body_keys",
    "registry.body_values",
    "registry.flags",
    "registry.metrics",
    "fake_engine.paths",
    "fake_engine.tags",
    "fake_http.metrics",
)


def _used(fact: Fact, values: set[str]) -> bool:
    if fact.match == "prefix":
        return any(v.startswith(fact.fact) for v in values)
    return fact.fact in values


# ── the tests ─────────────────────────────────────────────────────────────────────────


def test_the_table_is_well_formed() -> None:
    rows: list[Fact | Difference] = [*FACTS, *DIFFERENCES]
    assert FACTS and DIFFERENCES
    assert len({r.id for r in rows}) == len(rows), "ids are unique"
    for row in rows:
        assert row.repo == REPOS[row.engine], row.id
        assert _COMMIT.fullmatch(row.commit), f"{row.id}: a full commit hash"
        assert row.quote and "\n" not in row.quote and len(row.quote) <= 100, row.id
    assert {f.match for f in FACTS} <= {"exact", "prefix"}


@pytest.mark.parametrize("fact", FACTS, ids=[f.id for f in FACTS])
def test_the_upstream_quote_shows_the_fact(fact: Fact) -> None:
    assert fact.fact in fact.quote, f"{fact.repo}@{fact.commit[:7]} {fact.file}"


@pytest.mark.parametrize("fact", FACTS, ids=[f.id for f in FACTS])
def test_every_user_uses_the_cited_fact(fact: Fact) -> None:
    assert fact.users, fact.id
    for user in fact.users:
        values = PROBES[user](fact.engine)
        assert _used(fact, values), (
            f"{user} no longer uses {fact.fact!r} ({fact.repo}@{fact.commit[:7]} "
            f"{fact.file}: {fact.quote}); it has {sorted(values)}"
        )


@pytest.mark.parametrize("engine", sorted(REPOS))
def test_everything_declared_is_cited(engine: str) -> None:
    cited = {f.fact for f in FACTS if f.engine == engine}
    for probe in DECLARED:
        uncited = PROBES[probe](engine) - cited
        assert not uncited, f"{probe} of {engine}: {sorted(uncited)} has no upstream citation"


@pytest.mark.parametrize("row", DIFFERENCES, ids=[d.id for d in DIFFERENCES])
def test_the_recorded_differences_still_stand(row: Difference) -> None:
    now = ", ".join(sorted(PROBES[row.user](row.engine)))
    assert now == row.stand_in, f"{row.id}: the stand-in changed ({now!r}); update the table"
    assert row.upstream in row.quote, f"{row.id}: the quote shows what the source has"
    assert row.upstream not in now, f"{row.id}: the stand-in says it too: make it a [[fact]]"
