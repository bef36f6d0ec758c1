"""The mutation run itself (tests/mutation/mutate.py, docs/mutation.md).

- It fails (exit 1) when a module's score is below its threshold, and passes when the
  tests catch enough: shown on a one-function module in a scratch repository, once with
  a test that misses the boundary and once with one that pins it.
- An equivalent entry that matches no mutant stops the run (exit 2): a stale entry
  would otherwise hide a change. So does an entry that names no ``occurrence``: it
  would hide every equal change on lines of that text, each of which needs its own
  argument.
- A mutant runs only the tests that run one of its lines (the line map of the
  unmutated run): one on a line no test runs is a survivor, reported as not covered;
  one on a line run at import (a module's constant) runs every test of the module.
- A module without a threshold has its score reported, not gated; one marked
  ``in_test_command = false`` runs only with ``--full``.
- Every equivalent mutant of tests/mutation/equivalent.toml is listed in
  docs/mutation.md with its reason.
"""

from __future__ import annotations

import importlib.util
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


def scratch_repo(tmp: Path, test: str, equivalent: str = "", module: str = MODULE) -> Path:
    (tmp / "statemachine").mkdir()
    (tmp / "statemachine/__init__.py").write_text("")
    (tmp / "statemachine/tiny.py").write_text(module)
    (tmp / "tests/mutation").mkdir(parents=True)
    (tmp / "tests/test_tiny.py").write_text(test)
    for plugin in ("hypothesis_profile.py", "selection.py"):
        shutil.copy2(ROOT / "tests/mutation" / plugin, tmp / "tests/mutation")
    (tmp / "tests/mutation/mutation.toml").write_text(
        "[modules.tiny]\nthreshold = 100\n\n[run]\ntimeout_factor = 4.0\ntimeout_min_s = 60\n"
    )
    (tmp / "tests/mutation/equivalent.toml").write_text(equivalent)
    return tmp


def mutate(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MUTATE), "--root", str(root), *args],
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
        'operator = "minmax max -> min"\noccurrence = 0\nreason = "a line that is gone"\n'
    )
    got = mutate(scratch_repo(tmp_path, STRONG, stale))
    assert got.returncode == 2
    assert "equivalent.toml entry matches no mutant: tiny:return max(1, need - free):" in got.stderr


# a second function no test calls, and a module constant (run at import, never in a test)
TWO = (
    MODULE
    + """

FLOOR = 0


def floor(mib: int) -> int:
    return max(FLOOR, mib)


def unused(mib: int) -> int:
    return mib + 1
"""
)

TWO_TESTS = (
    STRONG.replace("import shortfall", "import floor, shortfall")
    + """

def test_floor() -> None:
    assert floor(-5) == 0
    assert floor(7) == 7
"""
)


def test_a_mutant_runs_only_the_tests_that_run_its_line(tmp_path: Path) -> None:
    got = mutate(scratch_repo(tmp_path, TWO_TESTS, module=TWO), "-v")
    # shortfall's 4, floor's max -> min and FLOOR's 0 -> 1 and 0 -> -1 killed; unused's 3 not
    assert "tiny: 10 mutants, 0 equivalent, 10 run, 7 killed (70.0 %" in got.stdout, got.stdout
    assert "3 not covered by any test" in got.stdout
    lines = got.stdout.splitlines()
    # shortfall's mutants run its one test, floor's its own one
    assert any("killed" in x and "1 tests" in x and "max(0, need - free)" in x for x in lines)
    assert any("killed" in x and "1 tests" in x and "max(FLOOR, mib)" in x for x in lines)
    # FLOOR = 0 runs at import: every test of the module runs it (and the 1 kills it)
    assert any("killed" in x and "2 tests" in x and "FLOOR = 0" in x for x in lines)
    uncovered = [x for x in lines if "uncovered" in x]
    assert len(uncovered) == 3 and all("return mib + 1" in x for x in uncovered), uncovered
    assert all(" 0 tests" in x for x in uncovered)
    assert got.returncode == 1


# two equal changes on one line: the two 0s of max(0, need - free, 0)
TWICE = MODULE.replace("max(0, need - free)", "max(0, need - free, 0)")


def test_an_equivalent_entry_without_occurrence_stops_the_run_and_names_each_match(
    tmp_path: Path,
) -> None:
    broad = (
        '[[equivalent]]\nmodule = "tiny"\nline = "return max(0, need - free, 0)"\n'
        'operator = "const 0 -> -1"\nreason = "one argument for two mutants"\n'
    )
    got = mutate(scratch_repo(tmp_path, STRONG, broad, TWICE))
    assert got.returncode == 2, got.stdout + got.stderr
    assert (
        "equivalent.toml entry names no occurrence: tiny:return max(0, need - free, 0):"
        "const 0 -> -1#? matches 2 mutant(s): occurrence = 0 at line 5, occurrence = 1 "
        "at line 5; name exactly one"
    ) in got.stderr


def test_an_equivalent_entry_names_one_mutant_by_its_occurrence(tmp_path: Path) -> None:
    one = (
        '[[equivalent]]\nmodule = "tiny"\nline = "return max(0, need - free, 0)"\n'
        'operator = "const 0 -> -1"\noccurrence = 1\nreason = "the second 0 only"\n'
    )
    root = scratch_repo(tmp_path, STRONG, one, TWICE)
    got = subprocess.run(
        [sys.executable, str(MUTATE), "--root", str(root), "--list"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    assert "# tiny: 6 mutants, 1 equivalent, 5 to run" in got.stdout
    assert "tiny:return max(0, need - free, 0):const 0 -> -1#0" in got.stdout
    assert "tiny:return max(0, need - free, 0):const 0 -> -1#1" not in got.stdout
    # the same entry once more: listed twice is refused
    (root / "tests/mutation/equivalent.toml").write_text(one + "\n" + one)
    again = mutate(root)
    assert again.returncode != 0 and "listed twice" in again.stderr


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
    row = (
        f"| `{entry['module']}.py` | `{entry['line']}` | {entry['operator']} "
        f"#{entry['occurrence']} |"
    )
    rows = [line for line in doc.splitlines() if line.startswith(row)]
    assert rows, f"docs/mutation.md has no row starting {row!r}"
    assert any(str(entry["reason"]) in r for r in rows), f"{row}: the reason differs from the toml"


def test_the_docs_table_of_equivalents_is_the_one_the_toml_generates() -> None:
    spec = importlib.util.spec_from_file_location("mutate_tool", MUTATE)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules["mutate_tool"] = tool  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    table = tool.equivalents_table(tool.load_config(ROOT))
    doc = (ROOT / "docs/mutation.md").read_text()
    assert f"(tests/mutation/mutate.py --docs) -->\n{table}\n<!-- end: equivalents -->" in doc, (
        "run `python tests/mutation/mutate.py --list --docs` to regenerate it"
    )


def test_a_module_without_threshold_is_reported_not_gated(tmp_path: Path) -> None:
    root = scratch_repo(tmp_path, WEAK)
    toml = root / "tests/mutation/mutation.toml"
    toml.write_text(toml.read_text().replace("threshold = 100\n", "in_test_command = false\n"))
    # not in the test command's run: nothing of it runs without --full
    assert "tiny" not in mutate(root, "--list").stdout
    got = mutate(root, "--full")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "4 run, 2 killed (50.0 %, threshold reported only)" in got.stdout


# a cached function, a property and a static method (patched in a fork of the warm
# process), a table built at import (its function's lines run outside every test: a
# fresh process), and a loop a mutant makes endless (the child's alarm)
SHAPES = '''"""Shapes the warm process patches, or leaves to a fresh process."""

import functools


@functools.cache
def doubled(mib: int) -> int:
    return mib * 2


class Room:
    def __init__(self, mib: int) -> None:
        self.mib = mib

    @property
    def half(self) -> int:
        return self.mib // 2

    @staticmethod
    def spare(mib: int) -> int:
        return mib - 10


def _levels() -> dict[str, int]:
    return {"low": 10 - 3}


LEVELS = _levels()


def countdown(n: int) -> int:
    while n > 0:
        n -= 1
    return n
'''

SHAPES_TESTS = """from statemachine.tiny import LEVELS, Room, countdown, doubled


def test_doubled() -> None:
    assert doubled(4) == 8


def test_room() -> None:
    assert Room(8).half == 4
    assert Room.spare(30) == 20


def test_levels() -> None:
    assert LEVELS == {"low": 7}


def test_countdown() -> None:
    assert countdown(3) == 0
"""


def _outcomes(stdout: str) -> dict[str, tuple[str, str]]:
    """Each mutant's described change: (status, how it ran)."""
    found: dict[str, tuple[str, str]] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[0] in ("killed", "survived", "timeout", "uncovered"):
            found[line.split("tiny.py:", 1)[1]] = (parts[0], parts[4])
    return found


def test_the_warm_process_patches_function_bodies_and_judges_as_a_fresh_one(
    tmp_path: Path,
) -> None:
    root = scratch_repo(tmp_path, SHAPES_TESTS, module=SHAPES)
    toml = root / "tests/mutation/mutation.toml"
    toml.write_text(toml.read_text().replace("timeout_min_s = 60", "timeout_min_s = 10"))
    warm = _outcomes(mutate(root, "-v").stdout)
    fresh = _outcomes(mutate(root, "-v", "--fresh").stdout)
    caught = {"killed": "caught", "timeout": "caught"}  # both count as killed
    assert {k: caught.get(s, s) for k, (s, _) in warm.items()} == {
        k: caught.get(s, s) for k, (s, _) in fresh.items()
    }
    assert len(warm) == 20
    assert {how for _, how in fresh.values()} == {"fresh"}
    by_text = {k.split(":", 1)[1].strip(): v for k, v in warm.items()}
    # the function bodies run warm: the cached function (its cache emptied), the
    # property, the static method, the loop; every mutant of them is killed
    for text in (
        "arith * -> //    return mib * 2",
        "arith // -> *    return self.mib // 2",
        "arith - -> +    return mib - 10",
        "cmp > -> >=    while n > 0:",
    ):
        assert by_text[text] == ("killed", "warm"), (text, warm)
    # the endless loop is stopped by the child's alarm
    assert by_text["aug -= -> +=    n -= 1"] == ("timeout", "warm")
    # the table's function ran at import: a fresh process builds the table with it
    assert by_text['arith - -> +    return {"low": 10 - 3}'] == ("killed", "fresh")


def test_known_survivors_are_counted_as_survived_without_running(tmp_path: Path) -> None:
    root = scratch_repo(tmp_path, WEAK)
    assert mutate(root, "--survivors").returncode == 2  # not every mutant run: refused
    wrote = mutate(root, "--full", "--survivors")
    assert wrote.returncode == 1, wrote.stdout + wrote.stderr
    known = tomllib.loads((root / "tests/mutation/survivors.toml").read_text())["known"]
    assert sorted(known) == [
        "tiny:return max(0, need - free):const 0 -> -1#0",
        "tiny:return max(0, need - free):const 0 -> 1#0",
    ]
    # the test command's run: the same score, the two not run
    got = mutate(root, "-v")
    assert got.returncode == 1
    assert "4 run, 2 killed (50.0 %" in got.stdout
    assert "2 known survivors counted without running" in got.stdout
    ran = [x for x in got.stdout.splitlines() if x.startswith("  ")]
    assert len(ran) == 2 and all("killed" in x for x in ran), ran
    # once the tests pin the boundary, --recheck runs them and sees them killed
    (root / "tests/test_tiny.py").write_text(STRONG)
    assert "4 killed (100.0 %" in mutate(root, "--recheck").stdout
    assert "0 known survivors" in mutate(root, "--full", "--survivors").stdout
    assert tomllib.loads((root / "tests/mutation/survivors.toml").read_text())["known"] == []


# a mutant that makes the module refuse to import: the tests' files fail to collect
REFUSES = '''"""A check at import."""

LIMIT = 1
if LIMIT < 1:
    raise TypeError("LIMIT must be at least 1")


def limit() -> int:
    return LIMIT
'''

REFUSES_TESTS = """from statemachine.tiny import limit


def test_limit() -> None:
    assert limit() == 1
"""


def test_a_mutant_that_breaks_the_import_is_killed_not_an_error(tmp_path: Path) -> None:
    got = mutate(scratch_repo(tmp_path, REFUSES_TESTS, module=REFUSES), "-v")
    # LIMIT 1 -> 0, the check's < -> <= and its 1 -> 2 raise at import (the test file
    # cannot be collected: killed, not a usage error); LIMIT 1 -> 2 fails the test; the
    # check's 1 -> 0 (LIMIT < 0) survives: a survivor, so the run is below 100 % (exit 1)
    assert got.returncode == 1, got.stdout + got.stderr
    assert "tiny: 5 mutants, 0 equivalent, 5 run, 4 killed (80.0 %" in got.stdout
    assert "error" not in got.stderr
    assert "survived" in next(x for x in got.stdout.splitlines() if "const 1 -> 0    if LIMIT" in x)


def test_the_shell_run_takes_the_shells_modules_only(tmp_path: Path) -> None:
    root = scratch_repo(tmp_path, STRONG)
    (root / "controller").mkdir()
    (root / "controller/__init__.py").write_text("")
    (root / "controller/tiny.py").write_text(MODULE)
    toml = root / "tests/mutation/mutation.toml"
    toml.write_text(toml.read_text() + '\n[modules."controller.tiny"]\nin_test_command = false\n')
    shell = mutate(root, "--shell", "--list").stdout
    assert "# controller.tiny: 4 mutants" in shell and "# tiny:" not in shell, shell
    core = mutate(root, "--list").stdout
    assert "# tiny: 4 mutants" in core and "controller.tiny" not in core, core
    # and the run says what it took: its summary line (and the docs block it writes) says shell
    run = mutate(root, "--shell")
    assert "mutate: shell run in" in run.stdout, run.stdout + run.stderr


def test_a_module_in_a_subpackage_of_the_core_is_mutated_by_its_dotted_path(
    tmp_path: Path,
) -> None:
    """``statemachine/engines/tiny.py`` is ``engines.tiny``: its mutants run the tests that
    import it or its package (a registry loads its modules itself), its lines are mapped
    under that name, and a weak test leaves the same survivors as at the top level."""
    root = scratch_repo(tmp_path, WEAK.replace("statemachine.tiny", "statemachine.engines"))
    (root / "statemachine/engines").mkdir()
    (root / "statemachine/engines/__init__.py").write_text(
        "from statemachine.engines.tiny import shortfall\n\n__all__ = ['shortfall']\n"
    )
    (root / "statemachine/tiny.py").rename(root / "statemachine/engines/tiny.py")
    toml = root / "tests/mutation/mutation.toml"
    toml.write_text(toml.read_text().replace("[modules.tiny]", '[modules."engines.tiny"]'))
    listed = mutate(root, "--list")
    assert "# engines.tiny: 4 mutants" in listed.stdout, listed.stdout + listed.stderr
    assert "tests/test_tiny.py" in listed.stdout, listed.stdout
    run = mutate(root, "-v")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engines.tiny: 4 mutants, 0 equivalent, 4 run, 2 killed" in run.stdout, run.stdout
    assert "statemachine/engines/tiny.py" not in run.stderr, run.stderr
