"""Mutation testing of the pure core: do the tests catch what they claim?

One mutant at a time, each a small change of one module of ``statemachine/``:

==========  =================================================================
operator    change
==========  =================================================================
``cmp``     ``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``is``/``is not``,
            ``in``/``not in`` swapped (the boundary and the negation)
``arith``   ``+``/``-`` swapped, ``*``/``//`` swapped, ``/`` to ``*``
``aug``     ``+=``/``-=`` swapped
``bool``    ``and``/``or`` swapped
``not``     ``not x`` becomes ``x``; ``-x`` becomes ``x``
``const``   an integer constant ``n`` becomes ``n + 1`` and ``n - 1``;
            ``True``/``False`` swapped
``return``  an early ``return`` (one that is not a function's last statement)
            becomes ``pass``
``loop``    ``break``/``continue`` swapped
``minmax``  ``min(...)``/``max(...)`` swapped
``drop``    one operand of ``and``/``or`` dropped, each in turn
``swap``    two adjacent elements of a sort key (the tuple a ``key=`` lambda or
            a ``key=``/``*_key`` function returns) or of a tuple compared
            (``<``, ``==``, ...) swapped
``delete``  a statement of a function's body becomes ``pass``: a call, an
            augmented assignment, a ``raise``, a ``continue``, an assignment
            to an attribute, an item or a name bound elsewhere too
``guard``   an ``if`` without ``else`` whose body is one ``return``,
            ``continue``, ``break`` or ``raise`` always taken
``count``   ``a - b`` becomes ``a``, and ``b``
``unit``    ``1024``/``1000``, ``1048576``/``1000000``, ``2**30``/``10**9``,
            ``60``/``3600`` swapped (floats too)
==========  =================================================================

A run prints its outcome per operator family (and ``--docs`` writes it into
docs/mutation.md with each module's row, from ``tests/mutation/scores.toml``).

Docstrings, annotations and string literals are never mutated. A mutant is written
into a private copy of the repository (one per worker), so the subprocesses the
tests start import the mutant too. The test pool is the *pure* test files (they
import ``statemachine`` and no ``controller``) and the files ``mutation.toml`` adds
(``[tests] also``: they import ``controller`` but need neither Docker nor
``tests/conftest.py``). The pool runs once unmutated under coverage
(``tests/mutation/selection.py``): the line map, which tests run each line, and each
test's time. A mutant then runs only the tests that run one of its lines (every test
of the module when a line runs at import), fastest first, in one pytest run with
``-x``, Hypothesis derandomized without shrinking
(``tests/mutation/hypothesis_profile.py``), without pytest's plugin autoload and
without ``tests/conftest.py`` (start-up is most of a killed mutant's time), and a
timeout from those tests' times (past it, the mutant runs once more at four times the
timeout: a busy machine slows a test, a hang hangs again): a mutant the tests fail on,
or that hangs past the timeout twice, is *killed*; one they pass is a *survivor*, and
so is one on a line no test runs (reported as *not covered*). A module without a
threshold is reported, not gated.

Each mutant has a stable key, ``module:line text:operator#n`` (``n`` counts equal
changes on lines of one text), so the equivalent mutants listed in
``tests/mutation/equivalent.toml`` (each names exactly one key, ``n`` included, with
its reason) keep matching while code around them moves. The score is killed /
(mutants run), equivalents excluded.
``tests/mutation/mutation.toml`` holds per module the threshold and how the test
command samples it; ``--full`` runs every mutant of every module.

Usage::

    python tests/mutation/mutate.py                 # the test command's run
    python tests/mutation/mutate.py --full          # every mutant (VRAMCTL_MUTATION=full)
    python tests/mutation/mutate.py ledger --list   # print the mutants, run nothing
    python tests/mutation/mutate.py planner --match 'need <= 0'   # only these mutants

Exit status: 0 every module at or above its threshold, 1 one below, 2 a usage or
set-up error (the unmutated tests fail, a stale equivalent entry, ...).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PACKAGE = "statemachine"
MAX_WORKERS = 2


def is_shell(name: str) -> bool:
    """A module of the shell is named by its dotted path (``controller.service.sleeping``);
    one of ``statemachine/`` by its path below it, dotted (``ledger``, ``engines.vllm``;
    a package's own module ``engines.__init__``)."""
    return name.startswith("controller.")


def source_path(name: str) -> Path:
    """The module's file, relative to the repository's root."""
    parts = name.split(".")
    return (
        Path(*parts).with_suffix(".py")
        if is_shell(name)
        else Path(PACKAGE, *parts).with_suffix(".py")
    )


def import_name(name: str) -> str:
    """The name the module is imported by (a package's ``__init__`` by the package's)."""
    dotted = name if is_shell(name) else f"{PACKAGE}.{name}"
    return dotted.removesuffix(".__init__")


_LIVE: set[subprocess.Popen[str]] = set()  # test runs in flight, ended when the run is stopped

_CMP_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BIN_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
}
_AUG_SWAP: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub, ast.Sub: ast.Add}
_SYMBOL = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Div: "/",
}


# ----- mutants ------------------------------------------------------------------------
@dataclass(frozen=True)
class Mutant:
    """One change: the ``index``-th node of the module's walk, changed by ``change``."""

    module: str
    index: int  # position of the node in _walk(tree)
    change: str  # what to do to it (see _apply)
    line: int
    line_text: str
    op: str  # e.g. "cmp > -> >="
    key: str = ""
    end_line: int = 0  # the node's last line (a change of a node runs on any of its lines)

    def describe(self) -> str:
        return f"{self.module}.py:{self.line}: {self.op}    {self.line_text}"


def _skipped_children(node: ast.AST) -> set[int]:
    """ids of nodes under ``node`` never mutated: annotations and decorators."""
    skip: list[ast.AST] = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        skip += node.decorator_list  # @dataclass(frozen=True, ...): not behaviour under test
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        if node.returns is not None:
            skip.append(node.returns)
        for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
            if a.annotation is not None:
                skip.append(a.annotation)
        for a in (node.args.vararg, node.args.kwarg):
            if a is not None and a.annotation is not None:
                skip.append(a.annotation)
    if isinstance(node, ast.AnnAssign):
        skip.append(node.annotation)
    return {id(n) for s in skip for n in ast.walk(s)}


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, bool]]:
    """(node, parent, last statement of a function body?) in a fixed order, skipping
    annotations, ``__slots__`` and ``__all__``."""
    skip: set[int] = set()
    parents: dict[int, ast.AST] = {}
    last: set[int] = set()
    for node in ast.walk(tree):
        skip |= _skipped_children(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            last.add(id(node.body[-1]))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("__slots__", "__all__") for t in node.targets
        ):
            skip |= {id(n) for n in ast.walk(node)}
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    for node in ast.walk(tree):
        if id(node) not in skip:
            yield node, parents.get(id(node)), id(node) in last


_UNITS: dict[int, int] = {
    1024: 1000,
    1000: 1024,
    1_048_576: 1_000_000,
    1_000_000: 1_048_576,
    1_073_741_824: 1_000_000_000,
    1_000_000_000: 1_073_741_824,
    60: 3600,
    3600: 60,
}
_GUARD_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)


@dataclass
class _Context:
    """What a node's mutations depend on beyond the node itself: the tuples that are
    sort keys or sides of a comparison, and the statements a deletion may drop."""

    key_tuples: set[int] = field(default_factory=set)
    deletable: set[int] = field(default_factory=set)


def _function_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of the functions or lambdas in it."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def _is_key_name(name: str) -> bool:
    return name == "key" or name.endswith("_key")


def _context(tree: ast.AST) -> _Context:
    ctx = _Context()
    key_functions: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg != "key":
                    continue
                if isinstance(kw.value, ast.Lambda) and isinstance(kw.value.body, ast.Tuple):
                    ctx.key_tuples.add(id(kw.value.body))
                elif isinstance(kw.value, ast.Name):
                    key_functions.add(kw.value.id)
                elif isinstance(kw.value, ast.Attribute):
                    key_functions.add(kw.value.attr)
        elif isinstance(node, ast.Compare) and all(isinstance(o, _ORDERING) for o in node.ops):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Tuple):
                    ctx.key_tuples.add(id(side))
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        inner = list(_function_nodes(node))
        if node.name in key_functions or _is_key_name(node.name):
            for r in inner:
                if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple):
                    ctx.key_tuples.add(id(r.value))
        stores: dict[str, int] = {}
        for n in inner:
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                stores[n.id] = stores.get(n.id, 0) + 1
        for n in inner:
            side_effect = isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
            if side_effect or isinstance(n, ast.AugAssign | ast.Raise | ast.Continue):
                ctx.deletable.add(id(n))
            elif isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                # a name bound only here would be unbound after: a crash, not a bug's shape
                names = [t for t in targets if isinstance(t, ast.Name)]
                if all(stores.get(t.id, 0) > 1 for t in names):
                    ctx.deletable.add(id(n))
    return ctx


def _changes(
    node: ast.AST, parent: ast.AST | None, is_last: bool, ctx: _Context | None = None
) -> list[tuple[str, str]]:
    """(change, operator label) for every mutation of ``node``."""
    ctx = ctx or _Context()
    out: list[tuple[str, str]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            new = _CMP_SWAP.get(type(op))
            if new is not None:
                out.append((f"cmp:{i}", f"cmp {_SYMBOL[type(op)]} -> {_SYMBOL[new]}"))
    elif isinstance(node, ast.BinOp):
        new_bin = _BIN_SWAP.get(type(node.op))
        strings = any(
            isinstance(side, ast.JoinedStr)
            or (isinstance(side, ast.Constant) and isinstance(side.value, str))
            for side in (node.left, node.right)
        )
        if new_bin is not None and not strings:
            out.append(("bin", f"arith {_SYMBOL[type(node.op)]} -> {_SYMBOL[new_bin]}"))
        if isinstance(node.op, ast.Sub) and not strings:
            # a - 1 -> a is const 1 -> 0, 0 - b -> b is arith - -> +: not twice
            if not (isinstance(node.right, ast.Constant) and node.right.value == 1):
                out.append(("count:left", "count a - b -> a"))
            if not (isinstance(node.left, ast.Constant) and node.left.value == 0):
                out.append(("count:right", "count a - b -> b"))
    elif isinstance(node, ast.AugAssign):
        new_aug = _AUG_SWAP.get(type(node.op))
        if new_aug is not None:
            out.append(("aug", f"aug {_SYMBOL[type(node.op)]}= -> {_SYMBOL[new_aug]}="))
    elif isinstance(node, ast.BoolOp):
        word = "and" if isinstance(node.op, ast.And) else "or"
        out.append(("bool", "bool and -> or" if word == "and" else "bool or -> and"))
        for i in range(len(node.values)):
            out.append((f"drop:{i}", f"drop {word} operand {i}"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("unary", "not removed"))
    elif (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and _number_value(node, parent) is None
    ):
        out.append(("unary", "unary - removed"))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        out.append(("flip", f"const {node.value} -> {not node.value}"))
    elif isinstance(node, ast.Return) and not is_last:
        out.append(("pass", "return early removed"))
    elif isinstance(node, ast.Break):
        out.append(("continue", "break -> continue"))
    elif isinstance(node, ast.Continue):
        out.append(("break", "continue -> break"))
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("min", "max")
    ):
        other = "max" if node.func.id == "min" else "min"
        out.append(("minmax", f"minmax {node.func.id} -> {other}"))
    elif isinstance(node, ast.Tuple) and id(node) in ctx.key_tuples:
        for i in range(len(node.elts) - 1):
            if ast.dump(node.elts[i]) != ast.dump(node.elts[i + 1]):
                out.append((f"swap:{i}", f"swap key {i} <-> {i + 1}"))
    elif (
        isinstance(node, ast.If)
        and not node.orelse
        and len(node.body) == 1
        and isinstance(node.body[0], _GUARD_EXITS)
        and not isinstance(node.test, ast.Constant)
    ):
        out.append(("guard", "guard always taken"))
    if id(node) in ctx.deletable:
        out.append(("delete", "statement deleted"))
    number = _number_value(node, parent)
    if number is not None:
        v = number
        out += [("plus", f"const {v!r} -> {v + 1!r}"), ("minus", f"const {v!r} -> {v - 1!r}")]
        if isinstance(node, ast.Constant) and v in _UNITS:
            unit = type(v)(_UNITS[int(v)])
            out.append(("unit", f"unit {v!r} -> {unit!r}"))
    return out


# the operator families of the reports, in this order; each change belongs to one
FAMILIES: dict[str, str] = {
    "cmp": "cmp",
    "bin": "arith",
    "aug": "aug",
    "bool": "bool",
    "unary": "not",
    "flip": "const",
    "plus": "const",
    "minus": "const",
    "pass": "return",
    "continue": "loop",
    "break": "loop",
    "minmax": "minmax",
    "drop": "drop",
    "swap": "swap",
    "delete": "delete",
    "guard": "guard",
    "count": "count",
    "unit": "unit",
}


#: the first operator families: what the test command's stage gates on (``--operators
#: classic``) until every module meets its threshold with the operators of bugs' shapes
#: too (docs/mutation.md); those are run and reported by ``--operators all``
CLASSIC = frozenset(("cmp", "arith", "aug", "bool", "not", "const", "return", "loop", "minmax"))


def family(change: str) -> str:
    """The operator family of a change (``cmp:0`` is ``cmp``, ``bin`` is ``arith``)."""
    return FAMILIES[change.split(":", 1)[0]]


def _number_value(node: ast.AST, parent: ast.AST | None) -> float | None:
    """The value of a number literal (``-3`` is one literal), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number_value(node.operand, None)
        return None if inner is None else -inner
    if (
        isinstance(node, ast.Constant)
        and type(node.value) in (int, float)
        and not (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub))
    ):
        return node.value  # type: ignore[no-any-return]
    return None


def _number(value: float, delta: int) -> ast.expr:
    new = value + delta
    if new < 0:
        return ast.UnaryOp(ast.USub(), ast.Constant(-new))
    return ast.Constant(new)


def _apply(node: ast.AST, change: str) -> ast.AST:
    """The replacement of ``node`` (``node`` itself changed in place, or a new node)."""
    if change.startswith("cmp:"):
        assert isinstance(node, ast.Compare)
        i = int(change.split(":")[1])
        node.ops[i] = _CMP_SWAP[type(node.ops[i])]()
        return node
    if change == "bin":
        assert isinstance(node, ast.BinOp)
        node.op = _BIN_SWAP[type(node.op)]()
        return node
    if change == "aug":
        assert isinstance(node, ast.AugAssign)
        node.op = _AUG_SWAP[type(node.op)]()
        return node
    if change == "bool":
        assert isinstance(node, ast.BoolOp)
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        return node
    if change == "unary":
        assert isinstance(node, ast.UnaryOp)
        return node.operand
    if change == "flip":
        assert isinstance(node, ast.Constant)
        return ast.Constant(not node.value)
    if change in ("plus", "minus"):
        delta = 1 if change == "plus" else -1
        if isinstance(node, ast.UnaryOp):
            assert isinstance(node.operand, ast.Constant)
            return _number(-node.operand.value, delta)
        assert isinstance(node, ast.Constant)
        return _number(node.value, delta)
    if change in ("pass", "delete"):
        return ast.Pass()
    if change.startswith("drop:"):
        assert isinstance(node, ast.BoolOp)
        i = int(change.split(":")[1])
        rest = [v for j, v in enumerate(node.values) if j != i]
        if len(rest) == 1:
            return rest[0]
        node.values = rest
        return node
    if change.startswith("swap:"):
        assert isinstance(node, ast.Tuple)
        i = int(change.split(":")[1])
        node.elts[i], node.elts[i + 1] = node.elts[i + 1], node.elts[i]
        return node
    if change == "guard":
        assert isinstance(node, ast.If)
        node.test = ast.Constant(True)
        return node
    if change.startswith("count:"):
        assert isinstance(node, ast.BinOp)
        return node.left if change == "count:left" else node.right
    if change == "unit":
        assert isinstance(node, ast.Constant) and isinstance(node.value, int | float)
        return ast.Constant(type(node.value)(_UNITS[int(node.value)]))
    if change == "continue":
        return ast.Continue()
    if change == "break":
        return ast.Break()
    if change == "minmax":
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        node.func = ast.Name("max" if node.func.id == "min" else "min", ast.Load())
        return node
    raise ValueError(f"unknown change {change!r}")


def mutants_of(module: str, source: str) -> list[Mutant]:
    """Every mutant of ``module`` (its source given), in source order, keys stable."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[Mutant] = []
    ctx = _context(tree)
    for index, (node, parent, is_last) in enumerate(_walk(tree)):
        for change, op in _changes(node, parent, is_last, ctx):
            lineno = getattr(node, "lineno", 0)
            text = lines[lineno - 1].strip() if lineno else ""
            end = getattr(node, "end_lineno", None) or lineno
            found.append(Mutant(module, index, change, lineno, text, op, end_line=end))
    found.sort(key=lambda m: (m.line, m.index, m.change))
    seen: dict[str, int] = {}
    keyed: list[Mutant] = []
    for m in found:
        base = f"{module}:{m.line_text}:{m.op}"
        n = seen.get(base, 0)
        seen[base] = n + 1
        keyed.append(
            Mutant(
                m.module, m.index, m.change, m.line, m.line_text, m.op, f"{base}#{n}", m.end_line
            )
        )
    return keyed


def mutated_tree(source: str, index: int, change: str) -> ast.Module:
    """The AST of ``source`` with the ``index``-th node changed by ``change``; every
    other node keeps its place (line and column), so it compiles to the same code."""
    tree = ast.parse(source)
    nodes = list(_walk(tree))
    target, parent, _ = nodes[index]
    replacement = _apply(target, change)
    if replacement is not target:
        assert parent is not None
        _replace_child(parent, target, replacement)
    ast.fix_missing_locations(tree)
    return tree


def mutated_source(source: str, mutant: Mutant) -> str:
    """``source`` with ``mutant`` applied (via the AST; comments are not kept)."""
    return ast.unparse(mutated_tree(source, mutant.index, mutant.change)) + "\n"


def function_bodies(source: str) -> list[range]:
    """The lines of the bodies of the module's functions and methods (nested ones
    inside them): a mutant wholly inside one changes only that function's code, which
    the warm process (``forkserver.py``) patches in memory. Decorators, defaults and
    annotations run when the ``def`` runs, and are not in a body."""
    spans: list[range] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                spans.append(range(node.body[0].lineno, (node.end_lineno or 0) + 1))
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(ast.parse(source).body)
    return spans


def _replace_child(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for name, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, name, new)
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is old:
                    value[i] = new
                    return
    raise ValueError("node not found under its parent")


# ----- configuration ------------------------------------------------------------------
@dataclass(frozen=True)
class ModuleConfig:
    name: str
    threshold: float | None  # percent; None: the score is reported, not gated
    sample: int | None  # None: every mutant in the test command's run
    seed: int
    in_test_command: bool = True  # False: only --full (or naming the module) runs it


@dataclass(frozen=True)
class Equivalent:
    """One entry of ``equivalent.toml``: exactly one mutant, named by module, the
    stripped text of its line, the operator and the occurrence (``#n`` of its key), and
    the argument why no test can tell it from the code."""

    module: str
    line: str
    operator: str
    occurrence: int | None  # None: the entry names no occurrence (refused by the run)
    reason: str

    @property
    def base(self) -> str:
        return f"{self.module}:{self.line}:{self.operator}"

    @property
    def key(self) -> str:
        return f"{self.base}#{'?' if self.occurrence is None else self.occurrence}"


@dataclass
class Config:
    modules: dict[str, ModuleConfig]
    timeout_factor: float
    timeout_min_s: float
    test_timeout_min_s: float
    env: dict[str, str]
    equivalents: list[Equivalent]
    also: list[Path] = field(default_factory=list)  # test files in the pool beyond the pure
    shell: list[Path] = field(default_factory=list)  # the pool's files for the shell's modules
    known: set[str] = field(default_factory=set)  # survivors.toml: known survivors' keys


def _gate(threshold: float | None) -> str:
    return "reported only" if threshold is None else f"{threshold:g} %"


def load_config(root: Path) -> Config:
    data = tomllib.loads((root / "tests/mutation/mutation.toml").read_text())
    modules = {
        name: ModuleConfig(
            name,
            None if m.get("threshold") is None else float(m["threshold"]),
            m.get("sample"),
            int(m.get("seed", 0)),
            bool(m.get("in_test_command", True)),
        )
        for name, m in data["modules"].items()
    }
    eq_data = tomllib.loads((root / "tests/mutation/equivalent.toml").read_text())
    equivalents: list[Equivalent] = []
    for e in eq_data.get("equivalent", []):
        occurrence = e.get("occurrence")
        entry = Equivalent(
            e["module"],
            e["line"].strip(),
            e["operator"],
            None if occurrence is None else int(occurrence),
            e.get("reason", "").strip(),
        )
        if not entry.reason:
            raise SystemExit(f"equivalent.toml: {entry.key}: every equivalent needs its reason")
        if any(x.key == entry.key for x in equivalents):
            raise SystemExit(f"equivalent.toml: {entry.key}: listed twice")
        equivalents.append(entry)
    run = data.get("run", {})
    return Config(
        modules,
        float(run.get("timeout_factor", 3.0)),
        float(run.get("timeout_min_s", 60.0)),
        float(run.get("test_timeout_min_s", 5.0)),
        {k: str(v) for k, v in data.get("env", {}).items()},
        equivalents,
        [Path(f) for f in data.get("tests", {}).get("also", [])],
        [Path(f) for f in data.get("tests", {}).get("shell", [])],
        load_known(root),
    )


SURVIVORS = "tests/mutation/survivors.toml"


def load_known(root: Path) -> set[str]:
    """The known survivors' keys (``survivors.toml``, written by ``--survivors``)."""
    path = root / SURVIVORS
    if not path.is_file():
        return set()
    return {str(k) for k in tomllib.loads(path.read_text()).get("known", [])}


def _write_whole(path: Path, text: str) -> None:
    """Write ``path`` by replacing it whole (a reader never sees half a file; two runs
    writing at once still keep only the later one's, each re-read just before)."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


def write_known(root: Path, results: list[ModuleResult], known: set[str]) -> None:
    """Rewrite ``survivors.toml``: the survivors of the modules just run in full (not
    the uncovered: those cost nothing to run), the other modules' entries kept."""
    ran = {r.module for r in results}
    keep = {k for k in known if k.split(":", 1)[0] not in ran}
    found = {o.mutant.key for r in results for o in r.outcomes if o.status == "survived"}
    lines = "".join(f"    {json.dumps(k)},\n" for k in sorted(keep | found))
    _write_whole(
        root / SURVIVORS,
        "# Known survivors: mutants the last full run (`mutate.py --full --survivors`) saw\n"
        "# survive, neither equivalent nor yet killed by a test. The test command's run counts\n"
        "# each as survived without running it (its score never overstates); `--full`,\n"
        "# `--recheck` and `--match` run them (docs/mutation.md). Generated: edit by a run.\n"
        f"known = [\n{lines}]\n",
    )


def match_equivalents(
    entries: list[Equivalent], mutants: list[Mutant]
) -> tuple[dict[str, Equivalent], list[str]]:
    """The mutants the entries exclude (key -> entry), and what is wrong with entries
    that do not name exactly one mutant: none (stale: the line or the change is gone)
    or several (no ``occurrence``: an entry may hide one mutant only, each with its
    own argument)."""
    by_base: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_base.setdefault(m.key.rpartition("#")[0], []).append(m)
    excluded: dict[str, Equivalent] = {}
    problems: list[str] = []
    for e in entries:
        same = by_base.get(e.base, [])
        hits = same if e.occurrence is None else [m for m in same if m.key == e.key]
        if e.occurrence is None:
            where = ", ".join(
                f"occurrence = {m.key.rpartition('#')[2]} at line {m.line}" for m in same
            )
            problems.append(
                f"equivalent.toml entry names no occurrence: {e.key} matches "
                f"{len(hits)} mutant(s){': ' + where if where else ''}; name exactly one"
            )
        elif not hits:
            problems.append(f"equivalent.toml entry matches no mutant: {e.key}")
        else:
            excluded[e.key] = e
    return excluded, problems


# ----- docs/mutation.md's generated tables ---------------------------------------------
DOCS = "docs/mutation.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def equivalents_table(cfg: Config) -> str:
    """The table of equivalent mutants, one row per entry of ``equivalent.toml``."""
    rows = [
        "| module | line | operator | why it is equivalent |",
        "|---|---|---|---|",
    ]
    for e in cfg.equivalents:
        rows.append(
            f"| `{e.module}.py` | `{_cell(e.line)}` | {e.operator} #{e.occurrence} "
            f"| {_cell(e.reason)} |"
        )
    return "\n".join(rows)


def operator_line(res: ModuleResult) -> str:
    """One module's outcome per operator family, for the run's output."""
    parts = []
    for fam, c in res.by_operator().items():
        if not c["run"]:
            continue  # its mutants equivalent, or not in this run (--match, a sample)
        left = c["survived"] + c["uncovered"]
        parts.append(
            f"{fam} {c['killed']}/{c['run']}"
            + (f" ({left} left: {c['uncovered']} not covered)" if left else "")
            + (f" +{c['equivalent']} eq" if c["equivalent"] else "")
        )
    return ", ".join(parts) or "no mutant"


def _sum_operators(results: list[ModuleResult]) -> dict[str, dict[str, int]]:
    total: dict[str, dict[str, int]] = {}
    for r in results:
        for fam, c in r.by_operator().items():
            row = total.setdefault(fam, dict.fromkeys(COUNTS, 0))
            for k in COUNTS:
                row[k] += c[k]
    return {f: total[f] for f in dict.fromkeys(FAMILIES.values()) if f in total}


def operators_table(counts: dict[str, dict[str, int]]) -> str:
    """The table of outcomes per operator family."""
    rows = [
        "| operator | mutants | equivalent | run | killed | survived | not covered | score |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fam, c in counts.items():
        score = f"{100.0 * c['killed'] / c['run']:.1f} %" if c["run"] else "-"
        rows.append(
            f"| {fam} | {c['mutants']} | {c['equivalent']} | {c['run']} | {c['killed']} "
            f"| {c['survived']} | {c['uncovered']} | {score} |"
        )
    return "\n".join(rows)


SCORES = "tests/mutation/scores.toml"


def load_scores(root: Path) -> dict[str, dict[str, Any]]:
    """Each module's last stored run (``scores.toml``, written by ``--docs``)."""
    path = root / SCORES
    if not path.is_file():
        return {}
    return dict(tomllib.loads(path.read_text()).get("modules", {}))


def stored_score(r: ModuleResult, when: str, command: str) -> dict[str, Any]:
    return {
        "last_run": when,
        "command": command,
        "mutants": r.total,
        "equivalent": r.equivalent,
        "run": r.run,
        "killed": r.killed,
        "uncovered": r.uncovered,
        "known": len(r.known),
        "seconds": round(r.seconds),
        "operators": r.by_operator(),
    }


def _toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def write_scores(root: Path, stored: dict[str, dict[str, Any]]) -> None:
    """Rewrite ``scores.toml``: one table per module, its last run's figures."""
    out = [
        "# Each module's last full run with `--docs` (tests/mutation/mutate.py): its counts,\n"
        "# in all and per operator family. Generated, not edited by hand; docs/mutation.md's\n"
        "# scores block is made from it (a module never run shows as not run).\n"
    ]
    for name in sorted(stored):
        out.append(f"\n[modules.{json.dumps(name)}]\n")
        for k, v in stored[name].items():
            if k != "operators":
                out.append(f"{k} = {_toml_value(v)}\n")
        out.append(f"\n[modules.{json.dumps(name)}.operators]\n")
        for fam, c in stored[name]["operators"].items():
            out.append(f"{fam} = {_toml_value(c)}\n")
    _write_whole(root / SCORES, "".join(out))


def scores_block(cfg: Config, stored: dict[str, dict[str, Any]]) -> str:
    """docs/mutation.md's scores block: a row per module the test command gates (and
    per other module of ``statemachine/`` with a stored run), what they stand at, and
    the outcomes per operator family summed over them."""
    names = [
        n for n, m in cfg.modules.items() if not is_shell(n) and (m.in_test_command or n in stored)
    ]
    gated = [n for n in names if cfg.modules[n].in_test_command]
    rows = [
        "| module | threshold | mutants | equivalent | run | killed | survived | not covered "
        "| known survivors | score | time | last run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    below: list[str] = []
    missing: list[str] = []
    total: dict[str, dict[str, int]] = {}
    for n in names:
        where = f"`{source_path(n).as_posix()}`"
        gate = cfg.modules[n].threshold
        s = stored.get(n)
        if s is None:
            missing.append(n)
            rows.append(f"| {where} | {_gate(gate)} | not run | | | | | | | | | |")
            continue
        score = 100.0 * s["killed"] / s["run"] if s["run"] else 100.0
        if gate is not None and score < gate and n in gated:
            below.append(f"`{n}` {score:.1f} %")
        rows.append(
            f"| {where} | {_gate(gate)} | {s['mutants']} | {s['equivalent']} | {s['run']} "
            f"| {s['killed']} | {s['run'] - s['killed'] - s['uncovered']} | {s['uncovered']} "
            f"| {s['known']} | {score:.1f} % | {s['seconds']} s | {s['last_run']} |"
        )
        for fam, c in s["operators"].items():
            row = total.setdefault(fam, dict.fromkeys(COUNTS, 0))
            for k in COUNTS:
                row[k] += c.get(k, 0)
    ran = [n for n in gated if n not in missing]
    if not ran:
        standing = "none has a stored run yet"
    elif below:
        standing = (
            f"{len(ran)} have a stored run: {len(ran) - len(below)} at or above their "
            f"threshold, below it: {', '.join(below)}"
        )
    else:
        standing = f"{len(ran)} have a stored run, each at or above its threshold"
    summary = (
        f"Of the {len(gated)} modules the test command gates, {standing}"
        + (f"; not run yet: {', '.join(f'`{n}`' for n in missing)}" if ran and missing else "")
        + ". A row is its module's last full run with `--docs` (its kind and date in the "
        f"last column; the figures in `{SCORES}`)."
    )
    fams = {f: total[f] for f in dict.fromkeys(FAMILIES.values()) if f in total}
    return (
        summary
        + "\n\n"
        + "\n".join(rows)
        + "\n\nBy operator, summed over the rows above:\n\n"
        + operators_table(fams)
    )


def scores_table(results: list[ModuleResult], thresholds: dict[str, float | None]) -> str:
    """The table of one run's scores, one row per module run."""
    rows = [
        "| module | threshold | mutants | equivalent | run | killed | not covered "
        "| known survivors | score | time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| `{source_path(r.module).as_posix()}` | {_gate(thresholds[r.module])} "
            f"| {r.total} | {r.equivalent} "
            f"| {r.run}{' sampled' if r.sampled else ''} | {r.killed} | {r.uncovered} "
            f"| {len(r.known)} | {r.score:.1f} % "
            f"| {r.seconds:.0f} s |"
        )
    return "\n".join(rows)


def run_kind(args: argparse.Namespace, full: bool) -> str:
    """What a run took, for its summary line and its generated block."""
    for kind, chosen in (
        ("quick-look", bool(args.tests)),
        ("shell", args.shell),
        ("full", full),
        ("match", bool(args.match)),
        ("recheck", args.recheck),
    ):
        if chosen:
            return kind
    return "test-command"


def write_block(root: Path, name: str, body: str) -> None:
    """Replace the generated block ``name`` of docs/mutation.md (between its markers)."""
    path = root / DOCS
    text = path.read_text()
    begin = f"<!-- generated: {name} (tests/mutation/mutate.py --docs) -->"
    end = f"<!-- end: {name} -->"
    if begin not in text or end not in text:
        raise SystemExit(f"mutate: {DOCS} has no generated block {name!r} ({begin} ... {end})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    _write_whole(path, f"{head}{begin}\n{body}\n{end}{tail}")


# ----- which tests ----------------------------------------------------------------------
_IMPURE = re.compile(r"^\s*(from|import)\s+controller\b", re.MULTILINE)


def _imports(path: Path, module: str | None) -> bool:
    """Does the test file import ``statemachine.<module>`` (any module when None), the
    package a module of ``statemachine/`` lies in (a package may load its modules
    itself, as a registry does), or the shell's module ``module``?"""
    text = path.read_text()
    if module is None:
        return bool(re.search(rf"^\s*(from|import)\s+{PACKAGE}\b", text, re.MULTILINE))
    full = import_name(module)
    package = full.rpartition(".")[0]
    names = [full] if is_shell(module) or package == PACKAGE else [full, package]
    pattern = "|".join(_import_of(n) for n in names)
    return bool(re.search(rf"^\s*({pattern})", text, re.MULTILINE))


def _import_of(dotted: str) -> str:
    """A pattern for a statement that imports the module ``dotted``, in any form."""
    parent, _, leaf = dotted.rpartition(".")
    return (
        rf"from\s+{re.escape(dotted)}\s+import|import\s+{re.escape(dotted)}\b|"
        rf"from\s+{re.escape(parent)}\s+import\s+.*\b{leaf}\b"
    )


def test_pool(root: Path, also: list[Path]) -> list[Path]:
    """The test files mutants are drawn from: those that import ``statemachine`` and
    nothing of ``controller`` (the pure ones), and ``also``: files of mutation.toml's
    ``[tests]`` that import ``controller`` yet need neither Docker nor
    ``tests/conftest.py`` (the baseline run shows they pass without them)."""
    pure = [
        path.relative_to(root)
        for path in sorted((root / "tests").glob("**/test_*.py"))
        if _imports(path, None) and not _IMPURE.search(path.read_text())
    ]
    return sorted({*pure, *also})


@dataclass
class LineMap:
    """Which tests run which lines of ``statemachine/``, from one run of the unmutated
    pure tests (``tests/mutation/selection.py``), and each test's time there."""

    lines: dict[str, dict[int, set[str]]] = field(default_factory=dict)  # module, line: ids
    outside: dict[str, set[int]] = field(default_factory=dict)  # lines run outside every test
    seconds: dict[str, float] = field(default_factory=dict)  # test id: its time

    def add(self, data: dict[str, Any]) -> None:
        """Merge one test file's map (the JSON the plugin writes)."""
        for module, by_line in data["lines"].items():
            mine = self.lines.setdefault(module, {})
            for n, ids in by_line.items():
                mine.setdefault(int(n), set()).update(ids)
        for module, ns in data["outside"].items():
            self.outside.setdefault(module, set()).update(ns)
        self.seconds.update(data["seconds"])

    def tests_for(self, m: Mutant, files: list[Path]) -> list[str]:
        """The tests a mutant runs, fastest first: those that run one of its lines.
        A line run outside every test (a module's constant, a ``def`` line's default)
        can change any test of the module: then every test that runs a line of it,
        and every test of ``files`` (the pure files that import it)."""
        span = range(m.line, max(m.line, m.end_line) + 1)
        by_line = self.lines.get(m.module, {})
        if any(n in self.outside.get(m.module, set()) for n in span):
            prefixes = tuple(f"{f.as_posix()}::" for f in files)
            ids = {t for t in self.seconds if t.startswith(prefixes)}
            ids.update(t for ts in by_line.values() for t in ts)
        else:
            ids = {t for n in span for t in by_line.get(n, ())}
        return sorted(ids, key=lambda t: (self.seconds.get(t, 0.0), t))


# ----- running ----------------------------------------------------------------------------
@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | timeout | uncovered (no test runs its line)
    seconds: float
    detail: str = ""
    tests: int = 0  # how many tests it was given
    how: str = ""  # "warm" (a fork of the warm process, patched) or "fresh" (a new one)


# A mutant past its time limit runs again at this many times the limit: a hang hangs
# again and is caught; a mutant that was only slow (a machine busy beside the run) gets
# the verdict its tests give. No mutant is killed by the machine's load.
RECHECK = 4.0
COUNTS = ("mutants", "equivalent", "run", "killed", "survived", "uncovered")
_COUNTED = {"timeout": "killed"}  # a hang is caught


@dataclass
class ModuleResult:
    module: str
    total: int = 0
    equivalent: int = 0
    run: int = 0
    sampled: bool = False
    seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    known: list[Mutant] = field(default_factory=list)  # known survivors, counted, not run
    every: list[Mutant] = field(default_factory=list)  # every mutant, equivalents included
    excluded: set[str] = field(default_factory=set)  # the equivalents' keys

    def by_operator(self) -> dict[str, dict[str, int]]:
        """Per operator family: mutants, equivalent, run, killed, survived (known
        survivors included), uncovered."""
        out: dict[str, dict[str, int]] = {}
        for m in self.every:
            row = out.setdefault(family(m.change), dict.fromkeys(COUNTS, 0))
            row["mutants"] += 1
            row["equivalent"] += m.key in self.excluded
        for o in self.outcomes:
            row = out.setdefault(family(o.mutant.change), dict.fromkeys(COUNTS, 0))
            row["run"] += 1
            row[_COUNTED.get(o.status, o.status)] += 1
        return {f: out[f] for f in dict.fromkeys(FAMILIES.values()) if f in out}

    @property
    def killed(self) -> int:
        return sum(1 for o in self.outcomes if o.status in ("killed", "timeout"))

    @property
    def uncovered(self) -> int:
        return sum(1 for o in self.outcomes if o.status == "uncovered")

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.run if self.run else 100.0


def _copy_repo(root: Path, dest: Path) -> None:
    ignore = shutil.ignore_patterns(
        "__pycache__", ".hypothesis", ".pytest_cache", "*.pyc", ".mypy_cache", ".ruff_cache"
    )
    for name in (PACKAGE, "tests", "controller", "docs", "manifests"):  # what tests read
        if (root / name).is_dir():
            shutil.copytree(root / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml",):
        if (root / name).is_file():
            shutil.copy2(root / name, dest / name)


def _env(copy_root: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(copy_root), str(copy_root / "tests/mutation")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # the installed pytest plugins (schemathesis, anyio) take two thirds of a pure test
    # file's start-up, once per mutant; the pure tests need only Hypothesis's
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    return env


PYTEST_FLAGS = [
    "-x",
    "-q",
    "-p",
    "no:cacheprovider",
    "--noconftest",  # tests/conftest.py: the Docker fixtures, which no pure test uses
    "-p",
    "_hypothesis_pytestplugin",  # plugin autoload is off (see _env): Hypothesis only
    "-p",
    "hypothesis_profile",
    "-p",
    "selection",  # the line map, or only the tests a mutant was given
    "--hypothesis-profile=mutation",
    "--no-header",
    "-o",
    "addopts=",
]


def _pytest(
    copy_root: Path, files: list[Path], env: dict[str, str], timeout: float
) -> tuple[str, float, str]:
    cmd = [sys.executable, "-m", "pytest", *map(str, files), *PYTEST_FLAGS]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=copy_root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _LIVE.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", time.monotonic() - t0, f"no result within {timeout:.0f}s"
    finally:
        _LIVE.discard(proc)
    dt = time.monotonic() - t0
    tail = "\n".join(out.strip().splitlines()[-3:])
    if proc.returncode == 0:
        return "survived", dt, tail
    if proc.returncode in (1, 2, 3):  # failed, interrupted (an import error), internal
        return "killed", dt, tail
    return f"error {proc.returncode}", dt, out[-3000:]


class Worker:
    """One worker's private copy of the repository and its warm process
    (``forkserver.py``, started at its first patchable mutant)."""

    def __init__(self, root: Path, pool: list[Path], extra: dict[str, str]) -> None:
        self.root = root
        self.pool = pool
        self.extra = extra
        self.server: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        config = {"files": [str(f) for f in self.pool], "pytest_args": PYTEST_FLAGS}
        log = (self.root / "forkserver.log").open("w")
        server = subprocess.Popen(
            [sys.executable, str(HERE / "forkserver.py"), json.dumps(config)],
            cwd=self.root,
            env=_env(self.root, self.extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        _LIVE.add(server)
        assert server.stdout is not None
        ready = json.loads(server.stdout.readline() or '{"ready": false}')
        if not ready.get("ready"):
            log.close()
            tail = (self.root / "forkserver.log").read_text()[-3000:]
            raise SystemExit(f"mutate: the warm test process did not start: {ready}\n{tail}")
        return server

    def patched(self, m: Mutant, tests: list[str], limits: list[float]) -> Outcome:
        """Run ``m`` in a fork of the warm process; ``unpatched`` when it cannot be."""
        if self.server is None or self.server.poll() is not None:
            self.server = self._start()
        request = {
            "module": m.module,
            "path": str(self.root / source_path(m.module)),
            "import": import_name(m.module),
            "index": m.index,
            "change": m.change,
            "tests": tests,
            "limits": limits,
            "out": str(self.root / "mutant.log"),
        }
        assert self.server.stdin is not None and self.server.stdout is not None
        try:
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            line = self.server.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:  # the warm process ended (killed from outside, out of memory):
            self._report_end()  # say so, and judge this mutant in a fresh process
            return Outcome(m, "unpatched", 0.0, "the warm process ended", len(tests), "warm")
        answer = json.loads(line)
        return Outcome(m, answer["status"], answer["seconds"], answer["tail"], len(tests), "warm")

    def _report_end(self) -> None:
        assert self.server is not None
        _LIVE.discard(self.server)
        self.server.wait()
        log = (self.root / "forkserver.log").read_text(errors="replace")[-2000:]
        print(
            f"mutate: the warm test process ended (status {self.server.returncode}); "
            f"started again at the next mutant. Its log ends:\n{log}",
            file=sys.stderr,
            flush=True,
        )
        self.server = None

    def close(self) -> None:
        if self.server is not None:
            _LIVE.discard(self.server)
            with contextlib.suppress(OSError):
                assert self.server.stdin is not None
                self.server.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGKILL)


def line_map(
    copies: queue.Queue[Path], files: list[Path], extra: dict[str, str], workers: int
) -> LineMap:
    """The unmutated pure tests' line map (the files run side by side, one per worker,
    each under coverage); exits when one fails."""
    copy_root = copies.get()
    try:
        env = _env(copy_root, extra)
        probe = subprocess.run(
            [sys.executable, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"],
            cwd=copy_root,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        copies.put(copy_root)
    if not Path(probe.stdout.strip()).resolve().is_relative_to(copy_root.resolve()):
        raise SystemExit(f"mutate: {PACKAGE} imports from {probe.stdout.strip()}, not the copy")

    def one(f: Path) -> tuple[Path, str, float, str, dict[str, Any]]:
        dest = copies.get()
        out = dest / f"map-{f.stem}.json"
        try:
            env = {**_env(dest, extra), "VRAMCTL_MUTATION_MAP": str(out)}
            status, dt, detail = _pytest(dest, [f], env, timeout=1800)
            data = json.loads(out.read_text()) if status == "survived" else {}
            return f, status, dt, detail, data
        finally:
            copies.put(dest)

    found = LineMap()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for f, status, dt, detail, data in pool.map(one, files):
            if status != "survived":
                raise SystemExit(f"mutate: {f} fails on the unmutated code ({status}):\n{detail}")
            found.add(data)
            print(f"mutate: mapped {f.name} in {dt:.1f}s", flush=True)
    return found


def run(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    cfg = load_config(root)
    full = args.full or os.environ.get("VRAMCTL_MUTATION", "") == "full"
    names = args.modules or [
        n
        for n, m in cfg.modules.items()
        if (is_shell(n) if args.shell else not is_shell(n) and (full or m.in_test_command))
    ]
    if args.survivors and (args.match or args.sample is not None or not (full or args.recheck)):
        print("mutate: --survivors needs every mutant run (--full or --recheck)", file=sys.stderr)
        return 2
    unknown = [n for n in names if n not in cfg.modules]
    if unknown:
        print(f"mutate: no such module in mutation.toml: {', '.join(unknown)}", file=sys.stderr)
        return 2

    plan: dict[str, tuple[ModuleResult, list[Mutant], list[Path]]] = {}
    every_key: set[str] = set()
    problems: list[str] = []
    pool = test_pool(root, cfg.also)
    if any(is_shell(n) for n in names):
        pool = sorted({*pool, *cfg.shell})
    if args.tests:  # a quick look while writing tests: never a gate (see --help)
        pool = [Path(t) for t in args.tests]
    for name in names:
        mc = cfg.modules[name]
        source = (root / source_path(name)).read_text()
        every = mutants_of(name, source)
        every_key |= {m.key for m in every}
        excluded, wrong = match_equivalents([e for e in cfg.equivalents if e.module == name], every)
        problems += wrong
        res = ModuleResult(
            name, total=len(every), equivalent=len(excluded), every=every, excluded=set(excluded)
        )
        todo = [m for m in every if m.key not in excluded]
        if args.operators == "classic":
            todo = [m for m in todo if family(m.change) in CLASSIC]
        if args.match:
            todo = [m for m in todo if any(t in m.key for t in args.match)]
        whole = full or args.recheck  # a module run again whole: no sample
        sample = args.sample if args.sample is not None else (None if whole else mc.sample)
        if args.match:
            sample = None
        if sample is not None and sample < len(todo):
            # keyed by the module's own name, not its package: a move between the core's
            # wings keeps the sample it had (docs/mutation.md)
            stem = name.rsplit(".", 1)[-1]
            rng = random.Random(f"{stem}:{args.seed if args.seed is not None else mc.seed}")
            todo = sorted(rng.sample(todo, sample), key=lambda m: (m.line, m.key))
            res.sampled = True
        res.run = len(todo)
        if not (full or args.recheck or args.match):
            res.known = [m for m in todo if m.key in cfg.known]
            todo = [m for m in todo if m.key not in cfg.known]
        plan[name] = (res, todo, [f for f in pool if _imports(root / f, name)])
    stale = sorted(k for k in cfg.known if k.split(":", 1)[0] in plan and k not in every_key)
    if stale:  # a changed line: its mutants run again; the entry only needs removing
        print(f"mutate: {SURVIVORS}: entries that match no mutant (remove them): {stale}")

    if args.survivors and any(res.sampled for res, _, _ in plan.values()):
        problems.append("--survivors needs every mutant run: a module is sampled")
    if problems:
        for problem in problems:
            print(f"mutate: {problem}", file=sys.stderr)
        return 2

    if args.docs:
        write_block(root, "equivalents", equivalents_table(cfg))
        write_block(root, "scores", scores_block(cfg, load_scores(root)))
    if args.list:
        for name, (res, todo, files) in plan.items():
            print(f"# {name}: {res.total} mutants, {res.equivalent} equivalent, {res.run} to run")
            print(f"#   test files importing it: {' '.join(map(str, files)) or 'none'}")
            for m in todo:
                print(f"{m.key}\n    {m.describe()}")
        return 0

    workers = max(1, min(MAX_WORKERS, args.workers))
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vramctl-mutate-") as tmp:
        copies: queue.Queue[Path] = queue.Queue()
        for i in range(workers):
            dest = Path(tmp) / f"w{i}"
            dest.mkdir()
            _copy_repo(root, dest)
            copies.put(dest)
        measured = sorted({source_path(n).parent.as_posix() for n in plan})
        lmap = line_map(
            copies, pool, {**cfg.env, "VRAMCTL_MUTATION_MEASURE": ",".join(measured)}, workers
        )

        workers_q: queue.Queue[Worker] = queue.Queue()
        every_worker: list[Worker] = []
        while not copies.empty():
            w = Worker(copies.get(), pool, cfg.env)
            every_worker.append(w)
            workers_q.put(w)
        bodies = {name: function_bodies((root / source_path(name)).read_text()) for name in plan}

        def patchable(m: Mutant) -> bool:
            inside = any(m.line in r and max(m.line, m.end_line) in r for r in bodies[m.module])
            at_import = lmap.outside.get(m.module, set())
            span = range(m.line, max(m.line, m.end_line) + 1)
            return inside and not any(n in at_import for n in span)

        def one(m: Mutant, files: list[Path]) -> Outcome:
            tests = lmap.tests_for(m, files)
            if not tests:
                return Outcome(m, "uncovered", 0.0, "no test runs its line")
            timeout = max(
                cfg.timeout_min_s, cfg.timeout_factor * sum(lmap.seconds[t] for t in tests)
            )
            test_files = [Path(f) for f in dict.fromkeys(t.split("::", 1)[0] for t in tests)]
            w = workers_q.get()
            try:
                if patchable(m) and not args.fresh:
                    limits = [
                        max(cfg.test_timeout_min_s, cfg.timeout_factor * lmap.seconds[t])
                        for t in tests
                    ]
                    out = w.patched(m, tests, limits)
                    if out.status == "timeout":  # a hang, or a busy machine: again
                        out = w.patched(m, tests, [RECHECK * x for x in limits])
                    if out.status != "unpatched":
                        return out
                out = fresh_process(w.root, m, tests, test_files, timeout)
                if out.status == "timeout":
                    out = fresh_process(w.root, m, tests, test_files, RECHECK * timeout)
                return out
            finally:
                workers_q.put(w)

        def fresh_process(
            dest: Path, m: Mutant, tests: list[str], test_files: list[Path], timeout: float
        ) -> Outcome:
            target = dest / source_path(m.module)
            original = target.read_text()
            chosen = dest / "selected.json"
            try:
                chosen.write_text(json.dumps(tests))
                target.write_text(mutated_source(original, m))
                env = {**_env(dest, cfg.env), "VRAMCTL_MUTATION_TESTS": str(chosen)}
                status, dt, detail = _pytest(dest, test_files, env, timeout)
            finally:
                target.write_text(original)
            return Outcome(m, status, dt, detail, len(tests), "fresh")

        errors: list[Outcome] = []
        try:
            for name, (res, todo, files) in plan.items():
                t_mod = time.monotonic()
                res.outcomes += [
                    Outcome(m, "survived", 0.0, "known survivor", how="known") for m in res.known
                ]
                pool = concurrent.futures.ThreadPoolExecutor(workers)
                try:
                    for out in pool.map(lambda m: one(m, files), todo):  # noqa: B023
                        if out.status.startswith("error"):
                            errors.append(out)
                            continue
                        res.outcomes.append(out)
                        if args.verbose or out.status in ("survived", "uncovered"):
                            print(
                                f"  {out.status:9s} {out.seconds:5.1f}s {out.tests:4d} tests "
                                f"{out.how or '-':5s} {out.mutant.describe()}",
                                flush=True,
                            )
                finally:  # stopped: no queued mutant starts after this
                    pool.shutdown(wait=True, cancel_futures=True)
                res.seconds = time.monotonic() - t_mod
                print(
                    f"mutate: {name}: {res.total} mutants, {res.equivalent} equivalent, "
                    f"{res.run} run, {res.killed} killed ({res.score:.1f} %, threshold "
                    f"{_gate(cfg.modules[name].threshold)}) in {res.seconds:.0f}s; "
                    f"{res.uncovered} not covered by any test, {len(res.known)} known "
                    f"survivors counted without running, "
                    f"{_mean(o.tests for o in res.outcomes):.0f} tests per mutant",
                    flush=True,
                )
                print(f"mutate: {name} by operator: {operator_line(res)}", flush=True)
        finally:
            for w in every_worker:
                w.close()
        if errors:
            for e in errors:
                print(f"mutate: {e.mutant.describe()}: {e.status}\n{e.detail}", file=sys.stderr)
            return 2

    elapsed = time.monotonic() - t_start
    if args.survivors:
        # read again now: a run of other modules may have rewritten it since this began
        write_known(root, [res for res, _, _ in plan.values()], load_known(root))
    below = [
        n
        for n, (res, _, _) in plan.items()
        if (gate := cfg.modules[n].threshold) is not None and res.score < gate
    ]
    results = [res for res, _, _ in plan.values()]
    print(f"mutate: {run_kind(args, full)} run in {elapsed:.0f}s with {workers} worker(s)")
    print("mutate: by operator, every module run:\n" + operators_table(_sum_operators(results)))
    if args.docs:
        thresholds = {n: m.threshold for n, m in cfg.modules.items()}
        command = " ".join(["mutate.py", *_shown(sys.argv[1:])])
        if all(is_shell(n) for n in plan):
            write_block(
                root,
                "shell-scores",
                f"`{command}`: {run_kind(args, full)} run, {workers} worker(s), "
                f"{elapsed:.0f} s in all.\n\n"
                + scores_table(results, thresholds)
                + "\n\nBy operator, every module of this run:\n\n"
                + operators_table(_sum_operators(results)),
            )
        elif args.match or args.tests or any(r.sampled for r in results):
            print(f"mutate: {SCORES} not written: a run of only some mutants is no module's score")
        else:
            stored = load_scores(root)
            day = time.strftime("%Y-%m-%d", time.gmtime())
            for r in results:
                stored[r.module] = stored_score(r, f"{run_kind(args, full)}, {day}", command)
            write_scores(root, stored)
            write_block(root, "scores", scores_block(cfg, stored))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    n: {
                        "mutants": res.total,
                        "equivalent": res.equivalent,
                        "run": res.run,
                        "killed": res.killed,
                        "score": round(res.score, 1),
                        "survivors": [
                            o.mutant.key
                            for o in res.outcomes
                            if o.status in ("survived", "uncovered")
                        ],
                        "uncovered": [
                            o.mutant.key for o in res.outcomes if o.status == "uncovered"
                        ],
                        "operators": res.by_operator(),
                    }
                    for n, (res, _, _) in plan.items()
                },
                indent=1,
            )
        )
    if below:
        print(f"mutate: FAILED: below threshold: {', '.join(below)}", file=sys.stderr)
        return 1
    return 0


def _shown(argv: list[str]) -> list[str]:
    """The run's arguments as the docs show them: without the paths of --json and --root."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--json", "--root"):
            skip = True
        elif not a.startswith(("--json=", "--root=")):
            out.append(a)
    return out


def _mean(values: Iterator[int]) -> float:
    seen = list(values)
    return sum(seen) / len(seen) if seen else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help="modules of statemachine/ (default: mutation.toml)")
    p.add_argument(
        "--full",
        action="store_true",
        help="every mutant of statemachine/ (also VRAMCTL_MUTATION=full)",
    )
    p.add_argument(
        "--shell",
        action="store_true",
        help="the shell's modules of mutation.toml (reported, with the tests of [tests] shell)",
    )
    p.add_argument("--sample", type=int, help="run this many mutants per module (seeded)")
    p.add_argument("--seed", type=int, help="the sample's seed (default: mutation.toml)")
    p.add_argument("--workers", type=int, default=MAX_WORKERS, help="at most 2")
    p.add_argument("--list", action="store_true", help="print the mutants and run nothing")
    p.add_argument(
        "--tests",
        nargs="+",
        metavar="FILE",
        help="only these test files in the pool (a quick look while writing tests; "
        "a mutant they miss may be killed by another file)",
    )
    p.add_argument(
        "--recheck",
        action="store_true",
        help=f"run every mutant of the modules, the known survivors of {SURVIVORS} too "
        "(--full and --match do), no sample",
    )
    p.add_argument(
        "--survivors",
        action="store_true",
        help=f"rewrite {SURVIVORS} from this run's survivors (a run of every mutant only)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="every mutant in a fresh interpreter (no warm process; slower, same judgement)",
    )
    p.add_argument(
        "--match",
        action="append",
        metavar="TEXT",
        help="only the mutants whose key holds TEXT (repeatable; every match, no sample)",
    )
    p.add_argument(
        "--operators",
        choices=("all", "classic"),
        default="all",
        help="classic: only the first operator families (the test command's stage)",
    )
    p.add_argument("--json", help="write the scores and survivors to this file")
    p.add_argument(
        "--docs",
        action="store_true",
        help=f"rewrite {DOCS}'s generated tables: the equivalents, and the scores of this run",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print every mutant's outcome")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    def stop(signum: int, _frame: object) -> None:
        _end_live()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        return run(args)
    finally:
        _end_live()


def _end_live() -> None:
    """End the test runs in flight: a stopped run leaves nothing behind."""
    for proc in list(_LIVE):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
