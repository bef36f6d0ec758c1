"""The KV cache types each engine stores (statemachine/engines, statemachine/flags/model_limits.py,
controller/manifest/load.py): a ``kv_dtype`` the serve's engine cannot store is a located
error where the manifest is read; a type that is not the engine's default is rendered as
the engine's own flag and word; lint reads the engine's words (``auto``) back."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.manifest import ManifestError, load_manifest
from statemachine import engines
from statemachine.flags.fraction import FindingKind
from statemachine.flags.model_limits import check_cache_types, render_cache_types
from statemachine.sizing.needs import KV_DTYPES

MANIFEST = """
[gpu.a]
capacity_mib = 24564

[[serve]]
name = "chat"
container = "chat-1"
engine = "{engine}"
gpu_role = "a"
vram_mib = 20000
[serve.model]
path = "m.gguf"
kv_dtype = "{kv_dtype}"
"""


def load(tmp_path: Path, engine: str, kv_dtype: str) -> object:
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST.format(engine=engine, kv_dtype=kv_dtype))
    return load_manifest(path)


@pytest.mark.parametrize(
    ("engine", "kv_dtype"),
    [
        ("vllm", "q8_0"),
        ("vllm", "q4_0"),
        ("sglang", "fp8"),
        ("sglang", "q8_0"),
        ("llamacpp", "fp8"),
    ],
)
def test_a_type_the_engine_cannot_store_is_a_located_error(
    tmp_path: Path, engine: str, kv_dtype: str
) -> None:
    with pytest.raises(ManifestError) as got:
        load(tmp_path, engine, kv_dtype)
    text = str(got.value)
    assert 'serve "chat" (#1): model.kv_dtype: must be one' in text
    assert f"got {kv_dtype!r}" in text


@pytest.mark.parametrize(
    ("engine", "kv_dtype"),
    [
        ("vllm", "fp8"),
        ("vllm", "bf16"),
        ("sglang", "fp8_e4m3"),
        ("llamacpp", "q5_1"),
        ("onnx-genai", "q8_0"),
    ],
)
def test_a_type_the_engine_stores_loads(tmp_path: Path, engine: str, kv_dtype: str) -> None:
    load(tmp_path, engine, kv_dtype)  # onnx-genai declares no cache types: nothing to check


def test_every_stored_type_is_one_the_sizing_knows() -> None:
    for engine in engines.engines(lambda e: e.cache_types is not None):
        assert engine.cache_types is not None
        assert set(engine.cache_types.stores) <= set(KV_DTYPES), engine.name


def test_vllm_renders_its_own_flag_and_word_and_none_for_its_default() -> None:
    types = engines.get("vllm").cache_types
    assert types is not None
    fp8 = render_cache_types(types, "fp8_e5m2")
    assert fp8 is not None and fp8.argv == ("--kv-cache-dtype", "fp8_e5m2")
    assert "1 bytes (fp8_e5m2: an 8-bit float) a cache element" in fp8.explanation
    assert render_cache_types(types, "bf16") is None
    assert render_cache_types(types, "f16") is None  # auto: the model's own 16-bit type


def test_lint_reads_auto_as_the_default_and_names_a_type_that_is_not_the_serves() -> None:
    types = engines.get("vllm").cache_types
    assert types is not None
    for argv in ([], ["--kv-cache-dtype", "auto"], ["--kv-cache-dtype=bfloat16"]):
        assert check_cache_types(types, "bf16", argv, serve="s") is None, argv
    assert check_cache_types(types, "f16", ["--kv-cache-dtype", "AUTO"], serve="s") is None
    assert check_cache_types(types, "fp8", ["--kv-cache-dtype", "fp8"], serve="s") is None
    wrong = check_cache_types(types, "bf16", ["--kv-cache-dtype", "fp8"], serve="s")
    assert wrong is not None and wrong.kind is FindingKind.CACHE_TYPE and wrong.is_error
    assert "2× smaller than the one the limits were sized for" in wrong.message
    assert "write --kv-cache-dtype auto" in wrong.message
    missing = check_cache_types(types, "fp8", [], serve="s")
    assert missing is not None and "write --kv-cache-dtype fp8" in missing.message
    assert "2× larger" in missing.message
