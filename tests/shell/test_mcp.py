"""``vramctl mcp`` through the MCP SDK's own client over stdio (docs/agents.md).

Each test spawns ``python -m controller.interfaces.cli mcp`` as an MCP client would
(``mcp.client.stdio.stdio_client`` + ``ClientSession``), on the single-card example and
its saved observation, and checks the tools against the command line's own JSON:
``can_fit`` answers as ``fit --json``, ``reservation_status`` as ``status --json``,
``plan_preview`` as ``plan --json`` on the edited file. Nothing is mocked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from support.mcp_stdio import (
    ADDED,
    ARGS,
    EXAMPLE,
    OBSERVED,
    tool_text,
    vramctl,
    with_session,
)

SERVES = ["stt", "tts", "embeddings", "reranker", "ocr", "fast"]


def call(name: str, arguments: dict[str, Any], args: list[str] = ARGS) -> Any:
    """One tool call's result (``types.CallToolResult``)."""

    async def go(s: ClientSession) -> Any:
        return await s.call_tool(name, arguments)

    return with_session(go, args)


def test_the_tools_and_their_schemas() -> None:
    async def go(s: ClientSession) -> Any:
        return await s.list_tools()

    listed = {t.name: t for t in with_session(go).tools}
    writes = {"request_up", "release"}
    assert set(listed) == {
        "reservation_status",
        "serves_status",
        "can_fit",
        "plan_preview",
        *writes,
    }
    up, release = listed.pop("request_up").annotations, listed.pop("release").annotations
    assert up is not None and release is not None
    assert up.read_only_hint is False and up.idempotent_hint is False
    assert release.read_only_hint is False and release.destructive_hint is True
    inputs = {name: t.input_schema for name, t in listed.items()}
    for name, schema in inputs.items():
        assert schema["type"] == "object", name
        assert schema["additionalProperties"] is False, name
    assert set(inputs["reservation_status"]["properties"]) == set()
    assert set(inputs["serves_status"]["properties"]) == {"serve"}
    assert set(inputs["can_fit"]["properties"]) == {
        "serve",
        "vram_mib",
        "gpu_role",
        "placement",
        "model_path",
        "context",
        "kv_dtype",
        "parallel",
    }
    assert inputs["can_fit"]["properties"]["placement"]["type"] == "array"
    assert "working directory" in inputs["can_fit"]["properties"]["model_path"]["description"]
    assert inputs["can_fit"]["properties"]["vram_mib"]["type"] == "integer"
    assert set(inputs["plan_preview"]["properties"]) == {
        "manifest_text",
        "replaces",
        "manifest_path",
    }
    for name, tool in listed.items():
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", name
        assert tool.description, name
        # every tool here only reads: annotated so, truthfully
        notes = tool.annotations
        assert notes is not None, name
        assert notes.read_only_hint is True, name
        assert notes.destructive_hint is False, name
        assert notes.open_world_hint is False, name


def test_can_fit_answers_as_fit_json_for_every_serve() -> None:
    async def go(s: ClientSession) -> dict[str, Any]:
        return {n: await s.call_tool("can_fit", {"serve": n}) for n in SERVES}

    results = with_session(go)
    for name in SERVES:
        r = vramctl("fit", name, *ARGS, "--json")
        cli = json.loads(r.stdout)
        assert r.returncode == (0 if cli["fits"] else 1), r.stderr  # 0 fits, 1 does not
        result = results[name]
        assert not result.is_error, tool_text(result)
        answer = result.structured_content
        assert {k: v for k, v in answer.items() if k not in ADDED} == cli, name
        assert answer["hypothetical"] is False
        assert answer["source"]["observed"] == str(OBSERVED)
        assert json.loads(tool_text(result)) == answer  # the text block says the same
    # the example's on-demand serve: ocr is drained and evicted for it, every term given
    fast = results["fast"].structured_content
    assert fast["fits"] is True and fast["evict"] == ["ocr"] and fast["drain"] == ["ocr"]
    [role] = fast["gpu_roles"]
    assert role["requested_mib"] == 19456 and role["free_mib"] == 15711
    assert role["shortfall_mib"] == 19456 - 15711


def test_can_fit_for_a_size_on_a_role() -> None:
    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("can_fit", {"vram_mib": 20000, "gpu_role": "display-card"}),
            await s.call_tool("can_fit", {"vram_mib": 1000, "gpu_role": "display-card"}),
            await s.call_tool("can_fit", {"vram_mib": 40000, "gpu_role": "display-card"}),
            await s.call_tool("can_fit", {"vram_mib": 1000, "gpu_role": "display-crad"}),
            await s.call_tool("can_fit", {"vram_mib": 1000}),
            await s.call_tool("can_fit", {"serve": "fast", "vram_mib": 1000}),
        ]

    big, small, too_big, bad_role, no_role, both = with_session(go)
    answer = big.structured_content
    assert answer["hypothetical"] is True and answer["fits"] is True
    assert answer["evict"] == ["ocr"]  # an on-demand serve of 20000 MiB evicts ocr
    assert answer["gpu_roles"][0]["requested_mib"] == 20000
    assert answer["gpu_roles"][0]["shortfall_mib"] == 20000 - 15711
    assert small.structured_content["fits"] is True
    assert small.structured_content["evict"] == []
    assert too_big.structured_content["fits"] is False  # beyond what eviction frees
    assert too_big.structured_content["reason"]
    assert bad_role.is_error and "display-card" in tool_text(bad_role)
    assert no_role.is_error and "gpu_role" in tool_text(no_role)
    assert both.is_error and "not both" in tool_text(both)


def test_reservation_status_answers_as_status_json() -> None:
    result = call("reservation_status", {})
    assert not result.is_error, tool_text(result)
    answer = result.structured_content
    r = vramctl("status", *ARGS, "--json")
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    # GET /v1/ledger's roles: the status role, and what is promised beside it
    assert [
        {k: v for k, v in a.items() if k in c}
        for a, c in zip(answer["gpu_roles"], cli["gpu_roles"], strict=True)
    ] == cli["gpu_roles"]
    for role in answer["gpu_roles"]:
        assert role["pending"] == [] and role["pending_mib"] == 0
        assert role["promised_mib"] == role["committed_mib"]
    assert answer["pending"] == []
    assert answer["host"] == cli.get("host")
    for key in ("docker", "nvml", "undeclared_gpu_containers", "no_longer_declared"):
        assert answer[key] == cli[key], key
    [role] = answer["gpu_roles"]
    # the saved observation has no GPUs: NVML used and drift are unknown, not 0
    assert role["nvml_used_mib"] is None and role["drift_used_mib"] is None
    assert any("nvml" in note for note in answer["notes"])
    assert role["budget_mib"] == role["capacity_mib"] - role["reserve_mib"]


def test_serves_status_answers_from_the_status_report() -> None:
    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("serves_status", {}),
            await s.call_tool("serves_status", {"serve": "ocr"}),
        ]

    every, one = with_session(go)
    assert not every.is_error, tool_text(every)
    cli = json.loads(vramctl("status", *ARGS, "--json").stdout)
    serves = every.structured_content["serves"]
    assert [s["serve"] for s in serves] == [s["serve"] for s in cli["serves"]]
    for mine, theirs in zip(serves, cli["serves"], strict=True):
        # GET /v1/serves's row: the status row, and what the answer adds to it
        assert {k: v for k, v in mine.items() if k in theirs} == theirs
        assert {"requestable", "request", "queued", "blocked"} <= set(mine)
        assert mine["backoff"] is None  # only the running loop knows it: unknown
    assert any("backoff" in note for note in every.structured_content["notes"])
    assert [s["serve"] for s in one.structured_content["serves"]] == ["ocr"]


def test_an_unknown_serve_is_a_tool_error_with_the_near_miss() -> None:
    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("can_fit", {"serve": "fsat"}),
            await s.call_tool("serves_status", {"serve": "ocrr"}),
            await s.call_tool("can_fit", {"serve": 7}),
            await s.call_tool("can_fit", {"srve": "fast"}),
        ]

    fit, serves, wrong_type, wrong_key = with_session(go)
    assert fit.is_error
    assert 'no serve named "fsat"' in tool_text(fit) and 'did you mean "fast"?' in tool_text(fit)
    assert fit.structured_content is None
    assert serves.is_error and 'did you mean "ocr"?' in tool_text(serves)
    assert wrong_type.is_error and "serve must be a JSON string" in tool_text(wrong_type)
    assert wrong_key.is_error and "did you mean 'serve'?" in tool_text(wrong_key)
    for result in (fit, serves, wrong_type, wrong_key):
        assert "Traceback" not in tool_text(result)


def _edited() -> str:
    text = EXAMPLE.read_text(encoding="utf-8")
    return text.replace(
        'residency = "on-demand"\n', 'residency = "on-demand"\ndesired = "running"\n'
    )


def test_plan_preview_plans_an_edit_and_executes_nothing(tmp_path: Path) -> None:
    before = EXAMPLE.read_bytes()
    result = call("plan_preview", {"manifest_text": _edited()})
    assert not result.is_error, tool_text(result)
    answer = result.structured_content
    assert answer["executed"] is False
    assert EXAMPLE.read_bytes() == before  # no file changed
    edited = tmp_path / EXAMPLE.name
    edited.write_text(_edited(), encoding="utf-8")
    r = vramctl("plan", "-m", str(edited), "--observed", str(OBSERVED), "--json")
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    for key in ("steps", "blocked", "ledger_before", "ledger_after"):
        assert answer[key] == cli[key], key
    actions = [(s["action"], s["serve"]) for s in answer["steps"]]
    assert ("stop", "ocr") in actions and ("start", "fast") in actions
    assert actions.index(("stop", "ocr")) < actions.index(("start", "fast"))
    # the same edit given as a file answers the same
    by_path = call("plan_preview", {"manifest_path": str(edited)})
    assert by_path.structured_content["steps"] == answer["steps"]


def test_plan_preview_refuses_what_does_not_load() -> None:
    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("plan_preview", {"manifest_text": "[[serve]]\nname = 1\n"}),
            await s.call_tool("plan_preview", {}),
            await s.call_tool("plan_preview", {"manifest_path": "/nonexistent.toml"}),
        ]

    broken, neither, missing = with_session(go)
    assert broken.is_error and "does not load" in tool_text(broken)
    assert neither.is_error and "manifest_text" in tool_text(neither)
    assert missing.is_error and "no such file" in tool_text(missing)


def test_a_manifest_that_does_not_load_stops_the_server_before_serving(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[gpu_roles]]\nid = 1\n", encoding="utf-8")
    r = vramctl("mcp", "-m", str(bad))
    assert r.returncode == 1
    assert str(bad) in r.stderr and "Traceback" not in r.stderr


def test_docker_unread_answers_unknown_never_zero(tmp_path: Path) -> None:
    unread = tmp_path / "unread.json"
    unread.write_text(
        json.dumps(
            {"docker": "error", "docker_error": "no socket", "containers": {}, "gpus": None}
        ),
        encoding="utf-8",
    )
    args = ["-m", str(EXAMPLE), "--observed", str(unread)]

    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("reservation_status", {}),
            await s.call_tool("can_fit", {"serve": "fast"}),
            await s.call_tool("plan_preview", {"manifest_text": _edited()}),
        ]

    status, fit, plan = with_session(go, args)
    [role] = status.structured_content["gpu_roles"]
    assert status.structured_content["docker"] == "error"
    assert role["committed_mib"] is None and role["free_mib"] is None
    assert any("no socket" in n for n in status.structured_content["notes"])
    assert fit.structured_content["fits"] is None
    cli = json.loads(vramctl("fit", "fast", *args, "--json").stdout)
    assert {k: v for k, v in fit.structured_content.items() if k not in ADDED} == cli
    assert plan.structured_content["known"] is False
    assert any("unknown, not empty" in n for n in plan.structured_content["notes"])


def test_the_writes_are_refused_over_stdio() -> None:
    """Without --allow-writes, for its lack; with it, because over stdio there is no
    running loop to admit a request (docs/agents.md: the writes are `vramctl run`'s)."""

    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("request_up", {"serve": "fast", "ttl_s": 60}),
            await s.call_tool("release", {"serve": "fast"}),
            await s.call_tool("request_up", {"serve": "fast", "ttl_s": 0}),
        ]

    up, release, bad = with_session(go)
    for result in (up, release):
        assert result.is_error and "--allow-writes" in tool_text(result)
    assert bad.is_error and "ttl_s must be more than 0" in tool_text(bad)
    up, release, _bad = with_session(go, [*ARGS, "--allow-writes"])
    for result in (up, release):
        assert result.is_error
        assert "need a running controller" in tool_text(result) and "/mcp" in tool_text(result)
