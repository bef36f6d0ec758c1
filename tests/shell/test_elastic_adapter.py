"""The elastic VRAM adapter against a fake engine over real loopback HTTP (docs/design.md §6).

What is pinned: the exact request of ``POST /v1/vram`` (and of ``/v1/unload``,
``/v1/load``); every answer of the seed (``vram-elastic-reserve-api.txt``) parsed into
an :class:`ElasticAnswer` rather than raised; 409 returned at once (a later cycle asks
again); only a missing answer raised, and not sent again when it may have reached the
engine; and :func:`elastic_ok`'s verdicts as a table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_http import FakeElastic, FakeHTTPServer, Reply
from support.serving import free_port

from controller.adapters.elastic import ElasticAnswer, ElasticClient, ElasticError, elastic_ok


@pytest.fixture
def client() -> Iterator[ElasticClient]:
    with ElasticClient(timeout_s=5, attempts=3, max_wait_s=3, initial_wait_s=0.01) as c:
        yield c


# ── the request ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("reserve", "token"),
    [(8000, "k"), (None, None), (0, None)],
    ids=["shrink-with-token", "grow-back-null", "zero"],
)
def test_request_is_exactly_the_protocol(
    client: ElasticClient, reserve: int | None, token: str | None
) -> None:
    with FakeElastic(token=token) as engine:
        client.set_reserve(engine.url + "/", reserve, token=token)
        (call,) = engine.calls
    assert (call.method, call.path) == ("POST", "/v1/vram")
    assert call.headers["content-type"] == "application/json"
    assert call.body == f'{{"reserve_mib": {"null" if reserve is None else reserve}}}'.encode()
    assert call.json == {"reserve_mib": reserve}
    if token is None:
        assert "authorization" not in call.headers
    else:
        assert call.headers["authorization"] == f"Bearer {token}"


@pytest.mark.parametrize("bad", [-1, True, 1.5, "8000"], ids=["negative", "bool", "float", "str"])
def test_invalid_reserve_is_refused_before_any_request(client: ElasticClient, bad: Any) -> None:
    with FakeElastic() as engine:
        with pytest.raises(ValueError, match="reserve_mib"):
            client.set_reserve(engine.url, bad)
        assert engine.calls == []


# ── answers ────────────────────────────────────────────────────────────────────


def test_ok_answer_is_parsed(client: ElasticClient) -> None:
    reply = FakeElastic.ok(
        8000, vram_free_mib=8200, expert_cache_mib=3072, expert_cache_full_mib=8192
    )
    with FakeElastic([reply]) as engine:
        answer = client.set_reserve(engine.url, 8000)
    assert answer.http_status == 200
    assert answer.status == "ok"
    assert (answer.reserve_mib, answer.vram_free_mib) == (8000, 8200)
    assert (answer.expert_cache_mib, answer.expert_cache_full_mib) == (3072, 8192)
    assert answer.error is None and answer.attempts == 1
    assert answer.raw == reply.body
    assert elastic_ok(answer, 8000) == (
        True,
        "ok: vram_free_mib 8200 >= reserve_mib 8000, expert cache 3072/8192 MiB",
    )


def test_a_shrink_a_segment_short_ran_and_its_cache_says_what_it_gave(
    client: ElasticClient,
) -> None:
    # the document: free VRAM can end a segment short of the reserve; the call ran,
    # and the cache (not the card-wide free figure) says what the engine gave back
    reply = FakeElastic.ok(
        7985, vram_free_mib=7824, expert_cache_mib=1024, expert_cache_full_mib=4608
    )
    with FakeElastic([reply]) as engine:
        answer = client.set_reserve(engine.url, 7985)
    assert (answer.http_status, answer.status, answer.ok) == (200, "ok", True)
    assert answer.given_back_mib == 3584
    assert elastic_ok(answer, 7985) == (
        True,
        "ok: vram_free_mib 7824 < reserve_mib 7985, expert cache 1024/4608 MiB",
    )


def test_busy_is_an_answer_at_once_not_retried_in_the_call(client: ElasticClient) -> None:
    # the engine has already waited (up to 300 s) for its running request: "later" is a
    # later cycle, not a retry that holds the loop
    with FakeElastic([FakeElastic.busy(), FakeElastic.ok(4000, vram_free_mib=4000)]) as engine:
        answer = client.set_reserve(engine.url, 4000)
        assert engine.reserves() == [4000]
        assert engine.remaining == 1
    assert answer.http_status == 409 and answer.busy
    assert answer.attempts == 1
    assert answer.error is not None and "still running" in answer.error
    assert answer.given_back_mib is None
    assert elastic_ok(answer, 4000)[1].startswith("busy (409)")


@pytest.mark.parametrize(
    ("reply", "needs_model_reload", "verdict"),
    [
        (FakeElastic.unavailable(), True, "engine unavailable (503): the engine did not answer"),
        (FakeElastic.refused(), False, "engine refused (400): VRAM needs an engine started"),
        (FakeElastic.resize_failed(), True, "resize failed, reload the model (400): VRAM: refill"),
    ],
    ids=["503", "400-refused", "400-resize-failed"],
)
def test_engine_errors_are_answers_at_once(
    client: ElasticClient, reply: Reply, needs_model_reload: bool, verdict: str
) -> None:
    with FakeElastic([reply]) as engine:
        answer = client.set_reserve(engine.url, 8000)
        assert len(engine.requests) == 1  # permanent: not retried
    assert answer.http_status == reply.status
    assert answer.needs_model_reload is needs_model_reload
    ok, why = elastic_ok(answer, 8000)
    assert not ok and why.startswith(verdict)


def test_not_loaded_is_parsed(client: ElasticClient) -> None:
    with FakeElastic([FakeElastic.not_loaded(8000)]) as engine:
        answer = client.set_reserve(engine.url, 8000)
    assert (answer.http_status, answer.status, answer.reserve_mib) == (200, "not loaded", 8000)
    assert answer.vram_free_mib is None
    assert elastic_ok(answer, 8000) == (
        False,
        "not loaded: the reserve applies when the model loads",
    )


def test_grow_back_gets_the_engines_default_reserve(client: ElasticClient) -> None:
    with FakeElastic(start_reserve_mib=1500) as engine:
        answer = client.set_reserve(engine.url, None)
    assert answer.reserve_mib == 1500 and answer.cache_whole is True
    assert elastic_ok(answer, None)[0]


def test_wrong_api_key_is_an_answer(client: ElasticClient) -> None:
    with FakeElastic(token="right") as engine:
        answer = client.set_reserve(engine.url, 100, token="wrong")
    assert answer.http_status == 401
    assert answer.error is not None and "invalid API key" in answer.error
    assert elastic_ok(answer, 100) == (False, "HTTP 401: invalid API key | authentication_error")


def test_non_json_error_body_keeps_its_text(client: ElasticClient) -> None:
    with FakeHTTPServer(lambda _: Reply(502, "Bad Gateway from proxy")) as fake:
        answer = client.set_reserve(fake.url, 100)
    assert answer.http_status == 502
    assert answer.error == "Bad Gateway from proxy"
    assert answer.raw == {}


def test_unreachable_engine_raises_transient_after_retries(client: ElasticClient) -> None:
    with pytest.raises(ElasticError) as info:
        client.set_reserve(f"http://127.0.0.1:{free_port()}", 100)
    assert info.value.transient is True
    assert info.value.attempts == 3


def test_no_answer_in_time_raises_transient_and_is_not_sent_again() -> None:
    # a request that reached the engine may still run: sending it again inside the call
    # would queue a second resize behind the first
    slow = Reply(200, {"status": "ok"}, delay_s=1.0)
    with (
        FakeHTTPServer(lambda _: slow) as fake,
        ElasticClient(timeout_s=0.2, attempts=3, max_wait_s=5, initial_wait_s=0.01) as client,
        pytest.raises(ElasticError) as info,
    ):
        client.set_reserve(fake.url, 100)
    assert info.value.transient is True
    assert "no answer within 0.2s" in info.value.message and "Timeout" in info.value.message
    assert len(fake.calls) == 1


def test_the_default_wait_for_an_answer_is_short() -> None:
    # the engine may hold a resize 300 s before its 409; the loop waits 20 s at most
    with ElasticClient() as c:
        assert c.timeout_s == 20


def test_unload_and_load_are_posted() -> None:
    replies = {"/v1/unload": Reply(200, {"status": "unloaded"}), "/v1/load": Reply(503, "busy")}
    with (
        FakeHTTPServer(lambda r: replies[r.path]) as fake,
        ElasticClient(timeout_s=5) as client,
    ):
        assert client.unload(fake.url, token="k").http_status == 200
        load = client.load(fake.url + "/", token="k")
        assert [(c.method, c.path, c.bearer) for c in fake.calls] == [
            ("POST", "/v1/unload", "k"),
            ("POST", "/v1/load", "k"),
        ]
    assert (load.http_status, load.error) == (503, "busy")


def test_malformed_url_raises_permanent(client: ElasticClient) -> None:
    with pytest.raises(ElasticError) as info:
        client.set_reserve("ftp://127.0.0.1:1", 100)
    assert info.value.transient is False


# ── the verdict, as a table ────────────────────────────────────────────────────


def ok_answer(reserve: int | None, free: int | None, cache: int = 4096) -> ElasticAnswer:
    return ElasticAnswer(
        http_status=200,
        status="ok",
        reserve_mib=reserve,
        vram_free_mib=free,
        expert_cache_mib=cache,
        expert_cache_full_mib=8192,
    )


VERDICTS = [
    pytest.param(
        ok_answer(8000, 8000), 8000, True, "ok: vram_free_mib 8000 >= reserve_mib 8000", id="exact"
    ),
    pytest.param(
        ok_answer(8000, 9100), 8000, True, "ok: vram_free_mib 9100 >= reserve_mib", id="more"
    ),
    pytest.param(
        ok_answer(8000, 6000),
        8000,
        True,
        "ok: vram_free_mib 6000 < reserve_mib 8000, expert cache 4096/8192 MiB",
        id="short-of-the-reserve",
    ),
    pytest.param(
        ok_answer(8000, None), 8000, True, "ok: no vram_free_mib (reserve_mib 8000)", id="no-free"
    ),
    pytest.param(
        ElasticAnswer(200, status="ok", reserve_mib=8000, vram_free_mib=9000),
        8000,
        True,
        "ok: vram_free_mib 9000 >= reserve_mib 8000, no expert-cache figures",
        id="no-cache-figures",
    ),
    pytest.param(ok_answer(0, 10), 0, True, "ok: vram_free_mib 10 >= reserve_mib 0", id="zero"),
    pytest.param(ok_answer(1024, 1500, 8192), None, True, "ok: grown back", id="grow-whole"),
    pytest.param(
        ok_answer(1024, 300, 6000),
        None,
        True,
        "ok: grown back, vram_free_mib 300, expert cache 6000/8192 MiB (cache not whole",
        id="grow-partial",
    ),
    pytest.param(
        ElasticAnswer(200, status="not loaded", reserve_mib=8000),
        8000,
        False,
        "not loaded",
        id="not-loaded",
    ),
    pytest.param(
        ElasticAnswer(200, status="weird"),
        8000,
        False,
        "unexpected status 'weird'",
        id="odd-status",
    ),
    pytest.param(
        ElasticAnswer(409, error="model_busy"), 8000, False, "busy (409): model_busy", id="busy"
    ),
    pytest.param(
        ElasticAnswer(400, error="VRAM: not with --peer-device"),
        8000,
        False,
        "engine refused (400): VRAM: not with --peer-device",
        id="refused",
    ),
    pytest.param(
        ElasticAnswer(400, error="the driver refused to release an expert-cache segment"),
        8000,
        False,
        "resize failed, reload the model (400)",
        id="resize-failed",
    ),
    pytest.param(
        ElasticAnswer(503, error="server_error"),
        None,
        False,
        "engine unavailable (503): server_error",
        id="unavailable",
    ),
    pytest.param(ElasticAnswer(415), 8000, False, "HTTP 415: no message", id="other-status"),
]


@pytest.mark.parametrize(("answer", "reserve", "ok", "why"), VERDICTS)
def test_elastic_ok_verdicts(
    answer: ElasticAnswer, reserve: int | None, ok: bool, why: str
) -> None:
    verdict, text = elastic_ok(answer, reserve)
    assert verdict is ok
    assert text.startswith(why), text
