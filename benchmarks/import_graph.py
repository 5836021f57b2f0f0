"""The grader's import graph, drawn from its code: which module imports which, any circle, and
the modules and classes over their size limits.

    python benchmarks/import_graph.py [--dot FILE]

Every ``import`` and ``from ... import`` of a ``grader`` module counts, at the top of a module
or inside a function (an import deferred into a function is still a dependency). A circle is a
strongly connected component of more than one module (Tarjan's algorithm). ``--dot`` writes the
graph for Graphviz. tests/test_layers.py asserts the same (no circle, no module over 500 lines,
no class over 200, imports only downwards through the layers docs/grader.md describes).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "grader"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 200


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
            if "node_modules" not in p.parts}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The grader modules ``path`` imports (``from grader import x`` counts as grader.x where
    that is a module)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            submodules = [f"{base}.{a.name}" for a in node.names
                          if f"{base}.{a.name}" in known]
            targets = submodules or [base]  # ``from package import module``: the module
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target not in (name, "grader") and target.startswith("grader."):
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(path, name, known) for name, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return result


def oversized() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(module, lines) over MAX_MODULE_LINES and (module.Class, lines) over MAX_CLASS_LINES."""
    big_modules, big_classes = [], []
    for name, path in modules().items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            big_modules.append((name, lines))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    big_classes.append((f"{name}.{node.name}", length))
    return big_modules, big_classes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dot", type=Path, help="write the graph in Graphviz's dot language")
    args = parser.parse_args()
    edges = graph()
    for name in sorted(edges):
        lines = len(modules()[name].read_text().splitlines())
        print(f"{name} ({lines} lines) -> {', '.join(sorted(edges[name])) or '-'}")
    found = circles(edges)
    big_modules, big_classes = oversized()
    print(f"\n{len(edges)} modules; circles: {len(found)}")
    for component in found:
        print("  circle: " + " <-> ".join(component))
    for name, lines in big_modules:
        print(f"  module over {MAX_MODULE_LINES} lines: {name} ({lines})")
    for name, lines in big_classes:
        print(f"  class over {MAX_CLASS_LINES} lines: {name} ({lines})")
    if args.dot:
        args.dot.write_text("digraph grader {\n  rankdir=LR;\n" + "".join(
            f'  "{a}" -> "{b}";\n' for a in sorted(edges) for b in sorted(edges[a])) + "}\n")
    return 1 if found or big_modules or big_classes else 0


if __name__ == "__main__":
    sys.exit(main())
