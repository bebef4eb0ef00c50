"""The modules of ``alea_trl`` import one another without cycles.

The graph is read from the source, not from ``sys.modules``: every ``import`` / ``from ... import`` statement of every
module (module level, inside functions and classes, under ``if``/``try`` alike) that names a module of the package is an
edge, relative imports resolved. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``; what is no module of the package (another package, or a module that does not exist) is no edge. Python's own
import of a package before its submodules is not an edge, so a package ``__init__`` that imports its submodules is not
a cycle by itself; a submodule that imports back from its package ``__init__`` is.

Run as a script to print the cycles: ``python tests/test_import_graph.py`` (outside ``alea_trl.trainer``),
``python tests/test_import_graph.py --all`` (the whole package).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


PACKAGE = "alea_trl"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE
TRAINER = f"{PACKAGE}.trainer"


def module_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of the package (``__init__.py`` named as its package)."""
    root = package_dir.parent
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(module: str, is_package: bool, node: ast.AST, modules: dict) -> list[str]:
    """The modules one import statement of ``module`` names, relative ones resolved (known to the package or not)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    return targets


def _import_statements(package_dir: Path):
    """``(module, line, imported module names)`` for every import statement of the package, and the modules."""
    modules = module_files(package_dir)
    statements = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                statements.append((module, node.lineno, _imported(module, path.name == "__init__.py", node, modules)))
    return statements, modules


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """``{module: the package modules it imports}`` for every module of the package."""
    statements, modules = _import_statements(package_dir)
    graph = {module: set() for module in modules}
    for module, _, targets in statements:
        graph[module] |= {t for t in targets if t in modules and t != module}
    return graph


def unresolved_imports(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """``module:line: name`` for each import of a module of the package that has no file (not counted as an edge)."""
    statements, modules = _import_statements(package_dir)
    prefix = package_dir.name
    return [
        f"{module}:{line}: {target}"
        for module, line, targets in statements
        for target in sorted(set(targets))
        if (target == prefix or target.startswith(prefix + ".")) and target not in modules
    ]


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` for each strongly connected group of modules that import one another (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(_cycle_in(graph, group) for group in groups)


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the first (sorted) module of ``group``, found breadth-first inside the group."""
    start = min(group)
    parent, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if nxt not in parent:
                    parent[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def outside(graph: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    """The graph restricted to the modules not in the (sub)package ``prefix``."""

    def kept(module):
        return module != prefix and not module.startswith(prefix + ".")

    return {m: {t for t in targets if kept(t)} for m, targets in graph.items() if kept(m)}


def _report(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_graph_sees_relative_and_function_level_imports():
    graph = import_graph()
    assert f"{PACKAGE}.configuration_alea" in graph[f"{PACKAGE}.modeling_alea"]  # from .configuration_alea import
    assert f"{PACKAGE}.envs.registry" in graph[f"{PACKAGE}.envs"]  # a package __init__ importing its submodule
    assert f"{PACKAGE}.envs.gymnasium" in graph[f"{PACKAGE}.envs.registry"]  # an import inside a function
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycle_outside_the_trainer():
    cycles = import_cycles(outside(import_graph(), TRAINER))
    assert not cycles, f"import cycles among the modules outside {TRAINER}:\n{_report(cycles)}"


def test_no_import_cycle():
    cycles = import_cycles(import_graph())
    assert not cycles, f"import cycles among the modules of {PACKAGE}:\n{_report(cycles)}"


if __name__ == "__main__":
    whole = "--all" in sys.argv[1:]
    graph = import_graph() if whole else outside(import_graph(), TRAINER)
    found = import_cycles(graph)
    where = PACKAGE if whole else f"{PACKAGE} outside {TRAINER}"
    print(f"{len(graph)} modules of {where}, {sum(map(len, graph.values()))} imports between them")
    print(_report(found) if found else "no import cycle")
    missing = [m for m in unresolved_imports() if whole or m.split(":")[0] in graph]
    if missing:
        print("imports of package modules that have no file (left out of the graph):", *missing, sep="\n  ")
    sys.exit(1 if found else 0)
