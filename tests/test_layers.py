"""The grader's layers, as its code draws them (benchmarks/import_graph.py; docs/grader.md
describes each layer): imports run one way, from the command line down to what every layer
shares, with no circle, no module over 500 lines and no class over 200."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GRADER = REPO / "grader"
spec = importlib.util.spec_from_file_location("import_graph",
                                              REPO / "benchmarks" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
sys.modules["import_graph"] = import_graph
spec.loader.exec_module(import_graph)

# Lowest first: a module may import from its own layer and the layers before it.
LAYERS = ["grader.common", "grader.content", "grader.intake", "grader.grading",
          "grader.gradebook", "grader.outputs", "grader.course", "grader.lab", "grader.cli",
          "grader.__main__"]


def layer_of(module: str) -> int:
    for rank, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and docs/grader.md")


def test_the_grader_has_no_import_circle() -> None:
    assert import_graph.circles(import_graph.graph()) == []


def test_imports_run_down_the_layers() -> None:
    upward = [(a, b) for a, targets in import_graph.graph().items() if a != "grader"
              for b in targets if layer_of(b) > layer_of(a)]
    assert upward == []


def test_no_module_over_500_lines_and_no_class_over_200() -> None:
    modules, classes = import_graph.oversized()
    assert (modules, classes) == ([], [])


def test_every_layer_says_what_it_owns_in_its_docstring_and_in_docs() -> None:
    guide = (REPO / "docs" / "grader.md").read_text()
    for prefix in LAYERS[:6]:
        package = REPO / Path(*prefix.split(".")) / "__init__.py"
        if package.exists():
            doc = package.read_text()
            assert doc.startswith('"""') and len(doc) > 80, prefix
        assert f"`{prefix.replace('.', '/')}" in guide, f"docs/grader.md says nothing of {prefix}"


def test_the_grader_parses_python_only_through_its_lock() -> None:
    """CPython 3.11 may fail two threads that parse at once (grader/common/syntax.py): no
    module of the grader calls ``ast.parse`` or ``compile`` on source itself."""
    import re

    direct = re.compile(r"\bast\.parse\(|(?<![.\w])compile\(")
    offenders = [str(path.relative_to(GRADER.parent)) for path in GRADER.rglob("*.py")
                 if "labextension" not in path.parts and path.name != "syntax.py"
                 and direct.search(path.read_text())]
    assert offenders == []


def test_commands_that_grade_nothing_do_not_load_torch() -> None:
    """torch costs a second of CPU to import: the command line, the course and every layer but
    grading load it only when a command grades, releases or syncs (export, report, review,
    feedback and the rest start without it)."""
    import subprocess

    code = ("import sys, grader.cli, grader.course, grader.outputs.report, grader.outputs.export,"
            " grader.outputs.feedback, grader.gradebook.review, grader.gradebook.batch;"
            " print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    assert loaded.strip() == "[]", loaded
