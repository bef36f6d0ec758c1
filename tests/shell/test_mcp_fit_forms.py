"""``can_fit``'s placed and model-file forms through the MCP SDK's stdio client
(docs/agents.md): ``{"vram_mib": N, "placement": [...]}`` answers as ``fit --json`` does
for a declared on-demand serve placed among the same candidates, and
``{"model_path": P, ...}`` asks for the model's known need, weights + KV cache. Inside
``vramctl run`` (``/mcp``, the live backend) both forms answer from the live view."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from support.mcp_stdio import ADDED, ROOT, tool_text, vramctl, with_session
from support.model_files import WEIGHTS, write_gguf
from test_api import idle, observe  # noqa: F401
from test_mcp_http import auth, run

from controller.service.loop import Controller

MANIFEST = """
[[gpu_roles]]
id = "card-a"
vram_mib = 24576
reserve_mib = 1024

[[gpu_roles]]
id = "card-b"
vram_mib = 16384

[[serve]]
name = "chat"
container = "fx-chat"
gpu_role = "card-a"
vram_mib = 8192
residency = "resident"
desired = "running"

[[serve]]
name = "tts"
container = "fx-tts"
gpu_role = "card-b"
vram_mib = 6000
residency = "evictable"
desired = "running"
"""
OBSERVED = {
    "docker": "ok",
    "taken_at": "2026-11-30T09:00:00Z",
    "containers": {
        "fx-chat": {"state": "running", "health": "healthy", "started_at": "2026-11-29T07:00:00Z"},
        "fx-tts": {"state": "running", "health": "healthy", "started_at": "2026-11-29T07:00:00Z"},
    },
    "gpus": None,
}
#: card-a has 23552 - 8192 = 15360 MiB free, card-b 16384 - 6000 = 10384
PROBE = 'name = "probe"\ncontainer = "fx-probe"\nresidency = "on-demand"\n'
HYPOTHETICAL = "(hypothetical)"


def _set(tmp_path: Path) -> list[str]:
    (tmp_path / "m.toml").write_text(MANIFEST)
    (tmp_path / "o.json").write_text(json.dumps(OBSERVED))
    return ["-m", str(tmp_path / "m.toml"), "--observed", str(tmp_path / "o.json")]


def _fit_json(tmp_path: Path, where: str, mib: int) -> dict[str, Any]:
    """``vramctl fit probe --json`` with ``probe`` declared: ``where`` its role line."""
    declared = tmp_path / "declared.toml"
    declared.write_text(f"{MANIFEST}\n[[serve]]\n{PROBE}{where}\nvram_mib = {mib}\n")
    done = vramctl("fit", "probe", "--json", "-m", str(declared), "--observed", _obs(tmp_path))
    answer: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == (0 if answer["fits"] else 1), done.stderr  # 0 fits, 1 does not
    return answer


def _obs(tmp_path: Path) -> str:
    return str(tmp_path / "o.json")


def _as_probe(answer: dict[str, Any]) -> dict[str, Any]:
    """The tool's answer with the hypothetical serve named ``probe``, less what it adds."""
    renamed: dict[str, Any] = json.loads(json.dumps(answer).replace(HYPOTHETICAL, "probe"))
    return {k: v for k, v in renamed.items() if k not in ADDED | {"estimate"}}


def test_a_size_placed_among_candidates_answers_as_fit_json(tmp_path: Path) -> None:
    args = _set(tmp_path)

    async def go(s: ClientSession) -> list[Any]:
        asks: list[dict[str, Any]] = [
            {"vram_mib": 10000, "placement": ["card-a", "card-b"]},
            {"vram_mib": 16000, "placement": ["card-a", "card-b"]},
            {"vram_mib": 20000, "placement": ["card-a", "card-b"]},
            {"vram_mib": 1000, "placement": ["card-a", "crad-b"]},
            {"vram_mib": 1000, "placement": ["card-a"], "gpu_role": "card-a"},
            {"vram_mib": 1000, "placement": []},
            {"vram_mib": 1000, "placement": "card-a"},
        ]
        return [await s.call_tool("can_fit", a) for a in asks]

    fits, evicts, never, typo, both, empty, not_a_list = with_session(go, args)
    roles = 'placement = ["card-a", "card-b"]'
    for result, mib in ((fits, 10000), (evicts, 16000)):
        assert not result.is_error, tool_text(result)
        answer = result.structured_content
        assert answer["hypothetical"] is True and "placement" in answer
        assert _as_probe(answer) == _fit_json(tmp_path, roles, mib)
    # best fit: both have room, card-b is left with the least
    assert fits.structured_content["fits"] is True
    assert fits.structured_content["placement"]["role"] == "card-b"
    assert fits.structured_content["evict"] == []
    # no room anywhere: card-a holds only a resident, card-b the evictable tts
    assert evicts.structured_content["fits"] is True
    assert evicts.structured_content["placement"]["role"] == "card-b"
    assert evicts.structured_content["evict"] == ["tts"]
    assert never.is_error and tool_text(never) == (
        'placement candidate "card-b" has a budget of 16384 MiB (capacity 16384 - reserve '
        "0), less than vram_mib 20000: it can never hold this serve"
    )
    assert typo.is_error
    assert tool_text(typo) == 'no gpu role "crad-b" in the manifest set (roles: card-a, card-b)'
    assert both.is_error
    assert tool_text(both) == "ask with exactly one of gpu_role or placement, not both"
    assert empty.is_error and "at least one candidate" in tool_text(empty)
    assert not_a_list.is_error and "placement must be a JSON array" in tool_text(not_a_list)


def _estimate_json(path: Path, *args: str) -> dict[str, Any]:
    done = vramctl("estimate", str(path), "--json", *args)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_a_model_s_files_ask_for_its_weights_and_kv_cache(tmp_path: Path) -> None:
    args = _set(tmp_path)
    gguf = write_gguf(tmp_path / "tiny.gguf")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model")
    relative = os.path.relpath(gguf, ROOT)  # the server runs in ROOT (test_mcp)

    async def go(s: ClientSession) -> list[Any]:
        asks: list[dict[str, Any]] = [
            {"model_path": str(gguf), "context": 4096, "gpu_role": "card-b"},
            {
                "model_path": relative,
                "kv_dtype": "f32",
                "parallel": 2,
                "placement": ["card-a", "card-b"],
            },
            {"model_path": str(tmp_path / "absent.gguf"), "gpu_role": "card-b"},
            {"model_path": str(garbage), "gpu_role": "card-b"},
            {"model_path": str(gguf), "vram_mib": 5, "gpu_role": "card-b"},
            {"vram_mib": 5, "context": 4096, "gpu_role": "card-b"},
            {"model_path": str(gguf), "kv_dtype": "q5", "gpu_role": "card-b"},
            {"model_path": str(gguf), "kv_dtype": "q8_0", "gpu_role": "card-b"},
        ]
        return [await s.call_tool("can_fit", a) for a in asks]

    pinned, placed, absent, unreadable, both, stray, dtype, no_kv = with_session(go, args)
    for result in (pinned, placed):
        assert not result.is_error, tool_text(result)

    own = _estimate_json(gguf, "--context", "4096")
    answer = pinned.structured_content
    est = answer["estimate"]
    assert est["weights_bytes"] == own["weights_bytes"] == WEIGHTS
    assert est["kv_cache_bytes"] == own["kv_cache_bytes"] > 0
    assert est["formula"] == own["formula"]
    need = WEIGHTS + own["kv_cache_bytes"]
    assert est["at_least_bytes"] == need and est["vram_mib"] == -(-need // 2**20)
    assert [u["term"] for u in est["unknown"]] == [u["term"] for u in own["unknown"]]
    assert est["unknown"] and all(u["reason"] for u in est["unknown"])
    assert "not included" in est["note"] and "vramctl calibrate" in est["note"]
    assert any("vramctl calibrate" in n for n in answer["notes"])
    assert answer["gpu_roles"][0]["requested_mib"] == est["vram_mib"]
    assert _as_probe(answer) == _fit_json(tmp_path, 'gpu_role = "card-b"', est["vram_mib"])

    own = _estimate_json(gguf, "--kv-dtype", "f32", "--parallel", "2")
    est = placed.structured_content["estimate"]
    assert est["model"] == str(gguf)  # the relative path, resolved where the server runs
    assert (est["kv_cache_bytes"], est["kv_dtype"], est["parallel"]) == (
        own["kv_cache_bytes"],
        "f32",
        2,
    )
    assert _as_probe(placed.structured_content) == _fit_json(
        tmp_path, 'placement = ["card-a", "card-b"]', est["vram_mib"]
    )

    assert absent.is_error and str(tmp_path / "absent.gguf") in tool_text(absent)
    assert tool_text(absent).startswith("model_path cannot be read: ")
    assert unreadable.is_error and str(garbage) in tool_text(unreadable)
    assert both.is_error and "not both vram_mib and model_path" in tool_text(both)
    assert stray.is_error and tool_text(stray) == "context: only with model_path"
    assert dtype.is_error and "kv_dtype must be one of f16" in tool_text(dtype)
    # a cache the files cannot size is no known need: refused, with the reason
    assert no_kv.is_error and tool_text(no_kv).startswith(f"{gguf}: its KV cache is unknown (")
    assert tool_text(no_kv).endswith("ask with vram_mib")


def test_the_live_backend_takes_both_forms(idle: Controller, tmp_path: Path) -> None:  # noqa: F811
    now = time.time()
    observe(idle, {"res": {"state": "running"}, "omni": {"state": "running", "started_at": now}})
    gguf = write_gguf(tmp_path / "tiny.gguf")

    async def go(base: str, session: Callable[..., Any]) -> list[Any]:
        async with session(auth()) as s:  # the refusals' words in full: with the token
            asks: list[dict[str, Any]] = [
                {"vram_mib": 5000, "gpu_role": "a"},
                {"vram_mib": 5000, "placement": ["a"]},
                {"model_path": str(gguf), "context": 4096, "placement": ["a"]},
                {"model_path": str(tmp_path / "absent.gguf"), "gpu_role": "a"},
                {"vram_mib": 9001, "placement": ["a"]},
            ]
            return [await s.call_tool("can_fit", a) for a in asks]

    pinned, placed, model, absent, never = run(idle, go)
    for result in (pinned, placed, model):
        assert not result.is_error, tool_text(result)
    # one candidate: placed already, the same arithmetic as on the role
    keep = ("fits", "reason", "gpu_roles", "drain", "evict", "blockers")
    assert {k: placed.structured_content[k] for k in keep} == {
        k: pinned.structured_content[k] for k in keep
    }
    est = model.structured_content["estimate"]
    assert est["weights_bytes"] == WEIGHTS and est["kv_cache_bytes"] > 0
    assert model.structured_content["gpu_roles"][0]["requested_mib"] == est["vram_mib"]
    assert model.structured_content["fits"] is True
    assert absent.is_error and str(tmp_path / "absent.gguf") in tool_text(absent)
    assert never.is_error and "budget of 9000 MiB" in tool_text(never)
