"""The Grafana dashboard and the Prometheus alert rules of docs/deploy/ stay true to /metrics.

- every ``vramctl_*`` name the dashboard and the rules query is emitted by a running
  ``vramctl run`` (the harness of test_api.py: a subprocess over real containers), and
  every label they match on is one that metric carries;
- the dashboard imports as it is: a datasource variable, no datasource uid of some
  other Grafana, unique panel ids;
- ``promtool check rules`` accepts the rules and ``promtool test rules`` runs their
  unit tests (docs/deploy/prometheus-alerts.test.yml): each alert fires on the series
  it is about and stays quiet on a healthy loop. promtool is Debian's ``prometheus``
  package (tests/ensure-tools.sh installs it);
- the backoff gauge the "backing off" alert reads follows the loop's backoff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.waiting import wait_for
from test_api import Live, idle, live, observe  # noqa: F401

from controller.interfaces.metrics import Metrics
from controller.service.loop import Backoff, Controller

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
RULES = DEPLOY / "prometheus-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus-alerts.test.yml"
IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}

_NAME = re.compile(r"\bvramctl_[a-z0-9_]+")
_SELECTOR = re.compile(r"\b(vramctl_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def _dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def _rule_exprs() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def exposed(live: Live) -> Iterator[dict[str, set[str]]]:
    """Sample and family names on the running controller's /metrics -> their label names."""
    wait_for("two cycles", lambda: live.http.get("/healthz").json()["cycles"] >= 2)
    text = live.http.get("/metrics").text
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        names.setdefault(family.name, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
            names[family.name].update(sample.labels)
    # a family without a sample now (NVML used / drift on a host without NVML) is
    # still declared on /metrics with its # TYPE line
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.setdefault(line.split()[2], set())
    yield names


def test_the_dashboard_imports_as_it_is() -> None:
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
    assert "__inputs" not in dash  # no import-time mapping needed


def test_the_dashboard_covers_the_ledger_the_serves_and_the_loop() -> None:
    used = {
        n for e in _dashboard_exprs(json.loads(DASHBOARD.read_text())) for n in _NAME.findall(e)
    }
    for name in (
        "vramctl_role_committed_mib",
        "vramctl_role_free_mib",
        "vramctl_role_budget_mib",
        "vramctl_role_nvml_used_mib",
        "vramctl_role_drift_mib",
        "vramctl_serve_state",
        "vramctl_serve_reservation_mib",
        "vramctl_serve_committed_mib",
        "vramctl_reconcile_duration_seconds_bucket",
        "vramctl_admissions_refused_total",
        "vramctl_observation_errors_total",
    ):
        assert name in used, name
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert {
        "VramctlRoleOvercommitted",
        "VramctlDriftHigh",
        "VramctlServeFailed",
        "VramctlServeBackingOff",
        "VramctlServeOverReservation",
        "VramctlObservationErrors",
        "VramctlLoopNotCycling",
    } <= alerts


@pytest.mark.docker
def test_every_metric_the_dashboard_and_rules_use_is_emitted(
    exposed: dict[str, set[str]],
) -> None:
    exprs = _dashboard_exprs(json.loads(DASHBOARD.read_text())) + _rule_exprs()
    used = {n for e in exprs for n in _NAME.findall(e)}
    assert len(used) >= 15
    missing = sorted(used - set(exposed))
    assert not missing, f"not on /metrics of a running controller: {missing}"
    for expr in exprs:
        for name, matchers in _SELECTOR.findall(expr):
            for label in _MATCHER.findall(matchers):
                if exposed[name]:  # a family with samples: its labels are known
                    assert label in exposed[name], f"{name} has no label {label!r}: {expr}"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "no promtool: tests/ensure-tools.sh installs Debian's prometheus package"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_the_rules_pass_promtool_check_and_their_unit_tests() -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 8 rules found" in check.stdout
    unit = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        check=False,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout


def test_the_backoff_gauge_follows_the_loops_backoff(idle: Controller) -> None:
    metrics = Metrics()
    observe(idle, {"res": {"state": "exited", "exit_code": 1}})
    metrics.update_ledger(idle)

    def gauge() -> dict[str, float]:
        families = text_string_to_metric_families(metrics.render().decode())
        return {
            s.labels["serve"]: s.value
            for f in families
            if f.name == "vramctl_serve_backoff_failures"
            for s in f.samples
        }

    assert gauge()["res"] == 0 and gauge()["llm"] == 0
    idle.backoff["res"] = Backoff(failures=3, until=time.time() + 60, last_failure="x")
    metrics.update_ledger(idle)
    assert gauge()["res"] == 3 and gauge()["llm"] == 0
    del idle.backoff["res"]
    metrics.update_ledger(idle)
    assert gauge()["res"] == 0
