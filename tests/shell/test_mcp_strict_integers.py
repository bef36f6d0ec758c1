"""A JSON ``true`` or ``false`` is no number for the MCP tools (docs/agents.md).

Python's ``bool`` is an ``int``: a check by ``isinstance(value, int)`` alone would take
``{"context": true}`` as a context of 1 token, ``{"vram_mib": true}`` as 1 MiB, and
``{"ttl_s": false}`` as 0 s. The rule pinned here: every argument a tool's input schema
types ``integer`` or ``number`` refuses a boolean, with a refusal that names the tool,
the argument and the value given. The rule is :func:`check_tool_arguments` (and the
read tools' own :meth:`Tools.call`), which every transport calls before anything is
read: ``vramctl mcp`` over stdio, the controller's ``/mcp`` and ``vramctl mcp --api``
share it. The arguments are read off the schemas, so a numeric argument added later is
covered without editing this file; the last test goes through the SDK's stdio client.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from support.mcp_stdio import tool_text, with_session

from controller.interfaces.mcp_server import (
    ALL_TOOLS,
    PUBLIC_ARGUMENTS,
    TOOLS,
    Asked,
    ToolError,
    Tools,
    check_tool_arguments,
)
from controller.manifest import ManifestSet

#: a valid value of each JSON type a tool's required argument may have
_VALID: dict[str, Any] = {"string": "x", "integer": 1, "number": 1.0, "array": ["x"]}


def _numeric() -> list[tuple[str, str, str]]:
    """(tool, argument, its JSON type) for every integer or number argument."""
    return [
        (tool.name, key, prop["type"])
        for tool in ALL_TOOLS
        for key, prop in tool.input_schema.get("properties", {}).items()
        if prop.get("type") in ("integer", "number")
    ]


NUMERIC = _numeric()


def _with(tool: str, key: str, value: object) -> dict[str, Any]:
    """The tool's required arguments (valid values), and ``key`` = ``value``."""
    schema: Mapping[str, Any] = next(t for t in ALL_TOOLS if t.name == tool).input_schema
    args = {k: _VALID[schema["properties"][k]["type"]] for k in schema.get("required", [])}
    args[key] = value
    return args


def test_the_numeric_arguments_are_those_the_tools_declare() -> None:
    """The parametrized tests below cover these: an empty or shrunken list would make
    them pass without checking anything."""
    assert {(t, k) for t, k, _ in NUMERIC} >= {
        ("can_fit", "vram_mib"),
        ("can_fit", "context"),
        ("can_fit", "parallel"),
        ("request_up", "ttl_s"),
        ("request_up", "wait_s"),
    }


@pytest.mark.parametrize(("tool", "key", "kind"), NUMERIC, ids=[f"{t}.{k}" for t, k, _ in NUMERIC])
@pytest.mark.parametrize("value", [True, False], ids=["true", "false"])
def test_a_boolean_is_refused_where_a_number_is_expected_naming_the_argument(
    tool: str, key: str, kind: str, value: bool
) -> None:
    """Rule: a JSON boolean given for an integer or number argument is refused, the
    refusal naming the tool, the argument and the value, never read as 1 or 0."""
    shown = "true" if value else "false"
    with pytest.raises(ToolError) as refused:
        check_tool_arguments(tool, _with(tool, key, value))
    assert str(refused.value) == f"{tool}: {key} must be a JSON {kind}, not {shown}"
    # without the API's token, the fixed wording (nothing the caller sent is echoed)
    assert refused.value.public == PUBLIC_ARGUMENTS


@pytest.mark.parametrize(("tool", "key", "kind"), NUMERIC, ids=[f"{t}.{k}" for t, k, _ in NUMERIC])
def test_the_number_one_is_taken_where_true_is_refused(tool: str, key: str, kind: str) -> None:
    """The refusal above is of the boolean, not of the value 1 it stands for: ``1``
    (and ``1.0`` for a number) passes the same check."""
    check_tool_arguments(tool, _with(tool, key, 1))
    if kind == "number":
        check_tool_arguments(tool, _with(tool, key, 1.0))


class _Untouched:
    """A tool source that fails the test if anything is asked of it: a refused call is
    refused before any observation or manifest is read."""

    any_file = False

    def ask(self, edit: ManifestSet | None = None, *, full: bool = True) -> Asked:
        raise AssertionError("a refused call read its source")

    def files(self) -> tuple[Path, ...]:
        raise AssertionError("a refused call read its source")

    def load(self, paths: tuple[Path, ...]) -> ManifestSet:
        raise AssertionError("a refused call read its source")


READ_NUMERIC = [(t, k, kind) for t, k, kind in NUMERIC if t in {tool.name for tool in TOOLS}]


@pytest.mark.parametrize(
    ("tool", "key", "kind"), READ_NUMERIC, ids=[f"{t}.{k}" for t, k, _ in READ_NUMERIC]
)
def test_the_read_tools_refuse_a_boolean_before_reading_anything(
    tool: str, key: str, kind: str
) -> None:
    """Rule: the read tools' own entry (``Tools.call``, what stdio and ``/mcp`` answer
    from) refuses a boolean for a number before it reads the host or the manifest."""
    with pytest.raises(ToolError, match=rf"^{tool}: {key} must be a JSON {kind}, not true$"):
        Tools(_Untouched()).call(tool, _with(tool, key, True))


def test_over_stdio_context_true_is_refused_not_read_as_one_token() -> None:
    """Rule, end to end (``vramctl mcp`` through the SDK's client): ``{"context": true}``
    and every other boolean where can_fit wants an integer is a tool error naming the
    argument; the same question with an integer is answered."""
    role = {"gpu_role": "display-card"}

    async def go(s: ClientSession) -> list[Any]:
        return [
            await s.call_tool("can_fit", {"model_path": "m.gguf", "context": True, **role}),
            await s.call_tool("can_fit", {"model_path": "m.gguf", "parallel": True, **role}),
            await s.call_tool("can_fit", {"vram_mib": True, **role}),
            await s.call_tool("can_fit", {"vram_mib": 1000, **role}),
        ]

    context, parallel, vram, answered = with_session(go)
    for result, key in ((context, "context"), (parallel, "parallel"), (vram, "vram_mib")):
        assert result.is_error
        assert f"can_fit: {key} must be a JSON integer, not true" in tool_text(result)
    assert not answered.is_error
    assert answered.structured_content is not None
    assert answered.structured_content["fits"] is True
