"""The import graph of ``controller`` and ``statemachine`` has no cycle.

The graph is grimp's (the library import-linter builds its contracts on), with every
import counted, those under ``TYPE_CHECKING`` and those inside functions included: a
circle held together by either is still a circle. What is not counted: an edge from a
package's ``__init__`` to a module below that package (a package re-exporting its own
parts), since importing the part imports its package first anyway.
"""

from __future__ import annotations

import grimp

PACKAGES = ("controller", "statemachine")


def _below(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def _edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """module -> the modules it imports, a package's import of its own parts left out."""
    return {
        m: {t for t in graph.find_modules_directly_imported_by(m) if not _below(m, t)}
        for m in graph.modules
    }


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members: list[str] = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.append(top)
                    if top == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def test_cycle_finder_finds_a_circle_and_only_a_circle() -> None:
    """The finder itself: a three-module circle is found, a chain beside it is not."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_controller_and_statemachine_import_no_circle() -> None:
    graph = grimp.build_graph(*PACKAGES)
    cycles = _cycles(_edges(graph))
    assert cycles == [], "import circles (each a set of modules that import each other): " + (
        "; ".join(" <-> ".join(c) for c in cycles)
    )
