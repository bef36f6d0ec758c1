"""One verdict on a serve's model (statemachine/flags/verdict.py): ``validate``, ``render``,
``fit`` (its CLI, MCP and JSON answer) and ``status`` (the model entries) give the same
answer, from the engine's own arithmetic. Files written by gguf's own writer
(tests/shell/test_enforce_render_lint.py's two-layer model: 4259840 bytes of weights, 128
bytes of KV a token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.cli import bare_cli as cli
from support.model_files import write_gguf

from controller.interfaces.fit_answer import FitReply
from controller.manifest import load_manifest
from controller.service.model_estimates import serve_models

HEAD = """
[[gpu_roles]]
id = "s"
vram_mib = 100
"""

SERVE = """
[[serve]]
name = "{name}"
container = "c-{name}"
engine = "{engine}"
gpu_role = "s"
vram_mib = {vram_mib}

[serve.model]
path = "tiny.gguf"
{context}
"""

#: name → (engine, vram_mib, declared context, verdict, words of its message or note)
CASES: dict[str, tuple[str, int, int | None, str, str]] = {
    # weights 4.06 MiB > 3 MiB: the output layer and the last layer on the GPU
    "partial": (
        "llamacpp",
        3,
        4096,
        "ok",
        "loads partly on the GPU: --n-gpu-layers 2 puts the output layer and the last 1 of "
        "2 layers there, the other 1 run on the CPU",
    ),
    # no declared context: the model's own 65536 would not fit; 7664 tokens do
    "fitted": ("vllm", 5, None, "ok", "--max-model-len 7664: the longest context that fits"),
    # a declared context that does not fit: the serve would not get it
    "declared": (
        "vllm",
        5,
        8192,
        "cannot_load",
        "the declared context 8192 does not fit: at most 7664 tokens do",
    ),
    "weights": ("vllm", 4, None, "cannot_load", "the weights alone exceed the reservation"),
    # an engine without a limit that holds it (SGLang): weights + KV cache in bytes
    "sglang": ("sglang", 4, 1024, "cannot_load", "cannot load in its reservation: vram_mib 4"),
    "sglang-fits": ("sglang", 5, 1024, "ok", ""),
}


def manifest(tmp_path: Path, *names: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_gguf(tmp_path / "tiny.gguf")
    text = HEAD
    for name in names:
        engine, vram_mib, context, _, _ = CASES[name]
        line = "" if context is None else f"context = {context}"
        text += SERVE.format(name=name, engine=engine, vram_mib=vram_mib, context=line)
    path = tmp_path / "serves.toml"
    path.write_text(text)
    return path


def check(tmp_path: Path, name: str) -> dict[str, Any]:
    entry = serve_models(load_manifest(manifest(tmp_path, name)))[name]
    assert entry["error"] is None
    got: dict[str, Any] = entry["check"]
    return got


@pytest.mark.parametrize("name", sorted(CASES))
def test_validate_render_and_the_model_entry_agree(tmp_path: Path, name: str) -> None:
    _, _, _, verdict, words = CASES[name]
    got = check(tmp_path, name)
    assert got["verdict"] == verdict
    said = got["message"] if verdict == "cannot_load" else (got["note"] or got["message"])
    assert words in said
    path = str(tmp_path / "serves.toml")
    validate = cli("validate", "-m", path)
    render = cli("render", name, "-m", path)
    if verdict == "ok":
        assert validate.returncode == 0, validate.stderr
        assert render.returncode == 0, render.stderr
    else:
        assert validate.returncode != 0 and words in validate.stdout + validate.stderr
        assert render.returncode != 0 and words in render.stdout + render.stderr


def test_fit_answers_does_not_fit_where_the_model_cannot_load(tmp_path: Path) -> None:
    """A fit whose room is there but whose model cannot load is not a fit: ``fits``
    false (the CLI exits 1), its reason the verdict's; a partial load fits."""
    room: dict[str, Any] = {"fits": True, "reason": "fits as it is"}

    class Answer:
        def to_json(self) -> dict[str, Any]:
            return dict(room)

        @property
        def result(self) -> Any:
            return type("R", (), {"fits": True})()

    for name, fits in (("declared", False), ("partial", True)):
        entry = serve_models(load_manifest(manifest(tmp_path / name, name)))[name]
        reply = FitReply(Answer(), entry)  # type: ignore[arg-type]
        assert (reply.loads, reply.fits) == (fits, fits), name
        body = reply.to_json()
        assert body["fits"] is fits and body["model"] == entry
        if not fits:
            assert body["reason"] == entry["check"]["message"]
