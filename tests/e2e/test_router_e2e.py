"""The real router's answers, end to end: plans on the real Docker daemon against a test
router that answers as the serving stack's router does (tests/fake_http.py FakeRouter).

What is pinned: a readmit counts only on ``readmitted: true`` (a refusal is retried,
then fails the step and leaves the tier for later cycles), also in the undo after a
failed drain; a tier quiesced by someone else is never quiesced again nor readmitted;
a router-tier typo and a router whose transition API is not enabled are refused by
the preflight before anything is stopped.
"""

# ruff: noqa: F811  (``host`` is the fixture of test_executor_e2e, used by name)
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fake_http import FakeRouter
from loguru import logger
from support.serving import free_port
from test_executor_e2e import (  # noqa: F401  (host: the fixture)
    ROLE,
    TOKEN,
    Host,
    actions,
    host,
    serve_toml,
)

from controller.adapters.router import QUIESCE_REASON
from controller.manifest import ManifestSet
from controller.service.executor import ExecutorConfig
from statemachine.domain.types import OnDemandRequest

pytestmark = pytest.mark.docker

#: readmit refusals retried briefly: the tests stay short
FAST = ExecutorConfig(
    poll_s=0.1, memory_wait_s=5.0, readmit_wait_s=2.0, readmit_poll_s=0.05, readmit_poll_max_s=0.2
)


@pytest.fixture
def logs() -> Iterator[list[str]]:
    """The controller's log lines (loguru) while the test runs."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip()), level="DEBUG", format="{message}")
    yield lines
    logger.remove(sink)


def llm_only(host: Host, *, tier: str = "fast-local") -> ManifestSet:
    port = free_port()
    mset = host.manifest(
        ROLE
        + serve_toml(
            "llm", mib=4000, residency="on-demand", port=port, extra=f'router_tier = "{tier}"'
        )
    )
    host.container("llm", port=port, running=False)
    return mset


def omni_and_llm(host: Host, *, omni_tier: str | None, llm_tier: str | None) -> ManifestSet:
    p_omni, p_llm = free_port(), free_port()
    omni_extra = 'desired = "running"' + (f'\nrouter_tier = "{omni_tier}"' if omni_tier else "")
    llm_extra = f'router_tier = "{llm_tier}"' if llm_tier else ""
    mset = host.manifest(
        ROLE
        + serve_toml("omni", mib=6000, residency="evictable", port=p_omni, extra=omni_extra)
        + serve_toml("llm", mib=6000, residency="on-demand", port=p_llm, extra=llm_extra)
    )
    host.container("omni", port=p_omni, running=True)
    host.container("llm", port=p_llm, running=False)
    return mset


def request(serve: str) -> tuple[OnDemandRequest, ...]:
    return (OnDemandRequest(serve, time.time()),)


def readmits(router: FakeRouter, tier: str) -> int:
    return router.actions().count(("readmit", tier))


# ── defect 2: a refused readmit ────────────────────────────────────────────────


def test_a_refused_readmit_fails_the_step_and_later_cycles_readmit_the_tier(host: Host) -> None:
    mset = llm_only(host)
    host.router.quiesce_as("fast-local", QUIESCE_REASON)  # left so by an earlier eviction
    host.router.script_readmit("fast-local", readmitted=False, reason="identity_not_verified")

    _, report, _ = host.execute(mset, requests=request("llm"), config=FAST)

    assert actions(report) == [
        "reserve llm ok",
        "start llm ok",
        "await_ready llm ok",
        "readmit llm failed",
    ]
    failed = report.results[-1].detail
    assert "identity_not_verified" in failed and "stays quiesced" in failed
    assert readmits(host.router, "fast-local") > 1  # refusals are asked again
    assert host.router.tier("fast-local")["state"] == "quiesced"
    assert host.state("llm") == "running"

    # a later cycle, the router still refusing: the tier is asked for again, and fails
    _, again, _ = host.execute(
        mset, requests=request("llm"), config=FAST, quiesced=frozenset({"llm"})
    )
    assert actions(again) == ["readmit llm failed"]

    # the model's identity verifies now: the next cycle's readmit is accepted
    host.router.script_readmit("fast-local", readmitted=True)
    _, last, _ = host.execute(
        mset, requests=request("llm"), config=FAST, quiesced=frozenset({"llm"})
    )
    assert actions(last) == ["readmit llm ok"]
    assert host.router.tier("fast-local")["state"] == "admitting"


def test_a_readmit_refused_until_identity_verifies_is_retried_until_accepted(host: Host) -> None:
    mset = llm_only(host)
    host.router.quiesce_as("fast-local", QUIESCE_REASON)
    host.router.script_readmit(
        "fast-local", readmitted=False, reason="identity_not_verified", times=2
    )

    _, report, _ = host.execute(mset, requests=request("llm"), config=FAST)

    assert actions(report)[-1] == "readmit llm ok"
    assert "after 2 refusals" in report.results[-1].detail
    assert readmits(host.router, "fast-local") == 3
    assert host.router.tier("fast-local")["state"] == "admitting"


def test_the_undo_after_a_failed_drain_counts_a_readmit_only_when_accepted(
    host: Host, logs: list[str]
) -> None:
    mset = omni_and_llm(host, omni_tier="omni-local", llm_tier=None)
    host.router.script_drain("omni-local", timed_out=True)
    host.router.set_ready("omni-local", False, "identity_http_404")

    _, report, _ = host.execute(mset, requests=request("llm"), config=FAST)

    assert actions(report)[:2] == ["quiesce omni ok", "drain omni aborted"]
    assert host.state("omni") == "running"  # nothing stopped
    assert host.router.tier("omni-local")["state"] == "quiesced"
    assert not any("readmitted (nothing was stopped)" in line for line in logs)
    assert any("left quiesced" in line and "identity_http_404" in line for line in logs)
    assert "identity_http_404" in report.left_quiesced["omni"]
    assert report.to_json()["left_quiesced"] == report.left_quiesced


# ── defect 3: a tier quiesced by someone else ──────────────────────────────────


def test_a_victim_tier_quiesced_by_someone_else_is_neither_quiesced_again_nor_readmitted(
    host: Host, logs: list[str]
) -> None:
    mset = omni_and_llm(host, omni_tier="omni-local", llm_tier=None)
    host.router.quiesce_as("omni-local", "maintenance")
    host.router.script_drain("omni-local", timed_out=True)

    _, report, _ = host.execute(mset, requests=request("llm"), config=FAST)

    assert actions(report)[:2] == ["quiesce omni ok", "drain omni aborted"]
    assert "someone else" in report.results[0].detail
    # a quiesce would have overwritten the reason; a readmit would lift the other quiesce
    assert host.router.actions() == [("drain", "omni-local")]
    tier = host.router.tier("omni-local")
    assert (tier["state"], tier["reason"]) == ("quiesced", "maintenance")
    assert any("someone else" in line for line in logs)
    assert report.lifecycles["omni"] == "running"


def test_a_requester_tier_quiesced_by_someone_else_is_not_readmitted(host: Host) -> None:
    mset = llm_only(host)
    host.router.quiesce_as("fast-local", "maintenance")

    _, report, _ = host.execute(mset, requests=request("llm"), config=FAST)

    assert actions(report)[-1] == "readmit llm ok"
    assert "quiesced by someone else" in report.results[-1].detail
    assert "maintenance" in report.results[-1].detail
    assert readmits(host.router, "fast-local") == 0
    assert host.router.tier("fast-local")["reason"] == "maintenance"
    assert host.state("llm") == "running"


# ── defect 3: the preflight ────────────────────────────────────────────────────


def test_a_router_tier_typo_is_refused_before_anything_is_stopped(host: Host) -> None:
    mset = omni_and_llm(host, omni_tier=None, llm_tier="fast-lcoal")
    with FakeRouter(token=TOKEN, tiers=["fast-local", "omni-local"]) as router:
        host.router = router
        _, report, _ = host.execute(mset, requests=request("llm"), config=FAST)

        problems = [p for p in report.preflight if "fast-lcoal" in p]
        assert problems, report.preflight
        assert problems[0].startswith("llm: router_tier 'fast-lcoal'")
        assert "400" in problems[0] and "invalid transition request" in problems[0]
        assert router.transitions == []
    assert report.refused_groups == ["llm"]
    assert all(a.endswith("skipped") for a in actions(report))
    assert host.state("omni") == "running"  # nothing stopped
    assert host.state("llm") == "created"


def test_a_router_without_its_transition_api_is_refused_clearly(host: Host) -> None:
    mset = omni_and_llm(host, omni_tier="omni-local", llm_tier=None)
    with FakeRouter(token=None) as router:  # no auth configured: no transition API
        host.router = router
        _, report, _ = host.execute(mset, requests=request("llm"), config=FAST)
        assert router.transitions == []
    (problem,) = report.preflight
    assert "404" in problem and "not enabled" in problem
    assert host.state("omni") == "running"
