"""The documentation in docs/ stays true to the code.

- docs/manifest.md documents exactly the fields of the manifest's pydantic models
  (``GpuRoleModel``, ``ServeModel``, ``ElasticModel``): one table row per field, in the
  section of its table, and no row for a field the models do not have;
- every relative link in docs/*.md points to a file or folder that exists (and a
  ``#heading`` in a Markdown page to a heading of that page);
- every ``vramctl COMMAND`` written in code (inline or fenced) names a command that
  ``python -m controller.interfaces.cli --help`` lists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from controller.manifest import ElasticModel, GpuRoleModel, HostModel, ServeModel, SleepModel

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MANIFEST_DOC = DOCS / "manifest.md"

#: Each model and the heading of the section that documents its fields.
SECTIONS: dict[str, tuple[type[BaseModel], str]] = {
    "GpuRoleModel": (GpuRoleModel, "## `[[gpu_roles]]` fields"),
    "ServeModel": (ServeModel, "## `[[serve]]` fields"),
    "ElasticModel": (ElasticModel, "## `elastic` fields"),
    "SleepModel": (SleepModel, "## `[serve.sleep]` fields"),
    "HostModel": (HostModel, "## `[host]` fields"),
}

_FIELD_ROW = re.compile(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \|")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)([^\n`]*)\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_COMMAND = re.compile(r"(?:^|(?<=[\s`(\[$]))(?:[\w.-]*/)?vramctl[ \t]+([a-z][a-z0-9-]*)")


def _doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of level 1 or 2."""
    lines = text.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        pytest.fail(f"{MANIFEST_DOC.relative_to(ROOT)} has no heading {heading!r}")
    out: list[str] = []
    for line in lines[start + 1 :]:
        if re.match(r"^#{1,2} ", line):
            break
        out.append(line)
    return "\n".join(out)


def _documented_fields(section: str) -> list[str]:
    return [m.group(1) for line in section.splitlines() if (m := _FIELD_ROW.match(line))]


@pytest.mark.parametrize("model_name", sorted(SECTIONS))
def test_manifest_doc_lists_exactly_the_model_fields(model_name: str) -> None:
    model, heading = SECTIONS[model_name]
    documented = _documented_fields(_section(MANIFEST_DOC.read_text(encoding="utf-8"), heading))
    fields = set(model.model_fields)
    duplicates = sorted({f for f in documented if documented.count(f) > 1})
    assert not duplicates, f"{model_name}: fields documented twice: {duplicates}"
    missing = sorted(fields - set(documented))
    assert not missing, f"{model_name}: fields missing from docs/manifest.md: {missing}"
    unknown = sorted(set(documented) - fields)
    assert not unknown, f"{model_name}: docs/manifest.md documents unknown fields: {unknown}"


def _relative_links(text: str) -> list[str]:
    # links inside code are examples, not links
    prose = _FENCE.sub("", text)
    prose = _INLINE.sub("", prose)
    out = []
    for target in _LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # http:, https:, mailto:, or an anchor on the same page
        out.append(target.split("#", 1)[0])
    return out


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower-case, punctuation dropped, spaces to hyphens."""
    out: set[str] = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", _FENCE.sub("", text), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


def _links_with_anchors(text: str) -> list[tuple[str, str]]:
    prose = _INLINE.sub("", _FENCE.sub("", text))
    out = []
    for target in _LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        out.append((path, anchor))
    return out


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: p.name)
def test_anchors_resolve(page: Path) -> None:
    broken = []
    for path, anchor in _links_with_anchors(page.read_text(encoding="utf-8")):
        target = page if not path else page.parent / path
        if target.suffix != ".md" or not target.is_file():
            continue
        if anchor not in _anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{path}#{anchor}")
    assert not broken, f"{page.name}: links to headings that do not exist: {broken}"


def test_docs_exist() -> None:
    names = {p.name for p in _doc_pages()}
    expected = {
        "README.md",
        "architecture.md",
        "manifest.md",
        "eviction.md",
        "operations.md",
        "protocols.md",
        "limits.md",
    }
    assert expected <= names, f"missing pages: {sorted(expected - names)}"


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = [
        target
        for target in _relative_links(page.read_text(encoding="utf-8"))
        if target and not (page.parent / target).exists()
    ]
    assert not broken, f"{page.name}: broken relative links: {broken}"


def _cli_commands() -> set[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    result = subprocess.run(
        [sys.executable, "-m", "controller.interfaces.cli", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    commands: set[str] = set()
    in_commands = False
    for raw in result.stdout.splitlines():
        if re.search(r"\bCommands\b", raw):
            in_commands = True
            continue
        if not in_commands:
            continue
        line = raw.strip().strip("│|").rstrip()
        if line.startswith(("╰", "╭", "+", "-")) and not re.search(r"[a-z]", line):
            continue
        # a command row: one space after the box edge, the name, two spaces, its help
        m = re.match(r"^ ?([a-z][a-z0-9-]*)(?:\s{2,}|$)", line)
        if m:
            commands.add(m.group(1))
    assert commands, f"no commands parsed from the CLI help:\n{result.stdout}"
    return commands


def _code_text(text: str) -> list[str]:
    """Fenced blocks (except diagrams) and inline code spans."""
    out = []
    for m in _FENCE.finditer(text):
        if m.group(2).strip().lower() != "mermaid":
            out.append(m.group(3))
    prose = _FENCE.sub("", text)
    out.extend(m.group(2) for m in _INLINE.finditer(prose))
    return out


def test_cli_help_is_parsed() -> None:
    commands = _cli_commands()
    assert {"validate", "plan", "fit", "status", "run", "apply", "replay"} <= commands


def test_vramctl_commands_in_docs_exist() -> None:
    commands = _cli_commands()
    unknown: dict[str, set[str]] = {}
    for page in _doc_pages():
        for code in _code_text(page.read_text(encoding="utf-8")):
            for name in _COMMAND.findall(code):
                if name not in commands:
                    unknown.setdefault(page.name, set()).add(name)
    assert not unknown, f"`vramctl COMMAND` naming no command of the CLI: {unknown}"


def test_the_mcp_registration_runs_the_server_as_the_units_user() -> None:
    """docs/agents.md registers ``vramctl mcp`` beside docs/deploy/vramctl.service: the
    state directory the unit makes is its ``User=``'s alone (``StateDirectoryMode=0700``),
    so the registered command starts the server as that user (``sudo -n -u USER``), on
    the unit's state directory, and the sudoers rule the page gives allows exactly it."""
    import fnmatch
    import json

    unit = (DOCS / "deploy" / "vramctl.service").read_text(encoding="utf-8")
    user = re.search(r"^User=(\S+)$", unit, re.MULTILINE)
    state = re.search(r"^Environment=VRAMCTL_STATE_DIR=(\S+)$", unit, re.MULTILINE)
    assert user and state and re.search(r"^StateDirectoryMode=0700$", unit, re.MULTILINE)
    page = (DOCS / "agents.md").read_text(encoding="utf-8")
    section = page.split("\n## Registering the server\n", 1)[1].split("\n## ", 1)[0]
    fences = {m.group(2).strip(): m.group(3) for m in _FENCE.finditer(section)}
    server = json.loads(fences["json"])["mcpServers"]["vramctl"]
    command = [server["command"], *server["args"]]
    assert command[:4] == ["sudo", "-n", "-u", user.group(1)], command
    assert command[command.index("--state-dir") + 1] == state.group(1), command
    rule = re.search(r"'(\S+) ALL=\((\S+)\) NOPASSWD: (.+)'", section)
    assert rule is not None and rule.group(2) == user.group(1), section
    assert fnmatch.fnmatchcase(" ".join(command[4:]), rule.group(3)), (command, rule.group(3))
