"""The adapters' shared HTTP helper (controller/adapters/http_client.py) and bounded retries.

What every HTTP adapter relies on: the client follows no redirect (a bearer token goes
only to the configured URL), reads no proxy from the environment, is closed by a
``with`` block; a call's connect phase is capped; a body that is not JSON reads as
``None``; the bounded ``Retrying`` retries only what it is told to, at most
``attempts`` times.
"""

from __future__ import annotations

import httpx
import pytest
from tenacity import retry_if_exception_type

from controller.adapters.http_client import (
    CONNECT_FAULTS,
    NO_ANSWER_FAULTS,
    HttpAdapter,
    bounded_timeout,
    endpoint,
    json_or_none,
)
from controller.adapters.retry import RetryKnobs


class _Adapter(HttpAdapter):
    def __init__(self, transport: httpx.BaseTransport) -> None:
        self.set_retry_knobs(attempts=3, max_wait_s=5, initial_wait_s=0)
        self.open_http(transport=transport)


def test_the_client_follows_no_redirect() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(307, headers={"Location": "http://elsewhere.test/steal"})

    with _Adapter(httpx.MockTransport(handler)) as adapter:
        response = adapter._http.post("http://engine.test/v1/vram", content=b"{}")
    assert response.status_code == 307
    assert seen == ["/v1/vram"]


def test_the_client_reads_no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("ALL_PROXY", "http://proxy.test:3128")
    with _Adapter(httpx.MockTransport(lambda r: httpx.Response(200))) as adapter:
        assert adapter._http.trust_env is False


def test_a_with_block_closes_the_client() -> None:
    with _Adapter(httpx.MockTransport(lambda r: httpx.Response(200))) as adapter:
        assert not adapter._http.is_closed
    assert adapter._http.is_closed


def test_the_connect_phase_is_capped() -> None:
    long = bounded_timeout(20, 10)
    assert (long.connect, long.read, long.write, long.pool) == (10, 20, 20, 20)
    short = bounded_timeout(2, 10)
    assert (short.connect, short.read) == (2, 2)


@pytest.mark.parametrize(
    ("body", "value"),
    [
        (b'{"is_sleeping": true}', {"is_sleeping": True}),
        (b"null", None),
        (b"<html>bad gateway</html>", None),
        (b"\xff\xfe{", None),
    ],
)
def test_a_body_that_is_not_json_reads_as_none(body: bytes, value: object) -> None:
    assert json_or_none(httpx.Response(200, content=body)) == value


def test_endpoint_joins_with_or_without_a_trailing_slash() -> None:
    assert endpoint("http://h:8000/", "/sleep") == "http://h:8000/sleep"
    assert endpoint("http://h:8000", "/sleep") == "http://h:8000/sleep"


def test_the_fault_families_tell_a_refused_connection_from_no_answer() -> None:
    refused = httpx.ConnectError("refused")
    read = httpx.ReadTimeout("slow")
    assert isinstance(refused, CONNECT_FAULTS)
    assert not isinstance(read, CONNECT_FAULTS)
    assert isinstance(read, NO_ANSWER_FAULTS)


class _Knobs(RetryKnobs):
    def __init__(self, attempts: int) -> None:
        self.set_retry_knobs(attempts=attempts, max_wait_s=5, initial_wait_s=0)


def test_bounded_retries_what_it_is_told_at_most_attempts_times() -> None:
    calls: list[int] = []

    def fails() -> None:
        calls.append(1)
        raise ConnectionError("down")

    retrying = _Knobs(3).bounded(retry_if_exception_type(ConnectionError))
    with pytest.raises(ConnectionError):
        retrying(fails)
    assert len(calls) == 3


def test_bounded_does_not_retry_other_faults() -> None:
    calls: list[int] = []

    def fails() -> None:
        calls.append(1)
        raise ValueError("bad request")

    retrying = _Knobs(3).bounded(retry_if_exception_type(ConnectionError))
    with pytest.raises(ValueError):
        retrying(fails)
    assert len(calls) == 1
