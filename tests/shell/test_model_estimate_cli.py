"""``[serve.model]`` through the command line: ``validate``'s error and hint, ``fit``,
``status`` and ``calibrate`` carrying the estimate (docs/sizing.md, "A serve's model").

The models are real files written by the formats' own writers (the helpers of
tests/shell/test_estimate_files.py); the footprints are samples recorded in a real journal.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from support.cli import cli_env, run_cli
from support.model_files import hf_config, write_tiny_gguf

from controller.store.journal import Journal, journal_path
from statemachine.sizing.footprint import Method, Sample

REPO = Path(__file__).resolve().parents[2]
#: 2 MiB of weights; 32 layers × 8 KV heads × head_dim 128 at 8192 tokens: 1 GiB of KV
KV_FORMULA = (
    "2 × 32 layers × 8 KV heads × 128 head_dim × 8192 tokens × 2 bytes (f16) × "
    "1 parallel sequence = 1073741824 bytes"
)


def vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env(250, PYTHONPATH=str(REPO)), cwd=REPO)


def safetensors_model(folder: Path) -> Path:
    """A one-file safetensors model of exactly 2 MiB of weights, an 8B-like cache."""
    folder.mkdir()
    save_file({"w": np.zeros((1024, 1024), dtype=np.float16)}, str(folder / "model.safetensors"))
    hf_config(
        folder,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_size=4096,
        max_position_embeddings=8192,
    )
    return folder


def serve(name: str, vram_mib: int, model: str, extra: str = "") -> str:
    return (
        f'\n[[serve]]\nname = "{name}"\ncontainer = "c-{name}"\ngpu_role = "g0"\n'
        f'vram_mib = {vram_mib}\n{extra}\n[serve.model]\npath = "{model}"\n'
    )


def manifest(tmp_path: Path, *serves: str) -> Path:
    safetensors_model(tmp_path / "st")
    write_tiny_gguf(tmp_path / "tiny.gguf")  # 6976 bytes of weights, 32768 bytes of KV
    path = tmp_path / "serves.toml"
    path.write_text('[[gpu_roles]]\nid = "g0"\nvram_mib = 24000\n' + "".join(serves))
    return path


def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "observed.json"
    path.write_text(json.dumps({"docker": "ok", "containers": {}, "gpus": None}))
    return path


def test_validate_refuses_a_reservation_below_weights_plus_kv_with_every_term(
    tmp_path: Path,
) -> None:
    path = manifest(tmp_path, serve("llm", 1000, "st"))
    r = vramctl("validate", "-m", str(path))
    assert r.returncode == 1
    line = (
        f'{path}: serve "llm": vram_mib: cannot load in its reservation: vram_mib 1000 < '
        f"weights 2 MiB + KV cache 1024 MiB ({KV_FORMULA}) = 1026 MiB, short by 26 MiB "
        "before the overheads (unknown)"
    )
    assert line in r.stderr, r.stderr
    data = json.loads(vramctl("validate", "-m", str(path), "--json").stdout)
    assert data["valid"] is False
    (err,) = data["errors"]
    assert (err["serve"], err["field"]) == ("llm", "vram_mib")
    check = data["models"]["llm"]["check"]
    assert check["verdict"] == "cannot_load" and check["shortfall_mib"] == 26
    assert (check["weights_bytes"], check["kv_cache_bytes"]) == (2 * 1024 * 1024, 1 << 30)
    assert (check["weights_mib"], check["kv_cache_mib"], check["known_mib"]) == (2, 1024, 1026)
    assert check["formula"] == KV_FORMULA and check["rest"] == "unknown"


def test_validate_accepts_a_reservation_within_the_bound(tmp_path: Path) -> None:
    # 1026 MiB known: up to 1026 + ceil(1026 / 4) + 2048 = 3331 MiB carries no hint
    path = manifest(tmp_path, serve("llm", 3331, "st"))
    r = vramctl("validate", "-m", str(path), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["valid"] is True and data["hints"] == []
    check = data["models"]["llm"]["check"]
    assert (check["verdict"], check["excess_mib"], check["bound_mib"]) == ("ok", 2305, 2305)
    assert "hint" not in r.stderr
    human = vramctl("validate", "-m", str(path))
    assert human.returncode == 0, human.stderr
    assert "llm: model: vram_mib 3331 ≥ weights 2 MiB + KV cache 1024 MiB" in human.stdout
    assert "2305 MiB left for the overheads (unknown; at most 2305 MiB" in human.stdout


def test_validate_hints_at_a_reservation_above_the_bound(tmp_path: Path) -> None:
    path = manifest(tmp_path, serve("llm", 3332, "st"), serve("tiny", 4000, "tiny.gguf"))
    with path.open("a") as fh:  # a serve with a model and no reservation: nothing to compare
        fh.write('\n[[serve]]\nname = "free"\ncontainer = "c-free"\n[serve.model]\npath = "st"\n')
    r = vramctl("validate", "-m", str(path), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    hints = data["hints"]
    assert len(hints) == 2
    assert hints[0].startswith(f'{path}: serve "llm": vram_mib: vram_mib 3332 exceeds')
    assert "by 2306 MiB, more than the 25 % + 2048 MiB = 2305 MiB" in hints[0]
    # the GGUF model: 6976 and 32768 bytes, each rounded up to 1 MiB
    assert "weights 1 MiB + KV cache 1 MiB" in hints[1] and "= 2 MiB by 3998 MiB" in hints[1]
    assert data["models"]["tiny"]["check"]["verdict"] == "oversized"
    assert "hint: " in r.stderr
    assert data["models"]["free"]["check"] is None
    assert data["models"]["free"]["estimate"]["known_mib"] == 1026
    human = vramctl("validate", "-m", str(path)).stdout
    assert "free: model: weights 2 + KV 1024 = 1026 MiB, the rest unknown; no reservation" in human


@pytest.mark.parametrize("bad", ["absent", "notamodel.bin"])
def test_validate_locates_a_model_path_that_cannot_be_read(tmp_path: Path, bad: str) -> None:
    path = manifest(tmp_path, serve("llm", 2000, bad))
    (tmp_path / "notamodel.bin").write_text("hello")
    r = vramctl("validate", "-m", str(path), "--json")
    assert r.returncode == 1
    (err,) = json.loads(r.stdout)["errors"]
    assert (err["serve"], err["field"]) == ("llm", "model.path")
    assert str(tmp_path / bad) in err["message"]
    assert f'serve "llm": model.path: {tmp_path / bad}' in r.stderr


def test_run_and_plan_do_not_refuse_a_model_not_there_yet(tmp_path: Path) -> None:
    # a model folder may be mounted after the controller starts: only validate checks
    path = manifest(tmp_path, serve("llm", 2000, "absent"), serve("short", 10, "st"))
    r = vramctl("plan", "-m", str(path), "--observed", str(snapshot(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert "model.path" not in r.stderr and "cannot load" not in r.stderr


def test_status_and_fit_show_the_estimate_beside_the_reservation(tmp_path: Path) -> None:
    path = manifest(tmp_path, serve("llm", 1500, "st"), serve("gone", 900, "absent"))
    observed = snapshot(tmp_path)
    state = tmp_path / "state"
    r = vramctl("status", "-m", str(path), "--observed", str(observed), "--json")
    r2 = vramctl("status", "-m", str(path), "--observed", str(observed), "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    models = json.loads(r.stdout)["models"]
    llm = models["llm"]
    assert (llm["vram_mib"], llm["measured_mib"]) == (1500, None)
    est = llm["estimate"]
    assert (est["weights_mib"], est["kv_cache_mib"], est["known_mib"]) == (2, 1024, 1026)
    assert est["formula"] == KV_FORMULA and est["context_used"] == 8192
    assert [u["term"] for u in est["unknown"]] == [
        "cuda_context", "activations", "cuda_graphs", "engine_overhead"
    ]  # fmt: skip
    assert models["gone"]["estimate"] is None and "absent" in models["gone"]["error"]
    assert models["gone"]["calibration"]["verdict"] == "unknown"
    assert r2.returncode == 0, r2.stderr
    table = r2.stdout.split("Model estimates (MiB, per GPU role)")[1]
    head = next(line for line in table.splitlines() if "┃ serve" in line)
    assert [c.strip() for c in head.split("┃")[1:-1]] == [
        "serve", "vram_mib", "weights", "KV", "weights + KV", "rest", "measured", "note"
    ]  # fmt: skip
    row = next(line for line in table.splitlines() if "│ llm" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "llm", "1500", "2", "1024", "1026", "unknown", "unknown", ""
    ]  # fmt: skip
    gone = next(line for line in table.splitlines() if "│ gone" in line)
    assert gone.split("│")[-2].strip() == f"{tmp_path / 'absent'}: no such file or folder"
    f = vramctl("fit", "llm", "-m", str(path), "--observed", str(observed), "--json")
    fit = json.loads(f.stdout)
    # nothing runs on g0's 24000 MiB: llm's 1500 fit, and fit says so by exiting 0
    assert (f.returncode, fit["fits"]) == (0, True), f.stderr
    assert fit["model"]["estimate"]["known_mib"] == 1026
    human = vramctl("fit", "llm", "-m", str(path), "--observed", str(observed))
    assert "model: weights 2 + KV 1024 = 1026 MiB known, the rest unknown" in human.stdout


def test_the_model_table_has_no_note_column_when_no_serve_has_a_note(tmp_path: Path) -> None:
    path = manifest(tmp_path, serve("llm", 1500, "st"))
    observed, state = snapshot(tmp_path), str(tmp_path / "state")
    r = vramctl("status", "-m", str(path), "--observed", str(observed), "--state-dir", state)
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("Model estimates (MiB, per GPU role)")[1]
    head = next(line for line in table.splitlines() if "┃ serve" in line)
    assert [c.strip() for c in head.split("┃")[1:-1]] == [
        "serve", "vram_mib", "weights", "KV", "weights + KV", "rest", "measured"
    ]  # fmt: skip
    row = next(line for line in table.splitlines() if "│ llm" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "llm", "1500", "2", "1024", "1026", "unknown", "unknown"
    ]  # fmt: skip


def record(journal: Journal, serve: str, declared: int, delta: int) -> None:
    at = float(len(journal.footprints()) + 1)
    sample = Sample(serve, "start", "g0", at, declared, Method.DELTA, True, delta_mib=delta)
    journal.add_footprint(serve, "start", "g0", at, sample.to_json())


def test_calibrate_says_which_term_is_off(tmp_path: Path) -> None:
    path = manifest(
        tmp_path,
        serve("short", 1000, "st"),  # the reservation: below weights + KV
        serve("over", 1500, "st"),  # measured above the reservation: the overheads
        serve("offload", 1500, "st"),  # measured below the weights
        serve("smallkv", 1500, "st"),  # measured between weights and weights + KV
        serve("good", 1500, "st"),
        serve("unmeasured", 1500, "st"),
    )
    state = tmp_path / "state"
    with Journal.open(journal_path(state)) as journal:
        for name, delta in (("over", 2000), ("offload", 1), ("smallkv", 600), ("good", 1300)):
            record(journal, name, 1500, delta)
        record(journal, "short", 1000, 1100)
    r = vramctl("calibrate", "-m", str(path), "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    by: dict[str, Any] = {s["serve"]: s for s in json.loads(r.stdout)["serves"]}
    verdicts = {n: s["model"]["calibration"]["verdict"] for n, s in by.items()}
    assert verdicts == {
        "short": "cannot_load",
        "over": "overheads_larger",
        "offload": "engine_offloads",
        "smallkv": "kv_smaller",
        "good": "consistent",
        "unmeasured": "unknown",
    }
    good = by["good"]["model"]["calibration"]
    assert (good["known_mib"], good["measured_mib"], good["overheads_mib"]) == (1026, 1300, 274)
    assert by["over"]["model"]["measured_mib"] == 2000
    assert by["good"]["proposed_mib"] is None  # the proposal's contract is unchanged
    human = vramctl("calibrate", "-m", str(path), "--state-dir", str(state))
    assert human.returncode == 0, human.stderr
    assert "estimate: weights 2 + KV 1024 = 1026 MiB (the rest unknown); measured 2000" in (
        human.stdout
    )
    assert "overheads_larger: measured 2000 MiB > vram_mib 1500 MiB (974 MiB above" in (
        human.stdout
    )
    assert "engine_offloads: measured 1 MiB < weights 2 MiB" in human.stdout
