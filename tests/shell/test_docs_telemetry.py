"""Nothing the operator is told about is unread, and nothing read or exported is untold.

A guard against telemetry and settings that never reach the operator: a documented
variable nothing reads, a metric declared and never written, a manifest field the docs
describe and the loader does not know (or the reverse). Three inventories, each checked
both ways:

- **environment variables**: every ``VRAMCTL_*`` name the operator's documents (README,
  ``docs/``, the Dockerfile) mention is read by the product (``controller/``) or, for the
  development variables, by its tooling (``tests/``, ``bin/``, ``benchmarks/``, the
  example's script); every variable the product reads (``os.environ``, ``os.getenv``,
  typer's ``envvar=``) or hands on to ``up`` (``UP_ENV_PASS``) is documented;
- **metrics**: every ``vramctl_*`` series the documents, the dashboard and the alert rules
  name is declared in :class:`controller.interfaces.metrics.Metrics`; every declared family
  is documented in ``docs/operations.md`` and written somewhere in that class;
- **manifest fields**: every field of ``docs/manifest.md``'s field tables is a field of
  the matching model, and the reverse; every field is read outside the models unless the
  docs call it informational.

The inventories come from the code's syntax tree (not its comments or docstrings), so a
name mentioned only in prose does not count as read.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from controller.adapters.docker.actions import UP_ENV_PASS
from controller.interfaces.metrics import Metrics
from controller.manifest import models

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (ROOT / "controller", ROOT / "statemachine")
TOOLING = (
    ROOT / "tests",
    ROOT / "bin",
    ROOT / "benchmarks",
    ROOT / "manifests" / "examples",
    ROOT / ".ci",
)
OPERATOR_DOCS = (
    ROOT / "README.md",
    ROOT / "Dockerfile",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "docs" / "deploy").iterdir()),
)
_VAR = re.compile(r"\bVRAMCTL_[A-Z0-9_]*[A-Z0-9]\b")
_METRIC = re.compile(r"\bvramctl_[a-z0-9_{},]*[a-z0-9}]")
_METRIC_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _py_files(*folders: Path) -> Iterator[Path]:
    for folder in folders:
        if folder.is_dir():
            yield from sorted(folder.rglob("*.py"))


def _text_files(*folders: Path) -> Iterator[Path]:
    for folder in folders:
        if folder.is_file():
            yield folder
        elif folder.is_dir():
            for path in sorted(folder.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    yield path


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (prose, not code)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _code_strings(path: Path) -> Iterator[str]:
    """Every string constant of a module's code, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    prose = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.value


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a name bound to an environment mapping (``environ``, ``env``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in {"environ", "env"}


def _read_variables(path: Path) -> Iterator[str]:
    """Names a module reads from its environment.

    ``environ.get(N)``, ``getenv(N)``, ``environ[N]``, ``N in environ`` and typer's ``envvar=N``.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        name: ast.AST | None = None
        if isinstance(node, ast.Call):
            func = node.func
            getter = isinstance(func, ast.Attribute) and (
                func.attr == "getenv" or (func.attr == "get" and _is_environ(func.value))
            )
            if getter and node.args:
                name = node.args[0]
            for kw in node.keywords:
                if kw.arg == "envvar" and isinstance(kw.value, ast.Constant):
                    yield str(kw.value.value)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            name = node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            name = node.left
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            yield name.value


def _documented_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in OPERATOR_DOCS)


def _mentioned(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


# ------------------------------------------------------------------ environment


def product_variables() -> set[str]:
    """What the product reads from its environment or hands on to ``up``."""
    found: set[str] = set(UP_ENV_PASS)
    for path in _py_files(*PRODUCT):
        found.update(_read_variables(path))
        found.update(s for s in _code_strings(path) if _VAR.fullmatch(s))
    return found


def tooling_variables() -> set[str]:
    """``VRAMCTL_*`` names the project's own scripts and tests read (development settings)."""
    found: set[str] = set()
    for path in _text_files(*TOOLING):
        found.update(_VAR.findall(path.read_text(encoding="utf-8", errors="replace")))
    return found


def test_every_documented_variable_is_read() -> None:
    documented = set(_VAR.findall(_documented_text()))
    unread = sorted(documented - product_variables() - tooling_variables())
    assert not unread, f"documented but read by nothing: {unread}"


def test_every_variable_the_product_reads_is_documented() -> None:
    text = _documented_text()
    untold = sorted(v for v in product_variables() if not _mentioned(text, v))
    assert not untold, f"read by the product but not documented: {untold}"


def test_the_variable_inventory_sees_what_it_claims(tmp_path: Path) -> None:
    """The syntax-tree reading finds known reads of each kind (it is not blind)."""
    found = product_variables()
    assert {"VRAMCTL_TOKEN", "VRAMCTL_MANIFEST", "XDG_STATE_HOME", "PATH"} <= found
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "x = os.environ.get('A_B')\n"
        "y = os.getenv('C_D')\n"
        "z = 'E_F' in os.environ\n"
        "w = os.environ['G_H']\n"
        "opt = typer.Option(envvar='I_J')\n"
        "'K_L, a string nothing reads'\n",
        encoding="utf-8",
    )
    assert set(_read_variables(sample)) == {"A_B", "C_D", "E_F", "G_H", "I_J"}


# ---------------------------------------------------------------------- metrics


def _expand(name: str) -> Iterator[str]:
    """``vramctl_role_{capacity,budget}_mib`` as its names (the docs' shorthand)."""
    brace = re.search(r"\{([^{}]*)\}", name)
    if brace is None:
        yield name
        return
    for part in brace.group(1).split(","):
        yield from _expand(name[: brace.start()] + part + name[brace.end() :])


def documented_metrics(paths: Iterable[Path] = OPERATOR_DOCS) -> set[str]:
    names: set[str] = set()
    for path in paths:
        for raw in _METRIC.findall(path.read_text(encoding="utf-8", errors="replace")):
            # a trailing brace is the series' labels ({state}, {source="api"}), not a
            # shorthand for several names ({capacity,budget}_mib has text after it)
            labelled = "{" in raw and (raw.endswith("}") or "}" not in raw)
            name = raw.split("{", 1)[0] if labelled else raw
            names.update(n for n in _expand(name) if "{" not in n and "}" not in n)
    return names


def declared_families() -> dict[str, str]:
    """Every family :class:`Metrics` registers, by name, with its type."""
    return {m.name: m.type for m in Metrics().registry.collect()}


def _family_of(name: str, families: dict[str, str]) -> str | None:
    if name in families:
        return name
    for suffix in _METRIC_SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            return name.removesuffix(suffix)
    return None


def test_every_documented_metric_is_declared() -> None:
    families = declared_families()
    # a series name in prose, a dashboard or a rule that /metrics never carries
    unknown = sorted(
        n for n in documented_metrics() if _family_of(n, families) is None and n not in _NOT_METRICS
    )
    assert not unknown, f"documented metrics the controller does not declare: {unknown}"


#: ``vramctl_*`` words of the documents that are not series (a secret's file name).
_NOT_METRICS = frozenset({"vramctl_token", "vramctl_router_token"})


def test_every_declared_metric_is_documented() -> None:
    ops = documented_metrics([ROOT / "docs" / "operations.md"])
    untold = sorted(f for f in declared_families() if not any(_family_of(n, {f: ""}) for n in ops))
    assert not untold, f"declared metrics docs/operations.md does not name: {untold}"


def _metric_attributes(tree: ast.Module) -> dict[str, int]:
    """``self.NAME = Gauge|Counter|Histogram(...)`` in :class:`Metrics`: NAME -> its line."""
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in {"Gauge", "Counter", "Histogram", "Summary", "Info"}
        ):
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    found[target.attr] = node.lineno
    return found


def test_every_declared_metric_is_written() -> None:
    """Each metric attribute is used after its construction (set, inc, observe or removed)."""
    path = ROOT / "controller" / "interfaces" / "metrics.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    declared = _metric_attributes(tree)
    assert len(declared) >= len(declared_families()) - 1, "the inventory misses declarations"
    loads = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
    }
    unwritten = sorted(name for name in declared if name not in loads)
    assert not unwritten, f"metrics declared and never written: {unwritten}"


# ---------------------------------------------------------------- manifest fields

#: docs/manifest.md's field tables, by the heading above each, and the model they describe.
FIELD_TABLES: dict[str, type[BaseModel]] = {
    "`[[gpu_roles]]` fields": models.GpuRoleModel,
    "`[[serve]]` fields": models.ServeModel,
    "`elastic` fields": models.ElasticModel,
    "`[serve.sleep]` fields": models.SleepModel,
    "`[host]` fields": models.HostModel,
}
_ROW = re.compile(r"^\|\s*`([a-z_][a-z0-9_]*)`\s*\|(.*)$")


def documented_fields() -> dict[str, dict[str, str]]:
    """Per table heading: field -> the rest of its row (type, default, meaning, validation)."""
    tables: dict[str, dict[str, str]] = {}
    current: str | None = None
    for line in (ROOT / "docs" / "manifest.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = line[3:].strip() if line[3:].strip() in FIELD_TABLES else None
            continue
        row = _ROW.match(line)
        if current is not None and row is not None:
            tables.setdefault(current, {})[row.group(1)] = row.group(2)
    return tables


@pytest.mark.parametrize("heading", sorted(FIELD_TABLES))
def test_the_field_tables_match_the_models(heading: str) -> None:
    model = FIELD_TABLES[heading]
    documented = set(documented_fields().get(heading, {}))
    declared = set(model.model_fields)
    assert documented - declared == set(), f"{heading}: documented, not in {model.__name__}"
    assert declared - documented == set(), f"{heading}: in {model.__name__}, not documented"


def _attribute_reads() -> set[str]:
    """Attribute names read anywhere in the product (a field is declared by name, not read)."""
    reads: set[str] = set()
    for path in _py_files(*PRODUCT):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        reads.update(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    return reads


def test_every_field_is_read_unless_documented_informational() -> None:
    reads = _attribute_reads()
    unread = sorted(
        f"{heading} {name}"
        for heading, rows in documented_fields().items()
        for name, rest in rows.items()
        if name not in reads and "informational" not in rest.lower()
    )
    assert not unread, f"fields the docs describe as acting and nothing reads: {unread}"
