"""Fuzzing the HTTP API with schemathesis, from the OpenAPI schema FastAPI publishes.

The app is built as ``vramctl run`` builds it (``controller.interfaces.api.create_app``) over a
controller whose last cycle observed a scripted host (no Docker): a resident and an
evictable serve running, on-demand serves that fit, do not fit, or conflict. The
schema is the one FastAPI generates for that app (``app.openapi()``; the running
server does not serve it). Schemathesis generates requests for every operation —
path parameters of any text, bodies valid and invalid against the schema (``ttl_s``
of every kind and number, ``NaN`` / ``Infinity`` included), with and without the
bearer token — and checks every answer:

* ``not_a_server_error`` — never a 5xx, except the one 503 this host can give: a
  state-changing request while no token is configured (the scripted controller has
  observed, and read docker), answered for every such request, exactly, with how to
  configure one — and that answer is checked against the schema like any other;
* ``response_schema_conformance`` / ``content_type_conformance`` — an answer the
  schema describes matches it.

Example counts are kept small for CI (``MAX_EXAMPLES`` per operation and auth mode).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from controller.interfaces.api import NO_TOKEN_MESSAGE, ApiSettings, create_app
from controller.manifest import load_manifest_set
from controller.service.events import EventBus
from controller.service.loop import Controller, CycleSummary, RunOptions
from controller.snapshot import parse_snapshot
from controller.store.journal import Journal, journal_path

TOKEN = "fuzz-token-0123456789"
MAX_EXAMPLES = 60

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 1000

[[serve]]
name = "res"
container = "c-res"
gpu_role = "a"
vram_mib = 3000
residency = "resident"
desired = "running"
port = 20001
health = "/health"

[[serve]]
name = "omni"
container = "c-omni"
gpu_role = "a"
vram_mib = 4000
residency = "evictable"
desired = "running"
port = 20002

[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "a"
vram_mib = 5000
residency = "on-demand"
port = 20003
idle_ttl_s = 60

[[serve]]
name = "big"
container = "c-big"
gpu_role = "a"
vram_mib = 7000
residency = "on-demand"
port = 20004

[[serve]]
name = "alt"
container = "c-alt"
gpu_role = "a"
vram_mib = 1000
residency = "on-demand"
port = 20001

[[serve]]
name = "off"
container = "c-off"
gpu_role = "a"
vram_mib = 1000
residency = "on-demand"
desired = "stopped"
port = 20005
"""


def _controller(tmp: Path) -> Controller:
    path = tmp / "serves.toml"
    path.write_text(MANIFEST)
    controller = Controller(
        RunOptions(manifests=(path,), state_dir=tmp / "state"), load_manifest_set([path])
    )
    controller.journal = Journal.open(journal_path(controller.state_dir))
    now = time.time()
    snap = parse_snapshot(
        {
            "docker": "ok",
            "containers": {
                "c-res": {"state": "running", "started_at": now - 100},
                "c-omni": {"state": "running", "started_at": now - 100},
                "c-llm": {"state": "exited"},
                "c-big": {"state": "exited"},
            },
            "gpus": None,
        }
    )
    controller.last = CycleSummary(at=now, snapshot=snap)
    controller.cycles += 1
    return controller


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    c = _controller(tmp_path_factory.mktemp("fuzz-api"))
    yield c
    c.journal.close()


SERVES = ("res", "omni", "llm", "big", "alt", "off")
AUTH_MODES = ("with-token", "wrong-token", "no-token", "no-token-set")
LABELS = tuple(
    r.ok().label
    for r in schemathesis.openapi.from_dict(
        create_app(_controller(Path(tempfile.mkdtemp(prefix="vc-fuzz-"))), ApiSettings()).openapi()
    ).get_all_operations()
)


def _ended_bus() -> EventBus:
    """A bus with a few events, closed: ``GET /v1/events`` replays and ends.

    The event stream never ends while the controller runs, and the in-process client
    reads an answer whole; over a closed bus each stream is finite, so it is fuzzed
    like every other route (``since`` and ``Last-Event-ID`` of any text). The stream
    itself is tested over a real server in tests/shell/test_events.py.
    """
    bus = EventBus(buffer=4)
    for i in range(6):
        bus.publish("step", private=("detail",), serve="llm", detail=f"detail {i}")
    bus.close()
    return bus


@pytest.fixture(scope="module")
def schemas(controller: Controller) -> dict[str, Any]:
    """Per auth mode: the published schema, bound to an app over the scripted controller."""
    out = {}
    for mode in AUTH_MODES:
        token = None if mode == "no-token-set" else TOKEN
        app = create_app(
            controller,
            ApiSettings(token=token, bind_host="127.0.0.1", max_wait_s=0.05),
            events=_ended_bus(),
        )
        loaded = schemathesis.openapi.from_dict(app.openapi())
        loaded.app = app
        out[mode] = loaded
    return out


def _headers(auth_mode: str) -> dict[str, str]:
    headers = {"Host": "127.0.0.1"}
    if auth_mode in ("with-token", "no-token-set"):
        headers["Authorization"] = f"Bearer {TOKEN}"
    elif auth_mode == "wrong-token":
        headers["Authorization"] = "Bearer not-the-token"
    return headers


def _refused_for_no_token(label: str, auth_mode: str) -> bool:
    """The only 503 here: a write while no token is configured (its body is never read)."""
    return auth_mode == "no-token-set" and not label.startswith(("GET ", "HEAD "))


def test_the_schema_publishes_every_route() -> None:
    assert set(LABELS) >= {
        "GET /healthz",
        "GET /v1/ledger",
        "GET /v1/serves",
        "GET /v1/fit/{serve}",
        "POST /v1/serves/{serve}/up",
        "POST /v1/serves/{serve}/down",
        "GET /v1/events",
    }, LABELS


# negative cases exist only where the schema constrains something: a body (a path
# parameter is any string, a route without parameters has nothing to break)
CASES = [(label, GenerationMode.POSITIVE) for label in LABELS] + [
    (label, GenerationMode.NEGATIVE) for label in LABELS if label.endswith("/up")
]


@pytest.mark.parametrize("auth_mode", AUTH_MODES)
@pytest.mark.parametrize(("label", "generation"), CASES)
def test_api_answers_every_generated_request_without_a_server_error(
    schemas: dict[str, Any], label: str, auth_mode: str, generation: GenerationMode
) -> None:
    operation = schemas[auth_mode].find_operation_by_label(label)
    calls = []

    strategy = operation.as_strategy(generation_mode=generation)
    if "{serve}" in label:  # mostly the manifest's serves: a random name is only a 404
        strategy = st.one_of(
            strategy,
            *(
                operation.as_strategy(generation_mode=generation, path_parameters={"serve": n})
                for n in SERVES
            ),
        )

    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case: Case) -> None:
        response = case.call(headers=_headers(auth_mode))
        calls.append(response.status_code)
        event(f"answered {response.status_code}")
        checks = [response_schema_conformance, content_type_conformance]
        if _refused_for_no_token(label, auth_mode):
            assert response.status_code == 503, response.text
            assert response.json() == {"status": 503, "error": NO_TOKEN_MESSAGE}, response.text
        else:
            checks.insert(0, not_a_server_error)
        case.validate_response(response, checks=checks)

    check()
    assert calls, "no request was made"
    statuses = dict(sorted(Counter(calls).items()))
    print(f"{label} {generation.value} {auth_mode}: {len(calls)} requests, {statuses}")


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e309", "1e999"])
def test_non_finite_ttl_is_refused_with_422(controller: Controller, raw: str) -> None:
    """JSON extensions Python's parser accepts: a 422 naming ttl_s, never a 500."""
    import httpx

    assert math.isinf(float(raw)) or math.isnan(float(raw))
    app = create_app(controller, ApiSettings(token=TOKEN, bind_host="127.0.0.1"))

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.post(
                "/v1/serves/llm/up",
                content=f'{{"ttl_s": {raw}}}',
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )

    import asyncio

    r = asyncio.run(post())
    assert r.status_code == 422, f"{r.status_code}: {r.text}"
    assert "ttl_s" in r.text
