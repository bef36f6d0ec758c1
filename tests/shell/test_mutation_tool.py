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

import ast
import importlib.util
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MUTATE = ROOT / "tests/mutation/mutate.py"

MODULE = '''"""What a role is short."""


def shortfall(free: int, need: int) -> int:
    return max(0, need - free)
'''

# only a role that is short: max(1, ...) and max(-1, ...) survive (of 6 mutants)
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
    assert "tiny: 6 mutants, 0 equivalent, 6 run, 4 killed (66.7 %, threshold 100 %)" in got.stdout
    assert "FAILED: below threshold: tiny" in got.stderr


def test_the_run_passes_when_the_tests_pin_the_boundary(tmp_path: Path) -> None:
    got = mutate(scratch_repo(tmp_path, STRONG))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "tiny: 6 mutants, 0 equivalent, 6 run, 6 killed (100.0 %" in got.stdout


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
    # shortfall's 6, floor's max -> min and FLOOR's 0 -> 1 and 0 -> -1 killed; unused's 3 not
    assert "tiny: 12 mutants, 0 equivalent, 12 run, 9 killed (75.0 %" in got.stdout, got.stdout
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
    assert "# tiny: 8 mutants, 1 equivalent, 7 to run" in got.stdout
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
    assert "6 run, 4 killed (66.7 %, threshold reported only)" in got.stdout


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
    assert len(warm) == 26
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
    assert "6 run, 4 killed (66.7 %" in got.stdout
    assert "2 known survivors counted without running" in got.stdout
    ran = [x for x in got.stdout.splitlines() if x.startswith("  ")]
    assert len(ran) == 4 and all("killed" in x for x in ran), ran
    # once the tests pin the boundary, --recheck runs them and sees them killed
    (root / "tests/test_tiny.py").write_text(STRONG)
    assert "6 killed (100.0 %" in mutate(root, "--recheck").stdout
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
    # LIMIT 1 -> 0, the check's < -> <=, its 1 -> 2 and its guard always taken raise at
    # import (the test file
    # cannot be collected: killed, not a usage error); LIMIT 1 -> 2 fails the test; the
    # check's 1 -> 0 (LIMIT < 0) survives: a survivor, so the run is below 100 % (exit 1)
    assert got.returncode == 1, got.stdout + got.stderr
    assert "tiny: 6 mutants, 0 equivalent, 6 run, 5 killed (83.3 %" in got.stdout
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
    assert "# controller.tiny: 6 mutants" in shell and "# tiny:" not in shell, shell
    core = mutate(root, "--list").stdout
    assert "# tiny: 6 mutants" in core and "controller.tiny" not in core, core
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
    assert "# engines.tiny: 6 mutants" in listed.stdout, listed.stdout + listed.stderr
    assert "tests/test_tiny.py" in listed.stdout, listed.stdout
    run = mutate(root, "-v")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engines.tiny: 6 mutants, 0 equivalent, 6 run, 4 killed" in run.stdout, run.stdout
    assert "statemachine/engines/tiny.py" not in run.stderr, run.stderr


# the shapes real bugs take: an operand of and/or dropped, a sort key's or a tuple
# comparison's elements swapped, a statement deleted, a guard always taken, a count
# read as one of its terms, a unit's constant read as the other unit's
BUGS = '''"""Shapes the operators of bugs' forms change."""

KIB = 1024


def usable(a: bool, b: bool, c: bool) -> bool:
    return a and b and c


def either(a: bool, b: bool) -> bool:
    return a or b


def by_age(items: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(items, key=lambda p: (p[1], p[0]))


def rank_key(p: tuple[int, int]) -> tuple[int, int]:
    return (p[1], p[0])


def before(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return (a[1], a[0]) < (b[1], b[0])


def total(items: list[int], seen: list[int]) -> int:
    count = 0
    for i in items:
        if i < 0:
            continue
        seen.append(i)
        count = count + i
    return count


def left(size: int, used: int) -> int:
    return size - used


def mib(n: int) -> float:
    return n / 1e6
'''

BUGS_TESTS = """from statemachine.tiny import (
    KIB, before, by_age, either, left, mib, rank_key, total, usable,
)


def test_usable() -> None:
    assert usable(True, True, True)
    assert not usable(False, True, True)
    assert not usable(True, False, True)
    assert not usable(True, True, False)


def test_either() -> None:
    assert either(False, True) and either(True, False)


def test_order() -> None:
    assert by_age([(1, 2), (2, 1)]) == [(2, 1), (1, 2)]
    assert sorted([(1, 2), (2, 1)], key=rank_key) == [(2, 1), (1, 2)]
    assert before((2, 1), (1, 2))


def test_total() -> None:
    seen: list[int] = []
    assert total([3, -1, 4], seen) == 7
    assert seen == [3, 4]


def test_left() -> None:
    assert left(10, 3) == 7


def test_units() -> None:
    assert KIB == 1024
    assert mib(2_000_000) == 2.0
"""

# each new operator's mutants of BUGS: key -> the changed line (as ast.unparse writes it)
BUG_MUTANTS = {
    "tiny:KIB = 1024:unit 1024 -> 1000#0": "KIB = 1000",
    "tiny:return a and b and c:drop and operand 0#0": "return b and c",
    "tiny:return a and b and c:drop and operand 1#0": "return a and c",
    "tiny:return a and b and c:drop and operand 2#0": "return a and b",
    "tiny:return a or b:drop or operand 0#0": "return b",
    "tiny:return a or b:drop or operand 1#0": "return a",
    "tiny:return sorted(items, key=lambda p: (p[1], p[0])):swap key 0 <-> 1#0": (
        "return sorted(items, key=lambda p: (p[0], p[1]))"
    ),
    "tiny:return (p[1], p[0]):swap key 0 <-> 1#0": "return (p[0], p[1])",
    "tiny:return (a[1], a[0]) < (b[1], b[0]):swap key 0 <-> 1#0": (
        "return (a[0], a[1]) < (b[1], b[0])"
    ),
    "tiny:return (a[1], a[0]) < (b[1], b[0]):swap key 0 <-> 1#1": (
        "return (a[1], a[0]) < (b[0], b[1])"
    ),
    "tiny:count = 0:statement deleted#0": "pass",
    "tiny:if i < 0::guard always taken#0": "if True:",
    "tiny:continue:statement deleted#0": "pass",
    "tiny:seen.append(i):statement deleted#0": "pass",
    "tiny:count = count + i:statement deleted#0": "pass",
    "tiny:return size - used:count a - b -> a#0": "return size",
    "tiny:return size - used:count a - b -> b#0": "return used",
    "tiny:return n / 1e6:unit 1000000.0 -> 1048576.0#0": "return n / 1048576.0",
}
NEW_OPERATORS = [
    "drop and operand",
    "drop or operand",
    "swap key",
    "statement deleted",
    "guard always taken",
    "count a - b",
    "unit ",
]


def _tool() -> object:
    spec = importlib.util.spec_from_file_location("mutate_tool", MUTATE)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules["mutate_tool"] = tool  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    return tool


def _each_outcome(stdout: str) -> list[tuple[str, str, str]]:
    """Each mutant's described change, its status and how it ran, in key order (two
    equal changes on one line are two entries)."""
    found = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[0] in ("killed", "survived", "timeout", "uncovered"):
            found.append((line.split("tiny.py:", 1)[1], parts[0], parts[4]))
    return sorted(found)


def test_each_new_operator_makes_the_expected_mutants() -> None:
    tool: Any = _tool()
    made = {
        m.key: m for m in tool.mutants_of("tiny", BUGS) if any(op in m.op for op in NEW_OPERATORS)
    }
    assert sorted(made) == sorted(BUG_MUTANTS)
    original = ast.unparse(ast.parse(BUGS)).splitlines()
    for key, line in BUG_MUTANTS.items():
        changed = tool.mutated_source(BUGS, made[key]).splitlines()
        assert len(changed) == len(original), key
        diff = [(a.strip(), b.strip()) for a, b in zip(original, changed, strict=True) if a != b]
        assert [b for _, b in diff] == [line], (key, diff)


def test_a_guard_a_key_and_a_deletion_need_their_shape() -> None:
    """Not every if, tuple or statement: a guard's body is one exit and it has no else;
    a tuple is a key (of key=, of a *_key function) or a side of an ordering; a
    statement deleted is a call, an update, a raise, a continue, or an assignment of a
    name bound elsewhere too (deleting a name's one binding would only crash)."""
    tool: Any = _tool()
    source = """
def f(x: int, names: list[str]) -> tuple[int, int]:
    y = x * 2
    if x in (1, 2):
        y += 1
    if x > 3:
        return (x, y)
    else:
        y = 0
    pair = (y, x)
    return pair
"""
    ops = {m.key.split(":", 1)[1] for m in tool.mutants_of("m", source)}
    assert "y += 1:statement deleted#0" in ops
    assert "y = 0:statement deleted#0" in ops
    assert "y = x * 2:statement deleted#0" in ops  # y is bound again below
    assert not any(op.startswith("pair = (y, x):statement") for op in ops)  # its one binding
    assert not any("guard" in op or "swap key" in op for op in ops), ops


def test_the_new_operators_run_warm_and_fresh_alike_and_are_reported_per_operator(
    tmp_path: Path,
) -> None:
    root = scratch_repo(tmp_path, BUGS_TESTS, module=BUGS)
    only = [a for op in NEW_OPERATORS for a in ("--match", op)]
    warm_run = mutate(root, "-v", *only)
    fresh_run = mutate(root, "-v", "--fresh", *only)
    warm, fresh = _each_outcome(warm_run.stdout), _each_outcome(fresh_run.stdout)
    assert len(warm) == len(BUG_MUTANTS), warm_run.stdout + warm_run.stderr
    assert [(k, s) for k, s, _ in warm] == [(k, s) for k, s, _ in fresh]
    assert {s for _, s, _ in warm} == {"killed"}, warm
    # the function bodies' mutants ran in a fork of the warm process, the module
    # constant's in a fresh one
    hows = [(k.split(":", 1)[1].strip(), how) for k, _, how in warm]
    hows.remove(("unit 1024 -> 1000    KIB = 1024", "fresh"))
    assert {how for _, how in hows} == {"warm"}, hows
    assert {how for _, _, how in fresh} == {"fresh"}
    for got in (warm_run, fresh_run):
        assert got.returncode == 0, got.stdout + got.stderr
        assert (
            "tiny by operator: drop 5/5, swap 4/4, delete 4/4, guard 1/1, count 2/2, unit 2/2"
        ) in got.stdout
        assert "| drop | 5 | 0 | 5 | 5 | 0 | 0 | 100.0 % |" in got.stdout


DOC_BLOCKS = """# Mutation

<!-- generated: scores (tests/mutation/mutate.py --docs) -->
<!-- end: scores -->

<!-- generated: equivalents (tests/mutation/mutate.py --docs) -->
<!-- end: equivalents -->
"""


def test_the_docs_scores_name_every_gated_module_and_count_per_operator(
    tmp_path: Path,
) -> None:
    """A run with --docs stores its modules' figures; the block lists every module the
    test command gates (one never run says so) and sums the figures per operator."""
    root = scratch_repo(tmp_path, WEAK)
    (root / "statemachine/other.py").write_text(MODULE)
    (root / "docs").mkdir()
    (root / "docs/mutation.md").write_text(DOC_BLOCKS)
    toml = root / "tests/mutation/mutation.toml"
    toml.write_text(toml.read_text() + "\n[modules.other]\nthreshold = 90\n")
    got = mutate(root, "tiny", "--docs")
    assert got.returncode == 1, got.stdout + got.stderr
    doc = (root / "docs/mutation.md").read_text()
    assert (
        "Of the 2 modules the test command gates, 1 have a stored run: 0 at or above their "
        "threshold, below it: `tiny` 66.7 %; not run yet: `other`."
    ) in doc
    rows = [x for x in doc.splitlines() if x.startswith("| `statemachine/")]
    assert rows[0].startswith("| `statemachine/tiny.py` | 100 % | 6 | 0 | 6 | 4 | 2 | 0 | 0 |")
    assert rows[1].startswith("| `statemachine/other.py` | 90 % | not run |")
    assert "| minmax | 1 | 0 | 1 | 1 | 0 | 0 | 100.0 % |" in doc
    assert "| const | 2 | 0 | 2 | 0 | 2 | 0 | 0.0 % |" in doc
    stored = tomllib.loads((root / "tests/mutation/scores.toml").read_text())["modules"]
    assert set(stored) == {"tiny"} and stored["tiny"]["operators"]["count"]["killed"] == 2
    # a run of some mutants only (--match) is no module's score: nothing stored
    mutate(root, "other", "--docs", "--match", "max")
    assert set(tomllib.loads((root / "tests/mutation/scores.toml").read_text())["modules"]) == {
        "tiny"
    }


def test_the_docs_scores_block_is_the_one_the_stored_runs_generate() -> None:
    tool: Any = _tool()
    block = tool.scores_block(tool.load_config(ROOT), tool.load_scores(ROOT))
    doc = (ROOT / "docs/mutation.md").read_text()
    assert f"<!-- generated: scores (tests/mutation/mutate.py --docs) -->\n{block}\n" in doc, (
        "run `python tests/mutation/mutate.py --list --docs` to regenerate it"
    )
