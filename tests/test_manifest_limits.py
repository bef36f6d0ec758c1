"""What a manifest may cost, and what it may say: every excess is a located error.

The loader bounds a manifest's size, its nesting and the time its parse may take,
refuses files that are not regular (a FIFO would block the process), and validates
values to what the runtime can carry out (finite, bounded timeouts; Docker's container
name rule; no NUL byte in an ``up`` argument). Each case checks the located error,
never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.manifest import LocatedError, ManifestError, load_manifest_set

ROLE = """
[[gpu_roles]]
id = "a"
vram_mib = 1000
"""


def serve(body: str = "", name: str = "s1", container: str = "c1") -> str:
    return f'\n[[serve]]\nname = "{name}"\ncontainer = "{container}"\n{body}\n'


def errors_of(path: Path) -> list[LocatedError]:
    with pytest.raises(ManifestError) as info:
        load_manifest_set([path])
    return info.value.errors


def test_non_utf8_bytes_are_located_by_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_bytes((ROLE + serve()).encode() + b'# caf\xe9 au lait\n')
    (err,) = errors_of(path)
    assert "not UTF-8 text" in err.message
    assert err.line == ROLE.count("\n") + serve().count("\n") + 1
    assert err.column == len("# caf") + 1
    assert str(err).startswith(f"{path}: line {err.line}, column {err.column}: not UTF-8")


# ── values the runtime can carry out (item: values that validate but break run) ──


def _one(tmp_path: Path, text: str) -> LocatedError:
    path = tmp_path / "serves.toml"
    path.write_text(text, encoding="utf-8")
    errors = errors_of(path)
    assert len(errors) == 1, "\n".join(str(e) for e in errors)
    return errors[0]


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("stop_timeout_s", "9.3e9", "at most 3600"),
        ("stop_timeout_s", "3601", "at most 3600"),
        ("start_timeout_s", "1e63", "at most 86400"),
        ("start_timeout_s", "86401", "at most 86400"),
        ("drain_timeout_s", "1e300", "at most 3600"),
        ("idle_ttl_s", "1e300", "at most 2678400"),
        ("stop_timeout_s", "inf", "positive number"),
        ("start_timeout_s", "nan", "positive number"),
        ("idle_ttl_s", "-inf", "non-negative"),
    ],
)
def test_timeouts_are_bounded_to_what_the_runtime_can_wait(
    tmp_path: Path, field: str, value: str, words: str
) -> None:
    err = _one(tmp_path, ROLE + serve(f"{field} = {value}"))
    assert err.field == field and err.serve == "s1"
    assert words in err.message, str(err)


def test_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(
        ROLE
        + serve(
            "stop_timeout_s = 3600\nstart_timeout_s = 86400\ndrain_timeout_s = 3600\n"
            "idle_ttl_s = 2678400"
        ),
        encoding="utf-8",
    )
    spec = load_manifest_set([path]).serves["s1"]
    assert (spec.stop_timeout_s, spec.start_timeout_s) == (3600.0, 86400.0)


def test_a_nul_byte_in_up_is_an_error(tmp_path: Path) -> None:
    err = _one(tmp_path, ROLE + serve('up = "docker compose up -d x\\u0000y"'))
    assert err.field == "up" and "NUL" in err.message, str(err)


@pytest.mark.parametrize(
    "container",
    ["bad\\nname", "has space", "../escape", "/abs", "x", "-leading", "ok/../x", "é"],
)
def test_container_names_follow_dockers_rule(tmp_path: Path, container: str) -> None:
    err = _one(tmp_path, ROLE + serve(container=container))
    assert err.field == "container", str(err)
    assert "[a-zA-Z0-9][a-zA-Z0-9_.-]" in err.message, str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize("name", ["bad\\nname", "has space", "../x", "a/b", "", "x" * 129])
def test_serve_names_are_sane(tmp_path: Path, name: str) -> None:
    err = _one(tmp_path, ROLE + serve(name=name))
    assert err.field == "name", str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize("ok", ["vllm-omni", "A1", "comfy_ui.2", "tp2-x-650k"])
def test_ordinary_names_load(tmp_path: Path, ok: str) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(ROLE + serve(name=ok, container=ok), encoding="utf-8")
    assert ok in load_manifest_set([path]).serves
