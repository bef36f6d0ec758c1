"""``vramctl estimate`` through the command line (a subprocess, as the console script runs):
the text answer and ``--json`` on files the formats' own writers made, exit 2 with a
located error on bad input, and what the command loads (``--help`` no gguf nor numpy)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from support.cli import cli_env, run_cli
from support.model_files import GGUF_WEIGHTS, hf_config, write_tiny_gguf
from test_cli_imports import SERVER_DOCKER_HTTP, _loaded, _tops

MIB = 1024 * 1024


def vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("estimate", *args, env=cli_env())


@pytest.fixture
def gguf_model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)  # 2 layers, 2 KV heads, head_dim 8, context 256
    return path


@pytest.fixture
def safetensors_model(tmp_path: Path) -> Path:
    save_file({"w": np.zeros((4, 4), dtype=np.float16)}, str(tmp_path / "model.safetensors"))
    hf_config(tmp_path)  # 3 layers, 2 KV heads, head_dim 16, context 512
    return tmp_path


def test_the_text_answer_shows_each_term_the_formula_and_the_least(gguf_model: Path) -> None:
    proc = vramctl(str(gguf_model), "--context", "100")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    kv = 2 * 2 * 2 * 8 * 100 * 2
    assert f"{GGUF_WEIGHTS:,}" in text and f"{kv:,}" in text
    assert (
        f"KV cache = 2 × 2 layers × 2 KV heads × 8 head_dim × 100 tokens × 2 bytes (f16) × "
        f"1 parallel sequence = {kv} bytes"
    ) in text
    assert "context 100 (--context)" in text
    assert f"at least: {GGUF_WEIGHTS + kv:,} bytes" in text
    for term in ("cuda_context", "activations", "cuda_graphs", "engine_overhead"):
        row = next(line for line in text.splitlines() if f" {term} " in line)
        assert "unknown" in row and " 0 " not in row
    assert "vramctl calibrate" in text


def test_the_json_answer_carries_the_figures_used(safetensors_model: Path) -> None:
    proc = vramctl(
        str(safetensors_model),
        "--json",
        "--kv-dtype",
        "q8_0",
        "--parallel",
        "2",
        "--engine",
        "vllm",
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    # as vLLM lays it out: 2 sequences of 512 tokens (whole 16-token blocks) and its
    # null block, one block on each of the 3 layers
    kv = 2 * 2 * 16 * 34 // 32 * 3 * (512 * 2 + 16)
    assert data["weights_bytes"] == 32
    assert data["kv_cache_bytes"] == kv
    arch = data["architecture"]
    assert {k: arch[k] for k in ("layers", "kv_heads", "head_dim", "context", "parallel")} == {
        "layers": 3,
        "kv_heads": 2,
        "head_dim": 16,
        "context": 512,
        "parallel": 2,
    }
    assert arch["kv_dtype"] == "q8_0"
    assert data["formula"].endswith(f"= {kv} bytes")
    assert data["engine"] == "vllm"
    unknown = {u["term"]: u["reason"] for u in data["unknown"]}
    assert set(unknown) == {"cuda_context", "activations", "cuda_graphs", "engine_overhead"}
    assert all("vLLM" in reason for reason in unknown.values())


def test_an_unknown_cache_is_null_and_named(tmp_path: Path) -> None:
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    hf_config(tmp_path, kv_lora_rank=512)
    data = json.loads(vramctl(str(tmp_path), "--json").stdout)
    assert data["kv_cache_bytes"] is None and data["at_least_bytes"] is None
    assert data["unknown"][0]["term"] == "kv_cache"
    text = vramctl(str(tmp_path)).stdout
    assert "MLA (kv_lora_rank 512)" in text and "the KV cache (unknown)" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nothere.gguf"], "nothere.gguf: no such file or folder"),
        (["notes.txt"], "notes.txt: not a GGUF file"),
        (["cut.safetensors"], "cut.safetensors: truncated safetensors header"),
    ],
    ids=["missing", "other-format", "truncated"],
)
def test_bad_input_exits_2_with_a_located_error(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "cut.safetensors").write_bytes(b"\x10\x00")
    proc = vramctl(*(str(tmp_path / a) for a in args))
    assert proc.returncode == 2
    assert f"error: {tmp_path / message.split(':', maxsplit=1)[0]}:" in proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("keep", "says"),
    [
        (-1, "truncated at byte {n} of {size} (its tensor table puts the end of its data"),
        (1000, "truncated at byte {n} of {size} (its tensor table puts the end of its data"),
        (300, "truncated at byte {n} of at least 308 (its tensor table goes on past the end"),
        (100, "truncated at byte {n} of at least 102 (its metadata goes on past the end"),
        (20, "truncated at byte {n} of at least 24 (its header goes on past the end"),
    ],
    ids=["last-byte", "data", "tensor-table", "metadata", "header"],
)
def test_a_truncated_gguf_file_says_where_it_ends_against_its_header(
    gguf_model: Path, keep: int, says: str
) -> None:
    """A GGUF file cut short (a download that stopped): its size against the size its
    header and tensor table give, never the reader's numpy error."""
    whole = gguf_model.read_bytes()
    cut = gguf_model.with_name("cut.gguf")
    cut.write_bytes(whole[:keep])
    n = len(whole[:keep])
    proc = vramctl(str(cut))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    expected = f"error: {cut}: " + says.format(n=n, size=len(whole))
    assert expected in proc.stderr, proc.stderr
    assert "reshape" not in proc.stderr and "dtype" not in proc.stderr, proc.stderr


def test_a_config_missing_a_key_exits_2_naming_it(safetensors_model: Path) -> None:
    hf_config(safetensors_model, num_hidden_layers=None)
    proc = vramctl(str(safetensors_model))
    assert proc.returncode == 2
    assert f"{safetensors_model / 'config.json'}: no num_hidden_layers" in proc.stderr


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--kv-dtype", "q9"], "one of f16, bf16, f32, fp8, fp8_e4m3, fp8_e5m2, q8_0, q5_1"),
        (["--engine", "nosuch"], "known: vllm, sglang, llamacpp"),
        (["--context", "0"], "--context"),
    ],
    ids=["kv-dtype", "engine", "context"],
)
def test_bad_options_are_usage_errors(gguf_model: Path, option: list[str], message: str) -> None:
    proc = vramctl(str(gguf_model), *option)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_estimate_help_loads_no_gguf_numpy_or_core() -> None:
    loaded = _tops(_loaded("estimate", "--help"))
    assert not loaded & {"gguf", "numpy", "safetensors", "statemachine", "rich"}, loaded


def test_an_estimate_loads_no_server_docker_or_http_library(gguf_model: Path) -> None:
    loaded = _tops(_loaded("estimate", str(gguf_model)))
    assert "gguf" in loaded
    assert not loaded & SERVER_DOCKER_HTTP
