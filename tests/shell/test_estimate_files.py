"""Reading a model's files (controller/adapters/model_files/) on real files written by the
formats' own writers: ``gguf.GGUFWriter`` (quantized Q8_0 and Q4_0 tensors beside F16 and
F32, a split model) and ``safetensors.numpy.save_file`` with a ``config.json`` (one file,
a sharded folder with its index). The weights must be the tensors' data sizes exactly,
and every bad input a located error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFWriter
from safetensors.numpy import save_file
from support.model_files import GGUF_WEIGHTS, hf_config, write_tiny_gguf

from controller.adapters.model_files import ModelFileError, read_model
from statemachine.sizing.needs import kv_cache


def test_a_gguf_files_weights_are_its_tensors_data_sizes(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    found = read_model(path)
    assert found.format == "gguf"
    assert found.weights.bytes == GGUF_WEIGHTS
    assert found.weights.tensors == 4
    assert found.weights.dtype == "F16, Q8_0, Q4_0, F32"
    arch = found.architecture
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.context_length) == (2, 2, 8, 256)
    # 2 × 2 layers × 2 KV heads × 8 head_dim × 256 tokens × 2 bytes
    assert kv_cache(arch, context=None).bytes == 2 * 2 * 2 * 8 * 256 * 2 == 32768


def test_a_gguf_files_key_and_value_lengths_are_taken_when_present(tmp_path: Path) -> None:
    path = tmp_path / "kv.gguf"
    write_tiny_gguf(path, {"llama.attention.key_length": 16, "llama.attention.value_length": 12})
    arch = read_model(path).architecture
    assert (arch.key_length, arch.value_length, arch.head_dim) == (16, 12, None)
    assert kv_cache(arch, context=10).bytes == 2 * 2 * (16 + 12) * 10 * 2


def test_a_split_gguf_model_is_summed_over_its_files(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", split_max_tensors=2)
    first = tmp_path / "tiny-00001-of-00002.gguf"
    assert first.is_file()
    found = read_model(first)
    assert found.weights.bytes == GGUF_WEIGHTS
    assert len(found.weights.files) == 2
    assert found.architecture.layers == 2


def test_a_split_gguf_model_missing_a_file_names_it(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", split_max_tensors=2)
    (tmp_path / "tiny-00002-of-00002.gguf").unlink()
    with pytest.raises(ModelFileError, match=r"missing: tiny-00002-of-00002\.gguf"):
        read_model(tmp_path / "tiny-00001-of-00002.gguf")


def test_sliding_window_layers_named_by_the_gguf_pattern_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "swa.gguf"
    write_tiny_gguf(
        path,
        {
            "llama.attention.sliding_window": 64,
            "llama.attention.sliding_window_pattern": [True, False],
        },
    )
    arch = read_model(path).architecture
    assert (arch.sliding_window, arch.sliding_layers) == (64, 1)
    assert kv_cache(arch, context=256).bytes == 2 * 2 * 8 * 2 * (256 + 64)


def test_kv_heads_given_per_layer_count_when_all_layers_agree(tmp_path: Path) -> None:
    path = tmp_path / "per-layer.gguf"
    write_tiny_gguf(path, kv_heads=[2, 2])
    assert read_model(path).architecture.kv_heads == 2


def test_kv_heads_that_differ_by_layer_make_the_cache_unknown(tmp_path: Path) -> None:
    path = tmp_path / "hybrid.gguf"
    write_tiny_gguf(path, kv_heads=[2, 0])
    arch = read_model(path).architecture
    assert arch.unsupported == (
        "the attention heads differ by layer (llama.attention.head_count_kv: [0, 2])"
    )
    assert kv_cache(arch, context=None).bytes is None


def test_recurrent_gguf_layers_make_the_cache_unknown(tmp_path: Path) -> None:
    path = tmp_path / "ssm.gguf"
    write_tiny_gguf(path, {"llama.ssm.state_size": 16})
    term = kv_cache(read_model(path).architecture, context=None)
    assert term.bytes is None and term.reason is not None and "llama.ssm.*" in term.reason


def test_a_gguf_file_without_a_figure_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bare.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("w", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match=r"bare.gguf: no metadata key llama.block_count"):
        read_model(path)


def test_a_truncated_gguf_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    write_tiny_gguf(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1000])
    cut = rf"cut.gguf: truncated at byte {len(whole) - 1000} of {len(whole)} "
    with pytest.raises(ModelFileError, match=cut):
        read_model(path)


def test_a_gguf_file_long_enough_but_unreadable_keeps_the_readers_words(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path)
    data = bytearray(path.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")  # a version gguf does not read
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"bad.gguf: not a readable GGUF file \("):
        read_model(path)


def _shard(n: int) -> dict[str, np.ndarray[Any, Any]]:
    return {
        f"layers.{n}.w": np.zeros((16, 8), dtype=np.float16),  # 256 bytes
        f"layers.{n}.b": np.zeros(10, dtype=np.float32),  # 40 bytes
    }


def test_one_safetensors_file_and_its_config(tmp_path: Path) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"), metadata={"format": "np"})
    hf_config(tmp_path)
    found = read_model(tmp_path / "model.safetensors")
    assert found.format == "safetensors"
    assert (found.weights.bytes, found.weights.tensors) == (296, 2)
    assert found.weights.dtype == "F16, F32 (config torch_dtype bfloat16)"
    arch = found.architecture
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.context_length) == (3, 2, 16, 512)
    assert kv_cache(arch, context=None).bytes == 2 * 3 * 2 * 16 * 512 * 2


def test_a_sharded_folder_and_its_index_give_the_same_sum(tmp_path: Path) -> None:
    weight_map = {}
    for n in (1, 2):
        name = f"model-0000{n}-of-00002.safetensors"
        save_file(_shard(n), str(tmp_path / name))
        weight_map.update(dict.fromkeys(_shard(n), name))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 592}, "weight_map": weight_map}))
    hf_config(tmp_path, head_dim=32)
    by_folder, by_index = read_model(tmp_path), read_model(index)
    assert by_folder.weights.bytes == by_index.weights.bytes == 592
    assert by_folder.weights.tensors == 4
    assert by_index.architecture.head_dim == 32


def test_a_folder_without_an_index_sums_every_safetensors_file(tmp_path: Path) -> None:
    for n in (1, 2, 3):
        save_file(_shard(n), str(tmp_path / f"part{n}.safetensors"))
    hf_config(tmp_path)
    assert read_model(tmp_path).weights.bytes == 3 * 296


def test_a_multimodal_config_is_read_from_its_text_config(tmp_path: Path) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    inner = {"num_hidden_layers": 5, "num_attention_heads": 2, "hidden_size": 16}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": inner}))
    arch = read_model(tmp_path).architecture
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.context_length) == (5, 2, 8, None)
    assert arch.source.endswith("config.json text_config")


def test_config_layer_types_name_the_sliding_window_layers(tmp_path: Path) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    types = ["sliding_attention", "sliding_attention", "full_attention"]
    hf_config(tmp_path, sliding_window=128, layer_types=types)
    arch = read_model(tmp_path).architecture
    assert (arch.sliding_window, arch.sliding_layers) == (128, 2)


def test_a_sliding_window_the_config_turns_off_is_ignored(tmp_path: Path) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    hf_config(tmp_path, sliding_window=128, use_sliding_window=False)
    assert read_model(tmp_path).architecture.sliding_window is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"kv_lora_rank": 512}, "MLA (kv_lora_rank 512)"),
        (
            {"layer_types": ["linear_attention", "full_attention", "full_attention"]},
            "linear_attention",
        ),
        ({"num_attention_heads": None, "ssm_state_size": 16}, "ssm_state_size"),
    ],
    ids=["mla", "linear-attention", "ssm"],
)
def test_layers_the_formula_does_not_describe_are_said(
    tmp_path: Path, changes: dict[str, Any], reason: str
) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    hf_config(tmp_path, **changes)
    arch = read_model(tmp_path).architecture
    assert arch.unsupported is not None and reason in arch.unsupported
    assert kv_cache(arch, context=None).bytes is None


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_attention_heads"])
def test_a_config_missing_a_key_names_the_key_and_the_file(tmp_path: Path, key: str) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    hf_config(tmp_path, **{key: None})
    with pytest.raises(ModelFileError, match=rf"config.json: no {key} \(needed"):
        read_model(tmp_path)


def test_a_config_without_head_dim_nor_hidden_size_says_so(tmp_path: Path) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    hf_config(tmp_path, hidden_size=None)
    with pytest.raises(ModelFileError, match="no head_dim nor hidden_size"):
        read_model(tmp_path)


def test_a_figure_that_is_not_a_positive_integer_is_named(tmp_path: Path) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    hf_config(tmp_path, num_key_value_heads="two")
    with pytest.raises(ModelFileError, match="num_key_value_heads must be a positive integer"):
        read_model(tmp_path)


def test_no_config_beside_the_weights_is_an_error(tmp_path: Path) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelFileError, match=r"config.json: no config.json beside the model"):
        read_model(tmp_path / "model.safetensors")


@pytest.mark.parametrize("keep", [4, 20, 200])
def test_a_truncated_safetensors_file_is_refused(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_shard(0), str(path))
    hf_config(tmp_path)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ModelFileError, match=r"model.safetensors: truncated"):
        read_model(path)


def test_a_missing_path_and_another_format_are_located_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"nothere\.gguf: no such file or folder"):
        read_model(tmp_path / "nothere.gguf")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(ModelFileError, match=r"notes\.txt: not a GGUF file"):
        read_model(other)
    with pytest.raises(ModelFileError, match=r"no \.safetensors files"):
        read_model(tmp_path)


def test_a_safetensors_header_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes((4).to_bytes(8, "little") + b"{{{{")
    with pytest.raises(ModelFileError, match="its header is not JSON"):
        read_model(path)


#: the published configs' figures (the keys their config.json files carry)
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 1024,  # 1024 / 16 heads = 64: head_dim is taken, not derived
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
}
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "per_token", "own_context"),
    [(QWEN3_0_6B, 114688, 40960), (LLAMA_3_1_8B, 131072, 131072)],
    ids=["qwen3-0.6b", "llama-3.1-8b"],
)
def test_published_configs_give_the_published_cache(
    tmp_path: Path, config: dict[str, Any], per_token: int, own_context: int
) -> None:
    save_file(_shard(0), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    arch = read_model(tmp_path).architecture
    assert (arch.head_dim, arch.sliding_window, arch.context_length) == (128, None, own_context)
    assert kv_cache(arch, context=1).bytes == per_token
    assert kv_cache(arch, context=None).bytes == per_token * own_context
