"""What a manifest may cost, and what it may say: every excess is a located error.

The loader bounds a manifest's size, its nesting and the time its parse may take,
refuses files that are not regular (a FIFO would block the process), and validates
values to what the runtime can carry out (finite, bounded timeouts; Docker's container
name rule; no NUL byte in an ``up`` argument). Each case checks the located error,
never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.waiting import WAIT_S

from controller.manifest import LocatedError, ManifestError, load_manifest_set
from controller.manifest.fields import MAX_MANIFEST_BYTES, MAX_NESTING

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
    path.write_bytes((ROLE + serve()).encode() + b"# caf\xe9 au lait\n")
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


# ── what a manifest may cost ──────────────────────────────────────────────────


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_bytes(ROLE.encode() + b"#" * MAX_MANIFEST_BYTES + b"\n")
    (err,) = errors_of(path)
    assert "larger than 512 KiB" in err.message, str(err)


def test_a_long_dotted_key_is_refused_before_tomllib_sees_it(tmp_path: Path) -> None:
    """tomllib's memory is quadratic in a dotted key's parts: 100 000 parts took 24 GB.

    The loader runs in a child with 1 GiB of address space: unbounded, it dies of it.
    """
    path = tmp_path / "serves.toml"
    path.write_text(ROLE + "x" + ".x" * 100_000 + " = 1\n", encoding="utf-8")
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from controller.manifest import ManifestError, load_manifest_set\n"
        "try:\n"
        "    load_manifest_set([sys.argv[1]])\n"
        "except ManifestError as exc:\n"
        "    print(exc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dotted key" in r.stdout and "parts" in r.stdout, r.stdout
    assert r.stdout.startswith(f"{path}: line {ROLE.count(chr(10)) + 1}"), r.stdout


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("deep = " + "[" * 1000 + "]" * 1000 + "\n", id="arrays-1000"),
        pytest.param("deep = " + "{a = " * 1000 + "1" + "}" * 1000 + "\n", id="inline-1000"),
        pytest.param("deep = " + "[" * 100 + "]" * 100 + "\n", id="arrays-100"),
    ],
)
def test_deep_nesting_is_a_located_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(ROLE + text, encoding="utf-8")
    (err,) = errors_of(path)
    assert "nested" in err.message and str(MAX_NESTING) in err.message, str(err)


def test_validate_reports_deep_nesting_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(ROLE + "deep = " + "[" * 1000 + "]" * 1000 + "\n", encoding="utf-8")
    r = subprocess.run(
        [sys.executable, "-m", "controller.interfaces.cli", "validate", "-m", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "nested" in r.stderr, r.stderr


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    os.mkfifo(path)
    found: list[list[LocatedError]] = []
    worker = threading.Thread(target=lambda: found.append(errors_of(path)), daemon=True)
    worker.start()
    worker.join(WAIT_S)
    if worker.is_alive():  # unblock the reader so the thread ends, then fail
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("loading a FIFO blocked")
    ((err,),) = found
    assert "not a regular file" in err.message and "FIFO" in err.message, str(err)


def test_a_device_is_refused(tmp_path: Path) -> None:
    (err,) = errors_of(Path("/dev/null"))
    assert "not a regular file" in err.message, str(err)


def test_a_symlink_loop_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    (tmp_path / "other.toml").symlink_to(path)
    path.symlink_to(tmp_path / "other.toml")
    (err,) = errors_of(path)
    assert err.file == str(path) and "cannot read the manifest" in err.message, str(err)


def test_the_manifest_watcher_restarts_after_it_fails(tmp_path: Path) -> None:
    """The watch of a folder that vanished fails; it is logged and started again."""
    import asyncio

    from loguru import logger

    from controller.service.loop import Controller, RunOptions

    folder = tmp_path / "manifests"
    folder.mkdir()
    path = folder / "serves.toml"
    path.write_text(ROLE + serve(), encoding="utf-8")
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state", debounce_ms=50),
        load_manifest_set([path]),
    )
    path.unlink()
    folder.rmdir()  # watchfiles cannot watch it: the watch raises
    said: list[str] = []
    sink = logger.add(lambda m: said.append(str(m)), level="ERROR")

    async def scenario() -> None:
        task = asyncio.create_task(c.watch_manifests())
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not any("manifest watcher failed" in m for m in said):
            assert asyncio.get_running_loop().time() < deadline, "no failure was logged"
            await asyncio.sleep(0.05)
        folder.mkdir()
        await asyncio.sleep(1.5)  # one restart later the folder is watched again
        c.manifest_dirty = False
        c.reasons.clear()
        while not c.manifest_dirty or "manifest changed" not in c.reasons:
            path.write_text(ROLE + serve("# edited"), encoding="utf-8")
            assert asyncio.get_running_loop().time() < deadline, "the edit was never seen"
            await asyncio.sleep(0.2)
        assert not task.done(), "the watcher ended"
        task.cancel()

    try:
        asyncio.run(scenario())
    finally:
        logger.remove(sink)
