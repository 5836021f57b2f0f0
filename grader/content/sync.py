"""Keep each lesson notebook in step with the code it is generated from.

One source of truth per piece:
- a graded function's code lives in ``solutions/<module>.py``; its notebook cell (grade id =
  function name) is that code with the body between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``, so nbgrader can strip it for the student version;
- the ``check`` helper lives in ``grader/content/notebook_checks.py``; the notebook's ``checks``
cell is a
  copy;
- hidden checks are call expressions in ``grader/content/cases/<module>.py``; the hidden region of
each
  test cell holds them with the reference's results written out as literals;
- data files live in ``data/``; a lesson folder holds copies of the ones it names.

``python -m grader sync`` rewrites all of these (and strips outputs); ``--check`` only reports
what differs, and the test suite fails on any difference.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import textwrap
from collections.abc import Callable
from types import ModuleType

import nbformat
import torch

from grader.common import syntax
from grader.common.errors import CourseError
from grader.content.cases import Case, as_case, reference_raises, reference_value
from grader.content.lessons import BEGIN_HIDDEN, CHECKS_SOURCE, DATA, END_HIDDEN, Lesson
from grader.content.notebook_checks import _difference
from grader.content.variants import Variants, variants_of

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
MAX_LITERAL_ELEMENTS = 64  # larger tensors need an oracle expression (Case.expected)


# ------------------------------------------------------------------ solution cells


def _body_region(node: ast.FunctionDef, lines: list[str]) -> tuple[int, int, str]:
    """First and last line (0-based, inclusive) of a function's body after its docstring,
    and the body's indentation."""
    body = node.body
    has_docstring = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                     and isinstance(body[0].value.value, str))
    if has_docstring and len(body) == 1:
        raise CourseError(f"{node.name} has only a docstring: nothing to hide")
    start = body[0].end_lineno if has_docstring else _header_end(node, lines)
    first = body[1] if has_docstring else body[0]
    indent = lines[first.lineno - 1][: first.col_offset]
    return start, node.end_lineno - 1, indent


def _header_end(node: ast.FunctionDef, lines: list[str]) -> int:
    """0-based index of the line after the one holding the ``def ...:`` colon."""
    line = node.body[0].lineno - 1
    while line > node.lineno - 1 and not lines[line - 1].rstrip().endswith(":"):
        line -= 1
    return line


def _definition_source(node: ast.stmt, lines: list[str], hide: bool) -> str:
    """A top-level definition's source, with every function body marked as a solution when
    ``hide``."""
    regions = []
    if hide and isinstance(node, ast.FunctionDef):
        regions.append(_body_region(node, lines))
    elif hide and isinstance(node, ast.ClassDef):
        regions += [_body_region(item, lines) for item in node.body
                    if isinstance(item, ast.FunctionDef)]
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    out: list[str] = []
    line = first
    for start, end, indent in regions:
        out += lines[line:start]
        out += [indent + BEGIN_SOLUTION, *lines[start : end + 1], indent + END_SOLUTION]
        line = end + 1
    out += lines[line : node.end_lineno]
    return "\n".join(out)


def solution_cell_source(module: ModuleType, names: list[str], given: list[str] = ()) -> str:
    """Cell source defining ``names`` (functions, classes, constants) as in ``module``, their
    bodies marked as solutions except for the ``given`` ones, which are copied as they are."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    by_name: dict[str, ast.stmt] = {}
    for node in syntax.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            by_name[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                by_name[node.targets[0].id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            by_name[node.target.id] = node
    missing = [n for n in names if n not in by_name]
    if missing:
        raise CourseError(f"{module.__name__} defines no {', '.join(missing)}")
    parts = []
    for name in names:
        node = by_name[name]
        text = _definition_source(node, lines, hide=name not in given)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and parts and parts[-1][0] == "constant":
            parts[-1] = ("constant", parts[-1][1] + "\n" + text)  # keep constants together
        else:
            parts.append(("constant" if isinstance(node, (ast.Assign, ast.AnnAssign)) else "def",
                          text))
    return "\n\n\n".join(text for _, text in parts)


# ------------------------------------------------------------------ hidden checks


def render_literal(value: object) -> str:
    """Python source that evaluates (with math and torch imported) to exactly ``value``."""
    if type(value) is float:
        if math.isnan(value):
            return "math.nan"
        if math.isinf(value):
            return "math.inf" if value > 0 else "-math.inf"
        return repr(value)
    if type(value) in (int, bool, str, type(None)):
        return repr(value)
    if type(value) is tuple:
        items = [render_literal(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if type(value) is list:
        return "[" + ", ".join(render_literal(v) for v in value) + "]"
    if type(value) is dict:
        return "{" + ", ".join(f"{render_literal(k)}: {render_literal(v)}"
                               for k, v in value.items()) + "}"
    if type(value) is torch.Tensor:
        if value.numel() > MAX_LITERAL_ELEMENTS:
            raise CourseError(
                f"a tensor of {value.numel()} elements is too large to write out; "
                "give the case an oracle expression (Case.expected)"
            )
        flat = value.detach().cpu().reshape(-1)
        if flat.is_floating_point():
            flat = flat.to(torch.float64)
        items = ", ".join(render_literal(v) for v in flat.tolist())
        dims = ", ".join(map(str, value.shape))
        shape = {0: "()", 1: f"{dims},"}.get(value.dim(), dims)
        return f"torch.tensor([{items}], dtype={value.dtype}).reshape({shape})"
    raise CourseError(f"cannot write a {type(value).__name__} as an expected value")


def hidden_check_lines(module: ModuleType, cases: list[Case | str],
                       existing: list[str] = ()) -> list[str]:
    """``check(...)`` lines for ``cases``, with expected values from the reference ``module``.

    A line of ``existing`` (the hidden region as it stands) is kept as it is when it checks the
    same expression with the same tolerances, and its literal agrees with the reference's value
    within them. Another CPU, BLAS, thread count or torch version may round a reference value
    differently in its last bits; such a value is still right, and the notebook must not change
    (or count as out of step) because of it. Values compared exactly must be equal.
    """
    namespace = {**vars(module), "math": math, "torch": torch}
    kept = {}
    for line in existing:
        parsed = _parse_check_line(line)
        if parsed is not None:
            kept[parsed[0]] = (line, parsed[1])
    out = []
    for case in map(as_case, cases):
        if case.raises is not None:
            reference_raises(case, namespace)
            out.append(f"check_raises({case.expression!r}, {case.raises})")
            continue
        value = reference_value(case, namespace)
        tolerance = "".join(f", {k}={v!r}" for k, v in
                            (("rel_tol", case.rel_tol), ("abs_tol", case.abs_tol)) if v)
        if case.expected is None and case.expression in kept:
            line, literal = kept[case.expression]
            if (line == f"check({case.expression!r}, {literal}{tolerance})"
                    and _agrees(value, literal, namespace, case)):
                out.append(line)
                continue
        literal = case.expected if case.expected is not None else render_literal(value)
        expected = eval(literal, dict(namespace))
        problem = _difference(value, expected, case.rel_tol, case.abs_tol)
        if problem is not None:
            raise CourseError(f"hidden case {case.expression!r}: reference and expected value "
                              f"disagree: {problem}")
        out.append(f"check({case.expression!r}, {literal}{tolerance})")
    return out


def _parse_check_line(line: str) -> tuple[str, str] | None:
    """The expression and the expected value's source of a ``check('expr', literal, ...)`` line
    (None for any other line)."""
    try:
        tree = syntax.parse(line)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id == "check" and len(call.args) == 2
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return None
    literal = ast.get_source_segment(line, call.args[1])
    return (call.args[0].value, literal) if literal else None


def _agrees(value: object, literal: str, namespace: dict, case: Case) -> bool:
    """Whether ``literal`` evaluates to ``value`` within the case's tolerances."""
    try:
        expected = eval(literal, dict(namespace))
        return _difference(value, expected, case.rel_tol, case.abs_tol) is None
    except Exception:  # a literal that no longer evaluates is out of step
        return False


def _region(source: str, begin: str, end: str) -> list[str]:
    """The lines between ``begin`` and ``end`` (none when either is missing)."""
    lines = source.splitlines()
    if begin not in lines or end not in lines:
        return []
    return lines[lines.index(begin) + 1 : lines.index(end)]


def _replace_region(source: str, begin: str, end: str, body: list[str], where: str) -> str:
    lines = source.splitlines()
    try:
        start, stop = lines.index(begin), lines.index(end)
    except ValueError:
        raise CourseError(f"{where}: needs a line {begin!r} and a line {end!r}") from None
    return "\n".join([*lines[: start + 1], *body, *lines[stop:]])


# ------------------------------------------------------------------ variant cells

VARIED_NOTE = ("# Graded outside the notebook: the grader compares your number with the answer "
               "for your own numbers.")


DEFAULT_PREFIX = "default_"  # the course's default numbers, which the measurement cells use


def default_names(spec: Variants) -> list[str]:
    """The names a variant cell binds to the course's default (the first choice): what the
    cells after a graded prediction measure, so that none of them shows a student's own
    answer."""
    return [DEFAULT_PREFIX + name for name in spec.names]


def variant_cell_source(lesson: Lesson, exercise: str, spec: Variants) -> str:
    """The locked cell that binds a graded prediction's names to the student's own choice, and
    ``default_<name>`` to the course's default, which the cells after the prediction measure."""
    rows = "".join(f"        {render_literal(tuple(choice))},\n" for choice in spec.choices)
    pieces = textwrap.wrap(spec.words, 84, drop_whitespace=False, break_long_words=False)
    defaults = "".join(f"{name} = {render_literal(value)}\n"
                       for name, value in zip(default_names(spec), spec.choices[0], strict=True))
    return (f"# Your own numbers for the prediction below: each student with an id draws one of "
            f"the last {len(spec.choices) - 1}.\n"
            "# The first is the course's default: the text works it through, and the cells "
            "after the\n# prediction measure it (the default_ names below), never yours: "
            "your answer is graded\n# when you hand in, and your feedback shows it.\n"
            f"{', '.join(spec.names)} = your_variant(\n"
            f"    {f'{lesson.name}/{exercise}'!r},\n"
            f"    {spec.names!r},\n"
            f"    [\n{rows}    ],\n"
            + "".join(f"    {piece!r}\n" for piece in pieces[:-1]) + f"    {pieces[-1]!r})\n"
            + defaults.rstrip("\n"))


# ------------------------------------------------------------------ whole notebooks


def expected_notebook(lesson: Lesson) -> nbformat.NotebookNode:
    """The lesson notebook as it must be: generated parts regenerated, outputs stripped."""
    nb = nbformat.read(lesson.notebook, as_version=4)
    module = importlib.import_module(lesson.module)
    cases: dict[str, list[Case | str]] = importlib.import_module(lesson.cases).CASES
    checks_source = CHECKS_SOURCE.read_text().rstrip("\n")
    variants = variants_of(lesson)
    placed: set[str] = set()
    graded: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        if grade_id == "checks":
            cell.source = checks_source
        elif meta.get("solution") and cell.cell_type == "code":
            course = cell.metadata.get("course", {})
            cell.source = solution_cell_source(module, list(course.get("defines", [grade_id])),
                                               list(course.get("given", [])))
            graded.append(grade_id)
        elif "copy_of" in cell.metadata.get("course", {}):  # given code, shown in full
            course = cell.metadata.course
            names = list(course.defines)
            cell.source = solution_cell_source(importlib.import_module(course.copy_of), names,
                                               given=names)
            # Read-only for students; nbgrader restores it from the gradebook when grading.
            cell.metadata["nbgrader"] = {"grade": False, "grade_id": f"given-{names[0]}",
                                         "locked": True, "schema_version": 3,
                                         "solution": False, "task": False}
        elif "variant_of" in cell.metadata.get("course", {}):
            name = cell.metadata.course.variant_of
            if name not in variants:
                raise CourseError(f"{lesson.notebook.name}: a variant cell for {name!r}, which "
                                  f"{lesson.cases} gives no VARIANTS")
            cell.source = variant_cell_source(lesson, name, variants[name])
            cell.metadata["nbgrader"] = {"grade": False, "grade_id": f"variant-{name}",
                                         "locked": True, "schema_version": 3,
                                         "solution": False, "task": False}
            placed.add(name)
        elif meta.get("grade") and grade_id.startswith("test-"):
            name = grade_id.removeprefix("test-")
            if not cases.get(name):
                raise CourseError(f"{lesson.cases} has no hidden cases for {name!r}")
            where = f"{lesson.notebook.name}, cell {grade_id}"
            existing = _region(cell.source, BEGIN_HIDDEN, END_HIDDEN)
            # A prediction that varies is judged per student, outside the notebook only.
            lines = [VARIED_NOTE] if name in variants else hidden_check_lines(
                module, cases[name], existing)
            cell.source = _replace_region(cell.source, BEGIN_HIDDEN, END_HIDDEN, lines, where)
    unplaced = sorted(set(variants) - placed)
    if unplaced:
        raise CourseError(f"{lesson.notebook.name}: no variant cell (metadata course.variant_of)"
                          f" for {', '.join(unplaced)}")
    untested = sorted(set(graded) - {c.metadata.nbgrader.get("grade_id", "").removeprefix("test-")
                                     for c in nb.cells if "nbgrader" in c.metadata})
    if untested:
        raise CourseError(f"{lesson.notebook.name}: no test cell for {', '.join(untested)}")
    return nb


def sync_lesson(lesson: Lesson, write: bool, log: Callable[[str], None] = print) -> list[str]:
    """Bring one lesson in step (``write``) or list what is out of step (not ``write``)."""
    drift = []
    want = nbformat.writes(expected_notebook(lesson)) + "\n"
    have = lesson.notebook.read_text()
    if want != have:
        drift.append(f"{lesson.notebook.relative_to(lesson.folder.parent.parent)} differs from "
                     "what solutions/, grader/content/cases/ and "
                     "grader/content/notebook_checks.py generate")
        if write:
            lesson.notebook.write_text(want)
            log(f"updated {lesson.notebook.name}")
    for name in lesson.data_files:
        source, copy = DATA / name, lesson.folder / name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            drift.append(f"{copy} is not a copy of data/{name}")
            if write:
                copy.write_bytes(source.read_bytes())
                log(f"copied data/{name} into {lesson.name}/")
    return drift


def sync(lessons: list[Lesson], check_only: bool, log: Callable[[str], None] = print) -> int:
    """Sync every lesson; with ``check_only``, exit status 1 when anything is out of step."""
    drift = [d for lesson in lessons for d in sync_lesson(lesson, not check_only, log)]
    if check_only:
        for line in drift:
            log(f"out of step: {line}")
        if drift:
            log("run `python -m grader sync` to regenerate, then review and commit the result")
        return 1 if drift else 0
    written = f", {len(drift)} change(s) written" if drift else ""
    log(f"{len(lessons)} lesson(s) in step{written}")
    return 0

