"""No import circles inside the package: at import time, under ``if TYPE_CHECKING:`` or inside a
function (a lazy import), every import of every module points one way.

The graph is read from the source with :mod:`ast`, so it sees what running the code would not
(type-checking imports, imports in functions no test calls). An edge goes from a module to the
module it names: ``from .x import y`` is an edge to ``x``, or to ``x.y`` when that is a module;
a package's ``__init__`` is the node of the package. A parent package imported implicitly (by
importing one of its modules) is not an edge.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import otel_loopguard

PACKAGE = Path(otel_loopguard.__file__).resolve().parent
ROOT = PACKAGE.name

#: Cycles that only another change can break, each with the file that must break it. Empty: a
#: new cycle fails the test, and so does a listed one that is gone.
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _module_names() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The package modules ``module`` names in any import statement, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target not in modules:
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                yield submodule if submodule in modules else target


def import_graph() -> dict[str, set[str]]:
    modules = _module_names()
    return {
        module: {target for target in _imported(module, path, modules) if target != module}
        for module, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """One shortest cycle through each strongly connected component of more than one module,
    each as its modules in import order, starting at the smallest name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan; the package is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_shortest_cycle(graph, component) for component in components)


def _shortest_cycle(graph: dict[str, set[str]], component: set[str]) -> tuple[str, ...]:
    start = min(component)
    paths: dict[str, tuple[str, ...]] = {start: (start,)}
    frontier = [start]
    while frontier:  # breadth first, inside the component, back to start
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    return paths[node]
                if target not in paths:
                    paths[target] = (*paths[node], target)
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert len(graph) > 40
    assert "otel_loopguard._guard" in graph["otel_loopguard"]  # at the top of the module
    # Under `if TYPE_CHECKING:` (service/_seam.py types against the options only there).
    assert "otel_loopguard.service._options" in graph["otel_loopguard.service._seam"]
    # Inside a function (load_policy imports plugins only when a plugin config is given).
    assert "otel_loopguard._plugins" in graph["otel_loopguard.config"]
    # `from . import x` names the module x, not the package.
    assert "otel_loopguard.replay._html" in graph["otel_loopguard.replay._run"]


def test_cycles_are_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [("a", "b", "c")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_package() -> None:
    found = cycles(import_graph())
    unexpected = [" -> ".join((*cycle, cycle[0])) for cycle in found if cycle not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles:\n" + "\n".join(unexpected)
    gone = [cycle for cycle in ALLOWED_CYCLES if cycle not in found]
    assert not gone, f"allowed cycles that are gone, remove them from ALLOWED_CYCLES: {gone}"
