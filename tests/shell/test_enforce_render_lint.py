"""``vramctl render`` and ``lint --compose`` with the limit flags: manifests whose serves
declare ``[serve.model]``, a GGUF file written by ``gguf.GGUFWriter`` (an F16 layer and a
Q8_0 layer), and compose files, all in tmp_path.

The model: 2 layers, 2 KV heads × 8 head_dim at f16 (2 × 2 × 2 × 8 × 2 = 128 bytes of KV
per token), 65536 tokens of context; layer 0 holds 2097152 bytes, layer 1 1114112
(1024 rows of 32 Q8_0 blocks of 34 bytes), the tensors of no layer 1048576: 4259840 bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cli import bare_cli as cli
from support.files import compose, manifest
from support.model_files import LAYER0, LAYER1, REST, WEIGHTS, write_gguf

from controller.adapters.model_files import read_model
from controller.service.model_estimates import limit_inputs
from controller.tools.compose_lint import lint_compose, render_serve
from statemachine.flags.fraction import FindingKind
from statemachine.flags.model_limits import ModelInput

REPO = Path(__file__).resolve().parents[2]
MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 97887

[[gpu_roles]]
id = "s"
vram_mib = 100

[[serve]]
name = "chat"
container = "vllm-chat"
engine = "vllm"
gpu_role = "s"
vram_mib = 5

[serve.model]
path = "tiny.gguf"

[[serve]]
name = "big"
container = "vllm-big"
engine = "vllm"
gpu_role = "s"
vram_mib = 4

[serve.model]
path = "tiny.gguf"

[[serve]]
name = "gguf"
container = "llamacpp-gguf"
engine = "llamacpp"
gpu_role = "s"
vram_mib = 3

[serve.model]
path = "tiny.gguf"
context = 4096

[[serve]]
name = "onnx"
container = "onnx-genai"
engine = "onnx-genai"
gpu_role = "a"
vram_mib = 3200
engine_overhead_mib = 200

[[serve]]
name = "moe"
container = "strata-moe"
engine = "strata"
gpu_role = "a"
vram_mib = 20000
elastic = { url = "http://127.0.0.1:30007", floor_mib = 4096, segment_mib = 1024 }

[[serve]]
name = "plain"
container = "vllm-plain"
engine = "vllm"
gpu_role = "a"
vram_mib = 3200
"""

GOOD = """
chat:
  image: vllm/vllm-openai:v0.11
  container_name: vllm-chat
  command: vllm serve m --gpu-memory-utilization 0.0500 --max-model-len 7664
gguf:
  image: ghcr.io/ggml-org/llama.cpp:server-cuda
  container_name: llamacpp-gguf
  command: llama-server -m /m/tiny.gguf -ngl 2 -np 1 -c 4096
onnx:
  image: ghcr.io/acme/onnx-genai:1
  container_name: onnx-genai
  command: onnx-genai serve --model /m --vram-limit 3145728000
moe:
  image: ghcr.io/acme/strata:1
  container_name: strata-moe
  command: ["--model", "/m", "--vram-elastic"]
plain:
  image: vllm/vllm-openai:v0.11
  container_name: vllm-plain
  command: vllm serve m --gpu-memory-utilization 0.0326
"""


@pytest.fixture
def mset(tmp_path: Path) -> Any:
    write_gguf(tmp_path / "tiny.gguf")
    return manifest(tmp_path, MANIFEST)


def test_the_gguf_reader_gives_each_layers_bytes_and_the_rest(tmp_path: Path) -> None:
    weights = read_model(write_gguf(tmp_path / "tiny.gguf")).weights
    assert weights.layer_bytes == (LAYER0, LAYER1)
    assert (weights.bytes, weights.non_layer_bytes) == (WEIGHTS, REST)


def test_the_serves_models_are_read_only_where_declared(tmp_path: Path, mset: Any) -> None:
    models = limit_inputs(mset)
    assert sorted(models) == ["big", "chat", "gguf"]
    chat = models["chat"]
    assert isinstance(chat, ModelInput) and chat.context is None  # the longest that fits
    (tmp_path / "tiny.gguf").unlink()
    assert "no such file" in str(limit_inputs(mset, ["chat"])["chat"])


def test_render_gives_vllm_its_context_beside_its_fraction(mset: Any) -> None:
    answer = render_serve(mset, "chat", models=limit_inputs(mset))
    # 5 MiB − 4259840 bytes of weights = 983040 bytes, 480 vLLM blocks of 16 tokens of
    # 128 bytes; one is the null block the pool keeps back: 479 × 16 = 7664 tokens
    assert answer.argv[2:] == ("--max-model-len", "7664")
    assert answer.argv[0] == "--gpu-memory-utilization"
    body = answer.to_json()
    assert body["limits"][0]["value"] == 7664
    assert "left for the KV cache 5242880 − 4259840 = 983040 bytes" in body["limits"][0]["terms"]


def test_render_refuses_weights_larger_than_the_reservation(mset: Any) -> None:
    answer = render_serve(mset, "big", models=limit_inputs(mset))
    (refused,) = answer.refused
    assert refused.problem is not None and "by 65536 bytes" in refused.problem


def test_render_splits_llamacpps_layers_and_onnx_genai_gets_bytes(mset: Any) -> None:
    models = limit_inputs(mset)
    gguf = render_serve(mset, "gguf", models=models)
    # 1048576 of no layer + the last layer's 1114112 + its 262144 of KV ≤ 3 MiB; not both:
    # the output layer (counted first) and the last layer
    assert gguf.argv == ("--n-gpu-layers", "2", "--ctx-size", "4096", "--parallel", "1")
    assert render_serve(mset, "onnx", models=models).argv == ("--vram-limit", "3145728000")
    moe = render_serve(mset, "moe", models=models)
    assert moe.argv == ("--vram-elastic", "--vram-segment-mib", "1024")
    assert moe.elastic is not None
    assert '"vram_segment_mib": 1024 (the engine\'s default, 512' in moe.elastic.explanation


def test_a_serve_without_a_model_renders_as_before(mset: Any) -> None:
    answer = render_serve(mset, "plain", models=limit_inputs(mset))
    assert answer.argv == ("--gpu-memory-utilization", "0.0326")
    assert "limits" not in answer.to_json() and "elastic" not in answer.to_json()


def test_lint_passes_the_flags_the_reservations_render(tmp_path: Path, mset: Any) -> None:
    report = lint_compose(mset, [compose(tmp_path, GOOD)], environ={}, models=limit_inputs(mset))
    assert report.errors == (), [f.message for f in report.errors]
    checked = {c.serve: c for c in report.checked}
    assert [(x.flag.name, found) for x, found in checked["gguf"].limits] == [
        ("--n-gpu-layers", "2"),
        ("--ctx-size", "4096"),
        ("--parallel", "1"),
    ]
    assert checked["plain"].limits == () and "limits" not in checked["plain"].to_json()
    # held by their limit flags, not "by the ledger only"; the elastic engine has none
    unheld = {f.serve for f in report.notes if f.kind is FindingKind.NO_ENGINE_FLAG}
    assert unheld == {"moe"}


@pytest.mark.parametrize(
    ("old", "new", "kind", "serve", "words"),
    [
        ("--max-model-len 7664", "--max-model-len 8192", "LIMIT_TOO_LARGE", "chat", "8192"),
        (" --max-model-len 7664", "", "MISSING_LIMIT", "chat", "add --max-model-len 7664"),
        ("-ngl 2 ", "-ngl 99 ", "LIMIT_TOO_LARGE", "gguf", "one layer more: 4784128"),
        ("-c 4096", "-c 8192", "LIMIT_TOO_LARGE", "gguf", "--ctx-size 8192"),
        ("-ngl 2 ", "-ngl auto ", "SIZED_FROM_FREE", "gguf", "from the device when it starts"),
        ("-ngl 2 ", "", "MISSING_LIMIT", "gguf", "add --n-gpu-layers 2"),
        (
            "-ngl 2 ",
            "-ngl auto --fit off --fit-target ${VRAMCTL_FIT_TARGET_MIB} ",
            "SIZED_FROM_FREE",
            "gguf",
            "write --n-gpu-layers 2",
        ),
        ("-ngl 2 ", "-ngl auto -fitt 1024 ", "SIZED_FROM_FREE", "gguf", "--n-gpu-layers auto"),
        ("-np 1", "-np 4", "LIMIT_TOO_LARGE", "gguf", "--parallel 4 is more than the 1"),
        (" -c 4096", "", "MISSING_LIMIT", "gguf", "add --ctx-size 4096"),
        (" --vram-limit 3145728000", "", "MISSING_LIMIT", "onnx", "(3200 − 200) MiB × 1048576"),
        (
            " --vram-limit 3145728000",
            "\n  environment:\n    ONNX_GENAI_VRAM_LIMIT: '4000000000'",
            "LIMIT_TOO_LARGE",
            "onnx",
            "--vram-limit 4000000000 is more than the 3145728000",
        ),
        ("--vram-limit 3145728000", "--vram-limit 4e9", "BAD_VALUE", "onnx", "whole number"),
        (', "--vram-elastic"', "", "ELASTIC_OFF", "moe", "lacks --vram-elastic"),
    ],
)
def test_lint_reports_each_limit_with_its_terms(
    tmp_path: Path, mset: Any, old: str, new: str, kind: str, serve: str, words: str
) -> None:
    assert old in GOOD
    path = compose(tmp_path, GOOD.replace(old, new))
    report = lint_compose(mset, [path], environ={}, models=limit_inputs(mset))
    found = [f for f in report.errors if f.serve == serve and f.kind is FindingKind[kind]]
    assert found, [(f.kind, f.serve, f.message) for f in report.errors]
    assert words in found[0].message
    checked = {c.serve: c for c in report.checked}
    assert checked[serve].ok is False


@pytest.mark.parametrize(
    "layers",
    [
        "--fit-target ${VRAMCTL_FIT_TARGET_MIB} ",
        "-ngl auto -fitt $VRAMCTL_FIT_TARGET_MIB ",
        "-ngl -1 --fit on --fit-target=${VRAMCTL_FIT_TARGET_MIB} ",
    ],
)
def test_lint_accepts_llamacpps_own_fit_to_the_starts_target(
    tmp_path: Path, mset: Any, layers: str
) -> None:
    """llama.cpp's --fit sizes what the command leaves unset (its layers) to the free
    memory less --fit-target: with the target each start sets (free less the
    reservation), that is the reservation."""
    path = compose(tmp_path, GOOD.replace("-ngl 2 ", layers))
    report = lint_compose(mset, [path], environ={}, models=limit_inputs(mset))
    assert report.errors == (), [f.message for f in report.errors]


def test_lint_reports_a_model_that_cannot_load(tmp_path: Path, mset: Any) -> None:
    text = GOOD + (
        "big:\n  image: vllm/vllm-openai:v0.11\n  container_name: vllm-big\n"
        "  command: vllm serve m --gpu-memory-utilization 0.0400 --max-model-len 10\n"
    )
    report = lint_compose(mset, [compose(tmp_path, text)], environ={}, models=limit_inputs(mset))
    (fit,) = [f for f in report.errors if f.kind is FindingKind.DOES_NOT_FIT]
    assert fit.serve == "big" and "4194304 bytes" in fit.message and "4259840" in fit.message


#: the llama.cpp serve's KV cache at f32: 2 × 2 layers × 2 KV heads × 8 × 4 bytes = 256 bytes
#: a token, 524288 bytes a layer at 4096 tokens: still only the last layer fits 3 MiB
F32_MANIFEST = MANIFEST.replace(
    'context = 4096\n\n[[serve]]\nname = "onnx"',
    'context = 4096\nkv_dtype = "f32"\n\n[[serve]]\nname = "onnx"',
)
F32_FLAGS = ("--cache-type-k", "f32", "--cache-type-v", "f32")
SIZED = "than the one the limits were sized for"


def test_render_gives_llamacpp_the_cache_type_its_limits_were_computed_at(
    tmp_path: Path,
) -> None:
    write_gguf(tmp_path / "tiny.gguf")
    mset = manifest(tmp_path, F32_MANIFEST)
    answer = render_serve(mset, "gguf", models=limit_inputs(mset))
    assert answer.argv == (
        "--n-gpu-layers",
        "2",
        "--ctx-size",
        "4096",
        "--parallel",
        "1",
        *F32_FLAGS,
    )
    assert "KV cache of one layer 2 × 2 KV heads × 8 head_dim" in (answer.limits[0].explanation)
    assert answer.to_json()["cache_types"] == {
        "argv": list(F32_FLAGS),
        "kv_dtype": "f32",
        "default": "f16",
        "explanation": "[serve.model] kv_dtype f32: 4 bytes (f32) a cache element, the size "
        "the limits' KV cache was computed at; without these flags the engine stores f16",
    }


def test_render_writes_no_cache_type_at_llamacpps_default(mset: Any) -> None:
    answer = render_serve(mset, "gguf", models=limit_inputs(mset))
    assert answer.cache_types is None and "cache_types" not in answer.to_json()
    assert not {"--cache-type-k", "--cache-type-v"} & set(answer.argv)


def test_lint_passes_a_llamacpp_command_storing_the_manifests_cache_type(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.gguf")
    mset = manifest(tmp_path, F32_MANIFEST)
    for written in ("-ctk f32 -ctv f32", "--cache-type-k=f32 --cache-type-v f32"):
        path = compose(tmp_path, GOOD.replace("-c 4096", f"-c 4096 {written}"))
        report = lint_compose(mset, [path], environ={}, models=limit_inputs(mset))
        assert report.errors == (), [f.message for f in report.errors]


def test_lint_reads_the_cache_type_from_llamacpps_environment(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.gguf")
    mset = manifest(tmp_path, F32_MANIFEST)
    env = "\n  environment:\n    LLAMA_ARG_CACHE_TYPE_K: f32\n    LLAMA_ARG_CACHE_TYPE_V: f32"
    path = compose(tmp_path, GOOD.replace("-c 4096", "-c 4096" + env))
    report = lint_compose(mset, [path], environ={}, models=limit_inputs(mset))
    assert report.errors == (), [f.message for f in report.errors]


def test_lint_reports_a_llamacpp_command_without_the_manifests_cache_type(
    tmp_path: Path,
) -> None:
    write_gguf(tmp_path / "tiny.gguf")
    mset = manifest(tmp_path, F32_MANIFEST)
    report = lint_compose(mset, [compose(tmp_path, GOOD)], environ={}, models=limit_inputs(mset))
    (found,) = [f for f in report.errors if f.kind is FindingKind.CACHE_TYPE]
    assert found.serve == "gguf" and found.service == "gguf"
    assert found.message == (
        "the command stores its KV cache as no --cache-type-k (the default f16), no "
        "--cache-type-v (the default f16) but [serve.model] kv_dtype is f32: the KV cache "
        f"would be 2× smaller {SIZED} (2 bytes (f16) an element against 4 bytes (f32)); "
        "write --cache-type-k f32 --cache-type-v f32"
    )
    facts = found.to_json()
    assert (facts["kv_dtype"], facts["default"]) == ("f32", "f16")
    assert facts["found"] == {"--cache-type-k": None, "--cache-type-v": None}
    assert {c.serve: c.ok for c in report.checked}["gguf"] is False


Q8 = "34/32 bytes (q8_0: ggml blocks of 32 elements in 34 bytes)"


@pytest.mark.parametrize(
    ("written", "consequence"),
    [
        (
            "-ctk q4_0 -ctv q4_0",
            f"the KV cache would be 3.56× (32/9) smaller {SIZED} (18/32 bytes (q4_0: ggml "
            "blocks of 32 elements in 18 bytes) an element against 2 bytes (f16))",
        ),
        (
            "--cache-type-k f32 --cache-type-v=f32",
            f"the KV cache would be 2× larger {SIZED} (4 bytes (f32) an element against 2 "
            "bytes (f16))",
        ),
        (
            "-ctk bf16 -ctv bf16",
            "the KV cache would be the same size as the one the limits were sized for (2 "
            "bytes (bf16) an element against 2 bytes (f16))",
        ),
        (
            "-ctk q8_0",
            "its keys would be 1.88× (32/17) smaller than those the limits were sized for "
            f"({Q8} an element against 2 bytes (f16))",
        ),
        (
            "-ctk q5_1 -ctv q5_1",
            "the KV cache would be 2.67× (8/3) smaller than the one the limits were sized "
            "for (24/32 bytes (q5_1: ggml blocks of 32 elements in 24 bytes) an element "
            "against 2 bytes (f16))",
        ),
        (
            "-ctk tq2_0 -ctv tq2_0",
            "the KV cache would be of a size unknown here, not the one the limits were sized "
            "for (tq2_0 is not one of f16, bf16, f32, fp8, fp8_e4m3, fp8_e5m2, q8_0, q5_1, "
            "q5_0, q4_1, q4_0, iq4_nl)",
        ),
    ],
)
def test_lint_says_how_much_larger_or_smaller_another_cache_type_is(
    tmp_path: Path, mset: Any, written: str, consequence: str
) -> None:
    path = compose(tmp_path, GOOD.replace("-c 4096", f"-c 4096 {written}"))
    report = lint_compose(mset, [path], environ={}, models=limit_inputs(mset))
    (found,) = report.errors
    assert (found.kind, found.serve, found.is_error) == (FindingKind.CACHE_TYPE, "gguf", True)
    assert found.message.split(": ", 1)[1] == (
        f"{consequence}; write --cache-type-k f16 --cache-type-v f16"
    )


def test_the_render_command_prints_the_flags_and_their_arithmetic(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.gguf")
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    r = cli("render", "chat", "-m", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "--gpu-memory-utilization 0.0500 --max-model-len 7664"
    assert "--max-model-len 7664: reservation 5 MiB × 1048576 = 5242880 bytes" in r.stderr
    assert "× 1 parallel sequence + 1 × 16 tokens × 2 layers the pool keeps back" in r.stderr
    assert "one token more: 985088 bytes > 983040" in r.stderr  # a block more
    gguf = cli("render", "gguf", "-m", str(path))
    assert gguf.stdout.strip() == "--n-gpu-layers 2 --ctx-size 4096 --parallel 1", gguf.stderr
    assert (
        "--n-gpu-layers 2: llama.cpp counts the output layer first, then the last 1 layers; "
        "the other 1 run on the CPU"
    ) in gguf.stderr
    big = cli("render", "big", "-m", str(path))
    assert big.returncode == 1 and "cannot load in its reservation" in big.stderr
    onnx = cli("render", "onnx", "-m", str(path), "--json")
    assert json.loads(onnx.stdout)["limits"][0]["value"] == 3145728000
    (tmp_path / "tiny.gguf").unlink()
    gone = cli("render", "chat", "-m", str(path))
    assert gone.returncode == 0 and gone.stdout.strip() == "--gpu-memory-utilization 0.0500"
    assert "--max-model-len unknown: the model's files cannot be read" in gone.stderr


def test_the_render_and_lint_commands_carry_the_cache_type(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.gguf")
    path = tmp_path / "serves.toml"
    path.write_text(F32_MANIFEST)
    r = cli("render", "gguf", "-m", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "--n-gpu-layers 2 --ctx-size 4096 --parallel 1 " + " ".join(
        F32_FLAGS
    )
    assert "--cache-type-k f32 --cache-type-v f32: [serve.model] kv_dtype f32: 4 bytes" in (
        r.stderr
    )
    lint = cli("lint", "-m", str(path), "--compose", str(compose(tmp_path, GOOD)))
    assert lint.returncode == 1
    assert "error: serve gguf, service gguf: cache-type-disagrees: the command stores" in (
        lint.stdout
    )


def test_the_lint_command_fails_on_a_context_too_large(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.gguf")
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST)
    ok = cli("lint", "-m", str(path), "--compose", str(compose(tmp_path, GOOD)))
    assert ok.returncode == 0, ok.stdout
    assert "--max-model-len 7664; the reservation renders 7664" in ok.stdout
    bad = GOOD.replace("-c 4096", "-c 5000")
    r = cli("lint", "-m", str(path), "--compose", str(compose(tmp_path, bad, "bad.yml")))
    assert r.returncode == 1 and "limit-too-large" in r.stdout and "--ctx-size 5000" in r.stdout


SAFETENSORS_MANIFEST = """
[[gpu_roles]]
id = "s"
vram_mib = 100

[[serve]]
name = "fast"
container = "sglang-fast"
engine = "sglang"
gpu_role = "s"
vram_mib = 3

[serve.model]
path = "hf"
parallel = 2

[[serve]]
name = "cpp"
container = "llamacpp-cpp"
engine = "llamacpp"
gpu_role = "s"
vram_mib = 3

[serve.model]
path = "hf"
"""


def test_a_safetensors_model_gives_sglang_its_context(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"w": np.zeros((1024, 1024), dtype=np.float16)}, str(folder / "m.safetensors"))
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 512,
        "max_position_embeddings": 32768,
    }
    (folder / "config.json").write_text(json.dumps(config))
    mset = manifest(tmp_path, SAFETENSORS_MANIFEST)
    models = limit_inputs(mset)
    fast = render_serve(mset, "fast", models=models)
    # SGLang's context bounds no memory: only its fraction of what is free at its start
    assert fast.argv == ("--mem-fraction-static", "${VRAMCTL_FRACTION_OF_FREE}")
    assert fast.limits == ()
    cpp = render_serve(mset, "cpp", models=models)
    layers = cpp.limits[0]
    assert layers.value is None and not layers.refused  # no blk.N tensors: unknown
    assert "tensor bytes for 0 layers of 4" in str(layers.problem)
