"""``[serve.sleep]`` and the engine's command line: what `render` prints, what `lint` finds.

vLLM answers the sleep API only with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``
in its environment; SGLang only with ``--enable-memory-saver``. Without them every sleep
answers 404 and falls back to a stop, so `lint --compose` reports it as an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.files import compose, manifest

from controller.tools.compose_lint import lint_compose, render_serve
from statemachine.flags.fraction import (
    SGLANG_SLEEP_FLAG,
    VLLM_SLEEP_ENV,
    VLLM_SLEEP_FLAG,
    FindingKind,
    Severity,
    SleepNeeds,
    check_sleep,
    sleep_needs,
)

SLEEPY = """
[[gpu_roles]]
id = "a"
vram_mib = 97887

[[serve]]
name = "chat"
container = "vllm-chat"
engine = "vllm"
gpu_role = "a"
vram_mib = 48000
port = 30002
[serve.sleep]
level = 1
residual_mib = 2048
host_ram_mib = 40000

[[serve]]
name = "fast"
container = "sglang-fast"
engine = "sglang"
gpu_role = "a"
vram_mib = 24576
port = 30003
[serve.sleep]
level = 2
residual_mib = 1024

[[serve]]
name = "plain"
container = "vllm-plain"
engine = "vllm"
gpu_role = "a"
vram_mib = 4000
"""

SERVICES = """
chat:
  image: vllm/vllm-openai:v0.11.0
  container_name: vllm-chat
  entrypoint: ["vllm"]
  environment:
    VLLM_SERVER_DEV_MODE: "1"
  command: serve m --gpu-memory-utilization 0.4903 --enable-sleep-mode
fast:
  image: lmsysorg/sglang:latest
  container_name: sglang-fast
  command: python3 -m sglang.launch_server
    --mem-fraction-static ${VRAMCTL_FRACTION_OF_FREE} --enable-memory-saver
plain:
  image: vllm/vllm-openai:v0.11.0
  container_name: vllm-plain
  entrypoint: ["vllm"]
  command: serve m --gpu-memory-utilization 0.0408
"""


def test_sleep_needs_per_protocol() -> None:
    assert sleep_needs("vllm") == SleepNeeds("vllm", (VLLM_SLEEP_FLAG,), {VLLM_SLEEP_ENV: "1"})
    assert sleep_needs("SGLang") == SleepNeeds("sglang", (SGLANG_SLEEP_FLAG,))
    assert sleep_needs("llamacpp") is None and sleep_needs(None) is None
    needs = sleep_needs("vllm")
    assert needs is not None and needs.text == "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"


@pytest.mark.parametrize(
    ("protocol", "argv", "env", "missing"),
    [
        ("vllm", ["vllm", "serve", "m", "--enable-sleep-mode"], {"VLLM_SERVER_DEV_MODE": "1"}, []),
        ("vllm", ["vllm", "serve", "m", "--enable_sleep_mode"], {"VLLM_SERVER_DEV_MODE": "1"}, []),
        ("vllm", ["vllm", "serve", "m"], {"VLLM_SERVER_DEV_MODE": "1"}, ["--enable-sleep-mode"]),
        ("vllm", ["vllm", "serve", "m", "--enable-sleep-mode"], {}, ["VLLM_SERVER_DEV_MODE=1"]),
        (
            "vllm",
            ["vllm", "serve", "m", "--enable-sleep-mode=false"],
            {"VLLM_SERVER_DEV_MODE": "0"},
            ["--enable-sleep-mode", "VLLM_SERVER_DEV_MODE=1"],
        ),
        ("sglang", ["python3", "-m", "sglang.launch_server", "--enable-memory-saver"], {}, []),
        ("sglang", ["python3", "-m", "sglang.launch_server"], {}, ["--enable-memory-saver"]),
    ],
)
def test_check_sleep(
    protocol: str, argv: list[str], env: dict[str, str], missing: list[str]
) -> None:
    found = check_sleep("s", protocol, argv, env)
    if not missing:
        assert found == []
        return
    (finding,) = found
    assert finding.kind is FindingKind.SLEEP_MODE_OFF and finding.severity is Severity.ERROR
    assert finding.facts["missing"] == missing
    assert "falls back to a stop" in finding.message
    for word in missing:
        assert word in finding.message


def test_a_protocol_the_command_does_not_speak_is_an_error() -> None:
    (finding,) = check_sleep("s", "vllm", ["x", "--enable-memory-saver"], {}, engine="sglang")
    assert finding.kind is FindingKind.SLEEP_PROTOCOL_MISMATCH and finding.is_error
    assert "protocol = 'sglang'" in finding.message
    assert check_sleep("s", "llamacpp", [], {}) == []


def test_lint_accepts_engines_started_with_their_sleep_api(tmp_path: Path) -> None:
    report = lint_compose(manifest(tmp_path, SLEEPY), [compose(tmp_path, SERVICES)], environ={})
    assert report.ok, [f.message for f in report.errors]


@pytest.mark.parametrize(
    ("old", "new", "serve", "missing"),
    [
        (" --enable-sleep-mode", "", "chat", ["--enable-sleep-mode"]),
        ('VLLM_SERVER_DEV_MODE: "1"', 'OTHER: "1"', "chat", ["VLLM_SERVER_DEV_MODE=1"]),
        (" --enable-memory-saver", "", "fast", ["--enable-memory-saver"]),
    ],
)
def test_lint_flags_an_engine_without_its_sleep_api(
    tmp_path: Path, old: str, new: str, serve: str, missing: list[str]
) -> None:
    services = SERVICES.replace(old, new)
    report = lint_compose(manifest(tmp_path, SLEEPY), [compose(tmp_path, services)], environ={})
    assert [(f.kind, f.serve) for f in report.errors] == [(FindingKind.SLEEP_MODE_OFF, serve)]
    assert report.errors[0].facts["missing"] == missing
    assert not {c.serve: c for c in report.checked}[serve].ok


def test_lint_reads_a_list_environment_and_notes_an_unread_env_file(tmp_path: Path) -> None:
    listed = SERVICES.replace(
        'environment:\n    VLLM_SERVER_DEV_MODE: "1"', "environment:\n    - VLLM_SERVER_DEV_MODE=1"
    )
    assert "- VLLM_SERVER_DEV_MODE=1" in listed
    report = lint_compose(manifest(tmp_path, SLEEPY), [compose(tmp_path, listed)], environ={})
    assert report.ok
    from_file = SERVICES.replace('environment:\n    VLLM_SERVER_DEV_MODE: "1"', "env_file: .env")
    report = lint_compose(manifest(tmp_path, SLEEPY), [compose(tmp_path, from_file)], environ={})
    assert report.ok
    assert [(f.kind, f.serve) for f in report.notes] == [(FindingKind.SLEEP_ENV_UNREAD, "chat")]


def test_render_names_what_the_sleep_api_needs(tmp_path: Path) -> None:
    mset = manifest(tmp_path, SLEEPY)
    chat = render_serve(mset, "chat")
    assert chat.sleep == sleep_needs("vllm")
    assert chat.to_json()["sleep"] == {
        "protocol": "vllm",
        "flags": ["--enable-sleep-mode"],
        "env": {"VLLM_SERVER_DEV_MODE": "1"},
    }
    assert render_serve(mset, "fast").sleep == sleep_needs("sglang")
    plain = render_serve(mset, "plain")
    assert plain.sleep is None and plain.to_json()["sleep"] is None
