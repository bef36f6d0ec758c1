"""Tests of engine enforcement (docs/design.md §3): statemachine.flags.fraction and
controller.tools.compose_lint.

The arithmetic is checked on a table of the real stack's reservations and as a
property (the rendered fraction never gives the engine more than its reservation, and
one more unit in the last place would). The lint is checked on small compose files
written to ``tmp_path`` (a wrong fraction, a missing flag, the ``=`` form, …) and on
the real serving stack's compose file and manifests (MIT, see
tests/fixtures/anvil-serving/LICENSE), whose findings are asserted exactly.
"""

from __future__ import annotations

import textwrap
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from support import files
from support.files import compose, write

from controller.manifest import ManifestSet, load_manifest_set
from controller.tools.compose_lint import (
    ComposeError,
    LintReport,
    interpolate,
    lint_compose,
    load_compose,
    render_serve,
    report_lines,
)
from statemachine.domain.types import GpuObs, GpuRole
from statemachine.flags.fraction import (
    DEFAULT_TOLERANCE,
    SGLANG_FLAG,
    SOURCE_DECLARED,
    SOURCE_NVML,
    VLLM_FLAG,
    DeviceTotal,
    FindingKind,
    RenderResult,
    Severity,
    check_fraction,
    engine_flag,
    engine_of_argv,
    engine_of_image,
    exact_fraction,
    flag_from_variable,
    flag_values,
    fraction_for,
    implied_mib,
    measured_totals,
    parse_fraction,
    render_flag,
    role_totals,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "anvil-serving"
SHARED_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "anvil-serving"
COMPOSE_FILES = (
    "docker-compose.yml",
    "docker-compose.voice-audio.yml",
    "docker-compose.comfyui.yml",
)
TOTAL = 97887  # one RTX PRO 6000 Max-Q, as the real manifest declares it
TP2_650K = "tp2-deepseek-v4-flash-0731-r16-b12x-dspark5-maxseq16-650k"
TP2_1M = "tp2-deepseek-v4-flash-0731-r16-b12x-dspark5-maxseq16-1m"


# ── arithmetic ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("vram_mib", "total_mib", "expected"),
    [
        (3200, TOTAL, "0.0326"),  # 0.032691… — the real compose writes 0.0327 (nearest)
        (3456, TOTAL, "0.0353"),  # 0.035306…
        (24576, TOTAL, "0.2510"),  # 0.251065… — the real compose writes 0.2511
        (27999, TOTAL, "0.2860"),  # 0.286034…
        (88000, TOTAL, "0.8989"),  # 0.898996… — the real compose writes 0.90 (a finding)
        (92000, TOTAL, "0.9398"),  # 0.939859… — the real compose writes 0.94
        (93000, TOTAL, "0.9500"),  # 0.950075…
        (94721, TOTAL, "0.9676"),  # the tp2 serves, per GPU
        (48000, 96000, "0.5000"),  # exact
        (TOTAL, TOTAL, "1.0000"),  # the whole device
        (10, TOTAL, "0.0001"),  # the smallest reservation 4 places can express
    ],
)
def test_fraction_for_rounds_down_to_four_places(
    vram_mib: int, total_mib: int, expected: str
) -> None:
    value = fraction_for(vram_mib, total_mib)
    assert str(value) == expected
    assert implied_mib(value, total_mib) <= vram_mib


def test_fraction_for_places() -> None:
    assert str(fraction_for(3200, TOTAL, places=6)) == "0.032690"
    assert str(fraction_for(3200, TOTAL, places=2)) == "0.03"


@given(
    st.integers(min_value=1024, max_value=200_000).flatmap(
        lambda total: st.tuples(st.just(total), st.integers(-(-total // 10_000), total))
    )
)
def test_fraction_never_exceeds_the_reservation_and_is_tight(case: tuple[int, int]) -> None:
    total, vram = case
    value = fraction_for(vram, total)
    event("the whole card" if vram == total else "a part of the card")
    event("the smallest fraction" if value == Decimal("0.0001") else "above the smallest")
    assert implied_mib(value, total) <= vram
    assert implied_mib(value + Decimal("0.0001"), total) > vram
    assert Fraction(value) <= exact_fraction(vram, total)


@pytest.mark.parametrize(
    ("vram_mib", "total_mib", "words"),
    [
        (100, 99, "exceeds the device total"),
        (0, 99, "must be positive"),
        (10, 0, "must be positive"),
        (9, TOTAL, "is 0 at 4 decimal places"),
    ],
)
def test_fraction_for_refuses(vram_mib: int, total_mib: int, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        fraction_for(vram_mib, total_mib)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.94", Decimal("0.94")),
        (" 0.0327 ", Decimal("0.0327")),
        ("1", Decimal("1")),
        ("0", None),
        ("1.2", None),
        ("-0.5", None),
        ("nan", None),
        ("", None),
        ("${X}", None),
    ],
)
def test_parse_fraction(text: str, expected: Decimal | None) -> None:
    assert parse_fraction(text) == expected


# ── engines and flags ──────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("label", "flag"),
    [
        ("vllm", VLLM_FLAG),
        ("vLLM", VLLM_FLAG),
        ("sglang", SGLANG_FLAG),
        ("SGLang", SGLANG_FLAG),
        ("llamacpp", None),
        ("llama.cpp", None),
        ("embedding", None),
        ("audio", None),
        (None, None),
        ("", None),
    ],
)
def test_engine_flag(label: str | None, flag: str | None) -> None:
    assert engine_flag(label) == flag


@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        (["vllm", "serve", "Qwen/Qwen3-Embedding-0.6B", "--runner", "pooling"], "vllm"),
        (["/usr/local/bin/vllm", "serve", "m"], "vllm"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm"),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
        (["sglang", "serve", "--model-path", "m"], "sglang"),
        (["llama-server", "-m", "/models/x.gguf"], "llamacpp"),
        (["--model", "tdt-0.6b-v3"], None),
        (["serve", "m", "--served-model-name", "vllm"], None),
        ([], None),
    ],
)
def test_engine_of_argv(argv: list[str], engine: str | None) -> None:
    assert engine_of_argv(argv) == engine


@pytest.mark.parametrize(
    ("image", "engine"),
    [
        ("vllm/vllm-openai:v0.11.0", "vllm"),
        ("vllm/vllm-openai@sha256:907377dd", "vllm"),
        ("lmsysorg/sglang:latest", "sglang"),
        ("ghcr.io/ggml-org/llama.cpp:server-cuda", "llamacpp"),
        ("ghcr.io/remsky/kokoro-fastapi-gpu:latest-cu128", None),
        ("registry:5000/vllm-like", "vllm"),
        ("registry:5000/other:vllm", None),
        (None, None),
    ],
)
def test_engine_of_image(image: str | None, engine: str | None) -> None:
    assert engine_of_image(image) == engine


@pytest.mark.parametrize(
    ("argv", "values"),
    [
        (["serve", "m", "--gpu-memory-utilization", "0.5"], ["0.5"]),
        (["serve", "m", "--gpu-memory-utilization=0.5"], ["0.5"]),
        (["serve", "m", "--gpu_memory_utilization", "0.5"], ["0.5"]),
        (["--gpu-memory-utilization", "0.5", "--gpu-memory-utilization=0.6"], ["0.5", "0.6"]),
        (["serve", "--gpu-memory-utilization"], [""]),
        (["serve", "--gpu-memory-utilization-extra", "0.5"], []),
        (["serve", "--mem-fraction-static", "0.5"], []),
    ],
)
def test_flag_values(argv: list[str], values: list[str]) -> None:
    assert flag_values(argv, VLLM_FLAG) == values


def test_flag_from_variable() -> None:
    assert flag_from_variable("serve m --gpu-memory-utilization ${UTIL:-0.5}")
    assert flag_from_variable("serve m --mem-fraction-static=$UTIL")
    assert not flag_from_variable("serve m --gpu-memory-utilization 0.5 ${EXTRA:-}")
    assert not flag_from_variable("serve m --gpu-memory-utilization $$HOME")


# ── device totals and render ───────────────────────────────────────────────────

ROLES = {
    "a": GpuRole("a", capacity_mib=TOTAL, reserve_mib=3072, uuid="GPU-a"),
    "b": GpuRole("b", capacity_mib=TOTAL, reserve_mib=3072, uuid="GPU-b"),
    "small": GpuRole("small", capacity_mib=32607),
}
TOTALS = role_totals(ROLES)


def test_role_totals_prefer_nvml() -> None:
    gpus = (GpuObs(uuid="GPU-a", total_mib=97871), GpuObs(uuid="GPU-b", total_mib=None))
    measured = measured_totals(ROLES, gpus)
    assert measured == {"a": 97871}
    totals = role_totals(ROLES, measured)
    assert totals["a"] == DeviceTotal("a", 97871, SOURCE_NVML)
    assert totals["b"] == DeviceTotal("b", TOTAL, SOURCE_DECLARED)
    assert measured_totals(ROLES, None) == {}


def test_render_vllm() -> None:
    result = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    assert result.flag == VLLM_FLAG
    assert result.value == "0.0326"
    assert result.text == "--gpu-memory-utilization 0.0326"
    assert result.argv == (VLLM_FLAG, "0.0326")
    assert result.problem is None
    assert result.explanation == (
        "3200 MiB / 97887 MiB (declared capacity of role a) = 0.032691… → 0.0326, rounded "
        "down to 4 places so the engine's 3191.1 MiB stays within the 3200 MiB reservation"
    )
    data = result.to_json()
    assert data["value"] == "0.0326"
    assert data["engine_mib"] == {"a": 3191.1}
    assert data["device_totals"] == [{"role": "a", "total_mib": TOTAL, "source": SOURCE_DECLARED}]


def test_render_exact_and_nvml_total() -> None:
    totals = role_totals(ROLES, {"a": 96000})
    result = render_flag("s", "vllm", 48000, ("a",), totals)
    assert result.value == "0.5000"
    assert (
        result.explanation
        == "48000 MiB / 96000 MiB (NVML total of role a) = 0.5000 exactly (48000 MiB)"
    )


def test_render_sglang() -> None:
    """SGLang's fraction is of the memory free when it starts: rendered as the variable
    each start sets, with what it is on an empty card."""
    result = render_flag("fast", "SGLang", 27999, ("a",), TOTALS)
    assert result.text == "--mem-fraction-static ${VRAMCTL_FRACTION_OF_FREE}"
    assert result.engine == "sglang" and result.of_free and result.budget() is None
    assert "a fraction of the memory free when the engine starts, not of the card" in (
        result.explanation
    )
    assert "on an empty card: 27999 MiB / " in result.explanation
    assert "0.2860" in result.explanation


def test_render_tensor_parallel_applies_per_gpu() -> None:
    result = render_flag("tp2", "vllm", 94721, ("a", "b"), TOTALS)
    assert result.text == "--gpu-memory-utilization 0.9676"
    assert "on each of 2 GPUs (tensor parallel; the fraction applies per GPU)" in result.explanation
    assert "97887 MiB (declared capacity of roles a, b)" in result.explanation


def test_render_tensor_parallel_unequal_totals_takes_the_smallest_fraction() -> None:
    result = render_flag("tp2", "vllm", 16000, ("a", "small"), TOTALS)
    assert result.value == str(fraction_for(16000, TOTAL))  # 0.1634 (the larger device)
    assert "smallest per-GPU fraction on role a" in result.explanation
    assert all(mib <= 16000 for mib in result.engine_mib().values())


@pytest.mark.parametrize(
    ("engine", "vram_mib", "roles", "kind", "words"),
    [
        ("llamacpp", 8000, ("a",), FindingKind.NO_ENGINE_FLAG, "engine 'llamacpp' has no"),
        ("embedding", 3200, ("a",), FindingKind.NO_ENGINE_FLAG, "engine 'embedding' has no"),
        (None, 3200, ("a",), FindingKind.NO_ENGINE_FLAG, "no engine is declared"),
        ("vllm", None, ("a",), FindingKind.NO_RESERVATION, "no reservation (vram_mib)"),
        ("vllm", 3200, (), FindingKind.NO_DEVICE_TOTAL, "no gpu_role/gpu_roles"),
        ("vllm", 3200, ("zzz",), FindingKind.NO_DEVICE_TOTAL, "no device total for role zzz"),
        ("vllm", 40000, ("small",), FindingKind.EXCEEDS_DEVICE, "exceeds the device total"),
    ],
)
def test_render_without_a_value(
    engine: str | None,
    vram_mib: int | None,
    roles: tuple[str, ...],
    kind: FindingKind,
    words: str,
) -> None:
    result = render_flag("s", engine, vram_mib, roles, TOTALS)
    assert result.fraction is None
    assert result.value is None
    assert result.text is None
    assert result.argv == ()
    assert result.problem_kind is kind
    assert result.problem is not None
    assert words in result.problem


# ── check_fraction ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize("found", ["0.0326", "0.0327", "0.033", "0.0317", "0.0336"])
def test_check_within_tolerance(found: str) -> None:
    render = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    assert check_fraction(render, found) is None


def test_check_disagrees_over() -> None:
    render = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    finding = check_fraction(render, "0.05", service="emb")
    assert finding is not None
    assert finding.kind is FindingKind.DISAGREES
    assert finding.severity is Severity.ERROR
    assert (finding.serve, finding.service) == ("embeddings", "emb")
    assert "--gpu-memory-utilization 0.05 gives the engine 4894.4 MiB of 97887 MiB" in (
        finding.message
    )
    assert "1694.4 MiB more than its 3200 MiB reservation (3200/97887 = 0.032691…)" in (
        finding.message
    )
    assert "write --gpu-memory-utilization 0.0326, or reserve vram_mib = 4895" in finding.message
    assert finding.facts["found_mib"] == 4894.4
    assert finding.facts["delta_mib"] == 1694.4
    assert finding.facts["tolerance_mib"] == 97.9


def test_check_disagrees_under() -> None:
    render = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    finding = check_fraction(render, "0.02")
    assert finding is not None
    assert finding.kind is FindingKind.DISAGREES
    assert "1242.3 MiB less than its 3200 MiB reservation" in finding.message
    assert "reserve vram_mib = 1958 to keep the flag" in finding.message


def test_check_tolerance_is_a_parameter() -> None:
    render = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    # tolerance 0: only the exact fraction would do, and 4 places cannot write it
    assert check_fraction(render, "0.0327", tolerance=0) is not None
    assert check_fraction(render, "0.0326", tolerance="0") is not None
    # 0.0001 of the device is 9.8 MiB: 0.0326 (-8.9 MiB) and 0.0327 (+0.9 MiB) pass
    assert check_fraction(render, "0.0326", tolerance="0.0001") is None
    assert check_fraction(render, "0.0327", tolerance=Decimal("0.0001")) is None
    assert check_fraction(render, "0.05", tolerance=0.02) is None
    with pytest.raises(ValueError, match="must not be negative"):
        check_fraction(render, "0.05", tolerance=-1)


def test_check_missing_flag() -> None:
    render = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    finding = check_fraction(render, None)
    assert finding is not None
    assert finding.kind is FindingKind.MISSING_FLAG
    assert finding.severity is Severity.ERROR
    assert "runs vLLM without --gpu-memory-utilization" in finding.message
    assert "add --gpu-memory-utilization 0.0326" in finding.message


@pytest.mark.parametrize("found", ["", "lots", "1.5", "0"])
def test_check_bad_value(found: str) -> None:
    render = render_flag("embeddings", "vllm", 3200, ("a",), TOTALS)
    finding = check_fraction(render, found)
    assert finding is not None
    assert finding.kind is FindingKind.BAD_VALUE
    assert finding.is_error


def test_check_notes_when_there_is_nothing_to_check() -> None:
    no_flag = check_fraction(render_flag("stt", "audio", 2048, ("a",), TOTALS), None)
    assert no_flag is not None
    assert no_flag.kind is FindingKind.NO_ENGINE_FLAG
    assert no_flag.severity is Severity.NOTE
    bare = check_fraction(render_flag("x", "vllm", None, ("a",), TOTALS), "0.5")
    assert bare is not None
    assert bare.kind is FindingKind.NO_RESERVATION
    assert not bare.is_error
    assert "sets --gpu-memory-utilization 0.5 but declares no reservation" in bare.message


def test_check_exceeding_the_device_is_an_error() -> None:
    finding = check_fraction(render_flag("x", "vllm", 40000, ("small",), TOTALS), "0.9")
    assert finding is not None
    assert finding.kind is FindingKind.EXCEEDS_DEVICE
    assert finding.is_error


def test_check_tensor_parallel_checks_every_role() -> None:
    render = render_flag("tp2", "vllm", 16000, ("a", "small"), TOTALS)
    # 0.1634 is right on the 97887 MiB card (-5.3 MiB), but on the 32607 MiB card it
    # budgets 5328 MiB against a 16000 MiB reservation: far under.
    finding = check_fraction(render, "0.1634")
    assert finding is not None
    assert finding.facts["role"] == "small"
    assert "less than its 16000 MiB reservation" in finding.message


def test_default_tolerance() -> None:
    assert Decimal("0.001") == DEFAULT_TOLERANCE


# ── compose parsing ────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A:-0.5}", {}, "0.5"),
        ("${A:-0.5}", {"A": ""}, "0.5"),
        ("${A-0.5}", {"A": ""}, ""),
        ("${A:-0.5}", {"A": "0.7"}, "0.7"),
        ("$A and ${B}", {"A": "x"}, "x and "),
        ("$$HOME", {"HOME": "/root"}, "$HOME"),
        ("${A:+set}", {"A": "1"}, "set"),
        ("${A:+set}", {}, ""),
        ("${A+set}", {"A": ""}, "set"),
        ("${A:?must be set}", {"A": "v"}, "v"),
        ("${A:-${B:-deep}}", {}, "deep"),
        ("${A:-${B:-deep}}", {"B": "b"}, "b"),
    ],
)
def test_interpolate(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(text, env) == expected


def test_interpolate_rejects_malformed() -> None:
    with pytest.raises(ValueError, match="invalid interpolation"):
        interpolate("${1BAD}", {})


MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 97887
reserve_mib = 3072

[[serve]]
name = "chat"
container = "vllm-chat"
engine = "vllm"
gpu_role = "a"
vram_mib = 48000

[[serve]]
name = "embed"
container = "vllm-embed"
engine = "embedding"
gpu_role = "a"
vram_mib = 3200

[[serve]]
name = "fast"
container = "sglang-fast"
engine = "sglang"
gpu_role = "a"
vram_mib = 24576

[[serve]]
name = "gguf"
container = "llamacpp-gguf"
engine = "llamacpp"
gpu_role = "a"
vram_mib = 8192

[[serve]]
name = "lab"
container = "vllm-lab"
engine = "vllm"
"""


def manifest(tmp_path: Path, text: str = MANIFEST) -> ManifestSet:
    return files.manifest(tmp_path, text)


GOOD_SERVICES = """
chat:
  image: vllm/vllm-openai:v0.11.0
  container_name: vllm-chat
  entrypoint: ["vllm"]
  command: >
    serve Qwen/Qwen3-32B
    --gpu-memory-utilization 0.4903
    --port 30002
embed:
  image: vllm/vllm-openai:v0.11.0
  container_name: vllm-embed
  entrypoint: ["vllm"]
  command: ["serve", "Qwen/Qwen3-Embedding-0.6B", "--gpu-memory-utilization=0.0327"]
fast:
  image: lmsysorg/sglang:latest
  container_name: sglang-fast
  command: python3 -m sglang.launch_server --model-path m
    --mem-fraction-static ${VRAMCTL_FRACTION_OF_FREE}
gguf:
  image: ghcr.io/ggml-org/llama.cpp:server-cuda
  container_name: llamacpp-gguf
  command: ["-m", "/models/x.gguf"]
router:
  image: anvil-serving:0.22.0
  container_name: anvil-router
"""


def kinds(report: LintReport) -> list[tuple[str, str | None, str | None]]:
    return [(f.kind.value, f.serve, f.service) for f in report.findings]


def test_lint_clean(tmp_path: Path) -> None:
    report = lint_compose(manifest(tmp_path), [compose(tmp_path, GOOD_SERVICES)], environ={})
    assert report.ok
    assert report.errors == ()
    assert kinds(report) == [("no-engine-flag", "gguf", "gguf")]
    checked = {c.serve: c for c in report.checked}
    assert set(checked) == {"chat", "embed", "fast", "gguf"}
    assert (checked["chat"].found, checked["chat"].expected) == ("0.4903", "0.4903")
    # the = form, and the purpose label resolved from the command that runs
    assert (checked["embed"].engine, checked["embed"].engine_source) == ("vllm", "command")
    assert checked["embed"].found == "0.0327"
    assert (checked["fast"].flag, checked["fast"].expected) == (
        SGLANG_FLAG,
        "${VRAMCTL_FRACTION_OF_FREE}",
    )
    assert (checked["gguf"].engine, checked["gguf"].engine_source) == ("llamacpp", "image")
    assert all(c.ok for c in checked.values())


def test_lint_wrong_fraction_is_an_error(tmp_path: Path) -> None:
    services = GOOD_SERVICES.replace(
        "--gpu-memory-utilization 0.4903", "--gpu-memory-utilization 0.60"
    )
    report = lint_compose(manifest(tmp_path), [compose(tmp_path, services)])
    assert not report.ok
    assert [(f.kind, f.serve, f.service) for f in report.errors] == [
        (FindingKind.DISAGREES, "chat", "chat")
    ]
    error = report.errors[0]
    assert error.severity is Severity.ERROR
    message = error.message
    assert "--gpu-memory-utilization 0.60 gives the engine 58732.2 MiB of 97887 MiB" in message
    assert "10732.2 MiB more than its 48000 MiB reservation (48000/97887 = 0.490361…)" in message
    assert "write --gpu-memory-utilization 0.4903" in message
    assert error.facts["found"] == "0.60"
    assert error.facts["expected"] == "0.4903"
    assert error.facts["vram_mib"] == 48000
    assert error.facts["found_mib"] == 58732.2
    checked = {c.serve: c for c in report.checked}
    assert not checked["chat"].ok
    assert report.to_json()["ok"] is False
    lines = report_lines(report)
    assert lines[0].startswith("4 serve(s) checked in ")
    assert "1 error(s), 1 note(s)" in lines[0]
    assert any(line.startswith("error: serve chat, service chat: disagrees: ") for line in lines)


def test_lint_missing_flag_is_an_error(tmp_path: Path) -> None:
    services = GOOD_SERVICES.replace("--gpu-memory-utilization=0.0327", "--max-model-len=2048")
    report = lint_compose(manifest(tmp_path), [compose(tmp_path, services)])
    assert [(f.kind, f.serve) for f in report.errors] == [(FindingKind.MISSING_FLAG, "embed")]
    assert "add --gpu-memory-utilization 0.0326" in report.errors[0].message


def test_lint_equals_form_can_disagree_too(tmp_path: Path) -> None:
    services = GOOD_SERVICES.replace(
        "--mem-fraction-static ${VRAMCTL_FRACTION_OF_FREE}", "--mem-fraction-static=0.35"
    )
    report = lint_compose(manifest(tmp_path), [compose(tmp_path, services)])
    assert [(f.kind, f.serve) for f in report.errors] == [(FindingKind.SIZED_FROM_FREE, "fast")]
    assert "--mem-fraction-static 0.35 is a fraction of the memory free when SGLang starts" in (
        report.errors[0].message
    )
    assert "write --mem-fraction-static ${VRAMCTL_FRACTION_OF_FREE}" in report.errors[0].message


def test_lint_notes(tmp_path: Path) -> None:
    services = GOOD_SERVICES + textwrap.dedent(
        """
        other:
          image: vllm/vllm-openai:v0.11.0
          container_name: vllm-unknown
          command: --model m --gpu-memory-utilization 0.3
        lab:
          image: vllm/vllm-openai:v0.11.0
          command: --model m --gpu-memory-utilization 0.3
        """
    )
    services = services.replace(
        "--gpu-memory-utilization 0.4903", "--gpu-memory-utilization ${CHAT_UTIL:-0.4903}"
    ).replace(
        '"--gpu-memory-utilization=0.0327"]',
        '"--gpu-memory-utilization=0.5", "--gpu-memory-utilization=0.0327"]',
    )
    mset = manifest(tmp_path)
    report = lint_compose(mset, [compose(tmp_path, services)])
    assert report.ok
    assert kinds(report) == [
        ("value-from-variable", "chat", "chat"),
        ("repeated-flag", "embed", "embed"),
        ("no-engine-flag", "gguf", "gguf"),
        ("no-serve", None, "other"),
        ("no-reservation", "lab", "lab"),
    ]
    by_kind = {f.kind: f for f in report.findings}
    assert "takes the last, 0.0327" in by_kind[FindingKind.REPEATED_FLAG].message
    assert "checked its value with nothing set in the environment: 0.4903" in (
        by_kind[FindingKind.FROM_VARIABLE].message
    )
    assert "'vllm-unknown'" in by_kind[FindingKind.NO_SERVE].message
    # "lab" has no container_name: matched by its service name
    assert "sets --gpu-memory-utilization 0.3 but declares no reservation" in (
        by_kind[FindingKind.NO_RESERVATION].message
    )


def test_lint_environment_is_used_only_when_given(tmp_path: Path) -> None:
    services = GOOD_SERVICES.replace(
        "--gpu-memory-utilization 0.4903", "--gpu-memory-utilization ${CHAT_UTIL:-0.4903}"
    )
    path = compose(tmp_path, services)
    mset = manifest(tmp_path)
    assert lint_compose(mset, [path]).ok
    report = lint_compose(mset, [path], environ={"CHAT_UTIL": "0.9"})
    assert [(f.kind, f.serve) for f in report.errors] == [(FindingKind.DISAGREES, "chat")]


def test_lint_engine_mismatch_note(tmp_path: Path) -> None:
    services = GOOD_SERVICES.replace(
        'command: ["-m", "/models/x.gguf"]', "command: vllm serve m --gpu-memory-utilization 0.0836"
    )
    report = lint_compose(manifest(tmp_path), [compose(tmp_path, services)])
    assert report.ok
    assert kinds(report) == [("engine-mismatch", "gguf", "gguf")]
    assert "the manifest says engine 'llamacpp'" in report.findings[0].message


def test_lint_not_in_compose_and_default_container_names(tmp_path: Path) -> None:
    services = """
    chat:
      image: vllm/vllm-openai:v0.11.0
      command: --model m --gpu-memory-utilization 0.4903
    """
    text = MANIFEST.replace('container = "vllm-chat"', 'container = "stack-chat-1"').replace(
        'name = "embed"\ncontainer = "vllm-embed"',
        'name = "embed"\ncontainer = "vllm-embed"\n'
        'up = "docker compose -f {dir}/docker-compose.aux.yml up -d embed"',
    )
    report = lint_compose(manifest(tmp_path, text), [compose(tmp_path, services)])
    assert [c.serve for c in report.checked] == ["chat"]
    notes = {f.serve: f for f in report.findings}
    assert set(notes) == {"embed", "fast", "gguf"}
    assert all(f.kind is FindingKind.NOT_IN_COMPOSE for f in notes.values())
    assert "its up command uses docker-compose.aux.yml" in notes["embed"].message
    assert "it has no up command" in notes["fast"].message


def test_lint_merges_files_like_compose(tmp_path: Path) -> None:
    base = compose(tmp_path, GOOD_SERVICES)
    override = write(
        tmp_path,
        "override.yml",
        """
        services:
          chat:
            command: serve m --gpu-memory-utilization 0.2
        """,
    )
    report = lint_compose(manifest(tmp_path), [base, override])
    assert [(f.kind, f.serve) for f in report.errors] == [(FindingKind.DISAGREES, "chat")]
    chat = next(c for c in report.checked if c.serve == "chat")
    assert chat.file == override
    assert (chat.engine, chat.engine_source) == ("vllm", "command")  # entrypoint kept


def test_lint_nvml_totals(tmp_path: Path) -> None:
    path = compose(tmp_path, GOOD_SERVICES)
    report = lint_compose(manifest(tmp_path), [path], measured={"a": 80000})
    errors = {f.serve: f for f in report.errors}
    # on an 80000 MiB device every fraction written for 97887 MiB budgets too little;
    # SGLang's, set at each start from what is free, is right on any card
    assert set(errors) == {"chat", "embed"}
    assert "of 80000 MiB (NVML total of role a)" in errors["chat"].message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("services: [1, 2]\n", "services: must be a mapping"),
        ("services:\n  a: 3\n", "services.a: must be a mapping"),
        (
            "services:\n  a:\n    command: {x: 1}\n",
            "services.a.command: must be a string or a list",
        ),
        ('services:\n  a:\n    command: "serve \'open"\n', "cannot split into arguments"),
        ("services:\n  a: [\n", "line 3, column 1: YAML syntax error"),
        ("- 1\n", "a compose file must be a mapping"),
    ],
)
def test_compose_errors_are_located(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ComposeError) as info:
        load_compose([path])
    assert str(path) in str(info.value)
    assert words in str(info.value)


def test_compose_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ComposeError, match="no such file"):
        load_compose([tmp_path / "absent.yml"])


# ── render_serve (what `vramctl render` calls) ─────────────────────────────────


def test_render_serve(tmp_path: Path) -> None:
    mset = manifest(tmp_path)
    chat = render_serve(mset, "chat")
    assert chat.result.text == "--gpu-memory-utilization 0.4903"
    assert chat.engine_source == "label"
    embed = render_serve(mset, "embed")
    assert embed.result.text is None
    assert "give its compose file" in str(embed.result.problem)
    path = compose(tmp_path, GOOD_SERVICES)
    embed = render_serve(mset, "embed", compose_paths=[path])
    assert (embed.result.text, embed.engine_source, embed.service) == (
        "--gpu-memory-utilization 0.0326",
        "command",
        "embed",
    )
    forced = render_serve(mset, "embed", engine="sglang")
    assert (forced.result.text, forced.engine_source) == (
        "--mem-fraction-static ${VRAMCTL_FRACTION_OF_FREE}",
        "given",
    )
    assert "on an empty card: 3200 MiB / " in forced.result.explanation
    given_total = render_serve(
        mset, "chat", measured={"a": 96000}, measured_source="--device-total"
    )
    assert given_total.result.value == "0.5000"
    assert "96000 MiB (--device-total of role a)" in given_total.result.explanation
    assert given_total.to_json()["engine_source"] == "label"
    with pytest.raises(KeyError):
        render_serve(mset, "nope")


# ── the real serving stack ─────────────────────────────────────────────────────


def test_real_stack_compose_and_manifest() -> None:
    """serves.toml + docker-compose.yml: 8 serves checked, one explained error, 2 notes.

    * primary-laguna-rollback: ``--gpu-memory-utilization 0.90`` budgets 88098.3 MiB on
      the 97887 MiB card against an 88000 MiB reservation: 98.3 MiB over, just beyond the
      0.001 (97.9 MiB) tolerance. Every other fraction in the file is within 14 MiB of its
      reservation (0.94 for 92000: +13.8; 0.0327 for 3200: +0.9; 0.2511 for 24576: +3.4).
    * The two tp2 DeepSeek serves reserve 94721 MiB per GPU but are started by a recipe
      loader (``python -m anvil_serving.cli models recipes load``), not this compose file.
    """
    mset = load_manifest_set([FIXTURES / "serves.toml"])
    report = lint_compose(mset, [FIXTURES / "docker-compose.yml"])
    assert not report.ok
    assert kinds(report) == [
        ("disagrees", "primary-laguna-rollback", "primary-laguna-rollback"),
        ("not-in-compose", TP2_650K, None),
        ("not-in-compose", TP2_1M, None),
    ]
    error = report.errors[0]
    assert error.facts["found"] == "0.90"
    assert error.facts["expected"] == "0.8989"
    assert error.facts["vram_mib"] == 88000
    assert error.facts["total_mib"] == TOTAL
    assert error.facts["found_mib"] == 88098.3
    assert error.facts["delta_mib"] == 98.3
    assert error.facts["tolerance_mib"] == 97.9
    assert "reserve vram_mib = 88099 to keep the flag" in error.message
    for note in report.notes:
        assert "does not use docker compose (python -m anvil_serving.cli …)" in note.message

    checked = {
        c.serve: (c.service, c.engine, c.engine_source, c.found, c.expected, c.ok)
        for c in report.checked
    }
    assert checked == {
        "primary": ("primary", "vllm", "command", "0.94", "0.9398", True),
        "primary-qwen35-rollback": (
            "primary-qwen35-rollback",
            "vllm",
            "command",
            "0.94",
            "0.9398",
            True,
        ),
        "primary-laguna-rollback": (
            "primary-laguna-rollback",
            "vllm",
            "command",
            "0.90",
            "0.8989",
            False,
        ),
        "primary-gptoss-puzzle-rollback": (
            "primary-gptoss-puzzle-rollback",
            "vllm",
            "command",
            "0.95",
            "0.9500",
            True,
        ),
        "omni": ("omni", "vllm", "command", "0.2860", "0.2860", True),
        "omni-small": ("omni-small", "vllm", "command", "0.2511", "0.2510", True),
        # labelled "embedding"/"reranker", run with `vllm serve`
        "embeddings": ("embeddings", "vllm", "command", "0.0327", "0.0326", True),
        "reranker": ("reranker", "vllm", "command", "0.0353", "0.0353", True),
    }


def test_real_stack_all_files() -> None:
    """The whole set: voice and comfyui serves have no engine flag (notes), nothing more."""
    mset = load_manifest_set(
        [FIXTURES / "serves.toml", FIXTURES / "serves.voice.toml", FIXTURES / "serves.comfyui.toml"]
    )
    report = lint_compose(mset, [FIXTURES / name for name in COMPOSE_FILES])
    assert kinds(report) == [
        ("disagrees", "primary-laguna-rollback", "primary-laguna-rollback"),
        ("no-engine-flag", "stt", "stt"),
        ("no-engine-flag", "tts", "tts"),
        ("no-engine-flag", "comfyui", "comfyui"),
        ("not-in-compose", TP2_650K, None),
        ("not-in-compose", TP2_1M, None),
    ]
    assert len(report.checked) == 11


def test_real_stack_with_a_wider_tolerance_is_clean() -> None:
    mset = load_manifest_set([FIXTURES / "serves.toml"])
    report = lint_compose(mset, [FIXTURES / "docker-compose.yml"], tolerance="0.0011")
    assert report.ok
    assert [f.kind for f in report.findings] == [FindingKind.NOT_IN_COMPOSE] * 2


def test_real_stack_render() -> None:
    mset = load_manifest_set([FIXTURES / "serves.toml"])
    assert render_serve(mset, "primary").result.text == "--gpu-memory-utilization 0.9398"
    tp2 = render_serve(mset, TP2_650K).result
    assert tp2.text == "--gpu-memory-utilization 0.9676"
    assert "tensor parallel" in tp2.explanation
    embeddings = render_serve(mset, "embeddings", compose_paths=[FIXTURES / "docker-compose.yml"])
    assert embeddings.result.explanation == (
        "3200 MiB / 97887 MiB (declared capacity of role dark-compute-b) = 0.032691… → 0.0326, "
        "rounded down to 4 places so the engine's 3191.1 MiB stays within the 3200 MiB "
        "reservation"
    )
    assert render_serve(mset, "fast-glm47-flash-llamacpp").result.problem_kind is (
        FindingKind.NO_ENGINE_FLAG
    )


@pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason="no shared fixtures beside the repo")
@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_fixture_copy_matches_shared(name: str) -> None:
    assert (FIXTURES / name).read_bytes() == (SHARED_FIXTURES / name).read_bytes()


# ── what the rendered fraction gives the engine, and SGLang's variable ─────────────


def test_the_budget_is_the_fraction_of_the_smallest_total_rounded_down() -> None:
    """vLLM's weights and KV cache live in fraction × the device total: 0.4903 of 97887
    MiB, rounded down to whole bytes; of two devices, the smaller's; with a smaller
    fraction (a command's), that one."""
    result = render_flag("chat", "vllm", 48000, ("a",), TOTALS)
    want = int(Fraction("0.4903") * TOTAL * 1024 * 1024)
    assert result.budget() == (want, f"--gpu-memory-utilization 0.4903 × {TOTAL} MiB × 1048576")
    assert want < 48000 * 1024 * 1024
    lower = result.budget(Decimal("0.4800"))
    assert lower is not None and lower[0] == int(Fraction("0.48") * TOTAL * 1024 * 1024)
    tp = render_flag("tp", "vllm", 16000, ("a", "small"), TOTALS)
    got = tp.budget()
    assert got is not None and got[1].endswith("× 32607 MiB × 1048576")
    assert got[0] == int(Fraction(str(tp.fraction)) * 32607 * 1024 * 1024)
    assert render_flag("s", "sglang", 16000, ("a",), TOTALS).budget() is None  # of free memory
    assert render_flag("s", "vllm", None, ("a",), TOTALS).budget() is None  # nothing rendered


def test_a_render_result_is_of_the_device_total_unless_said() -> None:
    total = DeviceTotal("a", TOTAL)
    plain = RenderResult("s", "vllm", VLLM_FLAG, 3200, (total,), Decimal("0.0326"), "e")
    assert (plain.of_free, plain.value) == (False, "0.0326")
    assert plain.budget() is not None
    assert RenderResult("s", "vllm", VLLM_FLAG, 3200, (), Decimal("0.0326"), "e").budget() is None


def test_only_an_engine_of_free_memory_takes_the_starts_variable() -> None:
    """vLLM's fraction is of the device total: the SGLang variable is no value for it."""
    render = render_flag("chat", "vllm", 48000, ("a",), TOTALS)
    raw = "vllm serve m --gpu-memory-utilization ${VRAMCTL_FRACTION_OF_FREE}"
    got = check_fraction(render, "", raw=raw)
    assert got is not None and got.kind is FindingKind.BAD_VALUE
    sglang = render_flag("fast", "sglang", 48000, ("a",), TOTALS)
    ok = "python -m sglang.launch_server --mem-fraction-static ${VRAMCTL_FRACTION_OF_FREE}"
    assert check_fraction(sglang, "", raw=ok) is None
