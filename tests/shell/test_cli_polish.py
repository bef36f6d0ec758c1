"""The command line as a new operator first reads it: the help, the exit codes, and the
answers of ``validate``, ``observe``, ``status`` and ``fit`` where something is missing
(docs/operations.md, "Commands" and "Docker cannot be reached").

* ``vramctl --help`` lists every command with a whole sentence, never cut with "...";
  the usage lines name what to give (SERVE, FILE, SECONDS), not Python types;
* each command's help names the exit codes docs/operations.md gives it;
* ``validate --json`` answers on stdout when the manifest is invalid too;
* ``observe`` exits 3 when Docker could not be read, like ``status``/``fit``/``plan``;
* ``status`` says once that NVML is unavailable;
* ``fit`` says when the start it answers cannot be carried out without a router, and
  that it cannot be answered (not "does not fit") when Docker could not be read.

Each runs the real module in a subprocess, as the console script does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from support.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "single-card.toml"
OBSERVED = ROOT / "manifests" / "examples" / "single-card.observed.json"
COMMANDS = [
    "validate",
    "observe",
    "status",
    "calibrate",
    "fit",
    "plan",
    "apply",
    "run",
    "up",
    "down",
    "events",
    "replay",
    "render",
    "lint",
    "estimate",
    "mcp",
]


def vramctl(*args: str, columns: int = 200, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMCTL_")}
    env.update(COLUMNS=str(columns), NO_COLOR="1", TERM="dumb", **extra_env)
    return run_cli(*args, env=env, cwd=ROOT)


def _no_docker(tmp_path: Path) -> dict[str, str]:
    return {"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}


# ── the help ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("columns", [80, 100])
def test_every_commands_summary_is_a_whole_sentence(columns: int) -> None:
    text = vramctl("--help", columns=columns).stdout
    listing = text.split("Commands:\n", 1)[1].rstrip("\n").splitlines()
    summaries = {}
    for line in listing:
        match = re.fullmatch(r"  (\w+) +(\S.*)", line)
        assert match, f"not one line per command: {line!r}\n{text}"
        summaries[match[1]] = match[2]
    assert sorted(summaries) == sorted(COMMANDS), text
    for name, summary in summaries.items():
        assert not summary.endswith("..."), f"{name}: cut: {summary!r}"
        assert summary[-1] in ".?", f"{name}: not a whole sentence: {summary!r}"


@pytest.mark.parametrize("command", COMMANDS)
def test_usage_and_options_name_what_to_give_not_python_types(command: str) -> None:
    text = vramctl(command, "--help", columns=100).stdout
    assert text.startswith("Usage: ") and f" {command} [OPTIONS]" in text.splitlines()[0], text
    assert not re.search(r"<[a-z][^>]*>|(?<!\$)\{\w+\}", text), text


def test_the_usage_lines_name_the_arguments_and_the_options_values() -> None:
    assert " fit [OPTIONS] SERVE\n" in vramctl("fit", "--help").stdout
    assert " replay [OPTIONS] SOURCE\n" in vramctl("replay", "--help").stdout
    assert " apply [OPTIONS] [PLAN]\n" in vramctl("apply", "--help").stdout
    status = vramctl("status", "--help").stdout
    assert "--manifest FILE" in status and "--interval SECONDS" in status, status


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        ("validate", ["0 when valid", "1"]),
        ("observe", ["3 when Docker could not be read"]),
        ("status", ["2 when the state directory", "3 when Docker could not be read"]),
        ("calibrate", ["2 when the state directory cannot be read"]),
        (
            "fit",
            [
                "0 it fits",
                "1 it does not",
                "2 when the serve is unknown",
                "the state directory cannot be read",
                "3 when Docker could not be read",
            ],
        ),
        ("apply", ["2 when the state directory cannot be locked"]),
        ("plan", ["2 when there are changes", "3 when Docker could not be read"]),
        ("replay", ["0 when every cycle plans the same", "2 when some differ", "1 on errors"]),
    ],
)
def test_each_commands_help_names_its_documented_exit_codes(command: str, codes: list[str]) -> None:
    flat = " ".join(vramctl(command, "--help").stdout.split())
    for code in codes:
        assert code in flat, f"{command} --help lacks {code!r}: {flat}"


# ── the answers ───────────────────────────────────────────────────────────────


EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.toml"))


def _table_rows(text: str, title: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header's words and each row's words (by its first cell) of the table titled
    ``title`` in ``text``: a row's cells folded over several lines are joined."""
    lines = text.splitlines()
    start = lines.index(title)
    header: list[str] = []
    rows: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_body = False
    for line in lines[start + 1 :]:
        if line.startswith(("└", "┗")):
            break
        if line.startswith(("┡", "├")):
            in_body = True
            continue
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if not cells:
            continue
        if not in_body:
            header += " ".join(cells).split()
        elif cells[0]:
            current = rows.setdefault(cells[0], [])
            current += " ".join(cells).replace(",", " ").split()
        elif current is not None:
            current += " ".join(cells).replace(",", " ").split()
    return header, rows


@pytest.mark.parametrize("manifest", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_status_reads_whole_at_80_columns(manifest: Path) -> None:
    """At 80 columns every line fits, no word of a table is cut (each is one of the words
    the same table has at 200), and every role and serve has its row with its name,
    residency and state."""
    observed = manifest.with_suffix(".observed.json")
    args = ("status", "-m", str(manifest), "--observed", str(observed))
    narrow, wide = vramctl(*args, columns=80), vramctl(*args, columns=200)
    assert narrow.returncode == 0, narrow.stderr
    too_long = [line for line in narrow.stdout.splitlines() if len(line) > 80]
    assert not too_long, narrow.stdout
    assert "…" not in narrow.stdout, narrow.stdout
    report = json.loads(vramctl(*args, "--json").stdout)
    for title, key, names in (
        ("GPU roles (MiB)", "role", [r["gpu_role"] for r in report["gpu_roles"]]),
        ("Serves", "serve", [s["serve"] for s in report["serves"]]),
    ):
        header, rows = _table_rows(narrow.stdout, title)
        wide_header, wide_rows = _table_rows(wide.stdout, title)
        # the narrow serves table says container, health and lifecycle in one "state"
        assert key in header and set(header) <= {*wide_header, "state"}, narrow.stdout
        assert sorted(rows) == sorted(names), narrow.stdout
        for name, words in rows.items():
            cut = set(words) - set(wide_rows[name])
            assert not cut, f"{name}: {sorted(cut)} cut mid-word:\n{narrow.stdout}"
    for s in report["serves"]:
        words = _table_rows(narrow.stdout, "Serves")[1][s["serve"]]
        for said in (s["residency"] or "-", s["lifecycle"], *s["gpu_roles"]):
            assert said in words, (s["serve"], said, narrow.stdout)


def test_validate_json_of_an_invalid_manifest_answers_on_stdout(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n\n'
        '[[serve]]\nname = "omni"\ncontainer = "c-omni"\ngpu_role = "a"\nvram_mib = 5000\n'
        'residency = "evictable"\nanti_affinity = "x"\n',
        encoding="utf-8",
    )
    r = vramctl("validate", "-m", str(bad), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["valid"] is False and data["files"] == [str(bad)]
    (error,) = data["errors"]
    assert error["file"] == str(bad) and error["serve"] == "omni"
    assert error["field"] == "vram_mib" and "can never fit" in error["message"]
    assert error["text"].startswith(f'{bad}: serve "omni" (#1): vram_mib: ')
    assert any("anti_affinity" in w for w in data["warnings"]), data


def test_observe_exits_3_when_docker_cannot_be_read(tmp_path: Path) -> None:
    r = vramctl("observe", "-m", str(EXAMPLE), **_no_docker(tmp_path))
    assert r.returncode == 3, r.stdout + r.stderr
    assert json.loads(r.stdout)["docker"] == "error"  # the snapshot is still printed
    assert "docker unreachable at" in r.stderr


def test_live_status_says_once_that_nvml_is_unavailable(tmp_path: Path) -> None:
    probe = vramctl("status", "-m", str(EXAMPLE), "--json", **_no_docker(tmp_path))
    if json.loads(probe.stdout)["nvml"] != "unavailable":
        pytest.skip("NVML is readable on this host")
    r = vramctl("status", "-m", str(EXAMPLE), **_no_docker(tmp_path))
    said = [line for line in (r.stdout + r.stderr).splitlines() if "NVML" in line]
    assert len(said) == 1, said
    assert "device figures are unknown" in said[0], said


def test_fit_says_when_the_start_needs_a_router_none_is_given_for() -> None:
    args = ("fit", "fast", "-m", str(EXAMPLE), "--observed", str(OBSERVED))
    r = vramctl(*args)
    assert r.returncode == 0, r.stderr  # the arithmetic is unchanged: it fits
    assert r.stdout.splitlines()[0] == "fast fits after stopping ocr"
    assert "up fast cannot be carried out without a router" in r.stdout, r.stdout
    assert "ocr is stopped to make room for fast" in r.stdout
    assert "--router-url" in r.stdout
    data = json.loads(vramctl(*args, "--json").stdout)
    assert data["fits"] is True
    assert [n["serve"] for n in data["needs_router"]] == ["ocr", "fast"]
    assert "without a router" in data["note"]
    # given the router (the option or run's variable), there is nothing to say
    for given in (
        vramctl(*args, "--router-url", "http://router:8080"),
        vramctl(*args, VRAMCTL_ROUTER_URL="http://router:8080"),
    ):
        assert given.returncode == 0 and "router" not in given.stdout, given.stdout
    data = json.loads(vramctl(*args, "--json", "--router-url", "http://r").stdout)
    assert "needs_router" not in data and "note" not in data


def test_fit_exits_apart_for_fits_does_not_fit_and_a_question_it_cannot_ask(
    tmp_path: Path,
) -> None:
    """0 it fits, 1 it does not, 2 the question is wrong (a misspelt serve, a manifest or
    saved observation that does not load): a script can tell "no" from a typo."""
    asked = ["-m", str(EXAMPLE), "--observed", str(OBSERVED)]
    assert vramctl("fit", "fast", *asked).returncode == 0  # after stopping ocr
    kept = tmp_path / "kept.toml"  # ocr may not be evicted: fast does not fit
    kept.write_text(
        EXAMPLE.read_text(encoding="utf-8").replace('"evictable"', '"resident"'), encoding="utf-8"
    )
    no = vramctl("fit", "fast", "-m", str(kept), "--observed", str(OBSERVED))
    assert no.returncode == 1 and "fast does not fit" in no.stdout, no.stdout + no.stderr
    typo = vramctl("fit", "fsat", *asked)
    assert typo.returncode == 2 and 'did you mean "fast"?' in typo.stderr, typo.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[[gpu_roles]]\nid = 1\n", encoding="utf-8")
    broken = vramctl("fit", "fast", "-m", str(bad), "--observed", str(OBSERVED))
    assert broken.returncode == 2 and str(bad) in broken.stderr, broken.stderr
    gone = vramctl("fit", "fast", "-m", str(EXAMPLE), "--observed", str(tmp_path / "no.json"))
    assert gone.returncode == 2 and "no.json" in gone.stderr, gone.stderr
    for r in (typo, broken, gone):
        assert "Traceback" not in r.stderr


def test_fit_with_docker_unreadable_cannot_be_answered(tmp_path: Path) -> None:
    r = vramctl("fit", "fast", "-m", str(EXAMPLE), **_no_docker(tmp_path))
    assert r.returncode == 3, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("fast: cannot be answered (unknown): docker"), r.stdout
    assert "does not fit" not in r.stdout
    assert "committed unknown;" in r.stdout and "(nothing)" not in r.stdout, r.stdout
    data = json.loads(
        vramctl("fit", "fast", "-m", str(EXAMPLE), "--json", **_no_docker(tmp_path)).stdout
    )
    assert data["fits"] is None and data["gpu_roles"][0]["committed_mib"] is None
