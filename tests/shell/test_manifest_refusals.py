"""Manifests that must not be accepted, and keys this version does not know.

- residents desired running whose reservations exceed a role's budget can never all run:
  a manifest error naming the sum and every term (``validate`` exits 1, a live edit
  keeps the last good manifest in force);
- an empty or whitespace-only file is an error, and a set that declares no serve and no
  role is refused unless a file of it says ``allow_empty = true``;
- every key this version does not know is reported by name as ignored (a warning), the
  real stack's informational keys excepted; ``validate --strict`` makes them errors.

The loader, the CLI (as a subprocess) and the running loop's reload are the real ones.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from loguru import logger
from support.cli import cli_env, run_cli

from controller.manifest import LocatedError, ManifestError, ManifestSet, load_manifest_set
from controller.service.loop import Controller, RunOptions

CARD = '[[gpu_roles]]\nid = "card"\nvram_mib = 32607\nreserve_mib = 2048\n'


def serve(name: str, mib: int, residency: str = "resident", desired: str = "running") -> str:
    return (
        f'\n[[serve]]\nname = "{name}"\ncontainer = "c-{name}"\ngpu_role = "card"\n'
        f'vram_mib = {mib}\nresidency = "{residency}"\ndesired = "{desired}"\n'
    )


def write(tmp_path: Path, text: str, name: str = "serves.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def errors_of(*paths: Path, strict: bool = False) -> list[LocatedError]:
    with pytest.raises(ManifestError) as info:
        if strict:
            load_manifest_set(list(paths), strict=True)
        else:
            load_manifest_set(list(paths))
    return info.value.errors


def vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env())


def reloaded(tmp_path: Path, good: str, edit: bytes) -> tuple[Controller, ManifestSet]:
    """A controller started on ``good``, after the loop reloaded the file saved as ``edit``."""
    path = write(tmp_path, good)
    first = load_manifest_set([path])
    c = Controller(RunOptions(manifests=(path,), state_dir=tmp_path / "state"), first)
    path.write_bytes(edit)
    c.reconciler.reread_manifest()
    return c, first


# ── residents that can never all run ─────────────────────────────────────────────

OVER = CARD + serve("a", 20480) + serve("b", 10272)


def test_residents_over_a_role_budget_are_an_error_naming_every_term(tmp_path: Path) -> None:
    [error] = errors_of(write(tmp_path, OVER))
    assert error.where == 'gpu_roles "card" (#1)'
    line = str(error)
    for term in ('"a" 20480', '"b" 10272', "30752 MiB", "32607 - 2048 = 30559 MiB"):
        assert term in line, line
    assert "never all run" in line


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(serve("b", 10272, residency="evictable"), id="evictable"),
        pytest.param(serve("b", 10272, desired="stopped"), id="stopped"),
        pytest.param(serve("b", 10079), id="exactly-the-budget"),
    ],
)
def test_residents_that_fit_or_do_not_all_run_are_valid(tmp_path: Path, other: str) -> None:
    load_manifest_set([write(tmp_path, CARD + serve("a", 20480) + other)])


def test_residents_over_budget_across_two_roles_and_files(tmp_path: Path) -> None:
    roles = CARD.replace('"card"', '"b2"') + CARD
    tp = serve("tp", 16000).replace('gpu_role = "card"', 'gpu_roles = ["card", "b2"]')
    errors = errors_of(write(tmp_path, roles + tp), write(tmp_path, serve("r", 15000), "r.toml"))
    [error] = errors
    assert error.where == 'gpu_roles "card" (#2)', error
    assert '"tp" 16000 + "r" 15000 = 31000 MiB' in error.message, error


def test_validate_exits_1_on_residents_that_can_never_all_run(tmp_path: Path) -> None:
    r = vramctl("validate", "-m", str(write(tmp_path, OVER)))
    assert r.returncode == 1, r.stdout
    assert "30752 MiB" in r.stderr and "30559 MiB" in r.stderr, r.stderr


def test_a_live_edit_with_residents_over_budget_keeps_the_last_good(tmp_path: Path) -> None:
    c, first = reloaded(tmp_path, CARD + serve("a", 20480), OVER.encode())
    assert c.mset is first
    assert any("30752 MiB" in line for line in c.manifest_error), c.manifest_error


# ── empty manifests ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("content", ["", "  \n\t\n\r\n"], ids=["0-bytes", "whitespace"])
def test_an_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = write(tmp_path, content)
    [error] = errors_of(path)
    assert error.file == str(path) and "empty" in error.message, error
    r = vramctl("validate", "-m", str(path))
    assert r.returncode == 1 and "empty" in r.stderr, (r.stdout, r.stderr)


def test_an_empty_file_beside_good_ones_is_an_error(tmp_path: Path) -> None:
    good = write(tmp_path, CARD + serve("a", 100))
    [error] = errors_of(good, write(tmp_path, "", "empty.toml"))
    assert error.file.endswith("empty.toml") and "empty" in error.message


@pytest.mark.parametrize(
    "text",
    ["# the header of a truncated copy\n", "[host]\nram_mib = 1000\n"],
    ids=["comments-only", "host-only"],
)
def test_a_set_that_declares_nothing_is_refused(tmp_path: Path, text: str) -> None:
    [error] = errors_of(write(tmp_path, text))
    assert "no [[serve]] and no [[gpu_roles]]" in error.message and "allow_empty" in str(error)


def test_allow_empty_accepts_a_set_that_declares_nothing(tmp_path: Path) -> None:
    mset = load_manifest_set([write(tmp_path, "allow_empty = true\n")])
    assert mset.serves == {} and mset.roles == {} and mset.warnings == []
    [error] = errors_of(write(tmp_path, 'allow_empty = "yes"\n'))
    assert error.field == "allow_empty" and "boolean" in error.message, error


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        pytest.param(b"", "empty", id="0-bytes"),
        pytest.param(b"\n\n", "empty", id="whitespace"),
        pytest.param(b"# cut\n", "no [[serve]] and no [[gpu_roles]]", id="comments-only"),
    ],
)
def test_a_live_edit_that_empties_the_manifest_keeps_the_last_good(
    tmp_path: Path, edit: bytes, words: str
) -> None:
    c, first = reloaded(tmp_path, CARD + serve("a", 100), edit)
    assert c.mset is first and set(c.mset.serves) == {"a"}
    assert any(words in line for line in c.manifest_error), c.manifest_error


def test_a_live_edit_that_allows_empty_is_adopted(tmp_path: Path) -> None:
    c, _ = reloaded(tmp_path, CARD + serve("a", 100), b"allow_empty = true\n")
    assert c.manifest_error == [] and c.mset.serves == {}


# ── keys this version does not know ──────────────────────────────────────────────

UNKNOWN = (
    "schema_version = 2\n"
    + CARD
    + "future_role_knob = 1\n"
    + serve("a", 100)
    + 'future_knob = ["x", "y"]\n'
    + '[serve.sleep]\nlevel = 2\nresidual_mib = 10\nprotocol = "vllm"\nurl = "http://h:1"\n'
    + "future_sleep_knob = true\n"
    + "\n[host]\nram_mib = 1000\nfuture_host_knob = 1\n"
    + "\n[[future_table]]\nx = 1\n"
)
UNKNOWN_KEYS = {
    "schema_version",
    "future_role_knob",
    "future_knob",
    "sleep.future_sleep_knob",
    "host.future_host_knob",
    "future_table",
}


def test_every_unknown_key_is_reported_by_name_as_ignored(tmp_path: Path) -> None:
    mset = load_manifest_set([write(tmp_path, UNKNOWN)])
    named = {w for w in mset.warnings if "unknown key, ignored" in w}
    assert len(named) == len(UNKNOWN_KEYS), mset.warnings
    for key in UNKNOWN_KEYS:
        assert any(f": {key}: unknown key, ignored" in w for w in named), (key, named)
    assert any('serve "a" (#1): future_knob: unknown key, ignored' in w for w in named)


def test_strict_makes_unknown_keys_errors(tmp_path: Path) -> None:
    errors = errors_of(write(tmp_path, UNKNOWN), strict=True)
    assert {e.field for e in errors} == UNKNOWN_KEYS, errors
    assert all("unknown key" in e.message for e in errors)


def test_a_newer_versions_field_is_named_not_silently_dropped(tmp_path: Path) -> None:
    text = CARD + serve("a", 100).replace('gpu_role = "card"', 'anti_affinity = ["card", "b"]')
    mset = load_manifest_set([write(tmp_path, text)])
    assert any("anti_affinity: unknown key, ignored" in w for w in mset.warnings), mset.warnings


def test_the_real_stacks_informational_keys_are_known(tmp_path: Path) -> None:
    fixtures = Path(__file__).parents[1] / "fixtures" / "anvil-serving"
    names = ("serves.toml", "serves.voice.toml", "serves.comfyui.toml")
    mset = load_manifest_set([fixtures / name for name in names], strict=True)
    assert not [w for w in mset.warnings if "unknown key" in w], mset.warnings
    tp2 = mset.serves["tp2-deepseek-v4-flash-0731-r16-b12x-dspark5-maxseq16-650k"]
    assert tp2.model_extra == {
        "router_config": "{dir}/anvil-router.deepseek-pi.toml",
        "rollback_router_config": "{dir}/anvil-router.live.toml",
    }


def test_validate_strict_exits_1_on_unknown_keys_and_plain_validate_warns(tmp_path: Path) -> None:
    path = write(tmp_path, CARD + serve("a", 100) + "future_knob = 1\n")
    plain = vramctl("validate", "-m", str(path))
    assert plain.returncode == 0, plain.stderr
    assert "future_knob: unknown key, ignored" in plain.stderr, plain.stderr
    strict = vramctl("validate", "--strict", "-m", str(path), "--json")
    assert strict.returncode == 1, strict.stdout
    assert "future_knob: unknown key" in strict.stderr, strict.stderr
    fine = vramctl("validate", "--strict", "-m", str(write(tmp_path, CARD, "c.toml")), "--json")
    assert fine.returncode == 0 and json.loads(fine.stdout)["valid"] is True, fine.stderr


def test_a_live_edit_with_an_unknown_key_is_adopted_and_the_key_logged(tmp_path: Path) -> None:
    said: list[str] = []
    sink = logger.add(lambda m: said.append(str(m).rstrip()), level="WARNING", format="{message}")
    try:
        c, _ = reloaded(
            tmp_path,
            CARD + serve("a", 100),
            (CARD + serve("a", 200) + "future_knob = 1\n").encode(),
        )
    finally:
        logger.remove(sink)
    assert c.manifest_error == [] and c.mset.serves["a"].vram_mib == 200
    assert any("future_knob: unknown key, ignored" in line for line in said), said
