"""Fuzzing the manifest loader: whatever the bytes, a valid set or located errors, in time.

Seeds are the real manifests: the stack's (``tests/fixtures/anvil-serving/``, loaded as
the three-file set they are) and the examples (``manifests/examples/``). Mutations:

* every cut at a table boundary (``[[serve]]`` / ``[[gpu_roles]]`` / ``[x]``), and just
  after each header line — deterministic, every seed;
* byte flips, insertions and deletions anywhere (hypothesis);
* a value swapped for another type or an extreme one: huge integers, ``nan``,
  ``inf``, ``1e309``, negative numbers, unicode and control characters, NUL bytes,
  very long strings, deep arrays / inline tables, dotted keys of many parts;
* a key replaced by a very long or unicode one.

The property: ``load_manifest_set`` returns a set (whose ``desired()`` converts) or
raises :class:`ManifestError` whose every error names the file it is about and says
something; never another exception, and never longer than ``DEADLINE_S`` (a SIGALRM
interrupts the pure-Python parse). A set that loads must be one the runtime can carry
out (``test_a_valid_set_is_one_the_runtime_can_run``): timeouts Python's clock
functions accept, ``up`` arguments without NUL, container names Docker accepts.

Sizes stay small enough for a shared CI machine (a dotted key of at most 3000 parts);
the one large input, the 100 000-part dotted key, runs in a subprocess with a memory
limit.
"""

from __future__ import annotations

import contextlib
import math
import re
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.strategies import case_share

from controller.manifest import ManifestError, ManifestSet, load_manifest_set
from controller.manifest.fields import (
    MAX_DRAIN_TIMEOUT_S,
    MAX_MIN_RUNTIME_S,
    MAX_START_TIMEOUT_S,
    MAX_STOP_TIMEOUT_S,
)

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "tests" / "fixtures" / "anvil-serving"
STACK_FILES = ("serves.toml", "serves.voice.toml", "serves.comfyui.toml")
EXAMPLES = tuple(sorted((ROOT / "manifests" / "examples").glob("*.toml")))
SEEDS: dict[str, bytes] = {
    **{f"stack/{n}": (STACK / n).read_bytes() for n in STACK_FILES},
    **{f"examples/{p.name}": p.read_bytes() for p in EXAMPLES},
}
DEADLINE_S = 10.0
FUZZ = settings(
    max_examples=100,
    deadline=None,  # the SIGALRM deadline below is the bound; hypothesis' is per-run timing
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# what Docker accepts as a container name
CONTAINER_NAME = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
MAX_TIMEOUT_S = 9.2e9  # 2**63 ns: above it Python's clock functions raise OverflowError


class HangError(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def alarm(_sig: int, _frame: FrameType | None) -> None:
        raise HangError(f"load_manifest_set ran past {seconds:g}s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def load(tmp: Path, name: str, data: bytes) -> ManifestSet | ManifestError:
    """Write ``data`` as the seed ``name`` (with its set's other files) and load the set."""
    tmp.mkdir(parents=True, exist_ok=True)
    if name.startswith("stack/"):
        files = []
        for n in STACK_FILES:
            path = tmp / n
            path.write_bytes(data if f"stack/{n}" == name else SEEDS[f"stack/{n}"])
            files.append(path)
    else:
        path = tmp / Path(name).name
        path.write_bytes(data)
        files = [path]
    try:
        with deadline(DEADLINE_S):
            mset = load_manifest_set(files)
            mset.desired()
            return mset
    except ManifestError as exc:
        check_located(exc, files)
        return exc


def check_located(exc: ManifestError, files: list[Path]) -> None:
    assert exc.errors, "a ManifestError without errors"
    names = {str(f) for f in files}
    for err in exc.errors:
        assert err.file in names, f"error about {err.file!r}, not one of {sorted(names)}: {err}"
        assert err.message.strip(), f"an error without a message: {err!r}"
        line = str(err)
        assert line.startswith(err.file), line
        assert "Traceback" not in line, line


# ── deterministic: cuts at every table boundary ──────────────────────────────

_HEADER = re.compile(rb"^\s*\[", re.MULTILINE)


def _cuts(data: bytes) -> list[int]:
    out = set()
    for m in _HEADER.finditer(data):
        out.add(m.start())  # before the header: the tail is lost
        eol = data.find(b"\n", m.start())
        if eol != -1:
            out.add(eol + 1)  # a header with no fields
    return sorted(out - {0})


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_table_boundary_cut_loads_or_is_refused_with_located_errors(
    name: str, tmp_path: Path
) -> None:
    data = SEEDS[name]
    cuts = _cuts(data)
    assert cuts, f"{name}: no table boundary found"
    for i, cut in enumerate(cuts):
        load(tmp_path / str(i), name, data[:cut])


# ── hypothesis: bytes ────────────────────────────────────────────────────────


@st.composite
def byte_mutations(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(SEEDS)))
    data = bytearray(SEEDS[name])
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(("flip", "insert", "delete", "truncate")))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        else:
            del data[at:]
    return name, bytes(data)


@FUZZ
@given(case=byte_mutations())
def test_byte_mutations_load_or_are_refused_with_located_errors(
    case: tuple[str, bytes], tmp_path_factory: pytest.TempPathFactory
) -> None:
    name, data = case
    load(tmp_path_factory.mktemp("bytes"), name, data)


# ── hypothesis: values and keys ──────────────────────────────────────────────


def toml_string(s: str) -> str:
    out = []
    for ch in s:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def nested(depth: int, inline_table: bool) -> str:
    if inline_table:
        return "{ a = " * depth + "1" + " }" * depth
    return "[" * depth + "1" + "]" * depth


EXTREME_NUMBERS = (
    "nan",
    "+nan",
    "-nan",
    "inf",
    "-inf",
    "1e309",
    "-1e309",
    "1e63",
    "9.3e9",
    "1e10",
    "0",
    "-0",
    "0.0",
    "-1",
    "1e-320",
    str(2**63),
    str(2**64 + 1),
    str(-(2**63) - 1),
    "9" * 40,
    "0x7fffffffffffffff",
    "1979-05-27T07:32:00Z",
    "true",
    "false",
)


def values() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(EXTREME_NUMBERS),
        st.integers(-(2**70), 2**70).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(
            lambda f: (
                "nan"
                if math.isnan(f)
                else ("inf" if f > 0 else "-inf")
                if math.isinf(f)
                else repr(f)
            )
        ),
        st.text(max_size=40).map(toml_string),
        st.sampled_from(("\x00", "a\x00b", "\n", "../x", "a b", "é", "名前", "\u202e", "/")).map(
            toml_string
        ),
        st.integers(1, 5000).map(lambda n: toml_string("x" * n)),
        st.builds(nested, st.integers(1, 1200), st.booleans()),
        st.lists(st.sampled_from(('"a"', "1", "1.5", "true", "[]", "{}")), max_size=4).map(
            lambda xs: "[" + ", ".join(xs) + "]"
        ),
        st.just("{}"),
    )


def keys() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(1, 5000).map(lambda n: "k" * n),
        st.integers(2, 3000).map(lambda n: ".".join(["k"] * n)),  # dotted: quadratic in tomllib
        st.text(min_size=1, max_size=30).map(toml_string),
        st.sampled_from(("vram_mb", "vram_MiB", "desire", "residence", "gpu-role", '"名前"')),
    )


_ASSIGN = re.compile(r"^(\s*)([A-Za-z0-9_\-\"'.]+)(\s*=\s*)(.*)$", re.MULTILINE)


@st.composite
def value_mutations(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(SEEDS)))
    text = SEEDS[name].decode()
    for _ in range(draw(st.integers(1, 3))):
        lines = list(_ASSIGN.finditer(text))
        if not lines:
            break
        m = draw(st.sampled_from(lines))
        if draw(st.integers(0, 4)) == 0:
            new = m.group(1) + draw(keys()) + m.group(3) + m.group(4)
        else:
            new = m.group(1) + m.group(2) + m.group(3) + draw(values())
        text = text[: m.start()] + new + text[m.end() :]
    return name, text.encode()


@FUZZ
@given(case=value_mutations())
def test_value_and_key_mutations_load_or_are_refused_with_located_errors(
    case: tuple[str, bytes], tmp_path_factory: pytest.TempPathFactory
) -> None:
    name, data = case
    load(tmp_path_factory.mktemp("values"), name, data)


# ── hypothesis: what the runtime reads, at its edges ─────────────────────────


def seconds(limit: float) -> st.SearchStrategy[str]:
    """Durations up to ``limit`` (the field's own, or what Python's clock functions
    take), mostly in range, its edges, and now and then past it or not a number."""
    inside = st.one_of(
        st.floats(1e-3, limit).map(repr),
        st.integers(1, int(limit)).map(str),
        st.sampled_from(("1e-320", "0.001", "1", repr(limit), str(int(limit)))),
    )
    outside = st.sampled_from(
        ("0", "-0", "-1", repr(limit + 0.5), "9.2e9", "9.3e9", "1e300", str(2**63), "9" * 40,
         "inf", "nan", '"600"', "true")
    )  # fmt: skip
    return st.one_of(inside, inside, inside, outside)


def container_names() -> st.SearchStrategy[str]:
    """Names Docker takes (drawn from its pattern), and near misses."""
    near = ("a", "-x", ".x", "_x", "/x", "x/y", "a b", "x\n", "名前", "a\u0000b", "a:b")
    return st.one_of(
        st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{1,40}", fullmatch=True).map(toml_string),
        st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{1,40}", fullmatch=True).map(toml_string),
        st.sampled_from(near).map(toml_string),
        st.just(toml_string("x" * 300)),
    )


def up_commands() -> st.SearchStrategy[str]:
    """``up`` commands: plain, quoted, ``{dir}`` anywhere, unicode, and a NUL or an
    unbalanced quote now and then."""
    words = st.sampled_from(
        ("docker", "compose", "-f", "{dir}/docker-compose.yml", "up", "-d", "'a b'", '"c d"',
         "{dir}", "x{dir}y", "é", "--name=名前", "\\", "$HOME", ";")
    )  # fmt: skip
    command = st.lists(words, min_size=1, max_size=8).map(" ".join)
    broken = st.tuples(command, st.sampled_from(("'", '"', "a\x00b")), command).map(" ".join)
    return st.one_of(command, command, command, broken).map(toml_string)


RUNTIME_FIELDS: dict[str, st.SearchStrategy[str]] = {
    "start_timeout_s": seconds(MAX_START_TIMEOUT_S),
    "stop_timeout_s": seconds(MAX_STOP_TIMEOUT_S),
    "drain_timeout_s": seconds(MAX_DRAIN_TIMEOUT_S),
    "min_runtime_s": seconds(MAX_MIN_RUNTIME_S),
    "container": container_names(),
    "up": up_commands(),
}
_SERVE_HEADER = re.compile(r"^\[\[serve\]\][^\n]*\n", re.MULTILINE)
_NEXT_TABLE = re.compile(r"^\s*\[", re.MULTILINE)


def set_in_serve(text: str, at: re.Match[str], key: str, value: str) -> str:
    """``text`` with ``key = value`` in the serve table whose header ``at`` matched:
    its assignment replaced where the table has one, else added under the header."""
    end = _NEXT_TABLE.search(text, at.end())
    stop = end.start() if end else len(text)
    line = re.compile(rf"^{re.escape(key)}\s*=.*$", re.MULTILINE).search(text, at.end(), stop)
    if line is not None:
        return text[: line.start()] + f"{key} = {value}" + text[line.end() :]
    return text[: at.end()] + f"{key} = {value}\n" + text[at.end() :]


@st.composite
def runtime_mutations(draw: st.DrawFn) -> tuple[str, bytes]:
    """A seed whose serves' runtime fields (container, timeouts, ``up``) are set to
    values at their edges: most sets still load, so the property below has sets to check
    (of the generic value mutations above, 2 to 13 in 100 loaded)."""
    name = draw(
        st.sampled_from(sorted(n for n, d in SEEDS.items() if _SERVE_HEADER.search(d.decode())))
    )
    text = SEEDS[name].decode()
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(list(_SERVE_HEADER.finditer(text))))
        key = draw(st.sampled_from(sorted(RUNTIME_FIELDS)))
        text = set_in_serve(text, at, key, draw(RUNTIME_FIELDS[key]))
    return name, text.encode()


def loads(case: tuple[str, bytes]) -> bool:
    """Whether the mutated seed loads as a set."""
    with tempfile.TemporaryDirectory(prefix="vc-fuzz-") as tmp:
        return not isinstance(load(Path(tmp), *case), ManifestError)


def test_the_runtime_property_checks_sets_that_load() -> None:
    """Its generator gives it sets to check: at least 40 % of its examples load (the
    generic value mutations it once drew loaded in 2 to 13 of 100; each field's values
    past its bound, a seventh of the draws, are refused, as they should be)."""
    share = case_share(runtime_mutations(), loads, examples=100)
    assert share >= 0.4, f"{share:.0%} of the runtime mutations load"


@FUZZ
@given(case=runtime_mutations())
def test_a_valid_set_is_one_the_runtime_can_run(
    case: tuple[str, bytes], tmp_path_factory: pytest.TempPathFactory
) -> None:
    name, data = case
    result = load(tmp_path_factory.mktemp("runtime"), name, data)
    if isinstance(result, ManifestError):
        event("refused")
        return
    event("loaded: checked")
    for serve_name, serve in result.serves.items():
        where = f"{name}: serve {serve_name!r}"
        assert CONTAINER_NAME.match(serve.container), f"{where}: container {serve.container!r}"
        for field in ("start_timeout_s", "stop_timeout_s", "drain_timeout_s"):
            value = float(getattr(serve, field))
            assert math.isfinite(value) and 0 <= value < MAX_TIMEOUT_S, f"{where}: {field}={value}"
        # only compared with a serve's age, never handed to a clock function: finite
        # (and bounded like the timeouts: the test below)
        assert math.isfinite(serve.min_runtime_s) and serve.min_runtime_s >= 0, where
        for arg in result.up_argv(serve_name) or ():
            assert "\x00" not in arg, f"{where}: NUL in up argument {arg!r}"


def test_min_runtime_s_is_bounded_like_the_timeouts(tmp_path: Path) -> None:
    data = SEEDS["examples/placement.toml"].decode()
    at = next(_SERVE_HEADER.finditer(data))
    result = load(
        tmp_path,
        "examples/placement.toml",
        set_in_serve(data, at, "min_runtime_s", "1e300").encode(),
    )
    assert isinstance(result, ManifestError), "min_runtime_s = 1e300 loads"
    assert "min_runtime_s" in str(result) and "31 days" in str(result), str(result)
    month = set_in_serve(data, at, "min_runtime_s", str(31 * 86400)).encode()
    assert not isinstance(load(tmp_path, "examples/placement.toml", month), ManifestError)


# ── the one large input, in a subprocess with a memory limit ─────────────────


def test_a_dotted_key_of_100000_parts_is_refused_in_bounded_memory_and_time(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dotted.toml"
    path.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n\n[[serve]]\nname = "x"\ncontainer = "x"\n'
        + ".".join(["k"] * 100_000)
        + " = 1\n"
    )
    limit = 1 << 30  # 1 GiB of address space: the process, the interpreter, the parse
    code = textwrap.dedent(
        f"""
        from controller.manifest import ManifestError, load_manifest_set
        try:
            load_manifest_set([{str(path)!r}])
        except ManifestError as exc:
            print("refused:", exc)
        else:
            print("loaded")
        """
    )

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=20,
            preexec_fn=limit_memory,  # only setrlimit, before exec
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("loading a 200 KB manifest with a 100000-part dotted key ran past 20 s")
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.startswith(("refused:", "loaded")), r.stdout
