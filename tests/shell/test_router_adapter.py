"""The router adapter against a fake router over real loopback HTTP (docs/design.md §6).

What is pinned: the exact request (path, bearer token, body fields, ``timeout`` for
a drain only), the parsing of drain and readmit answers (a refusal is 200 with
``readmitted: false``), the tier state as a typed record (unknown fields ``None``),
retries of 503 ``server_busy`` (for a budget that outlasts a drain holding the
router's mutation lock) and of connection faults (bounded in attempts and in time),
permanent errors raised at once with the status, the router's words and error type
(an unknown tier: 400 ``invalid_transition``), and the preflight check (a disabled
transition API: 404; an unknown tier).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_http import FakeHTTPServer, FakeRouter, Reply
from support.serving import free_port

from controller.adapters.router import (
    BUSY_MARGIN_S,
    DRAIN_HTTP_MARGIN_S,
    QUIESCE_REASON,
    TRANSITION_PATH,
    RouterClient,
    RouterError,
    TierState,
    busy_budget_s,
    router_token,
)
from controller.manifest.fields import DEFAULT_DRAIN_TIMEOUT_S

TOKEN = "s3cret"
TIER = "tier-a"


@pytest.fixture
def router() -> Iterator[FakeRouter]:
    with FakeRouter(token=TOKEN, tiers=[TIER, "other"]) as fake:
        yield fake


def make_client(url: str, token: str | None = TOKEN, **knobs: Any) -> RouterClient:
    """A client with tiny backoff so retry tests stay fast."""
    options: dict[str, Any] = {
        "timeout_s": 5,
        "attempts": 4,
        "max_wait_s": 3,
        "initial_wait_s": 0.01,
        "busy_wait_s": 0,  # busy answers follow attempts/max_wait_s unless a test says so
    }
    options.update(knobs)
    return RouterClient(url, token, **options)


# ── the request ────────────────────────────────────────────────────────────────


def test_quiesce_sends_exactly_the_protocol_body_and_headers(router: FakeRouter) -> None:
    with make_client(router.url + "/") as client:
        answer = client.transition("quiesce", TIER)

    (call,) = router.calls
    assert call.method == "POST"
    assert call.path == "/v1/admin/transition"
    assert call.query == {}
    assert call.headers["authorization"] == f"Bearer {TOKEN}"
    assert call.headers["content-type"] == "application/json"
    assert call.json == {
        "action": "quiesce",
        "tier_id": TIER,
        "confirm": True,
        "dry_run": False,
        "reason": "vramctl-eviction",
    }
    assert answer.applied is True
    assert answer.action == "quiesce"
    assert answer.drained is None and answer.timed_out is None and answer.readmitted is None
    assert answer.attempts == 1
    assert router.tier(TIER)["state"] == "quiesced"


def test_drain_sends_its_timeout_and_parses_a_completed_drain(router: FakeRouter) -> None:
    with make_client(router.url) as client:
        client.transition("quiesce", TIER)
        answer = client.transition("drain", TIER, drain_timeout_s=120, reason="make room")

    call = router.transitions[1]
    assert call.json == {
        "action": "drain",
        "tier_id": TIER,
        "confirm": True,
        "dry_run": False,
        "reason": "make room",
        "timeout": 120,
    }
    assert isinstance(call.json["timeout"], int)
    assert (answer.applied, answer.drained, answer.timed_out) == (True, True, False)
    assert router.tier(TIER)["state"] == "quiesced"  # a drain leaves the tier quiesced


def test_a_fractional_drain_timeout_is_sent_as_given(router: FakeRouter) -> None:
    with make_client(router.url) as client:
        client.transition("quiesce", TIER)
        client.transition("drain", TIER, drain_timeout_s=2.5)
    assert router.transitions[1].json["timeout"] == 2.5


def test_drain_timed_out_is_parsed(router: FakeRouter) -> None:
    router.set_active(TIER, 3)
    router.script_drain(TIER, timed_out=True)
    with make_client(router.url) as client:
        client.transition("quiesce", TIER)
        answer = client.transition("drain", TIER, drain_timeout_s=30)
        state = client.tier_state(TIER)

    assert answer.applied is True
    assert answer.drained is False
    assert answer.timed_out is True
    assert answer.raw["result"]["snapshot"]["active_requests"] == 3
    assert (state.state, state.active_requests, state.draining) == ("quiesced", 3, False)


@pytest.mark.parametrize(
    "timeout",
    [None, 0, -1, 3600.5, 3601, math.nan, math.inf],
    ids=["none", "zero", "negative", "just-over", "over", "nan", "inf"],
)
def test_drain_timeout_out_of_range_is_refused_before_any_request(
    router: FakeRouter, timeout: float | None
) -> None:
    with make_client(router.url) as client, pytest.raises(ValueError, match="drain"):
        client.transition("drain", TIER, drain_timeout_s=timeout)
    assert router.calls == []


def test_drain_timeout_at_the_limit_is_accepted(router: FakeRouter) -> None:
    with make_client(router.url) as client:
        client.transition("quiesce", TIER)
        client.transition("drain", TIER, drain_timeout_s=3600)
    assert router.transitions[1].json["timeout"] == 3600


def test_drain_timeout_is_not_sent_with_other_actions(router: FakeRouter) -> None:
    with make_client(router.url) as client:
        client.transition("quiesce", TIER, drain_timeout_s=60)
        client.transition("readmit", TIER, drain_timeout_s=60)
    assert all("timeout" not in c.json for c in router.transitions)
    assert router.actions() == [("quiesce", TIER), ("readmit", TIER)]


def test_unknown_action_is_refused(router: FakeRouter) -> None:
    with make_client(router.url) as client, pytest.raises(ValueError, match="unknown router"):
        client.transition("evict", TIER)  # type: ignore[arg-type]
    assert router.calls == []


def test_drain_http_timeout_exceeds_the_drain_timeout(router: FakeRouter) -> None:
    """The router may take the whole drain timeout: the HTTP call must wait longer."""
    router.script_drain(TIER, delay_s=0.6)
    router.quiesce_as(TIER, "vramctl-eviction")
    with make_client(router.url, timeout_s=0.2, attempts=1) as client:
        answer = client.transition("drain", TIER, drain_timeout_s=0.6)
    assert answer.drained is True
    assert DRAIN_HTTP_MARGIN_S >= 10


# ── readmit answers ────────────────────────────────────────────────────────────


def test_readmit_readmits_by_default(router: FakeRouter) -> None:
    with make_client(router.url) as client:
        client.transition("quiesce", TIER)
        answer = client.transition("readmit", TIER)
    assert (answer.applied, answer.readmitted, answer.reason) == (True, True, "readiness_passed")
    assert router.tier(TIER)["state"] == "admitting"


@pytest.mark.parametrize("nested", [True, False], ids=["inside-result", "top-level"])
def test_readmitted_false_is_parsed_wherever_it_is(router: FakeRouter, nested: bool) -> None:
    router.script_readmit(TIER, readmitted=False, reason="tier was never quiesced", nested=nested)
    with make_client(router.url) as client:
        answer = client.transition("readmit", TIER)
    assert answer.readmitted is False
    assert answer.reason == "tier was never quiesced"
    assert answer.applied is nested  # the fake says applied only in the nested form


# ── retries ────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("style", ["error", "detail", "text"])
def test_server_busy_is_retried_then_succeeds(router: FakeRouter, style: str) -> None:
    router.script_busy(2, style=style)
    with make_client(router.url) as client:
        answer = client.transition("quiesce", TIER)
    assert answer.applied is True
    assert answer.attempts == 3
    assert router.actions() == [("quiesce", TIER)] * 3


def test_server_busy_until_retries_run_out_is_transient(router: FakeRouter) -> None:
    router.script_busy(10)
    with make_client(router.url, attempts=3) as client, pytest.raises(RouterError) as info:
        client.transition("drain", TIER, drain_timeout_s=5)
    err = info.value
    assert err.transient is True
    assert err.status == 503
    assert err.attempts == 3
    assert "server_busy" in err.message
    assert len(router.transitions) == 3


def test_retries_are_bounded_in_time_too(router: FakeRouter) -> None:
    router.script_busy(1000)
    begin = time.monotonic()
    with (
        make_client(router.url, attempts=1000, max_wait_s=0.3, initial_wait_s=0.05) as client,
        pytest.raises(RouterError) as info,
    ):
        client.transition("quiesce", TIER)
    assert time.monotonic() - begin < 3.0
    assert info.value.transient is True
    assert 1 < info.value.attempts < 20


def test_unreachable_router_is_transient_after_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with make_client(url, attempts=3) as client, pytest.raises(RouterError) as info:
        client.transition("quiesce", TIER)
    assert info.value.transient is True
    assert info.value.attempts == 3
    assert info.value.status is None
    assert "unreachable" in info.value.message


# ── permanent errors ───────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("token", "status", "text"),
    [(None, 401, "invalid or missing API key"), ("wrong", 401, "invalid or missing API key")],
    ids=["no-token", "wrong-token"],
)
def test_auth_failures_are_permanent_at_once(
    router: FakeRouter, token: str | None, status: int, text: str
) -> None:
    with make_client(router.url, token=token) as client, pytest.raises(RouterError) as info:
        client.transition("quiesce", TIER)
    err = info.value
    assert (err.transient, err.status, err.attempts) == (False, status, 1)
    assert str(status) in err.message and text in err.message
    assert len(router.calls) == 1
    if token is None:
        assert "authorization" not in router.calls[0].headers


@pytest.mark.parametrize(
    ("status", "body", "text"),
    [
        (400, {"detail": "tier tier-a has no serve to drain"}, "no serve to drain"),
        (404, {"detail": "unknown tier_id 'tier-a'"}, "unknown tier_id"),
        (
            422,
            {"detail": [{"loc": ["body", "timeout"], "msg": "too large", "type": "x"}]},
            "body.timeout: too large",
        ),
        (409, {"error": {"code": "conflict", "message": "tier is pinned"}}, "tier is pinned"),
        (500, "Internal Server Error", "Internal Server Error"),
    ],
    ids=["400", "404", "422", "409", "500"],
)
def test_other_errors_are_permanent_at_once_and_name_status_and_text(
    router: FakeRouter, status: int, body: Any, text: str
) -> None:
    router.force_status("drain", status, body)
    with make_client(router.url) as client, pytest.raises(RouterError) as info:
        client.transition("drain", TIER, drain_timeout_s=10)
    err = info.value
    assert (err.transient, err.status, err.attempts) == (False, status, 1)
    assert f"answered {status}" in err.message
    assert text in err.message
    assert len(router.calls) == 1


@pytest.mark.parametrize("action", ["quiesce", "readmit", "state"])
def test_an_unknown_tier_is_400_invalid_transition_on_get_and_post(action: str) -> None:
    """The router answers 400 invalid_transition (not 404) for a tier it does not know;
    the stand-in knows no tier it was not given."""
    with FakeRouter(token=TOKEN) as fake, make_client(fake.url) as client:
        with pytest.raises(RouterError) as info:
            if action == "state":
                client.tier_state("stranger")
            else:
                client.transition(action, "stranger")  # type: ignore[arg-type]
        err = info.value
        assert (err.status, err.code, err.transient, err.attempts) == (
            400,
            "invalid_transition",
            False,
            1,
        )
        assert "invalid_transition" in err.message


def test_a_2xx_without_json_is_a_permanent_error() -> None:
    with (
        FakeHTTPServer(lambda _: Reply(200, "<html>proxy login</html>")) as fake,
        make_client(fake.url) as client,
        pytest.raises(RouterError) as info,
    ):
        client.transition("quiesce", TIER)
    assert info.value.transient is False
    assert "without a JSON object" in info.value.message


# ── tier state and preflight ───────────────────────────────────────────────────


def test_tier_state_reads_the_tier(router: FakeRouter) -> None:
    router.set_active(TIER, 2)
    with make_client(router.url) as client:
        state = client.tier_state(TIER)
    assert isinstance(state, TierState)
    assert (state.tier_id, state.state, state.reason) == (TIER, "admitting", "admitting")
    assert (state.active_requests, state.draining, state.ready) == (2, False, True)
    assert state.admitting and not state.quiesced and not state.quiesced_by_other
    (call,) = router.calls
    assert (call.method, call.path, call.query) == (
        "GET",
        "/v1/admin/transition",
        {"tier_id": TIER},
    )
    assert call.headers["authorization"] == f"Bearer {TOKEN}"


def test_tier_state_fields_the_answer_lacks_are_unknown_not_zero() -> None:
    body = {"tiers": [{"tier_id": "other"}, {"tier_id": TIER, "state": "quiesced"}]}
    with FakeHTTPServer(lambda _: Reply(200, body)) as fake, make_client(fake.url) as client:
        state = client.tier_state(TIER)
    assert state.state == "quiesced" and state.reason is None
    assert state.active_requests is None and state.draining is None and state.ready is None
    assert state.quiesced_by_other  # quiesced, and not with the controller's reason


def test_tier_state_without_a_row_for_the_tier_is_an_error() -> None:
    body = {"tiers": [{"tier_id": "other", "state": "admitting"}]}
    with (
        FakeHTTPServer(lambda _: Reply(200, body)) as fake,
        make_client(fake.url) as client,
        pytest.raises(RouterError) as info,
    ):
        client.tier_state(TIER)
    assert info.value.transient is False and TIER in info.value.message


def test_tier_state_retries_busy_answers() -> None:
    answers = iter(
        [
            Reply(503, {"error": {"type": "server_busy", "message": "busy"}}),
            Reply(200, {"tiers": [{"tier_id": TIER, "state": "admitting"}]}),
        ]
    )
    with FakeHTTPServer(lambda _: next(answers)) as fake, make_client(fake.url) as client:
        assert client.tier_state(TIER).state == "admitting"
        assert len(fake.calls) == 2


def test_a_requiesce_overwrites_the_reason(router: FakeRouter) -> None:
    """Why the controller must not quiesce a tier someone else quiesced: the router keeps
    only the last reason, so a readmit after it would lift the other quiesce."""
    router.quiesce_as(TIER, "maintenance")
    with make_client(router.url) as client:
        assert client.tier_state(TIER).quiesced_by_other
        client.transition("quiesce", TIER)
        state = client.tier_state(TIER)
    assert (state.state, state.reason) == ("quiesced", QUIESCE_REASON)
    assert not state.quiesced_by_other


def test_a_quiesce_or_readmit_without_confirm_is_a_dry_run_not_applied(router: FakeRouter) -> None:
    with make_client(router.url) as client:
        client._http.post(TRANSITION_PATH, json={"action": "quiesce", "tier_id": TIER})
    assert router.tier(TIER)["state"] == "admitting"


def test_a_refused_readmit_is_parsed_in_the_routers_form(router: FakeRouter) -> None:
    router.set_ready(TIER, False, "identity_http_404")
    with make_client(router.url) as client:
        client.transition("quiesce", TIER)
        answer = client.transition("readmit", TIER)
    assert (answer.applied, answer.readmitted, answer.reason) == (True, False, "identity_http_404")
    assert router.tier(TIER)["state"] == "quiesced"


# ── the mutation lock and the busy budget ──────────────────────────────────────


def _drain_in_background(router: FakeRouter, tier: str, timeout_s: float) -> threading.Thread:
    """Someone else's drain of ``tier``, holding the router's mutation lock."""
    router.set_active(tier, 1)
    router.quiesce_as(tier, "maintenance")
    other = make_client(router.url)
    thread = threading.Thread(
        target=lambda: other.transition("drain", tier, drain_timeout_s=timeout_s), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not router.tier(tier)["draining"]:
        assert time.monotonic() < deadline, "the drain never began"
        time.sleep(0.01)
    return thread


def test_a_quiesce_behind_a_long_drain_outlasts_it_with_the_busy_budget(
    router: FakeRouter,
) -> None:
    thread = _drain_in_background(router, "other", timeout_s=60)
    try:
        with make_client(router.url, attempts=3, max_wait_s=0.2, busy_wait_s=60) as client:
            releaser = threading.Timer(1.0, lambda: router.set_active("other", 0))
            releaser.start()
            answer = client.transition("quiesce", TIER)
        assert answer.applied is True and answer.attempts > 3
        assert router.tier(TIER)["state"] == "quiesced"
    finally:
        router.set_active("other", 0)
        thread.join(30)


def test_without_the_busy_budget_a_quiesce_behind_a_drain_gives_up(router: FakeRouter) -> None:
    """The old bound (a few attempts, seconds) gives up while the drain still runs."""
    thread = _drain_in_background(router, "other", timeout_s=60)
    try:
        with (
            make_client(router.url, attempts=3, max_wait_s=0.2) as client,
            pytest.raises(RouterError) as info,
        ):
            client.transition("quiesce", TIER)
        assert info.value.transient and info.value.code == "server_busy"
    finally:
        router.set_active("other", 0)
        thread.join(30)


# ── the management slots ───────────────────────────────────────────────────────


def test_a_fifth_management_request_is_refused_while_a_drain_holds_a_slot(
    router: FakeRouter,
) -> None:
    """The router serves four management requests at once, a drain's for its whole
    length; a fifth (a read too, even unauthenticated) answers 503 server_busy at once."""
    thread = _drain_in_background(router, "other", timeout_s=60)
    try:
        with router.hold_slots(3), httpx.Client(base_url=router.url) as raw:
            for token in (TOKEN, "wrong"):
                answer = raw.get(
                    TRANSITION_PATH,
                    params={"tier_id": TIER},
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert answer.status_code == 503
                assert answer.json() == {
                    "error": {"type": "server_busy", "message": "management busy; try again later"}
                }
        assert router.busy_refusals == 2
        assert client_state(router).state == "admitting"  # a slot is free again
    finally:
        router.set_active("other", 0)
        thread.join(30)
    assert router.management_peak == 2  # the drain and the last read


def client_state(router: FakeRouter) -> TierState:
    with make_client(router.url) as client:
        return client.tier_state(TIER)


def _hold_all_slots(router: FakeRouter, held: threading.Event) -> None:
    with router.hold_slots(4):
        held.set()
        time.sleep(0.5)


def test_the_client_retries_a_router_out_of_management_slots(router: FakeRouter) -> None:
    """A read or a transition refused for want of a slot is retried until one frees."""
    for call in ("state", "quiesce"):
        held = threading.Event()
        holder = threading.Thread(target=_hold_all_slots, args=(router, held), daemon=True)
        holder.start()
        assert held.wait(5)
        refused = router.busy_refusals
        with make_client(router.url, busy_wait_s=30) as client:
            if call == "state":
                assert client.tier_state(TIER).admitting
            else:
                assert client.transition("quiesce", TIER).applied
        holder.join(5)
        assert router.busy_refusals > refused


def test_the_busy_budget_covers_the_longest_drain_plus_margins() -> None:
    assert busy_budget_s([30, 600, 120]) == 600 + DRAIN_HTTP_MARGIN_S + BUSY_MARGIN_S
    assert busy_budget_s([]) == DEFAULT_DRAIN_TIMEOUT_S + DRAIN_HTTP_MARGIN_S + BUSY_MARGIN_S
    assert RouterClient("http://127.0.0.1:1", None).busy_wait_s == busy_budget_s([])


def test_check_passes_when_the_router_answers_and_accepts_the_token(router: FakeRouter) -> None:
    with make_client(router.url) as client:
        assert client.check() is None  # every tier's state: reachable, token fine
        assert client.check(tier_id=TIER) is None


@pytest.mark.parametrize(
    ("token", "expected"),
    [(None, "401"), ("wrong", "401")],
    ids=["no-token", "wrong-token"],
)
def test_check_reports_a_refused_token(
    router: FakeRouter, token: str | None, expected: str
) -> None:
    with make_client(router.url, token=token) as client:
        problem = client.check()
    assert problem is not None
    assert expected in problem and "token" in problem
    if token is None:
        assert "no router token configured" in problem


def test_check_reports_an_unreachable_router() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with make_client(url) as client:
        problem = client.check()
    assert problem is not None and "unreachable" in problem and url in problem


def test_check_reports_an_unknown_tier() -> None:
    with FakeRouter(token=TOKEN, tiers=["known"]) as fake, make_client(fake.url) as client:
        assert client.check(tier_id="known") is None
        problem = client.check(tier_id="stranger")
    assert problem is not None and "stranger" in problem
    assert "400" in problem and "invalid transition request" in problem


def test_check_reports_a_transition_api_that_is_not_enabled() -> None:
    """A router without an auth token configured answers 404 on the endpoint."""
    with FakeRouter(token=None) as fake, make_client(fake.url) as client:
        for tier in (None, "known"):
            problem = client.check(tier_id=tier)
            assert problem is not None and "404" in problem and "not enabled" in problem


# ── the token ──────────────────────────────────────────────────────────────────


def test_router_token_reads_the_file_stripped(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  abc123 \n")
    assert router_token(path, environ={"VRAMCTL_ROUTER_TOKEN": "env"}) == "abc123"


@pytest.mark.parametrize("content", [None, "  \n"], ids=["missing", "blank"])
def test_router_token_file_that_gives_no_token_is_an_error(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RouterError) as info:
        router_token(path, environ={})
    assert info.value.transient is False and str(path) in info.value.message


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"VRAMCTL_ROUTER_TOKEN": " v ", "ANVIL_ROUTER_TOKEN": "a"}, "v"),
        ({"ANVIL_ROUTER_TOKEN": "a"}, "a"),
        ({"VRAMCTL_ROUTER_TOKEN": "", "ANVIL_ROUTER_TOKEN": "a"}, "a"),
        ({}, None),
    ],
    ids=["vramctl-first", "anvil", "blank-vramctl-skipped", "none"],
)
def test_router_token_from_the_environment(environ: dict[str, str], expected: str | None) -> None:
    assert router_token(None, environ=environ) == expected


def test_router_token_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VRAMCTL_ROUTER_TOKEN", raising=False)
    monkeypatch.setenv("ANVIL_ROUTER_TOKEN", "from-env")
    assert router_token(None) == "from-env"
