"""Trusted scoring: call the student's functions in their kernel, judge the results outside it.

After a submission's cells have run, the grader sends one probe per exercise: the call
expressions of that exercise's visible and hidden checks, and nothing else. The kernel evaluates
them and prints the results in a tagged JSON form (a float as its exact hex, a tensor as dtype,
shape and raw bytes). The grading process decodes that into fresh plain values and compares them
with expected values it computed itself from the reference code. The student's kernel never sees
an expected value, and nothing it returns is trusted beyond its bytes: an object with a forged
``__eq__`` arrives as "not a float", a patched ``check`` or ``torch`` changes nothing here.
"""

from __future__ import annotations

import ast
import base64
import builtins
import importlib
import json
import math
from dataclasses import dataclass, field
from functools import cache

import nbformat
from nbgrader.preprocessors import ClearSolutions

from grader.common import syntax
from grader.common.errors import CourseError
from grader.content.cases import Case, as_case, reference_raises, reference_value
from grader.content.lessons import BEGIN_HIDDEN, Lesson
from grader.content.variants import variants_of

MAX_RESULT_CHARS = 48 * 2**20
MAX_DEPTH = 12

# Runs in the student's kernel; names start with _ctc_ to stay out of the student's way. The
# reply goes to a file of the kernel's private folder, written with os.write: nothing the
# student's code usually rebinds (sys.stdout, print, display) is on the way.
KERNEL_PROBE = r"""
def _ctc_probe(_ctc_namespace, _ctc_expressions, _ctc_reply, _ctc_nonce, _ctc_given="",
               _ctc_names=()):
    import base64, json, os
    import torch

    def encode(value, depth=0):
        kind = type(value)
        if depth > 12:
            return {"t": "other", "v": "nested too deep"}
        if kind is bool:
            return {"t": "bool", "v": value}
        if kind is int:
            try:
                return {"t": "int", "v": str(value)}
            except ValueError:
                return {"t": "other", "v": "int too large"}
        if kind is float:
            return {"t": "float", "v": value.hex()}
        if kind is str:
            return {"t": "str", "v": value[:10000]}
        if value is None:
            return {"t": "none"}
        if kind in (tuple, list):
            return {"t": kind.__name__, "v": [encode(v, depth + 1) for v in value[:10000]]}
        if kind is dict:
            return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)]
                                       for k, v in list(value.items())[:10000]]}
        if kind is torch.Tensor:
            flat = value.detach().to("cpu").contiguous().reshape(-1)
            if flat.numel() * flat.element_size() > 32 * 2**20:
                return {"t": "other", "v": "tensor larger than 32 MiB"}
            raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            return {"t": "tensor", "dtype": str(value.dtype), "shape": list(value.shape),
                    "v": base64.b64encode(raw).decode()}
        return {"t": "other", "v": f"{kind.__module__}.{kind.__qualname__}"[:200]}

    def failure(error):
        builtin = next(c for c in type(error).__mro__ if c.__module__ == "builtins")
        return {"t": "error", "v": f"{type(error).__name__}: {error}"[:500],
                "raised": builtin.__name__[:100]}

    # Whether the notebook replaced what this probe relies on: flagged, never trusted.
    tampered = [name for name, function, home in (
        ("json.dumps", json.dumps, "json"), ("os.write", os.write, "posix"),
        ("os.open", os.open, "posix"), ("base64.b64encode", base64.b64encode, "base64"),
        ("torch.Tensor.numpy", torch.Tensor.numpy, None))
        if (home is not None and getattr(function, "__module__", None) != home)
        or type(function).__name__ not in ("function", "builtin_function_or_method",
                                           "method_descriptor")]
    saved = {n: _ctc_namespace[n] for n in _ctc_names if n in _ctc_namespace}
    results = []
    try:
        if _ctc_given:  # the course's version of earlier exercises this one builds on
            exec(_ctc_given, _ctc_namespace)
        for expression in _ctc_expressions:
            try:
                results.append(encode(eval(expression, _ctc_namespace)))
            except NotImplementedError:
                results.append({"t": "error", "v": "not implemented yet"})
            except BaseException as error:  # exit() or a KeyboardInterrupt costs its check only
                results.append(failure(error))
    except Exception as error:
        results = [failure(error)] * len(_ctc_expressions)
    finally:
        for name in _ctc_names:
            _ctc_namespace.pop(name, None)
        _ctc_namespace.update(saved)
    data = (_ctc_nonce + json.dumps({"r": results, "t": tampered}) + _ctc_nonce + "\n").encode()
    fd = os.open(_ctc_reply, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
"""


def probe_source(expressions: list[str], reply: str, nonce: str, given: str = "",
                 names: tuple[str, ...] = ()) -> str:
    """The code of one probe cell: evaluate ``expressions`` (with ``given`` code defining
    ``names`` for the duration, the notebook's own definitions restored after) and write the
    results to the file ``reply``."""
    return (KERNEL_PROBE + f"\n_ctc_probe(globals(), {expressions!r}, {reply!r}, {nonce!r}, "
            f"{given!r}, {tuple(names)!r})\ndel _ctc_probe\n")


class Unreadable(Exception):
    """A probe result that does not decode: scores as wrong."""


@dataclass(frozen=True)
class Failure:
    """What the kernel said instead of a value: a message, and where the call raised an
    exception, the name of the first built-in class in its type's MRO (the built-in exception
    it is, or derives from)."""

    message: str
    raised: str = ""

    def raised_a(self, wanted: str) -> bool:
        """Whether the error raised is the built-in exception ``wanted`` or a subclass of it.
        One name per error: a class deriving from several built-ins counts as its first."""
        kind = getattr(builtins, self.raised, None)
        return (isinstance(kind, type) and issubclass(kind, BaseException)
                and issubclass(kind, getattr(builtins, wanted)))


@dataclass(frozen=True)
class Raises:
    """The expected outcome of a ``check_raises`` check: the built-in exception it names."""

    name: str


def decode(item: object, depth: int = 0) -> object:
    """A tagged value from the kernel as a fresh plain Python value (or ``Failure``)."""
    if depth > MAX_DEPTH + 1 or not isinstance(item, dict) or not isinstance(item.get("t"), str):
        raise Unreadable("malformed result")
    kind, value = item["t"], item.get("v")
    if kind == "error":
        raised = item.get("raised")
        return Failure(str(value)[:500], raised[:100] if isinstance(raised, str) else "")
    if kind == "other":
        return Failure(f"returned {str(value)[:200]}")
    if kind == "none":
        return None
    if kind == "bool" and type(value) is bool:
        return bool(value)
    if kind == "int" and type(value) is str:
        return int(value)
    if kind == "float" and type(value) is str:
        return float.fromhex(value)
    if kind == "str" and type(value) is str:
        return str(value)
    if kind in ("tuple", "list") and type(value) is list:
        items = [decode(v, depth + 1) for v in value]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict" and type(value) is list:
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in value}
    if kind == "tensor" and type(value) is str:
        import torch  # here, not above: the commands that grade nothing never load it
        dtype = getattr(torch, str(item.get("dtype", "")).removeprefix("torch."), None)
        shape = item.get("shape")
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, list):
            raise Unreadable("malformed tensor")
        raw = bytearray(base64.b64decode(value, validate=True))
        flat = (torch.frombuffer(raw, dtype=torch.uint8) if raw
                else torch.empty(0, dtype=torch.uint8))
        return flat.view(dtype).reshape([int(s) for s in shape]).clone()
    raise Unreadable(f"malformed {kind}")


def reply_bodies(text: str, nonce: str) -> list[str]:
    """The bodies of the replies in a probe's reply file. The probe writes one; more mean that
    the student's code wrote some."""
    return text.split(nonce)[1:-1:2]


def parse_replies(text: str, nonce: str, count: int) -> list[list[object]]:
    """Every reply in a probe's reply file, each as ``count`` decoded results."""
    return [decode_reply(body, count)[0] for body in reply_bodies(text, nonce)]


def decode_reply(body: str, count: int) -> tuple[list[object], list[str]]:
    """One reply's ``count`` results as plain values (``Failure`` where unreadable), and the
    names of the functions the probe found replaced."""
    invalid = [Failure("the probe's result is not valid")] * count
    if len(body) > MAX_RESULT_CHARS:
        return [Failure("the probe's result is too large")] * count, []
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):
        return invalid, []
    if not isinstance(reply, dict):
        return invalid, []
    items, tampered = reply.get("r"), reply.get("t", [])
    tampered = [str(t)[:50] for t in tampered[:10]] if isinstance(tampered, list) else ["?"]
    if not isinstance(items, list) or len(items) != count:
        return invalid, tampered
    out = []
    for item in items:
        try:
            out.append(decode(item))
        except (Unreadable, ValueError, TypeError, RuntimeError, OverflowError, RecursionError):
            out.append(Failure("unreadable result"))
    return out, tampered


# ------------------------------------------------------------------ what each exercise expects


@dataclass
class Check:
    expression: str
    expected: object
    rel_tol: float
    abs_tol: float
    hidden: bool


@dataclass
class Exercise:
    """A graded function: its checks, and what it builds on.

    ``given`` is the reference solution cell's source (the names it defines in ``defines``);
    the grader sends it to a kernel only to judge a later exercise again, and only once this
    one has been judged. ``depends`` are the earlier exercises whose names this one's reference
    code or checks use, directly or through each other, in notebook order. ``stub`` is the
    solution cell as students receive it (nbgrader's ``raise NotImplementedError()`` in place of
    the solution).
    """

    name: str
    points: float
    checks: list[Check] = field(default_factory=list)
    given: str = ""
    defines: tuple[str, ...] = ()
    depends: tuple[str, ...] = ()
    stub: str = ""
    prediction: bool = False  # a graded prediction: its verdict tells the answer and the band
    asked: str = ""  # the numbers it asks about, in words, where they vary per student


def _stub(cell: nbformat.NotebookNode) -> str:
    """A solution cell as nbgrader releases it (its default code stub, which the course keeps)."""
    released, _ = ClearSolutions().preprocess_cell(nbformat.from_dict(dict(cell)),
                                                   {"language": "python"}, 0)
    return released.source


def _lines(source: str) -> list[str]:
    return [line.rstrip() for line in source.strip().splitlines()]


def unattempted(nb: nbformat.NotebookNode, exercise: Exercise) -> bool:
    """Whether a submission's solution cell for ``exercise`` is still the stub it was released
    with, but for blank space at line ends: its function raises NotImplementedError whatever
    the earlier exercises do, so judging it again with their reference versions cannot help.
    (A student who edits the stub's metadata or text only makes the grader judge it again.)"""
    if not exercise.stub:
        return False
    cells = [c for c in nb.cells if c.get("cell_type") == "code"
             and c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == exercise.name]
    return len(cells) == 1 and isinstance(cells[0].get("source"), str) \
        and _lines(cells[0].source) == _lines(exercise.stub)


def _visible_checks(source: str) -> list[Case]:
    """The ``check("expr", ...)`` and ``check_raises("expr", Error)`` calls of a test cell's
    visible part, as cases (expected values left to the reference)."""
    visible = source.split(BEGIN_HIDDEN)[0]
    found = []
    for node in ast.walk(syntax.parse(visible)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            continue
        if node.func.id == "check":
            tolerances = {k.arg: ast.literal_eval(k.value) for k in node.keywords
                          if k.arg in ("rel_tol", "abs_tol")}
            found.append(Case(node.args[0].value, rel_tol=float(tolerances.get("rel_tol", 0.0)),
                              abs_tol=float(tolerances.get("abs_tol", 0.0))))
        elif node.func.id == "check_raises":
            error = node.args[1] if len(node.args) == 2 and not node.keywords else None
            try:
                found.append(Case(node.args[0].value, raises=getattr(error, "id", "")))
            except ValueError:
                raise CourseError(f"check_raises({node.args[0].value!r}, ...) must name a "
                                  "built-in exception, as in check_raises(\"f(-1)\", "
                                  "ValueError)") from None
    return found


@cache
def exercises(lesson: Lesson) -> tuple[Exercise, ...]:
    """Every graded function of a lesson with its points and its checks' expected values,
    computed here from the reference code (never in a student's kernel)."""
    import torch  # here, not above: the commands that grade nothing never load it

    # What judge() compares with, imported now: a batch computes this before its threads start,
    # so that no two threads import the same modules at once.
    import grader.content.notebook_checks  # noqa: F401

    nb = nbformat.read(lesson.notebook, as_version=4)
    module = importlib.import_module(lesson.module)
    cases = importlib.import_module(lesson.cases).CASES
    namespace = {**vars(module), "math": math, "torch": torch}
    variants = variants_of(lesson)
    solutions: dict[str, tuple[str, tuple[str, ...], str]] = {}  # name -> source, defines, stub
    found = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        if meta.get("solution") and cell.cell_type == "code" and grade_id:
            defines = tuple(cell.metadata.get("course", {}).get("defines", [grade_id]))
            solutions[grade_id] = (cell.source, defines, _stub(cell))
        if not (meta.get("grade") and grade_id.startswith("test-")):
            continue
        name = grade_id.removeprefix("test-")
        given, defines, stub = solutions.get(name, ("", (name,), ""))
        visible = cell.source.split(BEGIN_HIDDEN)[0]
        exercise = Exercise(name, float(meta["points"]), given=given, defines=defines, stub=stub,
                            prediction="check_prediction(" in visible and "graded=True" in visible,
                            asked=variants[name].said(0) if name in variants else "")
        planned = [(case, False) for case in _visible_checks(cell.source)]
        planned += [(as_case(case), True) for case in cases[exercise.name]]
        for case, hidden in planned:
            if case.raises is not None:
                reference_raises(case, namespace)
                expected: object = Raises(case.raises)
            else:
                expected = reference_value(case, namespace)
            exercise.checks.append(Check(case.expression, expected, case.rel_tol, case.abs_tol,
                                         hidden))
        found.append(exercise)
    _link_dependencies(found)
    return tuple(found)


def _names_used(source: str) -> set[str]:
    try:
        tree = syntax.parse(source)
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _link_dependencies(found: list[Exercise]) -> None:
    """Fill each exercise's ``depends``: the earlier exercises whose names its reference code
    or its checks use, and theirs in turn."""
    owner = {}  # name -> the exercise that defines it
    for exercise in found:
        uses = _names_used(exercise.given)
        for check in exercise.checks:
            uses |= _names_used(check.expression)
        direct = {owner[n] for n in uses if n in owner} - {exercise.name}
        closure = set(direct)
        for earlier in found:
            if earlier.name in direct:
                closure |= set(earlier.depends)
        exercise.depends = tuple(e.name for e in found if e.name in closure)
        for name in exercise.defines:
            owner.setdefault(name, exercise.name)


@dataclass
class Verdict:
    """How one exercise went: points, and which checks failed (hidden ones not named)."""

    name: str
    points: float
    max_points: float
    passed: int
    total: int
    visible_failures: list[str]
    # What each failed hidden check said: for the instructor (the ledger, review), never in
    # the student's feedback, which counts them only.
    hidden_failures: list[str]
    note: str = ""  # e.g. "passes with a correct `split_bits`"
    # A graded prediction's: the student's numbers, the answer, the band and their number.
    told: str = ""
    # Where the checks passed only when they ran again: what the first run's failures said.
    first_run: list[str] = field(default_factory=list)
    # A graded prediction's number, as read; and, for a notebook worked on other numbers than
    # its student's, that other answer and whether the number was in its band (for review).
    answered: float | None = None
    worked: str = ""

    @property
    def hidden_failed(self) -> int:
        return len(self.hidden_failures)

    def summary(self) -> str:
        text = (f"{self.name}: {self.points:g} of {self.max_points:g} points "
                f"({self.passed} of {self.total} checks passed"
                + (f"; {self.note}" if self.note else "") + ")")
        details = [self.told] if self.told else []
        details += self.visible_failures[:3]
        if self.hidden_failed and not self.told:
            details.append(f"{self.hidden_failed} hidden check(s) failed")
        return text + ("".join(f"\n  - {d}" for d in details) if details else "")


def judge(exercise: Exercise, results: list[object], partial: bool = False) -> Verdict:
    """All checks pass: full points; otherwise none, or with ``partial`` credit the points times
    the fraction of checks that passed."""
    from grader.content.notebook_checks import _difference  # loads torch: only when judging

    visible_failures, hidden_failures, passed = [], [], 0
    for check, got in zip(exercise.checks, results, strict=True):
        if isinstance(check.expected, Raises):
            wanted = check.expected.name
            if isinstance(got, Failure):
                problem: str | None = None if got.raised_a(wanted) else (
                    f"expected {wanted}, got {got.message}")
            else:
                problem = f"expected {wanted}, got a result"
        elif isinstance(got, Failure):
            problem = got.message
        else:
            try:
                problem = _difference(got, check.expected, check.rel_tol, check.abs_tol)
            except Exception as error:  # a decoded value the comparison cannot handle
                problem = f"cannot compare ({type(error).__name__})"
        if problem is None:
            passed += 1
        elif check.hidden:
            hidden_failures.append(f"{check.expression}: {problem}"[:300])
        else:
            visible_failures.append(f"{check.expression}: {problem}"[:300])
    total = len(exercise.checks)
    if partial and total:
        points = exercise.points * passed / total
    else:
        points = exercise.points if passed == total else 0.0
    told = _told(exercise, results) if exercise.prediction else ""
    banded = [got for c, got in zip(exercise.checks, results, strict=True)
              if c.rel_tol and type(c.expected) is float and type(got) is float]
    return Verdict(exercise.name, points, exercise.points, passed, total, visible_failures,
                   hidden_failures, told=told,
                   answered=banded[0] if exercise.prediction and len(banded) == 1 else None)


def _told(exercise: Exercise, results: list[object]) -> str:
    """What a graded prediction's feedback says: the numbers it asked about (where they vary),
    the answer, the band that earns the point and the student's number, inside it or not as
    the check itself judged it (``math.isclose``: within ``rel_tol`` of the larger of the two,
    so the band reaches answer / (1 - rel_tol) above)."""
    from grader.content.notebook_checks import _same_float, readable

    banded = [(c, got) for c, got in zip(exercise.checks, results, strict=True)
              if c.rel_tol and type(c.expected) is float]
    if len(banded) != 1:
        return ""
    check, got = banded[0]
    low, high = sorted((check.expected * (1 - check.rel_tol),
                        check.expected / (1 - check.rel_tol)))
    if abs(low) >= 1000:  # shown as whole numbers: the ones inside the band
        low, high = math.ceil(low), math.floor(high)
        for _ in range(4):  # an end that rounding put a hair outside
            low += not _same_float(float(low), check.expected, check.rel_tol, 0.0)
            high -= not _same_float(float(high), check.expected, check.rel_tol, 0.0)
    yours = (f"your number, {readable(got)}, is "
             + ("inside it" if _same_float(got, check.expected, check.rel_tol, 0.0)
                else "outside it")
             if type(got) is float else "no number of yours was read")
    asked = f"for your numbers ({exercise.asked}) " if exercise.asked else ""
    return (f"the answer {asked}is {readable(check.expected)}; a number from {readable(low)} "
            f"to {readable(high)} (within {check.rel_tol:.0%}, as the check counts) earns the "
            f"point, and {yours}")
