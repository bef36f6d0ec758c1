"""``/mcp`` of a real ``vramctl run`` to a caller without the token (docs/agents.md).

``vramctl run`` in a subprocess (``tests/shell/test_api.py``'s :class:`Live`, on the real
daemon: its serves are on-demand and never started, so no container is needed), its
manifest holding a serve whose ``[serve.model]`` files quote a marker in their error,
and beside it a file outside the manifest set that quotes the marker too. The caller
is the SDK's Streamable HTTP client, plain HTTP (httpx) and ``vramctl mcp --api``
without a token: no answer and no refusal may carry the marker or any free text
(a refusal is a fixed wording: :data:`controller.interfaces.mcp_server.PUBLIC_ERRORS`,
or for a manifest that does not load, where it is wrong without what it says). With
the token the same calls answer in full. ``plan_preview`` reads no file but the
manifest files the controller runs from, for any caller.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import httpx2
import numpy as np
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_raw import call_tool, message, open_session
from safetensors.numpy import save_file
from support.mcp_stdio import tool_text
from support.model_files import hf_config
from support.serving import free_port
from test_api import TOKEN, Live
from test_mcp_api import stdio_session
from test_mcp_http import auth

from controller.interfaces.api.agents import WRITES_NEED_TOKEN
from controller.interfaces.mcp_server import PATH_REFUSED, PUBLIC_ERRORS

#: the fixed wordings, and the writes' refusal without the token
FIXED = PUBLIC_ERRORS | {WRITES_NEED_TOKEN}

MARKER = "s3cr3t-7f1c-MARKER"
INVALID = f'[[gpu_roles]]\nid = "a"\nvram_mib = "{MARKER}"\n'


def model(folder: Path, **config: Any) -> Path:
    """A safetensors model in ``folder`` with its ``config.json`` (``config``: changes)."""
    folder.mkdir()
    save_file({"w": np.zeros((4, 4), dtype=np.float16)}, str(folder / "model.safetensors"))
    hf_config(folder, **config)
    return folder


def manifest(lv: Live) -> str:
    """Role a (budget 9000); llm on-demand; big and rec on-demand with models whose
    ``config.json`` holds the marker: where a number belongs (unreadable), and as a
    layer type (readable, its KV cache unknown, the reason naming it)."""

    def serve(name: str, mib: int, extra: str = "") -> str:
        return (
            f'\n[[serve]]\nname = "{name}"\ncontainer = "{lv.prefix}{name}"\n'
            f'gpu_role = "a"\nvram_mib = {mib}\nresidency = "on-demand"\n'
            f'port = {lv.ports[name]}\nhealth = "/health"\n{extra}'
        )

    return (
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 1000\n'
        + serve("llm", 5000)
        + serve("big", 2000, f'\n[serve.model]\npath = "{lv.tmp / "model"}"\n')
        + serve("rec", 2000, f'\n[serve.model]\npath = "{lv.tmp / "rec"}"\n')
    )


@pytest.fixture(scope="module")
def run(
    docker_client: docker.DockerClient, test_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("mcp-tokenless")
    model(tmp / "model", num_hidden_layers=MARKER)
    model(tmp / "rec", layer_types=["full_attention", MARKER])
    (tmp / "outside.toml").write_text(INVALID)
    lv = Live(docker_client, test_image, tmp)
    lv.ports.update(rec=free_port())
    lv.manifest.write_text(manifest(lv))
    try:
        lv.start()
        yield lv
    finally:
        lv.close()


def calls(lv: Live) -> list[tuple[str, dict[str, Any]]]:
    """Every tool, and each way it can refuse or fail, with the marker where it could
    be echoed."""
    return [
        ("reservation_status", {}),
        ("serves_status", {}),
        ("can_fit", {"serve": "big"}),  # its model's error quotes the marker
        ("can_fit", {"serve": "rec"}),  # why its KV cache is unknown names it
        ("can_fit", {"model_path": str(lv.tmp / "model"), "gpu_role": "a"}),
        ("can_fit", {"model_path": str(lv.tmp / "rec"), "gpu_role": "a"}),
        ("can_fit", {"model_path": f"/nonexistent/{MARKER}", "gpu_role": "a"}),
        ("can_fit", {"model_path": "bad\x00path", "gpu_role": "a"}),  # raises inside
        ("can_fit", {"vram_mib": 10, "gpu_role": MARKER}),
        ("can_fit", {"vram_mib": MARKER}),
        ("can_fit", {MARKER: 1}),
        ("serves_status", {"serve": MARKER}),
        ("plan_preview", {"manifest_path": str(lv.tmp / "outside.toml")}),
        ("plan_preview", {"manifest_path": str(lv.token_file)}),
        ("plan_preview", {"manifest_text": INVALID}),
        ("plan_preview", {"manifest_text": "x = 1", "replaces": MARKER}),
        ("request_up", {"serve": MARKER}),
        (MARKER, {}),
    ]


def sdk_calls(url: str, todo: list[tuple[str, dict[str, Any]]], headers: dict[str, str]) -> Any:
    async def main() -> list[Any]:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30, trust_env=False) as http,
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            return [await s.call_tool(name, args) for name, args in todo]

    return asyncio.run(asyncio.wait_for(main(), 90))


def withheld(name: str, args: dict[str, Any], result: Any) -> None:
    """A token-less answer: no marker, no token; a refusal in a fixed wording (a
    manifest that does not load: located, without what it says)."""
    shown = tool_text(result) + json.dumps(result.structured_content)
    said = f"{name} {args}: {shown}"
    assert MARKER not in shown and TOKEN not in shown, said
    if result.is_error:
        text = tool_text(result)
        located = text.startswith("the manifest set does not load: ") and "invalid" in text
        assert text in FIXED or located, said


@pytest.mark.docker
def test_without_the_token_no_answer_or_refusal_carries_free_text(run: Live) -> None:
    todo = calls(run)
    results = sdk_calls(run.url, todo, {})
    for (name, args), result in zip(todo, results, strict=True):
        withheld(name, args, result)
    # ... and over stdio, through `vramctl mcp --api` without a token
    address = run.url.removeprefix("http://")

    async def relayed() -> list[Any]:
        async with stdio_session(["--api", address]) as s:
            return [await s.call_tool(name, args) for name, args in todo[:4]]

    for (name, args), result in zip(todo, asyncio.run(relayed()), strict=False):
        withheld(name, args, result)


@pytest.mark.docker
def test_with_the_token_the_same_calls_answer_in_full(run: Live) -> None:
    todo = [*calls(run), ("plan_preview", {"manifest_path": str(run.manifest)})]
    answers = sdk_calls(run.url, todo, auth())
    results = {json.dumps([n, a]): r for (n, a), r in zip(todo, answers, strict=True)}

    def text(name: str, args: dict[str, Any]) -> str:
        result = results[json.dumps([name, args])]
        return tool_text(result) + json.dumps(result.structured_content)

    assert MARKER in text("can_fit", {"serve": "big"})
    assert MARKER in text("can_fit", {"serve": "rec"})
    assert MARKER in text("can_fit", {"model_path": str(run.tmp / "rec"), "gpu_role": "a"})
    assert MARKER in text("plan_preview", {"manifest_text": INVALID})
    assert "embedded null byte" in text("can_fit", {"model_path": "bad\x00path", "gpu_role": "a"})
    # no file outside the manifest set is read, whoever asks
    for path in (run.tmp / "outside.toml", run.token_file):
        assert text("plan_preview", {"manifest_path": str(path)}) == PATH_REFUSED + "null"
    # the controller's own file is read: the set as it is on disk
    own = results[json.dumps(["plan_preview", {"manifest_path": str(run.manifest)}])]
    assert not own.is_error, tool_text(own)
    assert own.structured_content["source"]["manifests"] == [str(run.manifest)]


@pytest.mark.docker
def test_plain_http_without_the_token_gets_no_free_text(run: Live) -> None:
    url = f"{run.url}/mcp"
    with httpx.Client(trust_env=False, timeout=30) as http:
        sid = open_session(http, url)
        answers = [call_tool(http, url, sid, name, args) for name, args in calls(run)]
        answers.append(call_tool(http, url, sid, "can_fit", MARKER))  # not an object
    for r in answers:
        assert r.status_code == 200, r.text
        assert MARKER not in r.text and TOKEN not in r.text, r.text
        result = message(r).get("result")
        if result is not None and result.get("isError"):
            text = "\n".join(c["text"] for c in result["content"])
            assert text in FIXED or "invalid" in text, r.text
