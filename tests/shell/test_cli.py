"""The CLI contracts of docs/design.md §5, run as an operator runs them: the real console
script in a subprocess, real manifest files, snapshot files.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import cli_env, run_cli

FIX = Path(__file__).parents[1] / "fixtures"
ANVIL = FIX / "anvil-serving"
OBSERVED = FIX / "anvil-serving.observed.json"
SET = [
    "-m",
    str(ANVIL / "serves.toml"),
    "-m",
    str(ANVIL / "serves.voice.toml"),
    "-m",
    str(ANVIL / "serves.comfyui.toml"),
]


def vramctl(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env(**extra_env))


def test_validate_fixture_set_ok() -> None:
    r = vramctl("validate", *SET, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["gpu_roles"] == {
        "dark-compute-a": {"capacity_mib": 97887, "reserve_mib": 3072, "budget_mib": 94815},
        "dark-compute-b": {"capacity_mib": 97887, "reserve_mib": 3072, "budget_mib": 94815},
    }


@pytest.mark.parametrize("name", ["serves.toml", "serves.voice.toml", "serves.comfyui.toml"])
def test_validate_each_fixture(name: str) -> None:
    r = vramctl("validate", "-m", str(ANVIL / name))
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout


def test_validate_counts_its_gpu_roles_in_words() -> None:
    """One card is "1 gpu role", two are "2 gpu roles" (docs/manifest.md)."""
    examples = Path(__file__).parents[2] / "manifests" / "examples"
    for name, words in (("single-card.toml", "1 gpu role"), ("two-card.toml", "2 gpu roles")):
        r = vramctl("validate", "-m", str(examples / name))
        assert r.returncode == 0, r.stderr
        assert r.stdout.rstrip().splitlines()[0].endswith(words), r.stdout


def test_validate_bad_manifest_located_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n\n'
        '[[serve]]\nname = "omni"\ncontainer = "c-omni"\ngpu_role = "a"\nvram_mb = 500\n'
        'residency = "evictable"\n'
    )
    r = vramctl("validate", "-m", str(bad))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "bad.toml" in r.stderr and '"omni"' in r.stderr and "vram_mb" in r.stderr
    assert 'did you mean "vram_mib"' in r.stderr


def test_validate_toml_syntax_error_has_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text('[[serve]]\nname = "x\n')
    r = vramctl("validate", "-m", str(bad))
    assert r.returncode == 1
    assert "broken.toml" in r.stderr and "line 2" in r.stderr
    assert "Traceback" not in r.stderr


def test_fit_exact_arithmetic_json() -> None:
    r = vramctl("fit", "comfyui", *SET, "--observed", str(OBSERVED), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["serve"] == "comfyui" and data["fits"] is True
    (role,) = data["gpu_roles"]
    # committed on compute-b: omni 27999 + embeddings 3200 + reranker 3456 + stt 2048 + tts 2048
    committed = 27999 + 3200 + 3456 + 2048 + 2048
    assert role["gpu_role"] == "dark-compute-b"
    assert role["capacity_mib"] == 97887 and role["reserve_mib"] == 3072
    assert role["budget_mib"] == 94815
    assert role["committed_mib"] == committed
    assert role["free_mib"] == 94815 - committed
    assert role["requested_mib"] == 12288 and role["shortfall_mib"] == 0
    for key in ("drain", "evict", "shrink", "blockers"):
        assert data[key] == []


def test_fit_blocked_exclusive_exit_1_names_blockers() -> None:
    serve = "tp2-deepseek-v4-flash-0731-r16-b12x-dspark5-maxseq16-650k"
    r = vramctl("fit", serve, *SET, "--observed", str(OBSERVED), "--json")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["fits"] is False
    assert {"primary", "embeddings", "reranker", "stt", "tts"} <= set(data["blockers"])
    a, _b = data["gpu_roles"]
    assert a["shortfall_mib"] == 94721 - (94815 - 92000)


def test_fit_unknown_serve_suggests(tmp_path: Path) -> None:
    r = vramctl("fit", "comfyu", *SET, "--observed", str(OBSERVED))
    assert r.returncode == 2, r.stderr  # a question it cannot ask, not "does not fit" (1)
    assert 'did you mean "comfyui"' in r.stderr


def test_fit_live_with_docker_unreachable_fails_closed(tmp_path: Path) -> None:
    # no --observed: observe live; the daemon cannot be reached, so nothing is admitted
    r = vramctl("fit", "comfyui", *SET, "--json", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert r.returncode == 3, r.stdout + r.stderr  # could not observe (docs/operations.md)
    assert "Traceback" not in r.stderr and "docker" in r.stderr
    data = json.loads(r.stdout)
    assert data["fits"] is None and "unknown" in data["reason"]
    assert data["gpu_roles"][0]["committed_mib"] is None


def test_fit_docker_error_fails_closed(tmp_path: Path) -> None:
    snap = tmp_path / "err.json"
    snap.write_text(json.dumps({"docker": "error", "gpus": None}))
    r = vramctl("fit", "comfyui", *SET, "--observed", str(snap), "--json")
    assert r.returncode == 3  # the snapshot could not observe docker: unknown, not "no"
    data = json.loads(r.stdout)
    assert data["fits"] is None  # cannot be answered, not "no"
    assert data["gpu_roles"][0]["committed_mib"] is None  # unknown, never 0


def test_bad_snapshot_is_located(tmp_path: Path) -> None:
    snap = tmp_path / "bad.json"
    snap.write_text(json.dumps({"docker": "ok", "containers": {"x": {"state": "sleeping"}}}))
    r = vramctl("status", *SET, "--observed", str(snap))
    assert r.returncode == 1
    assert "bad.json" in r.stderr and "containers.x.state" in r.stderr


def test_status_json_ledger_unlinked_roles_unknown() -> None:
    r = vramctl("status", *SET, "--observed", str(OBSERVED), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    roles = {x["gpu_role"]: x for x in data["gpu_roles"]}
    assert roles["dark-compute-a"]["committed_mib"] == 92000
    assert roles["dark-compute-b"]["committed_mib"] == 27999 + 3200 + 3456 + 2048 + 2048
    # the fixture roles declare no uuid: no device is linked, so NVML figures are unknown
    for role in roles.values():
        assert role["nvml_used_mib"] is None and role["drift_used_mib"] is None
    serves = {s["serve"]: s for s in data["serves"]}
    assert serves["omni"]["lifecycle"] == "running" and serves["omni"]["committed"] is True
    assert serves["comfyui"]["state"] == "absent" and serves["comfyui"]["committed"] is False


def test_status_drift_with_linked_device(tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 32000\nreserve_mib = 2000\nuuid = "GPU-1"\n\n'
        '[[gpu_roles]]\nid = "b"\nvram_mib = 32000\nuuid = "GPU-2"\n\n'
        '[[serve]]\nname = "emb"\ncontainer = "c-emb"\ngpu_role = "a"\nvram_mib = 4000\n'
        'residency = "resident"\n'
    )
    snap = tmp_path / "o.json"
    snap.write_text(
        json.dumps(
            {
                "docker": "ok",
                "containers": {"c-emb": {"state": "running"}},
                "gpus": [
                    {
                        "uuid": "GPU-1",
                        "index": 0,
                        "total_mib": 32607,
                        "used_mib": 5100,
                        "free_mib": 27507,
                    }
                ],
            }
        )
    )
    r = vramctl("status", "-m", str(manifest), "--observed", str(snap), "--json")
    assert r.returncode == 0, r.stderr
    roles = {x["gpu_role"]: x for x in json.loads(r.stdout)["gpu_roles"]}
    a = roles["a"]
    assert a["committed_mib"] == 4000 and a["nvml_used_mib"] == 5100
    assert a["drift_used_mib"] == 1100  # drawn outside the ledger
    assert a["drift_total_mib"] == 32607 - 32000
    b = roles["b"]  # linked, but the device is not in the snapshot: unknown, never 0
    assert b["device_found"] is False and b["nvml_used_mib"] is None


def test_status_human_prints_unknown_not_zero() -> None:
    r = vramctl("status", *SET, "--observed", str(OBSERVED))
    assert r.returncode == 0, r.stderr
    assert "unknown" in r.stdout and "94815" in r.stdout


def test_plan_detailed_exitcode_and_out(tmp_path: Path) -> None:
    r = vramctl("plan", *SET, "--observed", str(OBSERVED), "--detailed-exitcode")
    assert r.returncode == 0, r.stdout + r.stderr  # unmanaged fixtures: nothing to do
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 1000\n\n'
        '[[serve]]\nname = "emb"\ncontainer = "c-emb"\ngpu_role = "a"\nvram_mib = 4000\n'
        'residency = "resident"\ndesired = "running"\n'
    )
    snap = tmp_path / "o.json"
    snap.write_text(json.dumps({"docker": "ok", "containers": {}, "gpus": None}))
    out = tmp_path / "plan.json"
    r = vramctl(
        "plan",
        "-m",
        str(manifest),
        "--observed",
        str(snap),
        "--detailed-exitcode",
        "--out",
        str(out),
    )
    assert r.returncode == 2, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert [(s["action"], s["serve"]) for s in data["steps"]] == [
        ("reserve", "emb"),
        ("start", "emb"),
        ("await_ready", "emb"),
    ]
    assert data["ledger_after"]["a"]["committed_mib"] == 4000
    assert data["ledger_after"]["a"]["free_mib"] == 5000


def test_lint_real_compose_explains_its_one_finding() -> None:
    compose = str(ANVIL / "docker-compose.yml")
    r = vramctl("lint", "-m", str(ANVIL / "serves.toml"), "-c", compose, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(r.stdout)
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    assert [f["serve"] for f in errors] == ["primary-laguna-rollback"]
    assert "0.8989" in errors[0]["message"] and "88099" in errors[0]["message"]
    r = vramctl("lint", "-m", str(ANVIL / "serves.toml"), "-c", compose, "--tolerance", "0.0011")
    assert r.returncode == 0, r.stdout + r.stderr


def test_lint_wrong_fraction_fails(tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 32000\n\n'
        '[[serve]]\nname = "llm"\ncontainer = "vllm-llm"\ngpu_role = "a"\nvram_mib = 16000\n'
        'residency = "on-demand"\nengine = "vllm"\n'
    )
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(
        "services:\n  llm:\n    container_name: vllm-llm\n    image: vllm/vllm-openai\n"
        "    command: vllm serve m --gpu-memory-utilization 0.90\n"
    )
    r = vramctl("lint", "-m", str(manifest), "-c", str(compose))
    assert r.returncode == 1
    assert "llm" in r.stdout + r.stderr and "0.5000" in r.stdout + r.stderr


def test_render_prints_the_flag() -> None:
    r = vramctl(
        "render",
        "embeddings",
        "-m",
        str(ANVIL / "serves.toml"),
        "-c",
        str(ANVIL / "docker-compose.yml"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "--gpu-memory-utilization 0.0326"
    assert "3200 MiB / 97887 MiB" in r.stderr


def test_render_adds_what_the_sleep_api_needs(tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 32000\n\n'
        '[[serve]]\nname = "llm"\ncontainer = "vllm-llm"\ngpu_role = "a"\nvram_mib = 16000\n'
        'residency = "evictable"\nengine = "vllm"\nport = 30001\n'
        "[serve.sleep]\nlevel = 1\nresidual_mib = 1024\nhost_ram_mib = 16000\n"
    )
    r = vramctl("render", "llm", "-m", str(manifest))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "--gpu-memory-utilization 0.5000 --enable-sleep-mode"
    assert "VLLM_SERVER_DEV_MODE=1" in r.stderr


def test_fit_text_says_why_a_blocker_may_not_be_stopped(tmp_path: Path) -> None:
    # ocr started 10 s before the observation: inside its min_runtime_s, so protected
    example = Path(__file__).resolve().parents[2] / "manifests" / "examples"
    data = json.loads((example / "single-card.observed.json").read_text())
    data["containers"]["vllm-ocr"]["started_at"] = "2026-11-30T08:59:50Z"
    observed = tmp_path / "observed.json"
    observed.write_text(json.dumps(data))
    r = vramctl("fit", "fast", "-m", str(example / "single-card.toml"), "--observed", str(observed))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "protected: ocr (6144 MiB): started 10s ago, inside its min_runtime_s" in r.stdout


def test_status_human_shows_a_sleeper_at_its_residual_and_the_host_line(tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        "[host]\nram_mib = 64000\nreserve_mib = 4000\n\n"
        '[[gpu_roles]]\nid = "a"\nvram_mib = 32000\n\n'
        '[[serve]]\nname = "coder"\ncontainer = "c-coder"\ngpu_role = "a"\nvram_mib = 16000\n'
        'residency = "evictable"\nport = 21001\nengine = "vllm"\n'
        "[serve.sleep]\nlevel = 1\nresidual_mib = 1234\nhost_ram_mib = 20000\n"
    )
    snap = tmp_path / "o.json"
    snap.write_text(
        json.dumps(
            {
                "docker": "ok",
                "containers": {"c-coder": {"state": "running"}},
                "gpus": None,
                "sleep": {
                    "coder": {
                        "state": "asleep",
                        "level": 1,
                        "residual_mib": 1234,
                        "host_ram_mib": 20000,
                    }
                },
            }
        )
    )
    r = vramctl("status", "-m", str(manifest), "--observed", str(snap))
    assert r.returncode == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if "coder" in line and "asleep" in line]
    assert "1234" in row and "16000" not in row.replace("of 16000", ""), r.stdout
    (host,) = [line for line in r.stdout.splitlines() if line.startswith("host RAM")]
    assert "20000" in host and "60000" in host, r.stdout  # committed, budget
