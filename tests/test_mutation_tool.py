"""The mutation run itself (tests/mutation/mutate.py, docs/mutation.md).

- It fails (exit 1) when a module's score is below its threshold, and passes when the
  tests catch enough: shown on a one-function module in a scratch repository, once with
  a test that misses the boundary and once with one that pins it.
- An equivalent entry that matches no mutant stops the run (exit 2): a stale entry
  would otherwise hide a change.
- Every equivalent mutant of tests/mutation/equivalent.toml is listed in
  docs/mutation.md with its reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MUTATE = ROOT / "tests/mutation/mutate.py"

MODULE = '''"""What a role is short."""


def shortfall(free: int, need: int) -> int:
    return max(0, need - free)
'''

# only a role that is short: max(1, ...) and max(-1, ...) survive
WEAK = """from statemachine.tiny import shortfall


def test_short() -> None:
    assert shortfall(10, 30) == 20
"""

STRONG = """from statemachine.tiny import shortfall


def test_short_and_not_short() -> None:
    assert shortfall(10, 30) == 20
    assert shortfall(30, 10) == 0
"""


def scratch_repo(tmp: Path, test: str, equivalent: str = "") -> Path:
    (tmp / "statemachine").mkdir()
    (tmp / "statemachine/__init__.py").write_text("")
    (tmp / "statemachine/tiny.py").write_text(MODULE)
    (tmp / "tests/mutation").mkdir(parents=True)
    (tmp / "tests/test_tiny.py").write_text(test)
    shutil.copy2(ROOT / "tests/mutation/hypothesis_profile.py", tmp / "tests/mutation")
    (tmp / "tests/mutation/mutation.toml").write_text(
        "[modules.tiny]\nthreshold = 100\n\n[run]\ntimeout_factor = 4.0\ntimeout_min_s = 60\n"
    )
    (tmp / "tests/mutation/equivalent.toml").write_text(equivalent)
    return tmp


def mutate(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MUTATE), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_run_fails_below_the_threshold_and_names_the_survivors(tmp_path: Path) -> None:
    got = mutate(scratch_repo(tmp_path, WEAK))
    assert got.returncode == 1, got.stdout + got.stderr
    assert "survived" in got.stdout and "const 0 -> 1" in got.stdout
    assert "tiny: 4 mutants, 0 equivalent, 4 run, 2 killed (50.0 %, threshold 100 %)" in got.stdout
    assert "FAILED: below threshold: tiny" in got.stderr


def test_the_run_passes_when_the_tests_pin_the_boundary(tmp_path: Path) -> None:
    got = mutate(scratch_repo(tmp_path, STRONG))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "tiny: 4 mutants, 0 equivalent, 4 run, 4 killed (100.0 %" in got.stdout


def test_an_equivalent_entry_that_matches_no_mutant_stops_the_run(tmp_path: Path) -> None:
    stale = (
        '[[equivalent]]\nmodule = "tiny"\nline = "return max(1, need - free)"\n'
        'operator = "minmax max -> min"\nreason = "a line that is gone"\n'
    )
    got = mutate(scratch_repo(tmp_path, STRONG, stale))
    assert got.returncode == 2
    assert "equivalent.toml entry matches no mutant: tiny:return max(1, need - free):" in got.stderr


def _equivalents() -> list[dict[str, object]]:
    data = tomllib.loads((ROOT / "tests/mutation/equivalent.toml").read_text())
    return list(data.get("equivalent", []))


@pytest.mark.parametrize(
    "entry",
    _equivalents(),
    ids=lambda e: f"{e['module']}:{e['line']}:{e['operator']}#{e.get('occurrence', '')}",
)
def test_each_equivalent_mutant_is_listed_in_the_docs(entry: dict[str, object]) -> None:
    doc = (ROOT / "docs/mutation.md").read_text()
    row = f"| `{entry['module']}.py` | `{entry['line']}` | {entry['operator']}"
    rows = [line for line in doc.splitlines() if line.startswith(row)]
    assert rows, f"docs/mutation.md has no row starting {row!r}"
    assert any(str(entry["reason"]) in r for r in rows), f"{row}: the reason differs from the toml"
