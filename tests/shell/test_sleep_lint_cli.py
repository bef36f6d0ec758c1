"""``vramctl lint --compose`` names an engine started without its sleep API, and exits 1.

The executor falls back to a stop when an engine answers the sleep API with 404; the
lint is where the operator learns which flag is missing before that happens.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support.cli import bare_cli
from support.files import compose
from test_engine_flags_sleep import SERVICES, SLEEPY

REPO = Path(__file__).resolve().parents[2]


def lint(*args: str) -> subprocess.CompletedProcess[str]:
    return bare_cli("lint", *args)


def test_lint_compose_names_the_missing_sleep_flag_and_exits_1(tmp_path: Path) -> None:
    manifest = tmp_path / "serves.toml"
    manifest.write_text(SLEEPY)
    good = compose(tmp_path, SERVICES, "good.yml")
    ok = lint("-m", str(manifest), "--compose", str(good))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = compose(tmp_path, SERVICES.replace('    VLLM_SERVER_DEV_MODE: "1"\n', ""), "bad.yml")
    r = lint("-m", str(manifest), "--compose", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "VLLM_SERVER_DEV_MODE" in r.stdout and "chat" in r.stdout, r.stdout
    j = lint("-m", str(manifest), "--compose", str(bad), "--json")
    assert j.returncode == 1
    body = json.loads(j.stdout)
    assert body["ok"] is False and body["errors"] == 1
    found = [f for f in body["findings"] if f["severity"] == "error"]
    assert [(f["kind"], f["serve"], f["missing"]) for f in found] == [
        ("sleep-mode-off", "chat", ["VLLM_SERVER_DEV_MODE=1"])
    ]
